#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests/test_slurm.py (Debian/Ubuntu, as root).
# Installs slurm-wlm and munge when missing, writes slurm.conf for this host's CPUs and
# memory (`slurmd -C`), starts munged, slurmctld and slurmd, waits for the node to be idle.
# Idempotent: with the daemons already up and the same config it only checks the node.
# No cgroup plugins (proctrack/linuxproc, task/none), so it can run in a container.
# Exit codes name the failing step: 3 install, 4 munged, 5 slurmctld, 6 slurmd/node.
set -uo pipefail
PARTITION=${SLURM_TEST_PARTITION:-e3test}
LOGDIR=/var/log/slurm
fail() { echo "start_cluster: $2" >&2; exit "$1"; }

if ! command -v sbatch >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  [ "$(id -u)" = 0 ] || fail 3 "sbatch missing and not root: cannot apt-get install slurm-wlm munge"
  command -v apt-get >/dev/null || fail 3 "sbatch missing and no apt-get on this machine"
  export DEBIAN_FRONTEND=noninteractive
  out=$( { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; } 2>&1 ) \
    || fail 3 "apt-get install slurm-wlm munge failed: $(echo "$out" | grep -E '^(E|Err):' | head -1)"
fi
[ "$(id -u)" = 0 ] || fail 3 "not root: cannot write /etc/slurm or start the daemons"

# munge: a key, then the daemon.
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 400 /etc/munge/munge.key
if ! munge -n >/dev/null 2>&1; then
  if id munge >/dev/null 2>&1; then su -s /bin/sh munge -c munged 2>/tmp/munged.err || munged --force 2>/tmp/munged.err
  else munged --force 2>/tmp/munged.err; fi
  for _ in $(seq 20); do munge -n >/dev/null 2>&1 && break; sleep 0.5; done
  munge -n >/dev/null 2>&1 || fail 4 "munged did not start: $(tail -1 /tmp/munged.err 2>/dev/null)"
fi

HOST=$(hostname -s)
NODE=$(slurmd -C 2>/dev/null | head -1)
case "$NODE" in NodeName=*) ;; *) fail 6 "slurmd -C printed no node line: $NODE";; esac
mkdir -p /etc/slurm $LOGDIR /var/spool/slurmctld /var/spool/slurmd
CONF=$(cat <<CONF
# written by tests/slurm/start_cluster.sh
ClusterName=eagle3test
SlurmctldHost=$HOST
AuthType=auth/munge
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGDIR/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MinJobAge=3600
ReturnToService=2
MpiDefault=none
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
$NODE State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
)
changed=0
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" != "$CONF" ]; then echo "$CONF" > /etc/slurm/slurm.conf; changed=1; fi

if [ $changed = 1 ] || ! scontrol ping >/dev/null 2>&1; then
  [ -f /run/slurmctld.pid ] && kill "$(cat /run/slurmctld.pid)" 2>/dev/null && sleep 1
  [ -f /run/slurmd.pid ] && kill "$(cat /run/slurmd.pid)" 2>/dev/null && sleep 1
  slurmctld -c 2>/tmp/slurmctld.err || fail 5 "slurmctld did not start: $(tail -1 /tmp/slurmctld.err)"
  for _ in $(seq 30); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.5; done
  scontrol ping 2>/dev/null | grep -q UP \
    || fail 5 "slurmctld not answering: $(grep -iE 'error|fatal' $LOGDIR/slurmctld.log | tail -1)"
fi
if ! pgrep -x slurmd >/dev/null; then
  slurmd 2>/tmp/slurmd.err || fail 6 "slurmd did not start: $(tail -1 /tmp/slurmd.err)"
fi
for _ in $(seq 60); do
  state=$(sinfo -h -n "$HOST" -o %t 2>/dev/null)
  case "$state" in idle|mix|alloc) echo "$PARTITION"; exit 0;; down*|drain*) scontrol update nodename="$HOST" state=resume 2>/dev/null;; esac
  sleep 0.5
done
fail 6 "node $HOST not idle (state '${state:-?}'): $(grep -iE 'error|fatal' $LOGDIR/slurmd.log 2>/dev/null | tail -1)"
