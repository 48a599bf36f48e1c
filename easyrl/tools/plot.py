"""`easyrl plot`: learning curves of one or more runs from their `metrics.jsonl`.

Two panels: the mean return of the last episodes (`return_mean`) against env steps and
against the run clock (`time_s`: seconds of training, counted across resumes), one line per
run labelled with its directory's name; evaluations (`eval_return_mean`, written when the
run had an evaluator) are markers at the env steps / run clock they were reported. Drawn
with matplotlib's Agg canvas on a `Figure` of its own (no pyplot, no display, no global
backend switch), so it works on headless machines and from inside a notebook alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from easyrl.errors import EasyRLError

__all__ = ["Curves", "plot", "read_curves"]


class Curves(NamedTuple):
    """The learning curves of one run.

    Attributes:
        label: the run directory's name.
        env_steps, time_s, returns: one point per metrics line with a `return_mean`.
        eval_env_steps, eval_time_s, eval_returns: one point per evaluation.
    """

    label: str
    env_steps: list[float]
    time_s: list[float]
    returns: list[float]
    eval_env_steps: list[float]
    eval_time_s: list[float]
    eval_returns: list[float]


def _records(path: Path) -> list[dict]:
    """The JSON objects of a metrics.jsonl; a torn last line (a running run is appending
    to it) is skipped, a malformed line elsewhere is an error."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise EasyRLError(f"cannot read {str(path)!r}: {err}") from err
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise EasyRLError(f"{path}:{number}: not a JSON object: {err}") from err
        if not isinstance(record, dict):
            raise EasyRLError(f"{path}:{number}: not a JSON object")
        records.append(record)
    return records


def read_curves(run_dir: str | Path) -> Curves:
    """Reads the learning curves of one run directory.

    Raises:
        EasyRLError: no `metrics.jsonl`, or one without any return yet.
    """
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        what = "does not exist" if not run_dir.is_dir() else "has no metrics.jsonl"
        raise EasyRLError(f"run directory {str(run_dir)!r} {what}: nothing to plot")
    curves = Curves(run_dir.resolve().name, [], [], [], [], [], [])
    last_eval = None
    for record in _records(path):
        steps, time_s = record.get("env_steps", 0.0), record.get("time_s", 0.0)
        if "return_mean" in record:
            curves.env_steps.append(steps)
            curves.time_s.append(time_s)
            curves.returns.append(record["return_mean"])
        if "eval_return_mean" in record:
            # Every line repeats the newest evaluation: one marker per evaluation.
            key = record.get("eval_count", (record["eval_return_mean"], steps))
            if key != last_eval:
                last_eval = key
                curves.eval_env_steps.append(record.get("eval_at_env_steps", steps))
                curves.eval_time_s.append(time_s)
                curves.eval_returns.append(record["eval_return_mean"])
    if not curves.returns and not curves.eval_returns:
        raise EasyRLError(f"{path} holds no episode return yet: nothing to plot")
    return curves


def plot(run_dirs: list[str | Path], out: str | Path, title: str | None = None) -> Path:
    """Draws the learning curves of `run_dirs` into an image file.

    Args:
        run_dirs: one or more run directories (each with a `metrics.jsonl`).
        out: the image to write; its suffix picks the format (`.png`, `.svg`, `.pdf`).
        title: the figure's title (None: none).

    Returns:
        `out`, as a Path.

    Raises:
        EasyRLError: no run directory given, a run without metrics, or matplotlib missing.
    """
    if not run_dirs:
        raise EasyRLError("plot needs at least one run directory")
    all_curves = [read_curves(d) for d in run_dirs]
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise EasyRLError(
            "plotting needs matplotlib: pip install -e '.[plot]' (or pip install matplotlib)"
        ) from err

    figure = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    by_steps, by_time = figure.subplots(1, 2, sharey=True)
    for index, curves in enumerate(all_curves):
        color = f"C{index % 10}"
        by_steps.plot(curves.env_steps, curves.returns, color=color, label=curves.label)
        by_time.plot(curves.time_s, curves.returns, color=color, label=curves.label)
        if curves.eval_returns:
            style = {"color": color, "marker": "o", "linestyle": "none", "markersize": 5}
            label = f"{curves.label} (evaluation)"
            by_steps.plot(curves.eval_env_steps, curves.eval_returns, label=label, **style)
            by_time.plot(curves.eval_time_s, curves.eval_returns, label=label, **style)
    by_steps.set(xlabel="env steps", ylabel="mean episode return")
    by_time.set_xlabel("run clock (s)")
    for axes in (by_steps, by_time):
        axes.grid(True, alpha=0.3)
    by_steps.legend(fontsize="small")
    if title:
        figure.suptitle(title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(out, dpi=100)
    except (OSError, ValueError) as err:
        raise EasyRLError(f"cannot write {str(out)!r}: {err}") from err
    return out
