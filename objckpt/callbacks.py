"""Keras callbacks over objckpt, for `model.fit` in every Keras flavour.

Each callback is a real `Callback` of the Keras that its model belongs to
(Keras 3, tf_keras or Keras 2): the right base class is picked when the
callback is created, so `model.fit(callbacks=[...])` accepts it everywhere.
"""

from __future__ import annotations

from objckpt import errors
from objckpt._base import api as _api
from objckpt._base import options as _options
from objckpt._training import callbackbase as _callbackbase
from objckpt._training import retention as _retention
from objckpt._training.averaging import EMA, SWA

__all__ = ["EMA", "SWA", "BestSnapshot", "Checkpointing", "FreezeSchedule", "TwinSync"]

_BASES: dict = {}
_DEFAULT = _retention.DEFAULT  # a retention keyword not passed


def _with_keras_base(cls, model):
    """Returns a subclass of `cls` that also subclasses model's Keras Callback."""
    from objckpt import _compat

    base = _compat.keras_callback_base(model)
    if base is None:
        raise errors.InvalidArgumentError(
            f"{cls.__name__} drives model.fit, so it needs a Keras model (Keras 3, tf_keras or "
            f"Keras 2). Received: a {type(model).__name__}. In a custom loop call the objckpt "
            "API directly instead. Fix: pass a Keras model to fit, or in a custom loop call "
            "e.g. twins.sync() after each step.")
    key = (cls, base)
    if key not in _BASES:
        _BASES[key] = type(cls.__name__, (cls, base), {"__module__": cls.__module__})
    return _BASES[key]


class TwinSync:
    """Syncs `twins.past` from `twins.current` during `model.fit`.

    Args:
      twins: an `objckpt.Twins` whose `current` is the model being fit.
      every: keyword-only, as every option: sync after every `every`-th batch (or epoch).
      tau: 1.0 for a hard copy, < 1 for a Polyak update (see `Twins.sync`).
      on: "batch" or "epoch".

    Example:
      >>> twins = objckpt.Twins(model)
      >>> model.fit(x, y, callbacks=[objckpt.callbacks.TwinSync(twins, every=10, tau=0.01)])
    """

    @_api.keyword_options(("every", "tau", "on"), name="objckpt.callbacks.TwinSync",
                          warn=False)
    def __new__(cls, twins, *, every: int = 1, tau: float = 1.0, on: str = "batch"):
        if not hasattr(twins, "sync") or not hasattr(twins, "current"):
            raise errors.InvalidArgumentError(
                "TwinSync needs an objckpt.Twins. Received: twins of type "
                f"{type(twins).__name__}. Fix: TwinSync(objckpt.Twins(model)).")
        return super().__new__(_with_keras_base(cls, twins.current))

    @_api.keyword_options(("every", "tau", "on"), name="objckpt.callbacks.TwinSync")
    def __init__(self, twins, *, every: int = 1, tau: float = 1.0, on: str = "batch"):
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise errors.InvalidArgumentError(
                f"every must be a positive int (sync after every N batches or epochs). "
                f"Received: every={every!r}. Fix: pass e.g. every=1.")
        if on not in ("batch", "epoch"):
            raise errors.InvalidArgumentError(
                f'on must be "batch" or "epoch". Received: on={on!r}. Fix: pass on="batch" or '
                'on="epoch".')
        from objckpt._ops.twins import check_tau

        check_tau(tau)
        self.twins, self.every, self.tau, self.on = twins, every, tau, on
        self.syncs = 0
        self._count = 0

    def _tick(self) -> None:
        self._count += 1
        if self._count % self.every == 0:
            self.twins.sync(self.tau)
            self.syncs += 1

    def on_train_batch_end(self, batch, logs=None):
        if self.on == "batch":
            self._tick()

    def on_epoch_end(self, epoch, logs=None):
        if self.on == "epoch":
            self._tick()


# The Callback interface of every Keras flavour (one definition, shared with the averaging
# callbacks of `_training.averaging`).
_FlavourFreeCallback = _callbackbase.FlavourFreeCallback


class FreezeSchedule(_FlavourFreeCallback):
    """Freezes and unfreezes variables at epoch boundaries during `model.fit`.

    No `compile()` again and no retrace: the model's optimizer goes through an
    `objckpt.Freezer` for the duration of `fit`, so frozen variables and their
    optimizer state (momentum, Adam moments) stay bit-identical while the
    traced train step keeps running. (The train function is traced once per
    `fit`, at its first batch; a `Freezer` of your own, `freeze`d between
    `fit` calls, holds under `fit` just as well.)

    Args:
      schedule: {epoch: patterns}: from that epoch on (until the next entry),
        exactly the variables whose object path matches one of the patterns
        (regular expressions; a string or a list) are frozen; None or [] for
        none. Layers and variables of the model may stand among the patterns,
        as `Freezer.freeze` takes them. Before the first entry nothing is frozen.

    Attributes:
      freezer: the `objckpt.Freezer` in use (after training began).
      history: [(epoch, frozen object paths)] for every epoch trained.

    Example:
      >>> model.fit(x, y, epochs=6, callbacks=[objckpt.callbacks.FreezeSchedule(
      ...     {0: "^encoder/", 3: None})])   # encoder frozen for epochs 0-2
    """

    def __init__(self, schedule):
        super().__init__()
        if not isinstance(schedule, dict) or not schedule:
            raise errors.InvalidArgumentError(
                "FreezeSchedule takes a non-empty dict {epoch: patterns}, e.g. "
                f"{{0: '^encoder/', 3: None}}. Received: {schedule!r}. Fix: pass such a dict.")
        cleaned = {}
        for epoch, patterns in schedule.items():
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise errors.InvalidArgumentError(
                    f"FreezeSchedule epochs must be ints >= 0 (0 is the first epoch). "
                    f"Received: {epoch!r}. Fix: key the schedule by epoch numbers.")
            if patterns is None:
                patterns = ()
            elif isinstance(patterns, str) or not isinstance(patterns, (list, tuple)):
                patterns = (patterns,)  # a pattern, a layer or a variable
            else:
                patterns = tuple(patterns)
            if any(p is None or isinstance(p, (bytes, int, float, dict)) for p in patterns):
                raise errors.InvalidArgumentError(
                    f"FreezeSchedule[{epoch}] must be a regex string, a layer or variable of "
                    f"the model, a list of them, or None. Received: {schedule[epoch]!r}. Fix: pass "
                    "e.g. '^encoder/' or [model.layers[0]].")
            cleaned[epoch] = patterns
        self.schedule = dict(sorted(cleaned.items()))
        self.freezer = None
        self.history: list[tuple[int, tuple[str, ...]]] = []
        self._optimizer = None

    def _patterns_at(self, epoch: int) -> tuple[str, ...]:
        current = ()
        for start, patterns in self.schedule.items():
            if start <= epoch:
                current = patterns
        return current

    def on_train_begin(self, logs=None):
        from objckpt._ops.freeze import Freezer

        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None or not callable(getattr(optimizer, "apply_gradients", None)):
            raise errors.InvalidArgumentError(
                "FreezeSchedule needs a compiled model with an optimizer. Received: "
                f"{type(model).__name__} with optimizer={optimizer!r}. Fix: model.compile("
                "optimizer=..., loss=...) before fit.")
        if self.freezer is None or self.freezer.model is not model:
            self.freezer = Freezer(model)
        for epoch, patterns in self.schedule.items():  # every pattern checked before training
            try:
                if patterns:
                    self.freezer.matching(*patterns)
            except errors.InvalidArgumentError as err:
                raise errors.InvalidArgumentError(f"FreezeSchedule[{epoch}]: {err}") from err
        # Routes the optimizer through the Freezer; the train function fit just made (or
        # an earlier fit traced) is made afresh, traced once on the first batch.
        self.freezer.attach()
        self._optimizer = optimizer

    def on_epoch_begin(self, epoch, logs=None):
        self.freezer.set_frozen(self._patterns_at(epoch))
        self.history.append((epoch, self.freezer.frozen))

    def on_train_end(self, logs=None):
        self.freezer.set_frozen(None)
        if self._optimizer is not None:
            self.freezer.detach()
            self._optimizer = None


class Checkpointing(_FlavourFreeCallback):
    """Saves crash-safe, object-based checkpoints during `model.fit` and resumes from them.

    Each checkpoint is a standard TF object-based checkpoint of
    `tf.train.Checkpoint(model=model, epoch=, step=, batch=, monitor_value=)`
    (the model's variables include its optimizer's), listed in TF's
    `checkpoint` state file: `tf.train.latest_checkpoint(directory)` and
    `objckpt.restore(model, directory, at="model")` both find the newest.
    The state that callbacks of the same fit keep beside the model (the averages of
    `SWA` and `EMA`) is saved and resumed with it, under their names (`swa/...`).

    On `on_train_begin` the newest intact checkpoint is restored (weights,
    optimizer state, epoch and batch), and fit goes on from there: a run
    killed and restarted ends bit-identical to one never interrupted (with a
    deterministic model, fixed seeds and `shuffle=False`). `epochs` counts
    all epochs: a finished run restarted does no more training.

    A SIGKILL at any moment leaves the newest fully written checkpoint
    restorable (see `objckpt._training.checkpointing` for the commit protocol); an
    unreadable state file or a missing newest checkpoint falls back to the
    newest intact one, with a warning. An intact checkpoint is deleted only
    when superseded by a newer one; a directory holding intact checkpoints
    of other names and none of ours raises `errors.CheckpointDirectoryError`
    rather than start fresh. On SIGTERM during fit one more checkpoint is
    written, then the signal takes its course.

    Args:
      directory: a directory of checkpoints (created if missing): a local path, or a
        `gs://` or `s3://` URL (docs/storage.md); one writer at a time (others get
        `DirectoryLockedError`).
      retention: an `objckpt.RetentionPolicy`: which checkpoints stay and which saves are
        skipped, given once. The keywords below, up to `min_interval_seconds` (and
        `mode`), are shortcuts that build one; passing both is an `InvalidArgumentError`.
        Neither: `RetentionPolicy()` (the newest 5).
      max_to_keep: keep the newest this many checkpoints (>= 1; None: keep all).
      keep_best: also keep this many best checkpoints by `monitor`; the best
        set is read back from the checkpoints on restart.
      keep_every_n_steps: also keep forever every checkpoint whose global training
        step (batches since the start) is a multiple of this (Orbax's keep_period);
        None: off.
      keep_every_n_hours: TF CheckpointManager's `keep_checkpoint_every_n_hours`: a
        checkpoint leaving the newest `max_to_keep` is kept forever when it was saved at
        least this many hours after the last one so kept (TF's `last_preserved_timestamp`
        in the `checkpoint` state file, so it survives restarts); None: off.
      keep: a callable `(Kept) -> bool` (`Kept`: `.number`, `.prefix`, `.step`, `.metric`,
        `.timestamp`); True keeps that checkpoint forever. It is asked about each
        checkpoint no other rule keeps, so it must answer from the `Kept` alone; if it
        raises, the save raises `InvalidArgumentError` naming the checkpoint, with nothing
        written or deleted.
      checkpoint_interval: skip a save less than this many steps after the last one
        saved (TF's name; the step counter decides, also after a restart); None: off.
      min_interval_seconds: skip a save less than this many seconds after the last one
        saved (its timestamp, also after a restart); None: off.
        A checkpoint stays when any of these rules keeps it (docs/retention.md). The
        one more save on SIGTERM is never skipped.
      monitor: the logs key saved with each checkpoint and ranked for
        `keep_best` (e.g. "val_loss"; "loss" for batch-level saves).
      mode: "min" or "max": which value of `monitor` is better.
      save_freq: "epoch", or an int: save every that many batches.
      async_save: write in a background thread; the training step that
        triggers a save blocks only for the in-memory copy.
      on_error: "raise" a `CheckpointWriteError` when a save fails (disk
        full, I/O error, a read-only directory), or "warn" and keep training
        (in a read-only directory: resume, and train without saving).
        Earlier checkpoints are untouched either way.
      durable: True: fsync each checkpoint's files and the directory before it
        is committed (it survives a power cut); False: do not; None (default):
        the library default (see `objckpt.save`).
      verbose: 1 (the default) prints one line to stdout when fit resumes
        (`Checkpointing: resumed from /tmp/run/ckpt-7 (epoch 3 of 10 done,
        step 120); training continues with epoch 4.`), or when the directory
        holds a finished run (`Checkpointing: training already finished:
        ...`, with how to train further); 0 prints nothing. A fresh start
        prints nothing either way.

    Under `tf.distribute` (MirroredStrategy, MultiWorkerMirroredStrategy) each
    variable is saved once, as `tf.train.Checkpoint` saves it: a mirrored one
    by its value, a SyncOnRead one (BatchNorm statistics in tf_keras and Keras 2,
    metrics) by its value reduced across all replicas; resuming sets every
    replica to the saved value. With several workers every worker runs the
    callback: the chief (task 0) alone locks the directory, writes and commits;
    the others take part in reading the values (a collective) and write nothing,
    so no `workertemp_<task>` directory is left behind. The directory must be
    one every worker sees (a shared file system, as for TF's BackupAndRestore):
    on resume all workers restore the checkpoint the chief chose, or all raise.
    A SIGTERM there is not turned into one more save (the others would wait for
    it forever); a restart of all workers resumes from the newest checkpoint.

    Under ParameterServerStrategy (tf_keras, Keras 2) fit runs its steps on the
    workers asynchronously and calls no batch-level callback: Checkpointing saves at
    the end of each epoch, when every step of it has run (sharded variables and their
    optimizer slots whole, as `tf.train.Checkpoint` saves them), and resumes at the
    start of the next epoch. It needs fit's `steps_per_epoch` there; `save_freq` in
    batches, and resuming from a checkpoint saved within an epoch, are
    `InvalidArgumentError`s, raised before anything is opened or restored. SIGTERM
    keeps its usual effect. Each worker's dataset starts afresh on resume, so a resumed
    run equals the uninterrupted one when every epoch reads the same data (one pass
    each) and the run itself is reproducible (one worker, or steps that do not race).

    Attributes:
      resumed_from: the prefix restored at the start of the last fit, or None.
      saved: prefixes saved during the last fit, in order (with async_save:
        submitted; one still waiting when a newer save comes is superseded and
        never written, see `manager.superseded`).
      manager: the `CheckpointDirectory` (its `kept` and `best()` list the
        checkpoints kept; `skipped` counts the saves skipped as too soon).
      retention: the `RetentionPolicy` (built from the keywords when they were given).
      max_to_keep, keep_best, mode, rules: the policy's fields, read-only (`rules`: those
        beyond max_to_keep, keep_best and mode, by keyword).

    Example:
      >>> ckpt = objckpt.callbacks.Checkpointing("/tmp/run", keep_best=2)
      >>> model.fit(x, y, epochs=10, validation_data=(vx, vy), callbacks=[ckpt])
      >>> policy = objckpt.RetentionPolicy(max_to_keep=3, keep_every_n_steps=1000)
      >>> ckpt = objckpt.callbacks.Checkpointing("/tmp/run", retention=policy)
    """

    def __init__(self, directory, *, retention: _retention.RetentionPolicy | None = None,
                 max_to_keep: int | None = _DEFAULT, keep_best: int = _DEFAULT,
                 monitor: str = "val_loss", mode: str = _DEFAULT, save_freq="epoch",
                 keep_every_n_steps: int | None = _DEFAULT,
                 keep_every_n_hours: float | None = _DEFAULT, keep=_DEFAULT,
                 checkpoint_interval: int | None = _DEFAULT,
                 min_interval_seconds: float | None = _DEFAULT, async_save: bool = False,
                 on_error: str = "raise", verbose: int = 1, durable: bool | None = None):
        super().__init__()
        self.directory = _options.directory_path("Checkpointing", directory)
        self.retention = _retention.RetentionPolicy.of("Checkpointing", retention, dict(
            max_to_keep=max_to_keep, keep_best=keep_best, mode=mode,
            keep_every_n_steps=keep_every_n_steps, keep_every_n_hours=keep_every_n_hours,
            keep=keep, checkpoint_interval=checkpoint_interval,
            min_interval_seconds=min_interval_seconds))
        _options.writer_options(monitor=monitor, async_save=async_save, on_error=on_error,
                                verbose=verbose, durable=durable)
        self.durable = durable
        if save_freq != "epoch":
            _options.check_count("save_freq", save_freq, 1, '"epoch" or save every N batches')
        self.monitor = monitor
        self.save_freq, self.async_save, self.on_error = save_freq, async_save, on_error
        self.verbose = int(verbose)
        self.manager = None
        self.resumed_from = None
        self.saved: list[str] = []
        self._fit = None  # an objckpt._training.fitckpt.FitCheckpointer, from the first fit on

    @property
    def max_to_keep(self) -> int | None:
        return self.retention.max_to_keep

    @property
    def keep_best(self) -> int:
        return self.retention.keep_best

    @property
    def mode(self) -> str:
        return self.retention.mode

    @property
    def rules(self) -> dict:
        return {name: getattr(self.retention, name) for name in _retention.KEYWORDS[3:]}

    def _implements_train_batch_hooks(self):
        # None under ParameterServerStrategy, where tf_keras refuses batch-level callbacks:
        # Checkpointing saves at the end of each epoch there.
        from objckpt._training import fitckpt as _fitckpt

        return not _fitckpt.coordinated(self.model)

    def on_train_begin(self, logs=None):
        from objckpt._training import fitckpt as _fitckpt

        if self._fit is None:
            self._fit = _fitckpt.FitCheckpointer(self)
        try:
            self._fit.begin(self.model)  # resumes from the directory's newest checkpoint
        except errors.ObjckptError as err:
            errors.about(err, source=self.directory, obj=self.model)
            raise

    def on_epoch_begin(self, epoch, logs=None):
        self._fit.epoch_begin(epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._fit.batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._fit.epoch_end(epoch, logs)

    def on_train_end(self, logs=None):
        self._fit.end(self.model)


class BestSnapshot(_FlavourFreeCallback):
    """Keeps the best weights seen during `model.fit` in memory, and restores them at the end.

    The best state is an `objckpt.Snapshot` of the model (its optimizer's
    state included): no NumPy round trip, no bytes copied when taken.

    Args:
      monitor: the logs key to rank epochs by.
      mode: keyword-only, as every option: "min" or "max".
      restore_at_end: restore the best snapshot into the model on train end.
      verbose: 1 (the default) prints one line to stdout when the weights are rolled
        back at the end of fit (`BestSnapshot: restored the weights of epoch 3
        (val_loss 0.123), the best of 10 epochs.`; epochs counted from 1, as fit's
        progress bar counts them), or that the last epoch was the best and nothing
        changed; 0 prints nothing.

    Attributes:
      best: the best value of `monitor` seen, or None.
      best_epoch: the epoch (0-based, as Keras passes it to callbacks) it was seen at,
        or None.
      snapshot: the `Snapshot` taken at that epoch, or None.
      epochs: how many epochs the last fit ran.
      restored: whether the last fit ended with the weights rolled back to the best epoch.

    Under `tf.distribute` the snapshot holds what a checkpoint would: one value per
    variable (a SyncOnRead variable's reduced across replicas), and restoring it sets
    every replica. With several workers (MultiWorkerMirroredStrategy) every worker keeps
    its snapshot and the chief's logs decide the best epoch for all.

    Example:
      >>> best = objckpt.callbacks.BestSnapshot("val_loss")
      >>> model.fit(x, y, validation_data=(vx, vy), epochs=20, callbacks=[best])
      >>> best.best_epoch, best.best
    """

    @_api.keyword_options(("mode", "restore_at_end"), name="objckpt.callbacks.BestSnapshot")
    def __init__(self, monitor: str = "val_loss", *, mode: str = "min",
                 restore_at_end: bool = True, verbose: int = 1):
        super().__init__()
        _options.check_choice("mode", mode, ("min", "max"))
        if not isinstance(monitor, str) or not monitor:
            raise errors.InvalidArgumentError(
                f"monitor must be a logs key such as 'val_loss'. Received: monitor={monitor!r}. "
                "Fix: pass the name of a metric that fit logs, e.g. monitor='val_loss'.")
        if verbose not in (0, 1, True, False):
            raise errors.InvalidArgumentError(
                f"verbose must be 0 or 1. Received: verbose={verbose!r}. Fix: pass verbose=0 or "
                "verbose=1.")
        self.monitor, self.mode, self.restore_at_end = monitor, mode, bool(restore_at_end)
        self.verbose = int(verbose)
        self.best = self.best_epoch = self.snapshot = None
        self.epochs = 0
        self.restored = False
        self._last_epoch = None
        self._cluster = None

    def on_train_begin(self, logs=None):
        from objckpt._planning import tree as _tree
        from objckpt._training import checkpointing as _checkpointing

        self.best = self.best_epoch = self.snapshot = None
        self.epochs, self.restored = 0, False
        # Several workers (MultiWorkerMirroredStrategy): the chief's logs decide for all.
        self._cluster = _checkpointing.Cluster.of(_tree.tree(self.model).values())

    def on_epoch_end(self, epoch, logs=None):
        import math

        from objckpt._ops import snapshot as _snapshot

        self.epochs += 1
        self._last_epoch = epoch
        value = (logs or {}).get(self.monitor)
        if value is None:
            import warnings

            warnings.warn(f"BestSnapshot: monitor {self.monitor!r} is not in the logs (keys: "
                          f"{sorted(logs or {})}). Fix: pass validation_data, or monitor a key "
                          "that fit logs.", stacklevel=2)
        value = math.nan if value is None else float(value)
        better = not math.isnan(value) and (
            self.best is None or (value < self.best if self.mode == "min" else value > self.best))
        if self._cluster is not None:  # every worker snapshots at the same epoch (collective)
            taken, value = self._cluster.chief_row([float(better), value])
            better = bool(taken)
        if better:
            self.best, self.best_epoch = value, epoch
            self.snapshot = _snapshot.snapshot(self.model)

    def on_train_end(self, logs=None):
        if self.restore_at_end and self.snapshot is not None:
            from objckpt._ops import restore as _restore

            _restore.restore(self.model, self.snapshot)
            self.restored = True
            if self.verbose and (self._cluster is None or self._cluster.chief):
                print(self.rollback_line(), flush=True)  # several workers: the chief says it

    def rollback_line(self) -> str:
        """The line printed at the end of fit (verbose): to which epoch the weights went."""
        best = f"{self.monitor} {self.best:.4g}"
        if self.best_epoch == self._last_epoch:
            return (f"BestSnapshot: the last epoch ({self.best_epoch + 1}, {best}) was the best of "
                    f"{self.epochs} epoch(s); the weights are those it ended with.")
        return (f"BestSnapshot: restored the weights of epoch {self.best_epoch + 1} ({best}), "
                f"the best of {self.epochs} epochs.")
