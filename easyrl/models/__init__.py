"""Networks built from the config's `model` section, as plain `tf.Module`s.

Every variable has a stable, explicit name (e.g. "q/torso/0/w") so that all
roles agree on the PS shard assignment and the wire names.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

ACTIVATIONS = {"relu": tf.nn.relu, "tanh": tf.nn.tanh, "elu": tf.nn.elu}


def _glorot(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    limit = np.sqrt(6.0 / (shape[0] + shape[1]))
    return rng.uniform(-limit, limit, size=shape).astype(np.float32)


class Dense(tf.Module):
    """A dense layer `y = x @ w + b` with Glorot-uniform init and zero bias."""

    def __init__(self, in_dim: int, out_dim: int, name: str, rng: np.random.Generator, scale=1.0):
        super().__init__(name=None)
        self.w = tf.Variable(_glorot((in_dim, out_dim), rng) * scale, name=f"{name}/w")
        self.b = tf.Variable(tf.zeros([out_dim]), name=f"{name}/b")
        self.var_names = (f"{name}/w", f"{name}/b")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(x, self.w) + self.b  # [B, out]


class MLP(tf.Module):
    """A stack of dense layers with an activation after each one (none after the last
    when `activate_last` is false)."""

    def __init__(
        self,
        in_dim: int,
        sizes: Sequence[int],
        activation: str,
        name: str,
        rng: np.random.Generator,
        activate_last: bool = True,
    ):
        super().__init__(name=None)
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}")
        dims = [in_dim, *sizes]
        self.layers = [Dense(dims[i], dims[i + 1], f"{name}/{i}", rng) for i in range(len(sizes))]
        self._activation = ACTIVATIONS[activation]
        self._activate_last = activate_last

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self._activate_last or i < len(self.layers) - 1:
                x = self._activation(x)
        return x

    @property
    def var_names(self) -> tuple[str, ...]:
        return tuple(n for layer in self.layers for n in layer.var_names)


def named_variables(module: tf.Module) -> dict[str, tf.Variable]:
    """Returns {explicit name: variable} for every variable of `module`, sorted by name."""
    found = {v.name.removesuffix(":0"): v for v in module.trainable_variables}
    return dict(sorted(found.items()))
