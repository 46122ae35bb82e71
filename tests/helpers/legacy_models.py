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
            # explicit names: variable names must not depend on how many layers the
            # process built before (the tests compare tf_keras and Keras 3 names)
            self.dense = keras.layers.Dense(units, name="dense")
            self.norm = keras.layers.BatchNormalization(name="norm")
            self.inner = [keras.layers.Dense(units, name=f"inner{i}") for i in range(2)]

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
            self.blocks = [block(units, name=f"block{i}") for i in range(2)]
            self.heads = {"score": keras.layers.Dense(3, name="score"),
                          "extra": [keras.layers.Dense(3, use_bias=False, name="extra")]}
            self.drop = keras.layers.Dropout(0.25, seed=3, name="drop")

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
