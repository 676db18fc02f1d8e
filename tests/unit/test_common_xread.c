/* common/xread.c: the disk tier's reader. Random ranges of a random file (a fresh
 * seed each run, printed; BLOOMERY_TEST_SEED replays) through pread and io_uring,
 * with and without O_DIRECT and registered buffers, compared with the file's bytes;
 * a stand-in for pread that fails, returns short reads, EINTR and early ends; bad
 * requests; and a file changed, replaced or removed under the reader. io_uring tests
 * skip, with the system's reason, where it is refused. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "xread.h"

static char g_dir[256];
static char g_path[300];
static uint8_t *g_bytes; /* the file's content */
static size_t g_size;
static uint64_t g_rng;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static void write_bytes(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static int setup(void **state)
{
    (void)state;
    const char *seed = getenv("BLOOMERY_TEST_SEED");
    g_rng = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    if (!g_rng)
        g_rng = 1;
    printf("# seed %llu (BLOOMERY_TEST_SEED replays it)\n", (unsigned long long)g_rng);
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/bl_xread_XXXXXX", base && *base ? base : "/var/tmp");
    if (!mkdtemp(g_dir)) {
        snprintf(g_dir, sizeof g_dir, "/tmp/bl_xread_XXXXXX");
        if (!mkdtemp(g_dir))
            return -1;
    }
    snprintf(g_path, sizeof g_path, "%s/experts.bin", g_dir);
    g_size = (1u << 20) + 4096 * 3 + 123; /* not a whole block: the last read ends early */
    g_bytes = malloc(g_size);
    if (!g_bytes)
        return -1;
    for (size_t i = 0; i < g_size; i++)
        g_bytes[i] = (uint8_t)rnd();
    write_bytes(g_path, g_bytes, g_size);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_path);
    char p[400];
    snprintf(p, sizeof p, "%s/other.bin", g_dir);
    unlink(p);
    rmdir(g_dir);
    free(g_bytes);
    return 0;
}

static int open_reader(bl_xr_t **x, int kind, int direct, int depth, bl_err_t *err)
{
    const char *paths[1] = {g_path};
    bl_xr_opts_t o = {.kind = kind, .direct = direct, .depth = depth};
    return bl_xr_open(x, paths, 1, &o, err);
}

/* n random ranges (some at the file's ends, some one byte) through x into
 * buffers of the alignment it asks, each compared with the file. */
static void check_random_reads(bl_xr_t *x, int n, uint8_t *arena, size_t arena_cap)
{
    const size_t al = bl_xr_mem_align(x) > 64 ? bl_xr_mem_align(x) : 64;
    bl_xr_req_t *r = calloc((size_t)n, sizeof *r);
    uint8_t **own = calloc((size_t)n, sizeof *own);
    assert_non_null(r);
    assert_non_null(own);
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        const int shape = (int)(rnd() % 4);
        size_t len = shape == 0 ? 1 : shape == 1 ? 1 + rnd() % 300000 : 1 + rnd() % 9000;
        if (len > g_size)
            len = g_size;
        uint64_t off = shape == 3 ? g_size - len : rnd() % (g_size - len + 1);
        r[i] = (bl_xr_req_t){.file = 0, .off = off, .len = len};
        const size_t span = bl_xr_span(x, 0, off, len);
        r[i].cap = span + (rnd() % 2) * 512;
        if (arena && used + r[i].cap <= arena_cap) {
            r[i].buf = arena + used;
            used = (used + r[i].cap + al - 1) / al * al;
        } else {
            void *p = NULL;
            assert_int_equal(posix_memalign(&p, al, r[i].cap), 0);
            own[i] = r[i].buf = p;
        }
    }
    bl_err_t err = {0};
    const int rc = bl_xr_read(x, r, n, &err);
    if (rc)
        print_error("read: %s\n", err.msg);
    assert_int_equal(rc, 0);
    for (int i = 0; i < n; i++) {
        assert_non_null(r[i].data);
        assert_true(r[i].data >= r[i].buf && r[i].data + r[i].len <= r[i].buf + r[i].cap);
        assert_memory_equal(r[i].data, g_bytes + r[i].off, r[i].len);
        free(own[i]);
    }
    free(own);
    free(r);
}

static void test_pread_reads_random_ranges(void **state)
{
    (void)state;
    bl_xr_t *x = NULL;
    bl_err_t err = {0};
    assert_int_equal(open_reader(&x, BL_XR_PREAD, 0, 0, &err), 0);
    assert_string_equal(bl_xr_backend(x), "pread");
    assert_int_equal(bl_xr_direct(x, 0), 0);
    assert_int_equal(bl_xr_file_size(x, 0), g_size);
    check_random_reads(x, 64, NULL, 0);
    bl_xr_close(x);
}

static void test_pread_direct_reads_random_ranges(void **state)
{
    (void)state;
    bl_xr_t *x = NULL;
    bl_err_t err = {0};
    assert_int_equal(open_reader(&x, BL_XR_PREAD, 1, 0, &err), 0);
    if (!bl_xr_direct(x, 0))
        printf("# O_DIRECT refused on %s: the page-cache path runs instead\n", g_dir);
    else
        assert_true(bl_xr_mem_align(x) >= 512);
    check_random_reads(x, 64, NULL, 0);
    bl_xr_close(x);
}

/* io_uring, or the test skips with the reason the system gave. */
static bl_xr_t *uring_or_skip(int direct, int depth)
{
    bl_xr_t *x = NULL;
    bl_err_t err = {0};
    const int rc = open_reader(&x, BL_XR_URING, direct, depth, &err);
    if (rc == BL_ENOTSUP) {
        printf("# %s: io_uring tests skip\n", err.msg);
        return NULL;
    }
    if (rc)
        print_error("open: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_string_equal(bl_xr_backend(x), "io_uring");
    return x;
}

static void test_uring_reads_random_ranges(void **state)
{
    (void)state;
    bl_xr_t *x = uring_or_skip(0, 4);
    if (!x)
        skip();
    check_random_reads(x, 100, NULL, 0); /* 100 reads, 4 in flight */
    bl_xr_close(x);
}

static void test_uring_direct_registered_reads(void **state)
{
    (void)state;
    bl_xr_t *x = uring_or_skip(1, 16);
    if (!x)
        skip();
    const size_t cap = 8u << 20;
    void *arena = NULL;
    assert_int_equal(posix_memalign(&arena, 4096, cap), 0);
    bl_err_t err = {0};
    assert_int_equal(bl_xr_register(x, arena, cap, &err), 0);
    check_random_reads(x, 48, arena, cap);
    /* and again after the region is replaced by another */
    assert_int_equal(bl_xr_register(x, arena, cap / 2, &err), 0);
    check_random_reads(x, 48, arena, cap / 2);
    bl_xr_close(x);
    free(arena);
}

static void test_auto_picks_a_backend_and_reads(void **state)
{
    (void)state;
    bl_xr_t *x = NULL;
    bl_err_t err = {0};
    assert_int_equal(open_reader(&x, BL_XR_AUTO, 1, 0, &err), 0);
    printf("# auto: %s, O_DIRECT %d\n", bl_xr_backend(x), bl_xr_direct(x, 0));
    check_random_reads(x, 32, NULL, 0);
    bl_xr_close(x);
}

static void test_bad_requests_are_named(void **state)
{
    (void)state;
    for (int kind = BL_XR_AUTO; kind <= BL_XR_PREAD; kind += 2) {
        bl_xr_t *x = NULL;
        bl_err_t err = {0};
        assert_int_equal(open_reader(&x, kind, 1, 0, &err), 0);
        void *p = NULL;
        assert_int_equal(posix_memalign(&p, 4096, 3 * 4096), 0);
        bl_xr_req_t r = {.file = 1, .off = 0, .len = 10, .buf = p, .cap = 3 * 4096};
        assert_int_equal(bl_xr_read(x, &r, 1, &err), BL_EINVAL);
        assert_non_null(strstr(err.msg, "file 1"));
        r = (bl_xr_req_t){.file = 0, .off = g_size - 5, .len = 10, .buf = p, .cap = 3 * 4096};
        assert_int_equal(bl_xr_read(x, &r, 1, &err), BL_ERANGE);
        assert_non_null(strstr(err.msg, g_path));
        assert_non_null(strstr(err.msg, "offset"));
        r = (bl_xr_req_t){.file = 0, .off = 100, .len = 8000, .buf = p, .cap = 4000};
        assert_int_equal(bl_xr_read(x, &r, 1, &err), BL_EINVAL);
        assert_non_null(strstr(err.msg, "buffer"));
        r = (bl_xr_req_t){.file = 0, .off = 100, .len = 0, .buf = p, .cap = 4096};
        assert_int_equal(bl_xr_read(x, &r, 1, &err), BL_ERANGE);
        if (bl_xr_mem_align(x) > 1) {
            r = (bl_xr_req_t){.file = 0, .off = 0, .len = 10, .buf = (uint8_t *)p + 1, .cap = 2 * 4096};
            assert_int_equal(bl_xr_read(x, &r, 1, &err), BL_EINVAL);
            assert_non_null(strstr(err.msg, "aligned"));
        }
        assert_int_equal(bl_xr_read(x, NULL, 0, &err), 0);
        free(p);
        bl_xr_close(x);
    }
}

static void test_open_errors_are_named(void **state)
{
    (void)state;
    bl_xr_t *x = NULL;
    bl_err_t err = {0};
    char missing[400];
    snprintf(missing, sizeof missing, "%s/nope.bin", g_dir);
    const char *paths[2] = {g_path, missing};
    assert_int_equal(bl_xr_open(&x, paths, 2, NULL, &err), BL_ENOENT);
    assert_null(x);
    assert_non_null(strstr(err.msg, "nope.bin"));
    const char *dir[1] = {g_dir};
    assert_int_equal(bl_xr_open(&x, dir, 1, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "regular"));
    bl_xr_opts_t o = {.depth = 1000};
    assert_int_equal(bl_xr_open(&x, paths, 1, &o, &err), BL_EINVAL);
    assert_int_equal(bl_xr_open(&x, paths, 0, NULL, &err), BL_EINVAL);
    o = (bl_xr_opts_t){.kind = 7};
    assert_int_equal(bl_xr_open(&x, paths, 1, &o, &err), BL_EINVAL);
}

/* --- a stand-in for the disk ------------------------------------------------------ */

enum { FAKE_FULL, FAKE_SHORT, FAKE_EINTR, FAKE_EIO_AT, FAKE_ENDS_AT };

typedef struct fake {
    int mode;
    uint64_t at; /* FAKE_EIO_AT, FAKE_ENDS_AT: the offset where it goes wrong */
    int calls;
} fake_t;

static ssize_t fake_pread(void *ctx, int file, void *buf, size_t n, uint64_t off)
{
    fake_t *f = ctx;
    f->calls++;
    assert_int_equal(file, 0);
    uint64_t end = f->mode == FAKE_ENDS_AT ? f->at : g_size;
    if (f->mode == FAKE_EIO_AT && off <= f->at && f->at < off + n) {
        errno = EIO;
        return -1;
    }
    if (f->mode == FAKE_EINTR && f->calls % 2) {
        errno = EINTR;
        return -1;
    }
    if (off >= end)
        return 0;
    size_t k = n < end - off ? n : (size_t)(end - off);
    if (f->mode == FAKE_SHORT && k > 1)
        k = 1 + (size_t)(rnd() % k);
    memcpy(buf, g_bytes + off, k);
    return (ssize_t)k;
}

static bl_xr_t *fake_reader(fake_t *f)
{
    const char *paths[1] = {g_path};
    bl_xr_opts_t o = {.kind = BL_XR_AUTO, .direct = 1, .fake = fake_pread, .fake_ctx = f};
    bl_xr_t *x = NULL;
    bl_err_t err = {0};
    assert_int_equal(bl_xr_open(&x, paths, 1, &o, &err), 0);
    assert_string_equal(bl_xr_backend(x), "pread");
    assert_int_equal(bl_xr_direct(x, 0), 0);
    return x;
}

static void test_short_reads_and_eintr_are_continued(void **state)
{
    (void)state;
    fake_t f = {.mode = FAKE_SHORT};
    bl_xr_t *x = fake_reader(&f);
    check_random_reads(x, 40, NULL, 0);
    assert_true(f.calls > 40);
    bl_xr_close(x);
    f = (fake_t){.mode = FAKE_EINTR};
    x = fake_reader(&f);
    check_random_reads(x, 10, NULL, 0);
    bl_xr_close(x);
}

static void test_read_error_names_file_and_offset(void **state)
{
    (void)state;
    fake_t f = {.mode = FAKE_EIO_AT, .at = 500000};
    bl_xr_t *x = fake_reader(&f);
    uint8_t *buf = malloc(200000);
    bl_xr_req_t r[2] = {{.file = 0, .off = 1000, .len = 5000, .buf = buf, .cap = 100000},
                        {.file = 0, .off = 450000, .len = 90000, .buf = buf + 100000, .cap = 100000}};
    bl_err_t err = {0};
    assert_int_equal(bl_xr_read(x, r, 2, &err), BL_EIO);
    assert_non_null(strstr(err.msg, g_path));
    assert_non_null(strstr(err.msg, "offset 450000"));
    assert_non_null(strstr(err.msg, "Input/output error"));
    assert_null(r[1].data);
    bl_xr_close(x);

    f = (fake_t){.mode = FAKE_ENDS_AT, .at = 460000};
    x = fake_reader(&f);
    assert_int_equal(bl_xr_read(x, r, 2, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "short read"));
    assert_non_null(strstr(err.msg, "offset 450000"));
    assert_non_null(strstr(err.msg, "10000 of 90000"));
    bl_xr_close(x);
    free(buf);
}

/* A file changed under the reader is noticed: its size, its time, a new file at the
 * path, or none. */
static void test_changed_file_is_noticed(void **state)
{
    (void)state;
    char other[400];
    snprintf(other, sizeof other, "%s/other.bin", g_dir);
    write_bytes(other, g_bytes, 5000);
    const char *paths[2] = {g_path, other};
    bl_xr_t *x = NULL;
    bl_err_t err = {0};
    assert_int_equal(bl_xr_open(&x, paths, 2, NULL, &err), 0);
    assert_int_equal(bl_xr_check(x, &err), 0);

    FILE *f = fopen(other, "ab"); /* grows */
    assert_non_null(f);
    fputc('x', f);
    fclose(f);
    assert_int_equal(bl_xr_check(x, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "other.bin"));
    assert_non_null(strstr(err.msg, "size"));
    bl_xr_close(x);

    assert_int_equal(bl_xr_open(&x, paths, 2, NULL, &err), 0);
    struct timespec ts[2] = {{.tv_sec = 1000000, .tv_nsec = 0}, {.tv_sec = 1000000, .tv_nsec = 0}};
    assert_int_equal(utimensat(AT_FDCWD, other, ts, 0), 0); /* same size, new time */
    assert_int_equal(bl_xr_check(x, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "modified"));
    bl_xr_close(x);

    assert_int_equal(bl_xr_open(&x, paths, 2, NULL, &err), 0);
    char tmp[420];
    snprintf(tmp, sizeof tmp, "%s.new", other);
    write_bytes(tmp, g_bytes, 5001);
    assert_int_equal(rename(tmp, other), 0); /* replaced */
    assert_int_equal(bl_xr_check(x, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "replaced"));
    unlink(other); /* gone */
    assert_int_equal(bl_xr_check(x, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "gone"));
    bl_xr_close(x);
    bl_xr_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pread_reads_random_ranges),
        cmocka_unit_test(test_pread_direct_reads_random_ranges),
        cmocka_unit_test(test_uring_reads_random_ranges),
        cmocka_unit_test(test_uring_direct_registered_reads),
        cmocka_unit_test(test_auto_picks_a_backend_and_reads),
        cmocka_unit_test(test_bad_requests_are_named),
        cmocka_unit_test(test_open_errors_are_named),
        cmocka_unit_test(test_short_reads_and_eintr_are_continued),
        cmocka_unit_test(test_read_error_names_file_and_offset),
        cmocka_unit_test(test_changed_file_is_noticed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
