"""Wire speed: easyrl's PS Pull, PS Push and memory Sample against raw grpcio bytes of the
same size, measured in one run on the same machine.

- raw: a grpcio server in its own process with one generic handler per direction and no
  serializer at all (bytes in, bytes out, the same message-size options as easyrl's
  servers): "down" answers a tiny request with N bytes (what a Pull or a Sample moves),
  "up" takes N bytes and answers nothing (what a Push moves).
- PS Pull / Push: one PS shard as a real `easyrl run --role ps` process (Adam) holding the
  DQN network of `benchmarks/bench_ps.py`'s mlp-512x3 (2.1 MB) and mlp-1024x6 (21 MB);
  the benchmark is its client through `easyrl.transport.clients.ParameterClient`: Pull of
  every value (known_version -1, decoded), Push of gradients for every variable (encoded,
  decoded and applied with Adam by the shard).
- memory Sample: one prioritized memory shard (spawned `memory.build` + `rpc.make_server`,
  as `bench_memory.py` does) holding 42x42x4 uint8 Atari transitions (obs + next_obs,
  14,128 B per item), sampled with `MemoryClient.sample(512)` (decoded, no priority
  update): raw is the same number of bytes down. Twice: over gRPC (a client on another
  host), and the same-host path (`easyrl.transport.shm`: the body through the client's
  shared-memory segment, what a learner beside its shard gets).

Each pair (raw and easyrl at one size) is measured alternately, `--rounds` times, and the
median MB/s of each side is compared. The last line is

    ratios: ps_pull=R ps_push=R memory_sample=R

(easyrl MB/s over raw MB/s; for the PS the smaller ratio of the two model sizes), the
same-host path's (`easyrl.transport.shm`: a Pull's or a Sample's reply body, a Push's request
body through the caller's segment; what roles on one machine use). The line above it,
`grpc: ps_pull=R ps_push=R memory_sample=R`, is the gRPC path's (roles on different hosts).

    python benchmarks/bench_wire.py            # print the table and the ratios
    python benchmarks/bench_wire.py --write    # and update benchmarks/RESULTS.md
    python benchmarks/bench_wire.py --ps-threads 2   # the PS shard on 2 intra-op threads
"""

import argparse
import multiprocessing
import os
import signal
import statistics
import time

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

import bench_memory  # noqa: E402
import bench_ps  # noqa: E402
import grpc  # noqa: E402
import numpy as np  # noqa: E402
import servers  # noqa: E402
import timing  # noqa: E402
from report import load_average, markdown_table, parse_args, section_text, write_section  # noqa: E402

from easyrl.cluster.launcher import die_with_parent, free_ports  # noqa: E402
from easyrl.replay import item_bytes  # noqa: E402
from easyrl.transport import rpc, shm  # noqa: E402
from easyrl.transport.clients import MemoryClient, ParameterClient  # noqa: E402

SMOKE_LINE = r"^ratios: ps_pull=\d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""

RAW_SERVICE = "bench.Raw"
SAMPLE_BATCH = 512
ATARI_ITEMS = 4096


def _raw_server_main(address: str) -> None:
    """Body of the raw bytes server (a "spawn" child): "Down" answers with as many bytes as
    its 8-byte request asks for, "Up" takes any bytes and answers none."""
    from concurrent import futures

    die_with_parent()
    payloads: dict[int, bytes] = {}

    def down(request: bytes, context) -> bytes:
        size = int.from_bytes(request, "little")
        if size not in payloads:
            payloads[size] = os.urandom(size)
        return payloads[size]

    def up(request: bytes, context) -> bytes:
        return b""

    handlers = {
        "Down": grpc.unary_unary_rpc_method_handler(down),
        "Up": grpc.unary_unary_rpc_method_handler(up),
    }
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[
            ("grpc.max_send_message_length", rpc.MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", rpc.MAX_MESSAGE_BYTES),
        ],
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RAW_SERVICE, handlers),))
    server.add_insecure_port(address)
    server.start()
    signal.sigwait({signal.SIGTERM})
    server.stop(grace=0.5).wait()


class RawClient:
    """Bytes down and up through the raw server, no serializer on either side."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", rpc.MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", rpc.MAX_MESSAGE_BYTES),
            ],
        )
        self._down = self.channel.unary_unary(f"/{RAW_SERVICE}/Down")
        self._up = self.channel.unary_unary(f"/{RAW_SERVICE}/Up")
        self._payloads: dict[int, bytes] = {}

    def down(self, size: int):
        def call():
            data = self._down(size.to_bytes(8, "little"), timeout=60)
            return 1, len(data)

        return call

    def up(self, size: int):
        if size not in self._payloads:
            self._payloads[size] = os.urandom(size)
        payload = self._payloads[size]

        def call():
            self._up(payload, timeout=60)
            return 1, size

        return call


def pair(name: str, raw_fn, easyrl_fn, args) -> dict:
    """Measures `raw_fn` and `easyrl_fn` alternately; medians of MB/s over the rounds."""
    raw, ours = [], []
    for _ in range(args.rounds):
        raw.append(timing.measure(raw_fn, args.duration).mb_per_s)
        ours.append(timing.measure(easyrl_fn, args.duration).mb_per_s)
    row = {"name": name, "raw": statistics.median(raw), "easyrl": statistics.median(ours)}
    row["ratio"] = row["easyrl"] / row["raw"]
    print(
        f"  {name}: easyrl {row['easyrl']:,.0f} MB/s, raw {row['raw']:,.0f} MB/s "
        f"({row['ratio']:.2f}x)",
        flush=True,
    )
    return row


def bench_ps_pair(cluster: servers.Cluster, raw: RawClient, model: str, args) -> list[dict]:
    config = servers.write_config(
        bench_ps.raw_config(bench_ps.MODELS[model]), cluster.run_dir, f"wire-{model}.yaml"
    )
    threads = [f"cluster.threads.ps={args.ps_threads}"] if args.ps_threads else []
    spec = cluster.start_cli(config, num_ps=1, overrides=threads).spec
    variables = bench_ps.build_variables(bench_ps.MODELS[model])
    values = {name: v.numpy() for name, v in variables.items()}
    rng = np.random.default_rng(0)
    grads = {n: (rng.standard_normal(v.shape) * 1e-6).astype(np.float32) for n, v in values.items()}
    size = sum(v.nbytes for v in values.values())
    client = ParameterClient(servers.client("ps", spec.ps[0], cluster.token))
    shared = ParameterClient(
        servers.client("ps", spec.ps[0], cluster.token), shm.run_prefix(cluster.token)
    )
    version = client.assign(values)

    def puller(through: ParameterClient):
        def pull():
            through.pull(known_version=-1)
            return 1, size

        return pull

    def pusher(through: ParameterClient):
        def push():
            nonlocal version
            version = through.push(version, grads, values=False).version
            return 1, size

        return push

    mb = f"{size / 1e6:.1f} MB"
    rows = [
        {
            **pair(f"PS Pull, {model} ({mb})", raw.down(size), puller(client), args),
            "kind": "ps_pull",
        },
        {
            **pair(f"PS Pull, {model} ({mb}), same host", raw.down(size), puller(shared), args),
            "kind": "ps_pull_shm",
        },
        {**pair(f"PS Push, {model} ({mb})", raw.up(size), pusher(client), args), "kind": "ps_push"},
        {
            **pair(f"PS Push, {model} ({mb}), same host", raw.up(size), pusher(shared), args),
            "kind": "ps_push_shm",
        },
    ]
    if shared.shm_replies == 0 or shared.shm_requests == 0:
        raise RuntimeError("no pull or push went through shared memory")
    client.close()
    shared.close()
    cluster.stop(cluster.servers[-1:])
    return rows


def bench_sample_pair(cluster: servers.Cluster, raw: RawClient, args) -> list[dict]:
    spec = bench_memory.ITEM_SPECS["atari"]
    config = {
        "algorithm": {"name": "dqn", "batch_size": SAMPLE_BATCH},
        "env": {"id": "CartPole-v1"},
        "replay": {
            "kind": "prioritized",
            "capacity": ATARI_ITEMS,
            "alpha": 0.6,
            "min_size_to_sample": SAMPLE_BATCH,
        },
        "run": {"name": "bench-wire", "checkpoint_interval_s": 3600.0},
    }
    server = cluster.spawn_memory_server(config, spec)
    client = MemoryClient(servers.client("memory", server.address, cluster.token))
    rng = np.random.default_rng(0)
    for _ in range(ATARI_ITEMS // SAMPLE_BATCH):
        batch = bench_memory.random_batch(spec, SAMPLE_BATCH, rng)
        client.insert(batch, priorities=rng.random(SAMPLE_BATCH) + 0.1)
    # keys (int64) and importance weights (float32 or float64) travel with the items
    size = SAMPLE_BATCH * item_bytes(spec)

    shared = MemoryClient(
        servers.client("memory", server.address, cluster.token), shm.run_prefix(cluster.token)
    )

    def sampler(through: MemoryClient):
        def sample():
            taken = through.sample(SAMPLE_BATCH, timeout_s=10.0)
            if taken is None:
                raise RuntimeError("the memory shard did not answer a sample")
            data = sum(v.nbytes for v in taken.data.values())
            return 1, data + taken.keys.nbytes + taken.weights.nbytes

        return sample

    name = f"memory Sample({SAMPLE_BATCH}), Atari 42x42x4 items ({size / 1e6:.1f} MB)"
    rows = [
        {**pair(name, raw.down(size), sampler(client), args), "kind": "memory_sample"},
        {
            **pair(f"{name}, same host", raw.down(size), sampler(shared), args),
            "kind": "memory_sample_shm",
        },
    ]
    if shared.shm_replies == 0:
        raise RuntimeError("no sample came through shared memory")
    client.close()
    shared.close()
    cluster.stop([server])
    return rows


def report(rows: list[dict], args) -> tuple[str, str]:
    table = markdown_table(
        ["path", "easyrl MB/s", "raw grpcio MB/s", "easyrl / raw"],
        [[r["name"], r["easyrl"], r["raw"], f"{r['ratio']:.2f}x"] for r in rows],
    )

    def ratios(suffix: str) -> str:
        return " ".join(
            f"{kind}={min(r['ratio'] for r in rows if r['kind'] == kind + suffix):.2f}"
            for kind in ("ps_pull", "ps_push", "memory_sample")
        )

    line = "ratios: " + ratios("_shm")
    notes = [
        "",
        f"- medians of {args.rounds} alternating rounds of {args.duration:g} s per side; "
        "raw = a grpcio generic handler without serializers in its own process, same "
        "message-size options; easyrl = the typed clients against a real PS process "
        "(`easyrl run --role ps`, Adam applied on Push, "
        + (f"{args.ps_threads} intra-op threads" if args.ps_threads else "the launcher's budget")
        + ") and a spawned prioritized memory shard (Sample decoded, no priority update).",
        "- MB/s counts tensor bytes (raw: payload bytes). Goals: gRPC (issue 15) ps_pull >= 0.7, "
        "memory_sample >= 0.7, ps_push >= 0.5; same host (issue 45) each >= 1.5.",
        "",
        "`grpc: " + ratios("") + "`",
        "",
        "`" + line + "`",
    ]
    return table + "\n".join(notes), line


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per pair")
    parser.add_argument("--models", default="mlp-512x3,mlp-1024x6")
    parser.add_argument(
        "--ps-threads",
        type=int,
        default=0,
        help="the PS shard's cluster.threads.ps (0: the launcher's budget, 1 on a "
        "cluster's host; more applies a large network's Adam faster where cores are spare)",
    )
    args = parse_args(parser)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.duration, args.rounds, args.models = 0.2, 1, "cartpole"
    started, load_before = time.monotonic(), load_average()
    rows = []
    with servers.Cluster() as cluster:
        (port,) = free_ports(servers.HOST, 1)
        address = f"{servers.HOST}:{port}"
        process = multiprocessing.get_context("spawn").Process(
            target=_raw_server_main, args=(address,), daemon=True
        )
        process.start()
        raw = RawClient(address)
        grpc.channel_ready_future(raw.channel).result(timeout=60)
        try:
            for model in args.models.split(","):
                rows += bench_ps_pair(cluster, raw, model, args)
            rows += bench_sample_pair(cluster, raw, args)
        finally:
            raw.channel.close()
            process.terminate()
            process.join(5)
    text, line = report(rows, args)
    print()
    print(text.removesuffix("`" + line + "`").rstrip())
    if args.write:
        variant = ["tuned malloc"] * bool(args.tuned_malloc)
        variant += [f"PS {args.ps_threads} threads"] * bool(args.ps_threads)
        title = "Wire speed vs raw grpcio" + "".join(f" ({v})" for v in variant)
        section = section_text(title, started, load_before, text)
        write_section("-".join(["bench_wire", *variant]).replace(" ", "-").lower(), section)
    print(line)


if __name__ == "__main__":
    main()
