"""Hugging Face SAM 3 (`Sam3VideoModel`, model type `sam3_video`; `Sam3Model`, model type
`sam3`) <-> keras-hub's `SAM3PromptableConceptBackbone` (the promptable concept detector).

Names and layouts follow keras-hub's importer (`convert_sam3.py`, which reads a `sam3_video`
folder's `detector_config` and its `detector_model.` entries): a `Linear` weight (out, in) <->
a Keras kernel (in, out); a torch `Conv2d` kernel (out, in, h, w) and a `ConvTranspose2d`
kernel (in, out, h, w) <-> a Keras `Conv2D` (h, w, in, out) or `Conv2DTranspose` (h, w, out,
in) kernel, the same permutation; layer and group norms' `weight`/`bias` <-> `gamma`/`beta`;
embeddings' `weight` <-> `embeddings`. keras-hub's object paths follow transformers' module
names (`detr_decoder/layers/0/text_cross_attn/q_proj`), save for:

- the vision tower's neck (`vision_encoder.neck.`) <-> `vision_encoder/vision_neck/`;
- the CLIP text tower (`text_encoder.text_model.`) <-> `text_encoder/`: its attention's query,
  key and value (hidden, hidden) <-> (hidden, heads, head_dim), their biases <-> (heads,
  head_dim), `out_proj` <-> `output_dense` (heads, head_dim, hidden); `layer_norm1`/`2` <->
  `layer_norm_1`/`2`, `mlp.fc1`/`fc2` <-> `dense_1`/`dense_2`, `final_layer_norm` <->
  `layer_norm`; the token and position embeddings under `embedding/`;
- the ViT's position embeddings (1, pretraining patches, hidden) feed both
  `position_embeddings` and `tiled_position_embeddings`, the latter tiled over the backbone's
  patch grid (`TilePositions`, what keras-hub's importer assigns); export writes them once
  (the first tile of the tiled ones must be the position embeddings: a model whose two
  disagree is refused by export's tie check, naming both).

Computed, in no folder: each ViT layer's rotary tables (`rotary_emb/rope_embeddings_cos`,
`_sin`), built by keras-hub from the config: left as they are (listed under `skipped`),
never exported.

Set aside (no keras-hub variable, and transformers' forward reads none of them):
`text_encoder.text_projection.weight` (the CLIP tower's own projection: SAM 3 projects the
text with the top-level `text_projection`) and the pixel decoder's stages past the FPN levels
it uses (`mask_decoder.pixel_decoder.conv_layers.{i}`, `norms.{i}` for i >= number of scale
factors - 2; keras-hub never builds them). Export writes none of them; transformers
initialises them when it loads the export (unused by its outputs).

What keras-hub computes otherwise than transformers, from the same weights: its text tower
(`SAM3TextEncoder`) attends both ways where transformers' CLIP text tower is causal (the
text features 0.5 off on the tiny fixtures; keras-hub's layers under a causal mask give
transformers' to 2e-7), and its backbone always runs the geometry encoder (a CLS prompt
token even without a box), where transformers runs none without a box.

Hub classes (`CLASSES`): `Sam3VideoModel` (the Hub's `facebook/sam3`, what keras-hub's
importer reads) holds the detector under `detector_model.` beside the video tracker
(`tracker_model.`, `tracker_neck.`), which keras-hub has no model of: set aside. `Sam3Model`
is the detector alone, its names bare. Export writes the names of the folder's class: a
`sam3` set the bare names, which `Sam3Model` loads whole (but for the unused entries above);
a `sam3_video` set the detector under `detector_model.` and no tracker, which keras-hub's
importer reads, `Sam3Model` loads (transformers' `Sam3Model` reads a `sam3_video` folder's
detector) and `Sam3VideoModel` loads with the tracker missing. keras-hub's
`SAM3PromptableConceptImageSegmenter` has no variable beyond its backbone; `TASKS` is empty
(the backbone serves both classes).
"""

from __future__ import annotations

import dataclasses

from objckpt.rules.core import NOWHERE, Chain, ConvKernel, Reshape, Rule, RuleSet, \
    Transform, Transpose

__all__ = ["CLASSES", "MODEL_TYPES", "TASKS", "TilePositions", "rules"]

MODEL_TYPES = ("sam3_video", "sam3")
_TRACKER = ("tracker_model.", "tracker_neck.")
CLASSES = {
    "Sam3VideoModel": ("detector_model.", ()),
    "Sam3Model": ("", ()),
}
TASKS: dict = {}  # keras-hub's image segmenter has no variable beyond its backbone
_MODEL = "SAM 3"
_COMPUTED = ("rotary tables keras-hub computes from the config when it builds the layer; no "
             "folder holds them")
_DEPTH = 9  # the most dotted segments of a tracker entry's name (7 in transformers 5.24)


def _error(text: str, fix: str):
    """The error for what the set cannot read: what it needs, then its fix."""
    from objckpt import errors

    return errors.InvalidArgumentError(f"{text} Fix: {fix}")


def _part(config: dict, key: str, where: str = "") -> dict:
    value = config.get(key)
    if not isinstance(value, dict):
        raise _error(
            f"The {_MODEL} rule set needs `{where}{key}` (a dict) from the Hugging Face "
            f"config; received {type(value).__name__}.", "pass the checkpoint's folder (its "
            "config.json), or config={'detector_config': {'vision_config': {...}, "
            "'text_config': {...}, ...}} for sam3_video (the detector's keys at the top for "
            "sam3).")
    return value


def _size(config: dict, key: str, where: str) -> int:
    value = config.get(key)
    if type(value) is not int or value <= 0:
        raise _error(
            f"The {_MODEL} rule set needs `{where}{key}` (a positive int) from the Hugging "
            f"Face config; received {value!r}.", "pass the checkpoint's own config.json.")
    return value


@dataclasses.dataclass(frozen=True)
class TilePositions(Transform):
    """Position embeddings (1, source * source, hidden) of a square grid tiled over a larger
    grid (1, target * target, hidden), as keras-hub's SAM 3 ViT embedding tiles them (the
    grid repeated, then cut to `target` rows and columns). Its inverse (`inverse_of=True`)
    takes the first `source` rows and columns back: exact for a tiling, and export's tie
    check refuses tiled embeddings whose first tile is not the position embeddings."""

    source: int
    target: int
    inverse_of: bool = False

    def __post_init__(self):
        if not (type(self.source) is int and type(self.target) is int and
                0 < self.source <= self.target):
            raise _error(
                f"TilePositions needs 0 < source <= target (patches a side); received "
                f"source={self.source!r}, target={self.target!r}.", "build the backbone for "
                "an image at least as large as the pretraining one.")

    def _sides(self) -> tuple:
        return (self.target, self.source) if self.inverse_of else (self.source, self.target)

    def output_shape(self, shape: tuple) -> tuple:
        given, made = self._sides()
        shape = tuple(shape)
        if len(shape) != 3 or shape[1] not in (None, given * given):
            raise _error(
                f"{self!r} takes position embeddings of shape (1, {given * given}, hidden); "
                f"received {shape}.", "attach it to the ViT's position embeddings of a "
                f"config whose grids are {self.source} and {self.target} patches a side.")
        return (shape[0], made * made, shape[2])

    def __call__(self, value):
        given, made = self._sides()
        shape = self.output_shape(tuple(value.shape))
        hidden = int(value.shape[-1])
        import numpy as np

        if isinstance(value, np.ndarray):
            grid = value.reshape(-1, given, given, hidden)
            if not self.inverse_of:
                repeat = made // given + 1
                grid = np.tile(grid, (1, repeat, repeat, 1))
            return np.ascontiguousarray(grid[:, :made, :made, :]).reshape(shape)
        import tensorflow as tf

        grid = tf.reshape(value, (-1, given, given, hidden))
        if not self.inverse_of:
            repeat = made // given + 1
            grid = tf.tile(grid, (1, repeat, repeat, 1))
        return tf.reshape(grid[:, :made, :made, :], (-1, made * made, hidden))

    def inverse(self) -> TilePositions:
        return TilePositions(self.source, self.target, not self.inverse_of)


def _dense(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/kernel", Transpose()),
            Rule(f"{source}.bias", f"{target}/bias")]


def _conv(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/kernel", ConvKernel("OIHW", "HWIO")),
            Rule(f"{source}.bias", f"{target}/bias")]


def _norm(source: str, target: str) -> list:
    return [Rule(f"{source}.weight", f"{target}/gamma"), Rule(f"{source}.bias", f"{target}/beta")]


def _attention(source: str, target: str) -> list:
    return [r for p in ("q", "k", "v", "o") for r in _dense(f"{source}.{p}_proj",
                                                          f"{target}/{p}_proj")]


def _mlp(source: str, target: str, names=("fc1", "fc2")) -> list:
    return [r for n in names for r in _dense(f"{source}.{n}", f"{target}/{n}")]


def _vision(vision: dict) -> list:
    backbone = _part(vision, "backbone_config", "vision_config.")
    where = "vision_config.backbone_config."
    patch = _size(backbone, "patch_size", where)
    image = _size(backbone, "image_size", where)
    pretrain = _size(backbone, "pretrain_image_size", where)
    scales = vision.get("scale_factors")
    if not isinstance(scales, list) or len(scales) < 2:
        raise _error(
            f"The {_MODEL} rule set needs `vision_config.scale_factors` (a list of at least "
            f"2 numbers) from the Hugging Face config; received {scales!r}.", "pass the "
            "checkpoint's own config.json.")
    source, target = "vision_encoder.backbone", "vision_encoder/backbone"
    embeddings = f"{source}.embeddings.position_embeddings"
    layer, to = f"{source}.layers.{{i}}", f"{target}/layers/{{i}}"
    return [
        Rule(embeddings, f"{target}/embeddings/position_embeddings"),
        Rule(embeddings, f"{target}/embeddings/tiled_position_embeddings",
             TilePositions(pretrain // patch, image // patch)),
        Rule(f"{source}.embeddings.patch_embeddings.projection.weight",
             f"{target}/embeddings/patch_embeddings/projection/kernel",
             ConvKernel("OIHW", "HWIO")),
        *_norm(f"{source}.layer_norm", f"{target}/layer_norm"),
        *_norm(f"{layer}.layer_norm1", f"{to}/layer_norm1"),
        *_norm(f"{layer}.layer_norm2", f"{to}/layer_norm2"),
        *_attention(f"{layer}.attention", f"{to}/attention"),
        *_mlp(f"{layer}.mlp", f"{to}/mlp"),
        *(Rule(f"{layer}.rotary_emb.rope_embeddings_{w}",
               f"{to}/rotary_emb/rope_embeddings_{w}", absent=_COMPUTED,
               unused_by=("SAM3PromptableConceptBackbone",)) for w in ("cos", "sin")),
        *_conv("vision_encoder.neck.fpn_layers.{i}.scale_layers.{j}",
               "vision_encoder/vision_neck/fpn_layers/{i}/scale_layers/{j}"),
        *(r for p in ("proj1", "proj2") for r in _conv(
            f"vision_encoder.neck.fpn_layers.{{i}}.{p}",
            f"vision_encoder/vision_neck/fpn_layers/{{i}}/{p}")),
    ]


def _text(text: dict) -> list:
    hidden = _size(text, "hidden_size", "text_config.")
    heads = _size(text, "num_attention_heads", "text_config.")
    if hidden % heads:
        raise _error(
            f"The {_MODEL} rule set needs text_config.hidden_size divisible by "
            f"text_config.num_attention_heads; received {hidden} and {heads}.", "pass the "
            "checkpoint's own config.json.")
    head_dim = hidden // heads
    into_heads = Chain(Transpose(), Reshape((hidden, hidden), (hidden, heads, head_dim)))
    from_heads = Chain(Transpose(), Reshape((hidden, hidden), (heads, head_dim, hidden)))
    source, target = "text_encoder.text_model", "text_encoder"
    layer, to = f"{source}.encoder.layers.{{i}}", f"{target}/encoder_layers/{{i}}"
    out = [
        Rule(f"{source}.embeddings.token_embedding.weight",
             f"{target}/embedding/token_embedding/embeddings"),
        Rule(f"{source}.embeddings.position_embedding.weight",
             f"{target}/embedding/position_embedding/position_embeddings"),
        *_norm(f"{source}.final_layer_norm", f"{target}/layer_norm"),
        *_norm(f"{layer}.layer_norm1", f"{to}/layer_norm_1"),
        *_norm(f"{layer}.layer_norm2", f"{to}/layer_norm_2"),
        *_dense(f"{layer}.mlp.fc1", f"{to}/dense_1"),
        *_dense(f"{layer}.mlp.fc2", f"{to}/dense_2"),
        Rule(f"{layer}.self_attn.out_proj.weight", f"{to}/attention/output_dense/kernel",
             from_heads),
        Rule(f"{layer}.self_attn.out_proj.bias", f"{to}/attention/output_dense/bias"),
    ]
    for name, keras in (("q", "query"), ("k", "key"), ("v", "value")):
        out += [Rule(f"{layer}.self_attn.{name}_proj.weight",
                     f"{to}/attention/{keras}_dense/kernel", into_heads),
                Rule(f"{layer}.self_attn.{name}_proj.bias",
                     f"{to}/attention/{keras}_dense/bias", Reshape((hidden,), (heads, head_dim)))]
    return out


def _prompts() -> list:
    """The geometry encoder, the DETR encoder and decoder, and the dot-product scoring."""
    geometry, layer = "geometry_encoder", "geometry_encoder.layers.{i}"
    to = "geometry_encoder/layers/{i}"
    out = [Rule(f"{geometry}.{e}.weight", f"{geometry}/{e}/embeddings")
           for e in ("label_embed", "cls_embed")]
    out += [r for d in ("boxes_direct_project", "boxes_pos_enc_project", "final_proj")
            for r in _dense(f"{geometry}.{d}", f"{geometry}/{d}")]
    out += _conv(f"{geometry}.boxes_pool_project", f"{geometry}/boxes_pool_project")
    out += [r for n in ("vision_layer_norm", "prompt_layer_norm", "output_layer_norm")
            for r in _norm(f"{geometry}.{n}", f"{geometry}/{n}")]
    for source, target in ((layer, to), ("detr_encoder.layers.{i}", "detr_encoder/layers/{i}")):
        out += [r for n in ("layer_norm1", "layer_norm2", "layer_norm3")
                for r in _norm(f"{source}.{n}", f"{target}/{n}")]
        out += _attention(f"{source}.self_attn", f"{target}/self_attn")
        out += _attention(f"{source}.cross_attn", f"{target}/cross_attn")
        out += _mlp(f"{source}.mlp", f"{target}/mlp")
    decoder, layer, to = "detr_decoder", "detr_decoder.layers.{i}", "detr_decoder/layers/{i}"
    for attention in ("self_attn", "text_cross_attn", "vision_cross_attn"):
        out += _attention(f"{layer}.{attention}", f"{to}/{attention}")
        out += _norm(f"{layer}.{attention}_layer_norm", f"{to}/{attention}_layer_norm")
    out += _mlp(f"{layer}.mlp", f"{to}/mlp") + _norm(f"{layer}.mlp_layer_norm",
                                                      f"{to}/mlp_layer_norm")
    out += [r for n in ("output_layer_norm", "presence_layer_norm")
            for r in _norm(f"{decoder}.{n}", f"{decoder}/{n}")]
    out += [Rule(f"{decoder}.{e}.weight", f"{decoder}/{e}/embeddings")
            for e in ("query_embed", "reference_points", "presence_token")]
    out += [r for head in ("box_head", "presence_head", "ref_point_head", "box_rpb_embed_x",
                           "box_rpb_embed_y")
            for r in _mlp(f"{decoder}.{head}", f"{decoder}/{head}",
                          ("layer1", "layer2", "layer3"))]
    scoring = "dot_product_scoring"
    out += _mlp(f"{scoring}.text_mlp", f"{scoring}/text_mlp", ("layer1", "layer2"))
    out += _norm(f"{scoring}.text_mlp_out_norm", f"{scoring}/text_mlp_out_norm")
    out += _dense(f"{scoring}.text_proj", f"{scoring}/text_proj")
    out += _dense(f"{scoring}.query_proj", f"{scoring}/query_proj")
    return out + _dense("text_projection", "text_projection")


def _masks(config: dict, vision: dict) -> tuple:
    """(the mask decoder's rules, the entries of its pixel decoder's unused stages)."""
    masks = _part(config, "mask_decoder_config")
    stages = _size(masks, "num_upsampling_stages", "mask_decoder_config.")
    used = min(stages, len(vision["scale_factors"]) - 2)
    pixel, to = "mask_decoder.pixel_decoder", "mask_decoder/pixel_decoder"
    out = []
    for i in range(used):
        out += _conv(f"{pixel}.conv_layers.{i}", f"{to}/conv_layers/{i}")
        out += _norm(f"{pixel}.norms.{i}", f"{to}/norms/{i}")
    unused = [f"{pixel}.{kind}.{i}.{w}" for i in range(used, stages)
              for kind in ("conv_layers", "norms") for w in ("weight", "bias")]
    out += _dense("mask_decoder.mask_embedder.layers.{i}", "mask_decoder/mask_embedder/layers/{i}")
    out += _conv("mask_decoder.instance_projection", "mask_decoder/instance_projection")
    out += _conv("mask_decoder.semantic_projection", "mask_decoder/semantic_projection")
    out += _attention("mask_decoder.prompt_cross_attn", "mask_decoder/prompt_cross_attn")
    out += _norm("mask_decoder.prompt_cross_attn_norm", "mask_decoder/prompt_cross_attn_norm")
    return out, unused


def detector_config(config: dict) -> dict:
    """The detector's config: a `sam3_video` config's `detector_config`, a `sam3` config
    itself."""
    if str(config.get("model_type", "sam3_video")) == "sam3":
        return config
    return _part(config, "detector_config")


def rules(config: dict) -> RuleSet:
    """The SAM 3 rule set for a Hugging Face config (`sam3_video`: its `detector_config`;
    `sam3`: the detector's config itself), both directions.

    Example:
      >>> rules = objckpt.rules.huggingface("sam3_video", config=hf_config)
      >>> objckpt.restore(keras_hub.models.SAM3PromptableConceptBackbone(...), "sam3_dir",
      ...                 rules=rules)
    """
    video = str(config.get("model_type", "sam3_video")) != "sam3"
    detector = detector_config(config)
    vision = _part(detector, "vision_config")
    out = _vision(vision) + _text(_part(detector, "text_config")) + _prompts()
    masks, unused = _masks(detector, vision)
    out += masks
    why = ("Sam3Model, Sam3VideoModel (read by no output of transformers'; keras-hub has "
           "no variable for it)")
    aside = [Rule(entry, f"{NOWHERE}/{entry}", head=why)
             for entry in ["text_encoder.text_projection.weight", *unused]]
    prefix = "detector_model." if video else ""
    out = [r.with_source(prefix + r.source) for r in out + aside]
    if video:
        tracker = "Sam3VideoModel (the video tracker: keras-hub has no model of it)"
        for start in _TRACKER:
            for depth in range(1, _DEPTH):
                name = start + ".".join(f"{{s{n}}}" for n in range(depth))
                out.append(Rule(name, f"{NOWHERE}/{name}", head=tracker))
    name = "sam3_video" if video else "sam3"
    return RuleSet(out, alternatives=True, name=f"huggingface({name!r})", classes=TASKS)
