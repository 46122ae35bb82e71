"""The table of Hugging Face folders that transformers wrote, and their keras-hub models.

One row per (configuration, Hub class) that tests/helpers/make_hf_fixtures.py writes, in
float32 and bfloat16 (`tests/fixtures/hf/<case>-<Class>-<dtype>/`, its oracle beside it as
`<folder>.oracle.safetensors`), and one per class it also writes in transformers 5's key form
(`<folder>-v5names/`, in the dtypes the row lists). Each row says which keras-hub backbone
the folder's config.json describes (built with keras-hub's own `convert_backbone_config`),
the keras-hub task model that holds the class's head (None where keras-hub has none), the entries of the
folder that are the head (set aside when it goes into the backbone), the backbone variables
the class lacks, and which oracle output the task model's output is. The next architecture
adds rows here and in make_hf_fixtures.py's ROWS.

Run as a script (with Keras 3 and keras-hub; no transformers) it writes objckpt's exports of
the rows that export whole into tests/fixtures/hf_exports/ (see `export_rows`), which
`make_hf_fixtures.py --check-exports` loads with transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures", "hf")
EXPORTS = os.path.join(ROOT, "fixtures", "hf_exports")
DTYPES = ("float32", "bfloat16")
NEW_FORM = "v5names"  # the folders make_hf_fixtures.py saves in transformers 5's key form

# model_type -> keras-hub's converter module (its `backbone_cls`, `convert_backbone_config`).
CONVERTERS = {"llama": "convert_llama3", "mistral": "convert_mistral", "gemma": "convert_gemma",
              "gemma2": "convert_gemma", "gpt2": "convert_gpt2", "bert": "convert_bert",
              "vit": "convert_vit", "qwen2": "convert_qwen", "qwen3": "convert_qwen3",
              "distilbert": "convert_distilbert", "roberta": "convert_roberta",
              "xlm-roberta": "convert_xlm_roberta", "albert": "convert_albert",
              "gemma3_text": "convert_gemma3", "smollm3": "convert_smollm3",
              "bart": "convert_bart", "t5gemma": "convert_t5gemma", "mixtral": "convert_mixtral",
              "qwen2_moe": "convert_qwen_moe", "qwen3_moe": "convert_qwen3_moe",
              "gpt_oss": "convert_gpt_oss", "deit": "convert_deit",
              "dinov2": "convert_dinov2", "dinov2_with_registers": "convert_dinov2",
              "swin": "convert_swin_transformer", "dinov3_vit": "convert_dinov3",
              "gemma3": "convert_gemma3", "paligemma": "convert_pali_gemma",
              "esm": "convert_esm", "qwen3_5_text": "convert_qwen3_5",
              "qwen3_5_moe_text": "convert_qwen3_5_moe", "qwen3_5": "convert_qwen3_5",
              "qwen3_5_moe": "convert_qwen3_5_moe", "metaclip_2": "convert_metaclip_2",
              "gemma4_text": "convert_gemma4", "t5gemma2": "convert_t5gemma2",
              "blip-2": "convert_blip2",
              "sam3": "convert_sam3", "sam3_video": "convert_sam3",
              "gemma3n_text": "convert_gemma3n", "gemma3n": "convert_gemma3n",
              "gemma4": "convert_gemma4", "gemma4_assistant": "convert_gemma4_assistant"}
# text-image contrastive models (CLIP's kind): fed text and an image, compared on the
# logits of each against the other, the projected embeddings and each tower's last hidden state
CONTRASTIVE = ("metaclip_2",)


class Case(NamedTuple):
    """One Hub class of one configuration (both dtypes)."""

    case: str  # the configuration: make_hf_fixtures.ROWS's key
    cls: str  # the transformers class that wrote the folder
    task: str | None  # the keras-hub task model holding the head, or None
    head: tuple = ()  # the folder's entries with no backbone variable (set aside there)
    lacks: tuple = ()  # backbone variables (paths) the folder has no entry for
    # backbone variables keras-hub computes from the config, in no folder (restore leaves
    # them as they are, listed under `skipped`; export writes none)
    computed: tuple = ()
    # the folder's entries (unprefixed) that export does not give back byte for byte, where
    # transformers computes the same from what it writes (or leaves out)
    export_differs: tuple = ()
    # The task model's logits against transformers' (float32 models; rtol = atol), where
    # keras-hub's head computes differently from transformers' (None: the default).
    logits_tolerance: float | None = None
    # Every float32 output against transformers' (rtol = atol; the logits' too unless
    # `logits_tolerance` says), where keras-hub's backbone computes differently.
    tolerance: float | None = None
    # A bfloat16 model's outputs against transformers' (rtol = atol), where bfloat16
    # arithmetic drifts further than the default allows (None: the default).
    bfloat16_tolerance: float | None = None
    # The key form: "" for the names `save_pretrained` writes by default, NEW_FORM for
    # transformers 5's own (`save_original_format=False`; make_hf_fixtures.NEW_FORM), in
    # the dtypes `dtypes`.
    form: str = ""
    dtypes: tuple = DTYPES
    # The folder's entries a `Sum` rule adds into one variable (RoBERTa's position and
    # token-type rows): export writes the sum as the first and zeros as the others, not
    # the folder's bytes; from 16-bit entries the sum is float32 (a 16-bit model takes it
    # by a lossy cast).
    folded: tuple = ()
    # (the folder's prefix, export's) pairs: entries export writes under another name than
    # the folder's, where transformers saves a form other than the one export writes
    # (Gemma 3's vision tower: `vision_tower.` saved, `vision_tower.vision_model.` exported)
    renamed: tuple = ()
    # the leading positions the task model's logits leave out (PaliGemmaCausalLM: the
    # image's tokens): compared with transformers' logits from there on
    logits_from: int = 0
    # variables the task model adds to its backbone, which a backbone alone lacks
    # (BLIP2Seq2SeqLM builds its language model's `lm_head`): left out where the two compare
    task_adds: tuple = ()

    def export_name(self, name: str) -> str:
        """The name export writes for the folder's entry `name`."""
        for folder, export in self.renamed:
            if name.startswith(folder):
                return export + name[len(folder):]
        return name

    @property
    def id(self) -> str:
        return f"{self.case}-{self.cls}" + (f"-{self.form}" if self.form else "")

    def folder(self, dtype: str) -> str:
        suffix = f"-{self.form}" if self.form else ""
        return os.path.join(FIXTURES, f"{self.case}-{self.cls}-{dtype}{suffix}")

    @property
    def original(self) -> "Case":
        """The row of the same class in the original form (itself for one)."""
        return self._replace(form="", dtypes=DTYPES)

    @property
    def exports_whole(self) -> bool:
        """The restored model holds exactly the folder's entries: its export is the class
        (committed once, for the original form: export writes it whatever form was read)."""
        return not self.lacks and (not self.head or self.task is not None) and not self.form


_LM_HEAD = ("token_embedding/reverse_embeddings",)  # an untied backbone's output embedding
_MLM = ("cls.predictions.bias", "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.LayerNorm.bias")
_POOLER = ("pooled_dense/kernel", "pooled_dense/bias")
_POSITIONS = ("encoder.embed_positions.weight", "decoder.embed_positions.weight")
# SigLIP's tower as transformers 5 saves it, and as export (and the Hub) names it
_GEMMA3_TOWER = (("vision_tower.", "vision_tower.vision_model."),)
_T5GEMMA2_TOWER = tuple((f"{p}encoder.vision_tower.", f"{p}encoder.vision_tower.vision_model.")
                        for p in ("", "model."))
_GEMMA3N_SHARED = tuple(f"language_model/transformer_layers/{i}/attention/{v}"
                        for i in (2, 3) for v in ("k_proj/_kernel", "v_proj/_kernel",
                                                   "k_norm/scale"))
# the multimodal Gemma 3n row's vision tower (make_hf_fixtures.GEMMA3N_TOWER): keras-hub's
# convolutions' biases where timm's convolutions have none (the blocks', the adapter's)
_GEMMA3N_BIASES = tuple(
    f"vision_encoder/_operations/{n}/{conv}/conv/bias" for n, convs in (
        (2, ("conv_exp", "conv_pwl")), (3, ("dw_start", "dw_mid", "pw_exp", "pw_proj")),
        (4, ("pw_exp", "pw_proj")), (5, ("dw_start", "pw_exp", "pw_proj")),
        (8, ("pw_exp", "pw_proj")), (9, ("ffn/pw_exp", "ffn/pw_proj"))) for conv in convs)
_ROPE = ("_operations/3/self_attn/rotary_embedding/inv_freq",
         "_operations/4/self_attn/rotary_embedding/inv_freq")

def _roberta_rows(stem: str, case: str) -> tuple:
    """RoBERTa's (or XLM-RoBERTa's) rows: keras-hub's backbone has no pooler, and its
    position rows are transformers' with the one token-type row added (`folded`)."""
    folded = ("embeddings.position_embeddings.weight",
              "embeddings.token_type_embeddings.weight")
    mlm = ("lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
           "lm_head.layer_norm.bias", "lm_head.bias")
    classifier = ("classifier.dense.weight", "classifier.dense.bias",
                  "classifier.out_proj.weight", "classifier.out_proj.bias")
    return (
        Case(case, f"{stem}Model", None, head=("pooler.dense.weight", "pooler.dense.bias"),
             folded=folded),
        Case(case, f"{stem}ForMaskedLM", f"{stem}MaskedLM", head=mlm,
             folded=tuple("roberta." + name for name in folded)),
        Case(case, f"{stem}ForSequenceClassification", f"{stem}TextClassifier",
             head=classifier, folded=tuple("roberta." + name for name in folded)),
        Case(case, f"{stem}ForTokenClassification", None,
             head=("classifier.weight", "classifier.bias"),
             folded=tuple("roberta." + name for name in folded)),
    )

_CLASSIFIER = ("classifier.weight", "classifier.bias")

# SAM 3: each ViT layer's rotary tables, which keras-hub computes from the config
_SAM3_ROPE = tuple(f"vision_encoder/backbone/layers/{i}/rotary_emb/rope_embeddings_{w}"
                   for i in range(2) for w in ("cos", "sin"))
# entries no output of transformers' reads and keras-hub has no variable for (export writes
# none; transformers initialises them when it loads the export)
_SAM3_UNUSED = ("text_encoder.text_projection.weight",
                *(f"mask_decoder.pixel_decoder.{k}.2.{w}" for k in ("conv_layers", "norms")
                  for w in ("weight", "bias")))


def _sam3_tracker() -> tuple:
    """The video model's tracker entries (`tracker_model.`, `tracker_neck.`: keras-hub has no
    model of the tracker), read from the float32 folder's safetensors header."""
    path = os.path.join(FIXTURES, "sam3_video-Sam3VideoModel-float32", "model.safetensors")
    if not os.path.isfile(path):
        return ()
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return tuple(sorted(k for k in header if k.startswith(("tracker_model.", "tracker_neck."))))


def _esm_rows() -> tuple:
    """ESM's rows: transformers saves its rotary frequencies (a buffer keras-hub computes)
    and a contact-prediction head keras-hub has none of: into a backbone both are set aside
    with the head; into a task model too (never its head); export writes neither
    (transformers computes the frequencies and initialises the contact head when it loads
    the export). ESM-1b's position table: export writes row 0 (read by no input) as zeros."""
    # transformers 5.24 writes its one frequency buffer under a literal `*`
    rotary = ("encoder.layer.*.attention.self.rotary_embeddings.inv_freq",)
    contact = ("contact_head.regression.weight", "contact_head.regression.bias")
    mlm = ("lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
           "lm_head.layer_norm.bias", "lm_head.bias")
    classifier = ("classifier.dense.weight", "classifier.dense.bias",
                  "classifier.out_proj.weight", "classifier.out_proj.bias")
    esm = lambda names: tuple("esm." + name for name in names)  # noqa: E731
    positions = ("esm.embeddings.position_embeddings.weight",)
    return (
        Case("esm", "EsmModel", None,
             head=("pooler.dense.weight", "pooler.dense.bias") + contact + rotary),
        Case("esm", "EsmForMaskedLM", "ESMMaskedPLM", head=mlm,
             export_differs=esm(contact + rotary)),
        Case("esm", "EsmForSequenceClassification", "ESMProteinClassifier", head=classifier,
             export_differs=esm(contact + rotary)),
        Case("esm", "EsmForTokenClassification", None,
             head=("classifier.weight", "classifier.bias") + esm(contact + rotary)),
        Case("esm_absolute", "EsmModel", None,
             head=("pooler.dense.weight", "pooler.dense.bias") + contact),
        Case("esm_absolute", "EsmForMaskedLM", "ESMMaskedPLM", head=mlm,
             export_differs=esm(contact) + positions),
    )


CASES = (
    Case("llama", "LlamaModel", None, lacks=_LM_HEAD),
    Case("llama", "LlamaForCausalLM", "Llama3CausalLM"),
    Case("llama", "LlamaForSequenceClassification", None, head=("score.weight",),
         lacks=_LM_HEAD),
    Case("llama_tied", "LlamaForCausalLM", "Llama3CausalLM"),
    Case("mistral", "MistralModel", None, lacks=_LM_HEAD),
    Case("mistral", "MistralForCausalLM", "MistralCausalLM"),
    Case("mistral", "MistralForSequenceClassification", None, head=("score.weight",),
         lacks=_LM_HEAD),
    Case("gemma", "GemmaModel", None),
    Case("gemma", "GemmaForCausalLM", "GemmaCausalLM"),
    Case("gemma", "GemmaForSequenceClassification", None, head=("score.weight",)),
    Case("gemma2", "Gemma2Model", None),
    Case("gemma2", "Gemma2ForCausalLM", "GemmaCausalLM"),
    Case("gemma2", "Gemma2ForSequenceClassification", None, head=("score.weight",)),
    Case("gpt2", "GPT2Model", None),
    Case("gpt2", "GPT2LMHeadModel", "GPT2CausalLM"),
    Case("gpt2", "GPT2ForSequenceClassification", None, head=("score.weight",)),
    Case("bert", "BertModel", None),
    # keras-hub's MaskedLMHead normalises with epsilon 1e-5, BERT's with 1e-12: 7e-4 here.
    Case("bert", "BertForMaskedLM", "BertMaskedLM", head=_MLM, lacks=_POOLER,
         logits_tolerance=2e-3),
    Case("bert", "BertForPreTraining", None,
         head=_MLM + ("cls.seq_relationship.weight", "cls.seq_relationship.bias")),
    Case("bert", "BertForSequenceClassification", "BertTextClassifier",
         head=("classifier.weight", "classifier.bias")),
    # keras-hub's ViTBackbone normalises with epsilon 1e-6 whatever the config says
    # (transformers: layer_norm_eps 1e-12), and its importer passes none: up to 1.4e-4 off
    Case("vit", "ViTModel", None, head=("pooler.dense.weight", "pooler.dense.bias"),
         tolerance=5e-4),
    Case("vit", "ViTForImageClassification", "ViTImageClassifier",
         head=("classifier.weight", "classifier.bias"), tolerance=5e-4),
    # transformers 5's names (`layers.{i}.attention.q_proj`, ...), the same models
    Case("vit", "ViTModel", None, head=("pooler.dense.weight", "pooler.dense.bias"),
         form=NEW_FORM, dtypes=("float32",), tolerance=5e-4),
    Case("vit", "ViTForImageClassification", "ViTImageClassifier",
         head=("classifier.weight", "classifier.bias"), form=NEW_FORM, tolerance=5e-4),
    Case("qwen2", "Qwen2Model", None, lacks=_LM_HEAD),
    Case("qwen2", "Qwen2ForCausalLM", "QwenCausalLM"),
    Case("qwen2", "Qwen2ForSequenceClassification", None, head=("score.weight",),
         lacks=_LM_HEAD),
    # tied: the token embedding is the output embedding too. keras-hub's Qwen3Attention
    # normalises queries and keys with epsilon 1e-5 (its decoder does not pass the config's
    # rms_norm_eps on), transformers with 1e-6: 4.6e-4 here (5.9e-7 with keras-hub's
    # epsilon set to 1e-6).
    Case("qwen3", "Qwen3Model", None, tolerance=2e-3),
    Case("qwen3", "Qwen3ForCausalLM", "Qwen3CausalLM", tolerance=2e-3),
    Case("qwen3", "Qwen3ForSequenceClassification", None, head=("score.weight",),
         tolerance=2e-3),
    Case("distilbert", "DistilBertModel", None),
    # keras-hub's MaskedLMHead normalises with epsilon 1e-5, DistilBERT's with 1e-12.
    Case("distilbert", "DistilBertForMaskedLM", "DistilBertMaskedLM",
         head=("vocab_transform.weight", "vocab_transform.bias", "vocab_layer_norm.weight",
               "vocab_layer_norm.bias", "vocab_projector.bias"), logits_tolerance=2e-3),
    Case("distilbert", "DistilBertForSequenceClassification", "DistilBertTextClassifier",
         head=("pre_classifier.weight", "pre_classifier.bias", "classifier.weight",
               "classifier.bias")),
    *(row for stem, case in (("Roberta", "roberta"), ("XLMRoberta", "xlm_roberta"))
      for row in _roberta_rows(stem, case)),
    Case("albert", "AlbertModel", None),
    # keras-hub's MaskedLMHead normalises with epsilon 1e-5, ALBERT's with 1e-12.
    Case("albert", "AlbertForMaskedLM", "AlbertMaskedLM",
         head=("predictions.dense.weight", "predictions.dense.bias",
               "predictions.LayerNorm.weight", "predictions.LayerNorm.bias",
               "predictions.bias"), lacks=_POOLER, logits_tolerance=2e-3),
    Case("albert", "AlbertForSequenceClassification", "AlbertTextClassifier",
         head=("classifier.weight", "classifier.bias")),
    Case("albert", "AlbertForTokenClassification", None,
         head=("classifier.weight", "classifier.bias"), lacks=_POOLER),
    Case("gemma3", "Gemma3TextModel", None),
    # a bfloat16 model computes in bfloat16 (its q/k norms too): 2 of 192 elements of the
    # last hidden state up to 0.21 from transformers' float32 run of the same weights
    Case("gemma3", "Gemma3ForCausalLM", "Gemma3CausalLM", bfloat16_tolerance=0.25),
    Case("gemma3", "Gemma3TextForSequenceClassification", None, head=("score.weight",)),
    Case("gemma4", "Gemma4TextModel", None),
    # bfloat16 arithmetic as Gemma 3's: 1 of 192 elements of the last hidden state 0.14 from
    # transformers' float32 run of the same weights
    Case("gemma4", "Gemma4ForCausalLM", "Gemma4CausalLM", bfloat16_tolerance=0.25),
    Case("gemma4_keqv", "Gemma4TextModel", None),
    Case("gemma4_keqv", "Gemma4ForCausalLM", "Gemma4CausalLM"),
    # bfloat16 arithmetic routes one token of 12 to other experts (the same bfloat16 weights
    # in a float32 model: within 7e-6 of transformers): that token's row up to 0.73 off
    Case("gemma4_moe", "Gemma4TextModel", None, bfloat16_tolerance=0.8),
    Case("gemma4_moe", "Gemma4ForCausalLM", "Gemma4CausalLM", bfloat16_tolerance=0.8),
    # Gemma 3n's text decoder into keras-hub's backbone without vision or audio encoders;
    # the KV-shared layers 2 and 3 have no k/v projections or key norm in the folders. A
    # bfloat16 model computes in bfloat16 (AltUp's and Laurel's norms too): the last hidden
    # state up to 0.11 (of 2.8) from transformers' float32 run of the same weights
    Case("gemma3n", "Gemma3nTextModel", None, computed=_GEMMA3N_SHARED,
         bfloat16_tolerance=0.25),
    Case("gemma3n", "Gemma3nForCausalLM", "Gemma3nCausalLM", computed=_GEMMA3N_SHARED,
         bfloat16_tolerance=0.25),
    # multimodal Gemma 4: the decoder under `model.language_model.`, a vision tower (and an
    # audio tower); fed text and one image (and one clip) each. keras-hub builds the encoders in
    # float32 whatever dtype it is given: no all-bfloat16 model to compare
    Case("gemma4_vision", "Gemma4ForConditionalGeneration", "Gemma4CausalLM"),
    Case("gemma4_audio", "Gemma4Model", None),
    Case("gemma4_audio", "Gemma4ForConditionalGeneration", "Gemma4CausalLM"),
    # Gemma 3n with its vision and audio towers, fed one image and one audio clip per
    # example: keras-hub's MobileNetV5 computes the exact GELU where timm's is the tanh
    # approximation: the last hidden state up to 5.7e-3 off here (5.3e-6 with keras-hub's
    # GELU approximated); its convolutions' biases (zeros) are in no folder. A bfloat16
    # model computes in bfloat16 (the towers too): the last hidden state up to 0.23 (of
    # 3.0), the logits up to 0.033, from transformers' float32 run of the same weights
    Case("gemma3n_multimodal", "Gemma3nModel", None, computed=_GEMMA3N_SHARED + _GEMMA3N_BIASES,
         tolerance=1e-2, bfloat16_tolerance=0.25),
    Case("gemma3n_multimodal", "Gemma3nForConditionalGeneration", "Gemma3nCausalLM",
         computed=_GEMMA3N_SHARED + _GEMMA3N_BIASES, tolerance=1e-2, bfloat16_tolerance=0.25),
    # keras-hub keeps each layer's RoPE frequencies as a variable; no folder has them
    Case("smollm3", "SmolLM3Model", None, computed=_ROPE),
    Case("smollm3", "SmolLM3ForCausalLM", "SmolLM3CausalLM", computed=_ROPE),
    Case("smollm3", "SmolLM3ForSequenceClassification", None, head=("score.weight",),
         computed=_ROPE),
    # transformers never reads its position tables' first two rows (export writes zeros
    # there) nor, where zeros as it makes them, BartForConditionalGeneration's
    # final_logits_bias (set aside: keras-hub's BartSeq2SeqLM has none; export leaves it out)
    Case("bart", "BartModel", None, export_differs=_POSITIONS),
    Case("bart", "BartForConditionalGeneration", "BartSeq2SeqLM",
         export_differs=_POSITIONS + ("final_logits_bias",)),
    Case("t5gemma", "T5GemmaModel", None),
    Case("t5gemma", "T5GemmaForConditionalGeneration", "T5GemmaSeq2SeqLM"),
    Case("t5gemma2", "T5Gemma2Model", None, renamed=_T5GEMMA2_TOWER),
    Case("t5gemma2", "T5Gemma2ForConditionalGeneration", "T5Gemma2Seq2SeqLM",
         renamed=_T5GEMMA2_TOWER),
    # mixtures of experts: each layer's experts stacked into banks
    Case("mixtral", "MixtralModel", None, lacks=_LM_HEAD),
    Case("mixtral", "MixtralForCausalLM", "MixtralCausalLM"),
    Case("mixtral", "MixtralForSequenceClassification", None, head=("score.weight",),
         lacks=_LM_HEAD),
    Case("qwen3_moe", "Qwen3MoeModel", None, lacks=_LM_HEAD),
    Case("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeCausalLM"),
    Case("qwen3_moe", "Qwen3MoeForSequenceClassification", None, head=("score.weight",),
         lacks=_LM_HEAD),
    Case("qwen3_moe_dense", "Qwen3MoeForCausalLM", "Qwen3MoeCausalLM"),
    Case("qwen2_moe", "Qwen2MoeModel", None, lacks=_LM_HEAD),
    Case("qwen2_moe", "Qwen2MoeForCausalLM", "QwenMoeCausalLM"),
    Case("qwen2_moe", "Qwen2MoeForSequenceClassification", None, head=("score.weight",),
         lacks=_LM_HEAD),
    Case("qwen2_moe_dense", "Qwen2MoeForCausalLM", "QwenMoeCausalLM"),
    # transformers 5's form of the experts: one tensor per bank and layer
    Case("mixtral", "MixtralForCausalLM", "MixtralCausalLM", form=NEW_FORM),
    Case("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeCausalLM", form=NEW_FORM),
    Case("qwen2_moe", "Qwen2MoeForCausalLM", "QwenMoeCausalLM", form=NEW_FORM),
    Case("gpt_oss", "GptOssModel", None, lacks=_LM_HEAD),
    Case("gpt_oss", "GptOssForCausalLM", "GptOssCausalLM"),
    Case("gpt_oss", "GptOssForSequenceClassification", None, head=("score.weight",),
         lacks=_LM_HEAD),
    Case("deit", "DeiTModel", None, head=("pooler.dense.weight", "pooler.dense.bias")),
    Case("deit", "DeiTForImageClassification", "DeiTImageClassifier",
         head=("classifier.weight", "classifier.bias")),
    # keras-hub has no model averaging the class and distillation tokens' heads
    Case("deit", "DeiTForImageClassificationWithTeacher", None,
         head=("cls_classifier.weight", "cls_classifier.bias",
               "distillation_classifier.weight", "distillation_classifier.bias")),
    # transformers 5's names (DeiTModel renamed as ViTModel is), the same models
    Case("deit", "DeiTModel", None, head=("pooler.dense.weight", "pooler.dense.bias"),
         form=NEW_FORM, dtypes=("float32",)),
    Case("deit", "DeiTForImageClassification", "DeiTImageClassifier",
         head=("classifier.weight", "classifier.bias"), form=NEW_FORM),
    Case("deit", "DeiTForImageClassificationWithTeacher", None,
         head=("cls_classifier.weight", "cls_classifier.bias",
               "distillation_classifier.weight", "distillation_classifier.bias"),
         form=NEW_FORM, dtypes=("float32",)),
    # keras-hub has no DINOv2 task model: the classifier is set aside
    Case("dinov2", "Dinov2Model", None),
    Case("dinov2", "Dinov2ForImageClassification", None, head=_CLASSIFIER),
    # feature maps in transformers, the base model's names: keras-hub's backbone
    Case("dinov2", "Dinov2Backbone", None),
    Case("dinov2_swiglu", "Dinov2Model", None),
    Case("dinov2_registers", "Dinov2WithRegistersModel", None),
    Case("dinov2_registers", "Dinov2WithRegistersForImageClassification", None,
         head=_CLASSIFIER),
    # transformers 5's names (the attention renamed, a SwiGLU's weights_in in two halves)
    Case("dinov2", "Dinov2Model", None, form=NEW_FORM),
    Case("dinov2", "Dinov2ForImageClassification", None, head=_CLASSIFIER, form=NEW_FORM,
         dtypes=("float32",)),
    Case("dinov2_swiglu", "Dinov2Model", None, form=NEW_FORM),
    Case("dinov2_registers", "Dinov2WithRegistersModel", None, form=NEW_FORM,
         dtypes=("float32",)),
    Case("swin", "SwinModel", None),
    Case("swin", "SwinForImageClassification", "SwinTransformerImageClassifier",
         head=_CLASSIFIER),
    # transformers 5's names (the attention and the MLP renamed), the same models
    Case("swin", "SwinModel", None, form=NEW_FORM, dtypes=("float32",)),
    Case("swin", "SwinForImageClassification", "SwinTransformerImageClassifier",
         head=_CLASSIFIER, form=NEW_FORM),
    Case("dinov3", "DINOv3ViTModel", None),
    Case("dinov3", "DINOv3ViTBackbone", None),
    Case("dinov3_gated", "DINOv3ViTModel", None),
    # transformers 5's names (the blocks under `model.layer.{i}`), the same models
    Case("dinov3", "DINOv3ViTModel", None, form=NEW_FORM),
    Case("dinov3_gated", "DINOv3ViTModel", None, form=NEW_FORM, dtypes=("float32",)),
    # Gemma 3 with its vision tower (SigLIP), and its text decoder under `language_model.`:
    # fed one image per example; export names the tower as the Hub's folders do
    Case("gemma3_vision", "Gemma3Model", None, renamed=_GEMMA3_TOWER),
    Case("gemma3_vision", "Gemma3ForConditionalGeneration", "Gemma3CausalLM",
         renamed=_GEMMA3_TOWER),
    Case("gemma3_vision", "Gemma3ForSequenceClassification", None, head=("score.weight",),
         renamed=_GEMMA3_TOWER),
    # transformers 5's module names (`model.language_model.`, `model.vision_tower.`)
    Case("gemma3_vision", "Gemma3Model", None, form=NEW_FORM, dtypes=("float32",)),
    Case("gemma3_vision", "Gemma3ForConditionalGeneration", "Gemma3CausalLM", form=NEW_FORM),
    # PaliGemma: the image's tokens lead, then a prefix and a response
    Case("paligemma", "PaliGemmaModel", None, renamed=_GEMMA3_TOWER),
    Case("paligemma", "PaliGemmaForConditionalGeneration", "PaliGemmaCausalLM",
         renamed=_GEMMA3_TOWER, logits_from=16),
    Case("paligemma", "PaliGemmaModel", None, form=NEW_FORM, dtypes=("float32",)),
    Case("paligemma", "PaliGemmaForConditionalGeneration", "PaliGemmaCausalLM",
         form=NEW_FORM, logits_from=16),
    # Gemma 4's assistant: one draft step (the target's keys and values given); the
    # backbone compared on its decoder's output
    Case("gemma4_assistant", "Gemma4AssistantForCausalLM", "Gemma4AssistantCausalLM",
         head=("pre_projection.weight", "post_projection.weight")),
    *_esm_rows(),
    # MetaCLIP 2: both towers and their projections into keras-hub's backbone (it has no
    # task model); the one-tower classes hold half a backbone
    Case("metaclip_2", "MetaClip2Model", None),
    Case("qwen3_5", "Qwen3_5TextModel", None, lacks=_LM_HEAD),
    Case("qwen3_5", "Qwen3_5ForCausalLM", "Qwen3_5CausalLM"),
    Case("qwen3_5", "Qwen3_5TextForSequenceClassification", None, head=("score.weight",),
         lacks=_LM_HEAD),
    Case("qwen3_5_tied", "Qwen3_5ForCausalLM", "Qwen3_5CausalLM"),
    # the decoder and a vision tower, into keras-hub's backbone with its vision encoder;
    # outputs compared on text (no image)
    Case("qwen3_5_vl", "Qwen3_5Model", None, lacks=_LM_HEAD),
    Case("qwen3_5_vl", "Qwen3_5ForConditionalGeneration", "Qwen3_5CausalLM"),
    Case("qwen3_5_moe_vl", "Qwen3_5MoeModel", None, lacks=_LM_HEAD),
    Case("qwen3_5_moe_vl", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeCausalLM"),
    Case("qwen3_5_moe", "Qwen3_5MoeTextModel", None, lacks=_LM_HEAD),
    Case("qwen3_5_moe", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeCausalLM"),
    Case("qwen3_5_moe", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeCausalLM", form=NEW_FORM),
    # BLIP-2: an image as 4 queries (their image tokens lead the ids; keras-hub takes the
    # text alone, the queries ahead of it), into OPT or Flan-T5; BLIP2CausalLM's logits
    # leave the queries' positions out
    Case("blip2_opt", "Blip2Model", None),
    Case("blip2_opt", "Blip2ForConditionalGeneration", "BLIP2CausalLM", logits_from=4),
    # keras-hub's BLIP2FlanT5 computes the exact GELU where Flan-T5's gated-gelu is the tanh
    # approximation: up to 1.0e-3 off here (2.4e-6 with keras-hub's GELU approximated)
    Case("blip2_t5", "Blip2Model", None, tolerance=3e-3),
    Case("blip2_t5", "Blip2ForConditionalGeneration", "BLIP2Seq2SeqLM", tolerance=3e-3,
         task_adds=("lm_head/kernel",)),
    # SAM 3's detector, alone and beside the video tracker (set aside); compared on an image
    # and a text prompt through keras-hub's layers (`_sam3_outputs`)
    Case("sam3", "Sam3Model", None, computed=_SAM3_ROPE, export_differs=_SAM3_UNUSED),
    Case("sam3_video", "Sam3VideoModel", None, head=_sam3_tracker(), computed=_SAM3_ROPE),
)


def config(case: Case, dtype: str = "float32") -> dict:
    with open(os.path.join(case.folder(dtype), "config.json"), encoding="utf-8") as f:
        return json.load(f)


def oracle(case: Case, dtype: str) -> dict:
    """The fixed inputs and transformers' outputs (float32) beside the folder."""
    from safetensors.numpy import load_file

    return load_file(case.folder(dtype) + ".oracle.safetensors")


def _gemma4_global_sizes(hf_config: dict) -> None:
    """The full-attention layers' sizes as the published Gemma 4 configs name them."""
    from objckpt.rules.hf_gemma4 import global_sizes

    full = [i for i, t in enumerate(hf_config["layer_types"]) if t == "full_attention"]
    if full and hf_config.get("per_layer_config"):
        head_dim, kv_heads = global_sizes(hf_config, full[0])
        hf_config.setdefault("global_head_dim", head_dim)
        if hf_config.get("attention_k_eq_v"):
            hf_config.setdefault("num_global_key_value_heads", kv_heads)


def gemma3n_text_backbone(text: dict, dtype: str):
    """keras-hub's Gemma3nBackbone of a text-only Gemma 3n config: its importer's
    `convert_backbone_config` (which reads a multimodal config; RoPE's base from the full
    layers' `rope_parameters`, which transformers 5 writes per layer type), without the
    vision and audio encoders."""
    from keras_hub.src.utils.transformers import convert_gemma3n

    text = dict(text, rope_theta=text["rope_parameters"]["full_attention"]["rope_theta"])
    audio = {k: 1 for k in ("hidden_size", "input_feat_size", "sscp_conv_channel_size",
                            "sscp_conv_kernel_size", "sscp_conv_stride_size",
                            "sscp_conv_group_norm_eps", "conf_num_hidden_layers",
                            "rms_norm_eps", "gradient_clipping", "conf_residual_weight",
                            "conf_num_attention_heads", "conf_attention_chunk_size",
                            "conf_attention_context_right", "conf_attention_context_left",
                            "conf_attention_logit_cap", "conf_conv_kernel_size",
                            "conf_reduction_factor", "vocab_size", "vocab_offset")}
    kwargs = convert_gemma3n.convert_backbone_config({
        "text_config": text, "audio_config": audio,
        "vision_config": {"hidden_size": 1, "vocab_size": 1, "vocab_offset": 1},
        "vision_soft_tokens_per_image": 1, "audio_soft_tokens_per_image": 1,
        "image_token_id": 1, "audio_token_id": 1})
    kwargs.update(vision_encoder_config=None, audio_encoder_config=None)
    return convert_gemma3n.backbone_cls(**kwargs, dtype=dtype)
def _gemma4_media(feed: dict, hf_config: dict) -> dict:
    """The multimodal Gemma 4 backbone's inputs: the text (the image's and the clip's tokens
    as the pad id, as transformers embeds them), positions from 0, the image's patches and
    the clip's mel frames (one each per example) and where their tokens go."""
    import numpy as np

    ids = feed["input_ids"]
    batch, length = ids.shape
    images = (ids == hf_config["image_token_id"]).astype("int32")
    clips = (ids == hf_config["audio_token_id"]).astype("int32")
    media = (images + clips) == 1
    out = {"token_ids": np.where(media, hf_config["text_config"]["pad_token_id"], ids),
           "padding_mask": feed["attention_mask"],
           "position_ids": np.broadcast_to(np.arange(length, dtype="int32"), ids.shape),
           "pixel_values": feed["pixel_values"][:, None],
           "pixel_position_ids": feed["image_position_ids"][:, None],
           "vision_indices": np.stack([np.flatnonzero(row) for row in images]).astype("int32"),
           "vision_mask": images}
    if hf_config.get("audio_config"):
        out.update(audio_mel=feed["input_features"][:, None],
                   audio_mel_mask=feed["input_features_mask"][:, None],
                   audio_indices=np.stack([np.flatnonzero(row) for row in clips]
                                          ).astype("int32"),
                   audio_mask=clips)
    return out


def gemma3n_backbone(hf_config: dict, dtype: str):
    """keras-hub's Gemma3nBackbone of a multimodal Gemma 3n config: its importer's
    `convert_backbone_config` (RoPE's base as for the text-only one), its vision encoder the
    MobileNetV5 that timm built from the vision config's `model_args` (keras-hub's importer
    always builds the 300M one, at 768x768) built from keras-hub's own classes: the blocks
    (`block_args`, read back into block strings), the stem's and the adapter's sizes, the
    rest as the importer's 300M tower."""
    from keras_hub.src.models.mobilenetv5.mobilenetv5_builder import (
        convert_arch_def_to_stackwise)
    from keras_hub.src.utils.transformers import convert_gemma3n

    from objckpt.rules.hf_gemma3n_vision import block_strings

    text = hf_config["text_config"]
    text = dict(text, rope_theta=text["rope_parameters"]["full_attention"]["rope_theta"])
    kwargs = convert_gemma3n.convert_backbone_config({**hf_config, "text_config": text})
    model_args = hf_config["vision_config"]["model_args"]
    tower = convert_arch_def_to_stackwise(block_strings(model_args["block_args"]))
    importers = convert_gemma3n.MODEL_CONFIGS["mobilenetv5_300m_enc"]
    tower.update({k: v for k, v in importers.items() if not k.startswith("stackwise_")})
    tower.update(stem_size=model_args.get("stem_size", tower["stem_size"]),
                 msfa_output_resolution=model_args.get("msfa_output_resolution", 16),
                 num_features=hf_config["vision_config"]["hidden_size"],
                 image_shape=(IMAGE_SIZE["gemma3n"], IMAGE_SIZE["gemma3n"], 3))
    kwargs["vision_encoder_config"] = tower
    return convert_gemma3n.backbone_cls(**kwargs, dtype=dtype)


# model_type -> the side of the square images its rows feed (make_hf_fixtures.IMAGE_TOKENS)
IMAGE_SIZE = {"gemma3n": 32}
# inputs keras-hub's Gemma3nCausalLM takes beside its backbone's (which has none of them)
GEMMA3N_TASK = ("vision_indices", "vision_mask", "audio_indices", "audio_mask")


def backbone(case: Case, dtype: str = "float32"):
    """The keras-hub backbone the folder's config.json describes, in `dtype`."""
    import importlib

    hf_config = config(case)
    if hf_config["model_type"] == "bart":  # keras-hub 0.32 reads what transformers 5 no
        hf_config.setdefault("num_hidden_layers", hf_config["encoder_layers"])  # writes
    if hf_config["model_type"] == "qwen3_moe":  # transformers 5 renamed it; keras-hub 0.32
        hf_config.setdefault("num_experts", hf_config.get("num_local_experts"))  # reads this
    if hf_config["model_type"] == "gpt_oss":  # keras-hub 0.32 reads the YaRN factor from
        hf_config.setdefault("rope_scaling", hf_config.get("rope_parameters"))  # v4's key
    if hf_config["model_type"] == "gemma4_text":  # keras-hub 0.32 reads the published keys
        _gemma4_global_sizes(hf_config)  # transformers 5 writes as `per_layer_config`
    if hf_config["model_type"] == "gemma3n_text":  # text only: keras-hub's backbone
        return gemma3n_text_backbone(hf_config, dtype)  # without vision or audio encoders
    if hf_config["model_type"] == "gemma4":  # the same, in the text config
        _gemma4_global_sizes(hf_config["text_config"])
    if hf_config["model_type"] == "gemma3n":  # keras-hub's importer always builds the 300M
        return gemma3n_backbone(hf_config, dtype)  # tower: the folder's, from its classes
    converter = importlib.import_module(
        "keras_hub.src.utils.transformers." + CONVERTERS[hf_config["model_type"]])
    if hf_config["model_type"] == "blip-2":  # keras-hub's importer builds BLIP-2's parts
        import keras  # before the backbone, in the global dtype policy: set it for them

        before = keras.config.dtype_policy()
        keras.config.set_dtype_policy(dtype)
        try:
            return converter.backbone_cls(**converter.convert_backbone_config(hf_config),
                                          dtype=dtype)
        finally:
            keras.config.set_dtype_policy(before)
    if hf_config["model_type"] in ("sam3", "sam3_video"):  # keras-hub reads a sam3_video
        if hf_config["model_type"] == "sam3":  # config's detector; its converter takes the
            hf_config = {"detector_config": hf_config}  # class and gives the encoders' dtype
        return converter.backbone_cls(**converter.convert_backbone_config(
            hf_config, converter.backbone_cls, dtype=dtype), dtype=dtype)
    return converter.backbone_cls(**converter.convert_backbone_config(hf_config), dtype=dtype)


def task(case: Case, model):
    """The keras-hub task model of the class's head around `model` (a backbone)."""
    import keras_hub

    cls = getattr(keras_hub.models, case.task)
    if case.task == "Gemma4AssistantCausalLM":  # its sizes from the config, as keras-hub's
        from keras_hub.src.utils.transformers import convert_gemma4_assistant  # importer
        return cls(backbone=model, preprocessor=None,
                   **convert_gemma4_assistant.convert_task_config(config(case)))
    if case.task in ("BertTextClassifier", "ViTImageClassifier", "DistilBertTextClassifier",
                     "RobertaTextClassifier", "XLMRobertaTextClassifier",
                     "AlbertTextClassifier", "DeiTImageClassifier",
                     "SwinTransformerImageClassifier", "ESMProteinClassifier"):
        return cls(backbone=model, num_classes=len(config(case)["id2label"]),
                   preprocessor=None)
    return cls(backbone=model, preprocessor=None)


def keras_inputs(case: Case, feed: dict):
    """The oracle's inputs as keras-hub's models take them."""
    import numpy as np

    if config(case)["model_type"] in CONTRASTIVE:
        return {"images": feed["pixel_values"], "token_ids": feed["input_ids"]}
    if config(case)["model_type"] == "blip-2":
        return _query_image_inputs(config(case), feed)
    if "pixel_values" in feed and config(case)["model_type"] == "paligemma":
        # the image's tokens lead: keras-hub takes the text alone, the image ahead of it
        count = int(np.sum(feed["input_ids"][0] == config(case)["image_token_index"]))
        return {"images": feed["pixel_values"], "token_ids": feed["input_ids"][:, count:],
                "padding_mask": feed["attention_mask"][:, count:],
                "response_mask": feed["token_type_ids"][:, count:]}
    if config(case)["model_type"] == "gemma4":  # text and one image (as patches) each
        return _gemma4_media(feed, config(case))
    if config(case)["model_type"] == "gemma3n":  # text, one image and one audio clip each
        ids = feed["input_ids"]  # (keras-hub's mask marks the padded frames, transformers'
        hf_config = config(case)  # the valid ones); the image's and the clip's places for
        image = ids == hf_config["image_token_id"]  # the task model (GEMMA3N_TASK)
        audio = ids == hf_config["audio_token_id"]
        return {"token_ids": ids, "padding_mask": feed["attention_mask"],
                "images": feed["pixel_values"][:, None],
                "input_features": feed["input_features"][:, None],
                "input_features_mask": ~feed["input_features_mask"][:, None],
                "vision_indices": np.stack([np.flatnonzero(r) for r in image]).astype("int32"),
                "vision_mask": image, "audio_mask": audio,
                "audio_indices": np.stack([np.flatnonzero(r) for r in audio]).astype("int32")}
    if "decoder_input_ids" in feed and "pixel_values" in feed:  # T5Gemma 2: one image each
        return {"encoder_token_ids": feed["input_ids"],
                "encoder_padding_mask": feed["attention_mask"],
                "decoder_token_ids": feed["decoder_input_ids"],
                "decoder_padding_mask": np.ones_like(feed["decoder_input_ids"]),
                "images": feed["pixel_values"][:, None],
                "vision_indices": np.stack([np.flatnonzero(row) for row in
                                            feed["token_type_ids"]]).astype("int32")}
    if "pixel_values" in feed and "input_ids" in feed:  # text and images, one per example
        image_tokens = feed["token_type_ids"]
        return {"token_ids": feed["input_ids"], "padding_mask": feed["attention_mask"],
                "images": feed["pixel_values"][:, None], "vision_mask": image_tokens,
                "vision_indices": np.stack([np.flatnonzero(row) for row in image_tokens]
                                           ).astype("int32")}
    if "pixel_values" in feed:
        return feed["pixel_values"]
    if "decoder_input_ids" in feed:  # an encoder-decoder
        return {"encoder_token_ids": feed["input_ids"],
                "encoder_padding_mask": feed["attention_mask"],
                "decoder_token_ids": feed["decoder_input_ids"],
                "decoder_padding_mask": np.ones_like(feed["decoder_input_ids"])}
    out = {"token_ids": feed["input_ids"], "padding_mask": feed["attention_mask"]}
    if case.case.startswith("esm"):  # ESMBackbone masks the padding id itself
        del out["padding_mask"]
    if case.case.startswith("gemma4"):  # positions as transformers counts them, from 0
        ids = feed["input_ids"]
        out["position_ids"] = np.broadcast_to(np.arange(ids.shape[1], dtype="int32"), ids.shape)
    if case.case in ("qwen3_5_vl", "qwen3_5_moe_vl"):  # text only: no image (the fixture's vision_config)
        batch = feed["input_ids"].shape[0]
        out.update(pixel_values=np.zeros((batch, 0, 2, 4, 4, 3), "float32"),
                   image_grid_thw=np.zeros((batch, 0, 3), "int32"),
                   vision_indices=np.zeros((batch, 0), "int32"))
    if "token_type_ids" in feed:
        out["segment_ids"] = feed["token_type_ids"]
    if case.task in ("BertMaskedLM", "DistilBertMaskedLM", "RobertaMaskedLM",
                     "XLMRobertaMaskedLM", "AlbertMaskedLM", "ESMMaskedPLM"):
        length = feed["input_ids"].shape[1]
        out["mask_positions"] = np.tile(np.arange(length, dtype="int32"),
                                        (feed["input_ids"].shape[0], 1))
    return out


def _query_image_inputs(hf_config: dict, feed: dict) -> dict:
    """BLIP-2's inputs: the image, and the text after the queries' image tokens (keras-hub
    puts the queries ahead of it); Flan-T5's decoder ids."""
    import numpy as np

    count = hf_config["num_query_tokens"]
    text, mask = feed["input_ids"][:, count:], feed["attention_mask"][:, count:]
    if hf_config["text_config"]["model_type"] == "opt":
        return {"images": feed["pixel_values"], "token_ids": text, "padding_mask": mask}
    return {"images": feed["pixel_values"], "encoder_token_ids": text,
            "encoder_padding_mask": mask, "decoder_token_ids": feed["decoder_input_ids"],
            "decoder_padding_mask": np.ones_like(feed["decoder_input_ids"])}


def _query_image_outputs(model, given: dict) -> dict:
    """A BLIP2Backbone's outputs under the oracle's names: the language model's last hidden
    state (Flan-T5's decoder's, and its encoder's), the vision tower's and the Q-Former's."""
    import numpy as np

    vision = model.vision_encoder(given["images"])
    queries = model.qformer(vision)
    out = {"last_hidden_state": np.asarray(model(given), "float32"),
           "vision_last_hidden_state": np.asarray(vision, "float32"),
           "qformer_last_hidden_state": np.asarray(queries, "float32")}
    if "encoder_token_ids" in given:
        encoded, _ = model.language_model.call_encoder(
            given["encoder_token_ids"], given["encoder_padding_mask"], queries)
        out["encoder_last_hidden_state"] = np.asarray(encoded, "float32")
    return out
def _sam3_outputs(model, feed: dict) -> dict:
    """SAM 3's outputs on an image and a text prompt, under the oracle's names: the ViT's
    last hidden state, the FPN levels, the projected text features and the detections.

    keras-hub's layers composed as its backbone composes them, with two differences that
    follow transformers: no geometry encoder (transformers runs none without a box; the
    backbone always runs keras-hub's, adding its CLS prompt token), and the text tower under
    a causal mask (transformers' CLIP text tower is causal; keras-hub's `SAM3TextEncoder`
    attends both ways, 0.5 off here)."""
    import numpy as np
    from keras import ops

    images, ids = feed["pixel_values"], feed["input_ids"]
    masks = np.asarray(feed["attention_mask"], bool)
    fpn, positions = model.vision_encoder(images)
    out = {f"fpn_hidden_state_{i}": state for i, state in enumerate(fpn)}
    out["last_hidden_state"] = model.vision_encoder.backbone(images)
    text = model.text_encoder.embedding(ids)
    length = ids.shape[1]
    causal = np.tril(np.ones((length, length), bool))[None] & masks[:, None, :]
    for layer in model.text_encoder.encoder_layers:
        text = layer(text, causal)
    text = model.text_projection(model.text_encoder.layer_norm(text))
    out["text_features"] = text
    fpn, positions = fpn[:-1], positions[:-1]
    encoded = model.detr_encoder(vision_features=fpn[-1], text_features=text,
                                 vision_pos_embeds=positions[-1], text_masks=masks)
    decoded = model.detr_decoder(vision_features=encoded[0], text_features=text,
                                 vision_pos_encodings=encoded[1], text_masks=masks)
    logits = model.dot_product_scoring(decoder_hidden_states=decoded[0], text_features=text,
                                       text_masks=masks)
    boxes, logits, presence = model.box_decoder(
        box_offsets=model.detr_decoder.box_head(decoded[0]), reference_boxes=decoded[1],
        pred_logits=logits, presence_logits=decoded[2])
    pred_masks, semantic = model.mask_decoder(
        decoder_queries=decoded[0][:, -1], backbone_features=fpn,
        encoder_hidden_states=encoded[0], prompt_features=text, prompt_masks=masks)
    out.update(pred_boxes=boxes, pred_logits=logits, presence_logits=presence,
               pred_masks=ops.transpose(pred_masks, (0, 3, 1, 2)),
               semantic_seg=ops.transpose(semantic, (0, 3, 1, 2)))
    return {k: np.asarray(v, "float32") for k, v in out.items()}


def outputs(case: Case, model, feed: dict, *, is_task: bool) -> dict:
    """The model's outputs under the oracle's names: `last_hidden_state` (and
    `pooler_output`) of a backbone, `logits` of a task model."""
    import numpy as np

    if config(case)["model_type"] in ("sam3", "sam3_video"):
        return _sam3_outputs(model, feed)
    if config(case)["model_type"] == "gemma4_assistant":  # one draft step
        return _assistant_step(case, model, feed, is_task=is_task)
    given = keras_inputs(case, feed)
    if isinstance(given, dict) and not is_task:
        task_only = GEMMA3N_TASK if config(case)["model_type"] == "gemma3n" else ()
        for key in ("mask_positions", *task_only):
            given.pop(key, None)
    if not is_task and config(case)["model_type"] == "blip-2":
        return _query_image_outputs(model, given)
    if is_task and case.task == "Gemma3nCausalLM":
        # keras-hub's Gemma3nCausalLM reads its output embedding once, when built (its
        # functional graph holds the embedding's transpose as a constant): a task model
        # built before a restore gives the old embedding's logits, whatever its variables
        # hold. Its logits are those of the same class built around the restored backbone.
        model = type(model)(backbone=model.backbone, preprocessor=None)
    result = model(given)
    if is_task:
        return {"logits": np.asarray(result, dtype="float32")}
    if isinstance(result, dict) and "vision_logits" in result:  # contrastive: both towers
        unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
        return {"logits_per_image": np.asarray(result["vision_logits"], "float32"),
                "logits_per_text": np.asarray(result["text_logits"], "float32"),
                "image_embeds": unit(np.asarray(model.get_vision_embeddings(
                    given["images"]), "float32")),
                "text_embeds": unit(np.asarray(model.get_text_embeddings(
                    given["token_ids"]), "float32")),
                "last_hidden_state": np.asarray(model.text_encoder(
                    {"token_ids": given["token_ids"]}), "float32"),
                "vision_last_hidden_state": np.asarray(model.vision_encoder(
                    {"images": given["images"]}), "float32")}
    if isinstance(result, dict) and "decoder_sequence_output" in result:  # encoder-decoder
        return {"last_hidden_state": np.asarray(result["decoder_sequence_output"], "float32"),
                "encoder_last_hidden_state": np.asarray(result["encoder_sequence_output"],
                                                        "float32")}
    if isinstance(result, dict):
        out = {"last_hidden_state": np.asarray(result["sequence_output"], "float32")}
        if "pooled_output" in result:
            out["pooler_output"] = np.asarray(result["pooled_output"], "float32")
        return out
    return {"last_hidden_state": np.asarray(result, dtype="float32")}


def _assistant_step(case: Case, model, feed: dict, *, is_task: bool) -> dict:
    """A Gemma 4 assistant's step on the oracle's inputs: the task model's logits and
    `projected_state` (`call_with_cache`, the target's cache made of the oracle's keys and
    values), or the
    backbone's decoder run on the oracle's `decoder_inputs_embeds` (what `pre_projection`
    gives) reading the same keys and values: its `last_hidden_state`."""
    import numpy as np

    def kv(kind):  # torch's (batch, heads, positions, head_dim) -> keras-hub's cache slice
        return np.stack([feed[f"{kind}_{part}"].transpose(0, 2, 1, 3)
                         for part in ("keys", "values")], axis=1)

    cache = np.stack([kv("sliding"), kv("full")], axis=1)  # two target layers
    step = int(feed["position_ids"][0, 0])
    if is_task:
        width = config(case)["backbone_hidden_size"]
        given = feed["inputs_embeds"]
        logits, projected = model.call_with_cache(
            given[..., :width], given[..., width:], cache, step, target_kv_source_full_idx=1,
            target_kv_source_local_idx=0)
        return {"logits": np.asarray(logits, dtype="float32"),
                "projected_state": np.asarray(projected, dtype="float32")}
    import keras

    x = keras.ops.cast(feed["decoder_inputs_embeds"], model.compute_dtype)
    cache = keras.ops.cast(cache, model.compute_dtype)
    for layer, kind in zip(model.transformer_layers, model.layer_types):
        layer.attention.is_kv_shared_layer = True  # as the task model sets it
        shared = cache[:, 1 if kind == "full_attention" else 0]
        x, _ = layer(x, cache=shared, cache_update_index=step, shared_kv=shared)
    return {"last_hidden_state": np.asarray(model.layer_norm(x), dtype="float32")}


def exported(case: Case, dtype: str, out: str, model=None) -> bool:
    """objckpt's export into the empty folder `out` of the model restored from the folder:
    the task model where the class has one, else the backbone; in float32, written in the
    folder's dtype, with the rules of the folder's set. Returns whether export wrote a
    config.json; where it did not, the folder's own is copied beside (transformers needs
    one). `model`: that model, restored already."""
    import objckpt

    source = case.folder(dtype)
    rules = objckpt.rules.huggingface(source)
    if model is None:
        model = backbone(case, "float32")
        if case.task:
            model = task(case, model)
        objckpt.restore(model, source, rules=rules)
    os.makedirs(out, exist_ok=True)
    kwargs = {} if dtype == "float32" else {"dtype": dtype}
    objckpt.export(model, out, rules=rules, **kwargs)
    wrote = os.path.isfile(os.path.join(out, "config.json"))
    if not wrote:
        shutil.copy(os.path.join(source, "config.json"), out)
    return wrote


def export_rows():
    """(case, dtype) of the exports committed under tests/fixtures/hf_exports/."""
    return [(case, dtype) for case in CASES if case.exports_whole for dtype in DTYPES]


def write_exports(root: str = EXPORTS) -> None:
    if os.path.isdir(root):
        shutil.rmtree(root)
    for case, dtype in export_rows():
        name = f"{case.id}-{dtype}"
        try:
            exported(case, dtype, os.path.join(root, name))
            print(f"{name}: written")
        except Exception as err:  # noqa: BLE001 - a row objckpt cannot export yet
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            print(f"{name}: NOT written: {type(err).__name__}: {str(err)[:300]}")


if __name__ == "__main__":
    write_exports(sys.argv[1] if len(sys.argv) > 1 else EXPORTS)
