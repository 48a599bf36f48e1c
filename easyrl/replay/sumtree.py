"""A batch-vectorized binary sum tree for proportional prioritized sampling.

Every operation works on whole numpy batches; the only Python loops run over the tree
levels (``log2(capacity)`` iterations), never over items.
"""

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay.checks import check_indices, check_int


class SumTree:
    """Binary sum tree over ``capacity`` non-negative float64 leaf values.

    The tree is stored in heap layout in one float64 array of length ``2 * n`` where ``n``
    is ``capacity`` rounded up to a power of two: node 1 is the root, node ``i`` has
    children ``2i`` and ``2i + 1``, and leaf ``j`` lives at node ``n + j``. Padding leaves
    (``j >= capacity``) are always 0. Every internal node holds exactly (in float64) the
    sum of its two children.

    Args:
        capacity: Number of leaves, >= 1.

    Raises:
        ReplayError: If ``capacity`` is not an int >= 1.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = check_int("capacity", capacity, 1)
        n = 1
        while n < self._capacity:
            n *= 2
        self._n = n
        self._depth = n.bit_length() - 1  # number of edges from the root to a leaf
        self._nodes = np.zeros(2 * n, dtype=np.float64)  # [2n], node 0 unused

    @property
    def capacity(self) -> int:
        """Number of usable leaves.

        Returns:
            The ``capacity`` given to the constructor.
        """
        return self._capacity

    @property
    def total(self) -> float:
        """Sum of all leaf values (the root node).

        Returns:
            The total as a Python float.
        """
        return float(self._nodes[1])

    @property
    def nodes(self) -> np.ndarray:
        """Read-only view of the heap-layout node array (see the class docstring).

        Returns:
            float64 array of shape ``[2 * n]``; node 0 is unused.
        """
        view = self._nodes.view()
        view.flags.writeable = False
        return view

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        """Validate leaf indices.

        Args:
            indices: 1-D integer array of leaf indices.

        Returns:
            The indices as an int64 array.

        Raises:
            ReplayError: If ``indices`` is not 1-D integer or any index is out of range.
        """
        idx = check_indices("indices", indices)
        if idx.size and (idx.min() < 0 or idx.max() >= self._capacity):
            raise ReplayError(
                f"leaf indices must be in [0, {self._capacity}), "
                f"got range [{idx.min()}, {idx.max()}]"
            )
        return idx

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set a batch of leaf values and recompute the affected internal sums.

        If an index occurs several times in ``indices``, the value of its last occurrence
        wins. The tree is unchanged if validation fails.

        Args:
            indices: ``[K]`` integer leaf indices in ``[0, capacity)``.
            values: ``[K]`` finite values >= 0.

        Raises:
            ReplayError: On bad shapes, out-of-range indices, or non-finite/negative values.
        """
        idx = self._check_indices(indices)  # [K]
        vals = np.asarray(values, dtype=np.float64)  # [K]
        if vals.shape != idx.shape:
            raise ReplayError(
                f"values must have the shape of indices {idx.shape}, got {vals.shape}"
            )
        if not np.all(np.isfinite(vals)) or np.any(vals < 0):
            raise ReplayError("sum tree values must be finite and >= 0")
        if idx.size == 0:
            return
        # Keep the last occurrence of each index: unique over the reversed array returns
        # the first position in reversed order, i.e. the last one in the original order.
        uniq, rev_pos = np.unique(idx[::-1], return_index=True)  # [U], [U]
        last_pos = idx.size - 1 - rev_pos  # [U]
        nodes = uniq + self._n  # [U]
        tree = self._nodes
        tree[nodes] = vals[last_pos]
        for _ in range(self._depth):
            # The parents, repeats included: a repeated parent gets the same sum each time
            # (its children were all set one level below), which is ~4x cheaper than making
            # each level unique first.
            nodes = nodes >> 1  # [U]
            left = nodes << 1  # [U]
            tree[nodes] = tree[left] + tree[left + 1]

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Read a batch of leaf values.

        Args:
            indices: ``[K]`` integer leaf indices in ``[0, capacity)``.

        Returns:
            ``[K]`` float64 leaf values (a copy).

        Raises:
            ReplayError: On bad shapes or out-of-range indices.
        """
        idx = self._check_indices(indices)
        return self._nodes[idx + self._n]

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """Map prefix sums to leaves by a batched descent from the root.

        For each ``u`` returns the leaf ``i`` with
        ``sum(leaf[:i]) <= u < sum(leaf[:i + 1])``. Leaves with value 0 are never
        returned: where rounding would lead into an empty subtree the descent takes the
        non-empty sibling, so ``u == total`` (or a value rounded up to it) maps to the
        last non-zero leaf.

        Args:
            prefix_sums: ``[K]`` values in ``[0, total]``.

        Returns:
            ``[K]`` int64 leaf indices.

        Raises:
            ReplayError: If the tree is empty (total 0), or any value is non-finite,
                negative, or greater than ``total``.
        """
        u = np.array(prefix_sums, dtype=np.float64)  # [K] (copy, modified below)
        if u.ndim != 1:
            raise ReplayError(f"prefix_sums must be 1-D, got shape {u.shape}")
        total = self._nodes[1]
        if total <= 0:
            raise ReplayError("cannot search a sum tree whose total is 0")
        if not np.all(np.isfinite(u)) or np.any(u < 0) or np.any(u > total):
            raise ReplayError(f"prefix_sums must be finite and in [0, total={total!r}]")
        node = np.ones(u.shape, dtype=np.int64)  # [K]
        for _ in range(self._depth):
            left = self._nodes[2 * node]  # [K]
            right = self._nodes[2 * node + 1]  # [K]
            go_right = ((u >= left) & (right > 0)) | (left <= 0)  # [K]
            u = np.where(go_right, u - left, u)
            node = 2 * node + go_right
        return node - self._n

    def stratified_sample(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Draw one leaf per stratum: ``[0, total)`` is cut into ``batch_size`` equal parts.

        Args:
            batch_size: Number of leaves to draw, >= 1.
            rng: Source of the uniform draws.

        Returns:
            ``[batch_size]`` int64 leaf indices, each drawn with probability
            ``leaf / total`` on average over the strata.

        Raises:
            ReplayError: If ``batch_size`` < 1 or the tree is empty.
        """
        batch_size = check_int("batch_size", batch_size, 1)
        total = float(self._nodes[1])
        if total <= 0:
            raise ReplayError("cannot sample from a sum tree whose total is 0")
        u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)  # [B]
        return self.find(np.minimum(u, total))
