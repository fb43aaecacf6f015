#!/usr/bin/env bash
# make-gpucr-bundle.sh: a relocatable copy of gpucr to carry to a machine with
# no Go toolchain and no package registry (the GPU machine).
#
# usage: scripts/make-gpucr-bundle.sh [OUTDIR]      (default .carry/gpucr)
#
#   OUTDIR/bin/gpucr          launcher: runs libexec/gpucr through the glibc
#                             loader in libexec/lib (gpucr is a cgo binary; this
#                             makes it independent of the target's glibc) and
#                             points GPUCR_INTERPOSER at lib/libgpucr.so
#   OUTDIR/libexec/gpucr      build/bin/gpucr
#   OUTDIR/libexec/lib/       the loader and the libraries gpucr links, taken
#                             from the CRIU prefix (Debian forky's glibc; see
#                             scripts/install-criu.sh) so one glibc serves both
#   OUTDIR/lib/libgpucr.so    the interposer, loaded into applications by their
#                             own loader and glibc; it finds libprotobuf-c.so.1
#                             next to it (RPATH $ORIGIN)
#   OUTDIR/lib/libprotobuf-c.so.1
#   OUTDIR/lib/served/libcuda.so.1  the served-mode library (gpucr run --served),
#                             with its own libprotobuf-c.so.1 beside it
#   OUTDIR/lib/criu/gpucr_plugin.so  the CRIU plugin (gpucr checkpoint finds it;
#                             for criu itself: --libdir or a config "libdir")
#   OUTDIR/bin/*              the test applications built against the simulated
#                             driver are NOT included (the GPU machine builds its
#                             own with `make gpu-apps`)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/.carry/gpucr}
prefix=${GPUCR_CRIU_PREFIX:-/opt/gpucr/criu}
cd "$root"
make -s build/bin/gpucr build/lib/libgpucr.so build/lib/criu/gpucr_plugin.so build/lib/served/libcuda.so.1 build/lib/served/libcudart.so.13 build/lib/served/libnvidia-ml.so.1 build/lib/served/libcublas.so.13 build/lib/served/libcublasLt.so.13 build/bin/gpucr-worker
[ -x "$prefix/lib/ld-linux-x86-64.so.2" ] || bash scripts/install-criu.sh
rm -rf "$out"
mkdir -p "$out/bin" "$out/libexec/lib" "$out/lib/criu" "$out/lib/served"
cp build/bin/gpucr "$out/libexec/gpucr"
# served mode's worker, which the helper runs from beside gpucr's file, through the same loader
cp build/bin/gpucr-worker "$out/libexec/gpucr-worker"
cp build/lib/libgpucr.so "$out/lib/"
cp build/lib/criu/gpucr_plugin.so "$out/lib/criu/"
cp -L "$(ldconfig -p | awk '/libprotobuf-c.so.1 .*x86-64/{print $NF; exit}')" "$out/lib/libprotobuf-c.so.1"
cp build/lib/served/libcuda.so.1 build/lib/served/libcudart.so.13 build/lib/served/libnvidia-ml.so.1 build/lib/served/libcublas.so.13 build/lib/served/libcublasLt.so.13 "$out/lib/served/"
cp "$out/lib/libprotobuf-c.so.1" "$out/lib/served/"
cp -L "$prefix/lib/ld-linux-x86-64.so.2" "$out/libexec/lib/"
# Every library the loader resolves for gpucr and its worker, from the prefix (protobuf-c from the system).
for b in build/bin/gpucr build/bin/gpucr-worker; do
	"$prefix/lib/ld-linux-x86-64.so.2" --library-path "$prefix/lib:$(dirname "$(ldconfig -p | awk '/libprotobuf-c.so.1 .*x86-64/{print $NF; exit}')")" --list "$b"
done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
	cp -L "$lib" "$out/libexec/lib/"
done
cat >"$out/bin/gpucr" <<'EOF'
#!/bin/sh
# gpucr launcher (scripts/make-gpucr-bundle.sh): the bundle's own glibc.
here=$(cd "$(dirname "$0")/.." && pwd)
: "${GPUCR_INTERPOSER:=$here/lib/libgpucr.so}"
: "${GPUCR_SERVED_LIB:=$here/lib/served/libcuda.so.1}"
export GPUCR_INTERPOSER GPUCR_SERVED_LIB
exec "$here/libexec/lib/ld-linux-x86-64.so.2" --library-path "$here/libexec/lib" "$here/libexec/gpucr" "$@"
EOF
chmod +x "$out/bin/gpucr"
"$out/bin/gpucr" version >/dev/null
echo "bundle in $out: $(du -sh "$out" | cut -f1)"
