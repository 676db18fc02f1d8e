/* The CPU flags (cpuset.h). */
#include "cpuset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <linux/mempolicy.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int bl_cpu_mask_parse(cpu_set_t *s, const char *hex, bl_err_t *err)
{
    const char *p = hex;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
        p += 2;
    const size_t nd = strlen(p);
    if (nd == 0)
        return bl_err_set(err, BL_EINVAL, "--cpu-mask: '%.40s' is not a hex mask", hex);
    for (size_t i = 0; i < nd; i++) {
        const int v = hexval(p[i]);
        if (v < 0)
            return bl_err_set(err, BL_EINVAL, "--cpu-mask: '%.40s' is not a hex mask (at '%c')", hex, p[i]);
        for (int b = 0; b < 4; b++) {
            if (!(v & (1 << b)))
                continue;
            const size_t cpu = 4 * (nd - 1 - i) + (size_t)b; /* the last digit holds CPUs 0-3 */
            if (cpu >= CPU_SETSIZE)
                return bl_err_set(err, BL_ERANGE, "--cpu-mask: CPU %zu is past the %d this build handles", cpu,
                                  CPU_SETSIZE);
            CPU_SET(cpu, s);
        }
    }
    return 0;
}

static int read_cpu(const char **p, long *out)
{
    if (**p < '0' || **p > '9')
        return -1;
    char *end;
    errno = 0;
    const long v = strtol(*p, &end, 10);
    if (errno || v < 0)
        return -1;
    *p = end;
    *out = v;
    return 0;
}

int bl_cpu_range_parse(cpu_set_t *s, const char *lohi, bl_err_t *err)
{
    const char *p = lohi;
    long lo, hi;
    if (read_cpu(&p, &lo) < 0 || *p++ != '-' || read_cpu(&p, &hi) < 0 || *p != 0)
        return bl_err_set(err, BL_EINVAL, "--cpu-range: '%.40s' is not lo-hi", lohi);
    if (lo > hi)
        return bl_err_set(err, BL_EINVAL, "--cpu-range: '%.40s' ends before it starts", lohi);
    if (hi >= CPU_SETSIZE)
        return bl_err_set(err, BL_ERANGE, "--cpu-range: CPU %ld is past the %d this build handles", hi,
                          CPU_SETSIZE);
    for (long c = lo; c <= hi; c++)
        CPU_SET((size_t)c, s);
    return 0;
}

static int read_int(const char *path, long *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    const int ok = fscanf(f, "%ld", out) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

int bl_cpu_physical_cores(const char *root, const cpu_set_t *allowed)
{
    const int n = CPU_COUNT(allowed);
    if (n <= 0)
        return 1;
    /* (package, core) of each allowed CPU; a pair seen before is a sibling */
    static _Thread_local long pkg[CPU_SETSIZE], core[CPU_SETSIZE];
    int seen = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, allowed))
            continue;
        char path[512];
        long p, k;
        snprintf(path, sizeof path, "%s/cpu%d/topology/physical_package_id", root, c);
        if (read_int(path, &p) < 0)
            return n;
        snprintf(path, sizeof path, "%s/cpu%d/topology/core_id", root, c);
        if (read_int(path, &k) < 0)
            return n;
        int dup = 0;
        for (int i = 0; i < seen && !dup; i++)
            dup = pkg[i] == p && core[i] == k;
        if (!dup) {
            pkg[seen] = p;
            core[seen] = k;
            seen++;
        }
    }
    return seen > 0 ? seen : n;
}

int bl_cpu_default_threads(void)
{
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 1;
    }
    return bl_cpu_physical_cores("/sys/devices/system/cpu", &allowed);
}

int bl_cpu_count(void)
{
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0)
        return CPU_COUNT(&allowed);
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void bl_cpu_list(const cpu_set_t *s, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = 0;
    for (int c = 0; c < CPU_SETSIZE;) {
        if (!CPU_ISSET(c, s)) {
            c++;
            continue;
        }
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, s))
            e++;
        const int k = e > c ? snprintf(buf + at, cap - at, "%s%d-%d", at ? "," : "", c, e)
                            : snprintf(buf + at, cap - at, "%s%d", at ? "," : "", c);
        if (k < 0 || (size_t)k >= cap - at) { /* cut: end on "..." where it fits */
            if (cap >= 4)
                memcpy(buf + cap - 4, "...", 4);
            return;
        }
        at += (size_t)k;
        c = e + 1;
    }
}

int bl_cpu_flags_set(const bl_cpu_flags_t *f, cpu_set_t *s, bl_err_t *err)
{
    if (!f->mask && !f->range)
        return 0;
    cpu_set_t want;
    CPU_ZERO(&want);
    int rc;
    if ((f->mask && (rc = bl_cpu_mask_parse(&want, f->mask, err)) < 0) ||
        (f->range && (rc = bl_cpu_range_parse(&want, f->range, err)) < 0))
        return rc;
    if (CPU_COUNT(&want) == 0)
        return bl_err_set(err, BL_EINVAL, "--cpu-mask: '%.40s' selects no CPU", f->mask ? f->mask : "");
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return bl_err_set(err, BL_EIO, "--cpu-mask: the CPUs this process may run on: %s", strerror(errno));
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &want) && !CPU_ISSET(c, &allowed)) {
            char list[256];
            bl_cpu_list(&allowed, list, sizeof list);
            return bl_err_set(err, BL_ENOTSUP, "%s: CPU %d is not one this process may run on (%s)",
                              f->mask ? "--cpu-mask" : "--cpu-range", c, list);
        }
    *s = want;
    return 1;
}

/* A sysfs cpulist ("0-3,8,10-11\n") into s; -1 when it does not parse. */
static int cpulist_parse(const char *text, cpu_set_t *s)
{
    const char *p = text;
    CPU_ZERO(s);
    while (*p && *p != '\n') {
        long lo, hi;
        if (read_cpu(&p, &lo) < 0)
            return -1;
        hi = lo;
        if (*p == '-' && (p++, read_cpu(&p, &hi) < 0))
            return -1;
        if (hi < lo || hi >= CPU_SETSIZE)
            return -1;
        for (long c = lo; c <= hi; c++)
            CPU_SET((size_t)c, s);
        if (*p == ',')
            p++;
        else if (*p && *p != '\n')
            return -1;
    }
    return 0;
}

int bl_numa_nodes(const char *root, cpu_set_t *nodes, int cap)
{
    int n = 0;
    for (int i = 0; i < cap && i < BL_NUMA_MAX_NODES; i++) {
        CPU_ZERO(&nodes[i]);
        char path[512], text[4096];
        snprintf(path, sizeof path, "%s/node%d/cpulist", root, i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        const size_t len = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[len] = 0;
        if (cpulist_parse(text, &nodes[i]) == 0)
            n = i + 1;
        else
            CPU_ZERO(&nodes[i]);
    }
    return n;
}

int bl_numa_decide(int mode, const cpu_set_t *nodes, int n, const cpu_set_t *allowed, int cur, cpu_set_t *cpus,
                   uint64_t *mem)
{
    *cpus = *allowed;
    *mem = 0;
    if (mode == BL_NUMA_NONE || mode == BL_NUMA_NUMACTL || n <= 0)
        return -1;
    if (mode == BL_NUMA_DISTRIBUTE) {
        for (int i = 0; i < n && i < 64; i++) {
            cpu_set_t both;
            CPU_AND(&both, &nodes[i], allowed);
            if (CPU_COUNT(&both) > 0)
                *mem |= (uint64_t)1 << i;
        }
        return *mem ? MPOL_INTERLEAVE : -1;
    }
    /* isolate: the node of the CPU it runs on if it may run there, else the first
     * node with a CPU it may run on */
    int node = -1;
    for (int pass = 0; pass < 2 && node < 0; pass++)
        for (int i = 0; i < n && i < 64 && node < 0; i++) {
            cpu_set_t both;
            CPU_AND(&both, &nodes[i], allowed);
            if (CPU_COUNT(&both) > 0 && (pass == 1 || (cur >= 0 && cur < CPU_SETSIZE && CPU_ISSET(cur, &both))))
                node = i;
        }
    if (node < 0)
        return -1;
    CPU_AND(cpus, &nodes[node], allowed);
    *mem = (uint64_t)1 << node;
    return MPOL_PREFERRED;
}

static const char *const k_numa_names[] = {"none", "distribute", "isolate", "numactl"};

static int parse_numa(void *ud, const char *value, bl_err_t *err)
{
    for (int i = BL_NUMA_DISTRIBUTE; i <= BL_NUMA_NUMACTL; i++)
        if (strcmp(value, k_numa_names[i]) == 0) {
            *(int *)ud = i;
            return 0;
        }
    return bl_err_set(err, BL_EINVAL, "'%.32s' is not distribute, isolate or numactl", value);
}

/* --numa at start, after the CPU mask: the CPUs and the memory policy. */
static int numa_apply(int mode, bl_err_t *err)
{
    if (mode == BL_NUMA_NONE)
        return 0;
    static cpu_set_t nodes[BL_NUMA_MAX_NODES];
    const int n = bl_numa_nodes("/sys/devices/system/node", nodes, BL_NUMA_MAX_NODES);
    cpu_set_t allowed, cpus;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return bl_err_set(err, BL_EIO, "--numa: the CPUs this process may run on: %s", strerror(errno));
    uint64_t mem = 0;
    const int policy = bl_numa_decide(mode, nodes, n, &allowed, sched_getcpu(), &cpus, &mem);
    if (!CPU_EQUAL(&cpus, &allowed) && sched_setaffinity(0, sizeof cpus, &cpus) != 0)
        return bl_err_set(err, BL_EIO, "--numa %s: setting the process's CPUs: %s", k_numa_names[mode],
                          strerror(errno));
    char list[256];
    bl_cpu_list(&cpus, list, sizeof list);
    if (policy >= 0) {
        unsigned long mask = (unsigned long)mem;
        if (syscall(SYS_set_mempolicy, policy, &mask, (unsigned long)(8 * sizeof mask)) != 0)
            BL_LOG(BL_LOG_WARN, "event=numa_mempolicy_refused mode=%s error=\"%s\"", k_numa_names[mode],
                   strerror(errno));
    }
    BL_LOG(BL_LOG_INFO, "event=numa mode=%s nodes=%d cpus=%s memory_nodes=0x%llx", k_numa_names[mode], n, list,
           (unsigned long long)mem);
    return 0;
}

/* llama.cpp's levels as nice values (low, normal, medium, high, realtime). */
static const int k_nice_of[] = {5, 0, -5, -10, -20};

int bl_cpu_flags_apply(const bl_cpu_flags_t *f, bl_err_t *err)
{
    if (f->prio >= -1 && f->prio <= 3 && f->prio != 0 && setpriority(PRIO_PROCESS, 0, k_nice_of[f->prio + 1]) != 0)
        BL_LOG(BL_LOG_WARN, "event=prio_failed prio=%lld error=\"%s\"", (long long)f->prio, strerror(errno));
    cpu_set_t s;
    const int rc = bl_cpu_flags_set(f, &s, err);
    if (rc < 0)
        return rc;
    if (rc > 0 && sched_setaffinity(0, sizeof s, &s) != 0)
        return bl_err_set(err, BL_EIO, "--cpu-mask: setting the process's CPUs: %s", strerror(errno));
    return numa_apply(f->numa, err);
}

int bl_cpu_args(bl_arg_t *a, int *n, int cap, bl_cpu_flags_t *f)
{
    const bl_arg_t t[] = {
        {"-C,--cpu-mask", NULL, BL_ARG_STR, &f->mask, .metavar = "M",
         .help = "the CPUs to run on, a hex mask of any length (CPU 0 in the lowest bit); with -Cr, both "
                 "count. The server's processes inherit it (default: every CPU this process may use)"},
        {"-Cr,--cpu-range", NULL, BL_ARG_STR, &f->range, .metavar = "lo-hi",
         .help = "the CPUs lo..hi to run on; complements --cpu-mask"},
        {"--cpu-strict", NULL, BL_ARG_I64, &f->strict, 0, 1, .metavar = "0|1",
         .help = "1: each compute thread pinned to one of those CPUs, in order; 0 (default): the threads "
                 "may run on any of them"},
        {"--numa", "LLAMA_ARG_NUMA", BL_ARG_FN, NULL, .fn = parse_numa, .ud = &f->numa,
         .metavar = "distribute|isolate|numactl",
         .help = "NUMA: distribute: memory interleaved over the nodes of the CPUs in use; isolate: the CPUs of "
                 "the node the program started on, memory preferred there; numactl: the CPUs and memory policy "
                 "numactl gave (default: none of these)"},
        {"--prio", "LLAMA_ARG_PRIO", BL_ARG_I64, &f->prio, -1, 3, .metavar = "N",
         .help = "process priority, inherited by the server's processes: -1 low, 0 normal (default), 1 medium, "
                 "2 high, 3 realtime (as nice 5, 0, -5, -10, -20; raising needs the privilege)"},
    };
    const int k = (int)(sizeof t / sizeof t[0]);
    if (*n + k > cap)
        return BL_ERANGE;
    memcpy(a + *n, t, sizeof t);
    *n += k;
    return 0;
}
