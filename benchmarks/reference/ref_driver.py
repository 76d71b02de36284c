"""Times training steps of the reference code (copied to the scratch folder and run there).

    python ref_driver.py REFERENCE_DIR PATCHED_SCRIPT STEP_FILE THREADS WARMUP STEPS DEVICE OUT_JSON

Runs the patched script (the reference's own data loading, model, ``torch.compile``,
optimizer, scheduler and loss), draws ``WARMUP + STEPS`` batches from its
``train_loader`` (cycling over epochs), then executes the body of the script's loop
over ``train_loader`` once per batch, timing each execution. Imports nothing from
meshops: only the reference's modules, torch and the standard library.
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
    torch.set_num_threads(threads)
    if os.environ.get("MESHOPS_REF_STATIC_SHAPES") == "1":
        # --reference-static-shapes: torch.compile specialises on every input shape instead
        # of retracing with symbolic sizes, which torch.quantile (in their dist2att) does
        # not support on some torch versions (2.11 on CUDA). Their code is unchanged.
        torch._dynamo.config.automatic_dynamic_shapes = False
    sys.path.insert(0, ref_dir)  # their `from pit import *`, `from utils import *`
    t0 = time.perf_counter()
    ns = runpy.run_path(script, run_name="__reference__")
    setup_s = time.perf_counter() - t0
    code = compile(open(step_file).read(), "reference training step", "exec")
    batches = []
    while len(batches) < warmup + steps:
        for b in ns["train_loader"]:
            batches.append(b)
            if len(batches) == warmup + steps:
                break
    ns["train_l2"] = 0.0
    cuda = device.startswith("cuda")
    times = []
    for x, ext, y in batches:
        ns.update(x=x, ext=ext, y=y)
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        exec(code, ns)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
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
    }
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
