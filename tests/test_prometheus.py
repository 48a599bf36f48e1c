"""The Prometheus endpoint (`easyrl.metrics.prometheus`): ports, how each `Status` counter
is exported, and pages that Prometheus's own rules accept, checked with `prometheus_client`'s
text parser on a fixed `Status` reply and on live scrapes of every server of a real run."""

import logging
import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_cluster import _free_port

from easyrl.metrics import prometheus
from easyrl.transport import easyrl_pb2 as pb

# What PS shard 0 and a memory shard of a real Ape-X CartPole run returned from `Status`
# (1 actor, 1 learner), plus the shapes that run lacks: a multi-agent policy, an evaluation,
# an algorithm stat with a dot, a key the table does not know.
PS0 = {
    "env_steps": 136512.0,
    "updates": 4260.0,
    "episodes": 1375.0,
    "env_steps_per_s": 2820.4,
    "updates_per_s": 113.6,
    "recent_episodes": 100.0,
    "return_mean": 373.37,
    "return_max": 500.0,
    "length_mean": 373.37,
    "eval_count": 2.0,
    "eval_return_mean": 412.5,
    "actor/0/env_steps": 136000.0,
    "actor/0/episodes": 1375.0,
    "actor/0/updates": 0.0,
    "actor/0/recorded_steps": 4096.0,
    "learner/0/env_steps": 512.0,
    "learner/0/episodes": 0.0,
    "learner/0/updates": 4260.0,
    "actor/epsilon": 0.05,
    "actor/sent": 527.0,
    "actor/dropped_stale": 0.0,
    "learner/loss": 0.433,
    "learner/q_mean": 62.9,
    "learner/dropped_stale": 0.0,
    "learner/p0.loss": 0.5,
    "learner/mystery": 1.0,
    "policy/p0/episodes": 700.0,
    "policy/p0/return_mean": 20.5,
    "ps/0/applied": 4261.0,
    "ps/0/dropped_stale": 0.0,
    "ps/0/pulls": 858.0,
    "ps/0/pushes": 4261.0,
    "ps/0/round": 0.0,
    "ps/0/staleness_sum": 8623.0,
    "ps/0/version": 4262.0,
}
MEMORY0 = {
    "memory/0/inserts": 145569.0,
    "memory/0/inserted": 145569.0,
    "memory/0/samples": 2305536.0,
    "memory/0/sample_batches": 4503.0,
    "memory/0/priority_updates": 2295556.0,
    "memory/0/size": 50000.0,
    "memory/0/ready_batches": 1.0,
    "memory/0/rate_limited_insert": 3.0,
}
COUNTERS = {"env_steps", "episodes", "updates", "pushes", "pulls", "inserts", "samples"}
"""Names the issue found typed gauge: each must be a Prometheus counter."""


def page(counters: dict, role: str = "ps", task: int = 0, stopping: bool = False) -> str:
    """The `/metrics` page of a server whose `Status` returns `counters`."""
    reply = pb.StatusResponse(role=role, task=task, stopping=stopping, counters=counters)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(prometheus.StatusCollector(lambda: reply))  # pyright: ignore[reportArgumentType]
    return generate_latest(registry).decode()


def parse_strictly(text: str) -> dict[str, tuple[str, str, dict[str, float]]]:
    """`{family: (type, help, {series: value})}` of a text-format page, failing on what
    Prometheus rejects or its naming rules forbid: a family declared twice, a series twice,
    an empty label value, a counter sample not named `<family>_total`, a gauge sample not
    named as its family, a type other than counter or gauge, no help, a derived rate."""
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), f"a family declared twice: {sorted(types)}"
    out, seen = {}, set()
    for family in text_string_to_metric_families(text):
        assert family.name not in out, f"family {family.name} twice"
        assert family.type in ("counter", "gauge"), (family.name, family.type)
        assert family.documentation, f"{family.name} has no help"
        assert "_per_s" not in family.name, f"a derived rate: {family.name}"
        suffix = "_total" if family.type == "counter" else ""
        series = {}
        for sample in family.samples:
            assert sample.name == family.name + suffix, (family.type, sample.name)
            assert all(sample.labels.values()), f"an empty label value: {sample}"
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            assert key not in seen, f"series {key} twice"
            seen.add(key)
            series[key] = sample.value
        out[family.name] = (family.type, family.documentation, series)
    return out


def value(families: dict, series: str, default: float | None = None) -> float:
    """The value of `series` (`name` or `name{a="x",b="y"}`, labels sorted) on a page
    parsed by `parse_strictly`; `default` where it is missing (None: fail)."""
    for _, _, values in families.values():
        if series in values:
            return values[series]
    assert default is not None, f"{series} not on the page: {sorted(families)}"
    return default


# --- unit tests ------------------------------------------------------------------------


def test_ports_one_machine_and_one_pod_per_shard():
    from easyrl.cluster.spec import ClusterSpec

    # One machine: each server takes the next port; one pod per shard: the port itself.
    # Hosts compare case-insensitively, as ClusterSpec does ("H0" and "h0" are one machine).
    layout = [("ps", 0), ("ps", 1), ("memory", 0)]
    local = ClusterSpec(("127.0.0.1:1", "127.0.0.1:2"), ("127.0.0.1:3",), 1, 1)
    pods = ClusterSpec(("ps-0.x:7000", "ps-1.x:7000"), ("m-0.x:7100", "M-0.X:7101"), 1, 1)
    assert [prometheus.port(9100, local, r, t) for r, t in layout] == [9100, 9101, 9102]
    assert [prometheus.port(9100, pods, r, t) for r, t in [*layout, ("memory", 1)]] == [
        9100,
        9100,
        9100,
        9101,
    ]
    assert prometheus.port(None, local, "ps", 0) is None


@pytest.mark.parametrize(
    "key, name, kind, labels",
    [
        ("env_steps", "easyrl_run_env_steps", "counter", {}),
        ("return_mean", "easyrl_run_return_mean", "gauge", {}),
        ("actor/3/env_steps", "easyrl_env_steps", "counter", {"role": "actor", "task": "3"}),
        ("memory/1/size", "easyrl_size", "gauge", {"role": "memory", "task": "1"}),
        ("ps/0/version", "easyrl_version", "gauge", {"role": "ps", "task": "0"}),
        (
            "actor/2/recorded_steps",
            "easyrl_recorded_steps",
            "counter",
            {"role": "actor", "task": "2"},
        ),
        ("learner/loss", "easyrl_learner_loss", "gauge", {}),
        ("actor/sent", "easyrl_actor_sent", "gauge", {}),  # whichever actor reported last
        ("learner/p0.loss", "easyrl_learner_p0_loss", "gauge", {}),
        ("policy/p0/episodes", "easyrl_policy_episodes", "counter", {"policy": "p0"}),
        ("policy/p0/length_mean", "easyrl_policy_length_mean", "gauge", {"policy": "p0"}),
        ("mystery", "easyrl_run_mystery", "gauge", {}),
    ],
)
def test_each_key_shape_is_exported_as_one_named_typed_series(key, name, kind, labels):
    exported = prometheus.series(key)
    assert exported is not None
    assert (exported.name, exported.kind, exported.labels) == (name, kind, labels)


@pytest.mark.parametrize("key", ["env_steps_per_s", "updates_per_s", "learner/0/x_per_s"])
def test_derived_rates_are_left_to_prometheus(key):
    assert prometheus.series(key) is None


def test_a_status_reply_gives_a_page_prometheus_accepts():
    ps0 = parse_strictly(page(PS0))
    memory = parse_strictly(page(MEMORY0, "memory", 0, stopping=True))
    for name in COUNTERS:
        on = ps0 if name in {"env_steps", "episodes", "updates", "pushes", "pulls"} else memory
        assert on[f"easyrl_{name}"][0] == "counter", name
    # The run's totals are a metric of their own: a sum over the per-process series does not
    # count them twice, and it matches the total.
    assert value(ps0, "easyrl_run_env_steps_total") == 136512.0
    per_process = ps0["easyrl_env_steps"][2].values()
    assert sum(per_process) == value(ps0, "easyrl_run_env_steps_total")
    assert value(ps0, 'easyrl_env_steps_total{role="actor",task="0"}') == 136000.0
    assert value(ps0, 'easyrl_updates_total{role="learner",task="0"}') == 4260.0
    assert value(ps0, 'easyrl_version{role="ps",task="0"}') == 4262.0  # once: from the counter
    assert value(ps0, 'easyrl_up{role="ps",task="0"}') == 1.0
    assert value(ps0, 'easyrl_stopping{role="ps",task="0"}') == 0.0
    assert value(ps0, "easyrl_run_eval_count_total") == 2.0
    assert value(ps0, 'easyrl_policy_episodes_total{policy="p0"}') == 700.0
    assert value(ps0, "easyrl_learner_loss") == pytest.approx(0.433)
    assert value(ps0, "easyrl_actor_epsilon") == 0.05
    assert value(memory, 'easyrl_inserts_total{role="memory",task="0"}') == 145569.0
    assert value(memory, 'easyrl_rate_limited_insert_total{role="memory",task="0"}') == 3.0
    assert value(memory, 'easyrl_stopping{role="memory",task="0"}') == 1.0
    assert memory["easyrl_size"][0] == "gauge"


def test_help_says_what_each_metric_is():
    families = parse_strictly(page(PS0))
    help_of = {name: text for name, (_, text, _) in families.items()}
    assert (
        help_of["easyrl_learner_loss"]
        == "Loss of the latest update, as last reported by any learner"
    )
    assert help_of["easyrl_actor_epsilon"].startswith("Exploration rate")
    assert help_of["easyrl_env_steps"] == "Environment steps taken (per process)"
    assert help_of["easyrl_run_env_steps"] == "Environment steps taken (the whole run)"
    assert "counter" not in help_of["easyrl_learner_loss"] + help_of["easyrl_actor_epsilon"]
    # A key the table does not know gets a help that says only what is known of it.
    assert help_of["easyrl_learner_mystery"] == (
        "Value of 'learner/mystery' as last reported by any learner (not in easyrl's table "
        "of known metrics, so exported as a gauge)"
    )
    generic = {name for name, text in help_of.items() if "not in easyrl's table" in text}
    assert generic == {"easyrl_learner_mystery", "easyrl_learner_p0_loss"}


def test_keys_that_would_repeat_a_series_are_left_out_once_with_a_warning(caplog):
    clashing = {
        "learner/pg.loss": 1.0,  # both become easyrl_learner_pg_loss: the first (sorted) stays
        "learner/pg_loss": 2.0,
        "ps/0/up": 5.0,  # the server's own easyrl_up{role="ps",task="0"} stays
        "foo": 3.0,  # easyrl_run_foo ...
        "foo_per_s": 1.0,
        "env_steps": 7.0,  # easyrl_run_env_steps_total, a counter's sample ...
        "env_steps_total": 8.0,  # ... that the gauge easyrl_run_env_steps_total would repeat
    }
    reply = pb.StatusResponse(role="ps", task=0, counters=clashing)
    collector = prometheus.StatusCollector(lambda: reply)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # pyright: ignore[reportArgumentType]
    with caplog.at_level(logging.WARNING, logger=prometheus.__name__):
        texts = [generate_latest(registry).decode() for _ in range(2)]
    families = parse_strictly(texts[0])
    assert texts[0] == texts[1]
    assert value(families, "easyrl_learner_pg_loss") == 1.0
    assert value(families, 'easyrl_up{role="ps",task="0"}') == 1.0
    assert value(families, "easyrl_run_env_steps_total") == 7.0
    assert value(families, "easyrl_run_foo") == 3.0
    left_out = sorted(r.getMessage().split("'")[1] for r in caplog.records)
    assert left_out == ["env_steps_total", "learner/pg_loss", "ps/0/up"]  # once each


# --- a live scrape of a real run ---------------------------------------------------------


def _free_ports(n: int) -> int:
    """The first of `n` consecutive loopback ports that are free now."""
    for _ in range(100):
        base = _free_port()
        sockets = []
        try:
            for port in range(base, base + n):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError(f"no {n} consecutive free ports")


def _scrape(port: int) -> str:
    """The `/metrics` page on loopback `port` ("" while nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return reply.read().decode()
    except OSError:
        return ""


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_every_server_of_a_running_cluster_serves_a_page_prometheus_accepts(launch):
    base = _free_ports(3)
    run = launch(
        "stop.max_seconds=90",  # the fixture stops it once scraped
        f"run.prometheus_port={base}",
        "cluster.ps=2",
        "cluster.memory=1",
        "cluster.learner=1",
        "cluster.actor=1",
    )

    def trained():  # PS shard 0's page once actors and the learner reported episodes,
        # and shard 1's once the learner published to it (every learner.publish_every updates)
        families = parse_strictly(_scrape(base))
        totals = ("easyrl_run_env_steps_total", "easyrl_run_updates_total")
        moved = all(value(families, total, default=0.0) > 0 for total in totals)
        if not (moved and "easyrl_run_return_mean" in families):
            return None
        shard1 = parse_strictly(_scrape(base + 1))
        published = (
            value(families, 'easyrl_version{role="ps",task="0"}', default=0.0) > 0
            and value(shard1, 'easyrl_applied_total{role="ps",task="1"}', default=0.0) > 0
        )
        return (families, shard1) if published else None

    ps0, ps1 = run.poll_until(trained, 120, "a trained run on both PS shards' /metrics")
    memory = parse_strictly(_scrape(base + 2))
    # Every role is there: the servers' own pages, the actor's and learner's reports on PS 0.
    assert value(ps0, 'easyrl_up{role="ps",task="0"}') == 1
    assert value(ps0, 'easyrl_env_steps_total{role="actor",task="0"}') > 0
    assert value(ps0, 'easyrl_updates_total{role="learner",task="0"}') > 0
    assert value(ps0, 'easyrl_version{role="ps",task="0"}') > 0
    assert value(ps0, "easyrl_learner_loss") >= 0
    assert value(ps1, 'easyrl_applied_total{role="ps",task="1"}') > 0
    assert "easyrl_run_env_steps" not in ps1  # the run's numbers are PS shard 0's
    assert value(memory, 'easyrl_inserts_total{role="memory",task="0"}') > 0
    assert value(memory, 'easyrl_samples_total{role="memory",task="0"}') > 0
    # The monotonic counts are counters, on whichever page they are.
    types = {name: kind for f in (ps0, ps1, memory) for name, (kind, _, _) in f.items()}
    assert {types[f"easyrl_{name}"] for name in COUNTERS} == {"counter"}
    assert sum(ps0["easyrl_env_steps"][2].values()) == value(ps0, "easyrl_run_env_steps_total")
