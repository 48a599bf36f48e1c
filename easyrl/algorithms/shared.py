"""TensorFlow pieces that more than one algorithm's agent uses; imported by `agent.py` modules
only (it imports TensorFlow).

- Every agent: `compiled` functions, the gradient step (`flat_gradients`: tape, loss,
  gradients, global-norm clip, one flat vector), `CompiledGreedy` (greedy acting and its
  export), `NoTargetNetwork` and `checked_columns` (a batch checked against its columns).
- Off-policy continuous control (TD3/DDPG and SAC): the `PolyakActorCritic` base, twin
  `Critics`, `PolyakTargets`, `scaled_greedy_fn`, `transition_columns`, `ContinuousCollector`.
- PPO's networks, which MARWIL and BC build too: `ObsNorm`, `PolicyNet`, `ValueNet`.
"""

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any, cast

import gymnasium as gym
import numpy as np
import tensorflow as tf

from easyrl.algorithms.continuous import check_spaces, scale_actions
from easyrl.algorithms.contract import Agent, RecurrentAgent
from easyrl.algorithms.masking import features, masked
from easyrl.algorithms.nstep import NStepAccumulator
from easyrl.envs import EpisodicPolicy, Stateless
from easyrl.errors import EasyRLError
from easyrl.models import Compiled, Dense, build_torso

_LOG_2PI = math.log(2.0 * math.pi)

# --- every agent -----------------------------------------------------------------------------


def compiled(fn: Callable, *signature: tf.TensorSpec) -> Compiled:
    """`fn` compiled with a fixed input signature (`easyrl.models.Compiled`)."""
    return Compiled(fn, *signature)


def gradients(
    loss_fn: Callable[[], tuple[tf.Tensor, Any]], variables: Iterable[tf.Variable]
) -> tuple[list, tf.Tensor, Any]:
    """The gradients of a loss, inside a compiled function.

    Args:
        loss_fn: `() -> (loss, aux)`, run under the tape: the scalar loss, and what else the
            step hands back (stats, priorities), untouched.
        variables: the variables to differentiate, in gradient order.

    Returns:
        (gradients, one per variable, zeros where the loss does not reach it; loss; aux).
    """
    variables = list(variables)
    with tf.GradientTape() as tape:
        loss, aux = loss_fn()
    grads = tape.gradient(loss, variables)
    return [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)], loss, aux


def flatten(grads: list[tf.Tensor], clip: float) -> tf.Tensor:
    """Gradients as one flat vector, clipped to global norm `clip` first (0: no clip)."""
    if clip > 0:
        grads, _ = tf.clip_by_global_norm(grads, clip)
    return tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)


def flat_gradients(
    loss_fn: Callable[[], tuple[tf.Tensor, Any]], variables: Iterable[tf.Variable], clip: float
) -> tuple[tf.Tensor, tf.Tensor, Any]:
    """An agent's gradient step, inside its compiled function: `gradients` of `loss_fn()`'s
    loss, then `flatten`ed with global-norm clip `clip` (0: no clip).

    Returns:
        (flat gradients `[P]` in the order of `variables`, loss, the loss_fn's aux).
    """
    grads, loss, aux = gradients(loss_fn, variables)
    return flatten(grads, clip), loss, aux


class CompiledGreedy:
    """Greedy acting through the agent's compiled `_greedy` (a batch of observations in,
    deterministic actions out, one fixed input signature)."""

    _greedy: Any  # a `compiled` function

    state_size: int = 0
    """Floats in one env's recurrent state; 0: a stateless policy (a `RecurrentAgent` built
    with `model.lstm` sets it)."""

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions for a batch of observations (evaluation).

        Raises:
            EasyRLError: the policy is recurrent (`state_size` > 0): it acts with a state,
                through `greedy_policy(algo, recurrent=True)` (see `greedy_step`).
        """
        if self.state_size:
            raise EasyRLError(
                "a policy with model.lstm acts with a recurrent state: play it "
                "through easyrl.algorithms.shared.greedy_policy(algo, recurrent=True)"
            )
        return self._greedy(np.asarray(obs, self._obs_dtype())).numpy()

    def greedy_step(self, obs: np.ndarray, state: np.ndarray, first: np.ndarray) -> tuple:
        """A recurrent policy's greedy step (its `_greedy` takes obs, state, first):
        (actions `[N]`, next state) for `obs` `[N, ...]`, the state and the episode-start
        flags `first` `[N]`."""
        state, first = np.asarray(state, np.float32), np.asarray(first, np.float32)
        action, next_state = self._greedy(np.asarray(obs, self._obs_dtype()), state, first)
        return action.numpy(), next_state.numpy()

    def _obs_dtype(self):
        return self._greedy.input_signature[0].dtype.as_numpy_dtype

    @property
    def greedy_fn(self) -> Compiled:
        """The compiled function `greedy` calls, with its fixed input signature (a batch of
        observations in, actions out); `easyrl export` saves it as a SavedModel."""
        return self._greedy


def greedy_policy(algo: Agent, recurrent: bool) -> EpisodicPolicy:
    """The deterministic policy evaluation plays on a vector of envs: `algo.greedy`, or for a
    `RecurrentAgent` (`recurrent`: built with `model.lstm`) a fresh `RecurrentGreedy` (zero
    state)."""
    if recurrent:
        return RecurrentGreedy(cast(RecurrentAgent, algo))
    return Stateless(algo.greedy)


class RecurrentGreedy:
    """A recurrent agent's greedy policy over one vector of envs, its state carried per env.

    Call it with the envs' observations; `end_episodes(done)` after each env step tells it
    which envs' episodes ended (same-step autoreset: their next observation starts a new
    episode, whose step starts from the zero state).

    Args:
        algo: the recurrent agent.
    """

    def __init__(self, algo: RecurrentAgent):
        self.algo = algo
        self._state: np.ndarray | None = None
        self._first: np.ndarray | None = None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self._state is None or self._first is None or len(self._state) != len(obs):
            self._state = np.zeros((len(obs), self.algo.state_size), np.float32)
            self._first = np.ones(len(obs), np.float32)
        action, self._state = self.algo.greedy_step(obs, self._state, self._first)
        self._first = np.zeros(len(obs), np.float32)
        return action

    def end_episodes(self, done: np.ndarray) -> None:
        """Marks the envs whose episode ended on the last step: their state restarts."""
        if self._first is not None:
            self._first = np.maximum(self._first, np.asarray(done, np.float32).reshape(-1))


class NoTargetNetwork:
    """Base of a replay agent without a target network (IMPALA/A3C, LinUCB, MARWIL/BC): its
    `target_update_period` is 0, so the learner never syncs, and `sync_target` has nothing to
    copy."""

    target_update_period = 0
    """No target network: the runtime never syncs one."""

    def sync_target(self) -> None:
        """Nothing to copy: there is no target network."""


def checked_columns(name: str, spec: dict, batch: dict) -> list[np.ndarray]:
    """The `spec` columns ({column: (per-item shape, dtype)}) of `batch`, in the spec's order
    and dtypes, all as long as the first.

    Raises:
        EasyRLError: a column is missing or has a wrong shape (the message starts with `name`).
    """
    missing = [c for c in spec if c not in batch]
    if missing:
        raise EasyRLError(f"{name} batch lacks columns {missing}")
    n, arrays = len(batch[next(iter(spec))]), []
    for column, (shape, dtype) in spec.items():
        array = np.asarray(batch[column], dtype)
        if array.shape != (n, *shape):
            raise EasyRLError(
                f"{name} batch column {column!r} must be {(n, *shape)}, got {array.shape}"
            )
        arrays.append(array)
    return arrays


# --- off-policy continuous control (TD3 / DDPG, SAC) ----------------------------------------


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
        self._polyak = compiled(self._polyak_fn)
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


# --- PPO's networks (PPO, MARWIL / BC) -------------------------------------------------------


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
