"""Multi-host test: every role in its own Linux network namespace, with its own address.

The `network` fixture builds a small private LAN on this machine: one namespace per role
process (ps-0, memory-0, learner-0, actor-0, actor-1), each with a veth pair whose other
end sits on a bridge, and an address 10.231.Y.k/24 on a subnet no route of this host
overlaps. The bridge lives in a namespace of its own, so the bridged traffic only meets
that namespace's netfilter tables (empty) and never the host's firewall; where
`br_netfilter` is loaded, its `bridge-nf-call-iptables` is turned off there too (that
sysctl is per namespace; it is skipped where it does not exist). This namespace (where
the test runs) has a port on the bridge as well, so the test reaches every role directly.
Everything is deleted afterwards, even when the test fails.

The cluster is started and stopped the bare-metal way, with the README's commands:
`scripts/launch_cluster.sh` with the role addresses as host lists and a token file, with
`SSH` set to a wrapper that "logs in" to a host by entering the namespace owning its
address (`ip netns exec NS bash -c CMD`); `launch_cluster.sh` runs `scripts/launch_role.sh`
there, which runs `easyrl run`. `scripts/stop_cluster.sh` (same wrapper) ends the run.
Every process of the run lives in a PID namespace of its own, so that stop_cluster.sh,
which signals every `easyrl run` process it can see on a host, cannot reach any other
process of this machine, and so that killing its PID 1 kills the whole run. The run
directory, the token file and the work directory are shared (one filesystem), as an NFS
mount would be across hosts.

Needs root, iproute2 and util-linux; skipped, with the reason, where network namespaces
cannot be created.
"""

import ipaddress
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_cluster import BASE_OVERRIDES, _cmdlines, _env, _processes_referencing

from easyrl.errors import TransportError
from easyrl.transport import easyrl_pb2 as pb
from easyrl.transport import rpc

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "cartpole_apex.yaml"

pytestmark = pytest.mark.cluster
PROCESSES = ("ps-0", "memory-0", "learner-0", "actor-0", "actor-1")
"""One namespace (one "host") per role process."""
PORT = 7000
"""The PS and the memory shard both listen on this port, each on its own address."""
UNSUPPORTED = ("Operation not permitted", "Permission denied", "not supported", "Unknown device")
"""`ip` errors that mean this machine cannot create namespaces, bridges or veth pairs."""
TOOLS = ("ip", "ss", "unshare", "nsenter")


# --- the network --------------------------------------------------------------------------


class _SetupError(Exception):
    """An `ip` command of the network set-up failed."""


def _ip(*args: str, ns: str | None = None) -> None:
    """Runs `ip [-n NS] ARGS...`; raises _SetupError with its message when it fails."""
    command = ["ip", *(["-n", ns] if ns else []), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise _SetupError(f"`{' '.join(command)}` failed: {result.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.231.0.0/16 that no route or address of this host overlaps."""
    routes = subprocess.run(
        ["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True, timeout=30
    ).stdout
    used = []
    for line in routes.splitlines():
        words = line.split()
        dest = words[1] if words[0] in ("local", "broadcast", "unreachable") else words[0]
        try:
            used.append(ipaddress.ip_network(dest, strict=False))  # "default": not a network
        except ValueError:
            continue
    for i in range(256):
        subnet = ipaddress.ip_network(f"10.231.{(os.getpid() + i) % 256}.0/24")
        if not any(subnet.overlaps(net) for net in used):
            return subnet
    raise _SetupError("no free /24 in 10.231.0.0/16")


@dataclass(frozen=True)
class Network:
    """The namespaces of one test and their addresses.

    Args:
        gateway: this namespace's address on the bridge.
        hosts: {process name: its address}.
        namespaces: {process name: its network namespace}.
    """

    gateway: str
    hosts: dict[str, str]
    namespaces: dict[str, str]


def _build_network(tag: str) -> Network:
    """Creates the bridge (in namespace `easyrl-TAG-switch`), one namespace per process with
    a veth pair to the bridge and an address on a free subnet, and this namespace's port."""
    subnet = _free_subnet()
    addresses = [str(a) for a in subnet.hosts()]
    switch, bridge = f"easyrl-{tag}-switch", f"erlbr{tag}"
    _ip("netns", "add", switch)
    _ip("link", "add", bridge, "type", "bridge", ns=switch)
    _ip("link", "set", bridge, "up", ns=switch)
    sysctl = "/proc/sys/net/bridge/bridge-nf-call-iptables"  # exists where br_netfilter is loaded
    subprocess.run(
        ["ip", "netns", "exec", switch, "sh", "-c", f"[ ! -e {sysctl} ] || echo 0 > {sysctl}"],
        check=True,
        timeout=30,
    )
    _ip("link", "add", f"erl{tag}gw", "type", "veth", "peer", "name", "gw", "netns", switch)
    _ip("link", "set", "gw", "master", bridge, "up", ns=switch)
    _ip("addr", "add", f"{addresses[0]}/24", "dev", f"erl{tag}gw")
    _ip("link", "set", f"erl{tag}gw", "up")
    hosts, namespaces = {}, {}
    for name, address in zip(PROCESSES, addresses[1:]):
        ns = f"easyrl-{tag}-{name}"
        _ip("netns", "add", ns)
        _ip("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", ns, ns=switch)
        _ip("link", "set", name, "master", bridge, "up", ns=switch)
        _ip("addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
        _ip("link", "set", "eth0", "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        hosts[name], namespaces[name] = address, ns
    return Network(gateway=addresses[0], hosts=hosts, namespaces=namespaces)


def _namespaces(tag: str) -> list[str]:
    """The network namespaces of this test that exist now."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(f"easyrl-{tag}-")]


def _delete_network(tag: str) -> None:
    """Deletes this test's port, namespaces (with the veth ends and the bridge in them)."""
    subprocess.run(["ip", "link", "del", f"erl{tag}gw"], capture_output=True, timeout=30)
    for ns in _namespaces(tag):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    left = _namespaces(tag)
    assert not left, f"network namespaces left behind: {left}"


@pytest.fixture
def network():
    """A private LAN of one namespace per process (see the module docstring); skips where
    namespaces cannot be created."""
    if os.geteuid() != 0:
        pytest.skip(f"creating network namespaces needs root (running as uid {os.geteuid()})")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"this test needs {', '.join(missing)} (iproute2, util-linux): not installed")
    tag = str(os.getpid())
    try:
        try:
            net = _build_network(tag)
        except _SetupError as err:
            if any(marker in str(err) for marker in UNSUPPORTED):
                pytest.skip(f"cannot create network namespaces here: {err}")
            raise
        yield net
    finally:
        _delete_network(tag)


def _listeners(ns: str) -> list[str]:
    """The local "host:port" of every TCP socket listening in namespace `ns` (an IPv6 socket
    bound to an IPv4-mapped address, as gRPC binds, shows as that IPv4 address)."""
    result = subprocess.run(
        ["ip", "netns", "exec", ns, "ss", "-Hltn"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    found = []
    for line in result.stdout.splitlines():
        host, port = line.split()[3].rsplit(":", 1)
        host = host.strip("[]").split("%")[0]
        if host != "*":  # "*": every address
            ip = ipaddress.ip_address(host)
            host = str(getattr(ip, "ipv4_mapped", None) or ip)
        found.append(f"{host}:{port}")
    return sorted(found)


# --- the cluster --------------------------------------------------------------------------


def _executable(path: Path, body: str) -> str:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return str(path)


def _role_processes(run_dir: Path) -> dict[str, int]:
    """{"ps-0": pid, ...} of the live `easyrl run` processes writing to `run_dir`."""
    found = {}
    for pid, argv in _cmdlines().items():
        if "--role" in argv and "--task" in argv and any(str(run_dir) in a for a in argv):
            role, task = argv[argv.index("--role") + 1], argv[argv.index("--task") + 1]
            found[f"{role}-{task}"] = pid
    return found


def _child(process: subprocess.Popen) -> int:
    """The pid of the (only) child of `process`, once it has one."""
    deadline = time.monotonic() + 10
    while process.poll() is None and time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == process.pid:
                return int(stat.parent.name)
        time.sleep(0.05)
    pytest.fail(f"{process.args} started no child (exit code {process.poll()})")


class BareMetalRun:
    """The "machines" of one cluster: the namespaces of `net`, a PID namespace of their own
    (so `scripts/stop_cluster.sh`, which signals every `easyrl run` of the user on each
    host, sees only this run's processes), and the shared files under `tmp_path`.

    Args:
        net: the namespaces ("hosts") to start the processes on.
        tmp_path: where the shared files go.
        overrides: `--set` overrides passed to every `easyrl run`.
    """

    def __init__(self, net: Network, tmp_path: Path, overrides):
        self.net = net
        self.run_dir = tmp_path / "run"
        self.workdir = tmp_path / "work"  # the repository's path on every "host"
        self.workdir.mkdir()
        (self.workdir / "scripts").symlink_to(ROOT / "scripts")
        self.token_file = tmp_path / "token"
        self.token_file.write_text(rpc.new_token() + "\n")
        self.token_file.chmod(0o600)
        cases = "".join(f"  {net.hosts[p]}) ns={net.namespaces[p]} ;;\n" for p in PROCESSES)
        ssh = _executable(
            tmp_path / "ssh",
            "# ssh HOST COMMAND: every host is a network namespace of this machine\n"
            f'case $1 in\n{cases}  *) echo "ssh: unknown host $1" >&2; exit 255 ;;\nesac\n'
            'exec ip netns exec "$ns" bash -c "$2"\n',
        )
        self.env = {**_env(), "SSH": ssh}
        h = net.hosts
        self.servers = {"ps": f"{h['ps-0']}:{PORT}", "memory": f"{h['memory-0']}:{PORT}"}
        self.hosts = [
            *("--ps_hosts", self.servers["ps"], "--memory_hosts", self.servers["memory"]),
            *("--learner_hosts", h["learner-0"]),
            *("--actor_hosts", f"{h['actor-0']},{h['actor-1']}"),
        ]
        self.extra = []
        for override in (*BASE_OVERRIDES, f"run.dir={self.run_dir}", *overrides):
            self.extra += ["--set", override]
        # PID 1 of the namespace; killing it kills every process of the run.
        self.init = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sleep", "infinity"],
            stdin=subprocess.DEVNULL,
        )
        self.init_pid = _child(self.init)
        seen = self.in_cluster("cat", "/proc/1/comm").stdout.strip()
        assert seen == "sleep", f"the PID namespace is not isolated: PID 1 is {seen!r}"
        self.launch_output = ""

    def in_cluster(self, *command: str) -> subprocess.CompletedProcess:
        """Runs `command` in the run's PID namespace (where every "host" runs)."""
        return subprocess.run(
            ["nsenter", "--target", str(self.init_pid), "--pid", "--mount", *command],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )

    def launch(self) -> subprocess.CompletedProcess:
        """Runs `scripts/launch_cluster.sh CONFIG HOSTS... --token_file F --workdir W -- ...`."""
        result = self.in_cluster(
            "bash",
            str(ROOT / "scripts" / "launch_cluster.sh"),
            str(CONFIG),
            *self.hosts,
            *("--token_file", str(self.token_file), "--workdir", str(self.workdir)),
            "--",
            *self.extra,
        )
        self.launch_output = result.stdout + result.stderr
        return result

    def stop(self) -> subprocess.CompletedProcess:
        """Runs `scripts/stop_cluster.sh HOSTS...` (SIGTERM to `easyrl run` on each host)."""
        return self.in_cluster("bash", str(ROOT / "scripts" / "stop_cluster.sh"), *self.hosts)

    def client(self, role: str) -> rpc.Client:
        """A client (no retries) for the PS or the memory shard ("ps" or "memory")."""
        token = self.token_file.read_text().strip()
        return rpc.Client(rpc.stub_class(role), self.servers[role], token, retry_s=0.0)

    def status(self, role: str) -> pb.StatusResponse | None:
        """The Status of the PS or the memory shard, or None when it does not answer."""
        client = self.client(role)
        try:
            return client.call("Status", pb.StatusRequest(), timeout_s=5.0)
        except TransportError:
            return None
        finally:
            client.close()

    def logs(self) -> str:
        """launch_cluster.sh's output and the tail of every role's log (for failures)."""
        parts = [f"--- launch_cluster.sh\n{self.launch_output}"]
        for log in sorted((self.workdir / "logs").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def poll_until(self, predicate, deadline: float, what: str):
        """Polls `predicate()` until it returns something truthy (returned); fails, showing
        the logs, when time.monotonic() passes `deadline`."""
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.25)
        pytest.fail(f"timed out waiting for {what}:\n{self.logs()}")

    def kill(self) -> None:
        """Kills every process of the run (PID 1 of its namespace, then any straggler)."""
        self.init.kill()
        self.init.wait()
        deadline = time.monotonic() + 10
        while _role_processes(self.run_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in _processes_referencing(str(self.run_dir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def bare_metal(network, tmp_path):
    """`bare_metal(*overrides)` prepares a cluster on the namespaces; every process of it is
    killed afterwards, before the namespaces are deleted."""
    if shutil.which("easyrl") is None:
        pytest.fail("`easyrl` is not on the PATH (pip install -e .): the scripts run it")
    runs = []

    def start(*overrides) -> BareMetalRun:
        run = BareMetalRun(network, tmp_path, overrides)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.kill()


# --- the test -----------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_apex_across_namespaces_moves_every_counter(network, bare_metal):
    budget = 2000
    run = bare_metal(f"stop.max_env_steps={budget}")
    start = time.monotonic()
    deadline = start + 80  # for the run, from the launch to the learner's exit
    launched = run.launch()
    assert launched.returncode == 0, run.logs()
    for name in PROCESSES:
        role, task = name.split("-")
        assert f"{role} {task} on {network.hosts[name]}, log:" in launched.stderr, run.logs()

    # Every process runs in the namespace owning its host's address.
    def all_started():
        found = _role_processes(run.run_dir)
        return found if len(found) == len(PROCESSES) else None

    pids = run.poll_until(all_started, deadline, "every role process")
    for name, pid in pids.items():
        want = os.stat(f"/run/netns/{network.namespaces[name]}").st_ino
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == want, name

    # The servers bind exactly their cluster address: not 0.0.0.0, not loopback.
    for role, address in run.servers.items():
        ns = network.namespaces[f"{role}-0"]
        assert run.poll_until(lambda ns=ns: _listeners(ns), deadline, role) == [address]
        assert run.status(role) is not None, f"{role} does not answer on {address}"

    # PS shard 0 stops the run at the budget; the workers see it and exit on their own
    # (actors too, though the rate limiter refuses their inserts once the learner is gone).
    def stopping():
        status = run.status("ps")
        return status if status is not None and status.stopping else None

    reason = run.poll_until(stopping, deadline, "the stop condition").stop_reason
    assert "max_env_steps" in reason, f"{reason}\n{run.logs()}"
    workers = {"learner-0", "actor-0", "actor-1"}
    run.poll_until(
        lambda: not workers & set(_role_processes(run.run_dir)), deadline, "the workers to exit"
    )

    # Every counter moved: actors stepped and inserted, the learner sampled, trained and
    # published its updates (the run's only learner applies them itself: nothing is
    # pushed), the PS counted them and served pulls.
    ps = run.status("ps").counters
    assert ps["env_steps"] >= budget, ps
    assert ps["actor/0/env_steps"] > 0 and ps["actor/1/env_steps"] > 0, ps
    assert ps["actor/0/env_steps"] + ps["actor/1/env_steps"] == ps["env_steps"], ps
    assert ps["episodes"] > 0, ps
    assert ps["updates"] > 0 and ps["learner/0/updates"] > 0, ps
    assert ps["ps/0/pushes"] == 0 and ps["ps/0/applied"] > 0 and ps["ps/0/version"] > 1, ps
    assert ps["ps/0/pulls"] > 0, ps
    memory = run.status("memory").counters
    assert memory["memory/0/inserts"] > 0 and memory["memory/0/samples"] > 0, memory
    assert memory["memory/0/priority_updates"] > 0, memory
    assert (run.run_dir / "metrics.jsonl").stat().st_size > 0

    # scripts/stop_cluster.sh ends the run: every role exits, the servers save what they own.
    sent = time.time()
    stopped = run.stop()
    assert stopped.returncode == 0, f"{stopped.stdout}{stopped.stderr}"
    assert "stopped easyrl processes" in stopped.stdout, stopped.stdout
    exited = time.monotonic() + 10  # what a role gets to save and exit after SIGTERM
    run.poll_until(lambda: not _role_processes(run.run_dir), exited, "every role to exit")
    for name in ("ps-0", "memory-0"):
        checkpoint = run.run_dir / "checkpoints" / f"{name}.npz"
        assert checkpoint.exists() and checkpoint.stat().st_mtime >= sent - 0.01, name
    log = (run.workdir / "logs" / "ps-0.log").read_text()
    assert f"PS shard 0 listening on {run.servers['ps']}" in log, log
