"""SumTree against brute-force numpy references."""

import numpy as np
import pytest

from easyrl.errors import ReplayError
from easyrl.replay.sumtree import SumTree


def reference_nodes(leaves: np.ndarray) -> np.ndarray:
    """Heap-layout node array built level by level from padded leaves."""
    n = 1
    while n < leaves.size:
        n *= 2
    nodes = np.zeros(2 * n)
    nodes[n : n + leaves.size] = leaves
    k = n
    while k > 1:
        k //= 2
        nodes[k : 2 * k] = nodes[2 * k : 4 * k : 2] + nodes[2 * k + 1 : 4 * k : 2]
    return nodes


@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 8, 100, 1000])
def test_random_updates_with_duplicates_match_reference(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    leaves = np.zeros(capacity)
    for _ in range(30):
        k = int(rng.integers(1, 2 * capacity + 2))
        indices = rng.integers(0, capacity, k)  # duplicates are frequent
        values = rng.exponential(size=k) * (rng.random(k) > 0.2)
        tree.update(indices, values)
        for i, v in zip(indices, values):  # brute force: sequential, last one wins
            leaves[i] = v
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), leaves)
        np.testing.assert_array_equal(tree.nodes, reference_nodes(leaves))
        assert tree.total == pytest.approx(leaves.sum(), rel=1e-12, abs=1e-12)


def test_duplicate_indices_last_one_wins() -> None:
    tree = SumTree(4)
    tree.update(np.array([2, 1, 2, 2, 1]), np.array([5.0, 1.0, 7.0, 3.0, 4.0]))
    np.testing.assert_array_equal(tree.get(np.arange(4)), [0.0, 4.0, 3.0, 0.0])
    assert tree.total == 7.0


@pytest.mark.parametrize("capacity", [1, 5, 64, 777])
def test_find_matches_searchsorted(capacity: int) -> None:
    rng = np.random.default_rng(1)
    tree = SumTree(capacity)
    leaves = rng.exponential(size=capacity) * (rng.random(capacity) > 0.3)
    if leaves.sum() == 0:
        leaves[-1] = 1.0
    tree.update(np.arange(capacity), leaves)
    u = rng.uniform(0.0, tree.total, 20_000)
    expected = np.searchsorted(np.cumsum(leaves), u, side="right")
    np.testing.assert_array_equal(tree.find(u), expected)


def test_find_never_returns_zero_leaves_at_edges() -> None:
    leaves = np.array([0.0, 0.0, 1.0, 0.0, 2.5, 0.0, 0.0, 0.5, 0.0, 0.0])
    tree = SumTree(leaves.size)
    tree.update(np.arange(leaves.size), leaves)
    cumsum = np.cumsum(leaves)
    u = np.concatenate(
        [
            [0.0, tree.total, np.nextafter(tree.total, 0.0)],
            cumsum,  # every boundary, including the total
            np.nextafter(cumsum, 0.0),
            np.random.default_rng(0).uniform(0.0, tree.total, 5000),
        ]
    )
    u = np.minimum(u, tree.total)
    found = tree.find(u)
    assert np.all(leaves[found] > 0)
    assert found[0] == 2  # u = 0 skips the leading zero leaves
    assert found[1] == 7  # u = total maps to the last non-zero leaf


def test_find_rejects_out_of_range_and_empty_tree() -> None:
    tree = SumTree(4)
    with pytest.raises(ReplayError, match="total is 0"):
        tree.find(np.array([0.0]))
    tree.update(np.array([1]), np.array([2.0]))
    for bad in ([-0.1], [2.5], [np.nan]):
        with pytest.raises(ReplayError, match="prefix_sums"):
            tree.find(np.array(bad))


def test_stratified_sample_frequencies_match_probabilities() -> None:
    rng = np.random.default_rng(123)
    leaves = rng.exponential(size=50) * (rng.random(50) > 0.2)
    tree = SumTree(50)
    tree.update(np.arange(50), leaves)
    draws = np.concatenate([tree.stratified_sample(1000, rng) for _ in range(200)])  # 200k
    freq = np.bincount(draws, minlength=50) / draws.size
    p = leaves / leaves.sum()
    assert np.max(np.abs(freq - p)) < 0.01
    assert np.all(freq[leaves == 0] == 0)


def test_stratified_sample_hits_every_stratum() -> None:
    tree = SumTree(8)
    tree.update(np.arange(8), np.ones(8))
    # With 8 equal leaves and 8 strata, stratum i lies exactly on leaf i.
    np.testing.assert_array_equal(tree.stratified_sample(8, np.random.default_rng(0)), np.arange(8))


def test_invalid_updates_raise_and_leave_tree_unchanged() -> None:
    tree = SumTree(6)
    tree.update(np.arange(6), np.arange(6, dtype=float))
    before = tree.nodes.copy()
    bad_cases = [
        (np.array([0, 1]), np.array([1.0, np.nan])),
        (np.array([0, 1]), np.array([1.0, -1e-9])),
        (np.array([0, 1]), np.array([np.inf, 1.0])),
        (np.array([0, 6]), np.array([1.0, 1.0])),
        (np.array([-1]), np.array([1.0])),
        (np.array([0, 1]), np.array([1.0])),
        (np.array([0.0]), np.array([1.0])),
    ]
    for indices, values in bad_cases:
        with pytest.raises(ReplayError):
            tree.update(indices, values)
        np.testing.assert_array_equal(tree.nodes, before)


@pytest.mark.parametrize("capacity", [0, -3, 2.0, True])
def test_constructor_rejects_bad_capacity(capacity: object) -> None:
    with pytest.raises(ReplayError, match="capacity"):
        SumTree(capacity)  # type: ignore[arg-type]


def test_stratified_sample_rejects_bad_batch_and_empty_tree() -> None:
    tree = SumTree(3)
    with pytest.raises(ReplayError, match="total is 0"):
        tree.stratified_sample(4, np.random.default_rng(0))
    tree.update(np.array([0]), np.array([1.0]))
    with pytest.raises(ReplayError, match="batch_size"):
        tree.stratified_sample(0, np.random.default_rng(0))


def test_nodes_view_is_read_only() -> None:
    tree = SumTree(3)
    with pytest.raises(ValueError):
        tree.nodes[1] = 5.0
