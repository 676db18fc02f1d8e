/* Tests of common/cpuset.c: llama.cpp's -C hex masks and -Cr ranges, the bad values
 * each refuses with the flag's name, the check against the CPUs this process may
 * use, and the list the logs print. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "cpuset.h"

static void list_of(const cpu_set_t *s, char *buf, size_t cap) { bl_cpu_list(s, buf, cap); }

static void test_cpu_mask_hex(void **state)
{
    (void)state;
    static const struct {
        const char *hex, *list;
    } ok[] = {
        {"1", "0"},           {"0x1", "0"},     {"0X3", "0-1"},       {"f0", "4-7"},
        {"0x105", "0,2,8"},   {"00000001", "0"}, {"A", "1,3"},         {"8000000000000000", "63"},
        {"10000000000000000", "64"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cpu_set_t s;
        CPU_ZERO(&s);
        bl_err_t err = {0};
        assert_int_equal(bl_cpu_mask_parse(&s, ok[i].hex, &err), 0);
        char list[64];
        list_of(&s, list, sizeof list);
        assert_string_equal(list, ok[i].list);
    }
    /* every CPU of the set: 256 hex digits */
    char full[260] = "0x";
    memset(full + 2, 'f', 256);
    full[258] = 0;
    cpu_set_t all;
    CPU_ZERO(&all);
    bl_err_t e0 = {0};
    assert_int_equal(bl_cpu_mask_parse(&all, full, &e0), 0);
    assert_int_equal(CPU_COUNT(&all), CPU_SETSIZE);
    static const char *bad[] = {"", "0x", "zz", "0x1g", "1 ", "-1", "0x-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cpu_set_t s;
        CPU_ZERO(&s);
        bl_err_t err = {0};
        assert_int_equal(bl_cpu_mask_parse(&s, bad[i], &err), BL_EINVAL);
        assert_non_null(strstr(err.msg, "--cpu-mask"));
    }
    /* a CPU past CPU_SETSIZE: bit 1024 */
    char big[300] = "1";
    memset(big + 1, '0', 256);
    big[257] = 0;
    cpu_set_t s;
    CPU_ZERO(&s);
    bl_err_t err = {0};
    assert_int_equal(bl_cpu_mask_parse(&s, big, &err), BL_ERANGE);
    assert_non_null(strstr(err.msg, "CPU 1024"));
}

static void test_cpu_range(void **state)
{
    (void)state;
    cpu_set_t s;
    CPU_ZERO(&s);
    bl_err_t err = {0};
    assert_int_equal(bl_cpu_range_parse(&s, "2-5", &err), 0);
    assert_int_equal(bl_cpu_range_parse(&s, "9-9", &err), 0);
    assert_int_equal(bl_cpu_mask_parse(&s, "0x1", &err), 0); /* the two complement each other */
    char list[64];
    list_of(&s, list, sizeof list);
    assert_string_equal(list, "0,2-5,9");
    static const char *bad[] = {"", "3", "3-", "-3", "a-b", "5-2", "1-2-3", "1 -2", "+1-2", "1-+2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(bl_cpu_range_parse(&s, bad[i], &err), BL_EINVAL);
        assert_non_null(strstr(err.msg, "--cpu-range"));
    }
    assert_int_equal(bl_cpu_range_parse(&s, "0-1024", &err), BL_ERANGE);
    assert_int_equal(bl_cpu_range_parse(&s, "0-99999999999999999999", &err), BL_EINVAL);
}

static void test_cpu_list_cut(void **state)
{
    (void)state;
    cpu_set_t s;
    CPU_ZERO(&s);
    for (int c = 0; c < 200; c += 2)
        CPU_SET(c, &s);
    char list[16];
    bl_cpu_list(&s, list, sizeof list);
    assert_int_equal(strlen(list), sizeof list - 1);
    assert_string_equal(list + sizeof list - 4, "...");
    CPU_ZERO(&s);
    bl_cpu_list(&s, list, sizeof list);
    assert_string_equal(list, "");
}

/* The flags against this process's CPUs: none given leaves the set alone; the
 * process's own first CPU is accepted; a CPU it may not use and an empty mask are
 * refused by name. */
static void test_cpu_flags_against_the_process(void **state)
{
    (void)state;
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int first = -1, missing = -1;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &allowed) && first < 0)
            first = c;
        if (!CPU_ISSET(c, &allowed) && missing < 0)
            missing = c;
    }
    assert_true(first >= 0);
    bl_err_t err = {0};
    cpu_set_t s;
    CPU_ZERO(&s);
    bl_cpu_flags_t none = {0};
    assert_int_equal(bl_cpu_flags_set(&none, &s, &err), 0);
    assert_int_equal(CPU_COUNT(&s), 0);
    char range[32];
    snprintf(range, sizeof range, "%d-%d", first, first);
    bl_cpu_flags_t one = {.range = range};
    assert_int_equal(bl_cpu_flags_set(&one, &s, &err), 1);
    assert_int_equal(CPU_COUNT(&s), 1);
    assert_true(CPU_ISSET(first, &s));
    bl_cpu_flags_t empty = {.mask = "0x0"};
    assert_int_equal(bl_cpu_flags_set(&empty, &s, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "selects no CPU"));
    if (missing >= 0) {
        snprintf(range, sizeof range, "%d-%d", missing, missing);
        bl_cpu_flags_t out = {.range = range};
        assert_int_equal(bl_cpu_flags_set(&out, &s, &err), BL_ENOTSUP);
        assert_non_null(strstr(err.msg, "--cpu-range"));
        assert_non_null(strstr(err.msg, "may run on"));
    }
    assert_int_equal(bl_cpu_flags_apply(&none, &err), 0); /* nothing given: nothing changes */
}

static void put(const char *root, int cpu, const char *name, int v)
{
    char path[512];
    snprintf(path, sizeof path, "%s/cpu%d", root, cpu);
    (void)mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/cpu%d/topology", root, cpu);
    (void)mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/cpu%d/topology/%s", root, cpu, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%d\n", v);
    fclose(f);
}

/* The default thread count over a fake topology: two packages, CPUs 0 and 1 are
 * siblings of one core, 2 is a core of its own, 3 a core of the second package
 * with the same core id as CPU 0's. */
/* --prio parses -1..3 (and LLAMA_ARG_PRIO) and -1 lowers the process to nice 5, as
 * llama.cpp's low priority; a value out of range is refused by the parser. Run last:
 * the process stays lowered. */
static void test_cpu_prio(void **state)
{
    (void)state;
    bl_cpu_flags_t f = {0};
    bl_arg_t a[8];
    int n = 0;
    assert_int_equal(bl_cpu_args(a, &n, 8, &f), 0);
    char p0[] = "prog", p1[] = "--prio", p2[] = "4";
    char *bad[] = {p0, p1, p2};
    bl_err_t err = {0};
    assert_true(bl_args_parse(a, n, 3, bad, NULL, NULL, &err) != 0);
    assert_non_null(strstr(err.msg, "--prio"));
    char p3[] = "-1";
    char *low[] = {p0, p1, p3};
    assert_int_equal(bl_args_parse(a, n, 3, low, NULL, NULL, &err), 0);
    assert_int_equal(f.prio, -1);
    errno = 0;
    const int before = getpriority(PRIO_PROCESS, 0);
    assert_int_equal(bl_cpu_flags_apply(&f, &err), 0);
    const int after = getpriority(PRIO_PROCESS, 0);
    assert_true(after == 5 || before > 5); /* nice only rises without the privilege */
}

static void test_cpu_physical_cores(void **state)
{
    (void)state;
    char root[] = "/tmp/bl_test_cpus_XXXXXX";
    assert_non_null(mkdtemp(root));
    const int topo[4][2] = {{0, 0}, {0, 0}, {0, 1}, {1, 0}};
    for (int c = 0; c < 4; c++) {
        put(root, c, "physical_package_id", topo[c][0]);
        put(root, c, "core_id", topo[c][1]);
    }
    cpu_set_t s;
    CPU_ZERO(&s);
    for (int c = 0; c < 4; c++)
        CPU_SET(c, &s);
    assert_int_equal(bl_cpu_physical_cores(root, &s), 3);
    CPU_CLR(2, &s);
    CPU_CLR(3, &s);
    assert_int_equal(bl_cpu_physical_cores(root, &s), 1); /* two siblings: one core */
    CPU_SET(7, &s); /* no topology for CPU 7: count the CPUs */
    assert_int_equal(bl_cpu_physical_cores(root, &s), 3);
    CPU_ZERO(&s);
    assert_int_equal(bl_cpu_physical_cores(root, &s), 1);
    assert_true(bl_cpu_default_threads() >= 1);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_mask_hex),
        cmocka_unit_test(test_cpu_range),
        cmocka_unit_test(test_cpu_list_cut),
        cmocka_unit_test(test_cpu_flags_against_the_process),
        cmocka_unit_test(test_cpu_physical_cores),
        cmocka_unit_test(test_cpu_prio),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
