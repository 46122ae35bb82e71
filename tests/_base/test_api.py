"""One calling convention across the public API.

The public callables are enumerated (`objckpt.__all__`, `objckpt.callbacks.__all__`, the
public methods of the classes users make) and their signatures checked: everything that
reads a source into an obj takes (obj|template, source|sources) first and its options by
keyword, with one default each; callbacks, `Twins`, `Freezer` and `CheckpointManager` take
their options by keyword past the first argument. The old orders still work for one
release, each call with exactly one `DeprecationWarning` that shows the new spelling and
points at the caller's line. Then what came with the convention: `Freezer.freeze` with
layers and variables (under `fit` in every Keras flavour, and with a tf.Module),
`restore_on_create(strict=)`, `BestSnapshot`'s line at the end of fit, and the
`Checkpointing` warning for a monitor that a mid-epoch save cannot see.
"""

from __future__ import annotations

import inspect
import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import objckpt
import objckpt.callbacks
from objckpt import errors
from objckpt._base import api as _api

import flavours
from flavours import KERAS_FLAVOURS, keras_for

# What reads a source into an obj: (its first two parameters, further positional ones).
READERS = {
    "restore": (("obj", "source"), ()),
    "restore_on_create": (("obj", "source"), ()),
    "plan": (("obj", "source"), ()),
    "migrate": (("obj", "source"), ("prefix",)),
    "load_ensemble": (("template", "sources"), ()),
    "average": (("obj", "sources"), ()),
}
# The options every reader takes, with their one default.
SHARED = {"rules": None, "at": None, "strict": True, "optimizer_state": "auto"}
# Classes users make whose options are keyword-only past the first argument (the second
# too where it is what the class works on: CheckpointManager's directory is its source).
OPTION_CLASSES = {
    "objckpt.Twins": ("obj",),
    "objckpt.Freezer": ("obj",),
    "objckpt.CheckpointManager": ("obj", "directory"),
    "objckpt.callbacks.TwinSync": ("twins",),
    "objckpt.callbacks.BestSnapshot": ("monitor",),
    "objckpt.callbacks.Checkpointing": ("directory",),
    "objckpt.callbacks.FreezeSchedule": ("schedule",),
}
# Records objckpt returns (reports, plans, trees, handles): built by objckpt, not by users.
RECORDS = {"AverageReport", "CheckpointTree", "Diff", "Entry", "Graph", "Match",
           "PendingRestore", "Plan", "RestoreReport", "SaveHandle", "VariableTree",
           "VerifyReport"}
# Methods whose second positional parameter is data, not an option: the Mapping protocol's
# `get(key, default)`, `Twins.sync(tau)` (what the call does), `CheckpointManager.save(step,
# metrics)` (what it saves), `Graph.render/save(format)`, `SaveHandle.result(timeout)` (as
# concurrent.futures), `PendingRestore.poll(scope, edge)` (the hooks' own call).
DATA_PARAMETERS = {("get", "default"), ("sync", "tau"), ("save", "metrics"),
                   ("render", "format"), ("save", "format"), ("result", "timeout"),
                   ("poll", "scope"), ("poll", "edge")}


def _public():
    """(qualified name, callable) for every public function, class and method."""
    out = []
    for module, names in ((objckpt, objckpt.__all__),
                          (objckpt.callbacks, objckpt.callbacks.__all__)):
        for name in names:
            value = getattr(module, name)
            if inspect.ismodule(value):
                continue
            qualified = f"{module.__name__}.{name}"
            out.append((qualified, value))
            if inspect.isclass(value):
                for attr, method in vars(value).items():
                    if not attr.startswith("_") and inspect.isfunction(method):
                        out.append((f"{qualified}.{attr}", method))
    return out


PUBLIC = _public()


def _parameters(function):
    params = list(inspect.signature(function).parameters.values())
    return params[1:] if params and params[0].name in ("self", "cls") else params


def test_the_public_api_is_enumerated():
    names = {name for name, _ in PUBLIC}
    assert {f"objckpt.{name}" for name in READERS} <= names
    assert set(OPTION_CLASSES) <= names
    assert "objckpt.Freezer.freeze" in names and "objckpt.Twins.sync" in names
    assert len(PUBLIC) > 60


@pytest.mark.parametrize("name", sorted(READERS))
def test_readers_take_obj_then_source_and_options_by_keyword(name):
    first, more = READERS[name]
    params = _parameters(getattr(objckpt, name))
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == [*first, *more], name
    assert all(p.default is p.empty for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
    keyword = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
    assert {key: keyword.get(key, "absent") for key in SHARED} == SHARED, name


@pytest.mark.parametrize("name", [name for name, _ in PUBLIC])
def test_shared_options_have_one_default_and_options_are_keyword_only(name):
    function = dict(PUBLIC)[name]
    if inspect.isclass(function) and function.__name__ in RECORDS:
        return  # a record objckpt builds
    if name.split(".")[-2] in RECORDS or name.rsplit(".", 1)[-1].startswith("on_"):
        return  # a record's method, or a hook of Keras's Callback interface
    params = _parameters(function)
    for param in params:
        if param.name in SHARED:
            assert param.kind is param.KEYWORD_ONLY, (name, param.name)
            assert param.default == SHARED[param.name], (name, param.name, param.default)
    allowed = OPTION_CLASSES.get(name)
    for index, param in enumerate(params):
        if param.kind is not param.POSITIONAL_OR_KEYWORD:
            continue
        if allowed is not None:
            assert param.name in allowed, f"{name}: {param.name} must be keyword-only"
        elif param.default is not param.empty and index > 0:
            assert (name.rsplit(".", 1)[-1], param.name) in DATA_PARAMETERS, (
                f"{name}: option {param.name} must be keyword-only")


def test_classes_take_obj_first():
    for cls in (objckpt.Twins, objckpt.Freezer, objckpt.CheckpointManager):
        assert _parameters(cls)[0].name == "obj", cls


# --- old orders: still working, one DeprecationWarning each -----------------------------

class _Net(tf.Module):
    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.normal(size=(3, 2)).astype("float32"))
        self.b = tf.Variable(rng.normal(size=(2,)).astype("float32"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    source = _Net(seed=1)
    prefix = objckpt.save(source, str(tmp_path_factory.mktemp("api") / "ckpt"))
    return prefix, {p: v.numpy() for p, v in objckpt.tree(source).items()}


def _caught(call):
    """(result, [DeprecationWarning]) of call(), every warning recorded."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = call()
    return result, [w for w in seen if issubclass(w.category, DeprecationWarning)]


def _rows(plan):
    return [(m.target, m.source, m.strategy) for m in plan.matches]


def test_plan_old_order_warns_once_with_the_new_spelling(saved):
    prefix, _ = saved
    net = _Net()
    new, none = _caught(lambda: objckpt.plan(net, prefix))
    assert none == []
    old, caught = _caught(lambda: objckpt.plan(prefix, net))  # the old order
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "objckpt.plan(source, obj) is the old argument order" in message
    assert "call objckpt.plan(obj, source)" in message and "objckpt 0.2" in message
    assert caught[0].filename == __file__  # it points at the caller's line
    assert _rows(old) == _rows(new) and len(_rows(new)) == 2
    keyword, none = _caught(lambda: objckpt.plan(source=prefix, obj=net))
    assert none == [] and _rows(keyword) == _rows(new)
    snapshot, caught = _caught(lambda: objckpt.plan(objckpt.snapshot(net), net))
    assert len(caught) == 1 and len(snapshot.matches) == 2


def test_migrate_old_order_writes_the_same_with_one_warning(saved, tmp_path):
    prefix, values = saved
    net = _Net()
    written, none = _caught(lambda: objckpt.migrate(net, prefix, str(tmp_path / "new")))
    assert none == []
    old, caught = _caught(lambda: objckpt.migrate(prefix, net, str(tmp_path / "old")))
    assert len(caught) == 1 and caught[0].filename == __file__
    assert "call objckpt.migrate(obj, source, prefix)" in str(caught[0].message)
    for out in (written, old):
        fresh = _Net(seed=5)
        objckpt.restore(fresh, out)
        got = {p: v.numpy() for p, v in objckpt.tree(fresh).items()}
        assert all(got[p].tobytes() == values[p].tobytes() for p in values)


def test_detection_needs_a_source_then_a_live_obj():
    net = _Net()
    assert _api.is_source_like("a/ckpt") and _api.is_source_like(objckpt.snapshot(net))
    assert not _api.is_source_like(net) and _api.is_live(net)
    assert not _api.is_live("a/ckpt") and not _api.is_live(None) and not _api.is_live(3)
    # (obj, source) in the new order, or two sources, are left as they are.
    assert _api.obj_first("plan", net, "a") == (net, "a")
    assert _api.obj_first("plan", "a", "b") == ("a", "b")


def test_restore_accepts_rules_none_and_empty(saved):
    prefix, values = saved
    for rules in (None, (), []):
        net = _Net(seed=7)
        objckpt.restore(net, prefix, rules=rules)
        assert net.w.numpy().tobytes() == values["w"].tobytes()


def test_strict_is_checked_and_said_in_the_plan(saved):
    prefix, _ = saved

    class Less(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.zeros((3, 2)))

    with pytest.raises(errors.InvalidArgumentError, match="strict must be True or False"):
        objckpt.plan(Less(), prefix, strict="yes")
    strict = objckpt.plan(Less(), prefix)
    assert any("strict=True: objckpt.restore would refuse this plan (0 variables without a "
               "value and 1 source entry without a variable); strict=False skips them" in n
               for n in strict.notes)
    loose = objckpt.plan(Less(), prefix, strict=False)
    assert any(n.startswith("strict=False: objckpt.restore would skip") for n in loose.notes)
    assert _rows(strict) == _rows(loose)
    report = objckpt.restore(Less(), prefix, strict=False)
    assert report.unexpected == ("b",)


def test_restore_on_create_strict(saved):
    prefix, values = saved

    class Late(tf.Module):  # creates w now, b never
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.zeros((3, 2)))

    pending = objckpt.restore_on_create(Late(), prefix)
    assert pending.strict is True and pending.pending == ("b",)
    with pytest.raises(errors.StructureMismatchError, match=r"`b` .*not created yet"):
        pending.assert_done()
    late = Late()
    loose = objckpt.restore_on_create(late, prefix, strict=False)
    loose.assert_done()  # b tolerated: no variable takes it
    assert loose.pending == ("b",) and loose.applied == ("w",)
    assert late.w.numpy().tobytes() == values["w"].tobytes()

    class Wrong(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.zeros((2, 2)))

    wrong = Wrong()
    with pytest.raises(errors.StructureMismatchError, match="exists as float32"):
        objckpt.restore_on_create(wrong, prefix, strict=False)  # a shape: either way
    assert not wrong.w.numpy().any()


def test_load_ensemble_optimizer_state_auto_skips_without_an_optimizer(saved):
    prefix, values = saved
    ensemble = objckpt.load_ensemble(_Net(), [prefix, prefix])
    assert len(ensemble.members) == 2
    assert ensemble.members[1].w.numpy().tobytes() == values["w"].tobytes()
    with pytest.raises(errors.InvalidArgumentError, match="optimizer_state must be"):
        objckpt.load_ensemble(_Net(), [prefix], optimizer_state="yes")


# --- classes: options by keyword, obj first -----------------------------------------------

def _dense_model(keras, seed=0):
    init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(5, activation="relu", name="first", kernel_initializer=init(0))
    out = keras.layers.Dense(2, name="second", kernel_initializer=init(1))
    model = keras.Model(inputs, out(hidden(inputs)))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model


def _xy(n=32):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype("float32"), rng.normal(size=(n, 2)).astype("float32")


def test_twins_and_freezer_take_obj_and_warn_for_model():
    net = _Net()
    for cls in (objckpt.Twins, objckpt.Freezer):
        made, none = _caught(lambda cls=cls: cls(net))
        assert none == []
        made, caught = _caught(lambda cls=cls: cls(model=net))
        assert len(caught) == 1 and caught[0].filename == __file__
        assert f"objckpt.{cls.__name__}(model=...) is the old name" in str(caught[0].message)
        assert (made.current if cls is objckpt.Twins else made.model) is net
        with pytest.raises(TypeError, match="pass obj"):
            cls(net, model=net)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_callback_options_by_position_warn_with_the_keyword_spelling(flavour):
    keras = keras_for(flavour)
    twins = objckpt.Twins(_dense_model(keras))
    assert _api.is_live(twins.current) and not _api.is_source_like(twins.current)
    assert _api.is_live(twins.current.optimizer) and _api.is_live(tf.train.Checkpoint())
    sync, caught = _caught(lambda: objckpt.callbacks.TwinSync(twins, 2, 0.5))
    assert len(caught) == 1 and caught[0].filename == __file__
    assert "TwinSync(...) takes its options by keyword now: pass every=2, tau=0.5" in str(
        caught[0].message)
    assert (sync.every, sync.tau, sync.on) == (2, 0.5, "batch")
    assert isinstance(sync, keras.callbacks.Callback)
    sync, none = _caught(lambda: objckpt.callbacks.TwinSync(twins, every=2, tau=0.5))
    assert none == [] and (sync.every, sync.tau) == (2, 0.5)
    best, caught = _caught(lambda: objckpt.callbacks.BestSnapshot("loss", "max", False))
    assert len(caught) == 1
    assert "pass mode='max', restore_at_end=False" in str(caught[0].message)
    assert (best.monitor, best.mode, best.restore_at_end) == ("loss", "max", False)
    with pytest.raises(TypeError, match="takes 1 positional argument"):
        objckpt.callbacks.BestSnapshot("loss", "max", False, 1)


# --- Freezer: layers and variables -------------------------------------------------------

def _values(variables):
    return [np.array(v.numpy()) for v in variables]


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_freeze_a_layer_and_a_variable_under_fit(flavour):
    keras = keras_for(flavour)
    model = _dense_model(keras)
    first, second = model.get_layer("first"), model.get_layer("second")
    freezer = objckpt.Freezer(model)
    frozen = freezer.freeze(first)
    assert len(frozen) == 2 and frozen == freezer.matching(first)
    assert {n.split("/")[-1] for p, n in zip(freezer.paths, freezer.names)
            if p in frozen} == {"kernel", "bias"}
    x, y = _xy()
    before_first, before_second = _values(first.weights), _values(second.weights)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before_first,
                                                           _values(first.weights)))
    assert all(a.tobytes() != b.tobytes() for a, b in zip(before_second,
                                                           _values(second.weights)))
    # A variable of the model, mixed with a pattern; set_frozen takes one too.
    freezer.unfreeze(first)
    assert freezer.frozen == ()
    kernel = second.kernel
    only = freezer.set_frozen(kernel)
    assert len(only) == 1
    both = freezer.freeze(kernel, "first/bias|^first/_?bias")
    assert len(both) == 2
    freezer.set_frozen([kernel])
    before = _values([kernel, second.bias, first.kernel])
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    after = _values([kernel, second.bias, first.kernel])
    assert [a.tobytes() == b.tobytes() for a, b in zip(before, after)] == [True, False, False]


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_freeze_schedule_takes_a_layer(flavour):
    keras = keras_for(flavour)
    model = _dense_model(keras)
    first, second = model.get_layer("first"), model.get_layer("second")
    schedule = objckpt.callbacks.FreezeSchedule({0: first, 1: [second.kernel, "nothing|bias"]})
    x, y = _xy()
    before = _values(first.weights)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[schedule])
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, _values(first.weights)))
    assert schedule.history == [(0, schedule.freezer.matching(first))]
    assert len(schedule.history[0][1]) == 2
    with pytest.raises(errors.InvalidArgumentError, match=r"FreezeSchedule\[0\]"):
        objckpt.callbacks.FreezeSchedule({0: [3]})


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_freeze_refuses_a_layer_or_variable_of_another_model(flavour):
    keras = keras_for(flavour)
    model, other = _dense_model(keras), _dense_model(keras, seed=3)
    freezer = objckpt.Freezer(model)
    with pytest.raises(errors.InvalidArgumentError) as caught:
        freezer.freeze(other.get_layer("first"))
    text = str(caught.value)
    assert "freeze(Dense 'first')" in text and "is not one of" in text and "Fix:" in text
    with pytest.raises(errors.InvalidArgumentError, match=r"unfreeze\(variable .*Fix:"):
        freezer.unfreeze(tf.Variable(1.0))
    with pytest.raises(errors.InvalidArgumentError, match="no variables yet"):
        freezer.freeze(keras.layers.Dense(3, name="unbuilt"))
    assert freezer.frozen == ()


def test_freeze_a_submodule_of_a_tf_module():
    keras = keras_for(flavours.session_flavour()) if flavours.session_flavour() != "module" \
        else keras_for("keras3")

    class Two(tf.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = _Net(seed=1), _Net(seed=2)

    model = Two()
    freezer = objckpt.Freezer(model)
    assert len(freezer.freeze(model.a)) == 2
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    variables = [model.a.w, model.a.b, model.b.w, model.b.b]
    before = _values(variables)
    for _ in range(2):
        freezer.apply_gradients(optimizer, [(tf.ones_like(v), v) for v in variables])
    after = _values(variables)
    assert [a.tobytes() == b.tobytes() for a, b in zip(before, after)] == [True, True,
                                                                         False, False]
    freezer.set_frozen(None)
    freezer.freeze(model.b.w)
    assert freezer.frozen == ("b/w",)


# --- BestSnapshot says when it rolls back; Checkpointing's monitor warning ----------------

def test_best_snapshot_says_which_epoch_it_restores(capsys):
    keras = keras_for(flavours.session_flavour() if flavours.session_flavour() != "module"
                      else "keras3")
    model = _dense_model(keras)
    best = objckpt.callbacks.BestSnapshot()
    best.set_model(model)
    best.on_train_begin()
    kernel = model.get_layer("first").kernel
    seen = {}
    for epoch, loss in enumerate([0.5, 0.123, 0.9]):
        kernel.assign(tf.fill(kernel.shape, float(epoch)))
        seen[epoch] = kernel.numpy().copy()
        best.on_epoch_end(epoch, {"val_loss": loss})
    capsys.readouterr()
    best.on_train_end()
    out = capsys.readouterr().out
    assert out == ("BestSnapshot: restored the weights of epoch 2 (val_loss 0.123), the best "
                   "of 3 epochs.\n")
    assert kernel.numpy().tobytes() == seen[1].tobytes() and best.restored
    quiet = objckpt.callbacks.BestSnapshot(verbose=0)
    quiet.set_model(model)
    quiet.on_train_begin()
    quiet.on_epoch_end(0, {"val_loss": 1.0})
    quiet.on_epoch_end(1, {"val_loss": 0.5})
    quiet.on_train_end()
    assert capsys.readouterr().out == "" and quiet.restored
    assert quiet.rollback_line() == ("BestSnapshot: the last epoch (2, val_loss 0.5) was the "
                                     "best of 2 epoch(s); the weights are those it ended with.")


def _monitor_warnings(call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in seen if "Checkpointing: monitor" in str(w.message)]


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_checkpointing_monitor_warning_names_the_real_cause(flavour, tmp_path):
    keras = keras_for(flavour)
    x, y = _xy()
    model = _dense_model(keras)
    steps = objckpt.callbacks.Checkpointing(str(tmp_path / "steps"), keep_best=1, save_freq=2,
                                            verbose=0)
    said = _monitor_warnings(lambda: model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                                               validation_data=(x, y), callbacks=[steps]))
    assert len(said) == 1
    assert "With save_freq=2 checkpoints are saved after a batch" in said[0]
    assert "'val_loss' exists at the end of an epoch" in said[0]
    assert "monitor a training metric such as 'loss', or save_freq='epoch'" in said[0]
    assert "pass validation_data" not in said[0]
    epochs = objckpt.callbacks.Checkpointing(str(tmp_path / "epochs"), keep_best=1, verbose=0)
    said = _monitor_warnings(lambda: _dense_model(keras).fit(
        x, y, batch_size=8, epochs=1, verbose=0, callbacks=[epochs]))
    assert len(said) == 1 and "Fix: pass validation_data (or validation_split)" in said[0]
    assert re.search(r"keys: \[.*'loss'.*\]", said[0])
