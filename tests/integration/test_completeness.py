"""No weight left behind: layers in lists and dicts, untracked variables, optimizer state.

The oracle for "every variable" is Keras' own list (`model.variables` and the optimizer's),
compared by object identity, never objckpt's walk.
"""

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors

from flavours import KERAS_FLAVOURS, build, keras_for, session_flavour
from legacy_models import ListNet, bias_free_mlp


def _inner(variable):
    return objckpt._compat.as_variable(variable)


def owned_ids(model, optimizer=True) -> set:
    """ids of the TF variables Keras says the model owns (the independent oracle)."""
    found = [_inner(v) for v in model.variables]
    if optimizer and getattr(model, "optimizer", None) is not None:
        variables = model.optimizer.variables
        found += [_inner(v) for v in (variables() if callable(variables) else variables)]
    return {id(v) for v in found}


def _x(seed=0):
    return np.random.default_rng(seed).normal(size=(4, 6)).astype("float32")


def list_net(flavour, *, train=True, seed=0):
    keras = keras_for(flavour)
    keras.utils.set_random_seed(seed)
    model = ListNet(keras)
    model(_x())
    if train:
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        model.fit(_x(), np.ones((4, 3), "float32"), epochs=1, batch_size=2, verbose=0)
    return model


def values(model) -> dict:
    return {id(_inner(v)): np.array(v.numpy()) for v in model.variables}


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.parametrize("train", [False, True], ids=["built", "trained"])
def test_tree_covers_every_variable_of_list_and_dict_layers(flavour, train):
    model = list_net(flavour, train=train)
    variables = objckpt.tree(model)
    got = [id(v) for v in variables.values()]
    assert len(got) == len(set(got))
    assert owned_ids(model) <= set(got)
    # Beyond Keras' lists, only optimizer hyperparameters TF's own checkpoint writes too
    # (tf_keras keeps its learning rate out of optimizer.variables; Keras 2's OptimizerV2
    # its beta_1, beta_2, decay and learning_rate).
    extra = [p for p, v in variables.items() if id(v) not in owned_ids(model)]
    assert all(p.split("/")[0] == "optimizer" and p.split("/")[-1].lstrip("_") in
               ("learning_rate", "beta_1", "beta_2", "decay") for p in extra), extra
    # 2 blocks x (dense 2 + norm 4 + inner 2 x 2), score head 2, extra head 1
    assert len(objckpt._compat.network_variable_paths(model)) >= 2 * 10 + 3
    network = dict(objckpt._compat.network_variable_paths(model))
    for path in ("blocks/0/inner/1", "heads/score", "heads/extra/0"):
        assert any(p.startswith(path + "/") for p in network), (path, list(network))


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.slow
def test_snapshot_restore_save_twins_cover_list_layers(flavour, tmp_path):
    a = list_net(flavour, seed=0)
    b = list_net(flavour, seed=1)
    x = _x(5)
    want = np.asarray(a(x))
    assert np.abs(np.asarray(b(x)) - want).max() > 1e-3

    snap = objckpt.snapshot(a)
    assert {id(_inner(v)) for v in a.variables} <= {id(v) for v in objckpt.tree(a).values()}
    report = objckpt.restore(b, snap)
    assert len(report.restored) == len(objckpt.tree(b))
    np.testing.assert_array_equal(np.asarray(b(x)), want)

    c = list_net(flavour, seed=2)
    prefix = objckpt.save(a, tmp_path / "ckpt")
    objckpt.restore(c, prefix)
    before, after = values(a), values(c)
    assert [v.tobytes() for v in before.values()] == [v.tobytes() for v in after.values()]

    d = list_net(flavour, seed=3)
    twins = objckpt.Twins(a, past=d)
    twins.sync()
    np.testing.assert_array_equal(np.asarray(twins.past(x)), want)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_clone_and_restore_on_create_of_list_layers(flavour, tmp_path):
    keras = keras_for(flavour)
    a = list_net(flavour, train=False)
    x = _x(7)
    copy = objckpt.clone(a)
    np.testing.assert_array_equal(np.asarray(copy(x)), np.asarray(a(x)))
    assert not owned_ids(copy) & owned_ids(a)

    prefix = objckpt.save(a, tmp_path / "ckpt")
    fresh = ListNet(keras)
    pending = objckpt.restore_on_create(fresh, prefix)
    fresh(x)
    pending.assert_done()
    np.testing.assert_array_equal(np.asarray(fresh(x)), np.asarray(a(x)))


def test_checkpointing_resumes_list_layers_bit_exact(tmp_path):
    keras = keras_for("keras3")
    x, y = _x(1), np.random.default_rng(2).normal(size=(4, 3)).astype("float32")
    model = list_net("keras3", train=False)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(x, y, epochs=2, batch_size=2, shuffle=False, verbose=0,
              callbacks=[objckpt.callbacks.Checkpointing(tmp_path / "run")])
    resumed = list_net("keras3", train=False, seed=9)
    resumed.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    resumed.optimizer.build(resumed.trainable_variables)
    report = objckpt.restore(resumed, tmp_path / "run", at="model")
    assert not report.missing and not report.unexpected
    want = {p: v.numpy().tobytes() for p, v in objckpt.tree(model).items()}
    got = {p: v.numpy().tobytes() for p, v in objckpt.tree(resumed).items()}
    assert want == got


def test_untracked_variable_is_a_typed_error_naming_it():
    keras = keras_for("keras3")

    class SetNet(keras.Model):
        def __init__(self):
            super().__init__()
            self.group = {keras.layers.Dense(3, name="in_a_set")}  # a set: no stable path
            self.out = keras.layers.Dense(1)

        def call(self, x):
            return self.out(next(iter(self.group))(x))

    model = SetNet()
    model(_x())
    assert len(model.variables) == 4
    for operation in (objckpt.tree, objckpt.snapshot, objckpt.Twins):
        with pytest.raises(errors.UntrackedVariableError) as info:
            operation(model)
        message = str(info.value)
        assert "in_a_set/kernel" in message and "Dense `in_a_set`" in message
        assert "(6, 3)" in message and "Fix:" in message
        assert isinstance(info.value, ValueError)


def test_graph_of_live_obj_draws_list_layers():
    model = list_net("keras3", train=False)
    dot = objckpt.graph(model).dot
    assert '"blocks\\nlist or dict"' in dot or "blocks\\nlist or dict" in dot
    assert dot.count("moving_mean") == 2


def test_seed_state_missing_from_a_tf_written_checkpoint_is_skipped(tmp_path):
    """TF's own writer does not see Keras 3 SeedGenerator state; restoring its checkpoint
    skips that state (listed) instead of failing; layers in lists it cannot see either are
    missing, and say so."""
    keras = keras_for("keras3")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4),
                              keras.layers.Dropout(0.5, seed=1), keras.layers.Dense(2)])
    prefix = tf.train.Checkpoint(root=model).write(str(tmp_path / "tf"))
    report = objckpt.restore(model, prefix)
    assert len(report.restored) == 4
    assert any("seed_generator/state" in s and "random generator" in s
               for s in report.skipped)
    net = list_net("keras3", train=False)
    prefix = tf.train.Checkpoint(root=net).write(str(tmp_path / "net"))
    with pytest.raises(errors.StructureMismatchError, match="blocks/0/dense/_kernel"):
        objckpt.restore(list_net("keras3", train=False, seed=4), prefix)


# --- optimizer state -------------------------------------------------------------


def _moments(model) -> dict:
    """id(variable) -> (first moment, second moment) from the optimizer's own index."""
    optimizer = model.optimizer
    out = {}
    for variable in model.trainable_variables:
        if not hasattr(optimizer, "_momentums"):  # Keras 2's OptimizerV2: TF slot variables
            out[id(_inner(variable))] = (optimizer.get_slot(variable, "m").numpy(),
                                         optimizer.get_slot(variable, "v").numpy())
            continue
        if hasattr(optimizer, "_get_variable_index"):  # Keras 3
            index = optimizer._get_variable_index(variable)
        else:  # tf_keras / Keras 2 (2.11+ optimizers)
            index = optimizer._index_dict[optimizer._var_key(variable)]
        out[id(_inner(variable))] = (optimizer._momentums[index].numpy(),
                                     optimizer._velocities[index].numpy())
    return out


@pytest.mark.parametrize("flavour", ("keras3",))
def test_trained_checkpoint_into_uncompiled_model_skips_optimizer_state(flavour, tmp_path):
    trained = list_net(flavour, seed=0)
    prefix = objckpt.save(tf.train.Checkpoint(model=trained), tmp_path / "ckpt")
    fresh = list_net(flavour, train=False, seed=1)
    report = objckpt.restore(fresh, prefix, at="model")
    x = _x(3)
    np.testing.assert_array_equal(np.asarray(fresh(x)), np.asarray(trained(x)))
    skipped = [s for s in report.skipped if "optimizer state" in s]
    assert len(skipped) == len(trained.optimizer.variables)
    assert "optimizer state" in str(report)
    with pytest.raises(errors.StructureMismatchError, match="optimizer"):
        objckpt.restore(list_net(flavour, train=False), prefix, at="model",
                        optimizer_state=True)
    with pytest.raises(errors.InvalidArgumentError, match="optimizer_state"):
        objckpt.restore(fresh, prefix, at="model", optimizer_state="yes")


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
@pytest.mark.parametrize("depths", [(3, 4), (4, 3)], ids=["into_larger", "into_smaller"])
def test_optimizer_moments_move_only_to_their_own_variable(flavour, depths, tmp_path):
    keras = keras_for(flavour)
    keras.utils.set_random_seed(0)
    x = _x()[:, :5]
    source = bias_free_mlp(keras, depths[0])
    source.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    source.fit(x, np.ones((4, 4), "float32"), epochs=1, batch_size=2, verbose=0)
    prefix = objckpt.save(source, tmp_path / "ckpt")
    target = bias_free_mlp(keras, depths[1])
    target(x)
    target.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    objckpt._compat.build_optimizer(target.optimizer, target.trainable_variables)
    report = objckpt.restore(target, prefix, strict=False, optimizer_state=True)
    want = _moments(source)
    got = _moments(target)
    by_name = {f"d{i}": (source_layer, target_layer) for i in range(min(depths))
               for source_layer, target_layer in [(getattr(source, f"d{i}"),
                                                   getattr(target, f"d{i}"))]}
    for src, dst in by_name.values():
        m_want, v_want = want[id(_inner(src.kernel))]
        m_got, v_got = got[id(_inner(dst.kernel))]
        np.testing.assert_array_equal(m_got, m_want)
        np.testing.assert_array_equal(v_got, v_want)
    extra = getattr(target if depths[1] > depths[0] else source, f"d{max(depths) - 1}")
    if depths[1] > depths[0]:  # the new layer's moments stay zero, listed as left as is
        m_got, v_got = got[id(_inner(extra.kernel))]
        assert not m_got.any() and not v_got.any()
        assert sum("left as is" in s for s in report.skipped) == 2, report.skipped
    else:  # the dropped layer's moments are skipped and listed
        assert sum("feeds no variable" in s for s in report.skipped) == 2
    assert int(target.optimizer.iterations.numpy()) == int(source.optimizer.iterations.numpy())


def test_tf1_bert_style_slots_and_global_step_move_by_owner(tmp_path):
    """The original BERT's AdamWeightDecayOptimizer: `<var>/adam_m`, `<var>/adam_v`."""
    keras = keras_for("keras3")
    rng = np.random.default_rng(0)
    names = {"bert/dense/kernel": (5, 4), "bert/dense/bias": (4,),
             "bert/out/kernel": (4, 2), "bert/out/bias": (2,)}
    arrays = {}
    graph = tf.Graph()
    with graph.as_default():
        variables = []
        for name, shape in names.items():
            for suffix in ("", "/adam_m", "/adam_v"):
                arrays[name + suffix] = rng.normal(size=shape).astype("float32")
                variables.append(tf.compat.v1.get_variable(
                    name + suffix, initializer=arrays[name + suffix]))
        step = tf.compat.v1.train.get_or_create_global_step()
        assign = step.assign(7)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(assign)
            prefix = tf.compat.v1.train.Saver().save(session, str(tmp_path / "bert.ckpt"))

    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden), name="bert")
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    model.optimizer.build(model.trainable_variables)
    report = objckpt.restore(model, prefix, rules=[("^bert/", "")])
    assert report.plan.strategies()["slot"] == 2 * 4 + 1
    assert int(model.optimizer.iterations.numpy()) == 7
    optimizer = model.optimizer
    for layer in ("dense", "out"):
        for attribute in ("kernel", "bias"):
            variable = getattr(model.get_layer(layer), attribute)
            name = f"bert/{layer}/{attribute}"
            index = optimizer._get_variable_index(variable)
            np.testing.assert_array_equal(variable.numpy(), arrays[name])
            np.testing.assert_array_equal(optimizer._momentums[index].numpy(),
                                          arrays[name + "/adam_m"])
            np.testing.assert_array_equal(optimizer._velocities[index].numpy(),
                                          arrays[name + "/adam_v"])


# --- the plan cache ----------------------------------------------------------------


def test_snapshot_into_a_second_instance_reuses_the_checked_plan():
    keras = keras_for("keras3")
    make = lambda: keras.Sequential(  # noqa: E731
        [keras.Input((6,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
         keras.layers.Dense(2)])
    a, b = make(), make()
    x = _x()
    first = objckpt.restore(b, objckpt.snapshot(a))
    np.testing.assert_array_equal(np.asarray(b(x)), np.asarray(a(x)))
    a.layers[0].kernel.assign(tf.ones((6, 4)))
    second = objckpt.restore(b, objckpt.snapshot(a))
    assert second is first  # the same checked plan and report, reused
    np.testing.assert_array_equal(b.layers[0].kernel.numpy(), np.ones((6, 4), "float32"))
    # A different structure on either side is planned afresh, and checked.
    other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5)])
    with pytest.raises(errors.StructureMismatchError):
        objckpt.restore(b, objckpt.snapshot(other))
    third = objckpt.restore(b, objckpt.snapshot(a), strict=False)
    assert third is not first


def test_freezer_ensemble_and_default_twins_cover_list_layers(tmp_path):
    keras = keras_for("keras3")
    model = list_net("keras3", train=False)
    x = _x(4)

    twins = objckpt.Twins(model)  # past = clone: weights only in lists and dicts
    before = np.asarray(twins.past(x))
    model.blocks[1].inner[0].kernel.assign(model.blocks[1].inner[0].kernel * 2.0 + 0.1)
    assert np.abs(np.asarray(model(x)) - before).max() > 0
    twins.sync()
    np.testing.assert_array_equal(np.asarray(twins.past(x)), np.asarray(model(x)))

    freezer = objckpt.Freezer(model)
    frozen = freezer.freeze("^blocks/1/")
    assert len(frozen) == 8 and all(p.startswith("blocks/1/") for p in frozen)
    optimizer = keras.optimizers.SGD(0.1)
    kept = model.blocks[1].dense.kernel.numpy()
    moved = model.heads["score"].kernel.numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x, training=True) ** 2)
    variables = model.trainable_variables
    freezer.apply_gradients(optimizer, zip(tape.gradient(loss, variables), variables))
    np.testing.assert_array_equal(model.blocks[1].dense.kernel.numpy(), kept)
    assert np.abs(model.heads["score"].kernel.numpy() - moved).max() > 0

    prefixes = [objckpt.save(list_net("keras3", train=False, seed=s), tmp_path / f"m{s}")
                for s in (5, 6)]
    ensemble = objckpt.load_ensemble(list_net("keras3", train=False), prefixes)
    stacked = np.asarray(ensemble(x))
    for i, seed in enumerate((5, 6)):
        np.testing.assert_allclose(stacked[i], np.asarray(list_net("keras3", train=False,
                                                                   seed=seed)(x)), atol=1e-5)


OPTIMIZERS = {
    "sgd": lambda k: k.optimizers.SGD(0.01),
    "adamax": lambda k: k.optimizers.Adamax(),
    "adafactor": lambda k: k.optimizers.Adafactor(),
    "nadam": lambda k: k.optimizers.Nadam(),
    "loss_scale": lambda k: k.optimizers.LossScaleOptimizer(k.optimizers.Adam()),
    "accumulating": lambda k: k.optimizers.Adam(gradient_accumulation_steps=2),
}


@pytest.mark.parametrize("writer", ["objckpt", "tf"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_keras3_optimizer_restores_its_own_state(name, writer, tmp_path):
    """Whatever lists an optimizer keeps, a model restored from its own checkpoint gets
    every optimizer variable back (Dropout's seed state missing from TF's files)."""
    keras = keras_for("keras3")

    def make():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4),
                                  keras.layers.Dropout(0.2, seed=1), keras.layers.Dense(2)])
        model.compile(optimizer=OPTIMIZERS[name](keras), loss="mse")
        return model

    trained = make()
    trained.fit(_x(), np.ones((4, 2), "float32"), epochs=3, batch_size=2, verbose=0)
    prefix = (objckpt.save(trained, tmp_path / "ckpt") if writer == "objckpt"
              else tf.train.Checkpoint(trained).write(str(tmp_path / "ckpt")))
    fresh = make()
    fresh.optimizer.build(fresh.trainable_variables)
    objckpt.restore(fresh, prefix)
    want = [v.numpy() for v in trained.optimizer.variables]
    got = [v.numpy() for v in fresh.optimizer.variables]
    assert len(want) == len(got)
    assert int(fresh.optimizer.iterations.numpy()) == int(trained.optimizer.iterations.numpy())
    assert int(trained.optimizer.iterations.numpy()) > 0
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_two_optimizers_in_one_model_keep_their_own_state(tmp_path):
    keras = keras_for("keras3")

    class Outer(keras.Model):
        def __init__(self):
            super().__init__()
            self.body = keras.layers.Dense(3)
            self.disc = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

        def call(self, x):
            return self.disc(self.body(x))

    def make():
        model = Outer()
        model(_x())
        model.disc.compile(optimizer=keras.optimizers.Adam(), loss="mse")
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
        return model

    a = make()
    a.fit(_x(), np.ones((4, 1), "float32"), epochs=2, batch_size=4, verbose=0)
    a.disc.fit(np.ones((4, 3), "float32"), np.ones((4, 1), "float32"), epochs=5, batch_size=4,
               verbose=0)
    prefix = objckpt.save(a, tmp_path / "ckpt")
    b = make()
    b.optimizer.build(b.trainable_variables)
    b.disc.optimizer.build(b.disc.trainable_variables)
    objckpt.restore(b, prefix)
    assert int(b.optimizer.iterations.numpy()) == 2
    assert int(b.disc.optimizer.iterations.numpy()) == 5


def test_plain_variables_and_modules_in_keras3_lists_are_covered(tmp_path):
    keras = keras_for("keras3")

    class Holder(keras.Model):
        def __init__(self):
            super().__init__()
            self.ws = [tf.Variable(3.0)]
            self.mods = [tf.Module()]
            self.mods[0].v = tf.Variable([1.0, 2.0])
            self.out = keras.layers.Dense(1)

        def call(self, x):
            return self.out(x) * self.ws[0] + tf.reduce_sum(self.mods[0].v)

    model = Holder()
    model(_x())
    variables = objckpt.tree(model)
    assert variables["ws/0"] is model.ws[0] and variables["mods/0/v"] is model.mods[0].v
    prefix = objckpt.save(model, tmp_path / "ckpt")
    model.ws[0].assign(0.0)
    objckpt.restore(model, prefix)
    assert float(model.ws[0].numpy()) == 3.0


def test_two_dict_keys_with_one_path_are_refused_and_odd_keys_are_drawn():
    keras = keras_for("keras3")

    class Clash(keras.Model):
        def __init__(self, heads):
            super().__init__()
            self.heads = heads

        def call(self, x):
            return sum(layer(x) for layer in self.heads.values())

    clash = Clash({1: keras.layers.Dense(1), "1": keras.layers.Dense(1)})
    clash(_x())
    with pytest.raises(errors.UntrackedVariableError, match="heads/1/"):
        objckpt.tree(clash)
    odd = Clash({"v1.Score/x": keras.layers.Dense(1)})
    odd(_x())
    assert "heads/v1..Score.Sx/_kernel" in objckpt.tree(odd)
    assert "v1.Score/x" in objckpt.graph(odd).dot


class _Proxied(tf.Module):
    """A module whose instance (not class) holds `get_slot_names`, with one slot."""

    def __init__(self, owner):
        super().__init__()
        self.owner = owner
        slot = tf.Variable([0.5])  # reached only as the owner's slot
        self.get_slot_names = lambda: ["m"]
        self.get_slot = lambda variable, name: slot if variable is owner else None


def _graph_roots():
    """Roots whose graphs hold optimizer slots found the way TF finds them, or none."""
    roots = [("session model", lambda: build(session_flavour(), train=True)),
             ("module", lambda: build("module", train=True))]

    def tf1_optimizer():
        variable = tf.Variable([1.0, 2.0])
        optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
        optimizer.minimize(lambda: tf.reduce_sum(variable * variable), var_list=[variable])
        return tf.train.Checkpoint(v=variable, opt=optimizer)

    def instance_method():
        owner = tf.Variable([3.0])
        return tf.train.Checkpoint(owner=owner, holder=_Proxied(owner),
                                   table={"a": tf.Variable(1.0)})

    return [*roots, ("tf.compat.v1 optimizer", tf1_optimizer),
            ("instance get_slot_names", instance_method)]


@pytest.mark.parametrize("name,make", _graph_roots(), ids=[n for n, _ in _graph_roots()])
def test_objects_and_names_are_tfs_own_walk(name, make):
    """The graph walk skips TF's dir() of each object only where no slot can exist: its
    objects (slot variables included), order and names are those of TF's own function."""
    from tensorflow.python.checkpoint import graph_view
    from tensorflow.python.checkpoint import util as checkpoint_util

    from objckpt._compat import graph as compat_graph

    root = make()
    theirs, _, _, slots, their_names = checkpoint_util.objects_ids_and_slot_variables_and_paths(
        graph_view.ObjectGraphView(root))
    ours, our_names = compat_graph.objects_and_names(graph_view.ObjectGraphView(root))
    assert [id(t) for t in ours] == [id(t) for t in theirs], name
    assert [our_names[t] for t in ours] == [their_names[t] for t in theirs], name
    if name in ("tf.compat.v1 optimizer", "instance get_slot_names"):
        assert slots and any(".OPTIMIZER_SLOT" in our_names[t] for t in ours), name
