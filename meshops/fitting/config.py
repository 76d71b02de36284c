"""The options of a fit (:func:`meshops.fit`'s keywords) as one typed
:class:`TrainConfig`.

Options come from four places, each overriding the one before: the defaults
below, ``RUN/config.yaml`` of a run being resumed, a ``--config FILE`` (YAML, or
TOML by its suffix) and the command-line flags. Every value is coerced and checked
by the coercer of its field, and a bad one is refused naming the option and where
it came from (``command line: lr: ...`` or ``train.yaml: lr: ...``). Options left
``None`` (model size, batch size, learning rate, epochs) are chosen later from the
data by :mod:`meshops.fitting.defaults`; :meth:`TrainConfig.render` writes the
config as it was finally chosen (``RUN/config.yaml``, ``--dry-run``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from meshops.datasets.fields import field_names
from meshops.errors import UsageError
from meshops.runs.run_folder import RUN_CONFIG

__all__ = ["TRAIN_DEFAULTS", "TrainConfig", "load_config_file", "resolve_train_config"]

#: The source of :func:`meshops.fit`'s options (``TrainRequest.source``): its messages
#: name its keywords where the command's name flags (:func:`option_name`).
FIT = "fit()"


def option_name(key: str, source: str, value: str | None = None) -> str:
    """Option ``key`` (with ``value``, when given) as the caller that gave the options
    (``source``) writes it: :func:`meshops.fit`'s keyword (``val_data=DIR``, ``out=``;
    ``overwrite=True`` for a switch), else the command's flag (``--val-data DIR``)."""
    if source != FIT:
        flag = "--" + key.replace("_", "-")
        return flag if value is None else f"{flag} {value}"
    switch = key in ("resume", "overwrite", "dry_run") or \
        isinstance(TRAIN_DEFAULTS.get(key), bool)
    return f"{key}=True" if switch and value is None else f"{key}={value or ''}"


# ------------------------------------------------------------------- coercers
# Each takes the option's label for messages ("<source>: <key>") and a value as a
# flag, YAML or TOML gives it, and returns the value of the field or raises UsageError.
def _to_int(key, v, minimum=None, maximum=None):
    if isinstance(v, bool):
        raise UsageError(f"{key}: expected an integer, got {v!r}")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        try:
            v = int(v)
        except ValueError:
            raise UsageError(f"{key}: expected an integer, got {v!r}") from None
    if not isinstance(v, int):
        raise UsageError(f"{key}: expected an integer, got {v!r}")
    if minimum is not None and v < minimum:
        raise UsageError(f"{key}: must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise UsageError(f"{key}: must be <= {maximum}, got {v}")
    return v


def _seed(key, v):
    from meshops.training.seed import MAX_SEED

    return _to_int(key, v, minimum=0, maximum=MAX_SEED)


def _to_float(key, v, positive=False, nonneg=False):
    if isinstance(v, bool):
        raise UsageError(f"{key}: expected a number, got {v!r}")
    try:
        v = float(v)  # YAML reads 1e-3 (without a dot) as a string
    except (TypeError, ValueError):
        raise UsageError(f"{key}: expected a number, got {v!r}") from None
    if not math.isfinite(v) or (positive and v <= 0) or (nonneg and v < 0):
        raise UsageError(f"{key}: must be a finite {'positive' if positive else 'non-negative'} "
                       f"number, got {v}")
    return v


def _to_bool(key, v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "yes", "1", "false", "no", "0"):
        return v.lower() in ("true", "yes", "1")
    raise UsageError(f"{key}: expected true or false, got {v!r}")


def _opt_str(key, v):
    if v is None or (isinstance(v, str) and v.lower() in ("", "none", "null")):
        return None
    if not isinstance(v, (str, os.PathLike)):
        raise UsageError(f"{key}: expected a string, got {v!r}")
    return str(v)


def _folder(key, v):
    """A folder that must be named (the run folder): not empty, not none."""
    path = _opt_str(key, v)
    if path is None:
        raise UsageError(f"{key}: expected a folder name, got {v!r}")
    return path


def _model_name(key, v):
    if v is None or (isinstance(v, str) and v.lower() in ("auto", "none", "null")):
        return None  # chosen from the data
    if not isinstance(v, str) or not v:
        raise UsageError(f"{key}: expected a model name, got {v!r}")
    return v


def _model_config(key, v):
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise UsageError(f"{key}: expected a mapping of hyperparameters, got {v!r}")
    return {str(a).replace("-", "_"): b for a, b in v.items()}


def _grad_clip(key, v):
    return None if v is None or v == "none" else _to_float(key, v, positive=True)


def _val_fraction(key, v):
    v = None if v is None else _to_float(key, v, nonneg=True)
    if v is not None and v >= 1:
        raise UsageError(f"{key}: must be in [0, 1), got {v}")
    return v


def _field_spec(key, spec: str) -> str:
    """``spec`` in its one spelling (``"u + v"`` -> ``"u+v"``), or a UsageError."""
    from meshops.datasets.fields import field_spec

    try:
        return field_spec(spec)
    except ValueError as e:
        raise UsageError(f"{key}: {e}") from None


def _field_specs(key, v) -> list[str]:
    return [_field_spec(key, s) for s in field_names(v, key)]


def _field_weight(key, w) -> float:
    """A positive weight that float32, the default training dtype, holds as a positive
    finite number (1e300 is finite in float64 only, 1e-300 there only not 0)."""
    import numpy as np

    w = _to_float(key, w, positive=True)
    f32 = np.finfo(np.float32)
    lo, hi = float(f32.tiny), float(f32.max)  # compared as float64, not cast to float32
    if not lo <= w <= hi:
        raise UsageError(f"{key}: the weight {w:g} is not a normal float32 number (from "
                         f"{lo:.3g} to {hi:.3g}): the errors are weighted in the training "
                         f"dtype, float32 by default; scale the weights (only their ratios "
                         f"matter)")
    return w


def _field_weights(key, v):
    """``{field: weight}`` from a mapping or ``"u+v=1,p=0.5"``."""
    if v is None:
        return {}
    if isinstance(v, str):
        pairs = [t.strip() for t in v.split(",") if t.strip()]
        v = {}
        for pair in pairs:
            name, sep, w = pair.partition("=")
            if not sep or not name.strip():
                raise UsageError(f"{key}: expected FIELD=WEIGHT pairs (u+v=1,p=0.5), got {pair!r}")
            if name.strip() in v:
                raise UsageError(f"{key}: field {name.strip()!r} given twice")
            v[name.strip()] = w
    if not isinstance(v, dict):
        raise UsageError(f"{key}: expected a mapping of field weights, got {v!r}")
    out = {}
    for f, w in v.items():
        spec = _field_spec(key, str(f))
        if spec in out:
            raise UsageError(f"{key}: field {spec!r} given twice")
        out[spec] = _field_weight(f"{key}: {spec}", w)
    return out


def _scheduler(key, v):
    v = None if v is None or str(v).lower() in ("none", "constant") else str(v)
    if v not in (None, "auto", "cosine", "onecycle"):
        raise UsageError(f"{key}: must be auto, cosine, onecycle or none, got {v!r}")
    return v


def _dtype(key, v):
    if v not in ("float32", "float64"):
        raise UsageError(f"{key}: must be float32 or float64, got {v!r}")
    return v


def _one_of(*choices: str):
    """A coercer that takes one of ``choices``."""
    def coerce(key, v):
        if v not in choices:
            raise UsageError(f"{key}: must be {' or '.join(choices)}, got {v!r}")
        return v
    return coerce


def _extras():
    from meshops.fitting import trainer_options

    return trainer_options


def _unset_or(coerce):
    """``None`` (``null`` in a file: choose from the data) or a value for ``coerce``."""
    return lambda key, v: None if v is None else coerce(key, v)


def _option(default, coerce: Callable[[str, Any], Any]):
    """A TrainConfig field with its coercer."""
    if isinstance(default, (dict, list)):
        return field(default_factory=type(default), metadata={"coerce": coerce})
    return field(default=default, metadata={"coerce": coerce})


# ------------------------------------------------------------------ the config
@dataclass
class TrainConfig:
    """The options of a training run (:func:`meshops.fit`, ``meshops train``), typed
    and checked.

    ``None`` means "not set": ``data``, ``inputs`` and ``targets`` must be given;
    ``model``, ``epochs``, ``batch_size``, ``lr`` are chosen from the data
    (:mod:`meshops.fitting.defaults`). ``val_data`` replaces ``val_fraction``. Build one
    with :meth:`from_options` (a mapping, every value checked) or :meth:`resolve` (a
    request: files, the resumed run, flags or keywords), never with unchecked values;
    :meth:`with_options` changes a few, checked. Each field is a keyword of
    :func:`meshops.fit` and a flag of ``meshops train`` (``batch_size``:
    ``--batch-size``).

    Attributes:
        data: Folder of training meshes (one file per sample), or of time series.
        inputs: Input fields (``[]``: geometry only; ``geo:distance``,
            ``geo:direction``: computed from each mesh).
        targets: Target arrays (point or cell data); given as ``u+v,p`` they set
            ``fields`` too.
        fields: The target fields, each its own relative error in the loss: arrays
            joined by ``+`` (``u+v``); ``None``: every target array its own field.
        field_weights: ``{field: weight}`` in the loss and the validation error
            (default 1 each).
        params: Per-sample parameters (from the files' field data or a
            ``params.csv`` / ``params.json``), conditioning the model.
        tags: Boundary tags whose indicator and outward normal become input channels.
        model: A registered model (``pit``, ``reduced_basis``, ...); ``None``: chosen
            from the data.
        model_config: The model's hyperparameters (``{"width": 64}``); the channels
            and dimension come from the data.
        epochs: Epochs to train; ``None``: as many as fit ``minutes`` (timed).
        minutes: The wall-clock budget (sets the epochs, a reduced basis' ensemble).
        batch_size: Meshes per step (per process under torchrun); ``None``: from the
            data.
        lr: Learning rate; ``None``: from the data.
        weight_decay: AdamW's weight decay.
        scheduler: ``"auto"`` (chosen from the data), ``"cosine"``, ``"onecycle"``
            or ``None`` (a constant rate).
        grad_clip: Clip the gradient norm to this (``None``: off).
        quadrature_loss: Weight the relative L2 loss with the mesh's quadrature
            (``False``: plain per-point norms, as published benchmarks).
        val_fraction: Fraction of the files held out for validation (0: none).
        val_data: Folder of validation meshes, instead of a split of ``data``.
        seed: The seed of the split, the initial weights, the data order, dropout.
        out: The run folder.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``; ``None``: cuda when available.
        dtype: ``"float32"`` or ``"float64"``.
        threads: Torch's CPU threads; ``None``: the faster of 1 and all (timed).
        series: ``data`` holds time series: a next-step model of the targets.
        rollout_train: Time series: steps unrolled per training sample.
        rollout_grad: Time series: back-propagate through the ``"last"`` step or
            ``"all"``.
        rollout_loss: Time series: ``"mse"`` in units of the typical step, or
            ``"relative"`` L2.
        time_input: Time series: the model sees the time ``t``.
        amp: Mixed precision, ``"bf16"`` or ``"fp16"`` (``None``: off).
        compile: Train through :func:`torch.compile`.
        checkpoint_blocks: Recompute the blocks' activations in the backward pass
            (less memory; turned on by itself when a step would not fit).
        logger: Experiment loggers (``["tensorboard"]``, ``["mlflow"]``; ``[]``:
            none; ``None``: TensorBoard when installed).
        ensemble: Train this many models with seeds ``seed ..``; predict gives their
            mean and spread.
        lazy: Read the data lazily through an on-disk cache; ``None``: when it would
            not fit a quarter of the free memory.
        cache: The cache folder (implies ``lazy``).
        workers: DataLoader worker processes; ``None``: 2 when lazy (on more than 2
            cores), else 0.
        shards: Fixed parts of the training files, each step a batch of every part;
            ``None``: one per process of a lazy torchrun run, else none.
    """

    data: str | None = _option(None, _opt_str)
    inputs: list[str] | None = _option(None, lambda k, v: field_names(v, k))
    targets: list[str] | None = _option(None, lambda k, v: field_names(v, k))
    # The target fields, each its own relative error (meshops.datasets.fields): scalar
    # targets joined by "+" (u+v); None: every target array its own field. Set by
    # "--targets u+v,p", which also sets targets to u,v,p.
    fields: list[str] | None = _option(None, _unset_or(_field_specs))
    field_weights: dict = _option({}, _field_weights)
    params: list[str] = _option([], lambda k, v: field_names(v, k))
    tags: list[str] = _option([], lambda k, v: field_names(v, k))
    model: str | None = _option(None, _model_name)
    model_config: dict = _option({}, _model_config)
    epochs: int | None = _option(None, _unset_or(lambda k, v: _to_int(k, v, minimum=1)))
    minutes: float = _option(10.0, lambda k, v: _to_float(k, v, positive=True))
    batch_size: int | None = _option(None, _unset_or(lambda k, v: _to_int(k, v, minimum=1)))
    lr: float | None = _option(None, _unset_or(lambda k, v: _to_float(k, v, positive=True)))
    weight_decay: float = _option(1e-4, lambda k, v: _to_float(k, v, nonneg=True))
    # "auto": chosen from the data (meshops.fitting.defaults); None: a constant rate
    scheduler: str | None = _option("auto", _scheduler)
    grad_clip: float | None = _option(None, _grad_clip)
    quadrature_loss: bool = _option(True, _to_bool)
    val_fraction: float | None = _option(0.2, _val_fraction)
    val_data: str | None = _option(None, _opt_str)
    seed: int = _option(0, _seed)
    out: str = _option("run", _folder)
    device: str | None = _option(None, _opt_str)
    dtype: str = _option("float32", _dtype)
    # torch's threads; None: the faster of 1 and all (meshops.fitting.defaults)
    threads: int | None = _option(None, _unset_or(lambda k, v: _to_int(k, v, minimum=1)))
    # time series (meshops.fitting.series): a next-step model rolled out over K steps
    series: bool = _option(False, _to_bool)
    rollout_train: int = _option(2, lambda k, v: _to_int(k, v, minimum=1))
    rollout_grad: str = _option("last", _one_of("all", "last"))
    rollout_loss: str = _option("mse", _one_of("mse", "relative"))
    time_input: bool = _option(True, _to_bool)
    # speed, memory and logging (meshops.fitting.trainer_options)
    amp: str | None = _option(None, lambda k, v: _extras().coerce_amp(k, v))
    compile: bool = _option(False, _to_bool)
    checkpoint_blocks: bool = _option(False, _to_bool)
    logger: list[str] | None = _option(None, lambda k, v: _extras().coerce_loggers(k, v))
    ensemble: int = _option(1, lambda k, v: _to_int(k, v, minimum=1))
    # Reading (meshops.fitting.data): None = lazily only when the data would not fit.
    lazy: bool | None = _option(None, _unset_or(_to_bool))
    cache: str | None = _option(None, _opt_str)
    workers: int | None = _option(None, _unset_or(lambda k, v: _to_int(k, v, minimum=0)))
    # fixed parts of the training files (meshops.training.distributed.ShardSampler);
    # None: one per process of a torchrun run reading lazily, else none
    shards: int | None = _option(None, _unset_or(lambda k, v: _to_int(k, v, minimum=1)))

    # ------------------------------------------------------------- coercion
    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The option names, in the order they are written."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def coerce(cls, options: Mapping, source: str) -> dict:
        """Check and normalise a partial set of options from ``source`` (a file's
        path or ``"command line"``): ``batch-size`` is ``batch_size``, unknown keys
        and bad values raise :class:`UsageError` naming ``source`` and the key."""
        specs = {f.name: f.metadata["coerce"] for f in dataclasses.fields(cls)}
        out = {}
        for key, v in options.items():
            k = str(key).replace("-", "_")
            if k not in specs:
                close = difflib.get_close_matches(k, list(specs), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise UsageError(f"{source}: unknown key {key!r}{hint}; valid keys: "
                               f"{', '.join(specs)}")
            out[k] = v
        out = {k: specs[k](f"{source}: {k}", v) for k, v in out.items()}
        return _split_field_specs(out, source)

    @classmethod
    def from_options(cls, options: Mapping, source: str = "options") -> "TrainConfig":
        """A config from the defaults and ``options`` (checked as from ``source``)."""
        return cls(**cls.coerce(options, source))

    @classmethod
    def from_file(cls, path) -> dict:
        """The options of a config file (YAML, or TOML by the ``.toml`` suffix): a flat
        mapping of the ``meshops train`` options, with ``model_config`` a nested
        mapping. Unknown keys are an error."""
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"{path}: no such config file")
        text = path.read_bytes()
        try:
            if path.suffix.lower() == ".toml":
                import tomllib

                cfg = tomllib.loads(text.decode("utf-8"))
            else:
                import yaml

                cfg = yaml.safe_load(text.decode("utf-8"))
        except Exception as e:  # yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError
            raise UsageError(f"{path}: cannot parse config ({type(e).__name__}: {e})") from None
        if cfg is None:
            cfg = {}
        if not isinstance(cfg, dict):
            raise UsageError(f"{path}: a config file must be a mapping of options, got "
                           f"{type(cfg).__name__}")
        return cls.coerce(cfg, str(path))

    @classmethod
    def from_request(cls, options: Mapping, source: str = "options") -> dict:
        """The options a request sets (:class:`meshops.fitting.train.TrainRequest`: the
        flags given, or :func:`meshops.fit`'s keywords); ``model_config`` is a mapping,
        a list of ``key=value`` as on the command line, or one string of them."""
        cfg = {k: v for k, v in options.items() if k != "model_config"}
        mc = options.get("model_config")
        mc = {} if mc is None else _model_config_given(mc, source)
        if mc:  # none given, or an empty one: not an option given
            cfg["model_config"] = mc
        return cls.coerce(cfg, source)

    @classmethod
    def from_config(cls, config, source: str = "options") -> tuple[str, dict]:
        """``(label, options)`` of a request's ``config``: a YAML or TOML file (its path
        the label), a mapping of options or a :class:`TrainConfig` (its fields left
        unset do not count: :meth:`given`), checked as from ``"<source> config"``."""
        if config is None:
            return "", {}
        if isinstance(config, (str, os.PathLike)):
            return str(config), cls.from_file(config)
        label = f"{source} config"
        if isinstance(config, TrainConfig):
            config = config.given()
        if not isinstance(config, Mapping):
            raise UsageError(f"{label}: expected a TrainConfig, a mapping of options or a "
                             f"YAML or TOML file, got {type(config).__name__}")
        return label, cls.from_request(config, label)

    def given(self) -> dict:
        """The options this config sets: every field but those left unset (``None``
        where the default is ``None`` too), and ``val_fraction`` not beside a
        ``val_data``, which replaces it."""
        unset = {k for k, v in TRAIN_DEFAULTS.items() if v is None}
        out = {k: v for k, v in self.to_dict().items() if not (v is None and k in unset)}
        if self.val_data:
            out.pop("val_fraction", None)
        return out

    @classmethod
    def resolve(cls, request) -> "TrainConfig":
        """Defaults, then ``RUN/config.yaml`` (with ``--resume``), then ``--config
        FILE`` (or :func:`meshops.fit`'s ``config``), then the flags (or keywords);
        ``model_config`` mappings are merged, and the highest level that says how to
        validate (``val_data`` or ``val_fraction``) decides.
        ``request`` is a :class:`meshops.fitting.train.TrainRequest`."""
        flags = cls.from_request(request.options, request.source)
        label, from_file = cls.from_config(request.config, request.source)
        if from_file.get("val_data") and from_file.get("val_fraction") is not None:
            raise UsageError(f"{label}: give val_fraction or val_data, not both")
        cfg = cls()
        out = flags.get("out", from_file.get("out", cfg.out))
        levels = [from_file, flags]
        if request.resume and (Path(out) / RUN_CONFIG).is_file():
            levels.insert(0, cls.from_file(Path(out) / RUN_CONFIG))
        val = {"val_fraction": cfg.val_fraction, "val_data": None}
        for level in levels:
            for k, v in level.items():
                setattr(cfg, k, {**cfg.model_config, **v} if k == "model_config" else v)
            if level.get("val_data"):
                val = {"val_fraction": None, "val_data": level["val_data"]}
            elif level.get("val_fraction") is not None:
                val = {"val_fraction": level["val_fraction"], "val_data": None}
        cfg.val_fraction, cfg.val_data = val["val_fraction"], val["val_data"]
        cfg.check_complete(request.source)
        return cfg

    def check_complete(self, source: str = "command line") -> None:
        """The options that have no default are set, and no field is both an input
        and a target (messages in the words of ``source``'s caller: :func:`option_name`)."""
        fit = source == FIT
        who = FIT if fit else "train"
        missing = [k for k in ("data", "inputs", "targets") if getattr(self, k) is None]
        if missing:
            hint = ({"data": 'data="DIR"', "inputs": 'inputs=["a", "b"] (or inputs=[] for '
                     "geometry-only problems)", "targets": 'targets=["u"]'} if fit else
                    {"data": "--data DIR", "inputs": '--inputs a,b (or --inputs "" for '
                     "geometry-only problems)", "targets": "--targets u"})
            raise UsageError(f"{who}: missing " + "; ".join(hint[k] for k in missing)
                             + (" (as keywords or in config=FILE)" if fit else
                                " (on the command line or in --config)"))
        if not self.targets:
            raise UsageError(f"{who}: {option_name('targets', source)} needs at least one "
                             f"field name")
        both = sorted(set(self.inputs) & set(self.targets))
        if both:
            raise UsageError(f"{who}: field(s) {both} are both inputs and targets")
        self._check_fields()
        self._check_series_only(source)

    def _check_series_only(self, source: str) -> None:
        """The options of time series are left at their defaults without ``series``."""
        if self.series:
            return
        given = [option_name(k, source, None if k != "time_input" else "False")
                 for k, v in (("rollout_train", self.rollout_train != 2),
                              ("rollout_grad", self.rollout_grad != "last"),
                              ("rollout_loss", self.rollout_loss != "mse"),
                              ("time_input", not self.time_input)) if v]
        if source != FIT:
            given = ["--no-time-input" if g == "--time-input False" else g for g in given]
        if given:
            raise UsageError(f"{FIT if source == FIT else 'train'}: {', '.join(given)} apply "
                             f"to time series: add {option_name('series', source)}")

    def _check_fields(self) -> None:
        """``fields`` join the targets, each once and in their order; ``field_weights``
        name fields."""
        from meshops.datasets.fields import target_names

        specs = self.fields if self.fields is not None else self.targets
        if self.fields is not None:
            try:
                flat = target_names(self.fields)
            except ValueError as e:
                raise UsageError(f"train: fields: {e}") from None
            if flat != list(self.targets):
                raise UsageError(f"train: fields {','.join(self.fields)} must join the targets "
                               f"{','.join(self.targets)}, each once and in their order")
        unknown = sorted(set(self.field_weights) - set(specs))
        if unknown:
            raise UsageError(f"train: field_weights: {unknown} are not target fields (the "
                           f"fields are {','.join(specs)})")

    @property
    def schedule(self) -> str | None:
        """The learning-rate schedule: ``scheduler``, with ``"auto"`` (nothing chosen from
        the data, e.g. a time series) the cosine decay."""
        return "cosine" if self.scheduler == "auto" else self.scheduler

    @property
    def field_specs(self) -> list[str]:
        """The target fields: ``fields``, or every target its own."""
        return list(self.fields if self.fields is not None else self.targets)

    # ------------------------------------------------------ changes, rendering
    def with_options(self, source: str = "defaults", **options: Any) -> "TrainConfig":
        """A copy with ``options`` set, each checked like any other (from ``source``)."""
        return dataclasses.replace(self, **self.coerce(options, source))

    def to_dict(self) -> dict:
        """Every option, in order (``model_config`` a copy)."""
        return {k: (dict(v) if isinstance(v, dict) else v)
                for k, v in ((k, getattr(self, k)) for k in self.keys())}

    def render(self, model_config: Mapping | None = None) -> str:
        """The config as YAML, as written to ``RUN/config.yaml`` and printed by
        ``--dry-run``: every option, with ``model_config`` replaced by the model's
        full hyperparameters when given. It reads back as ``--config``."""
        import yaml

        cfg = self.to_dict()
        if model_config is not None:
            cfg["model_config"] = dict(model_config)
        return yaml.safe_dump(_plain(cfg), sort_keys=False, default_flow_style=False)


def _plain(v):
    """YAML-safe plain data (tuples as lists, paths and other objects as strings)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _parse_value(text: str):
    """A ``key=value`` value: int, float, bool, null or string (YAML scalars)."""
    import yaml

    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    try:
        v = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return v if isinstance(v, (str, bool, int, float, list)) or v is None else text


def _model_config_given(mc, source: str) -> dict:
    """A request's ``model_config``: a mapping, the words of ``--model-config`` (``key=value``
    each), or one string of them as the shell would split it (``"width=64 layers=2"``)."""
    import shlex

    if isinstance(mc, Mapping):
        return dict(mc)
    if isinstance(mc, str):
        try:
            mc = shlex.split(mc)
        except ValueError as e:
            raise UsageError(f"{source}: model_config: {e} in {mc!r}") from None
    if isinstance(mc, (list, tuple)) and all(isinstance(p, str) for p in mc):
        return _model_config_from_pairs(mc, source)
    raise UsageError(f"{source}: model_config: expected a mapping ({{'width': 64}}) or "
                     f"key=value words ('width=64 layers=2'), got {type(mc).__name__} {mc!r}")


def _model_config_from_pairs(pairs: Sequence[str], source: str = "command line") -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            label = "fit(): model_config" if source == FIT else "--model-config"
            raise UsageError(f"{label}: expected key=value, got {pair!r}")
        out[key] = _parse_value(value.strip())
    return out


def _split_field_specs(options: dict, source: str) -> dict:
    """``targets`` given as field specs (``u+v, p``) become the target arrays
    (``u, v, p``) and the ``fields`` (``u+v, p``). Targets without ``+`` (and no
    ``fields`` beside them) set ``fields`` to ``None``: every target its own field,
    whatever grouping a lower level (a ``--config`` file, the resumed run) had."""
    from meshops.datasets.fields import target_names

    targets = options.get("targets")
    if not targets:
        return options
    if not any("+" in t for t in targets):
        return options if "fields" in options else {**options, "fields": None}
    if options.get("fields") is not None:
        raise UsageError(f"{source}: targets {','.join(targets)} join fields with '+' and "
                       f"fields is given too: give one of them")
    try:
        flat = target_names(targets)
    except ValueError as e:
        raise UsageError(f"{source}: targets: {e}") from None
    return {**options, "targets": flat,
            "fields": [_field_spec(f"{source}: targets", t) for t in targets]}


# The defaults as a plain mapping, and the functional entry points.
TRAIN_DEFAULTS: dict[str, Any] = TrainConfig().to_dict()
load_config_file = TrainConfig.from_file
resolve_train_config = TrainConfig.resolve


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
