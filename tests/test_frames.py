"""Frame-deduplicating replay (easyrl.replay.frames): a table that stores each frame of its
frame-stack columns once samples exactly what the plain table samples (keys, weights,
batches bit for bit) on real Pong stacks and on synthetic streams with episode ends; its
ring drops the items whose frames it overwrites; its queue waits for frame room; snapshots
round-trip; malformed wire batches are refused with the table unchanged; a small Ape-X
cluster on Pong trains with it.
"""

import dataclasses
import re

import gymnasium
import numpy as np
import pytest
from test_cluster import ROOT, _counters, launch, one_each  # noqa: F401  (launch: a fixture)

from easyrl import config as config_lib
from easyrl.algorithms.nstep import NStepAccumulator
from easyrl.errors import ReplayError
from easyrl.replay import (
    BetaSchedule,
    LimitedTable,
    PrioritizedTable,
    RateLimiter,
    Table,
    UniformTable,
    kinds,
)
from easyrl.replay.frames import (
    FRAMES_KEY,
    PIXELS,
    FrameLayout,
    FrameStore,
    frame_capacity,
    layout_for,
)
from easyrl.replay.storage import FrameColumns, live_slots
from easyrl.roles import memory as memory_role

H, W, K = 6, 5, 4  # small synthetic frames, 4 to a stack
STACK = (H, W, K)


def transition_spec(shape=STACK) -> dict:
    return {
        "obs": (shape, np.dtype(np.uint8)),
        "action": ((), np.dtype(np.int64)),
        "reward": ((), np.dtype(np.float32)),
        "next_obs": (shape, np.dtype(np.uint8)),
        "discount": ((), np.dtype(np.float32)),
    }


def unroll_spec(t: int) -> dict:
    return {
        "obs": ((t + 1, *STACK), np.dtype(np.uint8)),
        "action": ((t,), np.dtype(np.int64)),
        "reward": ((t,), np.dtype(np.float32)),
    }


class Frames:
    """Synthetic frames: mostly random, sometimes one of two constant frames (identical
    content across envs and time, as blank Atari screens are)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def __call__(self, n: int) -> np.ndarray:
        frames = self.rng.integers(0, 256, (n, H, W), dtype=np.uint8)  # [n, H, W]
        constant = self.rng.random(n) < 0.15
        frames[constant] = self.rng.integers(0, 2, constant.sum())[:, None, None]
        return frames


class Stacks:
    """`num_envs` envs' frame stacks as gymnasium's FrameStackObservation gives them: a
    reset stack repeats its first frame; a step shifts in one new frame."""

    def __init__(self, num_envs: int, frames: Frames):
        self.frames = frames
        self.stacks = np.repeat(frames(num_envs)[..., None], K, axis=-1)  # [N, H, W, K]

    def step(self, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(next stacks, the true next stacks): done envs restart from a reset stack."""
        real = np.concatenate([self.stacks[..., 1:], self.frames(len(done))[..., None]], -1)
        nxt = real.copy()
        nxt[done] = np.repeat(self.frames(int(done.sum()))[..., None], K, axis=-1)
        self.stacks = nxt
        return nxt, real


def transition_shipments(seed, num_envs=3, steps=240, send_every=8, n_step=3, done_p=0.04):
    """DQN n-step transitions of synthetic streams (episode ends mid-shipment, next_obs
    n steps ahead across shipment boundaries), cut into shipments every `send_every`."""
    rng = np.random.default_rng(seed)
    stacks = Stacks(num_envs, Frames(rng))
    nstep = NStepAccumulator(num_envs, n_step, 0.9, STACK, np.uint8)
    shipments, parts = [], []
    for t in range(steps):
        obs = stacks.stacks
        terminated = rng.random(num_envs) < done_p
        truncated = rng.random(num_envs) < done_p / 2
        _, real = stacks.step(terminated | truncated)
        out = nstep.add(obs, rng.integers(0, 6, num_envs), rng.random(num_envs), real,
                        terminated, truncated)  # fmt: skip
        if out is not None:
            parts.append(out)
        if (t + 1) % send_every == 0 and parts:
            shipments.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
            parts = []
    return shipments


def unroll_shipments(seed, num_envs=2, t=5, count=30, done_p=0.1):
    """IMPALA unrolls of synthetic streams: obs [N, T + 1, ...], the bootstrap stack of one
    unroll the first of the next, resets mid-unroll."""
    rng = np.random.default_rng(seed)
    stacks = Stacks(num_envs, Frames(rng))
    shipments = []
    for _ in range(count):
        obs = [stacks.stacks]
        for _ in range(t):
            obs.append(stacks.step(rng.random(num_envs) < done_p)[0])
        shipments.append(
            {
                "obs": np.stack(obs, axis=1),  # [N, T + 1, H, W, K]
                "action": rng.integers(0, 4, (num_envs, t)),
                "reward": rng.random((num_envs, t)).astype(np.float32),
            }
        )
    return shipments


def assert_same_sample(a, b) -> None:
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    assert list(a.data) == list(b.data)
    for name in a.data:
        assert a.data[name].dtype == b.data[name].dtype, name
        np.testing.assert_array_equal(a.data[name], b.data[name], err_msg=name)


def feed_and_compare(plain, framed, shipments, seed=0, sample_size=16, sources=1):
    """Inserts every shipment into both tables (the framed one in wire form; shipment i
    from source i % sources), then samples and updates priorities on both and compares."""
    rng = np.random.default_rng(seed)
    layout = framed.frames.layout
    prioritized = isinstance(plain, PrioritizedTable)
    for i, shipment in enumerate(shipments):
        n = len(shipment["action"])
        priorities = rng.random(n) if prioritized else None
        np.testing.assert_array_equal(
            plain.insert(shipment, priorities),
            framed.insert(layout.pack(shipment), priorities, source=i % sources),
        )
        assert framed.size == plain.size
        for _ in range(2):
            a, b = plain.sample(sample_size, 0.4), framed.sample(sample_size, 0.4)
            assert_same_sample(a, b)
            if prioritized:
                new = rng.random(sample_size) * 3
                assert plain.update_priorities(a.keys, new) == framed.update_priorities(b.keys, new)


def layout_of(spec) -> FrameLayout:
    layout = FrameLayout.find(spec, STACK, K, np.uint8)
    assert layout is not None
    return layout


# --- the layout and the wire form -----------------------------------------------------


def test_pack_keeps_each_distinct_frame_once_and_unpacks_exactly():
    spec = transition_spec()
    layout = layout_of(spec)
    assert layout.columns == {"obs": (), "next_obs": ()}
    assert (layout.frame_shape, layout.max_frames, layout.steps_per_item) == ((H, W, 1), 8, 1)
    shipment = transition_shipments(0)[3]
    wire = layout.pack(shipment)
    assert set(wire) == {"action", "reward", "discount", FRAMES_KEY}
    part = wire[FRAMES_KEY]
    frames = np.concatenate([layout.split(shipment[c]) for c in ("obs", "next_obs")])
    distinct = {f.tobytes() for f in frames.reshape(-1, H, W, 1)}
    assert len(part[PIXELS]) == len(distinct)
    assert part["obs"].dtype == np.int32 and part["obs"].shape == (len(shipment["action"]), K)
    for name, value in layout.unpack(wire).items():
        np.testing.assert_array_equal(value, shipment[name], err_msg=name)


def test_colour_stacks_split_into_frames_of_three_channels():
    spec = {"obs": ((2, 3, 3 * K), np.dtype(np.uint8)), "a": ((), np.dtype(np.int64))}
    layout = FrameLayout.find(spec, (2, 3, 3 * K), K, np.uint8)
    assert layout is not None and layout.frame_shape == (2, 3, 3)
    colour = np.random.default_rng(0).integers(0, 256, (4, K, 2, 3, 3), dtype=np.uint8)
    # gymnasium + ChannelsLast: [k, H, W, 3] -> [H, W, k, 3] -> [H, W, 3k]
    stacks = np.moveaxis(colour, 1, 3).reshape(4, 2, 3, 3 * K)
    np.testing.assert_array_equal(layout.split(stacks), colour)
    np.testing.assert_array_equal(layout.join(layout.split(stacks)), stacks)


@pytest.mark.parametrize("channels", [1, 3])
def test_join_gathers_stacks_by_frame_ids_into_contiguous_arrays(channels):
    spec = {"obs": ((2, 3, channels * K), np.dtype(np.uint8))}
    layout = FrameLayout.find(spec, (2, 3, channels * K), K, np.uint8)
    assert layout is not None
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (50, 2, 3, channels), dtype=np.uint8)  # [F, H, W, c]
    ids = rng.integers(0, 50, (7, 2, K))  # [n, lead, k]
    expected = np.moveaxis(frames[ids], -4, -2).reshape(7, 2, 2, 3, channels * K)
    for stacks in (layout.join(frames, ids), layout.join(frames[ids])):
        assert stacks.flags.c_contiguous and stacks.dtype == np.uint8
        np.testing.assert_array_equal(stacks, expected)


def _config(name: str, *overrides: str):
    return config_lib.load(ROOT / "configs" / name, list(overrides))


def _spec(cfg) -> dict:
    """The config's replay spec for Pong's spaces (42x42 or 84x84 grey stacks, 6 actions)."""
    from easyrl.algorithms import registry

    atari = cfg.env.atari
    shape = (atari.screen_size, atari.screen_size, atari.frame_stack)
    obs = gymnasium.spaces.Box(0, 255, shape, np.uint8)
    module = registry.module(cfg.algorithm.name)
    return module.replay_spec(cfg.algorithm.params, obs, gymnasium.spaces.Discrete(6))


def test_the_pong_configs_store_frames_unless_switched_off():
    apex = _config("pong_apex.yaml", "env.atari.screen_size=42")
    layout = layout_for(apex, _spec(apex))
    assert layout is not None and layout.columns == {"obs": (), "next_obs": ()}
    assert layout.frame_shape == (42, 42, 1) and layout.stack == 4
    impala = _config("pong_impala.yaml")
    layout = layout_for(impala, _spec(impala))
    assert layout is not None and layout.columns == {"obs": (65,)}
    assert layout.max_frames == 64 + 4
    off = _config("pong_apex.yaml", "replay.frame_dedup=false")
    assert layout_for(off, _spec(off)) is None
    assert layout_for(_config("cartpole_apex.yaml"), transition_spec((4,))) is None


# --- the same samples as the plain table ------------------------------------------------


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_ring_samples_what_the_plain_ring_samples(kind):
    spec, capacity = transition_spec(), 150
    layout = layout_of(spec)
    store = FrameStore(layout, 3 * capacity)  # room for every item of the streams
    if kind == "prioritized":
        plain = PrioritizedTable(spec, capacity, alpha=0.7, seed=5)
        framed = PrioritizedTable(spec, capacity, alpha=0.7, seed=5, frames=store)
    else:
        plain = UniformTable(spec, capacity, seed=5)
        framed = UniformTable(spec, capacity, seed=5, frames=store)
    # Two actors' streams, their shipments interleaved (the sources alternate).
    pairs = zip(transition_shipments(1), transition_shipments(11), strict=True)
    shipments = [shipment for pair in pairs for shipment in pair]
    feed_and_compare(plain, framed, shipments, sources=2)
    items = sum(len(s["action"]) for s in shipments)
    assert plain.inserted == items > 4 * capacity  # wrapped four times
    assert framed.dropped == 0
    # Matching against the previous shipment stores about one frame per transition.
    assert store.next < 1.25 * items, (store.next, items)
    assert store.matched > 0


def test_queue_of_unrolls_samples_what_the_plain_queue_samples():
    t, capacity = 5, 12
    spec = unroll_spec(t)
    layout = layout_of(spec)
    assert layout.columns == {"obs": (t + 1,)} and layout.max_frames == t + K
    plain = Table.queue(spec, capacity)
    framed = Table.queue(spec, capacity, FrameStore(layout, capacity * layout.max_frames, False))
    for shipment in unroll_shipments(2):
        wire = layout.pack(shipment)
        assert framed.fits(wire)
        np.testing.assert_array_equal(plain.insert(shipment), framed.insert(wire, source=0))
        if plain.size >= 6:
            assert_same_sample(plain.sample(4), framed.sample(4))
        assert plain.size == framed.size
    while plain.size:
        assert_same_sample(plain.sample(1), framed.sample(1))


@pytest.fixture(scope="module")
def pong_shipments():
    """Real preprocessed Pong transitions (ALE/Pong-v5 through our gymnasium pipeline,
    42x42x4), random actions, the DQN n-step accumulator, shipped every 8 vector steps."""
    pytest.importorskip("ale_py")
    from easyrl.envs import env_options, final_observations, make_vector_env

    cfg = _config("pong_apex.yaml", "env.atari.screen_size=42", "env.num_envs=2")
    env = make_vector_env(cfg.env.id, 2, vector="sync", seed=3, **env_options(cfg.env))
    rng = np.random.default_rng(3)
    nstep = NStepAccumulator(2, 3, 0.99, (42, 42, 4), np.uint8)
    shipments, parts = [], []
    obs, _ = env.reset(seed=3)
    try:
        for t in range(320):
            actions = rng.integers(0, 6, 2)
            next_obs, rewards, terminated, truncated, infos = env.step(actions)
            done = terminated | truncated
            real = final_observations(next_obs, infos, done)
            out = nstep.add(obs, actions, rewards, real, terminated, truncated)
            if out is not None:
                parts.append(out)
            if (t + 1) % 8 == 0 and parts:
                shipments.append({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
                parts = []
            obs = next_obs
    finally:
        env.close()
    return shipments


def test_real_pong_transitions_sample_alike_and_take_one_frame_each(pong_shipments):
    shipments = pong_shipments
    cfg = _config(
        "pong_apex.yaml",
        "env.atari.screen_size=42",
        "replay.capacity=400",
        "replay.min_size_to_sample=100",
    )
    spec = transition_spec((42, 42, 4))
    layout = layout_for(cfg, spec)
    assert layout is not None
    plain = PrioritizedTable(spec, 400, alpha=0.6, seed=9)
    # The table alone: a shard of this config would also refuse inserts of 64 items.
    setup = dataclasses.replace(memory_role.shard_setup(cfg, spec, 0), seed=9, send_every=1)
    assert setup.frames == layout
    framed = kinds.get(cfg.replay.kind).build(setup).table
    assert framed.frames is not None
    assert framed.frames.capacity == frame_capacity(layout, 400, False) == 500
    feed_and_compare(plain, framed, shipments, sample_size=32, sources=1)
    assert plain.inserted > 400 and framed.dropped == 0
    per_item = framed.nbytes / framed.size
    assert per_item < 2400, per_item  # whole stacks: 2 * 7,056 + 16 bytes


# --- eviction and frame room --------------------------------------------------------------


def random_items(rng, n, spec=None) -> dict:
    """Items whose stacks are random pixels: every item brings 2k new frames."""
    return {
        "obs": rng.integers(0, 256, (n, *STACK), dtype=np.uint8),
        "action": np.arange(n, dtype=np.int64),
        "reward": rng.random(n).astype(np.float32),
        "next_obs": rng.integers(0, 256, (n, *STACK), dtype=np.uint8),
        "discount": np.ones(n, np.float32),
    }


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_a_ring_drops_the_items_whose_frames_it_overwrites(kind):
    spec = transition_spec()
    layout = layout_of(spec)
    store = FrameStore(layout, 60)  # 7 items of 8 frames
    table = (
        PrioritizedTable(spec, 50, seed=1, frames=store)
        if kind == "prioritized"
        else UniformTable(spec, 50, seed=1, frames=store)
    )
    rng = np.random.default_rng(0)
    inserted: dict[int, dict] = {}
    for i in range(40):
        items = random_items(rng, int(rng.integers(1, 4)))
        keys = table.insert(items, source=i % 2)
        for j, key in enumerate(keys):
            inserted[int(key)] = {name: column[j] for name, column in items.items()}
        assert table.size <= 7
        live = table.inserted - table.size
        sample = table.sample(64)
        assert sample.keys.min() >= live
        for j, key in enumerate(sample.keys):
            for name in spec:
                np.testing.assert_array_equal(sample.data[name][j], inserted[int(key)][name])
        # No stored item refers to a frame id the ring no longer holds.
        for name in layout.columns:
            ids = table.state_dict()["data/" + name]
            assert ids.min() >= store.next - store.capacity
    assert table.dropped > 0 and table.inserted - table.dropped > table.size - 1
    if kind == "prioritized":
        dropped_key = np.array([table.inserted - table.size - 1])
        assert table.update_priorities(dropped_key, np.ones(1)) == 0  # stale, not applied


class ScanningFrames(FrameColumns):
    """`FrameColumns.stale` as it was: a scan of every stored item (the reference)."""

    def stale(self, low: int, live: range) -> int:
        stale = np.flatnonzero(self.first_frame[live_slots(live, self.capacity)] < low)
        return int(stale[-1]) + 1 if stale.size else 0


class ScanningTable(PrioritizedTable):
    """A prioritized ring over `ScanningFrames`."""

    def __init__(self, spec, capacity: int, seed: int, frames: FrameStore) -> None:
        super().__init__(spec, capacity, seed=seed, frames=frames)
        self.storage = ScanningFrames(self.spec, capacity, frames, queue=False)


def streamed_items(rng, stream: np.ndarray, start: int, n: int) -> dict:
    """`n` 1-step transitions whose stacks slide over a source's `stream` of frames from
    `start`: a source's next batch reuses the frames its last one ended with."""
    obs = np.stack([stream[start + i : start + i + K] for i in range(n)])  # [n, K, H, W]
    nxt = np.stack([stream[start + i + 1 : start + i + 1 + K] for i in range(n)])
    return {
        "obs": np.moveaxis(obs, 1, -1),
        "action": np.arange(n, dtype=np.int64),
        "reward": rng.random(n).astype(np.float32),
        "next_obs": np.moveaxis(nxt, 1, -1),
        "discount": np.ones(n, np.float32),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dropping_by_frame_floors_matches_scanning_every_item(seed):
    """Sources whose batches reuse their previous batch's frames, interleaved at random (so
    items refer to frames older than other sources' later items), a ring far smaller than
    the run, a snapshot restored halfway: after every insert the table holds and samples
    exactly what the full scan keeps."""
    rng = np.random.default_rng(seed)
    spec = transition_spec()
    layout = layout_of(spec)
    streams = rng.integers(0, 256, (3, 2000, H, W), dtype=np.uint8)  # 3 sources
    position = [0, 0, 0]
    window = int(rng.integers(0, 30))

    def fresh(cls):
        return cls(spec, 40, seed=5, frames=FrameStore(layout, 70, window=window))

    tables = [fresh(PrioritizedTable), fresh(ScanningTable)]
    for step in range(150):
        source = int(rng.integers(0, 3))
        n = int(rng.integers(1, 9))
        if rng.random() < 0.1:  # a jump: the source's next batch shares no frames
            position[source] += K + 1
        items = streamed_items(rng, streams[source], position[source], n)
        position[source] += n
        priorities = rng.random(n)
        keys = [t.insert(items, priorities, source=source) for t in tables]
        np.testing.assert_array_equal(keys[0], keys[1])
        got, want = (t.state_dict() for t in tables)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        assert tables[0].dropped == tables[1].dropped
        if step == 75:  # restore both from their snapshots, as a restarted shard does
            restored = [fresh(PrioritizedTable), fresh(ScanningTable)]
            for old, new in zip(tables, restored, strict=True):
                new.load_state_dict(old.state_dict())
            tables = restored
    assert tables[0].dropped > 0 and tables[0].frames.matched > 0


def test_a_queue_waits_for_frame_room_until_samples_free_it():
    t = 3
    spec = unroll_spec(t)
    layout = layout_of(spec)
    store = FrameStore(layout, 2 * layout.max_frames, match_sources=False)
    queue = Table.queue(spec, 10, store)
    rng = np.random.default_rng(0)

    def unrolls(n):  # sliding stacks of fresh random frames: T + k frames each
        frames = rng.integers(0, 256, (n, t + K, H, W), dtype=np.uint8)
        windows = np.stack([frames[:, s : s + K] for s in range(t + 1)], axis=1)
        obs = np.moveaxis(windows, 2, -1)  # [n, T + 1, H, W, K]
        return layout.pack({"obs": obs, "action": np.zeros((n, t), np.int64),
                            "reward": np.zeros((n, t), np.float32)})  # fmt: skip

    first, second, third = unrolls(1), unrolls(1), unrolls(1)
    queue.insert(first)
    queue.insert(second)
    assert not queue.fits(third)  # both unrolls' frames are still queued
    before = queue.state_dict()
    with pytest.raises(ReplayError, match="frame store full"):
        queue.insert(third)
    after = queue.state_dict()
    assert sorted(after) == sorted(before)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    expected = layout.unpack(first)["obs"]
    np.testing.assert_array_equal(queue.sample(1).data["obs"], expected)
    assert queue.fits(third)
    queue.insert(third)
    np.testing.assert_array_equal(queue.sample(1).data["obs"], layout.unpack(second)["obs"])
    np.testing.assert_array_equal(queue.sample(1).data["obs"], layout.unpack(third)["obs"])


def test_frame_tables_refuse_batch_sizes_that_never_fit_or_deadlock():
    cfg = _config("pong_impala.yaml", "replay.capacity=20", "algorithm.batch_size=12")
    spec = _spec(cfg)
    setup = memory_role.shard_setup(cfg, spec, 0)
    assert setup.frames is not None and setup.batch_size == 12
    trajectory = kinds.get(cfg.replay.kind)
    with pytest.raises(ReplayError, match="deadlock"):  # needs 2 * 6 + 12 - 2 = 22 > 20
        trajectory.build(dataclasses.replace(setup, num_envs=6))
    trajectory.build(dataclasses.replace(setup, num_envs=5))
    apex = _config(
        "pong_apex.yaml",
        "env.atari.screen_size=42",
        "replay.capacity=100",
        "replay.min_size_to_sample=100",
    )
    spec = _spec(apex)
    setup = memory_role.shard_setup(apex, spec, 0)
    setup = dataclasses.replace(setup, num_envs=4, send_every=16, batch_size=32)
    with pytest.raises(ReplayError, match="raise replay.capacity"):
        kinds.get(apex.replay.kind).build(setup)  # 64 items x 8 frames > 125


# --- snapshots ---------------------------------------------------------------------------


def test_snapshot_round_trip_restores_the_same_samples(tmp_path):
    spec, capacity = transition_spec(), 120
    layout = layout_of(spec)
    shipments = transition_shipments(4)
    plain = PrioritizedTable(spec, capacity, seed=2)
    framed = PrioritizedTable(spec, capacity, seed=2, frames=FrameStore(layout, 2 * capacity))
    feed_and_compare(plain, framed, shipments[:20])
    paths = {}
    for name, table in (("plain", plain), ("framed", framed)):
        served = LimitedTable(table, RateLimiter(1), 4, BetaSchedule(0.4, 0.4, 0))
        memory = memory_role.MemoryServer(served)
        memory.close()
        paths[name] = tmp_path / f"{name}.npz"
        assert memory.snapshot(paths[name]) == table.size
    state, store = framed.state_dict(), framed.frames
    assert store is not None and len(state["frames/pixels"]) <= store.capacity
    assert state["data/obs"].dtype == np.int64 and state["data/obs"].shape == (capacity, K)
    plain2 = PrioritizedTable(spec, capacity, seed=7)
    framed2 = PrioritizedTable(spec, capacity, seed=7, frames=FrameStore(layout, 2 * capacity))
    assert memory_role.restore(plain2, paths["plain"]) == capacity
    assert memory_role.restore(framed2, paths["framed"]) == capacity
    assert framed2.frames is not None and framed2.frames.next == store.next
    # The restored tables go on alike (the restored store no longer knows the previous
    # shipments: it stores their frames again; what is sampled is the same).
    feed_and_compare(plain2, framed2, shipments[20:], seed=3)


def test_an_emptied_queue_snapshot_restores(tmp_path):
    # A trajectory queue the learner drained (every unroll sampled) when the run was
    # interrupted: its snapshot holds no items, and resuming the run restores it.
    t = 3
    spec = unroll_spec(t)
    layout = layout_of(spec)
    queue = Table.queue(spec, 10, FrameStore(layout, 4 * layout.max_frames))
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (2, t + K, H, W), dtype=np.uint8)
    windows = np.stack([frames[:, s : s + K] for s in range(t + 1)], axis=1)
    obs = np.moveaxis(windows, 2, -1)  # sliding stacks: [2, T + 1, H, W, K]
    batch = {"obs": obs, "action": np.zeros((2, t), np.int64),
             "reward": np.zeros((2, t), np.float32)}  # fmt: skip
    queue.insert(layout.pack(batch))
    queue.sample(2)
    state = queue.state_dict()
    assert state["data/obs"].shape[0] == 0
    again = Table.queue(spec, 10, FrameStore(layout, 4 * layout.max_frames))
    again.load_state_dict(state)
    assert again.size == 0 and again.inserted == 2
    again.insert(layout.pack(batch))
    np.testing.assert_array_equal(again.sample(1).data["obs"], obs[:1])


def _corrupt_ids(state):
    state["data/obs"] = state["data/obs"] + 10_000
    return state


def _short_pixels(state):
    state["frames/pixels"] = state["frames/pixels"][1:]
    return state


def _other_frame_capacity(state):
    state["frames/capacity"] = state["frames/capacity"] + 1
    return state


def _pixels_missing(state):
    del state["frames/pixels"]
    return state


@pytest.mark.parametrize("corrupt", [_corrupt_ids, _short_pixels, _other_frame_capacity,
                                     _pixels_missing])  # fmt: skip
def test_a_snapshot_that_does_not_fit_the_frames_is_refused(corrupt):
    spec = transition_spec()
    layout = layout_of(spec)
    source = UniformTable(spec, 40, frames=FrameStore(layout, 80))
    for shipment in transition_shipments(5, steps=60):
        source.insert(shipment)
    target = UniformTable(spec, 40, frames=FrameStore(layout, 80))
    target.insert(transition_shipments(6, steps=20)[0])
    before = target.state_dict()
    with pytest.raises(ReplayError):
        target.load_state_dict(corrupt(source.state_dict()))
    after = target.state_dict()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


# --- malformed wire batches ------------------------------------------------------------


def _index_out_of_range(w):
    w[FRAMES_KEY]["obs"] = w[FRAMES_KEY]["obs"] + len(w[FRAMES_KEY][PIXELS])


def _negative_index(w):
    w[FRAMES_KEY]["next_obs"] = w[FRAMES_KEY]["next_obs"] - 10_000


def _float_index(w):
    w[FRAMES_KEY]["obs"] = w[FRAMES_KEY]["obs"].astype(np.float32)


def _uint8_index(w):
    w[FRAMES_KEY]["obs"] = w[FRAMES_KEY]["obs"].astype(np.uint8)


def _index_shape(w):
    w[FRAMES_KEY]["obs"] = w[FRAMES_KEY]["obs"][:, :2]


def _index_rows(w):
    w[FRAMES_KEY]["obs"] = w[FRAMES_KEY]["obs"][1:]


def _pixels_dtype(w):
    w[FRAMES_KEY][PIXELS] = w[FRAMES_KEY][PIXELS].astype(np.float32)


def _pixels_shape(w):
    w[FRAMES_KEY][PIXELS] = w[FRAMES_KEY][PIXELS][:, :, :3]


def _no_pixels(w):
    del w[FRAMES_KEY][PIXELS]


def _extra_entry(w):
    w[FRAMES_KEY]["reward"] = np.zeros(3, np.int32)


def _unreferenced_frame(w):
    pixels = w[FRAMES_KEY][PIXELS]
    w[FRAMES_KEY][PIXELS] = np.concatenate([pixels, pixels[:1]])


def _stacks_and_indexes(w):
    w["obs"] = np.zeros((len(w["action"]), *STACK), np.uint8)


def _not_a_dict(w):
    w[FRAMES_KEY] = w[FRAMES_KEY][PIXELS]


def _too_many_frames_per_item(w):
    n = len(w["action"])
    w[FRAMES_KEY][PIXELS] = np.random.default_rng(0).integers(0, 256, (9 * n, H, W, 1), np.uint8)
    w[FRAMES_KEY]["obs"] = np.arange(4 * n, dtype=np.int32).reshape(n, 4)
    w[FRAMES_KEY]["next_obs"] = (np.arange(4 * n, dtype=np.int32) + 5 * n).reshape(n, 4)
    w[FRAMES_KEY]["obs"][:, 0] = 4 * n + np.arange(n)  # 9 frames an item


MALFORMED = [
    _index_out_of_range,
    _negative_index,
    _float_index,
    _uint8_index,
    _index_shape,
    _index_rows,
    _pixels_dtype,
    _pixels_shape,
    _no_pixels,
    _extra_entry,
    _unreferenced_frame,
    _stacks_and_indexes,
    _not_a_dict,
    _too_many_frames_per_item,
]


@pytest.fixture
def framed_and_wire():
    spec = transition_spec()
    layout = layout_of(spec)
    table = PrioritizedTable(spec, 50, seed=0, frames=FrameStore(layout, 100))
    shipments = transition_shipments(7, steps=40)
    for shipment in shipments[:-1]:
        table.insert(layout.pack(shipment), source=0)
    return table, layout.pack(shipments[-1])


def _state(table) -> dict:
    return {k: np.array(v, copy=True) for k, v in table.state_dict().items()}


@pytest.mark.parametrize("mutate", MALFORMED)
def test_malformed_wire_batches_are_refused_and_change_nothing(framed_and_wire, mutate):
    table, wire = framed_and_wire
    wire = {**wire, FRAMES_KEY: dict(wire[FRAMES_KEY])}
    mutate(wire)
    before, next_frame = _state(table), table.frames.next
    with pytest.raises(ReplayError):
        table.check_insert(wire)
    with pytest.raises(ReplayError):
        table.insert(wire, source=0)
    after = _state(table)
    assert sorted(after) == sorted(before) and table.frames.next == next_frame
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_the_memory_shard_answers_malformed_frames_with_invalid_argument(framed_and_wire):
    import grpc

    from easyrl.errors import TransportError
    from easyrl.transport import rpc
    from easyrl.transport.clients import MemoryClient

    table, wire = framed_and_wire
    memory = memory_role.MemoryServer(LimitedTable(table, RateLimiter(1), 4))
    server, port = rpc.make_server("127.0.0.1:0", "t0ken", max_workers=4)
    rpc.add_servicer("memory", memory, server)
    server.start()
    client = MemoryClient(rpc.Client(rpc.stub_class("memory"), f"127.0.0.1:{port}", "t0ken"))
    try:
        bad = {**wire, FRAMES_KEY: dict(wire[FRAMES_KEY])}
        _index_out_of_range(bad)
        before = _state(table)
        with pytest.raises(TransportError) as info:
            client.insert(bad, actor=0)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert re.search(r"frame indexes must be in \[0, \d+\)", str(info.value))
        after = _state(table)
        for key in before:
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)
        inserted = table.inserted
        client.insert(wire, actor=0)  # the well-formed batch goes in
        assert table.inserted == inserted + len(wire["action"])
        status = memory.Status(None, None).counters
        assert status["memory/0/frames_stored"] == table.frames.next
    finally:
        memory.close()
        server.stop(None).wait()


# --- a cluster ----------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_small_apex_cluster_on_pong_trains_with_frame_storage(launch):  # noqa: F811
    pytest.importorskip("ale_py")
    run = launch(
        "stop.max_seconds=120",
        "stop.max_env_steps=1600",
        *one_each(),
        "env.num_envs=2",
        "env.vector=sync",
        "env.atari.screen_size=42",
        "model.conv=[[16, 8, 4], [32, 4, 2]]",
        "model.hidden=[64]",
        "replay.capacity=1000",
        "replay.min_size_to_sample=100",
        "replay.samples_per_insert=null",
        "replay.error_buffer=null",
        "algorithm.batch_size=16",
        "algorithm.target_update_period=50",
        "actor.send_every=4",
        config=ROOT / "configs" / "pong_apex.yaml",
    )
    code = run.wait(280)
    output = run.output()
    assert code == 0, f"exit code {code}:\n{output}\n{run.logs()}"
    assert "Traceback" not in output + run.logs(), output + run.logs()
    summary = run.summary()
    assert "max_env_steps" in summary["reason"], summary["reason"]
    ps = _counters(summary, "ps/0")
    assert ps["learner/0/updates"] > 0 and ps["ps/0/applied"] > 0, ps
    memory = _counters(summary, "memory/0")
    assert memory["memory/0/inserts"] > 0 and memory["memory/0/samples"] > 0
    # The actor shipped distinct frames; the shard matched the overlap with its previous
    # shipment and stored about one frame per transition.
    assert 0 < memory["memory/0/frames_stored"] < 1.5 * memory["memory/0/inserts"], memory
    assert memory["memory/0/frames_matched"] > 0, memory
    logs = "\n".join(p.read_text(errors="replace") for p in (run.run_dir / "logs").glob("*"))
    assert "Traceback" not in logs


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_small_impala_cluster_on_pong_trains_with_frame_storage(launch):  # noqa: F811
    pytest.importorskip("ale_py")
    run = launch(
        "stop.max_seconds=120",
        "stop.max_env_steps=1500",
        *one_each(),
        "env.num_envs=2",
        "env.vector=sync",
        "algorithm.unroll_length=8",
        "algorithm.batch_size=2",
        "replay.capacity=8",
        "model.hidden=[64]",
        config=ROOT / "configs" / "pong_impala.yaml",
        base=("stop.episode_return_mean=null", "run.log_interval_s=0.5"),
    )
    code = run.wait(280)
    output = run.output()
    assert code == 0, f"exit code {code}:\n{output}\n{run.logs()}"
    logs = "\n".join(p.read_text(errors="replace") for p in (run.run_dir / "logs").glob("*"))
    assert "Traceback" not in output + logs, output + logs
    summary = run.summary()
    ps = _counters(summary, "ps/0")
    assert ps["learner/0/updates"] > 0, ps
    memory = _counters(summary, "memory/0")
    unrolls = memory["memory/0/inserts"]
    assert unrolls > 0 and memory["memory/0/samples"] > 0
    # At most T + k = 12 frames an unroll (sliding stacks), not (T + 1) * k = 36.
    assert 0 < memory["memory/0/frames_stored"] <= 12 * unrolls, memory
