"""The TensorFlow side of SAC: squashed-Gaussian policy, twin critics, temperature, losses.

Policy: (mu, log_std) = heads(MLP(s)), u = mu + sigma * z with z ~ N(0, 1), a = tanh(u), and
by the change of variables a = tanh(u) (per dimension, da/du = 1 - tanh(u)^2):
    log pi(a|s) = sum_j [log N(u_j; mu_j, sigma_j) - log(1 - tanh(u_j)^2)]
    log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u))        (exact, and stable for |u| big)
log_std is squashed smoothly into [LOG_STD_MIN, LOG_STD_MAX]:
    log_std = LOG_STD_MIN + (LOG_STD_MAX - LOG_STD_MIN) * (tanh(raw) + 1) / 2
(unlike a hard clip, it never stops the gradient).

Losses (alpha = exp(log_alpha); z, z' standard normal, given as `noise` `[2, B, A]`):
    a', logp' = pi(s'; z'),   y = R + discount * (min_i Q'_i(s', a') - alpha * logp')
    critic_loss = sum_i mean(w * (Q_i(s, a) - y)^2);  new priority = |y - Q_1(s, a)|
    a~, logp  = pi(s; z),    actor_loss = mean(alpha * logp - min_i Q_i(s, a~))
    alpha_loss = -mean(log_alpha * (logp + target_entropy))
Each loss moves only its own group (critic/, actor/, alpha/): y, alpha in the actor loss and
logp in the alpha loss are constants. Primes are local Polyak targets of the critics only.
"""

import math

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
from easyrl.algorithms.optimizers import LocalOptimizer
from easyrl.algorithms.sac.params import FLOW, Params
from easyrl.errors import ConfigError
from easyrl.models import Dense, build_torso, named_variables
from easyrl.models.flat import FlatVariables, GradientStep

LOG_STD_MIN = -5.0
"""Lower end of the policy's log standard deviation."""
LOG_STD_MAX = 2.0
"""Upper end of the policy's log standard deviation."""
_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)
_GROUPS = ("actor/", "alpha/", "critic/")
"""The variable groups, each with its own loss, in the (sorted) order of `variables`."""


def log_one_minus_tanh_sq(u: tf.Tensor) -> tf.Tensor:
    """log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), elementwise, finite for any u."""
    return 2.0 * (_LOG_2 - u - tf.nn.softplus(-2.0 * u))


def squashed_log_prob(u: tf.Tensor, mean: tf.Tensor, log_std: tf.Tensor) -> tf.Tensor:
    """log pi(tanh(u)) for u ~ N(mean, exp(log_std)) per dimension, all `[B, A]` -> `[B]`:
    sum_j [-(u - mean)^2 / (2 sigma^2) - log sigma - log(2 pi) / 2 - log(1 - tanh(u)^2)]."""
    z = (u - mean) * tf.exp(-log_std)  # [B, A]
    gaussian = -0.5 * tf.square(z) - log_std - 0.5 * _LOG_2PI  # [B, A]
    return tf.reduce_sum(gaussian - log_one_minus_tanh_sq(u), axis=-1)  # [B]


class GaussianActor(tf.Module):
    """The squashed-Gaussian policy: the model's torso (`{name}/torso`), linear `mean` and
    `log_std` heads (both started small, scale 0.1: actions near 0, log_std near the middle of
    its range)."""

    def __init__(self, obs_dim: int, action_dim: int, model, name: str, rng):
        super().__init__(name=None)
        self.torso = build_torso(model, (obs_dim,), f"{name}/torso", rng)
        width = self.torso.out_dim
        self.mean = Dense(width, action_dim, f"{name}/mean", rng, scale=0.1)
        self.log_std = Dense(width, action_dim, f"{name}/log_std", rng, scale=0.1)

    def __call__(self, obs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(mean, log_std), both `[B, A]`, of the Gaussian before the tanh."""
        h = self.torso(obs)  # [B, H]
        raw = tf.tanh(self.log_std(h))  # [B, A] in (-1, 1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (raw + 1.0)
        return self.mean(h), log_std

    def sample(self, obs: tf.Tensor, noise: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Reparameterized a = tanh(mean + sigma * noise) `[B, A]` and log pi(a|s) `[B]`."""
        mean, log_std = self(obs)
        u = mean + tf.exp(log_std) * noise  # [B, A]
        return tf.tanh(u), squashed_log_prob(u, mean, log_std)


class SAC(PolyakActorCritic):
    """SAC's pieces for the runtime: networks, acting, priorities, the losses (greedy acting,
    the critics' targets and loss and `sync_target`: `PolyakActorCritic`).

    Variables on the PS: `actor/...`, `alpha/log_alpha` (a scalar), `critic/q1/...`,
    `critic/q2/...`; the target critics `target_critic/...` stay local.

    Args:
        params: hyper-parameters.
        obs_space: a flat gymnasium Box.
        action_space: a flat gymnasium Box with finite bounds.
        model: the config's `model` section (an mlp or a custom torso).
        seed: initialisation seed (every role builds identical initial values); also seeds
            the sampling noise `learn` and `initial_priorities` draw when given none.

    Raises:
        ConfigError: unsupported spaces or model.
    """

    flow: Flow = FLOW

    def __init__(self, params: Params, obs_space, action_space, model, seed: int = 0):
        super().__init__("sac", obs_space, action_space, model)
        self.params = params
        self.target_entropy = (
            -float(self.action_dim) if params.target_entropy is None else params.target_entropy
        )
        rng = np.random.default_rng(seed)
        dims = (self.obs_dim, self.action_dim)
        try:
            self.actor = GaussianActor(*dims, model, "actor", rng)
            self.critic = Critics(*dims, model, True, "critic", rng)
            # Initial values are copied from the online critics by PolyakTargets.
            spare = np.random.default_rng(0)
            self.target_critic = Critics(*dims, model, True, "target_critic", spare)
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
        # TF's stub types `initial_value` as a Tensor; tf.Variable takes any tensor-like value.
        self.log_alpha = tf.Variable(
            np.float32(math.log(params.initial_alpha)),  # pyright: ignore[reportArgumentType]
            name="alpha/log_alpha",
        )
        self.variables = dict(
            sorted(
                {
                    **named_variables(self.actor),
                    **named_variables(self.critic),
                    "alpha/log_alpha": self.log_alpha,
                }.items()
            )
        )
        self._flat = FlatVariables(list(self.variables.values()))
        self._alpha_index = list(self.variables).index("alpha/log_alpha")
        self.polyak = PolyakTargets(
            named_variables(self.critic), named_variables(self.target_critic), params.tau
        )
        self._rng = np.random.default_rng(seed)

        obs = tf.TensorSpec([None, self.obs_dim], tf.float32)
        act = tf.TensorSpec([None, self.action_dim], tf.float32)
        vec = tf.TensorSpec([None], tf.float32)
        noise2 = tf.TensorSpec([2, None, self.action_dim], tf.float32)
        batch = [obs, act, vec, obs, vec]
        self._policy = compiled(lambda o: tf.tanh(self.actor(o)[0]), obs)  # tanh(mu(s))
        self._sample = compiled(self.actor.sample, obs, act)
        self._targets = compiled(self._targets_fn, vec, obs, vec, act)
        self._td_abs = compiled(self._td_abs_fn, *batch, act)
        self._step = GradientStep(self._step_fn, *batch, vec, noise2)

    # --- actor side ---------------------------------------------------------------------

    def collector(
        self, num_envs: int, seed: int = 0, actor_index: int = 0, num_actors: int = 1
    ) -> ContinuousCollector:
        """The actor-side collector: actions sampled from pi (uniform for the first
        `random_steps` env steps) and n-step transitions. All actors explore alike; the
        `rng` given to `act` drives the sampling."""
        return ContinuousCollector(self, num_envs, SampledPolicy(self))

    def sample(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """a = tanh(mu + sigma * noise) `[N, A]` (normalized) and log pi(a|s) `[N]`, for
        `obs` `[N, obs]` and standard-normal `noise` `[N, A]`."""
        action, logp = self._sample(np.asarray(obs, np.float32), np.asarray(noise, np.float32))
        return action.numpy(), logp.numpy()

    def initial_priorities(self, batch: dict, noise: np.ndarray | None = None) -> np.ndarray:
        """Ape-X initial priorities `[B]`: |y - Q_1(s, a)| with the actor's copies of the
        online critics standing in for the targets (an actor never syncs targets):
        y = R + discount * (min_i Q_i(s', a') - alpha * log pi(a'|s')), a' ~ pi(.|s') drawn
        with standard-normal `noise` `[B, A]` (None: from the agent's seeded generator)."""
        columns = transition_columns(batch)
        if noise is None:
            noise = self._rng.standard_normal((len(columns[0]), self.action_dim))
        return self._td_abs(*columns, np.asarray(noise, np.float32)).numpy()

    # --- learner side -------------------------------------------------------------------

    def learn(
        self, batch: dict, weights: np.ndarray | None, noise: np.ndarray | None = None
    ) -> LearnStep:
        """One gradient computation on a sampled batch (the PS applies it).

        Args:
            batch: the `replay_spec` columns, B rows.
            weights: importance weights `[B]` (None: ones); they weight the critic loss only.
            noise: standard normal `[2, B, A]`: z' for a' ~ pi(.|s') in the target, then z
                for a~ ~ pi(.|s) in the actor and alpha losses; None draws it from the
                agent's seeded generator.

        Returns:
            a LearnStep: gradients in the order of `self.variables` (the entry of
            `alpha/log_alpha` None unless `autotune_alpha`), stats, new priorities |y - Q_1|
            `[B]`.
        """
        columns = transition_columns(batch)
        size = len(columns[0])
        weights = np.ones(size, np.float32) if weights is None else weights
        if noise is None:
            noise = self._rng.standard_normal((2, size, self.action_dim), dtype=np.float32)
        flat, stats, td_abs = self._step(
            *columns, np.asarray(weights, np.float32), np.asarray(noise, np.float32)
        )
        stats = {k: float(v) for k, v in stats.items()}
        grads = self._step.gradients(flat, self._flat, self._absent())
        return LearnStep(grads, stats, td_abs.numpy())

    def _absent(self) -> tuple[int, ...]:
        """The variables `learn` leaves alone: alpha unless it is tuned."""
        return () if self.params.autotune_alpha else (self._alpha_index,)

    def fuse_update(self, optimizer: LocalOptimizer) -> bool:
        """From now on `learn`'s compiled step applies its gradients with `optimizer` and
        then takes the Polyak step of the target critics (a learner that applies its own
        updates, `easyrl.roles.publisher`, after its first `sync_target`); returns True: the
        learner no longer calls `sync_target` after each update."""
        return self._step.fuse(optimizer.traced(self._absent()), self.polyak.polyak_fn)

    # --- compiled math ------------------------------------------------------------------

    def _soft_targets(self, critic, reward, next_obs, discount, noise):
        next_action, next_logp = self.actor.sample(next_obs, noise)  # [B, A], [B]
        soft_q = min_q(critic(next_obs, next_action)) - tf.exp(self.log_alpha) * next_logp
        return reward + discount * soft_q  # [B]

    def _targets_fn(self, reward, next_obs, discount, noise):
        return self._soft_targets(self.target_critic, reward, next_obs, discount, noise)

    def _td_abs_fn(self, obs, action, reward, next_obs, discount, noise):
        y = self._soft_targets(self.critic, reward, next_obs, discount, noise)  # [B]
        return tf.abs(y - self.critic.q1(obs, action))

    def actor_loss(self, obs, noise):
        """The actor's loss for the noise z `[B, A]` of a~ ~ pi(.|s) (alpha held constant),
        with log pi(a~|s) `[B]`."""
        new_action, logp = self.actor.sample(obs, noise)  # [B, A], [B]
        q_new = min_q(self.critic(obs, new_action))  # [B]
        return tf.reduce_mean(tf.stop_gradient(tf.exp(self.log_alpha)) * logp - q_new), logp

    def alpha_loss(self, logp):
        """The temperature's loss for the actor's log pi(a~|s) `[B]` (held constant)."""
        slack = tf.stop_gradient(logp + self.target_entropy)  # [B]
        return -tf.reduce_mean(self.log_alpha * slack), None

    def _step_fn(self, obs, action, reward, next_obs, discount, weights, noise):
        clip = self.params.grad_clip  # per group: the actor's and the critics' norms differ a lot
        group = {g: [v for n, v in self.variables.items() if n.startswith(g)] for g in _GROUPS}
        critic_flat, critic_loss, (q_mean, td_abs) = flat_gradients(
            lambda: self.critic_loss(obs, action, reward, next_obs, discount, weights, noise[0]),
            group["critic/"],
            clip,
        )
        actor_flat, actor_loss, logp = flat_gradients(
            lambda: self.actor_loss(obs, noise[1]), group["actor/"], clip
        )
        alpha_flat, _, _ = flat_gradients(lambda: self.alpha_loss(logp), group["alpha/"], 0.0)
        stats = {
            "critic_loss": critic_loss,
            "actor_loss": actor_loss,
            "alpha": tf.exp(self.log_alpha),
            "entropy": -tf.reduce_mean(logp),
            "q_mean": q_mean,
        }
        # The groups in the (sorted) order of `variables`.
        return tf.concat([actor_flat, alpha_flat, critic_flat], axis=0), stats, td_abs


class SampledPolicy:
    """SAC exploration: a ~ pi(.|s), a = tanh(mu + sigma * z) with z drawn from the actor's
    rng; no state between steps."""

    def __init__(self, agent: SAC):
        self.agent = agent

    def __call__(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Normalized sampled actions `[N, A]` for `obs` `[N, obs]`."""
        noise = rng.standard_normal((len(obs), self.agent.action_dim))  # [N, A]
        return self.agent.sample(obs, noise)[0]

    def reset(self, done: np.ndarray) -> None:
        """Nothing to reset: the samples are independent across steps."""
        del done

    def stats(self) -> dict[str, float]:
        """No exploration parameters to report."""
        return {}
