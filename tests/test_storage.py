"""The storage under a replay table (easyrl.replay.storage): the table reads and writes
items through it, and its snapshot entries are the checkpoint format memory shards have
always written (a checkpoint from before the storage layer still loads)."""

import numpy as np
import pytest
from test_frames import layout_of, random_items, transition_spec

from easyrl.replay import Columns, FrameColumns, FrameStore, PrioritizedTable, Table, UniformTable

PRIORITIZED = ["priorities", "max_priority", "alpha", "priority_epsilon", "stale_updates"]
FRAMES = ["frames/capacity", "frames/next", "frames/pixels"]
COLUMNS = ["data/obs", "data/action", "data/reward", "data/next_obs", "data/discount"]


def _tables(frames: bool) -> dict[str, Table]:
    spec = transition_spec()

    def store(size: int):
        return FrameStore(layout_of(spec), size) if frames else None

    return {
        "uniform": UniformTable(spec, 8, seed=1, frames=store(40)),
        "prioritized": PrioritizedTable(spec, 8, seed=1, frames=store(40)),
        "queue": Table.queue(spec, 8, store(8 * layout_of(spec).max_frames)),
    }


@pytest.mark.parametrize("frames", [False, True], ids=["columns", "frame-columns"])
@pytest.mark.parametrize("kind", ["uniform", "prioritized", "queue"])
def test_snapshot_entries_are_the_checkpoint_format(kind, frames):
    """The entries of each table's snapshot, by name, dtype and shape: a ring of plain
    columns has no ``removed``; frame-stack columns hold ``[size, k]`` int64 frame ids."""
    table = _tables(frames)[kind]
    assert isinstance(table.storage, FrameColumns if frames else Columns)
    rng = np.random.default_rng(0)
    for source in range(3):
        table.insert(random_items(rng, 2), source=source)
    if kind == "queue":
        table.sample(1)  # a queue's snapshot holds what samples removed
    state = table.state_dict()
    expected = ["capacity", "inserted", *COLUMNS]
    expected += ["removed"] if frames or kind == "queue" else []
    expected += PRIORITIZED if kind == "prioritized" else []
    expected += FRAMES if frames else []
    assert sorted(state) == sorted(expected)
    size = table.size
    stack = (4,) if frames else (6, 5, 4)
    assert state["data/obs"].shape == state["data/next_obs"].shape == (size, *stack)
    assert state["data/obs"].dtype == (np.int64 if frames else np.uint8)
    assert state["data/action"].shape == (size,) and state["data/action"].dtype == np.int64
    store = table.frames
    if store is not None:
        low = int(min(state["data/obs"].min(), state["data/next_obs"].min()))
        assert state["frames/next"] == store.next
        assert state["frames/pixels"].shape == (state["frames/next"] - low, 6, 5, 1)
    restored = _tables(frames)[kind]
    restored.load_state_dict(state)
    for name in COLUMNS:
        np.testing.assert_array_equal(restored.state_dict()[name], state[name])


def test_the_storage_counts_what_a_ring_dropped_for_its_frames():
    """A frame ring far too small for random frames: the storage's writes make the oldest
    items stale, the table drops them (``removed``), and the storage's status says so."""
    spec = transition_spec()
    store = FrameStore(layout_of(spec), 20)
    table = UniformTable(spec, 16, frames=store)
    rng = np.random.default_rng(1)
    for _ in range(6):
        table.insert(random_items(rng, 2))
    status = table.storage.status()
    assert table.dropped > 0 and status["dropped_for_frames"] == table.dropped
    assert table.removed == table.dropped and table.size == table.inserted - table.removed
    assert status["frames_stored"] == store.next
    assert Columns(table.spec, 4).status() == {}
