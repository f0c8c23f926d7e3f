#!/bin/bash
# Starts a one-node Slurm cluster on this machine for the slurm-labelled tests: munged,
# slurmctld and slurmd (Debian's slurm-wlm and munge, installed by setup.sh), with a minimal
# configuration: one node named after this host, 8 CPU slots (oversubscribed, so that a few
# 2-rank array tasks run at once), the pmix MPI plugin. Idempotent: does nothing when the
# cluster answers already. Needs root.
set -euo pipefail
if sinfo -h >/dev/null 2>&1 && [[ $(sinfo -h -o %T | head -1) =~ idle|mix|alloc ]]; then exit 0; fi
[[ $(id -u) == 0 ]] || { echo "start_slurm.sh: needs root" >&2; exit 2; }
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  echo "start_slurm.sh: slurm-wlm and munge are not installed (run setup.sh)" >&2; exit 2
fi
host=$(hostname -s)
conf_dir=/etc/slurm
mkdir -p "$conf_dir" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
chown munge:munge /run/munge
[[ -s /etc/munge/munge.key ]] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
cat > "$conf_dir/slurm.conf" <<CONF
ClusterName=megabatch-test
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SchedulerParameters=defer
JobRequeue=1
NodeName=$host CPUs=8 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 300); do  # a deadline for a loaded machine
  if [[ $(sinfo -h -o %T 2>/dev/null | head -1) =~ idle|mix|alloc ]]; then exit 0; fi
  sleep 1
done
echo "start_slurm.sh: the cluster did not come up; see /var/log/slurm/" >&2
sinfo >&2 || true
exit 1
