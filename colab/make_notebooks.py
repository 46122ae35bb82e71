"""Writes the notebooks in colab/ from the cells below (outputs stripped).

Run `python colab/make_notebooks.py` after editing a notebook's cells here;
tests/integration/test_notebooks.py checks that the committed notebooks are what this
script writes, and executes each one in a Jupyter kernel. Every notebook
starts with an "Open in Colab" badge and a cell that installs objckpt in
Colab (and does nothing elsewhere), and uses only objckpt's public API.
"""

import os
import re
import sys

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))


def project_repository(pyproject: str = os.path.join(HERE, os.pardir, "pyproject.toml")) -> str:
    """GitHub owner/name from `Repository` under `[project.urls]` in pyproject.toml."""
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        tomllib = None
    with open(pyproject, "rb") as f:
        if tomllib is not None:
            url = tomllib.load(f)["project"]["urls"]["Repository"]
        else:  # the one line it needs, as pyproject.toml writes it
            url = re.search(r'(?m)^Repository = "([^"]+)"', f.read().decode()).group(1)
    match = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?", url)
    if not match:
        raise ValueError(f"[project.urls] Repository in {pyproject} is not a GitHub "
                         f"repository URL: {url!r}")
    return match.group(1)


REPO = project_repository()  # GitHub owner/name: the Colab badge and the Colab install use it

INSTALL = f'''# In Colab: install objckpt (with tf_keras for the migration notebook). Elsewhere: nothing.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "objckpt[tf_keras] @ git+https://github.com/{REPO}"], check=True)'''

IMPORTS = '''import os, tempfile
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")   # TF's C++ log: errors only
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # no oneDNN notice at start-up
# TF prints some start-up lines (CUDA probes) straight to file descriptor 2, whatever the
# log level: they go to devnull while TF loads and probes its devices.
stderr, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
os.dup2(quiet, 2)
try:
    import tensorflow as tf
    import keras
    tf.constant(0)
finally:
    os.dup2(stderr, 2)
    os.close(stderr)
    os.close(quiet)
import numpy as np
import matplotlib.pyplot as plt
import objckpt
from objckpt import callbacks

keras.utils.set_random_seed(0)
work = tempfile.mkdtemp(prefix="objckpt-notebook-")
print("TF", tf.__version__, "Keras", keras.__version__, "objckpt", objckpt.__version__)'''

DATA = '''rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = np.sin(x @ rng.normal(size=(8, 1))).astype("float32")

def mlp(names=("hidden", "out")):
    return keras.Sequential([keras.Input((8,)),
                             keras.layers.Dense(16, activation="tanh", name=names[0]),
                             keras.layers.Dense(1, name=names[1])])'''

NOTEBOOKS = {
    "01_twins_target_network.ipynb": [
        "# Past/current twins and a target network\n\n"
        "`objckpt.Twins(model)` keeps a second copy of a model (the *past* twin) with the same "
        "object structure. `twins.sync()` copies current into past in one fused TF call; "
        "`twins.sync(tau=...)` is a Polyak update, the classic target network of DQN/DDPG. "
        "`callbacks.TwinSync` does it during `fit`.",
        INSTALL, IMPORTS, DATA,
        "## A hard sync: the past twin lags exactly one update behind",
        '''model = mlp()
model.compile(keras.optimizers.Adam(0.01), "mse")
twins = objckpt.Twins(model)
probe = x[:4]
twins.sync()
before = twins.current(probe).numpy()
model.train_on_batch(x[:64], y[:64])
assert np.array_equal(twins.past(probe).numpy(), before)   # past: the weights before the step
assert not np.array_equal(twins.current(probe).numpy(), before)
twins.sync()
assert np.array_equal(twins.past(probe).numpy(), twins.current(probe).numpy())
print("hard sync: past == current after sync, one update behind after a step")''',
        "## A target network during `fit`: Polyak averaging every batch\n\n"
        "We record the current and the past (target) outputs on one probe input after every "
        "batch and plot them: the target follows the current network smoothly.",
        '''current_out, past_out = [], []

class Record(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        current_out.append(float(twins.current(probe[:1])[0, 0]))
        past_out.append(float(twins.past(probe[:1])[0, 0]))

twins.sync()
model.fit(x, y, epochs=4, batch_size=32, verbose=0, shuffle=False,
          callbacks=[callbacks.TwinSync(twins, every=1, tau=0.05, on="batch"), Record()])
plt.figure(figsize=(7, 3))
plt.plot(current_out, label="current network")
plt.plot(past_out, label="target network (tau=0.05)")
plt.xlabel("batch"); plt.ylabel("output on a probe input"); plt.legend(); plt.show()
lag = np.abs(np.diff(past_out)).mean() / np.abs(np.diff(current_out)).mean()
print(f"the target moves {lag:.2f}x as much per batch as the current network")
assert lag < 1''',
        "## Swap: evaluate with the other weights, then swap back",
        '''out_current, out_past = twins.current(probe).numpy(), twins.past(probe).numpy()
twins.swap()
assert np.array_equal(twins.current(probe).numpy(), out_past)
twins.swap()
assert np.array_equal(twins.current(probe).numpy(), out_current)
print("swap exchanges the values; the optimizer is untouched")''',
    ],
    "02_restore_on_create_and_structure.ipynb": [
        "# Restore-on-create, and structure versus names\n\n"
        "TF2 checkpoints match values to variables by **object structure** (the attribute "
        "edges from the root), not by variable names. objckpt shows that structure "
        "(`objckpt.read_tree`, `objckpt.graph`) and can restore values into a model as its "
        "variables are created (`objckpt.restore_on_create`).",
        INSTALL, IMPORTS, DATA,
        '''model = mlp()
model.compile(keras.optimizers.Adam(0.01), "mse")
model.fit(x, y, epochs=2, batch_size=64, verbose=0)
prefix = objckpt.save(model, os.path.join(work, "trained", "ckpt"))
for path, entry in objckpt.read_tree(prefix).items():
    print(f"{path:45s} {str(entry.shape):10s} {entry.dtype.name}")''',
        "## The object graph\n\nObjects are boxes, variables ellipses with shape and dtype; "
        "`depth=` collapses big graphs. (SVG needs Graphviz's `dot`, preinstalled in Colab; "
        "elsewhere `apt-get install graphviz`. Without it the DOT text is shown.)",
        '''picture = objckpt.graph(prefix)
print(picture)
picture''',
        "## Structure, not names\n\nA copy of the model whose layers have other names "
        "(`encoder`/`head`) restores from the checkpoint: the paths are the same.",
        '''renamed = mlp(names=("encoder", "head"))
print([v.name for v in renamed.weights])
report = objckpt.restore(renamed, prefix, strict=False)
print(report)
np.testing.assert_allclose(renamed(x[:4]), model(x[:4]), rtol=1e-6)
print("same outputs: the values went by structure")''',
        "## Restore on create\n\nA subclassed model creates its variables on its first call. "
        "`restore_on_create` gives each one its value the moment it is created, before "
        "first use.",
        '''class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, inputs):
        return self.out(self.hidden(inputs))

trained = Net()
trained(x[:1])                     # builds it: random weights, no optimizer
net_prefix = objckpt.save(trained, os.path.join(work, "net", "ckpt"))

fresh = Net()                      # no variables yet
pending = objckpt.restore_on_create(fresh, net_prefix)
print("pending before the first call:", len(pending.pending))
fresh(x[:1])                       # variables are created here, and restored at once
pending.assert_done()
np.testing.assert_array_equal(fresh(x[:4]), trained(x[:4]))
print("restored on creation:", pending.done)
objckpt.graph(fresh)  # a live obj: the class of every object is known''',
    ],
    "03_migrate_to_keras3.ipynb": [
        "# Migrating TF1 `Saver` and tf_keras checkpoints to Keras 3\n\n"
        "A TF1 checkpoint is **name-based** (`model_001/dense1/kernel`); a tf_keras / Keras 2 "
        "checkpoint is object-based with Keras 2's paths (`layer_with_weights-0/kernel`). "
        "`objckpt.plan` shows which entry feeds which variable of today's model, and why; "
        "`objckpt.migrate` writes a standard Keras 3 checkpoint.",
        INSTALL, IMPORTS, DATA,
        "## A TF1 checkpoint written by graph code and `tf.compat.v1.train.Saver`",
        '''tf1_dir = os.path.join(work, "tf1")
with tf.Graph().as_default():
    inputs = tf.compat.v1.placeholder(tf.float32, (None, 8))
    targets = tf.compat.v1.placeholder(tf.float32, (None, 1))
    step = tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.variable_scope("model_001"):
        with tf.compat.v1.variable_scope("dense1"):
            w1 = tf.compat.v1.get_variable("kernel", (8, 16))
            b1 = tf.compat.v1.get_variable("bias", (16,), initializer=tf.zeros_initializer())
        with tf.compat.v1.variable_scope("dense2"):
            w2 = tf.compat.v1.get_variable("kernel", (16, 1))
            b2 = tf.compat.v1.get_variable("bias", (1,), initializer=tf.zeros_initializer())
    outputs = tf.matmul(tf.tanh(tf.matmul(inputs, w1) + b1), w2) + b2
    loss = tf.reduce_mean(tf.square(outputs - targets))
    train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for i in range(20):
            sess.run(train, {inputs: x[:64], targets: y[:64]})
        tf1_out = sess.run(outputs, {inputs: x[:8]})
        tf1_prefix = tf.compat.v1.train.Saver().save(sess, os.path.join(tf1_dir, "model.ckpt"))
for name, shape in tf.train.list_variables(tf1_prefix):
    print(f"{name:35s} {shape}")''',
        "### The plan: rules rewrite names, Adam slots move by role\n\n"
        "Rules are `(regex, replacement)` pairs: each source key is rewritten once, by the "
        "**first** rule whose regex matches it (`re.sub(regex, replacement, key, count=1)`); "
        "rules never chain, and a replacement of `None` drops the entry. `global_step` is "
        "kept: with `optimizer_state=True` it becomes the Keras optimizer's `iterations`, "
        "and Adam's `Adam`/`Adam_1` slots move by the variable they belong to.",
        '''rules = [("^model_001/", "")]
rewrite = mlp(names=("dense1", "dense2"))
rewrite.compile(keras.optimizers.Adam(0.01), "mse")
rewrite.optimizer.build(rewrite.trainable_variables)
plan = objckpt.plan(rewrite, tf1_prefix, rules=rules, optimizer_state=True)
print(plan.describe())''',
        '''migrated = objckpt.migrate(rewrite, tf1_prefix, os.path.join(work, "migrated", "ckpt"),
                           rules=rules, optimizer_state=True)
objckpt.restore(rewrite, migrated)
np.testing.assert_allclose(rewrite(x[:8]), tf1_out, rtol=1e-6, atol=1e-6)
assert int(rewrite.optimizer.iterations) == 20   # TF1's global_step after 20 steps
print("optimizer step:", int(rewrite.optimizer.iterations))
print(objckpt.verify(migrated).describe())''',
        "## A tf_keras (Keras 2) checkpoint into the same model in Keras 3\n\n"
        "tf_keras and Keras 3 can live in one process. No rules: the object paths differ, so "
        "entries are matched by the Keras names they were saved under where every one pairs "
        "up (`keras name`), else by **structure** (layer by layer, by weight role and shape, "
        "renamed roles such as DepthwiseConv2D's `depthwise_kernel` read through a generated "
        "table); Adam's moments and step counter move into the Keras 3 optimizer by the "
        "variable they belong to (`optimizer_state='auto'`, the default, does so whenever "
        "the model has an optimizer).",
        '''import tf_keras

old = tf_keras.Sequential([tf_keras.Input((8,)),
                           tf_keras.layers.Dense(16, activation="tanh"),
                           tf_keras.layers.Dense(1)])
old.compile(tf_keras.optimizers.Adam(0.01), "mse")
old.fit(x, y, epochs=2, batch_size=64, verbose=0)
old_prefix = os.path.join(work, "tf_keras", "weights")
old.save_weights(old_prefix)
print(list(objckpt.read_tree(old_prefix))[:4])

new = mlp()
new.compile(keras.optimizers.Adam(0.01), "mse")
new.optimizer.build(new.trainable_variables)   # Adam's moments move over too
print(objckpt.plan(new, old_prefix, optimizer_state=True).describe())
objckpt.restore(new, old_prefix, optimizer_state=True)
np.testing.assert_allclose(new(x[:8]), old(x[:8]).numpy(), rtol=1e-5, atol=1e-6)
assert int(new.optimizer.iterations) == int(old.optimizer.iterations)
print("Keras 3 model gives the tf_keras model's outputs; optimizer step",
      int(new.optimizer.iterations))''',
    ],
    "04_checkpointing_resume.ipynb": [
        "# Checkpointing during `fit`: interrupted and resumed\n\n"
        "`callbacks.Checkpointing(directory)` writes crash-safe, standard object-based "
        "checkpoints (model, optimizer, epoch and step) and, when `fit` starts again, resumes "
        "from the newest intact one. We interrupt a run after epoch 3, start it again with a "
        "fresh model object (as a new process would), and compare with a run never interrupted.",
        INSTALL, IMPORTS, DATA,
        '''EPOCHS, STOP_AFTER = 8, 3

def fresh_model():
    keras.utils.set_random_seed(0)
    model = mlp()
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model

def fit(model, directory, extra=()):
    losses = {}
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: losses.__setitem__(epoch, logs["loss"]))
    model.fit(x, y, epochs=EPOCHS, batch_size=64, shuffle=False, verbose=0,
              callbacks=[callbacks.Checkpointing(directory, max_to_keep=2), record, *extra])
    return losses

class Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == STOP_AFTER:
            raise KeyboardInterrupt("simulated interruption")''',
        '''run_dir = os.path.join(work, "run")
first = {}
try:
    first = fit(fresh_model(), run_dir, [keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: first.__setitem__(epoch, logs["loss"])), Interrupt()])
except KeyboardInterrupt as stop:
    print("interrupted:", stop)
print("checkpoints on disk:", tf.train.get_checkpoint_state(run_dir).all_model_checkpoint_paths)

resumed_model = fresh_model()
resumed = fit(resumed_model, run_dir)       # resumes at epoch 3
print("epochs trained after the restart:", sorted(resumed))

straight_model = fresh_model()
straight = fit(straight_model, os.path.join(work, "straight"))
for a, b in zip(resumed_model.weights, straight_model.weights):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
print("resumed run ends with the uninterrupted run's weights")''',
        '''plt.figure(figsize=(7, 3))
plt.plot(sorted(straight), [straight[e] for e in sorted(straight)], "o-", color="#bbbbbb",
         label="never interrupted", linewidth=4)
plt.plot(sorted(first), [first[e] for e in sorted(first)], "o-", label="first run (interrupted)")
plt.plot(sorted(resumed), [resumed[e] for e in sorted(resumed)], "s-", label="resumed run")
plt.axvline(STOP_AFTER - 0.5, linestyle="--", color="k")
plt.xlabel("epoch"); plt.ylabel("training loss"); plt.legend(); plt.show()
print(objckpt.verify(run_dir).describe())''',
        "`callbacks.BestSnapshot` keeps the best weights in memory instead (no files):",
        '''model = fresh_model()
best = callbacks.BestSnapshot(monitor="val_loss")
model.fit(x, y, validation_split=0.25, epochs=4, verbose=0, callbacks=[best])
print("best epoch", best.best_epoch, "val_loss", round(best.best, 4), "(restored at the end)")''',
    ],
    "05_ensemble_and_freezing.ipynb": [
        "# Ensembles and freezing\n\n"
        "`objckpt.load_ensemble(template, sources)` loads N checkpoints of one architecture into "
        "N independent members and evaluates them as one batched computation. "
        "`callbacks.FreezeSchedule` freezes variables by pattern at epoch boundaries without "
        "recompiling: frozen values and their optimizer state stay bit-identical.",
        INSTALL, IMPORTS, DATA,
        '''prefixes = []
for seed in range(3):
    keras.utils.set_random_seed(seed)
    member = mlp()
    member.compile(keras.optimizers.Adam(0.01), "mse")
    member.fit(x, y, epochs=2, batch_size=64, verbose=0)
    prefixes.append(objckpt.save(member, os.path.join(work, f"member{seed}", "ckpt")))

ensemble = objckpt.load_ensemble(mlp(), prefixes)
stacked = ensemble(x[:5])
print("stacked outputs:", stacked.shape, "mode:", ensemble.last_mode)
assert stacked.shape == (3, 5, 1)
spread = np.std(stacked.numpy(), axis=0).ravel()
print("ensemble mean:", np.round(ensemble.mean(x[:5]).numpy().ravel(), 3))
print("spread between members:", np.round(spread, 3))''',
        "## A freeze schedule: `hidden` frozen for the first two epochs\n\nPatterns are regular expressions searched in object paths and variable names (`mlp/hidden/kernel`).",
        '''keras.utils.set_random_seed(0)
model = mlp()
model.compile(keras.optimizers.Adam(0.01), "mse")
hidden_kernel = model.get_layer("hidden").kernel
start = hidden_kernel.numpy().copy()
after = {}
watch = keras.callbacks.LambdaCallback(
    on_epoch_end=lambda epoch, logs: after.__setitem__(epoch, hidden_kernel.numpy().copy()))
schedule = callbacks.FreezeSchedule({0: "hidden/", 2: None})
model.fit(x, y, epochs=4, batch_size=64, verbose=0, callbacks=[schedule, watch])
for epoch, frozen in schedule.history:
    moved = not np.array_equal(after[epoch], start)
    print(f"epoch {epoch}: frozen {list(frozen)}; hidden kernel changed since start: {moved}")
assert np.array_equal(after[1], start) and not np.array_equal(after[3], start)''',
    ],
}


# The last cells of every notebook: the temporary folder the imports cell made goes away.
CLEANUP = ["## Clean up\n\nThe checkpoints above were written under a temporary folder.",
           '''import shutil
shutil.rmtree(work)
print("removed", work)''']


def notebook(name: str, cells: list) -> nbformat.NotebookNode:
    badge = (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
             f"(https://colab.research.google.com/github/{REPO}/blob/main/colab/{name})")
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"},
                   "language_info": {"name": "python"}, "colab": {"provenance": []}}
    first, *rest = [*cells, *CLEANUP]
    nb.cells = [nbformat.v4.new_markdown_cell(badge + "\n\n" + first)]
    for index, text in enumerate(rest):
        is_code = text == INSTALL or not text.startswith(("#", "`"))  # markdown: headings
        cell = (nbformat.v4.new_code_cell(text) if is_code
                else nbformat.v4.new_markdown_cell(text))
        cell["id"] = f"cell-{index + 1}"
        nb.cells.append(cell)
    nb.cells[0]["id"] = "cell-0"
    return nb


def write_all(directory: str = HERE) -> list[str]:
    """Writes every notebook into `directory`; returns their paths."""
    paths = []
    for name, cells in NOTEBOOKS.items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            nbformat.write(notebook(name, cells), f)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_all(sys.argv[1] if len(sys.argv) > 1 else HERE):
        print("wrote", written)
