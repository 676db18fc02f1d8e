/* The weights' copy in huge pages, and --mlock (wmem.h). */
#include <errno.h>
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
