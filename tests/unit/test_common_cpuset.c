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
#include <linux/mempolicy.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

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
/* A fake two-node machine: node0/cpulist 0-3, node1/cpulist 4-7 (a node2 with a
 * broken list is left out); isolate keeps the node of the CPU it runs on and prefers
 * its memory, distribute interleaves over the nodes of the allowed CPUs, numactl
 * changes nothing; bad lists and a machine without topology are handled. */
static void test_numa_fake_topology(void **state)
{
    (void)state;
    char root[] = "/tmp/bl-numa-XXXXXX";
    assert_non_null(mkdtemp(root));
    const char *lists[3] = {"0-3\n", "4-5,6,7\n", "0-x\n"};
    char path[256];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/node%d", root, i);
        assert_int_equal(mkdir(path, 0700), 0);
        snprintf(path, sizeof path, "%s/node%d/cpulist", root, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(lists[i], f);
        fclose(f);
    }
    cpu_set_t nodes[BL_NUMA_MAX_NODES];
    const int n = bl_numa_nodes(root, nodes, BL_NUMA_MAX_NODES);
    assert_int_equal(n, 2);
    assert_int_equal(CPU_COUNT(&nodes[0]), 4);
    assert_int_equal(CPU_COUNT(&nodes[1]), 4);
    assert_true(CPU_ISSET(6, &nodes[1]) && !CPU_ISSET(3, &nodes[1]));
    cpu_set_t all, cpus;
    CPU_ZERO(&all);
    for (int c = 0; c < 8; c++)
        CPU_SET(c, &all);
    uint64_t mem = 0;
    assert_int_equal(bl_numa_decide(BL_NUMA_ISOLATE, nodes, n, &all, 5, &cpus, &mem), MPOL_PREFERRED);
    assert_int_equal(CPU_COUNT(&cpus), 4);
    assert_true(CPU_ISSET(4, &cpus) && CPU_ISSET(7, &cpus) && !CPU_ISSET(0, &cpus));
    assert_int_equal(mem, 2);
    assert_int_equal(bl_numa_decide(BL_NUMA_DISTRIBUTE, nodes, n, &all, 5, &cpus, &mem), MPOL_INTERLEAVE);
    assert_true(CPU_EQUAL(&cpus, &all));
    assert_int_equal(mem, 3);
    /* only node 0's CPUs allowed: distribute names node 0 alone; isolate from a CPU
     * outside the allowed set still picks an allowed node */
    cpu_set_t low;
    CPU_ZERO(&low);
    CPU_SET(1, &low);
    CPU_SET(2, &low);
    assert_int_equal(bl_numa_decide(BL_NUMA_DISTRIBUTE, nodes, n, &low, 1, &cpus, &mem), MPOL_INTERLEAVE);
    assert_int_equal(mem, 1);
    assert_int_equal(bl_numa_decide(BL_NUMA_ISOLATE, nodes, n, &low, 6, &cpus, &mem), MPOL_PREFERRED);
    assert_true(CPU_EQUAL(&cpus, &low));
    assert_int_equal(mem, 1);
    assert_int_equal(bl_numa_decide(BL_NUMA_NUMACTL, nodes, n, &all, 5, &cpus, &mem), -1);
    assert_true(CPU_EQUAL(&cpus, &all));
    assert_int_equal(bl_numa_decide(BL_NUMA_ISOLATE, nodes, 0, &all, 5, &cpus, &mem), -1);
    snprintf(path, sizeof path, "%s/none", root);
    assert_int_equal(bl_numa_nodes(path, nodes, BL_NUMA_MAX_NODES), 0);
    /* the flag's parser */
    bl_cpu_flags_t f = {0};
    bl_arg_t a[8];
    int na = 0;
    assert_int_equal(bl_cpu_args(a, &na, 8, &f), 0);
    char p0[] = "prog", p1[] = "--numa", p2[] = "isolate", p3[] = "spread";
    char *ok[] = {p0, p1, p2}, *bad[] = {p0, p1, p3};
    bl_err_t err = {0};
    assert_int_equal(bl_args_parse(a, na, 3, ok, NULL, NULL, &err), 0);
    assert_int_equal(f.numa, BL_NUMA_ISOLATE);
    assert_true(bl_args_parse(a, na, 3, bad, NULL, NULL, &err) != 0);
    assert_non_null(strstr(err.msg, "--numa"));
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/node%d/cpulist", root, i);
        unlink(path);
        snprintf(path, sizeof path, "%s/node%d", root, i);
        rmdir(path);
    }
    rmdir(root);
}

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
        cmocka_unit_test(test_numa_fake_topology),
        cmocka_unit_test(test_cpu_prio),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
