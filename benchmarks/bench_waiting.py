"""What a memory shard's table thread costs while inserts wait for the rate limiter.

A shard whose table does not admit an insert yet (a full queue, a ring ahead of its
samples-per-insert ratio) keeps it pending until the table changes or its deadline passes
(`easyrl.roles.memory`, `INSERT_WAIT_S`); its actors send it again when refused. This runs
a real shard (`MemoryServer` behind a gRPC server on loopback, in this process so that its
table thread's CPU can be read from /proc) with a rate limiter that holds every insert
back, and `--waiting` client threads inserting without pause, each through its own
`MemoryClient`, as actors do; nothing samples. It prints the table thread's CPU over
`--duration` seconds for each count of waiting inserters:

    | inserts waiting | table thread cores | inserts refused/s |

    python benchmarks/bench_waiting.py                   # 1, 16 and 64 waiting
    python benchmarks/bench_waiting.py --waiting 4 --write
"""

import argparse
import os
import threading
import time

import numpy as np
import report

SMOKE_LINE = r"^\| 1 \| \d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""
SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64)}


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of thread `native_id` of this process (its task's stat:
    `procs.cpu_seconds` reads /proc/PID/stat, which read with a thread id gave 3-6x these
    figures here: the inserting threads' CPU too)."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(waiting: int, duration: float) -> tuple[float, float]:
    """(table thread cores, inserts refused per second) with `waiting` inserters."""
    from easyrl.config import SecurityConfig
    from easyrl.errors import TransportError
    from easyrl.replay import LimitedTable, RateLimiter, UniformTable
    from easyrl.roles.memory import MemoryServer
    from easyrl.transport import rpc
    from easyrl.transport.clients import connect

    token = rpc.new_token()
    # min_size 2, one sample per insert, error buffer 2: after a few inserts and no sample
    # the limiter admits no more.
    limiter = RateLimiter(min_size_to_sample=2, samples_per_insert=1.0, error_buffer=2.0)
    memory = MemoryServer(LimitedTable(UniformTable(SPEC, 1024, seed=0), limiter, 4), 1)
    server, port = rpc.make_server("127.0.0.1:0", token, max_workers=waiting + 4)
    rpc.add_servicer("memory", memory, server)
    server.start()
    stop = threading.Event()
    batch = {"obs": np.zeros((1, 4), np.float32), "action": np.zeros(1, np.int64)}
    clients = [
        connect("memory", f"127.0.0.1:{port}", token, SecurityConfig(), timeout_s=5.0)
        for _ in range(waiting)
    ]

    def insert_until_stopped(client) -> None:
        while not stop.is_set():
            try:
                client.insert(batch)
            except TransportError as err:
                if err.code is None or err.code.name != "RESOURCE_EXHAUSTED":
                    raise

    threads = [threading.Thread(target=insert_until_stopped, args=(c,)) for c in clients]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # the table fills; every inserter is held back
        table_thread = memory._thread.native_id  # the thread measured
        assert table_thread is not None
        refused0, wall0 = memory.counters["rate_limited_insert"], time.monotonic()
        cpu0 = thread_cpu_s(table_thread)
        time.sleep(duration)
        cpu1, wall1 = thread_cpu_s(table_thread), time.monotonic()
        refused = memory.counters["rate_limited_insert"] - refused0
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        for client in clients:
            client.close()
        memory.close()
        server.stop(0)
    return (cpu1 - cpu0) / (wall1 - wall0), refused / (wall1 - wall0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--waiting", default="1,16,64", help="comma list of inserter counts")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds measured")
    args = report.parse_args(parser, tuned_malloc=False)
    if args.smoke:
        args.waiting, args.duration = "1", 0.5
    started, load_before = time.monotonic(), report.load_average()
    rows = []
    for waiting in (int(n) for n in args.waiting.split(",")):
        cores, refused = measure(waiting, args.duration)
        rows.append([waiting, cores, refused])
    table = report.markdown_table(
        ["inserts waiting", "table thread cores", "inserts refused/s"], rows
    )
    print(table)
    if args.write:
        body = (
            f"{table}\n\n- One shard in this process behind gRPC on loopback; a rate limiter "
            f"that holds every insert back; {args.duration:g} s per count, after 1 s.\n"
        )
        title = "A memory shard's table thread while inserts wait"
        report.write_section("waiting", report.section_text(title, started, load_before, body))


if __name__ == "__main__":
    main()
