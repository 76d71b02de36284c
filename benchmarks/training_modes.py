"""``python -m benchmarks.training_modes``: speed and accuracy of mixed precision and
``torch.compile`` against float32/eager, and peak memory and step time of activation
checkpointing of the processor blocks (issue 22, items 1 and 3).

``--what precision`` trains the small parametric PiT that ``meshops train`` picks for a
parametric study (width 64, 2 heads, 2 blocks, 128 FPS latent points) on the
convection-diffusion stand-in (one fixed 3,136-node mesh, inputs kappa, wind_x, wind_y,
target u), the same seed, data order and epochs, once per variant: float32 eager, bf16
and fp16 autocast, float32 and bf16 under ``torch.compile``. It reports the median
seconds per epoch after the first (which includes compilation), the first epoch, and the
validation relative L2 error of the last epoch.

``--what memory`` runs training steps (forward, backward, optimiser) of TransformerNO and
PiT with and without ``--checkpoint-blocks``, each in a fresh process: the extra peak
resident memory of a step (``VmHWM - VmRSS`` before it, after a warm-up step; see
:mod:`benchmarks.harness`) and the median step time of ``--reps`` steps.

CUDA: ``--device cuda`` runs the same on a GPU (peak memory then from
``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from benchmarks.paths import command


def _uptime() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# ----------------------------------------------------------------- precision
def _precision(args) -> None:
    from data_adapters.standins.convdiff import make_convection_diffusion_standin
    from meshops.fitting.defaults import PARAMETRIC_PIT
    from meshops.models import get_model
    from meshops.training import Trainer
    from meshops.training.seed import seed_everything

    samples = make_convection_diffusion_standin(args.train + args.val, seed=0)
    train, val = samples[:args.train], samples[args.train:]
    print(f"# convection-diffusion stand-in: {len(train)} training / {len(val)} validation "
          f"samples of {samples[0].num_nodes} nodes; PiT {PARAMETRIC_PIT}; batch 4, lr 3e-3, "
          f"cosine, {args.epochs} epochs, device {args.device}")
    variants = [("float32 eager", False, False), ("bf16 eager", "bf16", False),
                ("fp16 eager", "fp16", False), ("float32 compile", False, True),
                ("bf16 compile", "bf16", True)]
    rows = []
    for name, amp, compile_ in variants:
        if args.only and name not in args.only:
            continue
        torch._dynamo.reset()
        seed_everything(0)
        model = get_model("pit", in_channels=3, out_channels=1, pos_dim=2, **PARAMETRIC_PIT)
        load = _uptime()
        t0 = time.perf_counter()
        try:
            history = Trainer(model, train, val, epochs=args.epochs, batch_size=4, lr=3e-3,
                              amp=amp, compile=compile_, device=args.device, progress=False,
                              log=None, seed=0).fit()
        except Exception as e:  # report and go on with the other variants
            print(f"{name:16s} failed: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        total = time.perf_counter() - t0
        times = [h["time_s"] for h in history]
        rows.append((name, statistics.median(times[1:]) if len(times) > 1 else times[0],
                     times[0], history[-1]["val_l2"], total, load))
        r = rows[-1]
        print(f"{name:16s} {r[1]:7.2f} s/epoch (epochs 2..)  first epoch {r[2]:7.2f} s  "
              f"val rel. L2 {r[3]:.4f}  total {r[4]:.0f} s  (load {r[5]})", flush=True)
    base = rows[0] if rows and rows[0][0] == "float32 eager" else None
    if base:
        print("\nratios to float32 eager (time per epoch, validation error):")
        for r in rows:
            print(f"  {r[0]:16s} speed-up x{base[1] / r[1]:.2f}  error x{r[3] / base[3]:.3f}")


# ------------------------------------------------------------------- memory
_MEMORY_CASES = {
    "transformer_no": dict(model=dict(width=128, layers=4, heads=4), points=4096, batch=2),
    "pit": dict(model=dict(width=128, heads=2, blocks=4, latent="fps", num_latent=2048,
                           quantile_in=0.005, quantile_out=0.01), points=20000, batch=1),
}


def _memory_child(case: str, checkpoint: bool, reps: int, device: str) -> dict:
    from torch_geometric.data import Batch

    from benchmarks.harness import hwm_bytes, malloc_trim, reset_hwm, rss_bytes
    from meshops.mesh.data import MeshData
    from meshops.models import get_model
    from meshops.training.dataset import prepare_batch
    from meshops.training.loss import RelativeLpLoss
    from meshops.training.trainer import targets_of, with_mesh_structures

    spec = _MEMORY_CASES[case]
    torch.manual_seed(0)
    model = get_model(case, in_channels=1, out_channels=1, **spec["model"]).to(device)
    model.set_block_checkpointing(checkpoint)
    g = torch.Generator().manual_seed(0)
    n = spec["points"]
    samples = [MeshData(pos=torch.rand(n, 2, generator=g), weight=torch.full((n,), 1.0 / n),
                        x=torch.randn(n, 1, generator=g), y=torch.randn(n, 1, generator=g))
               for _ in range(spec["batch"])]
    samples = with_mesh_structures(model, samples, "bench", False)
    batch = prepare_batch(Batch.from_data_list(samples), device)
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    loss_fn = RelativeLpLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(batch), *targets_of(batch)).backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up: optimiser state, allocator, kernels
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        import gc

        gc.collect()
        malloc_trim()
        base = rss_bytes()
        reset_hwm()
        step()
        peak = hwm_bytes() - base
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"peak_mb": peak / 2**20, "step_s": statistics.median(times), "steps": times}


def _memory(args) -> None:
    print(f"# training steps with and without --checkpoint-blocks, each in a fresh process; "
          f"device {args.device}, {torch.get_num_threads()} threads")
    for case, spec in _MEMORY_CASES.items():
        if args.only and case not in args.only:
            continue
        res = {}
        for checkpoint in (False, True):
            load = _uptime()
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.training_modes", "--child", case,
                 "--checkpoint" if checkpoint else "--no-checkpoint", "--reps", str(args.reps),
                 "--device", args.device], capture_output=True, text=True, check=True)
            res[checkpoint] = json.loads(out.stdout.strip().splitlines()[-1])
            r = res[checkpoint]
            print(f"{case:15s} {spec['batch']} x {spec['points']} points  checkpoint-blocks "
                  f"{'on ' if checkpoint else 'off'}  peak {r['peak_mb']:8.0f} MB  step "
                  f"{r['step_s']:6.2f} s ({', '.join(f'{t:.2f}' for t in r['steps'])})  "
                  f"(load {load})", flush=True)
        print(f"  -> memory x{res[True]['peak_mb'] / res[False]['peak_mb']:.2f}, "
              f"time x{res[True]['step_s'] / res[False]['step_s']:.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training_modes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", choices=["precision", "memory"], default="precision")
    p.add_argument("--device", default="cpu")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--train", type=int, default=24)
    p.add_argument("--val", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", nargs="*", help="variants or cases to run")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_memory_child(args.child, args.checkpoint, args.reps, args.device)))
        return 0
    print(f"# {command('benchmarks.training_modes', argv)}")
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average before: {_uptime()}")
    (_precision if args.what == "precision" else _memory)(args)
    print(f"# load average after: {_uptime()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
