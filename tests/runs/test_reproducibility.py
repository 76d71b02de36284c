"""``meshops train --seed S`` is reproducible: two runs with one seed write bit-identical
checkpoints whatever the process did before, a run killed before its first
checkpoint and started again ends where an uninterrupted run does, and another
seed gives other weights."""

from __future__ import annotations

import pytest
import torch
from _tiny_run import tiny_args
from test_cli import _write_dataset

from meshops import cli
from meshops.training import callbacks

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py

# With a validation split: it is drawn from the seed too.
TINY = [*tiny_args(epochs=2), "--val-fraction", "0.25"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_dataset(tmp_path_factory.mktemp("data"), 4)


def _train(data, out, seed, *extra, global_seed=None):
    # A different global state before each run stands for a different process (or
    # earlier work in this one): the run must not depend on it.
    if global_seed is not None:
        torch.manual_seed(global_seed)
    code = cli.main(["train", "--data", str(data), *TINY, "--seed", str(seed),
                     "--out", str(out), *extra])
    return code


def _tensors(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}")


def _all_tensors(path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint: weights, normalisers, optimizer moments, RNG states."""
    return dict(_tensors(torch.load(path, weights_only=True)))


def _differing(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def test_one_seed_gives_bit_identical_checkpoints_and_another_seed_does_not(data, tmp_path):
    assert _train(data, tmp_path / "a", 7, global_seed=1) == 0
    assert _train(data, tmp_path / "b", 7, global_seed=2) == 0
    assert _train(data, tmp_path / "c", 8, global_seed=1) == 0
    for name in ("last.pt", "best.pt"):
        a, b = _all_tensors(tmp_path / "a" / name), _all_tensors(tmp_path / "b" / name)
        assert any(".state_dict." in k for k in a) and len(a) > 10
        assert _differing(a, b) == []
    a, c = _all_tensors(tmp_path / "a" / "last.pt"), _all_tensors(tmp_path / "c" / "last.pt")
    weights = [k for k in a if k.startswith(".state_dict.") and "normalizer" not in k]
    assert set(weights) <= set(_differing(a, c)), "another seed must give other weights"


def test_a_run_killed_before_its_first_checkpoint_restarts_to_the_same_result(
        data, tmp_path, monkeypatch):
    assert _train(data, tmp_path / "whole", 4, global_seed=1) == 0

    # Killed at the end of the first epoch, before last.pt is written: the first
    # epoch's draws are spent, and only config.yaml is on disk.
    def killed(self, trainer):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(callbacks.Checkpoints, "save_state", killed)
        assert _train(data, tmp_path / "cut", 4, global_seed=2) == 130
    assert (tmp_path / "cut" / "config.yaml").is_file()
    assert not (tmp_path / "cut" / "last.pt").exists()
    # The same command again, with --resume: there is no last.pt, so it starts over.
    assert cli.main(["train", "--out", str(tmp_path / "cut"), "--resume"]) == 0
    whole = _all_tensors(tmp_path / "whole" / "last.pt")
    again = _all_tensors(tmp_path / "cut" / "last.pt")
    assert _differing(whole, again) == []
