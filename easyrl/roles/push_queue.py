"""The pushes a PS shard has accepted and not applied yet (`easyrl.roles.ps`): a bounded
queue between the Push handlers, which check and accept pushes, and the shard's apply thread,
which applies them one at a time in arrival order."""

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from easyrl.transport.shm import Lease

QUEUE_PUSHES = 4
"""Accepted pushes a shard holds before it has applied them, at most..."""
QUEUE_BYTES = 16 << 20
"""... and at most this many bytes of their gradients (one push always fits): a queued push
keeps its request's bytes, and a push acknowledged and not yet applied is part of what a
throughput measurement counts."""
QUEUE_WAIT_S = 30.0
"""The longest a Push waits for room in a full queue (back-pressure) before the shard answers
UNAVAILABLE (the caller retries); the caller's deadline cuts it shorter."""


class QueuedPush(NamedTuple):
    """An accepted push: its flat gradients by optimizer group, the staleness it is applied
    with and, when its caller lent the body, the lease to release once it is applied."""

    grads: dict[str, np.ndarray]
    staleness: int
    lease: Lease | None = None


class PushQueue:
    """The pushes a shard has accepted and not applied yet, oldest first: a handler checks a
    push and `put`s it (holding `changed`, after `wait_for_room`); the shard's apply thread
    applies `oldest()` and then calls `done()`, so a push stays queued until it is applied.

    `accepted` is the version the shard holds once every accepted push is applied. Every
    accepted push is applied, so one computed against version v and accepted now is applied
    to the values of version `accepted` exactly: its staleness is `accepted - v`.

    Args:
        pushes: at most this many queued pushes...
        max_bytes: ... and this many bytes of gradients (one push always fits).
    """

    def __init__(self, pushes: int = QUEUE_PUSHES, max_bytes: int = QUEUE_BYTES):
        if pushes < 1 or max_bytes < 0:
            raise ValueError("a push queue holds at least 1 push and max_bytes >= 0")
        self.changed = threading.Condition()
        """Guards the queue; notified whenever it changes."""
        self.accepted = 0
        self.closed = False
        """No more pushes are accepted; the apply thread applies the queued ones and ends."""
        self.stopped = False
        """The apply thread has ended (what is still queued is never applied)."""
        self._pushes, self._max_bytes = pushes, max_bytes
        self._items: deque[QueuedPush] = deque()
        self._bytes = 0
        self._holds = 0

    def __len__(self) -> int:
        return len(self._items)

    def wait_for_room(self, push_bytes: int, wait_s: float) -> bool:
        """Waits (the caller holds `changed`) up to `wait_s` seconds until a push of
        `push_bytes` bytes fits and nothing holds pushes back; False if it does not by then
        or the queue closed."""
        deadline = time.monotonic() + wait_s

        def full() -> bool:
            too_many = len(self._items) >= self._pushes
            too_big = self._items and self._bytes + push_bytes > self._max_bytes
            return bool(self._holds or too_many or too_big)

        while not self.closed and full():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.wait(left)
        return not self.closed

    def put(self, push: QueuedPush) -> int:
        """Queues an accepted push (the caller holds `changed`); returns the version the
        shard holds once it is applied."""
        self._items.append(push)
        self._bytes += push_bytes(push)
        self.accepted += 1
        self.changed.notify_all()
        return self.accepted

    def oldest(self) -> QueuedPush | None:
        """The apply thread: waits for the oldest queued push (it stays queued until `done`);
        None once the queue is closed and empty."""
        with self.changed:
            while not self._items and not self.closed:
                self.changed.wait()
            return self._items[0] if self._items else None

    def done(self) -> None:
        """The apply thread applied the oldest push."""
        with self.changed:
            self._bytes -= push_bytes(self._items.popleft())
            self.changed.notify_all()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Holds new pushes back while the block runs, and starts it once every queued push
        is applied: the block sees a shard with no push in flight (checkpoints, Assign)."""
        with self.changed:
            self._holds += 1
            while self._items and not self.stopped:
                self.changed.wait()
        try:
            yield
        finally:
            with self.changed:
                self._holds -= 1
                self.changed.notify_all()

    def reset(self, version: int) -> None:
        """The shard's values were set to `version` (Assign, restore; nothing is queued)."""
        with self.changed:
            self.accepted = version

    def close(self, stopped: bool = False) -> None:
        """Accepts no more pushes; `stopped`: the apply thread has ended."""
        with self.changed:
            self.closed = True
            self.stopped |= stopped
            self.changed.notify_all()


def push_bytes(push: QueuedPush) -> int:
    """Bytes of a queued push's gradients."""
    return sum(g.nbytes for g in push.grads.values())
