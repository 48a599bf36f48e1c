"""DeepMind Reverb 0.14 throughput, run by `bench_memory.py --reverb-python` in Reverb's venv.

    python reverb_memory.py --specs JSON --duration 1.5 --capacity 100000 \\
        --min-size 1000 [--insert-batches 1,64,512] [--sample-batch 512]

The same measurements as `bench_memory.py` makes of easyrl's memory shard, with the same
items, on the same kind of setup: one `reverb.Server` in its own process (a
multiprocessing "spawn" child: easyrl's shard is a process of its own too, and a server
in this process would share its address space and threads with the client), one table
"replay" (prioritized, priority exponent 0.6, FIFO remover, `max_size` --capacity,
`MinSize(--min-size)` rate limiter, signature = the item), the client in this process
over loopback. A fresh server per kind of item.

- Insert: one `TrajectoryWriter` (`num_keep_alive_refs=1`, so each item is its own chunk
  of one step, the way single transitions are stored); per batch of n items, n x (append
  one step, `create_item` on it with a random priority), then `flush()`, which returns
  once the server has confirmed every item. Client-side work (tensor conversion, chunk
  compression) is included. Items/s.
- Sample + update: `reverb.TrajectoryDataset.from_table_signature(...)` batched to
  --sample-batch, the input pipeline Reverb documents for learners (`Client.sample` is
  "NOT to be used for real training": it requests one item at a time); per round, the next
  batch decoded into numpy (data and keys), then `Client.mutate_priorities` with a random
  priority for each sampled key. One client thread. Rounds/s, after one unmeasured round
  that starts the dataset's workers. The dataset keeps 2 x --sample-batch samples in
  flight per worker (Acme's default), so it samples ahead of the priority updates, as
  easyrl's shard does from its prefetch queue. `Client.sample` made a fifth of the rounds
  or fewer in trials.

Items: --specs, `bench_memory.py`'s ITEM_SPECS as JSON ({kind: {column: [shape, dtype]}}:
"cartpole" = obs float32[4], action int64, reward float32, next_obs float32[4], discount
float32; "atari" = the same with obs and next_obs uint8[42,42,4], whole stacks). Items
whose obs are uint8 stacks get the sliding stacks of one stream of random frames that
`bench_memory.py` sends, 8 batches in rotation. The table is filled to --min-size first
(not measured). Each measurement runs --duration seconds after 0.2 s of unmeasured calls.

Prints a line per measurement, then one JSON object on the last line:
{"reverb_version", "tensorflow_version", "cartpole": {"insert_items_per_s": {"1", "64",
"512"}, "sample_rounds_per_s"}, "atari": {...}}. Imports no easyrl.
"""

import argparse
import itertools
import json
import multiprocessing
import time
from importlib import metadata

import numpy as np
import reverb
import tensorflow as tf

TABLE = "replay"


def make_batch(spec: dict, n: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """n items as steps ({column: array}); obs and next_obs of Atari items are the sliding
    4-frame stacks of one stream of random frames, as `bench_memory.stack_batch`."""
    batch = {}
    for name, (shape, dtype) in spec.items():
        if np.dtype(dtype).kind == "i":
            batch[name] = rng.integers(0, 2, size=(n, *shape)).astype(dtype)
        else:
            batch[name] = rng.standard_normal((n, *shape)).astype(dtype)
    if spec["obs"][1] == "uint8":  # frame stacks
        height, width, _ = spec["obs"][0]
        frames = rng.integers(0, 256, size=(n + 6, height, width), dtype=np.uint8)
        stacks = np.stack([frames[j : j + n] for j in range(7)], axis=-1)
        batch["obs"], batch["next_obs"] = stacks[..., :4].copy(), stacks[..., 3:].copy()
    return [{name: column[i] for name, column in batch.items()} for i in range(n)]


def serve(spec: dict, capacity: int, min_size: int, conn) -> None:
    """The server process: one table, its port sent on `conn`, stops when `conn` closes."""
    signature = {name: tf.TensorSpec(shape, dtype) for name, (shape, dtype) in spec.items()}
    table = reverb.Table(
        name=TABLE,
        sampler=reverb.selectors.Prioritized(priority_exponent=0.6),
        remover=reverb.selectors.Fifo(),
        max_size=capacity,
        rate_limiter=reverb.rate_limiters.MinSize(min_size),
        signature=signature,
    )
    server = reverb.Server(tables=[table])
    conn.send(server.port)
    try:
        conn.recv()
    except EOFError:
        pass
    server.stop()


def measure(fn, duration_s: float, warmup_s: float = 0.2, min_calls: int = 3) -> dict:
    """Calls `fn` (which returns the items it moved) for `duration_s` after `warmup_s`;
    `bench_memory.py`'s `timing.measure`."""
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        fn()
    calls = units = 0
    start = time.perf_counter()
    while True:
        units += fn()
        calls += 1
        now = time.perf_counter()
        if now - start >= duration_s and calls >= min_calls:
            seconds = now - start
            return {"calls_per_s": calls / seconds, "items_per_s": units / seconds}


def bench_items(items: str, spec: dict, args) -> dict:
    """Starts a server for `spec` (items of kind `items`), measures inserts and
    sample+update rounds, stops it."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=serve, args=(spec, args.capacity, args.min_size, child))
    process.start()
    child.close()
    address = f"localhost:{parent.recv()}"
    client = reverb.Client(address)
    rng = np.random.default_rng(0)
    result = {"insert_items_per_s": {}}
    stacks = spec["obs"][1] == "uint8"  # frame stacks: several batches in rotation
    try:
        with client.trajectory_writer(num_keep_alive_refs=1) as writer:

            def insert(steps, priorities) -> int:
                for step, priority in zip(steps, priorities):
                    writer.append(step)
                    trajectory = {name: writer.history[name][-1] for name in spec}
                    writer.create_item(TABLE, priority, trajectory)
                writer.flush()
                return len(steps)

            fill = make_batch(spec, 512, rng)
            while client.server_info()[TABLE].current_size < args.min_size:
                insert(fill, rng.random(512).tolist())
            for n in args.insert_batches:
                batches = [make_batch(spec, n, rng) for _ in range(8 if stacks else 1)]
                turns, priorities = itertools.cycle(batches), rng.random(n).tolist()
                rate = measure(lambda t=turns, p=priorities: insert(next(t), p), args.duration)
                result["insert_items_per_s"][str(n)] = rate["items_per_s"]
                print(
                    f"  reverb {items} insert batch {n:>4}: {rate['items_per_s']:>10,.0f} "
                    f"items/s {rate['calls_per_s']:>8,.0f} calls/s",
                    flush=True,
                )

        dataset = reverb.TrajectoryDataset.from_table_signature(
            address, TABLE, max_in_flight_samples_per_worker=2 * args.sample_batch
        ).batch(args.sample_batch, drop_remainder=True)
        batches = iter(dataset)

        def round_trip() -> int:
            sample = next(batches)
            data = {name: tensor.numpy() for name, tensor in sample.data.items()}
            keys = sample.info.key.numpy().tolist()
            client.mutate_priorities(TABLE, dict(zip(keys, rng.random(len(keys)).tolist())))
            return len(data["action"])

        round_trip()  # starts the dataset's sampler workers: not measured
        rate = measure(round_trip, args.duration)
        result["sample_rounds_per_s"] = rate["calls_per_s"]
        print(
            f"  reverb {items} sample({args.sample_batch})+update, 1 thread: "
            f"{rate['calls_per_s']:>8,.1f} rounds/s",
            flush=True,
        )
    finally:
        parent.close()
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--specs", required=True, help="JSON {kind: {column: [shape, dtype]}}")
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per measurement")
    parser.add_argument("--insert-batches", default="1,64,512", help="comma list of sizes")
    parser.add_argument("--sample-batch", type=int, default=512)
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--min-size", type=int, default=1000)
    args = parser.parse_args()
    args.insert_batches = [int(x) for x in args.insert_batches.split(",")]
    out = {
        "reverb_version": metadata.version("dm-reverb"),
        "tensorflow_version": tf.__version__,
    }
    for items, columns in json.loads(args.specs).items():
        spec = {name: (tuple(shape), dtype) for name, (shape, dtype) in columns.items()}
        print(f"reverb {items}:", flush=True)
        out[items] = bench_items(items, spec, args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
