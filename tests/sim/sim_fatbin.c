/*
 * Fat binaries given to the module loaders (cuModuleLoadData,
 * cuModuleLoadFatBinary, cuLibraryLoadData): the container nvcc embeds in
 * a program, and the wrapper around it that cudart registers.
 *
 * The simulator runs PTX only (its kernels are C functions registered under
 * the PTX entries' names), so of a fat binary it takes the first PTX entry
 * stored uncompressed; one that holds only cubins (ELF) or compressed
 * entries has no binary the simulator can run: CUDA_ERROR_NO_BINARY_FOR_GPU,
 * what the driver says of an image with nothing for its GPU.
 *
 * Layout (little-endian):
 *   header  {u32 magic 0xBA55ED50; u16 version; u16 header_size; u64 fat_size}
 *           fat_size: the bytes of entries that follow the header
 *   entry   {u16 kind (1 PTX, 2 ELF); u16 version; u32 header_size; u64 payload_size;
 *            u32 compressed_size; u32 reserved; u16 minor; u16 major; u32 arch;
 *            u32 name_offset; u32 name_len; u64 flags; u64 reserved; u64 decompressed_size}
 *           the payload at entry + header_size, the next entry after the payload
 *   wrapper {i32 magic 0x466243B1; i32 version (1, 2); const void *data (the fat binary); void *unused}
 * The loaders get no length, so, as the driver does, the header's sizes are
 * believed; within them every offset is checked before it is read.
 */
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define FATBIN_MAGIC 0xBA55ED50u
#define WRAPPER_MAGIC 0x466243B1u
#define FATBIN_HDR 16u
#define ENTRY_HDR 64u /* the fields above; an entry's header_size may be larger */
#define KIND_PTX 1u
#define FLAG_COMPRESSED 0x2000ull

static uint16_t rd16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static uint64_t rd64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The fat binary at fb: its first uncompressed PTX entry as text (malloc'd, NUL-terminated), or why not. */
static CUresult fatbin_ptx(const unsigned char *fb, char **out) {
    uint16_t hsize = rd16(fb + 6);
    uint64_t fsize = rd64(fb + 8);
    if (hsize < FATBIN_HDR || fsize > SIZE_MAX - hsize)
        return CUDA_ERROR_INVALID_IMAGE;
    const unsigned char *p = fb + hsize, *end = fb + hsize + fsize;
    while ((uint64_t)(end - p) >= ENTRY_HDR) {
        uint16_t kind = rd16(p);
        uint32_t ehsize = rd32(p + 4);
        uint64_t psize = rd64(p + 8);
        uint32_t csize = rd32(p + 16);
        uint64_t flags = rd64(p + 40), dsize = rd64(p + 56);
        if (ehsize < ENTRY_HDR || ehsize > (uint64_t)(end - p) || psize > (uint64_t)(end - p) - ehsize)
            return CUDA_ERROR_INVALID_IMAGE; /* an entry that runs past the container */
        bool compressed = csize != 0 || (flags & FLAG_COMPRESSED) || dsize != 0;
        if (kind == KIND_PTX && !compressed) {
            char *t = malloc(psize + 1);
            if (!t)
                return CUDA_ERROR_OUT_OF_MEMORY;
            memcpy(t, p + ehsize, psize);
            t[psize] = 0; /* the text may or may not end with its own NUL within the payload */
            *out = t;
            return CUDA_SUCCESS;
        }
        p += ehsize + psize;
    }
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
}

CUresult sim_image_text(const void *image, const char **text, char **owned) {
    const unsigned char *b = image;
    *owned = NULL;
    uint32_t magic = rd32(b);
    if (magic == WRAPPER_MAGIC) {
        int32_t version = (int32_t)rd32(b + 4);
        const void *data;
        memcpy(&data, b + 8, sizeof data);
        if ((version != 1 && version != 2) || !data || rd32(data) != FATBIN_MAGIC)
            return CUDA_ERROR_INVALID_IMAGE;
        b = data;
        magic = FATBIN_MAGIC;
    }
    if (magic == FATBIN_MAGIC) {
        CUresult r = fatbin_ptx(b, owned);
        if (r == CUDA_SUCCESS)
            *text = *owned;
        return r;
    }
    if (b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F')
        return CUDA_ERROR_INVALID_IMAGE; /* a cubin alone: machine code the simulator cannot run */
    *text = image;
    return CUDA_SUCCESS;
}
