#!/usr/bin/env bash
# Keeps the READMEs' command lines true: every PROGRAM (megabatch's programs, benches and
# fuzz targets) must answer --help with status 0 and a usage line naming itself on stdout,
# and every --flag a DOC names must be one that a PROGRAM's or a launcher's --help lists,
# or one of the other tools' flags the READMEs use (cmake, ctest, mpirun, Slurm, docker,
# podman, aws), listed below with their tool. A flag renamed in a program and not in a
# README, or a README example with a flag that never existed, fails here.
#
#   check_readme_flags.sh DOC... -- PROGRAM...     (exit 0: all held)
set -uo pipefail
usage="usage: check_readme_flags.sh DOC... -- PROGRAM..."
root=$(cd "$(dirname "$0")/../.." && pwd)
docs=()
while (($#)) && [[ $1 != -- ]]; do docs+=("$1"); shift; done
(($#)) && shift
((${#docs[@]} && $#)) || { echo "$usage" >&2; exit 2; }
helps=$(mktemp); out=$(mktemp); trap 'rm -f "$helps" "$out"' EXIT
status=0
for program in "$@"; do
  name=$(basename "$program")
  "$program" --help >"$out" 2>/dev/null </dev/null
  rc=$?
  if ((rc != 0)) || ! grep -qiE "^usage: .*$name" "$out"; then
    echo "$name --help: exit $rc, expected 0 and a 'usage: ... $name' line on stdout:"; head -3 "$out" | sed 's/^/  /'
    status=1
  fi
  cat "$out" >>"$helps"
done
# the launchers' own --help (tests/launchers checks that each answers it)
for launcher in ec2/launch.sh slurm/submit.sh selftest.sh; do bash "$root/launchers/$launcher" --help >>"$helps" 2>/dev/null; done
for launcher in eks/render.py plan.py; do /usr/bin/python3 "$root/launchers/$launcher" --help >>"$helps" 2>/dev/null; done
# other tools' flags the READMEs use
others="--workflow --preset --build --install --prefix"  # cmake
others+=" --test-dir"                                     # ctest
others+=" --bind-to"                                      # mpirun
others+=" --mpi --signal --requeue"                       # srun, sbatch
others+=" --build-arg --target --isolation --storage-driver" # docker build, podman build
others+=" --variant"                                      # mmdebstrap
others+=" --repository-name --username --password-stdin"  # aws ecr, docker login
others+=" --keep"                                         # tests/container/test_image.sh
for doc in "${docs[@]}"; do
  [[ -f $doc ]] || { echo "check_readme_flags.sh: no $doc" >&2; exit 2; }
  # the doc's flags, less families written with a wildcard (`--adam-*`)
  flags=$(sed -E 's/--[a-z0-9-]*\*//g' "$doc" | grep -oE '(^|[^A-Za-z0-9_-])--[a-z][a-z0-9-]*[a-z0-9]' | sed 's/^[^-]*//' | sort -u)
  unknown=()
  for flag in $flags; do
    [[ " $others " == *" $flag "* ]] && continue
    grep -qE -- "(^|[^A-Za-z0-9_-])$flag([^A-Za-z0-9_-]|$)" "$helps" || unknown+=("$flag")
  done
  doc_name=${doc#"$root/"}
  if ((${#unknown[@]})); then
    echo "$doc_name names flags no program's --help lists: ${unknown[*]}"
    for flag in "${unknown[@]}"; do grep -n -m2 -- "$flag" "$doc" | cut -c1-160 | sed "s|^|  $doc_name:|"; done
    status=1
  else
    echo "$doc_name: its $(wc -w <<<"$flags") flags are all in a program's or launcher's --help"
  fi
done
exit $status
