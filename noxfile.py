"""The test matrix: one session per supported TF/Keras combination.

Run everything with `nox`; one combination with `nox -s keras3` (or
`tf_keras`, `keras2`). Each session builds its own virtualenv from this
project's pyproject.toml.
"""

import nox

nox.options.sessions = ["keras3", "tf_keras", "keras2"]
nox.options.reuse_existing_virtualenvs = True


def _run_tests(session, *pins, env=None):
    session.install(*pins, ".[test]")
    session.run("python", "-c", "import tensorflow as tf, keras; "
                "print('TF', tf.__version__, 'keras', keras.__version__)", env=env)
    session.run("pytest", "-q", "-p", "no:cacheprovider", *session.posargs, env=env)


@nox.session
def keras3(session):
    """Latest TF with Keras 3 (tf.keras is Keras 3)."""
    _run_tests(session, "tensorflow", env={"TF_USE_LEGACY_KERAS": "0"})


@nox.session
def tf_keras(session):
    """Latest TF with tf_keras (TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras)."""
    _run_tests(session, "tensorflow", "tf_keras", env={"TF_USE_LEGACY_KERAS": "1"})


@nox.session
def keras2(session):
    """TF 2.12 with its bundled Keras 2, on NumPy 1."""
    _run_tests(session, "tensorflow==2.12.1", "numpy<2", env={"TF_USE_LEGACY_KERAS": "0"})
