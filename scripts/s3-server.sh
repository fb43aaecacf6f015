#!/usr/bin/env bash
# s3-server.sh: a SeaweedFS S3 server for the tests of images on an object
# store (image/level, tests/e2e/level_test.go), on 127.0.0.1 only.
#
#   bash scripts/s3-server.sh DIR [PORT]   starts it in the background
#
# PORT is the S3 port (default: one free now); the server's other seven ports
# (master, volume, filer, their gRPC ports and S3's) are ones free now too,
# and its Iceberg and Lance listeners are off.
# DIR holds its data, its log (DIR/weed.log), its pid (DIR/weed.pid) and its
# identities (DIR/s3.json): two users, each with one bucket it may create,
# write, read and list, and no right to the other's:
#   gpucr-a: AKIAGPUCRTESTA0000000 / the secret in DIR/s3.json
#   gpucr-b: AKIAGPUCRTESTB0000000
# It prints the endpoint once the server answers (within 60 s), else fails.
# The keys are for this throwaway server only.
set -euo pipefail
dir=$1
# Free ports, as the kernel hands them out (bound, then let go at once).
read -r -a ports <<<"$(python3 -c 'import socket
ss = [socket.socket() for _ in range(8)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')"
port=${2:-${ports[0]}}
weed=$(command -v weed || true)
[ -n "$weed" ] || { echo "s3-server.sh: no weed on PATH (make deps installs SeaweedFS)" >&2; exit 1; }
mkdir -p "$dir/data"
cat >"$dir/s3.json" <<JSON
{"identities": [
  {"name": "gpucr-a", "credentials": [{"accessKey": "AKIAGPUCRTESTA0000000", "secretKey": "gpucr-test-secret-a-000000000000000000000"}],
   "actions": ["Admin:gpucr-a", "Read:gpucr-a", "Write:gpucr-a", "List:gpucr-a", "Tagging:gpucr-a"]},
  {"name": "gpucr-b", "credentials": [{"accessKey": "AKIAGPUCRTESTB0000000", "secretKey": "gpucr-test-secret-b-000000000000000000000"}],
   "actions": ["Admin:gpucr-b", "Read:gpucr-b", "Write:gpucr-b", "List:gpucr-b", "Tagging:gpucr-b"]}
]}
JSON
setsid "$weed" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
	-master.port="${ports[1]}" -volume.port="${ports[2]}" -filer.port="${ports[3]}" \
	-master.port.grpc="${ports[4]}" -volume.port.grpc="${ports[5]}" -filer.port.grpc="${ports[6]}" \
	-s3 -s3.port="$port" -s3.port.grpc="${ports[7]}" -s3.port.iceberg=0 -s3.port.lance=0 \
	-s3.config="$dir/s3.json" -master.volumeSizeLimitMB=512 -volume.max=64 \
	</dev/null >"$dir/weed.log" 2>&1 &
echo $! >"$dir/weed.pid"
for _ in $(seq 600); do
	# any HTTP answer (403 to an anonymous request) says it serves
	if python3 -c 'import sys, urllib.request as u, urllib.error as e
try: u.urlopen(sys.argv[1], timeout=2)
except e.HTTPError: pass
except Exception: sys.exit(1)' "http://127.0.0.1:$port/" 2>/dev/null; then
		echo "http://127.0.0.1:$port"
		exit 0
	fi
	kill -0 "$(cat "$dir/weed.pid")" 2>/dev/null || break
	sleep 0.1
done
echo "s3-server.sh: the S3 server did not answer on port $port (log: $dir/weed.log)" >&2
grep -E '^[EF][0-9]' "$dir/weed.log" | tail -5 >&2 || true
kill "$(cat "$dir/weed.pid")" 2>/dev/null || true
exit 1
