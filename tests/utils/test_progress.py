"""meshops.utils.progress: bars on a terminal, nothing in a redirected log."""

from __future__ import annotations

import io

from meshops.utils.progress import on_terminal, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_only_on_a_terminal():
    log, tty = io.StringIO(), _Terminal()
    assert list(progress(range(50), file=log, desc="phase", mininterval=0)) == list(range(50))
    assert log.getvalue() == ""                        # a file: no bar, no \r
    assert list(progress(range(50), file=tty, desc="phase", mininterval=0)) == list(range(50))
    assert "\r" in tty.getvalue() and "phase" in tty.getvalue()
    off = _Terminal()
    assert list(progress(range(5), file=off, enabled=False)) == list(range(5))
    assert off.getvalue() == ""                        # enabled=False: never


def test_on_terminal():
    assert on_terminal(_Terminal()) and not on_terminal(io.StringIO())

    class Closed:
        def isatty(self):
            raise ValueError("I/O operation on closed file")
    assert not on_terminal(Closed()) and not on_terminal(object())


def test_trainer_draws_no_bar_into_a_redirected_stream(capsys):
    """Trainer(progress=True) with stderr not a terminal: the epoch's one line, no
    tqdm redraws (issue 15 item 8)."""
    import torch

    from meshops.mesh.data import MeshData
    from meshops.models import get_model
    from meshops.training import Trainer

    g = torch.Generator().manual_seed(0)
    pos = torch.rand(20, 2, generator=g, dtype=torch.float64)
    data = [MeshData(pos=pos, weight=torch.full((20,), 0.05, dtype=torch.float64),
                     x=torch.randn(20, 1, generator=g, dtype=torch.float64),
                     y=torch.randn(20, 1, generator=g, dtype=torch.float64)) for _ in range(4)]
    model = get_model("transformer_no", in_channels=1, out_channels=1, pos_dim=2, width=8,
                      heads=2, layers=1).double()
    Trainer(model, data, None, epochs=2, batch_size=2, progress=True).fit()
    out = capsys.readouterr()
    assert "\r" not in out.err and "\r" not in out.out
    assert out.out.count("epoch 1/2") == 1 and out.out.count("epoch 2/2") == 1
