"""Parameter-server throughput: Push, Pull (full), Pull (current) and a learner round.

PS shards run as real `python -m easyrl.cli run --role ps` processes (Adam, as in the
DQN config). The benchmark process builds the DQN network with
`registry.spec("dqn").build(...)` for three sizes of `model.hidden` and talks to the
shards through `easyrl.roles.common.ShardedWeights` (shard assignment, Assign, Pull)
and pushes like `Learner._push_one` (one thread per shard):

- cartpole:   hidden [64, 64], the CartPole Ape-X network (~20 KB)
- mlp-512x3:  hidden [512, 512, 512] (~2 MB)
- mlp-1024x6: hidden [1024] * 6 (~21 MB)

For 1 and 2 shards (2 PS processes, variables split by `assign_shards`):

- Push: gradients for every shard (encoded on the client, one thread per shard), the
  shard decodes, checks and applies them with Adam; a round = one push to every shard.
- Pull full: `ShardedWeights.fetch()` with known_version=-1 (shard answers from its
  encoded cache; the client decodes); shards are pulled one after the other, as fetch does.
- Pull current: `fetch()` when the caller is current (no tensors travel).
- Learner round: what `Learner._push_loop` does per update: push to every shard in
  parallel, then `fetch()` the new values (the shard re-encodes after every apply).

    python benchmarks/bench_ps.py            # print the table
    python benchmarks/bench_ps.py --write    # and update benchmarks/RESULTS.md
"""

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

import numpy as np  # noqa: E402
import servers  # noqa: E402
import timing  # noqa: E402
from report import load_average, markdown_table, parse_args, section_text, write_section  # noqa: E402

from easyrl.transport.clients import ParameterClient, Pushed  # noqa: E402

SMOKE_LINE = r"^\| cartpole \| [\d.]+ \| 1 \| Learner round \(push \+ fetch\) \| \d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""

MODELS = {
    "cartpole": [64, 64],
    "mlp-512x3": [512, 512, 512],
    "mlp-1024x6": [1024] * 6,
}


def raw_config(hidden: list[int]) -> dict:
    return {
        "algorithm": {"name": "dqn", "optimizer": "adam", "max_staleness": 20},
        "env": {"id": "CartPole-v1"},
        "model": {"hidden": hidden},
        "run": {"name": "bench-ps", "checkpoint_interval_s": 3600.0},
    }


def build_variables(hidden: list[int]) -> dict:
    """The DQN online network's {name: tf.Variable} for `hidden` (as every role builds it)."""
    from easyrl import config as config_lib
    from easyrl.algorithms import registry
    from easyrl.envs import env_spaces

    cfg = config_lib.from_dict(raw_config(hidden))
    obs_space, action_space = env_spaces(cfg.env.id)
    algo = registry.spec("dqn").build(
        cfg.algorithm.params, obs_space, action_space, cfg.model, cfg.run.seed
    )
    return dict(algo.variables)


class Bench:
    """One set of shards (1 or 2 PS processes) holding one model."""

    def __init__(self, spec, token, variables, rng):
        from easyrl.roles.common import ShardedWeights

        self.clients = [
            ParameterClient(servers.client("ps", address, token)) for address in spec.ps
        ]
        self.weights = ShardedWeights(self.clients, variables)
        self.pool = ThreadPoolExecutor(max_workers=len(self.clients))
        self.grads = {
            name: (rng.standard_normal(v.shape) * 1e-4).astype(np.float32)
            for name, v in variables.items()
        }
        self.shard_bytes = [
            sum(self.grads[n].nbytes for n in names) for names in self.weights.shard_names
        ]
        self.total_bytes = sum(self.shard_bytes)
        self.versions = [0] * len(self.clients)
        self.not_applied = 0

    def initialize(self) -> None:
        if not self.weights.initialize():
            raise RuntimeError("PS shards were already initialized")
        if not self.weights.fetch():
            raise RuntimeError("PS shards did not initialize")
        self.versions = list(self.weights.fetched_versions)

    def _push_one(self, shard: int) -> Pushed:
        grads = {n: self.grads[n] for n in self.weights.shard_names[shard]}
        return self.clients[shard].push(self.versions[shard], grads, values=False)

    def push(self):
        replies = list(self.pool.map(self._push_one, range(len(self.clients))))
        for shard, reply in enumerate(replies):
            self.not_applied += not reply.applied
            self.versions[shard] = reply.version
        return 1, self.total_bytes

    def pull_full(self):
        self.weights.fetched_versions = [-1] * len(self.clients)
        self.weights.fetch()
        return 1, self.total_bytes

    def pull_current(self):
        self.weights.fetch()
        return 1, 0

    def learner_round(self):
        self.push()
        self.weights.fetch()
        return 1, 2 * self.total_bytes

    def close(self) -> None:
        self.pool.shutdown()
        for c in self.clients:
            c.close()


def start_model(cluster: servers.Cluster, name: str, args) -> dict:
    """Starts the PS processes for `name` (one set per shard count) without waiting."""
    config = servers.write_config(raw_config(MODELS[name]), cluster.run_dir, f"ps-{name}.yaml")
    before = len(cluster.servers)
    specs = {n: cluster.start_cli(config, num_ps=n, wait=False).spec for n in args.shards}
    return {"specs": specs, "servers": cluster.servers[before:]}


def bench_model(cluster: servers.Cluster, name: str, started: dict, args, rng) -> list[dict]:
    variables = build_variables(MODELS[name])
    specs = started["specs"]
    rows = []
    for shards, spec in specs.items():
        bench = Bench(spec, cluster.token, variables, rng)
        bench.initialize()
        ops = {
            "Push": bench.push,
            "Pull full": bench.pull_full,
            "Pull current": bench.pull_current,
            "Learner round (push + fetch)": bench.learner_round,
        }
        for op, fn in ops.items():
            rate = timing.measure(fn, args.duration)
            rows.append(
                {
                    "model": name,
                    "mb": bench.total_bytes / 1e6,
                    "variables": len(variables),
                    "shards": shards,
                    "op": op,
                    "rate": rate,
                }
            )
            print(
                f"  {name} ({bench.total_bytes / 1e6:.2f} MB) {shards} shard(s) {op}: "
                f"{rate.per_s:,.1f}/s {rate.mb_per_s:,.1f} MB/s",
                flush=True,
            )
        if bench.not_applied:
            print(f"  warning: {bench.not_applied} pushes were not applied")
        rows[-1]["status"] = bench.clients[0].status().counters
        bench.close()
    t0 = time.monotonic()
    cluster.stop(started["servers"])
    print(f"  stopped its PS processes in {time.monotonic() - t0:.1f} s", flush=True)
    return rows


def report(rows: list[dict], args) -> str:
    table_rows = []
    base = {}
    for r in rows:
        key = (r["model"], r["op"])
        if r["shards"] == 1:
            base[key] = r["rate"].per_s
        ratio = r["rate"].per_s / base[key] if key in base and r["shards"] > 1 else None
        table_rows.append(
            [
                r["model"],
                f"{r['mb']:.3g}",
                r["shards"],
                r["op"],
                r["rate"].per_s,
                r["rate"].ms_per_call,
                r["rate"].mb_per_s if r["op"] != "Pull current" else None,
                f"{ratio:.2f}x" if ratio is not None else "",
            ]
        )
    table = markdown_table(
        ["model", "MB", "shards", "operation", "calls/s", "ms/call", "MB/s", "vs 1 shard"],
        table_rows,
    )
    notes = [
        "Each PS shard is a `python -m easyrl.cli run --role ps` process (Adam); the client "
        "is the benchmark process (token auth, loopback), one gRPC channel per shard.",
        "Models: the DQN online network (dueling head) built by `registry.spec('dqn')` for "
        "CartPole with `model.hidden` = "
        + ", ".join(f"{n}: {h}" for n, h in MODELS.items() if n in args.models)
        + "; variables split over shards with `assign_shards` (via `ShardedWeights`).",
        "A call = one round over every shard (Push: one gradient push per shard in parallel "
        "threads, like the learner; Pull: `ShardedWeights.fetch()`, which pulls the shards "
        "one after the other). MB/s counts raw tensor bytes (gradients + weights for a "
        "learner round). Push includes client-side encoding and the shard's Adam apply; "
        "Pull full includes client-side decoding.",
    ]
    return table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of models")
    parser.add_argument("--shards", default="1,2", help="comma list of PS shard counts")
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per measurement")
    args = parse_args(parser)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.models, args.shards, args.duration = "cartpole", "1", 0.2
    args.models = [m for m in args.models.split(",") if m]
    args.shards = [int(s) for s in args.shards.split(",")]
    for m in args.models:
        if m not in MODELS:
            parser.error(f"unknown model {m!r}; known: {', '.join(MODELS)}")

    started, load_before = time.monotonic(), load_average()
    rng = np.random.default_rng(0)
    rows = []
    with servers.Cluster() as cluster:
        # Start every PS process first (their TensorFlow start-up overlaps), measure only
        # once all of them are idle, and stop each model's processes when it is done.
        t0 = time.monotonic()
        processes = {name: start_model(cluster, name, args) for name in args.models}
        build_variables(MODELS[args.models[0]])  # imports TensorFlow meanwhile
        cluster.wait_ready(cluster.servers)
        print(
            f"{len(cluster.servers)} PS processes ready after {time.monotonic() - t0:.1f} s",
            flush=True,
        )
        for name in args.models:
            print(f"{name}:", flush=True)
            rows += bench_model(cluster, name, processes[name], args, rng)
    text = report(rows, args)
    print()
    print(text)
    if args.write:
        title = "Parameter server" + (" (tuned malloc)" if args.tuned_malloc else "")
        suffix = "-tuned-malloc" if args.tuned_malloc else ""
        write_section(f"bench_ps{suffix}", section_text(title, started, load_before, text))


if __name__ == "__main__":
    main()
