"""What a training step spends its time on: ``torch.profiler`` over a few steps, summarised.

Used by both sides of :mod:`benchmarks.reference` (``--profile DIR``): the reference
driver imports it from the scratch folder it is copied to (it imports nothing from
meshops: torch and the standard library only), meshops' child from here.

:func:`profile_steps` runs ``step(i)`` for ``steps`` steps under the profiler, writes a
Chrome trace (open it in ``chrome://tracing`` or https://ui.perfetto.dev) and returns
:func:`summarize`'s summary of the events:

* ``wall_s`` per step (host clock, each step ended by a device synchronisation);
* ``device_s`` per step: the summed duration of the device's kernels and copies, and
  ``device_busy`` = ``device_s / wall_s`` (low: the GPU waits for the host);
* ``syncs`` per step: host calls that wait for the device (``cudaDeviceSynchronize``,
  ``cudaStreamSynchronize``, ``cudaEventSynchronize``, blocking ``cudaMemcpy``), with
  ``sync_wait_s`` the host time spent in them; the harness itself adds one device
  synchronisation per step, ``loss.item()`` one stream synchronisation;
* ``copies`` per step by direction (``HtoD``, ``DtoH``, ``DtoD``) and their time;
* ``top_kernels``: device kernels by total time (per step, share of ``device_s``),
  ``sort_s``: the kernels whose names say sort (the reference's ``torch.quantile``);
* ``double_kernels``: kernels with ``double`` in their name (float64 work);
* ``top_ops``: operators by self host time (on the CPU: what dominates the step);
* ``compiled_frames`` / ``graph_breaks``: torch._dynamo's counters over the profiled
  steps (a frame compiled there is a recompilation inside the training loop).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Callable, Iterable, NamedTuple, Optional

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cudaMemcpy")
"""Host runtime calls that block until the device is done (``cudaMemcpy`` without
``Async``; ``cudaMemcpyAsync`` from pageable memory also blocks but is not counted)."""


class Event(NamedTuple):
    """One profiler event: ``kind`` is ``"op"`` (a host operator or annotation),
    ``"runtime"`` (a CUDA runtime call) or ``"device"`` (a kernel or copy on the GPU)."""

    name: str
    kind: str
    total_us: float
    self_us: float


def dynamo_counters() -> dict:
    """torch._dynamo's frame and graph-break counts so far (zeros without dynamo)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover
        return {"frames": 0, "graph_breaks": 0}
    return {"frames": int(counters["frames"].get("total", 0)),
            "frames_ok": int(counters["frames"].get("ok", 0)),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def _kind(evt) -> str:
    name = evt.name
    dev = str(getattr(evt, "device_type", "")).rsplit(".", 1)[-1]
    if dev in ("CUDA", "PrivateUse1", "XPU"):
        return "device"
    if name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
        return "runtime"
    return "op"


def events_of(prof) -> list[Event]:
    """:class:`Event` s from a finished ``torch.profiler.profile``."""
    out = []
    for e in prof.events():
        total = float(e.time_range.elapsed_us()) if getattr(e, "time_range", None) else 0.0
        out.append(Event(e.name, _kind(e), total, float(getattr(e, "self_cpu_time_total", 0.0))))
    return out


def _copy_direction(name: str) -> Optional[str]:
    low = name.lower()
    if "memcpy" not in low:
        return None
    for d in ("htod", "dtoh", "dtod"):
        if d in low:
            return {"htod": "HtoD", "dtoh": "DtoH", "dtod": "DtoD"}[d]
    return "other"


def summarize(events: Iterable[Event], steps: int, wall_s: float, top: int = 10,
              counters: Optional[dict] = None) -> dict:
    """The summary described in the module docstring, per step where it says so.

    Args:
        events: the profiled steps' events.
        steps: how many steps they cover.
        wall_s: host time of those steps (seconds, in total).
        top: rows in the top-kernel and top-operator lists.
        counters: dynamo counter differences over the steps (:func:`dynamo_counters`).
    """
    per = 1.0 / max(steps, 1)
    kernels: dict = defaultdict(lambda: [0, 0.0])
    ops: dict = defaultdict(lambda: [0, 0.0])
    syncs: dict = defaultdict(lambda: [0, 0.0])
    copies: dict = defaultdict(lambda: [0, 0.0])
    device_us = 0.0
    for e in events:
        if e.kind == "device":
            device_us += e.total_us
            d = _copy_direction(e.name)
            if d is not None:
                copies[d][0] += 1
                copies[d][1] += e.total_us
            else:
                kernels[e.name][0] += 1
                kernels[e.name][1] += e.total_us
        elif e.kind == "runtime":
            if e.name in SYNC_CALLS:
                syncs[e.name][0] += 1
                syncs[e.name][1] += e.total_us
        else:
            ops[e.name][0] += 1
            ops[e.name][1] += e.self_us
    wall = wall_s * per
    device = device_us * 1e-6 * per
    kern_total = sum(v[1] for v in kernels.values()) or 1.0
    top_k = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    top_o = sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]
    sort_us = sum(v[1] for k, v in kernels.items() if "sort" in k.lower())
    double = sum(v[1] for k, v in kernels.items() if "double" in k.lower())
    return {
        "steps": steps, "wall_s": wall, "device_s": device,
        "device_busy": (device / wall) if wall > 0 else None,
        "syncs": sum(v[0] for v in syncs.values()) * per,
        "sync_calls": {k: v[0] * per for k, v in sorted(syncs.items())},
        "sync_wait_s": sum(v[1] for v in syncs.values()) * 1e-6 * per,
        "copies": {k: {"n": v[0] * per, "s": v[1] * 1e-6 * per} for k, v in sorted(copies.items())},
        "sort_s": sort_us * 1e-6 * per, "double_kernels_s": double * 1e-6 * per,
        "kernels": sum(v[0] for v in kernels.values()) * per,
        "top_kernels": [{"name": k, "calls": v[0] * per, "s": v[1] * 1e-6 * per,
                         "share": v[1] / kern_total} for k, v in top_k],
        "top_ops": [{"name": k, "calls": v[0] * per, "self_s": v[1] * 1e-6 * per}
                    for k, v in top_o],
        "compiled_frames": (counters or {}).get("frames"),
        "graph_breaks": (counters or {}).get("graph_breaks"),
    }


def profile_steps(step: Callable[[int], None], steps: int, device: str, trace: str,
                  top: int = 10) -> dict:
    """Run ``step(0) ... step(steps - 1)`` under ``torch.profiler`` (CPU activity, and
    CUDA on a CUDA device), each ended by a device synchronisation; write the Chrome
    trace to ``trace``; return :func:`summarize`'s summary."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    before = dynamo_counters()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            with record_function("training_step"):
                step(i)
                if cuda:
                    torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    after = dynamo_counters()
    # written completely or not at all: a half-written trace would not load
    tmp = f"{trace}.part"
    prof.export_chrome_trace(tmp)
    os.replace(tmp, trace)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    events = [e for e in events_of(prof) if e.name != "training_step"]
    return summarize(events, steps, wall, top, delta)


def format_summary(label: str, s: dict, top: int = 8) -> list[str]:
    """Lines of a summary for the log (seconds per step)."""
    busy = s.get("device_busy")
    lines = [f"{label}: {s['steps']} profiled steps, {s['wall_s']:.3f} s/step on the host clock"
             + (f", device busy {s['device_s']:.3f} s/step ({busy:.0%})" if s["device_s"] else "")]
    if s["device_s"]:
        calls = ", ".join(f"{k} {v:g}" for k, v in s["sync_calls"].items()) or "none"
        copies = ", ".join(f"{k} {v['n']:g} ({v['s'] * 1e3:.1f} ms)"
                           for k, v in s["copies"].items()) or "none"
        lines.append(f"  syncs/step {s['syncs']:g} ({calls}), host blocked in them "
                     f"{s['sync_wait_s']:.3f} s/step; copies/step {copies}")
        lines.append(f"  kernels/step {s['kernels']:g}; sort kernels {s['sort_s'] * 1e3:.1f} "
                     f"ms/step; kernels named 'double' {s['double_kernels_s'] * 1e3:.1f} ms/step")
        for k in s["top_kernels"][:top]:
            lines.append(f"    {k['s'] * 1e3:9.2f} ms {k['share']:6.1%} x{k['calls']:<5g} "
                         f"{k['name'][:110]}")
    lines.append(f"  torch._dynamo during the profiled steps: {s['compiled_frames']} frame(s) "
                 f"compiled, {s['graph_breaks']} graph break(s); top host operators (self time):")
    for o in s["top_ops"][:top]:
        lines.append(f"    {o['self_s'] * 1e3:9.2f} ms x{o['calls']:<5g} {o['name'][:110]}")
    return lines

