"""Memory-shard throughput: Insert items/s and Sample+UpdatePriorities rounds/s.

One memory shard in its own process (prioritized table, alpha 0.6, capacity 100k by
default; `--kind uniform` for the uniform table), the benchmark process as its client
through `easyrl.transport.rpc.Client` + the codec, the way actors and learners talk to it:

- CartPole-size items (obs 4 float32, action int64, reward, next_obs, discount; 48 bytes):
  the shard is a real `python -m easyrl.cli run --role memory` process with a CartPole
  DQN config (`--server spawn` uses the spawned server below instead).
- Atari-size items (obs and next_obs 42x42x4 uint8; 14,128 bytes as whole stacks): the
  shard is a multiprocessing "spawn" child that builds `easyrl.roles.memory.build(cfg,
  spec)` + `rpc.make_server` with that spec and a config with `env.atari` (42x42, 4
  frames), so the table stores each frame once (`easyrl.replay.frames`; `--whole-stacks`:
  `replay.frame_dedup: false`); same servicer, table thread, rate limiter, prefetch. The
  items are sliding stacks of a stream of frames (n + 6 distinct frames per batch of n):
  real Pong frames from the bytes line's run below (`--frames pong`, the default: what
  the write-ahead log compresses, `easyrl.roles.wal.insert_record`) or noise (`--frames
  random`: the log's worst case, nothing compresses), packed by the client as actors
  pack them; batches rotate so that no insert repeats the previous one.

`--items atari` first prints the replay memory one stored transition takes, measured from
the table's own arrays (all of them, divided by the transitions it holds) after inserting
real preprocessed Pong transitions: ALE/Pong-v5 through our gymnasium pipeline (42x42x4),
4 envs, random actions, the DQN n-step accumulator (n = 3), shipped every 16 steps as an
actor ships them, into the table the config's replay kind builds (prioritized,
`--bytes-capacity` items), until the ring has wrapped:

    atari bytes per stored transition: N

Every measurement runs once per `--wal` setting (`replay.wal`; default: group, then none),
so the write-ahead log's cost is read off one run: a shard with the log writes it under the
benchmark's temporary run directory, and the notes give, per item kind, insert items/s with
the log over without and the log bytes written per stored item. `--rounds R` repeats the
settings R times, alternating their order each round (group, none, none, group, ...), so
that drifting load falls on both alike: the tables show each measurement's median over the
rounds, and the log's cost is the median of the R paired ratios (each round's log-on over
its log-off), printed with the R ratios themselves.

Insert: one client thread, client-side encoding included, Ape-X style initial
priorities sent with every batch; then `--insert-threads` inserters at once (default 4, each
its own client and actor index, as a cluster's actors insert; batch `--concurrent-batch`,
default 64, without priorities), where the log's group commit covers several inserts with one
fsync. `--restart-items N` times an Atari shard's restart after a SIGKILL with N items in
its write-ahead log only (it never snapshotted), beside an empty shard's restart:

    atari restart after SIGKILL holding N items in its log: S s (an empty shard: E s)

Sample: batch 512 (= the config's learner batch size, so calls are served from the shard's
prefetch queue as the learner's are), decoded on the client, then an UpdatePriorities call
with new priorities for the sampled keys; from one client thread and from two.

The "vs Reverb 0.14" column compares with DeepMind Reverb 0.14. With `--reverb-python`,
Reverb is measured side by side in the same run, once easyrl's shards have stopped:
`peers/reverb_memory.py` (its docstring says how) makes the same measurements of a
`reverb.Server` in its own process (prioritized table, priority exponent 0.6) with the
same items, batch sizes, capacity, min size and duration, and prints them as JSON.
Reverb is optional: install it into its own virtual environment, never into easyrl's
(it needs tensorflow 2.15):

    python3.11 -m venv /tmp/reverb-venv
    /tmp/reverb-venv/bin/pip install dm-reverb==0.14.0 "tensorflow==2.15.*" "numpy<2"
    python benchmarks/bench_memory.py --reverb-python /tmp/reverb-venv/bin/python --write

Without it the column uses the figures recorded in ../shared/NOTES.md
(`REVERB_INSERTS_PER_S`, `REVERB_ROUNDS_PER_S`).

    python benchmarks/bench_memory.py            # print the tables
    python benchmarks/bench_memory.py --write    # and update benchmarks/RESULTS.md
    python benchmarks/bench_memory.py --items atari --bytes-only   # the bytes line alone
"""

import argparse
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import servers
import timing
from report import REPO, load_average, markdown_table, parse_args, section_text, write_section

from easyrl.replay import Sampled, item_bytes
from easyrl.replay.frames import layout_for
from easyrl.transport.clients import MemoryClient

SMOKE_LINE = r"^\| cartpole \| group \| Sample\(64\) \+ UpdatePriorities, 1 thread\(s\) \| \d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""

REVERB_INSERTS_PER_S = 6_700.0  # single-transition inserts/s, writer flushing every 64
REVERB_ROUNDS_PER_S = {"cartpole": 86.0, "atari": 46.0}  # sample(512) + priority update
"""Reverb 0.14's figures recorded in ../shared/NOTES.md, used without `--reverb-python`."""

ITEM_SPECS = {
    "cartpole": {
        "obs": ((4,), "float32"),
        "action": ((), "int64"),
        "reward": ((), "float32"),
        "next_obs": ((4,), "float32"),
        "discount": ((), "float32"),
    },
    "atari": {
        "obs": ((42, 42, 4), "uint8"),
        "action": ((), "int64"),
        "reward": ((), "float32"),
        "next_obs": ((42, 42, 4), "uint8"),
        "discount": ((), "float32"),
    },
}


def table_spec(spec: dict) -> dict:
    """An `ITEM_SPECS` entry as a table spec: {column: (shape, np.dtype)}."""
    return {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in spec.items()}


def common_config(raw: dict):
    """The config of a raw config dict."""
    from easyrl import config as config_lib

    return config_lib.from_dict(raw)


def random_batch(spec: dict, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    batch = {}
    for name, (shape, dtype) in spec.items():
        if np.dtype(dtype) == np.uint8:
            batch[name] = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        elif np.dtype(dtype).kind == "i":
            batch[name] = rng.integers(0, 2, size=(n, *shape)).astype(dtype)
        else:
            batch[name] = rng.standard_normal((n, *shape)).astype(dtype)
    return batch


def stack_batch(
    spec: dict, n: int, rng: np.random.Generator, pool: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """`random_batch` whose obs and next_obs are the sliding 4-frame stacks of one stream of
    42x42 frames (item i: frames i..i+3 and i+3..i+6, as 3-step transitions): n + 6
    consecutive frames of `pool` ([frames, 42, 42], from a random start), else random ones."""
    batch = random_batch({k: v for k, v in spec.items() if "obs" not in k}, n, rng)
    if pool is not None and len(pool) > n + 6:
        start = int(rng.integers(0, len(pool) - n - 6))
        frames = pool[start : start + n + 6]
    else:
        frames = rng.integers(0, 256, size=(n + 6, 42, 42), dtype=np.uint8)  # [n + 6, H, W]
    stacks = np.stack([frames[j : j + n] for j in range(7)], axis=-1)  # [n, H, W, 7]
    batch["obs"], batch["next_obs"] = stacks[..., :4].copy(), stacks[..., 3:].copy()
    return batch


def raw_config(args, items: str = "cartpole", wal: str = "none") -> dict:
    raw: dict = {
        "algorithm": {"name": "dqn", "batch_size": args.sample_batch},
        "env": {"id": "CartPole-v1"},
        "replay": {
            "kind": args.kind,
            "capacity": args.capacity,
            "alpha": 0.6,
            "min_size_to_sample": args.min_size,
            "wal": wal,
        },
        "run": {"name": "bench-memory", "checkpoint_interval_s": 3600.0},
    }
    if items == "atari":  # 42x42x4 stacks: the table stores frames unless --whole-stacks
        raw["env"]["atari"] = {"screen_size": 42, "frame_stack": 4}
        raw["replay"]["frame_dedup"] = not args.whole_stacks
    return raw


def atari_bytes(args) -> dict:
    """Replay bytes per stored transition of real Pong transitions (module docstring)."""
    import gymnasium

    from easyrl import config as config_lib
    from easyrl.algorithms import dqn
    from easyrl.algorithms.nstep import NStepAccumulator
    from easyrl.envs import env_options, final_observations, make_vector_env
    from easyrl.replay.served import LimitedTable
    from easyrl.roles.memory import shard_setup

    raw = raw_config(args, "atari")
    raw["env"] = {**raw["env"], "id": "ALE/Pong-v5", "num_envs": 4}
    raw["env"]["kwargs"] = {"repeat_action_probability": 0.0}
    raw["replay"].update(capacity=args.bytes_capacity, min_size_to_sample=1)
    cfg = config_lib.from_dict(raw)
    params = cfg.algorithm.params
    obs_space = gymnasium.spaces.Box(0, 255, (42, 42, 4), np.uint8)
    spec = dqn.replay_spec(params, obs_space, gymnasium.spaces.Discrete(6))
    layout = layout_for(cfg, spec)
    setup = dataclasses.replace(shard_setup(cfg, spec, 0), seed=0, send_every=16)
    kind = cfg.replay.kind_spec
    assert kind is not None, "the atari items' config names a replay kind"
    served = kind.build(setup)
    assert isinstance(served, LimitedTable), f"{kind.name} is not a ring table"
    table = served.table
    num_envs, send_every = cfg.env.num_envs, 16
    env = make_vector_env(cfg.env.id, num_envs, vector="sync", seed=0, **env_options(cfg.env))
    nstep = NStepAccumulator(num_envs, params.n_step, params.gamma, (42, 42, 4), np.uint8)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    parts, steps, newest = [], 0, []
    try:
        while table.inserted < 1.5 * table.capacity:
            actions = rng.integers(0, 6, num_envs)
            next_obs, rewards, terminated, truncated, infos = env.step(actions)
            real = final_observations(next_obs, infos, terminated | truncated)
            out = nstep.add(obs, actions, rewards, real, terminated, truncated)
            if out is not None:
                parts.append(out)
            obs, steps = next_obs, steps + 1
            newest.append(next_obs[..., -1])  # [envs, 42, 42]: each env's newest frame
            if steps % send_every == 0 and parts:
                batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
                table.insert(layout.pack(batch) if layout else batch, source=0)
                parts = []
    finally:
        env.close()
    per_item = table.nbytes / table.size
    print(f"atari bytes per stored transition: {per_item:,.0f}", flush=True)
    frames = table.frames
    stored = frames.next / table.inserted if frames is not None else 2 * 4
    print(
        f"  ({table.size:,} transitions stored of {table.inserted:,} inserted, "
        f"{table.dropped} dropped early; frames stored per transition {stored:.3f}; "
        f"whole stacks: {item_bytes(ITEM_SPECS['atari']):,} bytes)",
        flush=True,
    )
    pool = np.stack(newest, axis=1).reshape(-1, 42, 42)  # env by env, each env's stream
    return {
        "bytes_per_transition": per_item,
        "size": table.size,
        "inserted": table.inserted,
        "frames": pool,
    }


def sampled(client: MemoryClient, batch_size: int) -> Sampled:
    """One Sample through the client the learners use."""
    taken = client.sample(batch_size, timeout_s=5.0)
    if taken is None:
        raise RuntimeError("Sample was not ready: the rate limiter blocked it")
    return taken


def inserter(address: str, token: str, batch: dict, layout, actor: int, n: int, per_item: int):
    """(an insert call for a measuring thread, its client): `batch` as actor `actor` ships it
    (frame stacks packed against its own previous shipment)."""
    local = MemoryClient(servers.client("memory", address, token))
    shipped = batch if layout is None else layout.pack(batch)

    def insert():
        local.insert(shipped, actor=actor)
        return n, n * per_item

    return insert, local


def measure_clients(calls: list[tuple], duration_s: float) -> timing.Rate:
    """The rate of (call, client) pairs, each call on a thread of its own; closes the
    clients."""
    try:
        return timing.measure_threads([call for call, _ in calls], duration_s)
    finally:
        for _, local in calls:
            local.close()


def bench_items(cluster: servers.Cluster, items: str, wal: str, args) -> dict:
    """Starts a shard for `items` with write-ahead log `wal` (`replay.wal`), measures
    inserts and sample+update rounds, stops it."""
    spec = ITEM_SPECS[items]
    raw = raw_config(args, items, wal)
    make_batch = functools.partial(stack_batch, pool=args.frame_pool)
    if items != "atari":
        make_batch = random_batch
    layout = layout_for(common_config(raw), table_spec(spec)) if items == "atari" else None
    if items == "cartpole" and args.server == "cli":
        config = servers.write_config(raw, cluster.run_dir, f"memory-{items}.yaml")
        cluster.start_cli(config, num_memory=1)
        how = "`easyrl run --role memory`"
    else:  # a run.dir: the shard's snapshot path, beside which its log is written
        raw["run"]["dir"] = str(cluster.run_dir / f"memory-{items}-{wal}")
        cluster.spawn_memory_server(raw, spec)
        how = "spawned `memory.build` + `rpc.make_server`"
    server = cluster.servers[-1]
    address = server.address
    assert address is not None  # the server is serving
    client = MemoryClient(servers.client("memory", address, cluster.token))
    rng = np.random.default_rng(0)
    per_item = item_bytes(spec)
    prioritized = args.kind == "prioritized"
    result = {
        "items": items,
        "concurrent_batch": args.concurrent_batch,
        "wal": wal,
        "server": how,
        "item_bytes": per_item,
        "inserts": {},
        "rounds": {},
    }

    # Fill past min_size_to_sample first (not measured), so samples never wait.
    fill = make_batch(spec, 512, rng)
    while client.status().counters["memory/0/size"] < args.min_size:
        client.insert(fill)

    for n in args.insert_batches:
        batches = [make_batch(spec, n, rng) for _ in range(8 if layout else 1)]
        priorities = rng.random(n).astype(np.float32)
        turn = iter(range(1 << 62))

        def insert(batches=batches, priorities=priorities, n=n, turn=turn):
            batch = batches[next(turn) % len(batches)]
            if layout is not None:  # as an actor ships frame stacks
                batch = layout.pack(batch)
            client.insert(batch, priorities if prioritized else None)
            return n, n * per_item

        rate = timing.measure(insert, args.duration)
        result["inserts"][n] = rate
        print(
            f"  {items} log {wal} insert batch {n:>4}: {rate.units_per_s:>10,.0f} items/s "
            f"{rate.per_s:>8,.0f} calls/s {rate.mb_per_s:>8.1f} MB/s",
            flush=True,
        )

    # Several inserters at once (a cluster's actors; each its own client and actor index),
    # where a write-ahead log's group commit covers all their inserts with one fsync.
    result["concurrent"] = {}
    for threads in args.insert_threads:
        n = args.concurrent_batch
        rate = measure_clients(
            [
                inserter(address, cluster.token, make_batch(spec, n, rng), layout, a, n, per_item)
                for a in range(threads)
            ],
            args.duration,
        )
        result["concurrent"][threads] = rate
        print(
            f"  {items} log {wal} insert batch {n:>4}, {threads} inserters: "
            f"{rate.units_per_s:>10,.0f} items/s",
            flush=True,
        )

    def sampler(seed: int):
        local = MemoryClient(servers.client("memory", address, cluster.token))
        local_rng = np.random.default_rng(seed)

        def round_trip():
            sample = sampled(local, args.sample_batch)
            local.update_priorities(sample.keys, local_rng.random(len(sample.keys)))
            return len(sample.keys), sum(a.nbytes for a in sample.data.values())

        return round_trip, local

    # Sample alone (what a learner without priority updates does): once with the
    # prefetched batch size (served from the ready queue) and once with one item less
    # (served by the table thread on request).
    result["sample_only"] = {}
    for size in (args.sample_batch, args.sample_batch - 1):
        if size < 1:
            continue

        def sample_only(size=size):
            sample = sampled(client, size)
            return len(sample.keys), sum(a.nbytes for a in sample.data.values())

        rate = timing.measure(sample_only, args.duration)
        result["sample_only"][size] = rate
        print(
            f"  {items} sample({size}) only: {rate.per_s:>8,.1f} calls/s "
            f"{rate.mb_per_s:>8.1f} MB/s",
            flush=True,
        )

    for threads in args.sample_threads:
        rate = measure_clients([sampler(seed) for seed in range(threads)], args.duration)
        result["rounds"][threads] = rate
        print(
            f"  {items} sample({args.sample_batch})+update, {threads} thread(s): "
            f"{rate.per_s:>8,.1f} rounds/s {rate.mb_per_s:>8.1f} MB/s",
            flush=True,
        )
    status = client.status()
    result["status"] = {k.split("/", 2)[-1]: v for k, v in status.counters.items()}
    client.close()
    cluster.stop([server])
    return result


def restart_time(cluster: servers.Cluster, args) -> tuple[float, float, int]:
    """Seconds until an Atari shard answers again after a SIGKILL, holding `--restart-items`
    items in its write-ahead log only (the spawned shard never snapshots), and the same for
    an empty one (process start and imports); and the items the restarted shard holds."""
    spec, n = ITEM_SPECS["atari"], args.restart_items
    raw = raw_config(args, "atari", "group")
    raw["replay"]["capacity"] = n
    raw["run"]["dir"] = str(cluster.run_dir / "memory-restart")
    layout = layout_for(common_config(raw), table_spec(spec))
    assert layout is not None  # Atari stacks
    rng = np.random.default_rng(1)
    batches = [layout.pack(stack_batch(spec, 512, rng, args.frame_pool)) for _ in range(8)]
    seconds = []
    for fill in (0, n):
        server = cluster.spawn_memory_server(raw, spec)
        assert server.address is not None  # the server is serving
        client = MemoryClient(servers.client("memory", server.address, cluster.token))
        inserted = 0
        while inserted < fill:
            client.insert(batches[(inserted // 512) % len(batches)], actor=0)
            inserted += 512
        client.close()
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        cluster.servers.remove(server)
        started = time.monotonic()
        again = cluster.spawn_memory_server(raw, spec)
        seconds.append(time.monotonic() - started)
        assert again.address is not None
        client = MemoryClient(servers.client("memory", again.address, cluster.token))
        held = int(client.status().counters["memory/0/size"])
        client.close()
        cluster.stop([again])
        shutil.rmtree(raw["run"]["dir"])
    return seconds[0], seconds[1], held


def bench_reverb(items: list[str], args) -> dict:
    """Reverb 0.14 measured by `peers/reverb_memory.py` in `--reverb-python`: its JSON line
    ({items: {"insert_items_per_s": {batch: items/s}, "sample_rounds_per_s": ...}})."""
    command = [args.reverb_python, str(REPO / "benchmarks" / "peers" / "reverb_memory.py")]
    specs = {kind: ITEM_SPECS[kind] for kind in items}  # the peer script imports no easyrl
    command += ["--specs", json.dumps(specs), "--duration", str(args.duration)]
    command += ["--capacity", str(args.capacity), "--min-size", str(args.min_size)]
    command += ["--insert-batches", ",".join(str(n) for n in args.insert_batches)]
    command += ["--sample-batch", str(args.sample_batch)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # stderr is kept for failures: Reverb's writer warns of "alarmingly high" pending
    # items on every flush of a 512-item batch.
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    *lines, last = done.stdout.strip().splitlines()
    print("\n".join(lines), flush=True)
    return json.loads(last)


def report(by_round: dict[tuple[str, str], list[dict]], args, reverb: dict | None = None) -> str:
    """The tables (each rate the median of its rounds); `reverb` is `bench_reverb`'s
    measurement, else the recorded figures."""
    results = [merge_rounds(rounds) for rounds in by_round.values()]
    rows = []
    for r in results:
        if reverb is not None:
            measured = reverb[r["items"]]
            inserts = {int(n): v for n, v in measured["insert_items_per_s"].items()}
            rounds = measured["sample_rounds_per_s"]
        else:
            inserts = dict.fromkeys(r["inserts"], REVERB_INSERTS_PER_S)
            rounds = REVERB_ROUNDS_PER_S[r["items"]]
        for n, rate in r["inserts"].items():
            rows.append(
                [
                    r["items"],
                    r["wal"],
                    f"Insert, batch {n}",
                    rate.units_per_s,
                    rate.per_s,
                    rate.mb_per_s,
                    rate.ms_per_call,
                    f"{rate.units_per_s / inserts[n]:.2f}x of {inserts[n] / 1e3:,.1f}k items/s",
                ]
            )
        for size, rate in r["sample_only"].items():
            how = "prefetched size" if size == args.sample_batch else "not the prefetched size"
            rows.append(
                [
                    r["items"],
                    r["wal"],
                    f"Sample({size}) only ({how})",
                    rate.units_per_s,
                    rate.per_s,
                    rate.mb_per_s,
                    rate.ms_per_call,
                    "",
                ]
            )
        for threads, rate in r["rounds"].items():
            rows.append(
                [
                    r["items"],
                    r["wal"],
                    f"Sample({args.sample_batch}) + UpdatePriorities, {threads} thread(s)",
                    rate.units_per_s,
                    rate.per_s,
                    rate.mb_per_s,
                    rate.ms_per_call * (threads if threads > 1 else 1),
                    f"{rate.per_s / rounds:.2f}x of {rounds:,.0f} rounds/s",
                ]
            )
    table = markdown_table(
        [
            "items",
            "replay.wal",
            "operation",
            "items/s",
            "calls (rounds)/s",
            "MB/s",
            "ms/call",
            "vs Reverb 0.14",
        ],
        rows,
    )
    servers = "; ".join(
        f"{r['items']} ({r['item_bytes']:,} B/item): {r['server']}"
        for r in results
        if r["wal"] == results[0]["wal"]
    )
    if reverb is not None:
        vs_reverb = (
            f"Reverb {reverb['reverb_version']} (tensorflow {reverb['tensorflow_version']}) "
            "measured in this run, after easyrl's shards had stopped, by "
            "`peers/reverb_memory.py` in its own venv: a `reverb.Server` in its own process, "
            "prioritized table (priority exponent 0.6, FIFO remover, MinSize rate limiter), "
            "same items, capacity, min size and duration; Insert batch n = n single-step "
            "items through one `TrajectoryWriter` then `flush()`; a round = the next "
            f"batch of a `TrajectoryDataset` batched to {args.sample_batch}, decoded into "
            "numpy, then `mutate_priorities` for its keys, from one thread (the 2-thread "
            "rows are compared with that too)."
        )
    else:
        vs_reverb = (
            "Reverb figures recorded in ../shared/NOTES.md, not measured in this run "
            "(`--reverb-python` measures them): 6.7k single-transition inserts/s with the "
            "writer flushing every 64 items (so compare both batch 1 and batch 64), 86 "
            "sample(512)+update rounds/s for CartPole-size items, 46 for 42x42x4 uint8 frames."
        )
    frames_text = "ALE/Pong-v5 frames" if args.frame_pool is not None else "random frames"
    notes = [
        f"Table: {args.kind}"
        + (", alpha 0.6" if args.kind == "prioritized" else "")
        + f", capacity {args.capacity:,}, min_size_to_sample {args.min_size:,}, no "
        "samples_per_insert limit; one memory shard in its own process, client in the "
        "benchmark process over loopback with token auth.",
        f"Servers: {servers}.",
        "MB/s counts raw tensor bytes (items x item size), not protobuf framing. Insert "
        "includes client-side encoding"
        + (
            " and sends one priority per item (as Ape-X actors do)"
            if args.kind == "prioritized"
            else ""
        )
        + "; Sample includes client-side decoding; ms/call is per call (per round, per thread).",
        f"Sample({args.sample_batch}) only is served from the shard's prefetch queue, which "
        "the table thread refills only when another request reaches it or after its 50 ms "
        "idle wait (`MemoryServer._table_loop`); with UpdatePriorities calls in between "
        f"(the rounds) it is refilled at once. Sample({args.sample_batch - 1}) goes through "
        "the table thread on request.",
        "Atari items: the table stores each 42x42 frame once and rebuilds the stacks when "
        "it samples (`easyrl.replay.frames`"
        + (", off here: --whole-stacks" if args.whole_stacks else "")
        + f"); inserted batches are sliding stacks of {frames_text}, packed by the client "
        "(distinct frames + indexes, as actors ship them); MB/s counts whole-stack bytes.",
        "Inserts land in ring slots never written before (the 100k ring does not wrap in "
        "these runs), so they include the first-touch page faults of the lazily mapped, "
        "preallocated ring (about 14 MB per 1,000 Atari items).",
        wal_note(by_round),
        vs_reverb,
    ]
    return table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def median_rate(rates: list[timing.Rate]) -> timing.Rate:
    """The middle one of several measurements of one thing, by units/s (calls/s when no
    units); of an even count, the lower middle."""
    ordered = sorted(rates, key=lambda r: (r.units_per_s, r.per_s))
    return ordered[(len(ordered) - 1) // 2]


def merge_rounds(rounds: list[dict]) -> dict:
    """One result from the same shard setting measured over several rounds: each rate the
    median of its rounds (`median_rate`); the counters of the last round."""
    merged = dict(rounds[-1])
    for key in ("inserts", "concurrent", "sample_only", "rounds"):
        merged[key] = {k: median_rate([r[key][k] for r in rounds]) for k in rounds[0][key]}
    return merged


def paired_ratios(on: list[dict], off: list[dict], key: str, n: int) -> str:
    """Round by round, units/s of `on[i][key][n]` over `off[i][key][n]`: their median,
    then the ratios themselves when there are several."""
    ratios = [
        a[key][n].units_per_s / b[key][n].units_per_s
        for a, b in zip(on, off, strict=True)
        if n in a[key] and n in b[key]
    ]
    middle = sorted(ratios)[(len(ratios) - 1) // 2]
    each = f" ({', '.join(f'{x:.2f}' for x in ratios)})" if len(ratios) > 1 else ""
    return f"{middle:.2f}{each}"


def wal_note(by_round: dict[tuple[str, str], list[dict]]) -> str:
    """What the write-ahead log costs: insert items/s with it over without, per item kind
    and batch (the median of the rounds' paired ratios, and each), and the bytes it wrote
    per stored item."""
    parts = []
    for (items, wal), rounds in by_round.items():
        status = rounds[-1]["status"]
        if wal != "none" and status.get("inserts"):
            written = status.get("wal_bytes", 0.0) / status["inserts"]
            syncs = status.get("inserts", 0.0) / max(1.0, status.get("wal_syncs", 0.0))
            parts.append(
                f"{items}, log {wal}: {written:,.0f} log bytes per stored item "
                f"({rounds[-1]['item_bytes']:,} B/item whole), {syncs:,.0f} items per fsync"
            )
            off = by_round.get((items, "none"))
            if off is not None:
                ratios = ", ".join(
                    f"batch {n} {paired_ratios(rounds, off, 'inserts', n)}"
                    for n in rounds[0]["inserts"]
                )
                parts.append(
                    f"{items} insert items/s, log {wal} over none, median of {len(rounds)} "
                    f"paired round(s): {ratios}"
                )
                concurrent = ", ".join(
                    f"{k} inserters x {rounds[0]['concurrent_batch']} "
                    f"{paired_ratios(rounds, off, 'concurrent', k)}"
                    for k in rounds[0]["concurrent"]
                )
                if concurrent:
                    parts.append(f"at once: {concurrent}")
    return (
        "replay.wal (easyrl.roles.wal): group = an Insert answered once its record is "
        "fsynced (one fsync per group), none = no log; log files on this host's ext4 "
        "virtual disk. " + "; ".join(parts) + "."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kind", choices=["prioritized", "uniform"], default="prioritized")
    parser.add_argument("--items", default="cartpole,atari", help="comma list: cartpole,atari")
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--insert-batches", default="1,64,512", help="comma list of sizes")
    parser.add_argument(
        "--insert-threads",
        default="4",
        help="comma list: inserters at once (each its own client), batch --concurrent-batch",
    )
    parser.add_argument("--concurrent-batch", type=int, default=64)
    parser.add_argument(
        "--restart-items",
        type=int,
        default=0,
        help="Atari items a shard holds in its log when killed and restarted (timed; 0: skip)",
    )
    parser.add_argument("--sample-batch", type=int, default=512)
    parser.add_argument("--sample-threads", default="1,2", help="comma list of thread counts")
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--min-size", type=int, default=1000, help="replay.min_size_to_sample")
    parser.add_argument(
        "--whole-stacks",
        action="store_true",
        help="Atari: store whole frame stacks per item (replay.frame_dedup: false)",
    )
    parser.add_argument(
        "--bytes-capacity",
        type=int,
        default=2000,
        help="Atari bytes line: capacity of the table filled with real Pong transitions",
    )
    parser.add_argument(
        "--bytes-only", action="store_true", help="Atari: print the bytes line alone"
    )
    parser.add_argument(
        "--server",
        choices=["cli", "spawn"],
        default="cli",
        help="how the CartPole shard is started (Atari always uses spawn)",
    )
    parser.add_argument(
        "--wal", default="group,none", help="comma list of replay.wal settings to measure"
    )
    parser.add_argument(
        "--frames",
        choices=["pong", "random"],
        default="pong",
        help="Atari items' frames: real Pong frames (from the bytes line's run) or noise",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every --wal setting this many times, alternating their order",
    )
    parser.add_argument(
        "--reverb-python",
        help="Python of the venv with dm-reverb 0.14: measure Reverb side by side (docstring)",
    )
    args = parse_args(parser)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.items, args.duration, args.insert_batches = "cartpole", 0.2, "1,64"
        args.sample_batch, args.sample_threads, args.capacity, args.min_size = 64, "1", 5000, 100
        args.wal, args.rounds, args.insert_threads, args.concurrent_batch = "group,none", 2, "2", 8
        args.restart_items = 1024
    args.insert_threads = [int(x) for x in args.insert_threads.split(",") if x]
    args.insert_batches = [int(x) for x in args.insert_batches.split(",")]
    args.sample_threads = [int(x) for x in args.sample_threads.split(",")]
    items = [x for x in args.items.split(",") if x]
    for name in items:
        if name not in ITEM_SPECS:
            parser.error(f"unknown --items {name!r}; known: {', '.join(ITEM_SPECS)}")

    started, load_before = time.monotonic(), load_average()
    args.frame_pool = None
    if "atari" in items:
        played = atari_bytes(args)
        if args.bytes_only:
            return
        if args.frames == "pong":
            args.frame_pool = played["frames"]
    by_round: dict[tuple[str, str], list[dict]] = {}
    with servers.Cluster() as cluster:
        for name in items:
            wals = args.wal.split(",")
            for turn in range(args.rounds):
                for wal in wals if turn % 2 == 0 else wals[::-1]:
                    print(f"{name}, replay.wal {wal}, round {turn + 1}:", flush=True)
                    result = bench_items(cluster, name, wal, args)
                    by_round.setdefault((name, wal), []).append(result)
        if args.restart_items:
            empty, full, held = restart_time(cluster, args)
            print(
                f"atari restart after SIGKILL holding {held:,} items in its log: {full:.1f} s "
                f"(an empty shard: {empty:.1f} s)",
                flush=True,
            )
    reverb = bench_reverb(items, args) if args.reverb_python else None
    text = report(by_round, args, reverb)
    print()
    print(text)
    if args.write:
        title = f"Memory shard ({args.kind}" + (", tuned malloc)" if args.tuned_malloc else ")")
        section = section_text(title, started, load_before, text)
        suffix = "-tuned-malloc" if args.tuned_malloc else ""
        write_section(f"bench_memory-{args.kind}{suffix}", section)


if __name__ == "__main__":
    main()
