"""The layout of ``meshops plot``'s pictures (issue 29): on a wide 2-D domain (a 22 x 5
channel) truth, prediction and error are stacked, and the domain fills a large share
of the picture instead of three thin strips across an empty one; a square domain keeps
its panels side by side."""

import numpy as np
import pytest
from _meshes import square_mesh

from meshops.inference.plot import STACK_ASPECT, _comparison_row, _figure, plot_fields
from meshops.mesh.io import mesh_from_arrays


def _channel(length: float, height: float):
    pts, cells = square_mesh(12, "triangle")
    mesh = mesh_from_arrays(pts * [length, height], cells)
    x = mesh.pos[:, 0].numpy()
    return mesh, np.sin(x / length * np.pi), 1.01 * np.sin(x / length * np.pi)


def _domain_axes(fig):
    """The panels' axes (those drawing the field), with their drawn boxes in figure
    fractions, after the layout and the equal aspect are applied."""
    fig.draw_without_rendering()
    return [(ax, ax.get_position()) for ax in fig.axes if ax.collections and
            ax.get_label() != "<colorbar>"]


def _filled(fig) -> float:
    return sum(box.width * box.height for _, box in _domain_axes(fig))


def test_a_wide_domain_stacks_truth_prediction_and_error():
    mesh, truth, pred = _channel(22.0, 5.0)
    row = [_comparison_row(mesh, truth, pred, "u", None)]
    fig = _figure(row)
    boxes = [box for _, box in _domain_axes(fig)]
    assert len(boxes) == 3
    assert max(b.x0 for b in boxes) - min(b.x0 for b in boxes) < 0.02     # one column
    tops = [b.y1 for b in boxes]
    assert tops == sorted(tops, reverse=True) and min(np.diff(tops[::-1])) > 0.2
    titles = [ax.get_title() for ax, _ in _domain_axes(fig)]
    assert titles[0].startswith("truth") and titles[2].startswith("error")
    side_by_side = _figure(row, stack=False)
    # stacked, the domain covers over a third of the picture and over twice the share
    # it gets side by side (three strips a quarter of the height: about 0.15)
    assert _filled(fig) > 0.35 and _filled(fig) > 2 * _filled(side_by_side)


def test_a_square_domain_stays_side_by_side():
    mesh, truth, pred = _channel(1.0, 1.0)
    boxes = [box for _, box in _domain_axes(_figure([_comparison_row(mesh, truth, pred,
                                                                         "u", None)]))]
    assert len(boxes) == 3 and max(b.y0 for b in boxes) - min(b.y0 for b in boxes) < 0.02
    assert len({round(b.x0, 2) for b in boxes}) == 3


@pytest.mark.parametrize("length, stacked", [(STACK_ASPECT * 0.9, False),
                                             (STACK_ASPECT * 1.1, True)])
def test_plot_fields_stacks_from_the_stated_aspect_unless_ncols_is_given(tmp_path, length,
                                                                         stacked):
    mesh, truth, pred = _channel(length, 1.0)
    from matplotlib.image import imread

    # side by side two panels make a picture over twice as wide as high; stacked, one
    # about as high as wide
    out = plot_fields(mesh, [truth, pred], ["a", "b"], tmp_path / "f.png")
    h, w = imread(out).shape[:2]
    assert (w / h < 1.5) == stacked and (w / h > 2) == (not stacked)
    forced = plot_fields(mesh, [truth, pred], ["a", "b"], tmp_path / "g.png", ncols=2)
    h, w = imread(forced).shape[:2]
    assert w / h > 2
