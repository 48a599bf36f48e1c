"""Load: many concurrent inserting clients against one memory shard.

One memory shard in its own process (prioritized table, alpha 0.6, capacity 100k by
default; CartPole-size items from a real `python -m easyrl.cli run --role memory`
process, or with `--items atari` 42x42x4 uint8 frames from the spawned server of
`servers.Cluster.spawn_memory_server`, as in bench_memory.py) and `--clients` (32)
inserting clients, each its own process (threads of one Python process would measure
the client's GIL, not the server). Each client loops Insert of one `--batch`-item batch
(default 256 = `actor.send_every` 8 x `env.num_envs` 32 of configs/cartpole_apex.yaml,
one Ape-X actor shipment, with one initial priority per item) through
`easyrl.transport.rpc.Client` with the token, one call in flight, for `--duration`
seconds (each connects with a Status call first, so connection set-up is not timed).
Requests are encoded once before the run, so the clients spend their CPU on gRPC, not on
encoding. `--samplers` (1) learner-like processes loop Sample(512) + UpdatePriorities at
the same time.

Reported: Insert items/s and RPCs/s (clients' count and the server's `inserts` counter),
RPC latency p50/p99/max, the shard's resident memory (VmRSS sampled every 0.25 s and the
kernel's peak VmHWM, against the preallocated table size), its CPU use, and the
accounting: items the clients got an OK for (acknowledged) against what the server counted
as inserted (`memory/0/inserts` after every client finished), the table size and the
evictions (inserted - size), and the failed calls by status code (RESOURCE_EXHAUSTED =
the rate limiter refused, DEADLINE_EXCEEDED, UNAVAILABLE: back-pressure, if any).
Clients do not retry (`retry_s=0`), so every failure is counted; an insert that failed on
the client can still have been stored, so the check is
`acknowledged <= server inserts <= acknowledged + items of failed calls`, equality when
no call failed.

`--samples-per-insert S --error-buffer E` turns on the shard's rate limiter, so that
inserts block (and, after 5 s, fail with RESOURCE_EXHAUSTED) when the samplers fall
behind: the back-pressure path.

    python benchmarks/bench_load.py --duration 60 --write
    python benchmarks/bench_load.py --samples-per-insert 16 --error-buffer 4096 --write
    python benchmarks/bench_load.py --items atari --capacity 20000 --duration 60 --write
"""

import argparse
import multiprocessing
import queue
import time
from collections import Counter

import numpy as np
import servers
from bench_memory import ITEM_SPECS, random_batch
from procs import cpu_seconds, memory_kib
from report import load_average, markdown_table, parse_args, section_text, write_section

from easyrl.cluster.launcher import Child, die_with_parent, tail
from easyrl.errors import TransportError
from easyrl.replay import item_bytes
from easyrl.transport import codec
from easyrl.transport import easyrl_pb2 as pb

SMOKE_LINE = r"^\| acknowledged vs server \| equal: no acknowledged insert lost"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""

SAMPLE_BATCH = 512
RSS_POLL_S = 0.25


def insert_requests(items: str, batch: int, seed: int, count: int = 4) -> list:
    """`count` different encoded InsertRequests of `batch` items with priorities, laid out as
    `MemoryClient.insert` lays them out (tensor bytes in the message body)."""
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(count):
        body = codec.Body()
        batch_ = random_batch(ITEM_SPECS[items], batch, rng)
        request = pb.InsertRequest(tensors=body.batch(batch_), actor=seed)
        priorities = rng.random(batch).astype(np.float32) + 0.01
        request.priorities.CopyFrom(body.tensor("priorities", priorities))
        requests.append(body.frame(request))
    return requests


def count_failure(failures: Counter, examples: dict, err: TransportError) -> None:
    """Counts a failed call by status code, keeping the first message of each code."""
    code = err.code.name if err.code is not None else "no status code"
    failures[code] += 1
    examples.setdefault(code, str(err))


def _inserter_main(index, address, token, args, ready, go, results) -> None:
    """Body of one inserting client process: Insert until `args.duration` has passed."""
    die_with_parent()
    requests = insert_requests(args.items, args.batch, index)
    client = servers.client("memory", address, token, timeout_s=args.rpc_timeout)
    client.call("Status", pb.StatusRequest(), timeout_s=60.0)  # connect before the run
    latencies, failures, examples = [], Counter(), {}
    acked = failed_items = last_inserted = 0
    ready.put(index)
    go.wait()
    end = time.monotonic() + args.duration
    while time.monotonic() < end:
        request = requests[len(latencies) % len(requests)]
        start = time.perf_counter()
        try:
            reply = client.call("Insert", request, retry_s=0.0)
        except TransportError as err:
            count_failure(failures, examples, err)
            failed_items += args.batch
            continue
        latencies.append(time.perf_counter() - start)
        acked += args.batch
        last_inserted = max(last_inserted, reply.inserted)
    client.close()
    results.put(
        {
            "kind": "insert",
            "latencies": np.asarray(latencies, np.float32),
            "acked": acked,
            "failed_items": failed_items,
            "failures": dict(failures),
            "last_inserted": last_inserted,
            "examples": examples,
        }
    )


def _sampler_main(index, address, token, args, ready, go, results) -> None:
    """Body of one learner-like process: Sample(512) + UpdatePriorities in a loop."""
    die_with_parent()
    client = servers.client("memory", address, token, timeout_s=args.rpc_timeout)
    rng = np.random.default_rng(1000 + index)
    request = pb.SampleRequest(batch_size=SAMPLE_BATCH, timeout_s=1.0)
    client.call("Status", pb.StatusRequest(), timeout_s=60.0)
    rounds = not_ready = 0
    latencies, failures, examples = [], Counter(), {}
    ready.put(-1 - index)
    go.wait()
    end = time.monotonic() + args.duration
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            reply = client.call("Sample", request, retry_s=0.0)
            if not reply.ready:
                not_ready += 1
                continue
            codec.decode_batch(reply.tensors, reply.body)
            keys = codec.decode_array(reply.keys, reply.body)
            body = codec.Body()
            update = pb.UpdatePrioritiesRequest(
                keys=body.tensor("keys", keys),
                priorities=body.tensor("priorities", rng.random(len(keys)) + 0.01),
            )
            client.call("UpdatePriorities", body.frame(update), retry_s=0.0)
            latencies.append(time.perf_counter() - start)
            rounds += 1
        except TransportError as err:
            count_failure(failures, examples, err)
    client.close()
    results.put(
        {
            "kind": "sample",
            "latencies": np.asarray(latencies, np.float32),
            "rounds": rounds,
            "not_ready": not_ready,
            "failures": dict(failures),
            "examples": examples,
        }
    )


def raw_config(args) -> dict:
    """A DQN/CartPole config whose replay section is the shard's."""
    replay = {
        "kind": "prioritized",
        "capacity": args.capacity,
        "alpha": 0.6,
        "min_size_to_sample": args.min_size,
        "samples_per_insert": args.samples_per_insert,
        "error_buffer": args.error_buffer,
    }
    return {
        "algorithm": {"name": "dqn", "batch_size": SAMPLE_BATCH},
        "env": {"id": "CartPole-v1"},
        "replay": replay,
        "run": {"name": "bench-load", "checkpoint_interval_s": 3600.0},
    }


def start_shard(cluster: servers.Cluster, args) -> Child:
    """The memory shard: `easyrl run --role memory` for CartPole items, spawned for Atari."""
    raw = raw_config(args)
    if args.items == "cartpole":
        config = servers.write_config(raw, cluster.run_dir, "memory-load.yaml")
        # The cluster the shard is told about has one actor per inserting client (it sizes
        # its handler threads from it, as in a real run).
        cluster.start_cli(config, num_memory=1, actors=args.clients)
        return cluster.servers[-1]
    return cluster.spawn_memory_server(raw, ITEM_SPECS[args.items])


def run_load(args) -> dict:
    """Starts the shard and the client processes, runs them, returns the figures."""
    ctx = multiprocessing.get_context("spawn")
    with servers.Cluster() as cluster:
        server = start_shard(cluster, args)
        pid = server.process.pid
        ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=_inserter_main,
                args=(i, server.address, cluster.token, args, ready, go, results),
                daemon=True,
            )
            for i in range(args.clients)
        ] + [
            ctx.Process(
                target=_sampler_main,
                args=(i, server.address, cluster.token, args, ready, go, results),
                daemon=True,
            )
            for i in range(args.samplers)
        ]
        for proc in procs:
            proc.start()
        try:
            for _ in procs:
                ready.get(timeout=servers.READY_TIMEOUT_S)
        except queue.Empty:
            raise RuntimeError("a client process did not connect (see its traceback)") from None
        status = servers.client("memory", server.address, cluster.token)
        rss_before = memory_kib(pid).get("VmRSS", 0)
        cpu_before = cpu_seconds(pid)
        clients_cpu_before = sum(cpu_seconds(p.pid) or 0.0 for p in procs)
        go.set()
        start = time.monotonic()
        rss = []  # (seconds since start, VmRSS KiB)
        while time.monotonic() - start < args.duration:
            time.sleep(RSS_POLL_S)
            rss.append((time.monotonic() - start, memory_kib(pid).get("VmRSS", 0)))
            if server.process.poll() is not None:
                raise RuntimeError(f"the memory shard died during the run:\n{tail(server)}")
        window = time.monotonic() - start
        cpu_after = cpu_seconds(pid)
        if cpu_before is None or cpu_after is None:
            raise RuntimeError(f"the memory shard exited during the run:\n{tail(server)}")
        clients_cpu = sum(cpu_seconds(p.pid) or 0.0 for p in procs) - clients_cpu_before
        outs = []
        for _ in procs:
            try:
                outs.append(results.get(timeout=args.rpc_timeout + 30))
            except queue.Empty:
                raise RuntimeError("a client process did not report") from None
        for proc in procs:
            proc.join(10)
        counters = status.call("Status", pb.StatusRequest()).counters
        status.close()
        memory = memory_kib(pid)
    inserters = [o for o in outs if o["kind"] == "insert"]
    samplers = [o for o in outs if o["kind"] == "sample"]
    latencies = np.concatenate([o["latencies"] for o in inserters]) * 1e3
    round_latencies = np.concatenate([o["latencies"] for o in samplers] + [[]]) * 1e3
    failures, examples = Counter(), {}
    for out in outs:
        failures.update(out["failures"])
        examples = {**out["examples"], **examples}
    half = [kib for t, kib in rss if t >= window / 2]
    return {
        "window_s": window,
        "acked": sum(o["acked"] for o in inserters),
        "failed_items": sum(o["failed_items"] for o in inserters),
        "calls": len(latencies),
        "latency_ms": percentiles(latencies),
        "round_latency_ms": percentiles(round_latencies),
        "failures": dict(failures),
        "examples": examples,
        "last_inserted": max((o["last_inserted"] for o in inserters), default=0),
        "rounds": sum(o["rounds"] for o in samplers),
        "not_ready": sum(o["not_ready"] for o in samplers),
        "counters": {k.split("/", 2)[-1]: v for k, v in counters.items()},
        "rss_kib": {
            "before": rss_before,
            "max_sampled": max(kib for _, kib in rss),
            "mid": half[0] if half else 0,
            "end": rss[-1][1],
            "hwm": memory.get("VmHWM", 0),
        },
        "server_cores": (cpu_after - cpu_before) / window,
        "client_cores": clients_cpu / window,
    }


def percentiles(ms: np.ndarray) -> list[float]:
    """p50, p99 and max of latencies (NaN when there are none)."""
    if not len(ms):
        return [float("nan")] * 3
    return [*np.percentile(ms, [50, 99]).tolist(), float(ms.max())]


def report(r: dict, args) -> str:
    c, mib = r["counters"], 1024.0
    server_inserts = int(c.get("inserts", 0))
    size = int(c.get("size", 0))
    window = r["window_s"]
    lo, hi = r["acked"], r["acked"] + r["failed_items"]
    if server_inserts == r["acked"]:
        check = "equal: no acknowledged insert lost, none stored twice"
    elif lo <= server_inserts <= hi:
        check = (
            f"server counted {server_inserts - lo:,} more than acknowledged, within the "
            f"{r['failed_items']:,} items of failed calls (stored, but the client saw an error)"
        )
    else:
        check = f"MISMATCH: server counted {server_inserts:,}, outside [{lo:,}, {hi:,}]"
    failures = ", ".join(f"{k} {v:,}" for k, v in sorted(r["failures"].items())) or "none"
    table_mib = args.capacity * item_bytes(ITEM_SPECS[args.items]) / 2**20
    rss = r["rss_kib"]
    rows = [
        ["Insert items/s (acknowledged / window)", r["acked"] / window],
        ["Insert items/s (server `inserts` counter / window)", server_inserts / window],
        ["Insert RPCs/s (OK)", r["calls"] / window],
        [
            "Insert latency p50 / p99 / max (ms)",
            "{:.2f} / {:.2f} / {:.1f}".format(*r["latency_ms"]),
        ],
        ["Sample(512) + UpdatePriorities rounds/s", r["rounds"] / window],
        [
            "round latency p50 / p99 / max (ms)",
            "{:.2f} / {:.2f} / {:.1f}".format(*r["round_latency_ms"]),
        ],
        ["items acknowledged to clients", r["acked"]],
        ["items the server counted as inserted (`inserts`)", server_inserts],
        ["max `inserted` in an InsertResponse (table's running total)", r["last_inserted"]],
        ["acknowledged vs server", check],
        ["table size / evictions (inserts - size)", f"{size:,} / {server_inserts - size:,}"],
        ["failed calls (by status)", failures],
        ["rate limiter timeouts (`rate_limited_insert`)", int(c.get("rate_limited_insert", 0))],
        ["Sample calls not ready (`ready=False`)", r["not_ready"]],
        [
            "shard VmRSS before / mid-run / end / max sampled (MiB)",
            f"{rss['before'] / mib:,.0f} / {rss['mid'] / mib:,.0f} / {rss['end'] / mib:,.0f} / "
            f"{rss['max_sampled'] / mib:,.0f}",
        ],
        ["shard peak RSS, VmHWM (MiB)", rss["hwm"] / mib],
        ["preallocated table (capacity x item bytes, MiB)", table_mib],
        ["shard CPU (cores)", r["server_cores"]],
        [f"{args.clients + args.samplers} client processes' CPU (cores)", r["client_cores"]],
    ]
    table = markdown_table(["measure", "value"], rows)
    limiter = (
        f"rate limiter samples_per_insert {args.samples_per_insert:g}, error_buffer "
        f"{args.error_buffer:g}"
        if args.samples_per_insert
        else "no samples_per_insert limit"
    )
    notes = [
        f"{args.clients} inserting client processes x one call in flight, batches of "
        f"{args.batch} {args.items} items ({item_bytes(ITEM_SPECS[args.items]):,} B each) with "
        f"priorities, pre-encoded; {args.samplers} Sample({SAMPLE_BATCH}) + UpdatePriorities "
        f"process(es); {window:.0f} s; prioritized table, capacity {args.capacity:,}, "
        f"min_size_to_sample {args.min_size:,}, {limiter}; per-call deadline "
        f"{args.rpc_timeout:g} s, no client retries; every client connected before the clock "
        "started.",
        "Every process shares the machine's cores (clients included), so the shard's rate "
        "is a lower bound of what it serves with cores of its own.",
        "The shard's queues: gRPC hands calls to 16 + actors + 4 x learners handler threads "
        "(`roles.memory.run` sizes them from the cluster: here 16 + 32 + 4 = 52), so inserts "
        "the rate limiter holds back never take the threads the learners' samples need; "
        "handlers put operations on the table thread's `_ops` queue and block until it "
        "answers. Calls in flight are bounded by the clients (one each, as actors do), not by "
        "the server; the rate limiter (when configured) is the server-side back-pressure "
        "(an insert waits, then fails RESOURCE_EXHAUSTED after min(5 s, its deadline); the "
        "actor sends it again).",
    ]
    notes += [f"First {code}: `{text}`" for code, text in sorted(r["examples"].items())]
    return table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--items", choices=sorted(ITEM_SPECS), default="cartpole")
    parser.add_argument("--clients", type=int, default=32, help="inserting processes")
    parser.add_argument("--samplers", type=int, default=1, help="Sample+Update processes")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--batch", type=int, default=256, help="items per Insert")
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--min-size", type=int, default=1000, help="replay.min_size_to_sample")
    parser.add_argument("--samples-per-insert", type=float, default=None)
    parser.add_argument("--error-buffer", type=float, default=None)
    parser.add_argument("--rpc-timeout", type=float, default=10.0, help="per-call deadline, s")
    args = parse_args(parser, tuned_malloc=False)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.clients, args.samplers, args.duration, args.batch = 2, 1, 1.0, 16
        args.capacity, args.min_size = 2000, 100
    if args.clients < 1 or args.samplers < 0 or args.batch < 1 or args.duration <= 0:
        parser.error("--clients and --batch must be >= 1, --samplers >= 0, --duration > 0")
    if (args.samples_per_insert is None) != (args.error_buffer is None):
        parser.error("--samples-per-insert and --error-buffer go together")

    started, load_before = time.monotonic(), load_average()
    result = run_load(args)
    text = report(result, args)
    print(text)
    if args.write:
        suffix = f"-spi{args.samples_per_insert:g}" if args.samples_per_insert else ""
        title = f"Load: {args.clients} inserting clients, one memory shard ({args.items}{suffix})"
        section = section_text(title, started, load_before, text)
        write_section(f"bench_load-{args.items}{suffix}", section)


if __name__ == "__main__":
    main()
