"""Neighbour-search benchmarks: ``knn`` (k = 16, self query), ``fps`` (4096 points) and
``partition`` (256 parts) on ``N`` points uniform in the unit cube (3-D), for every
installed backend (``impl`` = backend name; for ``partition`` the method).

The time includes input validation and the host/device transfers a backend does, i.e.
what a caller of :func:`meshops.knn` pays.  ``meta.default`` marks the backend that
``backend=None`` picks on this device.
"""

from __future__ import annotations

import torch

from benchmarks.harness import Case, Runner, device_kind

K = 16
FPS_NUM = 4096
PARTS = 256
SIZES = [10_000, 100_000, 1_000_000]
QUICK = [10_000, 100_000]


def _pos(n: int, device: str) -> torch.Tensor:
    return torch.rand(n, 3, generator=torch.Generator().manual_seed(0)).to(device)


def build_knn(n: int, impl: str, device: str) -> Runner:
    from meshops.search import default_backend, knn

    pos = _pos(n, device)
    return Runner(lambda: knn(pos, pos, K, backend=impl), meta={
        "default": default_backend("knn", device) == impl, "k": K})


def build_fps(n: int, impl: str, device: str) -> Runner:
    from meshops.search import default_backend, fps

    pos = _pos(n, device)
    return Runner(lambda: fps(pos, num=min(FPS_NUM, n), backend=impl), meta={
        "default": default_backend("fps", device) == impl, "num": FPS_NUM})


def build_partition(n: int, impl: str, device: str) -> Runner:
    from meshops.search import partition

    pos = _pos(n, device)
    return Runner(lambda: partition(pos, PARTS, method=impl), meta={"parts": PARTS})


def backends_for(op: str, device: str) -> list[str]:
    """Installed backends implementing ``op`` that make sense on ``device`` (the CPU-only
    libraries are skipped on CUDA)."""
    from meshops.search import available_backends
    from meshops.search.backends import SUPPORTS

    avail = available_backends()
    names = [b for b, ok in avail.items() if ok and op in SUPPORTS[b]]
    if device_kind(device) == "cuda":
        names = [b for b in names if b in ("torch", "torch_cluster")]
    return names


def cases(device: str = "cpu") -> list[Case]:
    from meshops.search import default_backend
    from meshops.search.partition import METHODS

    B = "benchmarks.search:"
    return [
        Case("search", "knn", B + "build_knn", SIZES, QUICK, impls=tuple(backends_for(
            "knn", device)), modes=("fwd",), desc=f"knn(pos, pos, k={K}), 3-D", warm_n=2048,
            max_run_s=60.0, must=(1_000_000,), must_impls=(default_backend("knn", device),)),
        Case("search", "fps", B + "build_fps", SIZES, QUICK, impls=tuple(backends_for(
            "fps", device)), modes=("fwd",), desc=f"fps(pos, num={FPS_NUM}), 3-D",
            warm_n=8192, max_run_s=60.0, must=(1_000_000,),
            must_impls=(default_backend("fps", device),)),
        Case("search", "partition", B + "build_partition", SIZES, QUICK, impls=tuple(METHODS),
             modes=("fwd",), desc=f"partition(pos, {PARTS}, method), 3-D", warm_n=4096,
             max_run_s=60.0),
    ]
