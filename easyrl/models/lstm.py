"""An LSTM core for recurrent policies, as a plain `tf.Module` with explicit variable names.

State: one float32 vector `[N, 2 * units]` per env, c then h (one array travels and is stored
as one replay column). One step (Hochreiter & Schmidhuber 1997, gates i, f, g, o):

    z = [x, h] @ w + b,   i, f, g, o = split(z, 4)
    c' = sigmoid(f + 1) * c + sigmoid(i) * tanh(g)        (forget bias 1, as TF's LSTMCell)
    h' = sigmoid(o) * tanh(c')

`first` resets: a row whose `first` is 1 starts an episode, and its state is zeroed before the
step, so actors and learners reset at exactly the same places.

A recurrent network is torso -> core -> heads: `recurrent_step` runs it for one step of N envs,
`recurrent_unroll` over B sequences (the one place each pattern is written).
"""

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from easyrl.models import _glorot


class LSTMCore(tf.Module):
    """One LSTM layer of `units` units on inputs of width `in_dim`; variables `{name}/w`
    `[in_dim + units, 4 * units]` (Glorot) and `{name}/b` `[4 * units]` (zeros)."""

    def __init__(self, in_dim: int, units: int, name: str, rng: np.random.Generator):
        super().__init__(name=None)
        self.units, self.in_dim = int(units), int(in_dim)
        w = tf.constant(_glorot((in_dim + self.units, 4 * self.units), rng))
        self.w = tf.Variable(w, name=f"{name}/w")
        self.b = tf.Variable(tf.zeros([4 * self.units]), name=f"{name}/b")
        self.state_size = 2 * self.units

    def step(self, x: tf.Tensor, state: tf.Tensor, first: tf.Tensor) -> tuple:
        """One step: `x` `[N, in_dim]`, `state` `[N, 2U]`, `first` `[N]` (1: reset before).

        Returns:
            (h' `[N, U]`, new state `[N, 2U]`).
        """
        state = state * (1.0 - first)[:, None]  # [N, 2U]
        c, h = tf.split(state, 2, axis=1)  # [N, U] each
        z = tf.matmul(tf.concat([x, h], axis=1), self.w) + self.b  # [N, 4U]
        i, f, g, o = tf.split(z, 4, axis=1)
        c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
        return h, tf.concat([c, h], axis=1)

    def unroll(self, xs: tf.Tensor, state: tf.Tensor, firsts: tf.Tensor) -> tf.Tensor:
        """The core over a sequence, time-major: `xs` `[T, N, in_dim]`, `state` `[N, 2U]`
        (before step 0), `firsts` `[T, N]`. Returns the outputs h `[T, N, U]`."""
        return self.run(xs, state, firsts)[0]

    def run(self, xs: tf.Tensor, state: tf.Tensor, firsts: tf.Tensor) -> tuple:
        """`unroll`, also returning the state after the last step: (h `[T, N, U]`, state
        `[N, 2U]`)."""

        def body(carry, inputs):
            _, state = carry
            return self.step(inputs[0], state, inputs[1])

        initial = (tf.zeros([tf.shape(state)[0], self.units]), state)
        hs, states = tf.scan(body, (xs, firsts), initializer=initial)
        return hs, states[-1]

    def unroll_batch_major(
        self, xs: tf.Tensor, state: tf.Tensor, firsts: tf.Tensor, burn_in: int = 0
    ) -> tf.Tensor:
        """`unroll` for B sequences of T steps laid out batch-major and flat: `xs`
        `[B * T, in_dim]` (row b * T + t), `state` `[B, 2U]`, `firsts` `[B, T]`. Returns h
        `[B * T, U]` in the same row order. With `burn_in` > 0 the core first runs the
        sequences' first `burn_in` steps without a gradient, only to warm its state up (R2D2),
        and returns the outputs of the rest, `[B * (T - burn_in), U]`."""
        b, t = tf.shape(firsts)[0], tf.shape(firsts)[1]
        xs = tf.transpose(tf.reshape(xs, [b, t, self.in_dim]), [1, 0, 2])  # [T, B, in]
        firsts = tf.transpose(firsts)  # [T, B]
        if burn_in:
            _, state = self.run(xs[:burn_in], state, firsts[:burn_in])
            state = tf.stop_gradient(state)  # [B, 2U]
            xs, firsts = xs[burn_in:], firsts[burn_in:]
        hs = self.unroll(xs, state, firsts)  # [T - burn_in, B, U]
        return tf.reshape(tf.transpose(hs, [1, 0, 2]), [-1, self.units])  # [B * (T - b), U]


def recurrent_step(
    torso: Callable, core: LSTMCore, heads: Callable[[tf.Tensor], Any], x, state, first
) -> tuple:
    """One step of N envs through torso -> `core.step` -> heads: `x` the torso's inputs
    `[N, ...]`, `state` `[N, 2U]`, `first` `[N]` (1: reset before).

    Returns:
        (heads(h') of the core's output h' `[N, U]`, the core's new state `[N, 2U]`).
    """
    h, state = core.step(torso(x), state, first)  # [N, U], [N, 2U]
    return heads(h), state


def recurrent_unroll(
    torso: Callable, core: LSTMCore, heads: Callable[[tf.Tensor], Any], x, state, first,
    burn_in: int = 0,
):  # fmt: skip
    """B sequences of T steps through torso -> `core` -> heads, batch-major and flat: `x` the
    torso's inputs `[B * T, ...]` (row b * T + t), `state` `[B, 2U]` before step 0, `first`
    `[B, T]`. Returns heads(hs) of the core's outputs hs `[B * T, U]` (same row order); with
    `burn_in`, of the steps after the first `burn_in`, which only warm the state up without
    a gradient (`LSTMCore.unroll_batch_major`): `[B * (T - burn_in), U]`."""
    return heads(core.unroll_batch_major(torso(x), state, first, burn_in))
