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
 * driver, and every other function says it is not initialized. Only what
 * callers look up before they give up is defined; NVML's numbers.
 */
#define NV_API __attribute__((visibility("default")))

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;

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
