"""meshops.utils.allocator: freed memory is reused without page faults (glibc only)."""

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from meshops.utils import allocator

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="keep_freed_memory sets glibc malloc parameters")

# Allocates and frees a 64 MiB array, then counts the minor page faults of allocating
# and filling a second one.  Run in a fresh interpreter: the setting is process-wide.
# numpy's plain malloc, not torch: torch's 64-byte-aligned blocks are not always
# reused under glibc < 2.38 (see meshops/utils/allocator.py), which would make this flaky.
PROBE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from meshops.utils.allocator import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory() is True
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = np.empty(1 << 23); x.fill(1.0); del x
    f0 = faults()
    x = np.empty(1 << 23); x.fill(1.0)
    print(faults() - f0)
""")
PAGES = (64 << 20) // 4096


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    return int(out.stdout.split()[-1])


@glibc
def test_freed_memory_is_reused_without_page_faults():
    # With glibc's defaults a 64 MiB block is a fresh mmap, faulting on first touch
    # page by page: 16,384 faults with 4 KiB pages, ~550 where numpy gets transparent
    # huge pages (as here).  Kept memory is already mapped: no page faults at all.
    kept, default = _faults("keep"), _faults("default")
    assert kept < 0.01 * PAGES, f"{kept} page faults re-allocating 64 MiB ({PAGES} pages)"
    assert default > kept, "the probe sees no page faults even with glibc's defaults"


def test_other_c_libraries_leave_the_allocator_alone(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("musl", "1.2"))
    with pytest.warns(RuntimeWarning, match="not glibc.*allocator left unchanged"):
        assert allocator.keep_freed_memory() is False
