"""Averages kept during `model.fit`: stochastic weight averaging (SWA) and an EMA.

Both keep the average in the `past` model of an `objckpt.Twins` of the model being fit and
update it with `Twins.sync(tau)`, one fused call per update: SWA's running mean of n models
takes the new weights with tau = 1/(n+1) (the first update is a hard copy), the EMA with
tau = 1 - decay. Integer variables (counters, random-generator state) are copied, not averaged.

The average, its count and the position it was last brought to are registered with
`_training.companions`, so a `callbacks.Checkpointing` of the same fit saves them beside the
model (`<name>/model/<object path>`, `<name>/count`, `<name>/seen`) and restores them on
resume: a run killed and resumed ends with an average bit-identical to one never
interrupted. Updates are keyed by the optimizer's step counter (or the epoch), so each one
happens once, whichever of the callbacks runs first and whether or not the batches of a
resumed epoch are skipped.
"""

from __future__ import annotations

from objckpt import errors
from objckpt._base import options as _options
from objckpt._base import paths as _paths
from objckpt._training import companions as _companions
from objckpt._training.callbackbase import FlavourFreeCallback

__all__ = ["EMA", "SWA"]


def _mirror(pairs) -> dict:
    """Nested dicts whose edges are the object paths' edges, ending at the variables: saved
    under a name, they give the same object paths as the model (`at="<name>/model"`)."""
    root: dict = {}
    for path, variable in pairs:
        edges = [_paths.unescape(edge) for edge in path.split("/")]
        node = root
        for edge in edges[:-1]:
            node = node.setdefault(edge, {})
        node[edges[-1]] = variable
    return root


class _Averaging(FlavourFreeCallback, _companions.Companion):
    """What SWA and EMA share: the twins, the saved state, when to update, exactly once."""

    def __init__(self, *, every, start_epoch: int, name: str, twins):
        super().__init__()
        if every != "epoch":
            _options.check_count("every", every, 1, 'update every N optimizer steps, or "epoch"')
        _options.check_count("start_epoch", start_epoch, 0, "the first epoch averaged, from 0")
        _companions.check_name(name)
        if twins is not None and not (hasattr(twins, "sync") and hasattr(twins, "past")):
            raise errors.InvalidArgumentError(
                f"{type(self).__name__}: twins must be an objckpt.Twins of the model being fit. "
                f"Received: {type(twins).__name__}. Fix: pass objckpt.Twins(model), or leave "
                "twins=None to make one when training begins.")
        self.every, self.start_epoch, self.name, self.twins = every, start_epoch, name, twins
        self._holder = None
        self._epoch = 0
        self._epoch_done = None  # the epoch whose end was considered (every="epoch")

    # --- what is kept -----------------------------------------------------------------

    @property
    def averaged_model(self):
        """The model holding the average (`twins.past`); None before training began."""
        return None if self.twins is None else self.twins.past

    @property
    def count(self) -> int:
        """How many updates the average holds."""
        return 0 if self._holder is None else int(self._holder.count.numpy())

    def state(self):
        """The trackable Checkpointing saves as `<name>`: the average's variables by object
        path (`model/...`), `count` and `seen` (the optimizer step last considered)."""
        if self._holder is None:
            import tensorflow as tf

            from objckpt._ops.twins import Twins

            model = self.model
            if self.twins is None:
                self.twins = Twins(model)
            elif self.twins.current is not model:
                raise errors.InvalidArgumentError(
                    f"{type(self).__name__}: twins.current is not the model being fit (a "
                    f"{type(self.twins.current).__name__}, fit trains a {type(model).__name__}). "
                    "Fix: pass objckpt.Twins(model) of the model you fit.")
            holder = tf.Module(name=self.name)
            holder.model = _mirror((p, past) for p, (_, past) in self.twins.variables().items())
            holder.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="count")
            # The optimizer step last considered; -1: none yet (the first step considered is
            # then taken as the one after its predecessor, also in a run resumed from a
            # checkpoint written before this callback was added).
            holder.seen = tf.Variable(-1, dtype=tf.int64, trainable=False, name="seen")
            self._holder = holder
        return self._holder

    def _step(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        iterations = getattr(optimizer, "iterations", None)
        if iterations is None:
            raise errors.InvalidArgumentError(
                f"{type(self).__name__}(every={self.every!r}) counts optimizer steps, and "
                f"{type(self.model).__name__} has no compiled optimizer. Fix: model.compile("
                f'optimizer=..., loss=...) before fit, or pass every="epoch".')
        return int(iterations.numpy())

    def _tau(self, count: int) -> float:
        raise NotImplementedError

    def _update(self) -> None:
        holder = self.state()
        count = int(holder.count.numpy())
        self.twins.sync(self._tau(count))
        holder.count.assign(count + 1)

    def before_save(self, epoch_end: bool) -> None:
        """Brings the average to the position a Checkpointing save is about to write."""
        if self.every == "epoch":
            if epoch_end:
                self._consider_epoch_end()
        else:
            self._consider_step()

    def _consider_step(self) -> None:
        holder, step = self.state(), self._step()
        seen = int(holder.seen.numpy())
        if step <= seen:
            return  # this step was considered (also before a resume: batches skipped)
        if seen < 0:
            seen = step - 1
        holder.seen.assign(step)
        if self._epoch >= self.start_epoch and step // self.every > seen // self.every:
            self._update()

    def _consider_epoch_end(self) -> None:
        if self._epoch_done == self._epoch:
            return
        self._epoch_done = self._epoch
        if self._epoch >= self.start_epoch:
            self._update()

    # --- Keras hooks ------------------------------------------------------------------

    def _implements_train_batch_hooks(self):
        return self.every != "epoch"

    def set_model(self, model):
        super().set_model(model)
        # Registered before any on_train_begin: Checkpointing finds it whatever the order.
        _companions.register(model, self.name, self)

    def on_train_begin(self, logs=None):
        _companions.register(self.model, self.name, self)
        if self.every != "epoch":
            self._step()  # the optimizer's step counter exists (or a clear error now)
        self.state()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._epoch_done = int(epoch), None

    def on_train_batch_end(self, batch, logs=None):
        if self.every != "epoch":
            self._consider_step()

    def on_epoch_end(self, epoch, logs=None):
        if self.every == "epoch":
            self._epoch = int(epoch)
            self._consider_epoch_end()

    def on_train_end(self, logs=None):
        _companions.unregister(self.model, self.name, self)


class SWA(_Averaging):
    """Stochastic weight averaging during `model.fit`: the equal-weight mean of the weights.

    From `start_epoch` on, after every epoch (or every `every` optimizer steps) the model's
    weights join a running mean kept in `averaged_model` (the `past` of an `objckpt.Twins`):
    after n updates it holds the mean of those n weight sets, in the model's dtypes. Integer
    variables (counters, random-generator state) are copied, not averaged. BatchNorm moving
    statistics are averaged like the rest, which is not what the averaged weights need: pass
    `recalibrate=` data to recompute them at the end of fit
    (`objckpt.recalibrate_batchnorm`), or call that yourself; without, the end of fit warns
    (`errors.BatchNormStatisticsWarning`).

    With a `callbacks.Checkpointing` in the same fit, the average, its count and the step it
    was last brought to are saved in each checkpoint (`swa/model/<object path>`,
    `swa/count`, `swa/seen`) and restored on resume: a run killed and resumed ends with an
    average bit-identical to one never interrupted. `objckpt.restore(fresh_model, directory,
    at="swa/model")` loads the average of the newest checkpoint into a model.

    Args:
      start_epoch: the first epoch (from 0, as Keras counts them) whose weights are averaged.
      every: keyword-only, as every option: "epoch" (the default): update after every epoch;
        an int k: after every k-th optimizer step (`model.optimizer.iterations`).
      recalibrate: data to recompute the averaged model's BatchNorm statistics from at the end
        of fit (what `objckpt.recalibrate_batchnorm` takes: a tf.data.Dataset or an iterable
        of batches, `x` or `(x, y, ...)`), or None.
      recalibrate_steps: how many batches of `recalibrate` to use (None: all).
      name: the name of the state in checkpoints (several averages need different names).
      twins: an `objckpt.Twins` of the model to keep the average in; None makes one when
        training begins.

    Attributes:
      averaged_model: the model holding the average (call it like the model).
      twins: the `objckpt.Twins`: `twins.swap()` exchanges the average and the model.
      count: how many weight sets the average holds.
      recalibrated: the report of the last recalibration at the end of fit, or None.

    Example:
      >>> swa = objckpt.callbacks.SWA(start_epoch=5, recalibrate=train_ds)
      >>> model.fit(train_ds, epochs=10, callbacks=[swa, objckpt.callbacks.Checkpointing(d)])
      >>> swa.averaged_model.evaluate(test_ds)
    """

    def __init__(self, start_epoch: int = 0, *, every="epoch", recalibrate=None,
                 recalibrate_steps: int | None = None, name: str = "swa", twins=None):
        super().__init__(every=every, start_epoch=start_epoch, name=name, twins=twins)
        if recalibrate_steps is not None:
            _options.check_count("recalibrate_steps", recalibrate_steps, 1, "batches used")
        self.recalibrate, self.recalibrate_steps = recalibrate, recalibrate_steps
        self.recalibrated = None

    def _tau(self, count: int) -> float:
        return 1.0 / (count + 1)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self.count == 0:
            return
        from objckpt._ops import batchnorm as _batchnorm

        if self.recalibrate is not None:
            self.recalibrated = _batchnorm.recalibrate_batchnorm(
                self.averaged_model, self.recalibrate, steps=self.recalibrate_steps)
        else:
            _batchnorm.warn_averaged_statistics(
                self.averaged_model, f"SWA: the averaged model (swa.averaged_model, {self.count} "
                "weight sets)", "pass SWA(recalibrate=train_data), or call "
                "objckpt.recalibrate_batchnorm(swa.averaged_model, train_data) before "
                "evaluating it", stacklevel=3)


class EMA(_Averaging):
    """An exponential moving average of the weights during `model.fit`, in `Twins.past`.

    After every `every` optimizer steps, `averaged_model = decay * averaged_model +
    (1 - decay) * model` (a Polyak update: `Twins.sync(tau=1 - decay)`, one fused call);
    integer variables are copied. The average starts as a copy of the model when training
    begins (or is what `twins.past` holds). BatchNorm moving statistics are averaged too,
    as EMA implementations do.

    With a `callbacks.Checkpointing` in the same fit, the average, its count and the step it
    was last brought to are saved in each checkpoint (`ema/model/<object path>`, `ema/count`,
    `ema/seen`) and restored on resume, bit-identical to a run never interrupted.

    Args:
      decay: the weight of the average in each update, in [0, 1) (e.g. 0.999).
      every: keyword-only, as every option: update after every this many optimizer steps
        (or "epoch": after every epoch).
      start_epoch: the first epoch (from 0) whose steps update the average.
      name: the name of the state in checkpoints.
      twins: an `objckpt.Twins` of the model; None makes one when training begins.

    Attributes:
      averaged_model: `twins.past`, the moving average (call it like the model).
      twins: the `objckpt.Twins`: `twins.swap()` puts the average into the model.
      count: how many updates were made.

    Example:
      >>> ema = objckpt.callbacks.EMA(decay=0.999)
      >>> model.fit(x, y, epochs=3, callbacks=[ema])
      >>> ema.averaged_model.predict(x)
    """

    def __init__(self, decay: float = 0.999, *, every=1, start_epoch: int = 0,
                 name: str = "ema", twins=None):
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or \
                not 0.0 <= decay < 1.0:
            raise errors.InvalidArgumentError(
                f"EMA decay is the weight of the average in each update and must lie in [0, 1). "
                f"Received: decay={decay!r}. Fix: pass e.g. decay=0.999.")
        super().__init__(every=every, start_epoch=start_epoch, name=name, twins=twins)
        self.decay = float(decay)

    def _tau(self, count: int) -> float:
        return 1.0 - self.decay
