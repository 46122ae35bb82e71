"""The test matrix: one session per supported TF/Keras combination.

Run everything with `nox`; one combination with `nox -s keras3` (or
`tf_keras`, `tf216`, `keras2`). Each session builds its own virtualenv from this
project's pyproject.toml.

The quick run, `nox -s quick`: latest TF + Keras 3, the tests not marked `slow`,
`multiworker`, `subprocess` or `fuzz` (the markers pyproject.toml declares), in a few
minutes on 2 cores. It is not in the matrix (`nox` alone and `.ci/run` run the four
sessions above, every test).
"""

import os
import shutil

import nox

nox.options.sessions = ["keras3", "tf_keras", "tf216", "keras2"]
nox.options.reuse_existing_virtualenvs = True


# keras-hub backbones are tested in the keras3 session (tests/integration/test_keras_hub.py). Its
# tensorflow-text requirement pins another TensorFlow and the backbones do not use it, so
# keras-hub goes in without its dependencies after the `hf` extra (those the backbones
# import), as docs/huggingface.md tells users to install it.
KERAS_HUB = (("--no-deps", "keras-hub"),)


# The Python blocks of README.md and docs/*.md run in the keras3 session (each block in fresh
# globals; a block marked `python continuation` goes on from the one before it). They must use
# today's calling conventions: objckpt's DeprecationWarnings (old argument orders and names,
# options by position; each message starts with "objckpt.") are errors there.
MARKDOWN_DOCS = ("pytest-markdown-docs>=0.9",)
OLD_SPELLINGS = ("-W", "error:objckpt:DeprecationWarning")


# What the quick session leaves out (the tiers: pyproject.toml's markers).
QUICK = "not slow and not multiworker and not subprocess and not fuzz"


def _run_tests(session, *pins, env=None, extras="test", also=(), docs=False, args=()):
    try:
        _install_and_test(session, pins, env, extras, also, args)
        if docs:
            session.run("pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "--markdown-docs",
                        *OLD_SPELLINGS, "README.md", "docs", env=env)
    finally:
        # .ci/run sets OBJCKPT_NOX_DROP_VENVS=1: each session's environment (about 2.4 GB
        # with TensorFlow) is deleted once its tests ran, so the four never need disk at once.
        if os.environ.get("OBJCKPT_NOX_DROP_VENVS") == "1":
            shutil.rmtree(session.virtualenv.location, ignore_errors=True)


def _install_and_test(session, pins, env, extras, also, args=()):
    session.install(*pins, f".[{extras}]")
    for packages in also:
        session.install(*packages)
    session.run("python", "-c", "import tensorflow as tf, keras; "
                "print('TF', tf.__version__, 'keras', keras.__version__)", env=env)
    # Two pytest-xdist workers (CI has 2 cores): a test file stays on one worker, so its
    # module fixtures are built once. `nox -s ... -- -n 0` runs in one process.
    session.run("pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope",
                *args, *session.posargs, env=env)


@nox.session
def keras3(session):
    """Latest TF with Keras 3 (tf.keras is Keras 3); also runs the colab/ notebooks, the
    keras-hub backbone tests and every Python block of README.md and docs/.

    The notebooks' Jupyter kernel also needs tf_keras (the migration notebook writes a
    tf_keras checkpoint); it goes into a side folder that only the kernel sees, so the rest
    of this session keeps testing a Keras 3 only environment.
    """
    side = os.path.join(session.virtualenv.location, "notebook-site")
    session.run("python", "-m", "pip", "install", "--quiet", "--upgrade", "--no-deps",
                "--target", side, "tf_keras")
    _run_tests(session, "tensorflow", extras="test,notebooks,remote-test,hf",
               also=(*KERAS_HUB, MARKDOWN_DOCS),
               env={"TF_USE_LEGACY_KERAS": "0", "OBJCKPT_NOTEBOOK_PATH": side}, docs=True)


@nox.session
def tf_keras(session):
    """Latest TF with tf_keras (TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras).

    Keras 3 is installed beside it; here the keras3 flavour runs only in the tests that
    restore tf_keras or Keras 2 checkpoints into Keras 3 (keras3 and tf216 test the rest).
    The storage emulators are installed here too, so remote directories are tested with
    tf_keras's `fit`; not in tf216 and keras2, whose TF needs protobuf < 5, which today's GCS
    client does not accept (their remote tests skip, saying so).
    """
    _run_tests(session, "tensorflow", "tf_keras", env={"TF_USE_LEGACY_KERAS": "1"},
               extras="test,remote-test")


@nox.session
def tf216(session):
    """TF 2.16, the first TF whose tf.keras is Keras 3, with the Keras 3 pip resolves for it
    (TF 2.16 needs NumPy 1)."""
    _run_tests(session, "tensorflow==2.16.2", env={"TF_USE_LEGACY_KERAS": "0"})


@nox.session
def keras2(session):
    """TF 2.12 with its bundled Keras 2, on NumPy 1."""
    _run_tests(session, "tensorflow==2.12.1", "numpy<2", env={"TF_USE_LEGACY_KERAS": "0"})


@nox.session
def quick(session):
    """The quick tier: latest TF with Keras 3, without the `slow`, `multiworker`,
    `subprocess` and `fuzz` tests (conftest.py fails a test here that starts a Python
    process). Not in nox.options.sessions: `nox` and `.ci/run` run the full matrix."""
    _run_tests(session, "tensorflow", env={"TF_USE_LEGACY_KERAS": "0"}, extras="test,remote-test",
               args=("-m", QUICK))
