"""The storage under a replay table: where its items' columns live.

A `Table` (`easyrl.replay.tables`) issues keys, picks slots (item ``k`` in slot ``k %
capacity``), samples and removes; it writes the items of a slot to its `Storage` and reads
them back from it. Two storages:

* `Columns`: one preallocated numpy array ``[capacity, *shape]`` per column, every column
  stored as it is.
* `FrameColumns`: the same, but each frame-stack column (Atari observations) is stored as
  the ``[*lead, k]`` ids of its frames in a `FrameStore` (`easyrl.replay.frames`), which
  keeps each frame once; a read rebuilds the stacks. Its write may make the oldest stored
  items stale (their frames are about to be overwritten): the table then drops them.

The table's stored items are given to a storage as ``live``, the ``range`` of their keys
(the oldest first).
"""

import bisect
from typing import Any, Protocol

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay.checks import TableSpec, validate_batch
from easyrl.replay.frames import FRAMES_PREFIX, FrameStore

DATA_PREFIX = "data/"
"""Prefix of the column arrays in a table snapshot (`Table.state_dict`)."""


class Storage(Protocol):
    """Where a table's items live (see the module docstring)."""

    @property
    def frames(self) -> FrameStore | None:
        """The frame store under the frame-stack columns, or None (whole columns)."""
        ...

    drops_items: bool
    """Whether a write can make stored items stale (the table's ``removed`` then counts
    them, and a snapshot holds it)."""
    dropped: int
    """Items the table dropped early because a write made them stale."""

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays that hold the items."""
        ...

    @property
    def state_keys(self) -> tuple[str, ...]:
        """The entries `state` adds to a table snapshot."""
        ...

    def check(self, batch: Any) -> int:
        """Checks an insert's batch; returns its size ``n``.

        Raises:
            ReplayError: If the batch does not match the table's spec.
        """
        ...

    def wire(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A checked batch in the form `write` takes fastest (work done off the table's
        thread: frame stacks split and deduplicated)."""
        ...

    def fits(self, batch: dict[str, Any], live: range) -> bool:
        """Whether a checked batch can be written now without dropping items the table
        must keep (a queue's insert otherwise waits for samples to remove some)."""
        ...

    def write(
        self, slots: np.ndarray, batch: dict[str, Any], first: int, source: int, live: range
    ) -> int:
        """Writes the batch's items from ``first`` to ``slots`` (after the ``live`` ones).

        Args:
            slots: ``[m]`` distinct slots of the batch's last ``m`` items.
            batch: A checked batch of ``n`` items.
            first: ``n - m``: the batch's items before it are not stored.
            source: Who sent the batch (a frame store matches frames per source).
            live: The keys of the items stored before this write.

        Returns:
            How many of the oldest ``live`` items the write made stale (the table drops
            them; 0 for a queue).

        Raises:
            ReplayError: If a queue's storage lacks room; nothing is changed then.
        """
        ...

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Column name -> ``[B, *shape]`` copies of the items of ``[B]`` slots."""
        ...

    def state(self, slots: np.ndarray) -> dict[str, Any]:
        """The snapshot entries (`state_keys`) of the items of ``slots`` (snapshot order)."""
        ...

    def check_state(self, state: dict[str, Any], size: int) -> Any:
        """Checks a snapshot's entries for ``size`` items, changing nothing.

        Returns:
            What `load_state` restores.

        Raises:
            ReplayError: If an entry is invalid or does not match this storage.
        """
        ...

    def load_state(self, checked: Any, slots: np.ndarray, live: range) -> None:
        """Restores what `check_state` returned; its items go to ``slots``, and are the
        table's ``live`` items then."""
        ...

    def status(self) -> dict[str, float]:
        """Counters for the memory shard's status."""
        ...


def live_slots(live: range, capacity: int) -> np.ndarray:
    """``[len(live)]`` slots of the ``live`` keys, the oldest first."""
    return np.arange(live.start, live.stop) % capacity


class Columns:
    """Every column stored as it is (see the module docstring).

    Args:
        spec: The table's normalised spec (`validate_spec`).
        capacity: Slots, >= 1.
        stored: How each column is stored (default: ``spec``).
    """

    drops_items = False

    def __init__(self, spec: TableSpec, capacity: int, stored: TableSpec | None = None):
        self.spec = spec
        self.capacity = capacity
        self.stored = spec if stored is None else stored
        self.dropped = 0
        self.columns = {
            name: np.zeros((capacity, *shape), dtype=dtype)
            for name, (shape, dtype) in self.stored.items()
        }  # name -> [capacity, *shape]

    @property
    def frames(self) -> FrameStore | None:
        """None: no frame store."""
        return None

    @property
    def nbytes(self) -> int:
        """Bytes of the column arrays."""
        return sum(column.nbytes for column in self.columns.values())

    @property
    def state_keys(self) -> tuple[str, ...]:
        """``data/<column>`` per column."""
        return tuple(DATA_PREFIX + name for name in self.spec)

    def check(self, batch: Any) -> int:
        """See `Storage.check`."""
        return validate_batch(self.spec, batch)

    def wire(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch as it is."""
        return batch

    def fits(self, batch: dict[str, Any], live: range) -> bool:
        """Always: the table checks item room."""
        return True

    def write(
        self, slots: np.ndarray, batch: dict[str, Any], first: int, source: int, live: range
    ) -> int:
        """Copies the columns; no item becomes stale."""
        self._copy(slots, batch, first)
        return 0

    def _copy(self, slots: np.ndarray, columns: dict[str, Any], first: int) -> None:
        for name, column in self.columns.items():
            column[slots] = columns[name][first:]

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """See `Storage.gather`."""
        return {name: column[slots] for name, column in self.columns.items()}

    def state(self, slots: np.ndarray) -> dict[str, Any]:
        """``data/<column>`` arrays ``[size, *shape]`` of the items of ``slots``."""
        return {DATA_PREFIX + name: column[slots] for name, column in self.columns.items()}

    def check_state(self, state: dict[str, Any], size: int) -> Any:
        """Checks the ``data/`` arrays' dtypes and shapes; returns nothing to restore
        beyond them."""
        for name, (shape, dtype) in self.stored.items():
            array = state[DATA_PREFIX + name]
            got = (array.dtype, array.shape) if isinstance(array, np.ndarray) else array
            if got != (dtype, (size, *shape)):
                raise ReplayError(
                    f"state dict column {name!r}: expected {dtype} {(size, *shape)}, got {got}"
                )
        return {name: state[DATA_PREFIX + name] for name in self.columns}

    def load_state(self, checked: Any, slots: np.ndarray, live: range) -> None:
        """Restores the columns (the other slots zeroed)."""
        for name, column in self.columns.items():
            column[:] = 0
            column[slots] = checked[name]

    def status(self) -> dict[str, float]:
        """None."""
        return {}


class FrameColumns(Columns):
    """Frame-stack columns stored as frame ids into a `FrameStore` (see the module
    docstring and `easyrl.replay.frames`): writes take whole stacks or their wire form,
    reads return whole stacks. A ring's write makes the oldest items stale when the frames
    they refer to are about to be overwritten; a queue's refuses to (`fits`).

    Args:
        spec: The table's normalised spec.
        capacity: Slots, >= 1.
        frames: The frame store (its layout names the frame-stack columns of ``spec``).
        queue: Whether the table is a queue (it never drops items).
    """

    drops_items = True

    def __init__(self, spec: TableSpec, capacity: int, frames: FrameStore, queue: bool):
        super().__init__(spec, capacity, frames.layout.id_spec(spec))
        self.store = frames
        self.queue = queue
        # The smallest frame id of each slot's item.
        self.first_frame = np.zeros(capacity, np.int64)
        # And a lower bound on that id for this item and every later one, non-decreasing from
        # the oldest item to the newest (the store's `next - window` at the item's insert: a
        # reused frame is never older), so `stale` finds the stale items by bisection.
        self.frame_floor = np.zeros(capacity, np.int64)

    @property
    def frames(self) -> FrameStore:
        """The frame store."""
        return self.store

    @property
    def nbytes(self) -> int:
        """Bytes of the columns, the frames and the frame bookkeeping."""
        bookkeeping = self.first_frame.nbytes + self.frame_floor.nbytes
        return super().nbytes + self.store.nbytes + bookkeeping

    @property
    def state_keys(self) -> tuple[str, ...]:
        """``data/<column>`` per column and ``frames/capacity``, ``frames/next``,
        ``frames/pixels``."""
        return (*super().state_keys, *(FRAMES_PREFIX + k for k in ("capacity", "next", "pixels")))

    def check(self, batch: Any) -> int:
        """Checks a batch in wire form or of whole stacks."""
        return self.store.check(self.spec, batch)

    def wire(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch's wire form (`FrameLayout.packed`)."""
        return self.store.layout.packed(batch)

    def lowest_frame(self, live: range) -> int:
        """The smallest frame id a ``live`` item refers to (the store's next id if none)."""
        if not live:
            return self.store.next
        return int(self.first_frame[live_slots(live, self.capacity)].min())

    def fits(self, batch: dict[str, Any], live: range) -> bool:
        """Always for a ring; a queue's new frames fit when they overwrite no frame of its
        queued items (the insert waits for samples to remove them, as for item room)."""
        if not self.queue:
            return True
        needed = self.store.frames_needed(self.store.layout.packed(batch))
        return self.store.next + needed - self.store.capacity <= self.lowest_frame(live)

    def stale(self, low: int, live: range) -> int:
        """How many of the oldest ``live`` items go up to the newest one referring to a
        frame id below ``low`` (those frames are about to be overwritten). Only the items
        before the first one whose frame floor reaches ``low`` can be stale (found by
        bisection over the live keys), so the scan is of those, not of the whole table."""
        if not live:
            return 0
        candidates = bisect.bisect_left(
            live, low, key=lambda k: self.frame_floor[k % self.capacity]
        )
        slots = live_slots(live[:candidates], self.capacity)  # [candidates]
        stale = np.flatnonzero(self.first_frame[slots] < low)
        return int(stale[-1]) + 1 if stale.size else 0

    def write(
        self, slots: np.ndarray, batch: dict[str, Any], first: int, source: int, live: range
    ) -> int:
        """Matches and stores the batch's frames and the items' frame ids; returns the
        stale items (a ring's).

        Raises:
            ReplayError: If a queue's new frames do not fit until queued items are sampled.
        """
        frames = self.store
        floor = frames.next - frames.window  # what `prepare` may reuse
        prepared = frames.prepare(batch, len(slots) + first, source)
        low = frames.next + len(prepared.new) - frames.capacity
        if self.queue and low > self.lowest_frame(live):
            raise ReplayError(
                f"frame store full: {len(prepared.new)} new frames do not fit until "
                "queued items are sampled"
            )
        stale = self.stale(low, live)
        self._copy(slots, prepared.columns, first)
        self.first_frame[slots] = prepared.first_frame[first:]
        self.frame_floor[slots] = floor
        frames.write(prepared, source)
        self.dropped += stale
        return stale

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The items with their frame stacks rebuilt."""
        data = super().gather(slots)
        for name in self.store.layout.columns:
            data[name] = self.store.gather(data[name])
        return data

    def state(self, slots: np.ndarray) -> dict[str, Any]:
        """The ``data/`` arrays (a frame-stack column's frame ids) and the frame store's
        ``frames/`` entries (the frames the items refer to)."""
        low = int(self.first_frame[slots].min()) if slots.size else self.store.next
        return {**super().state(slots), **self.store.state(low)}

    def check_state(self, state: dict[str, Any], size: int) -> Any:
        """Checks the columns, the frame ids and the frames they refer to."""
        columns = super().check_state(state, size)
        layout = self.store.layout
        widths = {name: int(np.prod(self.stored[name][0])) for name in layout.columns}
        ids = [columns[name].reshape(size, widths[name]) for name in layout.columns]
        first_frame = np.concatenate(ids, axis=1).min(axis=1) if size else np.zeros(0, np.int64)
        frames = self.store.check_state(state, int(first_frame.min()) if size else None)
        highest = max((int(i.max()) for i in ids if i.size), default=-1)
        if highest >= frames[0]:
            raise ReplayError(
                f"state dict frame ids reach {highest}, beyond the {frames[0]} issued"
            )
        return columns, first_frame, frames

    def load_state(self, checked: Any, slots: np.ndarray, live: range) -> None:
        """Restores the columns, the frames and the items' frame floors."""
        columns, first_frame, frames = checked
        super().load_state(columns, slots, live)
        self.first_frame[:] = 0
        self.first_frame[slots] = first_frame
        self.store.load(*frames)
        # Floors of the restored items: the smallest first frame from each item on
        # (oldest first), and never above what later inserts get.
        ordered = live_slots(live, self.capacity)  # [size]
        suffix_min = np.minimum.accumulate(self.first_frame[ordered][::-1])[::-1]
        self.frame_floor[:] = 0
        self.frame_floor[ordered] = np.minimum(suffix_min, self.store.next - self.store.window)

    def status(self) -> dict[str, float]:
        """Frames stored and matched, items dropped early for their frames."""
        return {
            "frames_stored": float(self.store.next),
            "frames_matched": float(self.store.matched),
            "dropped_for_frames": float(self.dropped),
        }


def storage_for(spec: TableSpec, capacity: int, frames: FrameStore | None, queue: bool) -> Storage:
    """The storage of a table: `FrameColumns` over ``frames``, or `Columns` when None."""
    if frames is None:
        return Columns(spec, capacity)
    return FrameColumns(spec, capacity, frames, queue)
