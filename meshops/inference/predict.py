"""Use a trained model on new meshes: :func:`load_model`, :class:`RunSpec`, :func:`predict_mesh`.

A run folder written by ``meshops train`` (or any checkpoint saved with the field
metadata of :class:`~meshops.training.Trainer`) is loaded with the names, shapes
and channel counts of its input and target fields, so that a mesh read from a file
can be checked against what the model expects and its prediction split back into
named fields::

    model, ckpt, meta = load_model("runs/poisson")
    spec = RunSpec(model, ckpt, meta)
    mesh = read_mesh("case.vtu")
    spec.check_mesh(mesh, "case.vtu")
    fields = spec.split(predict_mesh(model, spec, mesh))   # {"u": [N]}

The ``meshops predict`` and ``meshops evaluate`` commands are built on these.

Errors name the file: a checkpoint that cannot be used raises
:class:`~meshops.CheckpointError`, a mesh that does not fit the model
:class:`~meshops.MeshError`, a missing run folder or ``best.pt``
:class:`FileNotFoundError`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from meshops.datasets.fields import field_shape, format_shape
from meshops.errors import CheckpointError, MeshError
from meshops.inference.chunked import DEFAULT_CHUNK

if TYPE_CHECKING:
    import torch

__all__ = ["RUN_CHECKPOINT", "RunSpec", "available_fields", "field_channels", "input_dtype",
           "load_model", "mesh_sample", "predict_mesh"]

# The model file of a run folder (lowest validation error; the final model without
# validation data), as ``meshops train`` writes it.
RUN_CHECKPOINT = "best.pt"


# ----------------------------------------------------------------- field shapes
def field_channels(shape: Sequence[int]) -> int:
    """Model channels of a field of per-point ``shape``."""
    return int(math.prod(shape)) if shape else 1


def _same_layout(shape: Sequence[int], expected: Sequence[int]) -> bool:
    """A field of per-point ``shape`` holds what the model expects as ``expected``:
    the same shape, or the same number of components with one of them flat (mesh
    formats store a 3x3 tensor as 9 components, row-major, and a 1-vector as a
    scalar; see :func:`meshops.mesh.io.write_mesh`)."""
    return list(shape) == list(expected) or (
        field_channels(shape) == field_channels(expected)
        and min(len(shape), len(expected)) <= 1)


def available_fields(mesh) -> str:
    """The point fields of ``mesh`` (without the quadrature weights), for messages."""
    from meshops.mesh.io import WEIGHT_FIELD

    names = [k for k in (getattr(mesh, "fields", None) or {}) if k != WEIGHT_FIELD]
    return ", ".join(sorted(names)) or "none"


# ------------------------------------------------------------------- load a run
def load_model(run, device: str | None = None):
    """The model of a run folder (``RUN/best.pt``) or a checkpoint file.

    Args:
        run: A run folder written by ``meshops train`` or a ``.pt`` checkpoint.
        device: Where to load the weights (default ``cuda`` when available).

    Returns:
        ``(model, checkpoint_path, metadata)``; the metadata (field names and
        shapes, channels, dimension) has been checked against the model's config.

    Raises:
        FileNotFoundError: no such folder or file, or a folder without ``best.pt``.
        CheckpointError: a damaged checkpoint, or metadata that does not fit it.
    """
    import torch

    from meshops.models import NeuralOperator

    run = Path(run)
    if run.is_dir():
        ckpt = run / RUN_CHECKPOINT
        if not ckpt.is_file():
            hint = (f"; {run / 'last.pt'} holds the latest epoch"
                    if (run / "last.pt").is_file() else "")
            raise FileNotFoundError(f"{run}: no {RUN_CHECKPOINT} in this run folder{hint}")
    elif run.is_file():
        ckpt = run
    else:
        raise FileNotFoundError(f"{run}: no such run folder or checkpoint")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model = NeuralOperator.from_checkpoint(ckpt, map_location=device)
    except CheckpointError:  # damaged, truncated, malicious, inconsistent: names the file
        raise
    except (FileNotFoundError, ValueError, KeyError, RuntimeError, TypeError) as e:
        raise CheckpointError(f"{ckpt}: cannot load the model ({e})") from None
    meta = dict(getattr(model, "metadata", {}) or {})
    _check_run_metadata(meta, dict(getattr(model, "config", {}) or {}), ckpt)
    return model, ckpt, meta


def _check_run_metadata(meta: dict, config: dict, ckpt: Path) -> None:
    """The metadata ``meshops train`` records (field names and shapes, channels,
    dimension) has the right types and agrees with itself and with the model's
    config; :class:`RunSpec` then relies on it."""
    def fail(what: str):
        raise CheckpointError(f"{ckpt}: inconsistent metadata: {what}")

    for role in ("inputs", "targets"):
        names = meta.get(role)
        if names is not None and (not isinstance(names, list)
                                  or not all(isinstance(n, str) and n for n in names)):
            fail(f"{role} is {names!r}, not a list of field names")
    for key in ("in_channels", "out_channels", "pos_dim"):
        if key not in meta:
            continue
        v = meta[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            fail(f"{key} is {v!r}, not a channel count")
        if key in config and config[key] != v:
            fail(f"{key} is {v} but the model's config has {config[key]!r}")
    shapes = meta.get("field_shapes")
    if shapes is None:
        return
    if not isinstance(shapes, dict) or not all(
            isinstance(sh, list) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                         for n in sh) for sh in shapes.values()):
        fail(f"field_shapes is {shapes!r}, not a mapping of field name to shape")
    absent = [n for role in ("inputs", "targets") for n in (meta.get(role) or [])
              if n not in shapes]
    if absent:
        fail(f"field(s) {', '.join(absent)} have no entry in field_shapes "
             f"({', '.join(shapes) or 'empty'})")


class RunSpec:
    """What a checkpoint expects of the data: input/target names and shapes,
    channel counts and the spatial dimension.

    Args:
        model: The loaded model (its ``config`` gives the channels and dimension).
        ckpt: The checkpoint's path, named in messages.
        meta: The checkpoint's metadata (from :func:`load_model`).
        inputs, targets: Field names, needed only for a checkpoint that does not
            record them; when it does, they must agree with it.

    Raises:
        CheckpointError: names that disagree with the checkpoint, or fields whose
            channels do not add up to the model's.
    """

    def __init__(self, model, ckpt: Path, meta: dict, inputs=None, targets=None) -> None:
        cfg = dict(getattr(model, "config", {}) or {})
        self.ckpt = ckpt
        self.dtype = input_dtype(model)
        # a reduced basis: every input field is a parameter, one value per mesh
        self.constant_inputs = bool(getattr(model, "constant_inputs", False))
        self.in_channels = int(cfg.get("in_channels", meta.get("in_channels", 0)))
        self.out_channels = int(cfg.get("out_channels", meta.get("out_channels", 1)))
        self.pos_dim = cfg.get("pos_dim", meta.get("pos_dim"))
        self.shapes = {k: list(v) for k, v in (meta.get("field_shapes") or {}).items()}
        for role, given in (("inputs", inputs), ("targets", targets)):
            saved = meta.get(role)
            if given is not None and saved is not None and list(given) != list(saved):
                raise CheckpointError(
                    f"{ckpt}: the model was trained with {role} {','.join(saved) or '(none)'}, "
                    f"not {','.join(given) or '(none)'}")
            value = list(saved) if saved is not None else given
            if value is None:
                raise CheckpointError(f"{ckpt}: the checkpoint does not record its {role} (it "
                                      f"was not saved by meshops train); pass --{role}")
            setattr(self, role, list(value))
        if not self.shapes:  # a checkpoint without shapes: one channel per field if it fits
            for role, total in (("inputs", self.in_channels), ("targets", self.out_channels)):
                names = getattr(self, role)
                if len(names) == 1:
                    self.shapes[names[0]] = [] if total == 1 else [total]
                elif len(names) == total:
                    self.shapes.update({k: [] for k in names})
                else:
                    raise CheckpointError(f"{ckpt}: {len(names)} {role} for {total} channels; "
                                          f"cannot tell the channels of each field")
        c_in = sum(field_channels(self.shapes[k]) for k in self.inputs)
        c_out = sum(field_channels(self.shapes[k]) for k in self.targets)
        if (c_in, c_out) != (self.in_channels, self.out_channels):
            raise CheckpointError(f"{ckpt}: inputs {self.inputs} / targets {self.targets} give "
                                  f"{c_in}/{c_out} channels but the model has "
                                  f"{self.in_channels}/{self.out_channels}")
        self.fields = self._fields(meta.get("fields"))

    def _fields(self, saved):
        """The run's target fields (:mod:`meshops.datasets.fields`): as saved, or (runs
        saved before fields were recorded) every target its own field."""
        from meshops.datasets.fields import TargetFields

        if saved is None:
            return TargetFields.from_specs(self.targets, {k: field_channels(self.shapes[k])
                                                          for k in self.targets})
        try:
            fields = TargetFields.from_dict(saved)
            fields.check_channels(self.out_channels)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{self.ckpt}: malformed target fields in the metadata "
                                  f"({e})") from None
        return fields

    def describe(self) -> str:
        return (f"inputs {', '.join(self.inputs) or '(none)'} -> targets "
                f"{', '.join(self.targets)}")

    def target_slices(self) -> dict[str, slice]:
        """The model's output channels of each target field."""
        out, c = {}, 0
        for name in self.targets:
            k = field_channels(self.shapes[name])
            out[name] = slice(c, c + k)
            c += k
        return out

    def check_mesh(self, mesh, path, roles=("inputs",)) -> None:
        """The mesh has the fields (with the shapes and finite values) and the
        dimension the model expects.

        Raises:
            MeshError: naming ``path`` and the missing, misshapen or non-finite field,
                or the dimension.
        """
        from meshops.datasets.folder import check_finite_fields

        # First: a mesh of another dimension gives its geometry features (geo:direction)
        # another shape, and that is not what is wrong.
        d = int(mesh.pos.shape[1])
        if self.pos_dim is not None and d != int(self.pos_dim):
            raise MeshError(f"{path}: the mesh is {d}-D but the model in {self.ckpt} was "
                            f"trained on {self.pos_dim}-D meshes")
        fields = getattr(mesh, "fields", None) or {}
        for role in roles:
            for name in getattr(self, role):
                if name not in fields:
                    raise MeshError(
                        f"{path}: {role[:-1]} field {name!r} not found (the model in "
                        f"{self.ckpt} needs {self.describe()}); available point fields: "
                        f"{available_fields(mesh)}")
                sh = field_shape(fields[name])
                if not _same_layout(sh, self.shapes[name]):
                    raise MeshError(f"{path}: field {name!r} is {format_shape(sh)} but the model "
                                    f"in {self.ckpt} was trained on "
                                    f"{format_shape(self.shapes[name])}")
            # A NaN/inf input would spread to every predicted value (global attention).
            # Inputs are cast to the model's dtype: 1e300 is finite in the file but inf
            # in float32.
            check_finite_fields(fields, getattr(self, role), path, role[:-1],
                                self.dtype if role == "inputs" else None)
        if self.constant_inputs and "inputs" in roles:
            self._check_constant(fields, path)

    def _check_constant(self, fields, path) -> None:
        """Each input field is one value over the mesh, as the model was trained on."""
        import torch

        from meshops.reduced.parameters import varying_input

        for name in self.inputs:
            v = torch.as_tensor(fields[name]).reshape(len(fields[name]), -1)
            if varying_input(v, torch.zeros(v.shape[0], dtype=torch.long), 1) is not None:
                raise MeshError(f"{path}: input field {name!r} varies over the mesh (from "
                                f"{float(v.min()):g} to {float(v.max()):g}); the model in "
                                f"{self.ckpt} takes it as a parameter, one value per mesh, "
                                f"as in training: give it one value at every point")

    def split(self, out) -> dict:
        """Model output ``[N, C_out]`` -> ``{target: [N] or [N, c]}``."""
        n = out.shape[0]
        return {name: out[:, sl].reshape(n, *self.shapes[name])
                for name, sl in self.target_slices().items()}


def model_tensor(model) -> "torch.Tensor":
    """A tensor of the model (its first parameter, or buffer for a model fitted without
    trainable weights) whose dtype and device the model's inputs take."""
    import itertools

    return next(itertools.chain(model.parameters(), model.buffers()))


def input_dtype(model) -> "torch.dtype":
    """The dtype of the inputs ``model`` takes: its ``input_dtype`` where it has one (a
    :class:`~meshops.models.ReducedBasis` standardises its parameters in float64,
    whatever the dtype of its regression's weights), else that of its weights."""
    return getattr(model, "input_dtype", None) or model_tensor(model).dtype


def predict_mesh(model, spec: RunSpec, mesh, chunk_size: int | None = DEFAULT_CHUNK,
                 progress: bool = False):
    """``model.predict`` on one mesh, its inputs taken from the fields ``spec`` names.

    With ``chunk_size`` (points; None: never) a mesh with more points is predicted in chunks of that
    many output points, the global context computed once
    (:func:`meshops.inference.chunked.predict_chunked`: the same values in a bounded memory), with
    a progress bar if ``progress``. A sample with ``params [1, K]``
    (:class:`meshops.datasets.layout.SampleLayout`) passes them to a model conditioned on
    parameters.

    Shapes:
        mesh ``pos [N, d]``, ``weight [N]``, fields ``[N]`` or ``[N, ...]``
        -> ``[N, C_out]`` in the model's dtype, on the CPU
    """
    data = mesh_sample(model, spec, mesh)
    if chunk_size is not None and data.pos.shape[0] > chunk_size:
        from meshops.inference.chunked import predict_chunked

        return predict_chunked(model, data, chunk_size, progress).cpu()
    return model.predict(data).cpu()


def mesh_sample(model, spec: RunSpec, mesh):
    """The model's input sample of a mesh: ``pos``, ``weight`` and ``x`` (the fields
    ``spec`` names, concatenated) in the model's input dtype (:func:`input_dtype`), and
    ``params`` in float64 (models standardise them before their own dtype), on its
    device.

    Shapes:
        mesh ``pos [N, d]``, fields ``[N]`` or ``[N, ...]`` -> ``x [N, C_in]``
    """
    import torch

    from meshops.mesh.data import MeshData

    dtype, device = input_dtype(model), model_tensor(model).device
    n = int(mesh.pos.shape[0])
    cols = [mesh.fields[k].reshape(n, -1).to(torch.float64) for k in spec.inputs]
    x = torch.cat(cols, 1) if cols else torch.zeros(n, 0, dtype=torch.float64)
    data = MeshData(pos=mesh.pos.to(dtype), weight=mesh.weight.to(dtype), x=x.to(dtype))
    if getattr(mesh, "params", None) is not None:
        data.params = mesh.params.to(torch.float64)
    return data.to(device)
