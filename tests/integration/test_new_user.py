"""What a new user meets following README.md and docs/ on a fresh machine: install lines that
work from a checkout, the extras they name, and docs that say what the code does."""

import ast
import glob
import json
import os
import re
import struct

import numpy as np
import pytest

from flavours import KERAS_FLAVOURS, _data, build_functional, keras_for
from support import ROOT, assert_bits, values

PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
SOURCES = sorted(glob.glob(os.path.join(ROOT, "objckpt", "**", "*.py"), recursive=True))


def _read(path) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def _extras() -> dict:
    """pyproject.toml's [project.optional-dependencies]: name -> the requirement strings."""
    text = _read("pyproject.toml")
    section = re.search(r"^\[project\.optional-dependencies\]\n(.*?)^\[", text, re.M | re.S)
    assert section, "pyproject.toml has no [project.optional-dependencies]"
    body = re.sub(r"#[^\n]*", "", section.group(1))
    return {name: re.findall(r'"([^"]+)"', items)
            for name, items in re.findall(r"^([\w-]+)\s*=\s*\[(.*?)\]", body, re.M | re.S)}


def _install_lines(text: str) -> list[str]:
    """Every `pip install ...` command in text, up to the end of its line or its quote."""
    found = re.finditer(r"(?:python3 -m )?pip install[^\n`#]*", text)
    return [m.group(0).strip() for m in found]


def _objckpt_targets(line: str) -> list[str]:
    """The checkout targets a pip line installs: `.` or `".[a,b]"` (quoted or not)."""
    return re.findall(r"""(?<![\w/-])["']?\.(?:\[[^\]]*\])?["']?(?=\s|$|\\)""", line)


def test_the_extras_parser_reads_pyproject():
    extras = _extras()
    assert {"test", "tf_keras", "gcs", "s3", "hf", "remote-test", "notebooks"} <= set(extras)
    assert extras["gcs"] == ["gcsfs>=2024.2.0"]


@pytest.mark.parametrize("path", PAGES + [os.path.relpath(p, ROOT) for p in SOURCES])
def test_every_install_line_works_from_a_checkout(path):
    """The package is not on PyPI: `pip install objckpt[gcs]` fails with "No matching
    distribution". Every line that installs objckpt installs the checkout (`python3 -m pip
    install ".[gcs]"`), and names only extras pyproject.toml defines."""
    text = _read(path).replace('\\"', '"')  # in Python strings: the text they hold
    assert "objckpt[" not in text, f"{path} installs objckpt from PyPI, where it is not"
    extras = _extras()
    for line in _install_lines(text):
        for target in _objckpt_targets(line):
            assert "python3 -m pip install" in line, (path, line)
            named = re.search(r"\[([^\]]*)\]", target)
            if named and "{" not in target:  # an f-string's: its message is tested
                assert target[0] in "\"'" and target[-1] == target[0], (
                    f"{path}: {line!r}: quote `.[extra]` (shells expand brackets)")
                for extra in named.group(1).split(","):
                    assert extra.strip() in extras, (path, line, extra)


def test_the_install_line_check_catches_what_failed():
    """The checks above fail on the lines a new user met."""
    assert _objckpt_targets('python3 -m pip install ".[gcs]"') == ['".[gcs]"']
    assert _objckpt_targets("python3 -m pip install . && objckpt demo") == ["."]
    assert _objckpt_targets("python3 -m pip install nox") == []
    assert _install_lines("`pip install objckpt[gcs]` (gcsfs)") == ["pip install objckpt[gcs]"]


def test_the_hugging_face_path_says_what_it_needs_and_ci_installs_it_so():
    """docs/huggingface.md's blocks import keras_hub and safetensors: the page says how to
    install them (the `hf` extra, then keras-hub without its dependencies), and the keras3
    test session, which runs those blocks, installs them the same way."""
    extras = _extras()
    assert "safetensors>=0.4" in extras["hf"]
    page = _read("docs/huggingface.md")
    first_block = page.index("```python")
    said = page[:first_block]
    assert 'python3 -m pip install ".[hf]"' in said
    assert "python3 -m pip install --no-deps keras-hub" in said
    assert "import keras_hub" in page and "import safetensors" in page
    nox = _read("noxfile.py")
    session = nox[nox.index("def keras3"):nox.index("def tf_keras")]
    assert re.search(r'extras="[^"]*\bhf\b', session), session
    assert '("--no-deps", "keras-hub")' in nox
    assert 'python3 -m pip install ".[hf]"' in _read("README.md")


# --- the line Checkpointing prints on resuming -------------------------------------------

def _fit(keras, model, callbacks, epochs):
    """fit on 8 samples in batches of 2: 4 batches an epoch, in order."""
    _images, tokens, targets = _data()
    return model.fit([_images, tokens], targets, epochs=epochs, batch_size=2, shuffle=False,
                     verbose=0, callbacks=callbacks)


def _stop_after(keras, batches):
    class Stop(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            Stop.seen += 1
            if Stop.seen == batches:
                raise RuntimeError("interrupted on purpose")

    return Stop()


def _fresh(keras):
    keras.utils.set_random_seed(0)
    return build_functional(keras, train=False)


@pytest.mark.parametrize("flavour", KERAS_FLAVOURS)
def test_a_checkpoint_saved_after_an_epochs_last_batch_resumes_with_the_next_epoch(
        tmp_path, flavour, capsys):
    """save_freq=4 with epochs of 4 batches saves after each epoch's last batch: resuming
    says the epoch is done and training continues with the next one (not "with batch 5 of
    that epoch"), and training does continue there, bit for bit."""
    from objckpt.callbacks import Checkpointing

    keras = keras_for(flavour)
    model = _fresh(keras)
    _fit(keras, model, [], epochs=3)
    expected = values(model)
    model = _fresh(keras)
    with pytest.raises(RuntimeError, match="interrupted on purpose"):
        _fit(keras, model, [Checkpointing(tmp_path, save_freq=4), _stop_after(keras, 6)], 3)
    capsys.readouterr()
    model = _fresh(keras)
    _fit(keras, model, [Checkpointing(tmp_path, save_freq=4)], epochs=3)
    printed = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("Checkpointing")]
    assert printed == [
        f"Checkpointing: resumed from {tmp_path}/ckpt-1 (epoch 1 of 3 done, step 4); "
        "training continues with epoch 2."]
    assert_bits(expected, values(model))
    # fit(epochs=1) from the same checkpoint: that epoch was its last, nothing to train.
    model = _fresh(keras)
    _fit(keras, model, [Checkpointing(tmp_path / "one", save_freq=4)], epochs=1)
    capsys.readouterr()
    trained = values(model)
    _fit(keras, model, [Checkpointing(tmp_path / "one", save_freq=4)], epochs=1)
    printed = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("Checkpointing")]
    assert printed == [
        f"Checkpointing: training already finished: {tmp_path}/one/ckpt-1 holds 1 epoch(s) "
        "(step 4) and fit(epochs=1) counts all epochs, these included, so this fit trains no "
        "more. To train further, pass a larger epochs= to fit; to start over, give "
        "Checkpointing a new directory."]
    assert_bits(trained, values(model))


def test_the_resume_line_without_the_epochs_length_keeps_the_batch():
    """fit on a dataset of unknown length does not say how many batches an epoch has: the
    line then names the batch, as before."""
    from objckpt._training.fitckpt import resume_line

    assert resume_line("p", 3, 10, 40, 6) == (
        "Checkpointing: resumed from p (epoch 4 of 6 at batch 10, step 40); training "
        "continues with batch 11 of that epoch.")
    assert resume_line("p", 3, 10, 40, 6, 10) == (
        "Checkpointing: resumed from p (epoch 4 of 6 done, step 40); training continues "
        "with epoch 5.")
    assert resume_line("p", 3, 4, 34, 6, 10).endswith("continues with batch 5 of that epoch.")


# --- export writes weights only ---------------------------------------------------------

def _written_names(path) -> list:
    """The tensor names of a safetensors file, read from its header."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        return [k for k in json.loads(f.read(size)) if k != "__metadata__"]


@pytest.mark.parametrize("strict", [True, False])
def test_export_of_a_keras_hub_bert_writes_no_random_generator_state(tmp_path, strict):
    """A keras-hub BERT holds SeedGenerator states (its dropout layers'): export with the
    Hugging Face set writes the weights only, with strict=False too (transformers took
    the states for unexpected weights and called the file corrupted), and says what it
    left out."""
    keras_hub = pytest.importorskip("keras_hub")
    import objckpt

    config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 64,
              "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 32, "max_position_embeddings": 32,
              "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12}
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=32)
    seeds = {p for p, v in objckpt.tree(backbone).items() if "seed_generator" in p}
    assert len(seeds) >= 5  # the states the report named: there are some to leave out
    written = objckpt.export(backbone, tmp_path / "bert", strict=strict,
                             rules=objckpt.rules.huggingface("bert", config=config))
    names = _written_names(written)
    assert len(names) == len(backbone.weights)  # every weight, nothing else
    assert not [n for n in names if "seed" in n or "/" in n]
    assert set(written.left_out) == seeds
    assert all("random-generator state" in why for why in written.left_out.values())


@pytest.mark.parametrize("flavour", ["keras3", "module"])
def test_export_without_rules_leaves_random_generator_state_out(tmp_path, flavour):
    """Without rules too: a Keras 3 Dropout's SeedGenerator and a tf.Module's
    tf.random.Generator are not written; the weights restore bit for bit."""
    import tensorflow as tf

    import objckpt

    if flavour == "keras3":
        keras = keras_for("keras3")
        obj = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                keras.layers.Dropout(0.5), keras.layers.Dense(2)])
        weights = {p for p, v in objckpt.tree(obj).items() if "seed_generator" not in p}
    else:
        obj = tf.Module()
        obj.w = tf.Variable(np.arange(6, dtype="float32").reshape(2, 3))
        obj.generator = tf.random.Generator.from_seed(1)
        weights = {"w"}
    randoms = set(objckpt.tree(obj)) - weights
    assert len(randoms) == 1
    written = objckpt.export(obj, tmp_path / "m.safetensors")
    assert set(_written_names(written)) == weights
    assert written.left_out == {
        p: "random-generator state (a Keras SeedGenerator's or tf.random.Generator's), not "
           "a weight" for p in randoms}
    assert written == str(tmp_path / "m.safetensors")  # still the path, as a str
    before = values(obj)
    for variable in obj.trainable_variables:
        variable.assign(tf.zeros_like(variable))
    objckpt.restore(obj, written, strict=False)
    assert_bits({p: before[p] for p in weights}, {p: values(obj)[p] for p in weights})


# --- docs that say what the code does ---------------------------------------------------

@pytest.mark.subprocess
def test_verify_imports_tensorflow_for_tf_checkpoints_only_and_the_docs_say_so(tmp_path):
    """`verify` reads a TF checkpoint's tensors through TF's reader (TensorFlow is imported)
    and a safetensors file without it: no page calls `verify` TF-free without saying that."""
    import subprocess
    import sys

    import tensorflow as tf

    import objckpt

    module = tf.Module()
    module.w = tf.Variable([1.0, 2.0])
    prefix = objckpt.save(module, str(tmp_path / "ckpt"))
    objckpt.export(module, str(tmp_path / "m.safetensors"))
    from support import python_env

    for source, imports in ((prefix, True), (str(tmp_path / "m.safetensors"), False)):
        code = ("import sys, objckpt; assert objckpt.verify(sys.argv[1]).ok; "
                "print('tensorflow' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code, source], env=python_env(),
                             capture_output=True, text=True, timeout=300)
        assert out.stdout.split()[-1] == str(imports), (source, out.stderr[-2000:])
    claim = re.compile(r"verify`?[^.;|]*(TF-free|without TensorFlow)|"
                       r"(TF-free|without TensorFlow)[^.;|]*`verify")
    for page in ("README.md", "docs/formats.md", "docs/storage.md"):
        for paragraph in re.split(r"\n\s*\n|\n(?=\|)", _read(page)):  # table rows apart
            paragraph = " ".join(paragraph.split())
            if claim.search(paragraph):
                assert re.search(r"imports|but for `verify`|all TF-free", paragraph), (
                    page, paragraph)


def test_directories_may_be_urls_in_every_docstring_and_page():
    """Checkpointing and CheckpointManager take gs:// and s3:// directories (docs/storage.md):
    no docstring or page says a directory must be local."""
    from objckpt import callbacks
    from objckpt._training import manager

    for doc in (callbacks.Checkpointing.__doc__, manager.CheckpointManager.__doc__):
        assert "a local directory" not in doc
        assert "gs://" in doc and "s3://" in doc
    assert "must be local" not in _read("docs/guarantees.md")


def test_readme_resume_training_names_save_freq():
    """Checkpoints within an epoch need save_freq; README's "Resume training" says so."""
    readme = _read("README.md")
    section = readme[readme.index("## Resume training"):]
    section = section[:section.index("\n## ", 3)]
    assert "save_freq=N" in section


# --- messages that show the mistake ------------------------------------------------------

@pytest.fixture(scope="module")
def tf1_prefix(tmp_path_factory):
    """A TF1 Saver checkpoint of `legacy_net/{hidden,output}_layer/{weights,biases}`,
    trained one Adam step (so `beta1_power` and the slots sort before the weights)."""
    import tensorflow as tf

    folder = tmp_path_factory.mktemp("tf1")
    with tf.Graph().as_default():
        x = tf.constant(np.ones((2, 4), "float32"))
        with tf.compat.v1.variable_scope("legacy_net"):
            with tf.compat.v1.variable_scope("hidden_layer"):
                w = tf.compat.v1.get_variable("weights", initializer=np.ones((4, 3), "float32"))
                b = tf.compat.v1.get_variable("biases", initializer=np.zeros(3, "float32"))
            with tf.compat.v1.variable_scope("output_layer"):
                w2 = tf.compat.v1.get_variable("weights", initializer=np.ones((3, 2), "float32"))
                b2 = tf.compat.v1.get_variable("biases", initializer=np.zeros(2, "float32"))
        loss = tf.reduce_sum(tf.matmul(tf.matmul(x, w) + b, w2) + b2)
        step = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(step)
            return tf.compat.v1.train.Saver().save(session, str(folder / "model.ckpt"))


def _net():
    keras = keras_for("keras3")

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.fc_in = keras.layers.Dense(3)
            self.fc_out = keras.layers.Dense(2)

        def call(self, x):
            return self.fc_out(self.fc_in(x))

    net = Net()
    net(np.ones((1, 4), "float32"))
    return net


def _refusal(obj, source, **kwargs) -> str:
    import objckpt
    from objckpt import errors

    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(obj, source, **kwargs)
    return str(caught.value)


def test_a_mismatch_shows_each_key_as_the_rules_rewrote_it(tf1_prefix):
    """A rule that rewrites `legacy_net/hidden_layer/weights` to `fc_in/weights` (where the
    obj has `fc_in/kernel`): the message and the plan show the rewritten key, the mistake,
    beside the original; keys no rule rewrote show as they are."""
    import objckpt

    net = _net()
    rules = [(r"^legacy_net/hidden_layer/", "fc_in/")]
    message = _refusal(net, tf1_prefix, rules=rules, optimizer_state=False)
    assert ("  - `legacy_net/hidden_layer/weights` -> `fc_in/weights`: in the source but not "
            "in the obj") in message.splitlines()
    assert ("  - `legacy_net/output_layer/weights`: in the source but not in the obj"
            in message.splitlines())
    # The Fix names the variable beside the rewritten key, with a rule that works put first.
    near = re.search(r"Fix: a rule rewrote `legacy_net/hidden_layer/biases` to `fc_in/biases`, "
                     r"which the obj lacks; `fc_in/bias` beside it has its shape: name it with a "
                     r"rule before yours, e\.g\. rules=\[(\(.*?\))\] followed by your rules",
                     message)
    assert near, message
    fixed = [ast.literal_eval(near.group(1)), *rules]
    matched = objckpt.plan(net, tf1_prefix, rules=fixed, strict=False, optimizer_state=False)
    assert ("legacy_net/hidden_layer/biases", "fc_in/bias") in [
        (m.source, m.target) for m in matched.matches]
    described = objckpt.plan(net, tf1_prefix, rules=rules, optimizer_state=False).describe()
    assert "  - legacy_net/hidden_layer/biases -> fc_in/biases" in described.splitlines()
    assert "  - legacy_net/output_layer/biases" in described.splitlines()


def test_the_tf1_fix_gives_an_example_rule_in_the_spelling_of_the_interface(tf1_prefix):
    """The name-based Fix line names a network variable (not `beta1_power`) and gives an
    example rule built from the checkpoint's own keys, which does what it says; the command
    line says the same with its flags (`--rules FILE` holding the JSON), never
    `objckpt.plan(obj, source, --rules FILE)`."""
    import objckpt
    from objckpt._cli import terminal

    net = _net()
    message = _refusal(net, tf1_prefix, optimizer_state=False)
    fix = message[message.index("\nFix: "):]
    assert "beta1_power" not in fix
    assert "its keys are global variable names such as `legacy_net/hidden_layer/biases`" in fix
    example = re.search(r"e\.g\. rules=\[(\(.*?\))\]", fix)
    assert example, fix
    regex, replacement = ast.literal_eval(example.group(1))
    the_plan = objckpt.plan(net, tf1_prefix, rules=[(regex, replacement)], strict=False,
                            optimizer_state=False)
    assert [(m.source, m.target) for m in the_plan.matches] == [
        ("legacy_net/hidden_layer/biases", "fc_in/bias")]
    cli = terminal.cli_words(message)
    assert '--rules FILE holding [["^legacy_net/hidden_layer/biases$", "fc_in/bias"]]' in cli
    assert "objckpt migrate SOURCE OUT --template MODULE:CALLABLE --rules FILE --dry-run" in cli
    assert "objckpt.plan(" not in cli and "rules=" not in cli


def test_a_name_based_checkpoint_read_as_a_tree_gives_a_rule_from_its_own_scope(tf1_prefix):
    """read_tree of a TF1 checkpoint: the error's examples are weights (not `beta1_power`
    or Adam slots, which sort first) and its rule strips the checkpoint's own scope."""
    import objckpt
    from objckpt import errors

    with pytest.raises(errors.NotObjectBasedError) as caught:
        objckpt.read_tree(tf1_prefix)
    message = str(caught.value)
    assert "(`legacy_net/hidden_layer/biases`, `legacy_net/hidden_layer/weights`, " in message
    assert "e.g. rules=[('^legacy_net/', '')] strips the scope `legacy_net/`." in message
    assert "beta1_power" not in message and "model_001" not in message
