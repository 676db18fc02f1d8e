/* The hosttier's expert store: the routed experts of the layers the plan put in host
 * RAM, read from the model file (common/gguf, checked by common/arch) and computed
 * with kernels/cpu's expert pass, the same code a CPU worker runs for its own
 * experts, so a layer gives the same bits in either process.
 *
 * Threads: one owning thread calls ht_store_experts; the store's pool does the work,
 * and a pager's read-ahead thread reads the next layer's experts meanwhile. */
#ifndef HT_STORE_H
#define HT_STORE_H

#include <stdint.h>

#include "arch.h"
#include "err.h"
#include "progress.h"

typedef struct ht_store ht_store_t;

typedef struct ht_store_opts {
    const char *path;       /* the GGUF file (the first part of a split one) */
    const uint8_t *layers;  /* (n_layer): 1 for a layer whose experts the store holds;
                             * NULL: every layer's */
    int n_threads;          /* 1..256 */
    int64_t n_batch;        /* most rows one call takes, 1..65536 */
    int no_mmap;            /* copy the experts even when they pass half the RAM */
    uint64_t copy_bytes;    /* at most this many bytes of them copied, in whole layers
                             * (the rest read from the file's mapping); 0: as many as
                             * bl_wmem_alloc_part gives (the available memory's margin,
                             * all with no_mmap) */
    int mlock;              /* lock them in RAM (a refusal is logged, as the workers do) */
    int poll;               /* the pool's idle wait, 0..100 (kcpu_pool_set_poll) */
    int cpu_strict;         /* each pool thread pinned to one CPU (kcpu_pool_pin_strict) */
    /* RAM for the held experts: 0, or at least their bytes, holds them all; less
     * keeps them in the file and pages them through slots in that much memory (at
     * least one expert's slot), evicting the coldest by decayed routing heat */
    uint64_t ram_bytes;
    int disk_kind;          /* bl_xr_kind_t of the pager's reads */
    int disk_cached;        /* 1: read through the page cache instead of O_DIRECT */
    int disk_depth;         /* the pager's reads in flight (0: the reader's default) */
    int read_ahead;         /* experts of the next held layer read ahead while a call
                             * computes (at most a quarter of the slots); 0: none; -1:
                             * BLOOMERY_READ_AHEAD, else HT_READ_AHEAD_DEFAULT */
    int read_ahead_policy;  /* which: HT_AHEAD_ROUTER, HT_AHEAD_HEAT, or HT_AHEAD_DEFAULT
                             * (BLOOMERY_READ_AHEAD_POLICY=router|heat, else router) */
    bl_progress_fn progress;      /* or NULL: the experts' copy into RAM, bytes */
    bl_progress_fn fill_progress; /* or NULL: the pager's first fill of its slots, bytes */
    void *progress_ud;
} ht_store_opts_t;

#define HT_READ_AHEAD_DEFAULT 0 /* off: on the measured files it read more than it saved (docs/performance.md) */
#define HT_AHEAD_DEFAULT 0
#define HT_AHEAD_ROUTER 1 /* the next layer's gate run early on the call's rows */
#define HT_AHEAD_HEAT 2   /* the next layer's hottest experts by decayed heat */

/* The pager's counts since open: expert loads served from a slot, loads read from
 * the file after the first fill, and the bytes read, the first fill and the
 * alignment's extra included. Zero without one. */
typedef struct ht_store_pager_stats {
    int paged;            /* 1: the experts are paged */
    int64_t slots;        /* slots in RAM */
    uint64_t hits, misses, bytes_read;
    uint64_t read_ns;     /* time spent waiting on those reads (bytes_read / read_ns:
                           * the pager's read rate) */
    int ahead;            /* experts read ahead a call at most (0: none) */
    uint64_t ahead_reads, ahead_used; /* experts read ahead, and of those the ones a
                           * call used before they were evicted */
    const char *backend;  /* "io_uring" or "pread"; NULL without a pager */
} ht_store_pager_stats_t;

/* Opens the file, checks each held layer's three expert tensors (shape, type, size)
 * and copies them into anonymous memory advised as huge pages (as many whole layers as
 * half the physical memory and the available memory's margin allow, unless no_mmap;
 * the others stay in the file mapping). Errors: the
 * reader's and bl_arch_read's, BL_EINVAL (a dense model, bad options, a tensor of the
 * wrong shape), BL_ENOMEM. Caller frees with ht_store_close. */
int ht_store_open(ht_store_t **out, const ht_store_opts_t *o, bl_err_t *err) BL_WUR;
void ht_store_close(ht_store_t *s); /* NULL is a no-op */

const bl_arch_t *ht_store_arch(const ht_store_t *s);
/* The CPU kernel set in use ("avx2", "ref"). */
const char *ht_store_kernels(const ht_store_t *s);
/* Bytes of expert weights the store holds. */
uint64_t ht_store_bytes(const ht_store_t *s);
/* Held layers whose experts were copied into anonymous memory (the others are read
 * from the file's mapping, or paged). */
int64_t ht_store_layers_copied(const ht_store_t *s);

void ht_store_pager_stats(const ht_store_t *s, ht_store_pager_stats_t *out); /* any thread */

/* out (n, n_embd) = layer's routed experts of the rows xn (n, n_embd): row r's
 * counts[r] (1..n_expert_used) (expert, weight) pairs, packed row after row in ids
 * and wts (counts NULL: n_expert_used each). BL_EINVAL (a layer the store does not
 * hold, a count or an id out of range, named), BL_ERANGE (n outside 1..n_batch);
 * with a pager, BL_EIO naming the file and offset of a read that failed, or a
 * model file changed since open (the call computes nothing then). */
int ht_store_experts(ht_store_t *s, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                     const int32_t *ids, const float *wts, float *out, bl_err_t *err) BL_WUR;

#endif
