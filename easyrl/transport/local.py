"""Same-host calls without gRPC (issue 45): when a call's body lies in the caller's
shared-memory segment (`easyrl.transport.shm`: an Insert's items and a Push's gradients
written there by the caller, a Sample's batch and a Pull's values by the server), what is
left to send is a small message, and gRPC's own cost (~0.6 ms a call on loopback, HTTP/2 and
its threads) was most of a same-host Push. A PS or memory shard that takes shared memory also
listens on a Unix socket in Linux's abstract namespace, named from the run's segment prefix
and its own address (`local_name`: nothing on disk to clean up; it goes with the process), and
a client whose call names its segment sends the message there instead.

A connection starts with proof of the token (`token_digest`: a hash, never the token) and
comes from a process of the server's own user (`SO_PEERCRED`), or the server closes it before
reading a call; a caller talks only to a listener of its own user (another user's process
holding the name first would learn nothing but could answer anything). Each call is one
frame each way (`struct` headers below): the method, the caller's deadline and the
serialized request; then the status and the serialized reply (or the refusal's details).
The servicer's own method handles it, so a local call is checked, refused (INVALID_ARGUMENT
leaves the server's state as it was), counted and applied exactly as the gRPC one; only
`LOCAL_METHODS` are served.

A client that cannot connect (an older server, shared memory off, another host) uses gRPC;
one whose connection breaks mid-call (the server was killed) drops it, and the call is made
again over gRPC with a fresh segment (`Broken`; the old one may still be in use), which
retries while the server restarts (an Insert carries its sequence number: stored once); a
call that outlives its deadline fails with DEADLINE_EXCEEDED as over gRPC. A handler waiting
for a batch or a round sees a caller that closed its connection as gone, as over gRPC.
"""

import hashlib
import hmac
import logging
import os
import socket
import struct
import threading
import time

import grpc

from easyrl.errors import TransportError
from easyrl.transport import codec, rpc, shm

log = logging.getLogger(__name__)

LOCAL_METHODS = ("Insert", "Push", "Pull", "Sample")
"""The calls whose body may lie in the caller's segment: what the local path serves."""
_CALL = struct.Struct("<BdI")  # method index, timeout (s), request length
_REPLY = struct.Struct("<BI")  # status code value, reply (or details) length
_DIGEST_BYTES = 32
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_MAX_REQUEST_BYTES = 1 << 20  # a message whose tensors' bytes are in the segment is small
HANDSHAKE_S = 5.0
"""How long a new connection has to prove the token before it is closed."""


def _local_methods(role: str) -> list[tuple]:
    """(name, request type, reply type) of each of `role`'s `LOCAL_METHODS`: a call names
    its method by its index here."""
    return [(n, req, rep) for n, _, req, rep in rpc._methods(role) if n in LOCAL_METHODS]


def _error(method: str, code: grpc.StatusCode, details: str) -> TransportError:
    """The TransportError of a local call that failed with `code`."""
    error = TransportError(f"{method} (local) failed: {code.name}: {details}")
    error.code = code
    return error


def local_name(prefix: str, address: str) -> bytes:
    """The abstract socket name of the server at `address` in the run of segment `prefix`."""
    return b"\0" + f"{prefix}local-{address}".encode()


def token_digest(token: str | None) -> bytes:
    """What a connection presents for the token (a hash of it; fixed without one)."""
    return hashlib.sha256(b"easyrl-local-call:" + (token or "").encode()).digest()


class _Aborted(Exception):
    """A handler's `context.abort(code, details)`."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class Broken(Exception):
    """A local connection broke once the call was sent: the caller makes the call again over
    gRPC, with a fresh segment."""


class _Context:
    """What a servicer method reads of its gRPC context, for a local call on `conn`."""

    def __init__(self, timeout_s: float, conn: socket.socket):
        self._deadline = time.monotonic() + timeout_s
        self._conn = conn

    def time_remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def is_active(self) -> bool:
        """Before the deadline and the caller's connection open (it sends nothing else
        during a call: a read that would find its end finds it closed)."""
        if time.monotonic() >= self._deadline:
            return False
        try:
            return self._conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def abort(self, code: grpc.StatusCode, details: str):
        raise _Aborted(code, details)


def _peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of `conn` (`SO_PEERCRED`)."""
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return uid


def _recv_exact(conn: socket.socket, size: int) -> bytearray:
    """`size` bytes from `conn`.

    Raises:
        EOFError: the peer closed the connection first.
    """
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = conn.recv_into(view[got:])
        if not n:
            raise EOFError("connection closed")
        got += n
    return buffer


class LocalServer:
    """A shard's local listener: serves `LOCAL_METHODS` of `servicer` (a `role` servicer)
    to connections that prove the token, one thread per connection.

    Args:
        role: "ps" or "memory".
        servicer: the shard (its `Insert`/`Push` methods take (request, context)).
        prefix: the run's segment prefix (`shm.run_prefix`).
        address: the shard's gRPC address (names the socket).
        token: the run's token (None: insecure run).

    Raises:
        OSError: the name is taken (another process of this run serves that address).
    """

    def __init__(self, role: str, servicer, prefix: str, address: str, token: str | None):
        self._handlers = [
            (name, getattr(servicer, name), codec.parser(request))
            for name, request, _ in _local_methods(role)
        ]
        self._digest = token_digest(token)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind(local_name(prefix, address))
        self._socket.listen(64)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="local-calls", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                if _peer_uid(conn) != os.getuid():
                    return  # another user's process: closed before anything is read
                conn.settimeout(HANDSHAKE_S)
                digest = bytes(_recv_exact(conn, _DIGEST_BYTES))
                if not hmac.compare_digest(digest, self._digest):
                    return  # not this run's: closed before any call is read
                conn.settimeout(None)
                while not self._closed.is_set():
                    index, timeout_s, size = _CALL.unpack(_recv_exact(conn, _CALL.size))
                    if size > _MAX_REQUEST_BYTES:
                        return
                    request = _recv_exact(conn, size)
                    code, reply = self._handle(conn, index, timeout_s, request)
                    conn.sendall(_REPLY.pack(code.value[0], len(reply)) + reply)
            except (OSError, EOFError, struct.error):
                return
            finally:
                with self._lock:
                    self._conns.discard(conn)

    def _handle(self, conn: socket.socket, index: int, timeout_s: float, data: bytearray) -> tuple:
        """(status, reply bytes or the refusal's details) of one call."""
        if not 0 <= index < len(self._handlers):
            return grpc.StatusCode.UNIMPLEMENTED, b"no such local method"
        name, method, parse = self._handlers[index]
        try:
            request = parse(bytes(data))
        except Exception as err:  # a malformed message: refused, nothing read
            return grpc.StatusCode.INVALID_ARGUMENT, rpc.bounded(f"{name}: {err}").encode()
        try:
            reply = method(request, _Context(max(0.0, timeout_s), conn))
        except _Aborted as err:
            return err.code, rpc.bounded(err.details).encode()
        except Exception as err:  # what gRPC would answer UNKNOWN for, logged likewise
            log.exception("local %s failed", name)
            return grpc.StatusCode.UNKNOWN, rpc.bounded(f"{type(err).__name__}: {err}").encode()
        return grpc.StatusCode.OK, reply.SerializeToString()

    def close(self) -> None:
        """Stops accepting connections and ends the open ones (their callers go to gRPC)."""
        with self._lock:
            self._closed.set()
            conns, self._conns = list(self._conns), set()
        for sock in (self._socket, *conns):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._socket.close()


class LocalCaller:
    """A client's side: one connection to its shard's local listener, one call at a time
    (the caller holds its segment's lock), made on first use.

    Args:
        role: the server's role ("ps" or "memory").
        prefix: the run's segment prefix.
        address: the server's gRPC address.
        token: the run's token (None: insecure run).
    """

    def __init__(self, role: str, prefix: str, address: str, token: str | None):
        methods = _local_methods(role)
        self._index = {name: i for i, (name, _, _) in enumerate(methods)}
        self._parse = {name: codec.parser(reply) for name, _, reply in methods}
        self._name = local_name(prefix, address)
        self._digest = token_digest(token)
        self._conn: socket.socket | None = None
        self.off = False
        """No listener answered: every call goes over gRPC."""
        self.calls = 0
        """Calls answered here."""

    def call(self, grpc_call, method: str, message, timeout_s: float):
        """The reply of `method(message)` over the local connection, or over gRPC
        (`grpc_call(method, message)`) when there is none.

        Raises:
            TransportError: the server refused the call (its status in `code`), or it did
                not answer within `timeout_s` (DEADLINE_EXCEEDED).
            Broken: the connection broke once the call was sent.
        """
        if self.off or method not in self._index:
            return grpc_call(method, message)
        if self._conn is None:
            try:
                self._conn = self._connect()
            except OSError:
                self.off = True
                return grpc_call(method, message)
        conn = self._conn
        data = message.SerializeToString()
        try:
            conn.settimeout(timeout_s)
            conn.sendall(_CALL.pack(self._index[method], timeout_s, len(data)) + data)
            code_value, size = _REPLY.unpack(_recv_exact(conn, _REPLY.size))
            body = _recv_exact(conn, size)
        except TimeoutError:
            self.close()
            raise _error(method, grpc.StatusCode.DEADLINE_EXCEEDED, "no answer") from None
        except (OSError, EOFError):
            # The server went away (gRPC retries while it restarts), or never answered this
            # connection (another user, another token): gRPC from now on.
            self.close()
            self.off = self.calls == 0
            raise Broken(method) from None
        code = _CODES.get(code_value, grpc.StatusCode.UNKNOWN)
        if code != grpc.StatusCode.OK:
            raise _error(method, code, body.decode())
        self.calls += 1
        return self._parse[method](bytes(body))

    def _connect(self) -> socket.socket:
        """A connection to the listener, which must be a process of this user's (another
        user's holding the name would learn nothing but could answer anything).

        Raises:
            OSError: no listener, or another user's.
        """
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._name)
            if _peer_uid(conn) != os.getuid():
                raise ConnectionRefusedError("the local listener is another user's")
            conn.sendall(self._digest)
        except OSError:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Drops the connection (the next call connects again)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def serve(role: str, servicer, address: str, token: str | None) -> LocalServer | None:
    """The local listener of a shard at `address` whose servicer takes shared memory
    (`servicer.shared` set), when `address` is a loopback one; else None (also when the
    name is taken: logged, and callers use gRPC)."""
    if getattr(servicer, "shared", None) is None or not shm.same_host(address):
        return None
    try:
        return LocalServer(role, servicer, servicer.shared.prefix, address, token)
    except OSError as err:
        log.warning("no local calls for %s %s: %s", role, address, err)
        return None
