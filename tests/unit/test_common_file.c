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
#include <fcntl.h>
#include <sys/stat.h>
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

static void write_bytes(const char *path, const char *mode, size_t n)
{
    FILE *f = fopen(path, mode);
    assert_non_null(f);
    for (size_t i = 0; i < n; i++)
        fputc((int)(i * 7u), f);
    assert_int_equal(fclose(f), 0);
}

/* A file's identity: the same file checks clean; a later modification time, another
 * size, a file renamed over it and its removal are each named; a directory is not a
 * regular file. */
static void test_file_id_notices_every_change(void **state)
{
    (void)state;
    char dir[] = "/tmp/bl_fileid_XXXXXX", path[64], other[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m", dir);
    snprintf(other, sizeof other, "%s/n", dir);
    write_bytes(path, "wb", 1000);
    bl_file_id_t id, id2;
    bl_err_t err = {0};
    assert_int_equal(bl_file_id_path(path, &id, &err), 0);
    assert_int_equal(id.size, 1000);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(bl_file_id_fd(fd, path, &id2, &err), 0);
    close(fd);
    assert_memory_equal(&id, &id2, sizeof id);
    assert_int_equal(bl_file_id_check(path, &id, &err), 0);

    struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = (time_t)id.mtime_s + 5, .tv_nsec = 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
    assert_int_equal(bl_file_id_check(path, &id, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "modified"));
    assert_non_null(strstr(err.msg, path));

    assert_int_equal(bl_file_id_path(path, &id, &err), 0);
    write_bytes(path, "ab", 10);
    assert_int_equal(bl_file_id_check(path, &id, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "1000 -> 1010"));

    assert_int_equal(bl_file_id_path(path, &id, &err), 0);
    write_bytes(other, "wb", 1010);
    assert_int_equal(rename(other, path), 0);
    assert_int_equal(bl_file_id_check(path, &id, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "replaced"));

    assert_int_equal(unlink(path), 0);
    assert_int_equal(bl_file_id_check(path, &id, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "gone"));
    assert_int_equal(bl_file_id_path(path, &id, &err), BL_ENOENT);
    assert_int_equal(bl_file_id_path(dir, &id, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "not a regular file"));
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_reads_whole_file_with_nul),
        cmocka_unit_test(test_file_empty_file_is_empty_string),
        cmocka_unit_test(test_file_limit_is_exact),
        cmocka_unit_test(test_file_missing_and_directory_are_named),
        cmocka_unit_test(test_file_id_notices_every_change),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
