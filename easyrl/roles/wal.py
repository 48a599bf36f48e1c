"""A memory shard's write-ahead log: nothing it acknowledged is lost when it is killed.

The table thread applies an operation, then hands its record to the log's writer thread
(`WriteAheadLog.append`) with the reply; the writer appends every record it has, fsyncs
once for all of them (group commit) and only then releases their replies. An Insert is
thus answered once its items are durable, and a Sample may return items that are not yet:
a shard killed before the fsync never acknowledged them.

Kept: inserts (the batch the table stores, in the form it takes it: the wire form of
Atari frame stacks, each distinct frame of the shipment once), priority updates (answered
without waiting for the fsync: a kill may lose the last milliseconds of them, never an
item) and the items a queue's samples remove. Not kept: what sampling changes in a ring (its random
state and the beta schedule's clock), as a snapshot does not keep them either. A queue's
items count as removed when its table thread samples them, prefetched batches included: a
kill loses the prefetched batches no learner took yet (as a snapshot does), and never
gives out an item twice.

Files: `<snapshot>.wal/<segment>.log` beside the shard's snapshot (on its volume on
Kubernetes). A snapshot starts a new segment and records its number; once the snapshot
file is durable the older segments are deleted (`truncate`). A restarted shard restores
its newest snapshot, then replays the segments from the one it names (`replay`): the
items of the inserts it had answered, the (sender, sequence) of each so that a resend is
still a duplicate, the priority updates and a queue's removals. Each segment starts with
a header naming the run, the shard and its table; a log written for another is refused.

A record is ``[u32 length][u32 crc32][u8 kind][payload]`` (little-endian; the CRC covers
the kind and the payload). A record cut short or failing its CRC (a kill mid-write, a bad
disk) ends the log: the file is cut back to the last whole record, later segments are
set aside (renamed ``.dropped``), and the bytes dropped are counted and logged.
"""

import json
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay import LimitedTable, ServedTable
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb

log = logging.getLogger(__name__)

HEADER, INSERT, UPDATE, REMOVE = 1, 2, 3, 4
"""Record kinds: the segment's header (JSON), an insert (an `InsertRequest`), a priority
update (an `UpdatePrioritiesRequest`), items a queue's sample removed (u64 count)."""
FORMAT = 1
"""The header's format version."""
_FRAME = struct.Struct("<IIB")  # payload length, crc32 of kind + payload, kind
_COUNT = struct.Struct("<Q")
WAL_KEY = "wal/segment"
"""The snapshot entry naming the first log segment the snapshot does not cover."""

Mode = Literal["group", "write", "none"]


class Record(NamedTuple):
    """One encoded record (built on a handler thread: the table thread only hands it on)."""

    kind: int
    payload: bytes

    def frame(self) -> bytes:
        """The record's header: length, CRC and kind."""
        crc = zlib.crc32(self.payload, zlib.crc32(bytes([self.kind])))
        return _FRAME.pack(len(self.payload), crc, self.kind)


def insert_record(
    batch: dict[str, Any], priorities: np.ndarray | None, actor: int, round_: int, sender: int,
    sequence: int,
) -> Record:  # fmt: skip
    """The record of a checked insert: its batch as the table takes it (`check_insert`)."""
    body = codec.Body()
    tensors = body.batch(batch)
    request = pb.InsertRequest(
        tensors=tensors, actor=actor, round=round_, sender=sender, sequence=sequence
    )
    if priorities is not None:
        request.priorities.CopyFrom(body.tensor("priorities", priorities))
    return Record(INSERT, body.frame(request).SerializeToString())


def update_record(keys: np.ndarray, priorities: np.ndarray) -> Record:
    """The record of a priority update."""
    body = codec.Body()
    request = pb.UpdatePrioritiesRequest(
        keys=body.tensor("keys", keys), priorities=body.tensor("priorities", priorities)
    )
    return Record(UPDATE, body.frame(request).SerializeToString())


def remove_record(n: int) -> Record:
    """The record of `n` items a queue's sample removed."""
    return Record(REMOVE, _COUNT.pack(n))


def removes_on_sample(table: ServedTable) -> bool:
    """Whether `table`'s samples remove items (a queue: the log keeps its removals)."""
    return isinstance(table, LimitedTable) and table.table.remove_on_sample


def identity(cfg, spec: dict, shard: int, frames: bool) -> dict[str, Any]:
    """What a segment's header names: the run, the shard and its table."""
    columns = {name: [list(shape), np.dtype(dtype).str] for name, (shape, dtype) in spec.items()}
    r = cfg.replay
    return {
        "run": cfg.run.name,
        "seed": cfg.run.seed,
        "shard": shard,
        "kind": r.kind,
        "capacity": r.capacity,
        "frames": frames,
        "spec": columns,
    }


def log_dir(snapshot: Path) -> Path:
    """The directory of the log beside `snapshot`."""
    return snapshot.with_suffix(".wal")


def segment_path(directory: Path, segment: int) -> Path:
    """The file of `segment`."""
    return directory / f"{segment:08d}.log"


def segments(directory: Path) -> list[int]:
    """The numbers of the segments in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """Appends records to the segments in `directory` on a writer thread.

    Args:
        directory: the log's directory (created).
        header: the segments' header (`identity`).
        segment: the number of the first segment to write (after every existing one).
        mode: "group" (fsync each group of records) or "write" (no fsync).
        sync_interval_s: "group": least seconds between two fsyncs.
        on_error: called on the writer thread when a write fails (the shard stops: the
            records after the failed one are not durable, so nothing more is answered).

    Raises:
        ReplayError: the mode is not "group" or "write", or the interval is negative.
    """

    def __init__(
        self,
        directory: Path,
        header: dict[str, Any],
        segment: int,
        mode: Mode = "group",
        sync_interval_s: float = 0.0,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if mode not in ("group", "write"):
            raise ReplayError(f"a write-ahead log's mode is group or write, got {mode!r}")
        if sync_interval_s < 0:
            raise ReplayError(f"sync_interval_s must be >= 0, got {sync_interval_s}")
        self.directory, self.header, self.mode = directory, header, mode
        self.sync_interval_s = sync_interval_s
        self.on_error = on_error
        """Called with the error when a write fails."""
        self._queue: queue.Queue[tuple[Record | int | None, tuple[Future, Any] | None]]
        self._queue = queue.Queue()
        self._segment = segment  # the newest segment the table thread asked for
        self._opened = threading.Condition()
        self._open_segment = -1  # the segment the writer writes
        self._fd = -1
        self.failed: BaseException | None = None
        self.stats = {"wal_records": 0, "wal_bytes": 0, "wal_syncs": 0}
        directory.mkdir(parents=True, exist_ok=True)
        self._open(segment)
        self._thread = threading.Thread(target=self._run, name="wal", daemon=True)
        self._thread.start()

    # --- the table thread's side -----------------------------------------------------

    def append(self, record: Record | None, future: Future | None = None, result=None) -> None:
        """Queues `record` (None: none, only `future` waits for the records before it);
        `future` (if any) gets `result` once it and every record before it are durable, or a
        `ReplayError` if the log failed."""
        self._queue.put((record, None if future is None else (future, result)))

    def rotate(self) -> int:
        """Starts a new segment after the records appended so far (a snapshot covers
        those); returns its number."""
        self._segment += 1
        self._queue.put((self._segment, None))
        return self._segment

    def truncate(self, before: int, timeout_s: float = 30.0) -> int:
        """Deletes the segments before `before` once the writer has moved past them (a
        durable snapshot covers them); returns how many it deleted."""
        if self.failed is not None:
            return 0
        with self._opened:
            self._opened.wait_for(lambda: self._open_segment >= before, timeout_s)
            if self._open_segment < before:
                return 0
        old = [s for s in segments(self.directory) if s < before]
        for s in old:
            segment_path(self.directory, s).unlink(missing_ok=True)
        return len(old)

    def close(self, timeout_s: float = 10.0) -> None:
        """Writes what is queued, then stops the writer thread."""
        self._queue.put((-1, None))
        self._thread.join(timeout_s)

    # --- the writer thread -----------------------------------------------------------

    def _open(self, segment: int) -> None:
        if self._fd >= 0:
            if self.mode == "group":
                os.fsync(self._fd)
            os.close(self._fd)
        path = segment_path(self.directory, segment)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        header = json.dumps({"format": FORMAT, "segment": segment, **self.header}).encode()
        record = Record(HEADER, header)
        os.write(self._fd, record.frame() + record.payload)
        if self.mode == "group":
            os.fsync(self._fd)
            _fsync_dir(self.directory)
        with self._opened:
            self._open_segment = segment
            self._opened.notify_all()

    def _run(self) -> None:
        last_sync = 0.0
        while True:
            entries = [self._queue.get()]
            if self.mode == "group" and self.sync_interval_s:
                time.sleep(max(0.0, last_sync + self.sync_interval_s - time.monotonic()))
            while True:
                try:
                    entries.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self.failed is None:
                try:
                    self._write(entries)
                    last_sync = time.monotonic()
                except OSError as err:
                    self.failed = err
                    log.error(
                        "write-ahead log %s failed, answering nothing more: %s", self.directory, err
                    )
                    self._release(entries)
                    if self.on_error is not None:
                        self.on_error(err)
            self._release(entries)
            if any(entry == -1 for entry, _ in entries):
                if self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1
                return

    def _write(self, entries: list) -> None:
        """Writes the entries' records (a new segment where the table thread rotated),
        then fsyncs once."""
        parts: list[bytes] = []
        for entry, _ in entries:
            if isinstance(entry, Record):
                parts += [entry.frame(), entry.payload]
                self.stats["wal_records"] += 1
                self.stats["wal_bytes"] += len(entry.payload) + _FRAME.size
            elif isinstance(entry, int) and entry >= 0:
                self._writev(parts)
                parts = []
                self._open(entry)
        self._writev(parts)
        if self.mode == "group":
            os.fsync(self._fd)
            self.stats["wal_syncs"] += 1

    def _writev(self, parts: list[bytes]) -> None:
        while parts:
            # at most IOV_MAX buffers per call; a short write continues where it stopped
            chunk = parts[:512]
            written = os.writev(self._fd, chunk)
            total = sum(len(p) for p in chunk)
            if written < total:
                rest = b"".join(chunk)[written:]
                parts = [rest, *parts[512:]]
            else:
                parts = parts[512:]

    def _release(self, entries: list) -> None:
        for _, waiting in entries:
            if waiting is None or waiting[0].done():
                continue
            future, result = waiting
            if self.failed is None:
                future.set_result(result)
            else:
                future.set_exception(ReplayError(f"the write-ahead log failed: {self.failed}"))


class Replayed(NamedTuple):
    """What `replay` found."""

    inserts: int = 0
    """Insert records applied."""
    items: int = 0
    """Items they stored."""
    updates: int = 0
    """Priority-update records applied."""
    removes: int = 0
    """Items a queue's samples had removed, removed again."""
    dropped_bytes: int = 0
    """Bytes of a torn or corrupt tail (and of the segments after it), not replayed."""
    segments: int = 0
    """Segments read."""
    next_segment: int = 0
    """The number for the segment the restarted shard writes."""


def _records(data: memoryview):
    """Yields (offset, kind, payload) of the whole records of a segment's bytes; stops at
    the first that is cut short or fails its CRC."""
    pos = 0
    while pos + _FRAME.size <= len(data):
        length, crc, kind = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if end > len(data):
            return
        payload = data[pos + _FRAME.size : end]
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            return
        yield pos, end, kind, payload
        pos = end


def _check_header(path: Path, kind: int, payload: memoryview, expected: dict) -> None:
    if kind != HEADER:
        raise ReplayError(f"{path} does not start with a write-ahead log header")
    header = json.loads(bytes(payload))
    if header.get("format") != FORMAT:
        raise ReplayError(f"{path} is log format {header.get('format')}, not {FORMAT}")
    differ = sorted(k for k in expected if header.get(k) != expected[k])
    if differ:
        found = ", ".join(f"{k}={header.get(k)!r}" for k in differ)
        wanted = ", ".join(f"{k}={expected[k]!r}" for k in differ)
        raise ReplayError(
            f"{path} was written by another run or table ({found}; this shard has {wanted}); "
            f"move {path.parent} away to start this shard without it"
        )


def replay(
    directory: Path, expected: dict, start: int, apply: Callable[[int, memoryview], int]
) -> Replayed:
    """Applies the records of segments >= `start` in order and deletes the older ones.

    Args:
        directory: the log's directory.
        expected: the header this shard writes (`identity`).
        start: the first segment the snapshot does not cover (0: no snapshot).
        apply: applies one record (kind, payload); returns the items it stored or removed.

    Raises:
        ReplayError: a segment's header names another run or table (nothing is applied
            from it, and the segments before it were applied).
    """
    counts = {INSERT: 0, UPDATE: 0, REMOVE: 0}
    items = removes = dropped = read = 0
    found = segments(directory)
    for s in (s for s in found if s < start):
        segment_path(directory, s).unlink()
    later = [s for s in found if s >= start]
    for i, s in enumerate(later):
        path = segment_path(directory, s)
        data = memoryview(path.read_bytes())
        read += 1
        good = 0
        for begin, end, kind, payload in _records(data):
            if begin == 0:
                _check_header(path, kind, payload, expected)
            elif kind in counts:
                n = apply(kind, payload)
                counts[kind] += 1
                items += n if kind == INSERT else 0
                removes += n if kind == REMOVE else 0
            good = end
        if good < len(data):  # a torn or corrupt tail: the log ends here
            dropped += len(data) - good
            os.truncate(path, good)
            for rest in later[i + 1 :]:
                rest_path = segment_path(directory, rest)
                dropped += rest_path.stat().st_size
                rest_path.rename(rest_path.with_suffix(".dropped"))
            log.warning(
                "write-ahead log %s: dropped %d bytes after its last whole record at byte %d "
                "(a write cut short or corrupt)", path, dropped, good,
            )  # fmt: skip
            break
    next_segment = max([start, *(s + 1 for s in found)])
    return Replayed(counts[INSERT], items, counts[UPDATE], removes, dropped, read, next_segment)


def applier(table: ServedTable, stored: dict[int, tuple[int, int]]) -> Callable:
    """The `apply` of `replay` for a restored `table`: inserts bypass the rate limiter (a
    restored table's items are not counted by it either) and set `stored` (exactly-once).

    Raises:
        ReplayError: the table is not a `LimitedTable` (the only served table whose
            inserts the log can replay).
    """
    if not isinstance(table, LimitedTable):
        raise ReplayError(
            f"replay.wal needs a ring or a queue table, not {type(table).__name__}; "
            "set replay.wal: none"
        )
    insert_request = codec.parser(pb.InsertRequest)
    update_request = codec.parser(pb.UpdatePrioritiesRequest)

    def apply(kind: int, payload: memoryview) -> int:
        if kind == INSERT:
            request = insert_request(bytes(payload))
            batch = codec.decode_batch(request.tensors, request.body)
            priorities = None
            if request.HasField("priorities"):
                priorities = codec.decode_array(request.priorities, request.body)
            keys = table.table.insert(batch, priorities, source=request.actor)
            if request.sender:
                stored[request.actor] = (request.sender, request.sequence)
            return len(keys)
        if kind == UPDATE:
            request = update_request(bytes(payload))
            keys = codec.decode_array(request.keys, request.body)
            table.update_priorities(keys, codec.decode_array(request.priorities, request.body))
            return 0
        (n,) = _COUNT.unpack(payload)
        table.table.sample(n)
        return n

    return apply


def snapshot_segment(snapshot: Path) -> int | None:
    """The first segment `snapshot` does not cover (None: no snapshot; a snapshot written
    without a log covers every segment)."""
    if not snapshot.exists():
        return None
    with np.load(snapshot) as data:
        return int(data[WAL_KEY]) if WAL_KEY in data.files else -1


def open_log(
    snapshot: Path,
    header: dict[str, Any],
    table: ServedTable,
    stored: dict[int, tuple[int, int]],
    mode: Mode,
    sync_interval_s: float = 0.0,
) -> tuple[WriteAheadLog, Replayed]:
    """Replays the log beside `snapshot` (`<snapshot>.wal`) into `table`, restored from
    that snapshot, and opens it for the records to come.

    Raises:
        ReplayError: the log was written by another run or table, or the table's
            inserts cannot be replayed.
    """
    directory = log_dir(snapshot)
    start = snapshot_segment(snapshot)
    if start == -1:  # a snapshot of a shard without a log holds whatever a log held then
        start = max([0, *(s + 1 for s in segments(directory))])
    replayed = replay(directory, header, start or 0, applier(table, stored))
    return WriteAheadLog(directory, header, replayed.next_segment, mode, sync_interval_s), replayed
