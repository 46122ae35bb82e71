"""`objckpt.clone`: an independent structural copy of a live obj.

The package, from the top: `api` (`clone`, `clone_with_values`), `table` (the table of
copiers by type, `COPIERS`), `tfkinds` and `pykinds` (the copiers of TensorFlow's and
Python's kinds), `walker` (the walk itself: memo, work queue, weak references, ids).

`clone(obj)` returns a new obj with the same object tree (same checkpoint
paths, shapes, dtypes) whose variables are new `tf.Variable`s. It works for
Keras 3, tf_keras and Keras 2 models (Sequential, functional, subclassed,
registered for serialization or not), tf.Module trees, tf.train.Checkpoint
roots and optimizers, because it never goes through Keras' `get_config`,
`__reduce__` or `__deepcopy__`: it copies the Python object graph itself.

How the copy works
------------------
One walk over the object graph, with a memo (id of original -> copy), so
sharing and cycles are kept: a layer (or variable) reachable twice is one
object in the clone, reachable by both paths. Mutable objects are created as
empty shells first and filled from a work queue (no deep recursion, so very
deep functional graphs are fine). Per kind of object (each a copier in the table):

* `tf.Variable` (resource variables): a new variable on the same device with
  the same name, dtype, shape, trainable flag, synchronization, aggregation
  and constraint; its value is the original's (copy_values=True) or zeros.
  Keras 3 `keras.Variable` and Keras 2 `AutoCastVariable` wrappers are plain
  Python objects holding one and are copied generically around it.
* tf.distribute variables (`MirroredVariable`, `SyncOnReadVariable`: every
  variable made under MirroredStrategy or MultiWorkerMirroredStrategy, metrics
  and tf_keras BatchNorm statistics included): re-created under the original's
  strategy (its `scope()` is entered for them, wherever clone is called from),
  one component on each of the original's devices, same type, synchronization,
  aggregation, trainable flag, dtype, shape and name; each replica gets its own
  original replica's value. The first one met creates every distributed
  variable of the obj's tree first, in TF's object-graph order, so every worker
  of a multi-worker strategy creates the same variables in the same order.
  The strategy itself is shared. A `ShardedVariable` is re-created shard by shard
  (each shard, and each of ParameterServerStrategy's `CachingVariable`s, a plain
  variable on its original's device). Variables TF places otherwise (TPU and
  packed variables, variables with a variable policy) are refused with
  `DistributedVariableError`.
* immutable values (numbers, strings, EagerTensors, dtypes, shapes, type
  specs, enums), modules, classes, plain functions, graphs, distribution
  strategies, loggers: shared.
* lists, dicts, sets, tuples, namedtuples, deques, numpy arrays: copied.
  TF's tracking wrappers (`ListWrapper`, `_DictWrapper`, `_TupleWrapper`,
  wrapt proxies) are rebuilt around the copied container.
* generic Python objects: `object.__new__`-style shell (the class' own
  `__new__` / `__init__` are NOT run, so Keras' `__new__` side effects and
  `__setattr__` tracking are bypassed) and a copy of `__dict__` and slots.
* functions with a closure, bound methods, `functools.partial`: rebuilt
  around copied cells / `__self__` (Keras 3 stores per-instance closures
  such as the `build` wrapper that close over the layer).
* `tf.function` objects: rebuilt with the same options around the copied
  Python function, so they trace anew against the clone's variables; the
  cached Keras `train_function` / `test_function` / `predict_function` (and
  epoch iterators) are reset to None so Keras makes them again for the clone.
* weak references point at the copy of their referent when the referent is
  part of the clone, else at the original referent; WeakKeyDictionary &co.
  likewise.
* locks get fresh locks, `threading.local` a fresh local with this thread's
  attributes copied.
* dict keys and set items that are a variable's `_unique_id` string or an
  `id()` of a copied object (optimizer slot tables, Keras 3 trackers) are
  remapped to the clone's variable / object.

Impossible things raise `CloneError` (a `TypeError`) naming the attribute
path: open files, sockets, threads, generators, traced `ConcreteFunction`s,
resource tensors that are not variables (lookup tables, iterators); clone
called inside `strategy.run` or inside the scope of a strategy other than the
original's raises it too. The
TF and Keras internals it relies on (variable re-creation, `tf.function` options, the
types it treats specially, Keras' cached functions) come from `_compat`.
"""

from objckpt._ops.clone.api import clone, clone_with_values

__all__ = ["clone", "clone_with_values"]
