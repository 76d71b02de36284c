"""Run by test_distributed.py under ``torchrun``: ``meshops train`` with the arguments
after LOGDIR, recording per process (``LOGDIR/rank<r>-<pid>.jsonl``) which files it
hashed, parsed and read, and the epochs it started. The first process of rank
``$KILL_RANK`` to start epoch ``$KILL_EPOCH`` (0-based) kills itself (SIGKILL), as a
node that dies would (``LOGDIR/killed`` marks that it happened).

Usage: torchrun ... _lazy_ddp_script.py LOGDIR train --data ... --lazy --workers 0 ...
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import meshops.datasets.cache as cache
from meshops.cli import main
from meshops.training import trainer as trainer_mod


def _record(log_dir: Path, rank: int):
    out = open(log_dir / f"rank{rank}-{os.getpid()}.jsonl", "a")

    def note(**kw) -> None:
        out.write(json.dumps(kw) + "\n")
        out.flush()

    return note


def run(log_dir: Path, argv: list) -> int:
    rank = int(os.environ["RANK"])
    note = _record(log_dir, rank)
    note(kind="start", world=int(os.environ["WORLD_SIZE"]), t=time.time())
    get, digest, build = (cache.CachedMeshDataset.__getitem__, cache.file_digest,
                          cache._build_sample)

    def getitem(self, i):
        note(kind="read", file=Path(self.records[i % len(self)].path).name)
        return get(self, i)

    def hashed(path):
        note(kind="hash", file=Path(path).name)
        return digest(path)

    def parsed(c, read, path, key, sha):
        note(kind="parse", file=Path(path).name)
        return build(c, read, path, key, sha)

    epoch_of = trainer_mod.Trainer._train_epoch
    kill_rank, kill_epoch = int(os.environ.get("KILL_RANK", -1)), int(os.environ.get(
        "KILL_EPOCH", -1))

    def train_epoch(self, epoch):
        note(kind="epoch", epoch=epoch)
        if rank == kill_rank and epoch == kill_epoch:
            try:
                (log_dir / "killed").touch(exist_ok=False)
            except FileExistsError:  # killed once already: this is the restarted process
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return epoch_of(self, epoch)

    cache.CachedMeshDataset.__getitem__ = getitem
    cache.file_digest, cache._build_sample = hashed, parsed
    trainer_mod.Trainer._train_epoch = train_epoch
    return main(argv)


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1]), sys.argv[2:]))
