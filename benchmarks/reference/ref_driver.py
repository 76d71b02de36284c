"""Times training steps of the reference code (copied to the scratch folder and run there).

    python ref_driver.py REFERENCE_DIR PATCHED_SCRIPT STEP_FILE THREADS WARMUP STEPS DEVICE OUT_JSON

Runs the patched script (the reference's own data loading, model, ``torch.compile``,
optimizer, scheduler and loss), draws ``WARMUP + STEPS`` batches from its
``train_loader`` (cycling over epochs), then executes the body of the script's loop
over ``train_loader`` once per batch, timing each execution. Imports nothing from
meshops: only the reference's modules, torch, the standard library and
``profiling.py`` (copied beside this file; torch and the standard library only).

Environment: ``MESHOPS_REF_STATIC_SHAPES=1`` compiles with torch._dynamo's automatic
dynamic shapes off; ``MESHOPS_PROFILE_TRACE=PATH`` and ``MESHOPS_PROFILE_STEPS=K`` run
K more steps under ``torch.profiler`` after the timed ones, write their Chrome trace
to PATH and put their summary (``profiling.summarize``) in the result.
"""

import json
import os
import runpy
import sys
import time

import torch


def main(argv):
    ref_dir, script, step_file, threads, warmup, steps, device, out = argv
    threads, warmup, steps = int(threads), int(warmup), int(steps)
    trace = os.environ.get("MESHOPS_PROFILE_TRACE")
    profiled = int(os.environ.get("MESHOPS_PROFILE_STEPS", "0")) if trace else 0
    torch.set_num_threads(threads)
    if os.environ.get("MESHOPS_REF_STATIC_SHAPES") == "1":
        # torch.compile specialises on every input shape instead of retracing with
        # symbolic sizes, which torch.quantile (in their dist2att) does not support on
        # some torch versions (2.11 on CUDA). Their code is unchanged.
        torch._dynamo.config.automatic_dynamic_shapes = False
    sys.path.insert(0, ref_dir)  # their `from pit import *`, `from utils import *`
    import profiling  # beside this file (sys.path[0])
    t0 = time.perf_counter()
    ns = runpy.run_path(script, run_name="__reference__")
    setup_s = time.perf_counter() - t0
    code = compile(open(step_file).read(), "reference training step", "exec")
    batches = []
    need = warmup + steps + profiled
    while len(batches) < need:
        for b in ns["train_loader"]:
            batches.append(b)
            if len(batches) == need:
                break
    ns["train_l2"] = 0.0
    cuda = device.startswith("cuda")

    def step(i):
        x, ext, y = batches[i]
        ns.update(x=x, ext=ext, y=y)
        exec(code, ns)

    times, counts = [], [profiling.dynamo_counters()]
    for i in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        step(i)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        if i + 1 in (warmup, warmup + steps):
            counts.append(profiling.dynamo_counters())
    if warmup == 0:
        counts.insert(1, counts[0])
    profile = None
    if profiled:
        profile = profiling.profile_steps(lambda i: step(warmup + steps + i), profiled,
                                          device, trace)
    model = ns["model"]
    params = list(model.parameters())
    result = {
        "side": "reference", "warmup_s": times[:warmup], "step_s": times[warmup:],
        "setup_s": setup_s, "threads": torch.get_num_threads(),
        "dtype": str(params[0].dtype), "parameters": sum(p.numel() for p in params),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "compiled": type(model).__name__ == "OptimizedModule",
        "batch_size": int(batches[0][0].shape[0]), "loss": float(ns["loss"]),
        "torch": torch.__version__, "device": device,
        "static_shapes": os.environ.get("MESHOPS_REF_STATIC_SHAPES") == "1",
        "max_memory_gib": (torch.cuda.max_memory_allocated() / 2**30) if cuda else None,
        # torch._dynamo: frames compiled and graph breaks in set-up + warm-up and in the
        # timed steps (a frame compiled in the timed steps is a recompilation there)
        "dynamo_warmup": {k: counts[1][k] - counts[0][k] for k in counts[0]},
        "dynamo_timed": {k: counts[2][k] - counts[1][k] for k in counts[0]},
        "profile": profile,
    }
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
