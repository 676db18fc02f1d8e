/* Tests of common/gguf_writer.c: what it writes reads back through common/gguf.c
 * value for value, and every refusal of its header comment. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_writer.h"

#define CHECK(call)                                                                     \
    do {                                                                                \
        bl_err_t e_ = {0};                                                              \
        bl_err_t *err = &e_;                                                            \
        if ((call) != 0)                                                                \
            fail_msg("%s: %s", #call, e_.msg);                                          \
        (void)err;                                                                      \
    } while (0)

static char *temp_path(void)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/bl_test_gw_%d.gguf", (int)getpid());
    return path;
}

static void test_gw_round_trip_of_every_value_type_and_tensor(void **state)
{
    (void)state;
    bl_gguf_writer_t *w;
    CHECK(bl_gw_create(&w, err));
    CHECK(bl_gw_set_u32(w, "general.alignment", 64, err));
    CHECK(bl_gw_set_u8(w, "a.u8", 200, err));
    CHECK(bl_gw_set_i8(w, "a.i8", -100, err));
    CHECK(bl_gw_set_u16(w, "a.u16", 60000, err));
    CHECK(bl_gw_set_i16(w, "a.i16", -30000, err));
    CHECK(bl_gw_set_i32(w, "a.i32", -2000000000, err));
    CHECK(bl_gw_set_u64(w, "a.u64", UINT64_MAX, err));
    CHECK(bl_gw_set_i64(w, "a.i64", INT64_MIN, err));
    CHECK(bl_gw_set_f32(w, "a.f32", 0.25f, err));
    CHECK(bl_gw_set_f64(w, "a.f64", 1e300, err));
    CHECK(bl_gw_set_bool(w, "a.bool", 1, err));
    CHECK(bl_gw_set_strn(w, "a.str", "x\0y", 3, err));
    const int32_t ints[3] = {1, -2, 3};
    CHECK(bl_gw_set_arr(w, "a.arr", BL_GGUF_I32, ints, 3, err));
    const char *strs[2] = {"hello", ""};
    CHECK(bl_gw_set_arr_str(w, "a.strs", strs, 2, err));
    const int64_t ne_f32[2] = {3, 2}, ne_q8[1] = {64};
    CHECK(bl_gw_add_tensor(w, "t.f32", BL_TYPE_F32, 2, ne_f32, err));
    CHECK(bl_gw_add_tensor(w, "t.q8", BL_TYPE_Q8_0, 1, ne_q8, err));
    assert_int_equal(bl_gw_tensor_count(w), 2);
    assert_int_equal(bl_gw_tensor_nbytes(w, 1), 68);

    const char *path = temp_path();
    CHECK(bl_gw_begin(w, path, err));
    const float vals[6] = {1, 2, 3, 4, 5, 6};
    CHECK(bl_gw_write_data(w, vals, sizeof vals, err));
    uint8_t q8[68];
    for (size_t i = 0; i < sizeof q8; i++)
        q8[i] = (uint8_t)i;
    CHECK(bl_gw_write_data(w, q8, 30, err)); /* a tensor may come in pieces */
    CHECK(bl_gw_write_data(w, q8 + 30, 38, err));
    CHECK(bl_gw_finish(w, err));
    bl_gw_destroy(w);

    bl_gguf_t *g;
    CHECK(bl_gguf_open(&g, path, err));
    assert_int_equal(bl_gguf_alignment(g), 64);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    double f64;
    float f32;
    int b;
    bl_gguf_str_t s;
    CHECK(bl_gguf_get_u32(g, "a.u8", &u32, err));
    assert_int_equal(u32, 200);
    CHECK(bl_gguf_get_i64(g, "a.i8", &i64, err));
    assert_int_equal(i64, -100);
    CHECK(bl_gguf_get_u32(g, "a.u16", &u32, err));
    assert_int_equal(u32, 60000);
    CHECK(bl_gguf_get_i64(g, "a.i16", &i64, err));
    assert_int_equal(i64, -30000);
    CHECK(bl_gguf_get_i64(g, "a.i32", &i64, err));
    assert_int_equal(i64, -2000000000);
    CHECK(bl_gguf_get_u64(g, "a.u64", &u64, err));
    assert_true(u64 == UINT64_MAX);
    CHECK(bl_gguf_get_i64(g, "a.i64", &i64, err));
    assert_true(i64 == INT64_MIN);
    CHECK(bl_gguf_get_f32(g, "a.f32", &f32, err));
    assert_true(f32 == 0.25f);
    CHECK(bl_gguf_get_f64(g, "a.f64", &f64, err));
    assert_true(f64 == 1e300);
    CHECK(bl_gguf_get_bool(g, "a.bool", &b, err));
    assert_int_equal(b, 1);
    CHECK(bl_gguf_get_str(g, "a.str", &s, err));
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "x\0y", 3);
    const bl_gguf_arr_t *a;
    CHECK(bl_gguf_get_arr(g, "a.arr", &a, err));
    assert_int_equal(bl_gguf_arr_count(a), 3);
    CHECK(bl_gguf_arr_i64(a, 1, &i64, err));
    assert_int_equal(i64, -2);
    CHECK(bl_gguf_get_arr(g, "a.strs", &a, err));
    CHECK(bl_gguf_arr_str(a, 1, &s, err));
    assert_int_equal(s.len, 0);
    const bl_gguf_tensor_t *t = bl_gguf_find_tensor(g, "t.f32");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 3);
    assert_int_equal(t->ne[1], 2);
    assert_memory_equal(t->data, vals, sizeof vals);
    t = bl_gguf_find_tensor(g, "t.q8");
    assert_non_null(t);
    assert_int_equal(t->file_offset % 64, 0);
    assert_memory_equal(t->data, q8, sizeof q8);
    bl_gguf_close(g);
    unlink(path);
}

static void test_gw_rejects_repeated_key_and_tensor(void **state)
{
    (void)state;
    bl_gguf_writer_t *w;
    CHECK(bl_gw_create(&w, err));
    bl_err_t e = {0};
    CHECK(bl_gw_set_u32(w, "k", 1, err));
    assert_int_equal(bl_gw_set_u32(w, "k", 2, &e), BL_EINVAL);
    assert_non_null(strstr(e.msg, "'k'"));
    assert_int_equal(bl_gw_set_str(w, "", "v", &e), BL_EINVAL);
    const int64_t ne[1] = {32};
    CHECK(bl_gw_add_tensor(w, "t", BL_TYPE_F32, 1, ne, err));
    assert_int_equal(bl_gw_add_tensor(w, "t", BL_TYPE_F32, 1, ne, &e), BL_EINVAL);
    assert_non_null(strstr(e.msg, "'t'"));
    bl_gw_destroy(w);
}

static void test_gw_rejects_bad_tensor_shapes(void **state)
{
    (void)state;
    bl_gguf_writer_t *w;
    CHECK(bl_gw_create(&w, err));
    bl_err_t e = {0};
    const int64_t partial[1] = {100}, zero[2] = {32, 0}, huge[4] = {INT64_MAX / 2, 4, 4, 4};
    assert_int_equal(bl_gw_add_tensor(w, "p", BL_TYPE_Q4_K, 1, partial, &e), BL_EINVAL);
    assert_non_null(strstr(e.msg, "'p'"));
    assert_int_equal(bl_gw_add_tensor(w, "z", BL_TYPE_F32, 2, zero, &e), BL_EINVAL);
    assert_int_equal(bl_gw_add_tensor(w, "d", BL_TYPE_F32, 5, huge, &e), BL_EINVAL);
    assert_int_equal(bl_gw_add_tensor(w, "u", (bl_type_t)4, 1, partial, &e), BL_EINVAL);
    assert_int_not_equal(bl_gw_add_tensor(w, "h", BL_TYPE_F32, 4, huge, &e), 0);
    char long_name[80];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    assert_int_equal(bl_gw_add_tensor(w, long_name, BL_TYPE_F32, 1, zero, &e), BL_EINVAL);
    bl_gw_destroy(w);
}

static void test_gw_short_or_long_data_is_refused_and_file_removed(void **state)
{
    (void)state;
    const char *path = temp_path();
    bl_gguf_writer_t *w;
    CHECK(bl_gw_create(&w, err));
    bl_err_t e = {0};
    const int64_t ne[1] = {4};
    CHECK(bl_gw_add_tensor(w, "t", BL_TYPE_F32, 1, ne, err));
    CHECK(bl_gw_begin(w, path, err));
    const float v[5] = {0};
    CHECK(bl_gw_write_data(w, v, 8, err));
    assert_int_equal(bl_gw_finish(w, &e), BL_EINVAL); /* tensor 't' is short */
    assert_non_null(strstr(e.msg, "'t'"));
    bl_gw_destroy(w);
    assert_int_not_equal(access(path, F_OK), 0);

    /* too many bytes: refused, and the writer stays failed */
    CHECK(bl_gw_create(&w, err));
    CHECK(bl_gw_add_tensor(w, "t", BL_TYPE_F32, 1, ne, err));
    CHECK(bl_gw_begin(w, path, err));
    assert_int_equal(bl_gw_write_data(w, v, sizeof v, &e), BL_EINVAL);
    assert_int_equal(bl_gw_finish(w, &e), BL_EINVAL);
    bl_gw_destroy(w);
    assert_int_not_equal(access(path, F_OK), 0);
}

/* Skipped data: the file has its full size and reads as zeros where skipped, the
 * written tensors keep their bytes, a large hole takes no disk blocks (on file systems
 * that make holes), and skipping past the last tensor is refused. */
static void test_gw_skipped_data_is_a_hole_of_zeros(void **state)
{
    (void)state;
    const char *path = temp_path();
    bl_gguf_writer_t *w;
    CHECK(bl_gw_create(&w, err));
    const int64_t small[1] = {4}, big[2] = {1024, 4096}; /* 16 MiB of f32 */
    CHECK(bl_gw_add_tensor(w, "a", BL_TYPE_F32, 1, small, err));
    CHECK(bl_gw_add_tensor(w, "hole", BL_TYPE_F32, 2, big, err));
    CHECK(bl_gw_add_tensor(w, "b", BL_TYPE_F32, 1, small, err));
    CHECK(bl_gw_add_tensor(w, "tail", BL_TYPE_F32, 2, big, err)); /* the file ends in a hole */
    CHECK(bl_gw_begin(w, path, err));
    const float va[4] = {1, 2, 3, 4}, vb[4] = {-1, -2, -3, -4};
    CHECK(bl_gw_write_data(w, va, sizeof va, err));
    CHECK(bl_gw_skip_data(w, 1000, err)); /* a hole in pieces */
    CHECK(bl_gw_skip_data(w, 16 * 1024 * 1024 - 1000, err));
    CHECK(bl_gw_write_data(w, vb, sizeof vb, err));
    CHECK(bl_gw_skip_data(w, 16 * 1024 * 1024, err));
    bl_err_t e = {0};
    assert_int_equal(bl_gw_skip_data(w, 1, &e), BL_EINVAL); /* past the last tensor */
    bl_gw_destroy(w);
    assert_int_not_equal(access(path, F_OK), 0);

    CHECK(bl_gw_create(&w, err));
    CHECK(bl_gw_add_tensor(w, "a", BL_TYPE_F32, 1, small, err));
    CHECK(bl_gw_add_tensor(w, "hole", BL_TYPE_F32, 2, big, err));
    CHECK(bl_gw_add_tensor(w, "b", BL_TYPE_F32, 1, small, err));
    CHECK(bl_gw_add_tensor(w, "tail", BL_TYPE_F32, 2, big, err));
    CHECK(bl_gw_begin(w, path, err));
    CHECK(bl_gw_write_data(w, va, sizeof va, err));
    CHECK(bl_gw_skip_data(w, 16 * 1024 * 1024, err));
    CHECK(bl_gw_write_data(w, vb, sizeof vb, err));
    CHECK(bl_gw_skip_data(w, 16 * 1024 * 1024, err));
    const uint64_t total = bl_gw_bytes_written(w);
    CHECK(bl_gw_finish(w, err));
    bl_gw_destroy(w);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((uint64_t)st.st_size, total);
    printf("# a 32 MiB hole: %lld bytes on disk\n", (long long)st.st_blocks * 512);
    bl_gguf_t *g;
    CHECK(bl_gguf_open(&g, path, err)); /* every tensor inside the file */
    const bl_gguf_tensor_t *a = bl_gguf_find_tensor(g, "a"), *h = bl_gguf_find_tensor(g, "hole"),
                           *b = bl_gguf_find_tensor(g, "b"), *t = bl_gguf_find_tensor(g, "tail");
    assert_non_null(a);
    assert_non_null(h);
    assert_non_null(b);
    assert_non_null(t);
    assert_memory_equal(a->data, va, sizeof va);
    assert_memory_equal(b->data, vb, sizeof vb);
    const uint8_t *z[2] = {h->data, t->data};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < 16 * 1024 * 1024; i += 4093)
            assert_int_equal(z[k][i], 0);
    assert_int_equal(((const uint8_t *)t->data)[16 * 1024 * 1024 - 1], 0);
    bl_gguf_close(g);
    unlink(path);
}

static void test_gw_no_metadata_after_begin(void **state)
{
    (void)state;
    const char *path = temp_path();
    bl_gguf_writer_t *w;
    CHECK(bl_gw_create(&w, err));
    bl_err_t e = {0};
    CHECK(bl_gw_begin(w, path, err));
    assert_int_equal(bl_gw_set_u32(w, "late", 1, &e), BL_EINVAL);
    CHECK(bl_gw_finish(w, err));
    bl_gw_destroy(w);
    bl_gguf_t *g;
    CHECK(bl_gguf_open(&g, path, err)); /* an empty model is still a valid file */
    assert_int_equal(bl_gguf_n_tensors(g), 0);
    bl_gguf_close(g);
    unlink(path);
}

static void test_gw_unwritable_path_is_named(void **state)
{
    (void)state;
    bl_gguf_writer_t *w;
    CHECK(bl_gw_create(&w, err));
    bl_err_t e = {0};
    assert_int_equal(bl_gw_begin(w, "/nonexistent/dir/x.gguf", &e), BL_EIO);
    assert_non_null(strstr(e.msg, "/nonexistent/dir/x.gguf"));
    bl_gw_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gw_round_trip_of_every_value_type_and_tensor),
        cmocka_unit_test(test_gw_skipped_data_is_a_hole_of_zeros),
        cmocka_unit_test(test_gw_rejects_repeated_key_and_tensor),
        cmocka_unit_test(test_gw_rejects_bad_tensor_shapes),
        cmocka_unit_test(test_gw_short_or_long_data_is_refused_and_file_removed),
        cmocka_unit_test(test_gw_no_metadata_after_begin),
        cmocka_unit_test(test_gw_unwritable_path_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
