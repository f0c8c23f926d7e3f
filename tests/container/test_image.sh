#!/usr/bin/env bash
# Builds megabatch's container image (launchers/container/Dockerfile) for real, without a GPU
# and without a container daemon: a Debian 12 base made here (mmdebstrap --variant=minbase
# bookworm, imported into podman), CUDA off, `podman build --isolation=chroot`. The Dockerfile's
# `test` stage runs inside the image: train --help, --list-optimizers, preprocess brown and six
# iterations of a tiny GPT; this script checks what they printed, then builds the runtime image
# and reports its size and the build times.
#
#   tests/container/test_image.sh [--keep]     (ctest -L container; setup.sh installs podman and mmdebstrap)
# The base's tarball is cached in $MEGABATCH_CONTAINER_CACHE (default ~/.cache/megabatch/container).
# --keep keeps the images (localhost/megabatch:cpu, ...) in podman's storage afterwards.
# Exit status: 0 passed, 1 failed, 77 skipped (podman or mmdebstrap missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
keep=0
[[ ${1:-} == --keep ]] && keep=1
for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "test_image: SKIP: $tool is not installed (./setup.sh installs it)"; exit 77; }
done
cache=${MEGABATCH_CONTAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/megabatch/container}
mkdir -p "$cache"
log=$(mktemp -d "${TMPDIR:-/tmp}/megabatch-image.XXXXXX")
pm=(podman --storage-driver vfs)
base=localhost/megabatch-test-base:bookworm
fail() { echo "test_image: FAIL: $*" >&2; exit 1; }
now() { date +%s; }

t0=$(now)
if [[ ! -f $cache/bookworm-minbase.tar ]]; then  # (mmdebstrap picks the format by the name: say it)
  rm -rf "$cache/bookworm-minbase.tmp.tar"
  mmdebstrap --variant=minbase --format=tar bookworm "$cache/bookworm-minbase.tmp.tar" > "$log/mmdebstrap.log" 2>&1 ||
    fail "mmdebstrap failed: $log/mmdebstrap.log"
  mv "$cache/bookworm-minbase.tmp.tar" "$cache/bookworm-minbase.tar"
fi
"${pm[@]}" image exists "$base" || "${pm[@]}" import "$cache/bookworm-minbase.tar" "$base" > "$log/import.log" 2>&1 ||
  fail "podman import failed: $log/import.log"
t_base=$(( $(now) - t0 ))

# this machine's CA bundle for the build's npm downloads (a TLS-inspecting proxy's CA is in it
# where there is one), mounted for the build only
ca=(--volume /etc/ssl/certs/ca-certificates.crt:/run/build-ca.crt:ro --build-arg NODE_EXTRA_CA_CERTS=/run/build-ca.crt)
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || ca=()
build() {  # build TARGET TAG: the Dockerfile's stage, CPU only, on the Debian 12 base
  "${pm[@]}" build --isolation=chroot -f "$root/launchers/container/Dockerfile" "${ca[@]}" \
    --build-arg BASE_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" --build-arg CUDA=OFF \
    --build-arg JOBS="$(nproc)" --target "$1" -t "$2" "$root"
}
t0=$(now)
build test localhost/megabatch-test:test > "$log/test-stage.log" 2>&1 || { tail -40 "$log/test-stage.log" >&2; fail "the test stage failed: $log/test-stage.log"; }
t_test=$(( $(now) - t0 ))
out=$log/test-stage.log
grep -q "usage: train" "$out" || fail "train --help printed no usage line ($out)"
for plugin in sgd adamw lamb lars lamb_noise lamb_embscale; do
  grep -Eq "^$plugin " "$out" || fail "train --list-optimizers does not list $plugin ($out)"
done
grep -q "BROKEN" "$out" && fail "a plugin does not load in the image ($out)"
grep -q "default dataset ready" "$out" || fail "preprocess brown did not make the dataset ($out)"
grep -q "> done: iteration 6" "$out" || fail "the tiny GPT did not train to iteration 6 ($out)"
losses=$(grep -o "metrics.h5 lm_loss: .*" "$out") || fail "no metrics.h5 losses ($out)"
t0=$(now)
build runtime localhost/megabatch:cpu > "$log/runtime.log" 2>&1 || fail "the runtime image failed: $log/runtime.log"
t_runtime=$(( $(now) - t0 ))
size=$("${pm[@]}" image inspect --format '{{.Size}}' localhost/megabatch:cpu)
base_size=$("${pm[@]}" image inspect --format '{{.Size}}' "$base")
builder=$("${pm[@]}" images --format '{{.ID}}' --filter label=none 2>/dev/null | head -1 || true)
echo "test_image: PASS"
echo "  in the image: train --help, --list-optimizers (6 plugins), preprocess brown, a tiny GPT to iteration 6"
echo "  $losses"
echo "  base (Debian 12 minbase, made and imported): ${t_base} s, $((base_size / 1000000)) MB"
echo "  build and test stages (CPU only, $(nproc) jobs): ${t_test} s; the runtime image after them: ${t_runtime} s"
echo "  localhost/megabatch:cpu: $((size / 1000000)) MB (${builder:+builder layers kept; }logs in $log)"
if ((!keep)); then
  "${pm[@]}" rmi -f localhost/megabatch-test:test localhost/megabatch:cpu > /dev/null 2>&1 || true
  "${pm[@]}" image prune -f > /dev/null 2>&1 || true
fi
