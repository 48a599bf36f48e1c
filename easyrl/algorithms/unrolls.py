"""Actor-side unroll collection shared by the IMPALA, PPO and R2D2 collectors (numpy only):
the one `SequenceCollector` they derive from, and the `UnrollAccumulator` it keeps its steps
in.

A `SequenceCollector` does what every sequence agent's collector does: checks the inputs,
carries the recurrent state per env (empty for a feed-forward policy), records the columns of
each step and hands out the batch when an unroll completes. An agent gives three hooks:
`step(obs, state, first, rng) -> (env actions, columns to record, next state or None)` (its
policy's step), `outcome(...)` (the columns of a step's result; default reward and
discount = gamma * (1 - done)) and `finish(next_obs, real_next_obs)` (the batch; default
every column batch-major, the observations with the bootstrap one, and the recurrent
columns).

An `UnrollAccumulator` keeps, for N envs stepping together:
- the recurrent state per env (`state` `[N, S]`, S = 0 for a feed-forward policy) and the
  episode-start flags of the next step (`first` `[N]`: 1 at the first step, then where the
  previous step ended an episode); the policy resets its state where `first` is 1;
- time-major buffers `[T, N, ...]` of named columns, written row by row as circular buffers
  (row = step % T), so that unrolls of T steps may overlap (a new one every `period` steps,
  R2D2) or follow each other (`period` = T, IMPALA and PPO);
- each unroll's initial state (the state before its step 0, before that step's reset) and
  its episode-start flags, with the flag of the bootstrap step after step T-1 when asked.

Protocol per vector step: `expect_act()`, the policy's step from (`state`, `first`),
`record_act(next_state, **columns)`, then `expect_observe()` and
`record_outcome(done, **columns)`, which says whether an unroll is complete; read it then
with `batch_major` / `time_major` / `recurrent`, before the next step.
"""

from collections.abc import Mapping

import numpy as np

from easyrl.envs.flat import legal_actions
from easyrl.errors import EasyRLError

Columns = Mapping[str, tuple[tuple[int, ...], np.dtype | type]]
"""Per-step columns: name -> (shape of one env's value, dtype)."""


class UnrollAccumulator:
    """Cuts the steps of `num_envs` envs into unrolls of `length` steps, one per env, a new
    one every `period` steps (default `length`: back to back).

    Args:
        num_envs: N, envs in the vector env.
        length: T, steps per unroll.
        columns: per-step columns, name -> (shape of one env's value, dtype).
        state_size: S, width of the recurrent state per env (0: feed-forward).
        period: steps between the starts of two unrolls, in [1, T].

    Raises:
        EasyRLError: `num_envs`, `length` or `period` out of range.
    """

    def __init__(
        self,
        num_envs: int,
        length: int,
        columns: Columns,
        state_size: int = 0,
        period: int | None = None,
    ):
        if num_envs < 1:
            raise EasyRLError(f"num_envs must be positive, got {num_envs}")
        if length < 1:
            raise EasyRLError(f"an unroll's length must be positive, got {length}")
        period = length if period is None else period
        if not 1 <= period <= length:
            raise EasyRLError(f"period must be in [1, {length}], got {period}")
        self.num_envs, self.length, self.period = num_envs, length, period
        n = num_envs
        self._buffers = {
            name: np.zeros((length, n, *shape), dtype) for name, (shape, dtype) in columns.items()
        }
        self.columns = list(columns)
        """The column names, in the order given."""
        self._firsts = np.zeros((length, n), np.float32)
        self._states = np.zeros((length, n, state_size), np.float32)  # at unroll starts
        self.state = np.zeros((n, state_size), np.float32)
        """`[N, S]`: the state each env's next step starts from (before its reset)."""
        self.first = np.ones(n, np.float32)
        """`[N]`: 1 where the next step starts an episode (every env at the first step)."""
        self.steps = 0
        """Vector steps observed since construction or `clear`."""
        self.acted = False
        """Whether the current step's `record_act` came (its outcome is awaited)."""

    @property
    def row(self) -> int:
        """The buffer row of the current step."""
        return self.steps % self.length

    @property
    def complete(self) -> bool:
        """Whether the last step observed ends an unroll."""
        done_steps = self.steps - self.length
        return done_steps >= 0 and done_steps % self.period == 0

    def expect_act(self) -> None:
        """Raises EasyRLError when the current step was acted on already."""
        if self.acted:
            raise EasyRLError("act called twice without observe")

    def expect_observe(self) -> None:
        """Raises EasyRLError when no act preceded this outcome."""
        if not self.acted:
            raise EasyRLError("observe called without a preceding act")

    def record_act(self, next_state: np.ndarray | None = None, **values) -> None:
        """Stores the current step's acting columns `values` (`[N, ...]` each), its
        episode-start flags and (at an unroll's start) the state it started from;
        `next_state` `[N, S]` (the policy's state after the step) becomes `state`."""
        row = self.row
        if self.steps % self.period == 0:
            self._states[row] = self.state
        self._firsts[row] = self.first
        for name, value in values.items():
            self._buffers[name][row] = value
        if next_state is not None:
            self.state = next_state
        self.acted = True

    def record_outcome(self, done: np.ndarray, **values) -> bool:
        """Stores the current step's outcome columns `values` and ends the step: where
        `done` `[N]` (terminated or truncated), the next step starts an episode.

        Returns:
            Whether an unroll ends with this step (read it before the next step).
        """
        row = self.row
        for name, value in values.items():
            self._buffers[name][row] = value
        self.first = done.astype(np.float32)
        self.acted = False
        self.steps += 1
        return self.complete

    def clear(self) -> None:
        """Drops the unroll being collected (and an awaited outcome): the next step is step
        0 of a new one. The state and episode-start flags carry on (the episodes go on)."""
        self.steps = 0
        self.acted = False

    def _start(self) -> int:
        """The buffer row of the last unroll's step 0 (its oldest)."""
        return self.steps % self.length

    def time_major(self, name: str) -> np.ndarray:
        """Column `name` of the last unroll, oldest step first: a new array `[T, N, ...]`."""
        return np.roll(self._buffers[name], -self._start(), axis=0)

    def batch_major(self, name: str, bootstrap: np.ndarray | None = None) -> np.ndarray:
        """Column `name` of the last unroll batch-major: a new C-contiguous array
        `[N, T, ...]`, or `[N, T + 1, ...]` with the bootstrap step's `bootstrap` `[N, ...]`
        (e.g. the observation after step T-1) as step T."""
        return _batch_major(self._buffers[name], self._start(), bootstrap)

    def recurrent(self, bootstrap: bool) -> dict[str, np.ndarray]:
        """The last unroll's recurrent columns, new arrays: `state` `[N, S]`, the state
        before step 0, and `first` `[N, T]` (`[N, T + 1]` with `bootstrap`: the flags of
        the step after step T-1 too), 1 where a step starts an episode."""
        start = self._start()
        last = self.first if bootstrap else None
        return {
            "state": self._states[start].copy(),
            "first": _batch_major(self._firsts, start, last),
        }


def _batch_major(buffer: np.ndarray, start: int, bootstrap: np.ndarray | None) -> np.ndarray:
    """Circular time-major `buffer` `[T, N, ...]` read from row `start` on, as a new array
    `[N, T (+ 1), ...]`, `bootstrap` `[N, ...]` appended as the last step when given."""
    length, n = buffer.shape[:2]
    out = np.empty((n, length + (bootstrap is not None), *buffer.shape[2:]), buffer.dtype)
    head = length - start
    out[:, :head] = np.swapaxes(buffer[start:], 0, 1)
    out[:, head:length] = np.swapaxes(buffer[:start], 0, 1)
    if bootstrap is not None:
        out[:, length] = bootstrap
    return out


class SequenceCollector:
    """An actor's collector for a sequence agent (module docstring): `act(obs, rng)`, then
    `observe(...)`, repeated; the `observe` that completes an unroll returns its batch.
    Episodes continue across unrolls (`resets_envs = False`); each unroll carries the state
    before its step 0 and its episode-start flags (`UnrollAccumulator`).

    Args:
        num_envs: envs in the vector env.
        length: T, steps per unroll.
        columns: the columns `step` and `outcome` record besides "obs".
        obs_shape: one env's observation shape; obs_dtype: its dtype.
        gamma: the discount of the default `outcome`.
        state_size: width of the policy's recurrent state per env (0: feed-forward).
        period: steps between the starts of two unrolls (default T: back to back).
        mask_size: trailing action-mask features of an observation (0: none); `act`
            refuses an observation whose mask allows no action.

    Raises:
        EasyRLError: `num_envs`, `length` or `period` out of range.
    """

    resets_envs = False
    """Episodes continue across unrolls: the runtime never resets the envs for a new one."""
    last_action_logp: np.ndarray | None = None
    """Behaviour log-probabilities `[N]` of the last `act` (None: the unrolls carry what
    replaces them, e.g. IMPALA's logits)."""

    def __init__(
        self,
        num_envs: int,
        length: int,
        columns: Columns,
        obs_shape: tuple[int, ...],
        obs_dtype,
        gamma: float = 1.0,
        state_size: int = 0,
        period: int | None = None,
        mask_size: int = 0,
    ):
        self.num_envs = num_envs
        self.obs_shape, self.obs_dtype = tuple(obs_shape), obs_dtype
        self.gamma, self.state_size, self.mask_size = gamma, state_size, mask_size
        every = {"obs": (self.obs_shape, obs_dtype), **columns}
        self.steps = UnrollAccumulator(num_envs, length, every, state_size, period)

    # --- the protocol ---------------------------------------------------------------

    def act(self, obs: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """The env actions for `obs` `[N, *obs_shape]`, drawn with `rng` (None: the
        collector's own, where it has one); records the step.

        Raises:
            EasyRLError: `act` was already called for this step, `obs` has a wrong shape, or
                an observation's action mask has no legal action.
        """
        steps = self.steps
        steps.expect_act()
        obs = self.checked_obs("obs", obs)
        if self.mask_size:
            legal_actions(obs, self.mask_size)  # raises when a row has none
        state = steps.state if self.state_size else None
        actions, columns, next_state = self.step(obs, state, steps.first, rng)
        steps.record_act(next_state, obs=obs, **columns)
        return actions

    def observe(
        self,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        real_next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> dict[str, np.ndarray] | None:
        """Records the outcome of the step `act` chose; returns the batch (`finish`) when an
        unroll ends with it, else None.

        Args:
            rewards: `[N]`.
            next_obs: what the vector env returned (reset rows for done envs): the next
                step's observation, and the bootstrap one after an unroll's last step.
            real_next_obs: the true successors (final observation for done envs).
            terminated: `[N]` bool.
            truncated: `[N]` bool.

        Raises:
            EasyRLError: no `act` preceded this call, or an argument has a wrong shape.
        """
        steps = self.steps
        steps.expect_observe()
        n = self.num_envs
        rewards = np.asarray(rewards, np.float32).reshape(-1)
        terminated = np.asarray(terminated, bool).reshape(-1)
        truncated = np.asarray(truncated, bool).reshape(-1)
        if any(len(x) != n for x in (rewards, terminated, truncated)):
            raise EasyRLError(f"observe needs {n} rows per argument")
        next_obs = self.checked_obs("next_obs", next_obs)
        outcome = self.outcome(rewards, terminated, truncated, real_next_obs)
        if not steps.record_outcome(terminated | truncated, **outcome):
            return None
        return self.finish(next_obs, real_next_obs)

    def checked_obs(self, name: str, obs) -> np.ndarray:
        """`obs` as `[N, *obs_shape]` in the observations' dtype, or EasyRLError."""
        obs = np.asarray(obs, self.obs_dtype)
        if obs.shape != (self.num_envs, *self.obs_shape):
            expected = [self.num_envs, *self.obs_shape]
            raise EasyRLError(f"{name} must be {expected}, got {list(obs.shape)}")
        return obs

    # --- the agent's hooks ----------------------------------------------------------

    def step(
        self,
        obs: np.ndarray,
        state: np.ndarray | None,
        first: np.ndarray,
        rng: np.random.Generator | None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """The policy's step: (env actions, the columns to record `[N, ...]` each, the
        state after the step `[N, S]` or None without one), from observations `obs`, the
        state before the step `state` (None: feed-forward) and the episode-start flags
        `first` `[N]` (the policy resets its state where they are 1)."""
        raise NotImplementedError

    def outcome(
        self,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        real_next_obs: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """The columns of a step's result: reward, and discount = gamma * (1 - done) (an
        episode end of either kind is not bootstrapped)."""
        done = terminated | truncated
        return {"reward": reward, "discount": (self.gamma * (1.0 - done)).astype(np.float32)}

    def finish(self, next_obs: np.ndarray, real_next_obs: np.ndarray) -> dict[str, np.ndarray]:
        """The batch of the unroll that just ended: every column batch-major `[N, T, ...]`,
        "obs" `[N, T + 1, ...]` with `next_obs` as the bootstrap step, and with a recurrent
        state "state" `[N, S]` and "first" `[N, T + 1]`."""
        steps = self.steps
        batch = {
            name: steps.batch_major(name, bootstrap=next_obs if name == "obs" else None)
            for name in steps.columns
        }
        if self.state_size:
            batch.update(steps.recurrent(bootstrap=True))
        return batch
