"""The Hugging Face rule set for SAM 3 (`sam3_video`: the detector beside the video tracker;
`sam3`: the detector alone) <-> keras-hub's SAM3PromptableConceptBackbone: the set itself,
its tiling transform, its bad configs, and keras-hub's own importer as a second oracle (what
it reads from the fixtures and from objckpt's exports).

transformers' side (its folders restored and compared with its outputs on an image and a
text prompt, objckpt's exports read back by it) is tests/integration/test_hf_transformers.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import Chain, ConvKernel, Reshape, Transpose, huggingface
from objckpt.rules.core import NOWHERE
from objckpt.rules.hf_sam3 import TilePositions

from support import bits, by_source, config_folder

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hf")
VIDEO = ["sam3_video-Sam3VideoModel-float32", "sam3_video-Sam3VideoModel-bfloat16"]
DETECTOR = ["sam3-Sam3Model-float32", "sam3-Sam3Model-bfloat16"]


def _config(folder: str) -> dict:
    with open(os.path.join(FIXTURES, folder, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def _header(folder: str) -> list:
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    return sorted(header)


# --- the set itself (no keras-hub) ------------------------------------------------------------

def test_the_folder_chooses_the_set_by_model_type(tmp_path):
    assert {"sam3", "sam3_video"} <= set(objckpt.rules.supported())
    video, detector = _config(VIDEO[0]), _config(DETECTOR[0])
    chosen = huggingface(config_folder(tmp_path / "video", video))
    assert chosen.name == "huggingface('sam3_video')"
    assert list(chosen) == list(huggingface("sam3_video", config=video))
    alone = huggingface(config_folder(tmp_path / "detector", detector))
    assert alone.name == "huggingface('sam3')"
    assert chosen.classes == alone.classes == {}  # the backbone serves both classes
    # the same detector rules, under `detector_model.` for the video model
    bare = {(r.source, r.target) for r in alone}
    assert {("detector_model." + s, t) for s, t in bare} <= {(r.source, r.target)
                                                             for r in chosen}


def test_the_detectors_layouts():
    rules = by_source(huggingface("sam3", config=_config(DETECTOR[0])))
    # the CLIP text tower: width 16, 2 heads of 8
    query = rules["text_encoder.text_model.encoder.layers.{i}.self_attn.q_proj.weight"]
    assert query.target == "text_encoder/encoder_layers/{i}/attention/query_dense/kernel"
    assert query.transform == Chain(Transpose(), Reshape((16, 16), (16, 2, 8)))
    output = rules["text_encoder.text_model.encoder.layers.{i}.self_attn.out_proj.weight"]
    assert output.target == "text_encoder/encoder_layers/{i}/attention/output_dense/kernel"
    assert output.transform == Chain(Transpose(), Reshape((16, 16), (2, 8, 16)))
    assert rules["text_encoder.text_model.encoder.layers.{i}.self_attn.v_proj.bias"
                 ].transform == Reshape((16,), (2, 8))
    assert rules["text_encoder.text_model.final_layer_norm.weight"].target == (
        "text_encoder/layer_norm/gamma")
    # convolutions (the FPN's transposed ones too) and linears
    scale = rules["vision_encoder.neck.fpn_layers.{i}.scale_layers.{j}.weight"]
    assert scale.target == "vision_encoder/vision_neck/fpn_layers/{i}/scale_layers/{j}/kernel"
    assert scale.transform == ConvKernel("OIHW", "HWIO")
    assert rules["detr_decoder.layers.{i}.text_cross_attn.o_proj.weight"].transform == (
        Transpose())
    assert rules["geometry_encoder.boxes_pool_project.weight"].transform == (
        ConvKernel("OIHW", "HWIO"))
    assert rules["detr_decoder.query_embed.weight"].target == (
        "detr_decoder/query_embed/embeddings")
    # the used pixel-decoder stages (4 scale factors: 2), the third set aside
    assert rules["mask_decoder.pixel_decoder.norms.1.bias"].target == (
        "mask_decoder/pixel_decoder/norms/1/beta")
    for entry in ("mask_decoder.pixel_decoder.conv_layers.2.weight",
                  "text_encoder.text_projection.weight"):
        assert rules[entry].target == f"{NOWHERE}/{entry}"
        assert "read by no output of transformers'" in rules[entry].head


def test_the_position_embeddings_feed_both_copies_the_tiled_one_tiled():
    rules = [r for r in huggingface("sam3", config=_config(DETECTOR[0]))
             if r.source == "vision_encoder.backbone.embeddings.position_embeddings"]
    assert [(r.target, r.transform) for r in rules] == [
        ("vision_encoder/backbone/embeddings/position_embeddings", None),
        ("vision_encoder/backbone/embeddings/tiled_position_embeddings", TilePositions(2, 4))]


def test_the_rotary_tables_are_computed_and_the_tracker_set_aside():
    rules = huggingface("sam3_video", config=_config(VIDEO[0]))
    rope = [r for r in rules if r.target.endswith("rope_embeddings_cos")]
    assert len(rope) == 1 and rope[0].absent and rope[0].unused_by == (
        "SAM3PromptableConceptBackbone",)
    tracker = {r.source: r for r in rules if r.source.startswith("tracker_model.")}
    assert len(tracker) == 8  # one to eight name segments after the prefix
    assert all(r.head.startswith("Sam3VideoModel (the video tracker") for r in tracker.values())
    assert not [r for r in rules if r.source.startswith("vision_encoder.")]  # all prefixed


def test_tile_positions_is_keras_hubs_tiling_and_its_inverse_takes_the_first_tile():
    pytest.importorskip("keras_hub")
    from keras_hub.src.models.sam3.sam3_layers import SAM3Embedding

    rng = np.random.default_rng(0)
    for source, target in ((2, 4), (2, 5), (3, 3), (24, 72)):
        value = rng.normal(size=(1, source * source, 8)).astype(np.float32)
        tiled = TilePositions(source, target)(value)
        theirs = SAM3Embedding._tile_position_embeddings(
            value, patch_size=1, source_shape=(source, source), target_shape=(target, target))
        assert bits(tiled) == bits(np.asarray(theirs))
        assert TilePositions(source, target).output_shape((1, source * source, 8)) == (
            1, target * target, 8)
        back = TilePositions(source, target).inverse()
        assert bits(back(tiled)) == bits(value)
        assert bits(np.asarray(back(tf_constant(tiled)))) == bits(value)


def tf_constant(value):
    import tensorflow as tf

    return tf.constant(value)


def test_tile_positions_refuses_a_smaller_grid_and_another_shape():
    with pytest.raises(errors.InvalidArgumentError, match=r"0 < source <= target.*Fix:"):
        TilePositions(4, 2)
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"\(1, 4, hidden\); received \(1, 9, 8\).*Fix:"):
        TilePositions(2, 4).output_shape((1, 9, 8))


@pytest.mark.parametrize("drop", ["vision_config", "text_config", "mask_decoder_config"])
def test_a_detector_config_without_a_part_is_refused(drop):
    config = {k: v for k, v in _config(DETECTOR[0]).items() if k != drop}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"SAM 3 rule set needs `{drop}` \\(a dict\\).*NoneType.*Fix:"):
        huggingface("sam3", config=config)


def test_a_video_config_without_its_detector_is_refused():
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"SAM 3 rule set needs `detector_config` \(a dict\).*Fix:"):
        huggingface("sam3_video", config={"tracker_config": {}})


@pytest.mark.parametrize("part,key", [("text_config", "hidden_size"),
                                      ("text_config", "num_attention_heads")])
def test_a_config_without_sizes_is_refused(part, key):
    config = _config(DETECTOR[0])
    config[part] = {k: v for k, v in config[part].items() if k != key}
    with pytest.raises(errors.InvalidArgumentError,
                       match=f"SAM 3 rule set needs `{part}.{key}`.*received None.*Fix:"):
        huggingface("sam3", config=config)


def test_heads_that_do_not_divide_the_width_and_a_bad_grid_are_refused():
    config = _config(DETECTOR[0])
    config["text_config"] = {**config["text_config"], "num_attention_heads": 3}
    with pytest.raises(errors.InvalidArgumentError, match=r"divisible.*16 and 3.*Fix:"):
        huggingface("sam3", config=config)
    config = _config(DETECTOR[0])
    config["vision_config"] = {**config["vision_config"], "scale_factors": None}
    with pytest.raises(errors.InvalidArgumentError, match=r"scale_factors.*None.*Fix:"):
        huggingface("sam3", config=config)


# --- against keras-hub's importer -------------------------------------------------------------

def _values(model) -> list:
    """Every variable's bits, in the model's order (keras-hub names its encoders with the
    session's counters: `sam3_detr_decoder_2/...`), with its path below the encoder."""
    return [(v.path.split("/", 1)[-1], bits(v.numpy())) for v in model.weights]


def _backbone(config: dict, dtype: str = "float32"):
    from keras_hub.src.utils.transformers import convert_sam3

    if config.get("model_type") == "sam3":
        config = {"detector_config": config}
    return convert_sam3.backbone_cls(**convert_sam3.convert_backbone_config(
        config, convert_sam3.backbone_cls), dtype=dtype)


@pytest.mark.parametrize("folder", VIDEO)
def test_restore_is_bit_equal_to_keras_hubs_importer(tmp_path, folder):
    """transformers' video folder restored by objckpt (one call, no rules) and read by
    keras-hub's `from_preset(folder)` (its importer reads sam3_video only): every variable
    bit-equal, the tiled position embeddings and the rotary tables included. objckpt's
    export holds the folder's detector entries under `detector_model.` (no tracker, none of
    the unused ones) and keras-hub reads it back bit-equal."""
    keras_hub = pytest.importorskip("keras_hub")
    path = os.path.join(FIXTURES, folder)
    ours = _backbone(_config(folder))
    report = objckpt.restore(ours, path)
    assert "huggingface('sam3_video')" in str(report)
    with pytest.warns(UserWarning, match="Skipping"):  # its unbuilt pixel-decoder stage
        theirs = keras_hub.models.Backbone.from_preset(path, dtype="float32")
    assert type(theirs) is type(ours)
    assert _values(ours) == _values(theirs)
    out = str(tmp_path / "export")
    objckpt.export(ours, out, rules=huggingface(path))
    unused = {"detector_model.text_encoder.text_projection.weight", *(
        f"detector_model.mask_decoder.pixel_decoder.{k}.2.{w}"
        for k in ("conv_layers", "norms") for w in ("weight", "bias"))}
    detector = [k for k in _header(path) if k.startswith("detector_model.")]
    assert _header(out) == sorted(set(detector) - unused)
    with pytest.warns(UserWarning, match="Skipping"):
        again = keras_hub.models.Backbone.from_preset(out, dtype="float32")
    assert _values(again) == _values(ours)


@pytest.mark.parametrize("folder", DETECTOR)
def test_the_detector_folder_restores_what_the_video_folder_restores(folder):
    """A Sam3Model folder (the detector's names bare) and the video folder of the same
    detector config restore the same variables; keras-hub's importer reads neither a sam3
    folder nor a Sam3Model's names, so the oracle is transformers' (the integration test)."""
    pytest.importorskip("keras_hub")
    ours = _backbone(_config(folder))
    report = objckpt.restore(ours, os.path.join(FIXTURES, folder))
    assert "huggingface('sam3')" in str(report)
    assert len(report.restored) == len(ours.weights) - 4  # all but the rotary tables
    tiled = objckpt.tree(ours)["vision_encoder/backbone/embeddings/tiled_position_embeddings"]
    position = objckpt.tree(ours)["vision_encoder/backbone/embeddings/position_embeddings"]
    assert bits(tiled.numpy()) == bits(TilePositions(2, 4)(np.asarray(position.numpy())))


def test_export_refuses_tiled_embeddings_that_are_no_tiling(tmp_path):
    """Trained tiled position embeddings no longer tile the pretraining ones: export's tie
    check names both and writes nothing."""
    pytest.importorskip("keras_hub")
    path = os.path.join(FIXTURES, DETECTOR[0])
    model = _backbone(_config(DETECTOR[0]))
    objckpt.restore(model, path)
    tiled = objckpt.tree(model)["vision_encoder/backbone/embeddings/tiled_position_embeddings"]
    tiled.assign(tiled.numpy() + 1.0)
    out = tmp_path / "export"
    with pytest.raises(errors.ObjckptError, match=r"(?s)position_embeddings.*"
                                                  r"tiled_position_embeddings"):
        objckpt.export(model, str(out), rules=huggingface(path))
    assert not (out / "model.safetensors").exists()
