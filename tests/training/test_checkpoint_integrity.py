"""Checkpoints are verified before they are used: a damaged tensor (the archive's
CRC-32), a truncated file, a pickle that would run code, non-finite weights and
metadata that does not fit the weights are refused with :class:`CheckpointError`
naming the file and the problem, by ``from_checkpoint``, by a resumed ``Trainer``
and by the CLI (one line, exit 2)."""

from __future__ import annotations

import math
import os
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from _tiny_run import one_line_error, tiny_args
from test_cli import _write_dataset
from test_training import ToyOperator, make_samples

from meshops import CheckpointError, cli
from meshops.models import NeuralOperator
from meshops.training.dataset import fit_normalizers
from meshops.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


# ------------------------------------------------------------------ helpers
def _damage_largest_tensor(src: Path, dst: Path) -> str:
    """Copy ``src`` to ``dst`` with 4 bytes inverted in the middle of the largest tensor's
    bytes (found through the zip's local file header); returns that member's name."""
    with zipfile.ZipFile(src) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename),
                   key=lambda i: i.file_size)
    raw = bytearray(src.read_bytes())
    # Local file header: 30 fixed bytes (name and extra-field lengths at 26 and 28),
    # then the name and the extra field (torch pads it to align the data).
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    middle = start + info.file_size // 2
    for k in range(4):
        raw[middle + k] ^= 0xFF
    dst.write_bytes(bytes(raw))
    return info.filename.split("/", 1)[1]


class _Payload:
    """Unpickling this calls ``os.system``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def saved(tmp_path):
    """A toy model with fitted normalisers, saved; its state as a plain dict."""
    samples = make_samples(3, 4, shift=3.0, scale=2.0)
    torch.manual_seed(0)
    model = ToyOperator(hidden=8)
    model.set_normalizers(*fit_normalizers(samples))
    path = model.save(tmp_path / "m.pt", inputs=["a"], targets=["u"])
    return path, torch.load(path, weights_only=True), samples


def _edited(state: dict, path: Path) -> Path:
    torch.save(state, path)
    return path


# ---------------------------------------------------------------- the library
def test_a_flipped_byte_in_a_tensor_is_refused_naming_the_member(saved, tmp_path):
    path, _, samples = saved
    bad = tmp_path / "bad.pt"
    member = _damage_largest_tensor(path, bad)
    # torch.load alone does not notice: the damage would reach the predictions.
    raw = torch.load(bad, weights_only=True)["state_dict"]
    good = torch.load(path, weights_only=True)["state_dict"]
    assert any(not torch.equal(raw[k], good[k]) for k in good)
    with pytest.raises(CheckpointError, match=re.escape(str(bad)) + r".*damaged.*"
                       + re.escape(repr(member)) + r".*CRC"):
        NeuralOperator.from_checkpoint(bad)
    # The untouched file still loads.
    assert torch.equal(NeuralOperator.from_checkpoint(path).predict(samples[0]),
                       NeuralOperator.from_checkpoint(path).predict(samples[0]))


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_a_truncated_file_is_refused(saved, tmp_path, keep):
    path, _, _ = saved
    cut = tmp_path / "cut.pt"
    data = path.read_bytes()
    cut.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=re.escape(str(cut)) + ".*truncated"):
        NeuralOperator.from_checkpoint(cut)


def test_a_pickle_that_calls_os_system_is_refused_and_not_run(saved, tmp_path):
    path, state, _ = saved
    marker = tmp_path / "ran"
    state["metadata"]["note"] = _Payload(marker)
    evil = _edited(state, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError) as e:
        NeuralOperator.from_checkpoint(evil)
    msg = str(e.value)
    assert msg.startswith(f"{evil}: refused") and "system" in msg and "\n" not in msg
    assert not marker.exists()


@pytest.mark.parametrize("key, index, value", [
    ("lift.0.weight", (1, 2), math.nan),
    ("proj.2.bias", (0,), math.inf),
    ("output_normalizer.mean", (0,), -math.inf),
])
def test_a_non_finite_weight_is_refused_naming_it(saved, tmp_path, key, index, value):
    _, state, _ = saved
    state["state_dict"][key][index] = value
    bad = _edited(state, tmp_path / "nan.pt")
    with pytest.raises(CheckpointError, match=re.escape(f"{bad}: {key} has 1 non-finite value(s) "
                                                        f"(first at index {list(index)}")):
        NeuralOperator.from_checkpoint(bad)


def test_a_zero_normaliser_scale_is_refused(saved, tmp_path):
    _, state, _ = saved
    state["state_dict"]["input_normalizer.std"].zero_()
    bad = _edited(state, tmp_path / "std.pt")
    with pytest.raises(CheckpointError, match="input_normalizer.std has non-positive"):
        NeuralOperator.from_checkpoint(bad)


def _wider(state):
    state["config"]["hidden"] = 16  # the weights are for hidden=8


def _no_bias(state):
    del state["state_dict"]["proj.2.bias"]


def _extra_weight(state):
    state["state_dict"]["head.weight"] = torch.zeros(2)


def _no_weights(state):
    del state["state_dict"]


def _bad_config(state):
    state["config"]["depth"] = 3


def _list_weights(state):
    state["state_dict"]["lift.0.weight"] = [[1.0]]


@pytest.mark.parametrize("edit, message", [
    (_wider, "the weights do not fit the _test_mlp model its config describes: lift.0.weight "
             "is [8, 3] in the file but [16, 3] for the config"),
    (_no_bias, "missing proj.2.bias"),
    (_extra_weight, "unexpected head.weight"),
    (_no_weights, "incomplete checkpoint: no 'state_dict'"),
    (_bad_config, "its config cannot build a _test_mlp model"),
    (_list_weights, "state_dict entry 'lift.0.weight' is a list, not a tensor"),
])
def test_inconsistent_contents_are_refused_naming_what_differs(saved, tmp_path, edit, message):
    _, state, _ = saved
    edit(state)
    bad = _edited(state, tmp_path / "odd.pt")
    with pytest.raises(CheckpointError) as e:
        NeuralOperator.from_checkpoint(bad)
    assert str(e.value).startswith(f"{bad}: ") and message in str(e.value)
    assert "\n" not in str(e.value)


# -------------------------------------------------------------- trainer resume
def _trainer(out, epochs):
    torch.manual_seed(0)
    return Trainer(ToyOperator(hidden=8), make_samples(4, 1), epochs=epochs, batch_size=2,
                   out_dir=out, progress=False, log=None, resume=True)


@pytest.fixture
def last_pt(tmp_path):
    out = tmp_path / "run"
    _trainer(out, 1).fit()
    return out / "last.pt"


def _damage(path):
    _damage_largest_tensor(path, path)


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-200])


def _nan_moment(path):
    state = torch.load(path, weights_only=True)
    state["training"]["optimizer"]["state"][0]["exp_avg_sq"][0, 0] = math.nan
    torch.save(state, path)


def _short_history(path):
    state = torch.load(path, weights_only=True)
    state["training"]["history"] = []
    torch.save(state, path)


@pytest.mark.parametrize("edit, message", [
    (_damage, "CRC"),
    (_truncate, "truncated"),
    (_nan_moment, "training.optimizer.state.0.exp_avg_sq has 1 non-finite"),
    (_short_history, "holds 0 history entries"),
])
def test_resuming_from_a_bad_last_pt_is_refused(last_pt, edit, message):
    edit(last_pt)
    trainer = _trainer(last_pt.parent, 2)
    with pytest.raises(CheckpointError, match=re.escape(str(last_pt)) + ".*" + re.escape(message)):
        trainer.fit()


# ------------------------------------------------------------------------ CLI
TINY = [*tiny_args(), "--val-fraction", "0.25"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write_dataset(tmp_path_factory.mktemp("data"), 4)


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    assert cli.main(["train", "--data", str(data), *TINY, "--out", str(out)]) == 0
    return out


def _copy_run(run, dst):
    dst.mkdir()
    for name in ("best.pt", "last.pt", "config.yaml"):
        (dst / name).write_bytes((run / name).read_bytes())
    return dst


def test_cli_predict_refuses_a_damaged_checkpoint(run, data, tmp_path, capsys):
    bad = _copy_run(run, tmp_path / "bad")
    member = _damage_largest_tensor(run / "best.pt", bad / "best.pt")
    code = cli.main(["predict", str(bad), str(data / "s0.vtu"), "-o", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err)
    assert str(bad / "best.pt") in err and repr(member) in err and "CRC" in err
    assert not (tmp_path / "p").exists()


def test_cli_resume_refuses_a_truncated_last_pt(run, tmp_path, capsys):
    bad = _copy_run(run, tmp_path / "bad")
    (bad / "last.pt").write_bytes((run / "last.pt").read_bytes()[:1000])
    code = cli.main(["train", "--out", str(bad), "--resume", "--epochs", "2"])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err)
    assert str(bad / "last.pt") in err and "truncated" in err


def test_cli_resume_refuses_a_malicious_last_pt_without_a_traceback(run, tmp_path):
    bad = _copy_run(run, tmp_path / "bad")
    marker = tmp_path / "ran"
    state = torch.load(run / "last.pt", weights_only=True)
    state["training"]["history"][0]["note"] = _Payload(marker)
    torch.save(state, bad / "last.pt")
    proc = subprocess.run([sys.executable, "-m", "meshops", "train", "--out", str(bad),
                           "--resume", "--epochs", "2"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 2, proc.stderr
    assert one_line_error(proc.stderr), proc.stderr
    assert f"{bad / 'last.pt'}: refused" in proc.stderr and "system" in proc.stderr
    assert not marker.exists()


def _meta_edit(run, dst, **meta):
    state = torch.load(run / "best.pt", weights_only=True)
    state["metadata"].update(meta)
    dst.mkdir()
    torch.save(state, dst / "best.pt")
    return dst


@pytest.mark.parametrize("meta, message", [
    ({"inputs": ["f", "g"]}, "field(s) g have no entry in field_shapes"),
    ({"field_shapes": {"f": "scalar", "u": []}}, "field_shapes is"),
    ({"in_channels": 2}, "in_channels is 2 but the model's config has 1"),
    ({"targets": "u"}, "targets is 'u', not a list of field names"),
    # names and channel counts that disagree (RunSpec's own check)
    ({"inputs": ["f", "g"], "field_shapes": {"f": [], "g": [], "u": []}}, "2/1 channels"),
])
def test_cli_refuses_inconsistent_run_metadata(run, data, tmp_path, capsys, meta, message):
    bad = _meta_edit(run, tmp_path / "odd", **meta)
    code = cli.main(["evaluate", str(bad), "--data", str(data)])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err), err
    assert str(bad / "best.pt") in err and message in err
