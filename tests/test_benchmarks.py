"""Every benchmark script is a tested program: its `--smoke` run (the same real servers,
processes and code paths, tiny sizes and durations) exits 0 and prints its key line.

The scripts are discovered, not listed: every `benchmarks/*.py` that defines `main` must
declare `SMOKE_LINE` (a regular expression one line of its `--smoke` output matches), so a
new script without a smoke mode fails here. Timings are not asserted (benchmarks/RESULTS.md).
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SMOKE_TIMEOUT_S = 600


def has_main(tree: ast.Module) -> bool:
    """Whether a module defines a top-level `main` function."""
    return any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)


def smoke_line(tree: ast.Module) -> str | None:
    """The string a module assigns to `SMOKE_LINE` at top level, or None."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "SMOKE_LINE" for t in targets):
            value = node.value  # type: ignore[union-attr]
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    return None


def scripts() -> list[Path]:
    """The benchmark scripts: every benchmarks/*.py with a `main`."""
    found = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        if has_main(ast.parse(path.read_text(), str(path))):
            found.append(path)
    return found


SCRIPTS = scripts()


def test_the_benchmark_scripts_are_discovered():
    names = {p.name for p in SCRIPTS}
    assert {"bench_scaling.py", "bench_learner.py", "code_lines.py"} <= names
    assert not {"report.py", "timing.py", "procs.py", "servers.py"} & names  # helpers


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_script_declares_a_smoke_mode_and_its_key_line(script):
    source = script.read_text()
    line = smoke_line(ast.parse(source, str(script)))
    assert line is not None, f"{script.name} declares no SMOKE_LINE"
    re.compile(line)
    assert "smoke" in source, f"{script.name} has no --smoke mode"


@pytest.mark.cluster
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 60)
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_benchmark_script_runs_its_smoke_mode_and_prints_its_key_line(script):
    line = smoke_line(ast.parse(script.read_text(), str(script)))
    assert line is not None, f"{script.name} declares no SMOKE_LINE"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, str(script), "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    tail = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, tail
    assert re.search(line, done.stdout, re.MULTILINE), f"no line matching {line!r}\n{tail}"
