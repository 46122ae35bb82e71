"""Model code written the way other people write it, for every Keras flavour.

Each builder takes the Keras module (`keras` or `tf_keras`); the same code run in tf_keras
and in Keras 3 gives checkpoints whose object paths line up. Imports no Keras itself (the
subprocess writers import it too).
"""

from __future__ import annotations


def block_class(keras):
    class Block(keras.layers.Layer):
        """Dense + BatchNorm + a list of two Dense (a layer holding a list)."""

        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(units)
            self.norm = keras.layers.BatchNormalization()
            self.inner = [keras.layers.Dense(units), keras.layers.Dense(units)]

        def call(self, x, training=False):
            x = self.norm(self.dense(x), training=training)
            for layer in self.inner:
                x = layer(x)
            return x

    return Block


def ListNet(keras, units: int = 8):  # builds a model: named like one
    """A subclassed model whose layers sit in a list and a nested dict (a transformer's
    usual layout): `blocks/0/...`, `heads/score`, `heads/extra/0`, plus a Dropout."""
    block = block_class(keras)

    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="list_net")
            self.blocks = [block(units) for _ in range(2)]
            self.heads = {"score": keras.layers.Dense(3),
                          "extra": [keras.layers.Dense(3, use_bias=False)]}
            self.drop = keras.layers.Dropout(0.25, seed=3)

        def call(self, x, training=False):
            for each in self.blocks:
                x = each(x, training=training)
            x = self.drop(x, training=training)
            return self.heads["score"](x) + self.heads["extra"][0](x)

    return Net()


def bias_free_mlp(keras, depth: int, units: int = 4, name: str = "mlp"):
    """A subclassed MLP of `depth` bias-free Dense layers held as attributes d0, d1, ..."""

    class MLP(keras.Model):
        def __init__(self):
            super().__init__(name=name)
            for i in range(depth):
                setattr(self, f"d{i}", keras.layers.Dense(units, use_bias=False))

        def call(self, x):
            for i in range(depth):
                x = getattr(self, f"d{i}")(x)
            return x

    return MLP()
