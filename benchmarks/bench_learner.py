"""The learner role against its own train step: how much of the compute rate survives the
learner's plumbing.

Two rates of one learner, measured in one run for `--config` (default
configs/pong_impala_2core.yaml; any config whose algorithm uses the async_replay flow):

- compute: the agent's `learn` (the compiled step the learner runs: with one learner that
  applies its own updates, the gradients, the optimizer's step and the target networks' in
  one call, `easyrl.roles.learner.fuse_update`) called in a
  loop in this process on one batch held in memory (sampled once from the shard below, so
  it has exactly the learner's shapes and dtypes), no transport, with TensorFlow's pools
  sized to the learner role's thread budget (what the launcher gives it on this host:
  `cluster.threads.learner`, else what the PS and memory shards leave of the cores), so
  that both sides compute on as many threads and the ratio is the learner's plumbing.
  This process re-executes itself with the launcher's glibc settings (`MALLOC_ENV`), which
  every role process gets: the same allocator on both sides. Measured before and after the
  learner's window; their mean is the reference. The gradients alone (the step before it
  takes the optimizer's in) are timed once first, for a line of their own.
- learner: the real learner role (`easyrl run --role learner`, started by the local
  launcher: its prefetch threads, batch queue, gradient step, push threads and reports)
  fed by one real memory shard process and one PS shard process, no actors. The memory
  shard is filled before the learner starts and kept full during the window by a feeder
  thread in this process that inserts real-shaped items of the config's replay spec the
  way an actor ships them (`env.num_envs` items per Insert, Atari frame stacks as their
  distinct frames, held back by the shard's back-pressure like an actor), so the learner
  never waits for data: a trajectory FIFO, whose samples remove items, stays full.
  Updates/s come from PS shard 0's `updates` counter, between two of the learner's reports.

Both print updates/s and agent steps/s (batch steps per update x updates/s); the learner's
window also the CPU cores of each role and process (from /proc; `bench` is this process:
the feeder and the polling). The last line is `learner/compute: R` (learner updates/s over
compute updates/s; the goal of issue 38 is R >= 0.8).

A replay config with a rate limiter (`replay.samples_per_insert`) ties the learner to the
feeder's inserts; pass `--set replay.samples_per_insert=null` to measure the learner alone.

    python benchmarks/bench_learner.py --config configs/pong_impala_2core.yaml [--write]
"""

import argparse
import math
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import procs
import report
import timing
from servers import NO_STOP, READY_TIMEOUT_S, Cluster

from easyrl.errors import TransportError

SMOKE_LINE = r"^learner/compute: \d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""
SMOKE_OVERRIDES = ("env.num_envs=2", "replay.capacity=8", "learner.updates_per_report=1")
"""`--smoke`: small inserts, a small FIFO to fill, a report (a window boundary) per update."""
FEED_BATCHES = 4
"""Distinct item batches the feeder cycles through (each ships fresh frames)."""


class Window(NamedTuple):
    """PS shard 0's `updates` counter and the CPU of every process at one instant."""

    time: float
    updates: float
    cpu: dict[int, tuple[str, float]]


def real_shaped(spec: dict, layout, n: int, num_actions: int, rng) -> dict:
    """`n` items of the replay `spec` with random contents; the frame stacks of `layout`
    (if any) slide one frame a step along an item, as an actor's do, so that shipping them
    as distinct frames costs what it costs an actor."""
    batch = {}
    for name, (shape, dtype) in spec.items():
        dtype = np.dtype(dtype)
        lead = None if layout is None else layout.columns.get(name)
        if layout is not None and lead is not None:
            steps, k = math.prod(lead), layout.stack
            frames = rng.integers(0, 256, (n, steps + k - 1, *layout.frame_shape), np.uint8)
            windows = np.arange(steps)[:, None] + np.arange(k)  # [L, k]
            stacks = layout.join(frames[:, windows])  # [n, L, H, W, k * c]
            batch[name] = stacks.reshape(n, *shape).astype(dtype)
        elif dtype == np.bool_:
            batch[name] = rng.random((n, *shape)) < 0.01
        elif np.issubdtype(dtype, np.integer):
            high = num_actions if name == "action" else 2
            batch[name] = rng.integers(0, high, (n, *shape)).astype(dtype)
        else:
            batch[name] = rng.random((n, *shape)).astype(dtype)
    return batch


class Feeder:
    """A thread that inserts item batches into a memory shard without pause, retrying an
    Insert the shard holds back (a full queue, a rate limiter) as an actor's sender does."""

    def __init__(self, memory, batches: list[dict]):
        self.memory, self.batches = memory, batches
        self.stop = threading.Event()
        self.inserts = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def _run(self) -> None:
        from easyrl.roles.actor import RETRY_INSERT

        i = 0
        try:
            while not self.stop.is_set():
                try:
                    self.memory.insert(self.batches[i % len(self.batches)])
                except TransportError as err:
                    if err.code not in RETRY_INSERT:
                        raise
                    continue
                i += 1
                self.inserts += 1
        except BaseException as err:  # re-raised by `check`
            self.error = err

    def check(self) -> None:
        """Raises what stopped the thread, if anything did."""
        if self.error is not None:
            raise self.error

    def __enter__(self) -> "Feeder":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def fill(memory, batch: dict, capacity: int) -> None:
    """Inserts `batch` until the shard holds `capacity` items or refuses more."""
    while True:
        size = memory.status().counters.get("memory/0/size", 0.0)
        if size + len(next(iter(batch.values()))) > capacity:
            return
        try:
            memory.insert(batch)
        except TransportError:
            return


def compute_rate(algo, batch: dict, weights, duration_s: float) -> timing.Rate:
    """The agent's `learn` on one held batch, called for `duration_s` after a first call
    (tracing) and a warm-up: a Rate of calls (updates) with this process's CPU."""
    algo.learn(batch, weights)
    return timing.measure(
        lambda: (algo.learn(batch, weights), None)[1],
        duration_s,
        warmup_s=min(2.0, duration_s),
        cpu_label="bench",
    )


def progress(line: str) -> None:
    """A figure as soon as it is measured (to stderr): a run cut short still shows it."""
    print(line, file=sys.stderr, flush=True)


def report_boundary(ps, since: float | None, timeout_s: float) -> Window:
    """Waits for PS shard 0's `updates` counter to move past `since` (a learner report
    arrived) and returns that instant, so that a window spans whole reports."""
    deadline = time.monotonic() + timeout_s
    while True:
        updates = ps.status().counters.get("updates", 0.0)
        if since is None or updates > since:
            return Window(time.monotonic(), updates, procs.cpu_by_process())
        if time.monotonic() > deadline:
            raise TimeoutError(f"no learner report within {timeout_s:.0f} s")
        time.sleep(0.02)


def learner_window(learner_child, ps, feeder: Feeder, args) -> dict:
    """Measures the learner role's updates/s and each process's cores over `--duration`
    seconds after its first update plus `--warmup`."""
    report_boundary(ps, 0.0, READY_TIMEOUT_S)  # the first update
    time.sleep(args.warmup)
    start = report_boundary(ps, None, 1.0)
    start = report_boundary(ps, start.updates, 30.0)
    deadline = start.time + args.duration
    while time.monotonic() < deadline:
        feeder.check()
        if learner_child.process.poll() is not None:
            raise RuntimeError(f"the learner exited (log: {learner_child.log_path})")
        time.sleep(0.2)
    end = report_boundary(ps, ps.status().counters.get("updates", 0.0), 30.0)
    seconds = end.time - start.time
    per_process = procs.cores_used(start.cpu, end.cpu, seconds)
    return {
        "updates": (end.updates - start.updates) / seconds,
        "seconds": seconds,
        "per_process": per_process,
        "cores": procs.by_role(per_process),
    }


def run(args) -> dict:
    """Starts the servers, measures compute alone, the learner role, compute alone again."""
    import tensorflow as tf

    from easyrl.algorithms import registry
    from easyrl.algorithms.optimizers import LocalOptimizer
    from easyrl.replay.frames import layout_for
    from easyrl.roles.common import RoleContext, limit_tf_threads
    from easyrl.roles.learner import applies_locally, fuse_update, pick_device

    overrides = [*NO_STOP, *args.overrides]
    with Cluster() as bench:
        servers = bench.start_cli(args.config_path, 1, 1, overrides, actors=1)
        cfg = servers.cfg
        # Both sides compute on the thread budget the launcher gives the learner role
        # (`cluster.threads.learner` sets it): the ratio is the learner's plumbing, not its
        # placement.
        threads = servers.threads["learner"]
        limit_tf_threads(threads)
        ctx = RoleContext(cfg, 0, servers.spec, bench.token, servers.run_dir)
        with tf.device(pick_device(cfg.learner.device)):
            algo = ctx.build_algorithm(learner=True)
        if algo.flow != "async_replay":
            raise SystemExit(f"{cfg.algorithm.name} learns in flow {algo.flow}, not async_replay")
        obs_space, action_space = ctx.spaces()
        table_spec = registry.replay_spec(cfg, obs_space, action_space)
        layout = layout_for(cfg, table_spec)
        rng = np.random.default_rng(0)
        num_actions = int(getattr(action_space, "n", 2))
        raw = [
            real_shaped(table_spec, layout, cfg.env.num_envs, num_actions, rng)
            for _ in range(FEED_BATCHES)
        ]
        batches = [layout.pack(b) if layout is not None else b for b in raw]
        memory, ps = ctx.client("memory", 0), ctx.client("ps", 0)
        fill(memory, batches[0], cfg.replay.capacity)
        sampled = None
        while sampled is None:
            sampled = memory.sample(cfg.algorithm.params.batch_size, timeout_s=5.0)
        held, weights = sampled.data, sampled.weights
        with tf.device(pick_device(cfg.learner.device)):
            gradients = compute_rate(algo, held, weights, args.duration)
            progress(f"gradients alone: {gradients.per_s:,.1f} updates/s")
            if applies_locally(ctx, algo):  # the learner's step, as it runs it
                optimizer = LocalOptimizer(ctx.optimizer(), dict(algo.variables))
                fuse_update(ctx, algo, optimizer)
            before = compute_rate(algo, held, weights, args.duration)
            progress(f"compute before: {before.per_s:,.1f} updates/s")
            with Feeder(memory, batches) as feeder:
                (learner,) = servers.start_role("learner", 1)
                window = learner_window(learner, ps, feeder, args)
                bench.stop([learner])
            progress(f"learner: {window['updates']:,.1f} updates/s")
            after = compute_rate(algo, held, weights, args.duration)
        ctx.close_clients()
    steps = cfg.algorithm.params.batch_size * getattr(cfg.algorithm.params, "unroll_length", 1)
    return {
        "cfg": cfg,
        "gradients": gradients,
        "before": before,
        "after": after,
        "window": window,
        "steps": steps,
        "threads": threads,
    }


def lines(result: dict) -> list[str]:
    """The printed result; the last line is `learner/compute: R`."""
    steps, window = result["steps"], result["window"]
    before, after = result["before"], result["after"]
    compute = (before.per_s + after.per_s) / 2
    learner = window["updates"]
    cpu_per_update = 1e3 * (before.cpu_seconds + after.cpu_seconds) / (before.calls + after.calls)
    learner_cores = window["cores"].get("learner", 0.0)
    learner_ms = 1e3 * learner_cores / max(learner, 1e-9)
    roles = ", ".join(f"{r} {v:.2f}" for r, v in sorted(window["cores"].items()))
    procs = ", ".join(f"{p} {v:.2f}" for p, v in sorted(window["per_process"].items()))
    return [
        f"compute (agent.learn on a held batch of {steps} agent steps, "
        f"{result['threads']} intra-op thread(s): the learner's budget): "
        f"{compute:,.1f} updates/s, {compute * steps:,.0f} agent steps/s "
        f"(before {before.per_s:,.1f}, after {after.per_s:,.1f} updates/s; "
        f"{cpu_per_update:.1f} ms CPU per update)",
        f"gradients alone (the step without the optimizer's): {result['gradients'].per_s:,.1f} "
        f"updates/s; learner / gradients alone: {learner / result['gradients'].per_s:.2f}",
        f"learner (role process, memory + PS shards, no actors): {learner:,.1f} updates/s, "
        f"{learner * steps:,.0f} agent steps/s over {window['seconds']:.1f} s "
        f"({learner_ms:.1f} ms learner CPU per update)",
        f"CPU per update, compute / learner: {cpu_per_update / learner_ms:.2f} (R if both "
        "were CPU-bound on the same cores; less moved by other processes' load than R)",
        f"cores per role: {roles}",
        f"cores per process: {procs}",
        f"learner/compute: {learner / compute:.2f}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", default=str(report.REPO / "configs" / "pong_impala_2core.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each rate")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the 1st update")
    args = report.parse_args(parser, tuned_malloc=False)
    procs.reexec_with_malloc_env()  # compute alone runs with the learner process's allocator
    if args.smoke:
        args.duration, args.warmup = 0.5, 0.0
        args.overrides = [*SMOKE_OVERRIDES, *args.overrides]
    args.config_path = Path(args.config).resolve()
    if not args.config_path.is_file():
        parser.error(f"--config {args.config}: no such file")
    started, load_before = time.monotonic(), report.load_average()
    out = lines(run(args))
    print("\n".join(out), flush=True)
    if args.write:
        body = "\n".join(f"- {line}" for line in out[:-1]) + f"\n\n`{out[-1]}`\n"
        section = report.section_text("Learner role vs its train step", started, load_before, body)
        report.write_section("bench_learner", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
