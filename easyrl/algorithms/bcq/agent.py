"""The TensorFlow side of discrete BCQ: DQN's networks and targets (`dqn.agent.DQN`) with the
action constraint, plus the behaviour-cloning classifier G.

Loss on a batch (w: replay importance weights, 1 with uniform replay):
    a*       = argmax_{a in allowed(s')} Q(s', a)        (online Q when double_q, else
                                                          Q_target; classifier G at s')
    y        = R + discount * Q_target(s', a*)
    q_loss   = mean(w * huber(y - Q(s, a)))
    bc_loss  = mean(w * -log G(a|s))                      (cross-entropy on the logged action)
    loss     = q_loss + bc_weight * bc_loss + logit_reg * mean(logits(s)^2)
with allowed(s) = {a : G(a|s) / max_a' G(a'|s) > threshold} = {a : exp(l_a - max l) > tau}.
Acting (`greedy`) takes argmax_{a in allowed(s)} Q(s, a) too.
"""

import numpy as np
import tensorflow as tf

from easyrl.algorithms.bcq.params import Params
from easyrl.algorithms.dqn.agent import DQN
from easyrl.errors import ConfigError
from easyrl.models import Dense, build_torso, named_variables
from easyrl.models.flat import FlatVariables

STAT_NAMES = ("loss", "q_loss", "bc_loss", "q_mean", "allowed_fraction")
"""Keys of the stats `BCQ.learn` returns, in order."""


def allowed_actions(logits: tf.Tensor, threshold: float) -> tf.Tensor:
    """`[B, A]` bool: G(a|s) / max_a' G(a'|s) > threshold, from the classifier's logits
    `[B, A]` (the ratio of softmax probabilities is exp(l_a - max l)). The most likely action
    is always allowed (threshold < 1)."""
    return tf.exp(logits - tf.reduce_max(logits, axis=1, keepdims=True)) > threshold


def constrained_argmax(q: tf.Tensor, logits: tf.Tensor, threshold: float) -> tf.Tensor:
    """`[B]` int64: argmax of Q `[B, A]` over the allowed actions (see `allowed_actions`)."""
    q = tf.convert_to_tensor(q)
    masked = tf.where(allowed_actions(logits, threshold), q, q.dtype.min)  # [B, A]
    return tf.argmax(masked, axis=1)


class BehaviourNet(tf.Module):
    """G(.|s): logits of the logged actions, on a torso of its own (`bc/torso`, `bc/logits`)."""

    def __init__(self, obs_shape, num_actions, model, rng):
        super().__init__(name=None)
        self.torso = build_torso(model, obs_shape, "bc/torso", rng)
        self.logits = Dense(self.torso.out_dim, num_actions, "bc/logits", rng, scale=0.1)

    def __call__(self, obs):
        return self.logits(self.torso(obs))  # [B, A]


class BCQ(DQN):
    """Discrete BCQ's pieces for the runtime: DQN's Q and target networks (the target syncs
    Q only), the classifier, the constrained argmax and the loss.

    Args:
        params: hyper-parameters.
        obs_space: a gymnasium Box observation space.
        action_space: a gymnasium Discrete action space.
        model: the config's `model` section (Q and G get one torso each).
        seed: initialisation seed (every role builds identical initial values).
    """

    params: Params

    def __init__(self, params: Params, obs_space, action_space, model, seed: int = 0):
        super().__init__(params, obs_space, action_space, model, seed)
        try:
            self.bc = BehaviourNet(
                self.obs_shape, self.num_actions, model, np.random.default_rng(seed + 1)
            )
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
        self.variables = dict(sorted({**self.variables, **named_variables(self.bc)}.items()))
        self._flat = FlatVariables(list(self.variables.values()))  # `learn`'s gradients

    # --- compiled functions (DQN's, with the constraint) ------------------------------------

    def _greedy_fn(self, obs):
        return constrained_argmax(self.q(obs), self.bc(obs), self.params.threshold)  # [N]

    def _targets(self, reward, next_obs, discount):
        next_target = self.target(next_obs)  # [B, A]
        chooser = self.q(next_obs) if self.params.double_q else next_target
        best = constrained_argmax(chooser, self.bc(next_obs), self.params.threshold)  # [B]
        bootstrap = tf.gather(next_target, best, axis=1, batch_dims=1)  # [B]
        return reward + discount * bootstrap

    def _td_abs_fn(self, obs, action, reward, next_obs, discount):
        q_sa = tf.gather(self.q(obs), action, axis=1, batch_dims=1)  # [B]
        return tf.abs(self._targets(reward, next_obs, discount) - q_sa)

    def loss(self, obs, action, reward, next_obs, discount, weights):
        """The loss on a batch (see the module docstring), with (stats: the `STAT_NAMES` but
        `loss`, the new priorities |y - Q(s, a)| `[B]`); `learn` is DQN's."""
        p = self.params
        q_loss, (stats, td_abs) = super().loss(obs, action, reward, next_obs, discount, weights)
        logits = self.bc(obs)  # [B, A]
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=action, logits=logits)
        bc_loss = tf.reduce_mean(weights * nll)
        loss = q_loss + p.bc_weight * bc_loss + p.logit_reg * tf.reduce_mean(tf.square(logits))
        allowed = tf.reduce_mean(tf.cast(allowed_actions(logits, p.threshold), tf.float32))
        stats = {"q_loss": q_loss, "bc_loss": bc_loss, **stats, "allowed_fraction": allowed}
        return loss, (stats, td_abs)
