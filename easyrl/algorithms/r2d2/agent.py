"""The TensorFlow side of R2D2: the recurrent Q network, sequence collection, priorities and
the loss (see the module docstring of `easyrl.algorithms.r2d2`)."""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms import unrolls
from easyrl.algorithms.agent_parts import (
    CompiledGreedy,
    FusesItsStep,
    checked_columns,
    compiled,
    flat_gradients,
)
from easyrl.algorithms.contract import Flow, LearnStep
from easyrl.algorithms.dqn.agent import QNetwork, epsilon_greedy
from easyrl.algorithms.dqn.params import actor_epsilon
from easyrl.algorithms.r2d2.params import FLOW, Params, replay_spec
from easyrl.envs.flat import observation_parts
from easyrl.errors import ConfigError
from easyrl.models import named_variables
from easyrl.models.flat import FlatVariables, GradientStep
from easyrl.models.lstm import recurrent_step, recurrent_unroll

STAT_NAMES: tuple[str, ...] = ("q_mean", "td_abs_mean")
"""Keys of the stats `R2D2.learn` returns beside `loss`."""


def rescale(x: tf.Tensor, eps: float) -> tf.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (Pohlen et al. 2018)."""
    return tf.sign(x) * (tf.sqrt(tf.abs(x) + 1.0) - 1.0) + eps * x


def unrescale(x: tf.Tensor, eps: float) -> tf.Tensor:
    """h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    root = (tf.sqrt(1.0 + 4.0 * eps * (tf.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return tf.sign(x) * (tf.square(root) - 1.0)


def nstep_returns(reward, discount, bootstrap, n: int):
    """n-step returns cut at the sequence end, time-major, for L steps:
    G_t = sum_{k<m} (prod_{i<k} discount_{t+i}) r_{t+k} + (prod_{i<m} discount_{t+i})
    bootstrap_{t+m}, m = min(n, L - t).

    Args:
        reward: `[L, B]`; discount: `[L, B]`; bootstrap: values of x_0..x_L, `[L + 1, B]`.
        n: the return's steps (static).

    Returns:
        G `[L, B]`.
    """
    length = reward.shape[0]
    assert length is not None, "the sequence length must be static"
    steps = np.arange(length)
    pad = tf.zeros([n, tf.shape(reward)[1]])  # [n, B]
    rewards, discounts = tf.concat([reward, pad], 0), tf.concat([discount, pad], 0)  # [L+n, B]
    acc, factor = tf.zeros_like(reward), tf.ones_like(reward)  # [L, B]
    for k in range(n):
        valid = tf.constant((steps + k < length).astype(np.float32)[:, None])  # [L, 1]
        acc += valid * factor * rewards[k : k + length]
        factor *= valid * discounts[k : k + length] + (1.0 - valid)
    return acc + factor * tf.gather(bootstrap, np.minimum(steps + n, length))


class R2D2(CompiledGreedy, FusesItsStep):
    """R2D2's pieces for the runtime: the online and target recurrent Q networks (`q/...`,
    `target/...`: torso, LSTM core `model.lstm` units, dueling heads), epsilon-greedy
    sequence collection, initial priorities and the loss.

    Args:
        params: hyper-parameters.
        obs_space: a Box observation space.
        action_space: a Discrete action space.
        model: the config's `model` section (`model.lstm` > 0).
        seed: initialisation seed (every role builds identical initial values).

    Raises:
        ConfigError: unsupported spaces, or no `model.lstm`.
    """

    flow: Flow = FLOW

    def __init__(self, params: Params, obs_space, action_space, model, seed: int = 0):
        if not isinstance(obs_space, gym.spaces.Box):
            raise ConfigError(f"r2d2 needs a Box observation space, got {obs_space}")
        self.spec = replay_spec(params, obs_space, action_space, model.lstm)
        self.params = params
        self.target_update_period = params.target_update_period
        self.obs_shape = tuple(int(d) for d in obs_space.shape)
        self.obs_dtype = np.dtype(obs_space.dtype)
        self.num_actions = int(action_space.n)
        net = (self.obs_shape, self.num_actions, model, params.dueling, seed)
        try:
            parts = observation_parts(obs_space)
            self.q = QNetwork(*net, "q", lstm=model.lstm, parts=parts)
            self.target = QNetwork(*net, "target", lstm=model.lstm, parts=parts)
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
        self.state_size = 2 * int(model.lstm)
        """Width of the recurrent state per env."""
        self.variables = named_variables(self.q)
        self._flat = FlatVariables(list(self.variables.values()))
        self._target_flat = FlatVariables(list(named_variables(self.target).values()))
        # Fixed input signatures: no retracing, and AutoGraph stays off.
        obs_tf = tf.as_dtype(self.obs_dtype)
        t = params.sequence_length
        vec = tf.TensorSpec([None], tf.float32)
        state = tf.TensorSpec([None, self.state_size], tf.float32)
        self._greedy = compiled(
            self._greedy_step_fn, tf.TensorSpec([None, *self.obs_shape], obs_tf), state, vec
        )
        columns = [
            tf.TensorSpec([None, t + 1, *self.obs_shape], obs_tf),  # obs
            tf.TensorSpec([None, t], tf.int64),  # action
            tf.TensorSpec([None, t], tf.float32),  # reward
            tf.TensorSpec([None, t], tf.float32),  # discount
            state,  # state before step 0
            tf.TensorSpec([None, t + 1], tf.float32),  # first
        ]
        self._priorities = compiled(self._priorities_fn, *columns)
        self._step = GradientStep(self._step_fn, *columns, vec)
        self.sync_target()

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> "SequenceCollector":
        """The actor-side collector: Ape-X epsilon-greedy acting and overlapping sequences."""
        return SequenceCollector(self, num_envs, actor_index, num_actors)

    def initial_priorities(self, batch: dict) -> np.ndarray:
        """Sequence priorities computed on the actor with its copy of the online network
        (it stands in for the target network too)."""
        return self._priorities(*checked_columns("r2d2", self.spec, batch)).numpy()

    def learn(self, batch: dict, weights: np.ndarray) -> LearnStep:
        """One gradient computation on a sampled batch of sequences with importance
        weights `[B]`.

        Returns:
            a LearnStep: gradients in the order of `self.variables`, stats (`loss` and the
            `STAT_NAMES`), new priorities `[B]`.

        Raises:
            EasyRLError: a column is missing or has a wrong shape.
        """
        columns = checked_columns("r2d2", self.spec, batch)
        flat, loss, (stats, priorities) = self._step(*columns, np.asarray(weights, np.float32))
        named = dict(zip(STAT_NAMES, stats.numpy().tolist(), strict=True))
        grads = self._step.gradients(flat, self._flat)
        return LearnStep(grads, {"loss": float(loss), **named}, priorities.numpy())

    def sync_target(self) -> None:
        """Copies the online network into the target network."""
        self._target_flat.assign(self._flat.read())

    # --- compiled functions ---------------------------------------------------------------

    def _greedy_step_fn(self, obs, state, first):
        net = self.q
        assert net.core is not None
        q, state = recurrent_step(
            net.torso, net.core, lambda h: net.heads(h)[:, :, 0], obs, state, first
        )  # [N, A], [N, 2U]
        return tf.argmax(q, axis=1), state  # [N], [N, 2U]

    def _unroll(self, net: QNetwork, obs, state, first):
        """Q values of the learning steps x_burn..x_T of B sequences, time-major
        `[L + 1, B, A]`: the shared unroll (`recurrent_unroll`) runs the core from the stored
        `state` over the burn-in without a gradient, then over the rest."""
        core, burn = net.core, self.params.burn_in
        assert core is not None
        x = tf.reshape(obs, [-1, *self.obs_shape])  # [B * (T+1), ...]
        q = recurrent_unroll(
            net.torso, core, lambda h: net.heads(h)[:, :, 0], x, state, first, burn
        )  # [B * (L+1), A]
        steps = self.params.sequence_length + 1 - burn
        return tf.transpose(tf.reshape(q, [-1, steps, self.num_actions]), [1, 0, 2])

    def _td(self, target: QNetwork, obs, action, reward, discount, state, first):
        """(td `[L, B]` of the learning steps, Q(x_t, a_t) `[L, B]`), bootstrapping from
        `target` (the online network itself on the actor)."""
        p = self.params
        q = self._unroll(self.q, obs, state, first)  # [L+1, B, A]
        q_target = q if target is self.q else self._unroll(target, obs, state, first)
        q_target = tf.stop_gradient(q_target)
        pick = tf.stop_gradient(q) if p.double_q else q_target
        best = tf.argmax(pick, axis=2)  # [L+1, B]
        bootstrap = tf.gather(q_target, best, axis=2, batch_dims=2)  # [L+1, B]
        if p.value_rescaling:
            bootstrap = unrescale(bootstrap, p.rescale_eps)
        learn = slice(p.burn_in, None)
        reward_tm = tf.transpose(reward)[learn]  # [L, B]
        discount_tm = tf.transpose(discount)[learn]  # [L, B]
        returns = nstep_returns(reward_tm, discount_tm, bootstrap, p.n_step)  # [L, B]
        if p.value_rescaling:
            returns = rescale(returns, p.rescale_eps)
        action_tm = tf.transpose(action)[learn]  # [L, B]
        q_sa = tf.gather(q[:-1], action_tm, axis=2, batch_dims=2)  # [L, B]
        return tf.stop_gradient(returns) - q_sa, q_sa

    def _sequence_priorities(self, td):
        """eta * max_t |td| + (1 - eta) * mean_t |td|, `[B]`."""
        td_abs = tf.abs(td)  # [L, B]
        eta = self.params.eta
        return eta * tf.reduce_max(td_abs, 0) + (1.0 - eta) * tf.reduce_mean(td_abs, 0)

    def _priorities_fn(self, *columns):
        return self._sequence_priorities(self._td(self.q, *columns)[0])

    def loss(self, obs, action, reward, discount, state, first, weights):
        """The loss on a batch of sequences (see `easyrl.algorithms.r2d2`), with (stats `[2]`
        (the `STAT_NAMES`), new priorities `[B]`)."""
        td, q_sa = self._td(self.target, obs, action, reward, discount, state, first)
        loss = tf.reduce_mean(weights * tf.reduce_mean(0.5 * tf.square(td), axis=0))
        stats = tf.stack([tf.reduce_mean(q_sa), tf.reduce_mean(tf.abs(td))])
        return loss, (stats, self._sequence_priorities(td))

    def _step_fn(self, *batch):
        return flat_gradients(
            lambda: self.loss(*batch), self.variables.values(), self.params.grad_clip
        )


class SequenceCollector(unrolls.SequenceCollector):
    """An actor's side of R2D2 for `num_envs` envs (`unrolls.SequenceCollector`): Ape-X
    epsilon-greedy acting (actor `actor_index` of `num_actors`) with the LSTM state carried
    per env, and overlapping sequences of T steps, one per env every `period` steps once T
    steps are in: obs `[N, T + 1, ...]`, action `[N, T]`, reward and discount `[N, T]`
    (discount = gamma * (1 - done): an episode end is not bootstrapped, see
    `easyrl.algorithms.r2d2`), state `[N, 2U]` and first `[N, T + 1]`.
    """

    def __init__(self, agent: R2D2, num_envs: int, actor_index: int = 0, num_actors: int = 1):
        self.agent = agent
        self.actor_index, self.num_actors = actor_index, num_actors
        p = agent.params
        self.length = p.sequence_length
        columns = {
            "action": ((), np.int64),
            "reward": ((), np.float32),
            "discount": ((), np.float32),
        }
        super().__init__(
            num_envs,
            self.length,
            columns,
            agent.obs_shape,
            agent.obs_dtype,
            gamma=p.gamma,
            state_size=agent.state_size,
            period=p.period,
        )
        self.env_steps = 0
        self.sequences = 0
        self.epsilon = actor_epsilon(p, actor_index, num_actors, 0)

    def step(self, obs, state, first, rng):
        """Epsilon-greedy actions `[N]` at this actor's current epsilon."""
        p = self.agent.params
        self.epsilon = actor_epsilon(p, self.actor_index, self.num_actors, self.env_steps)
        greedy, next_state = self.agent.greedy_step(obs, self.steps.state, first)  # recurrent
        actions, logp = epsilon_greedy(greedy, self.epsilon, self.agent.num_actions, rng)
        self.last_action_logp: np.ndarray | None = logp
        return actions, {"action": actions}, next_state

    def outcome(self, reward, terminated, truncated, real_next_obs):
        """Counts the env steps (epsilon's clock), then the default reward and discount."""
        self.env_steps += self.num_envs
        return super().outcome(reward, terminated, truncated, real_next_obs)

    def finish(self, next_obs, real_next_obs):
        """The N sequences that end with this step (class docstring)."""
        self.sequences += self.num_envs
        return super().finish(next_obs, real_next_obs)

    def stats(self) -> dict[str, float]:
        """The current exploration rate and the sequences shipped."""
        return {"epsilon": self.epsilon, "sequences": float(self.sequences)}
