"""gRPC helpers shared by every role: servers with token auth, clients with retries.

Servers check a shared token carried in call metadata (`authorization: Bearer
<token>`) with an interceptor; clients attach it to every call, give every call
a deadline, and retry UNAVAILABLE with capped exponential backoff and jitter.
Every server also serves the standard health-checking service (`grpc.health.v1`),
open without the token so that a kubelet's grpc readiness probe can ask it.
"""

import functools
import logging
import os
import random
import secrets
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from easyrl.errors import ConfigError, EasyRLError, MessageTooLarge, TransportError
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb

log = logging.getLogger(__name__)

TOKEN_ENV = "EASYRL_TOKEN"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""A server's message limit when its caller gives none (role servers size theirs from the
config: `easyrl.roles.common.RoleContext.message_limit`)."""
UNLIMITED_MESSAGE_BYTES = 2**31 - 1
"""gRPC's largest limit: what clients set (see `_client_options`)."""
_AUTH_KEY = "authorization"
_TOO_LARGE = "larger than max"
"""What gRPC's status details say of a message over a limit."""
STOPPING = threading.Event()
"""Set once this process is asked to stop (a role's SIGTERM or SIGINT, see
`easyrl.roles.common.stop_event_on_signals`): clients then stop retrying an unreachable peer
at once, so that a role whose peer is gone still exits within its grace period."""
HEALTH_METHODS = "/grpc.health.v1.Health/"
"""Method prefix of the health service: answered without the token (it tells only whether the
server is serving, and probes carry no metadata)."""


def new_token() -> str:
    """Returns a fresh random token (what the local launcher hands its children)."""
    return secrets.token_hex(16)


def read_token_file(path: str | Path, what: str) -> str:
    """The token in file `path` (surrounding whitespace removed).

    Raises:
        ConfigError: starting with `what`: the file cannot be read or holds no token.
    """
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{what}: cannot read the token file {path}: {err}") from err
    if not token:
        raise ConfigError(f"{what}: the token file {path} is empty")
    return token


def resolve_token(token_file: str | None, insecure: bool) -> str | None:
    """Finds the shared token: the EASYRL_TOKEN environment variable, else `token_file`.

    Returns None only when `insecure` is set and no token is given.

    Raises:
        ConfigError: no token was found and `insecure` is false, or the file is
            missing, unreadable or empty.
    """
    token = (os.environ.get(TOKEN_ENV) or "").strip()
    if not token and token_file:
        token = read_token_file(token_file, "security.token_file")
    if not token and not insecure:
        raise ConfigError(
            f"no auth token: set {TOKEN_ENV} or security.token_file "
            "(or security.insecure: true to run without authentication)"
        )
    return token or None


@dataclass(frozen=True)
class TLSFiles:
    """PEM file paths for TLS; `ca` set on the server side asks for client certificates."""

    cert: str
    key: str
    ca: str | None = None


CONNECT_ATTEMPT_MS = 2000
"""The longest wait between a client's connection attempts, and the least time each attempt
gets to connect (`_client_options`)."""


def _channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def _client_options() -> list[tuple[str, int]]:
    # gRPC's default reconnect backoff starts at 1 s and grows to 120 s: a worker started
    # next to its servers, or whose server restarted, would sit idle long after the server
    # is back. Reconnect quickly instead (capped at 2 s, like Client's own retries).
    # `min_reconnect_backoff_ms` is not a backoff: it is the least time gRPC gives one
    # connection attempt (its "min connect timeout"). At 100 ms, a server that a loaded
    # machine schedules late failed new connections ("timed out before receiving SETTINGS
    # frame": 22 of 1,841 fresh Status calls to a 2-core Pong cluster's memory shard),
    # and a call without retries with them; an attempt gets the longest wait instead.
    # A client talks only to this run's servers, whose own limits bound what they take and
    # send (sized from the config): the client side sets none of its own.
    return [
        *_channel_options(UNLIMITED_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", CONNECT_ATTEMPT_MS),
        ("grpc.max_reconnect_backoff_ms", CONNECT_ATTEMPT_MS),
    ]


def _server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    # gRPC sets SO_REUSEPORT by default on Linux, which would let a second server
    # bind a port another one already listens on (the kernel then splits
    # connections between them). Turn it off so that the second bind fails.
    return [*_channel_options(max_message_bytes), ("grpc.so_reuseport", 0)]


class RefusalLogFilter(logging.Filter):
    """Collapses what gRPC logs for each malformed call it refuses (an unparseable body: an
    ERROR with a traceback, several lines a call) into one line per message template and
    interval: the first is logged with the exception's last line instead of the traceback,
    the others are counted and the count rides on the next line logged after the interval.
    Keyed by the template, not the formatted text (which carries what the caller chose,
    e.g. a method name), so callers cannot grow the table; at most MAX_KEYS templates."""

    MAX_KEYS = 256

    def __init__(self, interval_s: float = 60.0):
        super().__init__()
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}  # template: (last logged, suppressed)

    def filter(self, record: logging.LogRecord) -> bool:
        message, now = record.getMessage(), time.monotonic()
        key = f"{record.name}:{bounded(str(record.msg), 200)}"
        with self._lock:
            last, suppressed = self._seen.get(key, (-float("inf"), 0))
            if now - last < self.interval_s:
                self._seen[key] = (last, suppressed + 1)
                return False
            if len(self._seen) >= self.MAX_KEYS and key not in self._seen:
                self._seen.clear()
            self._seen[key] = (now, 0)
        cause = record.exc_info[1] if record.exc_info else None
        text = message + (f" ({type(cause).__name__}: {bounded(str(cause), 200)})" if cause else "")
        if suppressed:
            text += f"; {suppressed} more like it in the previous {self.interval_s:g} s"
        record.msg, record.args, record.exc_info, record.exc_text = text, None, None, None
        return True


_REFUSALS = RefusalLogFilter()
REFUSAL_LOGGERS = ("grpc._common", "grpc._server")
"""gRPC's loggers of calls it refuses itself (`RefusalLogFilter` on each, in every server)."""


class _TokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls whose metadata lacks the shared token with UNAUTHENTICATED."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}"

        def deny(requests, context):  # never iterated: the request body is not read
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")

        # A streaming-request handler: gRPC reads a message only when the handler asks for
        # it, so an unauthenticated call is refused before its body is buffered (a unary
        # handler gets the whole message read first: up to the message limit per call).
        self._deny = grpc.stream_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(HEALTH_METHODS):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get(_AUTH_KEY, "")
        if isinstance(given, str):  # bytes only for "-bin" keys
            given = given.encode()
        if secrets.compare_digest(given, self._expected.encode()):
            return continuation(handler_call_details)
        return self._deny


class HealthReportingServer(grpc.Server):
    """A gRPC server that serves the standard health service (`grpc.health.v1`, overall
    status, service name ""): NOT_SERVING until `start()` (a role builds or restores its
    state before it starts its server, so SERVING means ready), SERVING from then on, and
    NOT_SERVING again from `stop()` on (open Watch streams hear it before the server goes).

    Args:
        server: the server to serve through; every other call is passed on to it.
    """

    def __init__(self, server: grpc.Server):
        self._server = server
        self.health = health.HealthServicer()
        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)

    def add_generic_rpc_handlers(self, generic_rpc_handlers):
        self._server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name, method_handlers):
        # grpc.Server has this method since grpcio 1.63; typeshed's grpcio stubs lack it.
        self._server.add_registered_method_handlers(  # pyright: ignore[reportAttributeAccessIssue]
            service_name, method_handlers
        )

    def add_insecure_port(self, address):
        return self._server.add_insecure_port(address)

    def add_secure_port(self, address, server_credentials):
        return self._server.add_secure_port(address, server_credentials)

    def start(self):
        self._server.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace):
        self.health.enter_graceful_shutdown()
        return self._server.stop(grace)

    def wait_for_termination(self, timeout=None):
        return self._server.wait_for_termination(timeout)


def make_server(
    address: str,
    token: str | None,
    *,
    max_workers: int = 16,
    tls: TLSFiles | None = None,
    max_message_bytes: int | None = None,
) -> tuple[HealthReportingServer, int]:
    """Creates (not starts) a gRPC server bound to `address` ("host:port", port 0 = free),
    with the health service (see `HealthReportingServer`).

    The host is resolved by the operating system (a name in /etc/hosts works: a Kubernetes
    StatefulSet pod binds its own stable DNS name that way).

    Args:
        address: where to listen; never defaults to 0.0.0.0.
        token: shared token every call must carry; None disables authentication.
        max_workers: handler threads.
        tls: server certificate files; None serves plaintext.
        max_message_bytes: the largest message the server takes or sends (a larger one
            fails with RESOURCE_EXHAUSTED before its handler runs); None: MAX_MESSAGE_BYTES.

    Returns:
        The server and the port it bound.

    Raises:
        TransportError: the address could not be bound.
    """
    for name in REFUSAL_LOGGERS:
        if _REFUSALS not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_REFUSALS)
    interceptors: list[grpc.ServerInterceptor] = [_TokenInterceptor(token)] if token else []
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
        interceptors=interceptors,
        options=_server_options(max_message_bytes or MAX_MESSAGE_BYTES),
    )
    server = HealthReportingServer(server)
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            credentials = grpc.ssl_server_credentials(
                [(Path(tls.key).read_bytes(), Path(tls.cert).read_bytes())],
                root_certificates=Path(tls.ca).read_bytes() if tls.ca else None,
                require_client_auth=tls.ca is not None,
            )
            port = server.add_secure_port(address, credentials)
    except RuntimeError as err:
        raise TransportError(f"cannot bind {address}: {err}") from err
    if port == 0:
        raise TransportError(f"cannot bind {address}")
    return server, port


def caller_active(context) -> Callable[[], bool]:
    """Whether an RPC's caller still waits: false once it cancelled or its deadline passed
    (always true for a direct call without a context). Handlers that wait poll it."""
    return context.is_active if context is not None else lambda: True


def within_deadline(context, wait_s: float, margin_s: float = 0.05) -> float:
    """How long a handler may wait: `wait_s`, cut to end `margin_s` before the call's
    deadline (so the caller gets an answer, not DEADLINE_EXCEEDED). `context` may be None
    (a direct call in tests) or have no deadline: then `wait_s` as is."""
    remaining = context.time_remaining() if context is not None else None
    if remaining is None:
        return wait_s
    return min(wait_s, max(0.0, remaining - margin_s))


DETAILS_LIMIT = 1000
"""Characters of an error message a refusal sends back: messages echo the caller's input
(a dtype, a tensor name), and gRPC fails a call whose status details pass its 16 KiB metadata
limit with RESOURCE_EXHAUSTED instead of the refusal's own code."""


def bounded(text: str, limit: int = DETAILS_LIMIT) -> str:
    """`text`, cut to `limit` characters and saying how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more chars)"


def invalid_argument_on_error(method: Callable) -> Callable:
    """Decorates a servicer method: EasyRLError/ValueError become INVALID_ARGUMENT.

    The method must validate before it changes state, so that an aborted call
    leaves the server as it was.
    """

    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except (EasyRLError, ValueError) as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, bounded(str(err)))

    return wrapper


SERVICES = {"ps": "ParameterServer", "memory": "ReplayMemory"}
"""The gRPC service (in easyrl.proto) of each listening role."""


def _serialize(message) -> bytes:
    return message.SerializeToString()  # a protobuf message or a `codec.Framed` one


def _methods(role: str):
    service = pb.DESCRIPTOR.services_by_name[SERVICES[role]]
    for method in service.methods:
        path = f"/{service.full_name}/{method.name}"
        yield (
            method.name,
            path,
            getattr(pb, method.input_type.name),
            getattr(pb, method.output_type.name),
        )


def add_servicer(role: str, servicer, server: grpc.Server) -> None:
    """Serves `servicer`'s methods of `role`'s service on `server`. Unlike the generated
    `add_*Servicer_to_server`, requests with a `body` are parsed by `codec.parser` (tensors
    read in place) and responses may be `codec.Framed`."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=codec.parser(request),
            response_serializer=_serialize,
        )
        for name, _, request, _ in _methods(role)
    }
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                pb.DESCRIPTOR.services_by_name[SERVICES[role]].full_name, handlers
            ),
        )
    )


class Stub:
    """A client stub of `role`'s service (what the generated stub classes are, with
    `codec.parser` deserializers and `codec.Framed` requests)."""

    def __init__(self, channel: grpc.Channel, role: str):
        for name, path, _, response in _methods(role):
            call = channel.unary_unary(
                path, request_serializer=_serialize, response_deserializer=codec.parser(response)
            )
            setattr(self, name, call)


def stub_class(role: str) -> Callable[[grpc.Channel], Stub]:
    """The stub factory of a listening role ("ps" or "memory"), for `Client`."""
    return functools.partial(Stub, role=role)


class Client:
    """A stub with the token attached, a deadline on every call and retries on UNAVAILABLE.

    Args:
        stub_class: a stub factory taking the channel (`stub_class(role)`, or a generated
            stub class such as `ParameterServerStub`).
        address: "host:port" of the server.
        token: shared token, or None when the server runs insecure.
        timeout_s: per-call deadline.
        retry_s: how long UNAVAILABLE is retried before a call gives up.
        tls_ca: CA certificate to verify a TLS server with (None: plaintext, or the
            system's roots when `tls_cert` is given).
        tls_cert: this client's certificate chain, presented to a server that asks for one
            (mutual TLS); goes with `tls_key`.
        tls_key: the private key of `tls_cert`.
    """

    BACKOFF_START_S = 0.05
    BACKOFF_CAP_S = 2.0
    WARN_AFTER_S = 10.0
    """A call logs its peer unreachable only once it has retried this long (a peer that is
    still starting is expected: roles start in any order)."""
    WARN_EVERY_S = 10.0
    """A peer that stays unreachable is logged at most this often per client."""

    def __init__(
        self,
        stub_class: Callable[[grpc.Channel], Any],
        address: str,
        token: str | None,
        *,
        timeout_s: float = 10.0,
        retry_s: float = 30.0,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ):
        if timeout_s <= 0 or retry_s < 0:
            raise ValueError("timeout_s must be > 0 and retry_s >= 0")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        self.address = address
        self.token = token
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._last_warning = -self.WARN_EVERY_S
        if tls_ca or tls_cert:
            creds = grpc.ssl_channel_credentials(
                root_certificates=Path(tls_ca).read_bytes() if tls_ca else None,
                private_key=Path(tls_key).read_bytes() if tls_key else None,
                certificate_chain=Path(tls_cert).read_bytes() if tls_cert else None,
            )
            self._channel = grpc.secure_channel(address, creds, options=_client_options())
        else:
            self._channel = grpc.insecure_channel(address, options=_client_options())
        self._stub = stub_class(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = ((_AUTH_KEY, f"Bearer {token}"),) if token else ()

    def call(
        self, method: str, request, *, timeout_s: float | None = None, retry_s: float | None = None
    ):
        """Calls `method` with retries on UNAVAILABLE (none once `STOPPING` is set).

        Raises:
            TransportError: a non-retryable status, or UNAVAILABLE past `retry_s` or while
                the process stops. Its `code` attribute holds the grpc.StatusCode.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        give_up = started + (self.retry_s if retry_s is None else retry_s)
        delay = self.BACKOFF_START_S
        rpc = getattr(self._stub, method)
        while True:
            try:
                return rpc(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as err:
                code = err.code()
                retry = code == grpc.StatusCode.UNAVAILABLE and time.monotonic() < give_up
                if not retry or STOPPING.is_set():
                    details = f"{method} to {self.address} failed: {code.name}: {err.details()}"
                    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _TOO_LARGE in details:
                        error: TransportError = MessageTooLarge(
                            f"{details} (the server sizes its limit from the config; "
                            "set security.max_message_mb to raise it)"
                        )
                    else:
                        error = TransportError(details)
                    error.code = code
                    raise error from None
                now = time.monotonic()
                if now - started >= self.WARN_AFTER_S and (
                    now - self._last_warning >= self.WARN_EVERY_S
                ):
                    self._last_warning = now
                    log.warning(
                        "%s unreachable for %.0f s; retrying for up to %.0f s more",
                        self.address,
                        now - started,
                        max(0.0, give_up - now),
                    )
            pause = min(delay, max(0.0, give_up - time.monotonic())) * random.uniform(0.5, 1)
            STOPPING.wait(pause)  # a stop ends the pause: the next failure is not retried
            delay = min(delay * 2, self.BACKOFF_CAP_S)

    def serving(self, timeout_s: float) -> bool:
        """Asks the server's health service (no token, no retries) whether it is serving.

        Returns:
            True when it answers SERVING within `timeout_s`; False when it is unreachable,
            not started yet or shutting down.
        """
        try:
            # grpc_health ships no stub for health_pb2_grpc; pyright does not see the stub
            # methods HealthStub.__init__ assigns.
            check = self._health.Check  # pyright: ignore[reportAttributeAccessIssue]
            reply = check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()
