/* Where a process keeps the weights it reads on the CPU: decode streams every active
 * weight once per token, and a file mapping is in 4 KiB pages (a TLB miss every 4 KiB
 * and a hardware prefetcher that stops at each page), so the weights are copied once
 * into anonymous memory advised as huge pages (measured on the 2-core EPYC: tg64 on
 * m8.gguf about +12%). Best effort: weights past half the physical memory, or more
 * than the available memory less a margin (a file in tmpfs is not available: a copy
 * would hold it twice), stay in the file mapping, which the page cache can evict and
 * a copy could not be, unless the caller forces the copy (--no-mmap). The worker's
 * weights and the hosttier's experts both go through here; where the whole does not
 * fit, both copy the part bl_wmem_room allows (the hosttier in whole layers) and
 * read the rest from the mapping. */
#ifndef BL_WMEM_H
#define BL_WMEM_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "progress.h"

/* Anonymous memory for total bytes of weights, rounded up to huge pages, into
 * *len; NULL (and *len 0) when it passes half the physical memory or would leave
 * less than max(2 GiB, RAM / 10) available and force is not set, or the mapping fails: the caller then reads the file mapping. Free with
 * munmap(p, *len). */
void *bl_wmem_alloc(uint64_t total, int force, size_t *len);

/* The memory a load leaves free for everything else: the larger of 2 GiB and a
 * tenth of of (the RAM, or what is available). */
uint64_t bl_mem_margin(uint64_t of);

/* Whether a copy of total bytes leaves a margin of avail (MemAvailable),
 * bl_mem_margin(ram); 1 when avail is unknown (0). */
int bl_wmem_leaves_margin(uint64_t total, uint64_t avail, uint64_t ram);

/* The most of `want` bytes a copy may take, unforced, beside avail (MemAvailable)
 * and ram (MemTotal) bytes: at most half of ram and what leaves the margin of
 * bl_wmem_leaves_margin, in whole huge pages; want whole when avail is unknown (0)
 * and want fits half of ram. */
uint64_t bl_wmem_room(uint64_t want, uint64_t avail, uint64_t ram);

/* For a caller that can copy a part of its total bytes of weights and read the rest
 * from the file (a CPU worker's matrices, the hosttier's experts): all of them when
 * force (--no-mmap); all or none as bl_wmem_alloc when whole (--mlock, which locks
 * the copy or the mapping); else the part bl_wmem_room allows now. At most cap bytes
 * when cap is not 0. NULL and *len 0 when nothing is copied. */
void *bl_wmem_alloc_part(uint64_t total, uint64_t cap, int force, int whole, size_t *len);

/* The kernel's estimate of the memory a new load can take without swapping
 * (MemAvailable of /proc/meminfo), in bytes; 0 when it cannot be read. */
uint64_t bl_mem_available(void);
/* MemTotal, the same way. */
uint64_t bl_mem_total(void);

/* This host's memory read rate, as a stage's decode streams its weights: the best of
 * three passes of threads threads (1..64) summing their shares of a buffer of 256 MiB
 * (less where MemAvailable / 16 is less, at least 16 MiB), in MB/s; 0 when the buffer
 * or a thread cannot be had. Takes about a tenth of a second at 10 GB/s. The plan
 * weighs a hostfile's CPU stages by it (bl_stage_host_t). */
uint32_t bl_mem_read_mbps(int threads);

/* One copy of a load: n bytes from src to dst. */
typedef struct bl_wmem_job {
    void *dst;
    const void *src;
    size_t n;
} bl_wmem_job_t;

/* Runs the copies on up to threads threads, each taking an equal share of the total
 * bytes: a load is held by first-touch page faults of the copy and of the file
 * mapping, which one thread takes one at a time (measured on the dev machine: a
 * 3.4 GB file's weights at about 0.5 GB/s with one). Copies under 64 MiB in all run
 * on the caller. */
void bl_wmem_copy_many(const bl_wmem_job_t *jobs, size_t n_jobs, int threads);

/* bl_wmem_copy_many with progress: fn (NULL: none) gets the bytes copied so far of
 * the total, on the caller's thread, a few times a second and once at the end. */
void bl_wmem_copy_many_progress(const bl_wmem_job_t *jobs, size_t n_jobs, int threads, bl_progress_fn fn,
                                void *ud);

/* --mlock: the copy (p, len bytes) or, when p is NULL, every part of g's mapping,
 * locked in RAM. A refusal (RLIMIT_MEMLOCK, most often) is logged and the load goes
 * on, as llama.cpp does. */
void bl_wmem_lock(const void *p, uint64_t len, const bl_gguf_t *g);

#endif
