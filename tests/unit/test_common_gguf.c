/* Tests of common/gguf.c: GGUF images are built byte by byte in memory, written to a
 * temporary folder and opened; one test per kind of good file and per kind of broken
 * file. gguf.c is included (not linked) so that its allocations can be made to fail. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* --- allocation failure injection ------------------------------------------------ */

/* Allocations gguf.c may still make before they fail; negative is unlimited. */
static long alloc_budget = -1;

static int take_budget(void)
{
    if (alloc_budget == 0)
        return 0;
    if (alloc_budget > 0)
        alloc_budget--;
    return 1;
}
static void *failing_malloc(size_t n) { return take_budget() ? malloc(n) : NULL; }
static void *failing_calloc(size_t n, size_t m) { return take_budget() ? calloc(n, m) : NULL; }
static void *failing_realloc(void *p, size_t n) { return take_budget() ? realloc(p, n) : NULL; }
static char *failing_strdup(const char *s) { return take_budget() ? strdup(s) : NULL; }

#define malloc(n) failing_malloc(n)
#define calloc(n, m) failing_calloc(n, m)
#define realloc(p, n) failing_realloc(p, n)
#define strdup(s) failing_strdup(s)
#include "../../common/gguf.c"
#undef malloc
#undef calloc
#undef realloc
#undef strdup

#include "quant.h"

/* --- building images ------------------------------------------------------------- */

typedef struct img {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv, n_t;
    size_t data_start;
} img_t;

static void put(img_t *m, const void *d, size_t n)
{
    if (n == 0)
        return;
    if (m->n + n > m->cap) {
        m->cap = (m->n + n) * 2 + 64;
        m->p = realloc(m->p, m->cap);
        assert_non_null(m->p);
    }
    memcpy(m->p + m->n, d, n);
    m->n += n;
}
static void put_u8(img_t *m, uint8_t v) { put(m, &v, 1); }
static void put_u16(img_t *m, uint16_t v) { put(m, &v, 2); }
static void put_u32(img_t *m, uint32_t v) { put(m, &v, 4); }
static void put_u64(img_t *m, uint64_t v) { put(m, &v, 8); }
static void put_f32(img_t *m, float v) { put(m, &v, 4); }
static void put_f64(img_t *m, double v) { put(m, &v, 8); }
static void put_strn(img_t *m, const char *s, uint64_t n)
{
    put_u64(m, n);
    put(m, s, (size_t)n);
}
static void put_str(img_t *m, const char *s) { put_strn(m, s, strlen(s)); }
static void patch_u64(img_t *m, size_t at, uint64_t v) { memcpy(m->p + at, &v, 8); }
static void patch_u32(img_t *m, size_t at, uint32_t v) { memcpy(m->p + at, &v, 4); }

static void img_begin(img_t *m, uint32_t version)
{
    memset(m, 0, sizeof *m);
    put(m, "GGUF", 4);
    put_u32(m, version);
    put_u64(m, 0); /* tensor count, set by img_counts */
    put_u64(m, 0); /* key count */
}
static void img_counts(img_t *m)
{
    patch_u64(m, 8, m->n_t);
    patch_u64(m, 16, m->n_kv);
}
static void img_free(img_t *m)
{
    free(m->p);
    m->p = NULL;
}

static void kv_head(img_t *m, const char *key, uint32_t type)
{
    put_str(m, key);
    put_u32(m, type);
    m->n_kv++;
}
static void kv_u32(img_t *m, const char *key, uint32_t v)
{
    kv_head(m, key, BL_GGUF_U32);
    put_u32(m, v);
}
static void kv_str(img_t *m, const char *key, const char *v)
{
    kv_head(m, key, BL_GGUF_STRING);
    put_str(m, v);
}

static void tinfo(img_t *m, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type,
                  uint64_t offset)
{
    put_str(m, name);
    put_u32(m, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        put_u64(m, (uint64_t)ne[d]);
    put_u32(m, type);
    put_u64(m, offset);
    m->n_t++;
}

/* Patches the counts, pads to align and appends n data bytes (byte i is (i * 7 + 1)). */
static void img_data(img_t *m, uint32_t align, size_t n)
{
    img_counts(m);
    while (m->n % align)
        put_u8(m, 0);
    m->data_start = m->n;
    for (size_t i = 0; i < n; i++)
        put_u8(m, (uint8_t)(i * 7 + 1));
}

/* --- files ----------------------------------------------------------------------- */

static char tmpdir[256];

static int make_tmpdir(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/bl_gguf_XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
    (void)state;
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", tmpdir, e->d_name);
                if (rmdir(path) != 0)
                    unlink(path);
            }
        closedir(d);
    }
    return rmdir(tmpdir) == 0 ? 0 : -1;
}

/* Writes bytes to tmpdir/name and returns the path (a static buffer). */
static const char *write_file(const char *name, const void *p, size_t n)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n)
        assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    return path;
}

static void expect_in(const char *msg, const char *needle)
{
    if (needle && !strstr(msg, needle)) {
        print_error("message '%s' does not name '%s'\n", msg, needle);
        fail();
    }
}

/* Opens the image from a file and from memory; both must fail with code and name
 * every needle. */
static void expect_reject(img_t *m, int code, const char *needle1, const char *needle2)
{
    bl_gguf_t *g = NULL;
    bl_err_t err = { 0 };
    const char *path = write_file("broken.gguf", m->p, m->n);
    int rc = bl_gguf_open(&g, path, &err);
    if (rc != code)
        print_error("got %d (%s), message: %s\n", rc, bl_strerror(rc), err.msg);
    assert_int_equal(rc, code);
    assert_null(g);
    expect_in(err.msg, "broken.gguf");
    expect_in(err.msg, needle1);
    expect_in(err.msg, needle2);

    memset(&err, 0, sizeof err);
    assert_int_equal(bl_gguf_open_memory(&g, m->p, m->n, "mem.gguf", &err), code);
    assert_null(g);
    expect_in(err.msg, "mem.gguf");
    expect_in(err.msg, needle1);
    img_free(m);
}

static bl_gguf_t *open_ok(img_t *m, const char *name)
{
    bl_gguf_t *g = NULL;
    bl_err_t err = { 0 };
    const char *path = write_file(name, m->p, m->n);
    int rc = bl_gguf_open(&g, path, &err);
    if (rc)
        print_error("open failed: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_non_null(g);
    return g;
}

static const int64_t NE_8x2[] = { 8, 2 };   /* f32: 64 bytes */
static const int64_t NE_64[] = { 64 };      /* q8_0: 68 bytes */
static const int64_t NE_4x3x2[] = { 4, 3, 2 }; /* f16: 48 bytes */

/* A valid model of three tensors; align 0 leaves general.alignment out (default 32). */
static void good_model(img_t *m, uint32_t align)
{
    uint32_t a = align ? align : 32;
    img_begin(m, 3);
    kv_str(m, "general.architecture", "test");
    if (align)
        kv_u32(m, "general.alignment", align);
    kv_u32(m, "test.block_count", 2);
    tinfo(m, "a.weight", 2, NE_8x2, BL_TYPE_F32, 0);
    tinfo(m, "b.weight", 1, NE_64, BL_TYPE_Q8_0, (64 + a - 1) / a * a);
    tinfo(m, "c.weight", 3, NE_4x3x2, BL_TYPE_F16, (64 + a - 1) / a * a + (68 + a - 1) / a * a);
    img_data(m, a, (64 + a - 1) / a * a + (68 + a - 1) / a * a + 48);
}

/* --- good files ------------------------------------------------------------------ */

static void check_good_model(bl_gguf_t *g, img_t *m, uint32_t align)
{
    assert_int_equal(bl_gguf_version(g), 3);
    assert_int_equal(bl_gguf_alignment(g), align);
    assert_int_equal(bl_gguf_n_parts(g), 1);
    assert_int_equal(bl_gguf_n_tensors(g), 3);
    assert_int_equal(bl_gguf_data_offset(g, 0), m->data_start);
    assert_int_equal(bl_gguf_data_offset(g, 0) % align, 0);

    const bl_gguf_tensor_t *a = bl_gguf_find_tensor(g, "a.weight");
    const bl_gguf_tensor_t *b = bl_gguf_find_tensor(g, "b.weight");
    const bl_gguf_tensor_t *c = bl_gguf_find_tensor(g, "c.weight");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_null(bl_gguf_find_tensor(g, "a.weigh"));
    assert_ptr_equal(bl_gguf_tensor_at(g, 0), a);
    assert_ptr_equal(bl_gguf_tensor_at(g, 2), c);
    assert_null(bl_gguf_tensor_at(g, 3));

    assert_string_equal(a->name, "a.weight");
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->ne[0], 8);
    assert_int_equal(a->ne[1], 2);
    assert_int_equal(a->ne[2], 1);
    assert_int_equal(a->ne[3], 1);
    assert_int_equal(a->type, BL_TYPE_F32);
    assert_int_equal(a->nbytes, 64);
    assert_int_equal(b->nbytes, 68);
    assert_int_equal(b->type, BL_TYPE_Q8_0);
    assert_int_equal(c->nbytes, 48);
    assert_int_equal(c->n_dims, 3);
    assert_int_equal(c->ne[2], 2);
    for (int i = 0; i < 3; i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, (uint64_t)i);
        assert_int_equal(t->offset % align, 0);
        assert_int_equal(t->file_offset, m->data_start + t->offset);
        assert_int_equal(t->part, 0);
        /* The data pointer sees the bytes written at that place in the file. */
        assert_memory_equal(t->data, m->p + t->file_offset, t->nbytes);
    }
}

static void test_gguf_opens_default_alignment(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 0);
    bl_gguf_t *g = open_ok(&m, "good32.gguf");
    check_good_model(g, &m, 32);
    assert_null(bl_gguf_find_kv(g, "general.alignment"));
    bl_gguf_close(g);
    img_free(&m);
}

static void test_gguf_opens_alignment_64(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 64);
    bl_gguf_t *g = open_ok(&m, "good64.gguf");
    check_good_model(g, &m, 64);
    uint32_t a;
    bl_err_t err;
    assert_int_equal(bl_gguf_get_u32(g, "general.alignment", &a, &err), 0);
    assert_int_equal(a, 64);
    bl_gguf_close(g);
    img_free(&m);
}

/* The file is mapped shared and read-only: the CUDA worker registers the host
 * experts' pages of this mapping with the driver, and a long-term pin of a private
 * file mapping makes the kernel copy each page out first, which hung the load on a
 * 6.18 kernel (docs/architecture.md). */
static void test_gguf_maps_the_file_shared(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 0);
    bl_gguf_t *g = open_ok(&m, "shared.gguf");
    const uintptr_t at = (uintptr_t)bl_gguf_tensor_at(g, 0)->data;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) {
        bl_gguf_close(g);
        img_free(&m);
        skip();
    }
    char line[512], perms[8] = "";
    unsigned long lo, hi;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && at >= lo && at < hi)
            break;
        else
            perms[0] = '\0';
    fclose(f);
    assert_string_equal(perms, "r--s");
    bl_gguf_close(g);
    img_free(&m);
}

static void test_gguf_opens_memory(void **state)
{
    (void)state;
    img_t m;
    bl_gguf_t *g = NULL;
    bl_err_t err;
    good_model(&m, 0);
    assert_int_equal(bl_gguf_open_memory(&g, m.p, m.n, "mem", &err), 0);
    check_good_model(g, &m, 32);
    assert_ptr_equal(bl_gguf_tensor_at(g, 0)->data, m.p + m.data_start);
    bl_gguf_close(g);
    img_free(&m);
}

static void test_gguf_opens_version_2_and_no_tensors(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 2);
    kv_str(&m, "general.architecture", "x");
    img_counts(&m); /* no padding: a file without tensors may end right after the keys */
    bl_gguf_t *g = open_ok(&m, "v2.gguf");
    assert_int_equal(bl_gguf_version(g), 2);
    assert_int_equal(bl_gguf_n_tensors(g), 0);
    assert_int_equal(bl_gguf_n_kv(g), 1);
    assert_null(bl_gguf_find_tensor(g, "x"));
    bl_gguf_close(g);
    img_free(&m);
}

static void test_gguf_reads_every_value_type(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "t.u8", BL_GGUF_U8);
    put_u8(&m, 200);
    kv_head(&m, "t.i8", BL_GGUF_I8);
    put_u8(&m, (uint8_t)-5);
    kv_head(&m, "t.u16", BL_GGUF_U16);
    put_u16(&m, 60000);
    kv_head(&m, "t.i16", BL_GGUF_I16);
    put_u16(&m, (uint16_t)-30000);
    kv_u32(&m, "t.u32", 4000000000u);
    kv_head(&m, "t.i32", BL_GGUF_I32);
    put_u32(&m, (uint32_t)-7);
    kv_head(&m, "t.f32", BL_GGUF_F32);
    put_f32(&m, 1.5f);
    kv_head(&m, "t.bool", BL_GGUF_BOOL);
    put_u8(&m, 1);
    kv_str(&m, "t.string", "hello");
    kv_head(&m, "t.u64", BL_GGUF_U64);
    put_u64(&m, UINT64_MAX);
    kv_head(&m, "t.i64", BL_GGUF_I64);
    put_u64(&m, (uint64_t)INT64_MIN);
    kv_head(&m, "t.f64", BL_GGUF_F64);
    put_f64(&m, 0.1);
    kv_head(&m, "t.f64exact", BL_GGUF_F64);
    put_f64(&m, 0.5);
    kv_head(&m, "t.arr", BL_GGUF_ARRAY);
    put_u32(&m, BL_GGUF_I16);
    put_u64(&m, 3);
    put_u16(&m, 1);
    put_u16(&m, (uint16_t)-2);
    put_u16(&m, 3);
    img_counts(&m);

    bl_gguf_t *g = open_ok(&m, "types.gguf");
    bl_err_t err;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
    int b;
    bl_gguf_str_t s;
    const bl_gguf_arr_t *arr;

    assert_int_equal(bl_gguf_n_kv(g), 14);
    const char *keys[] = { "t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.i32", "t.f32",
                           "t.bool", "t.string", "t.u64", "t.i64", "t.f64" };
    for (uint32_t i = 0; i < 12; i++) {
        const bl_gguf_kv_t *kv = bl_gguf_kv_at(g, i);
        assert_ptr_equal(bl_gguf_find_kv(g, keys[i]), kv);
        assert_int_equal(bl_gguf_kv_type(kv), i < 9 ? i : i + 1);
        assert_int_equal(bl_gguf_kv_key(kv).len, strlen(keys[i]));
    }
    assert_null(bl_gguf_kv_at(g, 14));
    assert_null(bl_gguf_find_kv(g, "t.u"));

    assert_int_equal(bl_gguf_get_u32(g, "t.u8", &u32, &err), 0);
    assert_int_equal(u32, 200);
    assert_int_equal(bl_gguf_get_i64(g, "t.i8", &i64, &err), 0);
    assert_int_equal(i64, -5);
    assert_int_equal(bl_gguf_get_u64(g, "t.u16", &u64, &err), 0);
    assert_int_equal(u64, 60000);
    assert_int_equal(bl_gguf_get_i64(g, "t.i16", &i64, &err), 0);
    assert_int_equal(i64, -30000);
    assert_int_equal(bl_gguf_get_u32(g, "t.u32", &u32, &err), 0);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(bl_gguf_get_i64(g, "t.u32", &i64, &err), 0);
    assert_int_equal(i64, 4000000000);
    assert_int_equal(bl_gguf_get_i64(g, "t.i32", &i64, &err), 0);
    assert_int_equal(i64, -7);
    assert_int_equal(bl_gguf_get_f32(g, "t.f32", &f32, &err), 0);
    assert_true(f32 == 1.5f);
    assert_int_equal(bl_gguf_get_f64(g, "t.f32", &f64, &err), 0);
    assert_true(f64 == 1.5);
    assert_int_equal(bl_gguf_get_bool(g, "t.bool", &b, &err), 0);
    assert_int_equal(b, 1);
    assert_int_equal(bl_gguf_get_str(g, "t.string", &s, &err), 0);
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.ptr, "hello", 5);
    assert_int_equal(bl_gguf_get_u64(g, "t.u64", &u64, &err), 0);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(bl_gguf_get_i64(g, "t.i64", &i64, &err), 0);
    assert_true(i64 == INT64_MIN);
    assert_int_equal(bl_gguf_get_f64(g, "t.f64", &f64, &err), 0);
    assert_true(f64 == 0.1);
    assert_int_equal(bl_gguf_get_f32(g, "t.f64exact", &f32, &err), 0);
    assert_true(f32 == 0.5f);
    assert_int_equal(bl_gguf_get_f32(g, "t.u8", &f32, &err), 0);
    assert_true(f32 == 200.0f);

    assert_int_equal(bl_gguf_get_arr(g, "t.arr", &arr, &err), 0);
    assert_int_equal(bl_gguf_arr_type(arr), BL_GGUF_I16);
    assert_int_equal(bl_gguf_arr_count(arr), 3);
    assert_ptr_equal(bl_gguf_arr_kv(arr), bl_gguf_find_kv(g, "t.arr"));
    assert_int_equal(bl_gguf_arr_i64(arr, 1, &i64, &err), 0);
    assert_int_equal(i64, -2);
    assert_int_equal(bl_gguf_arr_u32(arr, 2, &u32, &err), 0);
    assert_int_equal(u32, 3);
    assert_non_null(bl_gguf_arr_data(arr));
    assert_int_equal(bl_gguf_arr_u32(arr, 1, &u32, &err), BL_ERANGE);
    expect_in(err.msg, "t.arr");
    expect_in(err.msg, "element 1");
    assert_int_equal(bl_gguf_arr_i64(arr, 3, &i64, &err), BL_ERANGE);
    assert_int_equal(bl_gguf_arr_str(arr, 0, &s, &err), BL_EINVAL);

    /* Mismatches and lossy conversions fail and name the key. */
    assert_int_equal(bl_gguf_get_u32(g, "t.string", &u32, &err), BL_EINVAL);
    expect_in(err.msg, "t.string");
    expect_in(err.msg, "string");
    assert_int_equal(bl_gguf_get_u32(g, "t.i8", &u32, &err), BL_ERANGE);
    expect_in(err.msg, "t.i8");
    assert_int_equal(bl_gguf_get_u32(g, "t.u64", &u32, &err), BL_ERANGE);
    assert_int_equal(bl_gguf_get_i64(g, "t.u64", &i64, &err), BL_ERANGE);
    assert_int_equal(bl_gguf_get_f32(g, "t.f64", &f32, &err), BL_ERANGE);
    assert_int_equal(bl_gguf_get_f32(g, "t.u32", &f32, &err), BL_ERANGE);
    assert_int_equal(bl_gguf_get_u64(g, "t.f32", &u64, &err), BL_EINVAL);
    assert_int_equal(bl_gguf_get_bool(g, "t.u8", &b, &err), BL_EINVAL);
    assert_int_equal(bl_gguf_get_str(g, "t.arr", &s, &err), BL_EINVAL);
    assert_int_equal(bl_gguf_get_arr(g, "t.u8", &arr, &err), BL_EINVAL);
    assert_int_equal(bl_gguf_get_u32(g, "no.such.key", &u32, &err), BL_ENOENT);
    expect_in(err.msg, "no.such.key");
    bl_gguf_close(g);
    img_free(&m);
}

static void test_gguf_reads_nested_arrays(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    /* [["a", "bc"], [], ["def"]] */
    kv_head(&m, "t.nested", BL_GGUF_ARRAY);
    put_u32(&m, BL_GGUF_ARRAY);
    put_u64(&m, 3);
    put_u32(&m, BL_GGUF_STRING);
    put_u64(&m, 2);
    put_str(&m, "a");
    put_str(&m, "bc");
    put_u32(&m, BL_GGUF_BOOL);
    put_u64(&m, 0);
    put_u32(&m, BL_GGUF_STRING);
    put_u64(&m, 1);
    put_str(&m, "def");
    /* [[[7]], [[8, 9]]] of i32 */
    kv_head(&m, "t.deep", BL_GGUF_ARRAY);
    put_u32(&m, BL_GGUF_ARRAY);
    put_u64(&m, 2);
    put_u32(&m, BL_GGUF_ARRAY);
    put_u64(&m, 1);
    put_u32(&m, BL_GGUF_I32);
    put_u64(&m, 1);
    put_u32(&m, 7);
    put_u32(&m, BL_GGUF_ARRAY);
    put_u64(&m, 1);
    put_u32(&m, BL_GGUF_I32);
    put_u64(&m, 2);
    put_u32(&m, 8);
    put_u32(&m, 9);
    kv_str(&m, "t.after", "ok");
    img_counts(&m);

    bl_gguf_t *g = open_ok(&m, "nested.gguf");
    bl_err_t err;
    const bl_gguf_arr_t *a, *x, *y;
    bl_gguf_str_t s;
    int64_t v;

    assert_int_equal(bl_gguf_get_arr(g, "t.nested", &a, &err), 0);
    assert_int_equal(bl_gguf_arr_type(a), BL_GGUF_ARRAY);
    assert_int_equal(bl_gguf_arr_count(a), 3);
    assert_null(bl_gguf_arr_data(a));
    assert_int_equal(bl_gguf_arr_arr(a, 0, &x, &err), 0);
    assert_int_equal(bl_gguf_arr_count(x), 2);
    assert_int_equal(bl_gguf_arr_str(x, 1, &s, &err), 0);
    assert_int_equal(s.len, 2);
    assert_memory_equal(s.ptr, "bc", 2);
    assert_int_equal(bl_gguf_arr_arr(a, 1, &x, &err), 0);
    assert_int_equal(bl_gguf_arr_type(x), BL_GGUF_BOOL);
    assert_int_equal(bl_gguf_arr_count(x), 0);
    assert_int_equal(bl_gguf_arr_arr(a, 2, &x, &err), 0);
    assert_int_equal(bl_gguf_arr_str(x, 0, &s, &err), 0);
    assert_memory_equal(s.ptr, "def", 3);
    assert_int_equal(bl_gguf_arr_arr(a, 3, &x, &err), BL_ERANGE);
    assert_int_equal(bl_gguf_arr_i64(x, 0, &v, &err), BL_EINVAL);
    expect_in(err.msg, "t.nested");

    assert_int_equal(bl_gguf_get_arr(g, "t.deep", &a, &err), 0);
    assert_int_equal(bl_gguf_arr_arr(a, 1, &x, &err), 0);
    assert_int_equal(bl_gguf_arr_arr(x, 0, &y, &err), 0);
    assert_int_equal(bl_gguf_arr_count(y), 2);
    assert_int_equal(bl_gguf_arr_i64(y, 1, &v, &err), 0);
    assert_int_equal(v, 9);
    assert_int_equal(bl_gguf_arr_arr(a, 0, &x, &err), 0);
    assert_int_equal(bl_gguf_arr_arr(x, 0, &y, &err), 0);
    assert_int_equal(bl_gguf_arr_i64(y, 0, &v, &err), 0);
    assert_int_equal(v, 7);
    assert_ptr_equal(bl_gguf_arr_kv(y), bl_gguf_find_kv(g, "t.deep"));

    assert_int_equal(bl_gguf_get_str(g, "t.after", &s, &err), 0);
    assert_memory_equal(s.ptr, "ok", 2);
    bl_gguf_close(g);
    img_free(&m);
}

/* A vocabulary-sized string array: every element is reachable in O(1). */
static void test_gguf_reads_large_string_array(void **state)
{
    (void)state;
    enum { N = 151936 };
    img_t m;
    char tok[32];
    img_begin(&m, 3);
    kv_head(&m, "tokenizer.ggml.tokens", BL_GGUF_ARRAY);
    put_u32(&m, BL_GGUF_STRING);
    put_u64(&m, N);
    for (int i = 0; i < N; i++) {
        snprintf(tok, sizeof tok, "tok%d", i);
        put_str(&m, tok);
    }
    img_counts(&m);
    bl_gguf_t *g = open_ok(&m, "vocab.gguf");
    const bl_gguf_arr_t *a;
    bl_gguf_str_t s;
    bl_err_t err;
    assert_int_equal(bl_gguf_get_arr(g, "tokenizer.ggml.tokens", &a, &err), 0);
    assert_int_equal(bl_gguf_arr_count(a), N);
    for (int i = N - 1; i >= 0; i -= 997) {
        snprintf(tok, sizeof tok, "tok%d", i);
        assert_int_equal(bl_gguf_arr_str(a, (uint64_t)i, &s, &err), 0);
        assert_int_equal(s.len, strlen(tok));
        assert_memory_equal(s.ptr, tok, s.len);
    }
    bl_gguf_close(g);
    img_free(&m);
}

/* One part of a three-part model: part i (0-based) holds tensors named p<i>.t<j>. */
static void split_part(img_t *m, int i, int n_tensors_here, uint64_t total, int with_meta)
{
    img_begin(m, 3);
    if (i == 0)
        kv_str(m, "general.architecture", "test");
    if (with_meta) {
        kv_head(m, "split.no", BL_GGUF_U16);
        put_u16(m, (uint16_t)i);
        kv_head(m, "split.count", BL_GGUF_U16);
        put_u16(m, 3);
        kv_head(m, "split.tensors.count", BL_GGUF_I32);
        put_u32(m, (uint32_t)total);
    }
    char name[32];
    for (int j = 0; j < n_tensors_here; j++) {
        snprintf(name, sizeof name, "p%d.t%d", i, j);
        tinfo(m, name, 2, NE_8x2, BL_TYPE_F32, (uint64_t)j * 64);
    }
    img_data(m, 32, (size_t)n_tensors_here * 64);
    for (size_t k = m->data_start; k < m->n; k++)
        m->p[k] = (uint8_t)(k + (size_t)i * 31);
}

static void write_split(const int *counts, uint64_t total, int with_meta, int skip_part)
{
    char name[64];
    for (int i = 0; i < 3; i++) {
        img_t m;
        if (i == skip_part)
            continue;
        split_part(&m, i, counts[i], total, with_meta);
        snprintf(name, sizeof name, "split-%05d-of-00003.gguf", i + 1);
        write_file(name, m.p, m.n);
        img_free(&m);
    }
}

static void remove_split(void)
{
    char path[512];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/split-%05d-of-00003.gguf", tmpdir, i + 1);
        unlink(path);
    }
}

static void test_gguf_opens_split_model(void **state)
{
    (void)state;
    const int counts[3] = { 2, 0, 3 };
    char path[512];
    for (int meta = 0; meta < 2; meta++) {
        write_split(counts, 5, meta, -1);
        for (int given = 1; given <= 3; given += 2) {
            bl_gguf_t *g = NULL;
            bl_err_t err;
            snprintf(path, sizeof path, "%s/split-%05d-of-00003.gguf", tmpdir, given);
            int rc = bl_gguf_open(&g, path, &err);
            if (rc)
                print_error("%s\n", err.msg);
            assert_int_equal(rc, 0);
            assert_int_equal(bl_gguf_n_parts(g), 3);
            assert_int_equal(bl_gguf_n_tensors(g), 5);
            assert_non_null(bl_gguf_find_kv(g, "general.architecture"));
            assert_non_null(strstr(bl_gguf_part_path(g, 2), "split-00003-of-00003.gguf"));
            assert_null(bl_gguf_part_path(g, 3));
            const bl_gguf_tensor_t *t = bl_gguf_find_tensor(g, "p2.t1");
            assert_non_null(t);
            assert_int_equal(t->part, 2);
            assert_int_equal(t->offset, 64);
            /* Its bytes come from part 3's mapping. */
            img_t m;
            split_part(&m, 2, 3, 5, meta);
            assert_memory_equal(t->data, m.p + t->file_offset, 64);
            img_free(&m);
            assert_int_equal(bl_gguf_find_tensor(g, "p0.t0")->part, 0);
            assert_ptr_equal(bl_gguf_tensor_at(g, 2), bl_gguf_find_tensor(g, "p2.t0"));
            bl_gguf_close(g);
        }
        remove_split();
    }
}

/* --- broken files: the container ------------------------------------------------- */

static void test_gguf_rejects_nonexistent_path(void **state)
{
    (void)state;
    bl_gguf_t *g = NULL;
    bl_err_t err;
    char path[512];
    snprintf(path, sizeof path, "%s/nope.gguf", tmpdir);
    assert_int_equal(bl_gguf_open(&g, path, &err), BL_ENOENT);
    assert_null(g);
    expect_in(err.msg, "nope.gguf");
}

static void test_gguf_rejects_directory(void **state)
{
    (void)state;
    bl_gguf_t *g = NULL;
    bl_err_t err;
    char path[512];
    snprintf(path, sizeof path, "%s/dir.gguf", tmpdir);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(bl_gguf_open(&g, path, &err), BL_EINVAL);
    expect_in(err.msg, "dir.gguf");
    expect_in(err.msg, "directory");
    assert_int_equal(rmdir(path), 0);
}

static void test_gguf_rejects_empty_file(void **state)
{
    (void)state;
    img_t m = { 0 };
    m.p = malloc(1); /* a zero-byte image that still has a valid address */
    assert_non_null(m.p);
    expect_reject(&m, BL_EINVAL, "empty", NULL);
}

static void test_gguf_rejects_truncated_header(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    m.n = 14;
    expect_reject(&m, BL_EINVAL, "offset 8", "tensor count");
}

static void test_gguf_rejects_bad_magic(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 0);
    m.p[0] = 'F';
    expect_reject(&m, BL_EINVAL, "magic", NULL);
}

static void test_gguf_rejects_version_1(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 0);
    patch_u32(&m, 4, 1);
    expect_reject(&m, BL_ENOTSUP, "version 1", "offset 4");
}

static void test_gguf_rejects_big_endian(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 0);
    patch_u32(&m, 4, 0x03000000u);
    expect_reject(&m, BL_ENOTSUP, "big-endian", NULL);
}

static void test_gguf_rejects_unknown_version(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 0);
    patch_u32(&m, 4, 4);
    expect_reject(&m, BL_ENOTSUP, "version 4", NULL);
}

static void test_gguf_rejects_huge_kv_count(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 0);
    patch_u64(&m, 16, 1ull << 63);
    expect_reject(&m, BL_ERANGE, "key count 9223372036854775808", "offset 16");
}

static void test_gguf_rejects_huge_tensor_count(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 0);
    patch_u64(&m, 8, UINT64_MAX);
    expect_reject(&m, BL_ERANGE, "tensor count", "offset 8");
}

/* Every prefix of a good file fails cleanly (and never reads past it: ASan). */
static void test_gguf_rejects_every_truncation(void **state)
{
    (void)state;
    img_t m;
    good_model(&m, 64);
    for (size_t n = 0; n < m.n; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        bl_gguf_t *g = NULL;
        bl_err_t err = { 0 };
        memcpy(copy, m.p, n);
        int rc = bl_gguf_open_memory(&g, copy, n, "cut.gguf", &err);
        if (rc == 0)
            print_error("prefix of %zu bytes opened\n", n);
        assert_true(rc < 0);
        assert_non_null(strstr(err.msg, "cut.gguf"));
        free(copy);
    }
    img_free(&m);
}

/* --- broken files: metadata ------------------------------------------------------ */

static void test_gguf_rejects_string_past_eof(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "general.name", BL_GGUF_STRING);
    put_u64(&m, 1000);
    put(&m, "short", 5);
    img_counts(&m);
    expect_reject(&m, BL_ERANGE, "general.name", "length 1000");
}

static void test_gguf_rejects_key_past_eof(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    put_u64(&m, 40);
    put(&m, "general.name", 12);
    put_u32(&m, 0);
    m.n_kv = 1;
    img_counts(&m);
    expect_reject(&m, BL_ERANGE, "key length 40", "offset 24");
}

static void test_gguf_rejects_key_too_long(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    size_t n = BL_GGUF_MAX_KEY_LEN + 1;
    char *key = malloc(n + 1);
    memset(key, 'k', n);
    key[n] = '\0';
    kv_u32(&m, key, 1);
    free(key);
    img_counts(&m);
    expect_reject(&m, BL_ERANGE, "key length 65536", "limit");
}

static void test_gguf_rejects_empty_key(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_u32(&m, "", 1);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "empty", "offset 24");
}

static void test_gguf_rejects_key_with_nul(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    put_strn(&m, "a\0b", 3);
    put_u32(&m, BL_GGUF_U8);
    put_u8(&m, 1);
    m.n_kv = 1;
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "a\\x00b", "NUL");
}

static void test_gguf_rejects_unknown_value_type(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "general.odd", 13);
    put_u32(&m, 0);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "general.odd", "unknown value type 13");
}

static void test_gguf_rejects_unknown_array_type(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "t.arr", BL_GGUF_ARRAY);
    put_u32(&m, 99);
    put_u64(&m, 1);
    put_u32(&m, 0);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "t.arr", "element type 99");
}

static void test_gguf_rejects_huge_array_count(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "tokenizer.ggml.tokens", BL_GGUF_ARRAY);
    put_u32(&m, BL_GGUF_STRING);
    put_u64(&m, 1ull << 62);
    put_str(&m, "a");
    img_counts(&m);
    expect_reject(&m, BL_ERANGE, "tokenizer.ggml.tokens", "4611686018427387904");
}

static void test_gguf_rejects_string_element_past_eof(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "tokenizer.ggml.tokens", BL_GGUF_ARRAY);
    put_u32(&m, BL_GGUF_STRING);
    put_u64(&m, 2);
    put_str(&m, "a");
    put_u64(&m, 99);
    put(&m, "0123456789", 10);
    img_counts(&m);
    expect_reject(&m, BL_ERANGE, "tokenizer.ggml.tokens", "length 99");
}

static void test_gguf_rejects_arrays_nested_too_deep(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "t.deep", BL_GGUF_ARRAY);
    for (unsigned d = 0; d < BL_GGUF_MAX_DEPTH; d++) {
        put_u32(&m, BL_GGUF_ARRAY);
        put_u64(&m, 1);
    }
    put_u32(&m, BL_GGUF_U8);
    put_u64(&m, 0);
    img_counts(&m);
    expect_reject(&m, BL_ERANGE, "t.deep", "nested deeper");
}

static void test_gguf_rejects_bad_bool(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "t.flag", BL_GGUF_BOOL);
    put_u8(&m, 2);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "t.flag", "bool");
}

static void test_gguf_rejects_duplicate_keys(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_u32(&m, "t.a", 1);
    kv_u32(&m, "t.b", 1);
    kv_u32(&m, "t.a", 2);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "'t.a'", "duplicate");
}

static void test_gguf_rejects_alignment_zero(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_u32(&m, "general.alignment", 0);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "general.alignment", "power of two");
}

static void test_gguf_rejects_alignment_not_power_of_two(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_u32(&m, "general.alignment", 48);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "general.alignment", "48");
}

static void test_gguf_rejects_alignment_wrong_type(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "general.alignment", BL_GGUF_U64);
    put_u64(&m, 32);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "general.alignment", "u64");
}

/* --- broken files: tensors ------------------------------------------------------- */

/* One tensor "bad.weight" with the given shape, type and offset, plus data bytes. */
static void one_tensor(img_t *m, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off,
                       size_t data)
{
    img_begin(m, 3);
    kv_str(m, "general.architecture", "test");
    tinfo(m, "bad.weight", n_dims, ne, type, off);
    img_data(m, 32, data);
}

static void test_gguf_rejects_unknown_tensor_type(void **state)
{
    (void)state;
    img_t m;
    one_tensor(&m, 2, NE_8x2, 4 /* a retired id */, 0, 64);
    expect_reject(&m, BL_ENOTSUP, "bad.weight", "type id 4");
    one_tensor(&m, 2, NE_8x2, 1000, 0, 64);
    expect_reject(&m, BL_ENOTSUP, "bad.weight", "type id 1000");
}

static void test_gguf_rejects_zero_dims(void **state)
{
    (void)state;
    img_t m;
    one_tensor(&m, 0, NE_8x2, BL_TYPE_F32, 0, 64);
    expect_reject(&m, BL_EINVAL, "bad.weight", "n_dims is 0");
}

static void test_gguf_rejects_too_many_dims(void **state)
{
    (void)state;
    img_t m;
    const int64_t ne[5] = { 1, 1, 1, 1, 1 };
    one_tensor(&m, 5, ne, BL_TYPE_F32, 0, 64);
    expect_reject(&m, BL_EINVAL, "bad.weight", "n_dims is 5");
}

static void test_gguf_rejects_zero_dim(void **state)
{
    (void)state;
    img_t m;
    const int64_t ne[2] = { 8, 0 };
    one_tensor(&m, 2, ne, BL_TYPE_F32, 0, 64);
    expect_reject(&m, BL_EINVAL, "bad.weight", "dimension 1 is 0");
}

static void test_gguf_rejects_negative_dim(void **state)
{
    (void)state;
    img_t m;
    const int64_t ne[2] = { -8, 2 };
    one_tensor(&m, 2, ne, BL_TYPE_F32, 0, 64);
    expect_reject(&m, BL_EINVAL, "bad.weight", "dimension 0");
}

static void test_gguf_rejects_dims_product_overflow(void **state)
{
    (void)state;
    img_t m;
    const int64_t ne[3] = { 1 << 20, 1 << 22, 1 << 22 };
    one_tensor(&m, 3, ne, BL_TYPE_F32, 0, 64);
    expect_reject(&m, BL_ERANGE, "bad.weight", "overflows");
}

static void test_gguf_rejects_row_not_block_multiple(void **state)
{
    (void)state;
    img_t m;
    const int64_t ne[2] = { 100, 2 };
    one_tensor(&m, 2, ne, BL_TYPE_Q4_K, 0, 64);
    expect_reject(&m, BL_EINVAL, "bad.weight", "block size 256");
}

static void test_gguf_rejects_byte_size_overflow(void **state)
{
    (void)state;
    img_t m;
    /* 2^62 f32 elements fit int64, their 2^64 bytes do not fit uint64. */
    const int64_t ne[2] = { 1ll << 31, 1ll << 31 };
    one_tensor(&m, 2, ne, BL_TYPE_F32, 0, 64);
    expect_reject(&m, BL_ERANGE, "bad.weight", NULL);
}

static void test_gguf_rejects_tensor_past_eof(void **state)
{
    (void)state;
    img_t m;
    one_tensor(&m, 2, NE_8x2, BL_TYPE_F32, 0, 63);
    expect_reject(&m, BL_ERANGE, "bad.weight", "past the end");
    one_tensor(&m, 2, NE_8x2, BL_TYPE_F32, UINT64_MAX - 31, 64);
    expect_reject(&m, BL_ERANGE, "bad.weight", "past the end");
}

static void test_gguf_rejects_misaligned_offset(void **state)
{
    (void)state;
    img_t m;
    one_tensor(&m, 2, NE_8x2, BL_TYPE_F32, 16, 96);
    expect_reject(&m, BL_EINVAL, "bad.weight", "alignment 32");
}

static void test_gguf_rejects_overlapping_tensors(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    tinfo(&m, "first.weight", 2, NE_8x2, BL_TYPE_F32, 64);
    tinfo(&m, "second.weight", 2, NE_8x2, BL_TYPE_F32, 96);
    tinfo(&m, "zero.weight", 2, NE_8x2, BL_TYPE_F32, 0);
    img_data(&m, 32, 192);
    expect_reject(&m, BL_EINVAL, "second.weight", "first.weight");
}

static void test_gguf_rejects_duplicate_tensor_names(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    tinfo(&m, "same.weight", 2, NE_8x2, BL_TYPE_F32, 0);
    tinfo(&m, "same.weight", 2, NE_8x2, BL_TYPE_F32, 64);
    img_data(&m, 32, 128);
    expect_reject(&m, BL_EINVAL, "same.weight", "duplicate");
}

static void test_gguf_rejects_empty_tensor_name(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    tinfo(&m, "", 2, NE_8x2, BL_TYPE_F32, 0);
    img_data(&m, 32, 64);
    expect_reject(&m, BL_EINVAL, "empty name", NULL);
}

static void test_gguf_rejects_tensor_name_past_eof(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    put_u64(&m, 1ull << 40);
    put(&m, "abcdefghijklmnopqrstuvwxyz0123456789", 36);
    m.n_t = 1;
    img_counts(&m);
    expect_reject(&m, BL_ERANGE, "tensor name length 1099511627776", "offset 24");
}

/* --- broken split models --------------------------------------------------------- */

static void expect_split_reject(int code, const char *needle1, const char *needle2)
{
    bl_gguf_t *g = NULL;
    bl_err_t err = { 0 };
    char path[512];
    snprintf(path, sizeof path, "%s/split-00001-of-00003.gguf", tmpdir);
    int rc = bl_gguf_open(&g, path, &err);
    if (rc != code)
        print_error("got %d, message: %s\n", rc, err.msg);
    assert_int_equal(rc, code);
    assert_null(g);
    expect_in(err.msg, needle1);
    expect_in(err.msg, needle2);
    remove_split();
}

static void test_gguf_rejects_missing_split_part(void **state)
{
    (void)state;
    const int counts[3] = { 1, 1, 1 };
    write_split(counts, 3, 1, 1);
    expect_split_reject(BL_ENOENT, "split-00002-of-00003.gguf", "missing split part 2 of 3");
}

static void test_gguf_rejects_split_no_mismatch(void **state)
{
    (void)state;
    const int counts[3] = { 1, 1, 1 };
    write_split(counts, 3, 1, 1);
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "split.no", BL_GGUF_U16);
    put_u16(&m, 2); /* part 2 is split.no 1 */
    tinfo(&m, "p1.t0", 2, NE_8x2, BL_TYPE_F32, 0);
    img_data(&m, 32, 64);
    write_file("split-00002-of-00003.gguf", m.p, m.n);
    img_free(&m);
    expect_split_reject(BL_EINVAL, "split.no", "split-00002-of-00003.gguf");
}

static void test_gguf_rejects_split_count_mismatch(void **state)
{
    (void)state;
    const int counts[3] = { 1, 1, 1 };
    write_split(counts, 3, 1, -1);
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "split.count", BL_GGUF_U16);
    put_u16(&m, 4);
    tinfo(&m, "p1.t0", 2, NE_8x2, BL_TYPE_F32, 0);
    img_data(&m, 32, 64);
    write_file("split-00002-of-00003.gguf", m.p, m.n);
    img_free(&m);
    expect_split_reject(BL_EINVAL, "split.count", "is 4");
}

static void test_gguf_rejects_split_tensor_count_mismatch(void **state)
{
    (void)state;
    const int counts[3] = { 1, 2, 1 };
    write_split(counts, 5, 1, -1);
    expect_split_reject(BL_EINVAL, "split.tensors.count", "is 5");
}

static void test_gguf_rejects_duplicate_tensor_across_parts(void **state)
{
    (void)state;
    const int counts[3] = { 1, 1, 1 };
    write_split(counts, 3, 0, -1);
    img_t m;
    img_begin(&m, 3);
    tinfo(&m, "p0.t0", 2, NE_8x2, BL_TYPE_F32, 0);
    img_data(&m, 32, 64);
    write_file("split-00003-of-00003.gguf", m.p, m.n);
    img_free(&m);
    expect_split_reject(BL_EINVAL, "p0.t0", "duplicate");
}

static void test_gguf_rejects_split_count_without_split_name(void **state)
{
    (void)state;
    img_t m;
    img_begin(&m, 3);
    kv_head(&m, "split.count", BL_GGUF_U16);
    put_u16(&m, 3);
    img_counts(&m);
    expect_reject(&m, BL_EINVAL, "split.count", "NAME-");
}

/* --- allocation failure ---------------------------------------------------------- */

/* Every allocation open makes is made to fail in turn: each failure is BL_ENOMEM with
 * nothing leaked (LeakSanitizer), and with enough allocations the open succeeds. */
static void test_gguf_open_survives_allocation_failure(void **state)
{
    (void)state;
    const int counts[3] = { 2, 1, 2 };
    char path[512];
    write_split(counts, 5, 1, -1);
    snprintf(path, sizeof path, "%s/split-00001-of-00003.gguf", tmpdir);
    int opened = 0;
    for (long budget = 0; budget < 1000 && !opened; budget++) {
        bl_gguf_t *g = NULL;
        bl_err_t err = { 0 };
        alloc_budget = budget;
        int rc = bl_gguf_open(&g, path, &err);
        alloc_budget = -1;
        if (rc == 0) {
            assert_int_equal(bl_gguf_n_tensors(g), 5);
            bl_gguf_close(g);
            opened = 1;
        } else {
            if (rc != BL_ENOMEM)
                print_error("budget %ld: %s\n", budget, err.msg);
            assert_int_equal(rc, BL_ENOMEM);
            assert_null(g);
        }
    }
    assert_true(opened);
    remove_split();
}

/* --- the shared tiny model ------------------------------------------------------- */

static void test_gguf_opens_shared_tiny_model(void **state)
{
    (void)state;
    char path[1024];
    const char *shared = getenv("BLOOMERY_SHARED");
    if (shared && *shared)
        snprintf(path, sizeof path, "%s/models/qwen3moe-tiny-q4k.gguf", shared);
    else
        snprintf(path, sizeof path, "%s/../shared/models/qwen3moe-tiny-q4k.gguf", BL_SOURCE_ROOT);
    if (access(path, R_OK) != 0) {
        print_message("skipped: %s is absent\n", path);
        skip();
    }
    bl_gguf_t *g = NULL;
    bl_err_t err;
    bl_gguf_str_t arch;
    int rc = bl_gguf_open(&g, path, &err);
    if (rc)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(bl_gguf_n_tensors(g), 51);
    assert_int_equal(bl_gguf_get_str(g, "general.architecture", &arch, &err), 0);
    assert_int_equal(arch.len, 8);
    assert_memory_equal(arch.ptr, "qwen3moe", 8);
    const bl_gguf_arr_t *tokens;
    assert_int_equal(bl_gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens, &err), 0);
    assert_int_equal(bl_gguf_arr_type(tokens), BL_GGUF_STRING);
    assert_true(bl_gguf_arr_count(tokens) > 1000);
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        assert_ptr_equal(bl_gguf_find_tensor(g, t->name), t);
        assert_true(t->file_offset + t->nbytes <= bl_gguf_part_size(g, 0));
    }
    bl_gguf_close(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_opens_default_alignment),
        cmocka_unit_test(test_gguf_opens_alignment_64),
        cmocka_unit_test(test_gguf_maps_the_file_shared),
        cmocka_unit_test(test_gguf_opens_memory),
        cmocka_unit_test(test_gguf_opens_version_2_and_no_tensors),
        cmocka_unit_test(test_gguf_reads_every_value_type),
        cmocka_unit_test(test_gguf_reads_nested_arrays),
        cmocka_unit_test(test_gguf_reads_large_string_array),
        cmocka_unit_test(test_gguf_opens_split_model),
        cmocka_unit_test(test_gguf_rejects_nonexistent_path),
        cmocka_unit_test(test_gguf_rejects_directory),
        cmocka_unit_test(test_gguf_rejects_empty_file),
        cmocka_unit_test(test_gguf_rejects_truncated_header),
        cmocka_unit_test(test_gguf_rejects_bad_magic),
        cmocka_unit_test(test_gguf_rejects_version_1),
        cmocka_unit_test(test_gguf_rejects_big_endian),
        cmocka_unit_test(test_gguf_rejects_unknown_version),
        cmocka_unit_test(test_gguf_rejects_huge_kv_count),
        cmocka_unit_test(test_gguf_rejects_huge_tensor_count),
        cmocka_unit_test(test_gguf_rejects_every_truncation),
        cmocka_unit_test(test_gguf_rejects_string_past_eof),
        cmocka_unit_test(test_gguf_rejects_key_past_eof),
        cmocka_unit_test(test_gguf_rejects_key_too_long),
        cmocka_unit_test(test_gguf_rejects_empty_key),
        cmocka_unit_test(test_gguf_rejects_key_with_nul),
        cmocka_unit_test(test_gguf_rejects_unknown_value_type),
        cmocka_unit_test(test_gguf_rejects_unknown_array_type),
        cmocka_unit_test(test_gguf_rejects_huge_array_count),
        cmocka_unit_test(test_gguf_rejects_string_element_past_eof),
        cmocka_unit_test(test_gguf_rejects_arrays_nested_too_deep),
        cmocka_unit_test(test_gguf_rejects_bad_bool),
        cmocka_unit_test(test_gguf_rejects_duplicate_keys),
        cmocka_unit_test(test_gguf_rejects_alignment_zero),
        cmocka_unit_test(test_gguf_rejects_alignment_not_power_of_two),
        cmocka_unit_test(test_gguf_rejects_alignment_wrong_type),
        cmocka_unit_test(test_gguf_rejects_unknown_tensor_type),
        cmocka_unit_test(test_gguf_rejects_zero_dims),
        cmocka_unit_test(test_gguf_rejects_too_many_dims),
        cmocka_unit_test(test_gguf_rejects_zero_dim),
        cmocka_unit_test(test_gguf_rejects_negative_dim),
        cmocka_unit_test(test_gguf_rejects_dims_product_overflow),
        cmocka_unit_test(test_gguf_rejects_row_not_block_multiple),
        cmocka_unit_test(test_gguf_rejects_byte_size_overflow),
        cmocka_unit_test(test_gguf_rejects_tensor_past_eof),
        cmocka_unit_test(test_gguf_rejects_misaligned_offset),
        cmocka_unit_test(test_gguf_rejects_overlapping_tensors),
        cmocka_unit_test(test_gguf_rejects_duplicate_tensor_names),
        cmocka_unit_test(test_gguf_rejects_empty_tensor_name),
        cmocka_unit_test(test_gguf_rejects_tensor_name_past_eof),
        cmocka_unit_test(test_gguf_rejects_missing_split_part),
        cmocka_unit_test(test_gguf_rejects_split_no_mismatch),
        cmocka_unit_test(test_gguf_rejects_split_count_mismatch),
        cmocka_unit_test(test_gguf_rejects_split_tensor_count_mismatch),
        cmocka_unit_test(test_gguf_rejects_duplicate_tensor_across_parts),
        cmocka_unit_test(test_gguf_rejects_split_count_without_split_name),
        cmocka_unit_test(test_gguf_open_survives_allocation_failure),
        cmocka_unit_test(test_gguf_opens_shared_tiny_model),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
