"""A finite input that drives the model to a non-finite output is a failure of the model
on that sample (issue 20, item 1): ``evaluate`` and validation during training count it,
name it, and their statistics say so (inf), instead of calling the target "zero
everywhere" and leaving the sample out of the mean, median and worst."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _folders import data, run, run_cli, tiny_model, tiny_samples, train, write_folder  # noqa: F401

from meshops.training import Trainer, lp_errors, summarize_errors

pytestmark = pytest.mark.usefixtures("one_thread")


def _huge_input(fields):
    # finite in float32 (< 3.4e38), but no attention layer survives it
    fields["f"][4] = 1e30


def test_lp_errors_call_a_non_finite_prediction_a_failure_not_a_zero_target():
    y = torch.tensor([[1.0], [2.0], [0.0], [0.0], [3.0]])
    batch = torch.tensor([0, 0, 1, 1, 2])
    pred = torch.tensor([[1.0], [float("nan")], [float("inf")], [0.0], [2.0]])
    e = lp_errors(pred, y, None, batch)
    assert e["failed"].tolist() == [True, True, False]
    # sample 1: its target is zero, but the model failed on it: a failure, not undefined
    assert e["zero_target"].tolist() == [False, False, False]
    assert e["relative"][:2].tolist() == [math.inf, math.inf]
    assert e["relative"][2].item() == pytest.approx(1 / 3)
    st = summarize_errors(e["relative"].tolist(), ["a", "b", "c"])
    assert st["failed"] == ["a", "b"] and st["undefined"] == [] and st["n"] == 3
    assert st["mean"] == math.inf and st["max"] == math.inf and st["worst_sample"] in ("a", "b")


def _not_json(constant: str):
    raise ValueError(f"{constant} is not standard JSON")


def test_evaluate_counts_names_and_reports_a_failed_sample(run, tmp_path, capsys):
    test = write_folder(tmp_path / "test", n=3, edits={1: _huge_input})
    code, out, err = run_cli(capsys, ["evaluate", run, "--data", test, "--json",
                                      "--no-baselines"])
    assert code == 0, err
    assert f"{test / 's1.vtu'}: the model predicts a non-finite value" in err
    assert "zero everywhere" not in err
    res = json.loads(out, parse_constant=_not_json)  # standard JSON: no Infinity, NaN
    assert res["failed"] == ["s1.vtu"]
    # issue 38: the distance bins wrote Infinity for the failed sample's errors
    worst = [b["max_error"] for b in res["distance"]["bins"]]
    assert None in worst and all(v is None or math.isfinite(v) for v in worst)
    st = res["fields"]["u"]["l2"]
    assert st["failed"] == ["s1.vtu"] and st["undefined"] == [] and st["n"] == 3
    # inf has no JSON form: null, with the sample named in "failed"
    assert st["mean"] is None and st["max"] is None and st["worst_sample"] == "s1.vtu"
    assert res["samples"][1]["u"]["l2"] is None
    # the other two samples' errors are finite and their median is the statistics'
    finite = [s["u"]["l2"] for s in res["samples"] if s["file"] != "s1.vtu"]
    assert all(math.isfinite(v) for v in finite)
    assert st["median"] == pytest.approx(max(finite))  # median of (a, b, inf)
    code, out, err = run_cli(capsys, ["evaluate", run, "--data", test, "--no-baselines"])
    assert code == 0
    assert "the model FAILED on 1 of 3 meshes" in out and "s1.vtu" in out
    row = next(line for line in out.splitlines() if "rel. L2 (quad)" in line)
    assert row.split()[4] == "inf"  # the mean column


def test_validation_counts_a_failed_sample_in_the_statistics():
    model = tiny_model()
    val = tiny_samples(3, {2: _huge_input})
    for i, s in enumerate(val):
        s.source = f"v{i}"
    tr = Trainer(model, tiny_samples(2), val, epochs=1, batch_size=2, progress=False, log=None)
    with pytest.warns(UserWarning, match=r"non-finite value .* on 1 sample\(s\).*: v2"):
        res = tr.evaluate()
    assert res["failed"] == 1 and res["l2_undefined"] == 0 and res["n"] == 3
    assert res["l2_mean"] == math.inf and res["l2_max"] == math.inf
    assert math.isfinite(res["l2_median"])


def test_training_with_val_data_says_the_model_failed(tmp_path, capsys):
    data = write_folder(tmp_path / "data")
    val = write_folder(tmp_path / "val", n=2, edits={1: _huge_input})
    code, out, err = train(capsys, data, tmp_path / "run", "--val-data", val)
    hist = json.loads((tmp_path / "run" / "history.json").read_text())
    assert hist[0]["val"]["failed"] == 1 and hist[0]["val_l2"] == math.inf
    assert "non-finite prediction on 1 of 2" in out
    # no epoch had a finite validation error: nothing to call best, and it is said
    assert code == 2 and "no epoch had a finite validation error" in err
    assert not (tmp_path / "run" / "best.pt").exists() and (tmp_path / "run" / "last.pt").exists()
