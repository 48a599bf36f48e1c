"""Replay kinds: what `replay.kind` names, each one object registered here.

A `Kind` says how a memory shard builds its table (store, sampler and remover, and what
admits its operations: a rate limiter or rounds) as a `served.ServedTable`, and what the
rest of the runtime needs to know without building one: whether learners sample batches
(and so send `Params.batch_size`) or take whole rounds, whether items carry priorities,
whether it can store Atari frames once, whether a shard snapshots it. Its items are the
algorithm's (`replay_spec`); its RPCs are the `ReplayMemory` service's, which every served
table answers (Sample by batch or by round, UpdatePriorities or a refusal).

The config loader, the algorithm contract check, the memory role and the k8s manifests
read the kind from here (`get`) and nothing else. Adding a kind is one `register` call,
in any module the run imports (an algorithm module of user code, for instance):

    register(Kind("lifo", build=lambda setup: LimitedTable(...)))

Built in: `uniform` and `prioritized` rings, the `trajectory` queue and the `aggregate`
table of synchronous rounds.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from easyrl.errors import ConfigError, ReplayError, did_you_mean
from easyrl.replay.aggregate import AggregateTable
from easyrl.replay.checks import check_int
from easyrl.replay.frames import FrameLayout, FrameStore, frame_capacity, frame_window
from easyrl.replay.rate_limiter import RateLimiter
from easyrl.replay.served import BetaSchedule, LimitedTable, ServedTable
from easyrl.replay.tables import PrioritizedTable, Table, TableSpec, UniformTable

if TYPE_CHECKING:
    from easyrl.config import ReplayConfig


@dataclass(frozen=True)
class ShardSetup:
    """What building a memory shard's table takes (see `easyrl.roles.memory.build`)."""

    replay: "ReplayConfig"
    """The config's `replay` section."""
    spec: TableSpec
    """The item's columns (the algorithm's `replay_spec`)."""
    seed: int
    """The shard's seed (sampling)."""
    batch_size: int
    """A learner's batch (`Params.batch_size`); 0 for a kind whose learners take rounds."""
    num_envs: int
    """Envs per actor (an actor ships one item per env and vector step)."""
    send_every: int
    """Vector steps between an actor's shipments."""
    frames: FrameLayout | None
    """The frame layout of Atari stacks to store frame by frame (`layout_for`), or None."""
    round_size: Callable[[], int]
    """Items that complete a round on this shard (synchronous rounds only)."""
    restarted: bool = False
    """This shard ran before in this run directory."""
    batches_per_sample: int = 1
    """Batches a learner asks for in one Sample (`learner.batches_per_sample`)."""

    @property
    def sample_size(self) -> int:
        """Items of one learner's Sample: `batches_per_sample` batches (what a table
        samples ahead)."""
        return self.batch_size * self.batches_per_sample


def _accept(replay: "ReplayConfig") -> None:
    """A kind that checks nothing beyond the section's own rules."""


@dataclass(frozen=True)
class Kind:
    """A replay kind (see the module docstring)."""

    name: str
    """What `replay.kind` and an algorithm's `REPLAY_KINDS` call it."""
    build: Callable[[ShardSetup], ServedTable]
    """Builds a shard's table with its sampler, remover and admission rules (a snapshot,
    when there is one, is restored into it afterwards)."""
    batches: bool = True
    """Learners sample batches of `Params.batch_size` items; False: they take whole rounds
    (Insert and Sample carry a round)."""
    prioritized: bool = False
    """Items carry priorities: actors compute initial ones, learners send new ones back."""
    frames: bool = False
    """It can store Atari frame stacks frame by frame (`replay.frame_dedup`)."""
    snapshots: bool = True
    """A shard snapshots its table and restores it when restarted."""
    check: Callable[["ReplayConfig"], None] = _accept
    """Checks the `replay` section for this kind.

    Raises:
        ConfigError: naming the key."""


_KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    """Adds `kind` (again: replaces it, so a module imported twice is harmless).

    Returns:
        `kind`.

    Raises:
        ReplayError: the name is not a non-empty identifier-like string.
    """
    if not isinstance(kind.name, str) or not kind.name.replace("_", "a").isalnum():
        raise ReplayError(f"a replay kind's name is letters, digits and '_', got {kind.name!r}")
    _KINDS[kind.name] = kind
    return kind


def names() -> list[str]:
    """The registered kinds' names, in registration order."""
    return list(_KINDS)


def get(name: str, key: str = "replay.kind") -> Kind:
    """The kind registered as `name`, or the `Kind` a `"package.module:attribute"` path
    names (imported here: every process of a run finds it from the config alone).

    Raises:
        ConfigError: no kind has that name (naming `key` and the closest registered one).
    """
    if name in _KINDS:
        return _KINDS[name]
    if ":" in name:  # a kind of your own, by config alone: its module is imported here
        from easyrl.imports import load_object

        found = load_object(name, key)
        if not isinstance(found, Kind):
            raise ConfigError(f"{key}: {name!r} is a {type(found).__name__}, not a Kind")
        return found
    hint = did_you_mean(name, names(), "registered kinds: " + ", ".join(names()))
    raise ConfigError(
        f"{key}: unknown replay kind {name!r}; {hint} (a kind of your own: "
        "easyrl.replay.kinds.register)"
    )


# --- the built-in kinds ---------------------------------------------------------------------


def _frame_store(setup: ShardSetup, queue: bool) -> FrameStore | None:
    """The frame store of a ring or a queue of `replay.capacity` items, or None."""
    if setup.frames is None:
        return None
    capacity = check_int("capacity", setup.replay.capacity, 1)
    size = frame_capacity(setup.frames, capacity, queue)
    window = frame_window(setup.frames, capacity)
    return FrameStore(setup.frames, size, match_sources=not queue, window=window)


def ring_limiter(
    r: "ReplayConfig", table: Table, insert_items: int, batch_size: int
) -> RateLimiter:
    """A ring's rate limiter from the config: ``SampleToInsertRatio`` or ``MinSize`` (it
    counts what this process inserts), checked against an insert of `insert_items` items
    and the learners' `batch_size`. A ring with a frame store must hold the frames of any
    insert (``max_frames`` per item).

    Raises:
        ReplayError: the batch sizes could deadlock or never fit the frame store.
    """
    frames = table.frames
    limiter = RateLimiter(r.min_size_to_sample, r.samples_per_insert, r.error_buffer)
    limiter.check_batch_sizes(insert_items, batch_size)
    insert_frames = insert_items * (frames.layout.max_frames if frames else 0)
    if frames is not None and insert_frames > frames.capacity:
        raise ReplayError(
            f"an insert of {insert_items} items may hold {insert_frames} frames, more than the "
            f"{frames.capacity} frames replay.capacity {table.capacity} keeps; raise "
            "replay.capacity (or set replay.frame_dedup: false)"
        )
    return limiter


def queue_limiter(table: Table, num_envs: int, batch_size: int) -> RateLimiter:
    """Reverb's ``Queue`` on a queue `table` (its state is the queue's, restored items
    included; an actor ships one unroll per env). With a frame store, whose oldest shipment
    may hold its frames while part of its items are sampled, the queue must hold the frames
    of a learner batch and two inserts, ``capacity >= 2 * num_envs + batch_size - 2``, or
    inserts waiting for frame room and samples waiting for items could deadlock.

    Raises:
        ReplayError: the batch sizes could deadlock.
    """
    limiter = RateLimiter.queue(table)
    limiter.check_batch_sizes(num_envs, batch_size)
    if table.frames is not None and table.capacity < 2 * num_envs + batch_size - 2:
        raise ReplayError(
            f"replay.capacity {table.capacity} (unrolls) must be at least 2 * num_envs + "
            f"batch_size - 2 = {2 * num_envs + batch_size - 2} with frame stacks stored "
            "frame by frame, or inserts and samples could deadlock; raise it (or set "
            "replay.frame_dedup: false)"
        )
    return limiter


def _ring(setup: ShardSetup, table: Table) -> LimitedTable:
    r = setup.replay
    insert_items = setup.send_every * setup.num_envs
    limiter = ring_limiter(r, table, insert_items, setup.sample_size)
    # The schedule's clock counts Samples; beta_anneal_steps counts updates (batches).
    anneal = math.ceil(r.beta_anneal_steps / setup.batches_per_sample)
    beta = BetaSchedule(r.beta, r.beta_final, anneal)
    return LimitedTable(table, limiter, setup.sample_size, beta)


def _uniform(setup: ShardSetup) -> LimitedTable:
    store = _frame_store(setup, queue=False)
    table = UniformTable(setup.spec, setup.replay.capacity, seed=setup.seed, frames=store)
    return _ring(setup, table)


def _prioritized(setup: ShardSetup) -> LimitedTable:
    r, store = setup.replay, _frame_store(setup, queue=False)
    table = PrioritizedTable(setup.spec, r.capacity, r.alpha, setup.seed, frames=store)
    return _ring(setup, table)


def _trajectory(setup: ShardSetup) -> LimitedTable:
    table = Table.queue(setup.spec, setup.replay.capacity, frames=_frame_store(setup, True))
    limiter = queue_limiter(table, setup.num_envs, setup.sample_size)
    return LimitedTable(table, limiter, setup.sample_size)


def _aggregate(setup: ShardSetup) -> AggregateTable:
    return AggregateTable(setup.spec, setup.replay.capacity, setup.round_size(), setup.restarted)


def _min_size_fits(r: "ReplayConfig") -> None:
    if r.min_size_to_sample > r.capacity:
        raise ConfigError(
            f"replay: min_size_to_sample must be <= capacity, got {r.min_size_to_sample} > "
            f"{r.capacity}"
        )


UNIFORM = register(Kind("uniform", _uniform, frames=True, check=_min_size_fits))
"""A ring sampled uniformly (DQN, DDPG/TD3, SAC, offline datasets)."""
PRIORITIZED = register(
    Kind("prioritized", _prioritized, prioritized=True, frames=True, check=_min_size_fits)
)
"""A ring with proportional prioritized sampling (Ape-X)."""
TRAJECTORY = register(Kind("trajectory", _trajectory, frames=True))
"""A FIFO of unrolls, each sampled once (IMPALA, LinUCB)."""
AGGREGATE = register(Kind("aggregate", _aggregate, batches=False, snapshots=False))
"""Whole synchronous rounds (PPO, ES, A2C)."""

BUILT_IN = frozenset(_KINDS)
"""The kinds above: an algorithm works with those its spec lists (`replay_kinds`)."""


def fits(kind: Kind, listed: tuple[str, ...]) -> str | None:
    """Why a kind that is not built in cannot hold the items of an algorithm whose spec lists
    the kinds `listed`, or None when it can: learners take its items the way they take those
    of the algorithm's own kind (batches or whole rounds), and priorities only where the
    algorithm computes them (one of its kinds is prioritized)."""
    if not listed:
        return "it uses no replay memory"
    own = get(listed[0])
    if kind.batches != own.batches:
        how = "sample batches" if own.batches else "take whole rounds"
        return f"its learners {how}, which {kind.name!r} does not serve"
    if kind.prioritized and not any(get(k).prioritized for k in listed):
        return f"it computes no priorities, which {kind.name!r} needs"
    return None
