"""Export a trained model to a file that runs without meshops: ``torch.export``
(``.pt2``) or ONNX (``.onnx``).

The exported program is the model's :meth:`~meshops.models.NeuralOperator.predict`
on one sample, normalisers included, so it takes and returns physical units:

* **mesh-input models** (TransformerNO, Galerkin transformer: nothing in their
  forward depends on a precomputed mesh structure) take ``(x [N, C_in], pos [N, d],
  weight [N])`` and return ``[N, C_out]``; with ``dynamic=True`` ``N`` may vary
  (``N >= 2``), otherwise it is the example mesh's.
* **fixed-mesh models** (PiT: its latent mesh and neighbour graphs come from
  farthest-point sampling and k-d tree searches, which no exporter traces) have the
  example mesh -- positions, quadrature weights and those structures -- built into
  the program and take only ``x [N, C_in]``: new input fields on that mesh (the
  parametric-study case). For another mesh, export again.

Attention runs through PyTorch's ``scaled_dot_product_attention`` (the SDPA path of
:func:`meshops.nn.functional.weighted_attention`), not meshops' fused CPU kernel, so
the file needs no meshops operator. What a file needs at load time:

* ``.pt2``: ``torch`` (the version that wrote it, or a later one that reads its
  format): ``torch.export.load(path).module()(x, pos, weight)``.
* ``.onnx``: any ONNX runtime (opset 18): ``onnxruntime.InferenceSession(path).run(
  None, {"x": x, "pos": pos, "weight": weight})`` with float32 arrays.

Both files carry the field names, shapes and the signature (``.pt2``: the extra file
``meshops.json``; ``.onnx``: metadata property ``meshops``), see :func:`read_info`.
The patched transformer cannot be exported: its patch grouping reads the partition's
values on the host, which neither exporter traces (:class:`ExportError` says so).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from meshops._atomic import atomic_write
from meshops.normalizer import decode_outputs, encode_inputs

__all__ = ["FORMATS", "ExportError", "export_model", "load_exported", "read_info"]

FORMATS = (".pt2", ".onnx")
INFO = "meshops.json"
ONNX_OPSET = 18


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
    from meshops.models.digest import MESH_ID

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
    """``model.predict`` on one sample as a function of tensors (what is exported)."""

    def __init__(self, model, fixed: dict[str, Tensor] | None) -> None:
        super().__init__()
        self.model = model
        self.fixed = fixed  # pos, weight and the mesh structures of a fixed-mesh program

    def forward(self, x: Tensor, pos: Tensor | None = None, weight: Tensor | None = None):
        from meshops.data import MeshData

        m = self.model
        x = encode_inputs(m, x)
        if self.fixed is not None:
            data = MeshData(x=x, **self.fixed)
        else:
            data = MeshData(x=x, pos=pos, weight=weight)
        return decode_outputs(m, m(data))


def _info(model, fixed: bool, dynamic: bool, n: int, meta: dict) -> dict[str, Any]:
    cfg = dict(getattr(model, "config", {}) or {})
    inputs = ["x"] if fixed else ["x", "pos", "weight"]
    return {
        "format": "meshops-export-1", "model": model.model_name,
        "inputs": inputs, "outputs": ["y"],
        "points": None if dynamic else n, "fixed_mesh": fixed,
        "in_channels": cfg.get("in_channels"), "out_channels": cfg.get("out_channels"),
        "pos_dim": cfg.get("pos_dim"),
        "input_fields": meta.get("inputs"), "target_fields": meta.get("targets"),
        "field_shapes": meta.get("field_shapes"),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }


def export_model(model, mesh, path, *, dynamic: bool = False,
                 metadata: dict | None = None) -> dict[str, Any]:
    """Export ``model`` (its ``predict`` on one sample) to ``path`` (``.pt2`` or ``.onnx``).

    Args:
        model: A :class:`~meshops.models.NeuralOperator` (its normalisers are included).
        mesh: The example sample: ``x [N, C_in]``, ``pos [N, d]``, ``weight [N]`` (e.g.
            from :func:`meshops.inference.predict_mesh`'s inputs); for fixed-mesh
            models (see the module) the mesh built into the program.
        path: Output file; its suffix picks the format. Written atomically.
        dynamic: Let the number of points vary (mesh-input models only).
        metadata: The run's field metadata (``inputs``, ``targets``,
            ``field_shapes``), stored in the file.

    Returns:
        The information stored with the file (inputs, sizes, fields; see
        :func:`read_info`).

    Raises:
        ExportError: an unknown suffix, ``dynamic`` for a fixed-mesh model, or a model
            the exporter cannot trace (the exporter's reason is in the message).

    Shapes:
        mesh ``x [N, C_in]``, ``pos [N, d]``, ``weight [N]`` -> program ``[N, C_out]``
    """
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ExportError(f"{path}: unknown export format {path.suffix!r}; use .pt2 "
                          f"(torch.export) or .onnx")
    if model.model_name == "patched_transformer":
        raise ExportError("patched_transformer cannot be exported: its patch grouping reads "
                          "the partition's values on the host, which torch.export does not "
                          "trace; transformer_no, galerkin_transformer and pit export")
    param = next(model.parameters())
    x = mesh.x.to(param.dtype).cpu()
    pos, weight = mesh.pos.to(param.dtype).cpu(), mesh.weight.to(param.dtype).cpu()
    n = int(pos.shape[0])
    net = _sdpa(model).cpu()
    from meshops.data import MeshData

    structures = _added_structures(net, MeshData(x=x, pos=pos, weight=weight))
    fixed = bool(structures)
    if fixed and dynamic:
        raise ExportError(f"{model.model_name}: the exported program holds this mesh's "
                          f"latent mesh and neighbour graphs (built by searches no exporter "
                          f"traces), so its size is fixed; export without --dynamic, once per "
                          f"mesh")
    program = _Program(net, {"pos": pos, "weight": weight, **structures} if fixed else None)
    args = (x,) if fixed else (x, pos, weight)
    shapes = None
    if dynamic:
        # the Galerkin layers switch to row blocks above BLOCK_ABOVE points
        from meshops.nn.galerkin import BLOCK_ABOVE

        top = BLOCK_ABOVE if model.model_name == "galerkin_transformer" else None
        pts = torch.export.Dim("points", min=2, max=top)
        shapes = {"x": {0: pts}, "pos": {0: pts}, "weight": {0: pts}}
    info = _info(model, fixed, dynamic, n, dict(metadata or {}))
    try:
        with torch.no_grad():
            ep = torch.export.export(program, args, dynamic_shapes=shapes)
            _check_no_meshops_ops(ep)
            if path.suffix == ".pt2":
                atomic_write(path, lambda tmp: torch.export.save(
                    ep, tmp, extra_files={INFO: json.dumps(info)}))
            else:
                _drop_output_size(ep)
                onnx_program = torch.onnx.export(
                    ep, args, input_names=info["inputs"], output_names=["y"],
                    dynamo=True, dynamic_shapes=shapes, opset_version=ONNX_OPSET,
                    verbose=False)
                onnx_program.model.metadata_props["meshops"] = json.dumps(info)
                atomic_write(path, lambda tmp: onnx_program.save(tmp))
    except ExportError:
        raise
    except Exception as e:  # the exporters raise many types; the first line says why
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{model.model_name}: {path.suffix} export failed "
                          f"({type(e).__name__}: {first})"
                          + ("; try without dynamic sizes" if dynamic else "")) from e
    return info


def _check_no_meshops_ops(ep) -> None:
    ops = sorted({str(node.target) for node in ep.graph.nodes
                  if node.op == "call_function" and "meshops" in str(node.target)})
    if ops:
        raise ExportError(f"the exported program calls meshops operators {ops}, which a "
                          f"plain torch cannot load")


def _drop_output_size(ep) -> None:
    """Remove ``output_size`` from ``repeat_interleave`` calls: a size hint that changes
    nothing, which the ONNX translation of onnxscript 0.7 does not accept."""
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
