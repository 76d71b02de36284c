"""Model benchmarks: forward / forward+backward of every model of :mod:`meshops.models`
against ``N``, and end-to-end training throughput with the Trainer.

Inputs: one sample of ``N`` points uniform in the unit square, one input and one output
channel, uniform weights, float32.  ``ref`` is the same model with every attention layer
evaluated densely (``ContinuumAttention(impl="naive")``, dense Galerkin, masked global
softmax for windows, one-hot token integrals, materialised position kernels
(``PositionAttention(impl="kernel")``; PiT's local encoder/decoder layers are kept, their
ball graphs are not kNN graphs); see :mod:`benchmarks.layers`).

Training throughput (``suite="training"``): :class:`meshops.training.Trainer` (AdamW,
cosine schedule, weighted relative L2, normalisers fitted on the data) for two epochs on
synthetic samples; samples/s of the second epoch (the first is the warm-up).  Sizes: the
Elasticity benchmark (972 points, batch 8) and 100,000 points (batch 1).  A
configuration whose step is predicted (from probes at 4,096 and 8,192 points) to exceed
the step budget is skipped, with the prediction in the notes.
"""

from __future__ import annotations

import time
import types
from typing import Any, Optional

import torch

from benchmarks.harness import Case, Runner, predict_time

#: name -> (preset for the size series, preset for training at 100k points)
PRESETS = {
    "transformer_no": ("elasticity", "elasticity"),
    "galerkin_transformer": ("elasticity", "large"),
    "patched_transformer": ("large", "large"),
    "pit": ("elasticity", "large"),
}


def available_models() -> list[str]:
    from meshops.models import MODELS

    return list(MODELS)


def make_model(name: str, preset: Optional[str], **overrides: Any):
    from meshops.models import MODELS

    cls = MODELS[name]
    kw = dict(in_channels=1, out_channels=1, **overrides)
    presets = getattr(cls, "PRESETS", {})
    if preset is not None and preset in presets and hasattr(cls, "from_preset"):
        return cls.from_preset(preset, **kw)
    return cls(**kw)


def make_sample(n: int, device: str, seed: int = 0, target: bool = False):
    from meshops.mesh.data import MeshData

    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 2, generator=g)
    x = torch.randn(n, 1, generator=g)
    kw = {"y": torch.sin(6 * pos[:, :1]) * pos[:, 1:] + 0.1 * x} if target else {}
    return MeshData(pos=pos, weight=torch.full((n,), 1.0 / n), x=x, **kw).to(device)


def densify(model: torch.nn.Module) -> torch.nn.Module:
    """Switch every attention layer of ``model`` to its dense reference evaluation."""
    from benchmarks import layers
    from meshops.nn.continuum import ContinuumAttention
    from meshops.nn.galerkin import FourierAttention, GalerkinAttention
    from meshops.nn.patch import PatchTokenAttention, WindowAttention
    from meshops.nn.position import PositionAttention

    for m in model.modules():
        if isinstance(m, PositionAttention):
            m.impl = "kernel"
        elif isinstance(m, ContinuumAttention):
            m.impl = "naive"
        elif isinstance(m, (GalerkinAttention, FourierAttention)):
            m._attend = types.MethodType(layers.dense_simple_attend, m)
        elif isinstance(m, WindowAttention):
            m.forward = types.MethodType(layers.dense_window_forward, m)
        elif isinstance(m, PatchTokenAttention):
            m.forward = types.MethodType(layers.dense_token_forward, m)
    return model


def build_model(n: int, impl: str, device: str, model: str, preset: Optional[str] = None,
                patch_size: Optional[int] = None) -> Runner:
    torch.manual_seed(0)
    over = {"patch_size": patch_size} if patch_size else {}
    net = make_model(model, preset, **over).to(device)
    if impl == "ref":
        densify(net)
    data = make_sample(n, device)
    params = sum(p.numel() for p in net.parameters()
                 if not isinstance(p, torch.nn.parameter.UninitializedParameter))
    return Runner(lambda: net(data), net.parameters(), [], {"params": params, **over})


def cases(models: Optional[list[str]] = None) -> list[Case]:
    names = available_models() if models is None else models
    B = "benchmarks.models:build_model"
    out = []
    for name in names:
        preset = PRESETS.get(name, (None, None))[0]
        if name in ("transformer_no", "pit"):
            sizes, quick = [1024, 2048, 4096, 8192, 16384], [1024, 2048]
        elif name == "patched_transformer":
            sizes, quick = [16384, 100_000, 250_000, 500_000, 1_000_000], [4096, 16384]
        else:
            sizes, quick = [1024, 4096, 16384, 65536, 262144, 1_000_000], [1024, 4096]
        mem = 16 << 30 if name == "patched_transformer" else None
        must = (100_000, 1_000_000) if name == "patched_transformer" else ()
        out.append(Case("models", name, B, sizes, quick, params={"model": name, "preset": preset},
                        desc=f"{name} (preset {preset})", ref_desc="dense attention",
                        mem_budget=mem, max_run_s=120.0, warm_n=512, must=must,
                        must_modes=("fwd",)))
        if name == "pit":
            out.append(Case("models", "pit_large", B, [16384, 100_000, 250_000, 1_000_000],
                            [16384], impls=("lib",), params={"model": name, "preset": "large"},
                            desc="pit (preset large: fps latent 2048, q 0.5%/1%)",
                            mem_budget=16 << 30, max_run_s=120.0, warm_n=4096))
        if name == "patched_transformer":
            # forward only: the flatness target (T6) is about the forward pass, and the
            # fixed-P case above already has fwd+bwd
            for ps in (4096,):
                out.append(Case("models", f"patched_transformer_p{ps}", B, sizes[1:], [],
                                impls=("lib",), modes=("fwd",),
                                params={"model": name, "preset": preset, "patch_size": ps},
                                desc=f"{name} (preset {preset}, patch_size={ps}: N/{ps} "
                                     f"patches)",
                                mem_budget=mem, max_run_s=120.0, warm_n=2 * ps,
                                must=(100_000, 1_000_000), must_modes=("fwd",)))
    return out


# ------------------------------------------------------------------ training throughput
TRAIN_CONFIGS = [("elasticity", 972, 8, 4), ("100k", 100_000, 1, 2)]  # name, N, batch, steps


def _step_time(net, data) -> float:
    t0 = time.perf_counter()
    out = net(data)
    out.float().sum().backward()
    return time.perf_counter() - t0


def train_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Child: samples/s of the Trainer on ``spec`` (model, preset, n, batch, steps)."""
    from meshops.training import Trainer

    torch.manual_seed(0)
    name, n, batch, steps = spec["model"], spec["n"], spec["batch"], spec["steps"]
    device, budget = spec["device"], spec["step_budget_s"]
    res: dict[str, Any] = {"status": "ok"}
    if n > 16384:  # probe before committing to a possibly hours-long step
        net = make_model(name, spec["preset"]).to(device)
        hist = []
        for m in (4096, 8192):
            d = make_sample(m, device)
            _step_time(net, d)                     # warm-up
            hist.append((m, _step_time(net, d)))
        pred = predict_time(hist, n) * batch
        res["probe"] = {"sizes": hist, "predicted_step_s": pred}
        if pred > budget:
            return {"status": "skipped", "predicted_step_s": pred,
                    "error": f"predicted {pred:.0f} s per step (probes {hist}) > "
                             f"{budget:.0f} s budget"}
        del net
    net = make_model(name, spec["preset"])
    data = [make_sample(n, "cpu", seed=i, target=True) for i in range(batch * steps)]
    trainer = Trainer(net, data, None, epochs=2, batch_size=batch, progress=False, log=None,
                      device=device, seed=0)
    t0 = time.perf_counter()
    hist = trainer.fit()
    res.update({"total_s": time.perf_counter() - t0, "epoch_s": [h["time_s"] for h in hist],
                "samples": len(data), "step_s": hist[-1]["time_s"] / steps,
                "samples_per_s": len(data) / hist[-1]["time_s"],
                "params": sum(p.numel() for p in net.parameters()),
                "train_loss": [h["train_loss"] for h in hist]})
    return res


def run_training(iso, device: str, quick: bool, step_budget_s: float, mem_budget: int,
                 log, models: Optional[list[str]] = None, max_foreign: Optional[float] = None,
                 retries: int = 2, retry_wait_s: float = 600.0) -> list[dict[str, Any]]:
    from benchmarks.harness import wait_quiet

    names = available_models() if models is None else models
    order = [m for m in ("pit", "transformer_no") if m in names] + \
            [m for m in names if m not in ("pit", "transformer_no")]
    rows = []
    for name in order:
        for cfg, n, batch, steps in TRAIN_CONFIGS:
            if quick and n > 1000:
                continue
            preset = PRESETS.get(name, (None, None))[0 if cfg == "elasticity" else 1]
            spec = {"model": name, "preset": preset, "n": n, "batch": batch, "steps": steps,
                    "device": device, "step_budget_s": step_budget_s}
            for attempt in range(retries + 1):
                res = iso.run("benchmarks.models:train_child", spec,
                              timeout=300 + 3 * (steps + 1) * step_budget_s, mem_limit=mem_budget)
                f = res.get("foreign_cpu")
                if max_foreign is None or f is None or f <= max_foreign or attempt == retries \
                        or res.get("status") != "ok":
                    break
                log(f"    {name} {cfg}: {f} cores busy with other work; waiting, then again")
                wait_quiet(max_foreign, retry_wait_s, log)
            row = {"suite": "training", "case": name, "impl": "lib", "config": cfg, "n": n,
                   "batch": batch, "preset": preset, "status": res.get("status"),
                   "load1": res.get("load1"), "foreign_cpu": res.get("foreign_cpu"),
                   "attempts": attempt + 1,
                   "notes": [res["error"]] if res.get("error") else []}
            for k in ("samples_per_s", "step_s", "epoch_s", "params", "predicted_step_s",
                      "probe", "train_loss"):
                if k in res:
                    row[k] = res[k]
            rows.append(row)
            sps = row.get("samples_per_s")
            log(f"  training {name:<22} {cfg:<10} N={n:<7} batch={batch}  "
                + (f"{sps:8.2f} samples/s ({row['step_s']:.3f} s/step)" if sps is not None
                   else f"{row['status']}: {'; '.join(row['notes'])[:150]}")
                + f"  load {row['load1']} foreign {row['foreign_cpu']}")
    return rows
