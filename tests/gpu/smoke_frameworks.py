"""One smoke run of a non-PyTorch GPU framework, for `gpucr run`.

    python3 smoke_frameworks.py jax|cupy|numba

Each computes something small but real on the GPU (a matmul and reductions,
an elementwise kernel, a jitted kernel) and prints `smoke NAME VALUE` with a
value that must be the same with and without the interposer, or exits 1 with
the error. A framework that is not installed prints `smoke NAME missing`.
"""
import sys


def jax_smoke():
    import os
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.2")
    # XLA picks GEMM algorithms by timing them: results then vary from run
    # to run in the last bits. Deterministic ops and no autotuning make the
    # value comparable between runs.
    os.environ.setdefault("XLA_FLAGS", "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0")
    import jax
    import jax.numpy as jnp
    key = jax.random.PRNGKey(0)
    a = jax.random.normal(key, (512, 512), dtype=jnp.float32)
    b = jnp.tanh(a @ a.T).sum()
    return float(jax.device_get(b)), str(jax.devices()[0])


def cupy_smoke():
    import cupy as cp
    x = cp.arange(1 << 20, dtype=cp.float64)
    y = (cp.sin(x) ** 2 + cp.cos(x) ** 2).sum()
    m = cp.random.RandomState(1).standard_normal((256, 256))
    return float(y) + float((m @ m).trace()), cp.cuda.runtime.getDeviceProperties(0)["name"].decode()


def numba_smoke():
    import numpy as np
    from numba import cuda

    @cuda.jit
    def axpy(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    n = 1 << 20
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    y = cuda.to_device(np.ones(n, dtype=np.float32))
    out = cuda.device_array(n, dtype=np.float32)
    axpy[(n + 255) // 256, 256](out, np.float32(2.0), x, y)
    return float(out.copy_to_host().astype(np.float64).sum()), cuda.get_current_device().name.decode()


SMOKES = {"jax": jax_smoke, "cupy": cupy_smoke, "numba": numba_smoke}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in SMOKES:
        print("usage: smoke_frameworks.py jax|cupy|numba", file=sys.stderr)
        sys.exit(2)
    try:
        __import__({"jax": "jax", "cupy": "cupy", "numba": "numba"}[name])
    except ImportError:
        print(f"smoke {name} missing")
        sys.exit(0)
    value, device = SMOKES[name]()
    print(f"smoke {name} {value!r} device={device}")
