/* The weights' copy in huge pages, and --mlock (wmem.h). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "wmem.h"

uint64_t bl_mem_margin(uint64_t of)
{
    const uint64_t least = (uint64_t)2 << 30;
    return of / 10 > least ? of / 10 : least;
}

int bl_wmem_leaves_margin(uint64_t total, uint64_t avail, uint64_t ram)
{
    return avail == 0 || (total <= avail && avail - total >= bl_mem_margin(ram));
}

uint64_t bl_wmem_room(uint64_t want, uint64_t avail, uint64_t ram)
{
    const uint64_t huge = (uint64_t)2 << 20;
    uint64_t room = want;
    if (ram > 0 && room > ram / 2)
        room = ram / 2;
    if (avail > 0) {
        const uint64_t margin = bl_mem_margin(ram);
        const uint64_t left = avail > margin ? avail - margin : 0;
        room = room < left ? room : left;
    }
    return room == want ? room : room & ~(huge - 1);
}

void *bl_wmem_alloc_part(uint64_t total, uint64_t cap, int force, int whole, size_t *len)
{
    uint64_t want = total;
    if (want && !force && !whole)
        want = bl_wmem_room(total, bl_mem_available(), bl_mem_total());
    if (cap && cap < want)
        want = cap;
    *len = 0;
    return want ? bl_wmem_alloc(want, force || want < total, len) : NULL;
}

void *bl_wmem_alloc(uint64_t total, int force, size_t *len)
{
    *len = 0;
    const size_t huge = (size_t)2 << 20;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (total == 0 || total > SIZE_MAX - huge || pages <= 0 || page <= 0 ||
        (!force && (total > (uint64_t)pages / 2 * (uint64_t)page || !bl_wmem_leaves_margin(total, bl_mem_available(), bl_mem_total()))))
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

#define COPY_CHUNK ((uint64_t)16 << 20) /* between two looks at the progress */
#define REPORT_US 200000                /* the progress function's period */

/* One bl_wmem_copy_many call: the jobs, the bytes copied by all its threads and the
 * progress function the caller's thread calls. */
struct copy_run {
    const bl_wmem_job_t *jobs;
    size_t n_jobs;
    uint64_t total;
    _Atomic uint64_t copied;
    _Atomic int finished; /* helper threads done */
    bl_progress_fn fn;
    void *ud;
    int64_t last_us;
};

struct copy_share {
    struct copy_run *run;
    uint64_t lo, hi; /* this thread's bytes of the jobs laid end to end */
    int caller;      /* the caller's thread: reports the progress */
};

static void tick(struct copy_run *r)
{
    const int64_t now = bl_progress_now_us();
    if (r->fn && now - r->last_us >= REPORT_US) {
        r->last_us = now;
        r->fn(r->ud, atomic_load_explicit(&r->copied, memory_order_relaxed), r->total);
    }
}

static void *copy_share(void *arg)
{
    const struct copy_share *c = arg;
    struct copy_run *r = c->run;
    uint64_t at = 0;
    for (size_t i = 0; i < r->n_jobs && at < c->hi; at += r->jobs[i].n, i++) {
        const uint64_t b = at + r->jobs[i].n < c->hi ? at + r->jobs[i].n : c->hi;
        for (uint64_t a = at > c->lo ? at : c->lo; a < b;) {
            const uint64_t e = b - a > COPY_CHUNK ? a + COPY_CHUNK : b;
            memcpy((uint8_t *)r->jobs[i].dst + (a - at), (const uint8_t *)r->jobs[i].src + (a - at), (size_t)(e - a));
            atomic_fetch_add_explicit(&r->copied, e - a, memory_order_relaxed);
            a = e;
            if (c->caller)
                tick(r);
        }
    }
    if (!c->caller)
        atomic_fetch_add_explicit(&r->finished, 1, memory_order_release);
    return NULL;
}

void bl_wmem_copy_many_progress(const bl_wmem_job_t *jobs, size_t n_jobs, int threads, bl_progress_fn fn,
                                void *ud)
{
    struct copy_run run = {.jobs = jobs, .n_jobs = n_jobs, .fn = fn, .ud = ud, .last_us = bl_progress_now_us()};
    for (size_t i = 0; i < n_jobs; i++)
        run.total += jobs[i].n;
    enum { MAX_THREADS = 64 };
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads < 1 || run.total < ((uint64_t)64 << 20))
        threads = 1;
    struct copy_share share[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    int started[MAX_THREADS] = {0}, n_started = 0;
    for (int t = 0; t < threads; t++)
        share[t] = (struct copy_share){&run, run.total * (uint64_t)t / (uint64_t)threads,
                                       run.total * (uint64_t)(t + 1) / (uint64_t)threads, t == 0};
    if (fn)
        fn(ud, 0, run.total);
    for (int t = 1; t < threads; t++)
        n_started += started[t] = pthread_create(&th[t], NULL, copy_share, &share[t]) == 0;
    copy_share(&share[0]);
    for (int t = 1; t < threads; t++)
        if (!started[t]) { /* no thread to spare: the caller copies that share too */
            share[t].caller = 1;
            copy_share(&share[t]);
        }
    /* the others' shares: the progress goes on while they finish */
    while (fn && atomic_load_explicit(&run.finished, memory_order_acquire) < n_started) {
        usleep(20000);
        tick(&run);
    }
    for (int t = 1; t < threads; t++)
        if (started[t])
            pthread_join(th[t], NULL);
    if (fn)
        fn(ud, run.total, run.total);
}

void bl_wmem_copy_many(const bl_wmem_job_t *jobs, size_t n_jobs, int threads)
{
    bl_wmem_copy_many_progress(jobs, n_jobs, threads, NULL, NULL);
}

// --- the read rate ---------------------------------------------------------------------

struct read_share {
    const uint64_t *p;
    size_t n;            /* words */
    _Atomic int *go;     /* the pass starts when it is set */
    uint64_t sum;        /* kept, so that the reads are not optimised away */
};

static void *read_share(void *arg)
{
    struct read_share *r = arg;
    while (!atomic_load_explicit(r->go, memory_order_acquire))
        sched_yield();
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= r->n; i += 4) {
        a += r->p[i];
        b ^= r->p[i + 1];
        c += r->p[i + 2];
        d ^= r->p[i + 3];
    }
    for (; i < r->n; i++)
        a += r->p[i];
    r->sum = a + b + c + d;
    return NULL;
}

uint32_t bl_mem_read_mbps(int threads)
{
    enum { MAX_THREADS = 64 };
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    uint64_t bytes = (uint64_t)256 << 20;
    const uint64_t avail = bl_mem_available();
    if (avail && avail / 16 < bytes)
        bytes = avail / 16 > ((uint64_t)16 << 20) ? avail / 16 : (uint64_t)16 << 20;
    bytes &= ~(uint64_t)4095;
    uint64_t *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return 0;
    (void)madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 0x5a, bytes); /* every page present before the timing */
    const size_t words = bytes / sizeof *buf;
    double best = 0.0;
    uint64_t sink = 0;
    int failed = 0;
    for (int pass = 0; pass < 3 && !failed; pass++) {
        _Atomic int go = 0;
        struct read_share sh[MAX_THREADS];
        pthread_t th[MAX_THREADS];
        int started = 1;
        for (int t = 0; t < threads; t++) {
            const size_t lo = words * (size_t)t / (size_t)threads, hi = words * (size_t)(t + 1) / (size_t)threads;
            sh[t] = (struct read_share){buf + lo, hi - lo, &go, 0};
        }
        while (started < threads && pthread_create(&th[started], NULL, read_share, &sh[started]) == 0)
            started++;
        failed = started < threads; /* the threads that did start still run their share */
        const int64_t t0 = bl_progress_now_us();
        atomic_store_explicit(&go, 1, memory_order_release);
        read_share(&sh[0]);
        for (int t = 1; t < started; t++)
            pthread_join(th[t], NULL);
        const int64_t us = bl_progress_now_us() - t0;
        for (int t = 0; t < started; t++)
            sink += sh[t].sum;
        const double mbps = us > 0 ? (double)bytes / (double)us : 0.0; /* bytes per us = MB/s */
        best = !failed && mbps > best ? mbps : best;
    }
    munmap(buf, bytes);
    __asm__ volatile("" : : "r"(sink));
    if (failed)
        return 0;
    return best > (double)UINT32_MAX ? UINT32_MAX : (uint32_t)best;
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
