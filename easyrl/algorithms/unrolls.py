"""Actor-side unroll collection shared by the IMPALA, PPO and R2D2 collectors (numpy only).

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

from easyrl.errors import EasyRLError


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
        columns: Mapping[str, tuple[tuple[int, ...], np.dtype | type]],
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
