/*
 * Functions that programs link against (PyTorch's libraries import all of
 * them) but that gpucr's runtime does not provide: each fails with
 * cudaErrorNotSupported and says so, naming itself, the first time. They are
 * declared without their parameters, which they do not read (the caller
 * passes them and cleans up; the return value is all that crosses).
 */
#include "rt.h"

#define UNSUPPORTED(name, why)                                                                                         \
    RT_API cudaError_t name(void);                                                                                     \
    RT_API cudaError_t name(void) { RT_REFUSE(why); }

#define IPC "sharing GPU memory or events between processes is not provided in served mode"
UNSUPPORTED(cudaIpcGetMemHandle, IPC)
UNSUPPORTED(cudaIpcOpenMemHandle, IPC)
UNSUPPORTED(cudaIpcCloseMemHandle, IPC)
UNSUPPORTED(cudaIpcGetEventHandle, IPC)
UNSUPPORTED(cudaIpcOpenEventHandle, IPC)

#define POOL "memory pools are not provided by gpucr's runtime (cudaMallocAsync uses the device's default pool)"
UNSUPPORTED(cudaDeviceGetDefaultMemPool, POOL)
UNSUPPORTED(cudaDeviceGetMemPool, POOL)
UNSUPPORTED(cudaMemPoolGetAttribute, POOL)
UNSUPPORTED(cudaMemPoolSetAttribute, POOL)
UNSUPPORTED(cudaMemPoolSetAccess, POOL)
UNSUPPORTED(cudaMemPoolTrimTo, POOL)

#define GRAPH "building or inspecting graphs node by node is not provided by gpucr's runtime (capture is)"
UNSUPPORTED(cudaGraphNodeGetDependencies, GRAPH)
UNSUPPORTED(cudaGraphDebugDotPrint, GRAPH)
