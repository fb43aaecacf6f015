/*
 * Base layer of libgpucr.so (see 1_base.h): the driver's entry points, by
 * name. The driver entry points cudadrv.h does not declare, and the one list
 * of the entry points the interposer hooks (GC_SYMS: each has a wrapper of
 * the same name and ABI, which dlsym and cuGetProcAddress hand out in place of
 * the driver's), with those it only resolves for its own use.
 */
#ifndef GPUCR_INTERCEPT_SYMS_H
#define GPUCR_INTERCEPT_SYMS_H

#include "gpucr/cudadrv.h"

/* ---- driver entry points cudadrv.h does not declare (signatures of the public driver API) ---- */
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
CUresult cuModuleLoad(CUmodule *module, const char *fname);
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                            void **optionValues);
CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                               void **libraryOptionValues, unsigned int numLibraryOptions);
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
/* Capture: the graph a stream's work goes into (cuda.h 13 names _v3 cuStreamGetCaptureInfo; the driver keeps _v2). */
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
                                   CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                   size_t *numDependencies_out);
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st CUDA_GRAPH_INSTANTIATE_PARAMS;
CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);

/*
 * Other calls that queue GPU work, passed through behind the gate only (so
 * that no work is queued while a checkpoint holds the process, or between the
 * driver's restore and the reimport of its memory: a CUDA graph replayed in
 * that window faults on memory not mapped yet). Their structures are only
 * passed through, so they stay incomplete here.
 */
typedef struct CUDA_MEMCPY2D_st CUDA_MEMCPY2D;
typedef struct CUDA_MEMCPY3D_st CUDA_MEMCPY3D;
typedef struct CUDA_MEMCPY3D_PEER_st CUDA_MEMCPY3D_PEER;
typedef union CUstreamBatchMemOpParams_union CUstreamBatchMemOpParams;
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData);
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *pCopy);
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream);
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy);
CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *pCopy);
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream);
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *pCopy, CUstream hStream);
CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *pCopy);
CUresult cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER *pCopy);
CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream);
CUresult cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream);
CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                      size_t ByteCount);
CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount);
CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount, CUstream hStream);
CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                CUcontext srcContext, size_t ByteCount, CUstream hStream);
CUresult cuMemsetD2D8_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height);
CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height);
CUresult cuMemsetD2D16_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height);
CUresult cuMemsetD2D16_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height);
CUresult cuMemsetD2D32_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height);
CUresult cuMemsetD2D32_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height);
CUresult cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,
                           CUstream hStream);
CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,
                                CUstream hStream);
CUresult cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height,
                            CUstream hStream);
CUresult cuMemsetD2D16Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height,
                                 CUstream hStream);
CUresult cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height,
                            CUstream hStream);
CUresult cuMemsetD2D32Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height,
                                 CUstream hStream);
CUresult cuStreamWriteValue32_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamWriteValue64_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);
CUresult cuStreamWaitValue32_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
CUresult cuStreamWaitValue64_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags);
CUresult cuStreamBatchMemOp_v2(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
                               unsigned int flags);
CUresult cuStreamBatchMemOp_v2_ptsz(CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray,
                                    unsigned int flags);

/* Passed through behind the gate only (8_gated.c). */
#define GC_GATED_SYMS(X)                                                                                               \
    X(cuLaunchHostFunc)                                                                                                \
    X(cuLaunchHostFunc_ptsz)                                                                                           \
    X(cuMemcpy2D_v2)                                                                                                   \
    X(cuMemcpy2D_v2_ptds)                                                                                              \
    X(cuMemcpy2DUnaligned_v2)                                                                                          \
    X(cuMemcpy2DUnaligned_v2_ptds)                                                                                     \
    X(cuMemcpy2DAsync_v2)                                                                                              \
    X(cuMemcpy2DAsync_v2_ptsz)                                                                                         \
    X(cuMemcpy3D_v2)                                                                                                   \
    X(cuMemcpy3D_v2_ptds)                                                                                              \
    X(cuMemcpy3DAsync_v2)                                                                                              \
    X(cuMemcpy3DAsync_v2_ptsz)                                                                                         \
    X(cuMemcpy3DPeer)                                                                                                  \
    X(cuMemcpy3DPeer_ptds)                                                                                             \
    X(cuMemcpy3DPeerAsync)                                                                                             \
    X(cuMemcpy3DPeerAsync_ptsz)                                                                                        \
    X(cuMemcpyPeer)                                                                                                    \
    X(cuMemcpyPeer_ptds)                                                                                               \
    X(cuMemcpyPeerAsync)                                                                                               \
    X(cuMemcpyPeerAsync_ptsz)                                                                                          \
    X(cuMemsetD2D8_v2)                                                                                                 \
    X(cuMemsetD2D8_v2_ptds)                                                                                            \
    X(cuMemsetD2D16_v2)                                                                                                \
    X(cuMemsetD2D16_v2_ptds)                                                                                           \
    X(cuMemsetD2D32_v2)                                                                                                \
    X(cuMemsetD2D32_v2_ptds)                                                                                           \
    X(cuMemsetD2D8Async)                                                                                               \
    X(cuMemsetD2D8Async_ptsz)                                                                                          \
    X(cuMemsetD2D16Async)                                                                                              \
    X(cuMemsetD2D16Async_ptsz)                                                                                         \
    X(cuMemsetD2D32Async)                                                                                              \
    X(cuMemsetD2D32Async_ptsz)                                                                                         \
    X(cuStreamWriteValue32_v2)                                                                                         \
    X(cuStreamWriteValue32_v2_ptsz)                                                                                    \
    X(cuStreamWriteValue64_v2)                                                                                         \
    X(cuStreamWriteValue64_v2_ptsz)                                                                                    \
    X(cuStreamWaitValue32_v2)                                                                                          \
    X(cuStreamWaitValue32_v2_ptsz)                                                                                     \
    X(cuStreamWaitValue64_v2)                                                                                          \
    X(cuStreamWaitValue64_v2_ptsz)                                                                                     \
    X(cuStreamBatchMemOp_v2)                                                                                           \
    X(cuStreamBatchMemOp_v2_ptsz)

#define GC_SYMS(X)                                                                                                     \
    X(cuInit)                                                                                                          \
    X(cuDeviceGetPCIBusId)                                                                                             \
    X(cuDeviceGetAttribute)                                                                                            \
    X(cuGetProcAddress)                                                                                                \
    X(cuGetProcAddress_v2)                                                                                             \
    X(cuMemAlloc_v2)                                                                                                   \
    X(cuMemAllocPitch_v2)                                                                                              \
    X(cuMemFree_v2)                                                                                                    \
    X(cuMemAllocAsync)                                                                                                 \
    X(cuMemAllocAsync_ptsz)                                                                                            \
    X(cuMemFreeAsync)                                                                                                  \
    X(cuMemFreeAsync_ptsz)                                                                                             \
    X(cuMemAllocFromPoolAsync)                                                                                         \
    X(cuMemAllocFromPoolAsync_ptsz)                                                                                    \
    X(cuMemGetAddressRange_v2)                                                                                         \
    X(cuPointerGetAttribute)                                                                                           \
    X(cuPointerGetAttributes)                                                                                          \
    X(cuMemAllocManaged)                                                                                               \
    X(cuIpcGetMemHandle)                                                                                               \
    X(cuMemCreate)                                                                                                     \
    X(cuMemRelease)                                                                                                    \
    X(cuMemMap)                                                                                                        \
    X(cuMemUnmap)                                                                                                      \
    X(cuMemSetAccess)                                                                                                  \
    X(cuMemRetainAllocationHandle)                                                                                     \
    X(cuMemGetAllocationPropertiesFromHandle)                                                                          \
    X(cuMemExportToShareableHandle)                                                                                    \
    X(cuMemImportFromShareableHandle)                                                                                  \
    X(cuLaunchKernel)                                                                                                  \
    X(cuLaunchKernel_ptsz)                                                                                             \
    X(cuLaunchKernelEx)                                                                                                \
    X(cuLaunchKernelEx_ptsz)                                                                                           \
    X(cuLaunchCooperativeKernel)                                                                                       \
    X(cuLaunchCooperativeKernel_ptsz)                                                                                  \
    X(cuMemcpyHtoD_v2)                                                                                                 \
    X(cuMemcpyDtoH_v2)                                                                                                 \
    X(cuMemcpyDtoD_v2)                                                                                                 \
    X(cuMemcpy)                                                                                                        \
    X(cuMemcpyHtoD_v2_ptds)                                                                                            \
    X(cuMemcpyDtoH_v2_ptds)                                                                                            \
    X(cuMemcpyDtoD_v2_ptds)                                                                                            \
    X(cuMemcpy_ptds)                                                                                                   \
    X(cuMemcpyHtoDAsync_v2)                                                                                            \
    X(cuMemcpyDtoHAsync_v2)                                                                                            \
    X(cuMemcpyDtoDAsync_v2)                                                                                            \
    X(cuMemcpyAsync)                                                                                                   \
    X(cuMemcpyHtoDAsync_v2_ptsz)                                                                                       \
    X(cuMemcpyDtoHAsync_v2_ptsz)                                                                                       \
    X(cuMemcpyDtoDAsync_v2_ptsz)                                                                                       \
    X(cuMemcpyAsync_ptsz)                                                                                              \
    X(cuMemsetD8_v2)                                                                                                   \
    X(cuMemsetD16_v2)                                                                                                  \
    X(cuMemsetD32_v2)                                                                                                  \
    X(cuMemsetD8_v2_ptds)                                                                                              \
    X(cuMemsetD16_v2_ptds)                                                                                             \
    X(cuMemsetD32_v2_ptds)                                                                                             \
    X(cuMemsetD8Async)                                                                                                 \
    X(cuMemsetD16Async)                                                                                                \
    X(cuMemsetD32Async)                                                                                                \
    X(cuMemsetD8Async_ptsz)                                                                                            \
    X(cuMemsetD16Async_ptsz)                                                                                           \
    X(cuMemsetD32Async_ptsz)                                                                                           \
    X(cuModuleLoad)                                                                                                    \
    X(cuModuleLoadData)                                                                                                \
    X(cuModuleLoadDataEx)                                                                                              \
    X(cuModuleUnload)                                                                                                  \
    X(cuLibraryLoadData)                                                                                               \
    X(cuLibraryLoadFromFile)                                                                                           \
    X(cuLibraryUnload)                                                                                                 \
    X(cuStreamCreate)                                                                                                  \
    X(cuStreamCreateWithPriority)                                                                                      \
    X(cuEventCreate)                                                                                                   \
    X(cuGraphLaunch)                                                                                                   \
    X(cuGraphLaunch_ptsz)                                                                                              \
    X(cuGraphInstantiateWithFlags)                                                                                     \
    X(cuGraphInstantiateWithParams)                                                                                    \
    X(cuGraphInstantiateWithParams_ptsz)                                                                               \
    X(cuGraphExecDestroy)                                                                                              \
    X(cuGraphDestroy)                                                                                                  \
    GC_GATED_SYMS(X)

/* Not wrapped: resolved for the interposer's own use. */
#define GC_INTERNAL_SYMS(X)                                                                                            \
    X(cuStreamGetCaptureInfo_v2)                                                                                       \
    X(cuCtxGetDevice)                                                                                                  \
    X(cuCtxGetCurrent)                                                                                                 \
    X(cuCtxSetCurrent)                                                                                                 \
    X(cuCtxSynchronize)                                                                                                \
    X(cuDevicePrimaryCtxRetain)                                                                                        \
    X(cuDevicePrimaryCtxRelease_v2)                                                                                    \
    X(cuDeviceGetUuid_v2)                                                                                              \
    X(cuDeviceGetCount)                                                                                                \
    X(cuMemGetAllocationGranularity)                                                                                   \
    X(cuMemAddressReserve)                                                                                             \
    X(cuMemAddressFree)                                                                                                \
    X(cuEventRecord)                                                                                                   \
    X(cuEventQuery)                                                                                                    \
    X(cuEventSynchronize)                                                                                              \
    X(cuEventDestroy_v2)                                                                                               \
    X(cuStreamSynchronize)                                                                                             \
    X(cuFuncGetParamInfo)                                                                                              \
    X(cuKernelGetParamInfo)                                                                                            \
    X(cuFuncGetName)                                                                                                   \
    X(cuFuncGetModule)                                                                                                 \
    X(cuKernelGetName)                                                                                                 \
    X(cuKernelGetLibrary)

#define GC_SYM_ENUM(n) SYM_##n,
enum {
    GC_SYMS(GC_SYM_ENUM) SYM_NWRAPPED,
    SYM_INTERNAL_BEFORE = SYM_NWRAPPED - 1,
    GC_INTERNAL_SYMS(GC_SYM_ENUM) SYM_NALL
};

#endif
