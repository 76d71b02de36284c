"""The optimiser and learning-rate scheduler of a :class:`~meshops.training.Trainer`:
built from a name, taken as an object, or made by a factory, and checked against the
model they train."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau


def name_of(obj) -> str:
    """A function's qualified name or an object's class name, for messages."""
    return getattr(obj, "__qualname__", None) or type(obj).__name__


#: The optimisers a Trainer builds by name (``weight_decay`` is decoupled in AdamW, an
#: L2 penalty in Adam).
OPTIMIZERS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}


def check_optimizer_arguments(optimizer, lr: float | None, weight_decay: float | None) -> None:
    """Refuse an unknown name or type, and ``lr``/``weight_decay`` given beside an
    optimiser object or factory (they would be silently ignored: it has its own)."""
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be 'adamw', 'adam', an optimizer or a callable "
                             f"params -> optimizer, got {optimizer!r}")
        return
    if not (isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer)):
        raise TypeError(f"optimizer must be 'adamw', 'adam', a torch.optim.Optimizer or a "
                        f"callable params -> optimizer, got a {type(optimizer).__name__}")
    given = [k for k, v in (("lr", lr), ("weight_decay", weight_decay)) if v is not None]
    if given:
        raise ValueError(f"Trainer: {' and '.join(given)} configure the optimizers named by a "
                         f"string; set them on the optimizer you pass instead")


#: Devices whose fused Adam(W) kernels torch ships (one kernel over all the parameters:
#: 0.5 ms a step where the per-tensor loop takes 3.1 ms, for the 98k-parameter slice
#: transformer on one CPU thread, a twentieth of its whole training step).
FUSED_DEVICES = ("cpu", "cuda")


def _can_fuse(params: list) -> bool:
    """Whether the fused Adam(W) kernel takes ``params``: floating tensors on one device
    it supports."""
    devices = {p.device for p in params}
    return (len(devices) == 1 and next(iter(devices)).type in FUSED_DEVICES
            and all(p.is_floating_point() for p in params))


def make_optimizer(model: nn.Module, optimizer, lr: float | None,
                   weight_decay: float | None) -> torch.optim.Optimizer:
    """The optimiser that ``optimizer`` names, is or makes, over ``model``'s parameters.

    Named ones (``lr`` default 1e-3, ``weight_decay`` 1e-4; torch's fused kernel where it
    takes the parameters) and factories get the trainable parameters; an object or a
    factory's result must hold only parameters of ``model``.
    """
    check_optimizer_arguments(optimizer, lr, weight_decay)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if isinstance(optimizer, str):
        return OPTIMIZERS[optimizer](trainable, lr=1e-3 if lr is None else lr,
                                     weight_decay=1e-4 if weight_decay is None else weight_decay,
                                     fused=_can_fuse(trainable) or None)
    if isinstance(optimizer, torch.optim.Optimizer):
        what = f"the {type(optimizer).__name__} optimizer"
    else:
        what = f"the optimizer factory {name_of(optimizer)}"
        optimizer = optimizer(trainable)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{what} returned a {type(optimizer).__name__}, not a "
                            f"torch.optim.Optimizer")
    own = {id(p) for p in model.parameters()}
    foreign = [tuple(p.shape) for g in optimizer.param_groups for p in g["params"]
               if id(p) not in own]
    if foreign:
        shown = ", ".join(str(list(s)) for s in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ValueError(f"Trainer: {what} holds {len(foreign)} parameter(s) that are not the "
                         f"model's (shapes {shown}); build it over model.parameters() of the "
                         f"model you train")
    return optimizer


def is_scheduler_object(obj) -> bool:
    """A scheduler (not a name, ``None`` or a factory): anything with ``step`` and
    ``state_dict``, or that is not callable (refused by :func:`check_scheduler`)."""
    if obj is None or isinstance(obj, str) or isinstance(obj, type):
        return False
    return isinstance(obj, LRScheduler) or (hasattr(obj, "step") and hasattr(obj, "state_dict")) \
        or not callable(obj)


def check_scheduler(scheduler, optimizer: torch.optim.Optimizer | None,
                    what: str = "the scheduler") -> None:
    """Refuse a scheduler that the per-batch loop cannot step, or that steps another optimiser."""
    if not (hasattr(scheduler, "step") and hasattr(scheduler, "state_dict")):
        raise TypeError(f"scheduler must be 'cosine', 'onecycle', None, a learning-rate "
                        f"scheduler or a callable (optimizer, total_steps) -> scheduler; "
                        f"{what} is a {type(scheduler).__name__}")
    if optimizer is None:  # the optimizer is still to be built from a name or factory
        raise ValueError("Trainer: a scheduler object needs the optimizer object it was built "
                         "on, passed as optimizer=; with a named optimizer or a factory, pass a "
                         "scheduler factory (optimizer, total_steps) -> scheduler")
    if isinstance(scheduler, ReduceLROnPlateau):
        raise ValueError(f"Trainer: {what} is a ReduceLROnPlateau, which steps on a metric; the "
                         f"trainer steps schedulers after every batch without one")
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise ValueError(f"Trainer: {what} ({type(scheduler).__name__}) steps another optimizer "
                         f"than the trainer's; build it on the optimizer object passed as "
                         f"optimizer=, or pass a callable (optimizer, total_steps) -> scheduler")


def make_scheduler(scheduler, optimizer: torch.optim.Optimizer, total_steps: int):
    """The scheduler that ``scheduler`` names, is or makes, on ``optimizer``.

    ``"cosine"`` decays to 0 over ``total_steps``; ``"onecycle"`` peaks at the rate
    ``optimizer`` was built with (``lr`` for a named one); a factory is called with
    ``(optimizer, total_steps)`` and its result checked; an object is returned as it
    is (check it with :func:`check_scheduler` first).
    """
    if scheduler is None:
        return None
    if scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    if scheduler == "onecycle":
        peak = [g["lr"] for g in optimizer.param_groups]
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=peak[0] if len(peak) == 1 else peak, total_steps=total_steps)
    if not is_scheduler_object(scheduler):
        made = scheduler(optimizer, total_steps)
        check_scheduler(made, optimizer, f"the scheduler factory {name_of(scheduler)}")
        return made
    return scheduler
