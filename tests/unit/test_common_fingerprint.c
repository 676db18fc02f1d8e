/* Tests of common/fingerprint.c: one file, one fingerprint; a byte changed in the
 * header or in a sampled block of the data changes it, one between the samples does
 * not (the price of not reading the whole file); truncated, missing and non-GGUF
 * files are refused with the path named. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fingerprint.h"
#include "gguf.h"
#include "gguf_writer.h"

#define BIG_FLOATS ((int64_t)2 << 20)  /* 8 MiB of data: sampled */
#define SMALL_FLOATS ((int64_t)4096)   /* 16 KiB: hashed whole */

static char g_dir[64];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

static int fill(void *ud, bl_gguf_writer_t *w, size_t i, bl_err_t *err)
{
    (void)ud;
    const uint64_t n = bl_gw_tensor_nbytes(w, i);
    static uint8_t buf[1 << 16];
    for (uint64_t at = 0; at < n;) {
        const size_t k = n - at < sizeof buf ? (size_t)(n - at) : sizeof buf;
        for (size_t j = 0; j < k; j++)
            buf[j] = (uint8_t)((at + j) * 31u + 7u);
        int rc = bl_gw_write_data(w, buf, k, err);
        if (rc)
            return rc;
        at += k;
    }
    return 0;
}

/* A GGUF with one f32 tensor of n floats and general.name "fp-model". */
static void make_model(const char *path, int64_t n)
{
    bl_gguf_writer_t *w = NULL;
    bl_err_t err = {0};
    assert_int_equal(bl_gw_create(&w, &err), 0);
    assert_int_equal(bl_gw_set_str(w, "general.name", "fp-model", &err), 0);
    const int64_t ne[1] = {n};
    assert_int_equal(bl_gw_add_tensor(w, "weights", BL_TYPE_F32, 1, ne, &err), 0);
    assert_int_equal(bl_gw_write_file(w, path, fill, NULL, &err), 0);
    bl_gw_destroy(w);
}

static uint64_t file_size(const char *path)
{
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return (uint64_t)sb.st_size;
}

static uint64_t data_offset(const char *path)
{
    bl_gguf_t *g = NULL;
    bl_err_t err = {0};
    assert_int_equal(bl_gguf_open(&g, path, &err), 0);
    const uint64_t off = bl_gguf_data_offset(g, 0);
    bl_gguf_close(g);
    return off;
}

static void copy_file(const char *from, const char *to)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

/* Adds 1 to the byte at off. */
static void bump_byte(const char *path, uint64_t off)
{
    const int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b = 0;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b++;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

static void fingerprint_ok(const char *path, uint8_t fp[BL_FINGERPRINT_BYTES])
{
    uint64_t size = 0;
    bl_err_t err = {0};
    assert_int_equal(bl_model_fingerprint(path, fp, &size, &err), 0);
    assert_int_equal(size, file_size(path));
}

/* Whether bumping the byte at off of a copy of the test file name changes its
 * fingerprint. */
static int bump_changes(const char *name, uint64_t off)
{
    char base[96], p[96];
    path_in(base, sizeof base, name);
    path_in(p, sizeof p, "bumped.gguf");
    copy_file(base, p);
    bump_byte(p, off);
    uint8_t a[BL_FINGERPRINT_BYTES], b[BL_FINGERPRINT_BYTES];
    fingerprint_ok(base, a);
    fingerprint_ok(p, b);
    unlink(p);
    return memcmp(a, b, sizeof a) != 0;
}

/* The test file name's data section [*d, *size) and the step between its samples. */
static uint64_t sample_step(const char *name, uint64_t *d, uint64_t *size)
{
    char p[96];
    path_in(p, sizeof p, name);
    *d = data_offset(p);
    *size = file_size(p);
    return (*size - *d - BL_FINGERPRINT_BLOCK) / BL_FINGERPRINT_SAMPLES;
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/bl_test_fp_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    char p[96];
    path_in(p, sizeof p, "big.gguf");
    make_model(p, BIG_FLOATS);
    path_in(p, sizeof p, "small.gguf");
    make_model(p, SMALL_FLOATS);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd);
}

static void test_fingerprint_same_file_same_hash(void **state)
{
    (void)state;
    char big[96], copy[96];
    path_in(big, sizeof big, "big.gguf");
    path_in(copy, sizeof copy, "copy.gguf");
    uint8_t a[BL_FINGERPRINT_BYTES], b[BL_FINGERPRINT_BYTES], c[BL_FINGERPRINT_BYTES];
    fingerprint_ok(big, a);
    fingerprint_ok(big, b);
    assert_memory_equal(a, b, sizeof a);
    copy_file(big, copy);
    fingerprint_ok(copy, c);
    assert_memory_equal(a, c, sizeof a);
    unlink(copy);
}

static void test_fingerprint_changes_with_a_header_byte(void **state)
{
    (void)state;
    char big[96];
    path_in(big, sizeof big, "big.gguf");
    /* the metadata's string value: the file stays a valid GGUF of the same size */
    const int fd = open(big, O_RDONLY);
    assert_true(fd >= 0);
    char head[4096];
    const ssize_t n = pread(fd, head, sizeof head, 0);
    close(fd);
    assert_true(n > 0);
    const char *at = memmem(head, (size_t)n, "fp-model", 8);
    assert_non_null(at);
    assert_true(bump_changes("big.gguf", (uint64_t)(at - head) + 3));
}

static void test_fingerprint_changes_with_a_byte_in_a_sampled_block(void **state)
{
    (void)state;
    uint64_t d, size;
    const uint64_t step = sample_step("big.gguf", &d, &size);
    /* the first byte of the data, a byte inside the 18th sample, the last byte */
    assert_true(bump_changes("big.gguf", d));
    assert_true(bump_changes("big.gguf", d + 17 * step + 1000));
    assert_true(bump_changes("big.gguf", size - 1));
}

static void test_fingerprint_skips_bytes_between_samples(void **state)
{
    (void)state;
    uint64_t d, size;
    const uint64_t step = sample_step("big.gguf", &d, &size);
    assert_true(step > BL_FINGERPRINT_BLOCK + 200); /* a gap between the first two samples */
    assert_false(bump_changes("big.gguf", d + BL_FINGERPRINT_BLOCK + 100));
}

static void test_fingerprint_hashes_a_small_data_section_whole(void **state)
{
    (void)state;
    uint64_t d, size;
    (void)sample_step("small.gguf", &d, &size);
    assert_true(size - d <= (BL_FINGERPRINT_SAMPLES + 1) * BL_FINGERPRINT_BLOCK);
    assert_true(bump_changes("small.gguf", d + (size - d) / 2 + 3));
}

/* A refused fingerprint: its code, a message naming path, nothing left in the outputs. */
static int refused(const char *path)
{
    uint8_t fp[BL_FINGERPRINT_BYTES], zero[BL_FINGERPRINT_BYTES] = {0};
    uint64_t size = 1;
    bl_err_t err = {0};
    memset(fp, 0xff, sizeof fp);
    const int rc = bl_model_fingerprint(path, fp, &size, &err);
    assert_true(rc < 0);
    if (!strstr(err.msg, path))
        fail_msg("'%s' does not name %s", err.msg, path);
    assert_int_equal(size, 0);
    assert_memory_equal(fp, zero, sizeof fp);
    print_message("# refused: %s\n", err.msg);
    return rc;
}

static void test_fingerprint_refuses_a_truncated_file(void **state)
{
    (void)state;
    char big[96], cut[96];
    path_in(big, sizeof big, "big.gguf");
    path_in(cut, sizeof cut, "cut.gguf");
    copy_file(big, cut);
    assert_int_equal(truncate(cut, (off_t)(file_size(big) - 1)), 0);
    assert_int_equal(refused(cut), BL_ERANGE); /* the last tensor ends past the file */
    unlink(cut);
}

static void test_fingerprint_refuses_a_file_that_is_not_gguf(void **state)
{
    (void)state;
    char p[96];
    path_in(p, sizeof p, "notes.txt");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("not a model, only some text that is long enough to hold a header\n", f);
    fclose(f);
    const int rc = refused(p);
    assert_true(rc == BL_EINVAL || rc == BL_ENOTSUP || rc == BL_ERANGE);
    unlink(p);
}

static void test_fingerprint_of_a_missing_file_is_enoent(void **state)
{
    (void)state;
    char p[96];
    path_in(p, sizeof p, "absent.gguf");
    assert_int_equal(refused(p), BL_ENOENT);
}

static void test_fingerprint_hex_digits(void **state)
{
    (void)state;
    uint8_t fp[BL_FINGERPRINT_BYTES] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xff};
    char out[2 * BL_FINGERPRINT_BYTES + 1];
    bl_fingerprint_hex(fp, 12, out);
    assert_string_equal(out, "0123456789ab");
    bl_fingerprint_hex(fp, 3, out);
    assert_string_equal(out, "012");
    bl_fingerprint_hex(fp, 1000, out);
    assert_int_equal(strlen(out), 2 * BL_FINGERPRINT_BYTES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fingerprint_same_file_same_hash),
        cmocka_unit_test(test_fingerprint_changes_with_a_header_byte),
        cmocka_unit_test(test_fingerprint_changes_with_a_byte_in_a_sampled_block),
        cmocka_unit_test(test_fingerprint_skips_bytes_between_samples),
        cmocka_unit_test(test_fingerprint_hashes_a_small_data_section_whole),
        cmocka_unit_test(test_fingerprint_refuses_a_truncated_file),
        cmocka_unit_test(test_fingerprint_refuses_a_file_that_is_not_gguf),
        cmocka_unit_test(test_fingerprint_of_a_missing_file_is_enoent),
        cmocka_unit_test(test_fingerprint_hex_digits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
