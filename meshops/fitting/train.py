"""Training a run: a folder of meshes to a run folder (:func:`meshops.fit`, ``meshops
train``).

:func:`train` takes a :class:`TrainRequest` (the options, a config file, and what may
happen to the run folder), resolves the config, reads the data, chooses the options the
data decides, builds the model and trains it (or fits a reduced basis, or a time-series
model in :mod:`meshops.fitting.series`), holding the run folder's lock, and returns a
:class:`~meshops.fitting.outcome.Training`. Progress is logged (logger
``meshops.fitting.*``, INFO), warnings at WARNING.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from meshops.datasets.fields import TargetFields, format_shape
from meshops.datasets.layout import SampleLayout
from meshops.datasets.lazy import fingerprints, take, with_structures
from meshops.errors import CheckpointError, MeshError, UsageError
from meshops.fitting import trainer_options
from meshops.fitting.config import TrainConfig, option_name, plural
from meshops.fitting.data import NonzeroTargets, data_loader, shards_of
from meshops.fitting.out_folder import (
    check_out_folder,
    check_resume_options,
    clear_run_files,
    recorded_config,
)
from meshops.fitting.outcome import Training
from meshops.fitting.training_run import (
    build_model,
    check_writable_folder,
    epochs_to_fit,
    fit_memory,
    run_training,
    split_files,
)
from meshops.inference.predict import field_channels
from meshops.runs import trust_reports
from meshops.runs.run_folder import (
    changes,
    fingerprint,
    listing,
    param_changes,
    param_fingerprint,
    refuse_changed,
    run_lock,
    same_content,
)
from meshops.training.distributed import device_or_error, is_main_rank

log = logging.getLogger(__name__)


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist: the data set says so when it reads it
        return False


def _check_run_folder(request, cfg: TrainConfig, out: Path) -> dict | None:
    """The checks of ``--out`` and ``--resume`` made before the data is read, so that a
    refused run leaves the folder as it was. Returns the metadata of ``last.pt`` when
    resuming a run, else ``None``."""
    from meshops.training.state import check_resume_epochs, read_training_state

    last = out / "last.pt"
    if not (request.resume and last.is_file()):
        check_out_folder(out, cfg, request.overwrite, request.resume, request.source)
        return None
    try:
        state = read_training_state(last)
        check_resume_epochs(last, state["training"], cfg.epochs, cfg.schedule is not None)
    except (CheckpointError, ValueError) as e:
        raise UsageError(str(e)) from None
    meta = dict(state.get("metadata") or {})
    # runs before the train_config record: their config.yaml
    recorded = meta.get("train_config") or recorded_config(out)
    if recorded:
        check_resume_options(cfg, recorded, request, last)
    return meta


def _check_same_data(meta: dict, cfg: TrainConfig, out: Path) -> None:
    """Refuse to resume a run whose training or validation files (mesh files and
    parameter files) changed."""
    diff = changes(meta["data_files"], cfg.data)
    if meta.get("param_files") is not None:
        diff += param_changes(meta["param_files"], cfg.data)
    if cfg.val_data and meta.get("val_files") is not None:
        diff += changes(meta["val_files"], cfg.val_data)
    if cfg.val_data and meta.get("val_param_files") is not None:
        diff += param_changes(meta["val_param_files"], cfg.val_data)
    refuse_changed(diff, out / "last.pt")


class _RunFiles:
    """What a new run records about its data (paths, file fingerprints, split, config)
    and the preparation of its folder, shared by every model's way of training."""

    def __init__(self, cfg, data: "_TrainData", resumed, out, main_rank) -> None:
        self.cfg, self.files, self.train_idx = cfg, data.files, data.train_idx
        self.val_files, self.shapes, self.sizes = data.val_files, data.shapes, data.sizes
        self.resumed, self.out, self.main_rank = resumed, out, main_rank
        self.layout, self.fields, self.known = data.layout, data.fields, data.known

    def metadata(self, resolved: str, train_samples) -> dict:
        """The checkpoint metadata; ``resolved`` is the rendered config. Refuses to
        resume on changed data and warns of validation files equal to training files."""
        import yaml

        cfg = self.cfg
        data_files = fingerprint(self.files, "fingerprinting data", known=self.known["data"])
        val_record = fingerprint(self.val_files, "fingerprinting val data",
                                 known=self.known["val"]) if cfg.val_data else None
        if self.resumed is not None and self.resumed.get("data_files") is not None:
            _check_same_data(self.resumed, cfg, self.out)
        if val_record and self.main_rank:
            same = same_content([Path(cfg.val_data) / n for n in val_record], data_files)
            if same:
                pairs = [f"{v} = {t}" for v, t in same.items()]
                log.warning(f"{len(same)} of the {len(val_record)} validation files have "
                            f"the same content as training files ({listing(pairs)}): the "
                            f"best checkpoint is partly picked on training data")
        c_in, c_out, dim = self.sizes
        meta = {
            "inputs": self.layout.input_fields, "targets": list(cfg.targets),
            "fields": self.fields.to_dict(),
            "params": list(cfg.params), "tags": list(cfg.tags),
            "location": self.layout.location,
            "field_shapes": self.shapes, "in_channels": c_in, "out_channels": c_out,
            "pos_dim": dim, "data": cfg.data, "val_data": cfg.val_data,
            "split": {"train": [Path(self.files[i]).name for i in self.train_idx],
                      "val": [Path(f).name for f in self.val_files]},
            "data_files": data_files, "val_files": val_record,
            # the parameter files give the samples' values as much as the meshes do
            "param_files": param_fingerprint(cfg.data) if cfg.params else None,
            "val_param_files": param_fingerprint(cfg.val_data)
            if cfg.params and cfg.val_data else None,
            "train_config": yaml.safe_load(resolved),
        }
        # descriptors of the training samples: predict and evaluate measure distances to them
        meta["training_set"] = trust_reports.training_set_metadata(train_samples, meta)
        return meta

    def prepare(self) -> None:
        """Create the run folder (or say why it cannot be written) and, for a new run,
        remove the files of an earlier one."""
        check_writable_folder(self.out)
        if self.main_rank and self.resumed is None:
            clear_run_files(self.out)  # a new run leaves no best.pt of an earlier one behind


@dataclass
class _TrainData:
    """The samples of a run: the files of ``--data``, their field shapes, the training
    and validation samples (and files), the channels and dimension they give, how a file
    becomes a sample (``layout``) and the loader's worker processes (lazy data)."""

    files: list
    shapes: dict
    train_idx: list[int]
    train: list
    val: list | None
    val_files: list
    sizes: tuple[int, int, int]       # in_channels, out_channels, pos_dim
    layout: SampleLayout
    workers: int
    fields: TargetFields
    # fingerprints a lazy run's cache took already, of --data and --val-data ("data",
    # "val": file name -> [size, mtime_ns, sha256])
    known: dict


@dataclass
class TrainRequest:
    """What a training run is asked to do.

    Args:
        options: :class:`~meshops.fitting.config.TrainConfig` keys and values (``data``,
            ``inputs``, ``targets``, ``minutes``, ...); a key left out takes its value
            from ``config``, the resumed run's ``config.yaml`` or the defaults.
            ``model_config`` is a mapping, or ``["key=value", ...]`` as on the command
            line (or one string of them, ``"width=64 layers=2"``).
        config: Options below ``options``: a YAML or TOML file of them, a mapping, or a
            :class:`~meshops.fitting.config.TrainConfig` (its fields left unset do not
            count).
        resume: Continue the run in ``out`` from its ``last.pt``.
        overwrite: Start a new run in a folder that holds another one.
        dry_run: Read the data, resolve the config and write nothing.
        source: Where the options come from, for messages (``"command line"``,
            ``"fit()"``).
    """

    options: dict
    config: "TrainConfig | Mapping | str | os.PathLike | None" = None
    resume: bool = False
    overwrite: bool = False
    dry_run: bool = False
    source: str = "options"

    def with_options(self, **options) -> "TrainRequest":
        """The same request with ``options`` set (an ensemble member's seed and folder)."""
        return dataclasses.replace(self, options={**self.options, **options})


def train(request: TrainRequest) -> Training:
    """The config, the data, the options chosen from the data, the model, then the
    training (or the fit of a reduced basis; time series in :mod:`meshops.fitting.series`),
    holding the run folder's lock (:mod:`meshops.runs.run_folder`). Returns what was done
    (for a dry run, the options chosen); what cannot be done raises
    :class:`~meshops.errors.UsageError` (or ``MeshError``, ``CheckpointError``) before
    the run folder is touched where it can be told then."""
    cfg = _resolve_config(request)
    if request.dry_run or not is_main_rank():  # writes nothing, or only what rank 0 says
        return _train(request, cfg)
    # One run at a time in a folder, from its first look at it to its last write.
    with run_lock(Path(cfg.out), option_name("out", request.source)):
        return _train(request, cfg)


def _train(request, cfg: TrainConfig) -> Training:
    """:func:`train` from the resolved config on."""
    import torch

    from meshops.training.seed import seed_everything

    main_rank = is_main_rank()
    out = Path(cfg.out)
    resumed = None if request.dry_run else _check_run_folder(request, cfg, out)
    # Before anything draws a random number: the model's initial weights (built
    # below) then depend on the seed alone, not on what ran before in the process.
    # The Trainer seeds again (seed + rank) for dropout and the data order.
    seed_everything(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.series:
        from meshops.fitting.series import train_series

        return train_series(cfg, request, getattr(torch, cfg.dtype), resumed)
    data, cfg, chosen = _data_and_options(cfg, main_rank, request.source)
    if cfg.model == "reduced_basis":
        from meshops.fitting.reduced import fit_reduced_run

        return fit_reduced_run(request, cfg, chosen, data.train, data.val,
                               _RunFiles(cfg, data, resumed, out, main_rank))
    training = _train_model(request, cfg, chosen, data, resumed)
    if not request.dry_run:
        trainer_options.train_members(request, training.config, out, train)
    return training


def _train_model(request, cfg: TrainConfig, chosen: str, data: "_TrainData",
                 resumed: dict | None) -> Training:
    """Build the model that ``data`` decides and train it (the end of :func:`_train`;
    ``resumed``: the metadata of the run resumed, or None)."""
    from meshops.training import RelativeLpLoss

    model = _build_model(cfg, data, request.source)
    # Before anything large is built: a step on the largest mesh must fit the memory.
    cfg, fitted = fit_memory(cfg, model, data.train, request.source)
    chosen = "; ".join(c for c in (chosen, fitted) if c)
    # Cached data get the model's mesh structures cached too (the Trainer builds those
    # of in-memory samples).
    data.train = with_structures(data.train, model, data.workers)
    data.val = with_structures(data.val, model, data.workers)
    # The epoch count fitted to --minutes from one timed step is said and saved in
    # config.yaml; the run then trains exactly that many epochs (no wall-clock stop), so
    # that `--epochs N` with the same seed repeats it bit for bit.
    cfg, fitted, thread_check = epochs_to_fit(cfg, model, data.train, len(data.val or []))
    chosen = "; ".join(c for c in (chosen, fitted) if c)
    # Every option, with the model's full hyperparameters: what config.yaml records.
    cfg = dataclasses.replace(cfg, model_config=dict(model.config))
    run = _RunFiles(cfg, data, resumed, Path(cfg.out), is_main_rank())

    def begin() -> dict:
        metadata = run.metadata(cfg.render(), data.train)
        run.prepare()
        return metadata

    return run_training(request, cfg, model, data.train, data.val, chosen,
                        _summary(cfg, model, data), begin, thread_check,
                        loss=RelativeLpLoss(quadrature=cfg.quadrature_loss,
                                            fields=data.fields),
                        compile=cfg.compile, checkpoint_blocks=cfg.checkpoint_blocks,
                        num_workers=data.workers, normalize=_normalize(cfg, data.train),
                        shards=shards_of(cfg, data.train, request.source))


def _normalize(cfg: TrainConfig, samples) -> bool | int:
    """The Trainer's ``normalize``: the input channel the outputs scale by when the
    targets are proportional to a global input (a neural model; the reduced basis and
    series have their own fits)."""
    from meshops.fitting.defaults import output_scale_channel

    channel = output_scale_channel(samples)
    return True if channel is None else channel


def _resolve_config(request) -> TrainConfig:
    """The run's options (defaults, config files, flags), with the data folders made
    absolute, checked before any data is read."""
    cfg = TrainConfig.resolve(request)
    device_or_error(cfg.device, option_name("device", request.source))  # before any data
    trainer_options.check(cfg, lambda key, value: option_name(key, request.source, value))
    # The run records where its data is, not where it was run from: evaluate and
    # --resume from another folder then read this data (see meshops.runs.run_folder).
    cfg = cfg.with_options("command line", data=os.path.abspath(cfg.data),
                           val_data=os.path.abspath(cfg.val_data) if cfg.val_data else None)
    if cfg.val_data and _same_folder(cfg.val_data, cfg.data):
        data = option_name("data", request.source)
        raise UsageError(f"{option_name('val_data', request.source, cfg.val_data)} is the "
                         f"training folder {data}: the best checkpoint would be picked on "
                         f"the training files; give a folder of other meshes, or "
                         f"{option_name('val_fraction', request.source, 'F')} to hold out "
                         f"part of {data}")
    return cfg


def _data_and_options(cfg: TrainConfig, main_rank: bool, source: str
                      ) -> tuple[_TrainData, TrainConfig, str]:
    """The data, and the config with the options chosen from it (and why). A reduced
    basis fits in float64, whatever ``--dtype``: its parameters (a timestamp-like
    1.7e9 + 100 a is quantised in float32) and snapshots are read in float64, again
    when the data chose it (``source``: whose words the errors use)."""
    dtype = "float64" if cfg.model == "reduced_basis" else cfg.dtype
    data = _read_data(cfg, main_rank, source, dtype)
    cfg, chosen = _options_from_data(cfg, data.train)
    if cfg.model == "reduced_basis" and dtype != "float64":
        data = _read_data(cfg, main_rank, source, "float64")
    return data, cfg, chosen


def _read_data(cfg: TrainConfig, main_rank: bool, source: str, dtype: str) -> _TrainData:
    """The training (and validation) samples in ``dtype``: ``--val-data``, or a split of
    ``--data``; in memory, or lazily through an on-disk cache for data larger than
    memory."""
    import torch

    dtype = getattr(torch, dtype)
    try:  # how a file becomes a sample: points or cells, parameters, boundary tags
        layout = SampleLayout(cfg.inputs, cfg.targets, cfg.params, cfg.tags)
    except MeshError as e:
        raise UsageError(str(e)) from None
    load_folder, workers, reading = data_loader(cfg, dtype, layout, source)
    if reading and main_rank:
        log.info(reading)
    check = NonzeroTargets(tuple(cfg.targets), tuple(cfg.field_specs))
    files, samples, shapes, dim = load_folder(cfg.data, cfg.inputs, cfg.targets, dtype,
                                              desc="reading data", check=check)
    if cfg.val_data:
        val_files, val_samples, val_shapes, val_dim = load_folder(
            cfg.val_data, cfg.inputs, cfg.targets, dtype, desc="reading val data",
            check=check)
        for k, sh in shapes.items():
            if val_shapes[k] != sh:
                raise UsageError(f"{val_files[0]}: field {k!r} is {format_shape(val_shapes[k])} "
                               f"but {format_shape(sh)} in {files[0]}")
        if val_dim != dim:
            raise UsageError(f"{val_files[0]}: the mesh is {val_dim}-D but {files[0]} is {dim}-D")
        train_idx, train_samples = list(range(len(files))), samples
    else:
        train_idx, val_idx = split_files(len(files), cfg.val_fraction, cfg.seed, cfg.data,
                                         source)
        train_samples = take(samples, train_idx)
        val_samples = take(samples, val_idx) or None
        val_files = [files[i] for i in val_idx]
    c_in = sum(field_channels(shapes[k]) for k in layout.input_fields)
    c_out = sum(field_channels(shapes[k]) for k in cfg.targets)
    known = {"data": fingerprints(samples),
             "val": fingerprints(val_samples) if cfg.val_data else {}}
    return _TrainData(files, shapes, train_idx, train_samples, val_samples, val_files,
                      (c_in, c_out, dim), layout, workers, target_fields(cfg, shapes),
                      known)


def target_fields(cfg: TrainConfig, shapes: dict) -> TargetFields:
    """The run's target fields (:mod:`meshops.datasets.fields`) from its config and the
    target arrays' shapes."""
    try:
        return TargetFields.from_specs(cfg.field_specs, {k: field_channels(shapes[k])
                                                         for k in cfg.targets},
                                       cfg.field_weights)
    except ValueError as e:
        raise UsageError(f"train: {e}") from None


def _options_from_data(cfg: TrainConfig, samples) -> tuple[TrainConfig, str]:
    """Options nobody set, chosen from the data (a resumed run's config.yaml sets them
    all), and the reason said (``""``: nothing chosen)."""
    from meshops.fitting.defaults import options_from_data

    try:
        options, reason = options_from_data(samples, cfg.model, cfg.model_config,
                                            cfg.batch_size, cfg.lr, cfg.scheduler)
    except ValueError as e:  # e.g. --model reduced_basis on data that is no study
        raise UsageError(str(e)) from None
    return cfg.with_options("defaults", **options), reason


def _build_model(cfg: TrainConfig, data: _TrainData, source: str):
    """The model, on the meta device first (it must fit the device training uses: cuda
    when available, as the Trainer), in the training dtype (``source``: whose words
    the errors use)."""
    import torch

    from meshops.training.distributed import check_device

    dtype = getattr(torch, cfg.dtype)
    model = build_model(cfg.model, cfg.model_config, *data.sizes, len(cfg.params), dtype,
                        check_device(cfg.device), source)
    return model.double() if dtype == torch.float64 else model


def _summary(cfg: TrainConfig, model, data: _TrainData) -> str:
    """One line: the model, its size, the data, the fields and channels."""
    c_in, c_out, dim = data.sizes
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return (f"{cfg.model} ({n_params:,} parameters) on {len(data.train)} meshes of "
            f"{cfg.data}, validating on "
            + (f"{len(data.val)}" if data.val else "none")
            + f"; inputs {', '.join(data.layout.input_fields) or '(none: geometry only)'} "
            f"({plural(c_in, 'channel')}) -> targets {', '.join(cfg.targets)} "
            f"({plural(c_out, 'channel')}), "
            f"{dim}-D"
            + (", on the cells (midpoint rule)" if data.layout.location == "cells" else "")
            + (f"; parameters {', '.join(cfg.params)}" if cfg.params else "")
            + (f"; the loss is the mean relative error of the fields {data.fields.describe()}"
               if len(data.fields) > 1 else ""))
