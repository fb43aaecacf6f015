/*
 * Streams, events, launches, function attributes, graphs and capture. The
 * runtime's handles are the driver's, and its flags the driver's numbers, so
 * most of these pass straight through.
 */
#include <stdlib.h>

#include "rt.h"

/* ---- streams ---- */

RT_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    if (!pStream)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(StreamCreate, (pStream, flags)));
}

RT_API cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

RT_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
    if (!pStream)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    /* a driver without priorities still makes a stream of the default one */
    if (!rt_drv.StreamCreateWithPriority && priority == 0)
        return rt_ret(DRV(StreamCreate, (pStream, flags)));
    return rt_ret(DRV(StreamCreateWithPriority, (pStream, flags, priority)));
}

RT_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    CTX();
    return rt_ret(DRV(StreamDestroy, (stream)));
}

RT_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    CTX();
    return rt_ret(DRV(StreamSynchronize, (stream)));
}

RT_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
    CTX();
    return rt_ret(DRV(StreamQuery, (stream)));
}

RT_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    CTX();
    return rt_ret(DRV(StreamWaitEvent, (stream, event, flags)));
}

RT_API cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority) {
    if (!priority)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(StreamGetPriority, (stream, priority)));
}

RT_API cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags) {
    if (!flags)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(StreamGetFlags, (stream, flags)));
}

RT_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
    if (!fn)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(LaunchHostFunc, (stream, fn, userData)));
}

/* A stream callback is a host function that also gets its stream and a status (always success: since CUDA 10
 * a callback does not run after a failure). */
struct callback {
    cudaStreamCallback_t fn;
    cudaStream_t stream;
    void *user;
};

static void run_callback(void *p) {
    struct callback c = *(struct callback *)p;
    free(p);
    c.fn(c.stream, cudaSuccess, c.user);
}

RT_API cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void *userData,
                                         unsigned int flags) {
    if (!callback || flags != 0)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    struct callback *c = malloc(sizeof *c);
    if (!c)
        return rt_ret(cudaErrorMemoryAllocation);
    *c = (struct callback){callback, stream, userData};
    cudaError_t e = DRV(LaunchHostFunc, (stream, run_callback, c));
    if (e != cudaSuccess)
        free(c);
    return rt_ret(e);
}

/* ---- events ---- */

RT_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    if (!event)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(EventCreate, (event, flags)));
}

RT_API cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

RT_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
    CTX();
    return rt_ret(DRV(EventDestroy, (event)));
}

RT_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    CTX();
    return rt_ret(DRV(EventRecord, (event, stream)));
}

RT_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
    CTX();
    if (flags == 0)
        return rt_ret(DRV(EventRecord, (event, stream)));
    return rt_ret(DRV(EventRecordWithFlags, (event, stream, flags)));
}

RT_API cudaError_t cudaEventQuery(cudaEvent_t event) {
    CTX();
    return rt_ret(DRV(EventQuery, (event)));
}

RT_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    CTX();
    return rt_ret(DRV(EventSynchronize, (event)));
}

RT_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(EventElapsedTime, (ms, start, end)));
}

/* ---- launches ---- */

/* A launch of the kernel f, once found. */
static cudaError_t launch(CUfunction f, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                          cudaStream_t stream) {
    if (sharedMem > 0xffffffffu)
        return cudaErrorInvalidValue;
    return DRV(LaunchKernel, (f, gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z,
                              (unsigned)sharedMem, stream, args, NULL));
}

RT_API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                    cudaStream_t stream) {
    CTX();
    CUfunction f;
    cudaError_t e = rt_function(func, &f);
    if (e == cudaSuccess)
        e = launch(f, gridDim, blockDim, args, sharedMem, stream);
    return rt_ret(e);
}

/* nvcc's <<<>>>: the kernel handle its host stub got from __cudaGetKernel once. */
RT_API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                      cudaStream_t stream) {
    CTX();
    CUfunction f;
    cudaError_t e = rt_kernel(kernel, &f);
    if (e == cudaSuccess)
        e = launch(f, gridDim, blockDim, args, sharedMem, stream);
    return rt_ret(e);
}

RT_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    if (!config)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUfunction f;
    cudaError_t e = rt_function(func, &f);
    if (e != cudaSuccess)
        return rt_ret(e);
    if (config->dynamicSmemBytes > 0xffffffffu)
        return rt_ret(cudaErrorInvalidValue);
    /* the attributes have the driver's layout and ids */
    CUlaunchConfig c = {config->gridDim.x,
                        config->gridDim.y,
                        config->gridDim.z,
                        config->blockDim.x,
                        config->blockDim.y,
                        config->blockDim.z,
                        (unsigned)config->dynamicSmemBytes,
                        config->stream,
                        (CUlaunchAttribute *)config->attrs,
                        config->numAttrs};
    return rt_ret(DRV(LaunchKernelEx, (&c, f, args, NULL)));
}

RT_API cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                               size_t sharedMem, cudaStream_t stream) {
    cudaLaunchAttribute a = {0};
    a.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    a.val.cooperative = 1;
    cudaLaunchConfig_t c = {gridDim, blockDim, sharedMem, stream, &a, 1};
    return cudaLaunchKernelExC(&c, func, args);
}

/* ---- functions ---- */

/* CUfunction_attribute numbers, in cudaFuncAttributes' order of interest. */
enum {
    FA_MAX_THREADS = 0,
    FA_SHARED = 1,
    FA_CONST = 2,
    FA_LOCAL = 3,
    FA_REGS = 4,
    FA_PTX = 5,
    FA_BINARY = 6,
    FA_CACHE_CA = 7,
    FA_MAX_DYN_SHARED = 8,
    FA_CARVEOUT = 9
};

RT_API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
    if (!attr)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUfunction f;
    cudaError_t e = rt_function(func, &f);
    if (e != cudaSuccess)
        return rt_ret(e);
    struct cudaFuncAttributes a = {0};
    int v[10] = {0};
    for (int i = 0; i < 10; i++)
        if ((e = DRV(FuncGetAttribute, (&v[i], i, f))) != cudaSuccess)
            return rt_ret(e);
    a.maxThreadsPerBlock = v[FA_MAX_THREADS];
    a.sharedSizeBytes = (size_t)(unsigned)v[FA_SHARED];
    a.constSizeBytes = (size_t)(unsigned)v[FA_CONST];
    a.localSizeBytes = (size_t)(unsigned)v[FA_LOCAL];
    a.numRegs = v[FA_REGS];
    a.ptxVersion = v[FA_PTX];
    a.binaryVersion = v[FA_BINARY];
    a.cacheModeCA = v[FA_CACHE_CA];
    a.maxDynamicSharedSizeBytes = v[FA_MAX_DYN_SHARED];
    a.preferredShmemCarveout = v[FA_CARVEOUT];
    *attr = a;
    return cudaSuccess;
}

RT_API cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    CTX();
    CUfunction f;
    cudaError_t e = rt_function(func, &f);
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret(DRV(FuncSetAttribute, (f, (int)attr, value)));
}

RT_API cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig) {
    CTX();
    CUfunction f;
    cudaError_t e = rt_function(func, &f);
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret(DRV(FuncSetCacheConfig, (f, (int)cacheConfig)));
}

RT_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, const void *func,
                                                                          int blockSize, size_t dynamicSMemSize,
                                                                          unsigned int flags) {
    if (!numBlocks)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUfunction f;
    cudaError_t e = rt_function(func, &f);
    if (e != cudaSuccess)
        return rt_ret(e);
    return rt_ret(
        DRV(OccupancyMaxActiveBlocksPerMultiprocessorWithFlags, (numBlocks, f, blockSize, dynamicSMemSize, flags)));
}

RT_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func, int blockSize,
                                                                 size_t dynamicSMemSize) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

/* ---- capture and graphs ---- */

RT_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    CTX();
    return rt_ret(DRV(StreamBeginCapture, (stream, (CUstreamCaptureMode)mode)));
}

RT_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    if (!pGraph)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(StreamEndCapture, (stream, pGraph)));
}

RT_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus) {
    if (!pCaptureStatus)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cudaError_t e = DRV(StreamIsCapturing, (stream, &st));
    if (e == cudaSuccess)
        *pCaptureStatus = (enum cudaStreamCaptureStatus)st;
    return rt_ret(e);
}

RT_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
    if (!mode)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUstreamCaptureMode m = (CUstreamCaptureMode)*mode;
    cudaError_t e = DRV(ThreadExchangeStreamCaptureMode, (&m));
    if (e == cudaSuccess)
        *mode = (enum cudaStreamCaptureMode)m;
    return rt_ret(e);
}

RT_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                 unsigned long long flags) {
    if (!pGraphExec)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(GraphInstantiateWithFlags, (pGraphExec, graph, flags)));
}

RT_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags) {
    return cudaGraphInstantiateWithFlags(pGraphExec, graph, flags);
}

RT_API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    CTX();
    return rt_ret(DRV(GraphLaunch, (graphExec, stream)));
}

RT_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
    CTX();
    return rt_ret(DRV(GraphExecDestroy, (graphExec)));
}

RT_API cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    CTX();
    return rt_ret(DRV(GraphDestroy, (graph)));
}

RT_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
                                            unsigned long long *id_out, cudaGraph_t *graph_out,
                                            const cudaGraphNode_t **dependencies_out, const void **edgeData_out,
                                            size_t *numDependencies_out);
RT_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
                                            unsigned long long *id_out, cudaGraph_t *graph_out,
                                            const cudaGraphNode_t **dependencies_out, const void **edgeData_out,
                                            size_t *numDependencies_out) {
    if (!captureStatus_out)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    cudaError_t e = DRV(StreamGetCaptureInfo, (stream, &st, id_out ? &id : NULL, graph_out,
                                               (const CUgraphNode **)dependencies_out, numDependencies_out));
    if (e != cudaSuccess)
        return rt_ret(e);
    *captureStatus_out = (enum cudaStreamCaptureStatus)st;
    if (id_out)
        *id_out = id;
    if (edgeData_out)
        *edgeData_out = NULL; /* every edge a default one: the only kind the runtime's capture makes here */
    return cudaSuccess;
}

RT_API cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes);
RT_API cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes) {
    if (!numNodes)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(DRV(GraphGetNodes, (graph, nodes, numNodes)));
}

RT_API cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr);
RT_API cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr) {
    if (!functionPtr)
        return rt_ret(cudaErrorInvalidValue);
    CTX();
    return rt_ret(rt_function(symbolPtr, functionPtr));
}
