"""Devices for the layer and model tests: CPU, CUDA, and CUDA under bf16 autocast.

The ``device`` fixture (conftest.py) hands a test one :class:`Device`; the test builds
its inputs and its float64 reference on the CPU as before and runs the code under test
through :meth:`Device.run`, which moves a copy of the module and the inputs to the
device (float64 inputs become float32 under bf16 autocast: autocast leaves float64
alone; a layer's features, its first argument, become bf16, as inside an autocast
model) and brings the output back to the CPU. :meth:`Device.assert_close` then compares
with the CPU reference: elementwise with the test's tolerance in float32/float64, and
normwise with :data:`BF16_RTOL` under bf16 autocast.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
from dataclasses import dataclass
from typing import Any

import pytest
import torch

#: Normwise relative error allowed under bf16 autocast, ``|out - ref| / |ref|``
#: (Frobenius norms). bf16 keeps 8 significant bits, a unit roundoff of
#: ``u = 2^-8 = 3.9e-3``; autocast rounds the inputs and weights of every matmul to
#: it (accumulating in float32) and keeps norms, softmax and reductions in float32.
#: A layer rounds ~4 times in a row (Q/K/V projection inputs, the attention product,
#: the output projection's input), each adding a relative error of at most ``u/2``
#: per entry and about that in norm: ~4 x 2e-3 = 8e-3 at worst for the sum, and the
#: softmax/normalisations can amplify it by their condition number (~2 for these
#: well-scaled inputs), so 2e-2. Elementwise relative checks would be meaningless near
#: zeros of the output, hence the norm.
BF16_RTOL = 2e-2
#: The same for a whole model (lifting, 2-4 blocks, a decoder: ~4x the roundings of
#: one layer, residuals keep the errors from growing faster than additively).
BF16_MODEL_RTOL = 5e-2

CUDA = torch.cuda.is_available()
NO_CUDA = "no CUDA device: the CUDA and bf16-autocast variants run on a GPU machine"
#: MESHOPS_TEST_EMULATE_CUDA=1 runs the "cuda" variants on the CPU through the same
#: copy / move / compare path (and "cuda-bf16" under CPU bf16 autocast), to check that
#: path and its tolerances on a machine without a GPU; it proves nothing about CUDA.
#: MESHOPS_TEST_SHOW_BF16=1 prints each bf16 comparison's error (with ``pytest -s``).
SHOW_BF16 = os.environ.get("MESHOPS_TEST_SHOW_BF16") == "1"
EMULATE = not CUDA and os.environ.get("MESHOPS_TEST_EMULATE_CUDA") == "1"


@dataclass(frozen=True)
class Device:
    """Where a test runs: ``"cpu"``, ``"cuda"`` or ``"cuda-bf16"`` (bf16 autocast)."""

    name: str

    @property
    def type(self) -> torch.device:
        return torch.device("cpu" if self.name == "cpu" or EMULATE else "cuda")

    @property
    def bf16(self) -> bool:
        return self.name.endswith("bf16")

    @property
    def is_cuda(self) -> bool:
        return self.name != "cpu"

    def dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The floating dtype a test's ``dtype`` inputs get here (float32 under
        autocast, which would leave float64 computations in float64)."""
        return torch.float32 if self.bf16 and dtype == torch.float64 else dtype

    def autocast(self):
        if self.bf16:
            return torch.autocast(self.type.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def to(self, obj: Any) -> Any:
        """Tensors (also inside tuples, lists, dicts, PyG data) on this device, floating
        ones in :meth:`dtype`; CPU: unchanged."""
        if self.name == "cpu" or obj is None:
            return obj
        if isinstance(obj, torch.Tensor):
            dtype = self.dtype(obj.dtype) if obj.is_floating_point() else obj.dtype
            return obj.detach().to(self.type, dtype).requires_grad_(obj.requires_grad)
        if isinstance(obj, (tuple, list)):
            return type(obj)(self.to(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self.to(v) for k, v in obj.items()}
        if hasattr(obj, "to") and hasattr(obj, "apply"):        # PyG Data / Batch
            out = obj.clone().to(self.type)
            return out.apply(lambda t: t.to(self.dtype(t.dtype)) if t.is_floating_point()
                             else t)
        return obj

    def module(self, module: torch.nn.Module) -> torch.nn.Module:
        """A copy of ``module`` on this device (the module itself on the CPU, so that
        the test's reference keeps reading the same parameters)."""
        if self.name == "cpu":
            return module
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()),
                     torch.float32)
        return copy.deepcopy(module).to(self.type, self.dtype(dtype))

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on this device: ``fn`` a module or a bound method of
        one (``layer.dense``), run on a copy; the output back on the CPU, floating
        tensors in float64 off the CPU (on the CPU: exactly what ``fn`` returned)."""
        if self.name == "cpu":
            return fn(*args, **kwargs)
        if inspect.ismethod(fn) and isinstance(fn.__self__, torch.nn.Module):
            fn = getattr(self.module(fn.__self__), fn.__name__)
        elif isinstance(fn, torch.nn.Module):
            fn = self.module(fn)
        args = self.to(args)
        if self.bf16 and args and isinstance(args[0], (torch.Tensor, tuple, list)):
            # a layer's features x (or (x_src, x_dst)) enter in bf16, as they do inside
            # a model under autocast (they come out of an autocast Linear); positions
            # and weights stay float32
            args = (_cast(args[0], torch.bfloat16),) + tuple(args[1:])
        with self.autocast():
            out = fn(*args, **self.to(kwargs))
        return self.back(out)

    def back(self, out: Any) -> Any:
        """Results on the CPU (floating tensors float64 off the CPU)."""
        if self.name == "cpu":
            return out
        if isinstance(out, torch.Tensor):
            out = out.detach().cpu()
            return out.double() if out.is_floating_point() else out
        if isinstance(out, (tuple, list)):
            return type(out)(self.back(o) for o in out)
        return out

    def assert_close(self, actual: torch.Tensor, expected: torch.Tensor, *, rtol: float,
                     atol: float, bf16_rtol: float = BF16_RTOL, **kw: Any) -> None:
        """``torch.testing.assert_close`` on the CPU (float64 off the CPU), normwise
        relative ``bf16_rtol`` under bf16 autocast."""
        if self.name == "cpu":
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, **kw)
            return
        actual = actual.detach().cpu().double()
        expected = expected.detach().cpu().double()
        assert actual.shape == expected.shape, (actual.shape, expected.shape)
        if not self.bf16:
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, **kw)
            return
        assert bool(torch.isfinite(actual).all() == torch.isfinite(expected).all())
        fin = torch.isfinite(expected)
        err = float((actual[fin] - expected[fin]).norm())
        ref = max(float(expected[fin].norm()), atol)
        if SHOW_BF16:
            print(f"bf16 normwise relative error {err / ref:.2e} (bound {bf16_rtol})")
        assert err <= bf16_rtol * ref, (f"bf16 autocast: normwise relative error "
                                        f"{err / ref:.3g} > {bf16_rtol}")


def _cast(obj: Any, dtype: torch.dtype) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_cast(o, dtype) for o in obj)
    return obj


def params(bf16: bool = True) -> list:
    """The pytest parameters of the ``device`` fixture (``device64``: without bf16).
    The CUDA ones carry the ``cuda`` marker (``pytest -m cuda`` selects them) and skip
    without a GPU."""
    cuda = (pytest.mark.cuda, pytest.mark.skipif(not (CUDA or EMULATE), reason=NO_CUDA))
    names = ["cpu", "cuda"] + (["cuda-bf16"] if bf16 else [])
    return [pytest.param(Device(n), id=n, marks=() if n == "cpu" else cuda) for n in names]
