#!/usr/bin/env bash
# Paired time to solve of two commits: BEFORE and AFTER (git revisions) alternate, one
# `bench_solve.py --runs 1` each, ROUNDS rounds per config (default 3); one line per run (its
# JSON result).
#   [ROUNDS=N] benchmarks/bench_pair.sh BEFORE AFTER [CONFIG ...]   (configs by name, e.g. cartpole_ppo)
set -euo pipefail
before=$1 after=$2
shift 2
configs=${*:-cartpole_ppo cartpole_impala pendulum_sac cartpole_apex}
repo=$(git rev-parse --show-toplevel)
root=$(mktemp -d)
git -C "$repo" worktree add -q "$root/before" "$before"
git -C "$repo" worktree add -q "$root/after" "$after"
trap 'git -C "$repo" worktree remove --force "$root/before"; git -C "$repo" worktree remove --force "$root/after"' EXIT
export TF_CPP_MIN_LOG_LEVEL=2
for c in $configs; do
  for i in $(seq "${ROUNDS:-3}"); do
    for side in before after; do
      load=$(cut -d' ' -f1 /proc/loadavg)
      line=$(cd "$root/$side" && PYTHONPATH="$root/$side" python benchmarks/bench_solve.py \
        "configs/$c.yaml" --runs 1 2>&1 | grep '^{')
      echo "$c $side $i load=$load $line"
    done
  done
done
