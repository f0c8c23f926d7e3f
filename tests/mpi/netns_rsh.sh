#!/bin/bash
# An rsh agent for mpirun (--mca plm_rsh_agent) in which each "host" of the hostfile is a
# network namespace of this machine: `netns_rsh.sh HOST COMMAND...` runs the command (Open
# MPI's daemon) inside namespace HOST, as ssh would on a real host. Used by the two-host test.
#
# The namespaces share this machine's file system and hostname, so Open MPI's session
# directories (under TMPDIR, named after the hostname) would be shared by the two daemons,
# and with any other mpirun on the machine: each host gets its own TMPDIR under
# $MB_NETNS_TMPDIR (set by the test to a directory of its own).
host=$1
shift
tmp=${MB_NETNS_TMPDIR:?MB_NETNS_TMPDIR: the directory the test made for the temporary files of its hosts}/$host
mkdir -p "$tmp"
exec ip netns exec "$host" env TMPDIR="$tmp" /bin/sh -c "$*"
