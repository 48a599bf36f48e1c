"""Tests of easyrl.algorithms.nstep.NStepAccumulator against a brute-force reference."""

import numpy as np
import pytest

from easyrl.algorithms.nstep import PRIORITY, NStepAccumulator
from easyrl.errors import ConfigError, EasyRLError

GAMMA = 0.9


def _make_streams(rng, num_envs, steps):
    """Random per-env step streams; obs encode (env, t, kind) so every row is identifiable.

    kind of obs: 0 = mid-episode, 2 = first obs after a reset. kind of next_obs: 0 = ordinary,
    1 = final observation of a done episode.
    """
    streams = []
    for e in range(num_envs):
        # Termination / truncation points, including episodes of length 1 (done on
        # consecutive steps) and episodes shorter than n.
        u = rng.random(steps)
        terminated = u < 0.15
        truncated = (u >= 0.15) & (u < 0.3)
        terminated[3:5] = True  # done on two consecutive steps
        truncated[3:5] = False
        truncated[9] = True
        truncated[10] = True
        terminated[9:11] = False
        rows = []
        prev_done = True
        for t in range(steps):
            done = bool(terminated[t] or truncated[t])
            rows.append(
                {
                    "obs": (e, t, 2 if prev_done else 0),
                    "action": int(rng.integers(0, 1000)),
                    "reward": float(rng.normal()),
                    "next_obs": (e, t + 1, 1 if done else 0),
                    "terminated": bool(terminated[t]),
                    "truncated": bool(truncated[t] and not terminated[t]),
                    "value": float(rng.normal()),  # Q(s_t, a_t) of the acting pass
                    "next_value": float(rng.normal()),  # V(s_{t+1})
                }
            )
            prev_done = done
        streams.append(rows)
    return streams


def _reference(streams, n, gamma):
    """Brute force from the definition: split into episodes, then m = min(n, steps left)."""
    out = []
    for rows in streams:
        steps = len(rows)
        episodes, start = [], 0
        for t, row in enumerate(rows):
            if row["terminated"] or row["truncated"]:
                episodes.append((start, t + 1, True))
                start = t + 1
        if start < steps:
            episodes.append((start, steps, False))  # still running at the end of the stream
        for begin, end, ended in episodes:
            for t in range(begin, end):
                if ended:
                    m = min(n, end - t)
                elif t + n <= end:
                    m = n
                else:
                    continue  # still pending in the accumulator
                reward = sum(gamma**k * rows[t + k]["reward"] for k in range(m))
                last = rows[t + m - 1]
                discount = 0.0 if last["terminated"] else gamma**m
                boot = 0.0 if last["terminated"] else last["next_value"]
                priority = abs(reward + discount * boot - rows[t]["value"])
                out.append(
                    (
                        rows[t]["obs"],
                        rows[t]["action"],
                        reward,
                        last["next_obs"],
                        discount,
                        priority,
                    )
                )
    return out


def _run(streams, n, gamma, valued=False):
    num_envs, steps = len(streams), len(streams[0])
    acc = NStepAccumulator(num_envs, n, gamma, (3,), np.int64)
    got = []
    for t in range(steps):
        col = {k: np.array([streams[e][t][k] for e in range(num_envs)]) for k in streams[0][t]}
        result = acc.add(
            col["obs"],
            col["action"],
            col["reward"],
            col["next_obs"],
            col["terminated"],
            col["truncated"],
            *((col["value"], col["next_value"]) if valued else ()),
        )
        if result is None:
            continue
        m = len(result["reward"])
        assert result["obs"].shape == (m, 3) and result["obs"].dtype == np.int64
        assert result["next_obs"].shape == (m, 3) and result["next_obs"].dtype == np.int64
        assert result["action"].shape == (m,) and result["action"].dtype == np.int64
        assert result["reward"].dtype == np.float32 and result["discount"].dtype == np.float32
        for i in range(m):
            got.append(
                (
                    tuple(int(x) for x in result["obs"][i]),
                    int(result["action"][i]),
                    float(result["reward"][i]),
                    tuple(int(x) for x in result["next_obs"][i]),
                    float(result["discount"][i]),
                    float(result[PRIORITY][i]) if valued else None,
                )
            )
    return got, acc


@pytest.mark.parametrize("valued", [False, True])
@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_brute_force(n, seed, valued):
    rng = np.random.default_rng(seed)
    streams = _make_streams(rng, num_envs=3, steps=60)
    got, acc = _run(streams, n, GAMMA, valued)
    want = _reference(streams, n, GAMMA)

    def key(tr):
        return tr[0][:2]  # (env, t)

    got.sort(key=key)
    want.sort(key=key)
    assert [key(tr) for tr in got] == [key(tr) for tr in want]
    for g, w in zip(got, want):
        assert g[0] == w[0] and g[1] == w[1] and g[3] == w[3]
        assert g[2] == pytest.approx(w[2], rel=1e-5, abs=1e-5)
        assert g[4] == pytest.approx(w[4], rel=1e-6, abs=1e-7)
        if valued:  # the Ape-X initial priority |R + discount * V - Q|
            assert g[5] == pytest.approx(w[5], rel=1e-5, abs=1e-5)
    # What is left pending is exactly the tail of each still-running episode.
    emitted = {key(tr) for tr in got}
    for e, rows in enumerate(streams):
        left = sum((e, t) not in emitted for t in range(len(rows)))
        assert acc.pending[e] == left < n


def test_hand_computed_example():
    acc = NStepAccumulator(1, 2, 0.5, (1,), np.float32)
    s = [np.array([[float(i)]]) for i in range(10)]
    f2, f4 = np.array([[102.0]]), np.array([[104.0]])
    no, yes = np.array([False]), np.array([True])
    a = [np.array([i]) for i in range(5)]

    assert acc.add(s[0], a[0], [1.0], s[1], no, no) is None
    out = acc.add(s[1], a[1], [2.0], s[2], no, no)
    np.testing.assert_array_equal(out["obs"], [[0.0]])
    np.testing.assert_array_equal(out["action"], [0])
    np.testing.assert_allclose(out["reward"], [1.0 + 0.5 * 2.0])
    np.testing.assert_array_equal(out["next_obs"], [[2.0]])
    np.testing.assert_allclose(out["discount"], [0.25])

    # Termination at step 2: flush t=1 (m=2) and t=2 (m=1), discount 0, next = final obs.
    out = acc.add(s[2], a[2], [4.0], f2, yes, no)
    np.testing.assert_array_equal(out["obs"], [[1.0], [2.0]])
    np.testing.assert_array_equal(out["action"], [1, 2])
    np.testing.assert_allclose(out["reward"], [2.0 + 0.5 * 4.0, 4.0])
    np.testing.assert_array_equal(out["next_obs"], [[102.0], [102.0]])
    np.testing.assert_array_equal(out["discount"], [0.0, 0.0])
    assert acc.pending[0] == 0

    # Truncation at step 4: flush t=3 (m=2) and t=4 (m=1), bootstrapping from the final obs.
    assert acc.add(s[3], a[3], [8.0], s[4], no, no) is None
    out = acc.add(s[4], a[4], [16.0], f4, no, yes)
    np.testing.assert_array_equal(out["obs"], [[3.0], [4.0]])
    np.testing.assert_allclose(out["reward"], [8.0 + 0.5 * 16.0, 16.0])
    np.testing.assert_array_equal(out["next_obs"], [[104.0], [104.0]])
    np.testing.assert_allclose(out["discount"], [0.25, 0.5])
    assert out["obs"].dtype == np.float32 and out["discount"].dtype == np.float32


def test_order_and_reset():
    acc = NStepAccumulator(3, 2, 0.5, (), np.int64, action_shape=(2,), action_dtype=np.float32)
    no3 = np.zeros(3, bool)
    act = np.ones((3, 2))
    assert acc.add([0, 10, 20], act, [1, 1, 1], [1, 11, 21], no3, no3) is None
    out = acc.add([1, 11, 21], act, [1, 1, 1], [2, 12, 22], [True, False, False], no3)
    # Not-done envs first (ascending), then the done env's entries oldest first.
    np.testing.assert_array_equal(out["obs"], [10, 20, 0, 1])
    assert out["action"].shape == (4, 2) and out["action"].dtype == np.float32
    np.testing.assert_array_equal(acc.pending, [0, 1, 1])
    acc.reset()
    np.testing.assert_array_equal(acc.pending, [0, 0, 0])
    assert acc.add([2, 12, 22], act, [1, 1, 1], [3, 13, 23], no3, no3) is None


def test_argument_checks():
    with pytest.raises(ConfigError):
        NStepAccumulator(0, 3, 0.9, (4,), np.float32)
    with pytest.raises(ConfigError):
        NStepAccumulator(2, 0, 0.9, (4,), np.float32)
    with pytest.raises(ConfigError):
        NStepAccumulator(2, 3, 1.5, (4,), np.float32)
    with pytest.raises(ConfigError):
        NStepAccumulator(2, 3, 0.9, 4, np.float32)
    with pytest.raises(ConfigError):
        NStepAccumulator(2, 3, 0.9, (4,), "not-a-dtype")
    acc = NStepAccumulator(2, 3, 0.9, (4,), np.float32)
    with pytest.raises(EasyRLError):
        acc.add(np.zeros((3, 4)), [0, 0], [0, 0], np.zeros((2, 4)), [0, 0], [0, 0])
