"""State Keras layers derive from their variables, refreshed after objckpt writes them.

Some layers compute from tensors cached from their variables, not from the variables: an
adapted `Normalization` uses `mean`/`variance` reshaped from `adapt_mean`/`adapt_variance`,
a lookup in "tf_idf" mode `idf_weights_const`, tf_keras' `Discretization` its
`bin_boundaries`. Keras refreshes them in its loaders, and objckpt does the same after it
writes into such layers, so that outputs equal those Keras's own loader gives:

- Keras 3: what the layer's `load_own_variables` does after assigning (`saving_lib`):
  `Normalization.finalize_state()`; an `IndexLookup` (StringLookup, IntegerLookup, the
  lookup inside TextVectorization) in "tf_idf" mode takes `idf_weights_const` from
  `idf_weights`; a layer class of the user's that defines `finalize_state` has it called
  (as Keras's legacy HDF5 loader does). A LoRA-enabled `Dense`, `EinsumDense` or
  `Embedding` whose kernel was written without its LoRA factors (a `.weights.h5` holds the
  merged kernel) gets zero factors, as its `load_own_variables` gives them.
- tf_keras and Keras 2: `finalize_state()` of every layer class overriding the base
  layer's (their `load_weights` and `set_weights` call it on every layer).

Which layers of an obj have such a hook is found by one walk and cached under a key the
caller gives (a `VariableTree`, a `Twins`): objs without any cost one dictionary lookup per
write. Hooks run eagerly. Inside a `tf.function` being traced the values are known only
once the function runs, so cached tensors cannot be refreshed: a warning names the layers
(LoRA factors are still zeroed, by assignments in the function).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import NamedTuple

import tensorflow as tf

from objckpt._compat.graph import keras_layers, walk
from objckpt._compat.variables import as_variable

__all__ = ["delegated_copies", "derived_hooks", "layer_hooks", "lora_factors",
           "owned_positions", "refresh_derived_state", "refresh_hooks", "saving_as_loaded"]


class Hook(NamedTuple):
    """A layer with state derived from its variables, and how to refresh it."""

    layer: weakref.ref
    action: str  # "finalize", "idf" or "lora"
    name: str  # `layer.name (ClassName)`, for messages


_CACHE: dict = {}  # id(key) -> (weak reference to the key, hooks)
_ACTION_OF_CLASS: dict = {}
_LORA_FACTORS = {"kernel": ("_kernel", "lora_kernel_a", "lora_kernel_b"),
                 "embeddings": ("_embeddings", "lora_embeddings_a", "lora_embeddings_b")}


def _keras_root(cls) -> tuple[str, type] | tuple[None, None]:
    """("keras" or "tf_keras", the flavour's base `Layer` class) for a layer class."""
    for base in cls.__mro__:
        root = base.__module__.split(".", 1)[0]
        if base.__name__ == "Layer" and root in ("keras", "tf_keras"):
            return root, base
    return None, None


def _keras3_class(cls, name: str) -> bool:
    return any(c.__name__ == name and c.__module__.startswith("keras.src.")
               for c in cls.__mro__)


def _class_action(cls) -> str | None:
    """The refresh a layer class needs after its variables are written, or None."""
    if cls in _ACTION_OF_CLASS:
        return _ACTION_OF_CLASS[cls]
    _, base = _keras_root(cls)
    action = None
    if base is not None and hasattr(base, "finalize_state"):
        # tf_keras, Keras 2: the loaders call finalize_state on every layer; the base one
        # does nothing.
        if getattr(cls, "finalize_state", None) is not base.finalize_state:
            action = "finalize"
    elif base is not None:  # Keras 3: what load_own_variables does after assigning
        if _keras3_class(cls, "IndexLookup"):
            action = "idf"
        elif _keras3_class(cls, "Normalization"):
            action = "finalize"
        elif any(_keras3_class(cls, n) for n in ("Dense", "EinsumDense", "Embedding")):
            action = "lora"
        elif callable(getattr(cls, "finalize_state", None)) and not cls.__module__.startswith(
                "keras."):
            action = "finalize"  # a layer of the user's (Keras's own, such as Discretization
            # and TextVectorization, derive nothing from variables when loaded)
    _ACTION_OF_CLASS[cls] = action
    return action


def _find_hooks(obj) -> tuple[Hook, ...]:
    try:
        reached: list = []
        for _ in walk(obj, skip_optimizers=True, collections=True, visited=reached):
            pass
        nodes = [node for node, _ in reached]
    except Exception:  # not walkable: a Keras layer's own sublayers still are
        nodes = [obj]
    # An unbuilt Keras 3 Sequential holds its layers where TF's graph does not look.
    nodes += keras_layers(obj)
    return layer_hooks(nodes)


def layer_hooks(nodes) -> tuple[Hook, ...]:
    """The hooks of those nodes (layers, say) that have one; nothing is walked."""
    layers: dict = {}
    for node in nodes:
        action = _class_action(type(node)) if as_variable(node) is None else None
        if action == "lora" and not (getattr(node, "lora_enabled", False)
                                     or getattr(node, "lora_rank", None)):
            continue  # LoRA not enabled: enabling it adds variables, so a new tree and key
        if action == "idf" and getattr(node, "output_mode", None) != "tf_idf":
            continue
        if action is not None:
            layers.setdefault(id(node), node)
    hooks = []
    for layer in layers.values():
        try:
            ref = weakref.ref(layer)
        except TypeError:
            continue
        hooks.append(Hook(ref, _class_action(type(layer)),
                          f"`{getattr(layer, 'name', '?')}` ({type(layer).__name__})"))
    return tuple(hooks)


def _forget(key_id: int):
    return lambda _: _CACHE.pop(key_id, None)


def derived_hooks(obj, key=None) -> tuple[Hook, ...]:
    """The layers of obj whose state derives from variables; cached under `key` (weakly,
    by identity: a `VariableTree` is a mapping, compared by value and unhashable)."""
    if key is not None:
        entry = _CACHE.get(id(key))
        if entry is not None and entry[0]() is key:
            return entry[1]
    found = _find_hooks(obj)
    if key is not None:
        try:
            ref = weakref.ref(key, _forget(id(key)))
        except TypeError:  # not weak-referenceable: not cached
            return found
        _CACHE[id(key)] = (ref, found)
    return found


def _own_ids(layer) -> set:
    ids = set()
    for variable in [*(getattr(layer, "weights", None) or ()),
                     getattr(layer, "idf_weights", None)]:
        inner = as_variable(variable)
        if inner is not None:
            ids.add(id(inner))
    return ids


def _inner(variable):
    inner = as_variable(variable)
    return variable if inner is None else inner


def lora_factors(layer):
    """(kernel, factor a, factor b) variables of a LoRA-enabled Keras 3 layer, else None."""
    if not getattr(layer, "lora_enabled", False):
        return None
    for names in _LORA_FACTORS.values():
        found = [as_variable(getattr(layer, name, None)) for name in names]
        if all(v is not None for v in found):
            return tuple(found)
    return None


def _refresh(layer, action: str, written) -> bool:
    if action == "finalize":
        layer.finalize_state()
    elif action == "idf":
        idf = getattr(layer, "idf_weights", None)
        if getattr(layer, "output_mode", None) != "tf_idf" or idf is None:
            return False
        layer.idf_weights_const = idf.value()
    else:  # lora: a kernel written without its factors is a merged one (Keras's load)
        found = lora_factors(layer)
        if found is None or written is None or id(found[0]) not in written or (
                id(found[1]) in written and id(found[2]) in written):
            return False
        for factor in found[1:]:
            factor.assign(tf.zeros(factor.shape, factor.dtype), read_value=False)
    return True


_WARNED: set = set()


def refresh_derived_state(obj, written=None, *, key=None, hooks=None, eager=False,
                          merged: bool = True) -> list:
    """Refreshes what obj's Keras layers derive from the variables just written.

    Args:
      obj: the obj written into (walked once per `key` for its layers with hooks).
      written: the variables written (or a callable returning them, called only when obj
        has such layers); None: all of obj's. Only layers owning one are refreshed.
      key: what the hooks are cached under (the obj's `VariableTree`); None: walk obj.
      hooks: the hooks, when the caller keeps them (`derived_hooks`).
      eager: the writes ran eagerly (under `tf.init_scope`) even inside a tf.function being
        traced: so do the refreshes.
      merged: a kernel written without its LoRA factors holds them merged (a Keras weights
        file), so its factors are zeroed, as Keras's load does; False: factors are left.

    Returns:
      The layers refreshed.
    """
    if hooks is None:
        hooks = derived_hooks(obj, key)
    if not hooks:
        return []
    if callable(written):
        written = written()
    ids = None if written is None else {id(_inner(v)) for v in written}
    if not merged:
        hooks = [hook for hook in hooks if hook.action != "lora"]
    if eager and not tf.executing_eagerly():
        with tf.init_scope():
            return _run(hooks, ids)
    return _run(hooks, ids)


def owned_positions(hooks, variables) -> tuple:
    """((hook, frozenset of the positions in `variables` of the variables its layer owns)
    for each hook whose layer is alive), worked out once for a caller that writes the same
    variables again and again (`Twins`); `refresh_hooks` runs the chosen ones."""
    position = {id(_inner(v)): i for i, v in enumerate(variables)}
    out = []
    for hook in hooks:
        layer = hook.layer()
        if layer is not None:
            out.append((hook, frozenset(position[i] for i in _own_ids(layer) if i in position)))
    return tuple(out)


def refresh_hooks(hooks) -> list:
    """Runs these hooks (their layers' variables were written): eagerly; while a
    tf.function is traced it warns, as `refresh_derived_state` does. LoRA hooks, which
    need the variables written, do nothing here."""
    return _run(hooks, None)


def _run(hooks, ids) -> list:
    eager = tf.executing_eagerly()
    done, stale = [], []
    for hook in hooks:
        layer = hook.layer()
        if layer is None:
            continue
        if ids is not None and hook.action != "lora" and not (_own_ids(layer) & ids):
            continue
        if not eager and hook.action != "lora":
            stale.append(hook.name)
            continue
        if _refresh(layer, hook.action, ids):
            done.append(layer)
    if stale and tuple(stale) not in _WARNED:
        _WARNED.add(tuple(stale))
        warnings.warn(
            f"objckpt wrote variables of Keras layer(s) {', '.join(stale[:5])}"
            f"{' ...' if len(stale) > 5 else ''} inside a tf.function being traced. These "
            "layers compute from tensors cached from their variables (finalize_state), which "
            "can only be refreshed eagerly, after the function has run: until then they give "
            "the outputs of their previous values. Fix: call this objckpt operation outside "
            "tf.function, or call each layer's finalize_state() once the function has run.",
            RuntimeWarning, stacklevel=4)
    return done


class _Saved:
    """Stands for `idf_weights_const` while a weights file is laid out: its `numpy()`, what
    Keras stores, is the variable Keras's load assigns that entry to."""

    def __init__(self, variable):
        self._variable = variable

    def numpy(self):
        return self._variable


@contextlib.contextmanager
def saving_as_loaded(obj):
    """While active, Keras 3 layers of obj save the variables their load assigns.

    Keras's `save_own_variables` stores computed values in a few slots whose
    `load_own_variables` assigns them to a variable: a LoRA layer's merged kernel (the
    kernel; the factors are zeroed) and a tf_idf lookup's `idf_weights_const` (its
    `idf_weights`). Laying out a weights file with these switched finds the variable at
    its slot (`_compat.keras_weights_layout`).
    """
    own = []  # (layer, attribute, had, previous)
    try:
        for layer in keras_layers(obj):
            if getattr(layer, "lora_enabled", False) is True:
                own.append((layer, "lora_enabled", True, True))
                object.__setattr__(layer, "lora_enabled", False)
            idf = getattr(layer, "idf_weights", None)
            if (_class_action(type(layer)) == "idf" and isinstance(idf, tf.Variable)
                    and "idf_weights_const" in vars(layer)):
                own.append((layer, "idf_weights_const", True, vars(layer)["idf_weights_const"]))
                object.__setattr__(layer, "idf_weights_const", _Saved(idf))
        yield
    finally:
        for layer, name, _, previous in reversed(own):
            object.__setattr__(layer, name, previous)


# Keras 3 layers whose `save_own_variables` also stores their sublayer's values (the
# sublayer then stores them again under its own path): TextVectorization's lookup.
_DELEGATES = ("_lookup_layer",)


def delegated_copies(keys) -> dict:
    """{key of a layer's entry: key of the same value its delegate sublayer stored}.

    Keras 3 `TextVectorization.save_own_variables` stores its lookup's `idf_weights` at
    `<path>/vars/idf_weights`, and Keras's walk stores the lookup's own at
    `<path>/_lookup_layer/vars/idf_weights`: one value, twice. Its loader assigns both, the
    lookup's last: a source shows the entry once, read from the lookup's copy.
    """
    keys = set(keys)
    out = {}
    for key in keys:
        head, sep, name = key.rpartition("/vars/")
        if not sep:
            continue
        for delegate in _DELEGATES:
            inner = f"{head}/{delegate}/vars/{name}" if head else f"{delegate}/vars/{name}"
            if inner in keys:
                out[key] = inner
    return out
