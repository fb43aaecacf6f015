"""The start of an inference server, for timing it plain and under `gpucr run`
(tests/gpu/bench-start.sh):

    python3 bench_start.py make WEIGHTS [--gib 8.6]   # write the weights file once
    python3 bench_start.py serve WEIGHTS PORT        # load, warm up, answer HTTP
    python3 bench_start.py serve WEIGHTS /PATH       # the same on a Unix socket at PATH
    python3 bench_start.py ask /PATH [/run]          # GET from a server on a Unix socket

`serve` loads every tensor of the safetensors file WEIGHTS onto the GPU (bf16,
one tensor per layer matrix, as a transformer checkpoint holds them), runs a
warm-up pass over all of them (a matrix product per layer), then answers
`GET /` on 127.0.0.1:PORT with the warm-up's checksum, and `GET /run` with
the checksum of the same pass run again on the GPU for the request (equal
to the warm-up's: an answer that needs every weight on the GPU). Given a path
instead of a port, it listens on a Unix socket there (replicas of one image,
each in its own container with its own directory at that path, listen side
by side; tests/gpu/replicas.sh). The harness times from
the start of the process to the first answer. With BENCH_T0 (the harness's
clock, seconds since the epoch, when it started the process) in the
environment, `serve` prints when each phase ended, in seconds since then:

    phase python|torch|cuda|load|warmup SECONDS
"""
import http.server
import os
import socket
import socketserver
import sys
import time


def phase(name):
    t0 = os.environ.get("BENCH_T0")
    if t0:
        print(f"phase {name} {time.time() - float(t0):.3f}", flush=True)


def make(path, gib):
    import torch
    from safetensors.torch import save_file
    d = 4096
    per = d * d * 2  # bytes of one bf16 d x d matrix
    n = int(gib * (1 << 30) // per)
    g = torch.Generator().manual_seed(0)
    tensors = {f"layers.{i}.weight": (torch.randn(d, d, generator=g) * 0.02).to(torch.bfloat16) for i in range(n)}
    save_file(tensors, path)
    print(f"wrote {n} tensors, {n * per / (1 << 30):.2f} GiB, to {path}")


def serve(path, port):
    phase("python")
    import torch
    from safetensors.torch import load_file
    phase("torch")
    torch.cuda.init()
    torch.empty(1, device="cuda")
    phase("cuda")
    weights = load_file(path, device="cuda")
    torch.cuda.synchronize()
    phase("load")
    order = sorted(weights, key=lambda s: int(s.split(".")[1]))

    def forward():
        x = torch.ones(16, 4096, device="cuda", dtype=torch.bfloat16) * 0.01
        acc = torch.zeros((), device="cuda", dtype=torch.float32)
        with torch.no_grad():
            for name in order:
                x = torch.tanh(x @ weights[name])
                acc += x.float().abs().sum()
        return f"{acc.item():.6f}\n".encode()

    answer = forward()
    phase("warmup")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = forward() if self.path == "/run" else answer
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    if isinstance(port, str):
        class UnixHTTPServer(socketserver.UnixStreamServer):
            def get_request(self):
                conn, _ = super().get_request()
                return conn, ("unix", 0)
        if os.path.exists(port):
            os.unlink(port)
        UnixHTTPServer(port, Handler).serve_forever()
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def ask(path, what="/run"):
    """GET what from the server on the Unix socket path; the body, or exit 1."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(path)
        s.sendall(f"GET {what} HTTP/1.0\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    except OSError:
        sys.exit(1)
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.0 200") and not head.startswith(b"HTTP/1.1 200"):
        sys.exit(1)
    print(body.decode().strip())


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--gib" else 8.6)
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3] if sys.argv[3].startswith("/") else int(sys.argv[3]))
    elif sys.argv[1] == "ask":
        ask(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "/run")
    else:
        sys.exit("usage: bench_start.py make WEIGHTS [--gib G] | serve WEIGHTS PORT")
