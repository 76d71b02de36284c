"""Export a trained model to a file that runs without meshops: ``torch.export``
(``.pt2``) or ONNX (``.onnx``).

The exported program is the model's :meth:`~meshops.models.NeuralOperator.predict`
on one sample, normalisers included, so it takes and returns physical units:

* **mesh-input models** (TransformerNO, Galerkin transformer: nothing in their
  forward depends on a precomputed mesh structure) take ``(x [N, C_in], pos [N, d],
  weight [N])`` and return ``[N, C_out]``; with ``dynamic=True`` ``N`` may vary
  (``N >= 2``), otherwise it is the example mesh's.
* **fixed-mesh models** (:data:`FIXED_MESH`: PiT, whose latent mesh and neighbour
  graphs come from farthest-point sampling and k-d tree searches, which no exporter
  traces; the reduced basis, whose modes are evaluated at the mesh's points) have the
  example mesh -- positions, quadrature weights and those structures -- built into
  the program and take only ``x [N, C_in]``: new input fields on that mesh (the
  parametric-study case). For another mesh, export again. A reduced basis of
  parameter vectors alone takes ``params`` only.
* a run with **parameters** (``--params``) takes ``params [1, K]`` as well, last,
  in float64 whatever the model's dtype: the model standardises them in float64 (a
  timestamp-like 1.7e9 + 100 a is quantised in float32), as in meshops itself.

``N`` counts the sample's points where the run's targets live: the mesh's vertices,
or for cell-data targets its cells (``pos`` their centroids, ``weight`` their
measures; :mod:`meshops.mesh.cells`). The input channels of boundary tags
(:func:`meshops.mesh.boundary.tag_channels`) are part of ``x``.

Attention runs through PyTorch's ``scaled_dot_product_attention`` (the SDPA path of
:func:`meshops.nn.functional.weighted_attention`), not meshops' fused CPU kernel, so
the file needs no meshops operator. What a file needs at load time:

* ``.pt2``: ``torch`` (the version that wrote it, or a later one that reads its
  format): ``torch.export.load(path).module()(x, pos, weight)``.
* ``.onnx``: any ONNX runtime (opset 18): ``onnxruntime.InferenceSession(path).run(
  None, {"x": x, "pos": pos, "weight": weight})`` with arrays of the file's dtype.

Both files carry the field names, shapes and the signature (``.pt2``: the extra file
``meshops.json``; ``.onnx``: metadata property ``meshops``), see :func:`read_info`.
The models of :data:`REFUSED` cannot be exported (:class:`ExportError` says why).
"""

from __future__ import annotations

import copy
import json
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from meshops.datasets.normalizer import decode_outputs, encode_inputs, output_scale
from meshops.utils.atomic import atomic_write

__all__ = ["FIXED_MESH", "FORMATS", "REFUSED", "ExportError", "check_exportable", "check_path",
           "export_model", "load_exported", "read_info"]

FORMATS = (".pt2", ".onnx")
INFO = "meshops.json"
ONNX_OPSET = 18

#: Models whose program holds the example mesh, and what of it (their size is fixed).
FIXED_MESH = {
    "pit": "latent mesh and neighbour graphs (built by searches no exporter traces)",
    "reduced_basis": "points and the basis's mean and modes at them",
}
#: Models that cannot be exported, and why.
REFUSED = {
    "patched_transformer": "its patch grouping reads the partition's values on the host, "
                           "which torch.export does not trace; transformer_no, "
                           "galerkin_transformer, pit and reduced_basis export",
    "next_step": "a time-series model is rolled out step by step from a state and its "
                 "time (meshops predict --rollout); a program of one step is not exported "
                 "yet",
    "trajectory_basis": "a time-series basis predicts the fields at the times of a series "
                        "from its parameters (meshops predict RUN SERIES --rollout N), not "
                        "one mesh's fields from its inputs, which is the program export "
                        "writes; a program of it is not exported yet",
}


class ExportError(ValueError):
    """A model, mesh or format that cannot be exported; the message says why."""


def _sdpa(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose attention layers use the SDPA path (no meshops operator)."""
    model = copy.deepcopy(model).eval()
    for mod in model.modules():
        impls = getattr(type(mod), "IMPLS", None) or getattr(mod, "IMPLS", None)
        if isinstance(getattr(mod, "impl", None), str) and impls and "sdpa" in impls:
            mod.impl = "sdpa"
    return model


def _added_structures(model, sample) -> dict[str, Tensor]:
    """What ``model.mesh_transform()`` stores on ``sample`` beyond the mesh digest."""
    from meshops.mesh.digest import MESH_ID

    make = getattr(model, "mesh_transform", None)
    transform = make() if callable(make) else None
    if transform is None:
        return {}
    before = set(sample.keys())
    done = transform(copy.copy(sample))
    added = {k: done[k] for k in done.keys() if k not in before and k != MESH_ID}
    # A model whose transform stores only a key (e.g. the Galerkin transformer without
    # query points) derives nothing from the mesh: it stays a mesh-input program.
    return added if any(isinstance(v, Tensor) for v in added.values()) else {}


class _Program(nn.Module):
    """``model.predict`` on one sample as a function of tensors (what is exported): the
    tensors named ``names`` (``x``, ``pos``, ``weight``, ``params``), in that order."""

    def __init__(self, model, fixed: dict[str, Tensor] | None, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names
        self.fixed = fixed  # pos, weight and the mesh structures of a fixed-mesh program

    def forward(self, *inputs: Tensor) -> Tensor:
        from meshops.mesh.data import MeshData

        m = self.model
        given = dict(zip(self.names, inputs))
        raw = given["x"]
        given["x"] = encode_inputs(m, raw)
        out = m(MeshData(**(self.fixed or {}), **given))
        return decode_outputs(m, out, output_scale(m, raw, out.shape[0]))


class _ReducedProgram(nn.Module):
    """A :class:`~meshops.models.ReducedBasis` on the example mesh: its mean and modes at
    the mesh's points are computed once, before tracing (on another mesh they come from
    moving least squares, whose neighbour search no exporter traces); the program maps
    the parameters (``x``: the constant input fields, ``params [1, K]``) to the fields."""

    def __init__(self, model, sample, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names
        mean, modes = model.basis_at(sample.pos.to(torch.float64))
        self.register_buffer("mean", mean)    # [N, C]
        self.register_buffer("modes", modes)  # [r, N, C]
        self.register_buffer("weight", sample.weight)
        self.dtype = sample.pos.dtype

    def forward(self, *inputs: Tensor) -> Tensor:
        from meshops.mesh.data import MeshData
        from meshops.reduced.parameters import batch_parameters

        m = self.model
        given = dict(zip(self.names, inputs))
        raw = given.get("x", self.weight.new_zeros(self.weight.shape[0], 0))
        x = encode_inputs(m, raw)
        extra = {"params": given["params"]} if "params" in given else {}
        # 1. the parameter vector [1, K] -> the modal coefficients [1, r]
        coef = m.coefficients(batch_parameters(MeshData(x=x, weight=self.weight, **extra), 1))
        # 2. the fields at the built-in points [N, C]
        out = self.mean + torch.einsum("r,rmc->mc", coef[0], self.modes)
        return decode_outputs(m, out.to(self.dtype), output_scale(m, raw, out.shape[0]))


def _input_names(model, sample, fixed: bool) -> list[str]:
    """The program's inputs: ``x`` (not for a reduced basis of parameter vectors alone),
    ``pos`` and ``weight`` (mesh-input programs) and ``params`` (runs with parameters)."""
    reduced = model.model_name == "reduced_basis"
    k = int((getattr(model, "config", None) or {}).get("param_channels", 0) or 0)
    has_params = getattr(sample, "params", None) is not None
    if k and not has_params:
        raise ExportError(f"{model.model_name}: the model takes {k} parameter(s) per sample; "
                          f"give the example sample its params [1, {k}] (meshops export reads "
                          f"them as training did: the mesh's field_data or params.csv / "
                          f"params.json beside it)")
    names = [] if reduced and sample.x.shape[1] == 0 else ["x"]
    names += [] if fixed else ["pos", "weight"]
    return names + (["params"] if has_params and (k or reduced) else [])


def _info(model, fixed: bool, dynamic: bool, n: int, names: list[str],
          meta: dict) -> dict[str, Any]:
    from meshops.inference.predict import model_tensor

    cfg = dict(getattr(model, "config", {}) or {})
    return {
        "format": "meshops-export-1", "model": model.model_name,
        "inputs": names, "outputs": ["y"],
        "points": None if dynamic else n, "fixed_mesh": fixed,
        "location": meta.get("location", "points"),
        "in_channels": cfg.get("in_channels"), "out_channels": cfg.get("out_channels"),
        "pos_dim": cfg.get("pos_dim"),
        "input_fields": meta.get("inputs"), "target_fields": meta.get("targets"),
        "param_fields": meta.get("params") or [],
        "field_shapes": meta.get("field_shapes"),
        "dtype": str(model_tensor(model).dtype).replace("torch.", ""),
        "params_dtype": "float64" if "params" in names else None,
    }


def check_path(path) -> Path:
    """``path`` as a :class:`~pathlib.Path` whose suffix is an export format.

    Raises:
        ExportError: another suffix.
    """
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ExportError(f"{path}: unknown export format {path.suffix!r}; use .pt2 "
                          f"(torch.export) or .onnx")
    return path


def check_exportable(model) -> None:
    """Raise :class:`ExportError` for a model of :data:`REFUSED`, saying why."""
    if model.model_name in REFUSED:
        raise ExportError(f"{model.model_name} cannot be exported: {REFUSED[model.model_name]}")


def _program(model, sample, dynamic: bool):
    """``(program, args, input names, fixed)`` of ``model`` (an SDPA copy) on ``sample``."""
    from meshops.mesh.data import MeshData

    reduced = model.model_name == "reduced_basis"
    structures = {} if reduced else _added_structures(
        model, MeshData(x=sample.x, pos=sample.pos, weight=sample.weight))
    fixed = reduced or bool(structures)
    if fixed and dynamic:
        why = FIXED_MESH.get(model.model_name, "structures")
        raise ExportError(f"{model.model_name}: the exported program holds this mesh's "
                          f"{why}, so its size is fixed; export without --dynamic, once per "
                          f"mesh")
    names = _input_names(model, sample, fixed)
    if reduced:
        program = _ReducedProgram(model, sample, names)
    else:
        program = _Program(model, {"pos": sample.pos, "weight": sample.weight, **structures}
                           if fixed else None, names)
    return program, tuple(getattr(sample, k) for k in names), names, fixed


def export_model(model, mesh, path, *, dynamic: bool = False,
                 metadata: dict | None = None) -> dict[str, Any]:
    """Export ``model`` (its ``predict`` on one sample) to ``path`` (``.pt2`` or ``.onnx``).

    Args:
        model: A :class:`~meshops.models.NeuralOperator` (its normalisers are included).
        mesh: The example sample: ``x [N, C_in]``, ``pos [N, d]``, ``weight [N]`` and,
            for a run with parameters, ``params [1, K]`` (e.g. from
            :func:`meshops.inference.predict.mesh_sample` of :meth:`meshops.SampleLayout.view`:
            at the cell centroids for a run whose targets are cell data, with the tag
            channels in ``x``); for fixed-mesh models (see the module) the mesh built
            into the program.
        path: Output file; its suffix picks the format. Written atomically.
        dynamic: Let the number of points vary (mesh-input models only).
        metadata: The run's field metadata (``inputs``, ``targets``,
            ``field_shapes``, ``location``, ``params``), stored in the file.

    Returns:
        The information stored with the file (inputs, sizes, fields; see
        :func:`read_info`).

    Raises:
        ExportError: an unknown suffix, ``dynamic`` for a fixed-mesh model, or a model
            the exporter cannot trace (the exporter's reason is in the message).

    Shapes:
        mesh ``x [N, C_in]``, ``pos [N, d]``, ``weight [N]``, ``params [1, K]`` ->
        program ``[N, C_out]``
    """
    from meshops.inference.predict import model_tensor

    path = check_path(path)
    check_exportable(model)
    dtype = model_tensor(model).dtype
    sample = copy.copy(mesh)
    for k in ("x", "pos", "weight", "params"):
        if getattr(mesh, k, None) is not None:  # params in float64 (see the module)
            to = torch.float64 if k == "params" else dtype
            setattr(sample, k, getattr(mesh, k).to(to).cpu())
    program, args, names, fixed = _program(_sdpa(model).cpu(), sample, dynamic)
    shapes = _dynamic_shapes(model, names) if dynamic else None
    info = _info(model, fixed, dynamic, int(sample.pos.shape[0]), names, dict(metadata or {}))
    try:
        with torch.no_grad(), _exporters_quiet():
            _write_program(path, program, args, names, shapes, info)
    except ExportError:
        raise
    except Exception as e:  # the exporters raise many types; the first line says why
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{model.model_name}: {path.suffix} export failed "
                          f"({type(e).__name__}: {first})"
                          + ("; try without dynamic sizes" if dynamic else "")) from e
    return info


def _dynamic_shapes(model, names: list[str]) -> tuple:
    """``torch.export``'s dynamic shapes: any number of points (at least 2)."""
    # the Galerkin layers switch to row blocks above BLOCK_ABOVE points
    from meshops.nn.galerkin import BLOCK_ABOVE

    top = BLOCK_ABOVE if model.model_name == "galerkin_transformer" else None
    pts = torch.export.Dim("points", min=2, max=top)
    # forward(*inputs): the inputs are one (variadic) argument
    return (tuple(None if k == "params" else {0: pts} for k in names),)


def _write_program(path: Path, program, args, names: list[str], shapes, info: dict) -> None:
    """Export ``program`` and write it to ``path`` (``.pt2`` or ``.onnx``) with ``info``,
    atomically."""
    ep = torch.export.export(program, args, dynamic_shapes=shapes)
    _check_no_meshops_ops(ep)
    if path.suffix == ".pt2":
        atomic_write(path, lambda tmp: torch.export.save(
            ep, tmp, extra_files={INFO: json.dumps(info)}))
        return
    ep = _for_onnx(ep)
    onnx_program = torch.onnx.export(ep, args, input_names=names, output_names=["y"],
                                     dynamo=True, dynamic_shapes=shapes,
                                     opset_version=ONNX_OPSET, verbose=False)
    onnx_program.model.metadata_props["meshops"] = json.dumps(info)
    atomic_write(path, lambda tmp: onnx_program.save(tmp))


@contextmanager
def _exporters_quiet():
    """The exporters' notices to their own developers (deprecations inside torch, the
    ONNX exporter's naming of dynamic axes, its registry's missing torchvision
    operators, onnx_ir's attribute types) are not the user's concern: silenced while
    they run. Their errors still raise."""
    import logging

    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "onnx_ir",
                                              "onnxscript")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        # e.g. "The axis name: points will not be used" (x, pos and weight share it)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _check_no_meshops_ops(ep) -> None:
    ops = sorted({str(node.target) for node in ep.graph.nodes
                  if node.op == "call_function" and "meshops" in str(node.target)})
    if ops:
        raise ExportError(f"the exported program calls meshops operators {ops}, which a "
                          f"plain torch cannot load")


def _euclidean_cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode=None) -> Tensor:
    """``torch.cdist`` for ``p = 2`` in elementary operations (the reduced basis's
    kernels), for which the ONNX exporter has no translation. The differences are
    formed directly (``cdist`` may expand the square instead): the same distances, or
    closer ones."""
    if p != 2.0:
        raise ExportError(f"the exported program computes a p = {p} distance (torch.cdist), "
                          f"which has no ONNX translation; export to .pt2")
    return (x1[..., :, None, :] - x2[..., None, :, :]).square().sum(-1).sqrt()


def _for_onnx(ep):
    """``ep`` in operations the ONNX translation of onnxscript 0.7 accepts: distances
    (``cdist``) decomposed, and no ``output_size`` on ``repeat_interleave`` (a size
    hint that changes nothing)."""
    cdist = (torch.ops.aten.cdist.default, torch.ops.aten._cdist_forward.default)
    if any(node.target in cdist for node in ep.graph.nodes):
        ep = ep.run_decompositions({op: _euclidean_cdist for op in cdist})
    _drop_output_size(ep)
    return ep


def _drop_output_size(ep) -> None:
    """Remove ``output_size`` from ``repeat_interleave`` calls (see :func:`_for_onnx`)."""
    changed = False
    for node in ep.graph.nodes:
        if node.op == "call_function" and "repeat_interleave" in str(node.target) \
                and "output_size" in node.kwargs:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "output_size"}
            changed = True
    if changed:
        ep.graph_module.recompile()


def read_info(path) -> dict[str, Any]:
    """The information :func:`export_model` stored with an exported file."""
    path = Path(path)
    if path.suffix == ".pt2":
        import zipfile

        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith(f"extra/{INFO}")), None)
            if name is None:
                raise ExportError(f"{path}: no {INFO} in this file (not written by meshops)")
            return json.loads(z.read(name))
    if path.suffix == ".onnx":
        import onnx

        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False)
                 .metadata_props}
        if "meshops" not in props:
            raise ExportError(f"{path}: no meshops metadata in this file")
        return json.loads(props["meshops"])
    raise ExportError(f"{path}: unknown export format {path.suffix!r}")


def load_exported(path):
    """A callable ``f(x, pos=None, weight=None) -> y`` of an exported file (numpy arrays or
    tensors in, a tensor out): ``torch.export.load`` for ``.pt2``, onnxruntime for
    ``.onnx``. Meant for checking an export; deployments load the file directly (see
    the module)."""
    path = Path(path)
    info = read_info(path)
    if path.suffix == ".pt2":
        module = torch.export.load(str(path)).module()

        def run(*arrays):
            return module(*(torch.as_tensor(a) for a in arrays))
    else:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def run(*arrays):
            feed = {k: torch.as_tensor(a).numpy() for k, a in zip(info["inputs"], arrays)}
            return torch.from_numpy(session.run(None, feed)[0])
    return run
