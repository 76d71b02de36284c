"""``meshops train`` chooses its defaults from the data: a reduced basis for a parametric
study on one mesh (constant input fields or parameter vectors; issue 19), a small PiT,
batch 4 and lr 3e-3 when PiT is asked for on such data or the study is too large for a
reduced basis (issue 13, item 9), PiT's documented sizes otherwise; the epoch count fits
``--minutes``; explicit options win."""

from __future__ import annotations

import pytest
import torch
import yaml

from meshops import cli
from meshops.fitting.defaults import (
    FIELDS_SLICE,
    FIELDS_TRAIN,
    GENERAL_PIT,
    GENERAL_TRAIN,
    PARAMETRIC_PIT,
    PARAMETRIC_TRAIN,
    choose_defaults,
    epochs_for_budget,
    options_from_data,
)
from meshops.mesh.data import MeshData


def _samples(n: int, points: int, one_mesh: bool, constant: bool, seed: int = 0,
             channels: int = 1):
    g = torch.Generator().manual_seed(seed)
    shared = torch.rand(points, 2, generator=g)
    out = []
    for k in range(n):
        pos = shared if one_mesh else torch.rand(points + k, 2, generator=g)
        params = torch.rand(1, 3, generator=g)
        x = params.expand(pos.shape[0], 3).clone() if constant else torch.rand(
            pos.shape[0], 3, generator=g)
        y = torch.sin(pos[:, :1] * (1 + params[:, :1])).expand(-1, channels).clone()
        weight = torch.full((pos.shape[0],), 1.0 / pos.shape[0])
        out.append(MeshData(pos=pos, x=x, y=y, weight=weight))
    return out


def test_parametric_study_on_one_mesh_gets_a_reduced_basis():
    name, model_config, train_config, reason = choose_defaults(
        _samples(20, 500, one_mesh=True, constant=True))
    assert (name, model_config, train_config) == ("reduced_basis", {}, {})
    assert reason.startswith("20 samples of one mesh (500 points each), constant inputs: a "
                             "parametric study (one mesh and 3 parameter(s) per sample), so a "
                             "reduced basis")


def test_reduced_basis_refused_for_data_that_is_no_parametric_study():
    import pytest

    with pytest.raises(ValueError, match="needs a parametric study .* the inputs vary"):
        choose_defaults(_samples(5, 50, one_mesh=True, constant=False), "reduced_basis")


def test_parametric_map_too_large_for_a_reduced_basis_gets_a_small_pit(monkeypatch):
    import meshops.fitting.defaults as defaults

    monkeypatch.setattr(defaults, "REDUCED_BASIS_MAX_VALUES", 20 * 500 - 1)
    name, model_config, train_config, reason = choose_defaults(
        _samples(20, 500, one_mesh=True, constant=True))
    assert name == "pit" and model_config == PARAMETRIC_PIT
    assert train_config == PARAMETRIC_TRAIN == {"batch_size": 4, "lr": 3e-3,
                                                "scheduler": "cosine"}
    assert reason.startswith("20 samples of one mesh (500 points each), constant inputs, "
                             "a parametric map: a small PiT (width 64, 256 latent points")


def test_latent_mesh_is_no_larger_than_the_mesh():
    _, model_config, _, reason = choose_defaults(_samples(5, 60, one_mesh=True, constant=True),
                                                 "pit")
    assert model_config["num_latent"] == 60 and "60 latent points" in reason


def test_field_inputs_and_one_target_channel_get_the_small_pit():
    for one_mesh in (True, False):
        name, model_config, train_config, reason = choose_defaults(
            _samples(10, 300, one_mesh=one_mesh, constant=False))
        assert (name, model_config, train_config) == ("pit", GENERAL_PIT, GENERAL_TRAIN)
        assert "field inputs, one target channel: a small PiT (width 64, 256 latent" in reason
    # a latent mesh no larger than the meshes (100 to 103 points: 102 on average)
    _, model_config, _, _ = choose_defaults(_samples(4, 100, one_mesh=False, constant=False))
    assert model_config["num_latent"] == 102


def test_a_family_of_geometries_with_constant_inputs_gets_the_small_pit():
    for channels in (1, 3):
        name, model_config, train_config, reason = choose_defaults(
            _samples(10, 300, one_mesh=False, constant=True, channels=channels))
        assert (name, model_config, train_config) == ("pit", PARAMETRIC_PIT, PARAMETRIC_TRAIN)
        assert "varying meshes" in reason and "a parametric map: a small PiT" in reason


def test_field_inputs_and_several_target_channels_get_the_slice_transformer():
    name, model_config, train_config, reason = choose_defaults(
        _samples(10, 300, one_mesh=False, constant=False, channels=3))
    assert (name, model_config, train_config) == ("slice_transformer", FIELDS_SLICE,
                                                  FIELDS_TRAIN)
    assert train_config == {"batch_size": 1, "lr": 1e-3, "scheduler": "onecycle"}
    assert ("field inputs, 3 target channels: the slice transformer (width 64, 32 slices, "
            "those under 0.001 of the domain muted), batch 1, lr 0.001, onecycle rate") in reason
    assert model_config["min_measure"] == 1e-3
    # PiT asked for on the same data: PiT's sizes and training, not the slice model's
    name, model_config, train_config, _ = choose_defaults(
        _samples(10, 300, one_mesh=False, constant=False, channels=3), "pit")
    assert (name, model_config, train_config) == ("pit", GENERAL_PIT, GENERAL_TRAIN)


def test_options_given_win_and_the_schedule_is_chosen_only_when_auto():
    samples = _samples(10, 300, one_mesh=False, constant=False, channels=3)
    options, reason = options_from_data(samples, lr=5e-4, scheduler="cosine")
    assert options == {"model": "slice_transformer", "model_config": FIELDS_SLICE,
                       "batch_size": 1, "lr": 5e-4, "scheduler": "cosine"}
    assert reason.endswith("(the options given win: lr, scheduler)")
    options, _ = options_from_data(samples, scheduler=None)  # a constant rate, given
    assert options["scheduler"] is None
    options, _ = options_from_data(samples)
    assert options["scheduler"] == "onecycle"


def test_epochs_fill_nine_tenths_of_the_budget():
    # 0.5 s/step, 34 steps + 9 validation steps (a third each): 18.5 s per epoch;
    # 0.9 * 600 s / 18.5 s = 29.2.
    assert epochs_for_budget(0.5, 34, 10.0, val_steps=9) == 29
    assert epochs_for_budget(100.0, 34, 1.0) == 1  # at least one epoch
    for bad in [(0.0, 34, 10.0), (0.5, 0, 10.0), (0.5, 34, -1.0)]:
        try:
            epochs_for_budget(*bad)
        except ValueError as e:
            assert "epochs_for_budget: need positive" in str(e)
        else:
            raise AssertionError(f"no error for {bad}")


def _folder(tmp_path, n=10, model=("--model", "pit")):
    from data_adapters import export_to_folder
    from data_adapters.standins.convdiff import make_convection_diffusion_standin

    export_to_folder(make_convection_diffusion_standin(n, seed=0, n=9), tmp_path / "d")
    return ["train", "--data", str(tmp_path / "d"), "--inputs", "kappa,wind_x,wind_y",
            "--targets", "u", "--out", str(tmp_path / "run"), "--dry-run", *model]


def test_cli_dry_run_without_a_model_chooses_the_reduced_basis(tmp_path, capsys):
    assert cli.main(_folder(tmp_path, model=()) + ["--minutes", "0.5"]) == 0
    out, err = capsys.readouterr()
    cfg = yaml.safe_load(out)
    assert cfg["model"] == "reduced_basis" and cfg["epochs"] is None
    assert ("defaults from the data: 8 samples of one mesh (81 points each), constant inputs: "
            "a parametric study") in err


def test_cli_dry_run_prints_the_chosen_defaults(tmp_path, capsys):
    assert cli.main(_folder(tmp_path) + ["--minutes", "0.5"]) == 0
    out, err = capsys.readouterr()
    cfg = yaml.safe_load(out)
    mc = cfg["model_config"]
    assert (mc["width"], mc["blocks"], mc["heads"], mc["num_latent"]) == (64, 4, 4, 81)
    assert (cfg["batch_size"], cfg["lr"], cfg["scheduler"], cfg["minutes"]) == (
        4, 3e-3, "cosine", 0.5)
    assert isinstance(cfg["epochs"], int) and cfg["epochs"] >= 1
    assert ("defaults from the data: 8 samples of one mesh (81 points each), constant inputs, "
            "a parametric map") in err
    assert f"{cfg['epochs']} epochs fit the 0.5-minute budget" in err


def test_cli_explicit_options_win(tmp_path, capsys):
    assert cli.main(_folder(tmp_path) + ["--epochs", "3", "--batch-size", "2", "--lr", "0.01",
                                         "--model-config", "width=32"]) == 0
    out, err = capsys.readouterr()
    cfg = yaml.safe_load(out)
    assert (cfg["epochs"], cfg["batch_size"], cfg["lr"]) == (3, 2, 0.01)
    # width is the user's; what they left out still comes from the data
    assert cfg["model_config"]["width"] == 32 and cfg["model_config"]["num_latent"] == 81
    assert "budget" not in err and "(the options given win: width, batch_size, lr)" in err


def test_timing_a_step_leaves_the_model_as_it_was():
    from meshops.fitting.defaults import time_training_step
    from meshops.models import PiT

    torch.manual_seed(0)
    model = PiT(3, 1, 2, width=8, heads=1, blocks=1, num_latent=16).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seconds = time_training_step(model, _samples(4, 50, one_mesh=True, constant=True), 2)
    assert 0 < seconds < 60
    assert not model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_trainer_stops_before_an_epoch_that_would_pass_the_time_limit():
    from test_training import ToyOperator, make_samples

    from meshops.training import Trainer

    def fit(limit):
        logs = []
        torch.manual_seed(0)
        trainer = Trainer(ToyOperator(hidden=8), make_samples(4, 1), make_samples(2, 1),
                          epochs=5, batch_size=2, progress=False, log=logs.append,
                          time_limit=limit)
        return trainer.fit(), logs

    history, logs = fit(1e-9)  # any epoch takes longer than a nanosecond
    assert len(history) == 1
    assert logs[-1] == "stopped after epoch 1/5: another epoch would pass the 1e-09 s time limit"
    history, logs = fit(3600.0)
    assert len(history) == 5 and not any("stopped" in m for m in logs)
    try:
        fit(0.0)
    except ValueError as e:
        assert "time_limit must be positive seconds, got 0.0" in str(e)
    else:
        raise AssertionError("no error for time_limit=0")


def test_default_run_is_repeated_exactly_by_the_printed_epoch_count(tmp_path, capsys):
    """The epoch count fitted to --minutes (and the faster thread count) is printed with
    how to repeat it; the run trains exactly that many epochs (no wall-clock stop), so
    the same seed, `--threads T` and `--epochs N` give the same weights, bit for bit."""
    import re

    args = [a for a in _folder(tmp_path) if a != "--dry-run"]
    assert cli.main(args + ["--minutes", "0.02"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"--threads (\d+) --epochs (\d+) repeats this run exactly", out)
    threads, n = found.group(1), int(found.group(2))
    first = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert first["training"]["epoch"] == n       # all the epochs, no wall-clock stop
    again = [a if a != str(tmp_path / "run") else str(tmp_path / "again") for a in args]
    assert cli.main(again + ["--epochs", str(n), "--threads", threads]) == 0
    second = torch.load(tmp_path / "again" / "last.pt", weights_only=True)
    a, b = first["state_dict"], second["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_faster_threads_times_both_and_keeps_the_faster(monkeypatch):
    """The thread count is the faster of torch's and one, from a timed step with each,
    and torch is left set to it; a given count is used as it is."""
    import meshops.fitting.defaults as defaults

    seen = []

    def timed(model, samples, batch):  # one thread "faster" here
        seen.append(torch.get_num_threads())
        return 0.5 if torch.get_num_threads() == 1 else 2.0

    monkeypatch.setattr(defaults, "time_training_step", timed)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert defaults.faster_threads(None, [], 1)[:2] == (1, 0.5)
        assert seen == [2, 1] and torch.get_num_threads() == 1
        torch.set_num_threads(2)
        monkeypatch.setattr(defaults, "time_training_step",
                            lambda m, s, b: 2.0 if torch.get_num_threads() == 1 else 0.5)
        assert defaults.faster_threads(None, [], 1)[:2] == (2, 0.5)
        assert torch.get_num_threads() == 2
        assert defaults.faster_threads(None, [], 1, threads=1)[0] == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_fewest_threads_within_a_tenth_of_the_fastest(monkeypatch):
    """Issue 38: a plan that printed "0.05 s per step on 2 threads, 0.05 s on 1" chose 2,
    and another process taking a core then made its epochs 20x slower; one thread is
    kept unless it is more than 10 % slower."""
    import meshops.fitting.defaults as defaults

    assert defaults.fewest_threads({2: 0.050, 1: 0.054}) == 1
    assert defaults.fewest_threads({2: 0.050, 1: 0.056}) == 2
    assert defaults.fewest_threads({4: 0.10, 2: 0.104, 1: 0.3}) == 2
    monkeypatch.setattr(defaults, "time_training_step",
                        lambda m, s, b: 0.052 if torch.get_num_threads() == 1 else 0.050)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        threads, step, note = defaults.faster_threads(None, [], 1)
        assert (threads, step) == (1, 0.052) and torch.get_num_threads() == 1
        assert note == " on 1 thread, 0.05 s on 2"
    finally:
        torch.set_num_threads(before)


class _Epochs:
    """What :class:`ThreadCheck` reads of a Trainer."""
    steps_per_epoch = 10
    device = torch.device("cpu")


def test_slow_steps_time_the_threads_again_and_switch(monkeypatch):
    """An epoch whose steps take more than twice the planned step times one thread and
    the current count again and trains on the fewest nearly as fast, at most twice a run;
    the line says so."""
    import meshops.fitting.defaults as defaults

    timed = []

    def step(model, samples, batch):  # a busy machine: two threads wait for a core
        timed.append(torch.get_num_threads())
        return 0.06 if torch.get_num_threads() == 1 else 0.4

    monkeypatch.setattr(defaults, "time_training_step", step)
    lines = []
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        check = defaults.ThreadCheck(None, [], 4, planned=0.05, many=2, val_steps=6,
                                     log=lines.append)
        # 10 steps and 6 validation steps (a third each): 12 steps' work per epoch
        check.on_epoch_end(_Epochs(), {"epoch": 1, "time_s": 12 * 0.09})  # 1.8x: fine
        assert timed == [] and lines == [] and torch.get_num_threads() == 2
        check.on_epoch_end(_Epochs(), {"epoch": 2, "time_s": 12 * 0.4})   # 8x: timed
        assert timed == [2, 1] and torch.get_num_threads() == 1
        assert lines == ["epoch 2: 0.40 s per step, 8.0x the planned 0.05 s (another "
                         "process on these cores?); timed again: 0.40 s on 2 threads, "
                         "0.06 s on 1 thread; training on 1 thread from now on"]
        # the new plan is the step re-timed: 0.06 s; twice more slow, then no more checks
        for epoch in (3, 4, 5):
            check.on_epoch_end(_Epochs(), {"epoch": epoch, "time_s": 12 * 0.5})
        assert len(lines) == 2 and "staying on 1 thread" in lines[1]
        assert timed == [2, 1, 2, 1]
        # one thread to begin with and no more to have: nothing to time
        alone = defaults.ThreadCheck(None, [], 4, planned=0.05, many=1, val_steps=0,
                                     log=lines.append)
        alone.on_epoch_end(_Epochs(), {"epoch": 1, "time_s": 10 * 0.4})
        assert timed == [2, 1, 2, 1] and len(lines) == 2
    finally:
        torch.set_num_threads(before)


def test_train_help_names_the_reduced_basis_and_the_choice_from_the_data(capsys):
    """--model lists every model trained from a folder and says the default is chosen
    from the data; --batch-size and --lr are a neural operator's (issue 29)."""
    from meshops.models import MODELS

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    text = text[text.index("options:"):]   # the help, not the usage line

    def help_of(flag: str, following: str) -> str:
        start = text.index(flag)
        return text[start:text.index(following, start + len(flag))]

    model = help_of("--model NAME", "--model-config")
    assert "chosen from the data" in model and "default pit" not in model
    # meshops' own models (tests register others), but --series' next_step
    ours = [n for n, cls in MODELS.items() if cls.__module__.startswith("meshops.")]
    assert len(ours) >= 6 and all(name in model for name in ours if name != "next_step")
    for flag, following in (("--batch-size B", "--lr"), ("--lr LR", "--weight-decay")):
        said = help_of(flag, following)
        assert "neural operator" in said and "parametric map on one mesh" not in said


def _with_load(samples):
    """Input channel 1 made a global input: a load, constant over each mesh."""
    for k, s in enumerate(samples):
        s.x[:, 1] = 1.0 + k
    return samples


def test_inputs_constant_over_each_mesh_beside_fields_condition_the_model():
    samples = _with_load(_samples(10, 300, one_mesh=False, constant=False, channels=3))
    name, model_config, train_config, reason = choose_defaults(samples)
    assert (name, model_config, train_config) == (
        "slice_transformer", {**FIELDS_SLICE, "condition_on_inputs": True,
                              "global_inputs": [1]}, FIELDS_TRAIN)
    assert ("field inputs (1 of them constant over each mesh, channel(s) 1: global inputs "
            "that condition every block), 3 target channels") in reason
    # one target channel: PiT, conditioned likewise
    name, model_config, _, _ = choose_defaults(
        _with_load(_samples(10, 300, one_mesh=False, constant=False)))
    assert name == "pit" and model_config == {**GENERAL_PIT, "condition_on_inputs": True}
    # a channel of one value in every mesh says nothing: no conditioning for it
    same = _samples(10, 300, one_mesh=False, constant=False, channels=3)
    for s in same:
        s.x[:, 1] = 5.0
    assert choose_defaults(same)[1] == FIELDS_SLICE
    # a channel that moves by a thousandth of its size over one mesh is a field
    samples[4].x[0, 1] += 1e-3 * 10
    name, model_config, _, reason = choose_defaults(samples)
    assert model_config == FIELDS_SLICE and "constant over each mesh" not in reason
