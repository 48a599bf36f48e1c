"""What every role process shares: its context, clients to its peers, signals, weights."""

import contextlib
import gc
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, overload

import numpy as np

from easyrl.algorithms import registry
from easyrl.algorithms.contract import Agent, AlgorithmSpec
from easyrl.cluster.spec import ClusterSpec, assign_shards
from easyrl.cluster.threads import pools, process_budget
from easyrl.config import Config
from easyrl.envs.multiagent import run_spaces
from easyrl.errors import TransportError
from easyrl.transport import rpc
from easyrl.transport.clients import (
    MemoryClient,
    ParameterClient,
    Pulled,
    Pushed,
    ShardClient,
    connect,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoleContext:
    """Everything a role process is started with.

    Args:
        cfg: the run's config.
        task: this process's index within its role.
        cluster: where the servers are and how many workers there are.
        token: the shared auth token (None only with `security.insecure`).
        run_dir: where checkpoints and logs go.
    """

    cfg: Config
    task: int
    cluster: ClusterSpec
    token: str | None
    run_dir: Path
    opened: list = field(default_factory=list, compare=False, repr=False)
    """The clients `client` made (`close_clients` closes them when the role ends)."""

    @overload
    def client(self, role: Literal["ps"], index: int) -> ParameterClient: ...
    @overload
    def client(self, role: Literal["memory"], index: int) -> MemoryClient: ...
    def client(self, role, index):
        """A client for server `index` of `role` ("ps" or "memory")."""
        address, timeout_s = getattr(self.cluster, role)[index], self.cfg.run.rpc_timeout_s
        shared = self.cfg.cluster.shared_memory
        client = connect(
            role, address, self.token, self.cfg.security, shared_memory=shared, timeout_s=timeout_s
        )
        self.opened.append(client)
        return client

    def close_clients(self) -> None:
        """Closes every client `client` made (their channels, and their shared-memory
        segments: unlinked by their owner, not left to the resource tracker's warning)."""
        for client in self.opened:
            client.close()
        self.opened.clear()

    @overload
    def clients(self, role: Literal["ps"]) -> list[ParameterClient]: ...
    @overload
    def clients(self, role: Literal["memory"]) -> list[MemoryClient]: ...
    def clients(self, role):
        """Clients for every server of `role`."""
        return [self.client(role, i) for i in range(len(getattr(self.cluster, role)))]

    def wait_for_peers(self, clients: Sequence[ShardClient], stop: threading.Event) -> bool:
        """Blocks until every server of `clients` answers the health check SERVING (a worker
        may start before its servers, e.g. all pods of a Kubernetes run at once).

        Returns:
            False if `stop` was set first, else True.

        Raises:
            TransportError: some are still not serving after `run.peer_timeout_s`; the
                message names their addresses.
        """
        timeout_s = self.cfg.run.peer_timeout_s
        deadline = time.monotonic() + timeout_s
        waiting = list(clients)
        log.info("waiting up to %g s for %d peer(s) to serve", timeout_s, len(waiting))
        while not stop.is_set():
            left = deadline - time.monotonic()
            waiting = [c for c in waiting if not c.serving(min(1.0, max(left, 0.1)))]
            if not waiting:
                return True
            if time.monotonic() >= deadline:
                addresses = ", ".join(c.address for c in waiting)
                raise TransportError(
                    f"peers unreachable or not serving after {timeout_s:g} s "
                    f"(run.peer_timeout_s): {addresses}"
                )
            stop.wait(min(0.5, max(left, 0.0)))
        return False

    def message_limit(self, largest_bytes: int) -> int:
        """A server's message limit: `security.max_message_mb` when set, else the largest
        legitimate message it takes or sends (`largest_bytes`) x 2, at least 4 MiB."""
        if self.cfg.security.max_message_mb is not None:
            return self.cfg.security.max_message_mb << 20
        return min(max(2 * largest_bytes, 4 << 20), rpc.UNLIMITED_MESSAGE_BYTES)

    def tls(self) -> rpc.TLSFiles | None:
        """The server's TLS files from the config's `security` section, or None."""
        sec = self.cfg.security
        if not sec.tls_cert or not sec.tls_key:  # both or neither (the config checks)
            return None
        return rpc.TLSFiles(cert=sec.tls_cert, key=sec.tls_key, ca=sec.tls_ca)

    def spaces(self):
        """(observation space, action space) of one environment (of one agent of a
        multi-agent env).

        Raises:
            ConfigError: the observations carry an action mask the algorithm cannot honour.
        """
        obs_space, action_space = run_spaces(self.cfg)
        registry.check_spaces(self.cfg.algorithm.name, self.cfg.env.id, obs_space)
        return obs_space, action_space

    def algorithm_spec(self) -> AlgorithmSpec:
        """The spec of the configured algorithm (from the registry)."""
        return registry.spec(self.cfg.algorithm.name)

    def optimizer(self):
        """The PS optimizer: the algorithm's (an `OptimizerSpec`, or {prefix: spec}); a
        multi-agent run's has one group per policy (`easyrl.algorithms.multiagent`)."""
        spec = self.algorithm_spec()
        if self.cfg.multiagent.enabled:
            from easyrl.algorithms import multiagent

            return multiagent.optimizer(self.cfg, spec)
        return spec.optimizer(self.cfg.algorithm.params)

    def build_algorithm(self, learner: bool = False) -> Agent:
        """Builds the algorithm's TF side (networks, act, loss) for this run; `learner` lets
        an algorithm spread its updates over several GPUs."""
        obs_space, action_space = self.spaces()
        spec = self.algorithm_spec()
        cfg = self.cfg
        if cfg.multiagent.enabled:  # one agent per policy, wrapped as one
            from easyrl.algorithms import multiagent

            return multiagent.build(cfg, spec, obs_space, action_space, learner)
        return spec.make(
            cfg.algorithm.params, obs_space, action_space, cfg.model, cfg.run.seed, learner
        )


def settle_heap() -> None:
    """Puts every object alive now out of the garbage collector's sight (`gc.freeze`), once
    a role's loop is running: what a process builds at start (TensorFlow's modules, the
    traced functions, the networks) lives as long as it does, yet each full collection
    walked all of it, holding the GIL: 7-10 % of a SAC learner's CPU (issue 45, perf)."""
    gc.collect()
    gc.freeze()


def limit_tf_threads(threads: int) -> tuple[int, int]:
    """Sizes this process's TensorFlow pools to a budget of `threads` (see
    `easyrl.cluster.threads.pools`); returns the (intra-op, inter-op) threads TensorFlow
    then reports. Call it before TensorFlow runs anything: the pools are fixed from then on."""
    import tensorflow as tf

    intra, inter = pools(threads)
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    t = tf.config.threading
    return t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads()


def apply_thread_budget(role: str, cfg: Config) -> None:
    """Gives this process, of role `role`, its thread budget (`process_budget`) and logs it;
    before TensorFlow runs anything. A memory shard, which never imports TensorFlow, only
    logs it."""
    threads, source = process_budget(role, cfg.cluster.threads)
    if role == "memory":
        log.info("thread budget %d (%s); no TensorFlow", threads, source)
        return
    intra, inter = limit_tf_threads(threads)
    log.info(
        "thread budget %d (%s): TensorFlow intra-op %d, inter-op %d threads",
        threads,
        source,
        intra,
        inter,
    )


class StopSignal(threading.Event):
    """Set when a role must stop; `error` says why when it stops because of a failure
    (then the process exits non-zero and the launcher restarts it)."""

    error: str | None = None

    def fail(self, error: str) -> None:
        """Stops because of `error`."""
        self.error = error
        self.set()


def stop_event_on_signals() -> StopSignal:
    """Returns a stop signal set by SIGTERM or SIGINT (the launcher's and Kubernetes' way
    to ask a role to finish cleanly)."""
    event = StopSignal()

    def handler(signum, frame):
        log.info("received signal %d, stopping", signum)
        rpc.STOPPING.set()  # no more waiting for peers that are gone
        event.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return event


def guarded(target: Callable[[], None], stop: StopSignal) -> None:
    """Runs a communication thread's body (a function, or a `functools.partial` of one); a
    transport failure that outlived its retries stops the whole role, which then exits
    non-zero (unless it was stopping anyway)."""
    try:
        target()
    except TransportError as err:
        if not stop.is_set():
            log.error("%s: %s", getattr(target, "func", target).__name__, err)
            stop.fail(str(err))


@contextlib.contextmanager
def threads_running(stop: StopSignal, *bodies: Callable[[], None]) -> Iterator[None]:
    """Runs each of `bodies` on a guarded daemon thread while the block runs; on leaving it,
    sets `stop` and joins them (5 s each)."""
    threads = [threading.Thread(target=guarded, args=(b, stop), daemon=True) for b in bodies]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)


def put_until_stopped(q: queue.Queue, item, stop: threading.Event) -> bool:
    """Puts `item` on a bounded queue, waiting while it is full (back-pressure);
    returns False if `stop` was set meanwhile."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


class ShardedWeights:
    """A worker's view of the PS shards: which variable lives where, and its newest values.

    A communication thread calls `fetch()` to pull every shard whose version moved
    into a "latest" slot; the main loop calls `swap_in()` between steps to assign
    them to the local variables. `local_versions` are the shard versions the local
    values came from (what gradients are computed against).

    Args:
        clients: one client per PS shard.
        variables: {name: tf.Variable} of the local network (all roles agree on names).
    """

    def __init__(self, clients: list[ParameterClient], variables: Mapping):
        self.clients = clients
        self.variables = variables
        sizes = [(name, int(np.prod(v.shape)) * v.dtype.size) for name, v in variables.items()]
        self.assignment = assign_shards(sizes, len(clients))
        self.shard_names = [
            sorted(n for n, s in self.assignment.items() if s == shard)
            for shard in range(len(clients))
        ]
        from easyrl.models.flat import FlatVariables

        self._flat = [FlatVariables([variables[n] for n in names]) for names in self.shard_names]
        self.fetched_versions = [-1] * len(clients)
        self.round = 0
        """The newest weight round every shard has published (synchronous rounds)."""
        self.local_versions = [-1] * len(clients)
        self._latest: dict[int, tuple[int, np.ndarray]] = {}  # shard -> (version, flat values)
        self._lock = threading.Lock()
        # Every shard is pulled at once: a fetch costs one round trip, not one per shard.
        self._pulls = ThreadPoolExecutor(len(clients), "pull") if len(clients) > 1 else None

    def initialize(self) -> bool:
        """Chief only: assigns the local initial values to every shard that is still empty.

        Returns:
            Whether any shard was initialized by this call.
        """
        assigned = False
        for client, names in zip(self.clients, self.shard_names, strict=True):
            values = {n: self.variables[n].numpy() for n in names}
            assigned |= client.assign(values, only_if_empty=True) > 0
        return assigned

    def fetch(self, min_round: int = 0, wait_s: float = 0.0) -> bool:
        """Pulls every shard whose version moved into the latest slot.

        Args:
            min_round: synchronous rounds: each shard waits up to `wait_s` seconds until it
                has published at least this round before answering.
            wait_s: the longest a shard waits for `min_round`.

        Returns:
            False when some shard is not initialized yet, else True.
        """

        def pull(shard: int) -> Pulled:
            return self.clients[shard].pull(self.fetched_versions[shard], min_round, wait_s)

        shards = range(len(self.clients))
        replies = list(self._pulls.map(pull, shards)) if self._pulls else [pull(0)]
        if any(reply.version == 0 for reply in replies):
            return False
        changed, rounds = {}, []
        for shard, reply in enumerate(replies):
            rounds.append(reply.round)
            if reply.version < self.fetched_versions[shard]:
                # The shard went back: it was restarted from its newest checkpoint. Its
                # values are the truth now, older version number or not.
                log.warning("PS shard %d went back to version %d", shard, reply.version)
                with self._lock:
                    self.fetched_versions[shard] = -1
            if reply.values is not None:
                changed[shard] = (reply.version, reply.values)
        for shard, (version, values) in changed.items():
            self.offer(shard, version, values)
        self.round = min(rounds)
        return True

    def wait_round(self, min_round: int, stop: threading.Event, on_wait=None) -> bool:
        """Blocks (long-polling the shards) until every shard has published `min_round`,
        then loads its values.

        Args:
            min_round: the round to wait for.
            stop: returns False as soon as it is set.
            on_wait: called after every unsuccessful wait of about a second (e.g. to report).
        """
        while not stop.is_set():
            if self.fetch(min_round, wait_s=1.0) and self.round >= min_round:
                self.swap_in()
                return True
            if on_wait is not None:
                on_wait()
        return False

    def push(
        self,
        grads: dict,
        versions: list[int],
        sender: int,
        pool,
        counters: dict,
        wait: bool = False,
    ) -> None:
        """Pushes `grads` ({name: array}) to the PS shards holding those variables, in
        parallel, each computed against its shard's version in `versions`; offers the values
        the shards return (their newest applied ones). `grads` may leave out whole optimizer
        groups (an update of the critic only). A dropped push (stale, non-finite) is counted
        in `counters` and the newest values are pulled.

        Args:
            sender: the pushing worker's index (for the PS's logs).
            pool: an executor with a thread per shard.
            wait: the shards answer once they applied the push (the values returned include
                it), not as soon as they accepted it.
        """

        shards = [s for s, names in enumerate(self.shard_names) if any(n in grads for n in names)]

        def push_one(shard: int) -> Pushed:
            mine = {n: grads[n] for n in self.shard_names[shard] if n in grads}
            return self.clients[shard].push(versions[shard], mine, sender, wait=wait)

        replies = list(pool.map(push_one, shards))
        for shard, reply in zip(shards, replies, strict=True):
            if reply.accepted and reply.values:  # none: the pusher's version is the newest
                self.offer(shard, reply.version, reply.values)
            elif reply.reason == "stale":
                counters["dropped_stale"] += 1
            elif reply.reason == "non-finite":
                counters["dropped_nonfinite"] += 1
        if not all(reply.accepted for reply in replies):
            self.fetch()

    def by_name(self, grads: Sequence) -> dict:
        """One update's gradients, given in the order of `variables`, as {name: gradient};
        a None (a variable this update leaves alone, e.g. TD3's actor between its updates)
        is left out."""
        return {n: g for n, g in zip(self.variables, grads, strict=True) if g is not None}

    def push_and_swap_in(self, grads: Sequence, sender: int, pool, counters: dict) -> None:
        """Pushes one update computed against the local values (`grads` in the order of
        `variables`), waits until the shards applied it, then swaps in the values they
        return: the next update starts from them (synchronous use: PPO/ES rounds, A3C
        actors)."""
        versions = list(self.local_versions)
        self.push(self.by_name(grads), versions, sender, pool, counters, wait=True)
        self.swap_in()

    def assign_local(self, names: list[str]) -> None:
        """Writes the local values of the shards holding `names` to the PS (state the
        learner changed outside gradients, e.g. observation statistics)."""
        for shard in sorted({self.assignment[n] for n in names}):
            values = {n: self.variables[n].numpy() for n in self.shard_names[shard]}
            version = self.clients[shard].assign(values)
            with self._lock:
                self.fetched_versions[shard] = max(self.fetched_versions[shard], version)
                self.local_versions[shard] = version

    def offer(self, shard: int, version: int, values: dict[str, np.ndarray]) -> None:
        """Puts values of `shard` at `version` (from a Pull or a Push reply) in the latest
        slot, unless a newer version is already there (several threads may fetch)."""
        if sorted(values) != self.shard_names[shard]:
            raise TransportError(f"PS shard {shard} holds unexpected variables")
        if version <= self.fetched_versions[shard]:
            return  # checked again below; this spares the copy
        # Flattened here, in the communication thread, so swap_in is one assign call.
        flat = self._flat[shard].concat([values[n] for n in self.shard_names[shard]])
        with self._lock:
            if version > self.fetched_versions[shard]:
                self._latest[shard] = (version, flat)
                self.fetched_versions[shard] = version

    def swap_in(self) -> None:
        """Assigns the newest fetched values to the local variables."""
        with self._lock:
            latest, self._latest = self._latest, {}
        for shard, (version, flat) in latest.items():
            self._flat[shard].assign(flat)
            self.local_versions[shard] = version

    def wait_initialized(
        self, stop: threading.Event, timeout_s: float | None = None, poll_s: float = 0.2
    ) -> bool:
        """Blocks until every shard holds values and loads them; False if `stop` was set.

        Raises:
            TransportError: the shards hold no values after `timeout_s` (None: wait on).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not stop.is_set():
            if self.fetch():
                self.swap_in()
                return True
            if deadline is not None and time.monotonic() >= deadline:
                addresses = ", ".join(c.address for c in self.clients)
                raise TransportError(
                    f"the PS shards ({addresses}) hold no weights after {timeout_s:g} s "
                    "(run.peer_timeout_s): is the chief (learner 0, or actor 0 when there is "
                    "no learner) running?"
                )
            stop.wait(poll_s)
        return False
