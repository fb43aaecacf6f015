#!/usr/bin/env bash
# Served mode's cuBLAS beyond the gemm family, on the GPU machine, against
# NVIDIA's cuBLAS (the nvidia-cublas wheel that python3 finds, or
# CUBLAS_LIB_DIR):
#
#   bash tests/gpu/served/blas-levels.sh GPUCR_PREFIX
#
# 1. prototypes: each function include/gpucr/cublas.h declares, declared
#    again after NVIDIA's cublas_v2.h and cublasLt.h (a type that differs is
#    a compile error that names the function), and the values of the enums
#    and the complex types' sizes that the level functions take, compared;
# 2. blaslevels on NVIDIA's cuBLAS itself: every level-1, 2 and 3 function
#    served mode forwards, and the copies, against the references it
#    computes (the checks checked);
# 3. blaslevels served (gpucr run --served): the same checks, forwarded to
#    the worker's cuBLAS, and the refusals of what it does not forward.
# Logs in build/gpu/blas-levels (and $OUT).
set -u
cd "$(dirname "$0")/../../.."
. tests/gpu/lib.sh
prefix_arg "usage: blas-levels.sh GPUCR_PREFIX" "$@"
fresh_logs build/gpu/blas-levels
SOCK=/run/gpucr/blas-levels.sock
HELPER=
trap 'kill $HELPER 2>/dev/null; [ -n "${OUT:-}" ] && tar -czf "$OUT/blas-levels-logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null' EXIT
note_host
dir=${CUBLAS_LIB_DIR:-$(python3 -c 'import glob, os, nvidia; print(os.path.dirname(sorted(glob.glob(os.path.join(nvidia.__path__[0], "*", "lib", "libcublas.so.*")))[-1]))' 2>/dev/null)}
if [ -z "$dir" ] || [ ! -e "$dir/libcublas.so.13" ]; then
	bad "no NVIDIA cuBLAS found (set CUBLAS_LIB_DIR)"
	exit 1
fi
note "## NVIDIA's cuBLAS: $dir ($(basename "$(readlink -f "$dir/libcublas.so.13")"))"

# ---- 1 ----
python3 - "$dir/../include" "$LOGS" >"$LOGS/prototypes.txt" 2>&1 <<'PYEOF'
import os, re, subprocess, sys
inc, logs = sys.argv[1], sys.argv[2]
text = re.sub(r"/\*.*?\*/", "", open("include/gpucr/cublas.h").read(), flags=re.S)
protos = re.findall(r"^((?:const char \*|cublasStatus_t|size_t) ?(cublas\w+)\([^;]*\);)", text, flags=re.M)
consts = ["CUBLAS_FILL_MODE_LOWER", "CUBLAS_FILL_MODE_UPPER", "CUBLAS_FILL_MODE_FULL", "CUBLAS_DIAG_NON_UNIT",
          "CUBLAS_DIAG_UNIT", "CUBLAS_SIDE_LEFT", "CUBLAS_SIDE_RIGHT", "sizeof(cuComplex)", "_Alignof(cuComplex)",
          "sizeof(cuDoubleComplex)", "_Alignof(cuDoubleComplex)", "sizeof(cublasFillMode_t)"]
flags = ["-I" + inc, "-I/usr/local/cuda/include"]
def build(name, src, extra):
    c = os.path.join(logs, name + ".c")
    open(c, "w").write(src)
    return subprocess.run(["cc", "-std=gnu11", *flags, *extra, "-o", os.path.join(logs, name), c],
                          capture_output=True, text=True)
src = "#include <cublas_v2.h>\n#include <cublasLt.h>\n" + "\n".join(p for p, _ in protos) + "\nint main(void) { return 0; }\n"
r = build("redeclared", src, [])
bad = sorted(set(re.findall(r"conflicting types for .(cublas\w+)", r.stderr)))
for name in bad:
    print(f"PROTO FAIL {name}: its type differs from NVIDIA's")
if r.returncode != 0 and not bad:
    print("PROTO FAIL: the redeclarations do not compile:\n" + r.stderr[-2000:])
values = {}
for side, hdr in (("nvidia", "#include <cublas_v2.h>"), ("gpucr", '#include "gpucr/cublas.h"')):
    body = "".join(f'    printf("%s %lld\\n", "{c}", (long long)({c}));\n' for c in consts)
    r = build("values-" + side, f"#include <stdio.h>\n{hdr}\nint main(void) {{\n{body}    return 0;\n}}\n",
              ["-Iinclude"])
    if r.returncode != 0:
        print(f"PROTO FAIL: the values with {side}'s header do not compile:\n" + r.stderr[-2000:])
        continue
    out = subprocess.run([os.path.join(logs, "values-" + side)], capture_output=True, text=True).stdout
    values[side] = dict(line.split(" ", 1) for line in out.splitlines())
if len(values) == 2:
    for c in consts:
        if values["nvidia"].get(c) != values["gpucr"].get(c):
            print(f"PROTO FAIL {c}: NVIDIA's {values['nvidia'].get(c)}, gpucr's {values['gpucr'].get(c)}")
print(f"prototypes: {len(protos)} functions redeclared, {len(bad)} differ; {len(consts)} values compared")
PYEOF
grep 'PROTO FAIL' "$LOGS/prototypes.txt" | while read -r line; do bad "$line"; done
grep -q 'PROTO FAIL' "$LOGS/prototypes.txt" && fail=1
note "$(tail -1 "$LOGS/prototypes.txt")"

# ---- 2, 3 ----
bin=build/gpu/bin
mkdir -p "$bin"
if ! cc -O2 -D_GNU_SOURCE -Iinclude -o "$bin/blaslevels" tests/apps/served/blaslevels.c \
	-L/usr/local/cuda/lib64/stubs -lcuda -ldl >"$LOGS/build.txt" 2>&1; then
	bad "building blaslevels: $(tail -3 "$LOGS/build.txt" | tr '\n' ' ')"
	exit 1
fi
# levels: every forwarded function (both precisions, both pointer modes); copies: the host-device copies
timeout 300 "$bin/blaslevels" --lib "$dir/libcublas.so.13" levels copies >"$LOGS/plain.txt" 2>&1 ||
	bad "blaslevels on NVIDIA's cuBLAS: $(grep -m3 FAIL "$LOGS/plain.txt" | tr '\n' ' ')$(tail -1 "$LOGS/plain.txt")"
note "blaslevels on NVIDIA's cuBLAS: $(tail -1 "$LOGS/plain.txt") (ok, failed)"
start_helper "$GPUCR" "$SOCK" "$LOGS/helper.log" --log-level info --served-pool 1 || { bad "the helper did not answer"; exit 1; }
GPUCR_CUBLAS_PATH=$dir/libcublas.so.13 timeout 300 "$GPUCR" run --served --socket "$SOCK" -- \
	"$bin/blaslevels" levels copies refused >"$LOGS/served.txt" 2>&1 ||
	bad "blaslevels served: $(grep -m3 FAIL "$LOGS/served.txt" | tr '\n' ' ')$(tail -1 "$LOGS/served.txt")"
note "blaslevels served: $(tail -1 "$LOGS/served.txt") (ok, failed)"
n=$(grep -c "is not forwarded to the worker yet" "$LOGS/served.txt")
[ "$n" = 3 ] || bad "served: $n refusal lines, want 3 (each refused function once)"
exit "${fail:-0}"
