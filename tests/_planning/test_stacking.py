"""Many entries into one variable (`_planning.stacking`), on a real keras-hub model.

A tiny `MixtralBackbone` is restored from a folder in transformers' layout (one entry per
expert, `model.layers.0.block_sparse_moe.experts.1.w1.weight`), written here with NumPy and
the `safetensors` library. The oracle is keras-hub's own importer, `from_preset` on the same
folder (offline: a local folder): every variable bit-equal, on the fetched route and on the
streamed one (each stacked variable assembled one part at a time). Export writes the same
entries back, byte-equal.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt._bundle import fastio as _fastio
from objckpt._planning import stacking as _stacking
from objckpt.rules import Chain, Concat, Reshape, Rule, RuleSet, Stack, Transpose

keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed here")
keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3"):
    pytest.skip("keras-hub's models need Keras 3", allow_module_level=True)
safetensors_numpy = pytest.importorskip("safetensors.numpy")

VOCAB, LAYERS, HEADS, KV, HIDDEN, INNER, EXPERTS, HEAD_DIM = 11, 2, 2, 1, 8, 6, 3, 4
CONFIG = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
          "vocab_size": VOCAB, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
          "hidden_size": HIDDEN, "intermediate_size": INNER, "num_key_value_heads": KV,
          "num_local_experts": EXPERTS, "num_experts_per_tok": 2, "rope_theta": 10000.0,
          "rms_norm_eps": 1e-5, "sliding_window": 16, "output_router_logits": False,
          "tie_word_embeddings": False}
EXPERT_WEIGHTS = (("w1", "gate_dense", (INNER, HIDDEN)), ("w3", "intermediate_dense",
                                                          (INNER, HIDDEN)),
                  ("w2", "output_dense", (HIDDEN, INNER)))


def _entries(seed: int = 0) -> dict:
    """Every entry of a MixtralForCausalLM of the config above, random."""
    rng = np.random.default_rng(seed)

    def weight(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    out = {"model.embed_tokens.weight": weight(VOCAB, HIDDEN),
           "lm_head.weight": weight(VOCAB, HIDDEN), "model.norm.weight": weight(HIDDEN)}
    for i in range(LAYERS):
        layer = f"model.layers.{i}."
        out[layer + "input_layernorm.weight"] = weight(HIDDEN)
        out[layer + "post_attention_layernorm.weight"] = weight(HIDDEN)
        out[layer + "self_attn.q_proj.weight"] = weight(HEADS * HEAD_DIM, HIDDEN)
        out[layer + "self_attn.k_proj.weight"] = weight(KV * HEAD_DIM, HIDDEN)
        out[layer + "self_attn.v_proj.weight"] = weight(KV * HEAD_DIM, HIDDEN)
        out[layer + "self_attn.o_proj.weight"] = weight(HIDDEN, HEADS * HEAD_DIM)
        out[layer + "block_sparse_moe.gate.weight"] = weight(EXPERTS, HIDDEN)
        for e in range(EXPERTS):
            for name, _, shape in EXPERT_WEIGHTS:
                out[layer + f"block_sparse_moe.experts.{e}.{name}.weight"] = weight(*shape)
    return out


def _folder(tmp_path, entries: dict) -> str:
    folder = tmp_path / "mixtral"
    folder.mkdir()
    safetensors_numpy.save_file(entries, str(folder / "model.safetensors"),
                                metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return str(folder)


def _backbone():
    return keras_hub.models.MixtralBackbone(
        vocabulary_size=VOCAB, num_layers=LAYERS, num_query_heads=HEADS, hidden_dim=HIDDEN,
        intermediate_dim=INNER, num_key_value_heads=KV, num_experts=EXPERTS, top_k=2,
        sliding_window=16)


def _rules(backbone) -> RuleSet:
    """transformers' Mixtral names <-> the backbone's, as keras-hub's `convert_mixtral.py`
    reads them. Keras names each layer's MoE block uniquely (`mixtral_sparse_moe_block_1`),
    so its rules are written per layer from the backbone's own names."""
    layer = "transformer_layer_{i}"

    def heads(n):
        return Chain(Transpose(), Reshape((HIDDEN, n * HEAD_DIM), (HIDDEN, n, HEAD_DIM)))

    rules = [
        Rule("model.embed_tokens.weight", "token_embedding/embeddings"),
        Rule("lm_head.weight", "token_embedding/reverse_embeddings", Transpose()),
        Rule("model.norm.weight", "sequence_output_layernorm/scale"),
        Rule("model.layers.{i}.input_layernorm.weight", f"{layer}/self_attention_layernorm/scale"),
        Rule("model.layers.{i}.post_attention_layernorm.weight",
             f"{layer}/feedforward_layernorm/scale"),
        Rule("model.layers.{i}.self_attn.q_proj.weight", f"{layer}/self_attention/query/kernel",
             heads(HEADS)),
        Rule("model.layers.{i}.self_attn.k_proj.weight", f"{layer}/self_attention/key/kernel",
             heads(KV)),
        Rule("model.layers.{i}.self_attn.v_proj.weight", f"{layer}/self_attention/value/kernel",
             heads(KV)),
        Rule("model.layers.{i}.self_attn.o_proj.weight",
             f"{layer}/self_attention/attention_output/kernel",
             Chain(Transpose(), Reshape((HEADS * HEAD_DIM, HIDDEN), (HEADS, HEAD_DIM, HIDDEN)))),
    ]
    for i in range(LAYERS):
        block = (f"transformer_layer_{i}/"
                 + backbone.get_layer(f"transformer_layer_{i}")._sparse_moe_block.name)
        source = f"model.layers.{i}.block_sparse_moe"
        rules.append(Rule(f"{source}.gate.weight",
                          f"{block}/sparse_feedforward_gate_dense/kernel", Transpose()))
        rules += [Rule(f"{source}.experts.{{e}}.{name}.weight",
                       f"{block}/experts/expert_feedforward_{bank}",
                       Chain(Transpose(), Stack("e", EXPERTS)))
                  for name, bank, _ in EXPERT_WEIGHTS]
    return RuleSet(rules)


@pytest.fixture(name="restored")
def _restored(tmp_path):
    """(backbone, rules, folder, entries, oracle): the backbone built first (its layers get
    the plain names), then keras-hub's own import of the same folder."""
    keras.backend.clear_session()
    backbone, entries = _backbone(), _entries()
    folder = _folder(tmp_path, entries)
    oracle = keras_hub.models.MixtralBackbone.from_preset(folder)
    return backbone, _rules(backbone), folder, entries, oracle


def _assert_bit_equal(backbone, oracle):
    assert len(backbone.weights) == len(oracle.weights)
    for got, want in zip(backbone.weights, oracle.weights):
        assert got.shape == want.shape, got.path
        assert np.asarray(got.numpy()).tobytes() == np.asarray(want.numpy()).tobytes(), got.path


def test_mixtral_experts_restore_as_keras_hubs_importer_and_export_back(restored, tmp_path):
    backbone, rules, folder, entries, oracle = restored
    the_plan = objckpt.plan(backbone, folder + "/model.safetensors", rules=rules)
    assert the_plan.complete, the_plan.describe()
    stacked = [m for m in the_plan.matches if "{0..2}" in m.source]
    assert len(stacked) == 3 * LAYERS  # one match per expert bank, its entries braced
    assert {m.source for m in stacked} == {
        f"model.layers.{i}.block_sparse_moe.experts.{{0..2}}.{name}.weight"
        for i in range(LAYERS) for name, _, _ in EXPERT_WEIGHTS}
    assert (f"{3 * EXPERTS * LAYERS} source entries made into {3 * LAYERS} variable(s) "
            "by Stack or Concat rules") in the_plan.describe()
    report = objckpt.restore(backbone, folder + "/model.safetensors", rules=rules)
    assert len(report.restored) == len(backbone.weights)
    assert not report.unexpected and not report.missing
    _assert_bit_equal(backbone, oracle)
    out = objckpt.export(backbone, tmp_path / "out" / "model.safetensors", rules=rules)
    written = safetensors_numpy.load_file(out)
    assert set(written) == set(entries)
    for name, array in entries.items():
        assert written[name].dtype == array.dtype and written[name].tobytes() == array.tobytes()


def test_the_streamed_route_assembles_each_bank_one_part_at_a_time(restored, monkeypatch):
    backbone, rules, folder, _, oracle = restored
    monkeypatch.setattr(_fastio, "STREAM_BYTES", 0)  # streamed whenever it can be
    held, assembled = [], []
    real_fetch = _stacking._assembled

    def spy(source, group):
        fetch = source.fetch

        def one_at_a_time(keys):
            held.append(len(keys))
            return fetch(keys)

        value = real_fetch(type(source)(**{**source.__dict__, "fetch": one_at_a_time}), group)
        assembled.append(group.full)
        return value

    streamed = []
    real_assign = _stacking._StackLoader.assign

    def assign(loader):
        streamed.append(len(loader.entries))
        real_assign(loader)

    monkeypatch.setattr(_stacking, "_assembled", spy)
    monkeypatch.setattr(_stacking._StackLoader, "assign", assign)
    objckpt.restore(backbone, folder + "/model.safetensors", rules=rules)
    assert streamed == [3 * LAYERS]  # the streamed route's loader assigned every bank
    assert len(assembled) == 3 * LAYERS and held == [1] * (3 * LAYERS * EXPERTS)
    _assert_bit_equal(backbone, oracle)


def test_a_missing_expert_leaves_the_backbone_as_it_was(restored, tmp_path):
    backbone, rules, _, entries, _ = restored
    del entries["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    folder = tmp_path / "lacking"
    folder.mkdir()
    safetensors_numpy.save_file(entries, str(folder / "model.safetensors"),
                                metadata={"format": "pt"})
    before = [np.asarray(w.numpy()).tobytes() for w in backbone.weights]
    with pytest.raises(errors.StructureMismatchError) as info:
        objckpt.restore(backbone, str(folder / "model.safetensors"), rules=rules)
    said = str(info.value)
    assert ("the source lacks 1 of its 3 entries: "
            "`model.layers.1.block_sparse_moe.experts.2.w3.weight`") in said
    assert "expert_feedforward_intermediate_dense" in said
    assert [np.asarray(w.numpy()).tobytes() for w in backbone.weights] == before


# --- Qwen3 MoE: per expert, gate and up joined, then stacked -----------------------------------

QWEN = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "head_dim": HEAD_DIM, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "intermediate_size": INNER,
        "moe_intermediate_size": 5, "num_experts": EXPERTS, "num_experts_per_tok": 2,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "sliding_window": None, "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False, "mlp_only_layers": []}


def _qwen_entries(seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    moe = QWEN["moe_intermediate_size"]

    def weight(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    out = {"model.embed_tokens.weight": weight(VOCAB, HIDDEN),
           "lm_head.weight": weight(VOCAB, HIDDEN), "model.norm.weight": weight(HIDDEN)}
    for i in range(LAYERS):
        layer = f"model.layers.{i}."
        for name, shape in (("input_layernorm", (HIDDEN,)),
                            ("post_attention_layernorm", (HIDDEN,)),
                            ("self_attn.q_proj", (HEADS * HEAD_DIM, HIDDEN)),
                            ("self_attn.k_proj", (KV * HEAD_DIM, HIDDEN)),
                            ("self_attn.v_proj", (KV * HEAD_DIM, HIDDEN)),
                            ("self_attn.o_proj", (HIDDEN, HEADS * HEAD_DIM)),
                            ("self_attn.q_norm", (HEAD_DIM,)), ("self_attn.k_norm", (HEAD_DIM,)),
                            ("mlp.gate", (EXPERTS, HIDDEN))):
            out[f"{layer}{name}.weight"] = weight(*shape)
        for e in range(EXPERTS):
            for name, shape in (("gate_proj", (moe, HIDDEN)), ("up_proj", (moe, HIDDEN)),
                                ("down_proj", (HIDDEN, moe))):
                out[f"{layer}mlp.experts.{e}.{name}.weight"] = weight(*shape)
    return out


def test_qwen3_moe_gate_up_and_down_banks_as_keras_hubs_importer(tmp_path):
    """The expert banks only (strict=False): Concat of gate and up per expert, then Stack;
    bit-equal to keras-hub's own import of the folder, and exported back byte-equal."""
    keras.backend.clear_session()
    backbone = keras_hub.models.Qwen3MoeBackbone(
        vocabulary_size=VOCAB, hidden_dim=HIDDEN, head_dim=HEAD_DIM, num_layers=LAYERS,
        num_query_heads=HEADS, num_key_value_heads=KV, intermediate_dim=INNER,
        moe_intermediate_dim=QWEN["moe_intermediate_size"], num_experts=EXPERTS, top_k=2,
        norm_top_k_prob=True, decoder_sparse_step=1, layer_norm_epsilon=1e-6,
        rope_max_wavelength=10000, sliding_window_size=None,
        router_aux_loss_coefficient=0.001, tie_word_embeddings=False)
    entries = _qwen_entries()
    folder = tmp_path / "qwen3_moe"
    folder.mkdir()
    safetensors_numpy.save_file(entries, str(folder / "model.safetensors"),
                                metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(QWEN))
    oracle = keras_hub.models.Qwen3MoeBackbone.from_preset(str(folder))
    rules, banks = [], []
    for i in range(LAYERS):
        block = f"transformer_layer_{i}/" + backbone.get_layer(f"transformer_layer_{i}").mlp.name
        experts = f"model.layers.{i}.mlp.experts.{{e}}"
        rules += [Rule(f"{experts}.{name}.weight",
                       f"{block}/experts/expert_feedforward_gate_dense",
                       Chain(Transpose(), Stack("e", EXPERTS), Concat(-1, parts=2, index=k)))
                  for k, name in enumerate(("gate_proj", "up_proj"))]
        rules.append(Rule(f"{experts}.down_proj.weight",
                          f"{block}/experts/expert_feedforward_output_dense",
                          Chain(Transpose(), Stack("e", EXPERTS))))
        banks += [f"{block}/experts/expert_feedforward_{n}" for n in ("gate_dense", "output_dense")]
    rules = RuleSet(rules)
    report = objckpt.restore(backbone, str(folder / "model.safetensors"), rules=rules,
                             strict=False)
    assert len(report.restored) == 2 * LAYERS
    at = {w.path: k for k, w in enumerate(backbone.weights)}  # the oracle's names differ
    for bank in banks:  # (Keras numbers its layers' names), its order does not
        mine, theirs = backbone.weights[at[bank]], oracle.weights[at[bank]]
        assert mine.shape == theirs.shape, bank
        assert np.asarray(mine.numpy()).tobytes() == np.asarray(theirs.numpy()).tobytes(), bank
    out = objckpt.export(backbone, tmp_path / "out" / "model.safetensors", rules=rules,
                         strict=False)
    written = safetensors_numpy.load_file(out)
    experts = [k for k in entries if ".experts." in k]
    assert len(experts) == 3 * EXPERTS * LAYERS
    for name in experts:
        assert written[name].tobytes() == entries[name].tobytes(), name
