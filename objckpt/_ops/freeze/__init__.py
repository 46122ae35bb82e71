"""Freezing variables without recompiling or retracing: `Freezer`.

The package, from the top: `freezer` (the public `Freezer`), `fit` (`FitHold`: the frozen
set under `model.fit`), `routes` (optimizers routed through the guard), `guard`
(`GuardedApply`: the update that leaves frozen variables alone), `skip` (Keras optimizers'
per-variable updates skipped), `selection` (`FrozenMask`: patterns to the frozen set).

A variable's `trainable` flag is read when a training step is traced, so
changing it means `compile()` again (Keras) or a retrace. `Freezer` keeps
the frozen set in a boolean TF variable instead; `Freezer.apply_gradients`
reads it inside the step, so the same traced step honours every later
`freeze`/`unfreeze`.

How a frozen variable stays bit-identical
-----------------------------------------
Optimizers update their state (momentum, Adam moments, weight decay, EMA)
even for a zero gradient, so a zero gradient alone moves a variable. Inside a
`tf.function`, the update runs in one of two branches of a conditional on "is
any variable frozen": the optimizer's plain update when none is. With up to
64 variables, the plain update is inlined in the step, where TF overlaps each
variable's update with the gradients still being computed (a conditional
there costs a Switch node per input); with more, either branch is one
function call. Otherwise:

* Keras optimizers (Keras 3, tf_keras, Keras 2, and their `legacy` ones)
  update each variable and its state in one method call (`update_step`, or
  `_resource_apply_dense`; weight decay in `_apply_weight_decay`); while the
  frozen branch is traced these are wrapped so that each variable's call runs
  only when it is not frozen. A frozen
  variable's update is skipped, not undone: it costs one conditional per
  variable, and freezing half the variables makes a step cheaper, not dearer.
* Other optimizers (TF1 `tf.compat.v1.train`, Keras optimizers with EMA,
  gradient accumulation, global-norm clipping or a loss-scale wrapper, whose
  state or scaling spans variables; variables with constraints, which Keras
  re-applies to every variable): for each variable, one conditional
  reads the variable and its optimizer state before the update, only when it
  is frozen, and hands the optimizer a zero gradient (so global-norm clipping
  ignores it); a second one writes the read values back after the update.
  The writes adopt the read buffers (no copy).

Under model.fit
---------------
Keras traces `model.train_step` once into a cached train function, capturing
the optimizer methods it calls. On a Keras model, the first `freeze` shadows
the model's `train_step` (an instance attribute, see `fit.FitHold`) with one
that routes the model's current optimizer (`apply_gradients`; a Keras 3
optimizer's `apply` too) through the Freezer while the step is traced, and
makes a train function traced before afresh, once. A recompile makes a new
train function, whose trace follows the new optimizer. One Freezer holds a model: a
second one's attach (the most recent `freeze`) displaces the first, whose frozen set then
no longer applies under fit (a Freezer made again in a notebook cell replaces the old
one, rather than nesting on it). A traced step that
passes none of the Freezer's variables through that optimizer (a custom
`train_step` updating them by hand) is refused while anything is frozen,
before any variable moves, and so is every later `freeze`.

Under tf.distribute
-------------------
Inside `strategy.run` (MirroredStrategy, MultiWorkerMirroredStrategy) the
optimizer all-reduces the gradients and updates each variable once per replica
in a cross-replica `merge_call`, which TF cannot run inside a conditional. There
the optimizer is called as it is, without the "is any variable frozen" branch:
Keras optimizers get their per-variable update skipped for each frozen
variable's replica (the hooks are installed once for all the replicas' calls);
other optimizers (and Keras ones with weight decay, which applies it in a
`merge_call` of its own) get the read-and-write-back of each frozen variable
and its state, each replica on its own copy. A MirroredVariable's replicas
start equal, get the same all-reduced update or none, and stay bit-identical.

Under ParameterServerStrategy a `ShardedVariable` is one variable of the Freezer (one path,
one flag): optimizers update its shards one by one (tf_keras keeps their state shard by
shard), so every shard and its state is held; the frozen set lives on a parameter server,
where the workers' traced steps read it. Its shards' `trainable` is its own (shards that
disagree are refused), and some but not all of its shards passed to `freeze` are refused:
it is frozen whole.
"""

from objckpt._ops.freeze.freezer import Freezer

__all__ = ["Freezer"]
