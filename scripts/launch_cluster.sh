#!/usr/bin/env bash
# launch_cluster.sh -- start a whole easyrl cluster, one process per host-list entry.
#
# Usage: scripts/launch_cluster.sh CONFIG --ps_hosts h:p,... --memory_hosts h:p,...
#            --learner_hosts h1,h2 --actor_hosts h1,h2,h3
#            [--token_file F] [--workdir DIR] [--dry-run] [-- EXTRA...]
#
# ps task i runs on the host of ps_hosts[i] and binds that host:port; memory likewise;
# learner task i runs on learner_hosts[i], actor task i on actor_hosts[i]. Listening roles
# (ps, memory) start first, then learners, then actors.
#
# Every host needs `easyrl` on the PATH of a non-interactive ssh shell and this repository
# at WORKDIR (default: the one holding this script, same path everywhere); CONFIG and a relative
# --token_file are resolved relative to WORKDIR. Remote hosts are reached with ${SSH:-ssh}
# (non-interactive, e.g. key-based); hosts named localhost / 127.0.0.1 are started locally.
# Logs go to WORKDIR/logs/ROLE-TASK.log on the host that runs the role.
#
# Auth token: only a file PATH is ever put on a command line. With --token_file F, F must
# already exist at that path on EVERY host. Without it, a fresh token is written to
# WORKDIR/.easyrl_token (mode 600) and copied to each remote host with ${SCP:-scp} first.
#
#   --dry-run   print the commands instead of running them
#   -- EXTRA... passed to every `easyrl run` (e.g. --set algorithm.lr=1e-4)
# EASYRL_STARTUP_DELAY (default 2): seconds to wait after starting the listening roles.
set -euo pipefail

prog=${0##*/}
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "$prog: error: $*" >&2; echo "Try '$prog --help'." >&2; exit 2; }

workdir=$(cd "$(dirname "$0")/.." && pwd)
positional=() extra=() ps="" mem="" learners="" actors="" token_file="" dry_run=0
need() { (($# >= 2)) || die "$1 needs a value"; }
while (($#)); do
  if [[ $1 == --*=* ]]; then set -- "${1%%=*}" "${1#*=}" "${@:2}"; fi
  case $1 in
    -h | --help) usage; exit 0 ;;
    --dry-run | --dry_run) dry_run=1; shift; continue ;;
    --) shift; extra=("$@"); break ;;
    --ps_hosts | --ps-hosts) need "$@"; ps=$2 ;;
    --memory_hosts | --memory-hosts) need "$@"; mem=$2 ;;
    --learner_hosts | --learner-hosts) need "$@"; learners=$2 ;;
    --actor_hosts | --actor-hosts) need "$@"; actors=$2 ;;
    --token_file | --token-file) need "$@"; token_file=$2 ;;
    --workdir) need "$@"; workdir=$2 ;;
    -*) die "unknown option: $1" ;;
    *) positional+=("$1"); shift; continue ;;
  esac
  shift 2
done

((${#positional[@]} == 1)) || die "expected exactly one CONFIG argument, got ${#positional[@]}"
config=${positional[0]}
host='[A-Za-z0-9._-]+'
check_list() { # NAME VALUE REGEX DESCRIPTION
  [[ -n $2 ]] || die "--$1 is required and must not be empty"
  [[ $2 =~ ^$3(,$3)*$ ]] || die "--$1 must be a comma-separated list of $4, got '$2'"
}
check_list ps_hosts "$ps" "$host:[0-9]+" "host:port"
check_list memory_hosts "$mem" "$host:[0-9]+" "host:port"
check_list learner_hosts "$learners" "($host@)?$host" "hosts"
check_list actor_hosts "$actors" "($host@)?$host" "hosts"
IFS=, read -ra ps_list <<<"$ps"
IFS=, read -ra mem_list <<<"$mem"
IFS=, read -ra learner_list <<<"$learners"
IFS=, read -ra actor_list <<<"$actors"
declare -A seen=()
for addr in "${ps_list[@]}" "${mem_list[@]}"; do
  port=${addr##*:}
  ((10#$port >= 1 && 10#$port <= 65535)) || die "port out of range in '$addr'"
  [[ -z ${seen[$addr]:-} ]] || die "address '$addr' is listed twice in --ps_hosts/--memory_hosts"
  seen[$addr]=1
done
[[ $workdir == /* ]] || die "--workdir must be an absolute path, got '$workdir'"
if [[ -d $workdir ]]; then
  (cd "$workdir" && [[ -f $config ]]) || die "config file not found: $config (relative to $workdir)"
fi

read -ra ssh <<<"${SSH:-ssh}"
read -ra scp <<<"${SCP:-scp}"
is_local() { [[ $1 == localhost || $1 == 127.0.0.1 ]]; }
quote() { # ARGS...: shell-quote, leaving plain words bare
  local a out=()
  for a; do if [[ $a =~ ^[A-Za-z0-9_./:=@,+-]+$ ]]; then out+=("$a"); else out+=("${a@Q}"); fi; done
  echo "${out[*]}"
}
run() { # print (dry run) or execute a command
  if ((dry_run)); then quote "$@"; else "$@" </dev/null; fi
}

remote_hosts=()
for h in "${ps_list[@]%:*}" "${mem_list[@]%:*}" "${learner_list[@]}" "${actor_list[@]}"; do
  is_local "$h" || [[ " ${remote_hosts[*]} " == *" $h "* ]] || remote_hosts+=("$h")
done
if [[ -z $token_file ]]; then
  token_file=$workdir/.easyrl_token
  if ((dry_run)); then
    echo "# generate a random token into $token_file (mode 600)"
  else
    [[ -d $workdir ]] || die "workdir $workdir must exist on this host to generate the token file"
    (umask 077 && { openssl rand -hex 16 2>/dev/null ||
      python3 -c 'import secrets;print(secrets.token_hex(16))'; } >"$token_file")
    chmod 600 "$token_file"
  fi
  for h in "${remote_hosts[@]}"; do
    run "${scp[@]}" -p -q "$token_file" "$h:$token_file" || { echo "$prog: error: copying the token to $h failed" >&2; exit 1; }
  done
elif ((!dry_run)) && ! (cd "$workdir" 2>/dev/null && [[ -r $token_file ]]); then
  echo "$prog: warning: token file $token_file not readable here; it must exist on every host" >&2
fi

((${#extra[@]} == 0)) || extra=(-- "${extra[@]}")
start() { # ROLE TASK HOST
  local cmd log=logs/$1-$2.log
  cmd=$(quote scripts/launch_role.sh "$1" "$2" "$config" --ps_hosts "$ps" --memory_hosts "$mem" \
    --num_learners "${#learner_list[@]}" --num_actors "${#actor_list[@]}" \
    --token_file "$token_file" --log_dir logs "${extra[@]}")
  cmd="cd $(quote "$workdir") && mkdir -p logs && { nohup $cmd >>$log 2>&1 </dev/null & }"
  if is_local "$3"; then run bash -c "$cmd"; else run "${ssh[@]}" "$3" "$cmd"; fi ||
    { echo "$prog: error: starting $1 $2 on $3 failed (stop the rest with scripts/stop_cluster.sh)" >&2; exit 1; }
  echo "$prog: $1 $2 on $3, log: $3:$workdir/$log" >&2
}
for i in "${!ps_list[@]}"; do start ps "$i" "${ps_list[i]%:*}"; done
for i in "${!mem_list[@]}"; do start memory "$i" "${mem_list[i]%:*}"; done
((dry_run)) || sleep "${EASYRL_STARTUP_DELAY:-2}"
for i in "${!learner_list[@]}"; do start learner "$i" "${learner_list[i]}"; done
for i in "${!actor_list[@]}"; do start actor "$i" "${actor_list[i]}"; done
