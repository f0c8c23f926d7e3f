#!/usr/bin/env bash
# Packs this machine's Open MPI runtime (Debian's openmpi-bin, libopenmpi3, libpmix2 and the
# libraries their programs and components load, less the C runtime) into OUT/openmpi.tar.xz,
# relocatable: a GPU machine without Open MPI unpacks it anywhere and sources its env.sh,
# which points OPAL_PREFIX and PMIX_INSTALL_PREFIX at the unpacked tree (Debian builds both
# with prefix-relative paths) and puts its mpirun first on PATH. tests/gpu/run.sh does so
# when the machine has no mpirun of its own.
#
#   tests/gpu/pack-openmpi.sh OUT
set -euo pipefail
out=${1:?usage: pack-openmpi.sh OUT}; mkdir -p "$out"; out=$(cd "$out" && pwd)
command -v orterun >/dev/null || { echo "pack-openmpi.sh: no Open MPI here (apt-get install openmpi-bin)" >&2; exit 1; }
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
p=$stage/usr; arch=x86_64-linux-gnu
mkdir -p "$p/bin" "$p/lib/$arch" "$p/share" "$p/deps"
cp -a /usr/bin/orterun "$p/bin/mpirun"; cp -a /usr/bin/orted "$p/bin/"
cp -a /usr/lib/$arch/openmpi "$p/lib/$arch/"
rm -rf "$p/lib/$arch/openmpi/include" "$p/lib/$arch/openmpi/lib/"*java* "$p/lib/$arch/openmpi/lib/pkgconfig"
cp -a /usr/lib/$arch/pmix2 "$p/lib/$arch/"
rm -rf "$p/lib/$arch/pmix2/include"
cp -a /usr/share/openmpi "$p/share/"
provided='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libutil|libresolv|libstdc\+\+|libgcc_s|libcuda|libcudart|libnvidia)[.-]'
while IFS= read -r f; do
  file -L "$f" | grep -q ELF || continue
  while read -r name arrow path _; do
    [[ $arrow == "=>" && $path != not ]] || continue
    base=$(basename "$name"); [[ $base =~ $provided ]] && continue
    [[ $path == /usr/lib/$arch/openmpi/* || $path == /usr/lib/$arch/pmix2/* ]] && continue  # in the tree already
    [[ -e $p/deps/$base ]] || cp -L "$path" "$p/deps/$base"
  done < <(ldd "$f" 2>/dev/null)
done < <(find "$p/bin" "$p/lib" -type f \( -name '*.so*' -o -perm -u+x \))
cat > "$stage/env.sh" <<'ENV'
# source this: the packed Open MPI first on PATH, relocated to where it was unpacked
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=$here/usr PMIX_INSTALL_PREFIX=$here/usr/lib/x86_64-linux-gnu/pmix2
export PATH=$here/usr/bin:$PATH
export LD_LIBRARY_PATH=$here/usr/lib/x86_64-linux-gnu/openmpi/lib:$here/usr/lib/x86_64-linux-gnu/pmix2/lib:$here/usr/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MEGABATCH_MPIRUN=$here/usr/bin/mpirun
ENV
tar -C "$stage" -cJf "$out/openmpi.tar.xz" .
echo "pack-openmpi.sh: $out/openmpi.tar.xz ($(du -m "$out/openmpi.tar.xz" | cut -f1) MiB, $(find "$p/deps" -mindepth 1 -maxdepth 1 | wc -l) libraries beside Open MPI's own)"
