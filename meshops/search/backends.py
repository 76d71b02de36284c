"""Backend registry: which implementations exist, which is used by default.

Four backends implement the same per-operation interface (see
:class:`SearchBackend`); all give the same results up to ties between equal
distances:

=================  =========================  ===========================================
backend            operations                 notes
=================  =========================  ===========================================
``torch_cluster``  knn, radius, fps           PyG's compiled kernels; used on CUDA when
                                              installed (optional extra ``cluster``).
``scipy``          knn, radius                ``cKDTree`` per sample, multi-threaded; the
                                              CPU default for knn/radius.
``fpsample``       fps                        QuickFPS bucket k-d tree, float32, ``d <= 8``;
                                              the CPU default for fps.
``torch``          knn, radius, fps           chunked exact ``cdist`` + ``topk`` and the
                                              plain greedy FPS loop; works on any device,
                                              default on CUDA without torch_cluster.
=================  =========================  ===========================================
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Optional, Protocol, Union

import torch
from torch import Tensor

from meshops.errors import MeshError

#: Operations of the backend interface.
OPS = ("knn", "radius", "fps")

#: Which backend implements which operation.
SUPPORTS: dict[str, tuple[str, ...]] = {
    "torch_cluster": ("knn", "radius", "fps"),
    "scipy": ("knn", "radius"),
    "fpsample": ("fps",),
    "torch": ("knn", "radius", "fps"),
}

#: Preference order per (operation, device type): the first available one is the
#: default. On CPU the tree-based libraries win by orders of magnitude over brute
#: force; on CUDA brute force is fast and avoids host round trips.
_PREFERENCE: dict[tuple[str, str], tuple[str, ...]] = {
    ("knn", "cpu"): ("scipy", "torch_cluster", "torch"),
    ("radius", "cpu"): ("scipy", "torch_cluster", "torch"),
    ("fps", "cpu"): ("fpsample", "torch_cluster", "torch"),
    ("knn", "cuda"): ("torch_cluster", "torch"),
    ("radius", "cuda"): ("torch_cluster", "torch"),
    ("fps", "cuda"): ("torch_cluster", "torch"),
}

#: Implementation module of each backend (imported lazily, so that importing
#: meshops never pays for, or fails on, an optional library).
_MODULES = {
    "torch_cluster": "meshops.search._torch_cluster_backend",
    "scipy": "meshops.search._scipy_backend",
    "fpsample": "meshops.search._fpsample_backend",
    "torch": "meshops.search._torch_backend",
}

#: Library each backend needs (None: only torch).
_LIBRARY = {"torch_cluster": "torch_cluster", "scipy": "scipy.spatial",
            "fpsample": "fpsample", "torch": None}

#: fpsample's C++ kernels are compiled for at most 8 coordinates.
FPSAMPLE_MAX_DIM = 8


class SearchBackend(Protocol):
    """Interface of a backend module (operations it lacks are simply absent).

    ``ptr_*`` are CSR pointers ``[B + 1]`` (Python ints) of the contiguous samples;
    outputs use global indices and PyG's layout (row 0 indexes ``y``).
    """

    def knn(self, x: Tensor, y: Tensor, k: int, ptr_x: list[int],
            ptr_y: list[int]) -> Tensor: ...

    def radius(self, x: Tensor, y: Tensor, r: float, max_num_neighbors: int,
               ptr_x: list[int], ptr_y: list[int]) -> Tensor: ...

    def fps(self, pos: Tensor, ptr: list[int], counts: list[int],
            starts: list[int]) -> Tensor: ...


@functools.lru_cache(maxsize=None)
def _import_error(name: str) -> Optional[str]:
    """None when the backend's library imports, else the reason it does not."""
    lib = _LIBRARY[name]
    if lib is None:
        return None
    try:
        importlib.import_module(lib)
    except Exception as exc:  # noqa: BLE001 - broken binary wheels raise OSError etc.
        return f"{type(exc).__name__}: {exc}"
    return None


def available_backends() -> dict[str, bool]:
    """Which backends can be used in this environment.

    Returns:
        ``{"torch_cluster": bool, "scipy": bool, "fpsample": bool, "torch": True}``.

    Shapes:
        No tensors.
    """
    return {name: _import_error(name) is None for name in SUPPORTS}


def _device_type(device: Union[str, torch.device, None]) -> str:
    dev = torch.device("cpu" if device is None else device)
    # Any accelerator that is not CUDA (mps, xpu) gets the portable torch backend.
    return dev.type if dev.type in ("cpu", "cuda") else "other"


def default_backend(op: str, device: Union[str, torch.device, None] = "cpu") -> str:
    """The backend used when ``backend=None`` for operation ``op`` on ``device``.

    Args:
        op: ``"knn"``, ``"radius"`` or ``"fps"``.
        device: Device of the input tensors (``"cpu"``, ``"cuda"``, a torch.device).

    Returns:
        The backend name, e.g. ``"scipy"`` for knn on CPU. (For fps on points with more
        than 8 coordinates, ``fps`` skips ``"fpsample"`` and uses the next one.)

    Shapes:
        No tensors.
    """
    if op not in OPS:
        raise MeshError(f"default_backend: op must be one of {OPS}, got {op!r}")
    kind = _device_type(device)
    order = _PREFERENCE.get((op, kind), ("torch",))
    return next(name for name in order if _import_error(name) is None)


def resolve_backend(op: str, backend: Optional[str], device: torch.device, fn: str,
                    *, dim: Optional[int] = None) -> str:
    """Check an explicit ``backend`` argument, or pick the default one."""
    if backend is None:
        name = default_backend(op, device)
        if name == "fpsample" and dim is not None and dim > FPSAMPLE_MAX_DIM:
            order = _PREFERENCE.get((op, _device_type(device)), ("torch",))
            name = next(n for n in order if n != "fpsample" and _import_error(n) is None)
        return name
    if backend not in SUPPORTS:
        raise MeshError(f"{fn}: backend must be one of {tuple(SUPPORTS)} or None, "
                        f"got {backend!r}")
    if op not in SUPPORTS[backend]:
        others = tuple(n for n, ops in SUPPORTS.items() if op in ops)
        raise MeshError(f"{fn}: backend={backend!r} does not implement {op}; "
                        f"use one of {others}")
    reason = _import_error(backend)
    if reason is not None:
        raise MeshError(f"{fn}: backend={backend!r} is not available ({reason}); "
                        f"available_backends() lists the usable ones")
    if backend == "fpsample" and dim is not None and dim > FPSAMPLE_MAX_DIM:
        raise MeshError(f"{fn}: backend='fpsample' supports at most {FPSAMPLE_MAX_DIM} "
                        f"coordinates, pos has d={dim}")
    return backend


def get_backend(name: str) -> ModuleType:
    """Implementation module of backend ``name`` (see :class:`SearchBackend`)."""
    return importlib.import_module(_MODULES[name])
