"""The execution flows: for each, the loop an actor runs and the loop a learner runs.

`async_replay` (DQN/Ape-X, IMPALA, DDPG/TD3, SAC, offline learners), `sync_rounds` (PPO, ES)
and `actor_gradients` (A3C) each hold what their loops do. The roles (`easyrl.roles.actor`,
`easyrl.roles.learner`) own the process plumbing the loops call, described here by
`ActorPlumbing` and `LearnerPlumbing`: clients, communication threads, queues and reports.
"""

import queue
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

import numpy as np

from easyrl.algorithms.contract import Agent, Batch, Collector
from easyrl.replay.sampled import Sampled
from easyrl.roles.common import RoleContext, ShardedWeights, StopSignal
from easyrl.transport.clients import MemoryClient


class Prefetched(NamedTuple):
    """A batch a learner's prefetch thread sampled, and the memory shard it came from (the
    shard its new priorities go back to)."""

    shard: int
    sample: Sampled


class ActorPlumbing(Protocol):
    """What an actor's loop uses of its process (`easyrl.roles.actor.Actor`)."""

    ctx: RoleContext
    algo: Agent
    stop: StopSignal
    weights: ShardedWeights
    counters: dict[str, int]
    sync_requested: threading.Event
    """Set to have the weight-sync thread fetch the newest values."""

    def collector(self, agent: Any, seed: int) -> Any:
        """The agent's collector for this actor's envs."""
        ...

    def step(
        self, env: Any, collector: Collector, obs: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, Batch | None]:
        """One vector step: (next observations, the items it completed or None)."""
        ...

    def ship(self, batch: Batch, round_: int = 0) -> bool:
        """Queues items for the memory shard; False if the actor stopped first."""
        ...

    def report(self, steps: int, stats: dict, force: bool = False, updates: int = 0) -> None:
        """Reports env steps, episodes and stats to PS shard 0 (at most every 0.5 s)."""
        ...

    def check_stopping(self) -> None:
        """Stops the actor when PS shard 0 says the run is stopping (reports nothing)."""
        ...

    def send_loop(self) -> None:
        """The sender thread's body."""
        ...

    def weight_sync_loop(self) -> None:
        """The weight-sync thread's body."""
        ...

    def discard_open_episodes(self) -> None:
        """Forgets unfinished episodes after the loop reset the envs."""
        ...


class LearnerPlumbing(Protocol):
    """What a learner's loop uses of its process (`easyrl.roles.learner.Learner`)."""

    ctx: RoleContext
    algo: Agent
    stop: StopSignal
    weights: ShardedWeights
    memories: list[MemoryClient]
    pushes: queue.Queue
    """(gradients by name, versions) for the push threads."""
    priorities: queue.Queue
    """(shard, keys, priorities) for the priority thread."""
    pool: ThreadPoolExecutor
    counters: dict[str, int]
    updates: int

    def prefetch(self, shard: int) -> None:
        """A prefetch thread's body (memory shard `shard`)."""
        ...

    def push_loop(self) -> None:
        """A push thread's body."""
        ...

    def update_threads(self) -> list:
        """The bodies of the threads that carry updates away (publisher or push threads)."""
        ...

    def fuse_update(self) -> bool:
        """Hands the agent the learner's optimizer when it can take the update into its step
        (`FusingLearner`); whether that step then steps the target networks too."""
        ...

    def values_for_update(self) -> list[int]:
        """Readies the values for the next update; the shard versions it is computed
        against."""
        ...

    def apply(self, grads: Sequence, versions: list[int]) -> bool:
        """Applies or queues one update's gradients; False when stopped while waiting."""
        ...

    def priority_loop(self) -> None:
        """The priority thread's body."""
        ...

    def take_batch(self) -> Prefetched | None:
        """The next prefetched batch, or None after 0.1 s."""
        ...

    def take_round(self, round_: int) -> tuple[Batch | None, int]:
        """Round `round_` from every memory shard, or (None, what to do instead)."""
        ...

    def publish(self, round_: int) -> None:
        """Publishes the current values as round `round_` on every PS shard."""
        ...

    def report(self, stats: dict) -> None:
        """Reports updates and stats to PS shard 0."""
        ...

    def report_due(self) -> bool:
        """Whether the next report is due."""
        ...
