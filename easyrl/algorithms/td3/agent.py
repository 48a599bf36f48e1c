"""The TensorFlow side of TD3 / DDPG: the actor, acting, the losses (the twin critics, their
loss, the Polyak targets and the collector are SAC's too:
`easyrl.algorithms.continuous.actor_critic`).

With a = normalized action in [-1, 1]^A, discount = gamma^m (0 at termination), w = importance
weights, sigma = target_noise, c = target_noise_clip, eps ~ N(0, 1) `[B, A]`:
    a'  = clip(mu'(s') + clip(sigma * eps, -c, c), -1, 1)           (target policy smoothing)
    y   = R + discount * min_i Q'_i(s', a')                          (i over the twins)
    critic_loss = sum_i mean(w * (Q_i(s, a) - y)^2);  new priority = |y - Q_1(s, a)|
    actor_loss  = -mean(Q_1(s, mu(s)))                              (unweighted)
Primes are the local target networks, Polyak-averaged by `sync_target`:
    target = tau * online + (1 - tau) * target.
"""

import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import compiled, flat_gradients
from easyrl.algorithms.continuous.actor_critic import (
    ContinuousCollector,
    Critics,
    PolyakActorCritic,
    PolyakTargets,
    min_q,
    transition_columns,
)
from easyrl.algorithms.contract import Flow, LearnStep
from easyrl.algorithms.td3.params import FLOW, actor_noise_scale
from easyrl.errors import ConfigError
from easyrl.models import Dense, build_torso, named_variables
from easyrl.models.flat import FlatVariables


class DeterministicActor(tf.Module):
    """mu(s) = tanh(out(torso(s))) in [-1, 1]^A, the torso the model's (`{name}/torso`). The
    output layer starts small (scale 0.1) so the first actions sit mid-range, away from the
    saturated tanh."""

    def __init__(self, obs_dim: int, action_dim: int, model, name: str, rng):
        super().__init__(name=None)
        self.torso = build_torso(model, (obs_dim,), f"{name}/torso", rng)
        self.out = Dense(self.torso.out_dim, action_dim, f"{name}/out", rng, scale=0.1)

    def __call__(self, obs: tf.Tensor) -> tf.Tensor:
        """mu(s) `[B, A]` for `obs` `[B, obs]`."""
        return tf.tanh(self.out(self.torso(obs)))  # [B, A]


class TD3(PolyakActorCritic):
    """TD3's (and DDPG's) pieces for the runtime: networks, acting, priorities, the losses
    (greedy acting, the critics' targets and loss and `sync_target`: `PolyakActorCritic`).

    Variables on the PS: `actor/...`, `critic/q1/...` (and `critic/q2/...`); the targets
    `target_actor/...`, `target_critic/...` stay local. Actions are normalized to [-1, 1].

    Args:
        params: TD3's or DDPG's hyper-parameters (the same fields).
        obs_space: a flat gymnasium Box.
        action_space: a flat gymnasium Box with finite bounds.
        model: the config's `model` section (an mlp or a custom torso).
        seed: initialisation seed (every role builds identical initial values); also seeds
            the target-smoothing noise `learn` draws when it is given none.
        name: algorithm name for error messages.

    Raises:
        ConfigError: unsupported spaces or model.
    """

    flow: Flow = FLOW

    def __init__(self, params, obs_space, action_space, model, seed: int = 0, name="td3"):
        super().__init__(name, obs_space, action_space, model)
        self.params = params
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
        self._policy = compiled(self.actor.__call__, obs)
        self._target_actions = compiled(self._target_actions_fn, obs, act)
        self._targets = compiled(self._targets_fn, vec, obs, vec, act)
        self._td_abs = compiled(self._td_abs_fn, *batch)
        self._critic_step = compiled(self._critic_step_fn, *batch, vec, act)
        self._full_step = compiled(self._full_step_fn, *batch, vec, act)

    # --- actor side ---------------------------------------------------------------------

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> ContinuousCollector:
        """The actor-side collector: noisy actions (`NoisyPolicy` with the scale of actor
        `actor_index` of `num_actors`) and n-step transitions. The `rng` given to `act`
        drives all of its randomness; `seed` is accepted for the runtime's protocol."""
        scale = actor_noise_scale(self.params, actor_index, num_actors)
        return ContinuousCollector(self, num_envs, NoisyPolicy(self, num_envs, scale))

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

    def learn(
        self, batch: dict, weights: np.ndarray | None, noise: np.ndarray | None = None
    ) -> LearnStep:
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
            a LearnStep: gradients in the order of `self.variables` (None for the actor's on
            a delayed call), stats, new priorities |y - Q_1| `[B]`.
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
            critic, (actor_flat, actor_loss, _) = self._full_step(*args)
            self.actor_updates += 1
            grads.update(zip(self._actor_names, self._actor_flat.split(actor_flat.numpy())))
            stats["actor_loss"] = float(actor_loss)
        else:
            critic = self._critic_step(*args)
        critic_flat, critic_loss, (q_mean, td_abs) = critic
        grads.update(zip(self._critic_names, self._critic_flat.split(critic_flat.numpy())))
        stats.update(
            critic_loss=float(critic_loss),
            q_mean=float(q_mean),
            critic_updates=float(self.learn_calls),
            actor_updates=float(self.actor_updates),
        )
        return LearnStep(list(grads.values()), stats, td_abs.numpy())

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

    def actor_loss(self, obs):
        """The actor's loss -mean(Q_1(s, mu(s))) (nothing else: None)."""
        return -tf.reduce_mean(self.critic.q1(obs, self.actor(obs))), None

    def _critic_step_fn(self, *batch):
        critic_vars = [self.variables[n] for n in self._critic_names]
        return flat_gradients(lambda: self.critic_loss(*batch), critic_vars, self.params.grad_clip)

    def _full_step_fn(self, obs, *rest):
        critic = self._critic_step_fn(obs, *rest)
        actor_vars = [self.variables[n] for n in self._actor_names]
        actor = flat_gradients(lambda: self.actor_loss(obs), actor_vars, self.params.grad_clip)
        return critic, actor


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
