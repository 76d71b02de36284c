import os
import sys
from pathlib import Path

import pytest
import torch

# Test helpers (_meshes.py) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))
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
#     pytest tests/test_nn_*.py tests/test_models.py -m cuda -n 0
@pytest.fixture(params=_devices.params())
def device(request) -> _devices.Device:
    return request.param


@pytest.fixture(params=_devices.params(bf16=False))
def device64(request) -> _devices.Device:
    return request.param
