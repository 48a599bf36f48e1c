#!/usr/bin/env bash
# stop_cluster.sh -- stop the `easyrl run` processes that launch_cluster.sh started.
#
# Usage: scripts/stop_cluster.sh [CONFIG] --ps_hosts h:p,... --memory_hosts h:p,...
#            --learner_hosts h1,h2 --actor_hosts h1,h2,h3 [--dry-run]
#
# Takes the same host flags as launch_cluster.sh (CONFIG, --token_file and --workdir are
# accepted and ignored, so the launch arguments can be reused). On every listed host it
# sends SIGTERM to the current user's processes whose command line contains "easyrl run"
# (pkill -f; the pattern is written "[e]asyrl run" so that it cannot match the shell that
# runs pkill). Remote hosts are reached with ${SSH:-ssh}; localhost / 127.0.0.1 directly.
#   --dry-run   print the commands instead of running them
set -euo pipefail

prog=${0##*/}
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "$prog: error: $*" >&2; echo "Try '$prog --help'." >&2; exit 2; }
need() { (($# >= 2)) || die "$1 needs a value"; }

lists=() positional=() dry_run=0
while (($#)); do
  if [[ $1 == --*=* ]]; then set -- "${1%%=*}" "${1#*=}" "${@:2}"; fi
  case $1 in
    -h | --help) usage; exit 0 ;;
    --dry-run | --dry_run) dry_run=1; shift; continue ;;
    --ps_hosts | --ps-hosts | --memory_hosts | --memory-hosts) need "$@"; lists+=("$1" "$2") ;;
    --learner_hosts | --learner-hosts | --actor_hosts | --actor-hosts) need "$@"; lists+=("$1" "$2") ;;
    --token_file | --token-file | --workdir) need "$@" ;;
    -*) die "unknown option: $1" ;;
    *) positional+=("$1"); shift; continue ;;
  esac
  shift 2
done
((${#positional[@]} <= 1)) || die "unexpected arguments: ${positional[*]:1}"
((${#lists[@]})) || die "no hosts given (use --ps_hosts, --memory_hosts, --learner_hosts, --actor_hosts)"

host='[A-Za-z0-9._-]+'
hosts=()
for ((i = 1; i < ${#lists[@]}; i += 2)); do
  flag=${lists[i - 1]} value=${lists[i]}
  if [[ $flag == --ps* || $flag == --memory* ]]; then re="$host:[0-9]+" what=host:port; else re="($host@)?$host" what=hosts; fi
  [[ $value =~ ^$re(,$re)*$ ]] || die "$flag must be a comma-separated list of $what, got '$value'"
  IFS=, read -ra entries <<<"$value"
  for h in "${entries[@]%:*}"; do [[ " ${hosts[*]} " == *" $h "* ]] || hosts+=("$h"); done
done

read -ra ssh <<<"${SSH:-ssh}"
kill_cmd='pkill -u "$(id -u)" -f "[e]asyrl run"'
status=0
for h in "${hosts[@]}"; do
  if [[ $h == localhost || $h == 127.0.0.1 ]]; then cmd=(bash -c "$kill_cmd"); else cmd=("${ssh[@]}" "$h" "$kill_cmd"); fi
  if ((dry_run)); then echo "${cmd[*]:0:${#cmd[@]}-1} ${kill_cmd@Q}"; continue; fi
  rc=0
  "${cmd[@]}" </dev/null || rc=$?
  case $rc in
    0) echo "$prog: $h: stopped easyrl processes" ;;
    1) echo "$prog: $h: no easyrl processes running" ;;
    *) echo "$prog: $h: failed (exit $rc)" >&2; status=1 ;;
  esac
done
exit "$status"
