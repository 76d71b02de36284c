"""Compiled CPU kernels, built on first use.

:func:`attention_extension` compiles ``attention_cpu.cpp`` with
:func:`torch.utils.cpp_extension.load` the first time it is needed (about a minute; a
C++ compiler and ``ninja`` are required, and the result is cached in PyTorch's
extension directory, ``TORCH_EXTENSIONS_DIR``).  Where that is impossible (no compiler,
a CPU without AVX2), it warns once and returns ``None``; the layers then use
PyTorch's own fused attention, which gives the same numbers more slowly.
``MESHOPS_KERNELS=0`` in the environment turns the kernels off.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

__all__ = ["attention_extension", "kernels_enabled"]

_SOURCE = Path(__file__).with_name("attention_cpu.cpp")
_LOG = logging.getLogger(__name__)
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


def attention_extension() -> Optional[ModuleType]:
    """The compiled fused-attention module, or ``None`` where it cannot be built.

    Thread-safe; the build is attempted once per process.
    """
    if not kernels_enabled():
        return None
    with _LOCK:
        if "attention" not in _STATE:
            _STATE["attention"] = _build()
        return _STATE["attention"]  # type: ignore[return-value]


def _build() -> Optional[ModuleType]:
    import torch
    from torch.utils import cpp_extension

    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in _FLAGS:
        warnings.warn(f"meshops: no fused CPU attention kernel for CPU capability {cap!r} "
                      f"(AVX2 or AVX512 needed); using PyTorch's attention", RuntimeWarning,
                      stacklevel=3)
        return None
    if shutil.which("ninja") is None:
        # the ninja wheel's binary is not on PATH when the venv is not activated
        try:
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass
    name = f"meshops_attention_{cap.lower()}"
    try:
        built = Path(cpp_extension._get_build_directory(name, False), f"{name}.so").exists()
    except Exception:  # noqa: BLE001 - a private helper; only decides about the notice
        built = False
    if not built:
        _LOG.warning("meshops: compiling the fused CPU attention kernel (once per machine, "
                     "about a minute; MESHOPS_KERNELS=0 skips it)")
    try:
        return cpp_extension.load(
            name=name, sources=[str(_SOURCE)],
            extra_cflags=["-O3", "-fopenmp", *_FLAGS[cap]], extra_ldflags=["-fopenmp"],
            verbose=False)
    except Exception as err:  # noqa: BLE001 - any build failure means "not available"
        warnings.warn(f"meshops: could not build the fused CPU attention kernel "
                      f"({type(err).__name__}: {str(err).strip()[:500]}); using PyTorch's "
                      f"attention instead (set MESHOPS_KERNELS=0 to skip the attempt)",
                      RuntimeWarning, stacklevel=3)
        return None
