"""The opt-in Prometheus endpoint of the server roles (`run.prometheus_port`).

Each PS and memory shard serves `/metrics` over plain HTTP on `run.prometheus_port` plus the
number of servers listed before it on the same host (PS shards, then memory shards): on a
laptop, where every shard shares 127.0.0.1, PS shard 0 takes the port itself and the others
the ports after it; on Kubernetes, where each pod has its own name, every shard takes the
port itself (the manifests annotate the server pods with it). Actors, learners and the
evaluator serve nothing: they report to PS shard 0, whose page carries their numbers.

A scrape reads the counters a `Status` call returns (PS shard 0 holds the run's) and
exports each key by its shape, counters (`KNOWN`) as Prometheus counters named `..._total`,
everything else as gauges, with no empty label values and each series once:

    env_steps             ->  easyrl_run_env_steps_total               (the run's total)
    return_mean           ->  easyrl_run_return_mean
    actor/0/env_steps     ->  easyrl_env_steps_total{role="actor",task="0"}
    ps/1/version          ->  easyrl_version{role="ps",task="1"}
    learner/loss          ->  easyrl_learner_loss        (the last report of any learner)
    policy/p0/episodes    ->  easyrl_policy_episodes_total{policy="p0"}
    env_steps_per_s       ->  (not exported: a rate, Prometheus's `rate()` derives it)

plus `easyrl_up` (1) and `easyrl_stopping` with the server's `role` and `task`. A role's
stat without a task (`learner/loss`) is whatever the latest report of any process of that
role carried, so it is a gauge even where it counts. The endpoint binds the host of the
shard's gRPC address and carries no token: it exposes counters only.
"""

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")
_UNKNOWN = "not in easyrl's table of known metrics, so exported as a gauge"

Kind = Literal["counter", "gauge"]
COUNTER: Kind = "counter"
GAUGE: Kind = "gauge"

_RATE_LIMITED: dict[str, tuple[Kind, str]] = {
    f"rate_limited_{op}": (
        COUNTER,
        f"{op.replace('_', ' ').capitalize()} requests timed out waiting for the rate limiter",
    )
    for op in ("insert", "sample", "update", "snapshot")
}
KNOWN: dict[str, tuple[Kind, str]] = {
    # Reports (actors, learners, evaluator) and the run's totals of them.
    "env_steps": (COUNTER, "Environment steps taken"),
    "updates": (COUNTER, "Gradient updates made"),
    "episodes": (COUNTER, "Episodes finished"),
    "recorded_steps": (COUNTER, "Steps the actor's recorder wrote to disk (output:)"),
    "recent_episodes": (GAUGE, "Recent episodes the return means are taken over"),
    "return_mean": (GAUGE, "Mean return of recent episodes"),
    "return_max": (GAUGE, "Highest return of recent episodes"),
    "return_min": (GAUGE, "Lowest return of recent episodes"),
    "length_mean": (GAUGE, "Mean length in steps of recent episodes"),
    "eval_count": (COUNTER, "Evaluations finished"),
    "eval_return_mean": (GAUGE, "Mean return of the latest evaluation"),
    "eval_return_best": (GAUGE, "Best mean return of an evaluation so far"),
    "eval_episodes": (GAUGE, "Episodes of the latest evaluation"),
    "eval_at_env_steps": (GAUGE, "The run's env steps when the latest evaluation came"),
    "eval_ope_is": (GAUGE, "Off-policy estimate of the return: importance sampling"),
    "eval_ope_wis": (GAUGE, "Off-policy estimate of the return: weighted importance sampling"),
    "eval_ope_episodes": (GAUGE, "Logged episodes of the off-policy estimates"),
    # PS shards.
    "version": (GAUGE, "Parameter version of the shard: pushes applied, or publishes"),
    "round": (GAUGE, "Current synchronous round, 0 outside synchronous flows"),
    "pulls": (COUNTER, "Pulls of the parameters answered"),
    "pushes": (COUNTER, "Gradient pushes received"),
    "applied": (COUNTER, "Updates in the parameters: pushes applied, a lone learner's published"),
    "queued": (GAUGE, "Pushes accepted and not applied yet (the shard's apply queue)"),
    "dropped_ahead": (COUNTER, "Gradients dropped as computed for a version ahead"),
    "dropped_stale": (COUNTER, "Gradients dropped as older than algorithm.max_staleness"),
    "dropped_nonfinite": (COUNTER, "Gradients dropped for NaN or infinite values"),
    "staleness_sum": (COUNTER, "Staleness in versions summed over applied gradients"),
    # Memory shards.
    "size": (GAUGE, "Items in the replay table"),
    "ready_batches": (GAUGE, "Sampled batches waiting for a learner"),
    "snapshot_items": (GAUGE, "Items in the latest snapshot of the table"),
    "restored_items": (GAUGE, "Items restored from a snapshot at start"),
    "restored_inserted": (GAUGE, "Inserts the restored snapshot had acknowledged"),
    "inserts": (COUNTER, "Items inserted"),
    "inserted": (COUNTER, "Items ever stored in the table, restored snapshots' included"),
    "inserts_abandoned": (COUNTER, "Items of inserts whose caller's deadline had passed"),
    "duplicate_inserts": (COUNTER, "Items of resent inserts recognised and not stored again"),
    "samples": (COUNTER, "Items sampled"),
    "sample_batches": (COUNTER, "Batches sampled"),
    "shm_requests": (COUNTER, "Request bodies read from a same-host caller's shared memory"),
    "shm_replies": (COUNTER, "Replies whose body went into a same-host caller's shared memory"),
    "shm_refused": (COUNTER, "Reply bodies a caller's segment could not take (sent by gRPC)"),
    "priority_updates": (COUNTER, "Priorities updated"),
    "stale_priority_keys": (COUNTER, "Priority updates for items no longer in the table"),
    "refused_stale": (COUNTER, "Refused as of a past round: items (memory), inserts (actor)"),
    "rounds_released": (COUNTER, "Synchronous rounds handed to a learner"),
    "dropped_items": (COUNTER, "Items the round aggregator refused or dropped as of a past round"),
    "wal_records": (COUNTER, "Records written to the write-ahead log"),
    "wal_bytes": (COUNTER, "Bytes written to the write-ahead log"),
    "wal_syncs": (COUNTER, "fsyncs of the write-ahead log (one per group of records)"),
    "wal_replayed_items": (GAUGE, "Items replayed from the write-ahead log at start"),
    "wal_dropped_bytes": (GAUGE, "Bytes of a torn or corrupt log tail dropped at start"),
    "frames_stored": (COUNTER, "Distinct Atari frames stored"),
    "frames_matched": (COUNTER, "Atari frames matched to a stored one, not stored again"),
    "dropped_for_frames": (COUNTER, "Items dropped because their oldest frame was overwritten"),
    **_RATE_LIMITED,
    # Actors' and learners' own counts.
    "sent": (COUNTER, "Batches sent to the memory shards"),
    "rate_limited": (COUNTER, "Inserts refused by the rate limiter and sent again"),
    "abandoned_rounds": (COUNTER, "Synchronous rounds abandoned for a lost part"),
    "dropped_priority_updates": (COUNTER, "Priority updates dropped after their deadline"),
    "dropped_open_steps": (COUNTER, "Steps of open episodes the recorder dropped"),
    "unrolls": (COUNTER, "Unrolls completed"),
    "recording": (GAUGE, "1 while the actor records its steps (output:)"),
    # Learning and acting diagnostics.
    "loss": (GAUGE, "Loss of the latest update"),
    "policy_loss": (GAUGE, "Policy loss of the latest update"),
    "value_loss": (GAUGE, "Value loss of the latest update"),
    "baseline_loss": (GAUGE, "Baseline (value) loss of the latest update"),
    "actor_loss": (GAUGE, "Actor loss of the latest update"),
    "critic_loss": (GAUGE, "Critic loss of the latest update"),
    "q_loss": (GAUGE, "Q loss of the latest update"),
    "bc_loss": (GAUGE, "Behaviour-cloning loss of the latest update"),
    "entropy": (GAUGE, "Policy entropy in the latest update"),
    "approx_kl": (GAUGE, "Approximate KL divergence from the acting policy"),
    "clip_frac": (GAUGE, "Fraction of the probability ratios clipped"),
    "q_mean": (GAUGE, "Mean Q value of the latest batch"),
    "td_abs_mean": (GAUGE, "Mean absolute TD error of the latest batch"),
    "rho_mean": (GAUGE, "Mean importance ratio of the latest batch"),
    "value_mean": (GAUGE, "Mean value estimate of the latest batch"),
    "adv_norm": (GAUGE, "Moving average of the squared advantage norm"),
    "adv_sq_mean": (GAUGE, "Mean squared advantage of the latest batch"),
    "allowed_fraction": (GAUGE, "Fraction of actions the generative model allowed"),
    "alpha": (GAUGE, "Entropy temperature"),
    "reward_mean": (GAUGE, "Mean reward of the latest batch"),
    "grad_norm": (GAUGE, "Norm of the latest gradient"),
    "theta_norm": (GAUGE, "Norm of the parameters"),
    "pairs": (GAUGE, "Perturbation pairs of the latest round"),
    "updates_per_round": (GAUGE, "Gradient updates of the latest round"),
    "epsilon": (GAUGE, "Exploration rate (probability of a random action)"),
    "noise_scale": (GAUGE, "Scale of the exploration noise"),
    "random_actions": (GAUGE, "1 while actions are uniformly random (warm-up)"),
}
"""What each counter name is: its Prometheus type and help text."""


def host(address: str) -> str:
    """The host of a "host:port" address (brackets of an IPv6 literal removed)."""
    return address.rsplit(":", 1)[0].strip("[]")


def port(base: int | None, cluster, role: str, task: int) -> int | None:
    """The `/metrics` port of server `role`/`task` of `cluster` (None: the endpoint is off)."""
    if base is None:
        return None
    hosts = [host(a).lower() for a in (*cluster.ps, *cluster.memory)]  # as ClusterSpec compares
    index = task if role == "ps" else len(cluster.ps) + task
    return base + hosts[:index].count(hosts[index])


class Series(NamedTuple):
    """How one key of a `Status` reply is exported."""

    name: str
    """The metric family's name (a counter's samples add `_total`)."""
    kind: Kind
    help: str
    labels: dict[str, str]


def series(key: str) -> Series | None:
    """How the `Status` counter `key` is exported (see the module docstring); None for a
    derived rate (`*_per_s`), which Prometheus's `rate()` computes from the counter."""
    parts = [_UNSAFE.sub("_", part) for part in key.split("/")]
    if parts[-1].endswith("_per_s"):
        return None
    if len(parts) == 1:
        return _known(f"run_{parts[0]}", key, parts[0], "the whole run", {})
    role, sub, name = parts[0], parts[1], "_".join(parts[2:])
    if len(parts) >= 3 and role == "policy" and sub:
        return _known(f"policy_{name}", key, name, "per multi-agent policy", {"policy": sub})
    if len(parts) >= 3 and sub.isascii() and sub.isdigit():
        return _known(name, key, name, "per process", {"role": role, "task": sub})
    name = "_".join(parts[1:])  # a role's stat: the latest report of any of its processes
    if name in KNOWN:
        text = f"{KNOWN[name][1]}, as last reported by any {role}"
    else:
        text = f"Value of {key!r} as last reported by any {role} ({_UNKNOWN})"
    return Series(f"easyrl_{role}_{name}", GAUGE, text, {})


def _known(name: str, key: str, known: str, scope: str, labels: dict[str, str]) -> Series:
    """The series `easyrl_<name>` of `key`, typed and described by `KNOWN[known]`."""
    if known not in KNOWN:
        return Series(f"easyrl_{name}", GAUGE, f"Value of {key!r} ({_UNKNOWN})", labels)
    kind, text = KNOWN[known]
    return Series(f"easyrl_{name}", kind, f"{text} ({scope})", labels)


class _Families:
    """The metric families of one scrape. Each family has one type and one set of label
    names, no two families write the same sample name, and each series (name and label
    values) is added once: a series that would break this is refused."""

    def __init__(self):
        self._families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        self._labels: dict[str, tuple[str, ...]] = {}  # each family's label names
        self._samples: set[str] = set()  # the sample names the families write
        self._series: set[tuple[str, tuple[str, ...]]] = set()

    def add(self, s: Series, value: float) -> bool:
        """Adds `value` as series `s`; False when `s` clashes with one added before."""
        family, labels = self._families.get(s.name), tuple(s.labels)
        if family is None:
            family = self._new_family(s)
            if family is None:
                return False
        elif family.type != s.kind or self._labels[s.name] != labels:
            return False
        values = tuple(s.labels.values())
        if (s.name, values) in self._series:
            return False
        self._series.add((s.name, values))
        family.add_metric(values, value)
        return True

    def _new_family(self, s: Series) -> CounterMetricFamily | GaugeMetricFamily | None:
        """The family of `s`, or None when one before writes a sample name it would write
        (a counter writes `<name>_total` and may write `<name>_created`)."""
        if s.kind == COUNTER:
            names, make = {s.name, f"{s.name}_total", f"{s.name}_created"}, CounterMetricFamily
        else:
            names, make = {s.name}, GaugeMetricFamily
        if names & self._samples:
            return None
        self._samples |= names
        self._labels[s.name] = tuple(s.labels)
        family = self._families[s.name] = make(s.name, s.help, labels=list(s.labels))
        return family

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


class StatusCollector:
    """Counters and gauges from a server's `Status` reply, read at each scrape."""

    def __init__(self, status: Callable[[], Any]):
        self._status = status
        self._refused: set[str] = set()  # keys left out, each warned about once

    def collect(self) -> Iterator[Metric]:
        """The server's state (`easyrl_up`, `easyrl_stopping`), then each counter as
        `series` exports it."""
        reply = self._status()
        families = _Families()
        server = {"role": reply.role, "task": str(reply.task)}
        families.add(Series("easyrl_up", GAUGE, "1 while the server answers", server), 1.0)
        stopping = Series("easyrl_stopping", GAUGE, "1 once the run is stopping", server)
        families.add(stopping, float(reply.stopping))
        for key, value in sorted(reply.counters.items()):
            exported = series(key)
            if exported is not None and not families.add(exported, value):
                self._warn_once(key, exported.name)
        yield from families

    def _warn_once(self, key: str, name: str) -> None:
        """Logs (once per key) that `key` was left out for clashing with `name`."""
        if key not in self._refused:
            self._refused.add(key)
            log.warning("Prometheus: counter %r left out: it clashes with %s", key, name)


def serve(ctx, role: str, status: Callable[[], Any]):
    """Starts the `/metrics` endpoint of server `role`/`ctx.task` when `run.prometheus_port`
    is set (on the host of its gRPC address), reading `status()` at each scrape.

    Returns:
        The HTTP server (call `shutdown()` on it), or None when the endpoint is off.
    """
    at = port(ctx.cfg.run.prometheus_port, ctx.cluster, role, ctx.task)
    if at is None:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))  # pyright: ignore[reportArgumentType]
    bind = host(getattr(ctx.cluster, role)[ctx.task])
    server, _ = start_http_server(at, addr=bind, registry=registry)
    log.info("%s shard %d serves Prometheus metrics on %s:%d/metrics", role, ctx.task, bind, at)
    return server
