"""Reverb-style rate limiting of replay inserts against samples.

The limiter is a pure, non-blocking state machine: it keeps two counters and answers
whether an insert or a sample of ``n`` items is legal now. The memory server's table
thread keeps the pending operations, asks ``can_insert`` / ``can_sample`` and reports what
it did with ``on_insert`` / ``on_sample``.

Semantics (Reverb's ``SampleToInsertRatio``, counted in items)::

    diff     = inserts * samples_per_insert - samples
    min_diff = min_size_to_sample * samples_per_insert - error_buffer
    max_diff = min_size_to_sample * samples_per_insert + error_buffer

    can_sample(n) = inserts >= min_size_to_sample and diff - n >= min_diff
    can_insert(n) = diff <= max_diff      # checked before the insert

Without ``samples_per_insert`` only the minimum size is enforced (Reverb's ``MinSize``).
"""

import math
from typing import Any

import numpy as np

from easyrl.errors import ReplayError


def _check_count(name: str, value: object, minimum: int) -> int:
    """Check that ``value`` is an integer (not a bool) >= ``minimum``.

    Args:
        name: Argument name used in the error message.
        value: The value to check.
        minimum: Smallest allowed value.

    Returns:
        ``value`` as a Python int.

    Raises:
        ReplayError: If ``value`` is not an integer or is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ReplayError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ReplayError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_real(name: str, value: object) -> float:
    """Check that ``value`` is a finite real number (not a bool).

    Args:
        name: Argument name used in the error message.
        value: The value to check.

    Returns:
        ``value`` as a Python float.

    Raises:
        ReplayError: If ``value`` is not a finite real number.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ReplayError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(float(value)):
        raise ReplayError(f"{name} must be finite, got {value!r}")
    return float(value)


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
        self._min_size = _check_count("min_size_to_sample", min_size_to_sample, 1)
        self._spi: float | None = None
        self._error_buffer: float | None = None
        if samples_per_insert is None:
            if error_buffer is not None:
                raise ReplayError(
                    "error_buffer is only meaningful with samples_per_insert; "
                    f"got error_buffer={error_buffer!r} and samples_per_insert=None"
                )
        else:
            spi = _check_real("samples_per_insert", samples_per_insert)
            if spi <= 0:
                raise ReplayError(f"samples_per_insert must be > 0, got {spi}")
            if error_buffer is None:
                raise ReplayError("error_buffer is required when samples_per_insert is given")
            buffer = _check_real("error_buffer", error_buffer)
            if buffer < max(1.0, spi):
                raise ReplayError(
                    f"error_buffer must be >= max(1.0, samples_per_insert) = {max(1.0, spi)}, "
                    f"got {buffer}"
                )
            self._spi = spi
            self._error_buffer = buffer
        self._inserts = 0
        self._samples = 0

    @property
    def min_size_to_sample(self) -> int:
        """Items that must have been inserted before sampling is allowed.

        Returns:
            The constructor's ``min_size_to_sample``.
        """
        return self._min_size

    @property
    def samples_per_insert(self) -> float | None:
        """Target sample-to-insert ratio.

        Returns:
            The ratio, or None when ratio limiting is disabled.
        """
        return self._spi

    @property
    def error_buffer(self) -> float | None:
        """Allowed deviation of ``diff`` from its centre.

        Returns:
            The buffer, or None when ratio limiting is disabled.
        """
        return self._error_buffer

    @property
    def inserts(self) -> int:
        """Total inserted items reported through ``on_insert``.

        Returns:
            The insert counter.
        """
        return self._inserts

    @property
    def samples(self) -> int:
        """Total sampled items reported through ``on_sample``.

        Returns:
            The sample counter.
        """
        return self._samples

    @property
    def min_diff(self) -> float | None:
        """Lower bound of ``diff`` after a sample.

        Returns:
            ``min_size_to_sample * spi - error_buffer``, or None without ratio limiting.
        """
        if self._spi is None or self._error_buffer is None:
            return None
        return self._min_size * self._spi - self._error_buffer

    @property
    def max_diff(self) -> float | None:
        """Upper bound of ``diff`` before an insert.

        Returns:
            ``min_size_to_sample * spi + error_buffer``, or None without ratio limiting.
        """
        if self._spi is None or self._error_buffer is None:
            return None
        return self._min_size * self._spi + self._error_buffer

    @property
    def diff(self) -> float | None:
        """Current ``inserts * samples_per_insert - samples``.

        Returns:
            The difference, or None without ratio limiting.
        """
        if self._spi is None:
            return None
        return self._inserts * self._spi - self._samples

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
        n = _check_count("n", n, 1)
        if self._inserts < self._min_size:
            return False
        diff, min_diff = self.diff, self.min_diff
        if diff is None or min_diff is None:  # no ratio limiting
            return True
        return diff - n >= min_diff

    def can_insert(self, n: int) -> bool:
        """Whether inserting ``n`` items is legal now.

        The check is made before the insert, so a batch of ``n`` items may push ``diff``
        up to ``max_diff + n * samples_per_insert``; this is what keeps batched inserts
        from deadlocking.

        Args:
            n: Items in the insert batch, >= 1.

        Returns:
            True iff ratio limiting is disabled or ``diff <= max_diff``.

        Raises:
            ReplayError: If ``n`` is not an int >= 1.
        """
        _check_count("n", n, 1)
        diff, max_diff = self.diff, self.max_diff
        if diff is None or max_diff is None:  # no ratio limiting
            return True
        return diff <= max_diff

    def on_insert(self, n: int) -> None:
        """Record that ``n`` items were inserted (the caller checked ``can_insert``).

        Args:
            n: Items inserted, >= 1.

        Raises:
            ReplayError: If ``n`` is not an int >= 1.
        """
        self._inserts += _check_count("n", n, 1)

    def on_sample(self, n: int) -> None:
        """Record that ``n`` items were sampled (the caller checked ``can_sample``).

        Args:
            n: Items sampled, >= 1.

        Raises:
            ReplayError: If ``n`` is not an int >= 1.
        """
        self._samples += _check_count("n", n, 1)

    def check_batch_sizes(self, insert_batch: int, sample_batch: int) -> None:
        """Reject batch sizes for which inserters and samplers could deadlock.

        A deadlock is a state where both ``can_insert`` and ``can_sample`` are False.
        Inserts are blocked only when ``diff > max_diff``. Then
        ``inserts * spi >= diff > min_size * spi + error_buffer``, so the minimum size is
        reached, and the sample is legal iff ``diff - sample_batch >= min_diff``. Since
        ``diff`` can lie arbitrarily close above ``max_diff`` (for general ``spi``), no
        deadlock is possible exactly when ``max_diff - sample_batch >= min_diff``, i.e.::

            2 * error_buffer >= sample_batch

        Below the minimum size ``diff < min_size * spi <= max_diff``, so inserts are
        always legal there. ``insert_batch`` does not enter the condition because
        ``can_insert`` is checked before the insert (an insert batch may overshoot
        ``max_diff`` by at most ``insert_batch * spi``); it is only validated.
        Without ratio limiting no deadlock is possible.

        Args:
            insert_batch: Items per insert call, >= 1.
            sample_batch: Items per sample call, >= 1.

        Raises:
            ReplayError: If a batch size is not an int >= 1, or if
                ``2 * error_buffer < sample_batch``.
        """
        _check_count("insert_batch", insert_batch, 1)
        sample_batch = _check_count("sample_batch", sample_batch, 1)
        if self._error_buffer is None:
            return
        if 2 * self._error_buffer < sample_batch:
            raise ReplayError(
                f"rate limiter window max_diff - min_diff = 2 * error_buffer = "
                f"{2 * self._error_buffer} is smaller than sample_batch={sample_batch}: "
                f"inserts and samples could deadlock; raise error_buffer to at least "
                f"{sample_batch / 2}"
            )

    def state(self) -> dict[str, Any]:
        """Snapshot of the configuration and counters, for status reports.

        Returns:
            Plain dict with ``min_size_to_sample``, ``samples_per_insert``,
            ``error_buffer``, ``inserts``, ``samples``, ``diff``, ``min_diff`` and
            ``max_diff``; the ratio entries (``samples_per_insert``, ``error_buffer``,
            ``diff``, ``min_diff``, ``max_diff``) are None without ratio limiting.
        """
        return {
            "min_size_to_sample": self._min_size,
            "samples_per_insert": self._spi,
            "error_buffer": self._error_buffer,
            "inserts": self._inserts,
            "samples": self._samples,
            "diff": self.diff,
            "min_diff": self.min_diff,
            "max_diff": self.max_diff,
        }
