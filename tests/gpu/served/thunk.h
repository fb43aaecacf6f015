/*
 * Counting thunks (x86-64) for the probes: a thunk stands in for a function
 * of any signature, adds one to its count and jumps to the function, leaving
 * every register the call passes (and the stack) as it found them. So a
 * probe can count the calls to a function it knows only by its address.
 *
 * Each thunk is 16 bytes of code in a page that is then made read-only and
 * executable, with its count and target in a separate writable block:
 *
 *   lock incq count(%rip)     f0 48 ff 05 <disp32>
 *   jmpq *target(%rip)        ff 25 <disp32>
 *
 * Callers make thunks one at a time (under their own lock); counts are read
 * at exit.
 */
#ifndef GPUCR_PROBE_THUNK_H
#define GPUCR_PROBE_THUNK_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define THUNKS_PER_BLOCK 4096

struct thunk_data {
    _Atomic uint64_t count;
    void *target;
};

struct thunk_block {
    uint8_t *code;           /* THUNKS_PER_BLOCK * 16 bytes, r-x once written */
    struct thunk_data *data; /* right after the code, rw- */
    int used;
};

/* thunk_make returns a thunk for target, or target itself where no thunk
 * can be made (the block is full, or mmap failed): the call still goes
 * through, only uncounted. *data gets the thunk's count (NULL: none).
 * Every thunk's code is written when the block is made, before any runs:
 * making one only sets its target, so code pages never change while other
 * threads run them. */
static inline void *thunk_make(struct thunk_block *b, void *target, struct thunk_data **data) {
    *data = NULL;
    if (!target)
        return target;
    const size_t code_bytes = THUNKS_PER_BLOCK * 16;
    if (!b->code) {
        size_t data_bytes = THUNKS_PER_BLOCK * sizeof(struct thunk_data);
        void *m = mmap(NULL, code_bytes + data_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return target;
        uint8_t *code = m;
        struct thunk_data *d = (struct thunk_data *)(code + code_bytes);
        static const uint8_t inc[4] = {0xf0, 0x48, 0xff, 0x05};
        static const uint8_t jmp[2] = {0xff, 0x25};
        for (int i = 0; i < THUNKS_PER_BLOCK; i++) {
            uint8_t *c = code + 16 * i;
            int32_t dcount = (int32_t)((uint8_t *)&d[i].count - (c + 8));
            int32_t dtarget = (int32_t)((uint8_t *)&d[i].target - (c + 14));
            memcpy(c, inc, 4);
            memcpy(c + 4, &dcount, 4);
            memcpy(c + 8, jmp, 2);
            memcpy(c + 10, &dtarget, 4);
            c[14] = 0xcc;
            c[15] = 0xcc;
        }
        __builtin___clear_cache((char *)code, (char *)code + code_bytes);
        if (mprotect(code, code_bytes, PROT_READ | PROT_EXEC) != 0) {
            munmap(m, code_bytes + data_bytes);
            return target;
        }
        b->code = code;
        b->data = d;
    }
    if (b->used >= THUNKS_PER_BLOCK)
        return target;
    int i = b->used++;
    b->data[i].target = target;
    atomic_store(&b->data[i].count, 0);
    *data = &b->data[i];
    return b->code + 16 * i;
}

#endif
