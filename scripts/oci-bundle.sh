#!/usr/bin/env bash
# oci-bundle.sh: make an OCI bundle (for runc) that runs one command in a
# minimal container built from the host's own files, suitable for
# `runc checkpoint` / `runc restore` with CRIU.
#
# usage: scripts/oci-bundle.sh [-w HOSTDIR:CTRDIR]... [-e NAME=VALUE]...
#                              [-d DEVICE]... [-C CWD] DIR -- CMD [ARGS...]
#
#   DIR       bundle directory to create (config.json + rootfs/); an existing
#             bundle there is replaced (its config.json and rootfs/ only).
#   -w H:C    bind the host directory H read-write at C in the container
#             (may be repeated); H is created if missing.
#   -e N=V    set environment variable N to V in the container (repeatable);
#             PATH defaults to the usual system PATH.
#   -d DEV    give the container the host's device node DEV (a path such as
#             /dev/nvidia0; repeatable): created in the container's /dev with
#             the same type and numbers, and allowed by the device cgroup.
#   -C CWD    working directory of the process (default: /).
#   CMD ...   the process' argv. With no terminal the process inherits
#             runc's stdio, so redirect inside the container, e.g.
#             -- sh -c 'exec myprog > /work/out.log 2>&1'
#
# The container:
#   - rootfs: an empty directory with read-only bind mounts of the host's
#     /usr /etc and (where they are real directories) /bin /sbin /lib /lib64,
#     each mount below them bound on its own (not through a recursive bind:
#     runc tells CRIU that the bundle's mounts are external, and CRIU refuses
#     to dump a file system it does not know that came along a recursive
#     bind, such as a GPU host's /usr/local/nvidia);
#     where the host has merged-/usr symlinks (bin -> usr/bin ...) the same
#     symlinks are made in rootfs instead. Plus tmpfs /tmp and the -w binds.
#   - no rlimits (this machine lacks CAP_SYS_RESOURCE: runc would fail to set
#     them, and CRIU restore would fail to restore them), no terminal.
#   - the host's network namespace (the "network" namespace is removed), so
#     GPU helpers / sockets on the host are reachable; pid, ipc, uts and
#     mount namespaces are private as in `runc spec`.
#
# Checkpoint/restore of such a container (verified with runc 1.1.5 and
# CRIU 4.1.1 on Debian 12, kernel 6.18, hybrid cgroup v1):
#   runc run -d --pid-file PIDFILE -b DIR ID </dev/null >/dev/null 2>&1
#   runc checkpoint --image-path IMG --work-path WORK ID
#   runc restore -d --image-path IMG --work-path WORK -b DIR ID \
#        </dev/null >/dev/null 2>&1
# No extra flags were needed: not --manage-cgroups-mode (the default "soft"
# works with this machine's hybrid cgroup v1 + v2 layout), not --file-locks,
# not --tcp-established (add the latter two if the program holds file locks
# or established TCP connections). Pitfalls:
#   - give --image-path / --work-path as absolute paths: runc restore works
#     in the bundle directory, so relative ones fail ("open img: no such
#     file or directory").
#   - keep runc's stdio on /dev/null (or files) for run and restore: with no
#     terminal the container inherits it, and runc reconnects it on restore.
#   - `criu` must be the one first on PATH (CRIU >= 4.0, see
#     scripts/install-criu.sh); runc's global --criu PATH selects another.
#   - CRIU logs "rlimit: Can't setup RLIMIT_NOFILE for self: Operation not
#     permitted" as an Error here (no CAP_SYS_RESOURCE); it is harmless.
set -euo pipefail

prog=${0##*/}
die() { echo "$prog: error: $*" >&2; exit 1; }
usage() {
	sed -n '6,18s/^# \{0,1\}//p' "$0" >&2
	exit "${1:-2}"
}

binds=()   # HOST:CTR pairs
envs=()    # NAME=VALUE
devs=()    # TYPE:MAJOR:MINOR:PATH
cwd=/
dir=
while [ $# -gt 0 ]; do
	case $1 in
	-w) [ $# -ge 2 ] || usage; binds+=("$2"); shift 2 ;;
	-e) [ $# -ge 2 ] || usage; envs+=("$2"); shift 2 ;;
	-d) [ $# -ge 2 ] || usage
		[ -c "$2" ] || [ -b "$2" ] || die "-d: $2 is not a device node"
		t=c; [ -b "$2" ] && t=b
		devs+=("$t:$((16#$(stat -c %t "$2"))):$((16#$(stat -c %T "$2"))):$2"); shift 2 ;;
	-C) [ $# -ge 2 ] || usage; cwd=$2; shift 2 ;;
	-h|--help) usage 0 ;;
	--) shift; break ;;
	-*) die "unknown option $1 (see --help)" ;;
	*) [ -z "$dir" ] || die "more than one bundle directory given ($dir, $1)"; dir=$1; shift ;;
	esac
done
[ -n "$dir" ] || usage
[ $# -gt 0 ] || die "no command given after --"
command -v runc >/dev/null || die "runc not found (scripts/install-deps.sh installs it)"
command -v python3 >/dev/null || die "python3 not found"

for b in "${binds[@]+"${binds[@]}"}"; do
	case $b in
	/*:/*) ;;
	*) die "-w wants HOSTDIR:CTRDIR with absolute paths, got '$b'" ;;
	esac
	mkdir -p "${b%%:*}"
done
for e in "${envs[@]+"${envs[@]}"}"; do
	case $e in
	[A-Za-z_]*=*) ;;
	*) die "-e wants NAME=VALUE, got '$e'" ;;
	esac
done

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
rm -f "$dir/config.json"
# rootfs holds only mount points and symlinks; never anything of the host.
rm -rf "$dir/rootfs"
mkdir -p "$dir/rootfs"
runc spec --bundle "$dir"

# Host top-level directories: real directories are bound read-only, symlinks
# (merged /usr) are recreated as the same symlinks.
ro_dirs=()
for d in /usr /etc /bin /sbin /lib /lib64; do
	if [ -L "$d" ]; then
		ln -s "$(readlink "$d")" "$dir/rootfs${d}"
	elif [ -d "$d" ]; then
		ro_dirs+=("$d")
	fi
done
# The mounts below them (mountinfo field 5, octal escapes decoded), parents
# first; only directories (a file bind mount would need a file mount point).
top=$(IFS='|'; echo "${ro_dirs[*]}")
while IFS= read -r m; do
	[ -d "$m" ] && ro_dirs+=("$m")
done < <(awk '{print $5}' /proc/self/mountinfo | grep -E "^($top)/" | while IFS= read -r m; do printf '%b\n' "$m"; done | sort -u)

# Edit config.json. Lists are passed as counted argv groups:
#   config  nRO ro...  nBIND bind...  nENV env...  cwd  cmd...
python3 - "$dir/config.json" \
	"${#ro_dirs[@]}" "${ro_dirs[@]}" \
	"${#binds[@]}" "${binds[@]+"${binds[@]}"}" \
	"${#envs[@]}" "${envs[@]+"${envs[@]}"}" \
	"${#devs[@]}" "${devs[@]+"${devs[@]}"}" \
	"$cwd" "$@" <<'PY'
import json, sys

args = sys.argv[1:]
path = args.pop(0)

def group():
    n = int(args.pop(0))
    out = args[:n]
    del args[:n]
    return out

ro_dirs, binds, envs, devs = group(), group(), group(), group()
cwd = args.pop(0)
cmd = args

with open(path) as f:
    cfg = json.load(f)

proc = cfg["process"]
proc["terminal"] = False
proc["args"] = cmd
proc["cwd"] = cwd
proc.pop("rlimits", None)
env = {}
for e in proc.get("env", []) + envs:
    name, _, value = e.partition("=")
    env[name] = value
proc["env"] = [k + "=" + v for k, v in env.items()]

cfg["root"] = {"path": "rootfs", "readonly": True}

mounts = cfg.get("mounts", [])
for d in ro_dirs:
    mounts.append({"destination": d, "type": "bind", "source": d,
                   "options": ["bind", "ro", "nosuid"]})
mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777"]})
for b in binds:
    host, _, ctr = b.partition(":")
    mounts.append({"destination": ctr, "type": "bind", "source": host,
                   "options": ["rbind", "rw"]})
cfg["mounts"] = mounts

linux = cfg.setdefault("linux", {})
for d in devs:
    typ, major, minor, dpath = d.split(":", 3)
    linux.setdefault("devices", []).append({"path": dpath, "type": typ, "major": int(major),
                                            "minor": int(minor), "fileMode": 0o666, "uid": 0, "gid": 0})
    linux.setdefault("resources", {}).setdefault("devices", []).append(
        {"allow": True, "type": typ, "major": int(major), "minor": int(minor), "access": "rwm"})
# Share the host's network namespace.
linux["namespaces"] = [ns for ns in linux.get("namespaces", [])
                       if ns.get("type") != "network"]

with open(path, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
PY

# Mount points must exist in the (read-only) rootfs beforehand.
for d in "${ro_dirs[@]}" /tmp; do
	mkdir -p "$dir/rootfs$d"
done
for b in "${binds[@]+"${binds[@]}"}"; do
	mkdir -p "$dir/rootfs${b#*:}"
done

echo "$prog: bundle ready in $dir (command: $*)"
