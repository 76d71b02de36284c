"""TrainConfig: the options of ``meshops train`` from flags and config files, coerced
to their types, checked, merged in order and rendered; a bad value names the option
and where it came from. No data is read: these tests take well under a second."""

import math

import pytest
import yaml

from meshops.cli import TrainConfig, UsageError, build_parser, main


def _flags(*argv):
    """The request of ``meshops train`` with these flags."""
    from meshops.cli.train import train_request

    return train_request(build_parser().parse_args(["train", *argv]))


def _write(path, text):
    path.write_text(text)
    return path


def test_every_option_is_coerced_from_a_yaml_file(tmp_path):
    # The strings YAML leaves as strings (1e-3 without a dot, "5", "yes") become the
    # option's type; "none" clears an optional option.
    f = _write(tmp_path / "train.yaml", """
data: d/
inputs: "f, g"
targets: [u]
model: transformer_no
model_config: {num-layers: 2, width: 16}
epochs: "5"
minutes: 2
batch-size: 4.0
lr: 1e-3
weight_decay: "0"
scheduler: constant
grad_clip: none
quadrature_loss: "no"
val_fraction: 0
seed: "7"
out: runs/x
device: none
dtype: float64
""")
    opts = TrainConfig.from_file(f)
    # targets without "+": every target its own field (fields None), over any lower level
    assert opts == {"data": "d/", "inputs": ["f", "g"], "targets": ["u"], "fields": None,
                    "model": "transformer_no", "model_config": {"num_layers": 2, "width": 16},
                    "epochs": 5, "minutes": 2.0, "batch_size": 4, "lr": 1e-3,
                    "weight_decay": 0.0, "scheduler": None, "grad_clip": None,
                    "quadrature_loss": False, "val_fraction": 0.0, "seed": 7, "out": "runs/x",
                    "device": None, "dtype": "float64"}
    for key in ("epochs", "batch_size", "seed"):
        assert type(opts[key]) is int, key
    for key in ("minutes", "lr", "weight_decay", "val_fraction"):
        assert type(opts[key]) is float, key
    cfg = TrainConfig.from_options(opts, str(f))
    assert cfg.batch_size == 4 and cfg.lr == 1e-3


def test_a_toml_file_and_the_flags_give_the_same_config(tmp_path):
    f = _write(tmp_path / "train.toml", 'data = "d"\ninputs = ""\ntargets = "u,v"\n'
               'epochs = 3\nlr = 0.01\nquadrature-loss = true\n')
    from_file = TrainConfig.from_options(TrainConfig.from_file(f), str(f))
    from_flags = TrainConfig.resolve(_flags("--data", "d", "--inputs", "", "--targets", "u,v",
                                            "--epochs", "3", "--lr", "0.01",
                                            "--quadrature-loss"))
    assert from_file == from_flags
    assert from_file.inputs == [] and from_file.targets == ["u", "v"]


# (key, value in a config file, the message after "<file>: ")
BAD_FILE_VALUES = [
    ("epochs", "0", "epochs: must be >= 1, got 0"),
    ("epochs", "2.5", "epochs: expected an integer, got 2.5"),
    ("batch_size", "true", "batch_size: expected an integer, got True"),
    ("seed", "-1", "seed: must be >= 0, got -1"),
    ("lr", "abc", "lr: expected a number, got 'abc'"),
    ("lr", "0", "lr: must be a finite positive number, got 0.0"),
    ("minutes", ".inf", "minutes: must be a finite positive number, got inf"),
    ("weight_decay", "-1e-4", "weight_decay: must be a finite non-negative number, got -0.0001"),
    ("grad_clip", "-1", "grad_clip: must be a finite positive number, got -1.0"),
    ("val_fraction", "1", "val_fraction: must be in [0, 1), got 1.0"),
    ("quadrature_loss", "maybe", "quadrature_loss: expected true or false, got 'maybe'"),
    ("scheduler", "step", "scheduler: must be auto, cosine, onecycle or none, got 'step'"),
    ("dtype", "float16", "dtype: must be float32 or float64, got 'float16'"),
    ("model", "''", "model: expected a model name, got ''"),
    ("model_config", "[1]", "model_config: expected a mapping of hyperparameters, got [1]"),
    ("inputs", "[f, 3]", "inputs: field names must be non-empty strings, got 3"),
    ("targets", "u,u", "targets: field(s) ['u'] given more than once"),
    ("data", "[a]", "data: expected a string, got ['a']"),
]


@pytest.mark.parametrize("key,value,message", BAD_FILE_VALUES,
                         ids=[f"{k}={v}" for k, v, _ in BAD_FILE_VALUES])
def test_a_bad_value_in_a_file_names_the_file_and_the_option(tmp_path, key, value, message):
    f = _write(tmp_path / "train.yaml", f"{key}: {value}\n")
    with pytest.raises(UsageError) as e:
        TrainConfig.from_file(f)
    assert str(e.value) == f"{f}: {message}"


# Flags argparse has already typed; the ranges are TrainConfig's.
BAD_FLAGS = [
    (["--epochs", "0"], "epochs: must be >= 1, got 0"),
    (["--seed", "-2"], "seed: must be >= 0, got -2"),
    (["--lr", "-1"], "lr: must be a finite positive number, got -1.0"),
    (["--minutes", "nan"], "minutes: must be a finite positive number, got nan"),
    (["--val-fraction", "1.5"], "val_fraction: must be in [0, 1), got 1.5"),
    (["--inputs", "f,f"], "inputs: field(s) ['f'] given more than once"),
]


@pytest.mark.parametrize("argv,message", BAD_FLAGS, ids=[a[0] for a, _ in BAD_FLAGS])
def test_a_bad_flag_is_named_as_from_the_command_line(argv, message):
    with pytest.raises(UsageError) as e:
        TrainConfig.resolve(_flags("--data", "d", "--inputs", "f", "--targets", "u", *argv))
    assert str(e.value) == f"command line: {message}"


def test_the_command_prints_one_line_naming_the_source(tmp_path, capsys):
    f = _write(tmp_path / "train.yaml", "data: d\ninputs: f\ntargets: u\nlr: -3\n")
    assert main(["train", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert err == f"meshops: error: {f}: lr: must be a finite positive number, got -3.0\n"
    # the flag overrides the file, and is checked as a flag
    assert main(["train", "--config", str(f), "--lr", "0"]) == 2
    assert capsys.readouterr().err == ("meshops: error: command line: lr: must be a finite "
                                       "positive number, got 0.0\n")


def test_an_unknown_key_names_the_file_and_the_closest_option(tmp_path):
    f = _write(tmp_path / "train.yaml", "batch-sise: 3\n")
    with pytest.raises(UsageError, match=r"train\.yaml: unknown key 'batch-sise' \(did you mean "
                                       r"'batch_size'\?\); valid keys: data, inputs"):
        TrainConfig.from_file(f)
    with pytest.raises(UsageError, match="defaults: unknown key 'nope'"):
        TrainConfig().with_options("defaults", nope=1)


def test_levels_merge_in_order(tmp_path):
    """Defaults < RUN/config.yaml (--resume) < --config < flags; model_config is merged
    key by key; the highest level that names a validation set decides."""
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "config.yaml", "data: d\ninputs: f\ntargets: u\nepochs: 9\nseed: 4\n"
           "model_config: {width: 8, heads: 2}\nval_data: v/\n")
    f = _write(tmp_path / "train.yaml", f"out: {run}\nepochs: 5\nlr: 0.5\n"
               "model_config: {width: 16}\nval_fraction: 0.3\n")
    cfg = TrainConfig.resolve(_flags("--config", str(f), "--resume", "--lr", "0.25",
                                     "--model-config", "layers=3"))
    assert (cfg.data, cfg.inputs, cfg.targets, cfg.seed) == ("d", ["f"], ["u"], 4)
    assert cfg.epochs == 5 and cfg.lr == 0.25 and cfg.out == str(run)
    assert cfg.model_config == {"width": 16, "heads": 2, "layers": 3}
    assert (cfg.val_fraction, cfg.val_data) == (0.3, None)
    # untouched defaults (the model: chosen from the data)
    assert cfg.model is None and cfg.weight_decay == 1e-4
    cfg = TrainConfig.resolve(_flags("--config", str(f), "--resume", "--val-data", "w/"))
    assert (cfg.val_fraction, cfg.val_data) == (None, "w/")


def test_plain_targets_over_a_grouping_mean_one_field_each(tmp_path):
    """Issue 38, item 4: ``--targets u,v,p`` over a ``--config`` file that joins u+v
    left the file's grouping in place, and the run trained u+v,p."""
    run = TrainConfig.from_options({"data": "d", "inputs": "f", "targets": "u+v,p"})
    f = _write(tmp_path / "config.yaml", run.render())
    assert TrainConfig.resolve(_flags("--config", str(f))).fields == ["u+v", "p"]
    cfg = TrainConfig.resolve(_flags("--config", str(f), "--targets", "u,v,p"))
    assert cfg.targets == ["u", "v", "p"] and cfg.fields is None
    assert cfg.field_specs == ["u", "v", "p"]
    # and the other way round: a grouping given over a file of plain targets
    g = _write(tmp_path / "plain.yaml", "data: d\ninputs: f\ntargets: [u, v, p]\n")
    cfg = TrainConfig.resolve(_flags("--config", str(g), "--targets", "u+v,p"))
    assert cfg.fields == ["u+v", "p"]


@pytest.mark.parametrize("was, now", [("u+v,p", "u,v,p"), ("u,v,p", "u+v,p")])
def test_a_resume_that_regroups_the_targets_is_refused(tmp_path, was, now):
    """The resumed run's config.yaml kept its grouping under a plain ``--targets``
    (silently dropped); a changed grouping is another run: refused, naming --targets."""
    from meshops.fitting.out_folder import check_resume_options

    out = tmp_path / "run"
    out.mkdir()
    recorded = TrainConfig.from_options({"data": "d", "inputs": "f", "targets": was,
                                         "out": str(out)})
    _write(out / "config.yaml", recorded.render())
    request = _flags("--resume", "--out", str(out), "--targets", now)
    cfg = TrainConfig.resolve(request)
    with pytest.raises(UsageError, match=r"--resume continues the run exactly, but --targets "
                       r"is \[.*\] \(the run: \[.*\]\)"):
        check_resume_options(cfg, recorded.to_dict(), request, out / "last.pt")
    same = _flags("--resume", "--out", str(out), "--targets", was)
    check_resume_options(TrainConfig.resolve(same), recorded.to_dict(), same, out / "last.pt")


def test_missing_and_conflicting_options_are_refused(tmp_path):
    with pytest.raises(UsageError, match=r"^train: missing --data DIR; --targets u "):
        TrainConfig.resolve(_flags("--inputs", "f"))
    with pytest.raises(UsageError, match=r"train: field\(s\) \['u'\] are both inputs and targets"):
        TrainConfig.resolve(_flags("--data", "d", "--inputs", "u", "--targets", "u"))
    f = _write(tmp_path / "t.yaml", "val_data: v\nval_fraction: 0.1\n")
    with pytest.raises(UsageError, match="t.yaml: give val_fraction or val_data, not both"):
        TrainConfig.resolve(_flags("--config", str(f)))


def test_filled_options_are_checked_and_the_render_reads_back(tmp_path):
    cfg = TrainConfig.resolve(_flags("--data", "d", "--inputs", "f", "--targets", "u"))
    cfg = cfg.with_options(lr="2e-3")  # as meshops train sets the defaults: coerced
    assert cfg.lr == 2e-3 and isinstance(cfg.lr, float)
    with pytest.raises(UsageError, match=r"^defaults: batch_size: must be >= 1, got 0$"):
        cfg.with_options(batch_size=0)
    text = cfg.render(model_config={"width": 32, "heads": (4,)})
    written = yaml.safe_load(text)
    assert list(written) == list(TrainConfig.keys())
    assert written["model_config"] == {"width": 32, "heads": [4]} and cfg.model_config == {}
    again = TrainConfig.from_file(_write(tmp_path / "config.yaml", text))
    assert again == {**cfg.to_dict(), "model_config": {"width": 32, "heads": [4]}}
    assert math.isclose(again["weight_decay"], 1e-4)


def test_null_leaves_a_data_chosen_option_unset(tmp_path, capsys):
    """``epochs: null`` (or lr, batch_size) in a file means what leaving it out means:
    chosen from the data. It used to be refused as 'expected a number, got None'."""
    f = _write(tmp_path / "train.yaml", f"data: {tmp_path / 'nothing'}\ninputs: f\n"
               "targets: u\nepochs: null\nlr: null\nbatch_size: null\n")
    assert {k: v for k, v in TrainConfig.from_file(f).items()
            if k in ("epochs", "lr", "batch_size")} == {"epochs": None, "lr": None,
                                                        "batch_size": None}
    # The command gets past the options to the data (the folder is not there).
    assert main(["train", "--config", str(f), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshops: error: ") and str(tmp_path / "nothing") in err
    assert "None" not in err


def test_an_empty_run_folder_is_refused_naming_the_source(tmp_path, capsys):
    """``--out ""`` or ``out: none`` used to end in a TypeError traceback."""
    assert main(["train", "--data", "d", "--inputs", "f", "--targets", "u", "--out", ""]) == 2
    assert capsys.readouterr().err == ("meshops: error: command line: out: expected a folder "
                                       "name, got ''\n")
    f = _write(tmp_path / "t.yaml", "out: none\n")
    with pytest.raises(UsageError, match=r"t\.yaml: out: expected a folder name, got 'none'$"):
        TrainConfig.from_file(f)


def test_a_rendered_config_with_val_data_reads_back(tmp_path):
    """A run's own config.yaml names val_data and renders val_fraction: null; used as
    --config it must not be refused as giving both (it was: 'give val_fraction or
    val_data, not both')."""
    (tmp_path / "val").mkdir()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"val_data": str(tmp_path / "val"), "val_fraction": None,
                                    "out": str(tmp_path / "run"), "inputs": ["f"],
                                    "targets": ["u"], "data": str(tmp_path)}))
    cfg = TrainConfig.resolve(_flags("--config", str(path)))
    assert cfg.val_data == str(tmp_path / "val") and cfg.val_fraction is None
