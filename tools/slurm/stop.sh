#!/usr/bin/env bash
# Stop the cluster tools/slurm/start.sh started: cancel its jobs, then stop slurmd, slurmctld and munged
# (munged only if start.sh started it), each by the pid file it wrote and only while that pid still runs the
# expected program, waiting (bounded) for each to exit. Removes slurmd's /run/slurm/conf link if it points
# into our state directory. Safe to rerun.
set -uo pipefail
DIR=${FEDREPRO_SLURM_DIR:-/tmp/fedrepro-slurm}

stop() {  # pid-file program
  local pid
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    if [ -d "/proc/$pid" ]; then
      echo "stop.sh: $2 ($pid) still runs 10 s after SIGTERM; sending SIGKILL" >&2
      kill -9 "$pid" 2>/dev/null
    fi
  fi
  rm -f "$1"
}

# cancel what is still queued or running (a test killed on timeout leaves jobs behind), then the daemons
if [ -s "$DIR/run/slurmctld.pid" ] && [ "$(cat "/proc/$(cat "$DIR/run/slurmctld.pid")/comm" 2>/dev/null)" = slurmctld ]; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
  if [ -n "$jobs" ]; then
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi
stop "$DIR/run/slurmd.pid" slurmd
stop "$DIR/run/slurmctld.pid" slurmctld
stop "$DIR/munge/munged.pid" munged
link=$(readlink /run/slurm/conf 2>/dev/null) && [ "${link#"$DIR"/}" != "$link" ] && rm -f /run/slurm/conf
echo "stop.sh: SLURM stopped ($DIR)"
