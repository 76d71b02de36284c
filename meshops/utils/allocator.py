"""CPU allocator setting for large meshes: keep freed memory for reuse.

glibc's ``malloc`` serves every block above 32 MiB with a fresh ``mmap`` and gives it
back to the operating system on ``free``.  A forward/backward pass on a 250k-point
mesh allocates and frees dozens of such tensors, so every step touches brand-new
pages and the kernel zero-fills each 4 KiB page on first touch: a layer's time per
point grows once its tensors pass that size, and keeping freed memory takes the
growth away (``python -m benchmarks --only layers --cases galerkin,galerkin_keepmem``
measures both; the figures are in the README).

:func:`keep_freed_memory` switches glibc to serve large blocks from its heap and to
never hand freed memory back, so that later steps reuse pages already mapped.  This
is what PyTorch's CPU tuning guide gets from jemalloc/TCMalloc via ``LD_PRELOAD``,
without a preload; the environment variable
``GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=<bytes>`` does the
same for a whole program.

The price is resident memory.  The process keeps its peak heap until it exits, and
blocks freed in the middle of the heap are reused only by requests that fit: glibc
before 2.38 serves PyTorch's 64-byte-aligned requests with a few bytes to spare, so
a freed block is not always reused for the next tensor of the same size, so the
resident size can grow to a few times the steps' peak before it levels off
(``python -m benchmarks.keep_freed_memory`` measures step time, page faults and
resident size with and without it).  Use it for long runs on large meshes when memory
is not the limit.
"""

from __future__ import annotations

import ctypes
import platform
import warnings

__all__ = ["keep_freed_memory"]

# mallopt() parameters, <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1


def keep_freed_memory() -> bool:
    """Make glibc ``malloc`` keep freed memory of this process for reuse.

    Process-wide and for the rest of the process's life: large blocks come from the
    heap instead of fresh ``mmap`` s (``M_MMAP_MAX = 0``), and freed heap memory is
    returned to the OS only above 2 GiB of free space at the top of the heap
    (``M_TRIM_THRESHOLD``).  Repeated training or inference steps on large meshes then
    stop paying a page fault per 4 KiB of every temporary tensor, at the cost of a
    larger resident size (see the module docstring for measured figures).  Covers the
    main thread's heap, where PyTorch's CPU forward and backward passes allocate;
    glibc's per-thread arenas still ``mmap`` blocks above their 64 MiB heap size.

    Returns:
        bool: True when the setting took effect; False (with a warning, nothing
        changed) when the C library is not glibc, e.g. on macOS or Windows.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        warnings.warn("keep_freed_memory: the C library is not glibc "
                      f"({platform.system()} {platform.libc_ver()[0] or 'unknown libc'}); "
                      "allocator left unchanged", RuntimeWarning, stacklevel=2)
        return False
    libc = ctypes.CDLL(None)
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX) == 1
    if not ok:  # pragma: no cover - glibc accepts both values
        warnings.warn("keep_freed_memory: glibc mallopt refused the setting",
                      RuntimeWarning, stacklevel=2)
    return ok
