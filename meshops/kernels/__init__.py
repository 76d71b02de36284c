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

Imports nothing of meshops: the layers of :mod:`meshops.nn` call it, and fall back to
PyTorch without it.
"""

from meshops.kernels.attention import (
                                       attention_extension,
                                       attention_kernel,
                                       build_attention_kernel,
                                       kernels_enabled,
)
from meshops.kernels.build import KernelBuildError

__all__ = ["KernelBuildError", "attention_extension", "attention_kernel",
           "build_attention_kernel", "kernels_enabled"]
