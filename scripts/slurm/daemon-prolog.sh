#!/bin/bash
# SLURM prolog: start the job's user's autobatch daemon on this node (nothing to do when it already runs).
#
# Pair with daemon-epilog.sh, which stops it after the user's last job on the node. In slurm.conf:
#   Prolog=/path/to/daemon-prolog.sh   Epilog=/path/to/daemon-epilog.sh   PrologFlags=Alloc
# (Alloc: the prolog runs when the node is allocated, before the job's first step.) Run by slurmd as root,
# it starts the daemon as the job's user (SLURM_JOB_USER) with runuser; run as that user (a test, or a
# site that runs it as the user), it starts it directly. Assumptions (docs/clusters.md):
#   * AUTOBATCH names the same autobatch the jobs run (a site install or module; default: autobatch on
#     PATH); a job whose autobatch or torch version differs replaces the daemon with its own.
#   * the daemon's folder is $AUTOBATCH_DAEMON_DIR, by default /tmp/autobatch-daemon-UID: jobs export the
#     same variable (daemon-job.sbatch does).
#   * the site lets a process the prolog starts outlive it (it runs outside the job's cgroup).
# A failure never fails the job: the prolog says why on stderr and exits 0 (commands then run in-process).
set -uo pipefail

user=${SLURM_JOB_USER:-$(id -un)}
uid=$(id -u "$user") || { echo "autobatch prolog: no user $user" >&2; exit 0; }
AUTOBATCH=${AUTOBATCH:-autobatch}
folder=${AUTOBATCH_DAEMON_DIR:-/tmp/autobatch-daemon-$uid}

as_user() {
  if [ "$(id -u)" = "$uid" ]; then "$@"; else runuser -u "$user" -- "$@"; fi
}

# Serialised with the epilog of the same user on this node: a stop never races a start.
as_user mkdir -p -m 0700 "$folder" || exit 0
exec 9>>"$folder/slurm.lock"
flock 9
# shellcheck disable=SC2086  # AUTOBATCH may be a command with arguments (python -m autobatch)
as_user env AUTOBATCH_DAEMON_DIR="$folder" $AUTOBATCH daemon start \
  || echo "autobatch prolog: the daemon did not start for $user; commands run in-process" >&2
exit 0
