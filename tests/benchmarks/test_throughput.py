"""benchmarks.throughput: the default model's samples/s from the Trainer's epochs."""

import statistics

import pytest
import torch

from benchmarks.throughput import main, measure
from meshops.fitting.defaults import PARAMETRIC_PIT
from meshops.mesh.data import MeshData


def _samples(n=6, points=40, seed=0):
    """Small parametric samples on one mesh (constant inputs): the small default PiT."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(points, 2, generator=g)
    out = []
    for i in range(n):
        p = torch.rand(2, generator=g)
        x = p.expand(points, 2).clone()
        y = (pos * p).sum(-1, keepdim=True)
        out.append(MeshData(pos=pos, x=x, y=y, weight=torch.full((points,), 1.0 / points)))
    return out


def test_throughput_is_samples_over_the_later_epochs(one_thread):
    """samples/s is the median over the epochs after the warm-up of samples / epoch
    time, s/step that time over the steps of an epoch; the model is the one
    ``meshops train --model pit`` picks for the data (a parametric map: the PiT of
    ``PARAMETRIC_PIT``)."""
    samples = _samples()
    lines = []
    r = measure(samples, "cpu", 3, False, batch_size=4, log=lines.append)
    assert r["model"] == "pit"
    assert r["model_config"]["width"] == PARAMETRIC_PIT["width"]
    assert r["steps_per_epoch"] == 2 and len(r["epoch_s"]) == 3
    assert r["samples_per_s"] == pytest.approx(
        statistics.median(6 / t for t in r["epoch_s"][1:]))
    assert r["step_s"] == pytest.approx(statistics.median(r["epoch_s"][1:]) / 2)
    assert len([ln for ln in lines if ln.startswith("  epoch")]) == 3
    with pytest.raises(ValueError, match="epochs must be >= 2"):
        measure(samples, "cpu", 1, False)


def test_cli_refuses_bad_arguments(capsys, tmp_path):
    for argv, msg in ((["--epochs", "1"], "--epochs >= 2"),
                      (["--data-dir", str(tmp_path / "no")], "no such folder"),
                      (["--device", "mps"], "--device mps: only cpu or cuda")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and msg in capsys.readouterr().err
