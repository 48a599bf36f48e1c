"""The TensorFlow side of TD3 / DDPG: actor, critics, Polyak targets, acting, the losses.

With a = normalized action in [-1, 1]^A, discount = gamma^m (0 at termination), w = importance
weights, sigma = target_noise, c = target_noise_clip, eps ~ N(0, 1) `[B, A]`:
    a'  = clip(mu'(s') + clip(sigma * eps, -c, c), -1, 1)           (target policy smoothing)
    y   = R + discount * min_i Q'_i(s', a')                          (i over the twins)
    critic_loss = sum_i mean(w * (Q_i(s, a) - y)^2);  new priority = |y - Q_1(s, a)|
    actor_loss  = -mean(Q_1(s, mu(s)))                              (unweighted)
Primes are the local target networks, Polyak-averaged by `sync_target`:
    target = tau * online + (1 - tau) * target.
"""

import functools

import numpy as np
import tensorflow as tf

from easyrl.algorithms.nstep import NStepAccumulator
from easyrl.algorithms.td3 import FLOW, actor_noise_scale, check_spaces, scale_actions
from easyrl.errors import ConfigError, EasyRLError
from easyrl.models import MLP, Dense, FlatVariables, named_variables


def transition_columns(batch: dict) -> tuple[np.ndarray, ...]:
    """The columns of a batch of transitions as the compiled functions take them:
    (obs [B, obs], normalized action [B, A], reward [B], next_obs [B, obs], discount [B])."""
    return tuple(
        np.asarray(batch[k], np.float32)
        for k in ("obs", "action", "reward", "next_obs", "discount")
    )


class Critic(tf.Module):
    """Q(s, a): an MLP on concat(obs, action) and a linear output, `[B]`."""

    def __init__(self, obs_dim: int, action_dim: int, model, name: str, rng):
        super().__init__(name=None)
        in_dim = obs_dim + action_dim
        self.torso = MLP(in_dim, model.hidden, model.activation, f"{name}/torso", rng)
        self.out = Dense(model.hidden[-1] if model.hidden else in_dim, 1, f"{name}/out", rng)

    def __call__(self, obs: tf.Tensor, action: tf.Tensor) -> tf.Tensor:
        """Q(s, a) `[B]` for `obs` `[B, obs]` and normalized `action` `[B, A]`."""
        x = tf.concat([obs, action], axis=1)  # [B, obs + A]
        return tf.reshape(self.out(self.torso(x)), [-1])  # [B]


class Critics(tf.Module):
    """The critics `{name}/q1` (and `{name}/q2` when `twin`); calling gives `[Q_1, (Q_2)]`."""

    def __init__(self, obs_dim: int, action_dim: int, model, twin: bool, name: str, rng):
        super().__init__(name=None)
        self.q1 = Critic(obs_dim, action_dim, model, f"{name}/q1", rng)
        self.q2 = Critic(obs_dim, action_dim, model, f"{name}/q2", rng) if twin else None

    def __call__(self, obs: tf.Tensor, action: tf.Tensor) -> list[tf.Tensor]:
        """[Q_1(s, a), Q_2(s, a)] (or [Q_1]), each `[B]`."""
        return [q(obs, action) for q in (self.q1, self.q2) if q is not None]  # each [B]


def min_q(qs: list[tf.Tensor]) -> tf.Tensor:
    """min_i Q_i elementwise over the critics' outputs `[B]` (the only one without twins)."""
    return qs[0] if len(qs) == 1 else tf.minimum(qs[0], qs[1])  # [B]


class DeterministicActor(tf.Module):
    """mu(s) = tanh(MLP(s)) in [-1, 1]^A. The output layer starts small (scale 0.1) so the
    first actions sit mid-range, away from the saturated tanh."""

    def __init__(self, obs_dim: int, action_dim: int, model, name: str, rng):
        super().__init__(name=None)
        self.torso = MLP(obs_dim, model.hidden, model.activation, f"{name}/torso", rng)
        width = model.hidden[-1] if model.hidden else obs_dim
        self.out = Dense(width, action_dim, f"{name}/out", rng, scale=0.1)

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        """mu(s) `[B, A]` for `obs` `[B, obs]`."""
        return tf.tanh(self.out(self.torso(obs)))  # [B, A]


class PolyakTargets:
    """Local target copies of online variables: `target_<name>` tracks `<name>`.

    `update()` Polyak-averages all of them in one compiled call,
        target = tau * online + (1 - tau) * target,
    except its first call, which copies: the learner's first call comes right after it pulled
    the PS values and before any update, so the targets start equal to the online networks
    (as in the papers), also after a restart from a checkpoint. The constructor copies too.

    Args:
        online: {name: variable} of the online networks.
        targets: {"target_" + name: variable}, one per online variable, same shapes.
        tau: the Polyak rate in (0, 1].

    Raises:
        EasyRLError: the target variables do not mirror the online ones.
    """

    def __init__(self, online: dict[str, tf.Variable], targets: dict[str, tf.Variable], tau):
        if set(targets) != {f"target_{name}" for name in online}:
            raise EasyRLError(f"targets {sorted(targets)} do not mirror {sorted(online)}")
        self.pairs = [(online[n], targets[f"target_{n}"]) for n in online]
        for src, dst in self.pairs:
            if src.shape != dst.shape:
                raise EasyRLError(f"{dst.name} has shape {dst.shape}, {src.name} {src.shape}")
        self.tau = float(tau)
        self.synced = False
        self._copy = tf.function(self._copy_fn, autograph=False, input_signature=[])
        self._polyak = tf.function(self._polyak_fn, autograph=False, input_signature=[])
        self._copy()

    def update(self) -> None:
        """Copies on the first call, Polyak-averages on every later one (see the class)."""
        if self.synced:
            self._polyak()
        else:
            self._copy()
            self.synced = True

    def _copy_fn(self) -> None:
        for src, dst in self.pairs:
            dst.assign(src)

    def _polyak_fn(self) -> None:
        for src, dst in self.pairs:
            dst.assign(self.tau * src + (1.0 - self.tau) * dst)


def flatten_grads(grads: list[tf.Tensor], clip: float) -> tf.Tensor:
    """Gradients as one flat vector, clipped to global norm `clip` first (0: no clip)."""
    if clip > 0:
        grads, _ = tf.clip_by_global_norm(grads, clip)
    return tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)


def scaled_greedy_fn(normalized_action, low: np.ndarray, high: np.ndarray, obs_dim: int):
    """A deterministic policy as one compiled function with a fixed input signature
    (observations `[N, obs_dim]` float32 in, actions `[N, A]` float32 out), what
    `easyrl export` saves as a SavedModel: `normalized_action(obs)` in [-1, 1] scaled to the
    bounds in float64 as `scale_actions` does, so both give the same actions."""
    low = tf.constant(low.astype(np.float64))  # [A]
    high = tf.constant(high.astype(np.float64))

    def greedy(obs):
        a = tf.clip_by_value(tf.cast(normalized_action(obs), tf.float64), -1.0, 1.0)  # [N, A]
        scaled = tf.clip_by_value(low + (a + 1.0) * 0.5 * (high - low), low, high)
        return tf.cast(scaled, tf.float32)

    spec = tf.TensorSpec([None, obs_dim], tf.float32)
    return tf.function(greedy, autograph=False, input_signature=[spec])


class TD3:
    """TD3's (and DDPG's) pieces for the runtime: networks, acting, priorities, the losses.

    Variables on the PS: `actor/...`, `critic/q1/...` (and `critic/q2/...`); the targets
    `target_actor/...`, `target_critic/...` stay local. Actions are normalized to [-1, 1].

    Args:
        params: TD3's or DDPG's hyper-parameters (the same fields).
        obs_space: a flat gymnasium Box.
        action_space: a flat gymnasium Box with finite bounds.
        model: the config's `model` section (mlp: `hidden`, `activation`).
        seed: initialisation seed (every role builds identical initial values); also seeds
            the target-smoothing noise `learn` draws when it is given none.
        name: algorithm name for error messages.

    Raises:
        ConfigError: unsupported spaces or model.
    """

    flow = FLOW
    target_update_period = 1
    """`sync_target` (a Polyak step) after every update."""

    def __init__(self, params, obs_space, action_space, model, seed: int = 0, name="td3"):
        check_spaces(name, obs_space, action_space, model)
        self.params = params
        self.obs_dim = int(obs_space.shape[0])
        self.action_dim = int(action_space.shape[0])
        self.low = np.asarray(action_space.low, np.float32)  # [A]
        self.high = np.asarray(action_space.high, np.float32)  # [A]
        rng = np.random.default_rng(seed)
        try:
            self.actor = DeterministicActor(self.obs_dim, self.action_dim, model, "actor", rng)
            self.critic = Critics(
                self.obs_dim, self.action_dim, model, params.twin_q, "critic", rng
            )
            # Initial values are copied from the online networks below.
            spare = np.random.default_rng(0)
            self.target_actor = DeterministicActor(
                self.obs_dim, self.action_dim, model, "target_actor", spare
            )
            self.target_critic = Critics(
                self.obs_dim, self.action_dim, model, params.twin_q, "target_critic", spare
            )
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
        self.variables = {**named_variables(self.actor), **named_variables(self.critic)}
        self.variables = dict(sorted(self.variables.items()))
        self._actor_names = [n for n in self.variables if n.startswith("actor/")]
        self._critic_names = [n for n in self.variables if n.startswith("critic/")]
        self._actor_flat = FlatVariables([self.variables[n] for n in self._actor_names])
        self._critic_flat = FlatVariables([self.variables[n] for n in self._critic_names])
        targets = {**named_variables(self.target_actor), **named_variables(self.target_critic)}
        self.polyak = PolyakTargets(self.variables, targets, params.tau)
        self._rng = np.random.default_rng(seed)
        self.learn_calls = 0
        self.actor_updates = 0

        obs = tf.TensorSpec([None, self.obs_dim], tf.float32)
        act = tf.TensorSpec([None, self.action_dim], tf.float32)
        vec = tf.TensorSpec([None], tf.float32)
        batch = [obs, act, vec, obs, vec]

        def compile_(fn, signature):
            return tf.function(fn, autograph=False, input_signature=signature)

        self._policy = compile_(self.actor.__call__, [obs])
        self._target_actions = compile_(self._target_actions_fn, [obs, act])
        self._targets = compile_(self._targets_fn, [vec, obs, vec, act])
        self._td_abs = compile_(self._td_abs_fn, batch)
        self._critic_step = compile_(self._critic_step_fn, [*batch, vec, act])
        self._full_step = compile_(self._full_step_fn, [*batch, vec, act])

    # --- actor side ---------------------------------------------------------------------

    def postprocessor(self, num_envs: int) -> NStepAccumulator:
        """The actor-side n-step accumulator for `num_envs` envs (float32 actions `[A]`)."""
        p = self.params
        return NStepAccumulator(
            num_envs, p.n_step, p.gamma, (self.obs_dim,), np.float32, (self.action_dim,), np.float32
        )

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> "ContinuousCollector":
        """The actor-side collector: noisy actions (`NoisyPolicy` with the scale of actor
        `actor_index` of `num_actors`) and n-step transitions. The `rng` given to `act`
        drives all of its randomness; `seed` is accepted for the runtime's protocol."""
        scale = actor_noise_scale(self.params, actor_index, num_actors)
        return ContinuousCollector(self, num_envs, NoisyPolicy(self, num_envs, scale))

    def policy(self, obs: np.ndarray) -> np.ndarray:
        """mu(s): normalized deterministic actions `[N, A]` in [-1, 1] for `obs` `[N, obs]`."""
        return self._policy(np.asarray(obs, np.float32)).numpy()

    def scale(self, normalized: np.ndarray) -> np.ndarray:
        """Normalized actions `[N, A]` mapped to the env's bounds (float32)."""
        return scale_actions(normalized, self.low, self.high)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Evaluation actions `[N, A]`: the actor's output scaled to the bounds."""
        return self.scale(self.policy(obs))

    @functools.cached_property
    def greedy_fn(self) -> tf.types.experimental.PolymorphicFunction:
        """`greedy` as one compiled function (see `scaled_greedy_fn`): the actor's output
        scaled to the bounds."""
        return scaled_greedy_fn(self._policy, self.low, self.high, self.obs_dim)

    def initial_priorities(self, batch: dict) -> np.ndarray:
        """Ape-X initial priorities `[B]`: |y - Q_1(s, a)| with the actor's copies of the
        online networks standing in for the targets (an actor never syncs targets) and no
        smoothing noise: y = R + discount * min_i Q_i(s', mu(s'))."""
        return self._td_abs(*transition_columns(batch)).numpy()

    # --- learner side -------------------------------------------------------------------

    def target_actions(self, next_obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Smoothed target actions a' `[B, A]` for standard-normal `noise` `[B, A]`."""
        return self._target_actions(
            np.asarray(next_obs, np.float32), np.asarray(noise, np.float32)
        ).numpy()

    def targets(self, batch: dict, noise: np.ndarray) -> np.ndarray:
        """Critic targets y `[B]` for standard-normal smoothing `noise` `[B, A]`."""
        _, _, reward, next_obs, discount = transition_columns(batch)
        return self._targets(reward, next_obs, discount, np.asarray(noise, np.float32)).numpy()

    def learn(
        self, batch: dict, weights: np.ndarray | None, noise: np.ndarray | None = None
    ) -> tuple[list, dict, np.ndarray]:
        """One gradient computation on a sampled batch (the PS applies it).

        The actor's gradients come with every `policy_delay`-th call (calls d, 2d, ...
        counted from 1 per agent); on the other calls its entries are None, so the PS steps
        only the critic's optimizer. The actor's gradient is taken at the same (pre-update)
        critic as the critic's.

        Args:
            batch: the `replay_spec` columns, B rows.
            weights: importance weights `[B]` (None: ones).
            noise: standard-normal smoothing noise `[B, A]`; None draws it from the agent's
                seeded generator (not needed when `target_noise` is 0).

        Returns:
            (gradients in the order of `self.variables`, None for the actor's on a delayed
            call; stats; new priorities |y - Q_1| `[B]`).
        """
        columns = transition_columns(batch)
        size = len(columns[0])
        weights = np.ones(size, np.float32) if weights is None else weights
        if noise is None:
            shape = (size, self.action_dim)
            if self.params.target_noise > 0:
                noise = self._rng.standard_normal(shape, dtype=np.float32)
            else:
                noise = np.zeros(shape, np.float32)
        args = (*columns, np.asarray(weights, np.float32), np.asarray(noise, np.float32))
        self.learn_calls += 1
        grads = dict.fromkeys(self.variables)
        stats = {}
        if self.learn_calls % self.params.policy_delay == 0:
            critic_flat, actor_flat, critic_loss, actor_loss, q_mean, td_abs = self._full_step(
                *args
            )
            self.actor_updates += 1
            grads.update(zip(self._actor_names, self._actor_flat.split(actor_flat.numpy())))
            stats["actor_loss"] = float(actor_loss)
        else:
            critic_flat, critic_loss, q_mean, td_abs = self._critic_step(*args)
        grads.update(zip(self._critic_names, self._critic_flat.split(critic_flat.numpy())))
        stats.update(
            critic_loss=float(critic_loss),
            q_mean=float(q_mean),
            critic_updates=float(self.learn_calls),
            actor_updates=float(self.actor_updates),
        )
        return list(grads.values()), stats, td_abs.numpy()

    def sync_target(self) -> None:
        """Polyak step of every target network, in one compiled call (the first call copies;
        see `PolyakTargets`)."""
        self.polyak.update()

    # --- compiled math ------------------------------------------------------------------

    def _target_actions_fn(self, next_obs, noise):
        c = self.params.target_noise_clip
        eps = tf.clip_by_value(self.params.target_noise * noise, -c, c)  # [B, A]
        return tf.clip_by_value(self.target_actor(next_obs) + eps, -1.0, 1.0)  # [B, A]

    def _targets_fn(self, reward, next_obs, discount, noise):
        next_action = self._target_actions_fn(next_obs, noise)
        return reward + discount * min_q(self.target_critic(next_obs, next_action))  # [B]

    def _td_abs_fn(self, obs, action, reward, next_obs, discount):
        y = reward + discount * min_q(self.critic(next_obs, self.actor(next_obs)))  # [B]
        return tf.abs(y - self.critic.q1(obs, action))

    def _critic_step_fn(self, obs, action, reward, next_obs, discount, weights, noise):
        y = tf.stop_gradient(self._targets_fn(reward, next_obs, discount, noise))  # [B]
        variables = [self.variables[n] for n in self._critic_names]
        with tf.GradientTape() as tape:
            qs = self.critic(obs, action)  # each [B]
            loss = tf.add_n([tf.reduce_mean(weights * tf.square(q - y)) for q in qs])
        flat = flatten_grads(tape.gradient(loss, variables), self.params.grad_clip)
        return flat, loss, tf.reduce_mean(qs[0]), tf.abs(y - qs[0])

    def _full_step_fn(self, obs, action, reward, next_obs, discount, weights, noise):
        critic_flat, critic_loss, q_mean, td_abs = self._critic_step_fn(
            obs, action, reward, next_obs, discount, weights, noise
        )
        variables = [self.variables[n] for n in self._actor_names]
        with tf.GradientTape() as tape:
            actor_loss = -tf.reduce_mean(self.critic.q1(obs, self.actor(obs)))
        actor_flat = flatten_grads(tape.gradient(actor_loss, variables), self.params.grad_clip)
        return critic_flat, actor_flat, critic_loss, actor_loss, q_mean, td_abs


class NoisyPolicy:
    """TD3 / DDPG exploration: mu(s) plus noise of scale sigma in normalized space, clipped
    to [-1, 1]; per env and action dimension,
        gaussian: n_t = sigma * N(0, 1)
        ou:       n_t = (1 - theta) * n_{t-1} + sigma * N(0, 1), reset to 0 at episode ends.

    Args:
        agent: the TD3 agent (its `policy` and `params`).
        num_envs: envs stepped together.
        noise_scale: sigma (see `actor_noise_scale`).
    """

    def __init__(self, agent: "TD3", num_envs: int, noise_scale: float):
        self.agent = agent
        self.noise_scale = noise_scale
        self.ou_state = np.zeros((num_envs, agent.action_dim))  # [N, A]

    def __call__(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Normalized exploratory actions `[N, A]` for `obs` `[N, obs]`."""
        p = self.agent.params
        noise = self.noise_scale * rng.standard_normal(self.ou_state.shape)  # [N, A]
        if p.exploration == "ou":
            self.ou_state = (1.0 - p.ou_theta) * self.ou_state + noise
            noise = self.ou_state
        return np.clip(self.agent.policy(obs) + noise, -1.0, 1.0)

    def reset(self, done: np.ndarray) -> None:
        """Restarts the OU process of the envs whose episode ended (`done` `[N]` bool)."""
        self.ou_state[done] = 0.0

    def stats(self) -> dict[str, float]:
        """The noise scale sigma."""
        return {"noise_scale": self.noise_scale}


class ContinuousCollector:
    """An actor's side of an off-policy Box-action algorithm: `explorer` picks normalized
    actions in [-1, 1] (uniform random ones for the first `random_steps` env steps), the env
    gets them scaled to its bounds, the replay gets them normalized, as n-step transitions.

    Protocol per vector step: `act(obs, rng)`, then `observe(...)`, which returns the
    transitions completed by that step (or None).

    Args:
        agent: has `params.random_steps`, `action_dim`, `scale` and `postprocessor`.
        num_envs: envs stepped together.
        explorer: `explorer(obs, rng) -> [N, A]` normalized actions, with `reset(done)` (called
            with each step's `[N]` episode ends) and `stats()`.
    """

    def __init__(self, agent, num_envs: int, explorer):
        self.agent = agent
        self.num_envs = num_envs
        self.explorer = explorer
        self.nstep = agent.postprocessor(num_envs)
        self.env_steps = 0
        self._obs = self._actions = None

    @property
    def random_phase(self) -> bool:
        """Whether `act` still draws uniform random actions."""
        return self.env_steps < self.agent.params.random_steps

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Env actions `[N, A]` (float32, within the bounds) for `obs` `[N, obs]`."""
        obs = np.asarray(obs, np.float32)
        if self.random_phase:
            actions = rng.uniform(-1.0, 1.0, size=(self.num_envs, self.agent.action_dim))
        else:
            actions = self.explorer(obs, rng)  # [N, A]
        self._obs, self._actions = obs, np.asarray(actions, np.float32)
        return self.agent.scale(self._actions)

    def observe(self, rewards, next_obs, real_next_obs, terminated, truncated) -> dict | None:
        """Feeds the step to the n-step accumulator; returns the completed transitions.

        Raises:
            EasyRLError: called without a preceding `act`.
        """
        if self._actions is None:
            raise EasyRLError("observe() needs a preceding act()")
        self.env_steps += self.num_envs
        self.explorer.reset(np.asarray(terminated, bool) | np.asarray(truncated, bool))
        out = self.nstep.add(
            self._obs, self._actions, rewards, real_next_obs, terminated, truncated
        )
        self._obs = self._actions = None
        return out

    def stats(self) -> dict[str, float]:
        """The explorer's stats, and `random_actions`: 1.0 while actions are uniform."""
        return {**self.explorer.stats(), "random_actions": float(self.random_phase)}
