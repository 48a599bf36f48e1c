"""RateLimiter: table-driven insert/sample sequences, validation and deadlock freedom."""

import math

import numpy as np
import pytest

from easyrl.errors import ReplayError
from easyrl.replay.rate_limiter import RateLimiter

# Each step: (operation, n, expected legality). A legal step is then performed.
SEQUENCES = {
    "min_size_only": (
        dict(min_size_to_sample=3),
        [
            ("sample", 1, False),
            ("insert", 1, True),
            ("insert", 1, True),
            ("sample", 1, False),  # 2 < 3 inserted
            ("insert", 1, True),
            ("sample", 1, True),
            ("sample", 100, True),  # no ratio limit
            ("insert", 50, True),
        ],
    ),
    "spi1_buffer2": (
        # min_diff = 2 - 2 = 0, max_diff = 2 + 2 = 4
        dict(min_size_to_sample=2, samples_per_insert=1.0, error_buffer=2.0),
        [
            ("sample", 1, False),  # below min size
            ("insert", 1, True),
            ("insert", 1, True),  # diff 2
            ("sample", 1, True),  # diff 1
            ("sample", 1, True),  # diff 0
            ("sample", 1, False),  # sampling too far ahead: 0 - 1 < 0
            ("insert", 1, True),  # diff 1
            ("sample", 1, True),  # diff 0
            ("insert", 1, True),  # diff 1
            ("insert", 1, True),  # diff 2
            ("insert", 1, True),  # diff 3
            ("insert", 1, True),  # diff 4
            ("insert", 1, True),  # 4 <= max_diff, legal -> diff 5
            ("insert", 1, False),  # inserting too far ahead: 5 > 4
            ("sample", 2, True),  # diff 3
            ("insert", 1, True),  # diff 4
            ("insert", 1, True),  # diff 5
            ("insert", 1, False),
            ("sample", 1, True),  # diff 4
            ("insert", 1, True),
        ],
    ),
    "batched_overshoot": (
        # min_diff = 2 - 2 = 0, max_diff = 2 + 2 = 4
        dict(min_size_to_sample=1, samples_per_insert=2.0, error_buffer=2.0),
        [
            ("insert", 3, True),  # checked before: diff 0 -> 6 (overshoot by 3 * 2)
            ("insert", 1, False),
            ("sample", 4, True),  # 6 - 4 = 2 >= 0 -> diff 2
            ("sample", 3, False),  # 2 - 3 < 0
            ("insert", 1, True),  # diff 4
            ("insert", 1, True),  # 4 <= 4 -> diff 6
            ("sample", 3, True),  # diff 3
            ("sample", 3, True),  # diff 0
            ("sample", 1, False),
        ],
    ),
    "fractional_spi": (
        # min_diff = 2 - 1 = 1, max_diff = 2 + 1 = 3
        dict(min_size_to_sample=4, samples_per_insert=0.5, error_buffer=1.0),
        [
            ("insert", 3, True),
            ("sample", 1, False),  # 3 < 4 inserted
            ("insert", 1, True),  # diff 2
            ("sample", 1, True),  # diff 1
            ("sample", 1, False),  # 0 < 1
            ("insert", 1, True),  # diff 1.5
            ("sample", 1, False),  # 0.5 < 1
            ("insert", 1, True),  # diff 2
            ("sample", 1, True),  # diff 1
            ("insert", 4, True),  # diff 3
            ("insert", 1, True),  # 3 <= 3 -> diff 3.5
            ("insert", 1, False),
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_sequences(name: str) -> None:
    kwargs, steps = SEQUENCES[name]
    limiter = RateLimiter(**kwargs)
    inserts = samples = 0
    for i, (op, n, legal) in enumerate(steps):
        check = limiter.can_insert if op == "insert" else limiter.can_sample
        assert check(n) is legal, f"step {i}: {op}({n}) in state {limiter.state()}"
        if legal and op == "insert":
            limiter.on_insert(n)
            inserts += n
        elif legal:
            limiter.on_sample(n)
            samples += n
    assert (limiter.inserts, limiter.samples) == (inserts, samples)


def test_state_reports_counters_and_bounds() -> None:
    limiter = RateLimiter(10, samples_per_insert=4.0, error_buffer=8.0)
    limiter.on_insert(12)
    limiter.on_sample(5)
    assert limiter.state() == {
        "min_size_to_sample": 10,
        "samples_per_insert": 4.0,
        "error_buffer": 8.0,
        "inserts": 12,
        "samples": 5,
        "diff": 43.0,
        "min_diff": 32.0,
        "max_diff": 48.0,
    }
    plain = RateLimiter(2).state()
    assert plain["diff"] is None and plain["max_diff"] is None and plain["inserts"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0,), "min_size_to_sample must be >= 1"),
        ((-2,), "min_size_to_sample must be >= 1"),
        ((2.0,), "min_size_to_sample must be an int"),
        ((True,), "min_size_to_sample must be an int"),
        ((1, 0.0, 1.0), "samples_per_insert must be > 0"),
        ((1, -1.0, 1.0), "samples_per_insert must be > 0"),
        ((1, math.nan, 1.0), "samples_per_insert must be finite"),
        ((1, 1.0, None), "error_buffer is required"),
        ((1, 0.5, 0.5), r"error_buffer must be >= max\(1.0, samples_per_insert\) = 1.0"),
        ((1, 4.0, 3.0), r"error_buffer must be >= max\(1.0, samples_per_insert\) = 4.0"),
        ((1, 1.0, math.inf), "error_buffer must be finite"),
        ((1, None, 2.0), "error_buffer is only meaningful"),
    ],
)
def test_constructor_validation(args: tuple, message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        RateLimiter(*args)


def test_counts_must_be_positive_ints() -> None:
    limiter = RateLimiter(1, 1.0, 1.0)
    for method in (limiter.can_insert, limiter.can_sample, limiter.on_insert, limiter.on_sample):
        with pytest.raises(ReplayError, match="n must be"):
            method(0)
        with pytest.raises(ReplayError, match="n must be"):
            method(1.0)  # type: ignore[arg-type]
    assert (limiter.inserts, limiter.samples) == (0, 0)


def test_check_batch_sizes() -> None:
    limiter = RateLimiter(100, samples_per_insert=1.0, error_buffer=2.0)
    limiter.check_batch_sizes(insert_batch=1000, sample_batch=4)  # 2 * 2 >= 4
    with pytest.raises(ReplayError, match="sample_batch=5"):
        limiter.check_batch_sizes(insert_batch=1, sample_batch=5)
    with pytest.raises(ReplayError, match="insert_batch"):
        limiter.check_batch_sizes(insert_batch=0, sample_batch=1)
    RateLimiter(5).check_batch_sizes(insert_batch=7, sample_batch=10_000)


def _run_until_deadlock(limiter: RateLimiter, k: int, b: int, steps: int, seed: int) -> bool:
    """Randomly interleave an inserter (batches of k) and a sampler (batches of b).

    Returns True iff a state is reached where neither may proceed.
    """
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        can_insert, can_sample = limiter.can_insert(k), limiter.can_sample(b)
        if not (can_insert or can_sample):
            return True
        if can_insert and (not can_sample or rng.random() < 0.5):
            limiter.on_insert(k)
        else:
            limiter.on_sample(b)
    return False


@pytest.mark.parametrize(
    ("min_size", "spi", "buffer", "k", "b"),
    [
        (10, 1.0, 2.0, 1, 4),
        (10, 0.7, 2.5, 3, 5),
        (50, 8.0, 32.0, 16, 64),
        (3, 0.1, 1.0, 64, 2),
        (7, math.pi, 4.0, 5, 8),
    ],
)
def test_accepted_batch_sizes_never_deadlock(
    min_size: int, spi: float, buffer: float, k: int, b: int
) -> None:
    limiter = RateLimiter(min_size, spi, buffer)
    limiter.check_batch_sizes(k, b)
    for seed in range(5):
        limiter = RateLimiter(min_size, spi, buffer)
        assert not _run_until_deadlock(limiter, k, b, 3000, seed)
        assert limiter.min_diff <= limiter.diff <= limiter.max_diff + k * spi


def test_rejected_batch_sizes_can_deadlock() -> None:
    # 2 * error_buffer = 2 < 4: diff tops out at 3, a sample of 4 needs diff >= 4.
    with pytest.raises(ReplayError):
        RateLimiter(10, 1.0, 1.0).check_batch_sizes(1, 4)
    assert _run_until_deadlock(RateLimiter(10, 1.0, 1.0), 1, 4, 3000, 0)
