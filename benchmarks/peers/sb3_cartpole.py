"""Stable-Baselines3 on CartPole-v1, run by `bench_peers.py` in the peers' own Python.

    python sb3_cartpole.py PPO|DQN BUDGET_STEPS CORES WINDOW

Hyper-parameters: the RL Baselines3 Zoo's tuned CartPole-v1 entries (hyperparams/ppo.yml,
hyperparams/dqn.yml), SB3's documented settings for this task, including their
`n_timesteps` (PPO 1e5, DQN 5e4): the learning-rate, clip-range and exploration schedules
are fractions of the total, so training longer would change them. BUDGET_STEPS only caps
it. Prints one JSON line of progress (env steps, episodes, trailing mean return of WINDOW
episodes) every 0.25 s.
"""

import json
import sys
import time

import numpy as np
import torch
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env


def linear(value: float):
    """The Zoo's `lin_<value>` schedule: decays to 0 over training."""
    return lambda progress: progress * value


class Report(BaseCallback):
    def __init__(self, window: int):
        super().__init__()
        self.window, self.returns, self.last = window, [], 0.0

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
        if self.returns and time.monotonic() - self.last > 0.25:
            self.last = time.monotonic()
            record = {
                "steps": self.num_timesteps,
                "episodes": len(self.returns),
                "return_mean": float(np.mean(self.returns[-self.window :])),
            }
            print(json.dumps(record), flush=True)
        return True


def main() -> None:
    name, budget, cores, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(cores)
    if name == "PPO":
        env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
        model = PPO(
            "MlpPolicy",
            env,
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=linear(0.001),
            clip_range=linear(0.2),
            seed=0,
            device="cpu",
        )
    else:
        env = make_vec_env("CartPole-v1", n_envs=1, seed=0)
        model = DQN(
            "MlpPolicy",
            env,
            learning_rate=2.3e-3,
            batch_size=64,
            buffer_size=100_000,
            learning_starts=1000,
            gamma=0.99,
            target_update_interval=10,
            train_freq=256,
            gradient_steps=128,
            exploration_fraction=0.16,
            exploration_final_eps=0.04,
            policy_kwargs={"net_arch": [256, 256]},
            seed=0,
            device="cpu",
        )
    n_timesteps = {"PPO": 100_000, "DQN": 50_000}[name]
    model.learn(total_timesteps=min(budget, n_timesteps), callback=Report(window))


if __name__ == "__main__":
    main()
