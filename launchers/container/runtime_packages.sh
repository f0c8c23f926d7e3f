#!/usr/bin/env bash
# The Debian/Ubuntu packages whose shared libraries the installed megabatch tree loads: its
# programs and plugins (ELF files under PREFIX), each library `ldd` resolves mapped to its
# package by `dpkg -S`; libraries of the CUDA toolkit in /usr/local/cuda come with the CUDA
# runtime image and are left out. One name per line, sorted. The container's runtime stage installs
# these (launchers/container/Dockerfile), so it needs no list that drifts from the build.
#
#   launchers/container/runtime_packages.sh PREFIX
# Exit status: 2 when a library is missing or belongs to no package (it could not be
# installed in the runtime stage).
set -euo pipefail
prefix=${1:?usage: runtime_packages.sh PREFIX (the installed tree)}
[[ -d $prefix ]] || { echo "runtime_packages.sh: $prefix: no such directory" >&2; exit 2; }
declare -A libs=()
while IFS= read -r -d '' f; do
  head -c 4 "$f" 2>/dev/null | grep -q $'\x7fELF' || continue
  while read -r line; do
    [[ $line == *"not found"* ]] && { echo "runtime_packages.sh: $f: ${line%% =>*} not found" >&2; exit 2; }
    [[ $line =~ =\>\ (/[^ ]+) ]] && libs[${BASH_REMATCH[1]}]=1
  done < <(ldd "$f" 2>/dev/null || true)
done < <(find "$prefix" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
declare -A packages=()
for lib in "${!libs[@]}"; do
  real=$(readlink -f "$lib")
  # the CUDA toolkit's (cuBLASLt, the CUDA runtime, NCCL there): the runtime base image's own
  [[ $real == /usr/local/cuda* ]] && continue
  pkg=""
  # usrmerge: a library found through /lib is packaged as /usr/lib, or the other way round
  for candidate in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
    [[ -n $candidate ]] || continue
    if out=$(dpkg -S "$candidate" 2>/dev/null); then pkg=${out%%: *}; break; fi
  done
  [[ -n $pkg ]] || { echo "runtime_packages.sh: $lib belongs to no package" >&2; exit 2; }
  for p in ${pkg//,/ }; do packages[$p]=1; done
done
printf '%s\n' "${!packages[@]}" | sort
