"""Many entries into one variable as rules: `Stack` and its export side, `Unstack`.

A rule whose transform ends with `Stack(over, count, axis)` makes one variable of the entries
that differ only in its `over` placeholder (a mixture of experts' per-expert weights, one
file entry each, into one expert bank); `objckpt.export` writes each entry back. The oracle
is NumPy (`np.stack`, indexing) and the `safetensors` library's own writer: a restore reads
its file, and an export of the restored obj is that file, byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt.rules import Chain, Concat, Reshape, Rule, RuleSet, Split, Stack, Transpose, Unstack

import flavours
from flavours import keras_for

safetensors_numpy = pytest.importorskip("safetensors.numpy")

EXPERTS, HID, INNER = 3, 4, 5

# torch keeps one (INNER, HID) weight per expert; the obj one (EXPERTS, HID, INNER) bank.
MOE = RuleSet([
    Rule("moe.experts.{e}.w1.weight", "experts", Chain(Transpose(), Stack("e", EXPERTS))),
    Rule("moe.gate.weight", "gate", Transpose()),
])


def _arrays(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {f"moe.experts.{e}.w1.weight": rng.standard_normal((INNER, HID)).astype(np.float32)
           for e in range(EXPERTS)}
    out["moe.gate.weight"] = rng.standard_normal((EXPERTS, HID)).astype(np.float32)
    return out


def _moe(flavour: str):
    """An obj with an expert bank `experts` (EXPERTS, HID, INNER) and a router `gate`."""
    if flavour == "module":
        net = tf.Module()
        net.experts = tf.Variable(tf.zeros((EXPERTS, HID, INNER)), name="experts")
        net.gate = tf.Variable(tf.zeros((HID, EXPERTS)), name="gate")
        return net
    keras = keras_for(flavour)

    class Moe(keras.layers.Layer):
        def build(self, shape):
            self.experts = self.add_weight(name="experts", shape=(EXPERTS, HID, INNER),
                                           initializer="zeros")
            self.gate = self.add_weight(name="gate", shape=(HID, EXPERTS),
                                        initializer="zeros")

        def call(self, x):
            return x

    layer = Moe(name="moe")
    layer.build((None, HID))
    return layer


def _values(obj) -> dict:
    return {path: v.numpy() for path, v in objckpt.tree(obj).items()}


def _write(arrays: dict, path) -> str:
    safetensors_numpy.save_file(arrays, str(path), metadata={"format": "pt"})
    return str(path)


# --- the transforms ---------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_stack_and_unstack_are_numpy_stack_and_indexing(axis):
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(4)]
    stack = Stack("e", 4, axis=axis)
    want = np.stack(parts, axis=axis)
    assert stack.output_shape((2, 3)) == want.shape
    np.testing.assert_array_equal(stack(parts), want)
    np.testing.assert_array_equal(stack([tf.constant(p) for p in parts]).numpy(), want)
    for k, part in enumerate(parts):
        back = stack.part(k)
        assert back == Unstack(axis, k)
        assert back.output_shape(want.shape) == part.shape
        assert back(want).tobytes() == part.tobytes()
        assert back(tf.constant(want)).numpy().tobytes() == part.tobytes()


@pytest.mark.parametrize("args, said", [
    (("1e", 2), "over must name the source placeholder"),
    (("e", 0), "count must be an int >= 1"),
    (("e", 2, 0.5), "axis must be an int"),
])
def test_stack_refuses_bad_arguments(args, said):
    with pytest.raises(errors.InvalidArgumentError, match=said):
        Stack(*args)


def test_stack_refuses_the_wrong_number_of_parts_and_an_axis_outside_the_value():
    with pytest.raises(errors.InvalidArgumentError, match="stacks 3 parts but received 2"):
        Stack("e", 3)([np.zeros(2), np.zeros(2)])
    with pytest.raises(errors.InvalidArgumentError, match="stacks along axis 3, but its parts "
                                                          "have 1 axes"):
        Stack("e", 3, axis=3).output_shape((2,))
    with pytest.raises(errors.InvalidArgumentError, match="takes part 4 along axis 0"):
        Unstack(0, 4).output_shape((3, 2))


def test_a_stack_alone_has_no_inverse_export_unstacks_it():
    with pytest.raises(errors.InvalidArgumentError, match="its inverse is 3 transforms"):
        Stack("e", 3).inverse()
    with pytest.raises(errors.InvalidArgumentError, match="no inverse on its own"):
        Unstack(0, 1).inverse()


# --- rules ------------------------------------------------------------------------------------

def test_only_a_stack_placeholder_may_be_in_the_source_alone():
    Rule("x.{e}.w", "bank", Stack("e", 2))  # accepted: {e} is the Stack's
    with pytest.raises(errors.InvalidArgumentError, match=r"placeholder\(s\) \{e\} appear in "
                                                          "the source only"):
        Rule("x.{e}.w", "bank", Transpose())
    with pytest.raises(errors.InvalidArgumentError, match=r"\{k\} must appear in the source "
                                                          "and not in the target"):
        Rule("x.{e}.w", "bank", Stack("k", 2))
    with pytest.raises(errors.InvalidArgumentError, match=r"\{e\} must appear in the source "
                                                          "and not in the target"):
        Rule("x.{e}.w", "bank/{e}", Stack("e", 2))


def test_export_names_gives_every_entry_of_a_stack_in_index_order():
    rules = RuleSet([Rule("layers.{i}.experts.{e}.w", "layer_{i}/bank",
                          Chain(Transpose(), Stack("e", 3))),
                     Rule("layers.{i}.norm", "layer_{i}/norm")])
    names, rule = rules.export_names("layer_1/bank")
    assert rule is rules[0]
    assert [n for n, _ in names] == [f"layers.1.experts.{e}.w" for e in range(3)]
    assert [t for _, t in names] == [Chain(Unstack(0, e), Transpose()) for e in range(3)]
    assert rules.export_names("layer_1/norm") == ([("layers.1.norm", None)], rules[1])
    assert rules.export_name("layer_1/norm") == ("layers.1.norm", None, rules[1])
    assert rules.export_names("layer_1/other") is None
    assert rules[0].source_name("layer_1/bank") == "layers.1.experts.{e}.w"  # the pattern
    assert rules[0].source_name("layer_1/bank", e="2") == "layers.1.experts.2.w"
    with pytest.raises(errors.InvalidArgumentError, match="as 3 entries"):
        rules.export_name("layer_1/bank")


# --- restore and export, every flavour --------------------------------------------------------

@pytest.mark.parametrize("flavour", flavours.FLAVOURS)
def test_per_expert_entries_restore_into_one_bank_and_export_back(flavour, tmp_path):
    obj, arrays = _moe(flavour), _arrays()
    source = _write(arrays, tmp_path / "moe.safetensors")
    the_plan = objckpt.plan(obj, source, rules=MOE)
    assert the_plan.complete, the_plan.describe()
    by_target = {m.target: m for m in the_plan.matches}
    assert by_target["experts"].source == "moe.experts.{0..2}.w1.weight"
    assert by_target["experts"].transform is None  # the value read is the stacked one
    shown = the_plan.describe()
    assert ("3 source entries made into 1 variable(s) by Stack or Concat rules (a braced key "
            "stands for its entries, ` + ` joins parts): `moe.experts.{0..2}.w1.weight` -> "
            "`experts`") in shown
    report = objckpt.restore(obj, source, rules=MOE)
    assert sorted(report.restored) == ["experts", "gate"]
    assert not report.unexpected and not report.missing
    got = _values(obj)
    want = np.stack([arrays[f"moe.experts.{e}.w1.weight"].T for e in range(EXPERTS)])
    assert got["experts"].tobytes() == want.tobytes()
    assert got["gate"].tobytes() == arrays["moe.gate.weight"].T.copy().tobytes()
    out = objckpt.export(obj, tmp_path / "out" / "model.safetensors", rules=MOE)
    with open(out, "rb") as a, open(source, "rb") as b:
        assert a.read() == b.read()  # the reference writer's bytes for the same tensors


def _refused(obj, source, said: str, strict: bool = True):
    before = _values(obj)
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(obj, source, rules=MOE, strict=strict)
    assert said in str(info.value), str(info.value)
    after = _values(obj)
    assert all(after[k].tobytes() == before[k].tobytes() for k in before)  # nothing changed
    return str(info.value)


@pytest.mark.parametrize("strict", [True, False])
def test_a_missing_expert_is_refused_by_name_and_nothing_changes(strict, tmp_path):
    obj, arrays = _moe("module"), _arrays()
    obj.gate.assign(tf.ones((HID, EXPERTS)))
    del arrays["moe.experts.1.w1.weight"]
    source = _write(arrays, tmp_path / "moe.safetensors")
    said = _refused(obj, source, "the source lacks 1 of its 3 entries: "
                                 "`moe.experts.1.w1.weight`", strict)
    assert "`experts`" in said
    the_plan = objckpt.plan(obj, source, rules=MOE)
    assert any("moe.experts.1.w1.weight" in m for m in the_plan.mismatched)


def test_parts_of_different_shapes_or_an_index_out_of_range_are_refused(tmp_path):
    obj = _moe("module")
    arrays = _arrays()
    arrays["moe.experts.2.w1.weight"] = np.zeros((INNER + 1, HID), np.float32)
    _refused(obj, _write(arrays, tmp_path / "shape.safetensors"),
             "entry `moe.experts.2.w1.weight` is float32(6, 4) but "
             "`moe.experts.0.w1.weight` is float32(5, 4)")
    arrays = _arrays()
    arrays["moe.experts.3.w1.weight"] = arrays["moe.experts.0.w1.weight"]
    arrays["moe.experts.01.w1.weight"] = arrays["moe.experts.0.w1.weight"]
    said = _refused(obj, _write(arrays, tmp_path / "range.safetensors"),
                    "entry `moe.experts.3.w1.weight` has {e} = `3`, not an index in 0..2")
    assert "entry `moe.experts.01.w1.weight` has {e} = `01`" in said


def test_a_stacked_shape_the_variable_lacks_is_a_mismatch(tmp_path):
    obj = _moe("module")
    rules = RuleSet([Rule("moe.experts.{e}.w1.weight", "experts", Stack("e", EXPERTS)),
                     MOE[1]])  # no Transpose: (3, INNER, HID), the obj has (3, HID, INNER)
    source = _write(_arrays(), tmp_path / "moe.safetensors")
    with pytest.raises(errors.StructureMismatchError, match=r"shape \(3, 5, 4\) in the source "
                                                            r"but \(3, 4, 5\) in the obj"):
        objckpt.restore(obj, source, rules=rules)


def test_a_per_entry_transform_runs_before_the_stack(tmp_path):
    """Each entry reshaped, then stacked along the last axis; export reverses both."""
    obj = tf.Module()
    obj.bank = tf.Variable(tf.zeros((2, 2, EXPERTS)))
    rng = np.random.default_rng(3)
    arrays = {f"w.{e}": rng.standard_normal((4,)).astype(np.float32) for e in range(EXPERTS)}
    rules = RuleSet([Rule("w.{e}", "bank", Chain(Reshape((4,), (2, 2)),
                                                Stack("e", EXPERTS, axis=-1)))])
    source = _write(arrays, tmp_path / "w.safetensors")
    objckpt.restore(obj, source, rules=rules)
    want = np.stack([arrays[f"w.{e}"].reshape(2, 2) for e in range(EXPERTS)], axis=-1)
    assert obj.bank.numpy().tobytes() == want.tobytes()
    out = objckpt.export(obj, tmp_path / "out.safetensors", rules=rules)
    with open(out, "rb") as a, open(source, "rb") as b:
        assert a.read() == b.read()


def test_restore_on_create_refuses_a_stack_rule_by_name(tmp_path):
    source = _write(_arrays(), tmp_path / "moe.safetensors")
    with pytest.raises(errors.InvalidArgumentError, match=r"makes one variable of several "
                                                          r"source entries.*restore_on_create"):
        objckpt.restore_on_create(_moe("module"), source, rules=MOE)


@pytest.mark.parametrize("operation", ["migrate", "load_ensemble"])
def test_migrate_and_ensembles_stack_the_entries_too(operation, tmp_path):
    arrays = _arrays(4)
    source = _write(arrays, tmp_path / "moe.safetensors")
    want = np.stack([arrays[f"moe.experts.{e}.w1.weight"].T for e in range(EXPERTS)])
    if operation == "migrate":
        prefix = objckpt.migrate(_moe("module"), source, str(tmp_path / "ckpt" / "moe"),
                                 rules=MOE)
        objs = [_moe("module")]
        objckpt.restore(objs[0], prefix)
    else:
        objs = objckpt.load_ensemble(_moe("module"), [source, source], rules=MOE).members
    for obj in objs:
        assert objckpt.tree(obj)["experts"].numpy().tobytes() == want.tobytes()


def test_bfloat16_entries_stack_and_widen_as_the_casting_policy_says(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arrays = {k: v.astype(ml_dtypes.bfloat16) for k, v in _arrays(5).items()}
    source = _write(arrays, tmp_path / "moe.safetensors")
    obj = _moe("module")
    assert objckpt.plan(obj, source, rules=MOE).casts == {
        "experts": "bfloat16 -> float32", "gate": "bfloat16 -> float32"}
    objckpt.restore(obj, source, rules=MOE)
    want = np.stack([arrays[f"moe.experts.{e}.w1.weight"].astype(np.float32).T
                     for e in range(EXPERTS)])
    assert obj.experts.numpy().tobytes() == want.tobytes()


# --- Concat: several rules' entries, one variable ---------------------------------------------

# Qwen MoE's layout in keras-hub: per expert, gate_proj and up_proj (INNER, HID) transposed and
# joined along the last axis, the experts stacked: one (EXPERTS, HID, 2 * INNER) bank.
GATE_UP = RuleSet([
    Rule("mlp.experts.{e}.gate_proj.weight", "gate_up",
         Chain(Transpose(), Stack("e", EXPERTS), Concat(-1, parts=2, index=0))),
    Rule("mlp.experts.{e}.up_proj.weight", "gate_up",
         Chain(Transpose(), Stack("e", EXPERTS), Concat(-1, parts=2, index=1))),
])


def _gate_up_arrays(seed: int = 6) -> dict:
    rng = np.random.default_rng(seed)
    out = {f"mlp.experts.{e}.{name}.weight": rng.standard_normal((INNER, HID)).astype(np.float32)
           for e in range(EXPERTS) for name in ("gate_proj", "up_proj")}
    return out


def test_concat_and_stack_make_qwen_moes_gate_up_bank_and_export_it_back(tmp_path):
    obj = tf.Module()
    obj.gate_up = tf.Variable(tf.zeros((EXPERTS, HID, 2 * INNER)))
    arrays = _gate_up_arrays()
    source = _write(arrays, tmp_path / "moe.safetensors")
    rules = GATE_UP
    the_plan = objckpt.plan(obj, source, rules=rules)
    assert the_plan.complete, the_plan.describe()
    assert [m.source for m in the_plan.matches] == [
        "mlp.experts.{0..2}.gate_proj.weight + mlp.experts.{0..2}.up_proj.weight"]
    objckpt.restore(obj, source, rules=rules)
    # keras-hub's convert_qwen_moe.py, in NumPy
    want = np.stack([np.concatenate([arrays[f"mlp.experts.{e}.gate_proj.weight"].T,
                                     arrays[f"mlp.experts.{e}.up_proj.weight"].T], axis=-1)
                     for e in range(EXPERTS)])
    assert obj.gate_up.numpy().tobytes() == want.tobytes()
    out = objckpt.export(obj, tmp_path / "out.safetensors", rules=rules)
    with open(out, "rb") as a, open(source, "rb") as b:
        assert a.read() == b.read()


def test_concat_alone_fuses_entries_of_given_sizes_both_ways(tmp_path):
    obj = tf.Module()
    obj.qkv = tf.Variable(tf.zeros((HID, HID + 4)))
    rng = np.random.default_rng(7)
    arrays = {"attn.q.weight": rng.standard_normal((HID, HID)).astype(np.float32),
              "attn.k.weight": rng.standard_normal((2, HID)).astype(np.float32),
              "attn.v.weight": rng.standard_normal((2, HID)).astype(np.float32)}
    rules = RuleSet([Rule(f"attn.{n}.weight", "qkv",
                          Chain(Transpose(), Concat(-1, sizes=(HID, 2, 2), index=i)))
                     for i, n in enumerate("qkv")])
    source = _write(arrays, tmp_path / "qkv.safetensors")
    objckpt.restore(obj, source, rules=rules)
    want = np.concatenate([arrays[f"attn.{n}.weight"].T for n in "qkv"], axis=-1)
    assert obj.qkv.numpy().tobytes() == want.tobytes()
    out = objckpt.export(obj, tmp_path / "out.safetensors", rules=rules)
    with open(out, "rb") as a, open(source, "rb") as b:
        assert a.read() == b.read()
    del arrays["attn.v.weight"]
    before = obj.qkv.numpy().tobytes()
    with pytest.raises(errors.StructureMismatchError, match=r"no entry gives part 2 of 3 \(the "
                                                            r"source lacks what rule 2"), \
            pytest.warns(UserWarning, match=r"matched no key .* rule 2 "):
        objckpt.restore(obj, _write(arrays, tmp_path / "qk.safetensors"), rules=rules)
    assert obj.qkv.numpy().tobytes() == before


def test_concat_validates_its_cut_and_has_the_split_as_inverse():
    with pytest.raises(errors.InvalidArgumentError, match="index must be an int in 0..1"):
        Concat(-1, parts=2, index=2)
    assert Concat(-1, parts=2, index=1).inverse() == Split(-1, parts=2, index=1)
    assert Concat(0, sizes=(2, 3), index=1).output_shape((3, 4)) == (5, 4)
    with pytest.raises(errors.InvalidArgumentError, match="part 1 has 4 along axis 0, not 3"):
        Concat(0, sizes=(2, 3), index=1).output_shape((4, 4))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_group_is_assembled_in_the_tensor_it_is_read_as(dtype, monkeypatch, tmp_path):
    """float32: each part is copied into the tensor TF allocated, which is the value read
    (no second copy of the stacked tensor); bfloat16 (no Empty kernel): a NumPy buffer,
    converted once."""
    from objckpt._planning import stacking as _stacking

    ml_dtypes = pytest.importorskip("ml_dtypes")
    made = []
    real = _stacking._empty

    def spy(shape, kind):
        out = real(shape, kind)
        made.append(out[0])
        return out

    monkeypatch.setattr(_stacking, "_empty", spy)
    arrays = _arrays(8)
    if dtype == "bfloat16":
        arrays = {k: v.astype(ml_dtypes.bfloat16) for k, v in arrays.items()}
    source = _write(arrays, tmp_path / "moe.safetensors")
    the_plan = objckpt.plan(_moe("module"), source, rules=MOE)
    (value,) = the_plan.fetch(["moe.experts.{0..2}.w1.weight"])
    want = np.stack([arrays[f"moe.experts.{e}.w1.weight"].T for e in range(EXPERTS)])
    assert np.asarray(value.numpy()).tobytes() == want.tobytes()
    assert len(made) == 1 and (made[0] is value if dtype == "float32" else made[0] is None)
