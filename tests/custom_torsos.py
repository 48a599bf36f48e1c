"""Example custom torsos for `tests/test_custom_models.py` (`model.kind: custom_torsos:Name`):
one of each form `easyrl.models.build_torso` takes, and some that break its contract.

Each working torso keeps the `obs_shape` it was built for, so that tests can check what an
algorithm called it with.
"""

import keras
import numpy as np
import tensorflow as tf

from easyrl.models import ACTIVATIONS, Dense


class Residual(tf.Module):
    """A plain tf.Module torso of width w = `model.hidden[0]`:
    h = act(W_in x + b_in); features = h + act(W_block h + b_block)."""

    def __init__(self, model, obs_shape: tuple[int, ...], name: str, rng: np.random.Generator):
        super().__init__(name=None)
        self.obs_shape = obs_shape
        width = model.hidden[0]
        self.inp = Dense(int(np.prod(obs_shape)), width, f"{name}/in", rng)
        self.block = Dense(width, width, f"{name}/block", rng)
        self.activation = ACTIVATIONS[model.activation]
        self.out_dim = width

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        h = self.activation(self.inp(tf.cast(obs, tf.float32)))  # [B, w]
        return h + self.activation(self.block(h))  # [B, w]


class Gated(keras.Model):
    """A Keras 3 model subclass of width w = `model.hidden[0]`: h = LayerNorm(tanh(W x + b)),
    features = h * sigmoid(W_g h + b_g). `name` is not passed on (Keras refuses "/")."""

    def __init__(self, model, obs_shape: tuple[int, ...], name: str, rng: np.random.Generator):
        super().__init__()
        self.obs_shape = obs_shape
        width = model.hidden[0]
        self.dense = keras.layers.Dense(width, activation="tanh")
        self.norm = keras.layers.LayerNormalization()
        self.gate = keras.layers.Dense(width, activation="sigmoid")

    def call(self, x):
        h = self.norm(self.dense(x))  # [B, w]
        return h * self.gate(h)  # [B, w]


def keras_mlp(model, obs_shape: tuple[int, ...], name: str, rng: np.random.Generator):
    """A function returning a Keras Sequential MLP, built at once by its `keras.Input`."""
    layers = [keras.layers.Dense(n, activation=model.activation) for n in model.hidden]
    return keras.Sequential([keras.Input(obs_shape), *layers])


def keras_sequence_output(model, obs_shape, name, rng):
    """Breaks the contract: features `[B, obs, 1]`, not `[B, out_dim]`."""
    return keras.Sequential([keras.layers.Reshape((*obs_shape, 1))])


class IntegerOutput(keras.Layer):
    """Breaks the contract: integer features."""

    def __init__(self, model, obs_shape, name, rng):
        super().__init__()

    def call(self, x):
        return tf.cast(x, tf.int32)


class Stray(tf.Module):
    """Breaks the contract: its variable is named outside `name/`."""

    def __init__(self, model, obs_shape, name, rng):
        super().__init__(name=None)
        self.w = Dense(int(obs_shape[0]), 4, "stray", rng)
        self.out_dim = 4

    def __call__(self, obs):
        return self.w(obs)
