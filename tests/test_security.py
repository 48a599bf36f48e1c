"""Authentication and TLS, end to end: PS and memory shards served the way the roles serve
them refuse every RPC without the run's token, speak TLS (and mutual TLS) with
certificates made here, and `easyrl train` runs real role processes over mutual TLS
without its token ever showing in a command line, the saved config or a log.
"""

import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from test_cluster import _assert_no_processes_left, _role_pids

from easyrl.errors import MessageTooLarge, TransportError
from easyrl.transport import codec, rpc
from easyrl.transport import easyrl_pb2 as pb

TOKEN = "security-test-token"
VALUES = {"q/w": np.arange(6, dtype=np.float32).reshape(2, 3), "q/b": np.ones(3, np.float32)}
GRADS = {name: np.full_like(value, 0.5) for name, value in VALUES.items()}


# --- certificates -------------------------------------------------------------------------


def _pem(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _certificate(subject, public_key, issuer, signing_key, *extensions) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signing_key, hashes.SHA256())


@dataclass(frozen=True)
class Authority:
    """A self-signed test CA (`ca`: its PEM file) that issues certificates."""

    name: str
    key: ec.EllipticCurvePrivateKey
    ca: str

    @classmethod
    def create(cls, directory: Path, name: str) -> "Authority":
        key = ec.generate_private_key(ec.SECP256R1())
        usage = x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=True,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        cert = _certificate(
            name,
            key.public_key(),
            name,
            key,
            (x509.BasicConstraints(ca=True, path_length=None), True),
            (usage, True),
        )
        pem = cert.public_bytes(serialization.Encoding.PEM)
        return cls(name, key, _pem(directory / f"{name}.pem", pem))

    def issue(self, directory: Path, name: str) -> tuple[str, str]:
        """A certificate for localhost and 127.0.0.1, good for servers and clients alike
        (each role process has one); returns the (certificate, key) PEM files."""
        key = ec.generate_private_key(ec.SECP256R1())
        hosts = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        purposes = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = _certificate(
            name,
            key.public_key(),
            self.name,
            self.key,
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.SubjectAlternativeName(hosts), False),
            (x509.ExtendedKeyUsage(purposes), False),
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return (
            _pem(directory / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM)),
            _pem(directory / f"{name}.key", key_pem),
        )


@dataclass(frozen=True)
class PKI:
    """The run's CA and certificate, and an unrelated CA with a certificate of its own."""

    ca: str
    cert: str
    key: str
    other_ca: str
    other_cert: str
    other_key: str

    def overrides(self, mutual: bool = True) -> list[str]:
        """Config overrides serving TLS with the run's certificate (mutual: checking the
        peers' certificates against the CA too)."""
        files = [f"security.tls_cert={self.cert}", f"security.tls_key={self.key}"]
        return [*files, f"security.tls_ca={self.ca}"] if mutual else files


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    directory = tmp_path_factory.mktemp("pki")
    ca, other = Authority.create(directory, "run-ca"), Authority.create(directory, "other-ca")
    cert, key = ca.issue(directory, "easyrl")
    other_cert, other_key = other.issue(directory, "intruder")
    return PKI(ca.ca, cert, key, other.ca, other_cert, other_key)


# --- helpers ------------------------------------------------------------------------------


def client(shards, role: str, token=TOKEN, **tls) -> rpc.Client:
    """A client of the shard of `role` that gives up at once (no retries)."""
    address = getattr(shards.ctx.cluster, role)[0]
    return rpc.Client(rpc.stub_class(role), address, token, timeout_s=5.0, retry_s=0.0, **tls)


def refused(servers, code, shards, role: str, method: str, request, token=TOKEN, **tls) -> str:
    """Asserts that `request` gets `code` and changes nothing on the shards (`servers`: the
    `role_servers` fixture); returns the error text."""
    servicer = getattr(shards, role)
    before = servers.state(shards.ps), servers.state(shards.memory)
    c = client(shards, role, token, **tls)
    try:
        with pytest.raises(TransportError) as info:
            c.call(method, request)
    finally:
        c.close()
    assert info.value.code == code, info.value
    assert (servers.state(shards.ps), servers.state(shards.memory)) == before, method
    assert not servicer.stopping.is_set()
    return str(info.value)


def round_trip(servers, shards, ps: rpc.Client, memory: rpc.Client) -> None:
    """Real traffic: assign and pull values, insert and sample items, read the status."""
    assign = pb.AssignRequest(tensors=codec.encode_named(VALUES), only_if_empty=False)
    version = ps.call("Assign", assign).version
    reply = ps.call("Pull", pb.PullRequest(known_version=-1))
    assert reply.version == version
    pulled = codec.decode_named(reply.tensors, reply.body)
    for name, value in VALUES.items():
        np.testing.assert_array_equal(pulled[name], value)
    spec = shards.memory.table.spec
    inserted = memory.call("Insert", insert_request(servers, spec, 0, 8)).inserted
    assert inserted >= 8
    reply = memory.call("Sample", pb.SampleRequest(batch_size=3, timeout_s=2.0))
    assert reply.ready
    keys = codec.decode_array(reply.keys, reply.body)
    data = codec.decode_batch(reply.tensors, reply.body)
    assert keys.shape == (3,) and np.all(keys < inserted)
    np.testing.assert_array_equal(data["action"], keys % 8)  # item k of each insert is k
    assert memory.call("Status", pb.StatusRequest()).counters["memory/0/inserts"] == inserted


def insert_request(servers, spec, start: int, n: int) -> pb.InsertRequest:
    return pb.InsertRequest(tensors=codec.encode_batch(servers.items(spec, start, n)))


# --- the token ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(role_servers):
    """PS and prioritized memory shards of a run with a token, holding values and items."""
    shards = role_servers.start(role_servers.config("prioritized"), TOKEN)
    ps, memory = shards.ctx.client("ps", 0), shards.ctx.client("memory", 0)
    round_trip(role_servers, shards, ps, memory)
    ps.close()
    memory.close()
    role_servers.settled_state(shards.memory)
    return shards


def valid_request(servers, shards, role: str, method: str):
    """A request `method` would carry out with the run's token."""
    spec = shards.memory.table.spec
    requests = {
        ("ps", "Pull"): lambda: pb.PullRequest(known_version=-1),
        ("ps", "Push"): lambda: pb.PushRequest(
            version=shards.ps.version, gradients=codec.encode_named(GRADS)
        ),
        ("ps", "Assign"): lambda: pb.AssignRequest(tensors=codec.encode_named(VALUES)),
        ("ps", "Report"): lambda: pb.ReportRequest(role="actor", task=0, env_steps=5),
        ("memory", "Insert"): lambda: insert_request(servers, spec, 100, 2),
        ("memory", "Sample"): lambda: pb.SampleRequest(batch_size=2, timeout_s=1.0),
        ("memory", "UpdatePriorities"): lambda: pb.UpdatePrioritiesRequest(
            keys=codec.encode_array("keys", np.array([3, 4])),
            priorities=codec.encode_array("priorities", np.array([2.0, 0.5])),
        ),
    }
    if method == "Status":
        return pb.StatusRequest()
    if method == "Shutdown":
        return pb.ShutdownRequest()
    return requests[role, method]()


METHODS = [
    *(("ps", m) for m in ("Pull", "Push", "Assign", "Report", "Status", "Shutdown")),
    *(("memory", m) for m in ("Insert", "Sample", "UpdatePriorities", "Status", "Shutdown")),
]


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x", TOKEN.upper()])
@pytest.mark.parametrize(("role", "method"), METHODS, ids=[f"{r}.{m}" for r, m in METHODS])
def test_every_method_refuses_a_missing_or_wrong_token(role_servers, served, role, method, token):
    request = valid_request(role_servers, served, role, method)
    code = grpc.StatusCode.UNAUTHENTICATED
    text = refused(role_servers, code, served, role, method, request, token)
    assert TOKEN not in text  # the refusal does not tell the token
    if method != "Shutdown":  # the same request with the run's token is carried out
        c = client(served, role)
        c.call(method, request)
        c.close()


# --- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_served(role_servers, pki):
    """Shards serving TLS with the run's certificate, not asking for client certificates."""
    return role_servers.start(role_servers.config("prioritized", *pki.overrides(False)), TOKEN)


def test_tls_round_trip_with_the_ca(role_servers, tls_served, pki):
    ps, memory = (
        client(tls_served, "ps", tls_ca=pki.ca),
        client(tls_served, "memory", tls_ca=pki.ca),
    )
    round_trip(role_servers, tls_served, ps, memory)
    ps.close()
    memory.close()


WRITES = [("ps", "Push"), ("memory", "Insert")]
"""A state-changing method of each service: a refused client must not get it through."""


@pytest.mark.parametrize(("role", "method"), WRITES)
def test_tls_refuses_a_plaintext_client(role_servers, tls_served, role, method):
    request = valid_request(role_servers, tls_served, role, method)
    refused(role_servers, grpc.StatusCode.UNAVAILABLE, tls_served, role, method, request)


@pytest.mark.parametrize(("role", "method"), WRITES)
def test_tls_client_trusting_another_ca_refuses_the_server(
    role_servers, tls_served, pki, role, method
):
    request = valid_request(role_servers, tls_served, role, method)
    code, ca = grpc.StatusCode.UNAVAILABLE, pki.other_ca
    refused(role_servers, code, tls_served, role, method, request, tls_ca=ca)


@pytest.fixture(scope="module")
def mtls_served(role_servers, pki):
    """Shards of a run whose config has `tls_ca` too: they ask for client certificates."""
    return role_servers.start(role_servers.config("prioritized", *pki.overrides()), TOKEN)


def test_mutual_tls_round_trip_the_way_roles_connect(role_servers, mtls_served):
    """`RoleContext.client` presents the run's certificate (`security.tls_cert`)."""
    ps, memory = mtls_served.ctx.client("ps", 0), mtls_served.ctx.client("memory", 0)
    round_trip(role_servers, mtls_served, ps, memory)
    ps.close()
    memory.close()


@pytest.mark.parametrize(("role", "method"), WRITES)
def test_mutual_tls_refuses_a_client_without_certificate(
    role_servers, mtls_served, pki, role, method
):
    request = valid_request(role_servers, mtls_served, role, method)
    code = grpc.StatusCode.UNAVAILABLE
    refused(role_servers, code, mtls_served, role, method, request, tls_ca=pki.ca)


@pytest.mark.parametrize(("role", "method"), WRITES)
def test_mutual_tls_refuses_a_certificate_of_another_ca(
    role_servers, mtls_served, pki, role, method
):
    request = valid_request(role_servers, mtls_served, role, method)
    tls = {"tls_ca": pki.ca, "tls_cert": pki.other_cert, "tls_key": pki.other_key}
    code = grpc.StatusCode.UNAVAILABLE
    refused(role_servers, code, mtls_served, role, method, request, **tls)


@pytest.mark.parametrize("role", ["ps", "memory"])
def test_mutual_tls_still_checks_the_token(role_servers, mtls_served, pki, role):
    request = valid_request(role_servers, mtls_served, role, "Shutdown")
    tls = {"tls_ca": pki.ca, "tls_cert": pki.cert, "tls_key": pki.key}
    code = grpc.StatusCode.UNAUTHENTICATED
    refused(role_servers, code, mtls_served, role, "Shutdown", request, "x", **tls)


# --- a real cluster over mutual TLS -------------------------------------------------------


def _proc_file(pid: int, name: str) -> bytes:
    try:
        return (Path("/proc") / str(pid) / name).read_bytes()
    except OSError:  # the process exited meanwhile
        return b""


@pytest.mark.cluster
@pytest.mark.timeout(200)
def test_easyrl_train_over_mutual_tls_never_shows_the_token(launch, pki):
    """`easyrl train` with TLS files in the config: every role and the launcher itself talk
    mutual TLS, the run trains to its budget, and the token shows nowhere but in the
    children's environment (not in a command line, the saved config, a log)."""
    run = launch("stop.max_env_steps=3000", "cluster.actor=1", *pki.overrides())
    run.poll_until(lambda: (run.metrics() or [{}])[-1].get("updates", 0) > 0, 150, "updates")
    pids = {
        f"{role}-0": _role_pids(run.config_path, role, 0)
        for role in ("ps", "memory", "learner", "actor")
    }
    token = None
    for name, found in pids.items():
        assert len(found) == 1, (name, found)
        environ = dict(
            line.split(b"=", 1)
            for line in _proc_file(found[0], "environ").split(b"\0")
            if b"=" in line
        )
        token = token or environ[rpc.TOKEN_ENV.encode()]
        assert environ[rpc.TOKEN_ENV.encode()] == token, name  # one token for the run
        cmdline = _proc_file(found[0], "cmdline")
        assert b"--role" in cmdline and token not in cmdline, name
    assert len(token) >= 32
    # A plaintext client, or one without the run's certificate, gets nothing.
    address = json.loads(
        dict(
            line.split(b"=", 1)
            for line in _proc_file(pids["ps-0"][0], "environ").split(b"\0")
            if b"=" in line
        )[b"EASYRL_CLUSTER"]
    )["ps"][0]
    for tls in ({}, {"tls_ca": pki.ca}):
        plain = rpc.Client(rpc.stub_class("ps"), address, token.decode(), retry_s=0, **tls)
        with pytest.raises(TransportError) as info:
            plain.call("Status", pb.StatusRequest())
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        plain.close()
    code = run.wait(150)
    assert code == 0, f"exit code {code}:\n{run.output()}\n{run.logs()}"
    counters = run.summary()["servers"]["ps/0"]["counters"]
    assert counters["env_steps"] >= 3000 and counters["ps/0/applied"] > 0, counters
    memory = run.summary()["servers"]["memory/0"]["counters"]
    assert memory["memory/0/inserts"] > 0 and memory["memory/0/samples"] > 0, memory
    files = [p for p in run.run_dir.rglob("*") if p.is_file()]
    assert run.config_path in files and any(p.suffix == ".log" for p in files)
    for path in [*files, run.out_path]:  # saved config, logs, checkpoints, metrics, output
        assert token not in path.read_bytes(), path
    _assert_no_processes_left(run.run_dir)


_SERVER = """
import sys, time
from easyrl.transport import rpc
server, port = rpc.make_server("127.0.0.1:0", "the-token")
server.start()
print(port, flush=True)
time.sleep(120)
"""


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_an_unauthenticated_call_is_refused_before_its_body_is_read():
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        before = _peak_rss_kb(server.pid)
        options = [("grpc.max_send_message_length", 1 << 30)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            insert = channel.unary_unary("/easyrl.v1.ReplayMemory/Insert")
            payload = b"x" * (200 << 20)  # 200 MiB, under the message limit, no token
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as info:
                    insert(payload, timeout=60)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        grown_mb = (_peak_rss_kb(server.pid) - before) / 1024
        # Reading the body first took the peak from ~50 MB to ~860 MB.
        assert grown_mb < 64, f"peak RSS grew {grown_mb:.0f} MB"
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize(("role", "method"), WRITES)
def test_a_message_over_the_limit_the_config_sizes_is_refused_unread(
    role_servers, served, role, method
):
    """The servers' message limit comes from the config, not a fixed 256 MiB: this small
    CartPole run's largest legitimate message is a few KB, so its shards take at most 4 MiB.
    An authenticated 6 MiB Push or Insert is refused with RESOURCE_EXHAUSTED before its
    handler runs (the client's error names the key that raises the limit), state unchanged."""
    if role == "ps":
        request = pb.PushRequest(
            version=served.ps.version,
            gradients=codec.encode_named({"q/w": np.zeros(6 << 18, np.float32)}),
        )
    else:
        request = insert_request(role_servers, served.memory.table.spec, 100, (6 << 20) // 48)
    assert request.ByteSize() > 6 << 20
    text = refused(role_servers, grpc.StatusCode.RESOURCE_EXHAUSTED, served, role, method, request)
    assert "security.max_message_mb" in text, text
    c = client(served, role)
    with pytest.raises(MessageTooLarge):
        c.call(method, request)
    c.close()


def test_the_message_limit_is_twice_the_largest_message_at_least_4_mib(role_servers):
    from easyrl.roles import memory as memory_role
    from easyrl.roles.common import RoleContext

    cfg = role_servers.config("trajectory")
    ctx = RoleContext(cfg=cfg, task=0, cluster=None, token=None, run_dir=Path("."))  # type: ignore[arg-type]
    assert ctx.message_limit(1_000) == 4 << 20
    assert ctx.message_limit(100 << 20) == 200 << 20
    assert ctx.message_limit(2 << 30) == rpc.UNLIMITED_MESSAGE_BYTES
    fixed = RoleContext(
        cfg=role_servers.config("trajectory", "security.max_message_mb=3"),
        task=0,
        cluster=None,  # type: ignore[arg-type]
        token=None,
        run_dir=Path("."),
    )
    assert fixed.message_limit(100 << 20) == 3 << 20
    # A memory shard's largest message: 2 envs x send_every 1 = 2 unrolls (also the batch of
    # 2); an unroll of 3 steps: obs 4x4 float32 (64 B) + action 3 int64 (24 B) + logits 3x2
    # float32 (24 B) + reward and discount 3 float32 each (24 B) = 136 B.
    spec = ctx.algorithm_spec().replay_spec(cfg.algorithm.params, *ctx.spaces())
    memory = memory_role.build(cfg, spec, 0)
    assert memory_role.largest_message(cfg, spec, memory) == 2 * 136
    memory.close()
    # A PS shard's: a lone learner publishes (Assign) and loads (Pull) values and Adam's two
    # slots of each: three times the values (a 84x84 Nature-CNN Breakout learner's state
    # load was refused with the values alone as the largest message).
    from easyrl.roles.ps import weight_bytes

    assert ctx.optimizer().kind == "adam"
    values = sum(v.numpy().nbytes for v in ctx.build_algorithm().variables.values())
    assert weight_bytes(ctx) == 3 * values
    pushing = RoleContext(  # several learners push gradients: no optimizer state travels
        cfg=role_servers.config("trajectory", "cluster.learner=2"),
        task=0,
        cluster=None,  # type: ignore[arg-type]
        token=None,
        run_dir=Path("."),
    )
    assert weight_bytes(pushing) == values
