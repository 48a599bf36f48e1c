"""Trains PPO on CartPole from Python with a callback, then plays the trained policy.

    python examples/python_api.py [--target R] [--seconds S] [--dir RUN_DIR]

`easyrl.train` runs the whole cluster as local processes; the callback hears every metrics
row (what metrics.jsonl gets), every evaluation and checkpoint, and asks the run to stop once
the mean return reaches R (`return self.stop(...)`; returning False stops it too, as in
Stable-Baselines3). `easyrl.load` then loads the run's greedy policy, and `predict` plays one
CartPole episode with it, as SB3's `model.predict` would.
"""

import argparse
import sys
from pathlib import Path

import gymnasium

import easyrl

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "cartpole_ppo.yaml"


class StopAtReturn(easyrl.Callback):
    """Prints the progress and stops the run at a mean return of `target`."""

    def __init__(self, target: float):
        self.target = target

    def on_progress(self, row):
        ret = row.get("return_mean")
        print(f"  {row['time_s']:6.1f} s  {row['env_steps']:>8,.0f} env steps  return {ret}")
        if ret is not None and ret >= self.target:
            return self.stop(f"mean return {ret:.1f} >= {self.target:g}")
        return None

    def on_checkpoint(self, path):
        print(f"  checkpoint {path.name}")

    def on_stop(self, reason):
        print(f"  stopped: {reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="PPO on CartPole with a callback, then predict")
    parser.add_argument("--target", type=float, default=200.0, help="mean return to stop at")
    parser.add_argument("--seconds", type=float, default=120.0, help="stop.max_seconds")
    parser.add_argument("--dir", help="run directory (default: runs/cartpole-ppo-<time>)")
    args = parser.parse_args(argv)
    result = easyrl.train(
        CONFIG,
        callbacks=[StopAtReturn(args.target)],
        stop={"max_seconds": args.seconds},
        run={"dir": args.dir},
        cluster={"actor": 1},
    )
    print(f"run directory {result.run_dir}: {result.reason}")

    policy = easyrl.load(result.run_dir)  # or an `easyrl export` directory
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        action, _ = policy.predict(obs)  # one observation, one action (a batch works too)
        obs, reward, terminated, truncated, _ = env.step(action)
        total, done = total + float(reward), terminated or truncated
    print(f"{policy}: one episode with policy.predict: return {total:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
