"""Same-host payloads through shared memory (issue 45): when a caller and its server run on
one host, the body of a Sample reply (a learner's batch), a Pull reply (weights), an Insert
(an actor's items) or a Push (gradients) goes through the caller's shared-memory segment
instead of protobuf and HTTP/2; the call itself carries only the tensors' metadata.

Which calls use it: a `MemoryClient` or `ParameterClient` whose server address is a loopback
one (the local launcher's; across hosts and Kubernetes pods nothing changes), unless
`cluster.shared_memory` is false. Containers on one host's network, each with its own
/dev/shm, have loopback addresses too: a server that cannot read a caller's segment refuses
its first body before reading anything, and that caller sends its bodies over gRPC from
then on (a reply that cannot be written there comes over gRPC anyway). The client owns one
segment (`Segment`, through `SharedReplies`), named from the run's token (`run_prefix`:
processes of other runs, and a caller without the token, get nothing: the server writes
only into segments of its own run's prefix, and the RPC needs the token anyway). POSIX
shared memory is created 0600 by its owner. A request whose body lies in the segment goes to
the server's local listener when it has one (`easyrl.transport.local`), not over gRPC.

No torn batch is ever read: the server writes the body into the segment before it answers,
the client reads it only from an answer, one call at a time; a call that failed or timed out
(its server may still be writing) makes the client drop that segment and start a fresh one.
A batch larger than the segment comes back over gRPC as before, and the client grows its
segment for the next one. The client unlinks its segment when it closes; `remove_run` unlinks
what a killed process left (the local launcher calls it when a run ends).

A queued Push is answered before the shard applies it, so a body the shard read in place
could be overwritten by the caller's next push: the shard copied it out (21 MB: ~7 ms of its
~30 ms CPU a push, on 2 cores). A pusher now lends its bodies instead (`SharedReplies.send`
with `lend`): it writes each into the next of `LEND_SLOTS` segments of its own, marked lent
(their last `LENT_BYTES` nonzero), and the shard reads the body there (`Attached.lend`), and
zeroes the mark once it has applied or dropped the push (`Lease.release`). The pusher writes
into a segment only once its mark is zero; one still lent after `LEND_WAIT_S` (its shard was
killed holding it) is dropped for a fresh one: the shard, if alive, keeps its own mapping.
"""

import hashlib
import itertools
import mmap
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from easyrl.aligned import aligned_empty
from easyrl.errors import TransportError

SHM_DIR = Path("/dev/shm")
"""Where Linux keeps POSIX shared memory (`remove_run` looks there)."""
INITIAL_BYTES = 1 << 20
"""A client's first segment (it grows to what a batch needs)."""
LENT_BYTES = 8
"""The mark at the end of a segment that lends its body: nonzero while the server holds it."""
LEND_SLOTS = 2
"""Segments a pusher lends bodies from in turn: the next body is written while the server
applies the last (a third push waits until the first is applied, as the shard's queue makes
it at the largest sizes anyway)."""
LEND_WAIT_S = 1.0
"""How long a pusher waits for its next segment to be let go before it takes a fresh one."""
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_counter = itertools.count()


def run_prefix(token: str | None) -> str:
    """The name prefix of the run's segments: from a hash of its token (never the token)."""
    return f"easyrl-{hashlib.sha256((token or '').encode()).hexdigest()[:12]}-"


def same_host(address: str) -> bool:
    """Whether a server address is a loopback one (the caller and the server share a host)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in _LOOPBACK


class Segment:
    """A client's segment: created 0600 with a fresh name of the run's prefix, grown and
    dropped (unlinked) by its owner only.

    Args:
        prefix: `run_prefix` of the run.
        size: bytes.

    Raises:
        OSError: the segment cannot be created (no /dev/shm, no space).
    """

    def __init__(self, prefix: str, size: int = INITIAL_BYTES):
        self.prefix = prefix
        self._shm = self._create(size)

    def _create(self, size: int) -> shared_memory.SharedMemory:
        name = f"{self.prefix}{os.getpid()}-{next(_counter)}"
        segment = shared_memory.SharedMemory(name=name, create=True, size=max(1, size))
        try:
            # Reserve the pages now: a full /dev/shm (64 MiB in a default container) then
            # fails here, with gRPC from then on, instead of killing the writer with SIGBUS.
            os.posix_fallocate(segment._fd, 0, segment.size)  # pyright: ignore[reportAttributeAccessIssue]
        except OSError:
            segment.close()
            segment.unlink()
            raise
        return segment

    @property
    def name(self) -> str:
        return self._shm.name

    @property
    def size(self) -> int:
        return self._shm.size

    def read(self, size: int) -> bytes:
        """A copy of the segment's first `size` bytes (what the server wrote)."""
        if not 0 < size <= self._shm.size:
            raise ValueError(f"a body of {size} bytes does not fit the segment's {self.size}")
        return bytes(_buffer(self._shm)[:size])

    def write(self, parts: Sequence[memoryview]) -> None:
        """Writes `parts` back to back from the segment's start (a request's body)."""
        _write_parts(_buffer(self._shm), parts)

    @property
    def lent(self) -> bool:
        """Whether the server still holds the body this segment lent (its mark is nonzero)."""
        return _lent_mark(_buffer(self._shm), self.size) != 0

    def lend(self) -> None:
        """Marks the segment lent (before its body is written; the server zeroes the mark)."""
        _set_lent_mark(_buffer(self._shm), self.size, 1)

    def renew(self, size: int | None = None) -> None:
        """Drops the segment for a fresh one (of `size` bytes; default: the same size).

        Raises:
            OSError: no fresh one could be made (the caller goes on over gRPC).
        """
        size = self._shm.size if size is None else size
        self.close()
        self._shm = self._create(size)

    def close(self) -> None:
        """Unlinks the segment (a server that still maps it keeps only its own mapping)."""
        self._shm.close()
        try:
            self._shm.unlink()
        except FileNotFoundError:
            pass


class Attached:
    """A server's mappings of its clients' segments, by name (the newest few kept).

    Args:
        prefix: `run_prefix` of the server's run: a segment of another prefix is refused.
        keep: how many mappings to keep (a client that renews its segment leaves the old
            one behind): enough for every segment of a 16-core run's callers (16 actors'
            and the learners' three each), since mapping one again costs a page fault per
            page it is read or written through.
    """

    def __init__(self, prefix: str, keep: int = 64):
        self.prefix, self.keep = prefix, keep
        self._open: OrderedDict[str, Mapped] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, name: str, size: int) -> memoryview:
        """A copy of the first `size` bytes of the caller's segment `name` (the body of its
        request), in memory of its own on an `easyrl.aligned.ALIGN` boundary: a request's
        first tensor can go to TensorFlow without another copy (`easyrl.models.flat.in_place`).

        Raises:
            ValueError: the name is not of this run, the segment is gone or too small.
        """
        with self._using(name) as mapped:
            if mapped is None or not 0 < size <= mapped.size:
                raise ValueError(
                    f"shm_body: no segment {name[:80]!r} of this run holding {size} bytes"
                )
            body = aligned_empty(size)
            body[:] = np.frombuffer(mapped.buf, np.uint8, size)
            # numpy arrays export the buffer protocol; numpy's stubs do not declare it.
            return memoryview(body)  # pyright: ignore[reportArgumentType]

    def lend(self, name: str, size: int) -> "Lease":
        """The first `size` bytes of the caller's segment `name`, lent: read in place (no
        copy) until the lease is released, which zeroes the segment's mark.

        Raises:
            ValueError: the name is not of this run, the segment is gone or too small.
        """
        mapped = self._get(name)
        if mapped is None or not 0 < size <= mapped.size - LENT_BYTES:
            if mapped is not None:
                self._let_go(mapped)
            raise ValueError(f"shm_body: no segment {name[:80]!r} of this run lending {size} bytes")
        return Lease(self, mapped, size)

    def write(self, name: str, parts: Sequence[memoryview], size: int) -> bool:
        """Writes `parts` (`size` bytes in all) back to back at the start of segment `name`;
        False (nothing written) when the name is not of this run, the segment is gone or
        too small."""
        with self._using(name) as mapped:
            if mapped is None or size > mapped.size:
                return False
            _write_parts(mapped.buf, parts)
            return True

    @contextmanager
    def _using(self, name: str) -> Iterator["Mapped | None"]:
        """The mapping of segment `name` (None when it is not of this run or is gone), kept
        open while in use: a mapping pushed out by newer ones meanwhile is closed by its last
        user (closing it under another thread's copy failed both: more clients than `keep`
        made a server's reads and writes fail now and then)."""
        mapped = self._get(name)
        try:
            yield mapped
        finally:
            if mapped is not None:
                self._let_go(mapped)

    def _let_go(self, mapped: "Mapped") -> None:
        """One user of `mapped` is done with it (closed by the last one once pushed out)."""
        with self._lock:
            mapped.users -= 1
            if mapped.users == 0 and mapped.evicted:
                mapped.close()

    def _get(self, name: str) -> "Mapped | None":
        """The mapping of segment `name`, counted as used (see `_using`), or None when it is
        not of this run or is gone."""
        if not name.startswith(self.prefix) or "/" in name:
            return None
        with self._lock:
            mapped = self._open.get(name)
            if mapped is not None:
                self._open.move_to_end(name)
            else:
                try:
                    mapped = Mapped(name)
                except (OSError, ValueError):
                    return None
                self._open[name] = mapped
                while len(self._open) > self.keep:
                    self._evict(self._open.popitem(last=False)[1])
            mapped.users += 1
            return mapped

    @staticmethod
    def _evict(mapped: "Mapped") -> None:
        """Closes `mapped` now, or marks it for its last user to close (the lock held)."""
        mapped.evicted = True
        if mapped.users == 0:
            mapped.close()

    def close(self) -> None:
        """Unmaps every segment (those in use when their users are done)."""
        with self._lock:
            for mapped in self._open.values():
                self._evict(mapped)
            self._open.clear()


class Lease:
    """A body a server reads in place in its caller's segment (`Attached.lend`): `body` is
    valid until `release`, which zeroes the segment's mark (its owner may write into it
    again). Release it once nothing reads the body any more; releasing twice does nothing."""

    def __init__(self, attached: Attached, mapped: "Mapped", size: int):
        self._attached: Attached | None = attached
        self._mapped = mapped
        self.body = mapped.buf[:size]

    def release(self) -> None:
        attached, self._attached = self._attached, None
        if attached is None:
            return
        mapped = self._mapped
        _set_lent_mark(mapped.buf, mapped.size, 0)
        attached._let_go(mapped)


class Mapped:
    """A server's mapping of a client's segment, by name, outside Python's resource tracker:
    before Python 3.13 `SharedMemory(name)` registers the segment there, and unregistering it
    again also cancels its owner's registration where both share one tracker (a spawned
    child, or one process): the owner's unlink then made the tracker fail with a KeyError,
    and a killed owner's segment was left to `remove_run` alone.

    Raises:
        OSError: no such segment.
        ValueError: it is empty.
    """

    def __init__(self, name: str):
        fd = os.open(SHM_DIR / name, os.O_RDWR)
        try:
            self.size = os.fstat(fd).st_size
            self._mmap = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)
        self.users = 0
        """Threads reading or writing it now (`Attached._using`)."""
        self.evicted = False
        """No longer kept: closed by its last user."""

    def close(self) -> None:
        try:
            self.buf.release()
            self._mmap.close()
        except BufferError:
            pass  # views of a lent body are still alive: unmapped once they are gone


class SharedReplies:
    """A client's side: calls whose reply body the server may write into this client's
    segment (made on first use), one call at a time (another thread meanwhile gets its
    reply over gRPC).

    Args:
        prefix: `run_prefix` of the run.
    """

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.segment: Segment | None = None
        self.replies = 0
        """Replies whose body came through the segment."""
        self.requests = 0
        """Requests whose body went through the segment."""
        self.lending: list[Segment | None] = [None] * LEND_SLOTS
        """The segments lent bodies are written into, in turn (`send` with `lend`)."""
        self._lent = 0  # lent bodies so far (the next goes into lending[_lent % LEND_SLOTS])
        self._lock = threading.Lock()
        self._off = False  # no shared memory at all
        self._send_off = False  # the server takes no request bodies through it
        self._lend_off = False  # no lending segments could be made (/dev/shm is small)

    def call(self, call, method: str, request) -> tuple:
        """(reply, body) of `call(method, request)`, `request` having a `shm_name` field and
        its reply a `shm_body` one. A call that fails drops the segment (the server may
        still write into it); a body too big for it came over gRPC and the segment grows."""
        if self._off or not self._lock.acquire(blocking=False):
            reply = call(method, request)
            return reply, reply.body
        try:
            if self.segment is None:
                try:
                    self.segment = Segment(self.prefix)
                except OSError:  # no /dev/shm here: gRPC from now on
                    self._off = True
                    reply = call(method, request)
                    return reply, reply.body
            request.shm_name = self.segment.name
            try:
                reply = call(method, request)
            except BaseException:
                self._renew(self.segment.size)
                raise
            if reply.shm_body:
                self.replies += 1
                return reply, self.segment.read(reply.shm_body)
            if len(reply.body) > self.segment.size:  # the next body of this size fits
                self._renew(len(reply.body) + len(reply.body) // 4)
            return reply, reply.body
        finally:
            self._lock.release()

    def send(self, call, method: str, framed, lend: bool = False) -> Any:
        """The reply of `call(method, request)` for a framed request (a message and its body,
        `codec.Framed`) whose message has `shm_name` and `shm_body` fields: the body goes
        into this client's segment (grown to fit) and the message alone over gRPC. With
        `lend` (the message has `shm_lent`), the server reads the body in place and lets it
        go later: it goes into the next lending segment, once that one is let go. A call
        that fails drops the segment (the server may still be reading it). An empty body
        goes over gRPC (a server lends no body of 0 bytes)."""
        parts, size = framed.body_parts()
        if not size or self._off or self._send_off or not self._lock.acquire(blocking=False):
            return call(method, framed)
        try:
            slot = self._lent % LEND_SLOTS if lend and not self._lend_off else None
            segment = self._segment_for(size, slot)
            if segment is None and slot is not None:  # no room for them: bodies copied
                self._lend_off, slot = True, None
                self._drop_lending()  # its room to the others' (a server maps its own)
                segment = self._segment_for(size, slot)
            if segment is None:
                return call(method, framed)
            if slot is not None:
                segment.lend()
            segment.write(parts)
            message = type(framed.message)()
            message.CopyFrom(framed.message)
            message.shm_name, message.shm_body = segment.name, size
            if slot is not None:
                message.shm_lent = True
            try:
                reply = call(method, message)
            except TransportError as err:
                self._renew(segment.size, slot)
                if err.code != grpc.StatusCode.INVALID_ARGUMENT or "shm_body:" not in str(err):
                    raise
                # A server that takes no shared memory, or cannot see this client's segments
                # (another /dev/shm: containers sharing one host's network), refused the body
                # before reading anything: its bodies go over gRPC from now on.
                self._send_off = True
                return call(method, framed)
            except BaseException:
                self._renew(segment.size, slot)
                raise
            self.requests += 1
            if slot is not None:  # (after a failed call, its fresh segment is used again)
                self._lent += 1
            return reply
        finally:
            self._lock.release()

    def _segment_for(self, size: int, slot: int | None) -> Segment | None:
        """The segment a body of `size` bytes goes into: `segment`, or lending segment
        `slot` once its last body is let go (a fresh one after `LEND_WAIT_S`); grown or made
        to fit. None: none could be made (without `slot`: gRPC from now on)."""
        need = size if slot is None else size + LENT_BYTES
        segment = self._get(slot)
        if segment is not None and slot is not None and segment.lent:
            deadline = time.monotonic() + LEND_WAIT_S
            while segment.lent and time.monotonic() < deadline:
                time.sleep(0.0002)
            if segment.lent:  # its server was killed holding it, or is very late
                self._renew(segment.size, slot)
                segment = self._get(slot)
        if segment is not None and need <= segment.size:
            return segment
        grown = max(need + size // 4, INITIAL_BYTES)
        if segment is not None:
            self._renew(grown, slot)
        else:
            try:
                self._set(slot, Segment(self.prefix, grown))
            except OSError:
                self._off = self._off or slot is None
        return self._get(slot)

    def _get(self, slot: int | None) -> Segment | None:
        return self.segment if slot is None else self.lending[slot]

    def _set(self, slot: int | None, segment: Segment | None) -> None:
        if slot is None:
            self.segment = segment
        else:
            self.lending[slot] = segment

    def _renew(self, size: int, slot: int | None = None) -> None:
        """A fresh `segment` (or lending segment `slot`) of `size` bytes; when none can be
        made, gRPC from now on (none in `slot`)."""
        segment = self._get(slot)
        self._set(slot, None)
        if segment is None:
            return
        try:
            segment.renew(size)
            self._set(slot, segment)
        except OSError:
            self._off = self._off or slot is None

    def close(self) -> None:
        """Unlinks the segments."""
        with self._lock:
            if self.segment is not None:
                self.segment.close()
            self.segment = None
            self._drop_lending()

    def _drop_lending(self) -> None:
        """Unlinks the lending segments."""
        for segment in self.lending:
            if segment is not None:
                segment.close()
        self.lending = [None] * LEND_SLOTS


def request_body(attached: "Attached | None", request, counters) -> bytes | memoryview:
    """The body of a request (`Push`, `Insert`): its bytes, or those its caller put in its
    segment (`shm_name`, `shm_body`; counted as `shm_requests` in `counters`).

    Raises:
        ValueError: a segment this server cannot read (the caller is told INVALID_ARGUMENT,
            its details starting "shm_body:", and sends the body over gRPC).
    """
    if not request.shm_body:
        return request.body
    if attached is None:
        raise ValueError("shm_body: this server takes no shared memory (cluster.shared_memory)")
    body = attached.read(request.shm_name, request.shm_body)
    counters["shm_requests"] += 1
    return body


def lent_body(attached: "Attached | None", request, counters) -> Lease:
    """The body a Push lent (`shm_lent`), read in place until the lease is released
    (counted as `shm_requests` in `counters`).

    Raises:
        ValueError: a segment this server cannot read, as `request_body`.
    """
    if attached is None:
        raise ValueError("shm_body: this server takes no shared memory (cluster.shared_memory)")
    lease = attached.lend(request.shm_name, request.shm_body)
    counters["shm_requests"] += 1
    return lease


def shared_reply(attached: "Attached | None", name: str, reply, counters) -> object:
    """A server's side: `reply` (a framed message with a body, or any other reply) with its
    body written into the caller's segment `name` and `shm_body` set, or `reply` as it is
    when there is no segment to use (none named, not this run's, gone, too small: nothing is
    lost); counts `shm_replies` and `shm_refused` in `counters`."""
    body_parts = getattr(reply, "body_parts", None)
    if not name or attached is None or body_parts is None:
        return reply
    parts, size = body_parts()
    if not attached.write(name, parts, size):
        counters["shm_refused"] += 1
        return reply
    counters["shm_replies"] += 1
    message = type(reply.message)()
    message.CopyFrom(reply.message)
    message.shm_body = size
    return message


def _write_parts(buffer: memoryview, parts: Sequence[memoryview]) -> None:
    """Writes `parts` back to back from the start of `buffer`."""
    offset = 0
    for part in parts:
        buffer[offset : offset + len(part)] = part
        offset += len(part)


def _lent_mark(buffer: memoryview, size: int) -> int:
    """The lent mark of a segment of `size` bytes (its last `LENT_BYTES`): nonzero while
    its server holds the body."""
    return struct.unpack_from("<Q", buffer, size - LENT_BYTES)[0]


def _set_lent_mark(buffer: memoryview, size: int, value: int) -> None:
    struct.pack_into("<Q", buffer, size - LENT_BYTES, value)


def _buffer(shm: shared_memory.SharedMemory) -> memoryview:
    """The segment's memory (None only once closed)."""
    if shm.buf is None:
        raise ValueError(f"segment {shm.name} is closed")
    return shm.buf


def remove_run(token: str | None) -> int:
    """Unlinks every segment of the run of `token` left in /dev/shm (by processes that were
    killed); returns how many."""
    removed = 0
    for path in SHM_DIR.glob(f"{run_prefix(token)}*"):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed
