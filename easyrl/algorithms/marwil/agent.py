"""The TensorFlow side of MARWIL and BC: policy (and, for beta > 0, value) networks, the
greedy policy, the behaviour log-probabilities for off-policy evaluation, and the loss
(see `easyrl.algorithms.marwil` for the equations).

The networks are PPO's (in `easyrl.algorithms.policy_nets`: `PolicyNet`, logits or a Gaussian
mean with a state-independent `pi/log_std`; `ValueNet`), without observation normalization. The
moving average of the squared advantage norm is a learner-local variable (not on the PS): a
restarted learner starts it again from `adv_norm_start`.
"""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import (
    CompiledGreedy,
    FusesItsStep,
    NoTargetNetwork,
    compiled,
    flat_gradients,
)
from easyrl.algorithms.contract import Flow, LearnStep
from easyrl.algorithms.marwil.params import FLOW, Params
from easyrl.algorithms.policy_nets import ObsNorm, PolicyNet, ValueNet
from easyrl.errors import ConfigError
from easyrl.models import named_variables
from easyrl.models.flat import FlatVariables, GradientStep

STAT_NAMES: tuple[str, ...] = ("loss", "policy_loss", "value_loss", "adv_sq_mean")
"""Keys of the stats `loss` returns (`learn` adds `adv_norm`, the moving average)."""


class MARWIL(CompiledGreedy, NoTargetNetwork, FusesItsStep):
    """MARWIL's pieces for the runtime: networks, greedy actions, log-probabilities, the
    gradient step. There is no collector: MARWIL trains from a dataset only.

    Args:
        params: hyper-parameters.
        obs_space: a flat gymnasium Box observation space.
        action_space: a Discrete or flat Box action space.
        model: the config's `model` section (an mlp or a custom torso).
        seed: initialisation seed (every role builds identical initial values).

    Raises:
        ConfigError: a custom torso breaks its contract.
    """

    flow: Flow = FLOW

    def __init__(self, params: Params, obs_space, action_space, model, seed: int = 0):
        self.params = params
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        obs_dim = int(obs_space.shape[0])
        rng = np.random.default_rng(seed)
        identity = ObsNorm(obs_dim, None)
        try:
            self.pi = PolicyNet(obs_dim, action_space, model, params.log_std_init, rng, identity)
            # beta = 0 (BC) never uses a value
            self.vf = ValueNet(obs_dim, model, rng, identity) if params.beta > 0 else None
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
        self.variables = named_variables(self.pi)
        if self.vf is not None:
            self.variables = {**self.variables, **named_variables(self.vf)}
        self._flat = FlatVariables(list(self.variables.values()))
        # TF's stub types `initial_value` as a Tensor; tf.Variable takes any tensor-like value.
        self.adv_norm = tf.Variable(params.adv_norm_start, dtype=tf.float32, trainable=False)  # pyright: ignore[reportArgumentType]
        if self.discrete:
            act = tf.TensorSpec([None], tf.int64)
        else:
            act = tf.TensorSpec([None, int(action_space.shape[0])], tf.float32)
        obs = tf.TensorSpec([None, obs_dim], tf.float32)
        ret = tf.TensorSpec([None], tf.float32)
        self._greedy = compiled(self.pi.greedy, obs)  # the most likely actions
        self._logp = compiled(lambda o, a: self.pi.log_prob_entropy(o, a)[0], obs, act)
        self._losses = compiled(lambda *batch: self._loss(*batch)[1], obs, act, ret)
        self._step = GradientStep(self._step_fn, obs, act, ret)

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
        return dict(zip(STAT_NAMES, stats.numpy().tolist(), strict=True))

    def learn(self, batch: dict, weights: np.ndarray | None = None) -> LearnStep:
        """One gradient computation on a sampled batch (uniform replay: `weights` unused);
        then folds the batch's squared advantage into the moving average.

        Returns:
            a LearnStep: gradients in the order of `self.variables`, stats, no priorities.
        """
        flat_grads, stats = self._step(*self._inputs(batch))
        stats = dict(zip(STAT_NAMES, stats.numpy().tolist(), strict=True))
        stats["adv_norm"] = float(self.adv_norm.numpy())
        return LearnStep(self._step.gradients(flat_grads, self._flat), stats)

    # --- compiled functions ---------------------------------------------------------------

    def _loss(self, obs, action, ret):
        """The loss on a batch (see `easyrl.algorithms.marwil`), with the stats `[4]` (the
        `STAT_NAMES`: loss, policy_loss, value_loss, mean squared advantage)."""
        p = self.params
        logp, _ = self.pi.log_prob_entropy(obs, action)  # [B]
        if self.vf is None:  # beta = 0: behaviour cloning
            policy_loss = -tf.reduce_mean(logp)
            return policy_loss, tf.stack([policy_loss, policy_loss, tf.zeros([]), tf.zeros([])])
        advantage = ret - self.vf(obs)  # [B]
        adv_sq = tf.reduce_mean(tf.square(advantage))
        scale = p.beta / (1e-8 + tf.sqrt(self.adv_norm))
        weights = tf.stop_gradient(tf.exp(scale * advantage))  # [B]
        policy_loss = -tf.reduce_mean(weights * logp)
        value_loss = 0.5 * adv_sq
        loss = policy_loss + p.vf_coeff * value_loss
        return loss, tf.stack([loss, policy_loss, value_loss, adv_sq])

    def _step_fn(self, obs, action, ret):
        flat, _, stats = flat_gradients(
            lambda: self._loss(obs, action, ret), self.variables.values(), self.params.grad_clip
        )
        if self.vf is not None:  # c <- c + rate * (mean(A^2) - c), with stats[3] = mean(A^2)
            self.adv_norm.assign_add(self.params.adv_norm_update_rate * (stats[3] - self.adv_norm))
        return flat, stats
