"""Machine and output helpers of the benchmarks: the machine description, markdown tables,
RESULTS.md sections and the options every benchmark shares (`parse_args`, `add_smoke`).

This module does not import TensorFlow.
"""

import argparse
import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from procs import malloc_note, reexec_with_malloc_env

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
REPO = Path(__file__).resolve().parent.parent

RESULTS_HEADER = """# easyrl component benchmarks

Figures written by the scripts in this folder (`--write`; each section names the exact
command that produced it). The component benchmarks run each server in its own process on
loopback. See `benchmarks/README.md` for how to run them.

**Read these numbers as rough.** They were taken on a small shared machine (2 cores) while
other engineers' test runs were using it too; the load average is printed with every
section. Absolute figures move by tens of percent from run to run; compare ratios taken
within one run (each section's own comparisons), not figures across sections or dates.
Each section comes from a single run (its defaults, or the subset named in its command) to
keep the total benchmarking time on the shared machine modest.
"""


def _version(*dists: str) -> str:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def machine_info() -> dict[str, str]:
    """nproc, CPU, Python and library versions, load average (no TensorFlow import)."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow", "tensorflow-cpu"),
        "grpcio": _version("grpcio"),
        "numpy": _version("numpy"),
        "gymnasium": _version("gymnasium"),
        "protobuf": _version("protobuf"),
    }


def load_average() -> str:
    """The 1-minute load average, as text."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def command_line() -> str:
    """The command this benchmark was started with, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(REPO)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *sys.argv[1:]])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (values formatted with `fmt`)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


def fmt(value: object) -> str:
    """Numbers with thousands separators and 3 significant digits where small."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


def section_text(title: str, started: float, load_before: str, body: str) -> str:
    """A RESULTS.md section: title, command, date, machine, then `body`."""
    info = machine_info()
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    machine = (
        f"{info['nproc']} cores ({info['cpu']}), Python {info['python']}, "
        f"tensorflow {info['tensorflow']}, grpcio {info['grpcio']}, numpy {info['numpy']}, "
        f"gymnasium {info['gymnasium']}, protobuf {info['protobuf']}"
    )
    return (
        f"## {title}\n\n"
        f"- command: `{command_line()}`\n"
        f"- date: {date}; wall time {time.monotonic() - started:.0f} s\n"
        f"- machine: {machine}\n"
        f"- load average (1 min) before / after: {load_before} / {load_average()}\n"
        f"- allocator: {malloc_note()}\n\n"
        f"{body.strip()}\n"
    )


def parse_args(parser: argparse.ArgumentParser, tuned_malloc: bool = True) -> argparse.Namespace:
    """Adds the options every benchmark shares (`--write`, `--smoke`, and `--tuned-malloc`
    where it applies), parses, and re-executes with tuned malloc settings when asked."""
    if tuned_malloc:
        parser.add_argument(
            "--tuned-malloc",
            action="store_true",
            help="re-run with the launcher's glibc settings (MALLOC_ENV: thresholds, one "
            "arena) in all processes",
        )
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    add_smoke(parser)
    args = parser.parse_args()
    if getattr(args, "tuned_malloc", False):
        reexec_with_malloc_env()
    return args


def add_smoke(parser: argparse.ArgumentParser) -> None:
    """Adds `--smoke`: the same real processes and code paths with tiny sizes and durations,
    seconds long, which tests/test_benchmarks.py runs so that no script rots unnoticed."""
    parser.add_argument(
        "--smoke", action="store_true", help="a seconds-long run with tiny sizes (the tests')"
    )


def write_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replaces (or appends) the section delimited by markers named `name` in RESULTS.md."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{text.strip()}\n{end}\n"
    old = path.read_text() if path.exists() else RESULTS_HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(old):
        new = pattern.sub(lambda _: block, old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + block
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
    print(f"wrote section {name!r} of {path}")
