"""Tests of easyrl.transport.rpc against real gRPC servers on 127.0.0.1."""

import logging
import re
import socket
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from easyrl.errors import ConfigError, MessageTooLarge, ReplayError, TransportError
from easyrl.transport import codec, rpc
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport import easyrl_pb2_grpc as pb_grpc

TOKEN = "s3cret-token"
MIB = 1024 * 1024


class CountingServicer(pb_grpc.ParameterServerServicer):
    """Implements only Status: counts the calls it handled and keeps the last metadata."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = 0
        self.metadata = {}

    def Status(self, request, context):
        with self._lock:
            self.calls += 1
            self.metadata = dict(context.invocation_metadata())
            return pb.StatusResponse(role="ps", task=0, counters={"calls": float(self.calls)})


class FailingServicer(pb_grpc.ParameterServerServicer):
    """Status raises whatever `error` holds, through `invalid_argument_on_error`."""

    def __init__(self, error):
        self.error = error

    @rpc.invalid_argument_on_error
    def Status(self, request, context):
        if self.error is not None:
            raise self.error
        return pb.StatusResponse(role="ok")


class SlowServicer(pb_grpc.ParameterServerServicer):
    def __init__(self):
        self.release = threading.Event()

    def Status(self, request, context):
        self.release.wait(5)
        return pb.StatusResponse()


@pytest.fixture
def resources():
    """Collects servers and clients and shuts them down after the test."""
    servers, clients = [], []
    yield servers, clients
    for client in clients:
        client.close()
    for server in servers:
        server.stop(None)


@pytest.fixture
def serve(resources):
    servers, _ = resources

    def start(token, servicer=None, address="127.0.0.1:0", max_message_bytes=None):
        servicer = CountingServicer() if servicer is None else servicer
        server, port = rpc.make_server(
            address, token, max_workers=4, max_message_bytes=max_message_bytes
        )
        rpc.add_servicer("ps", servicer, server)
        server.start()
        servers.append(server)
        return servicer, f"127.0.0.1:{port}"

    return start


@pytest.fixture
def connect(resources):
    _, clients = resources

    def make(address, token, **kwargs):
        kwargs.setdefault("timeout_s", 5.0)
        kwargs.setdefault("retry_s", 0.0)
        client = rpc.Client(rpc.stub_class("ps"), address, token, **kwargs)
        clients.append(client)
        return client

    return make


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status_of(client, **kwargs):
    return client.call("Status", pb.StatusRequest(), **kwargs)


# --- authentication -----------------------------------------------------------------------


def test_call_with_token_succeeds(serve, connect):
    servicer, address = serve(TOKEN)
    client = connect(address, TOKEN)
    first = status_of(client)
    second = status_of(client)
    assert isinstance(first, pb.StatusResponse)
    assert first.role == "ps"
    assert first.counters["calls"] == 1.0
    assert second.counters["calls"] == 2.0
    assert servicer.calls == 2
    assert servicer.metadata["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    "token", [None, "", "wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper()], ids=repr
)
def test_missing_or_wrong_token_is_unauthenticated(serve, connect, token):
    servicer, address = serve(TOKEN)
    client = connect(address, token, retry_s=2.0)
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        status_of(client)
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "UNAUTHENTICATED" in str(info.value)
    assert time.monotonic() - start < 1.0, "UNAUTHENTICATED must not be retried"
    assert servicer.calls == 0, "the handler ran without a valid token"


def test_unauthenticated_applies_to_every_method(serve, connect):
    _, address = serve(TOKEN)
    client = connect(address, "wrong")
    with pytest.raises(TransportError) as info:
        client.call("Pull", pb.PullRequest(known_version=-1))
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_insecure_server_accepts_clients_without_token(serve, connect):
    servicer, address = serve(None)
    assert status_of(connect(address, None)).counters["calls"] == 1.0
    assert status_of(connect(address, "any-token")).counters["calls"] == 2.0
    assert servicer.calls == 2


def test_empty_token_disables_auth_on_server(serve, connect):
    servicer, address = serve("")
    status_of(connect(address, None))
    assert servicer.calls == 1


# --- retries and deadlines ----------------------------------------------------------------


def test_call_retries_unavailable_until_server_starts(resources, connect):
    servers, _ = resources
    port = free_port()
    address = f"127.0.0.1:{port}"
    servicer = CountingServicer()
    started = threading.Event()
    failures = []

    def start_later():
        time.sleep(0.3)
        try:
            server, bound = rpc.make_server(address, TOKEN, max_workers=2)
            rpc.add_servicer("ps", servicer, server)
            server.start()
            servers.append(server)
            assert bound == port
        except Exception as err:  # reported by the main thread
            failures.append(err)
        started.set()

    client = connect(address, TOKEN, timeout_s=2.0, retry_s=8.0)
    thread = threading.Thread(target=start_later, daemon=True)
    begin = time.monotonic()
    thread.start()
    try:
        response = status_of(client)
    finally:
        thread.join(5)
    assert not failures, failures
    assert started.is_set()
    assert response.counters["calls"] == 1.0
    assert time.monotonic() - begin >= 0.3


def test_call_gives_up_on_unavailable_after_retry_budget(connect):
    client = connect(f"127.0.0.1:{free_port()}", TOKEN, timeout_s=2.0, retry_s=30.0)
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        status_of(client, retry_s=0.2)
    elapsed = time.monotonic() - start
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert 0.15 <= elapsed < 1.0, elapsed


def test_a_stopping_process_stops_retrying_at_once(connect, monkeypatch):
    # SIGTERM sets rpc.STOPPING (roles.common.stop_event_on_signals): a role whose peer is
    # gone must not sit out its 30 s retry budget, or it overruns the launcher's grace.
    stopping = threading.Event()
    monkeypatch.setattr(rpc, "STOPPING", stopping)
    client = connect(f"127.0.0.1:{free_port()}", TOKEN, timeout_s=2.0, retry_s=30.0)
    timer = threading.Timer(0.5, stopping.set)
    timer.start()
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        status_of(client)
    timer.join()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert 0.4 <= time.monotonic() - start < 10.0  # not the 30 s budget
    start = time.monotonic()
    with pytest.raises(TransportError):  # and no retries at all from then on
        status_of(client)
    assert time.monotonic() - start < 2.0


def test_unreachable_peer_is_logged_once_per_interval_not_per_retry(connect, caplog, monkeypatch):
    monkeypatch.setattr(rpc.Client, "WARN_AFTER_S", 0.3)
    address = f"127.0.0.1:{free_port()}"
    client = connect(address, TOKEN, timeout_s=2.0, retry_s=1.0)
    with caplog.at_level("WARNING", logger="easyrl.transport.rpc"):
        for _ in range(2):  # ~10 retries in all, well within one WARN_EVERY_S
            with pytest.raises(TransportError):
                status_of(client)
    warnings = [r.getMessage() for r in caplog.records if address in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert re.search(r"unreachable for [\d.]+ s; retrying for up to [\d.]+ s more", warnings[0])


def test_a_short_wait_for_a_peer_logs_nothing(connect, caplog):
    # A peer still starting is expected (roles start in any order): calls that give up
    # before WARN_AFTER_S (10 s) of retries, as the launcher's start-up polls do, log nothing.
    address = f"127.0.0.1:{free_port()}"
    client = connect(address, TOKEN, timeout_s=2.0, retry_s=0.5)
    with caplog.at_level("WARNING", logger="easyrl.transport.rpc"):
        for _ in range(3):
            with pytest.raises(TransportError):
                status_of(client)
    assert not [r for r in caplog.records if address in r.getMessage()]


def test_retry_budget_from_constructor(connect):
    client = connect(f"127.0.0.1:{free_port()}", TOKEN, timeout_s=2.0, retry_s=0.2)
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        status_of(client)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert 0.15 <= time.monotonic() - start < 1.0


def test_zero_retry_budget_fails_at_once(connect):
    client = connect(f"127.0.0.1:{free_port()}", TOKEN, retry_s=0.0)
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        status_of(client)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - start < 0.5


def test_other_codes_are_not_retried(serve, connect):
    _, address = serve(TOKEN)
    client = connect(address, TOKEN, retry_s=10.0)
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        client.call("Pull", pb.PullRequest(known_version=-1))
    assert info.value.code == grpc.StatusCode.UNIMPLEMENTED
    assert time.monotonic() - start < 1.0


def test_deadline_exceeded_is_reported_not_retried(serve, connect):
    servicer = SlowServicer()
    _, address = serve(TOKEN, servicer)
    client = connect(address, TOKEN, retry_s=10.0)
    start = time.monotonic()
    try:
        with pytest.raises(TransportError) as info:
            status_of(client, timeout_s=0.2)
    finally:
        servicer.release.set()
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - start < 1.5


class SlowAnswer:
    """A TCP relay to `target` that holds each new connection `delay_s` before relaying it:
    a server that takes that long to answer a new connection (a loaded machine)."""

    def __init__(self, target: str, delay_s: float):
        self.target, self.delay_s = target, delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.sockets.append(conn)
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        time.sleep(self.delay_s)
        host, port = self.target.rsplit(":", 1)
        try:
            upstream = socket.create_connection((host, int(port)))
        except OSError:  # the test ended
            conn.close()
            return
        self.sockets.append(upstream)
        for src, dst in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def test_a_server_slow_to_answer_a_new_connection_is_waited_for(serve, connect):
    # A server on a loaded machine may take a few hundred ms to answer a new connection
    # (measured: 22 of 1,841 fresh Status calls to a Pong cluster's memory shard on 2 cores):
    # a call without retries (the launcher's Status and Shutdown) must still get through.
    # gRPC gives each connection attempt at least `grpc.min_reconnect_backoff_ms`.
    _, address = serve(TOKEN)
    proxy = SlowAnswer(address, delay_s=0.5)
    try:
        reply = status_of(connect(proxy.address, TOKEN, timeout_s=5.0, retry_s=0.0))
    finally:
        proxy.close()
    assert reply.role == "ps"


@pytest.mark.parametrize(("timeout_s", "retry_s"), [(0.0, 1.0), (-1.0, 1.0), (1.0, -0.1)])
def test_client_rejects_bad_timeouts(timeout_s, retry_s):
    with pytest.raises(ValueError):
        rpc.Client(rpc.stub_class("ps"), "127.0.0.1:1", None, timeout_s=timeout_s, retry_s=retry_s)


# --- handler errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [ReplayError("bad keys: [3, 99]"), ConfigError("bad config value"), ValueError("bad value")],
    ids=["ReplayError", "ConfigError", "ValueError"],
)
def test_invalid_argument_on_error(serve, connect, error):
    _, address = serve(TOKEN, FailingServicer(error))
    client = connect(address, TOKEN, retry_s=5.0)
    with pytest.raises(TransportError) as info:
        status_of(client)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(error) in str(info.value)


def test_invalid_argument_on_error_passes_results_and_other_errors(serve, connect):
    servicer = FailingServicer(None)
    _, address = serve(TOKEN, servicer)
    client = connect(address, TOKEN)
    assert status_of(client).role == "ok"
    servicer.error = RuntimeError("internal bug")
    with pytest.raises(TransportError) as info:
        status_of(client)
    assert info.value.code == grpc.StatusCode.UNKNOWN
    assert FailingServicer.Status.__name__ == "Status"


# --- message size -------------------------------------------------------------------------


def big_push(nbytes: int) -> pb.PushRequest:
    gradient = np.zeros(nbytes // 4, dtype=np.float32)
    return pb.PushRequest(version=1, gradients=[codec.encode_array("g", gradient)])


def test_message_over_the_servers_limit_is_refused_and_not_retried(serve, connect):
    _, address = serve(TOKEN, max_message_bytes=MIB)
    client = connect(address, TOKEN, retry_s=5.0)

    with pytest.raises(MessageTooLarge, match="security.max_message_mb") as info:
        client.call("Push", big_push(2 * MIB))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED

    # A message under the limit gets through to the (unimplemented) handler.
    with pytest.raises(TransportError) as info:
        client.call("Push", big_push(MIB // 2))
    assert info.value.code == grpc.StatusCode.UNIMPLEMENTED
    assert not isinstance(info.value, MessageTooLarge)


def test_default_limit_carries_large_messages(serve, connect):
    _, address = serve(TOKEN)
    client = connect(address, TOKEN)
    with pytest.raises(TransportError) as info:
        client.call("Push", big_push(8 * MIB))
    # 8 MiB is over gRPC's 4 MiB default, so reaching the handler shows the options apply.
    assert info.value.code == grpc.StatusCode.UNIMPLEMENTED


# --- tokens -------------------------------------------------------------------------------


def test_new_token_is_random_hex():
    tokens = {rpc.new_token() for _ in range(20)}
    assert len(tokens) == 20
    for token in tokens:
        assert len(token) == 32
        int(token, 16)


def test_resolve_token_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv(rpc.TOKEN_ENV, "from-env")
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert rpc.resolve_token(None, insecure=False) == "from-env"
    assert rpc.resolve_token(str(token_file), insecure=False) == "from-env"
    assert rpc.resolve_token(None, insecure=True) == "from-env"


def test_resolve_token_from_file(monkeypatch, tmp_path):
    monkeypatch.delenv(rpc.TOKEN_ENV, raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("  from-file \n")
    assert rpc.resolve_token(str(token_file), insecure=False) == "from-file"
    assert rpc.resolve_token(str(token_file), insecure=True) == "from-file"


def test_resolve_token_empty_env_falls_back_to_file(monkeypatch, tmp_path):
    monkeypatch.setenv(rpc.TOKEN_ENV, "")
    token_file = tmp_path / "token"
    token_file.write_text("from-file")
    assert rpc.resolve_token(str(token_file), insecure=False) == "from-file"


@pytest.mark.parametrize("content", ["", "   \n\t\n"], ids=["empty", "blank"])
def test_resolve_token_empty_file_is_config_error(monkeypatch, tmp_path, content):
    monkeypatch.delenv(rpc.TOKEN_ENV, raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(content)
    for insecure in (False, True):
        with pytest.raises(ConfigError, match="empty"):
            rpc.resolve_token(str(token_file), insecure=insecure)


@pytest.mark.parametrize("insecure", [False, True])
def test_resolve_token_missing_file_is_config_error(monkeypatch, tmp_path, insecure):
    monkeypatch.delenv(rpc.TOKEN_ENV, raising=False)
    missing = tmp_path / "no" / "such-token"
    with pytest.raises(ConfigError, match="security.token_file") as info:
        rpc.resolve_token(str(missing), insecure=insecure)
    assert str(missing) in str(info.value)


def test_resolve_token_unreadable_file_is_config_error(monkeypatch, tmp_path):
    monkeypatch.delenv(rpc.TOKEN_ENV, raising=False)
    # A directory cannot be read as a file (works even as root, unlike chmod 000).
    with pytest.raises(ConfigError, match="security.token_file") as info:
        rpc.resolve_token(str(tmp_path), insecure=False)
    assert str(tmp_path) in str(info.value)
    binary = tmp_path / "token.bin"
    binary.write_bytes(b"\xff\xfe\x00\x80")
    with pytest.raises(ConfigError, match="security.token_file") as info:
        rpc.resolve_token(str(binary), insecure=False)
    assert str(binary) in str(info.value)


def test_resolve_token_missing_file_is_ignored_when_env_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv(rpc.TOKEN_ENV, "from-env")
    assert rpc.resolve_token(str(tmp_path / "missing"), insecure=False) == "from-env"


def test_resolve_token_env_is_stripped(monkeypatch, tmp_path):
    monkeypatch.setenv(rpc.TOKEN_ENV, "  from-env\n")
    assert rpc.resolve_token(None, insecure=False) == "from-env"
    token_file = tmp_path / "token"
    token_file.write_text("from-file")
    assert rpc.resolve_token(str(token_file), insecure=False) == "from-env"


def test_resolve_token_blank_env_counts_as_unset(monkeypatch, tmp_path):
    monkeypatch.setenv(rpc.TOKEN_ENV, " \t\n ")
    token_file = tmp_path / "token"
    token_file.write_text("from-file")
    assert rpc.resolve_token(str(token_file), insecure=False) == "from-file"
    with pytest.raises(ConfigError, match=rpc.TOKEN_ENV):
        rpc.resolve_token(None, insecure=False)
    assert rpc.resolve_token(None, insecure=True) is None


def test_resolve_token_nothing_given(monkeypatch):
    monkeypatch.delenv(rpc.TOKEN_ENV, raising=False)
    with pytest.raises(ConfigError, match=rpc.TOKEN_ENV):
        rpc.resolve_token(None, insecure=False)
    with pytest.raises(ConfigError):
        rpc.resolve_token("", insecure=False)
    assert rpc.resolve_token(None, insecure=True) is None
    assert rpc.resolve_token("", insecure=True) is None


# --- binding ------------------------------------------------------------------------------


def test_make_server_returns_bound_port(resources):
    servers, _ = resources
    server, port = rpc.make_server("127.0.0.1:0", TOKEN)
    servers.append(server)
    assert isinstance(server, grpc.Server)
    assert 0 < port < 65536


def test_make_server_on_port_held_by_plain_socket_raises():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(TransportError, match="cannot bind"):
            rpc.make_server(f"127.0.0.1:{port}", TOKEN)


def test_make_server_on_unresolvable_address_raises():
    with pytest.raises(TransportError, match="cannot bind"):
        rpc.make_server("256.0.0.1:1", TOKEN)


def test_make_server_on_port_held_by_another_server_raises(serve, connect):
    servicer, address = serve(TOKEN)
    second = None
    try:
        with pytest.raises(TransportError, match="cannot bind"):
            second, _ = rpc.make_server(address, TOKEN)
    finally:
        if second is not None:
            second.stop(None)
    # The first server still answers every call.
    client = connect(address, TOKEN)
    for _ in range(5):
        status_of(client)
    assert servicer.calls == 5


def test_make_server_on_port_held_by_unstarted_server_raises(resources):
    servers, _ = resources
    first, port = rpc.make_server("127.0.0.1:0", None)
    servers.append(first)
    with pytest.raises(TransportError, match="cannot bind"):
        rpc.make_server(f"127.0.0.1:{port}", None)


def test_make_server_disables_so_reuseport(monkeypatch):
    seen = {}
    real_server = grpc.server

    def spy(*args, **kwargs):
        seen.update(dict(kwargs.get("options") or ()))
        return real_server(*args, **kwargs)

    monkeypatch.setattr(grpc, "server", spy)
    server, _ = rpc.make_server("127.0.0.1:0", TOKEN)
    server.stop(None)
    assert seen["grpc.so_reuseport"] == 0
    assert seen["grpc.max_receive_message_length"] == rpc.MAX_MESSAGE_BYTES
    server, _ = rpc.make_server("127.0.0.1:0", TOKEN, max_message_bytes=MIB)
    server.stop(None)
    assert seen["grpc.max_receive_message_length"] == seen["grpc.max_send_message_length"] == MIB


def test_client_channel_does_not_get_server_only_options(monkeypatch):
    seen = {}
    real_channel = grpc.insecure_channel

    def spy(address, options=None, **kwargs):
        seen.update(dict(options or ()))
        return real_channel(address, options=options, **kwargs)

    monkeypatch.setattr(grpc, "insecure_channel", spy)
    client = rpc.Client(rpc.stub_class("ps"), "127.0.0.1:1", TOKEN)
    client.close()
    assert "grpc.so_reuseport" not in seen
    # Clients set no limit of their own: the servers' limits, sized from the config, apply.
    assert seen["grpc.max_send_message_length"] == rpc.UNLIMITED_MESSAGE_BYTES
    assert seen["grpc.max_receive_message_length"] == rpc.UNLIMITED_MESSAGE_BYTES


def test_malformed_calls_log_one_line_per_interval(caplog):
    server, port = rpc.make_server("127.0.0.1:0", "the-token")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method in ("List", "Watch", "Check"):  # health: no token needed
                call = channel.unary_unary(f"/grpc.health.v1.Health/{method}")
                for _ in range(34):
                    with pytest.raises(grpc.RpcError):
                        call(b"\xff\xff\xff", timeout=5)  # unparseable
    finally:
        server.stop(None).wait()
    records = [r for r in caplog.records if r.name in rpc.REFUSAL_LOGGERS]
    # Each call logged an ERROR with a traceback: 102 calls, 102 records, ~800 lines.
    assert len(records) <= 1 and all(r.exc_info is None for r in records), records


def test_refusal_filter_counts_what_it_held_back():
    refusals = rpc.RefusalLogFilter(interval_s=0.2)

    def record():
        try:
            raise ValueError("x" * 5000)
        except ValueError:
            return logging.LogRecord(
                "grpc._common", logging.ERROR, "", 0, "bad %s", ("body",), sys.exc_info()
            )

    first = record()
    assert refusals.filter(first) and first.exc_info is None
    assert (
        first.getMessage().startswith("bad body (ValueError: xxx") and len(first.getMessage()) < 300
    )
    assert not any(refusals.filter(record()) for _ in range(99))
    time.sleep(0.25)
    later = record()
    assert refusals.filter(later) and later.getMessage().endswith(
        "99 more like it in the previous 0.2 s"
    )


def test_refusal_filter_keys_on_the_template_not_what_the_caller_chose():
    refusals = rpc.RefusalLogFilter(interval_s=60)

    def record(method: str) -> logging.LogRecord:
        return logging.LogRecord(
            "grpc._common", logging.ERROR, "", 0, "Exception deserializing %s", (method,), None
        )

    # 10,000 refusals naming 10,000 made-up methods: one line, one entry.
    logged = [refusals.filter(record(f"/easyrl.v1.Memory/X{i}")) for i in range(10_000)]
    assert sum(logged) == 1 and len(refusals._seen) == 1
    for i in range(2 * refusals.MAX_KEYS):  # distinct templates (only code chooses those)
        refusals.filter(logging.LogRecord("grpc._server", 40, "", 0, f"t{i}", None, None))
    assert len(refusals._seen) <= refusals.MAX_KEYS
