#!/usr/bin/env bash
# tests/gpu/sources.sh in a git repository of its own: the check passes on the tree the record
# was made from, and fails naming each file changed, removed or (tracked or not) edited since;
# Markdown and ignored files do not count. Exit 0: all held.
set -uo pipefail
sources=$(cd "$(dirname "$0")" && pwd)/sources.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp" && mkdir -p repo/core bundle && cd repo || exit 1
git init -q . && git config user.email t@t && git config user.name t
printf 'int a;\n' >core/a.cc; printf 'x\n' >run.sh; printf '# doc\n' >README.md; printf '*.o\n' >.gitignore
git add -A && git commit -qm first
printf 'new, not yet added\n' >untracked.py; printf 'built\n' >core/a.o
fails=0
expect() {  # expect STATUS WORDS...: the check's exit status, and words its message must hold
  local want=$1 out rc; shift
  out=$("$sources" check ../bundle 2>&1); rc=$?
  if ((rc != want)); then echo "FAIL: exit $rc, expected $want: $out"; fails=1; fi
  for w in "$@"; do [[ $out == *"$w"* ]] || { echo "FAIL: '$w' not in: $out"; fails=1; }; done
}
"$sources" record ../bundle || { echo "FAIL: record"; exit 1; }
grep -q ' untracked.py$' ../bundle/sources.sha256 || { echo "FAIL: an untracked file git would track is not recorded"; fails=1; }
grep -qE ' (README.md|core/a.o)$' ../bundle/sources.sha256 && { echo "FAIL: Markdown or an ignored file recorded"; fails=1; }
expect 0
printf 'changed\n' >>README.md; printf 'changed\n' >core/a.o
expect 0  # a page, a build output
printf 'int b;\n' >>core/a.cc
expect 1 "core/a.cc" "run tests/gpu/pack.sh again"
git checkout -q core/a.cc && rm run.sh
expect 1 "run.sh"
git checkout -q run.sh && printf 'edited\n' >untracked.py
expect 1 "untracked.py"
printf 'new, not yet added\n' >untracked.py
expect 0
rm ../bundle/sources.sha256
expect 1 "sources.sha256 is missing"
((fails == 0)) && echo "sources.sh: every check held"
exit $fails
