"""keras-hub backbones (small configs, random weights): every weight covered.

Transformers keep their blocks in Python lists, which TF's own object graph does not
follow in Keras 3; clone, Twins, snapshot, restore and save must cover 100% of
`model.weights` anyway. Runs where keras-hub is installed (the keras3 nox session).
"""

import numpy as np
import pytest

import objckpt

keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed here")
keras = pytest.importorskip("keras")

SMALL = dict(num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32)
BACKBONES = {
    "vit": lambda: keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
        mlp_dim=32),
    "bert": lambda: keras_hub.models.BertBackbone(
        vocabulary_size=50, max_sequence_length=16, **SMALL),
    "gpt2": lambda: keras_hub.models.GPT2Backbone(
        vocabulary_size=50, max_sequence_length=16, **SMALL),
    "t5": lambda: keras_hub.models.T5Backbone(
        vocabulary_size=50, key_value_dim=8, **SMALL),
    "resnet": lambda: keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 16],
        stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type="basic_block",
        image_shape=(32, 32, 3)),
}


def inputs(model):
    rng = np.random.default_rng(0)
    out = {}
    for tensor in model.inputs:
        name = tensor.name.split(":")[0]
        shape = [2 if d is None else d for d in tensor.shape]
        if "token_ids" in name or "segment_ids" in name:
            shape[1] = shape[1] or 8
            out[name] = rng.integers(0, 2 if "segment" in name else 50, size=shape)
        elif "mask" in name:
            shape[1] = shape[1] or 8
            out[name] = np.ones(shape, "int32")
        else:
            out[name] = rng.normal(size=shape).astype("float32")
    return out if len(out) > 1 else next(iter(out.values()))


def outputs(model, x):
    result = model(x)
    flat = result.values() if isinstance(result, dict) else [result]
    return [np.asarray(r) for r in flat]


def make(name, seed):
    keras.utils.set_random_seed(seed)
    return BACKBONES[name]()


def inner_ids(variables):
    return {id(objckpt._compat.as_variable(v)) for v in variables}


@pytest.fixture(scope="module", params=sorted(BACKBONES))
def pair(request):
    return request.param, make(request.param, 0), make(request.param, 1)


def test_tree_and_snapshot_cover_every_weight(pair):
    _, a, _ = pair
    variables = objckpt.tree(a)
    assert inner_ids(a.weights) <= {id(v) for v in variables.values()}
    assert inner_ids(a.variables) == {id(v) for v in variables.values()}
    assert set(objckpt.snapshot(a)) == set(variables)


def test_restore_save_twins_clone_make_outputs_equal(pair, tmp_path):
    name, a, b = pair
    x = inputs(a)
    want = outputs(a, x)
    assert any(np.abs(w - g).max() > 1e-4 for w, g in zip(want, outputs(b, x)))

    twins = objckpt.Twins(a, past=b)
    twins.sync()
    for w, g in zip(want, outputs(b, x)):
        np.testing.assert_array_equal(g, w)

    c = make(name, 2)
    objckpt.restore(c, objckpt.save(a, tmp_path / "ckpt"))
    for w, g in zip(want, outputs(c, x)):
        np.testing.assert_array_equal(g, w)

    d = make(name, 3)
    report = objckpt.restore(d, objckpt.snapshot(a))
    assert len(report.restored) == len(objckpt.tree(d))
    for w, g in zip(want, outputs(d, x)):
        np.testing.assert_array_equal(g, w)

    copy = objckpt.clone(a)
    assert not inner_ids(copy.weights) & inner_ids(a.weights)
    for w, g in zip(want, outputs(copy, x)):
        np.testing.assert_array_equal(g, w)


def test_every_door_takes_a_hugging_face_folder_without_rules(tmp_path):
    """A keras-hub model and a Hugging Face folder: plan, restore, restore_on_create,
    load_ensemble and migrate use the set its config.json names (their notes say which),
    so each gives what restore with that set gives, bit for bit."""
    import json

    config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 50,
              "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 32, "max_position_embeddings": 16, "type_vocab_size": 2}
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    published = make("bert", seed=1)
    rng = np.random.default_rng(1)
    for variable in published.weights:
        variable.assign(rng.normal(size=variable.shape).astype(np.float32))
    objckpt.export(published, str(folder), rules=objckpt.rules.huggingface(str(folder)))
    want = {p: v.numpy().tobytes() for p, v in objckpt.tree(published).items()
            if "seed_generator" not in p}

    def values(model):
        return {p: v.numpy().tobytes() for p, v in objckpt.tree(model).items()
                if "seed_generator" not in p}

    note = "objckpt.rules.huggingface('bert'), chosen by the folder's config.json (BertModel)"
    assert any(note in n for n in objckpt.plan(make("bert", seed=2), str(folder)).notes)
    restored = make("bert", seed=2)
    assert any(note in n for n in objckpt.restore(restored, str(folder)).notes)
    assert values(restored) == want
    # a file inside the folder chooses the same set
    from_file = make("bert", seed=3)
    objckpt.restore(from_file, str(folder / "model.safetensors"))
    assert values(from_file) == want

    ensemble = objckpt.load_ensemble(make("bert", seed=4), [str(folder), str(folder)])
    assert [values(member) for member in ensemble.members] == [want, want]

    prefix = objckpt.migrate(make("bert", seed=5), str(folder), str(tmp_path / "ckpt" / "c"))
    migrated = make("bert", seed=6)
    objckpt.restore(migrated, prefix)
    assert values(migrated) == want

    deferred = make("bert", seed=7)
    objckpt.restore_on_create(deferred, str(folder)).assert_done()
    assert values(deferred) == want
