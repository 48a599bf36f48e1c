"""What a sample is, wherever it is: the one sampled-batch type (`Sampled`) a table draws, a
memory shard serves, a `MemoryClient` returns and a learner's loop takes, and the one answer
for a round that is not there (`NotReady`)."""

from typing import NamedTuple

import numpy as np

Batch = dict[str, np.ndarray]
"""Named columns, batch-major: the items of a replay table, or what a collector ships."""


def _none(dtype) -> np.ndarray:
    empty = np.zeros(0, dtype)
    empty.setflags(write=False)
    return empty


NO_KEYS = _none(np.int64)
"""The keys of a sample without any (a whole round)."""
NO_WEIGHTS = _none(np.float32)
"""The importance weights of a sample without any (a whole round)."""


class Sampled(NamedTuple):
    """Items a sample returns."""

    data: Batch
    """Column name -> ``[B, *shape]`` items."""
    keys: np.ndarray = NO_KEYS
    """``[B]`` int64 keys for priority updates (`NO_KEYS`: a whole round's, which has none)."""
    weights: np.ndarray = NO_WEIGHTS
    """``[B]`` float32 importance weights, normalised by the batch max (ones if uniform;
    `NO_WEIGHTS`: a whole round's)."""
    round: int = 0
    """The round the items belong to (tables of rounds)."""
    probabilities: np.ndarray | None = None
    """``[B]`` float64 probability with which each item was drawn (the table's; they stay in
    the memory shard)."""


class NotReady(NamedTuple):
    """A sample that cannot be served, now or ever: the caller asks again as it says."""

    round: int
    """The round being collected (the caller is behind when it asked for an older one)."""
    incomplete: bool = False
    """The round asked for cannot be completed (a restarted shard lost part of it)."""


def split_sample(sampled: Sampled, parts: int) -> list[Sampled]:
    """A sample of `parts` batches (a learner's `learner.batches_per_sample`) as `parts`
    equal batches, in order, as views. Each keeps its rows' keys and weights (normalised by
    the max of the whole sample: one batch's may stay under 1).

    Raises:
        ValueError: the sample's rows do not split into `parts` equal batches.
    """
    if parts == 1:
        return [sampled]
    rows = len(next(iter(sampled.data.values())))
    if parts < 1 or rows % parts:
        raise ValueError(f"a sample of {rows} items does not split into {parts} equal batches")
    size = rows // parts

    def rows_of(array, i: int):  # a sample without keys or weights (a round's) keeps them empty
        return array[i * size : (i + 1) * size] if len(array) else array

    return [
        sampled._replace(
            data={name: rows_of(column, i) for name, column in sampled.data.items()},
            keys=rows_of(sampled.keys, i),
            weights=rows_of(sampled.weights, i),
            probabilities=None
            if sampled.probabilities is None
            else rows_of(sampled.probabilities, i),
        )
        for i in range(parts)
    ]
