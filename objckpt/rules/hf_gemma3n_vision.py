"""Gemma 3n's MobileNetV5 vision tower (transformers' `TimmWrapperModel` around timm's
`mobilenetv5_300m_enc`, its entries `vision_tower.timm_model.`) <-> keras-hub's
`vision_encoder` (a `MobileNetV5Backbone`). Part of the multimodal Gemma 3n rules, checked
against folders transformers wrote with timm (a tiny tower from timm's `model_args`,
`block_strings`) and against keras-hub's importer (`convert_gemma3n._port_vision_tower`).

Names and layouts follow keras-hub's importer. The tower is a stem, stages of blocks and a
multi-scale fusion adapter (`msfa`); which entries a block has depends on its kind, read from
the architecture's definition (timm's block strings, `ARCHITECTURES`): an edge residual
(`er`: `conv_exp`, `conv_pwl` and their norms `bn1`, `bn2`), a universal inverted residual
(`uir`: `dw_start` where its `a` kernel is set, `pw_exp`, `dw_mid` where its `k` kernel is
set, `pw_proj`, each a convolution `.conv` and a norm `.bn`, and `layer_scale.gamma`), or
multi-query attention (`mqa`: `norm`, `layer_scale.gamma`, `attn.query.proj`, and the keys'
and values' `down_conv` and `norm` where its `v` stride is over 1, their `proj`, and
`attn.output.proj`). A torch `Conv2d` kernel (out, in, h, w) is a Keras kernel (h, w, in,
out), the blocks' depthwise ones (channels, 1, h, w) too (keras-hub's grouped `Conv2D`: (h, w,
1, channels)), but for the attention's `down_conv`, a Keras `DepthwiseConv2D` kernel (h, w,
channels, 1); an RMS norm's `weight` keras-hub's `gamma` (a batch norm's `weight`, `bias`,
`running_mean`, `running_var` its `gamma`, `beta`, `moving_mean`, `moving_variance`).

keras-hub addresses the tower's layers by their place in its functional graph
(`vision_encoder/_operations/{n}`, matched as `operations/{n}`: the stem is operation 1, block
j of the tower (counting across stages) operation 2 + j, the adapter the one after the last
block); its automatic layer names carry a counter of the session. keras-hub's convolutions
have a bias where timm's have none (every one but the stem's): no folder has those,
keras-hub's importer leaves them at their initial zeros, and so do these rules (listed under
`skipped`; export writes none, so a bias trained away from zero is not exported).
keras-hub's importer does not read the stem's bias (`conv_stem.conv.bias`); these rules do.
"""

from __future__ import annotations

import re

from objckpt.rules.core import ConvKernel, Rule

__all__ = ["ARCHITECTURES", "block_strings", "blocks", "tower_rules"]

_300M_STAGE_2 = (["uir_r1_a5_k5_s2_e6_c640"] + ["uir_r1_a5_k0_s1_e4_c640"] * 7
                 + ["uir_r1_a0_k0_s1_e1_c640"]
                 + ["mqa_r1_k3_h12_v2_s1_d64_c640", "uir_r1_a0_k0_s1_e2_c640"] * 14)
_300M_STAGE_3 = (["uir_r1_a5_k5_s2_e6_c1280"]
                 + ["mqa_r1_k3_h16_s1_d96_c1280", "uir_r1_a0_k0_s1_e2_c1280"] * 19)
# timm architecture -> its stages' block strings (keras-hub's importer's definition)
ARCHITECTURES = {
    "mobilenetv5_300m_enc": [
        ["er_r1_k3_s2_e4_c128", "er_r1_k3_s1_e4_c128", "er_r1_k3_s1_e4_c128"],
        ["uir_r1_a3_k5_s2_e6_c256", "uir_r1_a5_k0_s1_e4_c256", "uir_r1_a3_k0_s1_e4_c256",
         "uir_r1_a5_k0_s1_e4_c256", "uir_r1_a3_k0_s1_e4_c256"],
        _300M_STAGE_2,
        _300M_STAGE_3,
    ],
}
_TIMM = "vision_tower.timm_model"
_NO_BIAS = ("timm's convolution has no bias; keras-hub's has one, which its importer leaves at "
            "its initial zeros")
UNUSED_BY = ("Gemma3nBackbone", "Gemma3nCausalLM")


def _refuse(what: str):
    from objckpt import errors

    raise errors.InvalidArgumentError(
        f"The Gemma 3n vision tower rules {what}. Fix: pass an architecture of "
        f"{sorted(ARCHITECTURES)} (the Hugging Face vision_config's `architecture`), or an "
        "architecture definition of er, uir and mqa block strings.")


def blocks(arch_def) -> list:
    """(stage, index in stage, kind, options) of each block of an architecture definition
    (stages of timm block strings, e.g. `uir_r1_a3_k5_s2_e6_c256`), repeats expanded."""
    out = []
    for stage, strings in enumerate(arch_def):
        index = 0
        for text in strings:
            kind, *parts = str(text).split("_")
            options = dict(re.match(r"([a-z]+)(.*)$", p).groups() for p in parts
                           if re.match(r"[a-z]+", p))
            if kind not in ("er", "uir", "mqa") or (kind == "uir" and options.get("p", "0")
                                                     != "0"):
                _refuse(f"cover edge residual (er), universal inverted residual (uir, no `p` "
                        f"kernel) and multi-query attention (mqa) blocks; received {text!r}")
            for _ in range(int(options.get("r", "1") or 1)):
                out.append((stage, index, kind, options))
                index += 1
    return out


def _number(value) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else str(value)


# a decoded block's options as its block string names them: (letter, key, default)
_OPTIONS = {"er": (("k", "exp_kernel_size", 3), ("s", "stride", 1), ("e", "exp_ratio", 1),
                   ("c", "out_chs", None)),
            "uir": (("a", "dw_kernel_size_start", 0), ("k", "dw_kernel_size_mid", 0),
                    ("p", "dw_kernel_size_end", 0), ("s", "stride", 1),
                    ("e", "exp_ratio", 1), ("c", "out_chs", None)),
            "mqa": (("k", "dw_kernel_size", 3), ("h", "num_heads", None),
                    ("v", "kv_stride", 1), ("s", "stride", 1), ("d", "key_dim", None),
                    ("c", "out_chs", None))}


def block_strings(block_args) -> list:
    """The architecture definition (stages of timm block strings) of timm's decoded block
    arguments (`decode_arch_def`'s stages of dicts, a Hugging Face vision_config's
    `model_args["block_args"]`): the options the tower's names and shapes depend on."""
    out = []
    for stage in block_args if isinstance(block_args, (list, tuple)) else [None]:
        strings = []
        for block in stage if isinstance(stage, (list, tuple)) else [None]:
            kind = block.get("block_type") if isinstance(block, dict) else None
            if kind not in _OPTIONS or any(block.get(key, default) is None
                                           for _, key, default in _OPTIONS[kind]):
                _refuse(f"read decoded blocks of kinds {sorted(_OPTIONS)} with their sizes "
                        f"(timm's `decode_arch_def`); received {block!r}")
            parts = [f"{letter}{_number(block.get(key, default))}"
                     for letter, key, default in _OPTIONS[kind]]
            parts = [p for p in parts if p not in ("p0", "v1")]  # as timm's strings omit them
            strings.append("_".join([kind, "r1", *parts]))
        out.append(strings)
    return out


def _conv(source: str, target: str, *, bias: bool = False) -> list:
    """A timm `ConvNormAct`'s convolution: its kernel (a depthwise one's too: keras-hub makes
    it a grouped `Conv2D`, kernel (h, w, 1, channels)), and (keras-hub's only) its bias."""
    out = [Rule(f"{source}.weight", f"{target}/kernel", ConvKernel("OIHW", "HWIO"))]
    if bias:
        out.append(Rule(f"{source}.bias", f"{target}/bias"))
    else:
        out.append(Rule(f"{source}.bias", f"{target}/bias", absent=_NO_BIAS,
                        unused_by=UNUSED_BY))
    return out


def _norm(source: str, target: str) -> list:
    """An RMS norm's weight (or a batch norm's four entries)."""
    return [Rule(f"{source}.weight", f"{target}/gamma"),
            Rule(f"{source}.bias", f"{target}/beta"),
            Rule(f"{source}.running_mean", f"{target}/moving_mean"),
            Rule(f"{source}.running_var", f"{target}/moving_variance")]


def _cna(source: str, conv: str, norm: str, target: str, *, bias: bool = False) -> list:
    return _conv(f"{source}.{conv}", f"{target}/conv", bias=bias) + _norm(
        f"{source}.{norm}", f"{target}/norm")


def _attention(source: str, target: str, options: dict) -> list:
    out = [Rule(f"{source}.query.proj.weight", f"{target}/query_layers/0/kernel",
                ConvKernel("OIHW", "HWIO")),
           Rule(f"{source}.output.proj.weight", f"{target}/output_proj_layers/0/kernel",
                ConvKernel("OIHW", "HWIO"))]
    down = int(options.get("v", "1") or 1) > 1
    for part in ("key", "value"):
        layers = f"{target}/{part}_layers"
        if down:
            out += [Rule(f"{source}.{part}.down_conv.weight", f"{layers}/0/kernel",
                         ConvKernel("OIHW", "HWOI")),
                    *_norm(f"{source}.{part}.norm", f"{layers}/1")]
        out.append(Rule(f"{source}.{part}.proj.weight", f"{layers}/{2 if down else 0}/kernel",
                        ConvKernel("OIHW", "HWIO")))
    return out


def tower_rules(arch_def, where: str = "") -> list:
    """The tower's rules for an architecture definition, its entries named
    `vision_tower.timm_model.`, its targets under `{where}vision_encoder/`."""
    tower = f"{where}vision_encoder/operations"
    out = _cna(f"{_TIMM}.conv_stem", "conv", "bn", f"{tower}/1", bias=True)
    found = blocks(arch_def)
    if not found:
        _refuse("need at least one block")
    for j, (stage, index, kind, options) in enumerate(found):
        source, target = f"{_TIMM}.blocks.{stage}.{index}", f"{tower}/{2 + j}"
        if kind == "er":
            out += _cna(source, "conv_exp", "bn1", f"{target}/conv_exp")
            out += _cna(source, "conv_pwl", "bn2", f"{target}/conv_pwl")
            continue
        out.append(Rule(f"{source}.layer_scale.gamma", f"{target}/layer_scale/gamma"))
        if kind == "mqa":
            out += _norm(f"{source}.norm", f"{target}/norm")
            out += _attention(f"{source}.attn", f"{target}/attn", options)
            continue
        if options.get("a", "0") not in ("", "0"):
            out += _cna(f"{source}.dw_start", "conv", "bn", f"{target}/dw_start")
        out += _cna(f"{source}.pw_exp", "conv", "bn", f"{target}/pw_exp")
        if options.get("k", "0") not in ("", "0"):
            out += _cna(f"{source}.dw_mid", "conv", "bn", f"{target}/dw_mid")
        out += _cna(f"{source}.pw_proj", "conv", "bn", f"{target}/pw_proj")
    adapter = f"{tower}/{2 + len(found)}"
    for conv in ("pw_exp", "pw_proj"):
        out += _cna(f"{_TIMM}.msfa.ffn.{conv}", "conv", "bn", f"{adapter}/ffn/{conv}")
    return out + _norm(f"{_TIMM}.msfa.norm", f"{adapter}/norm")
