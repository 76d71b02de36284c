"""Data-parallel training beyond one machine: ``torchrun --nnodes 2`` (two "nodes" on
this machine, c10d rendezvous on 127.0.0.1, gloo) on lazily read data, each process
reading only its part, resuming after one process is killed, and equal to one
process taking both parts' steps (``--shards 2``); the ShardSampler it rests on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _folders import write_folder
from _procs import kill_group

from meshops.cli import main as cli_main
from meshops.datasets.folder import list_mesh_files
from meshops.training.distributed import ShardSampler
from meshops.training.splits import validation_split

TESTS = Path(__file__).parents[1]  # holds the script torchrun runs
ROOT = TESTS.parent


def test_shard_sampler_parts_and_their_interleaving():
    # 11 samples in 3 parts: 0,3,6,9 | 1,4,7,10 | 2,5,8 (+ its first again)
    parts = [ShardSampler(11, 3, p, shuffle=True, seed=5) for p in range(3)]
    for s in parts:
        s.set_epoch(2)
    seqs = [list(s) for s in parts]
    assert [sorted(set(q)) for q in seqs] == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert all(len(q) == 4 for q in seqs) and seqs[2][3] == seqs[2][0]
    one = ShardSampler(11, 3, None, batch=2, shuffle=True, seed=5)
    one.set_epoch(2)
    # one process with 3 x 2 samples per step: step k = every part's k-th batch of 2
    assert list(one) == [i for a in (0, 2) for q in seqs for i in q[a:a + 2]]
    # the order depends on (seed, epoch) only
    again = ShardSampler(11, 3, 1, shuffle=True, seed=5)
    again.set_epoch(2)
    assert list(again) == seqs[1]
    again.set_epoch(3)
    assert list(again) != seqs[1]
    with pytest.raises(ValueError, match="3 samples cannot be dealt into 4 parts"):
        ShardSampler(3, 4)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _parts(names: list[str], val_fraction: float, seed: int, world: int) -> list[set]:
    """The files of each process: the j-th training (or validation) file is process
    j % world's, as meshops train splits and deals them."""
    train, val = validation_split(len(names), val_fraction, seed)
    return [{names[i] for part in (train, val) for j, i in enumerate(part) if j % world == r}
            for r in range(world)]


def _params(run: Path) -> dict:
    return torch.load(run / "last.pt", weights_only=True)["state_dict"]


COMMON = ["--inputs", "f", "--targets", "u", "--model", "transformer_no", "--model-config",
          "width=8", "layers=1", "heads=2", "--epochs", "4", "--lr", "3e-3", "--scheduler",
          "none", "--lazy", "--workers", "0", "--dtype", "float64", "--threads", "1",
          "--logger", "none", "--val-fraction", "0.25", "--seed", "3"]


@pytest.mark.slow
def test_two_node_torchrun_on_lazy_data_resumes_after_a_kill_and_equals_one_process(
        tmp_path, capsys):
    data = write_folder(tmp_path / "data", 12)
    names = [p.name for p in list_mesh_files(data)]  # the order meshops splits them in
    logs = tmp_path / "logs"
    logs.mkdir()
    run, cache = tmp_path / "ddp", tmp_path / "cache"
    argv = ["train", "--data", str(data), *COMMON, "--batch-size", "2", "--cache", str(cache),
            "--out", str(run), "--resume"]  # --resume: a restarted process continues
    port = _port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KILL_RANK": "1", "KILL_EPOCH": "2",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           # each agent counts its own restarts, and workers sharing the rendezvous store
           # key their process group by that count: after one node's restart the two
           # counts differ and the new group never forms (pytorch/pytorch#135712)
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
         "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
         "meshops-test", "--max-restarts", "1", "--monitor-interval", "0.5",
         str(TESTS / "_lazy_ddp_script.py"), str(logs), *argv],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
        for _ in range(2)]
    try:
        outputs = [a.communicate(timeout=300)[0] for a in agents]
    finally:
        for a in agents:  # a hung rendezvous must not outlive the test, nor its ranks
            kill_group(a)
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outputs)

    # 1. Killed once, restarted once: each rank ran twice, the second time resumed.
    assert (logs / "killed").is_file()
    by_rank = {r: sorted((p for p in logs.glob(f"rank{r}-*.jsonl")),
                         key=lambda p: _read(p)[0]["t"]) for r in (0, 1)}
    assert [len(v) for v in by_rank.values()] == [2, 2]
    epochs = {r: [[e["epoch"] for e in _read(p) if e["kind"] == "epoch"] for p in v]
              for r, v in by_rank.items()}
    assert epochs[1][0] == [0, 1, 2]  # killed as it started the third epoch
    for r in (0, 1):
        assert epochs[r][1][-1] == 3 and epochs[r][1][0] in (1, 2), epochs  # from last.pt
    history = json.loads((run / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]

    # 2. Each process hashed, parsed and read only its part of the files.
    parts = _parts(names, 0.25, 3, 2)
    for log in logs.glob("rank*.jsonl"):
        rank = int(log.name[4])
        for e in _read(log):
            if e["kind"] in ("hash", "parse", "read"):
                assert e["file"] in parts[rank], (log.name, e)
    read = {r: set().union(*({e["file"] for e in _read(p) if e["kind"] == "read"} for p in v))
            for r, v in by_rank.items()}
    assert read == {0: parts[0], 1: parts[1]}

    # 3. The same model as one process taking both parts' steps (batch 2 x 2).
    one = tmp_path / "one"
    assert cli_main(["train", "--data", str(data), *COMMON, "--batch-size", "4", "--shards",
                     "2", "--cache", str(tmp_path / "cache1"), "--out", str(one)]) == 0
    capsys.readouterr()
    a, b = _params(run), _params(one)
    assert a.keys() == b.keys()
    # float64: summation order differs (DDP averages two batch means): 1e-16 per step
    floats = [k for k in a if a[k].is_floating_point()]
    assert all(torch.equal(a[k], b[k]) for k in a if k not in floats)
    diff = max(float((a[k] - b[k]).abs().max()) for k in floats)
    print(f"largest weight difference to one process: {diff:.3g}")
    assert diff < 1e-10, diff
    single = json.loads((one / "history.json").read_text())
    assert [h["train_loss"] for h in single] == pytest.approx(
        [h["train_loss"] for h in history], rel=1e-9)


@pytest.mark.parametrize("flags, message", [
    (["--shards", "4", "--batch-size", "4"],
     "--shards 4: the training set has 3 file(s) of {data}, and each part needs one at "
     "least; give --shards 3 or fewer"),
    (["--shards", "2", "--batch-size", "3"],
     "--shards 2: the batch of 3 samples is not a multiple of it (each step takes the "
     "same number from every part); give --batch-size a multiple of 2"),
])
def test_shards_that_cannot_be_dealt_are_refused_before_training(tmp_path, capsys, flags,
                                                                 message):
    """Issue 38, item 11: more parts than training files, or a batch the parts do not
    divide, reached the sampler's and the Trainer's ValueError: a traceback."""
    from _tiny_run import one_line_error

    data = write_folder(tmp_path / "data", n=4)   # 3 training files, 1 validation
    small = [a for a in COMMON if a not in ("--lazy",)]
    code = cli_main(["train", "--data", str(data), *small, *flags, "--out",
                     str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err), err
    assert message.format(data=data) in err
    assert not (tmp_path / "run" / "best.pt").exists()
