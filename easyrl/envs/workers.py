"""The ``async`` vector env: copies of one environment stepped in worker processes, each
worker stepping `envs_per_worker` of them in turn.

One subprocess per copy (``envs_per_worker`` 1) steps every copy in parallel, but each step
then costs every copy a round trip through a pipe and a process wake-up; where the copies
outnumber the cores, that is CPU the cores could have spent on the envs. A worker holding
several copies (a gymnasium ``SyncVectorEnv`` of them, same-step autoreset) pays the round
trip once for all of them (Sample Factory's ``num_envs_per_worker``; RESULTS.md has the
figures for Atari Pong).

Observations travel through shared memory (written by the worker, copied out by the parent);
actions, rewards, flags and infos through the worker's pipe. The infos of the workers are
merged into one gymnasium vector infos dict (``final_obs``/``_final_obs`` and the others, each
array `num_envs` long), as ``SyncVectorEnv`` and ``AsyncVectorEnv`` return them.

A worker that raises sends the error back, and the parent raises it (`EasyRLError`, with the
worker's traceback); a worker that died makes the next call raise. Workers ignore SIGINT (the
parent decides when they stop) and exit when their parent's end of the pipe closes.
"""

from __future__ import annotations

import copy
import multiprocessing
import signal
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector.utils import (
    batch_space,
    create_shared_memory,
    iterate,
    read_from_shared_memory,
    write_to_shared_memory,
)

from easyrl.errors import EasyRLError

CLOSE_TIMEOUT_S = 5.0
"""How long `close` waits for each worker to exit before terminating it."""


def _worker(conn, env_fns: Sequence[Callable[[], gymnasium.Env]], shm, space, first: int) -> None:
    """A worker process: a same-step-autoreset ``SyncVectorEnv`` of `env_fns`, whose
    observations it writes to the shared memory `shm` at rows `first`, `first` + 1, ..."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    env = None
    try:
        mode = gymnasium.vector.AutoresetMode.SAME_STEP
        env = gymnasium.vector.SyncVectorEnv(list(env_fns), autoreset_mode=mode)

        def share(obs) -> None:
            for i, one in enumerate(iterate(env.observation_space, obs)):
                write_to_shared_memory(space, first + i, one, shm)

        conn.send(("ready", None))
        while True:
            try:
                command, arg = conn.recv()
            except EOFError:  # the parent is gone
                return
            try:
                if command == "step":
                    obs, rewards, terminated, truncated, infos = env.step(arg)
                    share(obs)
                    conn.send(("ok", (rewards, terminated, truncated, infos)))
                elif command == "reset":
                    seeds, options = arg
                    obs, infos = env.reset(seed=seeds, options=options)
                    share(obs)
                    conn.send(("ok", infos))
                elif command == "close":
                    return
            except Exception as err:  # sent to the parent, which raises it
                conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    except Exception as err:  # building the envs failed
        conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    finally:
        if env is not None:
            env.close()
        conn.close()


def merge_infos(parts: Sequence[dict], sizes: Sequence[int]) -> dict:
    """One vector infos dict of the workers' infos dicts (`parts`, of `sizes` copies each, in
    order): every array entry becomes `sum(sizes)` long, zeros (None for objects, False for
    the ``_key`` masks) where a worker had no such entry; nested dicts (``final_info``) are
    merged the same way."""
    total, out = sum(sizes), {}
    first = 0
    for part, size in zip(parts, sizes, strict=True):
        for key, value in part.items():
            if isinstance(value, dict):
                continue
            value = np.asarray(value)
            if key not in out:
                fill = None if value.dtype == object else 0
                out[key] = np.full((total, *value.shape[1:]), fill, value.dtype)
            out[key][first : first + size] = value
        first += size
    for key in sorted({k for p in parts for k, v in p.items() if isinstance(v, dict)}):
        nested = [p.get(key, {}) for p in parts]
        out[key] = merge_infos(nested, sizes)
    return out


class WorkerVectorEnv(gymnasium.vector.VectorEnv):
    """`num_envs` copies of ``env_fn()`` in ``ceil(num_envs / envs_per_worker)`` worker
    processes (see the module docstring); same-step autoreset.

    Args:
        env_fn: makes one copy (picklable: workers are started with `context`).
        num_envs: copies, at least 1.
        envs_per_worker: copies per worker, at least 1 (the last worker may hold fewer).
        context: the multiprocessing start method.
    """

    def __init__(
        self,
        env_fn: Callable[[], gymnasium.Env],
        num_envs: int,
        envs_per_worker: int = 1,
        context: str = "spawn",
    ):
        self._conns, self._processes = [], []
        if envs_per_worker < 1:
            raise EasyRLError(f"envs_per_worker must be >= 1, got {envs_per_worker}")
        probe = env_fn()  # the spaces, read here as AsyncVectorEnv does
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        mode = gymnasium.vector.AutoresetMode.SAME_STEP
        self.metadata = {**probe.metadata, "autoreset_mode": mode}
        self.render_mode = None
        probe.close()
        self.num_envs = num_envs
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        ctx: Any = multiprocessing.get_context(context)  # its Process: not on BaseContext's stub
        self._shm = create_shared_memory(self.single_observation_space, num_envs, ctx)
        self._obs = read_from_shared_memory(self.single_observation_space, self._shm, num_envs)
        self._firsts = list(range(0, num_envs, envs_per_worker))
        self.sizes = [min(envs_per_worker, num_envs - first) for first in self._firsts]
        try:
            for first, size in zip(self._firsts, self.sizes, strict=True):
                parent, child = ctx.Pipe()
                args = (child, [env_fn] * size, self._shm, self.single_observation_space, first)
                process = ctx.Process(target=_worker, args=args, daemon=True)
                process.start()
                child.close()
                self._conns.append(parent)
                self._processes.append(process)
            self._receive_all()  # "ready", or the error that stopped a worker
        except BaseException:
            self.close()
            raise

    def _receive(self, worker: int) -> Any:
        """The next reply of `worker`.

        Raises:
            EasyRLError: the worker raised (its traceback in the message), or died.
        """
        try:
            status, payload = self._conns[worker].recv()
        except (EOFError, OSError):
            process = self._processes[worker]
            process.join(0.1)
            raise EasyRLError(
                f"env worker {worker} (pid {process.pid}) exited with code {process.exitcode}"
            ) from None
        if status == "error":
            raise EasyRLError(f"env worker {worker} raised {payload}")
        return payload

    def _receive_all(self) -> list:
        """Every worker's next reply; raises the first failure once all were read (so that
        no reply is left behind in a pipe)."""
        replies, failure = [], None
        for worker in range(len(self._conns)):
            try:
                replies.append(self._receive(worker))
            except EasyRLError as err:
                failure = failure or err
        if failure is not None:
            raise failure
        return replies

    def _send_all(self, command: str, args: Sequence) -> None:
        for worker, (conn, arg) in enumerate(zip(self._conns, args, strict=True)):
            try:
                conn.send((command, arg))
            except (BrokenPipeError, OSError):
                self._receive(worker)  # raises: the worker died

    def _split(self, values: Sequence | np.ndarray) -> list:
        """`values` (one per copy) cut into each worker's part."""
        return [values[f : f + n] for f, n in zip(self._firsts, self.sizes, strict=True)]

    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None):
        """Resets every copy; an int `seed` gives copy i the seed `seed` + i."""
        if seed is None or isinstance(seed, int | np.integer):
            seeds = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise EasyRLError(f"reset: {len(seeds)} seeds for {self.num_envs} envs")
        self._send_all("reset", [(part, options) for part in self._split(seeds)])
        infos = self._receive_all()
        return copy.deepcopy(self._obs), merge_infos(infos, self.sizes)

    def step(self, actions):
        """Steps every copy with its action (`actions[i]`, batched along the first axis)."""
        self._send_all("step", self._split(np.asarray(actions)))
        replies = self._receive_all()
        rewards, terminated, truncated = (
            np.concatenate([np.asarray(r[i]) for r in replies]) for i in range(3)
        )
        infos = merge_infos([r[3] for r in replies], self.sizes)
        return copy.deepcopy(self._obs), rewards, terminated, truncated, infos

    def close_extras(self, **kwargs) -> None:
        """Stops the workers (each gets `CLOSE_TIMEOUT_S` to close its envs)."""
        for conn in self._conns:
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(CLOSE_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(1.0)
        for conn in self._conns:
            conn.close()
        self._conns, self._processes = [], []
