/*
 * Calls that queue GPU work and need nothing of gpucr but the gate: no work
 * may be queued while a checkpoint holds the process (it would run on memory
 * that is being copied, or has been dropped), nor between the driver's restore
 * and the reimport of the process's memory (a CUDA graph replayed there
 * faulted on the H200: "unspecified launch failure"). Counted with the
 * launches, copies or memsets they are.
 */
#include "1_base.h"

#define GATED(name, stat, PARAMS, ARGS)                                                                                \
    GC_EXPORT CUresult name PARAMS {                                                                                   \
        __typeof__(&name) real_ = GC_REAL(name);                                                                       \
        if (!real_)                                                                                                    \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        gc_gate_enter();                                                                                               \
        gc_stat_add(stat, 1);                                                                                          \
        CUresult r = real_ ARGS;                                                                                       \
        gc_gate_leave();                                                                                               \
        return r;                                                                                                      \
    }

GATED(cuGraphLaunch, STAT_LAUNCHES, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
GATED(cuGraphLaunch_ptsz, STAT_LAUNCHES, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
GATED(cuLaunchHostFunc, STAT_LAUNCHES, (CUstream hStream, CUhostFn fn, void *userData), (hStream, fn, userData))
GATED(cuLaunchHostFunc_ptsz, STAT_LAUNCHES, (CUstream hStream, CUhostFn fn, void *userData), (hStream, fn, userData))
GATED(cuMemcpy2D_v2, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy), (pCopy))
GATED(cuMemcpy2D_v2_ptds, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy), (pCopy))
GATED(cuMemcpy2DUnaligned_v2, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy), (pCopy))
GATED(cuMemcpy2DUnaligned_v2_ptds, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy), (pCopy))
GATED(cuMemcpy2DAsync_v2, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy2DAsync_v2_ptsz, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3D_v2, STAT_COPIES, (const CUDA_MEMCPY3D *pCopy), (pCopy))
GATED(cuMemcpy3D_v2_ptds, STAT_COPIES, (const CUDA_MEMCPY3D *pCopy), (pCopy))
GATED(cuMemcpy3DAsync_v2, STAT_COPIES, (const CUDA_MEMCPY3D *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3DAsync_v2_ptsz, STAT_COPIES, (const CUDA_MEMCPY3D *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3DPeer, STAT_COPIES, (const CUDA_MEMCPY3D_PEER *pCopy), (pCopy))
GATED(cuMemcpy3DPeer_ptds, STAT_COPIES, (const CUDA_MEMCPY3D_PEER *pCopy), (pCopy))
GATED(cuMemcpy3DPeerAsync, STAT_COPIES, (const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpy3DPeerAsync_ptsz, STAT_COPIES, (const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream), (pCopy, hStream))
GATED(cuMemcpyPeer, STAT_COPIES,
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount))
GATED(cuMemcpyPeer_ptds, STAT_COPIES,
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount))
GATED(cuMemcpyPeerAsync, STAT_COPIES,
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount,
       CUstream hStream),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream))
GATED(cuMemcpyPeerAsync_ptsz, STAT_COPIES,
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount,
       CUstream hStream),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream))
GATED(cuMemsetD2D8_v2, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height),
      (dstDevice, dstPitch, uc, Width, Height))
GATED(cuMemsetD2D8_v2_ptds, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height),
      (dstDevice, dstPitch, uc, Width, Height))
GATED(cuMemsetD2D16_v2, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height),
      (dstDevice, dstPitch, us, Width, Height))
GATED(cuMemsetD2D16_v2_ptds, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height),
      (dstDevice, dstPitch, us, Width, Height))
GATED(cuMemsetD2D32_v2, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height),
      (dstDevice, dstPitch, ui, Width, Height))
GATED(cuMemsetD2D32_v2_ptds, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height),
      (dstDevice, dstPitch, ui, Width, Height))
GATED(cuMemsetD2D8Async, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, uc, Width, Height, hStream))
GATED(cuMemsetD2D8Async_ptsz, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, uc, Width, Height, hStream))
GATED(cuMemsetD2D16Async, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, us, Width, Height, hStream))
GATED(cuMemsetD2D16Async_ptsz, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, us, Width, Height, hStream))
GATED(cuMemsetD2D32Async, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, ui, Width, Height, hStream))
GATED(cuMemsetD2D32Async_ptsz, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, ui, Width, Height, hStream))
GATED(cuStreamWriteValue32_v2, STAT_LAUNCHES, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue32_v2_ptsz, STAT_LAUNCHES,
      (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags))
GATED(cuStreamWriteValue64_v2, STAT_LAUNCHES, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWriteValue64_v2_ptsz, STAT_LAUNCHES,
      (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags))
GATED(cuStreamWaitValue32_v2, STAT_LAUNCHES, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue32_v2_ptsz, STAT_LAUNCHES,
      (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags))
GATED(cuStreamWaitValue64_v2, STAT_LAUNCHES, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags))
GATED(cuStreamWaitValue64_v2_ptsz, STAT_LAUNCHES,
      (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags))
GATED(cuStreamBatchMemOp_v2, STAT_LAUNCHES,
      (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray, unsigned int flags),
      (stream, count, paramArray, flags))
GATED(cuStreamBatchMemOp_v2_ptsz, STAT_LAUNCHES,
      (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray, unsigned int flags),
      (stream, count, paramArray, flags))
