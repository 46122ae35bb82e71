"""Hugging Face rule sets for BERT, GPT-2 and ViT, against keras-hub.

keras-hub's own Hugging Face importers (`XBackbone.from_preset(folder)`, which reads a local
folder of `config.json` + `model.safetensors` through `convert_<model>.py`) and its GPT-2
exporter (`export_backbone`) are the oracle: objckpt's export must be what the importer
reads, objckpt's restore must give what the importer gives, and what keras-hub's exporter
writes must restore through the same rule set. Tiny random configs; the keras-hub tests run
where keras-hub is installed (the Keras 3 session), the sets themselves everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Transpose, huggingface

from support import bits, config_folder

# Each set lists alternative names (prefixed or not, LayerNorm weight or gamma) of which a
# file holds one (RuleSet(alternatives=True)): the rules a file does not use are expected and
# never warned about; such a warning fails these tests.
pytestmark = pytest.mark.filterwarnings("error:.*rule\\(s\\) matched no key")

HIDDEN, HEADS, LAYERS, VOCAB, POSITIONS = 16, 2, 2, 64, 32

BERT = {
    "architectures": ["BertModel"], "model_type": "bert", "vocab_size": VOCAB,
    "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
    "intermediate_size": 32, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": POSITIONS,
    "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
    "pad_token_id": 0, "position_embedding_type": "absolute", "torch_dtype": "float32",
}
GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": VOCAB,
    "n_positions": POSITIONS, "n_embd": HIDDEN, "n_layer": LAYERS, "n_head": HEADS,
    "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1,
    "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-05,
    "initializer_range": 0.02, "bos_token_id": 50256, "eos_token_id": 50256,
    "torch_dtype": "float32",
}
VIT = {
    "architectures": ["ViTModel"], "model_type": "vit", "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": 32,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "image_size": 16, "patch_size": 4,
    "num_channels": 3, "qkv_bias": True, "encoder_stride": 4, "torch_dtype": "float32",
}
CONFIGS = {"bert": BERT, "gpt2": GPT2, "vit": VIT}
HAS_GPT2 = "gpt2" in objckpt.rules.supported()  # its fused c_attn needs rules.Split
SETS = [name for name in CONFIGS if name != "gpt2" or HAS_GPT2]


# --- the sets themselves (no keras-hub) -------------------------------------------------------

@pytest.mark.parametrize("name", SETS)
def test_folder_chooses_the_set_by_model_type(tmp_path, name):
    config = CONFIGS[name]
    chosen = huggingface(config_folder(tmp_path, config))
    assert list(chosen) == list(huggingface(name, config=config))
    assert list(huggingface(name.upper(), config=config)) == list(chosen)
    assert name in objckpt.rules.supported()
    # a folder of another model type gets that type's set, not this one
    other = next(n for n in SETS if n != name)
    assert list(huggingface(config_folder(tmp_path / "other", CONFIGS[other]))) != list(chosen)


def test_bert_accepts_prefixed_and_old_layer_norm_names_and_exports_bare():
    rules = huggingface("bert", config=BERT)
    sources = [rule.source for rule in rules]
    for name in ("embeddings.LayerNorm.weight", "embeddings.LayerNorm.gamma",
                 "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.beta",
                 "bert.encoder.layer.{i}.attention.self.query.weight", "pooler.dense.weight"):
        assert name in sources
    # export names a variable by the first rule whose target matches: bare, `weight`
    name, inverse, _ = rules.export_name("transformer_layer_1/self_attention_layer_norm/gamma")
    assert (name, inverse) == ("encoder.layer.1.attention.output.LayerNorm.weight", None)
    name, inverse, _ = rules.export_name("transformer_layer_0/self_attention_layer/key/kernel")
    assert name == "encoder.layer.0.attention.self.key.weight"
    assert inverse == Chain(Reshape((HIDDEN, HEADS, HIDDEN // HEADS), (HIDDEN, HIDDEN)),
                            Transpose())


def test_vit_exports_under_vit_prefix_with_conv_and_position_layouts():
    rules = huggingface("vit", config=VIT)
    by_source = {rule.source: rule for rule in rules}
    assert by_source["vit.embeddings.patch_embeddings.projection.weight"].transform == \
        ConvKernel("OIHW", "HWIO")
    assert "embeddings.cls_token" in by_source  # ViTModel's bare names restore too
    name, inverse, _ = rules.export_name(
        "operations/1/position_embedding/embeddings")
    assert name == "vit.embeddings.position_embeddings"
    assert inverse.output_shape((17, HIDDEN)) == (1, 17, HIDDEN)
    name, _, _ = rules.export_name("operations/2/encoder_layers/1/mha/output_dense/kernel")
    assert name == "vit.encoder.layer.1.attention.output.dense.weight"


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("missing", ["hidden", "heads"])
def test_a_config_without_sizes_is_refused(name, missing):
    keys = {"bert": ("hidden_size", "num_attention_heads"),
            "vit": ("hidden_size", "num_attention_heads"), "gpt2": ("n_embd", "n_head")}[name]
    key = keys[0] if missing == "hidden" else keys[1]
    config = {k: v for k, v in CONFIGS[name].items() if k != key}
    with pytest.raises(errors.InvalidArgumentError, match=f"`{key}`.*Fix:"):
        huggingface(name, config=config)
    with pytest.raises(errors.InvalidArgumentError, match=r"divisible.*Fix:"):
        huggingface(name, config={**CONFIGS[name], keys[0]: 15, keys[1]: 2})


# --- against keras-hub ------------------------------------------------------------------------

def _backbone(name: str, config: dict):
    """A keras-hub backbone of `config`'s sizes (as keras-hub's importer reads them)."""
    keras_hub = pytest.importorskip("keras_hub")
    if name == "bert":
        return keras_hub.models.BertBackbone(
            vocabulary_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"], hidden_dim=config["hidden_size"],
            intermediate_dim=config["intermediate_size"],
            max_sequence_length=config["max_position_embeddings"])
    if name == "gpt2":
        return keras_hub.models.GPT2Backbone(
            vocabulary_size=config["vocab_size"], num_layers=config["n_layer"],
            num_heads=config["n_head"], hidden_dim=config["n_embd"],
            intermediate_dim=config.get("n_inner") or 4 * config["n_embd"],
            max_sequence_length=config["n_positions"])
    size, patch = config["image_size"], config["patch_size"]
    return keras_hub.models.ViTBackbone(
        image_shape=(size, size, 3), patch_size=(patch, patch),
        num_layers=config["num_hidden_layers"], num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"], mlp_dim=config["intermediate_size"],
        use_mha_bias=config["qkv_bias"])


def _randomize(backbone, seed: int) -> None:
    """Every weight random (not the initializers' zeros and ones: a swapped gamma/beta or
    bias would show)."""
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        variable.assign((rng.normal(size=variable.shape) * 0.3).astype(variable.dtype))


def _inputs(name: str, config: dict):
    rng = np.random.default_rng(7)
    if name == "vit":
        size = config["image_size"]
        return rng.normal(size=(2, size, size, 3)).astype("float32")
    ids = rng.integers(0, config["vocab_size"], size=(2, 8))
    mask = np.ones((2, 8), "int32")
    mask[1, 6:] = 0
    out = {"token_ids": ids, "padding_mask": mask}
    if name == "bert":
        out["segment_ids"] = (np.arange(8)[None, :] >= 4).astype("int32").repeat(2, 0)
    return out


def _outputs(backbone, name: str, config: dict) -> dict:
    out = backbone(_inputs(name, config))
    return {k: np.asarray(v) for k, v in out.items()} if isinstance(out, dict) else {
        "output": np.asarray(out)}


def _weights(backbone) -> dict:
    """{variable path: bits} of the weights (not the SeedGenerator states)."""
    return {v.path: bits(v.numpy()) for v in backbone.weights}


def _assert_same_outputs(first, second, name, config):
    one, two = _outputs(first, name, config), _outputs(second, name, config)
    assert list(one) == list(two)
    for key in one:
        np.testing.assert_array_equal(one[key], two[key], err_msg=key)


@pytest.mark.parametrize("name", SETS)
def test_export_is_read_by_keras_hubs_own_importer(tmp_path, name):
    """objckpt.export with the set -> keras-hub's `from_preset(folder)` -> the same outputs
    (bit for bit: the same weights through the same layers) and the same weights."""
    from safetensors.numpy import load_file

    keras_hub = pytest.importorskip("keras_hub")
    config = CONFIGS[name]
    original = _backbone(name, config)
    _randomize(original, 1)
    folder = config_folder(tmp_path / name, config)
    objckpt.export(original, folder, rules=huggingface(name, config=config))
    written = load_file(f"{folder}/model.safetensors")  # the safetensors library reads it
    fused = 4 * LAYERS if name == "gpt2" else 0  # query/key/value kernels and biases -> c_attn
    assert len(written) == len(original.weights) - fused  # no SeedGenerator state
    assert all("/" not in key for key in written)
    cls = {"bert": keras_hub.models.BertBackbone, "gpt2": keras_hub.models.GPT2Backbone,
           "vit": keras_hub.models.ViTBackbone}[name]
    imported = cls.from_preset(folder)
    assert _weights(imported) == _weights(original)
    _assert_same_outputs(original, imported, name, config)


def _rename(folder: str, rename) -> None:
    """Rewrites the folder's model.safetensors with renamed keys (the library writes it)."""
    from safetensors.numpy import load_file, save_file

    path = f"{folder}/model.safetensors"
    tensors = load_file(path)
    save_file({rename(k): v for k, v in tensors.items()}, path, metadata={"format": "pt"})


RENAMES = {  # how other Hugging Face models save the same weights
    "bert": ("BertForMaskedLM, gamma/beta", lambda k: "bert." + k.replace(
        "LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")),
    "vit": ("ViTForImageClassification", lambda k: k),  # export writes `vit.`
    "gpt2": ("GPT2LMHeadModel", lambda k: "transformer." + k),
}


@pytest.mark.parametrize("name", SETS)
def test_restore_equals_keras_hubs_own_importer(tmp_path, name):
    """A Hugging Face folder as another model class saves it -> objckpt.restore into a fresh
    backbone gives the weights keras-hub's importer gives, all of them, bit for bit."""
    keras_hub = pytest.importorskip("keras_hub")
    config = CONFIGS[name]
    original = _backbone(name, config)
    _randomize(original, 2)
    folder = config_folder(tmp_path / name, config)
    objckpt.export(original, folder, rules=huggingface(name, config=config))
    _rename(folder, RENAMES[name][1])
    cls = type(original)
    by_keras_hub = cls.from_preset(folder)
    fresh = _backbone(name, config)
    report = objckpt.restore(fresh, folder, rules=huggingface(folder))
    assert len(report.restored) == len(original.weights)
    assert not report.unexpected
    assert _weights(fresh) == _weights(by_keras_hub) == _weights(original)
    _assert_same_outputs(fresh, by_keras_hub, name, config)
    assert keras_hub  # (imported for the skip)


ROUND_TRIPS = {name: (name, CONFIGS[name]) for name in SETS}
ROUND_TRIPS["vit-no-qkv-bias"] = ("vit", {**VIT, "qkv_bias": False})


@pytest.mark.parametrize("case", sorted(ROUND_TRIPS))
def test_round_trip_keras_safetensors_keras_is_exact(tmp_path, case):
    """Keras -> safetensors (Hugging Face names and layouts) -> a fresh Keras backbone: every
    weight bit-equal, and a second export of the restored backbone writes the same bytes."""
    name, config = ROUND_TRIPS[case]
    rules = huggingface(name, config=config)
    original = _backbone(name, config)
    _randomize(original, 3)
    first = objckpt.export(original, tmp_path / "a.safetensors", rules=rules)
    fresh = _backbone(name, config)
    before = _weights(fresh)
    objckpt.restore(fresh, first, rules=rules)
    after = _weights(fresh)
    assert after == _weights(original)
    assert all(after[k] != before[k] for k in after)  # every weight was written
    second = objckpt.export(fresh, tmp_path / "b.safetensors", rules=rules)
    with open(first, "rb") as one, open(second, "rb") as two:
        assert one.read() == two.read()


def test_a_failed_restore_changes_nothing(tmp_path):
    """A BERT file whose query kernel has the wrong shape for the config: typed error, and
    no weight of the backbone changed."""
    from safetensors.numpy import load_file, save_file

    original = _backbone("bert", BERT)
    _randomize(original, 4)
    folder = config_folder(tmp_path / "bert", BERT)
    objckpt.export(original, folder, rules=huggingface("bert", config=BERT))
    path = f"{folder}/model.safetensors"
    tensors = load_file(path)
    tensors["encoder.layer.1.attention.self.query.weight"] = np.zeros((HIDDEN, 8), "float32")
    save_file(tensors, path, metadata={"format": "pt"})
    fresh = _backbone("bert", BERT)
    before = _weights(fresh)
    with pytest.raises(errors.ObjckptError, match="query"):
        objckpt.restore(fresh, folder, rules=huggingface(folder))
    assert _weights(fresh) == before


@pytest.mark.parametrize("name", [n for n in ("bert", "vit") if n in SETS])
def test_bare_names_restore(tmp_path, name):
    """BertModel and ViTModel save their weights without the `bert.` / `vit.` prefix:
    restore takes them (keras-hub's ViT importer does not: see the xfail below)."""
    config = CONFIGS[name]
    original = _backbone(name, config)
    _randomize(original, 5)
    folder = config_folder(tmp_path / name, config)
    objckpt.export(original, folder, rules=huggingface(name, config=config))
    _rename(folder, lambda k: k[len(name) + 1:] if k.startswith(name + ".") else k)
    fresh = _backbone(name, config)
    objckpt.restore(fresh, folder, rules=huggingface(folder))
    assert _weights(fresh) == _weights(original)


@pytest.mark.xfail(strict=True, reason="keras-hub 0.32's ViT importer (convert_vit.py) asks "
                   "for `vit.`-prefixed names only: 'File does not contain tensor "
                   "vit.embeddings.patch_embeddings.projection.weight' for a ViTModel's bare "
                   "names")
def test_keras_hubs_vit_importer_reads_bare_names(tmp_path):
    original = _backbone("vit", VIT)
    folder = config_folder(tmp_path / "vit", VIT)
    objckpt.export(original, folder, rules=huggingface("vit", config=VIT))
    _rename(folder, lambda k: k[len("vit."):])
    type(original).from_preset(folder)


def _keras_hub_export(backbone, folder: str) -> None:
    """keras-hub's own exporter to a Hugging Face folder (GPT-2 is the one of the three it
    has: keras_hub/src/utils/transformers/export/gpt2.py)."""
    pytest.importorskip("keras_hub")
    from keras_hub.src.utils.transformers.export.hf_exporter import export_backbone

    export_backbone(backbone, folder)


@pytest.mark.skipif(not HAS_GPT2, reason="no GPT-2 rule set (objckpt.rules.Split)")
@pytest.mark.parametrize("intermediate", [4 * HIDDEN, 2 * HIDDEN])
def test_keras_hubs_gpt2_export_restores_through_the_set(tmp_path, intermediate):
    """keras-hub's exporter (`transformer.`-prefixed names, fused c_attn) -> objckpt.restore
    with the set chosen by the folder's config.json -> the original's weights and outputs;
    and objckpt's export of the same backbone holds the same tensors, byte for byte (names
    bare). An MLP width other than 4 * n_embd restores too (keras-hub's importer cannot
    read it back: see the xfail below)."""
    from safetensors.numpy import load_file

    config = {**GPT2, "n_inner": intermediate}
    original = _backbone("gpt2", config)
    _randomize(original, 6)
    folder = str(tmp_path / "keras_hub")
    _keras_hub_export(original, folder)
    fresh = _backbone("gpt2", config)
    report = objckpt.restore(fresh, folder, rules=huggingface(folder))
    assert len(report.restored) == len(original.weights) and not report.unexpected
    assert _weights(fresh) == _weights(original)
    _assert_same_outputs(fresh, original, "gpt2", config)
    theirs = load_file(f"{folder}/model.safetensors")
    ours = load_file(objckpt.export(original, tmp_path / "ours.safetensors",
                                    rules=huggingface(folder)))
    assert {"transformer." + k for k in ours} == set(theirs)
    assert all(bits(ours[k]) == bits(theirs["transformer." + k]) for k in ours)


@pytest.mark.skipif(not HAS_GPT2, reason="no GPT-2 rule set (objckpt.rules.Split)")
@pytest.mark.xfail(strict=True, reason="keras-hub 0.32's GPT-2 importer sizes the MLP as 4 * "
                   "n_embd, ignoring the n_inner its own exporter writes: 'cannot reshape "
                   "array of size 512 into shape (16,64)'")
def test_keras_hubs_gpt2_importer_reads_its_own_export_of_another_mlp_width(tmp_path):
    original = _backbone("gpt2", {**GPT2, "n_inner": 2 * HIDDEN})
    folder = str(tmp_path / "keras_hub")
    _keras_hub_export(original, folder)
    type(original).from_preset(folder)
