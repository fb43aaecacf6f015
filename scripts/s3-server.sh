#!/usr/bin/env bash
# s3-server.sh: a SeaweedFS S3 server for the tests of images on an object
# store (image/level, tests/e2e/level_test.go), on 127.0.0.1 only.
#
#   bash scripts/s3-server.sh DIR PORT    starts it in the background
#
# DIR holds its data, its log (DIR/weed.log), its pid (DIR/weed.pid) and its
# identities (DIR/s3.json): two users, each with one bucket it may create,
# write, read and list, and no right to the other's:
#   gpucr-a: AKIAGPUCRTESTA0000000 / the secret in DIR/s3.json
#   gpucr-b: AKIAGPUCRTESTB0000000
# It prints the endpoint once the server answers (within 60 s), else fails.
# The keys are for this throwaway server only.
set -euo pipefail
dir=$1
port=$2
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
base=$((port + 1))
setsid "$weed" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
	-master.port="$base" -volume.port="$((base + 1))" -filer.port="$((base + 2))" \
	-master.port.grpc="$((base + 10001))" -volume.port.grpc="$((base + 10002))" -filer.port.grpc="$((base + 10003))" \
	-s3 -s3.port="$port" -s3.config="$dir/s3.json" -master.volumeSizeLimitMB=512 -volume.max=64 \
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
tail -5 "$dir/weed.log" >&2 || true
kill "$(cat "$dir/weed.pid")" 2>/dev/null || true
exit 1
