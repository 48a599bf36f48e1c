"""Loopback tests of the parameter-server shard servicer (easyrl.roles.ps) over real gRPC."""

import json
import time

import grpc
import numpy as np
import pytest
from conftest import PS_TOKEN as TOKEN
from test_memory_server import abandon_calls

from easyrl.algorithms.optimizers import OptimizerSpec
from easyrl.errors import TransportError
from easyrl.metrics import RunStats, Stop, StopKind
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport.clients import ParameterClient, ShardClient

SGD = OptimizerSpec(kind="sgd", lr=0.1)
ADAM = OptimizerSpec(kind="adam", lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8)


def initial_values() -> dict[str, np.ndarray]:
    """Variables of one shard; names carry "/" like Keras variable paths."""
    return {
        "q/torso/0/w": np.arange(6, dtype=np.float32).reshape(2, 3) / 10,
        "q/torso/0/b": np.array([0.5, -0.5, 1.5], dtype=np.float32),
        "q/head/w": np.array([[1.0], [-2.0], [3.0]], dtype=np.float32),
    }


def gradients(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "q/torso/0/w": np.array([[1.0, -2.0, 0.5], [0.25, 0.0, -1.0]], np.float32) * scale,
        "q/torso/0/b": np.array([0.1, 0.2, -0.3], np.float32) * scale,
        "q/head/w": np.array([[3.0], [-0.5], [0.0]], np.float32) * scale,
    }


def assign(client, values, only_if_empty=True) -> pb.AssignResponse:
    request = pb.AssignRequest(tensors=codec.encode_named(values), only_if_empty=only_if_empty)
    return client.call("Assign", request)


def push(client, grads, version) -> pb.PushResponse:
    request = pb.PushRequest(version=version, gradients=codec.encode_named(grads), learner=0)
    return client.call("Push", request)


def pull(client, known_version=-1) -> tuple[pb.PullResponse, dict[str, np.ndarray]]:
    reply = client.call("Pull", pb.PullRequest(known_version=known_version))
    return reply, codec.decode_named(reply.tensors, reply.body)


def status(client) -> pb.StatusResponse:
    return client.call("Status", pb.StatusRequest())


def state(client) -> tuple[int, dict[str, float], dict[str, np.ndarray]]:
    """Version, counters (without the pull counter, which Pull moves) and values."""
    reply = status(client)
    counters = {k: v for k, v in reply.counters.items() if not k.endswith("/pulls")}
    _, values = pull(client)
    return reply.version, counters, values


def assert_values_equal(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def assert_code(code, method, client, request):
    with pytest.raises(TransportError) as info:
        client.call(method, request)
    assert info.value.code == code, info.value
    return info.value


def assert_invalid_and_unchanged(client, method, request):
    before = state(client)
    err = assert_code(grpc.StatusCode.INVALID_ARGUMENT, method, client, request)
    after = state(client)
    assert after[0] == before[0]
    assert after[1] == before[1]
    assert_values_equal(after[2], before[2])
    return err


# --- Assign / Pull ---------------------------------------------------------------------


def test_pull_empty_then_assign_then_pull(serve_ps):
    ps, client = serve_ps()
    reply, values = pull(client)
    assert reply.version == 0 and not reply.current and values == {}
    assert not status(client).initialized

    reply = assign(client, initial_values())
    assert reply.assigned and reply.version == 1
    assert status(client).initialized

    # A second chief initialization does nothing.
    reply = assign(client, {k: v + 1 for k, v in initial_values().items()})
    assert not reply.assigned and reply.version == 1

    reply, values = pull(client, known_version=-1)
    assert reply.version == 1 and not reply.current
    assert_values_equal(values, initial_values())

    reply, values = pull(client, known_version=1)
    assert reply.version == 1 and reply.current and values == {}

    # An older known version gets everything again.
    reply, values = pull(client, known_version=0)
    assert not reply.current
    assert_values_equal(values, initial_values())
    assert status(client).counters["ps/0/pulls"] == 4


def test_assign_overwrite_with_matching_names(serve_ps):
    _, client = serve_ps()
    assign(client, initial_values())
    new = {k: v * 2 for k, v in initial_values().items()}
    reply = assign(client, new, only_if_empty=False)
    assert reply.assigned and reply.version == 2
    reply, values = pull(client, known_version=1)
    assert reply.version == 2
    assert_values_equal(values, new)


def test_a_publishing_learners_values_and_optimizer_state_are_kept_and_served(serve_ps, tmp_path):
    """A learner that applies its own updates publishes values and optimizer state with
    Assign; the shard serves both to a Pull that asks (a restarted learner) and checkpoints
    them; a state that does not fit is refused whole."""
    path = tmp_path / "ps-0.npz"
    ps, client = serve_ps(optimizer=ADAM, checkpoint_path=path)
    ps_client = ParameterClient(client)
    assert ps_client.pull(optimizer_state=True).optimizer_state == {}  # no values yet
    ps_client.assign(initial_values(), only_if_empty=True)
    fresh = ps_client.pull(optimizer_state=True)
    assert int(fresh.optimizer_state["step"]) == 0
    published = {k: v + 1 for k, v in initial_values().items()}
    state = {k: np.full_like(v, 0.5) for k, v in fresh.optimizer_state.items()}
    state["step"] = np.array(7, np.int64)
    assert ps_client.assign(published, optimizer_state=state, updates=5) == 2
    assert ps.counters["applied"] == 5 and ps.counters["pushes"] == 0
    pulled = ps_client.pull(optimizer_state=True)
    assert pulled.version == 2
    assert_values_equal(pulled.values, published)
    assert sorted(pulled.optimizer_state) == sorted(state)
    for key, value in state.items():
        np.testing.assert_array_equal(pulled.optimizer_state[key], value, err_msg=key)
    assert ps_client.pull(known_version=2).values is None  # an actor's pull is unchanged

    broken = dict(state)
    broken["slot0/1"] = np.zeros(9, np.float32)
    body = codec.Body()
    request = pb.AssignRequest(
        tensors=body.named({k: v + 5 for k, v in published.items()}),
        optimizer_state=body.named(broken),
    )
    err = assert_invalid_and_unchanged(client, "Assign", body.frame(request))
    assert "slot0/1" in str(err)
    assert int(ps_client.pull(optimizer_state=True).optimizer_state["step"]) == 7

    negative = pb.AssignRequest(tensors=codec.encode_named(published), updates=-1)
    assert_invalid_and_unchanged(client, "Assign", negative)

    ps.checkpoint()
    _, client2 = serve_ps(optimizer=ADAM, checkpoint_path=path)
    again = ParameterClient(client2).pull(optimizer_state=True)
    assert again.version == 2
    for key, value in state.items():
        np.testing.assert_array_equal(again.optimizer_state[key], value, err_msg=key)


# --- Push ------------------------------------------------------------------------------


def test_push_sgd_exact(serve_ps):
    _, client = serve_ps(optimizer=SGD)
    assign(client, initial_values())
    reply = push(client, gradients(), version=1)
    assert reply.applied and reply.version == 2 and reply.staleness == 0 and reply.reason == ""
    expected = {k: v - np.float32(0.1) * gradients()[k] for k, v in initial_values().items()}
    _, values = pull(client)
    assert_values_equal(values, expected)  # float32 arithmetic, bit for bit

    # A push computed against version 1 after version 2 exists: applied, staleness 1.
    reply = push(client, gradients(0.5), version=1)
    assert reply.applied and reply.version == 3 and reply.staleness == 1
    counters = status(client).counters
    assert counters["ps/0/pushes"] == 2
    assert counters["ps/0/applied"] == 2
    assert counters["ps/0/staleness_sum"] == 1
    assert counters["ps/0/version"] == 3


def adam_reference(x, grads_seq, spec):
    """Adam exactly as documented by easyrl.algorithms.optimizers, in float64."""
    x = x.astype(np.float64)
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    for t, g in enumerate(grads_seq, start=1):
        g = g.astype(np.float64)
        m = spec.beta1 * m + (1 - spec.beta1) * g
        v = spec.beta2 * v + (1 - spec.beta2) * g * g
        scale = spec.lr * np.sqrt(1 - spec.beta2**t) / (1 - spec.beta1**t)
        x = x - scale * m / (np.sqrt(v) + spec.epsilon)
    return x


def test_push_adam_two_steps(serve_ps):
    _, client = serve_ps(optimizer=ADAM)
    assign(client, initial_values())
    steps = [gradients(1.0), gradients(-3.0)]
    for i, grads in enumerate(steps):
        reply = push(client, grads, version=1 + i)
        assert reply.applied and reply.version == 2 + i
    _, values = pull(client)
    for name, start in initial_values().items():
        expected = adam_reference(start, [g[name] for g in steps], ADAM)
        np.testing.assert_allclose(values[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)
    # The first Adam step moves every element with a non-zero gradient by about lr.
    w0 = initial_values()["q/torso/0/w"]
    g0 = gradients()["q/torso/0/w"]
    first = adam_reference(w0, [g0], ADAM)
    np.testing.assert_allclose(np.abs(first - w0)[g0 != 0], ADAM.lr, rtol=1e-4)


def test_stale_push_dropped_and_counted(serve_ps):
    _, client = serve_ps(max_staleness=1)
    assign(client, initial_values())
    assert push(client, gradients(), 1).version == 2
    assert push(client, gradients(), 2).version == 3
    before = state(client)
    reply = push(client, gradients(100.0), version=1)  # 2 versions behind
    assert not reply.applied and reply.reason == "stale"
    assert reply.staleness == 2 and reply.version == 3
    after = state(client)
    assert after[0] == 3
    assert_values_equal(after[2], before[2])
    assert after[1]["ps/0/dropped_stale"] == 1
    assert after[1]["ps/0/applied"] == 2
    assert after[1]["ps/0/pushes"] == 3
    # One version behind is still within max_staleness.
    reply = push(client, gradients(), version=2)
    assert reply.applied and reply.staleness == 1 and reply.version == 4


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_push_dropped_and_counted(serve_ps, bad):
    _, client = serve_ps()
    assign(client, initial_values())
    grads = gradients()
    grads["q/torso/0/b"][1] = bad
    reply = push(client, grads, version=1)
    assert not reply.applied and reply.reason == "non-finite" and reply.version == 1
    version, counters, values = state(client)
    assert version == 1
    assert_values_equal(values, initial_values())
    assert counters["ps/0/dropped_nonfinite"] == 1
    assert counters["ps/0/applied"] == 0


def test_huge_but_finite_push_is_applied(serve_ps):
    """The finiteness check's fast path (a sum of squares) overflows here; the gradient is
    still finite, so the shard applies it."""
    _, client = serve_ps()
    assign(client, initial_values())
    grads = gradients()
    grads["q/torso/0/b"][:] = 1e30
    reply = push(client, grads, version=1)
    assert reply.applied and reply.version == 2


def test_all_finite():
    from easyrl.roles.ps import all_finite

    x = np.ones(1000, np.float32)
    assert all_finite(x) and all_finite(x[:0])
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[500] = bad
        assert not all_finite(y)
    y = x.copy()
    y[7] = 3e38  # finite, and its square overflows
    assert all_finite(y)
    y[8] = np.nan
    assert not all_finite(y)


def _renamed(grads):
    grads = dict(grads)
    grads["q/torso/0/W"] = grads.pop("q/torso/0/w")
    return grads


def _missing(grads):
    grads = dict(grads)
    del grads["q/head/w"]
    return grads


def _extra(grads):
    return {**grads, "q/head/b": np.zeros(1, np.float32)}


def _wrong_shape(grads):
    return {**grads, "q/head/w": np.zeros((1, 3), np.float32)}


def _wrong_dtype(grads):
    return {**grads, "q/torso/0/b": grads["q/torso/0/b"].astype(np.float64)}


def _int_dtype(grads):
    return {**grads, "q/torso/0/b": np.zeros(3, np.int32)}


def test_push_bad_gradients_invalid_argument(serve_ps):
    _, client = serve_ps()
    assign(client, initial_values())
    push(client, gradients(), 1)
    for mutate in (_renamed, _missing, _extra, _wrong_shape, _wrong_dtype, _int_dtype):
        request = pb.PushRequest(version=2, gradients=codec.encode_named(mutate(gradients())))
        assert_invalid_and_unchanged(client, "Push", request)


def test_push_duplicate_and_corrupt_tensors_invalid_argument(serve_ps):
    _, client = serve_ps()
    assign(client, initial_values())
    tensors = codec.encode_named(gradients())
    duplicate = pb.PushRequest(version=1, gradients=[*tensors, tensors[0]])
    assert_invalid_and_unchanged(client, "Push", duplicate)
    corrupt = pb.PushRequest(version=1, gradients=tensors)
    corrupt.gradients[0].data = corrupt.gradients[0].data[:-4]
    assert_invalid_and_unchanged(client, "Push", corrupt)


def test_push_bad_version_invalid_argument(serve_ps):
    _, client = serve_ps()
    assign(client, initial_values())
    push(client, gradients(), 1)  # current version is 2
    for version in (0, -1):
        request = pb.PushRequest(version=version, gradients=codec.encode_named(gradients()))
        err = assert_invalid_and_unchanged(client, "Push", request)
        assert "version" in str(err)


def test_push_ahead_of_a_restored_shard_is_dropped_and_counted(serve_ps):
    # A shard restarted from an older checkpoint gets pushes computed against versions it
    # never had: not applied, counted, answered with the shard's version to pull.
    ps, client = serve_ps()
    assign(client, initial_values())
    push(client, gradients(), 1)  # current version is 2
    before = status(client)
    _, values_before = pull(client)
    for version in (3, 100):
        reply = push(client, gradients(), version)
        assert not reply.applied and reply.reason == "ahead" and reply.version == 2
    after = status(client)
    assert after.version == 2
    assert after.counters["ps/0/dropped_ahead"] == 2
    assert after.counters["ps/0/applied"] == before.counters["ps/0/applied"]
    _, values_after = pull(client)
    for name, value in values_before.items():
        np.testing.assert_array_equal(values_after[name], value)


def test_push_before_assign_invalid_argument(serve_ps):
    ps, client = serve_ps()
    request = pb.PushRequest(version=1, gradients=codec.encode_named(gradients()))
    err = assert_code(grpc.StatusCode.INVALID_ARGUMENT, "Push", client, request)
    assert "not initialized" in str(err)
    reply = status(client)
    assert reply.version == 0 and not reply.initialized
    assert reply.counters["ps/0/pushes"] == 0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_assign_nonfinite_invalid_argument(serve_ps, bad):
    _, client = serve_ps()
    values = initial_values()
    values["q/head/w"][2, 0] = bad
    request = pb.AssignRequest(tensors=codec.encode_named(values), only_if_empty=True)
    assert_code(grpc.StatusCode.INVALID_ARGUMENT, "Assign", client, request)
    reply = status(client)
    assert reply.version == 0 and not reply.initialized
    # ... and on an initialized shard, nothing changes either.
    assign(client, initial_values())
    request = pb.AssignRequest(tensors=codec.encode_named(values), only_if_empty=False)
    assert_invalid_and_unchanged(client, "Assign", request)


def test_assign_non_float_or_empty_invalid_argument(serve_ps):
    _, client = serve_ps()
    ints = {"q/step": np.zeros(3, np.int64)}
    for values in (ints, {}):
        request = pb.AssignRequest(tensors=codec.encode_named(values), only_if_empty=True)
        assert_code(grpc.StatusCode.INVALID_ARGUMENT, "Assign", client, request)
    assert not status(client).initialized


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_assign_other_float_dtype_never_leaves_shard_unpushable(serve_ps, dtype):
    """The shard's optimizer updates float32 variables only: a float64/float16 variable
    must be refused at Assign (INVALID_ARGUMENT) rather than accepted and then failing
    every Push with an internal error."""
    _, client = serve_ps()
    values = {k: v.astype(dtype) for k, v in initial_values().items()}
    request = pb.AssignRequest(tensors=codec.encode_named(values), only_if_empty=True)
    try:
        reply = client.call("Assign", request)
    except TransportError as err:
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert not status(client).initialized
        return
    assert reply.assigned
    grads = {k: v.astype(dtype) for k, v in gradients().items()}
    assert push(client, grads, version=1).applied


def test_assign_mismatched_names_to_initialized_shard(serve_ps):
    _, client = serve_ps()
    assign(client, initial_values())
    push(client, gradients(), 1)
    for mutate in (_renamed, _missing, _extra, _wrong_shape, _wrong_dtype):
        values = mutate(initial_values())
        request = pb.AssignRequest(tensors=codec.encode_named(values), only_if_empty=False)
        assert_invalid_and_unchanged(client, "Assign", request)


def test_unauthenticated_without_token(serve_ps):
    ps, client = serve_ps(token=None)
    _, wrong = serve_ps(token="not-the-token")
    requests = {
        "Pull": pb.PullRequest(known_version=-1),
        "Push": pb.PushRequest(version=1, gradients=codec.encode_named(gradients())),
        "Assign": pb.AssignRequest(tensors=codec.encode_named(initial_values())),
        "Report": pb.ReportRequest(role="actor", env_steps=1),
        "PublishRound": pb.PublishRoundRequest(round=1),
        "Status": pb.StatusRequest(),
        "Shutdown": pb.ShutdownRequest(),
    }
    for method, request in requests.items():
        for c in (client, wrong):
            assert_code(grpc.StatusCode.UNAUTHENTICATED, method, c, request)
    assert ps.version == 0 and ps.round == 0
    assert not ps.stopping.is_set() and not ps.shutdown_requested.is_set()


# --- Report / Status -------------------------------------------------------------------


def report(client, **fields) -> pb.ReportResponse:
    return client.call("Report", pb.ReportRequest(**fields))


def test_report_and_status_on_shard0(serve_ps):
    _, client = serve_ps(stats=RunStats(window=3))
    assert not report(client, role="actor", task=0, env_steps=100).stopping
    report(
        client,
        role="actor",
        task=1,
        env_steps=50,
        episode_returns=[1.0, 2.0],
        episode_lengths=[10, 20],
    )
    report(client, role="learner", task=0, updates=7, stats={"loss": 0.25})
    report(
        client,
        role="actor",
        task=0,
        env_steps=25,
        episode_returns=[3.0, 10.0],
        episode_lengths=[30, 40],
    )
    reply = status(client)
    c = reply.counters
    assert reply.role == "ps" and reply.task == 0 and not reply.stopping
    assert c["env_steps"] == 175
    assert c["updates"] == 7
    assert c["episodes"] == 4
    assert c["actor/0/env_steps"] == 125 and c["actor/0/episodes"] == 2
    assert c["actor/1/env_steps"] == 50 and c["actor/1/episodes"] == 2
    assert c["learner/0/updates"] == 7
    assert c["learner/loss"] == 0.25
    assert c["recent_episodes"] == 3
    assert c["return_mean"] == pytest.approx((2.0 + 3.0 + 10.0) / 3)
    assert c["return_max"] == 10.0
    assert list(reply.recent_returns) == [2.0, 3.0, 10.0]
    assert "ps/0/version" in c


@pytest.mark.parametrize(
    "fields",
    [
        {"env_steps": -1},
        {"updates": -5},
        {"episode_returns": [1.0, 2.0], "episode_lengths": [3]},
        {"episode_returns": [1.0], "episode_lengths": [3, 4]},
        {"episode_returns": [float("nan")], "episode_lengths": [3]},
        {"episode_returns": [float("inf")]},
        {"stats": {"loss": float("nan")}},
        {"stats": {"loss": float("-inf")}},
        {"stats": {f"k{i}": 1.0 for i in range(5_000)}},  # bloats every Status and metrics line
        {"stats": {"0/updates": 1e9}},  # task 0's counter, reported by task 1
        {"stats": {"/updates": 1.0}},
        {"stats": {"x" * 65: 1.0}},
        {"stats": {"a b": 1.0}},
    ],
)
def test_report_invalid_argument_unchanged(serve_ps, fields):
    _, client = serve_ps(stats=RunStats(window=3))
    report(client, role="actor", task=0, env_steps=10, episode_returns=[5.0], episode_lengths=[2])
    before = status(client)
    with pytest.raises(TransportError) as info:
        client.call("Report", pb.ReportRequest(role="actor", task=1, **fields))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    after = status(client)
    assert dict(after.counters) == dict(before.counters)
    assert list(after.recent_returns) == [5.0]


def test_stats_never_hide_counters_and_clients_leave_out_non_finite_ones(serve_ps):
    _, client = serve_ps(stats=RunStats(window=3))
    report(client, role="actor", task=1, env_steps=10, stats={"1/env_steps": 1e9, "1/x": 2.0})
    c = status(client).counters
    assert c["actor/1/env_steps"] == 10 and c["actor/1/x"] == 2.0
    ParameterClient(client).report("learner", 0, updates=1, stats={"loss": float("nan"), "e": 0.5})
    c = status(client).counters
    assert "learner/loss" not in c and c["learner/e"] == 0.5 and c["updates"] == 1


def test_metrics_lines_are_strict_json(tmp_path):
    from easyrl.metrics import MetricsWriter

    MetricsWriter(tmp_path).write({"env_steps": 1.0, "odd": float("nan")}, 1.0, None)
    line = (tmp_path / "metrics.jsonl").read_text()

    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    assert json.loads(line, parse_constant=refuse)["odd"] is None


def test_report_to_other_shard_invalid_and_no_return_counters(serve_ps):
    _, client = serve_ps(shard=1, stats=None)
    assign(client, initial_values())
    before = status(client)
    with pytest.raises(TransportError) as info:
        report(client, role="actor", task=0, env_steps=10, episode_returns=[1.0])
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    after = status(client)
    assert dict(after.counters) == dict(before.counters)
    assert after.task == 1 and after.version == 1
    assert list(after.recent_returns) == []
    assert set(after.counters) == {
        f"ps/1/{k}"
        for k in (
            "pushes",
            "applied",
            "dropped_stale",
            "dropped_nonfinite",
            "pulls",
            "staleness_sum",
            "dropped_ahead",
            "version",
            "round",
            "queued",
            "shm_requests",
            "shm_replies",
            "shm_refused",
        )
    }
    assert not any("return" in k or "env_steps" in k for k in after.counters)


# --- checkpoint / shutdown -------------------------------------------------------------


def test_checkpoint_restore_round_trip(serve_ps, tmp_path):
    path = tmp_path / "checkpoints" / "ps-0.npz"
    ps, client = serve_ps(optimizer=ADAM, checkpoint_path=path, stats=RunStats(window=3))
    ps.checkpoint()  # nothing to save yet
    assert not path.exists()
    assign(client, initial_values())
    push(client, gradients(), 1)
    push(client, gradients(-2.0), 2)
    push(client, gradients(), 1)  # staleness 2, applied
    grads = gradients()
    grads["q/head/w"][0, 0] = np.nan
    push(client, grads, 4)  # dropped, counted
    report(client, role="actor", task=0, env_steps=30, episode_returns=[1.0, 4.0])
    ps.checkpoint()
    assert path.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == ["ps-0.npz"]
    ps.checkpoint()  # overwriting keeps a single, complete file
    assert sorted(p.name for p in path.parent.iterdir()) == ["ps-0.npz"]
    saved_version, saved_counters, saved_values = state(client)
    assert saved_version == 4

    restored, client2 = serve_ps(optimizer=ADAM, checkpoint_path=path, stats=RunStats(window=3))
    version, counters, values = state(client2)
    assert version == saved_version
    assert counters == saved_counters
    assert counters["ps/0/dropped_nonfinite"] == 1 and counters["env_steps"] == 30
    assert_values_equal(values, saved_values)
    assert list(status(client2).recent_returns) == [1.0, 4.0]
    for key, value in ps._optimizer.state().items():
        np.testing.assert_array_equal(restored._optimizer.state()[key], value, err_msg=key)

    # The optimizer slots came back: the same Adam push gives bit-identical results.
    for c in (client, client2):
        reply = push(c, gradients(0.7), version=4)
        assert reply.applied and reply.version == 5
    _, a = pull(client)
    _, b = pull(client2)
    assert_values_equal(a, b)
    fresh, client3 = serve_ps(optimizer=ADAM)  # without slots the step differs
    assign(client3, saved_values)
    push(client3, gradients(0.7), version=1)
    _, c = pull(client3)
    assert not np.array_equal(c["q/torso/0/w"], a["q/torso/0/w"])


def test_restored_shard_keeps_the_run_clock(serve_ps, tmp_path):
    path = tmp_path / "checkpoints" / "ps-0.npz"
    ps, client = serve_ps(checkpoint_path=path, stats=RunStats(window=3))
    assign(client, initial_values())
    time.sleep(0.3)
    ps.checkpoint()
    saved = ps.elapsed()
    restored, _ = serve_ps(checkpoint_path=path, stats=RunStats(window=3))
    # stop.max_seconds and metric times go on from the checkpoint, not from 0
    assert saved >= 0.3 and restored.elapsed() >= saved
    fresh, _ = serve_ps(stats=RunStats(window=3))
    assert fresh.elapsed() < 0.3 <= restored.elapsed()


def test_the_run_clock_stops_when_the_run_stops(serve_ps, tmp_path):
    path = tmp_path / "checkpoints" / "ps-0.npz"
    ps, client = serve_ps(checkpoint_path=path, stats=RunStats(window=3))
    assign(client, initial_values())
    ps.stop_clock()  # a stop condition (or Shutdown) was reached
    stopped = ps.elapsed()
    time.sleep(0.3)  # winding down: roles exit, the final checkpoint is written
    ps.checkpoint()
    assert ps.elapsed() == stopped
    restored, _ = serve_ps(checkpoint_path=path, stats=RunStats(window=3))
    assert stopped <= restored.elapsed() < stopped + 0.25  # resumed from the stop, not later


def test_checkpoint_without_path_is_noop(serve_ps, tmp_path):
    ps, client = serve_ps()
    assign(client, initial_values())
    ps.checkpoint()
    assert list(tmp_path.iterdir()) == []


def test_shutdown_sets_flags_and_report_answers_stopping(serve_ps):
    ps, client = serve_ps(stats=RunStats(window=3))
    assert not report(client, role="actor", task=0, env_steps=1).stopping
    client.call("Shutdown", pb.ShutdownRequest())
    assert ps.stopping.is_set() and ps.shutdown_requested.is_set()
    assert report(client, role="actor", task=0, env_steps=1).stopping
    assert status(client).stopping


def test_stop_flag_alone_answers_stopping(serve_ps):
    ps, client = serve_ps(stats=RunStats(window=3))
    ps.stop = Stop(StopKind.MAX_ENV_STEPS, "max_env_steps reached: 10 env steps")
    ps.stopping.set()
    assert report(client, role="learner", task=0, updates=1).stopping
    reply = status(client)
    assert reply.stopping and reply.stop_reason.startswith("max_env_steps")
    assert reply.stop_kind == pb.STOP_MAX_ENV_STEPS
    # The client hands the launcher the typed condition it judges success from.
    typed = ShardClient(client).status()
    assert typed.stop_kind is StopKind.MAX_ENV_STEPS and typed.stop_reason == reply.stop_reason


def test_every_stop_kind_crosses_the_wire(serve_ps):
    ps, client = serve_ps(stats=RunStats(window=3))
    assert ShardClient(client).status().stop_kind is None  # running
    for kind in StopKind:
        ps.stop = Stop(kind, kind.value)
        assert ShardClient(client).status().stop_kind is kind
    assert not ps.shutdown_requested.is_set()


@pytest.mark.parametrize("cancel", [False, True], ids=["deadline", "cancelled"])
def test_round_waits_end_when_the_caller_gives_up(serve_ps, cancel):
    _, client = serve_ps(stats=RunStats(window=3))  # 4 handler threads
    request = pb.PullRequest(known_version=-1, min_round=10**9, wait_s=10.0)
    abandon_calls(client.address, "ParameterServer", "Pull", request, 21, cancel, token=TOKEN)
    start = time.monotonic()
    status(client)
    # With the handler threads parked in the abandoned waits, this took ~9.8 s.
    assert time.monotonic() - start < 3.0


def test_all_finite_on_an_unaligned_view():
    from easyrl.roles.ps import all_finite

    data = b"x" + np.ones(100, np.float32).tobytes()
    x = np.frombuffer(data, np.float32, count=100, offset=1)  # as received: any byte offset
    assert not x.flags.aligned and all_finite(x)
    bad = np.ones(100, np.float32)
    bad[3] = np.inf
    y = np.frombuffer(b"x" + bad.tobytes(), np.float32, count=100, offset=1)
    assert not all_finite(y)
