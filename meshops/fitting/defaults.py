"""Defaults for ``meshops train`` chosen from the data, and an epoch count that fits a
wall-clock budget.

A new user's folder is often a *parametric* FEM study: one fixed mesh, a few scalar
parameters per sample (``params``, or input fields constant over the mesh), 100-500
samples. For those the default is a :class:`~meshops.models.ReducedBasis`: a POD
basis with the regression of its coefficients chosen on the validation split, which
beats both the classical POD + RBF model and a neural operator trained for the same
ten minutes (``python -m benchmarks.accuracy``; figures in ``benchmarks/results/``).
Everything else trains a neural operator: PiT when the inputs are constant over each
mesh (a family of geometries, or one mesh too large for a reduced basis in memory) or
when one target channel is learned from input fields; the slice transformer
(:class:`~meshops.models.SliceTransformer`) when input fields map to several target
channels (velocity and pressure).
:func:`choose_defaults` looks at the samples and says which model it picked and why;
:func:`epochs_for_budget` times one training step and picks the number of epochs.
Options the user gives always win: :func:`options_from_data` and :func:`epochs_to_fit`
take the options given and return the ones to use.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

from meshops.reduced import (
    constant_channels,
    global_channels,
    input_ranges,
    means_and_sizes,
    proportional_channel,
)
from meshops.training.callbacks import Callback

# Every default below was chosen on the validation split of the benchmark's stand-ins
# (48 validation meshes each), from 3-minute one-thread probes of the field-mean relative
# L2 error (``python -m benchmarks.family_probe``; every line in
# benchmarks/results/family-probes-cpu-3min.jsonl). Test meshes were not looked at.
#
# PiT for a parametric map (inputs constant over each mesh, whether or not the meshes
# vary): the processor carries a few numbers per sample, which also condition every block
# (FiLM of the input means). Hole stand-in: width 64 0.0271, width 128 0.0310 (the
# earlier default, picked on test meshes), slice transformer 0.042 (batch 4, lr 3e-3) and
# 0.048 (batch 2, one-cycle); batch 2 with a one-cycle rate 0.057. Airfoil stand-in: PiT
# 0.169, slice transformer 0.231.
PARAMETRIC_PIT = {"width": 64, "heads": 4, "blocks": 4, "latent": "fps", "num_latent": 256,
                  "condition_on_inputs": True}
PARAMETRIC_TRAIN = {"batch_size": 4, "lr": 3e-3, "scheduler": "cosine"}
# Field inputs and one target channel: the same PiT, unconditioned. Elasticity stand-in:
# 0.067; batch 2 with a one-cycle rate 0.088; slice transformer 0.088 (batch 1, one-cycle)
# and 0.098 (batch 2). On the obstacle stand-in this PiT reached 0.084 where the earlier
# default (2 heads, batch 8, lr 1e-3) reached 0.133, and batch 2 with a one-cycle rate
# 0.105. Airfoil: batch 2 with a one-cycle rate 0.181, against batch 4 cosine 0.169.
# Both PiTs keep the farthest-point latent mesh: its points at sites of a grid over each
# mesh's box (latent="sites") held the airfoil's re-meshed validation shapes better (mean
# error 0.216 against 0.261 on the finer C-grids, seed 0) at a level validation error (3
# seeds), but cost 7-8 % of validation error on every hole seed and up to 5.5 % on
# elasticity, whose farthest-point meshes already hold across meshes (docs/accuracy.md).
# What held the airfoil across grids was a field of its shape: with geo:distance as a
# third input (the default then the slice transformer below) its re-meshed validation
# shapes moved 1.00-1.13x, and the suite's airfoil family now carries the distance to the
# airfoil as an input, as obstacle carries its sdf.
GENERAL_PIT = {"width": 64, "heads": 4, "blocks": 4, "latent": "fps", "num_latent": 256}
GENERAL_TRAIN = {"batch_size": 4, "lr": 3e-3, "scheduler": "cosine"}
# Field inputs and several target channels (velocity and pressure): the slice
# transformer, one sample per step and a one-cycle rate. Obstacle stand-in: 0.057 (u+v
# 0.051, p 0.063), against PiT's 0.084 above and Transolver's 0.067 (PhysicsNeMo, same
# probe); batch 2 0.070, batch 2 at lr 2e-3 0.060, a cosine rate 0.10-0.19.
#
# Slices below a thousandth of the domain muted in the attention among the tokens
# (min_measure, SliceAttention): on the 48 obstacle validation shapes re-meshed with the
# band at the body refined 64x (python -m benchmarks.validation_remesh; 40 epochs, seed 0;
# benchmarks/results/validation-remesh-obstacle.jsonl) the pressure error grows 1.13x
# with it, 1.26x with 1e-4 and 1.59x without, its error there 0.0385 against 0.0485;
# the price on the validation meshes themselves: 0.0321 against 0.0287 (one seed).
FIELDS_SLICE = {"width": 64, "layers": 4, "heads": 4, "slices": 32, "min_measure": 1e-3}
FIELDS_TRAIN = {"batch_size": 1, "lr": 1e-3, "scheduler": "onecycle"}
# Inputs constant over each mesh beside field inputs (global inputs, global_inputs()):
# the same models conditioned on their input means. Obstacle stand-in with a load factor
# c ~ U(0.5, 2) as a second input and the targets times c (an answer linear in it), the
# slice transformer for 10 epochs (python -m benchmarks.obstacle_probes --what
# global-inputs; benchmarks/results/obstacle-probes-cpu-1thread.jsonl): mean validation
# error 0.278 and 0.280 (seeds 0, 1) conditioned, 0.308 and 0.317 with c a pointwise
# feature only; pressure 0.159 and 0.166 against 0.198 and 0.206. The slice transformer
# reads them through their means only (global_inputs): 0.260 and 0.270 (--variant
# film-only); and where the answer does not depend on c (--what irrelevant-global),
# 0.112 and 0.142 against 0.146 and 0.211 read at every point too, where a value unique
# to each training mesh lets the model tell the meshes apart (0.099 and 0.098 without c).

# Snapshot values (samples x points x channels) up to which a reduced basis is the
# default: 2.5e8 float64 values are 2 GB, a few times that while the SVD runs.
REDUCED_BASIS_MAX_VALUES = 250_000_000


def _shares_one_mesh(samples: Sequence) -> bool:
    first = samples[0].pos
    return all(s.pos is first or (s.pos.shape == first.shape and torch.equal(s.pos, first))
               for s in samples[1:])


def _parametric(dataset: Sequence) -> tuple[bool, str]:
    """Whether ``dataset`` is a parametric study a reduced basis can take, and why not."""
    from meshops.reduced import sample_parameters

    if callable(getattr(dataset, "facts", None)):  # read lazily: too large to hold
        return False, "the data is read lazily, and a reduced basis holds every snapshot"
    from meshops.training.baselines import correspondence, target_points

    how, why = correspondence(list(dataset))
    if how is None:
        return False, why
    params, why = sample_parameters(dataset)
    if params is None:
        return False, why
    if params.shape[0] < 2:  # no spread to tell (std() of one row is NaN)
        return False, ("one training sample: a reduced basis needs several, whose "
                       "parameters vary")
    if not bool((params.std(0) > 0).any()):
        return False, "the parameters are the same in every sample"
    size = len(dataset) * int(target_points(dataset[0])[0].shape[0]) * \
        int(dataset[0].y.reshape(dataset[0].y.shape[0], -1).shape[1])
    if size > REDUCED_BASIS_MAX_VALUES:
        return False, (f"{size:,} snapshot values, more than a reduced basis holds in "
                       f"memory ({REDUCED_BASIS_MAX_VALUES:,})")
    return True, (f"one {'grid shape' if how == 'grid' else 'mesh'} and "
                  f"{int(params.shape[1])} parameter(s) per sample")


def data_facts(dataset: Sequence) -> dict[str, Any]:
    """What :func:`choose_defaults` looks at: ``n`` samples, their mean ``points``,
    whether they share ``one_mesh``, whether their inputs are ``constant`` over each mesh,
    which input channels are global inputs (``global_channels``: constant over each mesh
    and not the same in all, a bool per channel, ``None`` without inputs), the one the
    targets are proportional to (``proportional``: ``(channel, exponent)`` or ``None``,
    :func:`~meshops.reduced.parameters.proportional_channel`), whether they have inputs
    at all (``has_x``) and the number of target ``channels``.
    A data set that knows these without reading its samples
    (:class:`meshops.datasets.cache.CachedMeshDataset`) gives them by its ``facts()``."""
    facts = getattr(dataset, "facts", None)
    if callable(facts):
        return facts()
    n = len(dataset)
    ranges = [input_ranges(s) for s in dataset]
    channels, glob = constant_channels(ranges), global_channels(ranges)
    return {"n": n, "points": round(sum(int(s.pos.shape[0]) for s in dataset) / n),
            "one_mesh": _shares_one_mesh(dataset),
            "constant": channels is not None and all(channels),
            "global_channels": glob,
            "proportional": None if channels is not None and all(channels)
            else proportional_channel(*means_and_sizes(dataset), glob),
            "has_x": getattr(dataset[0], "x", None) is not None,
            "channels": int(dataset[0].y.reshape(dataset[0].y.shape[0], -1).shape[1])}


def output_scale_channel(dataset: Sequence) -> int | None:
    """The input channel the model's outputs scale by (``Trainer(normalize=...)``): the
    global input the targets are proportional to (``data_facts``'s ``proportional``),
    ``None`` when there is none."""
    found = data_facts(dataset).get("proportional")
    return None if found is None else found[0]


def global_inputs(facts: dict[str, Any]) -> str:
    """What the data's global inputs are, for the log (``""``: none): input channels
    constant over each mesh beside others that vary (a load, a speed or a material
    beside a distance field). The defaults condition the whole model on them (FiLM of
    the input means at every site), and the slice transformer reads them through their
    means only: as pointwise features they reach the output only through products the
    network must learn, and a value unique to each training mesh lets it tell the meshes
    apart (validation figures: the note below :data:`FIELDS_TRAIN`)."""
    channels = facts.get("global_channels") or []
    if facts.get("constant") or not any(channels):
        return ""
    which = ", ".join(str(i) for i, c in enumerate(channels) if c)
    scaled = facts.get("proportional")
    per_unit = (f"; the targets are proportional to channel {scaled[0]} (exponent "
                f"{scaled[1]:.2f}), so the model learns them per unit of it" if scaled else "")
    return (f" ({sum(channels)} of them constant over each mesh, channel(s) {which}: "
            f"global inputs that condition every block{per_unit})")


def _facts_line(f: dict[str, Any]) -> str:
    """The data as the chosen defaults' line starts: samples, meshes, points, inputs."""
    one_mesh = f["one_mesh"]
    return (f"{f['n']} samples of {'one mesh' if one_mesh else 'varying meshes'} "
            f"({f['points']:,} points{' each' if one_mesh else ' on average'}), "
            f"{'constant' if f['constant'] else 'field' if f['has_x'] else 'no'} inputs")


def _slice_config(facts: dict[str, Any]) -> dict[str, Any]:
    """The slice transformer's sizes, conditioned on constant inputs, the global ones
    read through their means only."""
    cfg = dict(FIELDS_SLICE)
    channels = facts.get("global_channels") or []
    if facts["constant"] or any(channels):
        cfg["condition_on_inputs"] = True
    if not facts["constant"] and any(channels):
        cfg["global_inputs"] = [i for i, c in enumerate(channels) if c]
    return cfg


def choose_defaults(dataset: Sequence, model: str | None = None
                    ) -> tuple[str, dict[str, Any], dict[str, Any], str]:
    """The model and training options for ``dataset``, with a one-line reason.

    Args:
        dataset: The training samples (``pos [N, d]``, ``x [N, C]`` or none,
            ``params [1, K]`` or none).
        model: The model the user asked for, or ``None`` to choose one.

    Returns:
        ``(model_name, model_config, train_config, reason)``: ``train_config`` holds
        ``batch_size``, ``lr`` and ``scheduler`` for the models trained by epochs (empty for the
        reduced basis, which is fitted); the epoch count comes from
        :func:`epochs_for_budget`.

    Raises:
        ValueError: If ``dataset`` is empty, or ``model`` is ``"reduced_basis"`` and the
            data is not a parametric study (the message says why).
    """
    if len(dataset) == 0:
        raise ValueError("choose_defaults: the dataset is empty")
    f = data_facts(dataset)
    points, constant, glob = f["points"], f["constant"], global_inputs(f)
    facts = _facts_line(f) + glob
    if model in (None, "reduced_basis"):
        parametric, why = _parametric(dataset)
        if parametric:
            return "reduced_basis", {}, {}, (
                f"{facts}: a parametric study ({why}), so a reduced basis: POD modes and "
                f"the regression of their coefficients (spline, Gaussian process or MLP "
                f"ensemble) with the lowest validation error")
        if model == "reduced_basis":
            raise ValueError(f"the reduced_basis model needs a parametric study (one mesh "
                             f"and a parameter vector per sample); this data is not one: {why}")
    several = f.get("channels", 1) > 1
    kind = ("a parametric map" if constant else f"{f.get('channels', 1)} target channels"
            if several else "one target channel")
    name = model or ("slice_transformer" if several and not constant else "pit")
    if name == "slice_transformer":
        cfg, train = _slice_config(f), FIELDS_TRAIN
        size = (f"the slice transformer (width {cfg['width']}, {cfg['slices']} slices, "
                f"those under {cfg['min_measure']:g} of the domain muted)")
    elif name == "pit":
        cfg, train = ((dict(PARAMETRIC_PIT), PARAMETRIC_TRAIN) if constant
                      else (dict(GENERAL_PIT), GENERAL_TRAIN))
        # a latent mesh no larger than the meshes
        cfg["num_latent"] = min(cfg["num_latent"], points)
        if glob:
            cfg["condition_on_inputs"] = True
        size = (f"a small PiT (width {cfg['width']}, {cfg['num_latent']} latent points, "
                f"{cfg['blocks']} blocks)")
    else:  # a model the defaults were not chosen for: its own sizes, PiT's training
        train = PARAMETRIC_TRAIN if constant else GENERAL_TRAIN
        return name, {}, dict(train), (f"{facts}: batch {train['batch_size']}, lr "
                                       f"{train['lr']:g}, {train['scheduler']} rate")
    return name, cfg, dict(train), (
        f"{facts}, {kind}: {size}, batch {train['batch_size']}, lr {train['lr']:g}, "
        f"{train['scheduler']} rate")


def epochs_for_budget(seconds_per_step: float, steps_per_epoch: int, minutes: float,
                      val_steps: int = 0) -> int:
    """The number of epochs whose training fits in ``minutes``.

    A validation step (forward only) is counted as a third of a training step; 10 %
    of the budget is left for set-up, checkpoints and the noise of a shared machine.

    Raises:
        ValueError: If a time or count is not positive.
    """
    if not (seconds_per_step > 0 and steps_per_epoch > 0 and minutes > 0):
        raise ValueError(f"epochs_for_budget: need positive seconds_per_step, "
                         f"steps_per_epoch and minutes, got {seconds_per_step}, "
                         f"{steps_per_epoch}, {minutes}")
    epoch = seconds_per_step * (steps_per_epoch + val_steps / 3)
    return max(1, math.floor(0.9 * 60 * minutes / epoch))


def time_training_step(model, samples: Sequence, batch_size: int, repeats: int = 2) -> float:
    """Seconds of one forward and backward pass on the first ``batch_size`` samples
    (the fastest of ``repeats`` after one warm-up), with the model's mesh structures
    built beforehand as :class:`~meshops.training.Trainer` does. The model's weights
    are not changed; its gradients are cleared."""
    from meshops.training.dataset import make_loader, prepare_batch
    from meshops.training.loss import RelativeLpLoss
    from meshops.training.trainer import targets_of, with_mesh_structures

    # Structures built (and shared by samples of one mesh) as the Trainer builds them,
    # so that the step timed is the step trained.
    batch = with_mesh_structures(model, list(samples[:batch_size]), "timing", False)
    data = prepare_batch(next(iter(make_loader(batch, len(batch)))))
    loss_fn = RelativeLpLoss()
    best = math.inf
    was_training = model.training
    model.train()
    try:
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            loss_fn(model(data), *targets_of(data)).backward()
            if i:
                best = min(best, time.perf_counter() - t0)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return best


def options_from_data(samples: Sequence, model: str | None = None,
                      model_config: dict[str, Any] | None = None, batch_size: int | None = None,
                      lr: float | None = None, scheduler: str | None = "auto"
                      ) -> tuple[dict[str, Any], str]:
    """The options of a training run that nobody gave (``None``, or ``"auto"`` for the
    schedule), chosen from the data by :func:`choose_defaults`: the model, the chosen
    model's hyperparameters under the given ``model_config`` (when the model is the chosen
    one), the batch size, learning rate and learning-rate schedule.

    Returns:
        ``(options, reason)``: ``options`` has ``model``, ``model_config``,
        ``batch_size``, ``lr`` and ``scheduler`` (the given ones kept; the others stay
        unset for a model that is fitted rather than trained by epochs), ``reason`` says
        what was chosen and why (``""`` when nothing was).

    Raises:
        ValueError: As :func:`choose_defaults`.
    """
    model_config = dict(model_config or {})
    name, chosen_config, train, reason = choose_defaults(samples, model)
    unset = {"batch_size": None, "lr": None, "scheduler": "auto"}
    out: dict[str, Any] = {"model": name if model is None else model,
                           "model_config": model_config, "batch_size": batch_size, "lr": lr,
                           "scheduler": scheduler}
    before = {**out, "model": model}
    given = [k for k in train if out[k] != unset[k]]
    if out["model"] == name:
        given = [k for k in chosen_config if k in model_config] + given
        out["model_config"] = {**chosen_config, **model_config}
    for key, value in train.items():
        if out[key] == unset[key]:
            out[key] = value
    # Nothing chosen (every option given, e.g. a resumed run): nothing to say.
    if out == before:
        return out, ""
    return out, reason + (f" (the options given win: {', '.join(given)})" if given else "")


def epochs_to_fit(model, samples: Sequence, batch_size: int, minutes: float,
                  num_val: int, threads: int | None = None) -> tuple[int, int, float, str]:
    """The epochs that fit ``minutes`` (:func:`epochs_for_budget` from one timed step of
    ``model`` on ``batch_size`` of ``samples``, with ``num_val`` validation samples), the
    thread count (``threads`` when given, else the fewest nearly as fast as the fastest
    of one thread and all of torch's: :func:`faster_threads`, which leaves torch set to
    it), the seconds of a step on them, and what was done, for the log:
    ``(epochs, threads, step, note)``."""
    threads, step, why = faster_threads(model, samples, batch_size, threads)
    steps = math.ceil(len(samples) / batch_size)
    epochs = epochs_for_budget(step, steps, minutes, math.ceil(num_val / batch_size))
    return epochs, threads, step, (
        f"{epochs} epochs fit the {minutes:g}-minute budget "
        f"({step:.2f} s per step of {batch_size} samples{why}, {steps} steps per epoch; "
        f"--threads {threads} --epochs {epochs} repeats this run exactly)")


#: Thread counts whose step is within this fraction of the fastest count as fast, and
#: the fewest of them wins: on a shared machine each thread more is a core that another
#: process can take, and a step whose threads wait for a taken core is many times slower.
THREADS_RTOL = 0.1
#: An epoch whose steps take more than this many times the planned step has the threads
#: timed again (:class:`ThreadCheck`) ...
SLOW = 2.0
#: ... at most this many times a run: each check costs a few steps.
RECHECKS = 2


def fewest_threads(times: dict[int, float], rtol: float = THREADS_RTOL) -> int:
    """The fewest threads whose step time (``times``: seconds by thread count) is within
    ``rtol`` of the fastest."""
    fastest = min(times.values())
    return min(n for n, t in times.items() if t <= (1 + rtol) * fastest)


def time_threads(model, samples: Sequence, batch: int, counts: Sequence[int]
                 ) -> dict[int, float]:
    """Seconds of a training step (:func:`time_training_step`) with each thread count of
    ``counts``, in that order; torch is left set to the last."""
    times = {}
    for n in counts:
        torch.set_num_threads(n)
        times[n] = time_training_step(model, samples, batch)
    return times


def _on(n: int) -> str:
    return f"{n} thread" + ("s" if n > 1 else "")


def faster_threads(model, samples: Sequence, batch: int, threads: int | None = None
                   ) -> tuple[int, float, str]:
    """``(threads, seconds per step, note)``: ``threads`` when given, else the fewer of
    all of torch's threads and one unless the fewer is more than :data:`THREADS_RTOL`
    slower (:func:`fewest_threads`), from a timed step with each; torch is left set to
    the choice. Small models on a busy machine can be several times slower with two
    threads than with one (the threads wait for each other's core); larger ones gain
    from all of them."""
    many = torch.get_num_threads()
    if threads is not None or many == 1:
        torch.set_num_threads(threads or many)
        return threads or many, time_training_step(model, samples, batch), ""
    times = time_threads(model, samples, batch, (many, 1))
    chosen = fewest_threads(times)
    torch.set_num_threads(chosen)
    other = 1 if chosen == many else many
    return chosen, times[chosen], f" on {_on(chosen)}, {times[other]:.2f} s on {other}"


class ThreadCheck(Callback):
    """Times the threads again when an epoch's steps are :data:`SLOW` times the planned
    step (another process took a core: two threads on one core can make a step 20x
    slower), and trains on :func:`fewest_threads` of one and ``many`` from then on, at
    most :data:`RECHECKS` times a run; each check is said on a line of its own after the
    epoch's (``log``).

    ``model``, ``samples`` and ``batch`` are those the plan timed (:func:`faster_threads`)
    and ``planned`` its seconds per step. An epoch's step time counts its ``val_steps``
    validation steps as a third of a training step each, as :func:`epochs_for_budget`
    does. The timed steps draw no random numbers of the run (its generator is
    restored), so a run that never switches repeats bit for bit.
    """

    def __init__(self, model, samples: Sequence, batch: int, planned: float, many: int,
                 val_steps: int, log: Callable[[str], None]) -> None:
        self.model, self.samples, self.batch = model, samples, batch
        self.planned, self.many, self.val_steps, self.log = planned, many, val_steps, log
        self.left = RECHECKS

    def on_epoch_end(self, trainer, entry: dict[str, Any]) -> None:
        step = entry["time_s"] / (trainer.steps_per_epoch + self.val_steps / 3)
        now = torch.get_num_threads()
        counts = sorted({now, self.many, 1}, reverse=True)
        if (self.left <= 0 or len(counts) == 1 or trainer.device.type != "cpu"
                or step <= SLOW * self.planned):
            return
        self.left -= 1
        with torch.random.fork_rng(devices=[]):
            times = time_threads(self.model, self.samples, self.batch, counts)
        chosen = fewest_threads(times)
        torch.set_num_threads(chosen)
        timed = ", ".join(f"{t:.2f} s on {_on(n)}" for n, t in times.items())
        self.log(f"epoch {entry['epoch']}: {step:.2f} s per step, {step / self.planned:.1f}x "
                 f"the planned {self.planned:.2f} s (another process on these cores?); "
                 f"timed again: {timed}; "
                 + (f"training on {_on(chosen)} from now on" if chosen != now
                    else f"staying on {_on(chosen)}"))
        self.planned = times[chosen]
