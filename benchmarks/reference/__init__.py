"""Side by side: meshops PiT against the PiT authors' reference code, per training step.

    python -m benchmarks.reference --reference-dir /tmp/pit_ref [--quick]

The reference code (github: junfeng-chen/position_induced_transformer) is not part
of meshops and is never copied into it: ``--reference-dir`` is a checkout of a
snapshot of that repository, and the benchmark runs its training scripts
(``train_naca.py``, ``train_elasticity.py``) from a scratch folder, changed only
where the comparison needs it (:data:`CASES`, :func:`patch_script`):

* the data path (``load_data('./', ...)``) -> the folder of the stand-in files;
* the split (``ntrain``, ``ntest``) -> 200 / 40;
* the device (``.cuda()``) -> ``.to(DEVICE)`` (``cpu`` here);
* the airfoil's target: density, u, v, p (``Q[:, :4]``, ``out_dim=4``) -> Mach
  (``Q[:, 4:5]``, ``out_dim=1``), the channel meshops trains on;
* the script is cut before its epoch loop; the body of its loop over
  ``train_loader`` (``zero_grad``, forward, loss, ``backward``, ``optimizer.step``,
  ``scheduler.step``, ``loss.item()``) is executed as one step, on batches drawn
  from its own ``train_loader`` beforehand (data loading is excluded on both sides).

Both sides run in fresh processes with the same number of threads, float32 and
the float32 matmul precision the reference sets; each process does ``warmup``
steps (the reference's ``torch.compile`` happens there), then ``steps`` timed
steps; the processes alternate, reference and meshops, for ``rounds`` rounds.

The reference runs in one or more modes (``--reference-modes``): ``compiled`` (their
script as it is), ``compiled-static`` (the same with torch._dynamo's automatic dynamic
shapes off) and ``eager`` (their ``torch.compile`` line dropped).  ``--batch-size``
sets both sides' batch (their scripts use 20 and 10; the paper's timings are per
1,000-sample epoch, :attr:`Case.paper_epoch_s`).  ``--profile DIR`` adds profiled
steps to every process (:mod:`benchmarks.reference.profiling`).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

__all__ = ["CASES", "Case", "patch_script", "reference_settings", "meshops_kwargs",
           "step_body"]


@dataclass(frozen=True)
class Case:
    """One comparison: the reference script and settings, and how meshops matches them."""

    name: str
    script: str
    expected: dict
    """Hyperparameters the reference script must set (checked on its text)."""
    patches: tuple = field(default=())
    """``(regex, replacement, count)``: the changes the comparison needs, each of which
    must match exactly ``count`` times in the part of the script that runs."""
    grid_shape: tuple | None = None
    paper_epoch_s: float | None = None
    """The PiT paper's training time per epoch of 1,000 samples (RTX 3090), for scale:
    a measurement of the reference far slower than that is a harness problem."""


# The changes every script needs: data path, split sizes, device.
_COMMON = (
    (r"load_data\('\./'", "load_data(DATA_DIR", 1),
    (r"^ntrain(\s*)=\s*\d+", r"ntrain\1= NTRAIN", 1),
    (r"^ntest(\s*)=\s*\d+", r"ntest\1= NTEST", 1),
    (r"\.cuda\(\)", ".to(DEVICE)", 1),
)

CASES = {
    "airfoil": Case(
        name="airfoil", script="train_naca.py", grid_shape=(221, 51),
        expected=dict(hid_dim=128, n_head=1, n_blocks=4, x_downsample=4, y_downsample=4,
                      en_loc=0.02, de_loc=0.02, batch_size=20, learning_rate=0.001),
        paper_epoch_s=15.3,
        patches=_COMMON + (
            # target: Mach (channel 4) instead of density, u, v, p
            (r"\[:,:4,\.\.\.\]", "[:,4:5,...]", 1),
            (r"out_dim=4\b", "out_dim=1", 2),
        )),
    "elasticity": Case(
        name="elasticity", script="train_elasticity.py",
        expected=dict(hid_dim=256, n_head=2, n_blocks=4, en_loc=0.02, de_loc=0.02,
                      batch_size=10, learning_rate=0.001),
        paper_epoch_s=7.69,
        patches=_COMMON),
}

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_LOOP = re.compile(r"^for ep in range\(epochs\):", re.M)
_BATCH_LOOP = re.compile(r"^(\s*)for x, ext, y in train_loader:\s*$", re.M)
_COMPILE = (r"^model = torch\.compile\(model\)$", "pass  # torch.compile off (eager mode)", 1)
PAPER_TRAIN = 1000
"""Samples per epoch in the paper's timings (the training sets of NACA and Elasticity)."""


def reference_settings(text: str, names) -> dict:
    """The numeric value each of ``names`` is set to in a script (``name = v`` or
    ``name=v``); a name set to two different values raises ValueError."""
    out = {}
    for name in names:
        values = {float(v) for v in re.findall(rf"\b{name}\s*=\s*({_NUMBER})\b", text)}
        if len(values) > 1:
            raise ValueError(f"{name} is set to several values: {sorted(values)}")
        if values:
            v = values.pop()
            out[name] = int(v) if v.is_integer() else v
    return out


def _check_expected(case: Case, text: str) -> None:
    found = reference_settings(text, case.expected)
    wrong = {k: (v, found.get(k)) for k, v in case.expected.items() if found.get(k) != v}
    if wrong:
        detail = ", ".join(f"{k}={got} (expected {want})" for k, (want, got) in wrong.items())
        raise ValueError(f"{case.script}: the reference settings changed: {detail}")


def _prefix(case: Case, text: str) -> str:
    m = _LOOP.search(text)
    if m is None:
        raise ValueError(f"{case.script}: no 'for ep in range(epochs):' loop to cut before")
    return text[:m.start()]


def _apply(case: Case, text: str, patches) -> str:
    for pattern, repl, count in patches:
        new, n = re.subn(pattern, repl, text, flags=re.M)
        if n != count:
            raise ValueError(f"{case.script}: expected {count} match(es) of {pattern!r}, "
                             f"found {n}; the reference script changed")
        text = new
    return text


def patch_script(case: Case, text: str, data_dir: str, ntrain: int, ntest: int,
                 device: str = "cpu", compile: bool = True,
                 batch_size: int | None = None) -> str:
    """The reference script's text up to its epoch loop, with :attr:`Case.patches`
    (and, with ``compile=False``, without its ``torch.compile`` line; with
    ``batch_size``, that batch size instead of the script's).

    Checks first that the script sets :attr:`Case.expected`, so that a changed
    reference says so instead of being benchmarked at other settings.

    Raises:
        ValueError: a setting, a patched line or the epoch loop not found as expected.
    """
    _check_expected(case, text)
    prefix = _prefix(case, text)
    patches = case.patches + (() if compile else (_COMPILE,))
    if batch_size is not None:
        patches += ((r"^batch_size(\s*)=\s*\d+", rf"batch_size\g<1>= {int(batch_size)}", 1),)
    body = _apply(case, prefix, patches)
    header = (f"# {case.script}, cut before its epoch loop and patched by benchmarks.reference\n"
              f"DATA_DIR, NTRAIN, NTEST, DEVICE = {data_dir.rstrip('/') + '/'!r}, {int(ntrain)}, "
              f"{int(ntest)}, {device!r}\n")
    return header + body


def step_body(case: Case, text: str) -> str:
    """The body of the script's loop over ``train_loader`` (one training step),
    dedented, with ``.cuda()`` -> ``.to(DEVICE)``.

    Raises:
        ValueError: no such loop.
    """
    m = _BATCH_LOOP.search(text)
    if m is None:
        raise ValueError(f"{case.script}: no 'for x, ext, y in train_loader:' loop")
    indent = len(m.group(1))
    lines = []
    for line in text[m.end():].splitlines()[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        lines.append(line)
    body = textwrap.dedent("\n".join(lines)).strip("\n") + "\n"
    if "backward()" not in body or "optimizer.step()" not in body:
        raise ValueError(f"{case.script}: the train_loader loop has no backward/optimizer step")
    return body.replace(".cuda()", ".to(DEVICE)")


def meshops_kwargs(case: Case) -> dict:
    """meshops PiT's keywords at the configuration closest to the reference's.

    Differences that remain: the airfoil's encoder reads all 11,271 grid nodes
    (226 neighbours per latent point; the reference reads its 120 airfoil-surface
    points), meshops' latent grid keeps the last grid line (56 x 14 vs 56 x 13
    points), the encoder/decoder balls are k-nearest-neighbour graphs instead of a
    quantile mask over a dense distance matrix, meshops' attention has value maps
    and its processor blocks a residual linear path, and the reference runs under
    ``torch.compile`` while meshops runs eagerly with its fused kernels.
    """
    e = case.expected
    kw = dict(width=e["hid_dim"], heads=e["n_head"], blocks=e["n_blocks"],
              quantile_in=e["en_loc"], quantile_out=e["de_loc"], ball="count")
    if case.grid_shape is not None:
        if e["x_downsample"] != e["y_downsample"]:
            raise ValueError("meshops' stride per axis: pass a list")
        kw.update(latent="grid", grid_shape=list(case.grid_shape), stride=e["x_downsample"])
    else:
        kw.update(latent="input")  # the reference's latent mesh is the input mesh
    return kw
