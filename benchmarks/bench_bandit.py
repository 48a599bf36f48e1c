"""Regret of LinUCB on the built-in linear bandit: the cumulative (pseudo-)regret curve of
`configs/bandit_linucb.yaml`, and whether it grows sublinearly.

The regret of a step, `info["regret"]` of `easyrl/LinearBandit-v0` (the best arm's expected
reward minus the chosen arm's), is not visible to a cluster run (actors report returns, not
infos), so the algorithm runs in this process through its real update path
(`easyrl.algorithms.linucb.agent.regret_run`: the actor's collector, the learner's `learn` on
batches of `batch_size` logged steps, the PS's SGD optimizer adding the increments), with the
config's hyper-parameters, env and number of envs. Baselines on the same env and seed: LinUCB
with the textbook alpha = 1, LinUCB with alpha = 0 (greedy, no exploration bonus) and a
uniformly random arm.

Reading the curve: linear growth R(T) = c T doubles at every doubling of T; LinUCB's bound
grows like sqrt(T) log(T) (the ratio R(2T) / R(T) tends to sqrt(2) = 1.41), and on this easy
problem (finitely many arms with gaps) the curve flattens further, towards log T. Timing is
not measured: the shared machine's load does not change the regret.

    python benchmarks/bench_bandit.py --write
"""

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import (  # noqa: E402
    REPO,
    load_average,
    markdown_table,
    parse_args,
    section_text,
    write_section,
)

PNG = Path(__file__).resolve().parent / "bandit_regret.png"
SMOKE_LINE = r"^LinUCB's regret over the second half of the run is \d"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""


def random_regret(env_id: str, kwargs: dict, steps: int, num_envs: int, seed: int) -> np.ndarray:
    """Per-step regret `[steps]` of a uniformly random arm on the same env and seed."""
    from gymnasium.spaces import Discrete

    from easyrl.envs import make_vector_env
    from easyrl.envs.bandit import vector_regrets

    env = make_vector_env(env_id, num_envs, seed=seed, kwargs=kwargs)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    arms = int(cast(Discrete, env.single_action_space).n)
    out = [
        vector_regrets(env.step(rng.integers(arms, size=num_envs))[4], num_envs)
        for _ in range(-(-steps // num_envs))
    ]
    env.close()
    return np.concatenate(out)[:steps]


def plot(curves: dict[str, np.ndarray], path: Path) -> None:
    """Cumulative regret of every curve on log-log axes (left; a straight line of slope 1 is
    linear growth), and of the LinUCB curves on linear axes with c sqrt(T) log(T) through
    the config's end point (right)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for name, regret in curves.items():
        t = np.arange(1, len(regret) + 1)
        cumulative = np.cumsum(regret)
        left.loglog(t, np.maximum(cumulative, 1e-3), label=name)
        if name.startswith("LinUCB"):
            right.plot(t, cumulative, label=name)
    left.set(xlabel="env steps T", ylabel="cumulative regret R(T)", title="all policies")
    left.legend()
    cumulative = np.cumsum(curves["LinUCB (config)"])
    t = np.arange(1, len(cumulative) + 1)
    reference = np.sqrt(t) * np.log(t + 1)
    scale = cumulative[-1] / reference[-1]
    right.plot(t, scale * reference, "--", label=f"{scale:.3g} sqrt(T) log(T)")
    right.plot(t, cumulative[-1] * t / t[-1], ":", label="linear through R(T_end)")
    right.set(xlabel="env steps T", ylabel="cumulative regret R(T)", title="LinUCB")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "bandit_linucb.yaml"))
    parser.add_argument("--steps", type=int, default=16384, help="env steps (a power of 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parse_args(parser, tuned_malloc=False)
    if args.smoke:  # seconds, tiny sizes, same processes (tests/test_benchmarks.py)
        args.steps = 256
    started, load_before = time.monotonic(), load_average()

    from easyrl import config as config_lib
    from easyrl.algorithms.linucb.agent import regret_run

    cfg = config_lib.load(args.config, args.overrides)
    params, env = cfg.algorithm.params, cfg.env

    def linucb_regret(alpha: float | None = None) -> np.ndarray:
        changed = params if alpha is None else dataclasses.replace(params, alpha=alpha)
        run = regret_run(changed, env.id, args.steps, env.num_envs, args.seed, env.kwargs)
        return run[0]

    curves = {
        "LinUCB (config)": linucb_regret(),
        "LinUCB alpha=1": linucb_regret(1.0),
        "LinUCB alpha=0 (greedy)": linucb_regret(0.0),
        "random arm": random_regret(env.id, env.kwargs, args.steps, env.num_envs, args.seed),
    }
    with tempfile.TemporaryDirectory() as tmp:  # a smoke run leaves the committed plot alone
        plot(curves, Path(tmp) / PNG.name if args.smoke else PNG)

    horizons = [args.steps >> k for k in range(6, -1, -1) if args.steps >> k >= 64]
    rows = []
    for name, regret in curves.items():
        cumulative = np.cumsum(regret)
        at = [float(cumulative[h - 1]) for h in horizons]
        doubling = at[-1] / at[-2]
        rows.append([name, *at, doubling])
    headers = ["policy", *[f"R({h:,})" for h in horizons], "R(T)/R(T/2)"]
    linucb = np.cumsum(curves["LinUCB (config)"])
    half = args.steps // 2
    second, first = linucb[-1] - linucb[half - 1], linucb[half - 1]
    label = " ".join([Path(args.config).name, *args.overrides])
    body = (
        f"Config `{label}` "
        f"({env.id}, {env.kwargs}, {env.num_envs} envs, alpha {params.alpha}, ridge "
        f"{params.ridge}, batch {params.batch_size}), seed {args.seed}, {args.steps:,} env "
        "steps, run in process through the real update path (see the script's docstring). "
        "Cumulative pseudo-regret R(T) at doubling horizons; R(T)/R(T/2) is 2 for linear "
        "growth and about 1.41 for sqrt(T) log(T).\n\n"
        f"{markdown_table(headers, rows)}\n\n"
        f"LinUCB's regret over the second half of the run is {second:.2f}, "
        f"{second / first:.3f} of the first half's {first:.2f} (linear growth: 1): "
        f"{'sublinear' if second < first else 'NOT sublinear'}. "
        f"{linucb[horizons[0] - 1] / linucb[-1]:.0%} of it comes in the first {horizons[0]} "
        "steps (every arm looks alike until the first increments arrive, and A/b change once "
        f"per batch). Curve: `benchmarks/{PNG.name}`.\n"
    )
    text = section_text(f"LinUCB regret: {label}", started, load_before, body)
    print(text)
    if args.write:
        write_section("bench_bandit", text)


if __name__ == "__main__":
    main()
