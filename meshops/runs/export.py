"""Exporting a run (``meshops export``, :meth:`meshops.runs.Run.export`): its model as
a ``torch.export`` (``.pt2``) or ONNX file, checked against the run's own prediction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from meshops.datasets.fields import optional_field_names
from meshops.errors import UsageError
from meshops.inference.predict import RunSpec, load_model, mesh_sample
from meshops.runs.report import Report

#: Largest difference allowed between the exported program and the run on the example
#: mesh, relative to the prediction's largest magnitude (float32 reassociation is ~1e-7).
TOLERANCE = 1e-5


def _example_mesh(opts, meta: dict, run) -> Path:
    """``--mesh``, else the first training file the run records."""
    if opts.mesh:
        return Path(opts.mesh)
    root, train = meta.get("data"), (meta.get("split") or {}).get("train")
    if root and train and (Path(root) / train[0]).is_file():
        return Path(root) / train[0]
    raise UsageError(f"{run}: the run's training files are not here; pass --mesh FILE "
                   f"(a mesh with the input fields {', '.join(meta.get('inputs') or []) or '-'})")


def _check_output(path: Path, overwrite: bool) -> None:
    """Refuse, before any work, what would end without a checked file at ``path``."""
    from meshops.inference.export import ExportError, check_path

    try:
        check_path(path)
    except ExportError as e:
        raise UsageError(str(e)) from None
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise UsageError(f"{path}: exists; export does not replace a file without --overwrite "
                       f"(or choose another -o FILE)")
    if path.suffix == ".onnx":
        try:
            import onnxruntime  # noqa: F401  (the check below loads the file with it)
        except ImportError:
            raise UsageError(f"{path}: an ONNX file is kept only once onnxruntime has run it "
                           f"against the run's prediction, and onnxruntime is not installed "
                           f"(pip install onnxruntime, or meshops[onnx]); nothing written") \
                from None


def _example_sample(opts, model, spec, meta: dict, ckpt, run):
    """The example mesh as training read it (at the cells for cell targets, with the tag
    channels and the parameters): ``(mesh path, sample)``."""
    from meshops.datasets.layout import SampleLayout
    from meshops.mesh.io import read_mesh

    mesh_path = _example_mesh(opts, meta, run)
    layout = SampleLayout.from_run(meta, spec.inputs, spec.targets, model, ckpt)
    view = layout.view(read_mesh(mesh_path), mesh_path, need_targets=False)
    spec.check_mesh(view, mesh_path)
    return mesh_path, mesh_sample(model, spec, view)


def _export_checked(model, sample, tmp: Path, opts, meta: dict, what: str) -> tuple[dict, float]:
    """Export to ``tmp`` and load it back as a user would: ``(info, largest difference
    from the run's prediction, relative)``; above :data:`TOLERANCE` a UsageError."""
    import torch

    from meshops.inference.export import ExportError, export_model, load_exported

    try:
        info = export_model(model, sample, tmp, dynamic=opts.dynamic, metadata=meta)
    except ExportError as e:
        raise UsageError(str(e)) from None
    ref = model.predict(sample).to(torch.float64)
    # the arrays a user gives: the program's dtype, params in float64 (info["dtype"])
    dtypes = {k: getattr(torch, info["params_dtype"] if k == "params" else info["dtype"])
              for k in info["inputs"]}
    with torch.no_grad():
        out = load_exported(tmp)(*(getattr(sample, k).to(dtypes[k]) for k in info["inputs"]))
    diff = float((out.to(torch.float64) - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
    if not diff <= TOLERANCE:
        raise UsageError(f"{what} by {diff:.2e} (relative), over {TOLERANCE:g}; nothing written")
    return info, diff


def _signature(info: dict) -> str:
    k = len(info.get("param_fields") or [])
    size = {"x": f"x [N, {info['in_channels']}]", "pos": f"pos [N, {info['pos_dim']}]",
            "weight": "weight [N]", "params": f"params [1, {k}]"}
    return ", ".join(size[name] for name in info["inputs"])


@dataclass
class ExportOptions:
    """What ``meshops export`` and :meth:`meshops.runs.Run.export` are asked.

    Args:
        output: ``model.pt2`` (torch.export) or ``model.onnx``.
        overwrite: Replace ``output`` if it exists.
        mesh: Example mesh with the input fields (default: the run's first training
            file).
        dynamic: Any number of points (models that allow it); default the example's.
        inputs: Input fields, for checkpoints that do not record them.
    """

    output: str
    overwrite: bool = False
    mesh: str | None = None
    dynamic: bool = False
    inputs: Sequence[str] | str | None = None


def export_run(run, opts: ExportOptions) -> Report:
    """The model of the run folder or checkpoint ``run`` (loaded on the CPU) as a
    program of tensors at ``opts.output``, written only once it reproduces the run's
    prediction on the example mesh within :data:`TOLERANCE`."""
    from meshops.inference.export import ExportError, check_exportable
    from meshops.utils.atomic import atomic_write

    path = Path(opts.output)
    _check_output(path, opts.overwrite)
    model, ckpt, meta = load_model(run, "cpu")
    try:
        check_exportable(model)
    except ExportError as e:
        raise UsageError(f"{ckpt}: {e}") from None
    spec = RunSpec(model, ckpt, meta, optional_field_names(opts.inputs), None)
    mesh_path, sample = _example_sample(opts, model, spec, meta, ckpt, run)
    # Written beside path and renamed over it only once checked: a file that fails the
    # check, or an export that fails, leaves path as it was.
    done = {}
    what = f"{path}: the exported program differs from {ckpt} on {mesh_path}"
    atomic_write(path, lambda tmp: done.update(result=_export_checked(
        model, sample, Path(tmp), opts, meta, what)))
    info, diff = done["result"]
    return Report({"output": str(path), "mesh": str(mesh_path), "difference": diff,
                   "tolerance": TOLERANCE, **info}, _export_lines)


def _export_lines(r: dict) -> list[str]:
    info, path, mesh_path, diff = r, r["output"], Path(r["mesh"]), r["difference"]
    where = info["location"]
    size = f"any number of {where} (N >= 2)" if info["points"] is None else \
        f"{info['points']} {where}"
    return [f"wrote {path}: {info['model']}, inputs {_signature(info)} -> y [N, "
            f"{info['out_channels']}] ({info['dtype']}), {size}"
            + ("; the targets are cell data: pos holds the cells' centroids, weight their "
               "measures" if where == "cells" else "")
            + (f"; the mesh of {mesh_path.name} is built in" if info["fixed_mesh"] else ""),
            f"checked on {mesh_path.name}: largest difference {diff:.1e} of the prediction's "
            f"magnitude (tolerance {TOLERANCE:g})"]
