/* Tests of proto/child.c's device listing (bp_list_devices), the one reader of
 * `bloomery-worker --list-devices` for the router's plan and a node's answer to a
 * probe: a made-up worker (a shell script) prints what a worker would, or what it
 * must not; each line is read into a device or refused quoted, names are cut and
 * made printable, and a worker that fails or is missing is an error naming it. */
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

#include "child.h"

static char g_bin[256];

/* A worker at g_bin whose --list-devices prints body (printf's format, no
 * arguments) and exits with status. */
static void fake_worker(const char *body, int status)
{
    const char *dir = getenv("TMPDIR");
    snprintf(g_bin, sizeof g_bin, "%s/bl_test_list_devices_%d", dir && *dir ? dir : "/tmp", (int)getpid());
    FILE *f = fopen(g_bin, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n[ \"$1\" = --list-devices ] || exit 9\nprintf '%s'\nexit %d\n", body, status);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(g_bin, 0700), 0);
}

static int teardown(void **state)
{
    (void)state;
    if (g_bin[0])
        unlink(g_bin);
    return 0;
}

static void test_list_devices_reads_each_line(void **state)
{
    (void)state;
    fake_worker("cuda 0 137438953472 130000000000 NVIDIA GB10\\n"
                "cuda 3 85899345920 0 read_mbps=2987000 NVIDIA H100 80GB HBM3\\n", 0);
    bl_device_t d[4];
    int n = -1;
    bl_err_t err = {0};
    assert_int_equal(bp_list_devices(g_bin, d, 4, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(d[0].index, 0);
    assert_string_equal(d[0].name, "NVIDIA GB10");
    assert_true(d[0].total_bytes == 137438953472ull && d[0].free_bytes == 130000000000ull);
    assert_int_equal(d[1].index, 3);
    assert_string_equal(d[1].name, "NVIDIA H100 80GB HBM3");
    assert_true(d[1].free_bytes == 0); /* not known */
    assert_true(d[0].read_mbps == 0 && d[1].read_mbps == 2987000); /* a line without the rate: not known */
    /* at most cap */
    assert_int_equal(bp_list_devices(g_bin, d, 1, &n, &err), 0);
    assert_int_equal(n, 1);
    /* none: a host without a card, or a worker without CUDA */
    fake_worker("", 0);
    assert_int_equal(bp_list_devices(g_bin, d, 4, &n, &err), 0);
    assert_int_equal(n, 0);
}

static void test_list_devices_names_are_printable_and_cut(void **state)
{
    (void)state;
    char body[512];
    snprintf(body, sizeof body, "cuda 1 100 50 GB\\00110\\t%s\\n", "x234567890123456789012345678901234567890"
             "12345678901234567890123456789");
    fake_worker(body, 0);
    bl_device_t d[1];
    int n = 0;
    bl_err_t err = {0};
    assert_int_equal(bp_list_devices(g_bin, d, 1, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(strlen(d[0].name), sizeof d[0].name - 1);
    assert_memory_equal(d[0].name, "GB?10?x234", 10);
}

static void test_list_devices_refuses_what_is_not_a_device(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        const char *needle;
    } bad[] = {
        {"cuda 0 100 200 Free above total\\n", "does not parse: \"cuda 0 100 200 Free above total\""},
        {"cuda -1 100 50 Negative\\n", "does not parse"},
        {"cuda 256 100 50 Past the ordinals\\n", "does not parse"},
        {"gpu 0 100 50 Other\\n", "does not parse"},
        {"cuda 0 100 50\\n", "CUDA0 has no name"},
        {"cuda 0 100 50 \\n", "CUDA0 has no name"},
        {"cuda 0 100 50 No end", "a line without its end"},
        {"cuda 0 100 50 read_mbps=x GPU\\n", "CUDA0's read rate does not parse"},
        {"cuda 0 100 50 read_mbps=-1 GPU\\n", "CUDA0's read rate does not parse"},
        {"cuda 0 100 50 read_mbps=100000001 GPU\\n", "CUDA0's read rate does not parse"},
        {"cuda 0 100 50 read_mbps=5\\n", "CUDA0 has no name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fake_worker(bad[i].body, 0);
        bl_device_t d[2];
        int n = 0;
        bl_err_t err = {0};
        assert_int_equal(bp_list_devices(g_bin, d, 2, &n, &err), BL_EPROTO);
        if (!strstr(err.msg, bad[i].needle))
            fail_msg("%s: '%s' does not name '%s'", bad[i].body, err.msg, bad[i].needle);
    }
}

static void test_list_devices_worker_that_fails_or_is_missing(void **state)
{
    (void)state;
    fake_worker("cuda 0 100 50 Half\\n", 3);
    bl_device_t d[2];
    int n = 0;
    bl_err_t err = {0};
    assert_int_equal(bp_list_devices(g_bin, d, 2, &n, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "--list-devices failed"));
    assert_non_null(strstr(err.msg, g_bin));
    assert_int_equal(bp_list_devices("/nonexistent/bloomery-worker", d, 2, &n, &err), BL_EIO);
    assert_non_null(strstr(err.msg, "cannot start /nonexistent/bloomery-worker --list-devices"));
    assert_int_equal(n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_list_devices_reads_each_line, teardown),
        cmocka_unit_test_teardown(test_list_devices_names_are_printable_and_cut, teardown),
        cmocka_unit_test_teardown(test_list_devices_refuses_what_is_not_a_device, teardown),
        cmocka_unit_test_teardown(test_list_devices_worker_that_fails_or_is_missing, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
