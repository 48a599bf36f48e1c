"""The TensorFlow side of DQN / Ape-X DQN: Q network, acting, initial priorities, loss.

Loss (double DQN, n-step, prioritized):
    a* = argmax_a Q(s', a)                      (online net when double_q, else target)
    y  = R + discount * Q_target(s', a*)         (discount = gamma^m, 0 at termination)
    td = y - Q(s, a);  loss = mean(w * huber(td));  new priority = |td|
"""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms.contract import Flow, LearnStep
from easyrl.algorithms.dqn import FLOW, Params, actor_epsilon
from easyrl.algorithms.nstep import NStepAccumulator
from easyrl.algorithms.shared import CompiledGreedy, compiled, flat_gradients
from easyrl.errors import ConfigError, EasyRLError
from easyrl.models import Dense, FlatVariables, build_torso, named_variables


class QNetwork(tf.Module):
    """Q(s, .) from the configured torso (MLP, or conv on frames), with dueling
    value/advantage heads when asked: Q = V + A - mean(A)."""

    def __init__(self, obs_shape, num_actions, model, dueling, seed, name):
        super().__init__(name=None)
        rng = np.random.default_rng(seed)
        self.torso = build_torso(model, obs_shape, f"{name}/torso", rng)
        width = self.torso.out_dim
        self.dueling = dueling
        self.advantage = Dense(width, num_actions, f"{name}/advantage", rng, scale=0.1)
        if dueling:
            self.value = Dense(width, 1, f"{name}/value", rng, scale=0.1)

    def __call__(self, obs):
        h = self.torso(obs)  # [B, H]
        adv = self.advantage(h)  # [B, A]
        if not self.dueling:
            return adv
        return self.value(h) + adv - tf.reduce_mean(adv, axis=1, keepdims=True)


class DQN(CompiledGreedy):
    """DQN's pieces for the runtime: networks, acting, post-processing and the loss.

    Args:
        params: hyper-parameters.
        obs_space: a gymnasium Box observation space.
        action_space: a gymnasium Discrete action space.
        model: the config's `model` section.
        seed: initialisation seed (every role builds identical initial values).
    """

    flow: Flow = FLOW

    def __init__(self, params: Params, obs_space, action_space, model, seed: int = 0):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"dqn needs a Discrete action space, got {action_space}")
        if not isinstance(obs_space, gym.spaces.Box):
            raise ConfigError(f"dqn needs a Box observation space, got {obs_space}")
        self.params = params
        self.target_update_period = params.target_update_period
        self.obs_shape = tuple(obs_space.shape)
        self.num_actions = int(action_space.n)
        self.obs_dtype = np.dtype(obs_space.dtype)
        try:
            self.q = QNetwork(self.obs_shape, self.num_actions, model, params.dueling, seed, "q")
            self.target = QNetwork(
                self.obs_shape, self.num_actions, model, params.dueling, seed, "target"
            )
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
        self.variables = named_variables(self.q)
        # The Q network (what the target copies); `_flat`: all variables (BCQ adds its own).
        self._flat = self._q_flat = FlatVariables(list(self.variables.values()))
        self._target_flat = FlatVariables(list(named_variables(self.target).values()))
        # Fixed input signatures: converting numpy inputs is then cheap and nothing retraces.
        obs = tf.TensorSpec([None, *self.obs_shape], tf.as_dtype(self.obs_dtype))
        vec = tf.TensorSpec([None], tf.float32)
        act = tf.TensorSpec([None], tf.int64)
        self._greedy = compiled(self._greedy_fn, obs)
        self._td_abs = compiled(self._td_abs_fn, obs, act, vec, obs, vec)
        self._step = compiled(self._step_fn, obs, act, vec, obs, vec, vec)
        self.sync_target()

    def postprocessor(self, num_envs: int) -> NStepAccumulator:
        """The actor-side n-step accumulator for `num_envs` envs."""
        return NStepAccumulator(
            num_envs, self.params.n_step, self.params.gamma, self.obs_shape, self.obs_dtype
        )

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> "EpsilonGreedyCollector":
        """The actor-side collector: Ape-X epsilon-greedy acting and n-step transitions."""
        return EpsilonGreedyCollector(self, num_envs, actor_index, num_actors)

    def act(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy actions for a batch of observations `[N, obs]` -> `[N]`."""
        return self.act_with_logp(obs, epsilon, rng)[0]

    def act_with_logp(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator):
        """Epsilon-greedy actions `[N]` and their log-probabilities `[N]` float32 under the
        epsilon-greedy policy: log((1 - eps) + eps / A) for the greedy action, log(eps / A)
        for any other."""
        greedy = self._greedy(np.asarray(obs, self.obs_dtype)).numpy()
        explore = rng.random(len(obs)) < epsilon
        actions = np.where(explore, rng.integers(self.num_actions, size=len(obs)), greedy)
        uniform = epsilon / self.num_actions
        with np.errstate(divide="ignore"):  # epsilon 0: log(0) = -inf for other actions
            logp = np.log(np.where(actions == greedy, 1.0 - epsilon + uniform, uniform))
        return actions, logp.astype(np.float32)

    def initial_priorities(self, batch: dict) -> np.ndarray:
        """Ape-X initial priorities |TD| computed with the actor's copy of the network."""
        return self._td_abs(
            batch["obs"], batch["action"], batch["reward"], batch["next_obs"], batch["discount"]
        ).numpy()

    def learn(self, batch: dict, weights: np.ndarray) -> LearnStep:
        """One gradient computation on a sampled batch.

        Returns:
            a LearnStep: gradients in the order of `self.variables`, stats (`loss`, then the
            stats the `loss` method returns with it), new priorities |td| `[B]`.
        """
        flat_grads, loss, (stats, td_abs) = self._step(*self.step_inputs(batch, weights))
        stats = {"loss": float(loss), **{k: float(v) for k, v in stats.items()}}
        grads: list[np.ndarray | None] = list(self._flat.split(flat_grads.numpy()))
        return LearnStep(grads, stats, td_abs.numpy())

    def step_inputs(self, batch: dict, weights: np.ndarray) -> tuple[np.ndarray, ...]:
        """The compiled step's inputs from a batch of n-step transitions and IS weights:
        obs, action, reward, next_obs, discount, weights, in their dtypes."""
        return (
            np.asarray(batch["obs"], self.obs_dtype),
            np.asarray(batch["action"], np.int64),
            np.asarray(batch["reward"], np.float32),
            np.asarray(batch["next_obs"], self.obs_dtype),
            np.asarray(batch["discount"], np.float32),
            np.asarray(weights, np.float32),
        )

    def sync_target(self) -> None:
        """Copies the online network into the target network."""
        self._target_flat.assign(self._q_flat.read())

    def _greedy_fn(self, obs):
        return tf.argmax(self.q(obs), axis=1)  # [N]

    def _targets(self, reward, next_obs, discount):
        next_target = self.target(next_obs)  # [B, A]
        if self.params.double_q:
            best = tf.argmax(self.q(next_obs), axis=1)
        else:
            best = tf.argmax(next_target, axis=1)
        bootstrap = tf.gather(next_target, best, axis=1, batch_dims=1)  # [B]
        return reward + discount * bootstrap

    def _td_abs_fn(self, obs, action, reward, next_obs, discount):
        q_next = tf.reduce_max(self.q(next_obs), axis=1)  # [B]
        q_sa = tf.gather(self.q(obs), action, axis=1, batch_dims=1)
        return tf.abs(reward + discount * q_next - q_sa)

    def loss(self, obs, action, reward, next_obs, discount, weights):
        """The loss on a batch (see the module docstring), with ({"q_mean": mean Q(s, a)}, the
        new priorities |td| `[B]`)."""
        y = tf.stop_gradient(self._targets(reward, next_obs, discount))  # [B]
        q_sa = tf.gather(self.q(obs), action, axis=1, batch_dims=1)  # [B]
        td = y - q_sa
        # Huber: 0.5 td^2 for |td| <= delta, delta (|td| - 0.5 delta) beyond.
        quadratic = tf.minimum(tf.abs(td), self.params.huber_delta)
        huber = 0.5 * tf.square(quadratic) + self.params.huber_delta * (tf.abs(td) - quadratic)
        return tf.reduce_mean(weights * huber), ({"q_mean": tf.reduce_mean(q_sa)}, tf.abs(td))

    def _step_fn(self, *batch):
        return flat_gradients(
            lambda: self.loss(*batch), self.variables.values(), self.params.grad_clip
        )


class EpsilonGreedyCollector:
    """An actor's side of DQN: epsilon-greedy actions with the Ape-X schedule of actor
    `actor_index` of `num_actors`, and n-step transitions out of the env steps.

    Protocol per vector step: `act(obs, rng)`, then `observe(...)`, which returns the
    transitions completed by that step (or None).
    """

    def __init__(self, dqn: DQN, num_envs: int, actor_index: int, num_actors: int):
        self.dqn = dqn
        self.num_envs = num_envs
        self.actor_index, self.num_actors = actor_index, num_actors
        self.nstep = dqn.postprocessor(num_envs)
        self.env_steps = 0
        self.epsilon = actor_epsilon(dqn.params, actor_index, num_actors, 0)
        self._obs: np.ndarray | None = None
        self._actions: np.ndarray | None = None
        self.last_action_logp: np.ndarray | None = None

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy actions `[N]` for `obs` `[N, obs]`."""
        self.epsilon = actor_epsilon(
            self.dqn.params, self.actor_index, self.num_actors, self.env_steps
        )
        self._actions, self.last_action_logp = self.dqn.act_with_logp(obs, self.epsilon, rng)
        self._obs = obs
        return self._actions

    def observe(self, rewards, next_obs, real_next_obs, terminated, truncated) -> dict | None:
        """Feeds the step to the n-step accumulator; returns the completed transitions.

        Raises:
            EasyRLError: called without a preceding `act`.
        """
        if self._obs is None or self._actions is None:
            raise EasyRLError("observe() needs a preceding act()")
        self.env_steps += self.num_envs
        return self.nstep.add(
            self._obs, self._actions, rewards, real_next_obs, terminated, truncated
        )

    def stats(self) -> dict[str, float]:
        """The current exploration rate."""
        return {"epsilon": self.epsilon}
