"""Compiled CPU kernels, built on first use or ahead of time.

:func:`attention_extension` compiles ``attention_cpu.cpp`` the first time it is
needed (one to three minutes, with a notice before and the time taken after; a C++
compiler and ``ninja`` are required), or ``meshops build-kernels`` does it ahead of
time.  The result is cached in ``$TORCH_EXTENSIONS_DIR/meshops`` (by default
``~/.cache/torch_extensions/meshops``) in a folder keyed by the source, the torch
version and the Python ABI, so venvs and torch versions do not rebuild over each
other.  Nothing is compiled at import.

A build never waits without bound (:mod:`meshops.kernels.build`): builders exclude
each other with an OS file lock that dies with its holder, so a killed build leaves
no stale lock, and a process gives up waiting for another's build, or for its own
compile, after ``MESHOPS_KERNEL_TIMEOUT`` seconds (default 600).  Where the kernel
cannot be had (no compiler, a CPU without AVX2, the time limit), it warns once and
returns ``None``; the layers then use PyTorch's own fused attention, which gives the
same numbers more slowly.  A loaded kernel is registered as the PyTorch operators
``torch.ops.meshops.fused_attention`` and ``fused_attention_backward`` (with fake
implementations, so ``torch.compile`` traces through them); none is registered
without the kernel.  ``MESHOPS_KERNELS=0`` in the environment turns the kernels
off.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

from meshops.kernels.build import Built, Extension, KernelBuildError, ensure_built, load_module

__all__ = ["KernelBuildError", "attention_extension", "attention_kernel",
           "build_attention_kernel", "kernels_enabled"]

_SOURCE = Path(__file__).with_name("attention_cpu.cpp")
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}

# Compiler flags per ATen CPU capability: the kernels use ATen's Vectorized<T>, whose
# SIMD specialisations are chosen by these macros.
_FLAGS = {
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c",
               "-DCPU_CAPABILITY_AVX512", "-DCPU_CAPABILITY=AVX512"],
}


def kernels_enabled() -> bool:
    """False when ``MESHOPS_KERNELS`` is set to ``0``/``false``/``no``/``off``."""
    return os.environ.get("MESHOPS_KERNELS", "1").strip().lower() not in ("0", "false", "no",
                                                                          "off")


def attention_kernel() -> Extension:
    """The fused-attention extension for this CPU (sources, flags, cache location).

    Raises :class:`KernelBuildError` on a CPU without AVX2.
    """
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in _FLAGS:
        raise KernelBuildError(f"no fused CPU attention kernel for CPU capability {cap!r} "
                               f"(AVX2 or AVX512 needed)")
    return Extension(name=f"meshops_attention_{cap.lower()}", sources=(_SOURCE,),
                     cflags=("-O3", "-fopenmp", *_FLAGS[cap]), ldflags=("-fopenmp",),
                     title="the fused CPU attention kernel")


def build_attention_kernel(force: bool = False) -> Built:
    """Compile the fused-attention kernel into the cache unless it is there (or ``force``).

    Returns where it is and how long the compile took (``None``: already built).
    Raises :class:`KernelBuildError` when it cannot be built.
    """
    return ensure_built(attention_kernel(), force=force)


def attention_extension() -> Optional[ModuleType]:
    """The compiled fused-attention module, or ``None`` where it cannot be had.

    Builds it on the first call if the cache lacks it (bounded by
    ``MESHOPS_KERNEL_TIMEOUT``).  Thread-safe; attempted once per process, with one
    warning when it fails.
    """
    if not kernels_enabled():
        return None
    with _LOCK:
        if "attention" not in _STATE:
            _STATE["attention"] = _load_attention()
        return _STATE["attention"]  # type: ignore[return-value]


def _load_attention() -> Optional[ModuleType]:
    try:
        ext = attention_kernel()
        module = load_module(ext.name, ensure_built(ext).path)
        # the kernel as PyTorch operators (torch.compile traces through them): all
        # parts at once, or nothing and no kernel
        from meshops.kernels.attention import _register_ops

        _register_ops()
        return module
    except Exception as err:  # noqa: BLE001 - any failure means "use PyTorch's attention"
        reason = str(err) if isinstance(err, KernelBuildError) else f"{type(err).__name__}: {err}"
        warnings.warn(f"meshops: the fused CPU attention kernel is not available ({reason}); "
                      f"using PyTorch's attention, which gives the same numbers more slowly "
                      f"(MESHOPS_KERNELS=0 skips the attempt)", RuntimeWarning, stacklevel=4)
        return None
