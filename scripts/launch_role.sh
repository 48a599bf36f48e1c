#!/usr/bin/env bash
# launch_role.sh -- run ONE easyrl process (one role, one task index) on this host.
#
# Usage: scripts/launch_role.sh ROLE TASK CONFIG --ps_hosts h:p,... --memory_hosts h:p,...
#            --num_learners N --num_actors N [--token_file F] [--log_dir DIR] [-- EXTRA...]
#
#   ROLE    ps | memory | learner | actor
#   TASK    task index (0-based); ps/memory task i binds the i-th host:port of its list
#   CONFIG  experiment config (YAML)
#
# Options (underscore or dash spellings, "--opt VALUE" or "--opt=VALUE"):
#   --ps_hosts, --memory_hosts   comma-separated host:port lists
#   --num_learners, --num_actors number of learner / actor processes in the cluster
#   --token_file F   export EASYRL_TOKEN from F's contents (else the environment is left as is)
#   --log_dir DIR    append stdout/stderr to DIR/ROLE-TASK.log
#   -- EXTRA...      passed to `easyrl run` unchanged (e.g. --set algorithm.lr=1e-4)
# The cluster flags may be omitted if the cluster comes from EASYRL_CLUSTER or "-- --cluster FILE".
# The token never goes on a command line. EASYRL_BIN overrides the easyrl executable.
set -euo pipefail

prog=${0##*/}
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "$prog: error: $*" >&2; echo "Try '$prog --help'." >&2; exit 2; }

positional=() cluster_args=() extra=() token_file="" log_dir=""
while (($#)); do
  if [[ $1 == --*=* ]]; then set -- "${1%%=*}" "${1#*=}" "${@:2}"; fi
  case $1 in
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    --ps_hosts | --ps-hosts | --memory_hosts | --memory-hosts | \
      --num_learners | --num-learners | --num_actors | --num-actors)
      (($# >= 2)) || die "$1 needs a value"
      cluster_args+=("${1//_/-}" "$2"); shift 2 ;;
    --token_file | --token-file) (($# >= 2)) || die "$1 needs a value"; token_file=$2; shift 2 ;;
    --log_dir | --log-dir) (($# >= 2)) || die "$1 needs a value"; log_dir=$2; shift 2 ;;
    -[0-9]*) positional+=("$1"); shift ;; # a negative TASK: rejected below with a clear message
    -*) die "unknown option: $1" ;;
    *) positional+=("$1"); shift ;;
  esac
done

((${#positional[@]} == 3)) || die "expected ROLE TASK CONFIG, got ${#positional[@]} positional argument(s)"
role=${positional[0]} task=${positional[1]} config=${positional[2]}
case $role in ps | memory | learner | actor) ;; *) die "unknown ROLE '$role' (expected ps, memory, learner or actor)" ;; esac
[[ $task =~ ^[0-9]+$ ]] || die "TASK must be a non-negative integer, got '$task'"
task=$((10#$task))
[[ -f $config ]] || die "config file not found: $config"
for ((i = 1; i < ${#cluster_args[@]}; i += 2)); do
  flag=${cluster_args[i - 1]} value=${cluster_args[i]}
  if [[ $flag == --num-* ]]; then
    [[ $value =~ ^[0-9]+$ ]] || die "$flag must be a non-negative integer, got '$value'"
    if [[ $flag == "--num-${role}s" ]] && ((task >= 10#$value)); then die "TASK $task is out of range: $flag is $value"; fi
  else
    [[ $value =~ ^[^,:]+:[0-9]+(,[^,:]+:[0-9]+)*$ ]] || die "$flag must be a comma-separated host:port list, got '$value'"
    IFS=, read -ra entries <<<"$value"
    if [[ $flag == "--$role-hosts" ]] && ((task >= ${#entries[@]})); then
      die "TASK $task is out of range: $flag lists ${#entries[@]} address(es)"
    fi
  fi
done

if [[ -n $token_file ]]; then
  [[ -r $token_file ]] || die "token file not readable: $token_file"
  token=$(<"$token_file")
  token=${token#"${token%%[![:space:]]*}"} token=${token%"${token##*[![:space:]]}"} # trim
  [[ -n $token ]] || die "token file is empty: $token_file"
  export EASYRL_TOKEN=$token
  unset token
fi
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# glibc keeps large freed buffers (easyrl.cluster.launcher.MALLOC_ENV; a user's own win)
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-67108864}
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-1073741824}
export MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-1}

if [[ -n $log_dir ]]; then
  mkdir -p "$log_dir"
  exec >>"$log_dir/$role-$task.log" 2>&1
  echo "=== $(date '+%F %T') $prog: starting $role $task on $(hostname) ==="
fi

easyrl=${EASYRL_BIN:-easyrl}
command -v "$easyrl" >/dev/null || { echo "$prog: error: '$easyrl' not found (install easyrl or set EASYRL_BIN)" >&2; exit 127; }
exec "$easyrl" run --role "$role" --task "$task" --config "$config" "${cluster_args[@]}" "${extra[@]}"
