"""A memory shard's write-ahead log: nothing it acknowledged is lost when it is killed.

The table thread applies an operation, then writes its record (`WriteAheadLog.write`),
so the log keeps the table's order; an Insert's handler thread answers only once the
record is fsynced (`WriteAheadLog.sync`: the first waiting handler fsyncs for all of them,
group commit). An Insert is thus answered once its items are durable, and a Sample may
return items that are not yet: a shard killed before the fsync never acknowledged them.

Kept: inserts (the batch the table stores, in the form it takes it: the wire form of
Atari frame stacks, each distinct frame of the shipment once, compressed when it
compresses: `insert_record`), priority updates (answered
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
import struct
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple, NoReturn

import lz4.block
import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay import LimitedTable, ServedTable
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb

log = logging.getLogger(__name__)

HEADER, INSERT, UPDATE, REMOVE, INSERT_ZLIB, INSERT_LZ4 = 1, 2, 3, 4, 5, 6
"""Record kinds: the segment's header (JSON), an insert (an `InsertRequest`), a priority
update (an `UpdatePrioritiesRequest`), items a queue's sample removed (u64 count), an
insert whose `InsertRequest` is compressed: zlib (logs written before LZ4; still read) or LZ4
(`insert_record`)."""
_DECOMPRESS: dict[int, Callable[[Any], bytes]] = {
    INSERT_ZLIB: zlib.decompress,
    INSERT_LZ4: lz4.block.decompress,
}
COMPRESS_FROM = 8192
"""Insert records of at least this many bytes are compressed when a sample of them shrinks
to half (`insert_record`)."""
_PROBE = 2048
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
    """The record of a checked insert: its batch as the table takes it (`check_insert`).

    A large one is LZ4-compressed when `_PROBE` bytes from its middle compress to under half:
    Atari frames do ~20x (a 64-item Pong shipment at 42x42, 115 KB: ~14 us; zlib level 1
    took 150 us for 10 % fewer bytes), and the log's disk writes shrink as much; noise-like
    data costs only the probe."""
    body = codec.Body()
    tensors = body.batch(batch)
    request = pb.InsertRequest(
        tensors=tensors, actor=actor, round=round_, sender=sender, sequence=sequence
    )
    if priorities is not None:
        request.priorities.CopyFrom(body.tensor("priorities", priorities))
    payload = body.frame(request).SerializeToString()
    if len(payload) >= COMPRESS_FROM:
        middle = len(payload) // 2
        if 2 * len(lz4.block.compress(payload[middle : middle + _PROBE])) < _PROBE:
            return Record(INSERT_LZ4, lz4.block.compress(payload))
    return Record(INSERT, payload)


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


# A group's fsync flushes the appended bytes and the file size they need, not the file's
# times: fdatasync (0.25-0.65 ms against 1.4-2.3 ms for fsync after an append on this
# machine's ext4, where fsync also writes the inode's mtime), fsync where there is none (macOS).
_datasync = getattr(os, "fdatasync", os.fsync)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """Appends records to the segments in `directory`; fsyncs them in groups.

    The table thread writes each record (`write`) as it applies the operation, so the log
    keeps the table's order. A handler thread that must answer only once its record is
    durable calls `sync` with the position `write` returned: the first to arrive fsyncs
    everything written so far, the others waiting meanwhile find theirs covered (group
    commit, no thread of its own).

    Args:
        directory: the log's directory (created).
        header: the segments' header (`identity`).
        segment: the number of the first segment to write (after every existing one).
        mode: "group" (`sync` fsyncs) or "write" (no fsync: `sync` returns at once).
        sync_interval_s: "group": least seconds between two fsyncs.
        on_error: called when a write or an fsync fails (the shard stops: the records
            after the failed one are not durable, so nothing more is answered).

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
        """Called with the error when a write or an fsync fails."""
        self._lock = threading.Lock()  # one fsync at a time; segment switches wait for it
        self._fd = -1
        self.segment = segment
        """The segment being written."""
        self.written = 0
        """Bytes written since this log was opened, over all its segments."""
        self._synced = 0  # of `written`, the bytes known durable
        self._last_sync = 0.0
        self.failed: BaseException | None = None
        self.stats = {"wal_records": 0, "wal_bytes": 0, "wal_syncs": 0}
        directory.mkdir(parents=True, exist_ok=True)
        self._open(segment)

    def write(self, record: Record) -> int:
        """Appends `record` (on the table thread: records in the table's order); returns the
        position to `sync` to.

        Raises:
            ReplayError: the log failed (now or before).
        """
        self._check()
        try:
            self._writev([record.frame(), record.payload])
        except OSError as err:
            self._fail(err)
        self.stats["wal_records"] += 1
        self.stats["wal_bytes"] += len(record.payload) + _FRAME.size
        return self.written

    def sync(self, position: int) -> None:
        """Returns once the bytes up to `position` (`write`'s) are durable ("group"): the
        first caller fsyncs what is written by then, at most once per `sync_interval_s`.

        Raises:
            ReplayError: the log failed.
        """
        self._check()
        if self.mode != "group" or self._synced >= position:
            return
        with self._lock:
            self._check()
            if self._synced >= position:  # an fsync while this one waited covered it
                return
            if self._fd < 0:
                raise ReplayError("the write-ahead log is closed (the shard is stopping)")
            if self.sync_interval_s:
                time.sleep(max(0.0, self._last_sync + self.sync_interval_s - time.monotonic()))
            target = self.written  # every write completed by now is in this fsync
            try:
                _datasync(self._fd)
            except OSError as err:
                self._fail(err)
            self._synced, self._last_sync = target, time.monotonic()
            self.stats["wal_syncs"] += 1

    def rotate(self) -> int:
        """Starts a new segment after the records written so far (a snapshot covers those);
        returns its number."""
        with self._lock:
            self._open(self.segment + 1)
        return self.segment

    def truncate(self, before: int) -> int:
        """Deletes the segments before `before` (a durable snapshot covers them); returns
        how many it deleted."""
        if self.failed is not None:
            return 0
        old = [s for s in segments(self.directory) if s < min(before, self.segment)]
        for s in old:
            segment_path(self.directory, s).unlink(missing_ok=True)
        return len(old)

    def close(self) -> None:
        """Makes what is written durable ("group") and closes the segment."""
        with self._lock:
            if self._fd >= 0:
                if self.mode == "group" and self.failed is None:
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1

    def _check(self) -> None:
        if self.failed is not None:
            raise ReplayError(f"the write-ahead log failed: {self.failed}")

    def _fail(self, err: OSError) -> NoReturn:
        self.failed = err
        log.error("write-ahead log %s failed, answering nothing more: %s", self.directory, err)
        if self.on_error is not None:
            self.on_error(err)
        raise ReplayError(f"the write-ahead log failed: {err}") from err

    def _open(self, segment: int) -> None:
        """Closes the segment being written (durable first, "group") and starts `segment`
        with its header."""
        if self._fd >= 0:
            if self.mode == "group":
                os.fsync(self._fd)
            os.close(self._fd)
            self._synced = self.written
        path = segment_path(self.directory, segment)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        header = json.dumps({"format": FORMAT, "segment": segment, **self.header}).encode()
        record = Record(HEADER, header)
        os.write(self._fd, record.frame() + record.payload)
        if self.mode == "group":
            os.fsync(self._fd)
            _fsync_dir(self.directory)
        self.segment = segment

    def _writev(self, parts: list[bytes]) -> None:
        total = sum(len(p) for p in parts)
        written = os.writev(self._fd, parts)
        if written < total:  # a short write continues where it stopped
            rest = b"".join(parts)[written:]
            while rest:
                rest = rest[os.write(self._fd, rest) :]
        self.written += total


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
            if kind in _DECOMPRESS and begin > 0:
                kind, payload = INSERT, memoryview(_DECOMPRESS[kind](payload))
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
    """The `apply` of `replay` for a restored `table`: inserts bypass the rate limiter (the
    shard counts what a ring holds once, after the replay: `memory.build`) and set `stored`
    (exactly-once).

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
