"""Which model a run keeps, why, and the validation figures it was kept by: a
:class:`~meshops.runs.run.Run`'s ``choice``, read from its checkpoint or given by the
fit that trained it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Choice:
    """Which model a run keeps in ``best.pt``, why, and the validation figures it was
    kept by.

    Attributes:
        model: The model's name (``pit``, ``reduced_basis``, ``trajectory_basis``,
            ``next_step`` for a time-series model of steps, ...).
        reason: The options chosen from the data, and why (what the command prints as
            ``defaults from the data: ...``); ``""`` when every option was given, and
            for a run loaded from its folder, which does not record it.
        selected: Which state or candidate became ``best.pt``, in words (``""`` for a
            dry run, which trains nothing).
        metric: The name of the validation figures (``l2_mean``, ...); ``None``
            without validation data.
        validation: The validation figures by candidate: the model's best epoch for a
            trained model, each regression's mean for a reduced basis, the trajectory
            basis and the next-step model for a time-series run that tried both;
            empty without validation data.
        epoch: The epoch of ``best.pt`` (``None`` for a fitted model).
    """

    model: str
    reason: str = ""
    selected: str = ""
    metric: str | None = None
    validation: dict[str, float | None] = field(default_factory=dict)
    epoch: int | None = None

    @classmethod
    def from_metadata(cls, model_name: str, meta: dict) -> "Choice":
        """The choice a checkpoint records (``meta``: its metadata)."""
        val, metric = meta.get("val") or {}, meta.get("metric")
        value = val.get(metric, val.get(f"{metric}_mean")) if metric else None
        epoch = meta.get("epoch")
        selected = meta.get("selected") or (
            f"epoch {epoch}: the lowest validation {metric}" if value is not None else "")
        return cls(model_name, "", str(selected), metric if value is not None else None,
                   {model_name: value} if value is not None else {}, epoch)
