"""The test suite's fixtures and layout.

The tests mirror the package, as PyG's ``test/`` does: ``tests/nn/`` tests ``meshops.nn``,
``tests/runs/`` tests ``meshops.runs``, and so on; what lies outside the package has its own
folder (``benchmarks/``, ``data_adapters/``, ``docs/`` for the docs, README and examples,
``package/`` for the layout, the import graph, the package map and the PyG conventions).
The helpers every folder shares (``_meshes.py``, ``_folders.py``, ...), the scripts that
tests run under torchrun (``_ddp_script.py``, ``_lazy_ddp_script.py``) and the test of the
tests' own child processes (``test_procs.py``) stay in ``tests/`` itself.

The folders are not packages (no ``__init__.py``): pytest's default import mode puts a test
file's folder on ``sys.path`` and imports the file by its basename, so basenames are unique
across folders (``nn/test_compile.py``, ``models/test_model_compile.py``). Some tests import
helpers from other test files by that basename (``from test_cli import _write_dataset``), so
``tests/`` and each of its folders go on ``sys.path`` here, whichever files a run collects.
"""
import os
import sys
from pathlib import Path

import pytest
import torch

_TESTS = Path(__file__).parent
sys.path[:0] = [str(_TESTS)] + sorted(str(d) for d in _TESTS.iterdir()
                                     if d.is_dir() and any(d.glob("test_*.py")))
import _devices  # noqa: E402  (needs the path above)

# pytest-xdist runs one worker per core; more intra-op threads than cores only thrash.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test, restored afterwards: on small tensors and
    busy shared cores more threads only pay for wake-ups (10x slower here)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------ the compiled kernel
# Nothing is compiled at collection (a build there escapes pytest's timeout); tests that
# need the fused CPU kernel take the fixture below, which builds it once per session,
# bounded by MESHOPS_KERNEL_TIMEOUT, and skips them where it cannot be had. The bound is
# set below pytest's --timeout (600 s, pyproject.toml), so that a slow or stuck build
# gives up and falls back (the tests skip) before pytest kills the test that waits for it.
os.environ.setdefault("MESHOPS_KERNEL_TIMEOUT", "420")
@pytest.fixture(scope="session")
def fused_kernel_available():
    """Whether the fused CPU attention kernel could be built or loaded (once a session)."""
    from meshops.kernels import attention_extension

    return attention_extension() is not None


@pytest.fixture
def fused_kernel(fused_kernel_available):
    """Skip the test where the fused CPU attention kernel is not available."""
    if not fused_kernel_available:
        pytest.skip("fused CPU attention kernel not available")


@pytest.fixture(autouse=True)
def _fused_parameter_needs_kernel(request):
    """A test parametrised with the path ``"fused"`` needs the kernel, which is CPU-only."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and any(isinstance(v, str) and v == "fused"
                                    for v in callspec.params.values()):
        dev = callspec.params.get("device", callspec.params.get("device64"))
        if dev is not None and dev.is_cuda:
            pytest.skip("the fused attention kernel is CPU-only")
        request.getfixturevalue("fused_kernel")


# ------------------------------------------------------------------ devices
# Layer and model tests whose property does not depend on the device (values against a
# float64 reference, gradients, batching) take ``device``: they run on the CPU, on CUDA
# and on CUDA under bf16 autocast (tests/_devices.py says how and with what tolerance);
# ``device64`` leaves out bf16 for float64-only checks (gradcheck, rounding-level
# equalities). Without a GPU the CUDA variants skip, saying so. On a GPU machine:
#     pytest tests/nn tests/models -m cuda -n 0
@pytest.fixture(params=_devices.params())
def device(request) -> _devices.Device:
    return request.param


@pytest.fixture(params=_devices.params(bf16=False))
def device64(request) -> _devices.Device:
    return request.param
