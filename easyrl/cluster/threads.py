"""Per-process thread budgets: how many cores each role process keeps busy with TensorFlow.

Left alone, TensorFlow sizes both of its thread pools to every core it sees, so twenty role
processes on 16 cores start 16+ compute threads each. A process's budget is the number of
threads its intra-op pool gets; its inter-op pool gets as many, at least `MIN_INTER_OP`
(an actor's weight assigns and its acting calls run concurrently: with one inter-op thread
they waited for each other and a CartPole actor stepped 10-24 % slower, RESULTS.md).

A process's budget, the first of these that applies (`process_budget`):
1. `THREADS_ENV`, set by whoever placed the process: the local launcher (`budgets` over
   its host's cores and every process of the run, all placed there) and the Kubernetes
   manifests (the budget the pod requests CPUs for);
2. `cluster.threads.<role>` of the config;
3. derived for the process alone on its host (`easyrl run` on bare metal): `budgets` over
   `host_cores()` with only this process placed.
"""

import os
from collections.abc import Mapping
from pathlib import Path

from easyrl.cluster.spec import ROLES
from easyrl.config import ThreadsConfig
from easyrl.errors import EasyRLError

THREADS_ENV = "EASYRL_THREADS"
"""The thread budget of an easyrl role process, set by the launcher or the pod spec."""
ROLE_THREADS = {"ps": 1, "memory": 1, "actor": 1, "evaluator": 1}
"""The derived budget of each role but the learner, which does the gradient math and gets
what these leave. A PS shard applying pushes was as fast with 1 intra-op thread as with 2
for the shipped configs' networks; a shard of a 21 MB network applies Adam in 15.6 ms on one
and 11.8 ms on two (RESULTS.md, issue 45): `cluster.threads.ps` where cores are spare; a
memory shard runs no TensorFlow (its table thread and gRPC take about one core); an
actor acts faster on one thread (see `cluster.threads.actor`)."""
MIN_INTER_OP = 2
"""The fewest inter-op threads a process gets (see the module docstring)."""
CGROUP = Path("/sys/fs/cgroup")
"""Where the CPU quota of this process's cgroup is read (`cgroup_cores`)."""


def cgroup_cores(root: Path = CGROUP) -> int | None:
    """The whole CPUs the cgroup CPU quota of this process allows (cgroup v2 `cpu.max`, else
    v1 `cpu/cpu.cfs_quota_us` over `cpu.cfs_period_us`; at least 1), or None without a
    quota or where none is readable."""
    try:
        quota, period = (root / "cpu.max").read_text().split()
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1"):
        return None
    try:
        return max(1, int(quota) // int(period))
    except (ValueError, ZeroDivisionError):
        return None


def host_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota
    (a container's CPU limit), else os.cpu_count()."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        cores = os.cpu_count() or 1
    quota = cgroup_cores()
    return min(cores, quota) if quota else cores


def budgets(cores: int, counts: Mapping[str, int], configured: ThreadsConfig) -> dict[str, int]:
    """The thread budget of each role's processes when `counts` processes of each role share
    `cores` cores: the configured value where it is set (not 0), else `ROLE_THREADS`; the
    learners share what the other processes' budgets leave of the cores, at least 1 each.

    Args:
        cores: the host's cores (see `host_cores`).
        counts: processes placed on the host, by role (missing roles: none).
        configured: the config's `cluster.threads`.

    Returns:
        {role: threads} for every role of ROLES.
    """
    out = {role: getattr(configured, role) or n for role, n in ROLE_THREADS.items()}
    others = sum(threads * counts.get(role, 0) for role, threads in out.items())
    learners = max(1, counts.get("learner", 0))
    out["learner"] = configured.learner or max(1, (cores - others) // learners)
    return {role: out[role] for role in ROLES}


def process_budget(role: str, configured: ThreadsConfig) -> tuple[int, str]:
    """This process's budget as role `role` and where it came from (see the module
    docstring): (threads, "EASYRL_THREADS" | "cluster.threads.ROLE" | "N cores").

    Raises:
        EasyRLError: THREADS_ENV is set to something else than a whole number >= 1.
    """
    placed = os.environ.get(THREADS_ENV)
    if placed:
        if not placed.isdigit() or int(placed) < 1:
            raise EasyRLError(f"{THREADS_ENV} must be a whole number >= 1, got {placed!r}")
        return int(placed), THREADS_ENV
    if getattr(configured, role):
        return getattr(configured, role), f"cluster.threads.{role}"
    cores = host_cores()
    return budgets(cores, {role: 1}, configured)[role], f"{cores} cores"


def pools(threads: int) -> tuple[int, int]:
    """(intra-op, inter-op) TensorFlow threads of a process with budget `threads`."""
    return threads, max(MIN_INTER_OP, threads)
