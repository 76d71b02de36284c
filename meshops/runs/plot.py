"""Pictures of a mesh file's point fields (``meshops plot``): fields side by side, or
truth, prediction and error."""

from __future__ import annotations

from pathlib import Path

from meshops.datasets.fields import field_names
from meshops.errors import UsageError
from meshops.inference.predict import available_fields


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
    from meshops.inference.plot import (
        check_picture_path,
        plot_comparison,
        plot_comparisons,
        plot_fields,
    )
    from meshops.mesh.io import read_mesh

    check_picture_path(output)
    path, mesh = mesh, read_mesh(mesh)
    fields = getattr(mesh, "fields", None) or {}
    get = lambda name: _field(mesh, fields, name, path, component)  # noqa: E731
    suffix = f"[{component}]" if component is not None else ""
    title = title if title is not None else Path(path).name
    if truth or pred:
        if not (truth and pred):
            raise UsageError("plot: --truth and --pred go together")
        plot_comparison(mesh, get(truth), get(pred), output,
                        name=truth + suffix, title=title)
        return str(output)
    if not field:
        raise UsageError("plot: give --field NAME[,NAME...] or --truth NAME --pred NAME")
    chosen = field_names(field, "--field")
    if all(f"{n}_pred" in fields for n in chosen) and compare:
        if len(chosen) == 1:
            plot_comparison(mesh, get(chosen[0]), get(f"{chosen[0]}_pred"), output,
                            name=chosen[0] + suffix, title=title)
        else:
            plot_comparisons([(mesh, get(n), get(f"{n}_pred"), None, n + suffix)
                              for n in chosen], output, title=title)
    else:
        plot_fields(mesh, [get(n) for n in chosen], [n + suffix for n in chosen],
                    output, suptitle=title)
    return str(output)


def _field(mesh, fields: dict, name: str, path, component: int | None):
    """The point field ``name`` of ``mesh`` (its ``fields``, read from ``path``), or its
    component ``component``; else a UsageError naming the file and the fields it has."""
    if name not in fields:
        raise UsageError(f"{path}: point field {name!r} not found; available point "
                         f"fields: {available_fields(mesh)}")
    v = fields[name]
    if component is None:
        return v
    flat = v.reshape(v.shape[0], -1)
    if not 0 <= component < flat.shape[1]:
        raise UsageError(f"{path}: field {name!r} has {flat.shape[1]} component(s); "
                         f"--component {component} is out of range")
    return flat[:, component]
