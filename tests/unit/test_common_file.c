/* Tests of common/file.c: whole reads, the size limit, and the errors that name the
 * path. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file.h"

static char *temp_with(const char *content, size_t len)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/bl_test_file_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, len), (ssize_t)len);
    close(fd);
    return path;
}

static void test_file_reads_whole_file_with_nul(void **state)
{
    (void)state;
    char *path = temp_with("ab\0cd", 5);
    char *buf;
    size_t len;
    bl_err_t err = {0};
    assert_int_equal(bl_read_file(path, 100, &buf, &len, &err), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(buf, "ab\0cd", 5);
    assert_int_equal(buf[5], 0);
    free(buf);
    unlink(path);
}

static void test_file_empty_file_is_empty_string(void **state)
{
    (void)state;
    char *path = temp_with("", 0);
    char *buf;
    size_t len;
    bl_err_t err = {0};
    assert_int_equal(bl_read_file(path, 100, &buf, &len, &err), 0);
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    free(buf);
    unlink(path);
}

static void test_file_limit_is_exact(void **state)
{
    (void)state;
    char big[10000];
    memset(big, 'x', sizeof big);
    char *path = temp_with(big, sizeof big);
    char *buf = NULL;
    size_t len;
    bl_err_t err = {0};
    assert_int_equal(bl_read_file(path, sizeof big, &buf, &len, &err), 0);
    assert_int_equal(len, sizeof big);
    free(buf);
    assert_int_equal(bl_read_file(path, sizeof big - 1, &buf, &len, &err), BL_ERANGE);
    assert_null(buf);
    assert_non_null(strstr(err.msg, path));
    unlink(path);
}

static void test_file_missing_and_directory_are_named(void **state)
{
    (void)state;
    char *buf;
    size_t len;
    bl_err_t err = {0};
    assert_int_equal(bl_read_file("/nonexistent/bl/x", 10, &buf, &len, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, "/nonexistent/bl/x"));
    assert_int_equal(bl_read_file("/tmp", 10, &buf, &len, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "directory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_reads_whole_file_with_nul),
        cmocka_unit_test(test_file_empty_file_is_empty_string),
        cmocka_unit_test(test_file_limit_is_exact),
        cmocka_unit_test(test_file_missing_and_directory_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
