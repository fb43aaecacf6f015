#!/usr/bin/env bash
# Images on an object store, measured on this machine against the test
# object store over loopback (scripts/s3-server.sh, SeaweedFS):
#
#   sudo scripts/bench-level.sh [MIB] [STILL_MIB]
#
# A heartbeat under `gpucr run` holds MIB (default 64) of device memory that
# changes every iteration and STILL_MIB (default 2048) written once (a job's
# weights beside its state); on the simulated driver where no GPU is here.
# It prints, in one table:
#   1. the drain rate: `gpucr image push` of its checkpoint against one tar
#      stream of the same directory into one PUT to the same store (the
#      transport of `gpucr migrate`, one stream of the whole image), two
#      rounds in alternating order, each round into a bucket of its own (a
#      bucket holds each file once, so a second push of the same image
#      moves nothing);
#   2. a second checkpoint of the job, its still memory unchanged, pushed
#      after the first: the share of its bytes that crossed;
#   3. a final checkpoint on a preemption notice (`checkpoint --drain URL
#      --wait --deadline 60s`): from the command's start to the image safe in
#      the store, the checkpoint's part and the push's.
# The store: $GPUCR_TEST_S3_ENDPOINT with scripts/s3-server.sh's users, or one
# started here. Work files in /dev/shm (removed at the end).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
MIB=${1:-64}
STILL=${2:-2048}
[ "$(id -u)" = 0 ] || { echo "bench-level.sh: CRIU needs root" >&2; exit 2; }
export PATH=$root/build/bin:/opt/gpucr/criu/bin:$PATH
command -v nvidia-smi >/dev/null 2>&1 || export LD_LIBRARY_PATH=$root/build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -x build/bin/gpucr ] && [ -x build/bin/heartbeat ] || { echo "bench-level.sh: make all first" >&2; exit 2; }
work=$(mktemp -d /dev/shm/gpucr-bench-level.XXXXXX)
HELPER= APP= WEED=
cleanup() {
	[ -n "$APP" ] && kill -9 "$APP" 2>/dev/null
	[ -n "$HELPER" ] && kill "$HELPER" 2>/dev/null
	[ -n "$WEED" ] && kill "$WEED" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
ep=${GPUCR_TEST_S3_ENDPOINT:-}
if [ -z "$ep" ]; then
	ep=$(bash scripts/s3-server.sh "$work/s3")
	WEED=$(cat "$work/s3/weed.pid")
fi
declare -A key=([gpucr-a]=AKIAGPUCRTESTA0000000 [gpucr-b]=AKIAGPUCRTESTB0000000)
declare -A secret=([gpucr-a]=gpucr-test-secret-a-000000000000000000000 [gpucr-b]=gpucr-test-secret-b-000000000000000000000)
as() { # as USER CMD...: CMD with USER's credentials for the store
	local u=$1
	shift
	AWS_ENDPOINT_URL=$ep AWS_ACCESS_KEY_ID=${key[$u]} AWS_SECRET_ACCESS_KEY=${secret[$u]} AWS_REGION=us-east-1 "$@"
}
s3curl() { # s3curl USER ARGS...: curl signed as USER
	local u=$1
	shift
	curl -sf --aws-sigv4 aws:amz:us-east-1:s3 --user "${key[$u]}:${secret[$u]}" -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$@"
}
for u in gpucr-a gpucr-b; do
	s3curl "$u" -o /dev/null -X PUT "$ep/$u" || true # made if missing
	# a new bucket takes writes once the server made its collection
	for _ in $(seq 100); do echo x | s3curl "$u" -o /dev/null -T - "$ep/$u/probe" && break; sleep 0.1; done
done
now() { date +%s.%N; }
pick() { # pick FILE EXPR: EXPR of the JSON object that ends FILE (d)
	python3 - "$1" "$2" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
d = json.loads(t[t.index("{"):])
print(eval(sys.argv[2], {}, {"d": d}))
PY
}
sock=$work/helper.sock
gpucr helper --socket "$sock" --log-level warn >"$work/helper.log" 2>&1 &
HELPER=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
setsid gpucr run --socket "$sock" -- build/bin/heartbeat --mib "$MIB" --still-mib "$STILL" --buffers 4 --interval-ms 50 \
	--hb-every 1 </dev/null >"$work/hb.log" 2>&1 &
APP=$!
disown "$APP" # its end (a CRIU dump) is no job of this shell's to report
hbs() { grep -c '^hb' "$work/hb.log" || true; }
for _ in $(seq 600); do [ "$(hbs)" -ge 5 ] && break; sleep 0.1; done
[ "$(hbs)" -ge 5 ] || { echo "bench-level.sh: the heartbeat did not start: $(tail -3 "$work/hb.log")" >&2; exit 1; }
G=(--socket "$sock")
tag=bench-$(date +%s)

gpucr checkpoint "$APP" -D "$work/1" --leave-running --json "${G[@]}" >"$work/ck1.json"
bytes=$(du -sb "$work/1" | cut -f1)
push() { # push BUCKET: seconds of gpucr image push of image 1 there
	as "$1" gpucr image push "$work/1" "s3://$1/$tag/1" --json >"$work/push.$1.json"
	pick "$work/push.$1.json" 'd["seconds"]'
}
tarput() { # tarput BUCKET: seconds of one tar stream of image 1 into one PUT there
	local t0
	t0=$(now)
	tar -cf - -C "$work/1" . | s3curl "$1" -o /dev/null -T - "$ep/$1/$tag-tar/1.tar"
	python3 -c "print($(now) - $t0)"
}
t_tar_a=$(tarput gpucr-a)
t_push_a=$(push gpucr-a)
t_push_b=$(push gpucr-b)
t_tar_b=$(tarput gpucr-b)

a=$(hbs)
for _ in $(seq 100); do [ "$(hbs)" -ge $((a + 3)) ] && break; sleep 0.1; done
gpucr checkpoint "$APP" -D "$work/2" --leave-running --json "${G[@]}" >"$work/ck2.json"
as gpucr-a gpucr image push "$work/2" "s3://gpucr-a/$tag/2" --json >"$work/push2.json"
b2=$(pick "$work/push2.json" 'd["bytes"]')
m2=$(pick "$work/push2.json" 'd["moved_bytes"]')

as gpucr-a gpucr checkpoint "$APP" -D "$work/final" --drain "s3://gpucr-a/$tag/final" --wait --deadline 60s --json \
	"${G[@]}" >"$work/final.json" || true
APP=

python3 - "$bytes" "$t_tar_a" "$t_push_a" "$t_push_b" "$t_tar_b" "$b2" "$m2" "$work/final.json" "$MIB" "$STILL" "$(nproc)" <<'PY'
import json, sys
(bytes_, tar_a, push_a, push_b, tar_b, b2, m2, final, mib, still, cpus) = sys.argv[1:]
b = int(bytes_)
gb = lambda s: b / float(s) / 1e9
print(f"## Images on an object store: heartbeat --mib {mib} --still-mib {still}, {cpus} CPUs, "
      f"the test store (SeaweedFS) over loopback; image {b / 2**20:.0f} MiB")
print("| what | round 1 | round 2 | rate (round 1, 2) |")
print("|---|---|---|---|")
print(f"| one tar stream into one PUT | {float(tar_a):.3f} s | {float(tar_b):.3f} s | {gb(tar_a):.2f}, {gb(tar_b):.2f} GB/s |")
print(f"| gpucr image push | {float(push_a):.3f} s | {float(push_b):.3f} s | {gb(push_a):.2f}, {gb(push_b):.2f} GB/s |")
r = (float(tar_a) + float(tar_b)) / (float(push_a) + float(push_b))
print(f"\npush against the tar stream: {r:.2f}x the rate")
print(f"second checkpoint, its still memory unchanged: {int(m2) / 2**20:.1f} MiB of {int(b2) / 2**20:.0f} MiB "
      f"crossed ({100 * int(m2) / int(b2):.2f}%)")
t = open(final).read()
try:
    d = json.loads(t[t.index("{"):])
    print(f"final checkpoint on a notice: safe in the store {d['safe_seconds']:.3f} s after the command started "
          f"(checkpoint {d['seconds']:.3f} s, push {d['drain']['seconds']:.3f} s, "
          f"{d['drain']['moved_bytes'] / 2**20:.1f} MiB sent); deadline {d['deadline_seconds']:.0f} s met: {d['deadline_met']}")
except (ValueError, KeyError) as e:
    print(f"final checkpoint on a notice: no report ({e}): {t[-300:]}")
PY
