"""A custom network torso for easyrl: a residual MLP with layer normalization.

The config names it by `module:Class`, `model.kind: my_nets:ResidualMLP`; the algorithm
(DQN here) puts its heads on top. The contract (see `easyrl.models.build_torso`): the class is
called as `ResidualMLP(model, obs_shape, name, rng)` and returns a `tf.Module` mapping
observations `[B, *obs_shape]` to features `[B, out_dim]`, with every variable named
explicitly under `name/` and initialized from `rng`.
"""

import numpy as np
import tensorflow as tf

from easyrl.models import ACTIVATIONS, Dense


class ResidualMLP(tf.Module):
    """x = W_in obs; then per block x = x + W_i act(layer_norm(x)); features = act(x).

    `model.hidden[0]` is the width; every further entry of `model.hidden` (the same width)
    adds one residual block. `model.activation` is the activation.
    """

    def __init__(self, model, obs_shape: tuple[int, ...], name: str, rng: np.random.Generator):
        super().__init__(name=None)
        if len(obs_shape) != 1:
            raise ValueError(f"ResidualMLP needs flat observations, got shape {obs_shape}")
        width = model.hidden[0]
        if any(size != width for size in model.hidden):
            raise ValueError(f"ResidualMLP needs equal model.hidden sizes, got {model.hidden}")
        self.inp = Dense(obs_shape[0], width, f"{name}/in", rng)
        self.blocks = [
            Dense(width, width, f"{name}/block{i}", rng, scale=0.1)
            for i in range(len(model.hidden) - 1)
        ]
        self.activation = ACTIVATIONS[model.activation]
        self.out_dim = width

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        x = self.inp(tf.cast(obs, tf.float32))  # [B, width]
        for block in self.blocks:
            mean, variance = tf.nn.moments(x, axes=[1], keepdims=True)
            x = x + block(self.activation((x - mean) * tf.math.rsqrt(variance + 1e-5)))
        return self.activation(x)  # [B, width]
