/* The CPU flags (cpuset.h). */
#include "cpuset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

/* llama.cpp's levels as nice values (low, normal, medium, high, realtime). */
static const int k_nice_of[] = {5, 0, -5, -10, -20};

int bl_cpu_flags_apply(const bl_cpu_flags_t *f, bl_err_t *err)
{
    if (f->prio >= -1 && f->prio <= 3 && f->prio != 0 && setpriority(PRIO_PROCESS, 0, k_nice_of[f->prio + 1]) != 0)
        BL_LOG(BL_LOG_WARN, "event=prio_failed prio=%lld error=\"%s\"", (long long)f->prio, strerror(errno));
    cpu_set_t s;
    const int rc = bl_cpu_flags_set(f, &s, err);
    if (rc <= 0)
        return rc;
    if (sched_setaffinity(0, sizeof s, &s) != 0)
        return bl_err_set(err, BL_EIO, "--cpu-mask: setting the process's CPUs: %s", strerror(errno));
    return 0;
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
