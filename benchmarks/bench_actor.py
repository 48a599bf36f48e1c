"""Actor throughput: env steps/s of the real actor role vs a plain single-process loop.

Same environment, network and vector size on both sides (by default CartPole-v1 with
the DQN of `configs/cartpole_apex.yaml`, num_envs 1, 8 and 32; `--config` picks another
config, e.g. Atari Pong with `configs/pong_apex.yaml` or `configs/pong_impala.yaml`;
`--vector` overrides `env.vector`, and with a comma list measures each kind in the same run,
size by size, and prints their ratios to the first):

- plain: `act` + `env.step` in a loop, nothing else (no gRPC, no replay).
- plain + post: the plain loop plus everything the actor does in its own process
  besides talking to servers: the algorithm's collector (for DQN: epsilon-greedy
  acting and n-step accumulation), same-step-autoreset final observations, episode
  tracking, and every `actor.send_every` vector steps the shipment (concatenate,
  Ape-X initial priorities with the network, encode the InsertRequest).
- actor: `easyrl.roles.actor.Actor` against a PS shard and a memory shard that run as
  real `easyrl run` processes (PS initialized with the network by `Assign`;
  `replay.min_size_to_sample` = capacity so nothing is ever sampled; no rate limit, no
  learner; a trajectory queue (IMPALA) is never sampled either, so `--capacity` must hold
  every unroll of the run: 10,000 by default). Its env steps are read from PS shard 0's
  Status (`counters["env_steps"]`, which the actor reports every 0.5 s): rate = steps
  between two reports / time between them, after the first two reports (tracing, first
  pull). By default the actor runs in the benchmark process (the same
  `Actor(ctx, algo, stop).run()` that `easyrl.roles.actor.run` calls, on a thread);
  `--actor-process` starts it as a `python -m easyrl.cli run --role actor` process
  instead.

Each side's CPU is also read from /proc over its measured window (the actor's: its process
and the env subprocesses it started, not the PS or memory shard), giving steps/s per core
used: what one actor core yields where the actor has its cores to itself, as on a cluster.
With `--vector a,b` the comparison line gives that ratio too ("actor per core").

It ends with the line `min actor/plain: R`, the lowest actor / plain ratio of the run.
The benchmark process runs TensorFlow on an actor's thread budget (`cluster.threads.actor`),
as an actor process does, so both loops act with the same threads.

    python benchmarks/bench_actor.py            # print the table
    python benchmarks/bench_actor.py --write    # and update benchmarks/RESULTS.md
    python benchmarks/bench_actor.py --config configs/pong_apex.yaml --num-envs 1,4 \
        --capacity 20000 --write                # Atari frames/s per actor
    python benchmarks/bench_actor.py --config configs/pong_impala.yaml --num-envs 5 \
        --vector async,envpool                  # gymnasium subprocesses vs EnvPool threads
    python benchmarks/bench_actor.py --config configs/pong_impala_16core.yaml --num-envs 8 \
        --vector sync,async,async/4             # async/4: 4 envs per subprocess
"""

import argparse
import dataclasses
import os
import threading
import time
from pathlib import Path

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

import numpy as np  # noqa: E402
import procs  # noqa: E402
import report  # noqa: E402
import timing  # noqa: E402
import yaml  # noqa: E402
from servers import Cluster, client, write_config  # noqa: E402

from easyrl.algorithms.nstep import PRIORITY  # noqa: E402
from easyrl.transport import codec  # noqa: E402
from easyrl.transport import easyrl_pb2 as pb  # noqa: E402

SMOKE_LINE = r"^min actor/plain: \d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""

CONFIG = report.REPO / "configs" / "cartpole_apex.yaml"
VECTORS = ("sync", "async", "envpool")
"""`--vector` kinds; "async/N" is async with `env.envs_per_worker` N."""


def vector_kind(label: str) -> tuple[str, int]:
    """(env.vector, env.envs_per_worker) of a `--vector` label: "async/4" -> ("async", 4).

    Raises:
        ValueError: not one of VECTORS, or a per-worker count that is not a whole number >= 1.
    """
    kind, _, per_worker = label.partition("/")
    if kind not in VECTORS or (per_worker and (kind != "async" or not per_worker.isdigit())):
        raise ValueError(f"{label!r} is not one of {', '.join(VECTORS)} or async/N")
    if per_worker and int(per_worker) < 1:
        raise ValueError(f"{label!r}: envs per worker must be >= 1")
    return kind, int(per_worker or 1)


QUEUE_CAPACITY = 10_000
"""Default `--capacity` of a trajectory queue (unrolls; nothing drains it)."""


def raw_config(config: Path, num_envs: int, capacity: int | None, vector: str | None) -> dict:
    """`config` (an async-replay config: DQN, IMPALA, ...) with `num_envs` (and `vector` if
    given), no stop condition and no sampling."""
    raw = yaml.safe_load(config.read_text())
    raw["env"]["num_envs"] = num_envs
    if vector is not None:
        raw["env"]["vector"], raw["env"]["envs_per_worker"] = vector_kind(vector)
    raw.setdefault("replay", {})
    if capacity is None:
        capacity = QUEUE_CAPACITY if raw["replay"].get("kind") == "trajectory" else 1_000_000
    raw["replay"].update({"capacity": capacity, "min_size_to_sample": capacity})
    raw["stop"] = {"episode_return_mean": None, "max_seconds": None}
    raw["cluster"] = {"ps": 1, "memory": 1, "learner": 1, "actor": 1}
    raw["run"] = {**raw.get("run", {}), "checkpoint_interval_s": 3600.0}
    return raw


def plain_loop(cfg, algo, duration_s: float, post: bool) -> timing.Rate:
    """Steps `cfg.env.num_envs` envs for `duration_s` (after a warm-up): with `post`, through
    the algorithm's collector and the encoding of each shipment, as an actor does (without
    gRPC); without, greedy actions from one inference call per vector step and env.step only.
    """
    from easyrl.envs import env_options, final_observations, make_vector_env
    from easyrl.roles.actor import EpisodeTracker

    n = cfg.env.num_envs
    seed = cfg.run.seed * 10_000
    per_worker = cfg.env.envs_per_worker
    options = env_options(cfg.env)
    env = make_vector_env(
        cfg.env.id, n, vector=cfg.env.vector, seed=seed, envs_per_worker=per_worker, **options
    )
    rng = np.random.default_rng(seed)
    collector = algo.collector(n, seed, 0, 1)
    episodes = EpisodeTracker(n)
    obs, _ = env.reset(seed=seed)
    state = {"obs": obs, "steps": 0, "parts": []}

    def vector_step():
        if not post:
            state["obs"] = env.step(algo.greedy(state["obs"]))[0]
            return n, 0
        actions = collector.act(state["obs"], rng)
        next_obs, rewards, terminated, truncated, infos = env.step(actions)
        state["steps"] += n
        done = terminated | truncated
        real_next = final_observations(next_obs, infos, done)
        out = collector.observe(rewards, next_obs, real_next, terminated, truncated)
        if out is not None:
            state["parts"].append(out)
        episodes.step(rewards, done)
        episodes.take()
        if (state["steps"] // n) % cfg.actor.send_every == 0 and state["parts"]:
            parts = state["parts"]
            batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
            priorities = batch.pop(PRIORITY, None)  # as Actor.ship: the collector's if any
            body = codec.Body()  # as MemoryClient.insert builds the request
            request = pb.InsertRequest(tensors=body.batch(batch), actor=0)
            if cfg.replay.kind == "prioritized":
                if priorities is None:
                    priorities = algo.initial_priorities(batch)
                priorities = priorities.astype(np.float32)
                request.priorities.CopyFrom(body.tensor("priorities", priorities))
            body.frame(request).SerializeToString()
            state["parts"] = []
        state["obs"] = next_obs
        return n, 0

    try:
        return timing.measure(vector_step, duration_s, warmup_s=0.5, cpu_label="bench")
    finally:
        env.close()


def merge(a: timing.Rate, b: timing.Rate) -> timing.Rate:
    """Two measurements of the same thing as one."""
    cpu = None if a.cpu_seconds is None or b.cpu_seconds is None else a.cpu_seconds + b.cpu_seconds
    return timing.Rate(
        a.calls + b.calls, a.seconds + b.seconds, a.units + b.units, 0, a.windows + b.windows, cpu
    )


class StepsWatcher:
    """Polls PS shard 0's Status; records (time, env_steps, `procs.cpu_by_process()`)
    whenever env_steps changes."""

    def __init__(self, client, poll_s: float = 0.02):
        self.client = client
        self.poll_s = poll_s
        self.changes: list[tuple[float, float, dict]] = []
        self.stats: dict = {}
        self._stop = threading.Event()
        self._last = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            reply = self.client.call("Status", pb.StatusRequest())
            now = time.perf_counter()
            steps = reply.counters.get("env_steps", 0.0)
            if steps != self._last:
                self.changes.append((now, steps, procs.cpu_by_process()))
                self._last = steps
                self.stats = dict(reply.counters)
            self._stop.wait(self.poll_s)

    def start(self):
        self._thread.start()
        return self

    def wait_reports(self, count: int, timeout_s: float) -> bool:
        """Blocks until `count` changes were seen (the first is the starting value)."""
        deadline = time.monotonic() + timeout_s
        while len(self.changes) < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self):
        self._stop.set()
        self._thread.join()


def run_actor(cluster, local, cfg_path: Path, num_envs: int, vector: str, algo, args) -> dict:
    """Runs one actor (`num_envs` envs in a `vector` vector env) for `args.duration`
    measured seconds; returns its rate."""
    from easyrl import config as config_lib
    from easyrl.roles.actor import Actor
    from easyrl.roles.common import RoleContext, StopSignal

    spec = local.spec
    ps0 = client("ps", spec.ps[0], cluster.token)
    memory = client("memory", spec.memory[0], cluster.token)
    inserts_before = memory.call("Status", pb.StatusRequest()).counters.get("memory/0/inserts", 0.0)
    watcher = StepsWatcher(ps0).start()
    kind, per_worker = vector_kind(vector)
    overrides = [
        f"env.num_envs={num_envs}",
        f"env.vector={kind}",
        f"env.envs_per_worker={per_worker}",
    ]
    stop = StopSignal()
    if args.actor_process:
        (process,) = local.start_role("actor", 1, overrides)
        thread = None
    else:
        cfg = config_lib.load(str(cfg_path), overrides)
        ctx = RoleContext(
            cfg=cfg, task=0, cluster=spec, token=cluster.token, run_dir=cluster.run_dir
        )
        import tensorflow as tf

        def body():
            with tf.device("/CPU:0"):
                Actor(ctx, algo, stop).run()

        thread = threading.Thread(target=body, name="actor", daemon=True)
        thread.start()
        process = None
    try:
        # changes[0] is the value before this actor; skip two reports (tracing, first pull).
        if not watcher.wait_reports(4, timeout_s=180.0):
            raise RuntimeError("the actor did not report env steps")
        t0, v0, cpu0 = watcher.changes[3]
        deadline = t0 + args.duration
        while time.perf_counter() < deadline:
            time.sleep(0.05)
        # One more report after the deadline closes the window.
        watcher.wait_reports(len(watcher.changes) + 1, timeout_s=5.0)
        t1, v1, cpu1 = watcher.changes[-1]
    finally:
        watcher.stop()
        stop.set()
        if thread is not None:
            thread.join(timeout=30)
        if process is not None:
            cluster.stop([process])
    inserts_after = memory.call("Status", pb.StatusRequest()).counters.get("memory/0/inserts", 0.0)
    stats = watcher.stats
    ps0.close()
    memory.close()
    steps = int(v1 - v0)
    window = [c for c in watcher.changes if t0 <= c[0] <= t1]
    intervals = [
        (int(b[1] - a[1]), int(b[1] - a[1]), b[0] - a[0]) for a, b in zip(window, window[1:])
    ]
    # The actor's CPU: its process and the env subprocesses it started (in-process: this
    # process, whose other threads only wait or poll Status), not the PS and memory shard.
    used = procs.cpu_used(cpu0, cpu1)
    cpu = used.get("actor-0" if args.actor_process else "bench", 0.0)
    servers = sum(v for k, v in used.items() if k.startswith(("ps-", "memory-")))
    return {
        "rate": timing.Rate(steps, t1 - t0, steps, 0, intervals, cpu),
        "servers_cores": servers / (t1 - t0),
        "inserted": inserts_after - inserts_before,
        "rate_limited": stats.get("actor/rate_limited", 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--num-envs", default="1,8,32", help="comma list of vector sizes")
    parser.add_argument(
        "--config", type=Path, default=CONFIG, help="an async-replay config (DQN, IMPALA)"
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="replay capacity, nothing is sampled (default 1,000,000; trajectory queues: "
        f"{QUEUE_CAPACITY:,} unrolls)",
    )
    parser.add_argument(
        "--vector",
        default=None,
        help=f"env.vector override, one of {', '.join(VECTORS)}, or async/N (N envs per "
        "subprocess); a comma list (async,envpool) measures each in the same run and prints "
        "the ratios to the first",
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument(
        "--actor-process",
        action="store_true",
        help="run the actor as an `easyrl run --role actor` process (default: in-process)",
    )
    args = report.parse_args(parser, tuned_malloc=False)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.num_envs, args.duration = "2", 0.3
    sizes = [int(x) for x in args.num_envs.split(",")]
    vectors = args.vector.split(",") if args.vector else [None]
    for v in vectors:
        if v is not None:
            try:
                vector_kind(v)
            except ValueError as err:
                parser.error(f"--vector: {err}")

    started, load_before = time.monotonic(), report.load_average()
    from easyrl import config as config_lib

    with Cluster() as cluster:
        raw = raw_config(args.config.resolve(), sizes[0], args.capacity, vectors[0])
        cfg_path = write_config(raw, cluster.run_dir, "actor.yaml")
        local = cluster.start_cli(cfg_path, num_ps=1, num_memory=1, wait=False)
        import tensorflow as tf

        from easyrl.roles.common import RoleContext, ShardedWeights, apply_thread_budget

        cfg = config_lib.load(str(cfg_path))
        apply_thread_budget("actor", cfg)  # this process acts, as an actor process does
        ctx = RoleContext(
            cfg=cfg, task=0, cluster=local.spec, token=cluster.token, run_dir=cluster.run_dir
        )
        with tf.device("/CPU:0"):
            algo = ctx.build_algorithm()
        cluster.wait_ready(cluster.servers)
        ps_clients = ctx.clients("ps")
        ShardedWeights(ps_clients, algo.variables).initialize()
        for c in ps_clients:
            c.close()

        results = []
        for n in sizes:
            by_vector = {}
            default = cfg.env.vector + (
                f"/{cfg.env.envs_per_worker}" if cfg.env.envs_per_worker > 1 else ""
            )
            for v in [v or default for v in vectors]:
                kind, per_worker = vector_kind(v)
                env_n = dataclasses.replace(
                    cfg.env, num_envs=n, vector=kind, envs_per_worker=per_worker
                )
                cfg_n = dataclasses.replace(cfg, env=env_n)
                # plain runs half before and half after the actor, so that a change of the
                # machine's load during the actor's run biases neither side.
                with tf.device("/CPU:0"):
                    plain = plain_loop(cfg_n, algo, args.duration / 2, post=False)
                    post = plain_loop(cfg_n, algo, args.duration, post=True)
                actor = run_actor(cluster, local, cfg_path, n, v, algo, args)
                with tf.device("/CPU:0"):
                    plain = merge(plain, plain_loop(cfg_n, algo, args.duration / 2, post=False))
                p, q, a = (r.median_units_per_s for r in (plain, post, actor["rate"]))
                results.append((n, v, p, q, a, actor, plain))
                by_vector[v] = (p, q, a, actor["rate"].units_per_cpu_s)
                cores = actor["rate"].cpu_seconds / actor["rate"].seconds
                print(
                    f"num_envs {n:>3} {v:>7}: plain {p:>8,.0f} steps/s, plain+post {q:>8,.0f}, "
                    f"actor {a:>8,.0f} ({a / p:.2f}x of plain; means "
                    f"{plain.units_per_s:,.0f} / {post.units_per_s:,.0f} / "
                    f"{actor['rate'].units_per_s:,.0f}; rate limited "
                    f"{actor['rate_limited']:.0f}); actor {cores:.2f} cores, "
                    f"{actor['rate'].units_per_cpu_s:,.0f} steps/s per core",
                    flush=True,
                )
            first, *others = by_vector
            for v in others:
                ratios = [b / a for a, b in zip(by_vector[first], by_vector[v], strict=True)]
                print(
                    f"num_envs {n:>3}: {v} / {first}: plain {ratios[0]:.2f}x, plain+post "
                    f"{ratios[1]:.2f}x, actor {ratios[2]:.2f}x, actor per core {ratios[3]:.2f}x",
                    flush=True,
                )

    rows = []
    for n, v, p, q, a, actor, plain in results:
        rate = actor["rate"]
        rows.append(
            [
                n,
                v,
                p,
                q,
                a,
                f"{a / p:.2f}x",
                f"{a / q:.2f}x",
                1e6 / p * n,
                1e6 / a * n,
                f"{rate.cpu_seconds / rate.seconds:.2f}",
                f"{actor['servers_cores']:.2f}",
                plain.units_per_cpu_s,
                rate.units_per_cpu_s,
                int(actor["inserted"]),
            ]
        )
    table = report.markdown_table(
        [
            "num_envs",
            "vector",
            "plain steps/s",
            "plain + post steps/s",
            "actor steps/s",
            "actor / plain",
            "actor / plain+post",
            "plain µs per vector step",
            "actor µs per vector step",
            "actor cores used",
            "PS + memory cores used",
            "plain steps/s per core",
            "actor steps/s per core",
            "items inserted",
        ],
        rows,
    )
    where = (
        "an `easyrl run --role actor` process"
        if args.actor_process
        else "the benchmark process (thread running `Actor.run()`)"
    )
    config = args.config.resolve()
    epsilon = raw["algorithm"].get("epsilon")
    notes = [
        f"Env {cfg.env.id}"
        + (f" (Atari preprocessing {raw['env']['atari']})" if cfg.env.atari else "")
        + f", network and `act` from `{config.relative_to(report.REPO)}` "
        f"({cfg.algorithm.name}, model {raw['model']})"
        + (f", epsilon {epsilon} (actor 0 of 1)" if epsilon is not None else "")
        + ", seed 0.",
        "steps/s are medians over ~0.5 s windows (the actor's: between consecutive reports "
        "to PS shard 0), which resist bursts of load from other processes on this shared "
        f"machine; {args.duration:g} s measured per variant and size, plain split into two "
        "halves taken before and after the actor.",
        f"Actor ran in {where}; PS shard and memory shard were `easyrl run` processes on the "
        "same 2 cores (the actor's rate includes their CPU: Insert handling, Report, Pull). "
        f"actor.send_every {cfg.actor.send_every}, weight_sync_every "
        f"{cfg.actor.weight_sync_every} vector steps; replay {cfg.replay.kind}, nothing sampled.",
        "cores used: CPU seconds per second over the measured window (/proc); the actor's "
        "are its process and the env subprocesses it started"
        + (
            ""
            if args.actor_process
            else " (here the benchmark process, whose other threads only wait or poll Status)"
        )
        + ". steps/s per core = steps / those CPU seconds (plain: the benchmark process and "
        "its env subprocesses), the rate one actor core gives where the actor has its cores "
        "to itself.",
        "vector: sync = envs stepped in the process, async = one subprocess per env "
        "(gymnasium), async/N = N envs per subprocess (`easyrl.envs.workers`), envpool = "
        "EnvPool's C++ threads (`easyrl.envs.pool`).",
        "plain: `act` + `env.step` only. plain + post: adds final observations, the "
        "collector's work (DQN: n-step accumulation; IMPALA: unrolls), episode tracking and "
        "building each InsertRequest (Ape-X: initial priorities with the network; encoding) "
        "- all the actor's in-process work.",
        *(
            [
                f"An env step is one agent step = {cfg.env.atari.frame_skip} emulator frames "
                "(frame skip): frames/s per actor = steps/s x "
                f"{cfg.env.atari.frame_skip}."
            ]
            if cfg.env.atari
            else []
        ),
        "'items inserted' (transitions; IMPALA: unrolls) is the memory shard's insert count "
        "over the actor's whole run (including warm-up), to show the data reached replay.",
    ]
    text = table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    print()
    print(text)
    if args.write:
        suffix = "-process" if args.actor_process else ""
        title = "Actor" + (" (actor as a process)" if args.actor_process else "")
        if config != CONFIG:
            suffix += f"-{config.stem}"
            title += f": {cfg.env.id}"
        if args.vector:
            suffix += "-" + args.vector.replace(",", "-").replace("/", "x")
            title += f" ({args.vector.replace(',', ' vs ')})"
        report.write_section(
            f"bench_actor{suffix}", report.section_text(title, started, load_before, text)
        )
    print(f"min actor/plain: {min(a / p for _, _, p, _, a, _, _ in results):.2f}")


if __name__ == "__main__":
    main()
