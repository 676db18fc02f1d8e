/* The weights' copy in huge pages, and --mlock (wmem.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "wmem.h"

void *bl_wmem_alloc(uint64_t total, int force, size_t *len)
{
    *len = 0;
    const size_t huge = (size_t)2 << 20;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (total == 0 || total > SIZE_MAX - huge || pages <= 0 || page <= 0 ||
        (!force && total > (uint64_t)pages / 2 * (uint64_t)page))
        return NULL;
    const size_t n = ((size_t)total + huge - 1) & ~(huge - 1);
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE);
#endif
    *len = n;
    return p;
}

/* A "Key: N kB" line of /proc/meminfo in bytes; 0 when absent. */
static uint64_t meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    const size_t kl = strlen(key);
    unsigned long long kb = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strncmp(line, key, kl) == 0 && line[kl] == ':' && sscanf(line + kl + 1, " %llu kB", &kb) == 1;
    fclose(f);
    return found ? (uint64_t)kb * 1024 : 0;
}

uint64_t bl_mem_available(void) { return meminfo("MemAvailable"); }
uint64_t bl_mem_total(void) { return meminfo("MemTotal"); }

struct copy_share {
    const bl_wmem_job_t *jobs;
    size_t n_jobs;
    uint64_t lo, hi; /* this thread's bytes of the jobs laid end to end */
};

static void *copy_share(void *arg)
{
    const struct copy_share *c = arg;
    uint64_t at = 0;
    for (size_t i = 0; i < c->n_jobs && at < c->hi; at += c->jobs[i].n, i++) {
        const uint64_t a = at > c->lo ? at : c->lo, b = at + c->jobs[i].n < c->hi ? at + c->jobs[i].n : c->hi;
        if (a < b)
            memcpy((uint8_t *)c->jobs[i].dst + (a - at), (const uint8_t *)c->jobs[i].src + (a - at), (size_t)(b - a));
    }
    return NULL;
}

void bl_wmem_copy_many(const bl_wmem_job_t *jobs, size_t n_jobs, int threads)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n_jobs; i++)
        total += jobs[i].n;
    enum { MAX_THREADS = 64 };
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads < 1 || total < ((uint64_t)64 << 20))
        threads = 1;
    struct copy_share share[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < threads; t++)
        share[t] = (struct copy_share){jobs, n_jobs, total * (uint64_t)t / (uint64_t)threads,
                                       total * (uint64_t)(t + 1) / (uint64_t)threads};
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&th[t], NULL, copy_share, &share[t]) == 0;
    copy_share(&share[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            copy_share(&share[t]); /* no thread to spare: the caller copies that share too */
    }
}

void bl_wmem_lock(const void *p, uint64_t len, const bl_gguf_t *g)
{
    const uint32_t n = p ? 1 : bl_gguf_n_parts(g);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t l = len;
        const void *q = p ? p : bl_gguf_part_bytes(g, i, &l);
        if (!q || l == 0 || l > SIZE_MAX)
            continue;
        if (mlock(q, (size_t)l) != 0)
            BL_LOG(BL_LOG_WARN, "event=mlock_failed bytes=%llu reason=\"%s\" hint=\"raise ulimit -l "
                   "(RLIMIT_MEMLOCK)\"", (unsigned long long)l, strerror(errno));
        else
            BL_LOG(BL_LOG_INFO, "event=mlock bytes=%llu", (unsigned long long)l);
    }
}
