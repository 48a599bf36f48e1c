"""Reverb-style rate limiting of replay inserts against samples.

The limiter is a pure, non-blocking state machine: it keeps two counters and answers
whether an insert or a sample of ``n`` items is legal now. The memory server's table
thread keeps the pending operations, asks ``can_insert`` / ``can_sample`` and reports what
it did with ``on_insert`` / ``on_sample``. One class, configured by named constructors as
Reverb's are:

* ``RateLimiter(min_size_to_sample, samples_per_insert, error_buffer)`` (Reverb's
  ``SampleToInsertRatio``, in items)::

      diff     = inserts * samples_per_insert - samples
      min_diff = min_size_to_sample * samples_per_insert - error_buffer
      max_diff = min_size_to_sample * samples_per_insert + error_buffer

      can_sample(n) = inserts >= min_size_to_sample and diff - n >= min_diff
      can_insert(n) = diff <= max_diff      # checked before the insert

* ``RateLimiter.min_size``: only the minimum size is enforced (Reverb's ``MinSize``).
* ``RateLimiter.queue``: Reverb's ``Queue`` for a table whose samples remove what they
  return. Its counters are the table's (``inserted``, ``removed``), so
  ``diff = inserts - samples`` is the queue length, also after a restore; ``min_diff = 0``,
  ``max_diff = capacity``, and an insert must fit (``diff + n <= max_diff``).
"""

from typing import TYPE_CHECKING, Any

from easyrl.errors import ReplayError
from easyrl.replay.checks import check_int, check_real

if TYPE_CHECKING:
    from easyrl.replay.tables import Table


class RateLimiter:
    """Limits the ratio of sampled to inserted items, Reverb style.

    Args:
        min_size_to_sample: Items that must have been inserted before any sample, >= 1.
        samples_per_insert: Target number of sampled items per inserted item, > 0; None
            disables ratio limiting (only ``min_size_to_sample`` applies).
        error_buffer: Allowed deviation of ``diff`` around
            ``min_size_to_sample * samples_per_insert``; required with
            ``samples_per_insert`` and must be >= ``max(1.0, samples_per_insert)``;
            must be None without it.

    Raises:
        ReplayError: If an argument violates the rules above.
    """

    def __init__(
        self,
        min_size_to_sample: int,
        samples_per_insert: float | None = None,
        error_buffer: float | None = None,
    ) -> None:
        self._min_size = check_int("min_size_to_sample", min_size_to_sample, 1)
        self._spi: float | None = None
        self._error_buffer: float | None = None
        self._window: tuple[float, float] | None = None  # (min_diff, max_diff)
        self._queue: Table | None = None  # a queue's limiter counts what its table does
        if samples_per_insert is None:
            if error_buffer is not None:
                raise ReplayError(
                    "error_buffer is only meaningful with samples_per_insert; "
                    f"got error_buffer={error_buffer!r} and samples_per_insert=None"
                )
        else:
            spi = check_real("samples_per_insert", samples_per_insert)
            if spi <= 0:
                raise ReplayError(f"samples_per_insert must be > 0, got {spi}")
            if error_buffer is None:
                raise ReplayError("error_buffer is required when samples_per_insert is given")
            buffer = check_real("error_buffer", error_buffer)
            if buffer < max(1.0, spi):
                raise ReplayError(
                    f"error_buffer must be >= max(1.0, samples_per_insert) = {max(1.0, spi)}, "
                    f"got {buffer}"
                )
            self._spi, self._error_buffer = spi, buffer
            centre = self._min_size * spi
            self._window = (centre - buffer, centre + buffer)
        self._inserts = 0
        self._samples = 0

    @classmethod
    def min_size(cls, min_size_to_sample: int) -> "RateLimiter":
        """Reverb's ``MinSize``: samples wait until ``min_size_to_sample`` items were inserted.

        Raises:
            ReplayError: If ``min_size_to_sample`` is not an int >= 1.
        """
        return cls(min_size_to_sample)

    @classmethod
    def queue(cls, table: "Table") -> "RateLimiter":
        """Reverb's ``Queue`` on ``table`` (``Table.queue``): an insert waits until it fits
        in the table's capacity, a sample until ``n`` items are queued.

        Raises:
            ReplayError: If ``table`` does not remove what it samples.
        """
        if not table.remove_on_sample:
            raise ReplayError("a queue rate limiter needs a table that removes what it samples")
        limiter = cls(1, 1.0, 1.0)
        limiter._window, limiter._error_buffer = (0.0, float(table.capacity)), None
        limiter._queue = table
        return limiter

    @property
    def inserts(self) -> int:
        """Total inserted items reported through ``on_insert`` (a queue's table's)."""
        return self._inserts if self._queue is None else self._queue.inserted

    @property
    def samples(self) -> int:
        """Total sampled items reported through ``on_sample`` (a queue's table's)."""
        return self._samples if self._queue is None else self._queue.removed

    @property
    def min_diff(self) -> float | None:
        """Lower bound of ``diff`` after a sample, or None without ratio limiting."""
        return None if self._window is None else self._window[0]

    @property
    def max_diff(self) -> float | None:
        """Upper bound of ``diff`` before an insert (after it, for a queue), or None."""
        return None if self._window is None else self._window[1]

    @property
    def diff(self) -> float | None:
        """Current ``inserts * samples_per_insert - samples``, or None without a ratio."""
        if self._spi is None:
            return None
        return self.inserts * self._spi - self.samples

    def can_sample(self, n: int) -> bool:
        """Whether sampling ``n`` items is legal now.

        Args:
            n: Items in the sample, >= 1.

        Returns:
            True iff ``inserts >= min_size_to_sample`` and, with ratio limiting,
            ``diff - n >= min_diff``.

        Raises:
            ReplayError: If ``n`` is not an int >= 1.
        """
        n = check_int("n", n, 1)
        if self.inserts < self._min_size:
            return False
        diff, min_diff = self.diff, self.min_diff
        if diff is None or min_diff is None:  # no ratio limiting
            return True
        return diff - n >= min_diff

    def can_insert(self, n: int) -> bool:
        """Whether inserting ``n`` items is legal now.

        A ratio limiter checks before the insert, so a batch of ``n`` items may push
        ``diff`` up to ``max_diff + n * samples_per_insert``; this is what keeps batched
        inserts from deadlocking. A queue's insert must fit: ``diff + n <= max_diff``.

        Args:
            n: Items in the insert batch, >= 1.

        Returns:
            True iff ratio limiting is disabled or ``diff`` is within ``max_diff``.

        Raises:
            ReplayError: If ``n`` is not an int >= 1.
        """
        n = check_int("n", n, 1)
        diff, max_diff = self.diff, self.max_diff
        if diff is None or max_diff is None:  # no ratio limiting
            return True
        return diff + (0 if self._queue is None else n) <= max_diff

    def on_insert(self, n: int) -> None:
        """Record that ``n`` items (an int >= 1) were inserted.

        Raises:
            ReplayError: If ``n`` is not an int >= 1.
        """
        self._inserts += check_int("n", n, 1)

    def on_sample(self, n: int) -> None:
        """Record that ``n`` items (an int >= 1) were sampled.

        Raises:
            ReplayError: If ``n`` is not an int >= 1.
        """
        self._samples += check_int("n", n, 1)

    def check_batch_sizes(self, insert_batch: int, sample_batch: int) -> None:
        """Reject batch sizes for which inserters and samplers could deadlock.

        A deadlock is a state where both ``can_insert`` and ``can_sample`` are False.
        Ratio limiting blocks inserts only when ``diff > max_diff``. Then
        ``inserts * spi >= diff > min_size * spi + error_buffer``, so the minimum size is
        reached, and the sample is legal iff ``diff - sample_batch >= min_diff``. Since
        ``diff`` can lie arbitrarily close above ``max_diff`` (for general ``spi``), no
        deadlock is possible exactly when ``max_diff - sample_batch >= min_diff``, i.e.::

            2 * error_buffer >= sample_batch

        Below the minimum size ``diff < min_size * spi <= max_diff``, so inserts are
        always legal there. ``insert_batch`` does not enter the condition because
        ``can_insert`` is checked before the insert; it is only validated. Without ratio
        limiting no deadlock is possible. A queue must hold one insert and one sample.

        Args:
            insert_batch: Items per insert call, >= 1.
            sample_batch: Items per sample call, >= 1.

        Raises:
            ReplayError: If a batch size is not an int >= 1, or if it cannot be served.
        """
        insert_batch = check_int("insert_batch", insert_batch, 1)
        sample_batch = check_int("sample_batch", sample_batch, 1)
        if self._queue is not None:
            capacity = self._queue.capacity
            if max(insert_batch, sample_batch) > capacity:
                raise ReplayError(
                    f"replay.capacity {capacity} (unrolls) must hold one insert "
                    f"({insert_batch}) and one learner Sample ({sample_batch}: "
                    "algorithm.batch_size x learner.batches_per_sample)"
                )
        elif self._error_buffer is not None and 2 * self._error_buffer < sample_batch:
            raise ReplayError(
                f"rate limiter window max_diff - min_diff = 2 * error_buffer = "
                f"{2 * self._error_buffer} is smaller than sample_batch={sample_batch} (a "
                "learner's Sample: algorithm.batch_size x learner.batches_per_sample): "
                f"inserts and samples could deadlock; raise error_buffer to at least "
                f"{sample_batch / 2}"
            )

    def state(self) -> dict[str, Any]:
        """Snapshot of the configuration and counters, for status reports.

        Returns:
            Plain dict with ``min_size_to_sample``, ``samples_per_insert``,
            ``error_buffer``, ``inserts``, ``samples``, ``diff``, ``min_diff`` and
            ``max_diff``; the ratio entries are None without ratio limiting.
        """
        return {
            "min_size_to_sample": self._min_size,
            "samples_per_insert": self._spi,
            "error_buffer": self._error_buffer,
            "inserts": self.inserts,
            "samples": self.samples,
            "diff": self.diff,
            "min_diff": self.min_diff,
            "max_diff": self.max_diff,
        }
