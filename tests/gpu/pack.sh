#!/usr/bin/env bash
# Builds what the GPU checks need (CUDA on, portable CPU code, sm_90 only unless
# CUDA_ARCHS says otherwise) in build-gpu/ and packs it with ../shared/gpu-bundle.sh into
# gpu-bundle/ (git-ignored), with the test assets, the test plugins and the PyTorch
# reference, for a GPU machine that has the driver, CUDA and PyTorch but no Debian -dev
# libraries, with this machine's Open MPI (tests/gpu/pack-openmpi.sh). There, tests/gpu/run.sh
# runs the `gpu` label and the GPU benchmark.
#
#   tests/gpu/pack.sh                         # then, on the GPU machine: tests/gpu/run.sh LOG_DIR
#   CUDA_ARCHS=80 BUNDLER=/path/gpu-bundle.sh tests/gpu/pack.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bundler=${BUNDLER:-../shared/gpu-bundle.sh}
[[ -x $bundler ]] || { echo "pack.sh: no bundler at $bundler (set BUNDLER)" >&2; exit 1; }
assets=${MEGABATCH_ASSETS:-${XDG_CACHE_HOME:-$HOME/.cache}/megabatch}
[[ -d $assets/brown && -d $assets/gpt2 ]] || { echo "pack.sh: assets missing in $assets: run ./setup.sh" >&2; exit 1; }

# The sources as the build reads them (a file changed during the build makes the bundle stale):
# what the GPU machine's tree must match (unpack.sh checks it)
sources=$(mktemp -d); trap 'rm -rf "$sources"' EXIT
tests/gpu/sources.sh record "$sources"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGABATCH_CUDA=ON -DMEGABATCH_NATIVE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" -DMEGABATCH_WERROR=ON >/dev/null
cmake --build build-gpu --target train sweep preprocess megabatch_plugins test_ops_gpu test_gpu gpu_train_bench train_bench \
  cross_entropy_bench attention_bench optim_bench test_plugin_adafactor test_plugin_throwing
# The op tests once more, built for sm_75 (T4) alone: on a newer GPU the driver compiles that
# code from its PTX, so the T4 path of the flash kernels runs there too (tests/gpu/run.sh).
cmake -S . -B build-gpu-sm75 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGABATCH_CUDA=ON -DMEGABATCH_NATIVE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=75 -DMEGABATCH_WERROR=ON >/dev/null
cmake --build build-gpu-sm75 --target test_ops_gpu
# Only what the GPU run uses travels.
keep='^(train|sweep|preprocess|test_ops_gpu|test_gpu|gpu_train_bench|train_bench|cross_entropy_bench|attention_bench|optim_bench)$'
stage=$(mktemp -d); trap 'rm -rf "$stage" "$sources"' EXIT
mkdir -p "$stage/bin" "$stage/assets"
for f in build-gpu/bin/*; do [[ $(basename "$f") =~ $keep ]] && cp -a "$f" "$stage/bin/"; done
cp -a build-gpu-sm75/bin/test_ops_gpu "$stage/bin/test_ops_gpu_sm75"
mkdir -p "$stage/lib/megabatch" && cp -a build-gpu/lib/megabatch/plugins "$stage/lib/megabatch/"
cp -a "$assets"/{brown,gpt2,bert} "$stage/assets/"
rm -rf gpu-bundle && mkdir -p gpu-bundle
"$bundler" "$stage" gpu-bundle "$stage/assets" build-gpu/tests/plugins
tests/gpu/pack-openmpi.sh gpu-bundle   # mpirun for the multi-rank gpu tests, where the GPU machine has none
git rev-parse HEAD > gpu-bundle/commit
mv "$sources/sources.sha256" gpu-bundle/
echo "pack.sh: gpu-bundle/ holds commit $(cut -c1-12 gpu-bundle/commit)$(git diff --quiet HEAD || echo ' (plus uncommitted changes)')"
