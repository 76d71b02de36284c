import os
import sys
from pathlib import Path

import pytest
import torch

# Test helpers (_meshes.py) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))

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
