"""Issue 39, items 1 and 2: a typed API that returns instead of printing.

``meshops.fit(data, inputs, targets, *, config, **overrides)`` takes a ``TrainConfig``
(or a mapping, or a file) and its fields as keywords, names its keywords in every error,
returns a ``Run`` with its history and choice, and logs its progress: silent with
``verbose=False``, through the user's logging otherwise. Nothing in the package prints
but the command; the command and the API train the same weights."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import pytest
import torch
from _folders import SMALL, run_cli, write_folder
from _tiny_run import checkpoint_tensors

import meshops
from meshops.errors import UsageError

ROOT = Path(meshops.__file__).parent
# SMALL (tests/_folders.py) as a TrainConfig's fields
SMALL_OPTIONS = {"inputs": ["f"], "targets": ["u"], "model": "transformer_no",
                 "model_config": {"width": 8, "layers": 1, "heads": 2}, "epochs": 2,
                 "batch_size": 2}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("data"))


def _prints(path: Path) -> list[int]:
    """The lines of ``path`` where ``print`` is called."""
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "print"]


def test_nothing_prints_but_the_command():
    """The library returns and logs; only meshops/cli/ and the __main__ modules call
    print (read with ast, so that a string or a comment saying print( does not count)."""
    modules = [p for p in ROOT.rglob("*.py")
               if "cli" not in p.relative_to(ROOT).parts[:1] and p.name != "__main__.py"]
    assert len(modules) > 50 and ROOT / "fitting" / "train.py" in modules
    found = {str(p.relative_to(ROOT)): lines for p in modules if (lines := _prints(p))}
    assert found == {}
    # the check sees what it looks for: the command does print
    assert _prints(ROOT / "cli" / "__init__.py")


@pytest.fixture
def records():
    """The records of the ``meshops`` loggers at INFO, as a user's handler gets them."""
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record)

    logger = logging.getLogger("meshops")
    handler, level = Keep(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_fit_is_silent_without_verbose_and_logs_through_the_user_s_logging(
        data, tmp_path, capfd, records):
    run = meshops.fit(str(data), out=str(tmp_path / "quiet"), verbose=False, **SMALL_OPTIONS)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "") and records == []
    assert len(run.history) == 2
    meshops.fit(str(data), out=str(tmp_path / "said"), **SMALL_OPTIONS)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")          # the user's handler decides, not the library
    said = [r.getMessage() for r in records]
    assert all(r.levelno == logging.INFO for r in records)
    assert any(m.startswith("training transformer_no (") for m in said)
    assert any(m.startswith("best validation l2_mean ") for m in said)
    assert sum(m.startswith("epoch ") for m in said) == 2
    # the verbose=False call left the user's level as it was
    assert logging.getLogger("meshops").level == logging.INFO


def test_a_train_config_trains_the_weights_the_command_trains(data, tmp_path, capsys):
    """The same options as a config file and flags for the command, and as a TrainConfig
    with overrides for fit(): the saved weights are equal tensor for tensor, and the
    Run holds the history and choice the folder records."""
    config = tmp_path / "train.yaml"
    config.write_text("inputs: [f]\ntargets: [u]\nmodel: transformer_no\nbatch_size: 2\n"
                      "model_config: {width: 8, layers: 1, heads: 2}\nseed: 3\n")
    code, out, err = run_cli(capsys, ["train", "--config", config, "--data", data,
                                      "--epochs", "2", "--out", tmp_path / "cli"])
    assert code == 0, err
    cfg = meshops.TrainConfig.from_options({**SMALL_OPTIONS, "seed": 3, "epochs": 5})
    run = meshops.fit(str(data), config=cfg, epochs=2, out=str(tmp_path / "api"))
    cli = checkpoint_tensors(tmp_path / "cli" / "best.pt")
    api = checkpoint_tensors(tmp_path / "api" / "best.pt")
    assert cli.keys() == api.keys() and len(cli) > 4
    assert all(torch.equal(cli[k], api[k]) for k in cli)
    history = json.loads((tmp_path / "api" / "history.json").read_text())
    assert [e["epoch"] for e in run.history] == [1, 2] == [e["epoch"] for e in history]
    assert [e["val_l2"] for e in run.history] == [e["val_l2"] for e in history]
    best = min(run.history, key=lambda e: e["val_l2"])
    choice = run.choice
    assert (choice.model, choice.epoch, choice.metric) == ("transformer_no", best["epoch"],
                                                           "l2_mean")
    assert choice.validation == {"transformer_no": best["val_l2"]}
    again = meshops.load_run(tmp_path / "api")
    assert again.history == json.loads(json.dumps(run.history))
    assert (again.choice.epoch, again.choice.validation) == (choice.epoch, choice.validation)


def test_every_run_method_returns_a_report(data, tmp_path):
    run = meshops.fit(str(data), out=str(tmp_path / "r"), verbose=False, **SMALL_OPTIONS)
    fields = run.predict(data / "s1.vtu", verbose=False)
    assert isinstance(fields, meshops.Report)
    n = len(fields["u_pred"])
    assert f"u_pred [{n}]" in fields.table().splitlines()
    assert len(json.loads(fields.to_json())["u_pred"]) == n
    reports = [run.evaluate(str(data), verbose=False),
               run.predict_files(data, tmp_path / "p", verbose=False)]
    assert all(isinstance(r, meshops.Report) and r.table() for r in reports)


# ------------------------------------------------------------- fit()'s errors
def _refused(**kw) -> str:
    with pytest.raises(UsageError) as e:
        meshops.fit(**kw)
    return str(e.value)


@pytest.mark.parametrize("key", meshops.TrainConfig.keys())
def test_a_bad_value_of_any_option_names_its_keyword(key, data, tmp_path):
    """Every field of TrainConfig, given a value it cannot take, is refused naming the
    keyword (as fit()'s), before anything is written."""
    kw = {"data": str(data), "inputs": ["f"], "targets": ["u"], "out": str(tmp_path / "r")}
    message = _refused(**{**kw, key: object()})
    assert message.startswith(f"fit(): {key}: ") and "--" not in message
    assert not (tmp_path / "r").exists()


def test_a_config_of_the_wrong_kind_and_an_unknown_keyword_are_named(data, tmp_path):
    message = _refused(data=str(data), inputs=["f"], targets=["u"], config=3)
    assert message.startswith("fit() config: expected a TrainConfig, a mapping")
    message = _refused(data=str(data), inputs=["f"], targets=["u"], epoch=1)
    assert "unknown key 'epoch' (did you mean 'epochs'?)" in message and "--" not in message
    message = _refused(data=str(data), inputs=["f"], targets=["u"],
                       config={"epochs": 0}, out=str(tmp_path / "r"))
    assert message.startswith("fit() config: epochs: must be >= 1")


def test_options_of_time_series_without_series_are_named(data, tmp_path):
    message = _refused(data=str(data), inputs=["f"], targets=["u"], rollout_train=3,
                       time_input=False, out=str(tmp_path / "r"))
    assert message == ("fit(): rollout_train=, time_input=False apply to time series: add "
                       "series=True")


def test_shards_the_data_cannot_give_are_named(data, tmp_path):
    """shards_of's errors (issue 39: they said --shards to fit()'s callers)."""
    base = {"data": str(data), **SMALL_OPTIONS, "out": str(tmp_path / "r")}
    message = _refused(**{**base, "shards": 8})
    assert message.startswith("shards=8: the training set has 3 file(s)")
    assert message.endswith("give shards=3 or fewer")
    message = _refused(**{**base, "shards": 3, "batch_size": 4})
    assert message.startswith("shards=3: the batch of 4 samples") and "--" not in message
    assert "give batch_size= a multiple of 3" in message


def test_a_step_that_does_not_fit_the_memory_is_named_in_keywords(data, tmp_path,
                                                                  monkeypatch, capsys):
    """fit_memory's error (issue 39: it said --batch-size and --model-config to fit()'s
    callers); the command's stays in flags."""
    from meshops.training import footprint
    from meshops.training.footprint import StepMemory

    monkeypatch.setattr("meshops.utils.memory.available_bytes", lambda device=None: 10 ** 6)
    monkeypatch.setattr(footprint, "step_memory", lambda *a, **k: StepMemory(
        fixed=10 ** 9, per_point=0.0, optimizer=0))
    message = _refused(data=str(data), **SMALL_OPTIONS, out=str(tmp_path / "r"))
    assert message.startswith("fit(): a training step on the largest mesh")
    assert 'a smaller batch_size=, a narrower model (model_config={"width": ...})' in message
    assert "with checkpoint_blocks=True" in message and "--" not in message
    code, _, err = run_cli(capsys, ["train", "--data", data, *SMALL, "--out", tmp_path / "c"])
    assert code == 2 and "a smaller --batch-size, a narrower model (--model-config " in err


def test_a_resume_with_other_options_and_a_cache_without_lazy_are_named(data, tmp_path):
    """The run folder's checks (resume) and the reading's (cache against lazy=False)."""
    meshops.fit(str(data), out=str(tmp_path / "r"), verbose=False, **SMALL_OPTIONS)
    message = _refused(data=str(data), **{**SMALL_OPTIONS, "seed": 5},
                       out=str(tmp_path / "r"), resume=True)
    assert "resume=True continues the run exactly, but seed= is 5 (the run: 0)" in message
    assert message.endswith("start a new run with another out=") and "--" not in message
    message = _refused(data=str(data), **SMALL_OPTIONS, out=str(tmp_path / "c"),
                       cache=str(tmp_path / "cache"), lazy=False)
    assert message == ("fit(): cache=DIR reads the data lazily through the cache; it cannot "
                       "be combined with lazy=False")
