"""Actor-side n-step return accumulation over a vector of environments.

An actor steps ``N`` environments in lock-step and feeds every vector step to a
:class:`NStepAccumulator`, which turns the 1-step stream into n-step transitions
``(s_t, a_t, R_t, s_{t+m}, discount)`` with

    R_t = sum_{k=0}^{m-1} gamma^k r_{t+k},    discount = gamma^m (0 if the episode terminated),

where ``m = n`` normally and ``m < n`` when the episode ended before ``n`` further steps were
available. The learner's target is then ``R_t + discount * max_a Q(s_{t+m}, a)``. Truncation
(a time limit) is not termination: its transitions keep ``discount = gamma^m`` and bootstrap
from the final observation.

Given the acting network's values, it also gives each transition its Ape-X initial priority
``|R_t + discount * V(s_{t+m}) - Q(s_t, a_t)|`` (``add``'s ``value`` and ``next_value``), so
that an actor need not run the network again over what it ships.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from easyrl.errors import ConfigError, EasyRLError

__all__ = ["PRIORITY", "NStepAccumulator"]

PRIORITY = "initial_priority"
"""Key of the transitions' initial priorities in `NStepAccumulator.add`'s output (and in a
collector's; `easyrl.roles.actor.Actor.ship` takes them out of the batch it stores)."""


def _check_pos_int(name: str, value: object) -> int:
    """Checks that a constructor argument is a positive int.

    Args:
        name: Argument name, for the error message.
        value: The value to check.

    Returns:
        The value as a Python int.

    Raises:
        ConfigError: `value` is not a positive int (bools are rejected).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_shape(name: str, value: object) -> tuple[int, ...]:
    """Checks that a constructor argument is a shape (a sequence of non-negative ints).

    Args:
        name: Argument name, for the error message.
        value: The value to check.

    Returns:
        The shape as a tuple of Python ints.

    Raises:
        ConfigError: `value` is not a tuple/list of non-negative ints.
    """
    if not isinstance(value, tuple | list) or not all(
        not isinstance(d, bool) and isinstance(d, int | np.integer) and d >= 0 for d in value
    ):
        raise ConfigError(f"{name} must be a tuple of non-negative ints, got {value!r}")
    return tuple(int(d) for d in value)


def _check_dtype(name: str, value: DTypeLike) -> np.dtype:
    """Checks that a constructor argument names a numpy dtype.

    Args:
        name: Argument name, for the error message.
        value: Anything ``np.dtype`` accepts.

    Returns:
        The numpy dtype.

    Raises:
        ConfigError: `value` is not a valid dtype, or is the object dtype.
    """
    try:
        dtype = np.dtype(value)
    except TypeError as exc:
        raise ConfigError(f"{name} is not a numpy dtype: {value!r}") from exc
    if dtype.hasobject:
        raise ConfigError(f"{name} must not be an object dtype, got {dtype}")
    return dtype


class NStepAccumulator:
    """Turns per-step vector-env experience into n-step transitions, per environment.

    For each of the ``N`` environments it keeps the last up-to-``n`` pending
    ``(obs, action, reward)`` entries in preallocated ring buffers ``[n, N, ...]``. After the
    step at time ``t`` is appended:

    * terminated: every pending entry is emitted (its ``m`` = steps to the episode end,
      ``discount = 0``, ``next_obs`` = the final observation) and the history is cleared;
    * truncated (and not terminated): every pending entry is emitted with
      ``discount = gamma^m`` and ``next_obs`` = the final observation, and the history is
      cleared;
    * otherwise, once ``n`` entries are pending, the oldest is emitted (``m = n``,
      ``discount = gamma^n``, ``next_obs`` = this step's `next_obs`) and dropped.

    The common (not done) path is vectorized across environments; only done environments are
    handled in a Python loop.

    Output order of :meth:`add`: first the ``m = n`` transitions of environments that are not
    done, in ascending environment index; then the flushed entries of each done environment,
    in ascending environment index and, within one environment, oldest entry first.

    Args:
        num_envs: Number of environments ``N`` stepped together.
        n: Return horizon, at least 1 (``n = 1`` gives ordinary 1-step transitions).
        gamma: Discount factor in ``[0, 1]``.
        obs_shape: Shape of one observation.
        obs_dtype: Dtype observations are stored and returned as.
        action_shape: Shape of one action (``()`` for discrete actions).
        action_dtype: Dtype actions are stored and returned as.

    Raises:
        ConfigError: An argument is out of range or of the wrong type.
    """

    def __init__(
        self,
        num_envs: int,
        n: int,
        gamma: float,
        obs_shape: tuple,
        obs_dtype: DTypeLike,
        action_shape: tuple = (),
        action_dtype: DTypeLike = np.int64,
    ) -> None:
        self._num_envs = _check_pos_int("num_envs", num_envs)
        self._n = _check_pos_int("n", n)
        if (
            isinstance(gamma, bool)
            or not isinstance(gamma, int | float | np.integer | np.floating)
            or not 0.0 <= float(gamma) <= 1.0  # NaN fails too
        ):
            raise ConfigError(f"gamma must be a float in [0, 1], got {gamma!r}")
        self._gamma = float(gamma)
        self._obs_shape = _check_shape("obs_shape", obs_shape)
        self._obs_dtype = _check_dtype("obs_dtype", obs_dtype)
        self._action_shape = _check_shape("action_shape", action_shape)
        self._action_dtype = _check_dtype("action_dtype", action_dtype)

        big_n, n = self._num_envs, self._n
        # Time-indexed rings: step t of every environment lies in slot t % n, so appending and
        # emitting are slices (the environments step together); an environment's pending
        # entries are its last `count` steps.
        self._obs = np.zeros((n, big_n, *self._obs_shape), self._obs_dtype)  # [n, N, *obs]
        self._action = np.zeros((n, big_n, *self._action_shape), self._action_dtype)  # [n, N, *a]
        self._reward = np.zeros((n, big_n), np.float64)  # [n, N]
        self._value = np.zeros((n, big_n), np.float64)  # [n, N] Q(s_t, a_t) when given
        self._t = 0  # steps added so far
        self._count = np.zeros(big_n, np.int64)  # [N] pending entries, always < n between adds
        self._powers = self._gamma ** np.arange(n + 1, dtype=np.float64)  # [n + 1]
        self._orders = (np.arange(n)[:, None] + np.arange(n)) % n  # [n, n] slots from each slot

    @property
    def pending(self) -> np.ndarray:
        """Number of pending (not yet emitted) entries per environment.

        Returns:
            A copy, ``[N]`` int64, each value in ``[0, n - 1]``.
        """
        return self._count.copy()

    def reset(self) -> None:
        """Drops every pending entry of every environment, emitting nothing.

        Use it when the actor cuts its episodes (e.g. it resets the environments itself).
        """
        self._count[:] = 0

    def _check(self, name: str, value: object, shape: tuple[int, ...]) -> np.ndarray:
        """Converts a step argument to an array and checks its shape.

        Args:
            name: Argument name, for the error message.
            value: The array-like argument.
            shape: The expected shape.

        Returns:
            The argument as a numpy array.

        Raises:
            EasyRLError: The shape differs from `shape`.
        """
        arr = np.asarray(value)
        if arr.shape != shape:
            raise EasyRLError(f"{name} must have shape {shape}, got {arr.shape}")
        return arr

    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        value: np.ndarray | None = None,
        next_value: np.ndarray | None = None,
    ) -> dict[str, np.ndarray] | None:
        """Appends one vector step and returns the n-step transitions it completes.

        Args:
            obs: ``s_t`` of every environment, ``[N, *obs_shape]``.
            action: ``a_t``, ``[N, *action_shape]``.
            reward: ``r_t``, ``[N]``.
            next_obs: The true ``s_{t+1}``, ``[N, *obs_shape]``: for done environments the
                final observation, not the reset one (see ``easyrl.envs.final_observations``).
            terminated: ``[N]`` bool, the episode reached a terminal state.
            truncated: ``[N]`` bool, the episode was cut (time limit); ignored where
                `terminated` is set.
            value: ``Q(s_t, a_t)`` ``[N]`` (with `next_value`: the transitions then carry
                their initial priorities).
            next_value: ``V(s_{t+1})`` ``[N]`` of `next_obs` (ignored where `terminated`).

        Returns:
            None if no transition was completed, else a dict of ``M >= 1`` rows (order in the
            class docstring): ``obs [M, *obs_shape]`` (obs_dtype), ``action
            [M, *action_shape]`` (action_dtype), ``reward [M]`` float32, ``next_obs
            [M, *obs_shape]`` (obs_dtype), ``discount [M]`` float32; with `value`,
            ``PRIORITY [M]`` float32: ``|reward + discount * V - Q|``, V the `next_value` of
            the step that completed the transition (0 where the episode terminated), Q the
            `value` of its first step.

        Raises:
            EasyRLError: An argument's shape does not match the constructor's.
        """
        big_n, n = self._num_envs, self._n
        obs = self._check("obs", obs, (big_n, *self._obs_shape))
        action = self._check("action", action, (big_n, *self._action_shape))
        reward = self._check("reward", reward, (big_n,))
        next_obs = self._check("next_obs", next_obs, (big_n, *self._obs_shape))
        terminated = np.asarray(self._check("terminated", terminated, (big_n,)), bool)  # [N]
        truncated = np.asarray(self._check("truncated", truncated, (big_n,)), bool)  # [N]
        done = terminated | truncated  # [N]
        values = None  # (Q [N], V [N]) when given
        if value is not None:
            boot = self._check("next_value", next_value, (big_n,))
            values = self._check("value", value, (big_n,)), np.where(terminated, 0.0, boot)

        # Append step t to every environment's ring.
        t = self._t
        self._t += 1
        slot = t % n
        self._obs[slot] = obs
        self._action[slot] = action
        self._reward[slot] = reward
        if values is not None:
            self._value[slot] = values[0]
        self._count += 1

        parts: list[tuple[np.ndarray, ...]] = []

        # Not done and n entries pending: emit the oldest entry (step t - n + 1) with m = n.
        full = np.flatnonzero((self._count == n) & ~done)  # [F]
        if full.size:
            old = (t + 1) % n  # slot of step t - n + 1
            rewards = self._powers[:n] @ self._reward[self._orders[old]][:, full]  # [F]
            oldest = (
                self._obs[old, full],  # [F, *obs_shape]
                self._action[old, full],  # [F, *action_shape]
                rewards,  # [F]
                next_obs[full],  # [F, *obs_shape]
                np.full(full.size, self._powers[n]),  # [F]
            )
            if values is not None:
                oldest += (self._value[old, full], values[1][full])  # [F], [F]
            parts.append(oldest)
            self._count[full] -= 1

        # Done: flush every pending entry, oldest first (loop over done environments only).
        for e in np.flatnonzero(done):
            count = int(self._count[e])
            ring = (t - count + 1 + np.arange(count)) % n  # [C] slots of steps t-C+1..t
            rewards = self._reward[ring, e]  # [C]
            returns = np.empty(count, np.float64)  # [C]
            acc = 0.0
            for j in range(count - 1, -1, -1):
                acc = rewards[j] + self._gamma * acc
                returns[j] = acc
            steps = count - np.arange(count)  # [C] m of each entry
            discount = np.zeros(count) if terminated[e] else self._powers[steps]  # [C]
            flushed = (
                self._obs[ring, e],  # [C, *obs_shape]
                self._action[ring, e],  # [C, *action_shape]
                returns,
                np.repeat(next_obs[e][None], count, axis=0).astype(self._obs_dtype),
                discount,
            )
            if values is not None:
                flushed += (self._value[ring, e], np.full(count, values[1][e]))  # [C], [C]
            parts.append(flushed)
            self._count[e] = 0

        if not parts:
            return None
        if len(parts) == 1:
            obs_out, act_out, rew_out, next_out, disc_out, *valued = parts[0]
        else:
            obs_out, act_out, rew_out, next_out, disc_out, *valued = (
                np.concatenate(col, axis=0) for col in zip(*parts)
            )
        out = {
            "obs": obs_out.astype(self._obs_dtype, copy=False),  # [M, *obs_shape]
            "action": act_out.astype(self._action_dtype, copy=False),  # [M, *action_shape]
            "reward": rew_out.astype(np.float32),  # [M]
            "next_obs": next_out.astype(self._obs_dtype, copy=False),  # [M, *obs_shape]
            "discount": disc_out.astype(np.float32),  # [M]
        }
        if valued:
            q, v = valued  # [M], [M]
            out[PRIORITY] = np.abs(rew_out + disc_out * v - q).astype(np.float32)  # [M]
        return out
