#!/usr/bin/env bash
# The sources a GPU bundle was built from, so that a GPU machine's run checks them against the
# tree it runs in: a bundle packed before the tree's last change would test and time old
# binaries under new scripts and references (and a GPU session is short). `record` (pack.sh, on
# the build machine) writes BUNDLE/sources.sha256, a SHA-256 line for each file of the tree that
# git tracks or would track (the Markdown left out: a page edited after packing changes no
# result); `check` (unpack.sh, on the GPU machine, which has the tree's files without .git)
# names the files that differ or are missing and exits 1.
#
#   tests/gpu/sources.sh record gpu-bundle     # from the repository root
#   tests/gpu/sources.sh check gpu-bundle
set -euo pipefail
usage="usage: tests/gpu/sources.sh record|check BUNDLE_DIR"
(($# == 2)) || { echo "$usage" >&2; exit 2; }
what=$1; list=$2/sources.sha256
case $what in
  record)
    git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
      [[ -f $f && $f != *.md ]] && printf '%s\0' "$f"
    done | sort -zu | xargs -0 -r sha256sum >"$list"
    ;;
  check)
    [[ -f $list ]] || { echo "sources.sh: $list is missing: run tests/gpu/pack.sh again" >&2; exit 1; }
    differ=$(sha256sum --check --quiet "$list" 2>/dev/null | sed -nE 's/^(.*): FAILED.*$/\1/p') || true
    if [[ -n $differ ]]; then
      n=$(wc -l <<<"$differ")
      echo "sources.sh: the tree differs from the sources $2 was built from in $n file(s):" \
        "$(head -5 <<<"$differ" | paste -sd' ')$( ((n > 5)) && echo ' ...'); run tests/gpu/pack.sh again" >&2
      exit 1
    fi
    ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
