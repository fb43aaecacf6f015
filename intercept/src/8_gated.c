/*
 * Calls that queue GPU work and need nothing of gpucr but the gate: no work
 * may be queued while a checkpoint holds the process (it would run on memory
 * that is being copied, or has been dropped), nor between the driver's restore
 * and the reimport of the process's memory (a CUDA graph replayed there
 * faulted on the H200: "unspecified launch failure"). Counted with the
 * launches, copies or memsets they are.
 */
#include "1_base.h"
#include "5_vmm.h"
#include "7_cow.h"

/* WRITE: what the call may write, saved first while a copy-on-write window is open, and what it may touch,
 * loaded first while a restore's loading window is (7_cow.h). */
#define GATED(name, stat, PARAMS, ARGS, WRITE)                                                                         \
    GC_EXPORT CUresult name PARAMS {                                                                                   \
        __typeof__(&name) real_ = GC_REAL(name);                                                                       \
        if (!real_)                                                                                                    \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        if (gc_gate_enter()) {                                                                                         \
            WRITE;                                                                                                     \
        }                                                                                                              \
        gc_stat_add(stat, 1);                                                                                          \
        CUresult r = real_ ARGS;                                                                                       \
        gc_gate_leave();                                                                                               \
        return r;                                                                                                      \
    }

/* A stream wait on memory shared with another process is a peer sync operation (1_sync.c). */
#define GATED_WAIT(name, PARAMS, ARGS, bytes)                                                                          \
    GC_EXPORT CUresult name PARAMS {                                                                                   \
        __typeof__(&name) real_ = GC_REAL(name);                                                                       \
        if (!real_)                                                                                                    \
            return CUDA_ERROR_NOT_SUPPORTED;                                                                           \
        if (gc_sync_enter(atomic_load_explicit(&gc_sharing, memory_order_relaxed) && gc_vmm_shared(addr)))             \
            gc_cow_read(addr, bytes);                                                                                  \
        gc_stat_add(STAT_LAUNCHES, 1);                                                                                 \
        CUresult r = real_ ARGS;                                                                                       \
        gc_gate_leave();                                                                                               \
        return r;                                                                                                      \
    }

GATED(cuLaunchHostFunc, STAT_LAUNCHES, (CUstream hStream, CUhostFn fn, void *userData), (hStream, fn, userData),
      (void)0)
GATED(cuLaunchHostFunc_ptsz, STAT_LAUNCHES, (CUstream hStream, CUhostFn fn, void *userData), (hStream, fn, userData),
      (void)0)
GATED(cuMemcpy2D_v2, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy), (pCopy), gc_cow_all())
GATED(cuMemcpy2D_v2_ptds, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy), (pCopy), gc_cow_all())
GATED(cuMemcpy2DUnaligned_v2, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy), (pCopy), gc_cow_all())
GATED(cuMemcpy2DUnaligned_v2_ptds, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy), (pCopy), gc_cow_all())
GATED(cuMemcpy2DAsync_v2, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy, CUstream hStream), (pCopy, hStream), gc_cow_all())
GATED(cuMemcpy2DAsync_v2_ptsz, STAT_COPIES, (const CUDA_MEMCPY2D *pCopy, CUstream hStream), (pCopy, hStream),
      gc_cow_all())
GATED(cuMemcpy3D_v2, STAT_COPIES, (const CUDA_MEMCPY3D *pCopy), (pCopy), gc_cow_all())
GATED(cuMemcpy3D_v2_ptds, STAT_COPIES, (const CUDA_MEMCPY3D *pCopy), (pCopy), gc_cow_all())
GATED(cuMemcpy3DAsync_v2, STAT_COPIES, (const CUDA_MEMCPY3D *pCopy, CUstream hStream), (pCopy, hStream), gc_cow_all())
GATED(cuMemcpy3DAsync_v2_ptsz, STAT_COPIES, (const CUDA_MEMCPY3D *pCopy, CUstream hStream), (pCopy, hStream),
      gc_cow_all())
GATED(cuMemcpy3DPeer, STAT_COPIES, (const CUDA_MEMCPY3D_PEER *pCopy), (pCopy), gc_cow_all())
GATED(cuMemcpy3DPeer_ptds, STAT_COPIES, (const CUDA_MEMCPY3D_PEER *pCopy), (pCopy), gc_cow_all())
GATED(cuMemcpy3DPeerAsync, STAT_COPIES, (const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream), (pCopy, hStream),
      gc_cow_all())
GATED(cuMemcpy3DPeerAsync_ptsz, STAT_COPIES, (const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream), (pCopy, hStream),
      gc_cow_all())
GATED(cuMemcpyPeer, STAT_COPIES,
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount),
      (gc_cow_read(srcDevice, ByteCount), gc_cow_write(dstDevice, ByteCount)))
GATED(cuMemcpyPeer_ptds, STAT_COPIES,
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount),
      (gc_cow_read(srcDevice, ByteCount), gc_cow_write(dstDevice, ByteCount)))
GATED(cuMemcpyPeerAsync, STAT_COPIES,
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount,
       CUstream hStream),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream),
      (gc_cow_read(srcDevice, ByteCount), gc_cow_write(dstDevice, ByteCount)))
GATED(cuMemcpyPeerAsync_ptsz, STAT_COPIES,
      (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount,
       CUstream hStream),
      (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream),
      (gc_cow_read(srcDevice, ByteCount), gc_cow_write(dstDevice, ByteCount)))
GATED(cuMemsetD2D8_v2, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height),
      (dstDevice, dstPitch, uc, Width, Height), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D8_v2_ptds, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height),
      (dstDevice, dstPitch, uc, Width, Height), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D16_v2, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height),
      (dstDevice, dstPitch, us, Width, Height), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D16_v2_ptds, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height),
      (dstDevice, dstPitch, us, Width, Height), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D32_v2, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height),
      (dstDevice, dstPitch, ui, Width, Height), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D32_v2_ptds, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height),
      (dstDevice, dstPitch, ui, Width, Height), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D8Async, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, uc, Width, Height, hStream), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D8Async_ptsz, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, uc, Width, Height, hStream), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D16Async, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, us, Width, Height, hStream), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D16Async_ptsz, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, us, Width, Height, hStream), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D32Async, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, ui, Width, Height, hStream), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuMemsetD2D32Async_ptsz, STAT_MEMSETS,
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height, CUstream hStream),
      (dstDevice, dstPitch, ui, Width, Height, hStream), gc_cow_write(dstDevice, (uint64_t)dstPitch *Height))
GATED(cuStreamWriteValue32_v2, STAT_LAUNCHES, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
      (stream, addr, value, flags), gc_cow_write(addr, 4))
GATED(cuStreamWriteValue32_v2_ptsz, STAT_LAUNCHES,
      (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags),
      gc_cow_write(addr, 4))
GATED(cuStreamWriteValue64_v2, STAT_LAUNCHES, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
      (stream, addr, value, flags), gc_cow_write(addr, 8))
GATED(cuStreamWriteValue64_v2_ptsz, STAT_LAUNCHES,
      (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags),
      gc_cow_write(addr, 8))
GATED_WAIT(cuStreamWaitValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
           (stream, addr, value, flags), 4)
GATED_WAIT(cuStreamWaitValue32_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags),
           (stream, addr, value, flags), 4)
GATED_WAIT(cuStreamWaitValue64_v2, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
           (stream, addr, value, flags), 8)
GATED_WAIT(cuStreamWaitValue64_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags),
           (stream, addr, value, flags), 8)
GATED(cuStreamBatchMemOp_v2, STAT_LAUNCHES,
      (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray, unsigned int flags),
      (stream, count, paramArray, flags), gc_cow_all())
GATED(cuStreamBatchMemOp_v2_ptsz, STAT_LAUNCHES,
      (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray, unsigned int flags),
      (stream, count, paramArray, flags), gc_cow_all())

/*
 * The gate for libraries that queue GPU work without the driver's entry points: served mode's cuBLAS and
 * cuBLASLt (intercept/blas), whose products run in the worker. Their writes are not known here, so a
 * copy-on-write window saves everything first, as for a CUDA graph.
 */
GC_EXPORT void gpucrGateEnter(void) {
    if (gc_gate_enter())
        gc_cow_all();
    gc_stat_add(STAT_LAUNCHES, 1);
}

GC_EXPORT void gpucrGateLeave(void) { gc_gate_leave(); }
