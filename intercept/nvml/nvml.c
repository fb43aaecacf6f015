/*
 * Served mode's NVML (libnvidia-ml.so.1 of build/lib/served): NVML that is
 * not available, in a served process.
 *
 * NVML talks to the kernel driver itself: its nvmlInit opens /dev/nvidiactl,
 * the GPUs' device files and the capability files, and keeps them open. A
 * served process holds no driver state, and CRIU cannot dump one that holds
 * such a descriptor. PyTorch asks NVML for the device count (to stay clear of
 * CUDA before a fork) and, when NVML is not there, asks the CUDA runtime,
 * which is served. So in a served process (whose library path names this
 * directory first) NVML's initialization fails as on a host without the
 * driver, and every other function says it is not initialized, touching
 * none of its arguments. Defined are what callers look up before they give
 * up, and every function of PyTorch's NVML table (C10_NVML_DRIVER_API and
 * C10_NVML_DRIVER_API_OPTIONAL in c10/cuda/driver_api.h, 2.5 through main):
 * PyTorch dlopens libnvidia-ml.so.1 and, when it loads, asserts that each
 * function of that table is there, at the first use of its driver API table
 * (expandable segments' first allocation, an out-of-memory report) and
 * before it calls any of them. NVML's prototypes and numbers; its structures
 * only pass by pointer here, so they stay incomplete.
 */
#define NV_API __attribute__((visibility("default")))

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlPciInfo_st nvmlPciInfo_t;
typedef struct nvmlProcessInfo_v1_st nvmlProcessInfo_v1_t;
/* nvml.h's nvmlGpuFabricInfoV_t: an untagged structure, v2 or v3 as the header's version has it. */
typedef struct nvmlGpuFabricInfoV_st nvmlGpuFabricInfoV_t;

typedef enum {
    NVML_NVLINK_DEVICE_TYPE_GPU = 0x00,
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01,
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02,
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF,
} nvmlIntNvLinkDeviceType_t;

NV_API nvmlReturn_t nvmlInit_v2(void);
NV_API nvmlReturn_t nvmlInit_v2(void) { return NVML_ERROR_DRIVER_NOT_LOADED; }
NV_API nvmlReturn_t nvmlInit(void);
NV_API nvmlReturn_t nvmlInit(void) { return NVML_ERROR_DRIVER_NOT_LOADED; }
NV_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
NV_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return NVML_ERROR_DRIVER_NOT_LOADED;
}
NV_API nvmlReturn_t nvmlShutdown(void);
NV_API nvmlReturn_t nvmlShutdown(void) { return NVML_ERROR_UNINITIALIZED; }

NV_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
NV_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    (void)count;
    return NVML_ERROR_UNINITIALIZED;
}
NV_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count);
NV_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }
NV_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
NV_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    (void)index;
    (void)device;
    return NVML_ERROR_UNINITIALIZED;
}
NV_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
NV_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    (void)device;
    (void)uuid;
    (void)length;
    return NVML_ERROR_UNINITIALIZED;
}

/* PyTorch's table, beyond nvmlInit_v2. nvmlSystemGetCudaDriverVersion_v2 asks libcuda.so.1 in NVIDIA's
 * NVML; here it says, like the rest, that NVML is not initialized. */
NV_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device);
NV_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    (void)pciBusId;
    (void)device;
    return NVML_ERROR_UNINITIALIZED;
}
NV_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType);
NV_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType) {
    (void)device;
    (void)link;
    (void)pNvLinkDeviceType;
    return NVML_ERROR_UNINITIALIZED;
}
NV_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci);
NV_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    (void)device;
    (void)link;
    (void)pci;
    return NVML_ERROR_UNINITIALIZED;
}
/* The unversioned name, with version 1's structure: what nvml.h declares under NVML_NO_UNVERSIONED_FUNC_DEFS,
 * as PyTorch includes it. */
NV_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos);
NV_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos) {
    (void)device;
    (void)infoCount;
    (void)infos;
    return NVML_ERROR_UNINITIALIZED;
}
NV_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion);
NV_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    (void)cudaDriverVersion;
    return NVML_ERROR_UNINITIALIZED;
}
/* Optional in PyTorch's table (CUDA 12.4 and later): looked up, not asserted. */
NV_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo);
NV_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    (void)device;
    (void)gpuFabricInfo;
    return NVML_ERROR_UNINITIALIZED;
}

NV_API const char *nvmlErrorString(nvmlReturn_t result);
NV_API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded (NVML is not available in a gpucr served-mode process)";
    default: return "Unknown Error";
    }
}
