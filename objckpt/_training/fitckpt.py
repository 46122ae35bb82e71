"""What `callbacks.Checkpointing` does inside `model.fit`: counters, resume, SIGTERM.

The callback is a thin adapter; this module keeps the position of training
(epoch, batch in the epoch, global step), resumes it from the newest intact
checkpoint (starting epoch and skipped batches, through `_compat`), says so
in one line on stdout (or that training is already finished), decides when to
save, and turns a SIGTERM into one more save and a stop (in a single process; with
several workers SIGTERM keeps its usual effect, see `_install_sigterm`).

Under ParameterServerStrategy (`coordinated`) tf_keras runs fit's steps asynchronously on
the workers and calls no batch-level callback: Checkpointing saves at the end of each epoch
(every step of it done), resumes at an epoch's start, and refuses what needs batches
(`check_coordinated`).
"""

from __future__ import annotations

import signal
import threading
import warnings

import tensorflow as tf

from objckpt import _compat, errors
from objckpt._training import checkpointing as _checkpointing
from objckpt._training import companions as _companions


class FitCheckpointer:
    """Drives a `CheckpointDirectory` from the hooks of one `Checkpointing` callback."""

    def __init__(self, callback):
        self.callback = callback
        self.manager = None
        self.epoch = self.step = self.batch = 0
        self._epoch_start_step = 0
        self._skip_until = 0  # batches of the resumed epoch the checkpoint had trained on
        self._skip_calls = 0  # train-function calls to skip, from the resumed epoch's start
        self._sigterm = self._stopped = False
        self._previous_handler = None
        self._warned_monitor = False
        self.coordinated = False  # fit runs under ParameterServerStrategy

    # --- hooks ----------------------------------------------------------------------

    def begin(self, model) -> None:
        cb = self.callback
        self.coordinated = coordinated(model)
        if self.coordinated:
            check_coordinated(cb)  # before the directory is opened: nothing is touched
        if self.manager is not None:
            self.manager.release()  # an earlier fit of ours that raised
        extras = _companions.saved_with(model)  # state callbacks keep beside the model
        if self.manager is None or self.manager.root.model is not model or \
                self.manager.extras.keys() != extras.keys() or \
                any(self.manager.extras[k] is not v for k, v in extras.items()):
            self.manager = _checkpointing.CheckpointDirectory(
                cb.directory, model, retention=cb.retention, async_save=cb.async_save,
                on_error=cb.on_error, durable=getattr(cb, "durable", None), extras=extras,
                fingerprint=lambda: _compat.fingerprint(model))
        cb.manager, cb.saved, cb.resumed_from = self.manager, [], None
        _compat.unskip_fit_batches(model)
        latest = self.manager.open()
        try:
            self.epoch = self.step = self.batch = self._skip_until = self._skip_calls = 0
            if latest is not None:
                self._resume(model, latest)
        except BaseException:
            self.manager.close()
            raise
        self._epoch_start_step = self.step - self._skip_until
        self._install_sigterm()

    def _resume(self, model, latest) -> None:
        if self.coordinated:
            check_epoch_boundary(latest.prefix, self.callback.params["steps"])
        counters = self.manager.restore(latest, "Checkpointing", "at the start of fit")
        self.callback.resumed_from = latest.prefix
        self.epoch, self.step, self.batch = counters["epoch"], counters["step"], counters["batch"]
        if self.coordinated and self.batch:  # saved after an epoch's last batch: it is done
            self.epoch, self.batch = self.epoch + 1, 0
        self._skip_until = self.batch
        if self.callback.verbose:
            params = self.callback.params or {}
            print(resume_line(latest.prefix, self.epoch, self.batch, self.step,
                              params.get("epochs"), params.get("steps")), flush=True)
        _compat.set_fit_start_epoch(model, self.epoch)
        # Skipped from the resumed epoch's start (epoch_begin): a callback may make a new
        # train function when training begins (FreezeSchedule does), after this one.
        self._skip_calls = self.batch // _compat.steps_per_execution(model)

    def _install_sigterm(self) -> None:
        self._sigterm = self._stopped = False
        if threading.current_thread() is not threading.main_thread():
            return
        if self.manager.cluster is not None or self.coordinated:
            # Several workers: one more save on the worker that got the signal alone would
            # wait forever for the others (saving is collective). The signal keeps its usual
            # effect; a restart resumes from the newest checkpoint the chief committed.
            # ParameterServerStrategy: no hook runs before the epoch's end, so the signal
            # keeps its usual effect too; a restart resumes from the last epoch saved.
            return

        def on_sigterm(signum, frame):
            self._sigterm = True

        self._previous_handler = signal.signal(signal.SIGTERM, on_sigterm)

    def epoch_begin(self, epoch) -> None:
        self.epoch = epoch
        if self._skip_calls:
            _compat.skip_fit_batches(self.callback.model, self._skip_calls)
            self._skip_calls = 0
        if self._skip_until == 0:
            self.batch = 0
            self._epoch_start_step = self.step

    def batch_end(self, batch, logs) -> None:
        if batch + 1 <= self._skip_until:
            return  # a batch the restored checkpoint had trained on already
        self._skip_until = 0
        before, freq = self.step, self.callback.save_freq
        self.batch, self.step = batch + 1, self._epoch_start_step + batch + 1
        if (freq != "epoch" and self.step // freq > before // freq) or self._sigterm:
            self.save(logs, mid_epoch=True, force=self._sigterm)
        if self._sigterm:
            self._stop()

    def epoch_end(self, epoch, logs) -> None:
        if self._stopped:  # by SIGTERM, mid-epoch: the epoch is not done, and was saved
            return
        self._skip_until = 0
        if self.coordinated:  # no batch hooks: every step of the epoch ran (fit joined them)
            self.step = self._epoch_start_step + int(self.callback.params["steps"])
        self.epoch, self.batch = epoch + 1, 0
        if self.callback.save_freq == "epoch" or self._sigterm:
            self.save(logs, force=self._sigterm)
        if self._sigterm:
            self._stop()

    def _stop(self) -> None:
        self._stopped = True
        self.callback.model.stop_training = True

    def end(self, model) -> None:
        _compat.set_fit_start_epoch(model, None)
        _compat.unskip_fit_batches(model)
        try:
            self.manager.close()
        finally:
            if self._previous_handler is not None:
                signal.signal(signal.SIGTERM, self._previous_handler)
                self._previous_handler = None
                if self._sigterm:  # saved once more: now let the signal take its course
                    signal.raise_signal(signal.SIGTERM)

    # --- saving -----------------------------------------------------------------------

    def save(self, logs, mid_epoch: bool = False, force: bool = False) -> None:
        """Writes the next checkpoint with the current position and monitored value.

        mid_epoch: saved at a batch's end (save_freq=N, or SIGTERM), where fit's logs hold
        the training metrics only: validation metrics exist at the end of an epoch.
        force: never skipped as too soon (the save on SIGTERM).
        """
        cb = self.callback
        value = (logs or {}).get(cb.monitor)
        if value is None and cb.keep_best and not self._warned_monitor:
            self._warned_monitor = True
            warnings.warn(monitor_missing(cb.monitor, logs, cb.save_freq, mid_epoch),
                          stacklevel=4)
        _companions.before_save(cb.model, epoch_end=not mid_epoch)
        counters = self.manager.counters
        for name, number in (("epoch", self.epoch), ("step", self.step), ("batch", self.batch)):
            counters[name].assign(number)
        prefix = self.manager.save(None if value is None else float(value), force=force)
        if prefix is not None:
            cb.saved.append(prefix)


def coordinated(model) -> bool:
    """Whether `model.fit` runs under ParameterServerStrategy, whose `ClusterCoordinator`
    schedules the steps on the workers (tf_keras and Keras 2 call no batch-level hook there)."""
    strategy = getattr(model, "distribute_strategy", None)
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def check_coordinated(callback) -> None:
    """Refuses, before anything is opened, what Checkpointing cannot do under
    ParameterServerStrategy: saving every N batches, and a fit with no epoch length.

    Raises:
      InvalidArgumentError: save_freq is a number of batches, or fit has no steps_per_epoch.
    """
    if callback.save_freq != "epoch":
        raise errors.InvalidArgumentError(
            f"Checkpointing(save_freq={callback.save_freq!r}) cannot save every "
            f"{callback.save_freq} batches under ParameterServerStrategy: there fit (tf_keras, "
            "Keras 2) runs its steps asynchronously on the workers and calls no batch-level "
            "callback, and each worker reads its own copy of the data, so no batch position "
            "can be saved or resumed. Checkpointing saves at the end of each epoch there, once "
            "every step of it has run. Fix: save_freq='epoch', with fit(steps_per_epoch=N) "
            "set to the number of steps between checkpoints.", source=callback.directory)
    steps = (callback.params or {}).get("steps")
    if not isinstance(steps, int) or steps <= 0:
        raise errors.InvalidArgumentError(
            "Checkpointing cannot save during this fit: under ParameterServerStrategy it saves "
            "at the end of each epoch (fit calls no batch-level callback there), and this "
            f"fit's epochs never end (steps per epoch: {steps!r}; steps_per_epoch not given, "
            "or -1). Fix: pass fit(steps_per_epoch=N), N the number of steps between "
            "checkpoints, with a dataset that repeats (a DatasetCreator whose dataset_fn "
            "returns dataset.repeat()).", source=callback.directory)


def check_epoch_boundary(prefix: str, steps: int) -> None:
    """Refuses to resume from a checkpoint saved within an epoch (save_freq=N without
    ParameterServerStrategy) under it, where fit cannot skip the batches it trained on;
    read from the file before anything is restored. One saved after an epoch's last batch
    (`steps` of them, or more) holds that epoch done: fit resumes at the next.

    Raises:
      InvalidArgumentError: `prefix` was saved at a batch within an epoch.
    """
    reader = tf.train.load_checkpoint(prefix)
    key = "batch/.ATTRIBUTES/VARIABLE_VALUE"
    batch = int(reader.get_tensor(key)) if reader.has_tensor(key) else 0
    epoch = int(reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE"))
    if 0 < batch < steps:
        raise errors.InvalidArgumentError(
            f"Checkpointing cannot resume from {prefix} under ParameterServerStrategy: it was "
            f"saved in epoch {epoch + 1} after batch {batch} (save_freq in batches), and "
            "there fit resumes only at the start of an epoch (it cannot skip the batches "
            "the checkpoint trained on: each worker reads its own copy of the data). "
            "Nothing was restored. Fix: finish that epoch without ParameterServerStrategy "
            "(the same fit resumes mid-epoch there), or restore the weights with "
            f"objckpt.restore(model, {prefix!r}, at='model') and fit with a new directory.",
            source=prefix)


def monitor_missing(monitor: str, logs, save_freq, mid_epoch: bool) -> str:
    """The warning for a save whose logs lack `monitor` (with keep_best), by its real cause.

    A save after a batch (save_freq=N) sees that batch's logs: training metrics only, as
    fit computes validation metrics (`val_...`) at the end of an epoch; validation_data
    cannot put them there. A save at an epoch's end lacks `val_...` when fit had no
    validation data, or any key fit does not log.
    """
    keys = sorted(logs or {})
    head = (f"Checkpointing: monitor {monitor!r} is not in the logs (keys: {keys}); these "
            "checkpoints cannot count as best.")
    if mid_epoch:
        freq = f"save_freq={save_freq!r}" if save_freq != "epoch" else "a mid-epoch save"
        if monitor.startswith("val_"):
            return (f"{head} With {freq} checkpoints are saved after a batch, where fit logs "
                    f"only training metrics: {monitor!r} exists at the end of an epoch "
                    f"(validation runs then), whatever validation_data is. Fix: monitor a "
                    f"training metric such as {monitor[4:]!r}, or save_freq='epoch' to rank "
                    f"by {monitor!r}.")
        return (f"{head} With {freq} checkpoints are saved after a batch, whose logs hold "
                f"these keys only. Fix: monitor one of them, or save_freq='epoch'.")
    if monitor.startswith("val_"):
        return (f"{head} Validation metrics are logged at the end of an epoch when fit has "
                f"validation data. Fix: pass validation_data (or validation_split) to fit, "
                f"or monitor a key that fit logs.")
    return f"{head} Fix: monitor a key that fit logs."


def resume_line(prefix: str, epoch: int, batch: int, step: int, epochs, steps=None) -> str:
    """The line Checkpointing prints on resuming: from where, and what fit does next.

    Args:
      prefix: the checkpoint restored.
      epoch, batch, step: its counters (epochs done, batches done in the next, global step).
      epochs: fit's `epochs` (None when unknown).
      steps: fit's batches per epoch (None when unknown). A checkpoint saved after an
        epoch's last batch (save_freq=N where N divides it) holds that epoch done: fit
        goes on with the next epoch, not with a batch past the last.
    """
    if isinstance(steps, int) and steps > 0 and batch >= steps:
        epoch, batch = epoch + 1, 0  # every batch of that epoch trained: it is done
    if isinstance(epochs, int) and epoch >= epochs:
        return (f"Checkpointing: training already finished: {prefix} holds {epoch} epoch(s) "
                f"(step {step}) and fit(epochs={epochs}) counts all epochs, these included, so "
                "this fit trains no more. To train further, pass a larger epochs= to fit; to "
                "start over, give Checkpointing a new directory.")
    of = f" of {epochs}" if isinstance(epochs, int) else ""
    if batch:
        return (f"Checkpointing: resumed from {prefix} (epoch {epoch + 1}{of} at batch {batch}, "
                f"step {step}); training continues with batch {batch + 1} of that epoch.")
    return (f"Checkpointing: resumed from {prefix} (epoch {epoch}{of} done, step {step}); "
            f"training continues with epoch {epoch + 1}.")
