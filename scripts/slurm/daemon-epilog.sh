#!/bin/bash
# SLURM epilog: stop the job's user's autobatch daemon on this node after the user's last job here.
#
# Pair with daemon-prolog.sh (its header has the slurm.conf lines and the assumptions). The user's other
# jobs on this node are counted with `squeue -h -w NODE -u USER` (every state: a job still pending or
# completing here keeps the daemon); this job (SLURM_JOB_ID) is left out of the count. When squeue cannot
# answer, the daemon is left running: it exits by itself after daemon_idle without requests.
# Stopping ends running requests as interrupted tunes end (their measured probes kept).
set -uo pipefail

user=${SLURM_JOB_USER:-$(id -un)}
uid=$(id -u "$user") || exit 0
job=${SLURM_JOB_ID:-}
node=${SLURMD_NODENAME:-$(hostname -s)}
AUTOBATCH=${AUTOBATCH:-autobatch}
folder=${AUTOBATCH_DAEMON_DIR:-/tmp/autobatch-daemon-$uid}
[ -d "$folder" ] || exit 0  # no daemon was started for this user here

as_user() {
  if [ "$(id -u)" = "$uid" ]; then "$@"; else runuser -u "$user" -- "$@"; fi
}

exec 9>>"$folder/slurm.lock"
flock 9
if ! jobs=$(squeue -h -w "$node" -u "$user" -o %A 2>/dev/null); then
  echo "autobatch epilog: squeue did not answer; leaving $user's daemon to its idle exit" >&2
  exit 0
fi
others=$(printf '%s\n' "$jobs" | grep -v -x -e "$job" -e '' | wc -l)
if [ "$others" -eq 0 ]; then
  # shellcheck disable=SC2086  # AUTOBATCH may be a command with arguments (python -m autobatch)
  as_user env AUTOBATCH_DAEMON_DIR="$folder" $AUTOBATCH daemon stop >&2 \
    || echo "autobatch epilog: could not stop $user's daemon" >&2
fi
exit 0
