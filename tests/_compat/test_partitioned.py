"""TF1 `PartitionedVariable`s held by objs that TF 2 code still runs, as one logical variable.

TF 2 still makes them, eagerly too: `tf.compat.v1.get_variable(..., partitioner=...)` (TF1 code
ported to eager, a Keras layer's `build` calling it). A `PartitionedVariable` is no trackable:
`tf.Module.variables`, Keras's `variables` and `tf.train.Checkpoint` leave it out without a
word. objckpt finds it under its attribute path and treats it as a sharded variable whose
parts split one axis: `tree`, `snapshot`, `save` (one key, one slice per part, as the Saver
writes it), `plan` (its layout beside it), `restore` (any layout, a TF1 Saver checkpoint
included), `restore_on_create`, `Twins`, `clone`, `average` and `CheckpointManager`.
`tf.compat.v1.make_template` tracks its parts itself (TF's checkpoint has each part as a
variable): each part takes its slice of the one key a TF1 Saver wrote (the "part" strategy).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # test only: no public maker
from tensorflow.python.ops import variables as tf_variables  # test only: a multi-axis one

import objckpt
from objckpt import errors
from objckpt._bundle import index as _index
from objckpt._planning import sharded as _sharded

from flavours import KERAS_FLAVOURS, keras_for

_COUNT = [0]


def value(shape, seed) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def partitioned(array, parts: int, axis: int = 0):
    """An eager PartitionedVariable of `array` in `parts` parts along `axis`."""
    _COUNT[0] += 1
    made = tf.compat.v1.get_variable(
        f"pv{_COUNT[0]}", initializer=tf.constant(array),
        partitioner=tf.compat.v1.fixed_size_partitioner(parts, axis=axis))
    assert type(made).__name__ == "PartitionedVariable" and len(list(made)) == parts
    return made


def whole(variable) -> np.ndarray:
    """The logical value, read part by part without objckpt (the test's own reading)."""
    if type(variable).__name__ == "PartitionedVariable":
        axis = [i for i, n in enumerate(variable._partitions) if n > 1] or [0]
        return np.concatenate([p.numpy() for p in variable], axis=axis[0])
    if isinstance(variable, sharded_variable.ShardedVariable):
        return np.concatenate([p.numpy() for p in variable.variables])
    return variable.numpy()


def net(parts=(3, 2), seed=0) -> tf.Module:
    """`table` (10, 4) in parts of rows, `kernel` (4, 6) in parts of columns, `bias` plain."""
    module = tf.Module()
    module.table = partitioned(value((10, 4), seed), parts[0])
    module.kernel = partitioned(value((4, 6), seed + 1), parts[1], axis=1)
    module.bias = tf.Variable(value((6,), seed + 2))
    return module


def values_of(module) -> dict:
    return {name: whole(getattr(module, name)).tobytes() for name in ("table", "kernel", "bias")}


def test_tf_leaves_it_out_and_objckpt_takes_it_whole(tmp_path):
    module = net()
    assert module.variables == (module.bias,)  # TF's own listing misses both
    prefix = tf.train.Checkpoint(root=module).write(str(tmp_path / "tf"))
    assert sorted(k for k in tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
                  if "OBJECT_GRAPH" not in k) == ["bias/.ATTRIBUTES/VARIABLE_VALUE"]
    tree = objckpt.tree(module)
    assert list(tree) == ["bias", "table", "kernel"]
    assert tree["table"] is module.table and tuple(tree["kernel"].shape) == (4, 6)
    assert objckpt._compat.shard_layout(module.table).describe() == \
        "3 parts of rows [0:4) [4:7) [7:10)"
    assert objckpt._compat.shard_layout(module.kernel).describe() == \
        "2 parts of columns [0:3) [3:6)"
    snap = objckpt.snapshot(module)
    assert {k: snap[k].numpy().tobytes() for k in snap} == values_of(module)


def test_in_lists_and_dicts_tf_tracks(tmp_path):
    def holder(seed, parts):
        module = tf.Module()
        module.tables = [partitioned(value((6, 2), seed + i), parts) for i in range(2)]
        module.named = {"a/b": partitioned(value((4, 2), seed + 2), parts)}
        return module

    source = holder(80, 2)
    assert list(objckpt.tree(source)) == ["tables/0", "tables/1", "named/a.Sb"]
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    target = holder(90, 3)
    objckpt.restore(target, prefix)
    for mine, theirs in [*zip(target.tables, source.tables),
                         (target.named["a/b"], source.named["a/b"])]:
        assert whole(mine).tobytes() == whole(theirs).tobytes()


def test_save_writes_what_the_saver_writes_and_tf_reads_it(tmp_path):
    module = net(seed=3)
    prefix = objckpt.save(module, str(tmp_path / "ckpt"))
    entries = _index.read_index(prefix).entries
    assert [s[0] for s in entries["table/.ATTRIBUTES/VARIABLE_VALUE"].slices] == \
        [(0, 4), (4, 3), (7, 3)]
    assert [s[1] for s in entries["kernel/.ATTRIBUTES/VARIABLE_VALUE"].slices] == [(0, 3), (3, 3)]
    # the same slices as the parts' own SaveSliceInfo (what tf.compat.v1.train.Saver writes)
    specs = [p._get_save_slice_info().spec for p in module.table]
    assert specs == ["10 4 0,4:0,4", "10 4 4,3:0,4", "10 4 7,3:0,4"]
    for layout in ("plain", "sharded"):
        fresh = tf.Module()
        fresh.table = (tf.Variable(tf.zeros((10, 4))) if layout == "plain" else
                       sharded_variable.ShardedVariable([tf.Variable(tf.zeros((5, 4))),
                                                         tf.Variable(tf.zeros((5, 4)))]))
        fresh.kernel = tf.Variable(tf.zeros((4, 6)))
        fresh.bias = tf.Variable(tf.zeros((6,)))
        tf.train.Checkpoint(root=fresh).read(prefix).assert_consumed()
        assert values_of(fresh) == values_of(module)


@pytest.mark.parametrize("saved, restored", [((3, 2), (2, 3)), ((1, 1), (4, 2)),
                                             ((2, 3), (1, 1))])
def test_restore_reparts_and_plan_shows_both_layouts(tmp_path, saved, restored):
    source = net(saved, seed=5)
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    target = net(restored, seed=9)
    text = objckpt.plan(target, prefix).describe()
    table_row = next(line for line in text.splitlines() if line.strip().startswith("table"))
    assert f"{restored[0]} part" in table_row and "exact" in table_row
    if saved[0] > 1:
        assert f"saved in {saved[0]} parts of rows" in table_row
    report = objckpt.restore(target, prefix)
    assert sorted(report.restored) == ["bias", "kernel", "table"]
    assert values_of(target) == values_of(source)
    # and from a Snapshot (values whole, assigned part by part)
    again = net(restored, seed=11)
    objckpt.restore(again, objckpt.snapshot(source))
    assert values_of(again) == values_of(source)


def test_a_tf1_saver_checkpoint_into_eager_partitioned_variables(tmp_path):
    table, kernel = value((10, 4), 20), value((4, 6), 21)
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("model"):
            tf.compat.v1.get_variable("table", initializer=tf.constant(table),
                                      partitioner=tf.compat.v1.fixed_size_partitioner(2))
            tf.compat.v1.get_variable("kernel", initializer=tf.constant(kernel))
            tf.compat.v1.get_variable("bias", initializer=tf.zeros((6,)))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            prefix = tf.compat.v1.train.Saver().save(session, str(tmp_path / "tf1" / "model"))
    module = net((3, 2), seed=22)  # the same code in TF 2, other part counts
    report = objckpt.restore(module, prefix, rules=[("^model/", "")])
    assert sorted(report.restored) == ["bias", "kernel", "table"]
    assert whole(module.table).tobytes() == table.tobytes()
    assert whole(module.kernel).tobytes() == kernel.tobytes()


def test_a_failed_restore_changes_no_part(tmp_path):
    prefix = objckpt.save(net(seed=30), str(tmp_path / "ckpt"))
    target = net((2, 3), seed=31)
    target.table = partitioned(value((12, 4), 32), 3)  # does not fit: 12 rows, not 10
    before = values_of(target)
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(target, prefix)
    assert f"`table` [{target.table.name}; 3 parts of rows [0:4) [4:8) [8:12)]: shape (10, 4) " \
           "in the source but (12, 4) in the obj" in str(caught.value)
    assert values_of(target) == before


def test_each_part_reads_its_slice_and_a_failure_half_way_puts_every_part_back(monkeypatch,
                                                                               tmp_path):
    source = net(seed=35)
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    real, reads = _sharded.read_slice, []

    def recording(prefix_, job):
        reads.append((job.key.split("/")[0], job.spec))
        if len(reads) == 4 and fail:
            raise OSError("the data file went away")
        return real(prefix_, job)

    monkeypatch.setattr(_sharded, "read_slice", recording)
    fail = False
    target = net((2, 3), seed=36)
    objckpt.restore(target, prefix)
    assert values_of(target) == values_of(source)
    # one read per part: rows of the table, columns of the kernel, each its own slice only
    assert sorted(reads) == sorted([("bias", ""), ("kernel", "4 6 0,4:0,2"),
                                    ("kernel", "4 6 0,4:2,2"), ("kernel", "4 6 0,4:4,2"),
                                    ("table", "10 4 0,5:0,4"), ("table", "10 4 5,5:0,4")])
    target, reads[:], fail = net((2, 3), seed=37), [], True
    before = values_of(target)
    with pytest.raises(OSError, match="the data file went away"):
        objckpt.restore(target, prefix)
    assert len(reads) == 4 and values_of(target) == before


def test_make_template_parts_each_take_their_slice_of_a_saver_key(tmp_path):
    table = value((10, 4), 45)

    def make(initializer, parts):
        return tf.compat.v1.get_variable("table", initializer=initializer,
                                         partitioner=tf.compat.v1.fixed_size_partitioner(parts))

    with tf.Graph().as_default():  # TF1: the template in a graph, saved by the Saver
        tf.compat.v1.make_template("net", make, initializer=tf.constant(table), parts=2)()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            prefix = tf.compat.v1.train.Saver().save(session, str(tmp_path / "tf1" / "model"))
    # TF 2: the same template, eagerly, in 3 parts; it tracks each part as a variable
    template = tf.compat.v1.make_template("net", make, initializer=tf.zeros((10, 4)), parts=3)
    template()
    assert list(objckpt.tree(template)) == ["table.Spart_0", "table.Spart_1", "table.Spart_2"]
    scope = template.variable_scope_name.rstrip("/")  # "net_1" where a "net" was made before
    rules = [("^net/", f"{scope}/")] if scope != "net" else []
    plan = objckpt.plan(template, prefix, rules=rules)
    assert [(m.target, m.source, m.strategy) for m in plan.matches] == [
        (f"table.Spart_{i}", "net/table", "part") for i in range(3)]
    assert plan.complete
    objckpt.restore(template, prefix, rules=rules)
    assert np.concatenate([v.numpy() for v in template.variables]).tobytes() == table.tobytes()
    # migrate lays it out as TF's checkpoint of the template, which TF reads back
    out = objckpt.migrate(template, prefix, str(tmp_path / "out" / "ckpt"), rules=rules)
    fresh = tf.compat.v1.make_template("net", make, initializer=tf.zeros((10, 4)), parts=3)
    fresh()
    tf.train.Checkpoint(root=fresh).read(out).assert_consumed()
    assert np.concatenate([v.numpy() for v in fresh.variables]).tobytes() == table.tobytes()


def test_restore_on_create_lands_in_the_parts(tmp_path):
    source = net(seed=40)
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    existing = net((2, 3), seed=41)
    pending = objckpt.restore_on_create(existing, prefix)
    assert pending.done and values_of(existing) == values_of(source)
    later = tf.Module()
    pending = objckpt.restore_on_create(later, prefix)
    later.bias = tf.Variable(tf.zeros((6,)))  # a trackable: TF tells when it is attached
    later.table = partitioned(np.zeros((10, 4), "float32"), 4)
    later.kernel = partitioned(np.zeros((4, 6), "float32"), 3, axis=1)
    # No trackable: nothing tells when a PartitionedVariable is attached to a plain tf.Module;
    # poll() looks (a Keras layer's build looks by itself, see below).
    assert set(pending.pending) == {"table", "kernel"}
    pending.poll()
    pending.assert_done()
    assert values_of(later) == values_of(source)


def test_twins_and_clone_pair_part_with_part(tmp_path):
    module = net(seed=50)
    twins = objckpt.Twins(module)
    original = values_of(module)
    assert values_of(twins.past) == original
    assert not {id(p) for p in twins.past.table} & {id(p) for p in module.table}
    module.table.assign(tf.ones((10, 4)))
    assert values_of(twins.past) == original  # independent
    twins.sync(tau=0.5)
    expected = (0.5 * np.frombuffer(original["table"], "float32").reshape(10, 4)
                + 0.5 * np.ones((10, 4), "float32"))
    np.testing.assert_allclose(whole(twins.past.table), expected, rtol=1e-6)
    twins.sync()
    assert values_of(twins.past) == values_of(module)
    copy = objckpt.clone(module)
    prefix = objckpt.save(copy, str(tmp_path / "clone"))  # its parts' slices from its layout
    restored = net((1, 1), seed=51)
    objckpt.restore(restored, prefix)
    assert values_of(restored) == values_of(module)


def test_average_of_two_checkpoints_into_parts(tmp_path):
    first, second = net(seed=70), net((1, 3), seed=71)
    sources = [objckpt.save(first, str(tmp_path / "a")), objckpt.save(second, str(tmp_path / "b"))]
    target = net((2, 2), seed=72)
    objckpt.average(target, sources)
    for name in ("table", "kernel", "bias"):
        expected = (whole(getattr(first, name)) + whole(getattr(second, name))) / 2
        np.testing.assert_allclose(whole(getattr(target, name)), expected, rtol=1e-6)


def test_checkpoint_manager_resumes_into_another_layout(tmp_path):
    module = net(seed=75)
    objckpt.CheckpointManager(module, str(tmp_path / "run")).save(7)
    resumed = net((4, 1), seed=76)
    assert objckpt.CheckpointManager(resumed, str(tmp_path / "run")).restore_latest() == 7
    assert values_of(resumed) == values_of(module)


def test_parts_along_two_axes_are_a_typed_error_naming_the_path():
    parts = []
    for i in range(2):
        for j in range(2):
            part = tf.Variable(tf.zeros((2, 2)))
            part._set_save_slice_info(tf.Variable.SaveSliceInfo("grid", [4, 4], [2 * i, 2 * j],
                                                                [2, 2]))
            parts.append(part)
    module = tf.Module()
    module.inner = tf.Module()
    module.inner.grid = tf_variables.PartitionedVariable("grid", [4, 4], tf.float32, parts,
                                                         [2, 2])
    with pytest.raises(errors.DistributedVariableError,
                       match=r"`inner/grid` is a tf.compat.v1 PartitionedVariable split along "
                             r"2 axes \(\[2, 2\] parts"):
        objckpt.tree(module)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_a_keras_layer_that_makes_one_in_build(flavour, tmp_path):
    keras = keras_for(flavour)

    class Lookup(keras.layers.Layer):
        def build(self, input_shape):
            self.table = partitioned(value((10, 3), _COUNT[0]), 2)
            self.scale = self.add_weight(name="scale", shape=(3,), initializer="ones")

        def call(self, ids):
            return tf.nn.embedding_lookup(self.table, ids) * self.scale

    def model():
        return keras.Sequential([keras.Input((2,), dtype="int32"), Lookup(name="lookup")])

    source = model()
    ids = tf.constant([[1, 8], [0, 9]])
    paths = list(objckpt.tree(source))
    table_path = next(p for p in paths if p.endswith("/table"))
    assert len(paths) == 2 and len(source.variables) == 1  # Keras lists `scale` alone
    prefix = objckpt.save(source, str(tmp_path / "ckpt"))
    target = model()
    assert not np.array_equal(target(ids).numpy(), source(ids).numpy())
    objckpt.restore(target, prefix)
    np.testing.assert_array_equal(target(ids).numpy(), source(ids).numpy())
    later = Lookup(name="lookup")  # unbuilt: the table lands when its build makes it
    pending = objckpt.restore_on_create(later, prefix, rules=[(f"^{table_path}$", "table"),
                                                              (r"^.*/scale$", "scale")])
    assert set(pending.pending) == {"table", "scale"}
    result = later(ids).numpy()
    pending.assert_done()
    np.testing.assert_array_equal(result, source(ids).numpy())
