#!/usr/bin/env bash
# A throwaway single-node SLURM cluster on this machine, for tests/test_slurm.py and for trying
# profiles/slurm-test by hand: munged + slurmctld + slurmd on 127.0.0.1, partition `debug`, one fake GPU
# (GRES gpu:1 backed by /dev/null: jobs that ask for a GPU get scheduled, one at a time, with
# CUDA_VISIBLE_DEVICES=0; torch still sees no CUDA device and runs on the CPU).
#
# Debian/Ubuntu, run as root, no systemd needed. Installs slurmctld slurmd slurm-client munge with apt-get
# when they are missing. Config, spool, logs, pid files and the munge key live in $FEDREPRO_SLURM_DIR
# (default /tmp/fedrepro-slurm); nothing is written to /etc. Outside it, only runtime directories under /run:
# munged's standard socket (/run/munge; a munged already answering there is used instead) and slurmd's
# config cache link /run/slurm/conf. The cluster is "configless": slurmd fetches slurm.conf from slurmctld
# and client commands (sinfo, sbatch, and the srun that snakemake runs inside each job after removing every
# SLURM_* variable, SLURM_CONF included) find it in /run/slurm/conf without any environment.
#   tools/slurm/start.sh && sinfo && tools/slurm/stop.sh
# Environment: FEDREPRO_SLURM_DIR, FEDREPRO_SLURM_PORT (slurmctld; slurmd uses +1; default 6817),
# FEDREPRO_SLURM_WAIT (seconds to wait for the node to become idle; default 60).
# Exit status: 0 up; 77 cannot run here (not root, no apt-get/dpkg, packages not installable, another SLURM
# configured or running on this machine); 1 failed to start (the daemons' log tails are printed).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
export DEBIAN_FRONTEND=noninteractive

DIR=${FEDREPRO_SLURM_DIR:-/tmp/fedrepro-slurm}
PORT=${FEDREPRO_SLURM_PORT:-6817}
WAIT=${FEDREPRO_SLURM_WAIT:-60}
HERE=$(cd "$(dirname "$0")" && pwd)
PKGS="slurmctld slurmd slurm-client munge"

cannot() { echo "start.sh: cannot start SLURM here: $*" >&2; exit 77; }
fail() {
  echo "start.sh: SLURM failed to start: $*" >&2
  for f in "$DIR"/log/*.log "$DIR"/munge/*.log; do
    if [ -s "$f" ]; then echo "--- tail $f" >&2; tail -n 20 "$f" >&2; fi
  done
  "$HERE/stop.sh" >/dev/null 2>&1 || true
  exit 1
}

[ "$(id -u)" = 0 ] || cannot "needs root (daemons, apt-get)"

# --- packages (quiet; only when something is missing) ---
missing=0
for b in slurmctld slurmd sinfo sbatch squeue scontrol srun munged munge unmunge; do
  command -v "$b" >/dev/null || missing=1
done
if [ "$missing" = 1 ]; then
  { command -v apt-get && command -v dpkg; } >/dev/null || cannot "slurm/munge are not installed and there is no apt-get/dpkg"
  echo "start.sh: installing $PKGS (apt-get) ..."
  mkdir -p "$DIR"
  if ! apt-get install -y -qq --no-install-recommends $PKGS >"$DIR/apt.log" 2>&1; then
    # a fresh container has no package lists yet
    apt-get update -qq >>"$DIR/apt.log" 2>&1 || true
    apt-get install -y -qq --no-install-recommends $PKGS >>"$DIR/apt.log" 2>&1 \
      || { tail -n 20 "$DIR/apt.log" >&2; cannot "apt-get install $PKGS failed (log: $DIR/apt.log)"; }
  fi
fi

# --- a clean state directory; a cluster of ours still running is stopped first ---
"$HERE/stop.sh" >/dev/null 2>&1 || true
[ ! -e /etc/slurm/slurm.conf ] \
  || cannot "/etc/slurm/slurm.conf exists: this machine has its own SLURM set-up, which clients would use"
for d in slurmctld slurmd; do
  ! pgrep -x "$d" >/dev/null || cannot "a $d that tools/slurm/start.sh did not start is running"
done
rm -rf "$DIR/etc" "$DIR/munge" "$DIR/spool" "$DIR/log" "$DIR/run"
mkdir -p "$DIR/etc" "$DIR/munge" "$DIR/spool/ctld" "$DIR/spool/d" "$DIR/log" "$DIR/run"
chmod 0755 "$DIR"

# --- munge on its standard socket (slurmd authenticates its config fetch before it has read any config) ---
M="$DIR/munge"
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "start.sh: using the munged already running"
else
  if command -v mungekey >/dev/null; then mungekey --create --keyfile="$M/munge.key" >/dev/null
  else dd if=/dev/urandom of="$M/munge.key" bs=1024 count=1 status=none; fi
  mkdir -p /run/munge
  chown munge:munge "$M" "$M/munge.key" /run/munge
  chmod 0755 "$M" /run/munge && chmod 0400 "$M/munge.key"
  runuser -u munge -- munged --force --key-file="$M/munge.key" --pid-file="$M/munged.pid" \
    --log-file="$M/munged.log" --seed-file="$M/munged.seed" || fail "munged did not start"
  for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || fail "munged does not answer"
fi

# --- slurm.conf + gres.conf (slurmctld serves both to slurmd) ---
H=$(hostname -s)
NODE=$(slurmd -C | head -n 1)   # e.g. NodeName=vm CPUs=2 Boards=1 ... RealMemory=24105
MEM=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$NODE")
NODE=$(sed "s/RealMemory=[0-9]*/RealMemory=$((MEM * 90 / 100))/" <<<"$NODE")
export SLURM_CONF="$DIR/etc/slurm.conf"
cat >"$SLURM_CONF" <<EOF
# written by tools/slurm/start.sh: a single-node test cluster; state in $DIR
ClusterName=fedrepro
SlurmctldHost=${H}(127.0.0.1)
SlurmctldParameters=enable_configless
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
# no slurmdbd, so no sacct: clients ask squeue (profiles/slurm-test: slurm-status-command: squeue)
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# finished jobs stay visible to squeue/scontrol for 300 s (snakemake's squeue mode needs >= 3 x its init wait)
MinJobAge=300
InactiveLimit=0
KillWait=5
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=30
$NODE NodeAddr=127.0.0.1 Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
echo "NodeName=$H Name=gpu File=/dev/null" >"$DIR/etc/gres.conf"

# --- daemons (each daemonizes and writes its pid file) ---
slurmctld -f "$SLURM_CONF" -c || fail "slurmctld did not start"
# slurmctld daemonizes before it listens: a slurmd started at once can find no controller to fetch its config
# from ("Unable to contact slurm controller (connect failure)", seen once in six test runs)
for _ in $(seq $((WAIT * 5))); do
  scontrol ping 2>/dev/null | grep -q "is UP" && break
  sleep 0.2
done
SLURM_CONF='' slurmd --conf-server "127.0.0.1:$PORT" || fail "slurmd did not start"
state=""
for _ in $(seq $((WAIT * 5))); do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -n 1) || true
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || fail "node not idle after ${WAIT}s (sinfo: '${state:-no answer}')"
unset SLURM_CONF   # from here on, as every client will: through slurmd's /run/slurm/conf
gpu=$(timeout 30 srun -p debug -t 1 --gpus=1 printenv CUDA_VISIBLE_DEVICES 2>&1) \
  || fail "a 1-GPU test job did not run: $gpu"
echo "start.sh: SLURM up: partition debug, node $H, fake GPU (CUDA_VISIBLE_DEVICES=$gpu); state in $DIR"
