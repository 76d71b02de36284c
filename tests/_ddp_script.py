"""Run by test_training.py under ``torchrun --nproc_per_node=2``: train the toy model
data-parallel on CPU (gloo) and leave, per rank, ``OUT/rank{r}.pt`` with the final
parameters, the history, the files the rank wrote and the lines it logged.

Usage: python -m torch.distributed.run --nproc_per_node=2 --standalone _ddp_script.py OUT
"""

import os
import sys
from pathlib import Path

import torch

# test_training.py and the helpers it imports (_meshes.py)
sys.path[:0] = [str(Path(__file__).parent / "training"), str(Path(__file__).parent)]

from test_training import DDP_KW, ddp_data, ddp_model  # noqa: E402

import meshops.models.base as base_mod  # noqa: E402
from meshops.training import callbacks as callbacks_mod  # noqa: E402
from meshops.training.trainer import Trainer  # noqa: E402


def main(out: Path) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])

    # Record every file this rank writes (checkpoints, history) through atomic_write.
    writes: list[str] = []
    for mod in (callbacks_mod, base_mod):
        def recording(path, write, _orig=mod.atomic_write):
            writes.append(str(path))
            return _orig(path, write)
        mod.atomic_write = recording
    logs: list[str] = []

    train, val = ddp_data()
    model = ddp_model()
    trainer = Trainer(model, train, val, batch_size=2, out_dir=out / "run", log=logs.append,
                      **DDP_KW)
    assert trainer.dist.active and trainer.dist.world_size == 2
    history = trainer.fit()
    assert not torch.distributed.is_initialized()  # fit() destroyed the group

    torch.save({
        "world_size": trainer.dist.world_size,
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "history": history, "writes": writes, "logs": logs,
        "n_best": sum(Path(p).name == "best.pt" for p in writes),
    }, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
