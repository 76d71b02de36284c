"""No memory bombs (issue 20, items 9 and 10): a file that is not what its suffix says
is refused from its first bytes, before meshio reads it whole; a checkpoint whose config
was edited is checked against its weights on the meta device, before the model it
describes is allocated; a model config too big for the memory is refused before it is
built. Each with one error line."""

from __future__ import annotations

import os

import pytest
import torch
from _folders import run_cli, train, write_folder
from _tiny_run import one_line_error
from torch.overrides import TorchFunctionMode

from meshops import CheckpointError
from meshops.models import NeuralOperator, get_model

pytestmark = pytest.mark.usefixtures("one_thread")

JUNK = {"binary": lambda n: os.urandom(n), "text": lambda n: b"hello world 1 2 3\n" * (n // 18),
        "zeros": lambda n: b"\0" * n}


@pytest.fixture()
def no_meshio_reader(monkeypatch):
    """Fail the test if any meshio reader is called."""
    import meshio._helpers as helpers

    def refuse(*a, **k):
        raise AssertionError("a meshio reader was called")

    monkeypatch.setattr(helpers, "reader_map", {k: refuse for k in helpers.reader_map})


@pytest.mark.parametrize("kind", sorted(JUNK))
@pytest.mark.parametrize("suffix", [".vtu", ".vtk", ".msh", ".xdmf", ".stl", ".obj", ".ply",
                                    ".off"])
def test_info_refuses_junk_from_its_first_bytes(tmp_path, capsys, no_meshio_reader, kind,
                                                suffix):
    path = tmp_path / f"junk{suffix}"
    path.write_bytes(JUNK[kind](2_000_000))
    code, out, err = run_cli(capsys, ["info", path])
    assert code == 2 and out == "" and one_line_error(err), err
    assert err.startswith(f"meshops: error: {path}: cannot read mesh: it begins with ")
    assert "SystemExit" not in err


def test_a_file_larger_than_the_free_memory_is_not_read(tmp_path, capsys, monkeypatch,
                                                        no_meshio_reader):
    import meshops.utils.memory as memory

    write_folder(tmp_path, n=1)
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 1000)
    code, _, err = run_cli(capsys, ["info", tmp_path / "s0.vtu"])
    assert code == 2 and one_line_error(err)
    assert "more than the 1e-06 GB of free memory" in err


def test_a_failing_meshio_reader_is_one_line_without_its_console_output(tmp_path, capsys):
    """A file that begins right but is broken: meshio's reasons in one line; meshio
    printed them on stdout and stderr and called sys.exit(1)."""
    path = tmp_path / "broken.vtk"
    path.write_text("# vtk DataFile Version 4.2\nbroken\nASCII\nDATASET NONSENSE\n")
    code, out, err = run_cli(capsys, ["info", path])
    assert code == 2 and out == "" and one_line_error(err), err
    assert f"{path}: cannot read mesh (vtk: " in err and "SystemExit" not in err


class _Allocations(TorchFunctionMode):
    """The largest tensor created on a real device while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.device.type != "meta":
            self.largest = max(self.largest, out.numel())
        return out


def test_an_edited_checkpoint_config_is_refused_before_allocating(tmp_path):
    model = get_model("transformer_no", in_channels=1, out_channels=1, pos_dim=2, width=8,
                      layers=1, heads=2)
    state = model.checkpoint_state()
    state["config"].update(width=1024, layers=12)  # 150M parameters: 600 MB
    path = tmp_path / "edited.pt"
    torch.save(state, path)
    with _Allocations() as seen, pytest.raises(CheckpointError, match="do not fit"):
        NeuralOperator.from_checkpoint(path)
    largest_saved = max(t.numel() for t in state["state_dict"].values())
    assert seen.largest <= largest_saved


def test_a_checkpoint_loads_as_before(tmp_path):
    torch.manual_seed(0)
    model = get_model("transformer_no", in_channels=1, out_channels=1, pos_dim=2, width=8,
                      layers=1, heads=2)
    model.save(tmp_path / "m.pt")
    back = NeuralOperator.from_checkpoint(tmp_path / "m.pt")
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k


def test_a_model_config_too_big_for_memory_is_refused_before_building(tmp_path, capsys):
    data = write_folder(tmp_path / "data")
    with _Allocations() as seen:
        code, _, err = train(capsys, data, tmp_path / "run", "--model-config",
                             "width=1000000000")
    assert code == 2 and one_line_error(err), err
    assert "with {'width': 1000000000" in err and "of memory is available on cpu" in err
    assert "choose a smaller model_config" in err
    assert seen.largest < 10**8
    assert not (tmp_path / "run").exists()
