/*
 * The driver's entry points as cuGetProcAddress hands them out: the base
 * name a caller asks for, the function, and the CUDA version from which that
 * function is what the name means (a caller asking for an older version gets
 * the newest entry not past it). Facts of the driver API, shared by the
 * simulated driver (tests/sim) and served mode's library (intercept/served),
 * each of which defines P(base, function, version) for its own table.
 */
#ifndef GPUCR_PROCADDR_H
#define GPUCR_PROCADDR_H

#define GC_PROC_ADDRESSES(P)                                                                                           \
    P("cuInit", cuInit, 2000)                                                                                          \
    P("cuDriverGetVersion", cuDriverGetVersion, 2020)                                                                  \
    P("cuGetErrorString", cuGetErrorString, 6000)                                                                      \
    P("cuGetErrorName", cuGetErrorName, 6000)                                                                          \
    P("cuGetProcAddress", cuGetProcAddress, 11030)                                                                     \
    P("cuGetProcAddress", cuGetProcAddress_v2, 12000)                                                                  \
    P("cuGetExportTable", cuGetExportTable, 3000)                                                                      \
    P("cuDeviceGetCount", cuDeviceGetCount, 2000)                                                                      \
    P("cuDeviceGet", cuDeviceGet, 2000)                                                                                \
    P("cuDeviceGetName", cuDeviceGetName, 2000)                                                                        \
    P("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000)                                                              \
    P("cuDeviceGetPCIBusId", cuDeviceGetPCIBusId, 4010)                                                                \
    P("cuDeviceCanAccessPeer", cuDeviceCanAccessPeer, 4000)                                                            \
    P("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020)                                                                   \
    P("cuDeviceGetUuid", cuDeviceGetUuid, 9020)                                                                        \
    P("cuDeviceGetUuid", cuDeviceGetUuid_v2, 11040)                                                                    \
    P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000)                                                      \
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000)                                                \
    P("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState, 7000)                                                  \
    P("cuDevicePrimaryCtxSetFlags", cuDevicePrimaryCtxSetFlags_v2, 11000)                                              \
    P("cuCtxGetCurrent", cuCtxGetCurrent, 4000)                                                                        \
    P("cuCtxSetCurrent", cuCtxSetCurrent, 4000)                                                                        \
    P("cuCtxGetDevice", cuCtxGetDevice, 2000)                                                                          \
    P("cuCtxSynchronize", cuCtxSynchronize, 2000)                                                                      \
    P("cuCtxSetLimit", cuCtxSetLimit, 3010)                                                                            \
    P("cuCtxGetLimit", cuCtxGetLimit, 3010)                                                                            \
    P("cuCtxGetStreamPriorityRange", cuCtxGetStreamPriorityRange, 5050)                                                \
    P("cuMemAlloc", cuMemAlloc_v2, 3020)                                                                               \
    P("cuMemAllocPitch", cuMemAllocPitch_v2, 3020)                                                                     \
    P("cuMemFree", cuMemFree_v2, 3020)                                                                                 \
    P("cuMemGetInfo", cuMemGetInfo_v2, 3020)                                                                           \
    P("cuMemGetAddressRange", cuMemGetAddressRange_v2, 3020)                                                           \
    P("cuMemAllocAsync", cuMemAllocAsync, 11020)                                                                       \
    P("cuMemFreeAsync", cuMemFreeAsync, 11020)                                                                         \
    P("cuMemAllocHost", cuMemAllocHost_v2, 3020)                                                                       \
    P("cuMemHostAlloc", cuMemHostAlloc, 2020)                                                                          \
    P("cuMemFreeHost", cuMemFreeHost, 2000)                                                                            \
    P("cuMemHostRegister", cuMemHostRegister_v2, 6050)                                                                 \
    P("cuMemHostUnregister", cuMemHostUnregister, 4000)                                                                \
    P("cuPointerGetAttribute", cuPointerGetAttribute, 4000)                                                            \
    P("cuPointerGetAttributes", cuPointerGetAttributes, 7000)                                                          \
    P("cuMemcpyHtoD", cuMemcpyHtoD_v2, 3020)                                                                           \
    P("cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020)                                                                           \
    P("cuMemcpyDtoD", cuMemcpyDtoD_v2, 3020)                                                                           \
    P("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, 3020)                                                                 \
    P("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, 3020)                                                                 \
    P("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2, 3020)                                                                 \
    P("cuMemcpy", cuMemcpy, 4000)                                                                                      \
    P("cuMemcpyAsync", cuMemcpyAsync, 4000)                                                                            \
    P("cuMemsetD8", cuMemsetD8_v2, 3020)                                                                               \
    P("cuMemsetD16", cuMemsetD16_v2, 3020)                                                                             \
    P("cuMemsetD32", cuMemsetD32_v2, 3020)                                                                             \
    P("cuMemsetD8Async", cuMemsetD8Async, 3020)                                                                        \
    P("cuMemsetD16Async", cuMemsetD16Async, 3020)                                                                      \
    P("cuMemsetD32Async", cuMemsetD32Async, 3020)                                                                      \
    P("cuStreamCreate", cuStreamCreate, 2000)                                                                          \
    P("cuStreamCreateWithPriority", cuStreamCreateWithPriority, 5050)                                                  \
    P("cuStreamGetPriority", cuStreamGetPriority, 5050)                                                                \
    P("cuStreamGetFlags", cuStreamGetFlags, 5050)                                                                      \
    P("cuStreamBeginCapture", cuStreamBeginCapture_v2, 10010)                                                          \
    P("cuStreamIsCapturing", cuStreamIsCapturing, 10000)                                                               \
    P("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode, 10010)                                   \
    P("cuStreamEndCapture", cuStreamEndCapture, 10000)                                                                 \
    P("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 11040)                                               \
    P("cuGraphLaunch", cuGraphLaunch, 10000)                                                                           \
    P("cuGraphExecDestroy", cuGraphExecDestroy, 10000)                                                                 \
    P("cuGraphDestroy", cuGraphDestroy, 10000)                                                                         \
    P("cuGraphGetNodes", cuGraphGetNodes, 10000)                                                                       \
    P("cuStreamDestroy", cuStreamDestroy_v2, 4000)                                                                     \
    P("cuStreamSynchronize", cuStreamSynchronize, 2000)                                                                \
    P("cuStreamQuery", cuStreamQuery, 2000)                                                                            \
    /* the _v2 memory operations are what the names mean from 12.0 (the v1 ABI is not simulated) */                    \
    P("cuStreamWriteValue32", cuStreamWriteValue32_v2, 12000)                                                          \
    P("cuStreamWriteValue64", cuStreamWriteValue64_v2, 12000)                                                          \
    P("cuStreamWaitValue32", cuStreamWaitValue32_v2, 12000)                                                            \
    P("cuStreamWaitValue64", cuStreamWaitValue64_v2, 12000)                                                            \
    P("cuStreamWaitEvent", cuStreamWaitEvent, 3020)                                                                    \
    P("cuLaunchHostFunc", cuLaunchHostFunc, 10000)                                                                     \
    P("cuEventCreate", cuEventCreate, 2000)                                                                            \
    P("cuEventRecord", cuEventRecord, 2000)                                                                            \
    P("cuEventRecordWithFlags", cuEventRecordWithFlags, 11010)                                                         \
    P("cuEventQuery", cuEventQuery, 2000)                                                                              \
    P("cuEventSynchronize", cuEventSynchronize, 2000)                                                                  \
    P("cuEventElapsedTime", cuEventElapsedTime, 2000)                                                                  \
    P("cuEventElapsedTime", cuEventElapsedTime_v2, 12080)                                                              \
    P("cuEventDestroy", cuEventDestroy_v2, 4000)                                                                       \
    P("cuModuleLoadData", cuModuleLoadData, 2000)                                                                      \
    P("cuModuleLoad", cuModuleLoad, 2000)                                                                              \
    P("cuModuleLoadFatBinary", cuModuleLoadFatBinary, 2000)                                                            \
    P("cuModuleGetFunction", cuModuleGetFunction, 2000)                                                                \
    P("cuModuleUnload", cuModuleUnload, 2000)                                                                          \
    P("cuModuleGetGlobal", cuModuleGetGlobal_v2, 3020)                                                                 \
    P("cuLibraryLoadData", cuLibraryLoadData, 12000)                                                                   \
    P("cuLibraryGetKernel", cuLibraryGetKernel, 12000)                                                                 \
    P("cuLibraryUnload", cuLibraryUnload, 12000)                                                                       \
    P("cuLibraryGetGlobal", cuLibraryGetGlobal, 12000)                                                                 \
    P("cuKernelGetFunction", cuKernelGetFunction, 12000)                                                               \
    P("cuFuncGetParamInfo", cuFuncGetParamInfo, 12040)                                                                 \
    P("cuKernelGetParamInfo", cuKernelGetParamInfo, 12040)                                                             \
    P("cuFuncGetModule", cuFuncGetModule, 11000)                                                                       \
    P("cuFuncGetName", cuFuncGetName, 12030)                                                                           \
    P("cuKernelGetName", cuKernelGetName, 12030)                                                                       \
    P("cuKernelGetLibrary", cuKernelGetLibrary, 12050)                                                                 \
    P("cuLaunchKernel", cuLaunchKernel, 4000)                                                                          \
    P("cuLaunchKernelEx", cuLaunchKernelEx, 11060)                                                                     \
    P("cuFuncGetAttribute", cuFuncGetAttribute, 2020)                                                                  \
    P("cuFuncSetAttribute", cuFuncSetAttribute, 9000)                                                                  \
    P("cuFuncSetCacheConfig", cuFuncSetCacheConfig, 3000)                                                              \
    P("cuOccupancyMaxActiveBlocksPerMultiprocessor", cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050)                \
    P("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,    \
      7000)                                                                                                            \
    P("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, 10020)                                           \
    P("cuMemCreate", cuMemCreate, 10020)                                                                               \
    P("cuMemRelease", cuMemRelease, 10020)                                                                             \
    P("cuMemAddressReserve", cuMemAddressReserve, 10020)                                                               \
    P("cuMemAddressFree", cuMemAddressFree, 10020)                                                                     \
    P("cuMemMap", cuMemMap, 10020)                                                                                     \
    P("cuMemUnmap", cuMemUnmap, 10020)                                                                                 \
    P("cuMemSetAccess", cuMemSetAccess, 10020)                                                                         \
    P("cuMemExportToShareableHandle", cuMemExportToShareableHandle, 10020)                                             \
    P("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle, 11000)                                               \
    P("cuMemGetAllocationPropertiesFromHandle", cuMemGetAllocationPropertiesFromHandle, 10020)                         \
    P("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle, 10020)                                         \
    P("cuCheckpointProcessGetRestoreThreadId", cuCheckpointProcessGetRestoreThreadId, 12080)                           \
    P("cuCheckpointProcessGetState", cuCheckpointProcessGetState, 12080)                                               \
    P("cuCheckpointProcessLock", cuCheckpointProcessLock, 12080)                                                       \
    P("cuCheckpointProcessCheckpoint", cuCheckpointProcessCheckpoint, 12080)                                           \
    P("cuCheckpointProcessRestore", cuCheckpointProcessRestore, 12080)                                                 \
    P("cuCheckpointProcessUnlock", cuCheckpointProcessUnlock, 12080)

#endif
