"""How much memory a model will take, asked before it takes it.

A model is first built on PyTorch's ``meta`` device (:func:`skeleton`): every
parameter and buffer with its shape and dtype, no storage. That is enough to check a
checkpoint's weights against its config, and the size of a config, before
allocating anything: an edited 35 KB checkpoint, or ``width: 1000000000``, is then
refused in milliseconds instead of after gigabytes and minutes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn


def skeleton(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` run on the ``meta`` device: the module with shapes and no storage.

    Building on ``meta`` draws no random numbers (the global generators are left as
    they were), so a real build after it gives the same initial weights.
    """
    with torch.device("meta"):
        return build()


def module_bytes(module: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of the parameters and buffers of ``module`` (floating ones counted in
    ``dtype`` when given, as after ``module.to(dtype)``)."""
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        size = torch.finfo(dtype).bits // 8 if dtype is not None and t.is_floating_point() \
            else t.element_size()
        total += t.numel() * size
    return total


def available_bytes(device: Any = None) -> int | None:
    """Free memory on ``device`` (a CUDA device's free memory, else the host's
    available memory), or ``None`` when it cannot be told."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        return None


def too_big(nbytes: int, device: Any = None, what: str = "the model") -> str:
    """Why ``nbytes`` cannot be allocated on ``device`` (``""`` when it can, or when
    the free memory is unknown)."""
    free = available_bytes(device)
    if free is None or nbytes <= free:
        return ""
    return (f"{what} needs {format_bytes(nbytes)} but {format_bytes(free)} of memory is "
            f"available on {torch.device(device) if device is not None else 'cpu'}")


def format_bytes(n: int) -> str:
    if n >= 1e15:
        return f"{n:.3g} bytes"
    return f"{n / 1e9:.3g} GB" if n < 1e12 else f"{n / 1e9:,.0f} GB"
