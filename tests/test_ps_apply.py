"""Loopback tests of a PS shard's apply thread (easyrl.roles.ps): pushes acknowledged once
queued, applied in arrival order, with staleness, finiteness and back-pressure honest.

A test holds the apply thread back by holding the shard's state lock (the thread takes it
to apply each push): pushes are then accepted and answered, and none is applied, until the
test lets go.
"""

import contextlib
import json
import threading
import time

import grpc
import numpy as np
import pytest
from test_ps import (
    ADAM,
    adam_reference,
    assert_code,
    assert_values_equal,
    assign,
    gradients,
    initial_values,
    pull,
    state,
    status,
)

from easyrl.errors import TransportError
from easyrl.roles.push_queue import QUEUE_PUSHES, PushQueue, QueuedPush
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb


def queued_push(client, grads, version, values=False) -> pb.PushResponse:
    """A push answered once the shard accepted it (`queue`)."""
    request = pb.PushRequest(
        version=version, gradients=codec.encode_named(grads), queue=True, return_values=values
    )
    return client.call("Push", request)


@contextlib.contextmanager
def apply_thread_held(ps):
    """Keeps the shard's apply thread from applying anything while the block runs."""
    with ps._lock:
        yield


def wait_for_version(ps, version: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ps.version < version:
        assert time.monotonic() < deadline, f"the shard stayed at version {ps.version}"
        time.sleep(0.01)


def test_queued_pushes_are_answered_before_and_applied_after_in_arrival_order(serve_ps):
    ps, client = serve_ps(optimizer=ADAM)
    assign(client, initial_values())
    steps = [gradients(1.0), gradients(-3.0), gradients(0.5), gradients(2.0)]
    with apply_thread_held(ps):
        replies = [queued_push(client, grads, version=1) for grads in steps]
        assert ps.version == 1  # all answered, none applied
    for i, reply in enumerate(replies):
        assert reply.queued and not reply.applied and reply.reason == ""
        assert reply.version == 1  # the newest applied version when it was answered
        assert reply.staleness == i  # the pushes accepted before it are applied first
    wait_for_version(ps, 1 + len(steps))
    # Adam does not commute: only the arrival order gives these values.
    _, values = pull(client)
    for name, start in initial_values().items():
        expected = adam_reference(start, [g[name] for g in steps], ADAM)
        np.testing.assert_allclose(values[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)
    counters = status(client).counters
    assert counters["ps/0/pushes"] == counters["ps/0/applied"] == len(steps)
    assert counters["ps/0/staleness_sum"] == 0 + 1 + 2 + 3
    assert counters["ps/0/queued"] == 0


def test_queued_pushes_count_toward_staleness(serve_ps):
    """A push computed against version 1 behind two accepted ones is applied to version 3's
    values: staleness 2, though the shard still serves version 1 when it answers."""
    ps, client = serve_ps(max_staleness=2)
    assign(client, initial_values())
    with apply_thread_held(ps):
        assert [queued_push(client, gradients(), 1).staleness for _ in range(3)] == [0, 1, 2]
        reply = queued_push(client, gradients(100.0), version=1)
        assert reply.reason == "stale" and reply.staleness == 3 and not reply.queued
        assert reply.version == 1
    wait_for_version(ps, 4)
    version, counters, values = state(client)
    assert version == 4  # the stale push was never applied
    expected = {k: v - np.float32(0.1) * 3 * gradients()[k] for k, v in initial_values().items()}
    for name, value in expected.items():
        np.testing.assert_allclose(values[name], value, rtol=1e-6, err_msg=name)
    assert counters["ps/0/dropped_stale"] == 1 and counters["ps/0/applied"] == 3
    assert counters["ps/0/pushes"] == 4 and counters["ps/0/staleness_sum"] == 3


def test_a_nonfinite_queued_push_is_never_applied_and_counted(serve_ps):
    ps, client = serve_ps()
    assign(client, initial_values())
    bad = gradients()
    bad["q/head/w"][2, 0] = np.nan
    with apply_thread_held(ps):
        assert queued_push(client, gradients(), 1).queued
        reply = queued_push(client, bad, 1)
        assert reply.reason == "non-finite" and not reply.queued and reply.staleness == 1
        assert queued_push(client, gradients(), 1).staleness == 1  # the dropped one is skipped
    wait_for_version(ps, 3)
    version, counters, values = state(client)
    assert version == 3 and counters["ps/0/dropped_nonfinite"] == 1
    assert counters["ps/0/applied"] == 2 and counters["ps/0/pushes"] == 3
    assert all(np.all(np.isfinite(v)) for v in values.values())


def test_a_malformed_queued_push_is_invalid_and_changes_nothing(serve_ps):
    ps, client = serve_ps()
    assign(client, initial_values())
    queued_push(client, gradients(), 1)
    wait_for_version(ps, 2)
    before = state(client)
    wrong = {**gradients(), "q/head/w": np.zeros((1, 3), np.float32)}
    for grads, version in ((wrong, 2), (gradients(), 0)):
        request = pb.PushRequest(version=version, gradients=codec.encode_named(grads), queue=True)
        assert_code(grpc.StatusCode.INVALID_ARGUMENT, "Push", client, request)
    after = state(client)
    assert after[:2] == before[:2]
    assert_values_equal(after[2], before[2])


def test_a_full_queue_holds_the_pusher_back_until_a_push_is_applied(serve_ps):
    ps, client = serve_ps(max_staleness=100)
    assign(client, initial_values())
    late = {}
    with apply_thread_held(ps):
        for _ in range(QUEUE_PUSHES):
            assert queued_push(client, gradients(), 1).queued
        pusher = threading.Thread(target=lambda: late.update(r=queued_push(client, gradients(), 1)))
        pusher.start()
        pusher.join(0.5)
        assert pusher.is_alive() and len(ps._queue) == QUEUE_PUSHES  # waits for room
    pusher.join(10)
    assert late["r"].queued and late["r"].staleness == QUEUE_PUSHES
    wait_for_version(ps, 2 + QUEUE_PUSHES)


def test_a_queue_holds_one_push_of_any_size_and_bounds_bytes():
    queue = PushQueue(pushes=4, max_bytes=100)
    with queue.changed:
        assert queue.wait_for_room(400, 0.0)  # empty: one push always fits
        queue.put(QueuedPush({"": np.zeros(25, np.float32)}, staleness=0))  # 100 bytes
        assert not queue.wait_for_room(4, 0.05)  # would pass max_bytes
    with pytest.raises(ValueError):
        PushQueue(pushes=0)


def test_a_waiting_push_is_answered_once_applied_with_values_that_include_it(serve_ps):
    """What a synchronous round's learner or an A3C actor does (`wait`)."""
    ps, client = serve_ps()
    assign(client, initial_values())
    with apply_thread_held(ps):
        assert queued_push(client, gradients(), 1).queued
    request = pb.PushRequest(version=1, gradients=codec.encode_named(gradients()))
    request.return_values = True
    reply = client.call("Push", request)
    assert reply.applied and not reply.queued and reply.version == 3 and reply.staleness == 1
    expected = {k: v - np.float32(0.2) * gradients()[k] for k, v in initial_values().items()}
    for name, value in codec.decode_named(reply.tensors, reply.body).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, err_msg=name)


def test_a_queued_push_returns_the_newest_applied_values_unless_the_pusher_has_them(serve_ps):
    ps, client = serve_ps()
    assign(client, initial_values())
    reply = queued_push(client, gradients(), 1, values=True)
    assert reply.queued and reply.version == 1 and not reply.tensors  # it holds version 1
    wait_for_version(ps, 2)
    reply = queued_push(client, gradients(), 1, values=True)
    assert reply.queued and reply.version >= 2
    _, now = pull(client, known_version=-1)
    if reply.version == ps.version:
        assert_values_equal(codec.decode_named(reply.tensors, reply.body), now)


def test_assign_comes_after_the_pushes_accepted_before_it(serve_ps):
    ps, client = serve_ps()
    assign(client, initial_values())
    new = {k: v + 10 for k, v in initial_values().items()}
    with apply_thread_held(ps):
        queued_push(client, gradients(), 1)
        queued_push(client, gradients(), 1)
        assigner = threading.Thread(target=assign, args=(client, new, False))
        assigner.start()
        time.sleep(0.2)
    assigner.join(10)
    version, counters, values = state(client)
    assert version == 4 and counters["ps/0/applied"] == 2
    assert_values_equal(values, new)  # not overwritten by the pushes
    assert queued_push(client, gradients(), 4).staleness == 0  # counted from the Assign


def test_checkpoints_taken_while_pushes_stream_in_are_consistent(serve_ps, tmp_path):
    """A checkpoint waits until every accepted push is applied and holds new ones back, so
    its version, values and counters agree; a shard restored from it goes on exactly."""
    path = tmp_path / "ps-0.npz"
    ps, client = serve_ps(optimizer=ADAM, checkpoint_path=path, max_staleness=1000)
    assign(client, initial_values())
    stop = threading.Event()

    def push_on():
        version = 1
        while not stop.is_set():
            version = max(1, queued_push(client, gradients(0.1), version).version)

    pusher = threading.Thread(target=push_on)
    pusher.start()
    try:
        for _ in range(5):
            time.sleep(0.05)
            ps.checkpoint()
            with np.load(path) as data:
                meta = json.loads(data["meta"].tobytes())
            counters = meta["counters"]
            assert meta["version"] == 1 + counters["applied"]
            dropped = sum(v for k, v in counters.items() if k.startswith("dropped"))
            assert counters["pushes"] == counters["applied"] + dropped
    finally:
        stop.set()
        pusher.join(10)
    ps.close()  # applies what it accepted
    assert ps.counters["pushes"] == ps.counters["applied"] > 0
    ps.checkpoint()
    restored, client2 = serve_ps(optimizer=ADAM, checkpoint_path=path)
    version, counters, values = state(client2)
    assert version == ps.version == 1 + counters["ps/0/applied"]
    assert counters["ps/0/pushes"] == ps.counters["pushes"]
    assert_values_equal(values, pull(client)[1])
    for key, value in ps._optimizer.state().items():
        np.testing.assert_array_equal(restored._optimizer.state()[key], value, err_msg=key)


def test_close_applies_what_was_accepted_and_refuses_later_pushes(serve_ps):
    ps, client = serve_ps()
    assign(client, initial_values())
    with apply_thread_held(ps):
        for _ in range(3):
            queued_push(client, gradients(), 1)
        closer = threading.Thread(target=ps.close)
        closer.start()
        time.sleep(0.1)
    closer.join(10)
    assert ps.version == 4 and not ps.applying()
    request = pb.PushRequest(version=4, gradients=codec.encode_named(gradients()), queue=True)
    with pytest.raises(TransportError) as info:
        client.call("Push", request, retry_s=0)  # UNAVAILABLE would be retried
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and "stopping" in str(info.value)
    assert status(client).counters["ps/0/pushes"] == 3
