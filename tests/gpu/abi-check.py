#!/usr/bin/env python3
"""ABI check of include/gpucr/cudadrv.h against NVIDIA's cuda.h and libcuda.so.1.

Parses cudadrv.h, writes abi-items.h (one item a line) and compiles
tests/gpu/abi-check.c twice: with the real cuda.h and with gpucr's header.
Then compares, item by item:
  - sizeof of every typedef, offset and size of every struct member,
    the value of every enum constant and #define, and what each alias macro
    and function name expands to (abi-check.c prints them);
  - every function prototype of cudadrv.h, re-declared after the real cuda.h:
    a conflicting type is a compile error that names the function;
  - every function resolves in the driver library (dlsym).
An item that does not compile with the real header (a name it lacks) is a
failure too. Prints one line per failure naming the item and a summary;
exit status 0 only if nothing differs.

usage: abi-check.py [--cuda-include DIR] [--lib LIB] [--no-real] [--workdir DIR]
  --cuda-include DIR  where cuda.h is (default /usr/local/cuda/include)
  --lib LIB           driver library for the symbol check (default libcuda.so.1;
                      build/sim/libcuda.so.1 checks the simulator instead)
  --no-real           no cuda.h here: check only that the items build and run
                      with gpucr's header (and the symbols, if --lib is given)
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
HEADER = os.path.join(ROOT, "include", "gpucr", "cudadrv.h")
CHECK_C = os.path.join(ROOT, "tests", "gpu", "abi-check.c")
CC = os.environ.get("CC", "gcc")

IDENT = re.compile(r"[A-Za-z_]\w*")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def split_top(text, sep):
    """Splits text at sep where no (), [] or {} is open."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def members(body, prefix):
    """Member names (dotted for nested anonymous structs) of a struct/union body."""
    out = []
    for decl in split_top(body, ";"):
        m = re.match(r"^(struct|union)\s*\{(.*)\}\s*(\w+)$", decl, re.S)
        if m:
            out.append(prefix + m.group(3))
            out += members(m.group(2), prefix + m.group(3) + ".")
            continue
        decl = re.sub(r"\[[^\]]*\]", "", decl)  # array bounds
        for d in split_top(decl, ","):
            names = IDENT.findall(d)
            if names:
                out.append(prefix + names[-1])
    return out


def parse(path):
    """Returns the list of items (macro invocations) and the prototypes."""
    items, protos = [], []
    lines, skip = [], False
    for line in strip_comments(open(path).read()).split("\n"):
        s = line.strip()
        if s.startswith("#"):
            if re.match(r"#\s*ifdef\s+__cplusplus", s):
                skip = True
            elif re.match(r"#\s*endif", s):
                skip = False
            m = re.match(r"#\s*define\s+(\w+)(?!\()\s+(.+)$", s)
            if m and not m.group(1).startswith("GPUCR_"):
                name, val = m.group(1), m.group(2).strip()
                if re.fullmatch(r"cu\w+", val):
                    items.append("ABI_ALIAS(%s)" % name)
                else:
                    items.append("ABI_VALUE(%s)" % name)
            continue
        if not skip:
            lines.append(line)
    for stmt in split_top("\n".join(lines), ";"):
        stmt = " ".join(stmt.split())
        m = re.match(r"^typedef (enum|struct|union)\s*(\w*)\s*\{(.*)\}\s*(\w+)$", stmt)
        if m:
            kind, body, name = m.group(1), m.group(3), m.group(4)
            items.append("ABI_SIZEOF(%s)" % name)
            if kind == "enum":
                for e in split_top(body, ","):
                    items.append("ABI_VALUE(%s)" % IDENT.match(e).group(0))
            else:
                for mem in members(body, ""):
                    items.append("ABI_MEMBER(%s, %s)" % (name, mem))
            continue
        m = re.match(r"^typedef [\w\s*]+\(\s*\*\s*(\w+)\s*\)\s*\(.*\)$", stmt)  # a function pointer type
        if m:
            items.append("ABI_SIZEOF(%s)" % m.group(1))
            continue
        m = re.match(r"^typedef .*?(\w+)$", stmt)
        if m:
            items.append("ABI_SIZEOF(%s)" % m.group(1))
            continue
        m = re.match(r"^CUresult (\w+)\s*\(.*\)$", stmt)
        if m:
            items.append('ABI_FUNC(%s, "%s")' % (m.group(1), m.group(1)))
            protos.append(stmt + ";")
            continue
        raise SystemExit("abi-check: cannot parse this declaration of %s:\n  %s" % (path, stmt))
    return items, protos


def compile_dropping(src, items_path, items, args, label, failures, allow_drop):
    """Compiles src with the items, dropping those the compiler rejects
    (recorded as failures); returns the binary or None."""
    exe = src + "." + label
    live = list(items)
    for _ in range(20):
        with open(items_path, "w") as f:
            for it in live:
                f.write((it or "/* dropped */") + "\n")
        r = subprocess.run([CC, "-std=gnu11", "-O0", "-ftrack-macro-expansion=0", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-o", exe,
                            CHECK_C] + args + ["-ldl"], capture_output=True, text=True)
        if r.returncode == 0:
            return exe
        bad = {}
        for line in r.stderr.splitlines():
            m = re.search(re.escape(os.path.basename(items_path)) + r":(\d+):\d+: error: (.*)", line)
            if m:
                bad.setdefault(int(m.group(1)), m.group(2))
        if not bad or not allow_drop:
            sys.stderr.write(r.stderr)
            failures.append("%s build failed (see compiler output above)" % label)
            return None
        for ln, msg in sorted(bad.items()):
            if 1 <= ln <= len(live) and live[ln - 1]:
                failures.append("%s: does not compile with %s: %s" % (live[ln - 1], label, msg))
                live[ln - 1] = None
    failures.append("%s build still failing after dropping items" % label)
    return None


def run_items(exe):
    out = {}
    r = subprocess.run([exe], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("abi-check: %s failed:\n%s" % (exe, r.stdout + r.stderr))
    for line in r.stdout.splitlines():
        f = line.split(" ", 2)
        if len(f) == 3:
            out[(f[0], f[1])] = f[2]
    return out


def check_protos(work, protos, inc, failures):
    src = os.path.join(work, "abi-protos.c")
    with open(src, "w") as f:
        f.write("#include <cuda.h>\n")
        for p in protos:
            f.write(p + "\n")
    r = subprocess.run([CC, "-std=gnu11", "-c", "-o", os.devnull, "-I", inc, src], capture_output=True, text=True)
    if r.returncode == 0:
        return 0
    n = 0
    for line in r.stderr.splitlines():
        m = re.search(r"abi-protos\.c:(\d+):\d+: error: (.*)", line)
        if m and 2 <= int(m.group(1)) <= len(protos) + 1:
            failures.append("prototype %s: %s" % (protos[int(m.group(1)) - 2].split("(")[0].split()[-1], m.group(2)))
            n += 1
    if n == 0:
        sys.stderr.write(r.stderr)
        failures.append("prototype check did not compile (see compiler output above)")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda-include", default="/usr/local/cuda/include")
    ap.add_argument("--lib", default=None)
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--workdir", default=None)
    opt = ap.parse_args()

    work = opt.workdir or tempfile.mkdtemp(prefix="abi-check.")
    os.makedirs(work, exist_ok=True)
    items, protos = parse(HEADER)
    items_path = os.path.join(work, "abi-items.h")
    failures = []
    print("abi-check: %d items, %d functions from %s" % (len(items), len(protos), os.path.relpath(HEADER, ROOT)))

    src = os.path.join(work, "abi-check")
    ours_exe = compile_dropping(src, items_path, items, ["-I", work, "-I", os.path.join(ROOT, "include")],
                                "gpucr-header", failures, False)
    if not ours_exe:
        raise SystemExit("abi-check: the items do not build with gpucr's own header: a bug in abi-check.py")
    ours = run_items(ours_exe)

    if not opt.no_real:
        if not os.path.exists(os.path.join(opt.cuda_include, "cuda.h")):
            raise SystemExit("abi-check: no cuda.h in %s (--cuda-include, or --no-real)" % opt.cuda_include)
        real_exe = compile_dropping(src, items_path, items, ["-DREAL_CUDA_H", "-I", work, "-I", opt.cuda_include],
                                    "real-cuda.h", failures, True)
        if real_exe:
            real = run_items(real_exe)
            print("abi-check: real %s, ours %s" % (real.get(("info", "CUDA_VERSION")),
                                                    ours.get(("info", "GPUCR_CUDA_API_VERSION"))))
            compared = 0
            for key, v in sorted(ours.items()):
                if key[0] == "info":
                    continue
                if key not in real:
                    continue  # dropped above: already a failure
                compared += 1
                if real[key] != v:
                    failures.append("%s %s: gpucr %s, cuda.h %s" % (key[0], key[1], v, real[key]))
            print("abi-check: %d items compared" % compared)
        check_protos(work, protos, opt.cuda_include, failures)
        if opt.lib is None:
            opt.lib = "libcuda.so.1"

    if opt.lib:
        r = subprocess.run([ours_exe, "--symbols", opt.lib], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            if line.endswith(" MISSING") or line.startswith("cannot load"):
                failures.append(line)
            elif line.startswith("info "):
                print("abi-check: " + line[5:])
        print("abi-check: %d functions looked up in %s" % (len(protos), opt.lib))

    for f in failures:
        print("ABI FAIL " + f)
    print("abi-check: %s (%d failure%s)" % ("OK" if not failures else "FAILED", len(failures),
                                            "" if len(failures) == 1 else "s"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
