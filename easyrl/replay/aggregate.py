"""The aggregate table of synchronous rounds (PPO, ES).

A round is everything the actors produce under one published weight round ``r``. The
table collects round ``r`` until it holds at least ``round_size`` items, then releases the
whole round to the learner at once and starts collecting ``r + 1``. Items tagged with an
older round than the one being collected are refused and counted, never mixed in.

A table of a restarted shard cannot know what its previous process held: the first round
it collects is marked incomplete (items shipped before the restart are gone, and their
actors wait for the next round), and the learner abandons that round instead of waiting
for it. Every later round starts after the restart, so it is whole.

A memory shard serves the table as it is (it is a `served.ServedTable`): an Insert carries
its round, a Sample asks for a round (batch size 0: all of it) and waits until it is
complete; there are no priorities, no prefetch and no snapshot.
"""

from typing import Any

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay.checks import TableSpec, validate_batch, validate_spec
from easyrl.replay.sampled import Batch, NotReady, Sampled


class AggregateTable:
    """Collects one round of items and releases it whole (a `ServedTable`).

    Args:
        spec: column name -> (item shape, dtype).
        capacity: most items held at once; an insert beyond it is refused with an error.
        round_size: items that complete a round (what this shard's actors ship per round).
        restarted: this shard ran before (a restart or a resumed run): the first round
            the table collects is incomplete.

    Raises:
        ReplayError: a malformed spec, or sizes that are not positive or cannot hold a round.
    """

    def __init__(
        self, spec: TableSpec, capacity: int, round_size: int, restarted: bool = False
    ) -> None:
        self._spec = validate_spec(spec)
        if not 1 <= round_size <= capacity:
            raise ReplayError(
                f"round_size must be in [1, capacity={capacity}], got {round_size}; "
                "raise replay.capacity to hold a whole round"
            )
        self.capacity = capacity
        self.round_size = round_size
        self.round = 0
        """The round being collected."""
        self._parts: list[dict[str, np.ndarray]] = []
        self._size = 0
        self.inserted = 0
        self.refused = 0
        """Items dropped: inserted for a round already released, or held for a round a
        newer one superseded."""
        self.released_rounds = 0
        self._restarted = restarted
        self.incomplete_round: int | None = None
        """The round this restarted table cannot complete (None: every round is whole)."""
        self.batch_size = round_size
        """The largest Sample reply holds a round (at least `round_size` items)."""

    @property
    def spec(self) -> TableSpec:
        """The table's column spec."""
        return dict(self._spec)

    @property
    def size(self) -> int:
        """Items held for the round being collected."""
        return self._size

    def insert(self, batch: dict[str, np.ndarray], round_: int) -> bool:
        """Adds items collected under weight round `round_`.

        A newer round than the one being collected means this shard fell behind (it was
        restarted, or a learner released a round elsewhere): what it holds is dropped and
        counted, and the table collects the newer round.

        Returns:
            True when the items were kept, False when they were refused as stale.

        Raises:
            ReplayError: the batch does not match the spec, the round is negative, or the
                table would exceed its capacity (nothing is changed then).
        """
        n = validate_batch(self._spec, batch)
        if isinstance(round_, bool) or not isinstance(round_, int | np.integer) or round_ < 0:
            raise ReplayError(f"round must be an int >= 0, got {round_!r}")
        if round_ < self.round:
            self.refused += n
            return False
        held = self._size if round_ == self.round else 0  # a newer round drops what is held
        if held + n > self.capacity:
            raise ReplayError(
                f"aggregate table full: holds {held} of {self.capacity} items, cannot add {n}"
            )
        if round_ > self.round:
            self._advance(int(round_))
        self._first_round_seen()
        self._parts.append({k: np.array(v, copy=True) for k, v in batch.items()})
        self._size += n
        self.inserted += n
        return True

    def ready(self, round_: int) -> bool:
        """Whether round `round_` is complete and can be released."""
        whole = round_ != self.incomplete_round
        return round_ == self.round and whole and self._size >= self.round_size

    def take(self, round_: int) -> dict[str, np.ndarray]:
        """Releases every item of the complete round `round_` and starts the next round.

        Raises:
            ReplayError: round `round_` is not being collected or is not complete.
        """
        if not self.ready(round_):
            raise ReplayError(
                f"round {round_} is not ready (collecting round {self.round}, "
                f"{self._size} of {self.round_size} items)"
            )
        batch = {k: np.concatenate([p[k] for p in self._parts]) for k in self._spec}
        self._parts, self._size = [], 0
        self.round += 1
        self.released_rounds += 1
        return batch

    def catch_up(self, round_: int) -> None:
        """Starts collecting `round_` when it is newer (a learner resumed at that round)."""
        if round_ > self.round:
            self._advance(round_)
        self._first_round_seen()

    def _first_round_seen(self) -> None:
        if self._restarted:  # the first round a restarted table meets lacks earlier items
            self._restarted = False
            self.incomplete_round = self.round

    def _advance(self, round_: int) -> None:
        self.refused += self._size
        self._parts, self._size = [], 0
        self.round = round_

    # --- served by a memory shard (`served.ServedTable`) -------------------------------

    prefetch = False
    """Rounds are taken whole, on request."""

    def check_insert(
        self, batch: Batch, priorities: np.ndarray | None, round_: int
    ) -> tuple[Batch, int]:
        """Items of the spec, a round >= 0 and no priorities."""
        n = validate_batch(self._spec, batch)
        if priorities is not None or round_ < 0:
            raise ReplayError("an aggregate table takes a round >= 0 and no priorities")
        return batch, n

    def try_insert(
        self, batch: Batch, n: int, priorities: np.ndarray | None, round_: int, source: int
    ) -> bool:
        """Always runs: `insert` (False: refused as stale)."""
        return self.insert(batch, round_)

    def check_sample(self, batch_size: int, round_: int) -> None:
        """A round >= 0, taken whole (batch size 0)."""
        if round_ < 0 or batch_size != 0:
            raise ReplayError("an aggregate table takes a round >= 0 and batch_size 0 (all of it)")

    def try_sample(self, batch_size: int, round_: int) -> Sampled | NotReady | None:
        """Round `round_` whole once complete (None: not yet); NotReady when the caller is
        behind (the round collected now) or the round cannot be completed."""
        self.catch_up(round_)
        if self.round > round_:  # the caller is behind: tell it which round is collected
            return NotReady(self.round)
        if self.incomplete_round == round_:
            return NotReady(round_, incomplete=True)
        if not self.ready(round_):
            return None
        return Sampled(self.take(round_), round=round_)

    def update_priorities(self, keys: np.ndarray, priorities: Any) -> int:
        """Always raises ReplayError."""
        raise ReplayError("an aggregate table has no priorities")

    def status(self) -> dict[str, float]:
        """The round collected, the items dropped as stale and the rounds released."""
        return {
            "round": float(self.round),
            "dropped_items": float(self.refused),
            "rounds_released": float(self.released_rounds),
        }

    def state_dict(self) -> dict[str, Any]:
        """Always raises ReplayError: a restarted shard makes the learner abandon the round."""
        raise ReplayError("an aggregate table is not snapshotted")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Always raises ReplayError (see `state_dict`)."""
        raise ReplayError("an aggregate table is not snapshotted")
