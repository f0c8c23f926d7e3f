#!/bin/bash
# An rsh agent for mpirun (--mca plm_rsh_agent) in which each "host" of the hostfile is a
# network namespace of this machine: `netns_rsh.sh HOST COMMAND...` runs the command (Open
# MPI's daemon) inside namespace HOST, as ssh would on a real host. Used by the two-host test.
host=$1
shift
exec ip netns exec "$host" /bin/sh -c "$*"
