/* libFuzzer target for common/gguf.c: opens the input from memory and from a memfd
 * mapping (the two must agree), and when it opens, walks every key, array element
 * and tensor through the public API, touching each tensor's first and last byte.
 * Seeds: tests/fuzz/make_corpus.py. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Elements visited per input, so that one huge array does not stall the run. */
static uint64_t budget;

static volatile uint64_t sink;

static void walk_arr(const bl_gguf_arr_t *a);

static void walk_value(const bl_gguf_kv_t *kv, const bl_gguf_arr_t *a, uint64_t i)
{
    bl_err_t err;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
    int b;
    bl_gguf_str_t s;
    const bl_gguf_arr_t *sub;

    /* Every getter on every value: the wrong ones must fail cleanly. */
    if (a) {
        if (!bl_gguf_arr_u32(a, i, &u32, &err)) sink += u32;
        if (!bl_gguf_arr_u64(a, i, &u64, &err)) sink += u64;
        if (!bl_gguf_arr_i64(a, i, &i64, &err)) sink += (uint64_t)i64;
        if (!bl_gguf_arr_f32(a, i, &f32, &err)) sink += f32 == f32;
        if (!bl_gguf_arr_f64(a, i, &f64, &err)) sink += f64 == f64;
        if (!bl_gguf_arr_bool(a, i, &b, &err)) sink += (uint64_t)b;
        if (!bl_gguf_arr_str(a, i, &s, &err) && s.len)
            sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        if (!bl_gguf_arr_arr(a, i, &sub, &err))
            walk_arr(sub);
    } else {
        if (!bl_gguf_kv_u32(kv, &u32, &err)) sink += u32;
        if (!bl_gguf_kv_u64(kv, &u64, &err)) sink += u64;
        if (!bl_gguf_kv_i64(kv, &i64, &err)) sink += (uint64_t)i64;
        if (!bl_gguf_kv_f32(kv, &f32, &err)) sink += f32 == f32;
        if (!bl_gguf_kv_f64(kv, &f64, &err)) sink += f64 == f64;
        if (!bl_gguf_kv_bool(kv, &b, &err)) sink += (uint64_t)b;
        if (!bl_gguf_kv_str(kv, &s, &err) && s.len)
            sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        if (!bl_gguf_kv_arr(kv, &sub, &err))
            walk_arr(sub);
    }
}

static void walk_arr(const bl_gguf_arr_t *a)
{
    uint64_t n = bl_gguf_arr_count(a);
    const uint8_t *raw = bl_gguf_arr_data(a);
    size_t sz = bl_gguf_type_size(bl_gguf_arr_type(a));
    if (raw && n)
        sink += raw[0] + raw[n * sz - 1];
    /* The first and the last elements, then as many as the budget allows. */
    if (n) {
        walk_value(NULL, a, n - 1);
        budget = budget ? budget - 1 : 0;
    }
    for (uint64_t i = 0; i < n && budget; i++, budget--)
        walk_value(NULL, a, i);
    bl_err_t err;
    uint32_t u32;
    if (bl_gguf_arr_u32(a, n, &u32, &err) != BL_ERANGE)
        abort();
}

static void walk(const bl_gguf_t *g)
{
    budget = 20000;
    for (uint64_t i = 0; i < bl_gguf_n_kv(g); i++) {
        const bl_gguf_kv_t *kv = bl_gguf_kv_at(g, i);
        bl_gguf_str_t key = bl_gguf_kv_key(kv);
        char buf[256];
        if (key.len < sizeof buf) {
            memcpy(buf, key.ptr, key.len);
            buf[key.len] = '\0';
            if (bl_gguf_find_kv(g, buf) != kv)
                abort();
        }
        walk_value(kv, NULL, 0);
    }
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        if (bl_gguf_find_tensor(g, t->name) != t || t->nbytes == 0)
            abort();
        sink += p[0] + p[t->nbytes - 1];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bl_gguf_t *g = NULL;
    bl_err_t err;
    int rc_mem = bl_gguf_open_memory(&g, data, size, "fuzz.gguf", &err);
    if (rc_mem == 0) {
        walk(g);
        bl_gguf_close(g);
    }

    /* The same bytes through a real file mapping. */
    int fd = memfd_create("fuzz.gguf", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int rc_file = bl_gguf_open(&g, path, &err);
    if (rc_file == 0) {
        walk(g);
        bl_gguf_close(g);
    }
    close(fd);
    if ((rc_mem == 0) != (rc_file == 0))
        abort();
    return 0;
}
