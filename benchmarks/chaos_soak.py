"""Chaos soak (issue 17): trains a config with `easyrl train` while SIGKILLing a random role
process (ps, memory, learner, actor, evaluator) every `--every` seconds for `--for` seconds,
then checks that the run reached its target and accounts for the memory shards' inserts.
Roles are picked in cycles (each role once per cycle, in a random order; a random task of
it), so every role is killed about equally often.

    python benchmarks/chaos_soak.py configs/cartpole_apex.yaml --dir runs/chaos-apex
    python benchmarks/chaos_soak.py configs/cartpole_ppo.yaml --dir runs/chaos-ppo

The run trains through the whole soak: its return target is turned into a check (the best
100-episode mean after the first kill must reach it) and it stops `--settle` seconds after the
last kill (`stop.max_seconds`), with an evaluator so that every role can be killed.

Insert accounting (replay tables, snapshotted every `run.checkpoint_interval_s`): right before
killing memory shard k (its actors paused) the soak reads its Status `inserted`: every item
the shard has acknowledged, its snapshot's included. The newest snapshot on disk holds
`inserted` as of its writing; the restarted shard must come back with exactly that count
(`restored_inserted`) and those items, and the difference is what the kill lost (items
acknowledged after that snapshot, which must be younger than a checkpoint interval plus 3 s).
Acknowledged = the sum over the shard's incarnations of what each one's counter rose by;
stored = the last incarnation's `inserted`; acknowledged = stored + lost holds only if no
restart lost or invented an item beyond that. With the shard's write-ahead log
(`replay.wal`, on by default) a kill loses nothing: the restarted shard must come back with
every item it acknowledged (`restored_inserted` = the count read before the kill: its
snapshot's and its log's), lost = acknowledged - restored is 0 for every kill, and
acknowledged = stored. An aggregate table (synchronous rounds) is not
snapshotted: a kill drops the round being collected, which the learner abandons
(`abandoned_rounds`).

Writes `chaos.json` in the run directory and prints a summary; exit code 0 when every check
holds. Needs a machine where it can signal the run's processes (the same user).
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by a test

from report import add_smoke  # noqa: E402

from easyrl import config as config_lib  # noqa: E402
from easyrl.transport import easyrl_pb2 as pb  # noqa: E402
from easyrl.transport import rpc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE_CONFIG = ROOT / "configs" / "cartpole_apex.yaml"
SMOKE_OVERRIDES = (
    "stop.episode_return_mean=9",
    "env.num_envs=2",
    "cluster.actor=1",
    "run.log_interval_s=0.5",
)
"""`--smoke`: a small Ape-X CartPole run whose target any policy reaches (episodes last >= 8
steps), so that the soak's checks (restarts, insert accounting) decide the exit code."""
SMOKE_LINE = r"^ok +every kill restarted"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""


def role_processes(run_dir: Path) -> dict[str, int]:
    """{"memory-0": pid, ...} of the live role processes of the run in `run_dir`."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        if "--role" in argv and "--task" in argv and any(str(run_dir) in a for a in argv):
            role, task = argv[argv.index("--role") + 1], argv[argv.index("--task") + 1]
            found[f"{role}-{task}"] = int(proc.name)
    return found


def environ(pid: int) -> dict[str, str]:
    """The environment process `pid` was started with."""
    raw = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    return dict(line.decode().split("=", 1) for line in raw if b"=" in line)


class Run:
    """The soaked run: its process, directory and (once a role is up) token and addresses."""

    def __init__(self, config: Path, run_dir: Path, overrides: list[str]):
        self.run_dir = run_dir
        command = [sys.executable, "-m", "easyrl.cli", "train", str(config)]
        command += [a for o in [f"run.dir={run_dir}", *overrides] for a in ("--set", o)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.log_path = run_dir.parent / f"{run_dir.name}.console.log"
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.token: str | None = None
        self.memories: list[str] = []
        self.ps = ""

    def connect(self) -> None:
        """Reads the token and the memory addresses from a role process's environment."""
        while self.token is None and self.process.poll() is None:
            for pid in role_processes(self.run_dir).values():
                try:
                    env = environ(pid)
                except OSError:
                    continue
                if rpc.TOKEN_ENV in env and "EASYRL_CLUSTER" in env:
                    self.token = env[rpc.TOKEN_ENV]
                    cluster = json.loads(env["EASYRL_CLUSTER"])
                    self.memories, self.ps = cluster["memory"], cluster["ps"][0]
                    return
            time.sleep(0.2)

    def wait_running(self) -> None:
        """Waits until actors step envs (metrics.jsonl counts env steps): the launcher is past
        its start-up wait, during which a lost server ends the run by design."""
        metrics = self.run_dir / "metrics.jsonl"
        while self.process.poll() is None:
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            if lines and json.loads(lines[-1]).get("env_steps", 0) > 0:
                return
            time.sleep(0.2)

    def settle(self, kills: int, first_kill: float, timeout_s: float) -> None:
        """Waits until the launcher has restarted `kills` processes (its console lines) and
        a metrics row after `first_kill` (run clock) has a return mean, or `timeout_s`."""
        metrics = self.run_dir / "metrics.jsonl"
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and time.monotonic() < deadline:
            console = self.log_path.read_text()
            rows = [json.loads(x) for x in metrics.read_text().split("\n")[:-1]]  # whole lines
            returned = any(m["time_s"] >= first_kill and "return_mean" in m for m in rows)
            if returned and console.count("; restarting it (restart") >= kills:
                return
            time.sleep(0.2)

    def run_clock(self) -> float:
        """PS shard 0's run clock (`elapsed_s` of its Status): metrics.jsonl's `time_s`."""
        client = rpc.Client(rpc.stub_class("ps"), self.ps, self.token, retry_s=30.0)
        try:
            return client.call("Status", pb.StatusRequest()).elapsed_s
        finally:
            client.close()

    def memory_counters(self, shard: int, timeout_s: float = 5.0) -> dict[str, float] | None:
        """Memory shard `shard`'s Status counters, or None if it does not answer."""
        client = rpc.Client(
            rpc.stub_class("memory"),
            self.memories[shard],
            self.token,
            timeout_s=1.0,
            retry_s=timeout_s,
        )
        try:
            return dict(client.call("Status", pb.StatusRequest()).counters)
        except Exception:  # noqa: BLE001 - not answering is what the caller asks about
            return None
        finally:
            client.close()


def snapshot_counts(path: Path) -> tuple[int, int] | None:
    """(`inserted`, items held) of the memory snapshot at `path` (None without one)."""
    try:
        with np.load(path) as data:
            held = next(len(data[k]) for k in data.files if k.startswith("data/"))
            return int(data["inserted"]), held
    except (OSError, KeyError, ValueError, StopIteration):
        return None


def started_at(pid: int) -> float:
    """When process `pid` started (epoch seconds), from /proc."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def kill_memory(run: Run, shard: int, pid: int, logged: bool) -> dict:
    """SIGKILLs memory shard `shard` after reading what it acknowledged (the actors paused
    meanwhile, so that nothing is acknowledged between the read and the kill); waits for the
    restarted shard and reads what it restored. `logged`: the shard keeps a write-ahead log,
    so the kill lost what the restart did not bring back (else what its snapshot lacks)."""
    actors = [p for name, p in role_processes(run.run_dir).items() if name.startswith("actor-")]
    for actor in actors:
        os.kill(actor, signal.SIGSTOP)
    try:
        time.sleep(0.5)  # inserts in flight complete
        before = run.memory_counters(shard) or {}
        born = started_at(pid)
        os.kill(pid, signal.SIGKILL)
    finally:
        for actor in actors:
            os.kill(actor, signal.SIGCONT)
    killed_at = time.time()
    record = {"acknowledged": before.get(f"memory/{shard}/inserted")}
    path = run.run_dir / "checkpoints" / f"memory-{shard}.npz"
    counts = snapshot_counts(path)
    if counts is None:  # killed before its first snapshot: everything since its start is lost
        record["snapshot_inserted"], record["snapshot_items"] = 0, 0
        record["snapshot_age_s"] = round(killed_at - born, 2)
    else:
        record["snapshot_inserted"], record["snapshot_items"] = counts
        record["snapshot_age_s"] = round(killed_at - path.stat().st_mtime, 2)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = role_processes(run.run_dir)
        if pids.get(f"memory-{shard}") not in (None, pid):
            after = run.memory_counters(shard, timeout_s=30)
            if after is not None:
                record["restored_items"] = after.get(f"memory/{shard}/restored_items")
                record["restored_inserted"] = after.get(f"memory/{shard}/restored_inserted")
                record["log_items"] = after.get(f"memory/{shard}/wal_replayed_items")
                break
        time.sleep(0.2)
    kept = record.get("restored_inserted") if logged else record["snapshot_inserted"]
    if record["acknowledged"] is not None and kept is not None:
        record["lost"] = record["acknowledged"] - kept
    return record


def soak(args) -> int:
    config = config_lib.load(args.config, args.set)
    target = config.stop.episode_return_mean
    if target is None:
        sys.exit(f"{args.config} has no stop.episode_return_mean to check")
    run_dir = Path(args.dir).resolve()
    if run_dir.exists():
        sys.exit(f"{run_dir} exists; give a new --dir")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    overrides = [
        *args.set,
        "stop.episode_return_mean=null",
        # + 60 s for the start-up (the run clock starts with PS shard 0, before the actors).
        f"stop.max_seconds={args.start + args.duration + args.settle + 60}",
        "cluster.evaluator=1",
        f"run.checkpoint_interval_s={args.checkpoint_s}",
    ]
    run = Run(Path(args.config).resolve(), run_dir, overrides)
    rng = random.Random(args.seed)
    kills: list[dict] = []
    roles: list[str] = []
    try:
        run.connect()
        run.wait_running()
        started = time.monotonic()  # the schedule counts from here
        time.sleep(args.start)
        first_kill = run.run_clock()  # a metrics line with time_s >= this came after it
        while time.monotonic() - started < args.start + args.duration:
            if run.process.poll() is not None:
                break
            pids = role_processes(run_dir)
            if not pids:
                time.sleep(0.5)
                continue
            if not roles:  # every role once per cycle, in a random order
                roles = sorted({n.split("-")[0] for n in pids})
                rng.shuffle(roles)
            role = roles.pop()
            name = rng.choice(sorted(n for n in pids if n.startswith(f"{role}-")) or sorted(pids))
            at = round(time.monotonic() - started, 1)
            print(f"[{at:6.1f}s] SIGKILL {name} (pid {pids[name]})", flush=True)
            if name.startswith("memory-") and config.replay.kind != "aggregate":
                shard, logged = int(name.split("-")[1]), config.replay.wal != "none"
                record = kill_memory(run, shard, pids[name], logged)
            else:
                try:
                    os.kill(pids[name], signal.SIGKILL)
                except ProcessLookupError:  # it exited since the listing: pick again
                    continue
                record = {}
            kills.append({"at_s": at, "process": name, **record})
            time.sleep(max(0.0, args.every - (time.monotonic() - started - at)))
        if args.interrupt:
            run.settle(len(kills), first_kill, timeout_s=args.settle + 120)
        final = run.memory_counters(0, timeout_s=10) if run.memories else None
        if args.interrupt and run.process.poll() is None:
            run.process.send_signal(signal.SIGINT)
        code = run.process.wait(timeout=args.settle + 300)
    finally:
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGINT)
            run.process.wait(timeout=60)
        run.log.close()
    return report(args, run, config, target, kills, first_kill, final, code)


def run_seconds(lines: list[dict]) -> float:
    """The run clock of the last metrics line."""
    return max((m["time_s"] for m in lines), default=0.0)


def accounting(memory_kills: list[dict], final: dict | None, seconds: float) -> dict:
    """Memory shard 0's inserts over its incarnations. Incarnation i acknowledged what its
    `inserted` counter rose from the count it restored (R_i: 0 for the first, the restarted
    shard's Status for the others) to the count read before its kill (A_i); the last one up
    to the final count F. A kill lost the items acknowledged after the snapshot on disk
    (A_i - S_i, S_i = `inserted` in that snapshot file); F is what the surviving table counts
    as stored. acknowledged = stored + lost holds only if every restart came back with its
    snapshot's count (R_{i+1} = S_i)."""
    stored = (final or {}).get("memory/0/inserted")
    shard0 = [k for k in memory_kills if k["process"] == "memory-0"]
    counts = [k.get(x) for k in shard0 for x in ("acknowledged", "restored_inserted")]
    if stored is None or None in counts:
        acknowledged = None
    else:
        restored = [0.0, *(k["restored_inserted"] for k in shard0)]
        ends = [*(k["acknowledged"] for k in shard0), stored]
        acknowledged = sum(end - start for start, end in zip(restored, ends, strict=True))
    return {
        "acknowledged": acknowledged,
        "stored": stored,
        "lost_to_memory_kills": sum(k.get("lost", 0) for k in shard0),
        "memory_kills": len(shard0),
        "inserts_per_s": round((stored or 0.0) / max(seconds, 1.0)),
    }


def report(args, run, config, target, kills, first_kill, final, code) -> int:
    """Checks the run and the accounting; writes chaos.json; returns the exit code."""
    lines = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    # first_kill is PS shard 0's run clock right before the first kill: a metrics line with
    # time_s >= first_kill was written after it.
    under_fire = [m for m in lines if m["time_s"] >= first_kill and "return_mean" in m]
    best = max((m["return_mean"] for m in under_fire), default=float("nan"))
    last = lines[-1] if lines else {}
    summary = json.loads((run.run_dir / "summary.json").read_text())
    restarts = summary.get("restarts", {})
    result = {
        "config": str(args.config),
        "overrides": args.set,
        "exit_code": code,
        "kills": kills,
        "restarts": restarts,
        "target": target,
        "best_return_mean_after_first_kill": best,
        "final_return_mean": last.get("return_mean"),
        "env_steps": last.get("env_steps"),
        "updates": last.get("updates"),
    }
    # --smoke stops the run itself (SIGINT: exit code 130) once every kill is restarted.
    expected = 130 if args.interrupt else 0
    checks = {
        f"exit code {expected}": code == expected,
        f"best return mean after the first kill >= {target:g}": best >= target,
        "every kill restarted": sum(restarts.values()) >= len(kills),
    }
    memory_kills = [k for k in kills if "acknowledged" in k]
    if config.replay.kind != "aggregate":
        result["inserts"] = accounting(memory_kills, final, run_seconds(lines))
        result["inserts"]["checkpoint_interval_s"] = args.checkpoint_s
        result["inserts"]["wal"] = config.replay.wal
        inserts = result["inserts"]
        if config.replay.wal != "none":
            checks["each restarted memory shard came back with every insert it answered"] = all(
                k.get("snapshot_items") is not None
                and k.get("restored_items") == k["snapshot_items"]
                and k.get("restored_inserted") == k["acknowledged"]
                for k in memory_kills
            )
            checks["lost_to_memory_kills 0 and acknowledged = stored"] = (
                inserts["acknowledged"] is not None
                and inserts["lost_to_memory_kills"] == 0
                and inserts["acknowledged"] == inserts["stored"]
            )
            result["checks"] = checks
            return write_report(run, result, checks)
        checks["each restarted memory shard restored its newest snapshot"] = all(
            k.get("snapshot_items") is not None
            and k.get("restored_items") == k["snapshot_items"]
            and k.get("restored_inserted") == k["snapshot_inserted"]
            for k in memory_kills
        )
        # A kill loses the inserts acknowledged after the newest snapshot: at most a
        # checkpoint interval's (plus the time a snapshot takes to copy and write).
        age = args.checkpoint_s + 3.0
        checks[f"each kill lost only inserts of the last {age:g} s (snapshot age)"] = all(
            k.get("lost") is not None and k["lost"] >= 0 and k.get("snapshot_age_s", age) < age
            for k in memory_kills
        )
        checks["acknowledged = stored + lost"] = (
            inserts["acknowledged"] is not None
            and inserts["acknowledged"] == inserts["stored"] + inserts["lost_to_memory_kills"]
        )
    else:
        counters = summary["servers"].get("ps/0", {}).get("counters", {})
        result["abandoned_rounds"] = counters.get("learner/abandoned_rounds")
    result["checks"] = checks
    return write_report(run, result, checks)


def write_report(run, result: dict, checks: dict[str, bool]) -> int:
    """Writes chaos.json, prints the summary and the checks; returns the exit code."""
    (run.run_dir / "chaos.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "kills"}, indent=2))
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("config", nargs="?", help="the config to train (--smoke: Ape-X CartPole)")
    parser.add_argument(
        "--dir",
        help="the run directory (must not exist; --smoke: a temporary one)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between kills")
    parser.add_argument("--for", dest="duration", type=float, default=300.0)
    parser.add_argument(
        "--start", type=float, default=10.0, help="seconds from the first env steps to the first"
    )
    parser.add_argument("--settle", type=float, default=60.0, help="run time after the last")
    parser.add_argument("--checkpoint-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    add_smoke(parser)
    args = parser.parse_args(argv)
    args.interrupt = args.smoke
    if not args.smoke:
        if args.config is None or args.dir is None:
            parser.error("CONFIG and --dir are required")
        return soak(args)
    # Seconds of soak: two kills 2 s apart, against a target any policy reaches; the soak
    # stops the run (SIGINT) as soon as both are restarted and a return was reported after
    # the first, instead of waiting for `stop.max_seconds` (a start-up allowance of 60 s).
    args.config = args.config or str(SMOKE_CONFIG)
    args.set = [*SMOKE_OVERRIDES, *args.set]
    args.every, args.duration, args.start, args.settle = 2.0, 3.0, 1.0, 5.0
    with tempfile.TemporaryDirectory(prefix="easyrl-chaos-") as tmp:
        args.dir = args.dir or str(Path(tmp) / "run")
        return soak(args)


if __name__ == "__main__":
    sys.exit(main())
