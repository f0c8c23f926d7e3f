#!/bin/bash
# Every shell script of the tree (launchers, setup, CI, test and benchmark helpers) must pass
# the linter shellcheck: every expansion quoted where a path may hold spaces, commas, quotes or $.
#   tests/tools/check_shell.sh SOURCE_DIR
set -euo pipefail
cd "${1:?usage: check_shell.sh SOURCE_DIR}"
command -v shellcheck >/dev/null || { echo "check_shell.sh: shellcheck is not installed (./setup.sh installs it)" >&2; exit 1; }
scripts=(setup.sh .ci/run)
while IFS= read -r -d '' f; do scripts+=("$f"); done < <(find launchers tests bench -type f \( -name '*.sh' -o -name '*.sbatch' \) -print0 | sort -z)
shellcheck --external-sources "${scripts[@]}"
echo "shellcheck: ${#scripts[@]} scripts clean"
