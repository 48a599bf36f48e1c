"""The TensorFlow side of MARWIL and BC: policy (and, for beta > 0, value) MLPs, the
greedy policy, the behaviour log-probabilities for off-policy evaluation, and the loss
(see `easyrl.algorithms.marwil` for the equations).

The networks are PPO's (`PolicyNet`: logits, or a Gaussian mean with a state-independent
`pi/log_std`; `ValueNet`), without observation normalization. The moving average of the
squared advantage norm is a learner-local variable (not on the PS): a restarted learner
starts it again from `adv_norm_start`.
"""

import math

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms.marwil import FLOW, Params
from easyrl.algorithms.ppo.agent import ObsNorm, PolicyNet, ValueNet
from easyrl.models import FlatVariables, named_variables

STAT_NAMES = ("loss", "policy_loss", "value_loss", "adv_sq_mean")
"""Keys of the stats `loss` returns (`learn` adds `adv_norm`, the moving average)."""

_LOG_2PI = math.log(2.0 * math.pi)


class MARWIL:
    """MARWIL's pieces for the runtime: networks, greedy actions, log-probabilities, the
    gradient step. There is no collector: MARWIL trains from a dataset only.

    Args:
        params: hyper-parameters.
        obs_space: a flat gymnasium Box observation space.
        action_space: a Discrete or flat Box action space.
        model: the config's `model` section.
        seed: initialisation seed (every role builds identical initial values).
    """

    flow = FLOW
    target_update_period = 0
    """No target network."""

    def __init__(self, params: Params, obs_space, action_space, model, seed: int = 0):
        self.params = params
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        obs_dim = int(obs_space.shape[0])
        rng = np.random.default_rng(seed)
        identity = ObsNorm(obs_dim, None)
        self.pi = PolicyNet(obs_dim, action_space, model, params.log_std_init, rng, identity)
        self.variables = named_variables(self.pi)
        self.vf = None
        if params.beta > 0:  # beta = 0 (BC) never uses a value
            self.vf = ValueNet(obs_dim, model, rng, identity)
            self.variables = {**self.variables, **named_variables(self.vf)}
        self._flat = FlatVariables(list(self.variables.values()))
        self.adv_norm = tf.Variable(params.adv_norm_start, dtype=tf.float32, trainable=False)
        if self.discrete:
            act = tf.TensorSpec([None], tf.int64)
        else:
            act = tf.TensorSpec([None, int(action_space.shape[0])], tf.float32)
            self._low = tf.constant(action_space.low, tf.float32)
            self._high = tf.constant(action_space.high, tf.float32)
        obs = tf.TensorSpec([None, obs_dim], tf.float32)
        ret = tf.TensorSpec([None], tf.float32)

        def compile_(fn, signature):
            return tf.function(fn, autograph=False, input_signature=signature)

        self._greedy = compile_(self._greedy_fn, [obs])
        self._logp = compile_(self._log_prob, [obs, act])
        self._losses = compile_(self._losses_fn, [obs, act, ret])
        self._step = compile_(self._step_fn, [obs, act, ret])

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """The most likely action for each observation `[N, obs]` (evaluation)."""
        return self._greedy(np.asarray(obs, np.float32)).numpy()

    @property
    def greedy_fn(self) -> tf.types.experimental.PolymorphicFunction:
        """The compiled function `greedy` calls (observations in, actions out);
        `easyrl export` saves it as a SavedModel."""
        return self._greedy

    def action_logp(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """log pi(actions | obs) `[N]` float32 of the learned (stochastic) policy: the target
        policy of off-policy evaluation."""
        dtype = np.int64 if self.discrete else np.float32
        return self._logp(np.asarray(obs, np.float32), np.asarray(actions, dtype)).numpy()

    def _inputs(self, batch: dict) -> tuple:
        dtype = np.int64 if self.discrete else np.float32
        return (
            np.asarray(batch["obs"], np.float32),
            np.asarray(batch["action"], dtype),
            np.asarray(batch["return"], np.float32),
        )

    def loss(self, batch: dict) -> dict[str, float]:
        """The loss terms on `batch` (obs, action, return) with the current weights and
        advantage norm, without a gradient step."""
        stats = self._losses(*self._inputs(batch))
        return dict(zip(STAT_NAMES, [float(x) for x in stats], strict=True))

    def learn(self, batch: dict, weights: np.ndarray | None = None) -> tuple[list, dict, None]:
        """One gradient computation on a sampled batch (uniform replay: `weights` unused);
        then folds the batch's squared advantage into the moving average.

        Returns:
            (gradients in the order of `self.variables`, stats, None: no priorities).
        """
        flat_grads, stats = self._step(*self._inputs(batch))
        stats = dict(zip(STAT_NAMES, stats.numpy().tolist(), strict=True))
        stats["adv_norm"] = float(self.adv_norm.numpy())
        return self._flat.split(flat_grads.numpy()), stats, None

    # --- compiled functions ---------------------------------------------------------------

    def _greedy_fn(self, obs):
        out = self.pi(obs)  # [N, A]
        if self.discrete:
            return tf.argmax(out, axis=1)  # [N]
        return tf.clip_by_value(out, self._low, self._high)  # [N, A]

    def _log_prob(self, obs, action):
        out = self.pi(obs)  # [B, A] logits or means
        if self.discrete:
            return tf.gather(tf.nn.log_softmax(out), action, axis=1, batch_dims=1)  # [B]
        log_std = self.pi.log_std  # [A]
        z = (action - out) * tf.exp(-log_std)  # [B, A]
        return -0.5 * tf.reduce_sum(tf.square(z) + 2.0 * log_std + _LOG_2PI, axis=1)  # [B]

    def _losses_fn(self, obs, action, ret):
        """(loss, policy_loss, value_loss, mean squared advantage) on a batch."""
        p = self.params
        logp = self._log_prob(obs, action)  # [B]
        if self.vf is None:  # beta = 0: behaviour cloning
            policy_loss = -tf.reduce_mean(logp)
            return policy_loss, policy_loss, tf.zeros([]), tf.zeros([])
        advantage = ret - self.vf(obs)  # [B]
        adv_sq = tf.reduce_mean(tf.square(advantage))
        scale = p.beta / (1e-8 + tf.sqrt(self.adv_norm))
        weights = tf.stop_gradient(tf.exp(scale * advantage))  # [B]
        policy_loss = -tf.reduce_mean(weights * logp)
        value_loss = 0.5 * adv_sq
        return policy_loss + p.vf_coeff * value_loss, policy_loss, value_loss, adv_sq

    def _step_fn(self, obs, action, ret):
        variables = list(self.variables.values())
        with tf.GradientTape() as tape:
            loss, policy_loss, value_loss, adv_sq = self._losses_fn(obs, action, ret)
        grads = tape.gradient(loss, variables)
        grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]
        if self.params.grad_clip > 0:
            grads, _ = tf.clip_by_global_norm(grads, self.params.grad_clip)
        if self.vf is not None:  # c <- c + rate * (mean(A^2) - c)
            self.adv_norm.assign_add(self.params.adv_norm_update_rate * (adv_sq - self.adv_norm))
        stats = tf.stack([loss, policy_loss, value_loss, adv_sq])
        return tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0), stats
