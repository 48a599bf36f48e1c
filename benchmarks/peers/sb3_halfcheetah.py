"""Stable-Baselines3 SAC on MuJoCo HalfCheetah-v5 beside `configs/halfcheetah_sac.yaml`, run in
the peers' own Python (see `bench_peers.py` for the venv; add "gymnasium[mujoco]"):

    taskset -c 0,1 python sb3_halfcheetah.py BUDGET_STEPS CORES

The settings are easyrl's config's (Tianshou's): a 256x256 ReLU actor and critics, batch 256,
gamma 0.99, tau 0.005, 10,000 uniform-random steps first, one update per env step, learned
entropy temperature, one env. One difference SB3 imposes: a single learning rate (1e-3) for the
actor, the critics and the temperature (easyrl and Tianshou learn the temperature at 3e-4).

Prints one JSON line of progress every 10 s (env steps, wall seconds since start, episodes, mean
return of the last 10 training episodes) and at the end the deterministic evaluation of the last
policy over 10 episodes, as easyrl's evaluator does (`"eval_return_mean"`).
"""

import json
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

STARTED = time.monotonic()


class Report(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns: list[float] = []
        self.last = 0.0

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
        now = time.monotonic()
        if now - self.last > 10.0:
            self.last = now
            record = {
                "steps": self.num_timesteps,
                "wall_s": round(now - STARTED, 1),
                "episodes": len(self.returns),
                "return_mean": float(np.mean(self.returns[-10:])) if self.returns else None,
            }
            print(json.dumps(record), flush=True)
        return True


def main() -> None:
    budget, cores = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(cores)
    env = Monitor(gym.make("HalfCheetah-v5"))
    model = SAC(
        "MlpPolicy",
        env,
        learning_rate=1e-3,
        buffer_size=1_000_000,
        learning_starts=10_000,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        policy_kwargs={"net_arch": [256, 256]},
        seed=0,
        device="cpu",
    )
    model.learn(total_timesteps=budget, callback=Report())
    trained_s = time.monotonic() - STARTED
    returns, _ = evaluate_policy(
        model,
        Monitor(gym.make("HalfCheetah-v5")),
        n_eval_episodes=10,
        deterministic=True,
        return_episode_rewards=True,
    )
    record = {
        "steps": model.num_timesteps,
        "wall_s": round(trained_s, 1),
        "eval_return_mean": float(np.mean(returns)),
        "eval_return_std": float(np.std(returns)),
    }
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
