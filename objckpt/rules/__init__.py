"""Rules that convert both ways, and layout transforms with exact inverses.

A `Rule(source, target, transform)` names a source entry (as a file other than
objckpt's writes it, e.g. a Hugging Face safetensors name) and the object path
it feeds, with `{name}` placeholders that stand for one name segment on both
sides (no `/` and no `.` inside). A `RuleSet` of them is accepted wherever
`rules=` is (`restore`, `plan`, `migrate`, `restore_on_create`,
`load_ensemble`): each rule becomes the anchored regex rule
`(^source$, target, transform)`, so the usual rule semantics hold (the first
rule that matches a source key rewrites it; keys no rule matches stay as they
are). `objckpt.export` applies the same set the other way: each object path is
renamed by the first rule whose target matches it and its value goes through
the transform's inverse.

Several rules with the same source pattern feed one tensor to several variables: each
with a `Split(axis, parts=..., index=k)` first takes its part (GPT-2's fused `c_attn` ->
query, key, value; export concatenates them back), and without a Split the weights are
tied (the tensor feeds each target; export writes it once, checking they agree).
The other way round, a `Stack(over, count)` last in a rule's transform makes one variable of
the entries that differ only in its `over` placeholder (a mixture of experts' per-expert
weights -> keras-hub's expert bank); export writes each entry back (`Unstack`). And
several rules of one target, each ending with a `Concat(axis, parts=..., index=k)`, make one
variable of their parts (the way back from a `Split`: torch's q, k, v into one fused kernel;
after a Stack, Qwen MoE's per-expert gate and up weights into one `gate_up` bank).
Several rules of one target, each ending with a `Sum(parts, index)`, make one variable of
their entries added (RoBERTa's position rows, `Crop`ped of its reserved rows, plus its one
token-type row: `broadcast=(0,)`); export writes the value as term 0 and zeros as the
others (`Pad` puts the cropped rows back as zeros).

Transforms (`Transpose`, `ConvKernel`, `Reshape`, `Split`, `Stack`, `Crop`, `Chain`) are
callables on a `tf.Tensor` (or a NumPy array) that move bytes without arithmetic, so a round
trip through a transform and its `inverse()` is bit-exact. `Sum` alone adds: restoring its
export gives the variable back bit for bit (x + 0), but exporting what it restored writes
the sum, not the file's separate entries.

Example:
    >>> rules = objckpt.rules.RuleSet([
    ...     Rule("model.layers.{i}.mlp.up_proj.weight", "layers/{i}/up/kernel", Transpose()),
    ...     Rule("model.layers.{i}.mlp.up_proj.bias", "layers/{i}/up/bias"),
    ... ])
    >>> objckpt.restore(model, "hf/model.safetensors", rules=rules)
    >>> objckpt.export(model, "out/model.safetensors", rules=rules)

Rule sets for Hugging Face checkpoints ship with the library:
`objckpt.rules.huggingface("llama")`, or `huggingface("path/to/hf_dir")` which reads the
folder's `config.json` (`model_type`, and the sizes a set needs) as data. Each set knows the
Hub classes of its architecture and their heads (`Rule(..., head=...)`): set aside in a
backbone, restored into the keras-hub task model that has them; a part a class lacks
(`Rule(..., absent=...)`: a `BertForMaskedLM` has no pooler) is named with that reason.
Without rules, restoring a keras-hub model from such a folder uses the set its config.json
names (`huggingface.for_model`).

Layout: `core` (the rules and transforms; it imports only `objckpt.errors`, and TensorFlow
or NumPy only when a transform runs) and `huggingface` (the choice of a set), with one
module per architecture (`hf_<name>`) that imports only `core`. The planning layer imports
this package; this package imports only `errors` of objckpt, and `huggingface` also `_base`'s
rendering and, when it is given a folder, the safetensors reader of `_formats` (to tell a
folder's key form from its tensor names).
"""

from __future__ import annotations

from objckpt.rules.core import (
    Chain,
    Concat,
    ConvKernel,
    Crop,
    Pad,
    Reshape,
    Rule,
    RuleSet,
    Split,
    Stack,
    Sum,
    Transform,
    Transpose,
    Unstack,
)
from objckpt.rules.huggingface import huggingface, supported

__all__ = ["Chain", "Concat", "ConvKernel", "Reshape", "Rule", "RuleSet", "Split", "Stack", "Transform",
           "Transpose", "Unstack", "huggingface", "supported"]
__all__ += ["Crop", "Pad", "Sum"]
