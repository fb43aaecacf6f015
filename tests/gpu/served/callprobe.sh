#!/usr/bin/env bash
# What a served mode would have to answer and what it would take out of the
# process, measured on the GPU machine with a plain PyTorch job (no gpucr):
#
#   bash tests/gpu/served/callprobe.sh [ANCHOR_DIR]
#
# 1. callprobe.so (LD_PRELOAD) under probe_app.py (PyTorch, cuBLAS, cuDNN, a
#    CUDA graph; COMPILE=1 adds torch.compile): for each library that asks,
#    the driver entry points it resolves and the export tables it fetches
#    (cuGetExportTable: the driver's undocumented tables that cudart reads
#    directly). A served mode must answer all of them from another process.
# 2. libprobe.so (LD_AUDIT) under probe_app.py: the functions of cudart,
#    cuBLAS, cuDNN and the other CUDA libraries it binds, and the calls
#    counted.
#    Then the workload matrix's programs (WORKLOADS, default
#    "train_dataloader kv_cache cuda_graph jax cupy", WL_STEPS steps) under
#    both probes: what each calls.
# 3. probe_app.py held: its memory by kind (smaps_by_kind.py: Rss/private
#    dirty MiB) as it runs, then after NVIDIA's checkpoint (drvckpt from
#    ANCHOR_DIR, default ../shared/device/anchor: lock + checkpoint) parks
#    the driver's state in it, then after the driver's restore. The private
#    dirty pages are what CRIU copies; the difference is what a process
#    with no driver state would not carry.
# Logs in build/gpu/served (and $OUT).
set -u
cd "$(dirname "$0")/../../.."
. tests/gpu/lib.sh # NVLink multicast off
ANCHOR=${1:-../shared/device/anchor}
L=build/gpu/served
mkdir -p "$L"
S=$L/callprobe.txt
: >"$S"
PY=${PYTHON:-python3}
note() { printf '%s\n' "$*" | tee -a "$S"; }
APP=$PWD/tests/gpu/served/probe_app.py
HELD=
finish() {
	[ -n "$HELD" ] && kill -9 "$HELD" 2>/dev/null
	[ -n "${OUT:-}" ] && cp "$L"/*.txt "$L"/*.tsv "$OUT"/ 2>/dev/null
}
trap finish EXIT
# merge_reports TABLE HEADER: every process's report (TABLE.PID: a probe
# writes one per process) into TABLE, under HEADER once; reports TABLE: how
# many there were.
merge_reports() {
	printf '%s\n' "$2" >"$1"
	cat "$1".[0-9]* 2>/dev/null | grep -v '^#' >>"$1"
}
reports() { find "$(dirname "$1")" -maxdepth 1 -name "$(basename "$1").[0-9]*" | wc -l; }

note "host: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $($PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)')"
gcc -O2 -Wall -Wextra -fPIC -shared -Iinclude -Itests/gpu/served -o "$L/callprobe.so" tests/gpu/served/callprobe.c -ldl -pthread || exit 1

for compile in 0 1; do
	out=$L/calls-compile$compile.tsv
	rm -f "$out" "$out".[0-9]*
	if ! COMPILE=$compile LD_PRELOAD=$PWD/$L/callprobe.so CALLPROBE_OUT=$PWD/$out timeout 300 $PY "$APP" >"$L/app-compile$compile.log" 2>&1; then
		note "FAIL: probe_app (COMPILE=$compile): $(tail -2 "$L/app-compile$compile.log")"
		continue
	fi
	merge_reports "$out" "# caller	what	count	first_word"
	note ""
	note "== COMPILE=$compile: $(tail -1 "$L/app-compile$compile.log"); $(reports "$out") processes reported"
	note "$(grep '^startup:' "$L/app-compile$compile.log")"
	note "caller: distinct driver entry points, export tables"
	awk -F'\t' 'NR>1 && $1 != "(calls)" { if ($2 ~ /^export:/) e[$1]++; else s[$1]++; c[$1]=1 }
		END { for (k in c) printf "  %s: %d entry points, %d export tables\n", k, s[k], e[k] }' "$out" | sort | tee -a "$S"
	note "export tables (caller, uuid, fetches, first word):"
	awk -F'\t' 'NR>1 && $2 ~ /^export:/ { printf "  %s %s %s %s\n", $1, substr($2, 8), $3, $4 }' "$out" | sort | tee -a "$S"
	note "distinct entry points in all: $(awk -F'\t' 'NR>1 && $1 != "(calls)" && $2 !~ /^export:/ {print $2}' "$out" | sort -u | wc -l)"
	# The calls through each entry point (every process's, summed).
	awk -F'\t' '$1 == "(calls)" { n[$2] += $3 } END { for (k in n) print k, n[k] }' "$out" | sort -k2 -n -r >"$out.calls"
	# Names that start with "cu" through dlsym include cuDNN's and cuBLASLt's
	# own (they load their parts that way): the driver's are the cu[A-Z] ones.
	note "entry points called: $(awk '$2 > 0' "$out.calls" | wc -l) of $(wc -l <"$out.calls") handed out ($(awk '$2 > 0 && $1 ~ /^cu[A-Z]/' "$out.calls" | wc -l) of them the driver's); the most called:"
	awk '$2 > 0' "$out.calls" | head -30 | sed 's/^/    /' | tee -a "$S"
done

# 2. The CUDA libraries' functions PyTorch binds and calls (libprobe.so by
# LD_AUDIT): the surface a served mode answers if it forwards calls at those
# libraries' boundary instead of the driver's.
gcc -O2 -Wall -Wextra -fPIC -shared -Itests/gpu/served -o "$L/libprobe.so" tests/gpu/served/libprobe.c || exit 1
for compile in 0 1; do
	out=$L/libcalls-compile$compile.tsv
	rm -f "$out" "$out".[0-9]*
	if ! COMPILE=$compile LD_AUDIT=$PWD/$L/libprobe.so LIBPROBE_OUT=$PWD/$out timeout 300 $PY "$APP" >"$L/libapp-compile$compile.log" 2>&1; then
		note "FAIL: probe_app under libprobe (COMPILE=$compile): $(tail -2 "$L/libapp-compile$compile.log")"
		continue
	fi
	merge_reports "$out" "# library	function	calls	callers"
	note ""
	note "== library boundary, COMPILE=$compile ($(reports "$out") processes): library: functions bound, called, calls"
	# Summed over the processes (one row per function each).
	awk -F'\t' 'NR>1 && $1 != "(fatbins)" { f[$1 "\t" $2] += $3 }
		END { for (k in f) { split(k, p, "\t"); b[p[1]]++; if (f[k] > 0) { c[p[1]]++; n[p[1]] += f[k] } }
			for (l in b) printf "  %s: %d bound, %d called, %d calls\n", l, b[l], c[l], n[l] }' "$out" | sort | tee -a "$S"
	note "  fat binaries registered: $(awk -F'\t' '$1 == "(fatbins)" && $2 == "registered" { n += $3 } END { print n + 0 }' "$out"), $(awk -F'\t' '$1 == "(fatbins)" && $2 == "bytes" { n += $3 } END { printf "%.1f MiB", n / 1048576 }' "$out") (all processes)"
	note "  most called:"
	awk -F'\t' 'NR>1 && $1 != "(fatbins)" && $3 > 0 { n[$1 " " $2] += $3 } END { for (k in n) printf "    %s %d\n", k, n[k] }' "$out" |
		sort -k3 -n -r | head -25 | tee -a "$S"
done

# 2b. The matrix's workloads (WORKLOADS, WL_STEPS steps each) under both
# probes at once: what other jobs call beyond probe_app's.
for w in ${WORKLOADS:-train_dataloader kv_cache cuda_graph jax cupy}; do
	o=$L/wl-$w
	rm -f "$o".*
	if ! CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONHASHSEED=0 LD_PRELOAD=$PWD/$L/callprobe.so CALLPROBE_OUT=$PWD/$o.drv \
		LD_AUDIT=$PWD/$L/libprobe.so LIBPROBE_OUT=$PWD/$o.lib timeout 300 $PY tests/gpu/matrix_workloads.py "$w" "$o.log" \
		"${WL_STEPS:-50}" >"$o.out" 2>&1; then
		note "FAIL: workload $w under the probes: $(tail -2 "$o.out")"
		continue
	fi
	merge_reports "$o.drv" "# caller	what	count	first_word"
	merge_reports "$o.lib" "# library	function	calls	callers"
	awk -F'\t' '$1 == "(calls)" && $3 > 0 && $2 ~ /^cu[A-Z]/ { print $2 }' "$o.drv" | sort -u >"$o.driver-called"
	awk -F'\t' 'NR>1 && $1 != "(fatbins)" && $3 > 0 { print $1 "\t" $2 }' "$o.lib" | sort -u >"$o.lib-called"
	note "  $w ($(grep -c '^step' "$o.log") steps): $(wc -l <"$o.driver-called") driver entry points called;" \
		"library functions called: $(cut -f1 "$o.lib-called" | sed 's/\.so.*//' | sort | uniq -c | awk '{printf "%s %s, ", $2, $1}')" \
		"export tables fetched: $(awk -F'\t' '$2 ~ /^export:/ { print $2 }' "$o.drv" | sort -u | wc -l);" \
		"fat binaries: $(awk -F'\t' '$1 == "(fatbins)" && $2 == "bytes" { n += $3 } END { printf "%.0f MiB", n / 1048576 }' "$o.lib")"
done
cat "$L"/wl-*.driver-called 2>/dev/null | sort -u >"$L/all-driver-called.txt"
cat "$L"/wl-*.lib-called 2>/dev/null | sort -u >"$L/all-lib-called.txt"
note "  all workloads together: $(wc -l <"$L/all-driver-called.txt") driver entry points and $(wc -l <"$L/all-lib-called.txt") library functions called (all-*-called.txt)"

note ""
note "== memory of the held process (kind=Rss/private dirty MiB)"
cc -O2 -I/usr/local/cuda/include -o "$L/drvckpt" "$ANCHOR/drvckpt.c" -L/usr/local/cuda/lib64/stubs -lcuda || {
	note "FAIL: building drvckpt"
	exit 1
}
R=$L/ready.txt
rm -f "$R"
setsid $PY "$APP" "$R" </dev/null >"$L/held.log" 2>&1 &
for _ in $(seq 1200); do grep -q '^ready' "$R" 2>/dev/null && break; sleep 0.1; done
HELD=$(sed -n 's/^ready pid=\([0-9]*\).*/\1/p' "$R" | head -1)
[ -n "$HELD" ] || {
	note "FAIL: the held app did not start: $(tail -2 "$L/held.log")"
	exit 1
}
note "start-up without a probe: $(grep '^startup:' "$L/held.log")"
note "running:            $($PY tests/gpu/served/smaps_by_kind.py "$HELD")"
timeout 60 "$L/drvckpt" lock checkpoint "$HELD" >>"$L/drvckpt.log" 2>&1 || note "FAIL: driver checkpoint: $(tail -1 "$L/drvckpt.log")"
note "driver checkpointed: $($PY tests/gpu/served/smaps_by_kind.py "$HELD")"
note "  ($(grep -h 'drvckpt checkpoint' "$L/drvckpt.log" | tail -1))"
timeout 60 "$L/drvckpt" restore unlock "$HELD" >>"$L/drvckpt.log" 2>&1 || note "FAIL: driver restore: $(tail -1 "$L/drvckpt.log")"
note "driver restored:    $($PY tests/gpu/served/smaps_by_kind.py "$HELD")"
