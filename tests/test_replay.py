"""Replay tables: batch validation, uniform and prioritized sampling, ring wraparound."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from easyrl.errors import ReplayError
from easyrl.replay import PrioritizedTable, Sampled, UniformTable, item_bytes, validate_batch
from easyrl.replay.sampled import split_sample
from easyrl.replay.tables import TableSpec

SPEC: TableSpec = {
    "obs": ((4,), np.dtype(np.float32)),
    "action": ((), np.dtype(np.int64)),
    "reward": ((), np.dtype(np.float32)),
    "next_obs": ((4,), np.dtype(np.float32)),
    "discount": ((), np.dtype(np.float32)),
}


def make_batch(n: int, start: int = 0) -> dict[str, np.ndarray]:
    """Batch whose item i carries its index ``start + i`` in every column."""
    ids = np.arange(start, start + n)
    obs = np.repeat(ids[:, None], 4, axis=1).astype(np.float32) + np.arange(4, dtype=np.float32)
    return {
        "obs": obs,
        "action": ids.astype(np.int64),
        "reward": ids.astype(np.float32) * 0.5,
        "next_obs": obs + 1.0,
        "discount": np.full(n, 0.99, dtype=np.float32),
    }


def assert_data_matches_keys(sample: Sampled) -> None:
    """Every sampled row must be the item that was inserted under its key."""
    expected = make_batch(1)  # shape reference only
    for name in expected:
        assert sample.data[name].shape == (sample.keys.size, *SPEC[name][0])
        assert sample.data[name].dtype == SPEC[name][1]
    np.testing.assert_array_equal(sample.data["action"], sample.keys)
    np.testing.assert_array_equal(sample.data["obs"][:, 0], sample.keys.astype(np.float32))
    np.testing.assert_array_equal(sample.data["next_obs"], sample.data["obs"] + 1.0)


def assert_states_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# --- validate_batch -------------------------------------------------------------------------


def _wrong_dtype(b: dict[str, np.ndarray]) -> None:
    b["obs"] = b["obs"].astype(np.float64)


def _wrong_item_shape(b: dict[str, np.ndarray]) -> None:
    b["next_obs"] = np.zeros((len(b["obs"]), 5), np.float32)


def _missing_batch_dim(b: dict[str, np.ndarray]) -> None:
    b["obs"] = b["obs"][0]


def _missing_column(b: dict[str, np.ndarray]) -> None:
    del b["discount"]


def _extra_column(b: dict[str, np.ndarray]) -> None:
    b["extra"] = np.zeros(len(b["obs"]), np.float32)


def _mismatched_n(b: dict[str, np.ndarray]) -> None:
    b["reward"] = b["reward"][:-1]


def _not_an_array(b: dict[str, np.ndarray]) -> None:
    b["action"] = b["action"].tolist()  # type: ignore[assignment]


def _empty(b: dict[str, np.ndarray]) -> None:
    for name in b:
        b[name] = b[name][:0]


BAD_BATCHES: dict[str, tuple[Callable[[dict[str, np.ndarray]], None], str]] = {
    "wrong_dtype": (_wrong_dtype, "column 'obs': expected dtype float32, got float64"),
    "wrong_item_shape": (_wrong_item_shape, r"column 'next_obs': expected shape .* got \(3, 5\)"),
    "missing_batch_dim": (_missing_batch_dim, r"column 'obs': expected shape .* got \(4,\)"),
    "missing_column": (_missing_column, r"missing \['discount'\]"),
    "extra_column": (_extra_column, r"unexpected \['extra'\]"),
    "mismatched_n": (_mismatched_n, "column 'reward': expected batch size 3 .* got 2"),
    "not_an_array": (_not_an_array, "column 'action': expected a numpy array"),
    "empty": (_empty, "at least one item"),
}


def test_item_bytes_counts_every_column_whole() -> None:
    atari = {
        "obs": ((42, 42, 4), "uint8"),
        "action": ((), "int64"),
        "reward": ((), np.float32),
        "next_obs": ((42, 42, 4), np.dtype("uint8")),
    }
    assert item_bytes(atari) == 2 * 42 * 42 * 4 + 8 + 4  # stacks whole: 14,124
    assert item_bytes({"x": ((0, 5), "float64")}) == 0


def test_validate_batch_returns_n() -> None:
    assert validate_batch(SPEC, make_batch(7)) == 7


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
@pytest.mark.parametrize("table_cls", [UniformTable, PrioritizedTable])
def test_bad_batches_raise_and_leave_table_unchanged(case: str, table_cls: type) -> None:
    mutate, message = BAD_BATCHES[case]
    table = table_cls(SPEC, capacity=8)
    table.insert(make_batch(8))  # full: every slot is visible in the state dict
    before = table.state_dict()
    bad = make_batch(3, start=100)
    mutate(bad)
    with pytest.raises(ReplayError, match=message):
        validate_batch(SPEC, bad)
    with pytest.raises(ReplayError, match=message):
        table.insert(bad)
    assert_states_equal(table.state_dict(), before)
    assert table.inserted == 8


# --- UniformTable ---------------------------------------------------------------------------


def test_uniform_insert_and_sample() -> None:
    table = UniformTable(SPEC, capacity=100, seed=3)
    keys = table.insert(make_batch(30))
    np.testing.assert_array_equal(keys, np.arange(30))
    assert keys.dtype == np.int64
    np.testing.assert_array_equal(table.insert(make_batch(5, start=30)), np.arange(30, 35))
    assert (table.size, table.inserted, table.capacity) == (35, 35, 100)
    sample = table.sample(10_000)
    assert_data_matches_keys(sample)
    assert sample.weights.dtype == np.float32 and np.all(sample.weights == 1.0)
    np.testing.assert_allclose(sample.probabilities, 1 / 35)
    freq = np.bincount(sample.keys, minlength=35) / 10_000
    assert np.max(np.abs(freq - 1 / 35)) < 0.015


def test_uniform_wraparound() -> None:
    table = UniformTable(SPEC, capacity=10, seed=0)
    for start in range(0, 28, 7):
        table.insert(make_batch(7, start=start))
    assert (table.size, table.inserted) == (10, 28)
    sample = table.sample(2000)
    assert_data_matches_keys(sample)
    assert set(sample.keys.tolist()) == set(range(18, 28))


def test_batch_larger_than_capacity_keeps_last_items() -> None:
    for table in (UniformTable(SPEC, capacity=4), PrioritizedTable(SPEC, capacity=4)):
        table.insert(make_batch(3))
        keys = table.insert(make_batch(10, start=3))
        np.testing.assert_array_equal(keys, np.arange(3, 13))
        assert (table.size, table.inserted) == (4, 13)
        sample = table.sample(500)
        assert_data_matches_keys(sample)
        assert set(sample.keys.tolist()) == {9, 10, 11, 12}


def test_uniform_update_priorities_validates_and_ignores() -> None:
    table = UniformTable(SPEC, capacity=4)
    table.insert(make_batch(6))
    assert table.update_priorities(np.array([0, 5]), np.array([1.0, 2.0])) == 0
    with pytest.raises(ReplayError, match="never issued"):
        table.update_priorities(np.array([6]), np.array([1.0]))
    with pytest.raises(ReplayError, match="finite"):
        table.update_priorities(np.array([5]), np.array([np.nan]))
    with pytest.raises(ReplayError, match="finite"):
        table.insert(make_batch(1), priorities=np.array([-1.0]))
    assert table.inserted == 6


def test_uniform_state_dict_round_trip() -> None:
    table = UniformTable(SPEC, capacity=10, seed=5)
    table.insert(make_batch(13))
    state = table.state_dict()
    assert state["inserted"] == 13 and state["capacity"] == 10
    assert state["data/obs"].shape == (10, 4)
    restored = UniformTable(SPEC, capacity=10, seed=5)
    restored.insert(make_batch(2, start=500))  # overwritten by the load
    restored.load_state_dict(state)
    assert_states_equal(restored.state_dict(), state)
    assert (restored.size, restored.inserted) == (10, 13)
    a, b = table.sample(64), restored.sample(64)
    np.testing.assert_array_equal(a.keys, b.keys)
    assert_data_matches_keys(b)
    np.testing.assert_array_equal(restored.insert(make_batch(1, start=13)), [13])
    assert_data_matches_keys(restored.sample(200))

    partial = UniformTable(SPEC, capacity=10)
    partial.insert(make_batch(4))
    fresh = UniformTable(SPEC, capacity=10)
    fresh.load_state_dict(partial.state_dict())
    assert (fresh.size, fresh.inserted) == (4, 4)
    assert_data_matches_keys(fresh.sample(100))


def test_uniform_load_state_dict_rejects_mismatch() -> None:
    table = UniformTable(SPEC, capacity=10)
    table.insert(make_batch(3))
    before = table.state_dict()
    other = UniformTable(SPEC, capacity=12)
    other.insert(make_batch(5))
    with pytest.raises(ReplayError, match="capacity"):
        table.load_state_dict(other.state_dict())
    bad = dict(before, inserted=7)  # data arrays hold 3 rows, not 7
    with pytest.raises(ReplayError, match="column"):
        table.load_state_dict(bad)
    with pytest.raises(ReplayError, match="unexpected"):
        table.load_state_dict(dict(before, junk=1))
    assert_states_equal(table.state_dict(), before)


def test_sampling_errors() -> None:
    for table in (UniformTable(SPEC, capacity=4), PrioritizedTable(SPEC, capacity=4)):
        with pytest.raises(ReplayError, match="empty"):
            table.sample(1)
        table.insert(make_batch(1))
        with pytest.raises(ReplayError, match="batch_size"):
            table.sample(0)
        with pytest.raises(ReplayError, match="beta"):
            table.sample(1, beta=1.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(capacity=0), "capacity"),
        (dict(capacity=4, seed=-1), "seed"),
        (dict(capacity=4, spec={}), "spec"),
        (dict(capacity=4, spec={"x": ((2,), "not-a-dtype")}), "dtype"),
        (dict(capacity=4, spec={"x": ([2], np.float32)}), "shape"),
        (dict(capacity=4, spec={"x": ((2,), object)}), "object"),
    ],
)
def test_constructor_validation(kwargs: dict[str, Any], message: str) -> None:
    kwargs = {"spec": SPEC, **kwargs}
    for table_cls in (UniformTable, PrioritizedTable):
        with pytest.raises(ReplayError, match=message):
            table_cls(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"), [(dict(alpha=-0.1), "alpha"), (dict(priority_epsilon=np.nan), "eps")]
)
def test_prioritized_constructor_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        PrioritizedTable(SPEC, capacity=4, **kwargs)


# --- PrioritizedTable -----------------------------------------------------------------------


def brute_force_probabilities(priorities: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    weights = (priorities.astype(np.float64) + eps) ** alpha
    return weights / weights.sum()


def sample_frequencies(table: PrioritizedTable, draws: int, batch: int = 1000) -> np.ndarray:
    keys = np.concatenate([table.sample(batch).keys for _ in range(draws // batch)])
    return np.bincount(keys, minlength=table.inserted) / keys.size


def test_prioritized_frequencies_follow_priorities() -> None:
    rng = np.random.default_rng(0)
    priorities = rng.exponential(size=20) * (rng.random(20) > 0.25)
    alpha, eps = 0.6, 1e-6
    table = PrioritizedTable(SPEC, capacity=20, alpha=alpha, priority_epsilon=eps, seed=1)
    table.insert(make_batch(20), priorities=priorities)
    expected = brute_force_probabilities(priorities, alpha, eps)
    freq = sample_frequencies(table, 200_000)
    assert np.max(np.abs(freq - expected)) < 0.01
    # alpha = 0.6 flattens priorities: the raw proportions would be clearly off.
    assert np.max(np.abs(freq - priorities / priorities.sum())) > 0.02


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_prioritized_importance_weights_match_formula(beta: float) -> None:
    rng = np.random.default_rng(2)
    priorities = rng.uniform(0.0, 5.0, size=30)
    table = PrioritizedTable(SPEC, capacity=50, alpha=0.7, priority_epsilon=0.01, seed=4)
    table.insert(make_batch(30), priorities=priorities)
    sample = table.sample(64, beta=beta)
    assert_data_matches_keys(sample)
    probs = brute_force_probabilities(priorities, 0.7, 0.01)[sample.keys]
    np.testing.assert_allclose(sample.probabilities, probs, rtol=1e-12)
    expected = (30 * probs) ** -beta
    expected /= expected.max()
    assert sample.weights.dtype == np.float32
    np.testing.assert_allclose(sample.weights, expected, rtol=1e-6)
    assert sample.weights.max() == 1.0


def test_priority_update_changes_frequencies() -> None:
    table = PrioritizedTable(SPEC, capacity=10, alpha=1.0, priority_epsilon=0.0, seed=7)
    keys = table.insert(make_batch(10))  # all get the initial max priority 1.0
    freq = sample_frequencies(table, 50_000)
    assert np.max(np.abs(freq - 0.1)) < 0.01
    assert table.update_priorities(keys[[3, 5]], np.array([10.0, 0.0])) == 2
    freq = sample_frequencies(table, 50_000)
    expected = np.ones(10)
    expected[3], expected[5] = 10.0, 0.0
    expected /= expected.sum()
    assert np.max(np.abs(freq - expected)) < 0.01
    assert freq[5] == 0.0
    assert table.max_priority == 10.0
    new_key = table.insert(make_batch(1, start=10))  # new items get the max priority
    np.testing.assert_allclose(table.priorities(new_key), [10.0])


def test_duplicate_keys_in_update_last_one_wins() -> None:
    table = PrioritizedTable(SPEC, capacity=4, alpha=1.0, priority_epsilon=0.0)
    table.insert(make_batch(4))
    assert table.update_priorities(np.array([1, 2, 1]), np.array([5.0, 3.0, 2.0])) == 3
    np.testing.assert_array_equal(table.priorities(np.arange(4)), [1.0, 2.0, 3.0, 1.0])


def test_stale_keys_are_skipped_and_counted() -> None:
    table = PrioritizedTable(SPEC, capacity=5, alpha=1.0, priority_epsilon=0.0)
    table.insert(make_batch(8))  # keys 3..7 are stored
    applied = table.update_priorities(
        np.array([0, 1, 5, 6, 2]), np.array([9.0, 9.0, 4.0, 3.0, 9.0])
    )
    assert applied == 2
    assert table.stale_updates == 3
    np.testing.assert_array_equal(table.priorities(np.arange(3, 8)), [1.0, 1.0, 4.0, 3.0, 1.0])
    assert table.update_priorities(np.array([0, 1]), np.array([1.0, 1.0])) == 0
    assert table.stale_updates == 5
    with pytest.raises(ReplayError, match="overwritten"):
        table.priorities(np.array([2]))


@pytest.mark.parametrize(
    ("keys", "priorities", "message"),
    [
        ([3, 4], [1.0, np.nan], "finite"),
        ([3, 4], [1.0, -0.5], "finite"),
        ([3, 4], [np.inf, 1.0], "finite"),
        ([3, 4], [1.0], "shape"),
        ([3, 8], [1.0, 1.0], "never issued"),
        ([-1, 4], [1.0, 1.0], "never issued"),
        ([3.0, 4.0], [1.0, 1.0], "integers"),
        ([3, 4], [1e300, 1.0], "overflow"),
    ],
)
def test_invalid_priority_updates_change_nothing(
    keys: list, priorities: list, message: str
) -> None:
    table = PrioritizedTable(SPEC, capacity=5, alpha=2.0)
    table.insert(make_batch(8), priorities=np.arange(8, dtype=float))
    before = table.state_dict()
    with pytest.raises(ReplayError, match=message):
        table.update_priorities(np.array(keys), np.array(priorities))
    assert_states_equal(table.state_dict(), before)
    with pytest.raises(ReplayError):
        table.insert(make_batch(2, start=8), priorities=np.array([1.0, np.nan]))
    assert_states_equal(table.state_dict(), before)


def test_prioritized_wraparound() -> None:
    table = PrioritizedTable(SPEC, capacity=6, alpha=1.0, priority_epsilon=0.0, seed=3)
    table.insert(make_batch(4), priorities=np.full(4, 100.0))
    keys = table.insert(make_batch(5, start=4), priorities=np.arange(1.0, 6.0))
    np.testing.assert_array_equal(keys, np.arange(4, 9))
    assert (table.size, table.inserted) == (6, 9)
    # Keys 0..2 were overwritten: their huge priorities must be gone from the tree.
    freq = sample_frequencies(table, 60_000)
    expected = np.zeros(9)
    expected[3:] = [100.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    expected /= expected.sum()
    assert np.max(np.abs(freq - expected)) < 0.01
    assert_data_matches_keys(table.sample(300))
    state = table.state_dict()
    # Slot order: keys 6, 7, 8 in slots 0..2, then keys 3, 4, 5 in slots 3..5.
    np.testing.assert_array_equal(state["priorities"], [3.0, 4.0, 5.0, 100.0, 1.0, 2.0])


def test_all_zero_priorities_cannot_be_sampled() -> None:
    table = PrioritizedTable(SPEC, capacity=4, priority_epsilon=0.0)
    table.insert(make_batch(2), priorities=np.zeros(2))
    with pytest.raises(ReplayError, match="zero"):
        table.sample(1)


def test_prioritized_state_dict_round_trip() -> None:
    table = PrioritizedTable(SPEC, capacity=8, alpha=0.5, seed=9)
    table.insert(make_batch(11), priorities=np.linspace(0.0, 3.0, 11))
    table.update_priorities(np.array([1, 9]), np.array([2.0, 7.0]))
    state = table.state_dict()
    restored = PrioritizedTable(SPEC, capacity=8, alpha=0.5, seed=9)
    restored.load_state_dict(state)
    assert_states_equal(restored.state_dict(), state)
    assert restored.max_priority == 7.0 and restored.stale_updates == 1
    np.testing.assert_array_equal(table.sample(32, 0.4).keys, restored.sample(32, 0.4).keys)
    with pytest.raises(ReplayError, match="alpha"):
        PrioritizedTable(SPEC, capacity=8, alpha=0.6).load_state_dict(state)


def test_a_sample_of_several_batches_splits_into_them_in_order():
    data = {"obs": np.arange(24, dtype=np.float32).reshape(12, 2), "action": np.arange(12)}
    keys, weights = np.arange(100, 112), np.linspace(0.5, 1.0, 12, dtype=np.float32)
    parts = split_sample(Sampled(data, keys, weights), 3)
    assert [len(p.data["obs"]) for p in parts] == [4, 4, 4]
    np.testing.assert_array_equal(np.concatenate([p.keys for p in parts]), keys)
    np.testing.assert_array_equal(np.concatenate([p.weights for p in parts]), weights)
    np.testing.assert_array_equal(parts[2].data["obs"], data["obs"][8:])
    whole_round = split_sample(Sampled({"obs": np.zeros((4, 2))}), 2)  # no keys nor weights
    assert [len(p.keys) + len(p.weights) for p in whole_round] == [0, 0]
    with pytest.raises(ValueError, match="does not split into 5"):
        split_sample(Sampled(data, keys, weights), 5)
