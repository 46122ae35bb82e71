"""objckpt.greedy_soup: the trace on a constructed case, and never below its best member.

Candidates are Snapshots of small Keras models with known weights; the scorers are plain
functions of the model's weights or outputs, so every score and decision is known.
"""

import warnings

import numpy as np
import pytest

import objckpt
from objckpt import errors

from flavours import keras_for, session_flavour


def scalar_model(keras):
    """y = w * x: one weight."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def weight(model) -> float:
    return float(model.layers[-1].kernel.numpy()[0, 0])


def candidates(keras, values):
    out = []
    for value in values:
        model = scalar_model(keras)
        model.layers[-1].kernel.assign([[value]])
        out.append(objckpt.snapshot(model))
    return out


def test_the_trace_of_a_constructed_soup_where_one_candidate_hurts():
    keras = keras_for(session_flavour())
    sources = candidates(keras, [1.0, 1.2, 5.0, 1.15])
    model = scalar_model(keras)
    report = objckpt.greedy_soup(model, sources, lambda m: -abs(weight(m) - 1.1))
    # Alone: 1.15 is best, then 1.0 and 1.2 (a tie: the order given), 5.0 last. The soup
    # takes 1.0 (mean 1.075) and 1.2 (mean 1.11667); 5.0 would pull it to 2.0875.
    assert [(s.index, s.kept) for s in report.trace] == [(3, True), (0, True), (1, True),
                                                         (2, False)]
    assert [s.own_score for s in report.trace] == pytest.approx([-0.05, -0.1, -0.1, -3.9])
    assert [s.soup_score for s in report.trace] == pytest.approx(
        [-0.05, -0.025, -(3.35 / 3 - 1.1), -0.9875], abs=1e-6)
    assert report.kept == (sources[3], sources[0], sources[1])
    assert report.trace[1].source is sources[0]
    assert report.scores == pytest.approx((-0.1, -0.1, -3.9, -0.05))
    assert weight(model) == pytest.approx(3.35 / 3, abs=1e-6)  # the best soup, not the last try
    assert report.score == pytest.approx(-(3.35 / 3 - 1.1), abs=1e-6)
    text = report.describe()
    assert "soup of 3 of 4" in text and text.count(" no ") == 1


@pytest.mark.parametrize("seed", range(4))
def test_the_soup_never_scores_below_its_best_member(seed):
    keras = keras_for(session_flavour())
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(64, 4)).astype("float32")
    target = x @ rng.normal(size=(4, 2)).astype("float32")

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    def score(model):
        return -float(np.mean((model(x).numpy() - target) ** 2))

    base = build()
    sources = []
    for _ in range(5):  # candidates scattered around one model, some far
        member = build()
        for mine, theirs in zip(member.weights, base.weights):
            spread = rng.choice([0.05, 0.5, 2.0])
            mine.assign(theirs.numpy() + spread * rng.normal(size=theirs.shape))
        sources.append(objckpt.snapshot(member))
    model = build()
    report = objckpt.greedy_soup(model, sources, score)
    assert report.score >= max(report.scores)
    assert score(model) == report.score  # the model holds the soup reported
    best = report.trace[0].soup_score
    assert best == max(report.scores)  # the best candidate alone comes first
    for step in report.trace[1:]:  # kept exactly when the soup's score did not drop
        assert step.kept == (step.soup_score >= best), (step, best)
        best = max(best, step.soup_score) if step.kept else best
    assert best == report.score


def test_bad_input_changes_nothing():
    keras = keras_for(session_flavour())
    sources = candidates(keras, [1.0, 2.0])
    model = scalar_model(keras)
    model.layers[-1].kernel.assign([[7.0]])
    other = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    with pytest.raises(errors.StructureMismatchError):
        objckpt.greedy_soup(model, [*sources, objckpt.snapshot(other)], lambda m: weight(m))
    assert weight(model) == 7.0
    with pytest.raises(ZeroDivisionError):
        objckpt.greedy_soup(model, sources, lambda m: 1 / (weight(m) - 2.0))
    assert weight(model) == 7.0
    with pytest.raises(errors.InvalidArgumentError, match="score must return a number"):
        objckpt.greedy_soup(model, sources, lambda m: "good")
    with pytest.raises(errors.InvalidArgumentError, match="non-empty list"):
        objckpt.greedy_soup(model, [], weight)
    with pytest.raises(errors.InvalidArgumentError, match="score must be a callable"):
        objckpt.greedy_soup(model, sources, 0.5)
    assert weight(model) == 7.0


def test_batchnorm_soups_warn_once_unless_recalibrated():
    keras = keras_for(session_flavour())
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")

    def build():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                  keras.layers.BatchNormalization()])
        model.compile(optimizer="sgd", loss="mse")
        return model

    sources = []
    for seed in range(3):
        keras.utils.set_random_seed(seed)
        sources.append(objckpt.snapshot(build()))
    model = build()
    with pytest.warns(errors.BatchNormStatisticsWarning, match="greedy_soup: the soup") as seen:
        objckpt.greedy_soup(model, sources, lambda m: 0.0)
    assert len([w for w in seen if w.category is errors.BatchNormStatisticsWarning]) == 1
    scored = []

    def score(m):  # every model scored has the statistics of its own dense outputs on x
        outputs = m.layers[0](x).numpy().astype(np.float64)
        np.testing.assert_allclose(m.layers[-1].moving_mean.numpy(), outputs.mean(0),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m.layers[-1].moving_variance.numpy(), outputs.var(0),
                                   rtol=1e-5, atol=1e-6)
        scored.append(True)
        return 0.0

    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.BatchNormStatisticsWarning)
        objckpt.greedy_soup(model, sources, score, recalibrate=x)
    assert len(scored) == 5  # 3 candidates alone, 2 soups
