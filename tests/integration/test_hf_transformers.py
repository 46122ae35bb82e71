"""Hugging Face folders that transformers itself wrote, restored into keras-hub, and back.

The oracle is transformers: tests/fixtures/hf/ holds tiny random models of each shipped
architecture and each of its Hub classes, saved by `save_pretrained` in float32 and
bfloat16, with transformers' outputs on fixed inputs beside each folder
(tests/helpers/make_hf_fixtures.py writes them, transformers pinned there). These tests need
only Keras 3 and keras-hub; the table is tests/helpers/hf_cases.py (one row per class: the
keras-hub backbone from keras-hub's own reading of config.json, the task model, the head's
entries, what the class lacks), so another architecture adds rows, not tests.

Tolerances (max |ours - transformers'| per element, `assert_allclose`):
- a float32 model (from a float32 folder, or a bfloat16 folder widened): rtol = atol = 1e-4.
  The same weights in the same float32 arithmetic differ by 2e-7 .. 1e-6 (summation order);
  keras-hub's BERT uses the tanh GELU where transformers' uses erf (1e-5), and keras-hub's
  ViT normalises with epsilon 1e-6 where the config says 1e-12 (keras-hub's importer does
  not pass it on): 5.5e-5. For a bfloat16 folder the oracle is transformers' float32 run of
  the folder (`from_pretrained(dtype=float32)`: the rounded weights widened, RoPE computed in
  float32), what a float32 model restored from it must compute, so widening is checked to
  the same tolerance as float32. A row may widen its logits' tolerance, or every output's
  (`tolerance`: Qwen3, whose attention keras-hub normalises with epsilon 1e-5 where the
  config says 1e-6: 4.6e-4), with the reason.
- a bfloat16 model: bfloat16 keeps 8 bits of mantissa (eps 2**-8 = 0.0039) and keras-hub
  computes in it; rtol = atol = 0.1 against the same float32 oracle (measured here: 0.013 ..
  0.032 on outputs of magnitude 2.3 .. 3.3).

Exports: objckpt's export of each model that holds exactly its folder's entries is compared
byte for byte (names, dtypes, values, header) with tests/fixtures/hf_exports/, the exports
that `make_hf_fixtures.py --check-exports` loads with transformers (nothing missing,
unexpected or mismatched; outputs equal). Regenerate them with
`python tests/helpers/hf_cases.py`, then check them with transformers.
"""

from __future__ import annotations

import functools
import json
import os
import re

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt.rules import huggingface

import hf_cases
from hf_cases import CASES, DTYPES

pytest.importorskip("keras_hub", reason="keras-hub is not installed here")
keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3"):
    pytest.skip("keras-hub's models need Keras 3", allow_module_level=True)
safetensors_numpy = pytest.importorskip("safetensors.numpy")

TOLERANCE = {"float32": 1e-4, "bfloat16": 0.1}  # rtol = atol, by the model's dtype
TASKS = [case for case in CASES if case.task]
ONE_PER_CONFIG = list({case.case: case for case in reversed(CASES)}.values())[::-1]


def _ids(cases):
    return [case.id for case in cases]


def _values(model) -> dict:
    return {_same(v.path): np.asarray(v.numpy()).tobytes() for v in model.weights}


def _same(path: str) -> str:
    """A variable's path as it is in every model of its configuration: without the counter
    Keras adds to an automatic layer name below a decoder layer
    (`transformer_layer_0/mixtral_sparse_moe_block_3/...`: the session's fourth block)."""
    return re.sub(r"^(transformer_layer_\d+/\w+?)(?:_\d+)?/", r"\1/", path)


def _bare(path: str) -> str:
    """An object path without the leading underscores of its segments (`_kernel`)."""
    return "/".join(part.lstrip("_") or part for part in path.split("/"))


def _computed(model, case) -> set:
    """The Keras paths of the backbone's variables the row lists as `computed` (by object
    path): no folder has them, so restore leaves them as the model made them (keras-hub
    initialises some at random: two models of the row differ there)."""
    tree = objckpt.tree(model)
    return {tree[path].name.rsplit(":", 1)[0] for path in case.computed if path in tree}


def _rules(case, dtype):
    return huggingface(case.folder(dtype))


@functools.lru_cache(maxsize=None)
def _restored_backbone(case, dtype, model_dtype="float32", **kwargs):
    """(backbone, report) after a restore from the folder (strict where the class lacks
    nothing), or (backbone, the error)."""
    model = hf_cases.backbone(case, model_dtype)
    try:
        return model, objckpt.restore(model, case.folder(dtype), rules=_rules(case, dtype),
                                      strict=not case.lacks, **kwargs)
    except errors.ObjckptError as err:
        return model, err


@functools.lru_cache(maxsize=None)
def _restored_task(case, dtype):
    """(task model, report) after a strict restore from the folder."""
    model = hf_cases.task(case, hf_cases.backbone(case))
    return model, objckpt.restore(model, case.folder(dtype), rules=_rules(case, dtype))


def _report(case, dtype, model_dtype="float32", **kwargs):
    model, report = _restored_backbone(case, dtype, model_dtype, **kwargs)
    if isinstance(report, Exception):
        raise report
    return model, report


def _tensors(path: str) -> dict:
    """{name: (dtype, shape, raw bytes)} of a safetensors file, read by its header (NumPy
    has no bfloat16)."""
    with open(path, "rb") as f:
        data = f.read()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    body = data[8 + size:]
    return {name: (entry["dtype"], tuple(entry["shape"]),
                   body[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items()}


def _unprefixed(name: str) -> str:
    """A tensor name without a base model's prefix (`model.`, `transformer.`, ...)."""
    first, _, rest = name.partition(".")
    return rest if first in ("model", "transformer", "bert", "vit", "distilbert",
                             "deit", "dinov2", "dinov2_with_registers", "swin") else name


def _assert_close(ours: dict, oracle: dict, tolerance: float, what: str):
    compared = [key for key in ours if key in oracle]
    assert compared, f"{what}: nothing to compare ({sorted(ours)} vs {sorted(oracle)})"
    for key in compared:
        np.testing.assert_allclose(ours[key], oracle[key], rtol=tolerance, atol=tolerance,
                                   err_msg=f"{what}: {key}")


# --- the fixtures are what the table says ----------------------------------------------------

def _skip_absent(case, dtype):
    if dtype not in case.dtypes:
        pytest.skip(f"{case.id} is written in {', '.join(case.dtypes)} only")


def _skip_float32_only(case):
    built = {str(v.dtype) for v in hf_cases.backbone(case, "bfloat16").weights}
    if built != {"bfloat16"}:
        pytest.skip(f"keras-hub builds {case.id}'s backbone in {sorted(built)} when given "
                    "dtype='bfloat16'")


def test_every_fixture_folder_has_a_row_and_every_row_its_folders():
    on_disk = {name for name in os.listdir(hf_cases.FIXTURES)
               if os.path.isdir(os.path.join(hf_cases.FIXTURES, name))}
    rows = {os.path.basename(case.folder(dtype)) for case in CASES for dtype in case.dtypes}
    assert on_disk == rows
    for case in CASES:
        for dtype in case.dtypes:
            config = hf_cases.config(case, dtype)
            assert config["architectures"] == [case.cls]
            assert config.get("dtype", config.get("torch_dtype")) == dtype
            oracle = hf_cases.oracle(case, dtype)
            assert "last_hidden_state" in oracle
            assert ("logits" in oracle) == (not case.cls.endswith(("Model", "Backbone")) or
                                            case.cls == "GPT2LMHeadModel")


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_the_head_entries_are_in_the_folder_and_no_backbone_has_them(case):
    """The table's head keys are entries of the folder (as transformers saved them)."""
    names = set(safetensors_numpy.load_file(
        os.path.join(case.folder("float32"), "model.safetensors")))
    assert set(case.head) <= names
    backbone = _restored_backbone(case, "float32")[0]
    assert not set(case.lacks) - {v.path for v in backbone.weights}


# --- into the keras-hub backbone --------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_backbone_restores_and_computes_what_transformers_computes(case, dtype):
    """Strict restore into a float32 backbone: every entry but the head's restored, the
    head's set aside and listed as such, nothing unexpected; a bfloat16 folder is widened
    (listed); outputs within float tolerance of transformers'. A class that lacks a
    backbone variable (a base model without the output embedding, BertForMaskedLM's pooler)
    restores with strict=False and names exactly those."""
    _skip_absent(case, dtype)
    model, report = _report(case, dtype)
    assert tuple(report.unexpected) == ()
    assert sorted(map(_bare, report.missing)) == sorted(case.lacks)
    assert len(report.restored) == len(model.weights) - len(case.lacks) - len(case.computed)
    for path in case.computed:
        assert any(line.startswith((f"`{path}`:", f"`{path}` [")) for line in
                   report.skipped), path
    skipped = "\n".join(report.skipped)
    for key in case.head:
        assert any(line.startswith(key + ":") for line in report.skipped), (
            f"{key} not set aside: {skipped}")
    if dtype == "bfloat16":
        assert report.cast and set(report.cast.values()) == {"bfloat16 -> float32"}
    _assert_close(hf_cases.outputs(case, model, hf_cases.oracle(case, dtype), is_task=False),
                  hf_cases.oracle(case, dtype), case.tolerance or TOLERANCE["float32"],
                  case.id)


@pytest.mark.parametrize("case", [c for c in CASES if c.lacks], ids=_ids(
    [c for c in CASES if c.lacks]))
def test_a_strict_restore_names_what_the_class_lacks_and_changes_nothing(case):
    """One problem per variable the class lacks, each named; the head is no problem."""
    model = hf_cases.backbone(case)
    before = _values(model)
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(model, case.folder("float32"), rules=_rules(case, "float32"))
    count = len(case.lacks)
    assert f": {count} problem{'s' if count > 1 else ''}." in str(caught.value)
    for path in case.lacks:
        assert path in str(caught.value)
    for key in case.head:  # the head is set aside, never a problem
        assert key not in str(caught.value)
    assert _values(model) == before


# --- into the keras-hub task model ------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TASKS, ids=_ids(TASKS))
def test_task_model_restores_the_head_and_its_logits_are_transformers(case, dtype):
    _skip_absent(case, dtype)
    model, report = _restored_task(case, dtype)
    assert (tuple(report.missing), tuple(report.unexpected)) == ((), ())
    for key in case.head:
        assert not any(line.startswith(key) for line in report.skipped), report.skipped
    oracle = hf_cases.oracle(case, dtype)
    oracle["logits"] = oracle["logits"][:, case.logits_from:]
    _assert_close(hf_cases.outputs(case, model, hf_cases.oracle(case, dtype), is_task=True),
                  oracle, case.logits_tolerance or case.tolerance or TOLERANCE["float32"], case.id)


# --- one call -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_one_call_uses_the_set_that_config_json_names(case):
    """restore(model, folder) without rules: the same variables as with the set, and the
    report says which set it used."""
    model = hf_cases.task(case, hf_cases.backbone(case)) if case.task else \
        hf_cases.backbone(case)
    report = objckpt.restore(model, case.folder("float32"), strict=not case.lacks)
    reference = _restored_backbone(case, "float32")[0]
    # variable by variable, in order: keras-hub leaves some layers Keras's numbered names
    ours = [v for v in (model.backbone if case.task else model).weights
            if v.path not in case.task_adds]
    assert len(ours) == len(reference.weights)
    kept = set(case.lacks) | _computed(reference, case)
    for variable, expected in zip(ours, reference.weights):
        if expected.path not in kept:  # those keep their (random) initial values
            assert np.asarray(variable.numpy()).tobytes() == np.asarray(
                expected.numpy()).tobytes(), expected.path
    model_type = hf_cases.config(case)["model_type"]
    assert f"huggingface({model_type!r})" in str(report)


# --- dtypes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_bfloat16_folder_into_a_bfloat16_model(case):
    """No cast: the variables hold the file's bfloat16 values, which are transformers'
    float32 weights rounded to nearest even (as the float32 folder restored, then rounded),
    and the outputs are within bfloat16 tolerance of transformers'."""
    _skip_absent(case, "bfloat16")
    _skip_float32_only(case)
    if case.folded:  # the folded entries' sum is float32: rounded once, as asked for
        model, report = _report(case, "bfloat16", "bfloat16", cast="lossy")
        assert set(report.cast.values()) == {"float32 -> bfloat16"}
    else:
        model, report = _report(case, "bfloat16", "bfloat16")
        assert not getattr(report, "cast", None)
    assert {v.dtype for v in model.weights} == {"bfloat16"}
    # a folded variable is the sum of the file's bfloat16 entries (in float32) rounded once;
    # the reference model is of the same class, its variables in the same order (see above)
    wide = _report(case, "bfloat16" if case.folded else "float32")[0].weights
    assert len(wide) == len(model.weights)
    kept = set(case.lacks) | _computed(model, case)
    for variable, reference in zip(model.weights, wide):
        if variable.path in kept:
            continue
        rounded = np.asarray(reference.numpy()).astype(variable.numpy().dtype)
        assert rounded.tobytes() == np.asarray(variable.numpy()).tobytes(), variable.path
    _assert_close(hf_cases.outputs(case, model, hf_cases.oracle(case, "bfloat16"),
                                   is_task=False),
                  hf_cases.oracle(case, "bfloat16"),
                  case.bfloat16_tolerance or TOLERANCE["bfloat16"], case.id)


@pytest.mark.parametrize("case", ONE_PER_CONFIG, ids=_ids(ONE_PER_CONFIG))
def test_a_lossy_cast_is_refused_without_the_argument(case):
    """float32 folder -> bfloat16 model: a typed error whose Fix names `cast="lossy"`,
    nothing changed; with it, the values are the float32 ones rounded."""
    _skip_float32_only(case)
    model = hf_cases.backbone(case, "bfloat16")
    before = _values(model)
    folder, rules = case.folder("float32"), _rules(case, "float32")
    with pytest.raises(errors.ObjckptError, match=r"(?s)float32.*bfloat16.*Fix:.*cast="):
        objckpt.restore(model, folder, rules=rules, strict=not case.lacks)
    assert _values(model) == before
    objckpt.restore(model, folder, rules=rules, strict=not case.lacks, cast="lossy")
    wide = _restored_backbone(case, "float32")[0]
    kept = _computed(model, case)
    for variable, reference in zip(model.weights, wide.weights):
        if any(variable.path.endswith(path) for path in case.lacks) or variable.path in kept:
            continue  # the folder has no value for it: left at its initial value
        expected = np.asarray(reference.numpy()).astype(variable.numpy().dtype)
        assert expected.tobytes() == np.asarray(variable.numpy()).tobytes(), variable.path


# --- back out: what transformers reads ------------------------------------------------------

EXPORTS = hf_cases.export_rows()


def test_every_model_that_holds_its_folder_has_a_committed_export():
    names = {f"{case.id}-{dtype}" for case, dtype in EXPORTS}
    on_disk = set(os.listdir(hf_cases.EXPORTS)) if os.path.isdir(hf_cases.EXPORTS) else set()
    assert on_disk == names, (f"missing: {sorted(names - on_disk)}; stale: "
                              f"{sorted(on_disk - names)}")


def _assert_folded(ours: dict, original: dict, folded: tuple, reserved: int):
    """A Sum rule's entries as export writes them: the first the folder's two added (in
    float32, rounded once to the file's dtype) behind its reserved rows, written as zeros;
    the other zeros (RoBERTa: position rows and the token-type row)."""
    import ml_dtypes

    kinds = {"F32": np.float32, "BF16": ml_dtypes.bfloat16}

    def array(entry):
        kind, shape, raw = entry
        return np.frombuffer(raw, kinds[kind]).reshape(shape)

    first, second = folded
    position, token_type = array(ours[first]), array(ours[second])
    assert (ours[first][:2], ours[second][:2]) == (original[first][:2], original[second][:2])
    assert not np.any(token_type.astype(np.float32))
    assert not np.any(position[:reserved].astype(np.float32))
    wide = {k: array(original[k]).astype(np.float32) for k in folded}
    summed = (wide[first][reserved:] + wide[second][0]).astype(position.dtype)
    assert position[reserved:].tobytes() == summed.tobytes()


@pytest.mark.parametrize("case,dtype", EXPORTS, ids=[f"{c.id}-{d}" for c, d in EXPORTS])
def test_export_is_byte_equal_to_what_transformers_read_back(tmp_path, case, dtype):
    """The model restored from the folder (float32), exported in the folder's dtype: the
    same file, byte for byte, as the committed export that transformers loads with nothing
    missing, unexpected or mismatched; each tensor is the one transformers wrote (name,
    dtype, shape, bytes); export writes a config.json naming the class and the dtype."""
    out = str(tmp_path / "out")
    model = _restored_task(case, dtype)[0] if case.task else _report(case, dtype)[0]
    wrote_config = hf_cases.exported(case, dtype, out, model)
    written = os.path.join(out, "model.safetensors")
    committed = os.path.join(hf_cases.EXPORTS, f"{case.id}-{dtype}", "model.safetensors")
    ours = _tensors(written)
    # the tensors transformers wrote (restore and export are exact), under its names (a
    # base model's may carry the task classes' prefix: transformers reads both)
    original = {case.export_name(k): v for k, v in _tensors(
        os.path.join(case.folder(dtype), "model.safetensors")).items()}
    if case.folded:
        _assert_folded(ours, original, case.folded, hf_cases.config(case)["pad_token_id"] + 1)
    ours_bare = {_unprefixed(k): v for k, v in ours.items() if k not in case.folded}
    original_bare = {_unprefixed(k): v for k, v in original.items() if k not in case.folded}
    for key in case.export_differs:  # written with the same dtype and shape, or not at all
        theirs, exported = original_bare.pop(key), ours_bare.pop(key, None)
        assert exported is None or exported[:2] == theirs[:2], key
    assert ours_bare == original_bare
    assert sorted(ours) == sorted(_tensors(committed))
    with open(written, "rb") as f, open(committed, "rb") as g:
        assert f.read() == g.read()
    assert wrote_config, "export wrote no config.json"
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["architectures"] == [case.cls]
    assert config.get("dtype", config.get("torch_dtype")) == dtype


# --- transformers 5's key form ----------------------------------------------------------------

NEW_FORM = [(case, dtype) for case in CASES if case.form for dtype in case.dtypes]
_NEW_IDS = [f"{c.id}-{d}" for c, d in NEW_FORM]
# an entry transformers 5 names anew, by configuration (its prefix: the class's, `CLASSES`)
_NEW_NAME = {"vit": "layers.0.attention.q_proj.weight",
             "deit": "layers.0.attention.q_proj.weight",
             "dinov2": "encoder.layer.0.attention.q_proj.weight",
             "dinov2_swiglu": "encoder.layer.0.mlp.gate_proj.weight",
             "dinov2_registers": "encoder.layer.0.attention.o_proj.bias",
             "swin": "encoder.layers.1.blocks.1.attention.relative_position_bias."
                     "relative_position_bias_table",
             "dinov3": "model.layer.0.attention.q_proj.weight",
             "dinov3_gated": "model.layer.1.mlp.gate_proj.weight",
             "mixtral": "layers.0.mlp.experts.gate_up_proj",
             "qwen3_moe": "layers.0.mlp.experts.gate_up_proj",
             "qwen2_moe": "layers.0.mlp.experts.gate_up_proj",
             "qwen3_5_moe": "layers.0.mlp.experts.gate_up_proj"}
# mixtures of experts: transformers 5 holds each bank's experts in one tensor (as many bytes)
_BANKED = {"mixtral", "qwen3_moe", "qwen2_moe", "qwen3_5_moe"}
_SIGLIP = ("gemma3_vision", "paligemma")  # a SigLIP tower, its names changed by transformers 5
_FORMED = sorted({case.case for case in CASES if case.form})


def _joined_halves(tensors: dict, original: dict) -> dict:
    """The tensors with each `gate_proj`/`up_proj` pair that the original folder holds as one
    `weights_in` joined along the first axis (bytes concatenated): transformers 5 splits a
    fused SwiGLU input projection (DINOv2's) into those halves."""
    out = dict(tensors)
    for name in [n for n in tensors if ".gate_proj." in n]:
        fused = name.replace(".gate_proj.", ".weights_in.")
        if fused not in original:
            continue
        (dtype, shape, first), (_, _, second) = out.pop(name), out.pop(
            name.replace(".gate_proj.", ".up_proj."))
        out[fused] = (dtype, (2 * shape[0],) + shape[1:], first + second)
    return out


def _set_module(case):
    """The module of the case's shipped set (its `CLASSES`, its `FORMS`)."""
    import importlib

    hf = importlib.import_module("objckpt.rules.huggingface")
    return importlib.import_module(hf._MODULES[hf_cases.config(case)["model_type"]])


def _siglip_new_form(case) -> tuple:
    """(a key a SigLIP model's new-form folder holds, a regex no key of it matches): the
    tower without `vision_model.` (as the default form too), the rest under `model.`."""
    prefix = "model." if case.cls not in ("Gemma3Model", "PaliGemmaModel") else ""
    return f"{prefix}vision_tower.embeddings.patch_embedding.weight", r"^language_model\.model\."


@pytest.mark.parametrize("case,dtype", NEW_FORM, ids=_NEW_IDS)
def test_new_form_folders_are_the_original_models_under_transformers_5_names(case, dtype):
    """What the fixture script wrote: the same tensors as the original-form folder, the
    encoder's under transformers 5's names (a mixture of experts': each bank's experts in one
    tensor, as many bytes), and the same oracle."""
    ours = _tensors(os.path.join(case.folder(dtype), "model.safetensors"))
    theirs = _tensors(os.path.join(case.original.folder(dtype), "model.safetensors"))
    if case.case in _SIGLIP:
        key, original = _siglip_new_form(case)
        assert key in ours
        assert not [name for name in ours if re.search(original, name)]
    else:
        module = _set_module(case)
        assert module.CLASSES[case.cls][0] + _NEW_NAME[case.case] in ours
        assert not [name for name in ours if re.match(module.FORMS["original"][0], name)]
    if case.case in _BANKED:
        assert sum(len(v[2]) for v in ours.values()) == sum(len(v[2]) for v in theirs.values())
    else:
        assert sorted(_joined_halves(ours, theirs).values()) == sorted(theirs.values())
    assert set(ours) != set(theirs)
    oracle, original = hf_cases.oracle(case, dtype), hf_cases.oracle(case.original, dtype)
    assert sorted(oracle) == sorted(original)
    for key, value in oracle.items():
        assert value.tobytes() == original[key].tobytes(), key


@pytest.mark.parametrize("case,dtype", NEW_FORM, ids=_NEW_IDS)
def test_new_form_restores_what_the_original_form_restores(case, dtype):
    """Backbone and task model: every variable bit-equal to the original form's restore,
    the same entries set aside as the head."""
    model, report = _report(case, dtype)
    reference, expected = _report(case.original, dtype)
    assert _values(model) == _values(reference)
    assert len(report.restored) == len(expected.restored)
    assert sorted(line.split(":")[0] for line in report.skipped) == sorted(
        line.split(":")[0] for line in expected.skipped)
    if case.task:
        assert _values(_restored_task(case, dtype)[0]) == _values(
            _restored_task(case.original, dtype)[0])


@pytest.mark.parametrize("case", [c for c in CASES if c.case in _FORMED],
                         ids=_ids([c for c in CASES if c.case in _FORMED]))
def test_one_call_names_the_key_form_it_read(case):
    model = hf_cases.backbone(case)
    report = objckpt.restore(model, case.folder("float32"), strict=not case.lacks)
    # transformers 5.24 writes a SigLIP tower without `vision_model.` in either form
    form = "transformers 5" if case.form or case.case in _SIGLIP else "original"
    assert f"its keys in the {form} form" in str(report)


@pytest.mark.parametrize("case,dtype", NEW_FORM, ids=_NEW_IDS)
def test_export_of_a_new_form_folder_writes_the_original_form(tmp_path, case, dtype):
    """Export names what transformers reads by default, whatever form was restored: the
    bytes of the export of the original-form folder's model (the committed one, where the
    class has one)."""
    import re

    out, reference = str(tmp_path / "new"), str(tmp_path / "original")
    model = _restored_task(case, dtype)[0] if case.task else _report(case, dtype)[0]
    hf_cases.exported(case, dtype, out, model)
    original = case.original
    hf_cases.exported(original, dtype, reference, _restored_task(original, dtype)[0]
                      if original.task else _report(original, dtype)[0])
    with open(os.path.join(out, "model.safetensors"), "rb") as f, \
            open(os.path.join(reference, "model.safetensors"), "rb") as g:
        assert f.read() == g.read()
    new_form = _set_module(case).FORMS["transformers 5"][0]
    assert not [name for name in _tensors(os.path.join(out, "model.safetensors"))
                if re.match(new_form, name)]
    if original.exports_whole:
        committed = os.path.join(hf_cases.EXPORTS, f"{original.id}-{dtype}",
                                 "model.safetensors")
        with open(os.path.join(out, "model.safetensors"), "rb") as f, \
                open(committed, "rb") as g:
            assert f.read() == g.read()
