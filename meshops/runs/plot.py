"""Pictures of a mesh file's point fields (``meshops plot``): fields side by side, or
truth, prediction and error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshops.errors import UsageError
from meshops.inference.predict import available_fields
from meshops.runs.common import names


@dataclass
class _Plot:
    mesh: str
    output: str
    field: str | list | None
    truth: str | None
    pred: str | None
    component: int | None
    title: str | None
    compare: bool


def plot_file(mesh, output, *, field=None, truth: str | None = None, pred: str | None = None,
              component: int | None = None, title: str | None = None,
              compare: bool = True) -> str:
    """Draw a picture of the point fields of a mesh file (``meshops plot``).

    Args:
        mesh: The mesh file.
        output: The picture (``.png``, ``.pdf``, ``.svg``, ...).
        field: ``"NAME[,NAME...]"`` or a list: the fields, each beside its ``NAME_pred``
            and their difference when the file has it (unless ``compare`` is off).
        truth, pred: Two fields compared (instead of ``field``).
        component: One component of vector fields (default: the magnitude).
        title: The figure's title (default the file's name).
        compare: Compare ``NAME`` with ``NAME_pred`` where the file has both.

    Returns:
        The picture's path.
    """
    opts = _Plot(mesh, output, field, truth, pred, component, title, compare)
    from meshops.inference.plot import (
        check_picture_path,
        plot_comparison,
        plot_comparisons,
        plot_fields,
    )
    from meshops.mesh.io import read_mesh

    check_picture_path(opts.output)
    mesh = read_mesh(opts.mesh)
    fields = getattr(mesh, "fields", None) or {}
    get = lambda name: _field(mesh, name, opts)  # noqa: E731
    suffix = f"[{opts.component}]" if opts.component is not None else ""
    title = opts.title if opts.title is not None else Path(opts.mesh).name
    if opts.truth or opts.pred:
        if not (opts.truth and opts.pred):
            raise UsageError("plot: --truth and --pred go together")
        plot_comparison(mesh, get(opts.truth), get(opts.pred), opts.output,
                        name=opts.truth + suffix, title=title)
        return str(opts.output)
    if not opts.field:
        raise UsageError("plot: give --field NAME[,NAME...] or --truth NAME --pred NAME")
    chosen = names(opts.field, "--field")
    if all(f"{n}_pred" in fields for n in chosen) and opts.compare:
        if len(chosen) == 1:
            plot_comparison(mesh, get(chosen[0]), get(f"{chosen[0]}_pred"), opts.output,
                            name=chosen[0] + suffix, title=title)
        else:
            plot_comparisons([(mesh, get(n), get(f"{n}_pred"), None, n + suffix)
                              for n in chosen], opts.output, title=title)
    else:
        plot_fields(mesh, [get(n) for n in chosen], [n + suffix for n in chosen],
                    opts.output, suptitle=title)
    return str(opts.output)


def _field(mesh, name: str, opts: _Plot):
    """The point field ``name`` of ``mesh`` (its component ``opts.component``), or a
    UsageError naming the file and the fields it has."""
    fields = getattr(mesh, "fields", None) or {}
    if name not in fields:
        raise UsageError(f"{opts.mesh}: point field {name!r} not found; available point "
                         f"fields: {available_fields(mesh)}")
    v = fields[name]
    if opts.component is None:
        return v
    flat = v.reshape(v.shape[0], -1)
    if not 0 <= opts.component < flat.shape[1]:
        raise UsageError(f"{opts.mesh}: field {name!r} has {flat.shape[1]} component(s); "
                         f"--component {opts.component} is out of range")
    return flat[:, opts.component]
