// A program on the CUDA runtime (nvcc -cudart shared), to run on NVIDIA's
// runtime and on served mode's (intercept/runtime): what nvcc's host code
// registers and launches, __device__ and __constant__ variables, two streams,
// events, pinned host memory, a captured graph, function attributes and
// occupancy. It prints "ready", then "hb N checksum" every iteration and
// "done checksum=..." at the end: the same on either runtime, checkpointed
// and restored or not.
//
//   rtapp [--mib N] [--iters N] [--interval-ms N]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#define CK(x)                                                                                                    \
    do {                                                                                                         \
        cudaError_t e_ = (x);                                                                                    \
        if (e_ != cudaSuccess) {                                                                                 \
            fprintf(stderr, "rtapp: %s: %s (%s)\n", #x, cudaGetErrorString(e_), cudaGetErrorName(e_));           \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

__device__ unsigned long long dev_total;
__constant__ unsigned int mult;

__global__ void fill(unsigned int *p, size_t n, unsigned int seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned int)(i * 2654435761u) ^ seed;
}

__global__ void step(unsigned int *p, size_t n, unsigned int add) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = p[i] * mult + add + (unsigned int)(i & 7);
}

__global__ void sum(const unsigned int *p, size_t n) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += p[i];
    atomicAdd(&dev_total, s);
}

int main(int argc, char **argv) {
    size_t mib = 64;
    int iters = 20, interval = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib"))
            mib = strtoul(argv[i + 1], 0, 10);
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--interval-ms"))
            interval = atoi(argv[i + 1]);
    }
    int n = 0, rv = 0, dv = 0;
    CK(cudaGetDeviceCount(&n));
    CK(cudaRuntimeGetVersion(&rv));
    CK(cudaDriverGetVersion(&dv));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    fprintf(stderr, "rtapp: %d device(s), %s sm_%d%d, %d SMs, warp %d, %zu MiB; runtime %d driver %d\n", n, prop.name,
            prop.major, prop.minor, prop.multiProcessorCount, prop.warpSize, prop.totalGlobalMem >> 20, rv, dv);
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, step));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, step, 256, 0));
    fprintf(stderr, "rtapp: step: %d regs, max %d threads, occupancy %d blocks/SM at 256\n", fa.numRegs,
            fa.maxThreadsPerBlock, occ);
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));

    size_t words = mib << 18, half = words / 2;
    unsigned int *d;
    CK(cudaMalloc(&d, words * 4));
    unsigned int m = 3;
    CK(cudaMemcpyToSymbol(mult, &m, sizeof m));
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, hi));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    unsigned int *host;
    CK(cudaHostAlloc((void **)&host, 4096 * 4, cudaHostAllocDefault));
    fill<<<256, 256, 0, s1>>>(d, half, 1);
    fill<<<256, 256, 0, s2>>>(d + half, words - half, 2);
    CK(cudaGetLastError());
    // the per-iteration work, captured once and replayed
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    step<<<128, 256, 0, s1>>>(d, half, 11);
    step<<<128, 256, 0, s1>>>(d, half, 13);
    CK(cudaStreamEndCapture(s1, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaDeviceSynchronize());
    printf("ready\n");
    fflush(stdout);
    unsigned long long total = 0;
    for (int it = 1; it <= iters; it++) {
        CK(cudaEventRecord(e0, s1));
        CK(cudaGraphLaunch(ge, s1));
        step<<<128, 256, 0, s2>>>(d + half, words - half, (unsigned)it);
        CK(cudaEventRecord(e1, s2));
        CK(cudaStreamWaitEvent(s1, e1, 0));
        unsigned long long zero = 0;
        CK(cudaMemcpyToSymbolAsync(dev_total, &zero, sizeof zero, 0, cudaMemcpyHostToDevice, s1));
        sum<<<64, 256, 0, s1>>>(d, words);
        CK(cudaMemcpyAsync(host, d + (it * 4099) % (words - 4096), 4096 * 4, cudaMemcpyDeviceToHost, s1));
        CK(cudaStreamSynchronize(s1));
        CK(cudaMemcpyFromSymbol(&total, dev_total, sizeof total, 0, cudaMemcpyDeviceToHost));
        unsigned long long h = 0;
        for (int i = 0; i < 4096; i++)
            h = h * 31 + host[i];
        total ^= h;
        printf("hb %d %016llx\n", it, total);
        fflush(stdout);
        if (interval)
            usleep(interval * 1000);
    }
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaFreeHost(host));
    CK(cudaFree(d));
    printf("done checksum=%016llx\n", total);
    return 0;
}
