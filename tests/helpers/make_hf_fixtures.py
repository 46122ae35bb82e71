"""Hugging Face folders written by transformers itself, and objckpt's exports checked by it.

Pinned: transformers==5.24.0, torch==2.13.0+cpu (CPU), safetensors==0.8.0, numpy 2.x. The
script refuses to run under other versions of transformers or torch (their files and
outputs are the oracle: a new version is a new oracle, regenerated on purpose).

Run it with an interpreter that has transformers and torch (CI's does not; the tests read
only the files this script commits). The multimodal Gemma 3n rows (TIMM_ROWS) need timm and
torchvision as well (transformers builds Gemma 3n's vision tower with timm, which imports
torchvision): they were written with a second interpreter, /work/hfvenv-tv (torch 2.13.0 as
PyPI builds it by default, TIMM_TORCH, run on the CPU; torchvision 0.28.0, timm 1.0.31),
as `--only gemma3n_multimodal`, and their exports checked with it; the other rows with
torch 2.13.0+cpu, whose torchvision wheel PyPI does not have:

    python tests/helpers/make_hf_fixtures.py                      # writes tests/fixtures/hf/
    python tests/helpers/make_hf_fixtures.py --only qwen2 qwen3   # those rows' folders only
    python tests/helpers/make_hf_fixtures.py --check-exports DIR  # transformers reads DIR

First mode: for each row of ROWS (an architecture, a configuration of it, the Hub classes
transformers has for it), a tiny random model of each class: torch's initial values, then
every parameter moved by a seeded normal perturbation (so a swapped weight/bias or a norm
left at ones shows), saved with `save_pretrained(safe_serialization=True)` into
`tests/fixtures/hf/<case>-<Class>-<dtype>/`, in float32 and in bfloat16 (the float32 model
cast with `.to(torch.bfloat16)`, round to nearest even). Beside each folder,
`<folder>.oracle.safetensors` holds the fixed inputs and transformers' outputs on them:
`last_hidden_state` (the base model's, after its final norm; an encoder-decoder's decoder's,
with `encoder_last_hidden_state` beside it), `pooler_output` where the base model has a
pooler (a vision `...Backbone` class, which gives feature maps, is run as the base model
holding its weights, the same names), and `logits` for a class with a head. An
encoder-decoder's decoder reads `decoder_input_ids`: the input ids shifted right behind
token 2. BLIP-2 (QUERY_IMAGES) has no base model output of its own: its oracle is its
language model's last hidden state after the final norm (Flan-T5's decoder's and encoder's),
`vision_last_hidden_state` and `qformer_last_hidden_state`, and the logits of
`Blip2ForConditionalGeneration`. The oracle is transformers' run of
the folder as saved, loaded with `from_pretrained(folder, dtype=float32)`: for a bfloat16
folder, the bfloat16-rounded weights widened, with the buffers transformers computes (RoPE
frequencies) in float32: what a float32 model restored from that folder must give. Inputs are stored
in Keras's layout (images NHWC; transformers gets them as NCHW).

transformers 5 renames some classes' keys at load (its `conversion_mapping.py`) and
`save_pretrained` renames them back unless told `save_original_format=False`; folders in that
new form exist too. For each class in NEW_FORM the same model is also saved that way, in the
dtypes listed, as `<folder>-v5names/` (its oracle beside it, as above): the script checks that
it holds the same tensors (bytes, dtypes, shapes), some under other names (where transformers 5
splits a tensor, that both folders load into the same state), and the same config.json.

Everything is seeded and runs on CPU in eager attention with one thread: re-running the
script writes the same bytes (the safetensors files and config.json are byte-identical; the
check is `git status` after a re-run).

Second mode: each folder under DIR (objckpt's exports: tests/fixtures/hf_exports/ holds the
committed set, the CI tests write theirs to a temporary folder) is loaded by the class its
`config.json` names (`architectures`, else the base model) with `from_pretrained(...,
output_loading_info=True)`: nothing missing, unexpected or mismatched; its outputs on the
oracle's inputs equal the oracle of the folder of the same name under tests/fixtures/hf/
within float tolerance. It prints a table and exits non-zero if a row fails (or none is
checked). A folder of the other interpreter's rows (TIMM_ROWS under PINNED's torch, the
others under TIMM_TORCH) is listed as skipped: check it with that interpreter.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import zlib

PINNED = {"transformers": "5.24.0", "torch": "2.13.0+cpu"}
# torch 2.13.0 as PyPI builds it by default (for CUDA; run on the CPU here), with which
# PyPI's torchvision 0.28.0 imports: the interpreter of the rows that need timm (TIMM_ROWS)
TIMM_TORCH = "2.13.0+cu130"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures", "hf")
DTYPES = ("float32", "bfloat16")
SEED = 1234
SCALE = 0.05  # the perturbation's standard deviation
BATCH, LENGTH = 2, 6
VOCAB = 64

_DECODER = {
    "vocab_size": VOCAB, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "num_labels": 3,
}
_GEMMA = {**_DECODER, "num_key_value_heads": 1, "intermediate_size": 16,
          "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
          "tie_word_embeddings": True}
_T5GEMMA = {**{k: v for k, v in _GEMMA.items() if k != "num_labels"}, "head_dim": 8,
            "query_pre_attn_scalar": 8, "sliding_window": 64}
# a sliding and a full layer; the full one's RoPE linearly scaled (keras-hub reads a factor)
_T5GEMMA2 = {**{k: v for k, v in _T5GEMMA.items() if k != "rope_theta"},
             "layer_types": ["sliding_attention", "full_attention"],
             "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                       "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                    "rope_theta": 1000000.0}}}
_SEQ2SEQ = ("bart", "t5gemma", "t5gemma2")  # encoder-decoders: decoders read inputs shifted right

_ENCODER = {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 32, "hidden_act": "gelu",
            "max_position_embeddings": 32, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "num_labels": 3}

_QWEN_MOE = {**_DECODER, "tie_word_embeddings": False, "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 8, "decoder_sparse_step": 1,
             "norm_topk_prob": False}

_DINOV2 = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "mlp_ratio": 2,
           "hidden_act": "gelu", "image_size": 16, "patch_size": 4, "num_channels": 3,
           "layerscale_value": 1.0, "num_labels": 3}
_DINOV3 = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
           "intermediate_size": 32, "hidden_act": "gelu", "image_size": 16, "patch_size": 4,
           "num_channels": 3, "num_register_tokens": 2, "layerscale_value": 1.0,
           "query_bias": True, "key_bias": False, "value_bias": True, "proj_bias": True,
           "mlp_bias": True, "rope_theta": 100.0}
_ESM = {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32,
        "position_embedding_type": "rotary", "layer_norm_eps": 1e-5, "pad_token_id": 1,
        "mask_token_id": 32, "eos_token_id": 2, "token_dropout": False,
        "emb_layer_norm_before": False, "tie_word_embeddings": True, "num_labels": 3}

_QWEN3_5 = {**_DECODER, "tie_word_embeddings": False, "head_dim": 8,
            "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 4, "linear_value_head_dim": 4,
            "linear_conv_kernel_dim": 4}

_QWEN3_5_VISION = {"depth": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32,
                   "in_channels": 3, "out_hidden_size": 16, "patch_size": 4,
                   "temporal_patch_size": 2, "spatial_merge_size": 2,
                   "num_position_embeddings": 16}

_BLIP2 = {"vision_config": {"hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
                            "layer_norm_eps": 1e-6},
          "qformer_config": {"hidden_size": 8, "num_hidden_layers": 2,
                             "num_attention_heads": 2, "intermediate_size": 16,
                             "cross_attention_frequency": 2, "layer_norm_eps": 1e-12},
          "num_query_tokens": 4, "image_token_index": VOCAB - 1}
# SAM 3's detector: a ViT of 2 layers (the second global) on 28x28 images of 7x7 patches
# (a 4x4 grid), its position embeddings pretrained on 14x14 (2x2, tiled), a 4-level FPN of
# width 16, a CLIP text tower, one layer each of geometry encoder, DETR encoder and decoder
# (4 queries); the video model's tracker as small
_SAM3_VISION = {"backbone_config": {"model_type": "sam3_vit_model", "hidden_size": 16,
                                    "intermediate_size": 32, "num_hidden_layers": 2,
                                    "num_attention_heads": 2, "image_size": 28, "patch_size": 7,
                                    "window_size": 2, "global_attn_indexes": [1],
                                    "pretrain_image_size": 14},
                "fpn_hidden_size": 16, "backbone_feature_sizes": [[16, 16], [8, 8], [4, 4]]}
_SAM3 = {"vision_config": _SAM3_VISION,
         "text_config": {"vocab_size": VOCAB, "hidden_size": 16, "intermediate_size": 32,
                         "projection_dim": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "max_position_embeddings": 8, "hidden_act": "gelu",
                         "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
         "geometry_encoder_config": {"hidden_size": 16, "num_layers": 1,
                                     "num_attention_heads": 2, "intermediate_size": 32,
                                     "roi_size": 2},
         "detr_encoder_config": {"hidden_size": 16, "num_layers": 1, "num_attention_heads": 2,
                                 "intermediate_size": 32},
         "detr_decoder_config": {"hidden_size": 16, "num_layers": 1, "num_attention_heads": 2,
                                 "intermediate_size": 32, "num_queries": 4},
         "mask_decoder_config": {"hidden_size": 16, "num_attention_heads": 2,
                                 "num_upsampling_stages": 3}}
_SAM3_TRACKER = {"vision_config": _SAM3_VISION,
                 "prompt_encoder_config": {"hidden_size": 16, "image_size": 28, "patch_size": 7,
                                           "mask_input_channels": 4},
                 "mask_decoder_config": {"hidden_size": 16, "mlp_dim": 32,
                                         "num_attention_heads": 2, "iou_head_hidden_dim": 16},
                 "memory_attention_hidden_size": 16, "memory_attention_num_layers": 1,
                 "memory_attention_feed_forward_hidden_size": 32,
                 "memory_attention_rope_feat_sizes": [4, 4], "memory_encoder_hidden_size": 16,
                 "memory_encoder_output_channels": 8, "mask_downsampler_embed_dim": 16,
                 "memory_fuser_embed_dim": 16, "memory_fuser_intermediate_dim": 32,
                 "memory_fuser_num_layers": 1, "mask_downsampler_total_stride": 4}
# model_type -> (the target's hidden size, key heads, head width) of a draft model fed one
# step: the target's token embedding and last hidden state joined, and the keys and values of
# the target's last sliding and full layers (LENGTH positions, the step at the last)
ASSISTANT = {"gemma4_assistant": (24, 1, 8)}
_GEMMA4_TEXT = {**{k: v for k, v in _GEMMA.items() if k != "num_labels"}, "head_dim": 8,
                "global_head_dim": 16, "num_hidden_layers": 3, "sliding_window": 64,
                "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": VOCAB}
_GEMMA4_VISION = {"hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 12,
                  "patch_size": 4, "position_embedding_size": 16, "pooling_kernel_size": 2,
                  "use_clipped_linears": True, "standardize": True}
_GEMMA4_AUDIO = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "subsampling_conv_channels": [128, 4], "conv_kernel_size": 3,
                 "attention_chunk_size": 4, "attention_context_left": 5,
                 "attention_context_right": 0, "output_proj_dims": 12}
# the image token, then begin and end of image, then the other media's (past the text's ids)
_GEMMA4_TOKENS = {"image_token_id": 57, "boi_token_id": 58, "eoi_token_id": 59,
                  "audio_token_id": 60, "boa_token_id": 61, "eoa_token_index": 62,
                  "video_token_id": 63}

# case -> (model_type, config, the Hub classes). The next architecture adds a row here and
# one in tests/integration/test_hf_transformers.py's table.
ROWS = {
    "llama": ("llama", {**_DECODER, "tie_word_embeddings": False},
              ("LlamaModel", "LlamaForCausalLM", "LlamaForSequenceClassification")),
    "llama_tied": ("llama", {**_DECODER, "tie_word_embeddings": True}, ("LlamaForCausalLM",)),
    "mistral": ("mistral", {**_DECODER, "tie_word_embeddings": False, "sliding_window": 512,
                            "rms_norm_eps": 1e-5},
                ("MistralModel", "MistralForCausalLM", "MistralForSequenceClassification")),
    "gemma": ("gemma", _GEMMA,
              ("GemmaModel", "GemmaForCausalLM", "GemmaForSequenceClassification")),
    "gemma2": ("gemma2", {**_GEMMA, "head_dim": 8, "query_pre_attn_scalar": 8,
                          "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
                          "sliding_window": 64},
               ("Gemma2Model", "Gemma2ForCausalLM", "Gemma2ForSequenceClassification")),
    "gpt2": ("gpt2", {"vocab_size": VOCAB, "n_positions": 32, "n_embd": 16, "n_layer": 2,
                      "n_head": 2, "activation_function": "gelu_new", "pad_token_id": 0,
                      "bos_token_id": 1, "eos_token_id": 2,
                      "num_labels": 3},
             ("GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification")),
    "bert": ("bert", {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "intermediate_size": 32, "hidden_act": "gelu",
                      "max_position_embeddings": 32, "type_vocab_size": 2, "num_labels": 3},
             ("BertModel", "BertForMaskedLM", "BertForPreTraining",
              "BertForSequenceClassification")),
    "vit": ("vit", {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                    "intermediate_size": 32, "hidden_act": "gelu", "image_size": 16,
                    "patch_size": 4, "num_channels": 3, "qkv_bias": True, "num_labels": 3},
            ("ViTModel", "ViTForImageClassification")),
    "qwen2": ("qwen2", {**_DECODER, "tie_word_embeddings": False},
              ("Qwen2Model", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification")),
    # tied, as the small Qwen3s are; head_dim * heads != hidden_size
    "qwen3": ("qwen3", {**_DECODER, "tie_word_embeddings": True, "head_dim": 8},
              ("Qwen3Model", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification")),
    "distilbert": ("distilbert", {"vocab_size": VOCAB, "dim": 16, "n_layers": 2, "n_heads": 2,
                                  "hidden_dim": 32, "activation": "gelu",
                                  "max_position_embeddings": 32, "num_labels": 3},
                   ("DistilBertModel", "DistilBertForMaskedLM",
                    "DistilBertForSequenceClassification")),
    # one token type (as the published checkpoints): its row, perturbed like every
    # parameter, is nonzero, so a restore that drops it shows
    "roberta": ("roberta", _ENCODER, ("RobertaModel", "RobertaForMaskedLM",
                                      "RobertaForSequenceClassification",
                                      "RobertaForTokenClassification")),
    "xlm_roberta": ("xlm-roberta", _ENCODER, ("XLMRobertaModel", "XLMRobertaForMaskedLM",
                                              "XLMRobertaForSequenceClassification",
                                              "XLMRobertaForTokenClassification")),
    # one group of one shared layer run twice, embeddings narrower than the hidden size
    "albert": ("albert", {"vocab_size": VOCAB, "embedding_size": 8, "hidden_size": 16,
                          "num_hidden_layers": 2, "num_hidden_groups": 1,
                          "inner_group_num": 1, "num_attention_heads": 2,
                          "intermediate_size": 32, "hidden_act": "gelu_new",
                          "max_position_embeddings": 32, "type_vocab_size": 2,
                          "num_labels": 3},
               ("AlbertModel", "AlbertForMaskedLM", "AlbertForSequenceClassification",
                "AlbertForTokenClassification")),
    # Gemma 3's text decoder: per-head q/k norms; both layers sliding (transformers'
    # default pattern, keras-hub's fixed one), the window 64 > the inputs
    "gemma3": ("gemma3_text", {**_GEMMA, "head_dim": 8, "query_pre_attn_scalar": 8,
                               "sliding_window": 64},
               ("Gemma3TextModel", "Gemma3ForCausalLM", "Gemma3TextForSequenceClassification")),
    # Gemma 4's text decoder: two sliding layers then a full one with wider heads (its
    # RoPE over a quarter of them), per-layer inputs; the window 64 > the inputs
    "gemma4": ("gemma4_text", {**_GEMMA, "head_dim": 8, "global_head_dim": 16,
                               "num_hidden_layers": 3, "sliding_window": 64,
                               "hidden_size_per_layer_input": 4,
                               "vocab_size_per_layer_input": VOCAB},
               ("Gemma4TextModel", "Gemma4ForCausalLM")),
    # the full layer's keys are its values (no v_proj), with 2 key heads of its own
    "gemma4_keqv": ("gemma4_text", {**_GEMMA, "head_dim": 8, "global_head_dim": 16,
                                    "num_hidden_layers": 3, "sliding_window": 64,
                                    "hidden_size_per_layer_input": 0,
                                    "attention_k_eq_v": True,
                                    "num_global_key_value_heads": 2},
                    ("Gemma4TextModel", "Gemma4ForCausalLM")),
    # a mixture of 4 experts (2 a token) beside each dense block; the last two layers reuse
    # the first two's keys and values (transformers computes those with per-layer inputs)
    "gemma4_moe": ("gemma4_text", {**_GEMMA, "head_dim": 8, "global_head_dim": 16,
                                   "num_hidden_layers": 4, "sliding_window": 64,
                                   "layer_types": ["sliding_attention", "full_attention"] * 2,
                                   "hidden_size_per_layer_input": 4,
                                   "vocab_size_per_layer_input": VOCAB,
                                   "num_kv_shared_layers": 2, "enable_moe_block": True,
                                   "num_experts": 4, "top_k_experts": 2,
                                   "moe_intermediate_size": 8},
                   ("Gemma4TextModel", "Gemma4ForCausalLM")),
    # Gemma 3n's text decoder: AltUp over 2 streams, Laurel (rank 4), per-layer inputs, a
    # sliding and a full layer twice, the last two reusing the first two's keys and values
    # (transformers 5 saves no k/v projections for them), layer 0 activation-sparse; the
    # window 64 > the inputs
    "gemma3n": ("gemma3n_text", {**{k: v for k, v in _GEMMA.items() if k != "num_labels"},
                                 "head_dim": 8, "num_key_value_heads": 2,
                                 "intermediate_size": 32, "num_hidden_layers": 4,
                                 "sliding_window": 64,
                                 "layer_types": ["sliding_attention", "full_attention"] * 2,
                                 "hidden_size_per_layer_input": 4,
                                 "vocab_size_per_layer_input": VOCAB, "altup_num_inputs": 2,
                                 "laurel_rank": 4, "num_kv_shared_layers": 2,
                                 "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]},
                ("Gemma3nTextModel", "Gemma3nForCausalLM")),
    # multimodal Gemma 4: the "gemma4" row's text decoder and a vision tower (width 24, its
    # heads 12 wide, clipped projections, standardized output); fed one image per example
    # (PATCHED_IMAGES); no audio tower (the next row has both classes)
    "gemma4_vision": ("gemma4", {"text_config": _GEMMA4_TEXT, "vision_config": _GEMMA4_VISION,
                                 **_GEMMA4_TOKENS},
                      ("Gemma4ForConditionalGeneration",)),
    # and an audio tower (a Conformer of width 16; 128 channels first, as many as the mel
    # bins keras-hub's encoder assumes); fed the same image and one clip (AUDIO_FRAMES)
    "gemma4_audio": ("gemma4", {"text_config": _GEMMA4_TEXT, "vision_config": _GEMMA4_VISION,
                                "audio_config": _GEMMA4_AUDIO, **_GEMMA4_TOKENS},
                     ("Gemma4Model", "Gemma4ForConditionalGeneration")),
    # Gemma 4's assistant (a draft model): two layers, a sliding and a full one of one head
    # width, both reading the target's keys and values; the target 24 wide
    "gemma4_assistant": ("gemma4_assistant", {
        "text_config": {**{k: v for k, v in _GEMMA.items() if k != "num_labels"},
                        "head_dim": 8, "global_head_dim": 8, "sliding_window": 64,
                        "layer_types": ["sliding_attention", "full_attention"],
                        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0},
        "backbone_hidden_size": ASSISTANT["gemma4_assistant"][0],
        "use_ordered_embeddings": False}, ("Gemma4AssistantForCausalLM",)),
    # Gemma 3n with its vision and audio towers (needs timm and torchvision: TIMM_ROWS): the
    # text decoder of the row above, its vocabulary 64 text tokens, then 8 of the vision
    # embedder and 8 of the audio one; a MobileNetV5 tower of three stages that timm builds
    # from `model_args` (GEMMA3N_TOWER: an edge residual, inverted residuals with and
    # without their depthwise convolutions, attention with and without down-sampled keys
    # and values), 32x32 images, 4 image tokens (its adapter pools to 2x2; its width 2048,
    # fixed by timm); the audio tower of tests/fixtures/hf_parts/gemma3n_audio, fed one
    # clip of 32 frames per example (4 audio tokens)
    "gemma3n_multimodal": ("gemma3n", {
        "text_config": {**{k: v for k, v in _GEMMA.items() if k != "num_labels"},
                        "vocab_size": VOCAB + 16, "head_dim": 8, "num_key_value_heads": 2,
                        "intermediate_size": 32, "num_hidden_layers": 4, "sliding_window": 64,
                        "layer_types": ["sliding_attention", "full_attention"] * 2,
                        "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": VOCAB,
                        "altup_num_inputs": 2, "laurel_rank": 4, "num_kv_shared_layers": 2,
                        "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]},
        "vision_config": {"architecture": "mobilenetv5_300m_enc", "hidden_size": 2048,
                          "vocab_size": 8, "vocab_offset": VOCAB,
                          "model_args": {"block_args": "GEMMA3N_TOWER", "stem_size": 8,
                                         "msfa_output_resolution": 2}},
        "audio_config": {"vocab_size": 8, "vocab_offset": VOCAB + 8, "input_feat_size": 16,
                         "hidden_size": 16, "rms_norm_eps": 1e-6, "gradient_clipping": 1e10,
                         "conf_attention_chunk_size": 4, "conf_attention_context_left": 5,
                         "conf_attention_context_right": 0, "conf_attention_logit_cap": 50.0,
                         "conf_num_attention_heads": 2, "conf_num_hidden_layers": 2,
                         "conf_conv_kernel_size": 3, "conf_reduction_factor": 2,
                         "conf_residual_weight": 0.5, "sscp_conv_channel_size": [8, 4],
                         "sscp_conv_group_norm_eps": 1e-3,
                         "sscp_conv_kernel_size": [[3, 3], [3, 3]],
                         "sscp_conv_stride_size": [[2, 2], [2, 2]]},
        "vision_soft_tokens_per_image": 4, "audio_soft_tokens_per_image": 4,
        "image_token_id": VOCAB + 1, "boi_token_id": VOCAB + 2, "eoi_token_id": VOCAB + 3,
        "audio_token_id": VOCAB + 9, "boa_token_id": VOCAB + 10, "eoa_token_id": VOCAB + 11},
        ("Gemma3nModel", "Gemma3nForConditionalGeneration")),
    # tied, as SmolLM3-3B is; layer 1 without RoPE (no_rope_layers: 0 = none)
    "smollm3": ("smollm3", {**_DECODER, "tie_word_embeddings": True, "no_rope_layers": [1, 0],
                            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
                ("SmolLM3Model", "SmolLM3ForCausalLM", "SmolLM3ForSequenceClassification")),
    # encoder-decoder: transformers feeds the decoder the inputs shifted right (no
    # decoder_input_ids given); keras-hub's BART has one size for encoder and decoder
    "bart": ("bart", {"vocab_size": VOCAB, "d_model": 16, "encoder_layers": 2,
                      "decoder_layers": 2, "encoder_attention_heads": 2,
                      "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
                      "decoder_ffn_dim": 32, "max_position_embeddings": 32,
                      "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
                      "decoder_start_token_id": 2, "forced_eos_token_id": None},
             ("BartModel", "BartForConditionalGeneration")),
    # encoder and decoder of one size (keras-hub's cross-attention takes the encoder's)
    "t5gemma": ("t5gemma", {"encoder": _T5GEMMA, "decoder": _T5GEMMA, "vocab_size": VOCAB,
                            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                ("T5GemmaModel", "T5GemmaForConditionalGeneration")),
    # T5Gemma 2: a Gemma 3 encoder (with its SigLIP tower: one 16x16 image of 4x4 patches per
    # example, pooled by 2 into 4 image tokens, vision width 24) and a decoder of merged
    # self and cross attention; image token 61, begin and end of image 62 and 63 (the end's
    # embedding is the learned `eoi_embedding`); no SigLIP pooling head (as the Hub's)
    "t5gemma2": ("t5gemma2", {
        "encoder": {"text_config": _T5GEMMA2, "mm_tokens_per_image": 4,
                    "vision_config": {"hidden_size": 24, "intermediate_size": 32,
                                      "num_hidden_layers": 2, "num_attention_heads": 2,
                                      "image_size": 16, "patch_size": 4,
                                      "layer_norm_eps": 1e-6, "vision_use_head": False}},
        "decoder": _T5GEMMA2, "vocab_size": VOCAB, "image_token_index": 61,
        "eoi_token_index": 63, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
        ("T5Gemma2Model", "T5Gemma2ForConditionalGeneration")),

    # mixtures of experts: 4 experts, 2 per token
    "mixtral": ("mixtral", {**_DECODER, "tie_word_embeddings": False, "sliding_window": 512,
                            "intermediate_size": 16, "num_local_experts": 4,
                            "num_experts_per_tok": 2},
                ("MixtralModel", "MixtralForCausalLM", "MixtralForSequenceClassification")),
    "qwen3_moe": ("qwen3_moe", {**_QWEN_MOE, "head_dim": 8, "norm_topk_prob": True},
                  ("Qwen3MoeModel", "Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification")),
    # layer 0 a dense MLP, layer 1 experts (decoder_sparse_step 2)
    "qwen3_moe_dense": ("qwen3_moe", {**_QWEN_MOE, "decoder_sparse_step": 2},
                        ("Qwen3MoeForCausalLM",)),
    "qwen2_moe": ("qwen2_moe", {**_QWEN_MOE, "shared_expert_intermediate_size": 12,
                                "norm_topk_prob": True},
                  ("Qwen2MoeModel", "Qwen2MoeForCausalLM", "Qwen2MoeForSequenceClassification")),
    # dense MLPs only (no layer i with (i + 1) a multiple of 3): keras-hub's QwenMoeBackbone
    # builds every layer as its layer 0, so it has no model of a mix of dense and sparse
    "qwen2_moe_dense": ("qwen2_moe", {**_QWEN_MOE, "shared_expert_intermediate_size": 12,
                                      "decoder_sparse_step": 3},
                        ("Qwen2MoeForCausalLM",)),
    # unquantized experts (what save_pretrained writes); the sliding window longer than the
    # inputs (keras-hub's window of 4 over 6 tokens is not transformers')
    "gpt_oss": ("gpt_oss", {**_DECODER, "tie_word_embeddings": False, "intermediate_size": 16,
                            "num_local_experts": 4, "num_experts_per_tok": 2,
                            "sliding_window": 8},
                ("GptOssModel", "GptOssForCausalLM", "GptOssForSequenceClassification")),

    "deit": ("deit", {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "intermediate_size": 32, "hidden_act": "gelu", "image_size": 16,
                      "patch_size": 4, "num_channels": 3, "qkv_bias": True, "num_labels": 3},
             ("DeiTModel", "DeiTForImageClassification",
              "DeiTForImageClassificationWithTeacher")),
    "dinov2": ("dinov2", _DINOV2, ("Dinov2Model", "Dinov2ForImageClassification",
                                   "Dinov2Backbone")),
    "dinov2_swiglu": ("dinov2", {**_DINOV2, "use_swiglu_ffn": True}, ("Dinov2Model",)),
    "dinov2_registers": ("dinov2_with_registers", {**_DINOV2, "num_register_tokens": 2},
                         ("Dinov2WithRegistersModel",
                          "Dinov2WithRegistersForImageClassification")),
    # 32 / 4 = 8 patches a side: windows of 2 in stage 0 (8 x 8) and after merging (4 x 4)
    "swin": ("swin", {"image_size": 32, "patch_size": 4, "num_channels": 3, "embed_dim": 8,
                      "depths": [2, 2], "num_heads": [2, 4], "window_size": 2,
                      "mlp_ratio": 2.0, "qkv_bias": True, "hidden_act": "gelu",
                      "num_labels": 3},
             ("SwinModel", "SwinForImageClassification")),
    # transformers has no DINOv3 ViT task class; the keys' bias flags as the Hub's models
    "dinov3": ("dinov3_vit", _DINOV3, ("DINOv3ViTModel", "DINOv3ViTBackbone")),
    "dinov3_gated": ("dinov3_vit", {**_DINOV3, "use_gated_mlp": True, "mlp_bias": False},
                     ("DINOv3ViTModel",)),
    # Gemma 3 with its SigLIP vision tower: one 32x32 image of 8x8 patches per example,
    # pooled by 4 (keras-hub's fixed pool) into 4 image tokens; the vision width (24) other
    # than the text's (16), so a transposed projection shows; no SigLIP pooling head (as
    # the Hub's Gemma 3 configs)
    "gemma3_vision": ("gemma3", {
        "text_config": {**{k: v for k, v in _GEMMA.items() if k != "num_labels"},
                        "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 64},
        "vision_config": {"hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 2,
                          "num_attention_heads": 2, "image_size": 32, "patch_size": 4,
                          "layer_norm_eps": 1e-6, "vision_use_head": False},
        "mm_tokens_per_image": 4, "image_token_index": 60, "boi_token_index": 61,
        "eoi_token_index": 62, "num_labels": 3},
        ("Gemma3Model", "Gemma3ForConditionalGeneration", "Gemma3ForSequenceClassification")),
    # PaliGemma: one 16x16 image of 16 patches (its 16 tokens lead the inputs); head_dim 16,
    # the patch count, which keras-hub's importer takes for head_dim; the image token past
    # the vocabulary (keras-hub's embedding stops before it); vision width 24, text 16
    "paligemma": ("paligemma", {
        "text_config": {**{k: v for k, v in _GEMMA.items() if k != "num_labels"},
                        "head_dim": 16},
        "vision_config": {"hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 2,
                          "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
                          "layer_norm_eps": 1e-6, "projection_dim": 16,
                          "vision_use_head": False},
        "image_token_index": VOCAB, "projection_dim": 16},
        ("PaliGemmaModel", "PaliGemmaForConditionalGeneration")),
    # ESM-2's layout: rotary positions, no embedding norm, tied output embedding;
    # token_dropout false (true scales the embeddings by 0.88, which keras-hub never does)
    "esm": ("esm", _ESM, ("EsmModel", "EsmForMaskedLM", "EsmForSequenceClassification",
                          "EsmForTokenClassification")),
    # ESM-1b's: absolute positions from pad_token_id + 1, a norm after the embeddings
    "esm_absolute": ("esm", {**_ESM, "position_embedding_type": "absolute",
                             "emb_layer_norm_before": True},
                     ("EsmModel", "EsmForMaskedLM")),
    # MetaCLIP 2: a text tower (causal, pooled at the first EOS, id 2) and a vision tower
    # of other widths (16, 24), both projected to 8; quick_gelu as the Hub's models
    "metaclip_2": ("metaclip_2", {
        "text_config": {"vocab_size": VOCAB, "hidden_size": 16, "intermediate_size": 32,
                        "num_hidden_layers": 2, "num_attention_heads": 2,
                        "max_position_embeddings": 32, "hidden_act": "quick_gelu",
                        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
        "vision_config": {"hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 2,
                          "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
                          "hidden_act": "quick_gelu"},
        "projection_dim": 8}, ("MetaClip2Model",)),
    # Qwen3.5's text decoder: a gated-delta-net (linear attention) layer, then a full one
    "qwen3_5": ("qwen3_5_text", _QWEN3_5,
                ("Qwen3_5TextModel", "Qwen3_5ForCausalLM",
                 "Qwen3_5TextForSequenceClassification")),
    # Qwen3.5-MoE's: every layer 4 experts (2 per token) and a shared expert
    "qwen3_5_moe": ("qwen3_5_moe_text", {**_QWEN3_5, "num_experts": 4,
                                         "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                                         "shared_expert_intermediate_size": 12},
                    ("Qwen3_5MoeTextModel", "Qwen3_5MoeForCausalLM")),
    # tied, as the small Qwen3.5s are
    "qwen3_5_tied": ("qwen3_5_text", {**_QWEN3_5, "tie_word_embeddings": True},
                     ("Qwen3_5ForCausalLM",)),
    # the published layout: the text decoder and a vision tower (one block); the oracle is
    # the text-only run
    "qwen3_5_vl": ("qwen3_5", {"text_config": {**_QWEN3_5, "num_labels": 3},
                               "vision_config": _QWEN3_5_VISION,
                               "tie_word_embeddings": False},
                   ("Qwen3_5Model", "Qwen3_5ForConditionalGeneration")),
    "qwen3_5_moe_vl": ("qwen3_5_moe", {"text_config": {**_QWEN3_5, "num_experts": 4,
                                                       "num_experts_per_tok": 2,
                                                       "moe_intermediate_size": 8,
                                                       "shared_expert_intermediate_size": 12},
                                       "vision_config": _QWEN3_5_VISION,
                                       "tie_word_embeddings": False},
                       ("Qwen3_5MoeModel", "Qwen3_5MoeForConditionalGeneration")),
    # BLIP-2: a ViT tower (width 24, one 16x16 image of 16 patches), a Q-Former of 4 queries
    # (width 8, cross-attention every second layer, as the Hub's) and the projection into
    # the language model (width 16), OPT or Flan-T5; the queries' 4 image tokens (id 63)
    # lead the text. transformers 5 always ties T5's lm_head to `shared` (folders hold no
    # `lm_head.weight`); tie_word_embeddings false (Flan-T5's) leaves its outputs unscaled
    "blip2_opt": ("blip-2", {**_BLIP2, "text_config": {
        "model_type": "opt", "vocab_size": VOCAB, "hidden_size": 16, "ffn_dim": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 32,
        "word_embed_proj_dim": 16, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2}},
        ("Blip2Model", "Blip2ForConditionalGeneration")),
    "blip2_t5": ("blip-2", {**_BLIP2, "text_config": {
        "model_type": "t5", "vocab_size": VOCAB, "d_model": 16, "d_kv": 8, "d_ff": 32,
        "num_layers": 2, "num_decoder_layers": 2, "num_heads": 2,
        "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "pad_token_id": 0,
        "eos_token_id": 1, "decoder_start_token_id": 0}},
        ("Blip2Model", "Blip2ForConditionalGeneration")),
    # SAM 3: the detector alone, and the video model (the detector beside the tracker)
    "sam3": ("sam3", _SAM3, ("Sam3Model",)),
    "sam3_video": ("sam3_video", {"detector_config": _SAM3, "tracker_config": _SAM3_TRACKER},
                   ("Sam3VideoModel",)),
}

# rows whose models transformers builds with timm (run with TIMM_TORCH's interpreter)
TIMM_ROWS = ("gemma3n_multimodal",)
# the multimodal Gemma 3n row's vision tower: timm block strings, given to timm decoded
# (`decode_arch_def`) as the vision config's model_args["block_args"]; a stage may not end
# in attention (timm's builder reads a stage's last block's pointwise convolution)
GEMMA3N_TOWER = [["er_r1_k3_s2_e2_c8"], ["uir_r1_a3_k5_s2_e2_c8", "uir_r1_a0_k0_s1_e2_c8"],
                 ["uir_r1_a3_k0_s2_e2_c8", "mqa_r1_k3_h2_v2_s1_d4_c8",
                  "mqa_r1_k3_h2_s1_d4_c8", "uir_r1_a0_k0_s1_e2_c8"]]

# model_type -> (image size, image tokens per image, the image token's id) of a model whose
# inputs hold text and one image per example: the ids hold the image tokens (after a
# begin-of-image token, before an end-of-image one), `token_type_ids` marks them, and
# `pixel_values` holds the images.
IMAGE_TOKENS = {"gemma3": (32, 4, 60), "t5gemma2": (16, 4, 61), "gemma3n": (32, 4, VOCAB + 1)}
# model_type -> (frames, features per frame, audio tokens per clip, the audio token's id) of
# a model whose inputs (IMAGE_TOKENS') end in one audio clip's tokens (after a
# begin-of-audio token, before an end-of-audio one): `input_features` holds the clips
# (log-mel frames), `input_features_mask` marks their valid frames (all of them).
AUDIO_TOKENS = {"gemma3n": (32, 16, 4, VOCAB + 9)}
# model_type -> (image size, query tokens, the image token's id) of a model whose language
# model reads its image as queries in place of the image tokens that lead the ids (BLIP-2):
# `pixel_values` holds one image per example; `decoder_input_ids` (the text shifted right
# behind token 0) feed an encoder-decoder language model (Flan-T5), OPT's rows never read them.
QUERY_IMAGES = {"blip-2": (16, 4, VOCAB - 1)}
# model_type -> (patches a side, patch size, pooling, the image token's id) of a model fed
# one image per example as patches (Gemma 4): `pixel_values` (batch, patches, patch * patch *
# 3) in [0, 1], `image_position_ids` (batch, patches, 2) their (x, y); the ids hold the image's
# pooled tokens after a begin-of-image token (id + 1), before an end-of-image one (id + 2),
# the text's ids below the image token's.
PATCHED_IMAGES = {"gemma4": (4, 4, 2, 57)}
# model_type -> (frames, the audio token's id) of a model with an audio tower fed one clip per
# example after its image: `input_features` (batch, frames, 128 mel bins) and its mask; the
# ids hold its tokens (frames / 4) between begin (id + 1) and end (id + 2) of audio.
AUDIO_FRAMES = {"gemma4": (16, 60)}
# model_type -> (image size, image tokens, the image token's id) of a model whose inputs
# lead with one image's tokens, then text: `token_type_ids` marks the response (the text's
# second half; the image and the text's first half are the prefix, attended both ways).
PREFIX_IMAGES = {"paligemma": (16, 16, VOCAB)}


# Hub classes whose keys transformers 5 renames at load (its conversion_mapping.py: for
# these rows the "ViTModel" entry, which every ViT class picks up through its `vit`
# submodule and DeiT through "DeiTModel"; "Dinov2Model", "Dinov2WithRegistersModel", "swin"
# and "dinov3_vit"; the other rows' classes have none, save for the "legacy" LayerNorm
# gamma/beta renaming every model gets) -> the dtypes in which the folder is also written in
# the new form, `save_pretrained(save_original_format=False)`, as `<folder>-v5names`.
NEW_FORM = {("vit", "ViTModel"): ("float32",),
            ("vit", "ViTForImageClassification"): ("float32", "bfloat16"),
            # mixtures of experts: each layer's experts in one tensor per bank
            ("mixtral", "MixtralForCausalLM"): ("float32", "bfloat16"),
            ("qwen3_moe", "Qwen3MoeForCausalLM"): ("float32", "bfloat16"),
            ("qwen2_moe", "Qwen2MoeForCausalLM"): ("float32", "bfloat16"),
            # DeiT: conversion_mapping.py maps "DeiTModel" to the "ViTModel" entry
            ("deit", "DeiTModel"): ("float32",),
            ("deit", "DeiTForImageClassification"): ("float32", "bfloat16"),
            ("deit", "DeiTForImageClassificationWithTeacher"): ("float32",),
            # DINOv2: the attention renamed, a SwiGLU's weights_in split in two
            ("dinov2", "Dinov2Model"): ("float32", "bfloat16"),
            ("dinov2", "Dinov2ForImageClassification"): ("float32",),
            ("dinov2_swiglu", "Dinov2Model"): ("float32", "bfloat16"),
            ("dinov2_registers", "Dinov2WithRegistersModel"): ("float32",),
            ("swin", "SwinModel"): ("float32",),
            ("swin", "SwinForImageClassification"): ("float32", "bfloat16"),
            ("dinov3", "DINOv3ViTModel"): ("float32", "bfloat16"),
            ("dinov3_gated", "DINOv3ViTModel"): ("float32",),
            # the vision tower without `vision_model.`, the rest under `model.`
            ("gemma3_vision", "Gemma3Model"): ("float32",),
            ("gemma3_vision", "Gemma3ForConditionalGeneration"): ("float32", "bfloat16"),
            ("paligemma", "PaliGemmaModel"): ("float32",),
            ("paligemma", "PaliGemmaForConditionalGeneration"): ("float32", "bfloat16"),
            ("qwen3_5_moe", "Qwen3_5MoeForCausalLM"): ("float32", "bfloat16")}
NEW_FORM_SUFFIX = "-v5names"


def folder_name(case: str, cls: str, dtype: str, new_form: bool = False) -> str:
    return f"{case}-{cls}-{dtype}" + (NEW_FORM_SUFFIX if new_form else "")


# model_type -> the side of the square images its rows take (image models only)
# model_type -> image size of a text-image contrastive model (CLIP's kind): fed text and an
# image, its oracle is the logits of each against the other, the projected embeddings and
# each tower's last hidden state (`last_hidden_state`: the text's).
CONTRASTIVE = {"metaclip_2": 16}
IMAGE_SIZES = {"vit": 16, "deit": 16, "dinov2": 16, "dinov2_with_registers": 16,
               "swin": 32, "dinov3_vit": 16}


def inputs(model_type: str, config=None) -> dict:
    """The fixed inputs, as NumPy arrays in Keras's layout (int32 ids, NHWC images); `config`
    (the model's, optional) says whether a Gemma 4 has an audio tower to feed."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    if model_type in SAM3:  # an image and a text prompt (no box: see _run_sam3)
        return {"pixel_values": rng.normal(size=(BATCH, 28, 28, 3)).astype("float32"),
                "input_ids": rng.integers(3, VOCAB, size=(BATCH, LENGTH)).astype("int32"),
                "attention_mask": np.ones((BATCH, LENGTH), "int32")}
    if model_type in ASSISTANT:
        width, heads, head_dim = ASSISTANT[model_type]
        out = {"inputs_embeds": rng.normal(size=(BATCH, 1, 2 * width)).astype("float32"),
               "position_ids": np.full((BATCH, 1), LENGTH - 1, "int32")}
        for kind in ("sliding", "full"):  # (batch, heads, positions, head_dim), as torch's
            for part in ("keys", "values"):
                out[f"{kind}_{part}"] = rng.normal(
                    size=(BATCH, heads, LENGTH, head_dim)).astype("float32")
        return out
    if model_type in IMAGE_SIZES:
        size = IMAGE_SIZES[model_type]
        return {"pixel_values": rng.normal(size=(BATCH, size, size, 3)).astype("float32")}
    out = {"input_ids": rng.integers(3, VOCAB, size=(BATCH, LENGTH)).astype("int32"),
           "attention_mask": np.ones((BATCH, LENGTH), "int32")}
    if model_type in IMAGE_TOKENS:  # text, then one image's tokens, then text
        size, count, token = IMAGE_TOKENS[model_type]
        ids = out["input_ids"] % (token - 3) + 3  # no image token among the text
        images = np.full((BATCH, count + 2), token, "int32")
        images[:, 0], images[:, -1] = token + 1, token + 2  # begin and end of image
        ids = np.concatenate([ids[:, :2], images, ids[:, 2:]], axis=1)
        out = {"input_ids": ids, "attention_mask": np.ones_like(ids),
               "token_type_ids": (ids == token).astype("int32"),
               "pixel_values": rng.normal(size=(BATCH, size, size, 3)).astype("float32")}
    if model_type in PATCHED_IMAGES:  # text, one image's tokens, text
        side, patch, pool, token = PATCHED_IMAGES[model_type]
        ids = out["input_ids"] % (token - 3) + 3
        images = np.full((BATCH, (side // pool) ** 2 + 2), token, "int32")
        images[:, 0], images[:, -1] = token + 1, token + 2
        audio = getattr(config, "audio_config", None) is not None
        if audio:  # then one clip's tokens (its frames subsampled by 4)
            frames, clip = AUDIO_FRAMES[model_type]
            clips = np.full((BATCH, frames // 4 + 2), clip, "int32")
            clips[:, 0], clips[:, -1] = clip + 1, clip + 2
            images = np.concatenate([images, clips], axis=1)
        ids = np.concatenate([ids[:, :2], images, ids[:, 2:]], axis=1)
        grid = np.stack(np.meshgrid(np.arange(side), np.arange(side), indexing="xy"), -1)
        out = {"input_ids": ids, "attention_mask": np.ones_like(ids),
               "pixel_values": rng.uniform(size=(BATCH, side * side, patch * patch * 3)
                                           ).astype("float32"),
               "image_position_ids": np.broadcast_to(grid.reshape(-1, 2).astype("int32"),
                                                     (BATCH, side * side, 2)).copy()}
        if audio:  # log-mel frames (128 bins), every frame valid
            out["input_features"] = rng.normal(size=(BATCH, frames, 128)).astype("float32")
            out["input_features_mask"] = np.ones((BATCH, frames), "int32")
    if model_type in AUDIO_TOKENS:  # then one clip's tokens; the clip, every frame valid
        frames, features, count, token = AUDIO_TOKENS[model_type]
        clip = np.full((BATCH, count + 2), token, "int32")
        clip[:, 0], clip[:, -1] = token + 1, token + 2  # begin and end of audio
        ids = np.concatenate([out["input_ids"], clip], axis=1)
        out.update(input_ids=ids, attention_mask=np.ones_like(ids),
                   token_type_ids=np.pad(out["token_type_ids"], ((0, 0), (0, count + 2))),
                   input_features=rng.normal(size=(BATCH, frames, features)).astype("float32"),
                   input_features_mask=np.ones((BATCH, frames), bool))
    if model_type in PREFIX_IMAGES:  # one image's tokens, then text (prefix, response)
        size, count, token = PREFIX_IMAGES[model_type]
        ids = np.concatenate([np.full((BATCH, count), token, "int32"), out["input_ids"]], 1)
        response = (np.arange(ids.shape[1]) >= count + LENGTH // 2).astype("int32")
        out = {"input_ids": ids, "attention_mask": np.ones_like(ids),
               "token_type_ids": np.tile(response, (BATCH, 1)),
               "pixel_values": rng.normal(size=(BATCH, size, size, 3)).astype("float32")}
    if model_type in QUERY_IMAGES:  # the queries' image tokens, then text; an image
        size, count, token = QUERY_IMAGES[model_type]
        text = out["input_ids"] % (token - 3) + 3  # no image token among the text
        ids = np.concatenate([np.full((BATCH, count), token, "int32"), text], 1)
        out = {"input_ids": ids, "attention_mask": np.ones_like(ids),
               "pixel_values": rng.normal(size=(BATCH, size, size, 3)).astype("float32"),
               "decoder_input_ids": np.concatenate(
                   [np.zeros((BATCH, 1), "int32"), text[:, :-1]], axis=1)}
    if model_type in CONTRASTIVE:  # text ending in its EOS (id 2), and an image
        size = CONTRASTIVE[model_type]
        out["input_ids"][:, -1] = 2
        out["pixel_values"] = rng.normal(size=(BATCH, size, size, 3)).astype("float32")
    if model_type in _SEQ2SEQ:
        out["decoder_input_ids"] = np.concatenate(
            [np.full((BATCH, 1), 2, "int32"), out["input_ids"][:, :-1]], axis=1)
    if model_type in ("bert", "albert"):
        out["token_type_ids"] = (np.arange(LENGTH)[None] >= LENGTH // 2).astype(
            "int32").repeat(BATCH, 0)
    return out


def _check_versions():
    import torch
    import transformers

    found = {"transformers": transformers.__version__, "torch": torch.__version__}
    if found != PINNED and found != {**PINNED, "torch": TIMM_TORCH}:
        sys.exit(f"make_hf_fixtures.py is pinned to {PINNED}; found {found}. Install the "
                 "pinned versions, or change PINNED on purpose and regenerate every fixture.")


def _torch_inputs(model_type: str, config=None) -> dict:
    import torch

    out = {}
    for key, value in inputs(model_type, config).items():
        tensor = torch.from_numpy(value)
        if key == "pixel_values" and tensor.dim() == 4:  # images (patches: as they are)
            tensor = tensor.permute(0, 3, 1, 2).contiguous()
        elif key == "input_features_mask":  # transformers indexes by it: a boolean mask
            tensor = tensor.bool()
        elif value.dtype.kind in "iu":  # ids and masks (a bool mask stays one)
            tensor = tensor.long()
        out[key] = tensor
    return out


def _run(model, model_type: str) -> dict:
    """transformers' outputs: the base model's last hidden state (and pooler), the logits."""
    import torch

    import transformers

    feed = _torch_inputs(model_type, model.config)
    if model_type in SAM3:
        return _run_sam3(model, feed)
    out = {}
    if model_type in ASSISTANT:  # one draft step, not a base model
        return _assistant_step(model, feed)
    # the base model: `base_model` finds it by the class's prefix, which names an inner
    # module in a base model that has one of that name (DINOv3 ViT's `model`, its encoder)
    base_class = transformers.MODEL_MAPPING[type(model.config)]
    backbone = type(model).__name__.endswith("Backbone")
    if isinstance(model, base_class):
        base_model = model
    elif backbone:  # feature maps, no last hidden state: the base model of its weights,
        base_model = base_class(model.config)  # which it holds under the same names
        base_model.load_state_dict(model.state_dict(), strict=True)
        base_model.eval()
    else:
        base_model = model.base_model
    if model_type in QUERY_IMAGES:
        return _run_query_images(model, feed)
    if model_type in CONTRASTIVE:  # both towers, not one base model
        with torch.no_grad():
            result = model(**feed)
        out = {k: getattr(result, k) for k in (
            "logits_per_image", "logits_per_text", "image_embeds", "text_embeds")}
        # each tower's last hidden state (the text's after its final norm, the vision's
        # before its post-norm, as transformers returns them)
        out["last_hidden_state"] = result.text_model_output.last_hidden_state
        out["vision_last_hidden_state"] = result.vision_model_output.last_hidden_state
        return {k: v.float().numpy() for k, v in out.items()}
    with torch.no_grad():
        base = base_model(**feed)
        out["last_hidden_state"] = base.last_hidden_state
        if getattr(base, "pooler_output", None) is not None:
            out["pooler_output"] = base.pooler_output
        if getattr(base, "encoder_last_hidden_state", None) is not None:  # encoder-decoder
            out["encoder_last_hidden_state"] = base.encoder_last_hidden_state
        if base_model is not model and not backbone:
            result = model(**feed)
            out["logits"] = getattr(result, "logits", None)
            if out["logits"] is None:  # BertForPreTraining
                out["logits"] = result.prediction_logits
                out["seq_relationship_logits"] = result.seq_relationship_logits
    return {k: v.float().numpy() for k, v in out.items()}


def _run_query_images(model, feed: dict) -> dict:
    """BLIP-2's outputs (its base model gives no last hidden state): the language model's
    last hidden state after its final norm (an encoder-decoder's decoder's, with
    `encoder_last_hidden_state`: queries and text), the vision tower's (after its
    post-norm) and the Q-Former's, and the logits of a class other than the base model."""
    import torch

    language = model.language_model
    if model.config.use_decoder_only_language_model:
        feed = {k: v for k, v in feed.items() if k != "decoder_input_ids"}
        norms = {"last_hidden_state": language.model.decoder.final_layer_norm}
    else:
        norms = {"last_hidden_state": language.decoder.final_layer_norm,
                 "encoder_last_hidden_state": language.encoder.final_layer_norm}
    out = {}
    hooks = [norm.register_forward_hook(
        lambda _module, _args, value, key=key: out.__setitem__(key, value))
        for key, norm in norms.items()]
    try:
        with torch.no_grad():
            result = model(**feed)
    finally:
        for hook in hooks:
            hook.remove()
    out["vision_last_hidden_state"] = result.vision_outputs.last_hidden_state
    out["qformer_last_hidden_state"] = result.qformer_outputs.last_hidden_state
    if not isinstance(model, _base_class(model)):
        out["logits"] = result.logits
    return {k: v.float().numpy() for k, v in out.items()}


def _base_class(model):
    """The base model class of `model`'s config (`Blip2Model` for every BLIP-2 class)."""
    import transformers

    return transformers.MODEL_MAPPING[type(model.config)]


# SAM 3 (the detector; the video model's `detector_model`): fed an image and a text prompt,
# no box (transformers' geometry encoder pools boxes with torchvision's roi_align, which
# this environment lacks; with no box it is not run, and keras-hub's backbone always runs
# its own, so the oracle's detection outputs are compared with keras-hub's layers composed
# as its backbone composes them, the geometry encoder left out)
SAM3 = ("sam3", "sam3_video")


def _run_sam3(model, feed: dict) -> dict:
    """The detector's outputs: the ViT's last hidden state, each FPN level (NHWC), the
    projected text features, and the detections on the text prompt."""
    import torch

    detector = getattr(model, "detector_model", model)
    with torch.no_grad():
        vision = detector.vision_encoder(feed["pixel_values"])
        text = detector.get_text_features(input_ids=feed["input_ids"],
                                          attention_mask=feed["attention_mask"])
        result = detector(**feed)
    out = {"last_hidden_state": vision.last_hidden_state,
           "text_features": text.pooler_output}
    for level, state in enumerate(vision.fpn_hidden_states):
        out[f"fpn_hidden_state_{level}"] = state.permute(0, 2, 3, 1)
    for key in ("pred_logits", "pred_boxes", "pred_masks", "presence_logits", "semantic_seg"):
        out[key] = getattr(result, key)
    return {k: v.float().numpy() for k, v in out.items()}


def _assistant_step(model, feed: dict) -> dict:
    """A draft model's step: its logits, the projected state it returns
    (`projected_state`), the decoder's input (`decoder_inputs_embeds`: after
    `pre_projection`, what a keras-hub backbone takes) and output (`last_hidden_state`,
    after the final norm)."""
    import torch

    seen = {}

    def keep(name, of):  # a hook that records, returning None (the output stays as it is)
        return lambda _module, _inputs, output: seen.update({name: of(output)}) and None

    hooks = [model.pre_projection.register_forward_hook(
                 keep("decoder_inputs_embeds", lambda out: out)),
             model.model.register_forward_hook(
                 keep("last_hidden_state", lambda out: out.last_hidden_state))]
    shared = {f"{kind}_attention": (feed[f"{kind}_keys"], feed[f"{kind}_values"])
              for kind in ("sliding", "full")}
    try:
        with torch.no_grad():
            result = model(inputs_embeds=feed["inputs_embeds"],
                           position_ids=feed["position_ids"], shared_kv_states=shared)
    finally:
        for hook in hooks:
            hook.remove()
    out = {**seen, "logits": result.logits, "projected_state": result.last_hidden_state}
    return {k: v.float().numpy() for k, v in out.items()}


def _perturb(model, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, parameter in sorted(model.named_parameters()):
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
            parameter.add_(noise * SCALE)


def _build(model_type: str, config: dict, cls: str, seed: int):
    import torch
    import transformers

    torch.manual_seed(seed)
    model_args = config.get("vision_config", {}).get("model_args", {})
    if model_args.get("block_args") == "GEMMA3N_TOWER":  # timm's decoded blocks
        from timm.models._efficientnet_builder import decode_arch_def

        model_args = {**model_args, "block_args": decode_arch_def(GEMMA3N_TOWER)}
        config = {**config, "vision_config": {**config["vision_config"],
                                              "model_args": copy.deepcopy(model_args)}}
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    hf_config.architectures = [cls]
    model = getattr(transformers, cls)(hf_config)
    if model_args:  # timm's builder takes each block's kind out of the dicts it is given
        model.config.vision_config.model_args = model_args  # (the config's): as given
    model.config._attn_implementation = "eager"
    model.eval()
    _perturb(model, seed)
    if model_type in BOUNDED_BUFFERS:
        _bound(model, seed)
    return model


# model_types whose buffers that are weights (Gemma 4's clipping bounds, its vision tower's
# standardization) transformers initialises to values that hide a mix-up (every bound
# infinite, the standardization the identity): `_bound` sets them to finite seeded values
# (bounds that clip some activations), so a restore that swaps or drops one shows.
BOUNDED_BUFFERS = ("gemma4",)


def _bound(model, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, buffer in sorted(model.named_buffers()):
            leaf = name.rsplit(".", 1)[-1]
            if leaf not in ("input_min", "input_max", "output_min", "output_max", "std_bias",
                            "std_scale"):
                continue
            draw = torch.rand(buffer.shape, generator=generator, dtype=torch.float32)
            if leaf.endswith(("_min", "_max")):  # a bound between 1 and 3 from zero
                value = (1.0 + 2.0 * draw) * (-1.0 if leaf.endswith("_min") else 1.0)
            else:  # a bias near 0, a scale near 1
                value = (draw - 0.5) * 0.2 + (1.0 if leaf == "std_scale" else 0.0)
            buffer.copy_(value.to(buffer.dtype))


def _save(model, model_type: str, cls: str, dtype: str, path: str, **kwargs) -> None:
    """The folder (`save_pretrained`, `kwargs` passed on) and its oracle beside it."""
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import save_file

    model.save_pretrained(path, safe_serialization=True, **kwargs)
    # transformers' float32 run of the folder: the weights as saved (bfloat16: rounded,
    # then widened), the buffers it computes (RoPE) in float32
    oracle_model = getattr(transformers, cls).from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")
    oracle_model.eval()
    oracle = {**inputs(model_type, oracle_model.config), **_run(oracle_model, model_type)}
    save_file({k: np.ascontiguousarray(v) for k, v in oracle.items()},
              path + ".oracle.safetensors",
              metadata={"oracle": json.dumps({  # one key: its order is fixed
                  "transformers": PINNED["transformers"], "class": cls,
                  "dtype": dtype, "run": "float32, eager attention"},
                  sort_keys=True)})


def _check_new_form(original: str, new: str, cls: str = "") -> None:
    """The new-form folder holds the original's tensors (bytes, dtypes, shapes) under other
    names for some of them, or (experts joined into one tensor per bank) tensors that
    transformers loads into the same parameters, bit for bit; the same config.json: else
    transformers wrote no new form."""
    import torch
    from safetensors import safe_open

    def tensors(folder):
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    def contents(found):  # each tensor as (dtype, shape, bytes), in a fixed order
        return sorted((str(t.dtype), tuple(t.shape),
                       t.contiguous().flatten().view(torch.uint8).numpy().tobytes())
                      for t in found.values())

    def loaded(folder):  # the state transformers loads from the folder
        import transformers

        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            cls = json.load(f)["architectures"][0]
        model = getattr(transformers, cls).from_pretrained(folder)
        return {k: v for k, v in model.state_dict().items()}

    first, second = tensors(original), tensors(new)
    # the same bytes under other names; or, where transformers 5 splits a tensor (a fused
    # SwiGLU input projection into two halves; a mixture of experts' experts joined into
    # one tensor per bank), the same model once loaded
    if set(first) <= set(second) or (contents(first) != contents(second) and contents(
            loaded(original)) != contents(loaded(new))):
        sys.exit(f"{new}: expected the tensors of {original}, some under other names; "
                 f"found the names {sorted(second)}")
    with open(os.path.join(original, "config.json"), "rb") as f, \
            open(os.path.join(new, "config.json"), "rb") as g:
        if f.read() != g.read():
            sys.exit(f"{new}: its config.json differs from {original}'s")


def seed_of(case: str, cls: str) -> int:
    """The seed of one row's class: from their names (crc32), so a row added anywhere in ROWS
    leaves every other folder's bytes as they were."""
    return SEED + zlib.crc32(f"{case}/{cls}".encode("utf-8")) % 1_000_000


def write_fixtures(out: str = FIXTURES, only=()) -> list:
    """Every row's folders that this interpreter writes (TIMM_ROWS with TIMM_TORCH, the
    others with PINNED's torch; the folder `out` emptied of all but the other interpreter's
    rows first), or only those of the cases `only` (the others' files left as they are:
    each folder's seed comes from its row's and class's names, `seed_of`, not from its
    place in ROWS)."""
    import torch

    torch.set_num_threads(1)
    unknown = sorted(set(only) - set(ROWS))
    if unknown:
        sys.exit(f"--only: no row {unknown}; the rows are {sorted(ROWS)}")
    # the rows this interpreter writes: TIMM_ROWS with TIMM_TORCH (which has torchvision),
    # the others with PINNED's torch; a run without --only leaves the others' files alone
    timm = torch.__version__ == TIMM_TORCH
    here = [case for case in ROWS if (case in TIMM_ROWS) == timm]
    elsewhere = sorted(set(only) - set(here))
    if elsewhere:
        sys.exit(f"--only {elsewhere}: written with torch "
                 f"{PINNED['torch'] if timm else TIMM_TORCH} (TIMM_ROWS: {list(TIMM_ROWS)} "
                 f"need timm and torchvision); this interpreter has torch {torch.__version__}")
    rows = list(only) or here
    for name in os.listdir(out) if os.path.isdir(out) else ():
        if name.split("-")[0] in rows or (not only and name.split("-")[0] not in ROWS):
            path = os.path.join(out, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(out, exist_ok=True)
    written = []
    for case, (model_type, config, classes) in ROWS.items():
        if case not in rows:
            continue
        for cls in classes:
            model = _build(model_type, config, cls, seed_of(case, cls))
            for dtype in DTYPES:
                name = folder_name(case, cls, dtype)
                path = os.path.join(out, name)
                model.to(getattr(torch, dtype))
                _save(model, model_type, cls, dtype, path)
                written.append(name)
                if dtype in NEW_FORM.get((case, cls), ()):
                    name = folder_name(case, cls, dtype, new_form=True)
                    _save(model, model_type, cls, dtype, os.path.join(out, name),
                          save_original_format=False)
                    _check_new_form(path, os.path.join(out, name), cls)
                    written.append(name)
    return written


# Cases whose export holds entries a Sum rule added into one variable (RoBERTa's position
# rows and its token-type row, which keras-hub's backbone holds as one): exported in
# bfloat16, that sum is rounded once more than transformers' run of the original folder
# (which adds the two in float32), so outputs agree within that rounding, not 1e-5
# (measured: at most 7.8e-3 here). In float32 they agree within 1e-5.
FOLDED = ("roberta", "xlm_roberta")
FOLDED_BF16_TOLERANCE = 2e-2


# Cases whose export lacks entries no keras-hub model holds, which transformers makes
# itself when it loads the export (ESM: the rotary frequencies, computed from the config,
# and the contact-prediction head, initialised anew: no output here reads it). Those, and
# only those, may be `missing_keys`.
EXPORT_MISSING = {"esm": ("esm.rotary_embeddings.inv_freq", "esm.contact_head.regression.weight",
                          "esm.contact_head.regression.bias"),
                  "esm_absolute": ("esm.contact_head.regression.weight",
                                   "esm.contact_head.regression.bias"),
                  # SAM 3: the CLIP tower's own projection and the pixel decoder's stage past
                  # the FPN levels it reads (no output reads them; keras-hub has neither)
                  "sam3": ("text_encoder.text_projection.weight",
                           *(f"mask_decoder.pixel_decoder.{k}.2.{w}"
                             for k in ("conv_layers", "norms") for w in ("weight", "bias")))}


def _export_tolerance(name: str) -> float:
    if name.split("-")[0] in FOLDED and name.endswith("-bfloat16"):
        return FOLDED_BF16_TOLERANCE
    return 1e-5


def check_exports(folder: str, fixtures: str = FIXTURES) -> int:
    """Each folder under `folder` loaded by transformers and compared with its oracle."""
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import load_file

    torch.set_num_threads(1)
    rows, failed, skipped = [], 0, 0
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(os.path.join(path, "config.json")):
            continue
        if (name.split("-")[0] in TIMM_ROWS) != (torch.__version__ == TIMM_TORCH):
            rows.append((name, "-", f"not checked: needs torch {TIMM_TORCH} and timm"
                         if name.split("-")[0] in TIMM_ROWS else
                         f"not checked: written with torch {PINNED['torch']}", "skipped"))
            skipped += 1
            continue
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        cls = (config.get("architectures") or [None])[0]
        oracle_path = os.path.join(fixtures, name + ".oracle.safetensors")
        if cls is None or not os.path.isfile(oracle_path):
            why = ("no `architectures` in config.json" if cls is None
                   else f"no fixture {name!r} under {fixtures}")
            rows.append((name, cls or "-", why, "FAIL"))
            failed += 1
            continue
        model, info = getattr(transformers, cls).from_pretrained(
            path, output_loading_info=True, attn_implementation="eager",
            dtype=torch.float32)
        model.eval()
        allowed = set(EXPORT_MISSING.get(name.split("-")[0], ()))
        if set(info.get("missing_keys", ())) == allowed:
            info = {**info, "missing_keys": ()}
        problems = {k: sorted(v) for k, v in info.items()
                    if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        oracle = load_file(oracle_path)
        ours = _run(model, config["model_type"])
        worst = 0.0
        for key, value in ours.items():
            if key in oracle:
                worst = max(worst, float(np.max(np.abs(value - oracle[key]))))
        compared = ",".join(k for k in ours if k in oracle)
        ok = not problems and compared and worst <= _export_tolerance(name)
        failed += not ok
        rows.append((name, cls, f"{problems or 'none'}; max |diff| {worst:.1e} ({compared})",
                     "ok" if ok else "FAIL"))
    width = max((len(r[0]) for r in rows), default=10)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: "
          f"from_pretrained(output_loading_info=True) of {folder}")
    print(f"{'folder':<{width}}  {'class':<32}  {'missing/unexpected/mismatched; outputs':<60}  "
          "result")
    for row in rows:
        print(f"{row[0]:<{width}}  {row[1]:<32}  {row[2]:<60}  {row[3]}")
    print(f"{len(rows) - failed - skipped} of {len(rows)} ok"
          + (f", {skipped} skipped (the other interpreter's rows)" if skipped else ""))
    return 1 if failed or len(rows) == skipped else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check-exports", metavar="DIR",
                        help="load each exported folder under DIR with transformers")
    parser.add_argument("--out", default=FIXTURES, help="where the fixtures go")
    parser.add_argument("--only", nargs="+", default=(), metavar="CASE",
                        help="write only these rows of ROWS (the other folders untouched)")
    args = parser.parse_args(argv)
    _check_versions()
    if args.check_exports:
        return check_exports(args.check_exports, args.out)
    names = write_fixtures(args.out, args.only)
    print(f"wrote {len(names)} folders under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
