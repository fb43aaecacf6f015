/*
 * The driver under the runtime: its entry points, the context each thread
 * uses, the last error, and the errors' names.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "rt.h"

struct rt_driver rt_drv;

/* What one process's runtime found at its first call. */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static cudaError_t init_err;
static int ndevices;
static bool served;

/* Per device: its primary context, retained once for the life of the process (as NVIDIA's runtime does). */
#define RT_MAX_DEVICES 64
static pthread_mutex_t prim_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[RT_MAX_DEVICES];

static __thread int tls_device;       /* cudaSetDevice's, else 0 */
static __thread bool tls_bound;       /* a context is current on this thread for tls_device */
static __thread cudaError_t tls_last; /* the last error */

/*
 * The table by name, resolved through cuGetProcAddress: the symbol that the dynamic linker binds is the
 * interposer's where gpucr's interposer is loaded, so its wrappers are what the runtime calls. Every entry is
 * asked for as of CUDA 12.0, whose signatures the table declares: a base name resolves to the newest version
 * not past the one asked for, and later versions changed some (CUDA 13's cuCtxSynchronize takes a context,
 * 12.3's cuStreamGetCaptureInfo adds edge data).
 */
#define RT_DRIVER_ABI 12000
static void resolve(void) {
#define RT_NAME(field, name, params) {name, offsetof(struct rt_driver, field)},
    static const struct {
        const char *name;
        size_t off;
    } names[] = {RT_DRIVER(RT_NAME){"cuStreamGetCaptureInfo", offsetof(struct rt_driver, StreamGetCaptureInfo)}};
#undef RT_NAME
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (cuGetProcAddress_v2(names[i].name, &fn, RT_DRIVER_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS ||
            st != CU_GET_PROC_ADDRESS_SUCCESS)
            fn = NULL;
        memcpy((char *)&rt_drv + names[i].off, &fn, sizeof fn);
    }
}

static void init(void) {
    served = dlsym(RTLD_DEFAULT, "gpucrServedAttach") != NULL;
    resolve();
    cudaError_t e = DRV(Init, (0));
    if (e == cudaSuccess)
        e = DRV(DeviceGetCount, (&ndevices));
    if (e == cudaSuccess && ndevices == 0)
        e = cudaErrorNoDevice;
    /* the driver's "no such library" is the runtime's "too old a driver" */
    init_err = e == (cudaError_t)CUDA_ERROR_STUB_LIBRARY ? cudaErrorInsufficientDriver : e;
}

cudaError_t rt_init(void) {
    pthread_once(&init_once, init);
    return init_err;
}

bool rt_served(void) {
    pthread_once(&init_once, init);
    return served;
}

int rt_device(void) { return tls_device; }

static cudaError_t primary_ctx(int dev, CUcontext *out) {
    if (dev < 0 || dev >= ndevices || dev >= RT_MAX_DEVICES)
        return cudaErrorInvalidDevice;
    pthread_mutex_lock(&prim_mu);
    cudaError_t e = cudaSuccess;
    if (!primary[dev]) {
        CUdevice d;
        e = DRV(DeviceGet, (&d, dev));
        if (e == cudaSuccess)
            e = DRV(DevicePrimaryCtxRetain, (&primary[dev], d));
    }
    *out = primary[dev];
    pthread_mutex_unlock(&prim_mu);
    return e;
}

cudaError_t rt_ctx(void) {
    if (tls_bound)
        return cudaSuccess;
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    /* a context the program made current itself (through the driver) is the one the runtime uses */
    CUcontext cur = NULL;
    if ((e = DRV(CtxGetCurrent, (&cur))) != cudaSuccess)
        return e;
    if (!cur) {
        if ((e = primary_ctx(tls_device, &cur)) != cudaSuccess)
            return e;
        if ((e = DRV(CtxSetCurrent, (cur))) != cudaSuccess)
            return e;
    }
    tls_bound = true;
    return cudaSuccess;
}

cudaError_t rt_set_device(int device) {
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    CUcontext ctx;
    if ((e = primary_ctx(device, &ctx)) != cudaSuccess)
        return e;
    if ((e = DRV(CtxSetCurrent, (ctx))) != cudaSuccess)
        return e;
    tls_device = device;
    tls_bound = true;
    return cudaSuccess;
}

cudaError_t rt_ret(cudaError_t e) {
    if (e != cudaSuccess && e != cudaErrorNotReady)
        tls_last = e;
    return e;
}

static void say(const char *fn, const char *why) { fprintf(stderr, "gpucr runtime: %s: %s\n", fn, why); }

cudaError_t rt_missing(const char *name) {
    /* one line per entry point, however many runtime functions need it */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static const char *said[128];
    static size_t nsaid;
    pthread_mutex_lock(&mu);
    bool first = true;
    for (size_t i = 0; i < nsaid && first; i++)
        first = said[i] != name;
    if (first && nsaid < sizeof said / sizeof said[0])
        said[nsaid++] = name;
    pthread_mutex_unlock(&mu);
    if (first) {
        char why[128];
        snprintf(why, sizeof why, "the driver has no cu%s, which this call needs", name);
        say("not supported", why);
    }
    return rt_ret(cudaErrorNotSupported);
}

cudaError_t rt_refuse(_Atomic int *once, const char *fn, const char *why) {
    if (atomic_exchange(once, 1) == 0)
        say(fn, why);
    return rt_ret(cudaErrorNotSupported);
}

RT_API cudaError_t cudaGetLastError(void) {
    cudaError_t e = tls_last;
    tls_last = cudaSuccess;
    return e;
}

RT_API cudaError_t cudaPeekAtLastError(void) { return tls_last; }

/* ---- error names ---- */

/* The runtime's own errors, and those whose runtime name is not the driver's spelled in camel case. */
static const struct {
    cudaError_t e;
    const char *name, *text;
} own[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorMissingConfiguration, "cudaErrorMissingConfiguration", "__global__ function call is not configured"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported",
     "peer access is not supported between these two devices"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
};

static int own_index(cudaError_t e) {
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i].e == e)
            return (int)i;
    return -1;
}

/* CUDA_ERROR_LAUNCH_FAILED -> cudaErrorLaunchFailed: the runtime's name for a driver error it shares. */
static const char *camel(const char *drv, char *buf, size_t cap) {
    const char *p = strncmp(drv, "CUDA_ERROR_", 11) == 0 ? drv + 11 : NULL;
    if (!p)
        return NULL;
    size_t n = (size_t)snprintf(buf, cap, "cudaError");
    bool up = true;
    for (; *p && n + 1 < cap; p++) {
        if (*p == '_') {
            up = true;
            continue;
        }
        buf[n++] = up ? *p : (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
        up = false;
    }
    buf[n] = 0;
    return buf;
}

RT_API const char *cudaGetErrorName(cudaError_t error) {
    int i = own_index(error);
    if (i >= 0)
        return own[i].name;
    /* names of driver errors, made once each and kept (the caller keeps the pointer) */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static struct {
        int e;
        char name[64];
    } made[64];
    static size_t nmade;
    const char *dn = NULL;
    pthread_once(&init_once, init);
    if (!rt_drv.GetErrorName || rt_drv.GetErrorName((CUresult)error, &dn) != CUDA_SUCCESS || !dn)
        return "cudaErrorUnknown";
    const char *out = "cudaErrorUnknown";
    pthread_mutex_lock(&mu);
    for (size_t k = 0; k < nmade; k++)
        if (made[k].e == (int)error)
            out = made[k].name;
    if (strcmp(out, "cudaErrorUnknown") == 0 && nmade < sizeof made / sizeof made[0] &&
        camel(dn, made[nmade].name, sizeof made[nmade].name)) {
        made[nmade].e = (int)error;
        out = made[nmade++].name;
    }
    pthread_mutex_unlock(&mu);
    return out;
}

RT_API const char *cudaGetErrorString(cudaError_t error) {
    int i = own_index(error);
    if (i >= 0)
        return own[i].text;
    const char *s = NULL;
    pthread_once(&init_once, init);
    if (rt_drv.GetErrorString && rt_drv.GetErrorString((CUresult)error, &s) == CUDA_SUCCESS && s)
        return s;
    return "unrecognized error code";
}
