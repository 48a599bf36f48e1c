"""Trains the custom corridor environment with the custom torso through the Python API.

    python examples/custom/train.py [--seed S] [--set KEY=VALUE ...]

`easyrl.train` takes the config file, `--set`-style overrides (`set=[...]`) and sections as
keyword arguments (`run={"seed": 3}`), runs the whole cluster as local processes and returns a
`TrainResult`. Exit status 0 when the config's goal was reached.
"""

import argparse
import sys
from pathlib import Path

import easyrl

CONFIG = Path(__file__).resolve().with_name("config.yaml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="run.seed (default 0)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    result = easyrl.train(CONFIG, set=args.set, run={"seed": args.seed})
    metrics = result.metrics
    print(
        f"{'reached the goal' if result.reached_goal else 'did not reach the goal'}: "
        f"{result.reason}; {metrics.get('env_steps', 0):.0f} env steps, "
        f"{metrics.get('updates', 0):.0f} updates, mean return {metrics.get('return_mean')}; "
        f"run directory {result.run_dir}"
    )
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
