"""The opt-in Prometheus endpoint of the server roles (`run.prometheus_port`).

Each PS and memory shard serves `/metrics` over plain HTTP on `run.prometheus_port` plus the
number of servers listed before it on the same host (PS shards, then memory shards): on a
laptop, where every shard shares 127.0.0.1, PS shard 0 takes the port itself and the others
the ports after it; on Kubernetes, where each pod has its own name, every shard takes the
port itself (the manifests annotate the server pods with it). A scrape reads the counters
a `Status` call returns (PS shard 0 holds the run's: env steps, updates, episodes, the mean
return, ...) as gauges named `easyrl_<counter>` with `role` and `task` labels:

    actor/0/env_steps  ->  easyrl_env_steps{role="actor",task="0"}
    env_steps          ->  easyrl_env_steps{role="run",task=""}     (the run's total)
    learner/pg_loss    ->  easyrl_pg_loss{role="learner",task=""}

plus `easyrl_up` (1), `easyrl_stopping` and, on PS shards, `easyrl_version`. The endpoint
binds the host of the shard's gRPC address and carries no token: it exposes counters only.
"""

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")
LABELS = ["role", "task"]


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


def split(key: str) -> tuple[str, list[str]]:
    """A counter key as (metric name, [role, task]) labels (see the module docstring)."""
    parts = key.split("/")
    if len(parts) >= 3 and parts[1].isdigit():
        role, task, name = parts[0], parts[1], "_".join(parts[2:])
    elif len(parts) >= 2:
        role, task, name = parts[0], "", "_".join(parts[1:])
    else:
        role, task, name = "run", "", key
    return "easyrl_" + _UNSAFE.sub("_", name), [role, task]


class StatusCollector:
    """Gauges from a server's `Status` reply, read at each scrape."""

    def __init__(self, status: Callable[[], Any]):
        self._status = status

    def collect(self) -> Iterator[Metric]:
        """One family per counter name (labelled by role and task), and the server's state."""
        reply = self._status()
        families: dict[str, GaugeMetricFamily] = {}
        for key, value in sorted(reply.counters.items()):
            name, labels = split(key)
            if name not in families:
                families[name] = GaugeMetricFamily(
                    name, f"easyrl counter {name[7:]}", labels=LABELS
                )
            families[name].add_metric(labels, value)
        state = [
            ("easyrl_up", 1.0, "1 while the server answers"),
            ("easyrl_stopping", float(reply.stopping), "1 once the run is stopping"),
        ]
        if reply.role == "ps":
            state.append(("easyrl_version", float(reply.version), "parameter version"))
        for name, value, text in state:
            family = families.setdefault(name, GaugeMetricFamily(name, text, labels=LABELS))
            family.add_metric([reply.role, str(reply.task)], value)
        yield from families.values()


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
