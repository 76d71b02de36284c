import os
import sys
from pathlib import Path

import torch

# Test helpers (_meshes.py) live beside the tests.
sys.path.insert(0, str(Path(__file__).parent))

# pytest-xdist runs one worker per core; more intra-op threads than cores only thrash.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
