"""The TensorFlow side that the off-policy continuous-control algorithms share (TD3 / DDPG,
SAC; their numpy side is the package, `easyrl.algorithms.continuous`); imported by their
`agent.py` only: it imports TensorFlow.

The `PolyakActorCritic` base, twin `Critics` and `min_q`, `PolyakTargets`, `scaled_greedy_fn`,
`transition_columns` and the actors' `ContinuousCollector`.
"""

import functools

import numpy as np
import tensorflow as tf

from easyrl.algorithms.agent_parts import compiled
from easyrl.algorithms.continuous import check_spaces, scale_actions
from easyrl.algorithms.nstep import NStepAccumulator
from easyrl.errors import EasyRLError
from easyrl.models import Dense, build_torso
from easyrl.models.flat import Compiled


def transition_columns(batch: dict) -> tuple[np.ndarray, ...]:
    """The columns of a batch of transitions as the compiled functions take them:
    (obs [B, obs], normalized action [B, A], reward [B], next_obs [B, obs], discount [B])."""
    return tuple(
        np.asarray(batch[k], np.float32)
        for k in ("obs", "action", "reward", "next_obs", "discount")
    )


class Critic(tf.Module):
    """Q(s, a): the model's torso (`{name}/torso`, on inputs of shape `(obs + A,)`) on
    concat(obs, action) and a linear output, `[B]`."""

    def __init__(self, obs_dim: int, action_dim: int, model, name: str, rng):
        super().__init__(name=None)
        self.torso = build_torso(model, (obs_dim + action_dim,), f"{name}/torso", rng)
        self.out = Dense(self.torso.out_dim, 1, f"{name}/out", rng)

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
        self._copy = compiled(self._copy_fn)
        self._polyak = compiled(self.polyak_fn)
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

    def polyak_fn(self) -> None:
        """The Polyak step, to trace into a compiled call (`update` compiles it alone)."""
        for src, dst in self.pairs:
            dst.assign(self.tau * src + (1.0 - self.tau) * dst)


def scaled_greedy_fn(normalized_action, low: np.ndarray, high: np.ndarray, obs_dim: int):
    """A deterministic policy as one compiled function with a fixed input signature
    (observations `[N, obs_dim]` float32 in, actions `[N, A]` float32 out), what
    `easyrl export` saves as a SavedModel: `normalized_action(obs)` in [-1, 1] scaled to the
    bounds in float64 as `scale_actions` does, so both give the same actions."""
    low_t = tf.constant(low.astype(np.float64))  # [A]
    high_t = tf.constant(high.astype(np.float64))

    def greedy(obs):
        a = tf.clip_by_value(tf.cast(normalized_action(obs), tf.float64), -1.0, 1.0)  # [N, A]
        scaled = tf.clip_by_value(low_t + (a + 1.0) * 0.5 * (high_t - low_t), low_t, high_t)
        return tf.cast(scaled, tf.float32)

    return compiled(greedy, tf.TensorSpec([None, obs_dim], tf.float32))


class PolyakActorCritic:
    """The common side of TD3/DDPG and SAC: actions normalized to [-1, 1]^A inside the
    algorithm, scaled to the Box bounds for the env only; critics learn targets y from local
    target networks, Polyak-averaged after every update.

    A subclass builds `critic` (`Critics`) and `polyak` (`PolyakTargets`), defines
    `_targets_fn(reward, next_obs, discount, noise)` (y `[B]`), and compiles it as `_targets`
    and its deterministic policy (normalized actions for float32 observations) as `_policy`.

    Args:
        name: the algorithm name, for error messages.
        obs_space: a flat Box.
        action_space: a flat Box with finite bounds.
        model: the config's `model` section (an mlp or a custom torso).

    Raises:
        ConfigError: unsupported spaces or model.
    """

    target_update_period = 1
    """`sync_target` (a Polyak step) after every update."""
    critic: Critics
    polyak: PolyakTargets
    _policy: Compiled
    _targets: Compiled

    def __init__(self, name: str, obs_space, action_space, model):
        check_spaces(name, obs_space, action_space, model)
        self.obs_dim = int(obs_space.shape[0])
        self.action_dim = int(action_space.shape[0])
        self.low = np.asarray(action_space.low, np.float32)  # [A]
        self.high = np.asarray(action_space.high, np.float32)  # [A]

    def policy(self, obs: np.ndarray) -> np.ndarray:
        """Normalized deterministic actions `[N, A]` in [-1, 1] for `obs` `[N, obs]`."""
        return self._policy(np.asarray(obs, np.float32)).numpy()

    def scale(self, normalized: np.ndarray) -> np.ndarray:
        """Normalized actions `[N, A]` mapped to the env's bounds (float32)."""
        return scale_actions(normalized, self.low, self.high)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Evaluation actions `[N, A]`: `policy` scaled to the bounds."""
        return self.scale(self.policy(obs))

    @functools.cached_property
    def greedy_fn(self) -> Compiled:
        """`greedy` as one compiled function (see `scaled_greedy_fn`)."""
        return scaled_greedy_fn(self._policy, self.low, self.high, self.obs_dim)

    def targets(self, batch: dict, noise: np.ndarray) -> np.ndarray:
        """Critic targets y `[B]` of a batch of transitions for the standard-normal `noise`
        `[B, A]` of the next actions."""
        _, _, reward, next_obs, discount = transition_columns(batch)
        return self._targets(reward, next_obs, discount, np.asarray(noise, np.float32)).numpy()

    def sync_target(self) -> None:
        """Polyak step of the target networks, in one compiled call (the first call copies;
        see `PolyakTargets`)."""
        self.polyak.update()

    def critic_loss(self, obs, action, reward, next_obs, discount, weights, noise):
        """The critics' loss sum_i mean(w * (Q_i(s, a) - y)^2), y from `_targets_fn` with the
        next actions' `noise` `[B, A]`, with (mean Q_1(s, a), the new priorities
        |y - Q_1(s, a)| `[B]`)."""
        y = tf.stop_gradient(self._targets_fn(reward, next_obs, discount, noise))  # [B]
        qs = self.critic(obs, action)  # each [B]
        loss = tf.add_n([tf.reduce_mean(weights * tf.square(q - y)) for q in qs])
        return loss, (tf.reduce_mean(qs[0]), tf.abs(y - qs[0]))

    def _targets_fn(self, reward, next_obs, discount, noise) -> tf.Tensor:
        raise NotImplementedError


class ContinuousCollector:
    """An actor's side of an off-policy Box-action algorithm: `explorer` picks normalized
    actions in [-1, 1] (uniform random ones for the first `random_steps` env steps), the env
    gets them scaled to its bounds, the replay gets them normalized, as n-step transitions
    (float32 observations and actions `[A]`).

    Protocol per vector step: `act(obs, rng)`, then `observe(...)`, which returns the
    transitions completed by that step (or None).

    Args:
        agent: has `params` (`n_step`, `gamma`, `random_steps`), `obs_dim`, `action_dim` and
            `scale`.
        num_envs: envs stepped together.
        explorer: `explorer(obs, rng) -> [N, A]` normalized actions, with `reset(done)` (called
            with each step's `[N]` episode ends) and `stats()`.
    """

    def __init__(self, agent, num_envs: int, explorer):
        self.agent = agent
        self.num_envs = num_envs
        self.explorer = explorer
        p, dims = agent.params, ((agent.obs_dim,), np.float32, (agent.action_dim,), np.float32)
        self.nstep = NStepAccumulator(num_envs, p.n_step, p.gamma, *dims)
        self.env_steps = 0
        # Not recorded: the actions are clipped and scaled.
        self.last_action_logp: np.ndarray | None = None
        self._obs: np.ndarray | None = None
        self._actions: np.ndarray | None = None

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
        if self._obs is None or self._actions is None:
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
