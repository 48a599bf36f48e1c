"""The on-policy family's networks: PPO's (and so A2C's and PG's, which build PPO's agent),
which MARWIL and BC build too: `ObsNorm`, `PolicyNet`, `ValueNet`, optionally recurrent
(`model.lstm`). Imported by `agent.py` modules only: it imports TensorFlow.
"""

import math

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms.masking import features, masked
from easyrl.models import Dense, build_torso

_LOG_2PI = math.log(2.0 * math.pi)


class ObsNorm(tf.Module):
    """Running observation statistics `obs_norm/{mean,var,count}` and the normalization
    clip((obs - mean) / sqrt(var + 1e-8), -c, c). They are variables like the weights, so
    they live on the PS and reach every actor with the weights; no gradient moves them
    (their gradient is zero), only `update` on the learner does.

    Args:
        obs_dim: observation size.
        clip: the clip c; None disables normalization (the identity, no variables).
    """

    def __init__(self, obs_dim: int, clip: float | None):
        super().__init__(name=None)
        self.clip = clip
        if clip is not None:
            # TF's stub types `initial_value` as a Tensor; tf.Variable takes any tensor-like value.
            self.mean = tf.Variable(np.zeros(obs_dim, np.float32), name="obs_norm/mean")  # pyright: ignore[reportArgumentType]
            self.var = tf.Variable(np.ones(obs_dim, np.float32), name="obs_norm/var")  # pyright: ignore[reportArgumentType]
            # A tiny prior count, as Stable-Baselines3 does: the first update dominates it.
            self.count = tf.Variable(np.float32(1e-4), name="obs_norm/count")  # pyright: ignore[reportArgumentType]

    def __call__(self, obs):
        if self.clip is None:
            return obs
        # Statistics, not parameters: no gradient flows into them.
        mean, var = tf.stop_gradient(self.mean), tf.stop_gradient(self.var)
        z = (obs - mean) / tf.sqrt(var + 1e-8)  # [B, obs]
        return tf.clip_by_value(z, -self.clip, self.clip)

    def update(self, obs: np.ndarray) -> None:
        """Merges the moments of `obs` `[n, obs]` into the running ones (Chan et al.):
        the result equals the mean/variance of all observations seen so far."""
        obs = np.asarray(obs, np.float64)
        count, mean, var = float(self.count.numpy()), self.mean.numpy(), self.var.numpy()
        n, batch_mean, batch_var = len(obs), obs.mean(axis=0), obs.var(axis=0)
        total = count + n
        delta = batch_mean - mean
        m2 = var * count + batch_var * n + np.square(delta) * count * n / total
        self.mean.assign((mean + delta * n / total).astype(np.float32))
        self.var.assign((m2 / total).astype(np.float32))
        self.count.assign(np.float32(total))


class PolicyNet(tf.Module):
    """pi(.|s): the model's torso (`pi/torso`), an LSTM core `pi/lstm` when `model.lstm` > 0,
    and a linear head giving logits (Discrete) or the Gaussian mean (Box, with a
    state-independent `pi/log_std`), on normalized observations. With `mask_size` n > 0 the
    last n entries of an observation are its action mask: `norm` and the torso see the others
    only, and the logits of illegal actions are `masking.ILLEGAL`. `parts`: where the keys of
    a flattened Dict/Tuple observation lie (for `model.encoders`)."""

    def __init__(
        self, obs_dim, action_space, model, log_std_init, rng, norm, mask_size=0, parts=()
    ):
        super().__init__(name=None)
        self.norm = norm
        self.mask_size = mask_size
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.torso = build_torso(model, (obs_dim - mask_size,), "pi/torso", rng, parts)
        self.core = _core(self.torso.out_dim, model, "pi/lstm", rng)
        width = self.core.units if self.core is not None else self.torso.out_dim
        if self.discrete:
            # Small output scale: the initial policy is close to uniform / zero-mean.
            self.head = Dense(width, int(action_space.n), "pi/logits", rng, scale=0.01)
        else:
            dim = int(action_space.shape[0])
            self.head = Dense(width, dim, "pi/mean", rng, scale=0.01)
            # TF's stub types `initial_value` as a Tensor; tf.Variable takes any tensor-like value.
            self.log_std = tf.Variable(np.full(dim, log_std_init, np.float32), name="pi/log_std")  # pyright: ignore[reportArgumentType]
            self.low = tf.constant(action_space.low, tf.float32)  # [A]
            self.high = tf.constant(action_space.high, tf.float32)

    def __call__(self, obs):
        return self.masked(self.head(self.torso(self.inputs(obs))), obs)  # [B, A]

    def inputs(self, obs):
        """What the torso takes: the normalized features of `obs` `[B, D]`."""
        return self.norm(features(obs, self.mask_size))

    def masked(self, out, obs):
        """The head's output `out` `[B, A]` (logits or means) with illegal logits masked."""
        return masked(out, obs, self.mask_size)

    def step(self, obs, state, first):
        """Recurrent, one step: (logits or means `[N, A]`, the core's next state `[N, 2U]`)."""
        return _step(self, obs, state, first)

    def unroll(self, obs, state, first):
        """Recurrent, B sequences `[B, T, obs]` from `state` `[B, 2U]`, resets `first` `[B, T]`:
        logits or means `[B * T, A]` (batch-major)."""
        return _unroll(self, obs, state, first)

    def greedy(self, obs):
        """The most likely actions: argmax of the logits `[N]`, or the Gaussian mean clipped
        to the action bounds `[N, A]`."""
        return self.greedy_from(self(obs))

    def greedy_from(self, out):
        """`greedy` of the head's output `out` `[N, A]`."""
        if self.discrete:
            return tf.argmax(out, axis=1)  # [N]
        return tf.clip_by_value(out, self.low, self.high)  # [N, A]

    def log_prob_entropy(self, obs, action):
        """log pi(action | obs) `[B]` and the policy's entropy `[B]`, exactly."""
        return self.log_prob_entropy_from(self(obs), action)

    def log_prob_entropy_from(self, out, action):
        """`log_prob_entropy` of the head's output `out` `[B, A]`."""
        if self.discrete:
            log_p = tf.nn.log_softmax(out)  # [B, A]
            logp = tf.gather(log_p, action, axis=1, batch_dims=1)  # [B]
            entropy = -tf.reduce_sum(tf.exp(log_p) * log_p, axis=1)  # [B]
            return logp, entropy
        log_std = self.log_std  # [A]
        z = (action - out) * tf.exp(-log_std)  # [B, A]
        # log N(a; mu, sigma^2) = -0.5 * sum(z^2 + 2 log sigma + log 2 pi)
        logp = -0.5 * tf.reduce_sum(tf.square(z) + 2.0 * log_std + _LOG_2PI, axis=1)  # [B]
        # H = sum(log sigma + 0.5 (1 + log 2 pi)), the same for every state.
        entropy = tf.reduce_sum(log_std + 0.5 * (1.0 + _LOG_2PI)) * tf.ones_like(logp)  # [B]
        return logp, entropy


class ValueNet(tf.Module):
    """V(s): the model's torso (`vf/torso`), an LSTM core `vf/lstm` when `model.lstm` > 0, and
    a linear head, on normalized observations (without their last `mask_size` entries, an
    action mask; `parts` as `PolicyNet`'s)."""

    def __init__(self, obs_dim, model, rng, norm, mask_size=0, parts=()):
        super().__init__(name=None)
        self.norm = norm
        self.mask_size = mask_size
        self.torso = build_torso(model, (obs_dim - mask_size,), "vf/torso", rng, parts)
        self.core = _core(self.torso.out_dim, model, "vf/lstm", rng)
        width = self.core.units if self.core is not None else self.torso.out_dim
        self.head = Dense(width, 1, "vf/out", rng, scale=1.0)

    def __call__(self, obs):
        return self.head(self.torso(self.inputs(obs)))[:, 0]  # [B]

    def inputs(self, obs):
        """What the torso takes: the normalized features of `obs` `[B, D]`."""
        return self.norm(features(obs, self.mask_size))

    def masked(self, out, obs):
        """`out` itself: a value has no actions to mask."""
        return out

    def step(self, obs, state, first):
        """Recurrent, one step: (values `[N]`, the core's next state `[N, 2U]`)."""
        out, state = _step(self, obs, state, first)
        return out[:, 0], state

    def unroll(self, obs, state, first):
        """Recurrent, B sequences (see `PolicyNet.unroll`): values `[B * T]`."""
        return _unroll(self, obs, state, first)[:, 0]


def _core(width: int, model, name: str, rng):
    """The LSTM core of `model.lstm` units on features of `width`, or None (no LSTM)."""
    from easyrl.models.lstm import LSTMCore

    return LSTMCore(width, model.lstm, name, rng) if getattr(model, "lstm", 0) else None


def _step(net, obs, state, first):
    """A recurrent PolicyNet's or ValueNet's step: (head output, next state)."""
    from easyrl.models.lstm import recurrent_step

    x = net.inputs(obs)
    return recurrent_step(
        net.torso, net.core, lambda h: net.masked(net.head(h), obs), x, state, first
    )


def _unroll(net, obs, state, first):
    """A recurrent PolicyNet's or ValueNet's head outputs `[B * T, out]` over B sequences."""
    from easyrl.models.lstm import recurrent_unroll

    b, t = tf.shape(obs)[0], tf.shape(obs)[1]
    obs = tf.reshape(obs, [b * t, obs.shape[-1]])  # [B * T, D]
    x = net.inputs(obs)
    return recurrent_unroll(
        net.torso, net.core, lambda h: net.masked(net.head(h), obs), x, state, first
    )
