"""Frame-deduplicating storage of frame-stack columns (Atari observations).

An Atari observation stacks the last k frames as channels (``[H, W, k * c]``, see
`easyrl.envs.atari`): consecutive observations of one env share k - 1 frames, and a DQN
transition's obs and next_obs (n steps apart) share most of theirs, so a table that stores
whole stacks keeps every frame up to 2k times. As Dopamine's circular buffer does, a table
composed with a `FrameStore` keeps each frame once and rebuilds the stacks when it samples;
what a sample returns is unchanged (whole stacks, the same keys and weights).

* `FrameLayout` names the columns that are frame stacks (their trailing shape is the
  observation's ``[H, W, k * c]``: DQN's obs and next_obs, IMPALA's obs ``[T + 1, H, W,
  k * c]``) and splits a stack into its k frames ``[H, W, c]`` and back, exactly.
* The wire form of a batch (`FrameLayout.pack`, run by the actor before it ships): the
  columns that are not stacks as they are, and under `FRAMES_KEY` the batch's distinct
  frames (deduplicated by content, keyed by their bytes: exact) as ``pixels [M, H, W, c]``
  and, per stacked column, ``[n, *lead, k]`` int32 indexes into them. A nested dict, so the
  codec sends it as the tensors ``@frames/pixels``, ``@frames/<column>``. A table takes
  the wire form or plain stacks (which it packs itself).
* `FrameStore`: a FIFO ring of F frames with absolute int64 frame ids (frame ``i`` lives in
  slot ``i % F``); the table keeps, per item and stacked column, the ``[*lead, k]`` ids of
  its frames instead of the pixels. A ring table also matches a shipment's frames against
  the same source's (actor's) previous shipment, so the frames consecutive shipments share
  (the k - 1 earlier frames of a stack, n-step next obs) are stored once.

Eviction: frames and items are stored in insertion order. Before the frame ring overwrites
a frame, a ring table drops every item that still refers to it (the oldest items; an item
never returns a frame that was overwritten); a queue never drops items: an insert whose new
frames do not fit waits (`Table.fits`) until samples have removed the items holding the
oldest frames. A queue matches frames only within a shipment, so the frames it holds are
exactly those of the shipments its items came from.

Sizing (``F`` from the table's ``capacity`` items, `frame_capacity`): a stream of stacks
brings one new frame per stack step, so a ring gets ``ceil(1.25 * capacity * s)`` frames
(``s``: stacks per item of the longest stacked column: 1 for a transition, T + 1 for an
unroll), which keeps ``capacity`` items of real env streams; items that bring more new
frames (random pixels) are evicted earlier. A queue gets ``capacity * b`` frames, ``b`` =
`FrameLayout.max_frames` (the most distinct frames one item of sliding stacks holds, and
the most an insert may give an item), so it always holds ``capacity`` such items.
"""

import collections
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from easyrl.errors import ReplayError
from easyrl.replay.checks import TableSpec, check_int, validate_batch, validate_spec

if TYPE_CHECKING:
    from easyrl.config import Config

FRAMES_KEY = "@frames"
"""Key of a batch's frames and frame indexes in its wire form (no column is named so)."""
PIXELS = "pixels"
"""Entry of ``batch[FRAMES_KEY]`` holding the distinct frames ``[M, H, W, c]``."""
FRAMES_PREFIX = "frames/"
"""Prefix of a frame store's entries in a table snapshot (`Table.state_dict`)."""
RING_HEADROOM = 1.25
"""Frames a ring table keeps per stack step of its items (see the module docstring)."""
MAX_SOURCES = 1024
"""Sources (actors) whose previous shipment a ring's frame store remembers."""

INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
"""Dtypes a wire-form frame index column may have."""


@dataclass(frozen=True)
class FrameLayout:
    """Which columns of a table are frame stacks, and how a stack splits into frames.

    Args:
        columns: Stacked column name -> its leading item shape (``()`` for one stack per
            item, ``(T + 1,)`` for an unroll's observations).
        frame_shape: One frame's ``(H, W, c)``.
        stack: Frames per stack, k >= 2.
        dtype: The frames' dtype (the observation's).
    """

    columns: dict[str, tuple[int, ...]]
    frame_shape: tuple[int, int, int]
    stack: int
    dtype: np.dtype

    @staticmethod
    def find(
        spec: TableSpec, obs_shape: tuple[int, ...], stack: int, dtype: Any
    ) -> "FrameLayout | None":
        """The layout of the columns of ``spec`` whose trailing shape is ``obs_shape``
        (``[H, W, k * c]``) and whose dtype is ``dtype``; None when there is none.

        Raises:
            ReplayError: If ``obs_shape`` is not ``[H, W, k * c]`` with ``stack`` = k >= 2.
        """
        stack = check_int("frame stack", stack, 2)
        if len(obs_shape) != 3 or obs_shape[2] % stack or min(obs_shape) < 1:
            raise ReplayError(f"frame stacks need an [H, W, k * c] shape, got {obs_shape}")
        h, w, channels = (int(d) for d in obs_shape)
        columns = {
            name: shape[:-3]
            for name, (shape, column_dtype) in spec.items()
            if shape[-3:] == (h, w, channels) and np.dtype(column_dtype) == np.dtype(dtype)
        }
        if not columns:
            return None
        if FRAMES_KEY in spec:
            raise ReplayError(f"a column may not be named {FRAMES_KEY!r} (frame tables)")
        return FrameLayout(columns, (h, w, channels // stack), stack, np.dtype(dtype))

    @property
    def stack_shape(self) -> tuple[int, int, int]:
        """One stack's ``(H, W, k * c)``."""
        h, w, c = self.frame_shape
        return h, w, self.stack * c

    @property
    def steps_per_item(self) -> int:
        """Stacks per item of the longest stacked column (1 for a transition)."""
        return max(math.prod(lead) for lead in self.columns.values())

    @property
    def max_frames(self) -> int:
        """The most distinct frames an item may hold: per stacked column, its stacks
        sliding by one frame a step (``steps - 1 + k``); a transition's obs and next_obs
        hold at most 2k."""
        return sum(math.prod(lead) - 1 + self.stack for lead in self.columns.values())

    def id_spec(self, spec: TableSpec) -> TableSpec:
        """``spec`` with each stacked column stored as ``[*lead, k]`` int64 frame ids."""
        out: TableSpec = {}
        for name, entry in spec.items():
            lead = self.columns.get(name)
            out[name] = entry if lead is None else ((*lead, self.stack), np.dtype(np.int64))
        return out

    def split(self, stacks: np.ndarray) -> np.ndarray:
        """``[..., H, W, k * c]`` stacks -> their ``[..., k, H, W, c]`` frames (a view)."""
        k, c = self.stack, self.frame_shape[2]
        frames = stacks.reshape(*stacks.shape[:-1], k, c)  # [..., H, W, k, c]
        return np.moveaxis(frames, -2, -4)  # [..., k, H, W, c]

    def join(self, frames: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """``[..., k, H, W, c]`` frames -> ``[..., H, W, k * c]`` stacks, a new C-contiguous
        array; with ``ids`` ``[..., k]``, the frames are ``frames[ids]`` (``frames`` then
        ``[F, H, W, c]``), gathered one stack position at a time without the whole
        ``frames[ids]``.

        Stack position by position: with c = 1 numpy's copy of the transposed view runs an
        inner loop of one byte, ~3.5x slower than these k copies (Atari Sample(512): 7.6 ->
        2.1 ms).
        """
        k, (h, w, c) = self.stack, self.frame_shape
        lead = frames.shape[:-4] if ids is None else ids.shape[:-1]
        out = np.empty((*lead, h, w, k, c), frames.dtype)
        for j in range(k):
            out[..., j, :] = frames[..., j, :, :, :] if ids is None else frames[ids[..., j]]
        return out.reshape(*lead, h, w, k * c)

    def pack(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """The wire form of a batch of whole stacks (see the module docstring).

        Frames are matched by their bytes (exact); the distinct ones keep the order in which
        they first appear (column by column, item by item, frame by frame).

        Args:
            batch: Column name -> ``[n, *shape]`` arrays; the stacked columns ``[n, *lead,
                H, W, k * c]`` of this layout's dtype.

        Returns:
            A new dict: the other columns as they are, and ``FRAMES_KEY`` -> ``{PIXELS:
            [M, H, W, c], column: [n, *lead, k] int32}``.

        Raises:
            ReplayError: If a stacked column is missing or has another shape or dtype.
        """
        index: dict[bytes, int] = {}
        rows: list[np.ndarray] = []
        packed: dict[str, np.ndarray] = {}
        for name, lead in self.columns.items():
            stacks = batch.get(name)
            if (
                not isinstance(stacks, np.ndarray)
                or stacks.dtype != self.dtype
                or stacks.shape[1:] != (*lead, *self.stack_shape)
            ):
                got = (stacks.dtype, stacks.shape) if isinstance(stacks, np.ndarray) else stacks
                raise ReplayError(
                    f"column {name!r}: expected {self.dtype} [n, *{(*lead, *self.stack_shape)}]"
                    f" frame stacks, got {type(got).__name__ if got is None else got}"
                )
            frames = np.ascontiguousarray(self.split(stacks))  # [n, *lead, k, H, W, c]
            flat = frames.reshape(-1, *self.frame_shape)  # [N, H, W, c]
            ids = np.empty(len(flat), np.int32)  # [N]
            for j, frame in enumerate(flat):
                ids[j] = found = index.setdefault(frame.tobytes(), len(index))
                if found == len(rows):
                    rows.append(frame)
            packed[name] = ids.reshape(*frames.shape[:-3])  # [n, *lead, k]
        pixels = np.stack(rows) if rows else np.zeros((0, *self.frame_shape), self.dtype)
        out: dict[str, Any] = {k: v for k, v in batch.items() if k not in self.columns}
        out[FRAMES_KEY] = {PIXELS: pixels, **packed}
        return out

    def packed(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """``batch`` in its wire form: as it is when it has one, else `pack` ed."""
        return dict(batch) if FRAMES_KEY in batch else self.pack(batch)

    def unpack(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Whole stacks again from a (checked) wire-form batch: the inverse of `pack`."""
        part = batch[FRAMES_KEY]
        out = {k: v for k, v in batch.items() if k != FRAMES_KEY}
        for name in self.columns:
            out[name] = self.join(part[PIXELS], part[name])
        return out

    def check_packed(self, part: Any, n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Checks the ``FRAMES_KEY`` entry of a wire-form batch of ``n`` items.

        Returns:
            The pixels ``[M, H, W, c]`` and, per stacked column, its ``[n, *lead, k]``
            int64 indexes into them.

        Raises:
            ReplayError: If an entry is missing, unexpected, of another dtype or shape, an
                index is outside ``[0, M)``, a frame is referenced by no item, or an item
                holds more than `max_frames` distinct frames.
        """
        if not isinstance(part, Mapping):
            raise ReplayError(f"{FRAMES_KEY!r} must hold named arrays, got {type(part).__name__}")
        expected = {PIXELS, *self.columns}
        missing, extra = sorted(expected - set(part)), sorted(set(part) - expected, key=str)
        if missing or extra:
            raise ReplayError(
                f"{FRAMES_KEY!r} entries do not match the frame layout: missing {missing}, "
                f"unexpected {extra}"
            )
        pixels = part[PIXELS]
        if (
            not isinstance(pixels, np.ndarray)
            or pixels.dtype != self.dtype
            or pixels.ndim != 4
            or pixels.shape[1:] != self.frame_shape
            or len(pixels) < 1
        ):
            got = (pixels.dtype, pixels.shape) if isinstance(pixels, np.ndarray) else pixels
            raise ReplayError(
                f"{FRAMES_KEY}/{PIXELS}: expected {self.dtype} [M >= 1, *{self.frame_shape}], "
                f"got {got if got is None or isinstance(got, tuple) else type(got).__name__}"
            )
        m = len(pixels)
        referenced = np.zeros(m, bool)  # [M]
        indexes: dict[str, np.ndarray] = {}
        for name, lead in self.columns.items():
            ids = part[name]
            shape = (n, *lead, self.stack)
            if not isinstance(ids, np.ndarray) or ids.dtype not in INDEX_DTYPES:
                got = ids.dtype if isinstance(ids, np.ndarray) else type(ids).__name__
                raise ReplayError(
                    f"{FRAMES_KEY}/{name}: expected int32 or int64 indexes, got {got}"
                )
            if ids.shape != shape:
                raise ReplayError(f"{FRAMES_KEY}/{name}: expected shape {shape}, got {ids.shape}")
            ids = ids.astype(np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= m):
                raise ReplayError(
                    f"{FRAMES_KEY}/{name}: frame indexes must be in [0, {m}), got "
                    f"[{ids.min()}, {ids.max()}]"
                )
            referenced[ids.reshape(-1)] = True
            indexes[name] = ids
        if not referenced.all():
            unused = np.flatnonzero(~referenced)
            raise ReplayError(
                f"{FRAMES_KEY}/{PIXELS}: frames {unused[:5]} are referenced by no item"
            )
        per_item = np.sort(np.concatenate([v.reshape(n, -1) for v in indexes.values()], 1), 1)
        distinct = 1 + (np.diff(per_item, axis=1) != 0).sum(axis=1)  # [n]
        if distinct.max() > self.max_frames:
            raise ReplayError(
                f"{FRAMES_KEY}: an item holds {distinct.max()} distinct frames; frame stacks "
                f"of this layout hold at most {self.max_frames}"
            )
        return pixels, indexes


def frame_window(layout: FrameLayout, capacity: int) -> int:
    """How far back a ring's frame store reuses frames (`FrameStore`'s ``window``): the
    frames its `frame_capacity` keeps beyond one frame per stack step of ``capacity``
    items."""
    return max(0, frame_capacity(layout, capacity, False) - capacity * layout.steps_per_item)


def frame_capacity(layout: FrameLayout, capacity: int, queue: bool) -> int:
    """Frames the frame store of a table of ``capacity`` items keeps (see the module
    docstring): ``capacity * max_frames`` for a queue, else ``ceil(1.25 * capacity *
    steps_per_item)``, and never fewer than one item's ``max_frames``."""
    if queue:
        return capacity * layout.max_frames
    ring = math.ceil(RING_HEADROOM * capacity * layout.steps_per_item)
    return max(ring, layout.max_frames)


def layout_for(cfg: "Config", spec: TableSpec) -> FrameLayout | None:
    """The frame layout the actors and memory shards of a run use for a replay spec: the
    stacks of ``env.atari`` (frame_stack > 1) in a uniform, prioritized or trajectory table
    of an online run with ``replay.frame_dedup``; None otherwise (whole stacks per item).

    Raises:
        ReplayError: If the spec is malformed.
    """
    atari, replay = cfg.env.atari, cfg.replay
    if atari is None or atari.frame_stack < 2 or not replay.frame_dedup:
        return None
    if replay.kind not in ("uniform", "prioritized", "trajectory") or cfg.input.dir is not None:
        return None
    channels = atari.frame_stack * (1 if atari.grayscale else 3)
    obs_shape = (atari.screen_size, atari.screen_size, channels)
    return FrameLayout.find(validate_spec(spec), obs_shape, atari.frame_stack, np.uint8)


class Prepared(NamedTuple):
    """A checked insert of a frame table, matched against the stored frames."""

    columns: dict[str, np.ndarray]
    """The columns as the table stores them: stacked ones as ``[n, *lead, k]`` frame ids."""
    first_frame: np.ndarray
    """``[n]`` int64 smallest frame id each item refers to."""
    new: np.ndarray
    """``[M']`` indexes (into the wire-form pixels) of the frames to store, in id order."""
    pixels: np.ndarray
    """The wire-form pixels ``[M, H, W, c]``."""
    ids: np.ndarray
    """``[M]`` int64 frame id of each wire-form frame (stored or matched)."""
    keys: list[bytes]
    """The wire-form frames' bytes (empty when the store does not match sources)."""


class FrameStore:
    """A FIFO ring of frames with absolute frame ids (see the module docstring).

    Args:
        layout: The table's frame layout.
        capacity: Frames kept, F >= 1 (`frame_capacity`).
        match_sources: Whether an insert's frames are matched against its source's
            previous insert (a ring table's; a queue's store does not).
        window: How far back a matched frame may lie: frames of ids below ``next -
            window`` are stored again, so that an item never holds a frame much older than
            its insert (a frame seen again and again, such as a blank screen, would
            otherwise keep its first id and make the ring drop every item that uses it
            early). None: ``F // 4``; `make_table` passes the frames beyond what its
            ``capacity`` items need, ``F - capacity * steps_per_item``.

    Raises:
        ReplayError: If an argument is invalid.
    """

    def __init__(
        self,
        layout: FrameLayout,
        capacity: int,
        match_sources: bool = True,
        window: int | None = None,
    ):
        self.layout = layout
        self.capacity = check_int("frame capacity", capacity, 1)
        self.match_sources = match_sources
        self.window = self.capacity // 4 if window is None else check_int("window", window, 0)
        self.frames = np.zeros((self.capacity, *layout.frame_shape), layout.dtype)  # [F, H, W, c]
        self.next = 0
        """Frame ids ever issued (the id of the next frame stored)."""
        self.matched = 0
        """Wire-form frames found among the stored ones (not stored again) so far."""
        self._recent: collections.OrderedDict[int, dict[bytes, int]] = collections.OrderedDict()

    @property
    def nbytes(self) -> int:
        """Bytes of the frame ring."""
        return self.frames.nbytes

    def check(self, spec: TableSpec, batch: Any) -> int:
        """Checks a batch in wire form or of whole stacks against ``spec``.

        Returns:
            The batch size ``n``.

        Raises:
            ReplayError: If the batch does not match the spec or this store's layout, or
                holds more distinct frames than the store ever keeps.
        """
        if not isinstance(batch, dict) or FRAMES_KEY not in batch:
            return validate_batch(spec, batch)
        plain = {name: entry for name, entry in spec.items() if name not in self.layout.columns}
        rest = {k: v for k, v in batch.items() if k != FRAMES_KEY}
        if plain:
            n = validate_batch(plain, rest)
        else:
            if rest:
                raise ReplayError(f"batch columns do not match the table spec: unexpected {rest}")
            first = batch[FRAMES_KEY].get(next(iter(self.layout.columns)))
            n = len(first) if isinstance(first, np.ndarray) and first.ndim else 0
            if not n:
                raise ReplayError("batch must contain at least one item, got n = 0")
        pixels, _ = self.layout.check_packed(batch[FRAMES_KEY], n)
        if len(pixels) > self.capacity:
            raise ReplayError(
                f"{len(pixels)} distinct frames never fit a frame store of {self.capacity} "
                "frames; raise replay.capacity"
            )
        return n

    def frames_needed(self, batch: dict[str, Any]) -> int:
        """The frames an insert of a checked wire-form batch stores at most."""
        return len(batch[FRAMES_KEY][PIXELS])

    def prepare(self, batch: dict[str, Any], n: int, source: int) -> Prepared:
        """Matches a checked batch's frames against the stored ones, changing nothing.

        A frame of ``source``'s previous insert is reused when its id is at least ``next -
        window`` and stays stored after this insert's new frames are written (ids >=
        ``next + M - F``).

        Returns:
            What `write` and the table store.
        """
        wire = self.layout.packed(batch)
        pixels, indexes = self.layout.check_packed(wire[FRAMES_KEY], n)
        m = len(pixels)
        ids = np.empty(m, np.int64)  # [M]
        new: list[int] = []
        keys: list[bytes] = []
        recent = self._recent.get(source) if self.match_sources else None
        floor = max(self.next + m - self.capacity, self.next - self.window)
        for i in range(m):
            hit = None
            if self.match_sources:
                keys.append(pixels[i].tobytes())
                if recent is not None:
                    hit = recent.get(keys[-1])
            if hit is not None and hit >= floor:
                ids[i] = hit
            else:
                ids[i] = self.next + len(new)
                new.append(i)
        columns = {k: v for k, v in wire.items() if k != FRAMES_KEY}
        first = np.full(n, np.iinfo(np.int64).max, np.int64)  # [n]
        for name, local in indexes.items():
            columns[name] = ids[local]  # [n, *lead, k]
            first = np.minimum(first, columns[name].reshape(n, -1).min(axis=1))
        return Prepared(columns, first, np.asarray(new, np.int64), pixels, ids, keys)

    def write(self, prepared: Prepared, source: int) -> None:
        """Stores the new frames of a prepared insert (overwriting the oldest) and
        remembers its frames as ``source``'s previous insert."""
        count = len(prepared.new)
        slots = (self.next + np.arange(count)) % self.capacity  # [M']
        self.frames[slots] = prepared.pixels[prepared.new]
        self.next += count
        self.matched += len(prepared.ids) - count
        if self.match_sources:
            self._recent[source] = dict(zip(prepared.keys, prepared.ids.tolist(), strict=True))
            self._recent.move_to_end(source)
            while len(self._recent) > MAX_SOURCES:
                self._recent.popitem(last=False)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """``[..., k]`` stored frame ids -> ``[..., H, W, k * c]`` stacks."""
        return self.layout.join(self.frames, ids % self.capacity)

    def state(self, low: int) -> dict[str, Any]:
        """Snapshot entries: ``frames/capacity``, ``frames/next`` and ``frames/pixels``, the
        frames of ids ``[low, next)`` in id order."""
        slots = np.arange(low, self.next) % self.capacity
        return {
            FRAMES_PREFIX + "capacity": self.capacity,
            FRAMES_PREFIX + "next": self.next,
            FRAMES_PREFIX + "pixels": self.frames[slots],
        }

    def check_state(self, state: dict[str, Any], low: int | None) -> tuple[int, np.ndarray]:
        """Checks the ``frames/`` entries of a snapshot whose items' smallest frame id is
        ``low`` (None: it holds no item).

        Returns:
            ``(next, pixels)``.

        Raises:
            ReplayError: If an entry is invalid or does not hold the frames ``[low, next)``.
        """
        capacity = check_int("state['frames/capacity']", state[FRAMES_PREFIX + "capacity"], 1)
        if capacity != self.capacity:
            raise ReplayError(f"state dict frame capacity {capacity} != {self.capacity}")
        following = check_int("state['frames/next']", state[FRAMES_PREFIX + "next"], 0)
        if low is not None and low < 0:
            raise ReplayError(f"state dict frame ids must be >= 0, got {low}")
        pixels = state[FRAMES_PREFIX + "pixels"]
        held = following - (following if low is None else low)
        shape = (held, *self.layout.frame_shape)
        got = (pixels.dtype, pixels.shape) if isinstance(pixels, np.ndarray) else pixels
        if held < 0 or held > capacity or got != (self.layout.dtype, shape):
            raise ReplayError(
                f"state dict frames: expected {self.layout.dtype} {shape} (ids [{low}, "
                f"{following}), at most {capacity}), got {got}"
            )
        return following, pixels

    def load(self, following: int, pixels: np.ndarray) -> None:
        """Restores checked snapshot frames (ids ``[following - len(pixels), following)``);
        forgets the sources' previous inserts."""
        self.frames[:] = 0
        self.frames[np.arange(following - len(pixels), following) % self.capacity] = pixels
        self.next = following
        self._recent.clear()
