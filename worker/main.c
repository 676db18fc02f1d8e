/* bloomery-worker: one pipeline stage as a process. Started by the router with its
 * rings at known fds (proto/step.h) and the control endpoint on the command line; it
 * says Hello, takes the Plan, loads its layers, reports Ready, then its step thread
 * runs steps from the input ring to the next ring (hidden rows, or logits from the
 * last stage), sending routed experts to the hosttier when the plan says so. The main
 * thread is the control thread: it owns the ZeroMQ socket (Shutdown, Stats).
 * A failing step is reported down the pipeline as an error message, never an exit. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "bl_config.h"
#include "cardlink.h"
#include "chan.h"
#include "child.h"
#include "log.h"
#include "kvpart.h"
#include "step.h"
#include "wk.h"
#include "xserve.h"
#if BL_HAVE_CUDA
#include "kcuda.h"
#endif

_Static_assert(WK_KV_CHUNK == BP_KV_CHUNK, "the router and the stages count a shared cache's "
                                          "chunks alike");
_Static_assert(WK_CARD_MAX_BUFS == BP_CARD_MAX_BUFS && WK_CARD_HANDLE_BYTES == BP_CARD_HANDLE_BYTES,
               "a card link's offer fits the model's export");

/* How long a wait on a ring lasts before it looks again at the stop flag. */
#define POLL_US 100000

/* One worker. Fields above the line are set before the step thread starts and only
 * read after; the step thread owns the rings, caches and scratch; the control thread
 * owns ctl. */
typedef struct worker {
    bp_child_t ctl;    /* control plane; ctl.label ("worker 0") names this stage in
                        * error texts */
    wk_model_t *m;
    wk_kv_t **kvs;     /* (n_slots) */
    wk_kv_pool_t *pool; /* the cache the slots share (Plan.kv_pool), or NULL */
    char *slot_dir;     /* Plan.slot_dir, or NULL: no slot files */
    char *cache_dir;    /* Plan.cache_dir, or NULL: no prompt cache on disk */
    uint32_t kv_type;
    /* the writer of part files (PERSIST): a thread of its own, so that a step never
     * waits for the disk; jobs under wmu */
    pthread_t writer;
    int writer_on, writer_stop;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    struct part_job {
        int64_t id, n;
        void *mem;
        size_t bytes;
        int dropped; /* the entry went while the job waited or ran: the writer frees mem */
    } jobs[16];
    int n_jobs;          /* queued, jobs[0] the one running when writer_busy */
    int writer_busy;
    bp_step_limits_t lim;
    int device;          /* the stage's CUDA ordinal, or WK_DEVICE_CPU */
    int first, last, remote;
    int mtp;            /* the last stage's NextN proposals go with its logits (Plan.mtp) */
    int stage;          /* this stage's index in the plan */
    int64_t layer_begin, layer_end;
    int threads, threads_batch; /* the compute pool's, as the plan gave them */
    bp_ring_t *in, *out;
    /* where the routed experts of this stage's layers go that are not its own: [0]
     * the hosttier, [k + 1] expert tier k (Plan.tiers), each with the count of calls
     * made, the counter its answers echo */
    struct xlink {
        bp_ring_t *out, *in;
        uint64_t call;
        char who[16];
    } xl[1 + BP_PLAN_MAX_TIERS];
    uint8_t *xt;         /* (n_layer) the xl index of a layer's experts */
    /* the card links on in and out (Plan.stages[].card_next) where both ends set them
     * up; NULL: the ring carries the rows */
    bp_cardlink_t *card_in, *card_out;
    /* ---- step thread */
    bp_step_seq_t *seqs; /* (n_slots) copied from the input */
    int32_t *tokens;     /* (n_batch) copied from the input */
    wk_seq_t *wseqs;     /* (n_slots) */
    bp_step_kvop_t kvops[BP_STEP_MAX_KVOPS]; /* copied from a KV message */
    struct kv_entry *entries; /* saved cache states, by the router's entry names */
    size_t n_entries, cap_entries;
    struct kv_block {         /* host memory of dropped states, kept for reuse: page-
                               * locking a new block costs far more than the copy */
        void *mem;
        size_t cap;
    } spare[8];
    int n_spare;
    /* ---- shared: stop is set by either thread, read by both (relaxed is enough:
     * each side polls it at least every POLL_US) */
    _Atomic int stop;
    _Atomic uint64_t n_steps, n_rows, n_errors;
    _Atomic uint64_t busy_us; /* time in the forward pass: 1 - its share of the uptime is
                               * how long the stage waited for work */
    /* ---- control thread: the names of the per-layer Stats counters, by index */
    char stat_names[BP_CHILD_MAX_COUNTERS][32];
} worker_t;

/* ------------------------------------------------------------ ring waits */

/* Reserves a step message, waiting in POLL_US slices so that stop is seen; through
 * the card link (its buffer too) where card is set. */
static int reserve(worker_t *w, bp_ring_t *r, bp_cardlink_t *card, const bp_step_hdr_t *h, bp_step_out_t *o,
                   bl_err_t *err)
{
    for (;;) {
        int rc = card ? bp_cardlink_reserve(card, h, o, POLL_US, err) : bp_step_reserve(r, h, o, POLL_US, err);
        if (rc != BL_ETIMEDOUT)
            return rc;
        if (atomic_load_explicit(&w->stop, memory_order_relaxed))
            return bl_err_set(err, BL_ECLOSED, "%s: stopping", w->ctl.label);
    }
}

static int peek(worker_t *w, bp_ring_t *r, const void **msg, size_t *n, bl_err_t *err)
{
    for (;;) {
        int rc = bp_ring_peek(r, msg, n, POLL_US, err);
        if (rc != BL_ETIMEDOUT)
            return rc;
        if (atomic_load_explicit(&w->stop, memory_order_relaxed))
            return bl_err_set(err, BL_ECLOSED, "%s: stopping", w->ctl.label);
    }
}

/* ------------------------------------------------------------ experts */

/* wk_experts_fn: the rows go to the layer's hosttier or expert tier, the sums come
 * back. On the step thread, inside wk_model_stage. */
static int experts_remote(void *ctx, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                          const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    worker_t *w = ctx;
    const bp_step_limits_t *lim = &w->lim;
    struct xlink *x = &w->xl[w->xt[layer]];
    uint64_t call = ++x->call;
    int64_t picks = 0;
    for (int64_t r = 0; r < n; r++)
        picks += counts ? counts[r] : lim->n_expert_used;
    bp_step_hdr_t h = {.kind = BP_STEP_EXPERTS, .step = call, .n_rows = (int32_t)n,
                       .width = lim->n_embd, .k = (int32_t)picks, .layer = (int32_t)layer};
    bp_step_out_t o;
    int rc = reserve(w, x->out, NULL, &h, &o, err);
    if (rc)
        return rc;
    memcpy(o.rows, xn, (size_t)n * (size_t)lim->n_embd * sizeof(float));
    for (int64_t r = 0; r < n; r++)
        o.counts[r] = counts ? counts[r] : lim->n_expert_used;
    memcpy(o.ids, ids, (size_t)picks * sizeof(int32_t));
    memcpy(o.wts, wts, (size_t)picks * sizeof(float));
    if ((rc = bp_ring_commit(x->out, o.nbytes, err)) != 0)
        return rc;

    const void *msg;
    size_t nbytes;
    if ((rc = peek(w, x->in, &msg, &nbytes, err)) != 0)
        return rc == BL_ECLOSED ? bl_err_set(err, BL_ECLOSED, "%s: the %s closed its ring", w->ctl.label, x->who)
                                : rc;
    bp_step_in_t in = {0};
    rc = bp_step_parse(msg, nbytes, lim, BP_STEP_SUMS, call, &in, err);
    if (rc == 0 && in.hdr.kind == BP_STEP_ERROR)
        rc = bl_err_set(err, in.hdr.code, "%.*s", (int)in.hdr.text_len, in.text);
    else if (rc == 0 && (in.hdr.layer != layer || in.hdr.n_rows != n))
        rc = bl_err_set(err, BL_EPROTO, "%s: the %s answered layer %d with %d rows for "
                        "layer %lld with %lld", w->ctl.label, x->who, in.hdr.layer, in.hdr.n_rows,
                        (long long)layer, (long long)n);
    else if (rc == 0)
        memcpy(out, in.rows, (size_t)n * (size_t)lim->n_embd * sizeof(float));
    bp_ring_release(x->in);
    return rc;
}

static void send_error(worker_t *w, uint64_t step, int code, const char *text);

/* ------------------------------------------------------------ saved cache states */

/* A slot's cache state kept in host memory for the router's prompt cache: this
 * stage's layers of positions 0..n. */
struct kv_entry {
    int64_t id, n;
    size_t bytes, cap; /* bytes used of cap */
    void *mem;
};

/* Large states are stored in blocks of whole steps of this size (small ones in
 * powers of two), so that a spare block fits the next state of about the same
 * length. */
#define KV_BLOCK_STEP ((size_t)32 << 20)

/* A block of at least bytes: a spare one that is not much larger, else a new one. */
static int block_get(worker_t *w, size_t bytes, void **mem, size_t *cap, bl_err_t *err)
{
    int best = -1;
    for (int i = 0; i < w->n_spare; i++)
        if (w->spare[i].cap >= bytes && w->spare[i].cap <= 2 * bytes + KV_BLOCK_STEP &&
            (best < 0 || w->spare[i].cap < w->spare[best].cap))
            best = i;
    if (best >= 0) {
        *mem = w->spare[best].mem;
        *cap = w->spare[best].cap;
        w->spare[best] = w->spare[--w->n_spare];
        return 0;
    }
    if (bytes >= KV_BLOCK_STEP) {
        *cap = (bytes + KV_BLOCK_STEP - 1) / KV_BLOCK_STEP * KV_BLOCK_STEP;
    } else { /* a small state: the next power of two */
        *cap = 1u << 16;
        while (*cap < bytes)
            *cap *= 2;
    }
    return wk_kv_state_alloc(w->m, *cap, mem, err);
}

/* Keeps a block for reuse; past the spares' room the largest goes back. */
static void block_put(worker_t *w, void *mem, size_t cap)
{
    if (w->n_spare == (int)(sizeof w->spare / sizeof *w->spare)) {
        int big = 0;
        for (int i = 1; i < w->n_spare; i++)
            if (w->spare[i].cap > w->spare[big].cap)
                big = i;
        if (w->spare[big].cap <= cap) {
            wk_kv_state_free(w->m, mem);
            return;
        }
        wk_kv_state_free(w->m, w->spare[big].mem);
        w->spare[big] = w->spare[--w->n_spare];
    }
    w->spare[w->n_spare++] = (struct kv_block){mem, cap};
}

static struct kv_entry *entry_find(worker_t *w, int64_t id)
{
    for (size_t i = 0; i < w->n_entries; i++)
        if (w->entries[i].id == id)
            return &w->entries[i];
    return NULL;
}

static void entry_drop(worker_t *w, int64_t id)
{
    struct kv_entry *e = entry_find(w, id);
    if (!e)
        return;
    /* The memory comes back here, unless a part file of it is queued or being
     * written: the router has its meta file on disk already, so the part is still
     * written, and the writer frees the memory after. */
    int mine = 1;
    if (w->writer_on) {
        pthread_mutex_lock(&w->wmu);
        for (int i = 0; i < w->n_jobs; i++) {
            if (w->jobs[i].id != id || w->jobs[i].dropped)
                continue;
            w->jobs[i].dropped = 1;
            mine = 0;
            break;
        }
        pthread_mutex_unlock(&w->wmu);
    }
    if (mine)
        block_put(w, e->mem, e->cap);
    *e = w->entries[--w->n_entries];
}

/* Writes one part file: under the name with ".tmp", then renamed. */
static int part_write(worker_t *w, const struct part_job *j, bl_err_t *err)
{
    char path[4200], tmp[4210];
    snprintf(path, sizeof path, BP_KV_PART_FMT, w->cache_dir, (long long)j->id,
             (long long)w->layer_begin, (long long)w->layer_end);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    bl_kvpart_t h = {.version = BL_KVPART_VERSION, .kv_type = w->kv_type,
                     .layer_begin = (uint32_t)w->layer_begin, .layer_end = (uint32_t)w->layer_end,
                     .planes = (uint32_t)wk_kv_planes(w->kvs[0]),
                     .kv_layers = (uint32_t)wk_kv_layers(w->kvs[0]),
                     .rec_bytes = wk_kv_ckpt_bytes(w->kvs[0]),
                     .n = (uint64_t)j->n, .row_bytes = wk_kv_row_bytes(w->kvs[0]),
                     .sum = bl_sum64(0, j->mem, j->bytes)};
    if (bl_kvpart_bytes(&h) != j->bytes)
        return bl_err_set(err, BL_EINVAL, "cache part of %lld positions: %zu bytes, not %llu",
                          (long long)j->n, j->bytes, (unsigned long long)bl_kvpart_bytes(&h));
    uint8_t hb[BL_KVPART_HDR_BYTES];
    bl_kvpart_encode(&h, hb);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return bl_err_set(err, BL_EIO, "%s: %s", tmp, strerror(errno));
    int rc = 0;
    const struct {
        const void *p;
        size_t n;
        off_t at;
    } piece[2] = {{hb, sizeof hb, 0}, {j->mem, j->bytes, (off_t)sizeof hb}};
    for (int k = 0; rc == 0 && k < 2; k++)
        for (size_t done = 0; rc == 0 && done < piece[k].n;) {
            ssize_t n = pwrite(fd, (const char *)piece[k].p + done, piece[k].n - done, piece[k].at + (off_t)done);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                rc = bl_err_set(err, BL_EIO, "%s: %s", tmp, n < 0 ? strerror(errno) : "no room");
            else
                done += (size_t)n;
        }
    if (rc == 0 && fdatasync(fd) != 0)
        rc = bl_err_set(err, BL_EIO, "%s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = bl_err_set(err, BL_EIO, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = bl_err_set(err, BL_EIO, "%s: %s", path, strerror(errno));
    if (rc)
        (void)unlink(tmp);
    return rc;
}

static void *writer_main(void *arg)
{
    worker_t *w = arg;
    pthread_mutex_lock(&w->wmu);
    for (;;) {
        while (!w->writer_stop && w->n_jobs == 0)
            pthread_cond_wait(&w->wcv, &w->wmu);
        /* a stop lets the queued parts be written first: the router has written their
         * entries' meta files, so a part left out would cost a refused entry */
        if (w->n_jobs == 0)
            break;
        struct part_job j = w->jobs[0];
        w->writer_busy = 1;
        pthread_mutex_unlock(&w->wmu);
        bl_err_t err = {0};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = part_write(w, &j, &err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (rc)
            BL_LOG(BL_LOG_WARN, "event=cache_part_write_failed entry=%lld reason=\"%s\"",
                   (long long)j.id, err.msg);
        else
            BL_LOG(BL_LOG_DEBUG, "event=cache_part_written entry=%lld bytes=%zu ms=%.1f",
                   (long long)j.id, j.bytes, (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                   (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
        pthread_mutex_lock(&w->wmu);
        if (w->jobs[0].dropped) /* its entry went meanwhile: the memory is the writer's */
            wk_kv_state_free(w->m, w->jobs[0].mem);
        memmove(&w->jobs[0], &w->jobs[1], (size_t)(w->n_jobs - 1) * sizeof *w->jobs);
        w->n_jobs--;
        w->writer_busy = 0;
        pthread_cond_broadcast(&w->wcv);
    }
    pthread_mutex_unlock(&w->wmu);
    return NULL;
}

/* PERSIST: the entry's state goes to the writer (full queue: this entry is not kept
 * on disk, which the router finds out when it reads it). */
static int kv_persist(worker_t *w, const bp_step_kvop_t *o, bl_err_t *err)
{
    if (!w->writer_on)
        return bl_err_set(err, BL_EINVAL, "cache on disk: the plan names no folder");
    const struct kv_entry *e = entry_find(w, o->entry);
    if (!e || e->n != o->n)
        return bl_err_set(err, BL_ENOENT, "no saved cache state %lld of %lld positions to write",
                          (long long)o->entry, (long long)o->n);
    pthread_mutex_lock(&w->wmu);
    int queued = 0;
    if (w->n_jobs < (int)(sizeof w->jobs / sizeof *w->jobs)) {
        w->jobs[w->n_jobs++] = (struct part_job){.id = e->id, .n = e->n, .mem = e->mem, .bytes = e->bytes};
        queued = 1;
        pthread_cond_broadcast(&w->wcv);
    }
    pthread_mutex_unlock(&w->wmu);
    if (!queued)
        BL_LOG(BL_LOG_WARN, "event=cache_part_skipped entry=%lld reason=\"the writer is behind\"",
               (long long)o->entry);
    return 0;
}

/* FETCH: this stage's part file of the entry into the slot, checked first. */
static int kv_fetch(worker_t *w, bp_step_kvop_t *o, bl_err_t *err)
{
    if (!w->cache_dir)
        return bl_err_set(err, BL_EINVAL, "cache on disk: the plan names no folder");
    char path[4200];
    snprintf(path, sizeof path, BP_KV_PART_FMT, w->cache_dir, (long long)o->entry,
             (long long)w->layer_begin, (long long)w->layer_end);
    wk_kv_t *kv = w->kvs[o->slot];
    if (w->writer_on) { /* a part still queued or being written is waited for */
        pthread_mutex_lock(&w->wmu);
        for (int i = 0; i < w->n_jobs;) {
            if (w->jobs[i].id == o->entry) {
                pthread_cond_wait(&w->wcv, &w->wmu);
                i = 0;
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&w->wmu);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bl_err_set(err, BL_ENOENT, "%s: %s", path, strerror(errno));
    uint8_t hb[BL_KVPART_HDR_BYTES];
    bl_kvpart_t h;
    struct stat sb;
    ssize_t k = pread(fd, hb, sizeof hb, 0);
    int rc = bl_kvpart_decode(hb, k > 0 ? (size_t)k : 0, &h, err);
    const uint64_t bytes = rc == 0 ? bl_kvpart_bytes(&h) : 0;
    if (rc == 0 && (h.kv_type != w->kv_type || h.layer_begin != (uint32_t)w->layer_begin ||
                    h.layer_end != (uint32_t)w->layer_end || h.row_bytes != wk_kv_row_bytes(kv) ||
                    h.planes != (uint32_t)wk_kv_planes(kv) || h.kv_layers != (uint32_t)wk_kv_layers(kv) ||
                    h.rec_bytes != wk_kv_ckpt_bytes(kv) || h.n < (uint64_t)o->n))
        rc = bl_err_set(err, BL_EINVAL, "%s: a part of layers %u..%u, %llu positions, type %u, "
                        "not this stage's", path, h.layer_begin, h.layer_end,
                        (unsigned long long)h.n, h.kv_type);
    if (rc == 0 && (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != BL_KVPART_HDR_BYTES + bytes))
        rc = bl_err_set(err, BL_EINVAL, "%s: cut short or grown", path);
    void *mem = NULL;
    size_t cap = 0;
    if (rc == 0)
        rc = block_get(w, (size_t)bytes, &mem, &cap, err);
    for (size_t done = 0; rc == 0 && done < bytes;) {
        ssize_t n = pread(fd, (char *)mem + done, (size_t)bytes - done, (off_t)(BL_KVPART_HDR_BYTES + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            rc = bl_err_set(err, BL_EIO, "%s: %s", path, n < 0 ? strerror(errno) : "cut short");
        else
            done += (size_t)n;
    }
    if (rc == 0 && bl_sum64(0, mem, (size_t)bytes) != h.sum)
        rc = bl_err_set(err, BL_EINVAL, "%s: damaged (its checksum does not match)", path);
    if (rc == 0)
        rc = wk_kv_load(kv, o->n, mem, (int64_t)h.n, err);
    if (mem)
        block_put(w, mem, cap);
    close(fd);
    return rc;
}

static double ms_since(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_nsec - a->tv_nsec) / 1e6;
}

/* A slot file's part of this stage: positions 0..n of the slot's cache written at
 * o->bytes of the io file (WRITE), or read from there into the cache (READ); o->bytes
 * moves past the part. */
static int kv_file(worker_t *w, bp_step_kvop_t *o, bl_err_t *err)
{
    if (!w->slot_dir)
        return bl_err_set(err, BL_EINVAL, "slot files: the plan names no folder");
    char path[4200];
    snprintf(path, sizeof path, BP_KV_IO_FMT, w->slot_dir, (long long)o->entry);
    wk_kv_t *kv = w->kvs[o->slot];
    const int writing = o->op == BP_KV_WRITE;
    const size_t bytes = wk_kv_state_bytes(kv, o->n);
    int fd = open(path, (writing ? O_WRONLY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return bl_err_set(err, BL_EIO, "slot file %s: %s", path, strerror(errno));
    struct stat sb;
    int rc = 0;
    if (!writing && (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < (uint64_t)o->bytes + bytes))
        rc = bl_err_set(err, BL_EINVAL, "slot file: %zu bytes of this stage's layers are not "
                        "there at offset %lld", bytes, (long long)o->bytes);
    void *mem = NULL;
    size_t cap = 0;
    if (rc == 0)
        rc = block_get(w, bytes, &mem, &cap, err);
    if (rc == 0 && writing)
        rc = wk_kv_save(kv, o->n, mem, err);
    for (size_t done = 0; rc == 0 && done < bytes;) {
        ssize_t k = writing ? pwrite(fd, (char *)mem + done, bytes - done, (off_t)(o->bytes + done))
                            : pread(fd, (char *)mem + done, bytes - done, (off_t)(o->bytes + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            rc = bl_err_set(err, BL_EIO, "slot file %s: %s", path,
                            k < 0 ? strerror(errno) : "shorter than it was");
        else
            done += (size_t)k;
    }
    if (rc == 0 && !writing)
        rc = wk_kv_load(kv, o->n, mem, o->n, err);
    if (mem)
        block_put(w, mem, cap);
    if (close(fd) != 0 && rc == 0 && writing)
        rc = bl_err_set(err, BL_EIO, "slot file %s: %s", path, strerror(errno));
    if (rc == 0)
        o->bytes += (int64_t)bytes;
    return rc;
}

/* One op of a KV message on this stage's layers; o->bytes grows by what it keeps. */
static int kv_op(worker_t *w, bp_step_kvop_t *o, bl_err_t *err)
{
    if (o->op == BP_KV_WRITE || o->op == BP_KV_READ)
        return kv_file(w, o, err);
    if (o->op == BP_KV_PERSIST)
        return kv_persist(w, o, err);
    if (o->op == BP_KV_FETCH)
        return kv_fetch(w, o, err);
    if (o->op == BP_KV_DROP) {
        entry_drop(w, o->entry);
        return 0;
    }
    wk_kv_t *kv = w->kvs[o->slot];
    if (o->op == BP_KV_CLEAR) {
        wk_kv_clear(kv);
        return 0;
    }
    if (o->op == BP_KV_LOAD) {
        const struct kv_entry *e = entry_find(w, o->entry);
        if (!e)
            return bl_err_set(err, BL_ENOENT, "no saved cache state %lld to load into slot %d",
                              (long long)o->entry, o->slot);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = wk_kv_load(kv, o->n, e->mem, e->n, err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (rc == 0) {
            o->bytes += (int64_t)e->cap;
            BL_LOG(BL_LOG_DEBUG, "event=kv_load slot=%d n=%lld copy_ms=%.1f", o->slot, (long long)o->n,
                   ms_since(&t0, &t1));
        }
        return rc;
    }
    if (o->op == BP_KV_ROLLBACK) {
        const struct kv_entry *e = entry_find(w, o->entry);
        if (!e || e->n != o->n)
            return bl_err_set(err, BL_ENOENT, "no checkpoint %lld of %lld positions to roll slot %d back to",
                              (long long)o->entry, (long long)o->n, o->slot);
        return wk_kv_ckpt_load(kv, o->n, e->mem, err);
    }
    entry_drop(w, o->entry); /* a name saved again replaces the old state */
    if (w->n_entries == w->cap_entries) {
        size_t cap = w->cap_entries ? 2 * w->cap_entries : 16;
        struct kv_entry *g = realloc(w->entries, cap * sizeof *g);
        if (!g)
            return bl_err_set(err, BL_ENOMEM, "out of memory for the saved cache states");
        w->entries = g;
        w->cap_entries = cap;
    }
    const int ckpt = o->op == BP_KV_CKPT;
    if (ckpt && o->n != wk_kv_n_past(kv))
        return bl_err_set(err, BL_EINVAL, "a checkpoint of slot %d at %lld positions: it holds %lld", o->slot,
                          (long long)o->n, (long long)wk_kv_n_past(kv));
    /* a checkpoint of a stage without recurrent layers keeps only its position */
    const size_t bytes = ckpt ? wk_kv_ckpt_bytes(kv) + 8 : wk_kv_state_bytes(kv, o->n);
    void *mem = NULL;
    size_t cap = 0;
    struct timespec t0, t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = block_get(w, bytes, &mem, &cap, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == 0 && (rc = ckpt ? wk_kv_ckpt_save(kv, mem, err) : wk_kv_save(kv, o->n, mem, err)) != 0)
        block_put(w, mem, cap);
    clock_gettime(CLOCK_MONOTONIC, &t2);
    if (rc)
        return rc;
    BL_LOG(BL_LOG_DEBUG, "event=kv_save slot=%d n=%lld bytes=%zu alloc_ms=%.1f copy_ms=%.1f", o->slot,
           (long long)o->n, bytes, ms_since(&t0, &t1), ms_since(&t1, &t2));
    w->entries[w->n_entries++] = (struct kv_entry){.id = o->entry, .n = o->n, .bytes = bytes, .cap = cap,
                                                   .mem = mem};
    o->bytes += (int64_t)cap; /* what the state holds of host memory */
    return 0;
}

/* A KV message: its ops here, then on to the next stage (the last sends it back to
 * the router). A failed op stops the message: an error goes on in its place. */
static void run_kv(worker_t *w, const bp_step_in_t *in)
{
    bl_err_t err = {0};
    int rc = 0;
    for (int32_t i = 0; rc == 0 && i < in->hdr.n_seqs; i++)
        rc = kv_op(w, &w->kvops[i], &err);
    bp_step_out_t o;
    bp_step_hdr_t h = {.kind = BP_STEP_KV, .step = in->hdr.step, .n_seqs = in->hdr.n_seqs};
    if (rc == 0 && (rc = reserve(w, w->out, NULL, &h, &o, &err)) == 0) {
        memcpy(o.kvops, w->kvops, (size_t)in->hdr.n_seqs * sizeof *o.kvops);
        if ((rc = bp_ring_commit(w->out, o.nbytes, &err)) == 0)
            return;
    }
    char text[BP_STEP_MAX_TEXT];
    snprintf(text, sizeof text, "%s: %s", w->ctl.label, err.msg);
    send_error(w, in->hdr.step, rc, text);
}

/* ------------------------------------------------------------ step thread */

/* Sends an error on in place of this stage's output; it travels to the router. */
static void send_error(worker_t *w, uint64_t step, int code, const char *text)
{
    bl_err_t e2;
    atomic_fetch_add_explicit(&w->n_errors, 1, memory_order_relaxed);
    if (bp_step_push_error(w->out, step, code, text, POLL_US * 10, &e2) != 0)
        BL_LOG(BL_LOG_WARN, "event=step_error_lost step=%llu reason=\"%s\"",
               (unsigned long long)step, e2.msg);
}

/* One message from the input ring: run the stage on it, or pass an error on. */
static void run_step(worker_t *w, const void *msg, size_t nbytes)
{
    bl_err_t err = {0};
    bp_step_in_t in = {.seqs = w->seqs, .ids = w->tokens, .kvops = w->kvops};
    bp_step_kind_t want = w->first ? BP_STEP_TOKENS : BP_STEP_HIDDEN;
    int rc = bp_step_parse(msg, nbytes, &w->lim, want, BP_STEP_ANY, &in, &err);
    uint64_t step = in.hdr.step;
    if (rc) {
        char text[BP_STEP_MAX_TEXT];
        snprintf(text, sizeof text, "%s: bad message from the previous stage: %s", w->ctl.label,
                 err.msg);
        send_error(w, step, rc, text);
        return;
    }
    if (in.hdr.kind == BP_STEP_KV) {
        run_kv(w, &in);
        return;
    }
    if (in.hdr.kind == BP_STEP_ERROR) { /* an earlier stage failed: pass it on */
        char text[BP_STEP_MAX_TEXT + 1];
        memcpy(text, in.text, in.hdr.text_len);
        text[in.hdr.text_len] = '\0';
        send_error(w, step, in.hdr.code, text);
        return;
    }

    /* Rows left in a card buffer come over first, queued before the stage's work. */
    if (in.hdr.card && (rc = bp_cardlink_get(w->card_in, &in, &err)) != 0) {
        char text[BP_STEP_MAX_TEXT];
        snprintf(text, sizeof text, "%s: the previous stage's rows from the card: %s", w->ctl.label, err.msg);
        send_error(w, step, rc, text);
        return;
    }
    int32_t n_out = 0, row = 0;
    for (int32_t i = 0; i < in.hdr.n_seqs; i++) {
        const bp_step_seq_t *s = &w->seqs[i];
        w->wseqs[i] = (wk_seq_t){.kv = w->kvs[s->slot], .tokens = w->tokens + row,
                                 .n = s->n, .pos = s->pos, .n_out = s->n_out};
        row += s->n;
        n_out += s->n_out;
    }
    bp_step_hdr_t h = w->last
        ? (bp_step_hdr_t){.kind = BP_STEP_LOGITS, .step = step, .n_rows = n_out,
                          .width = w->lim.n_vocab, .k = w->mtp}
        : (bp_step_hdr_t){.kind = BP_STEP_HIDDEN, .step = step, .n_seqs = in.hdr.n_seqs,
                          .n_rows = in.hdr.n_rows, .width = w->lim.n_embd};
    bp_step_out_t o;
    if ((rc = reserve(w, w->out, w->card_out, &h, &o, &err)) != 0) {
        send_error(w, step, rc, err.msg);
        return;
    }
    if (!w->last) { /* the sequences and their tokens go on with the rows */
        memcpy(o.seqs, w->seqs, (size_t)in.hdr.n_seqs * sizeof *o.seqs);
        memcpy(o.tokens, w->tokens, (size_t)in.hdr.n_rows * sizeof *o.tokens);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* in.rows and o.rows are NULL where the rows come or go through the card */
    rc = wk_model_stage(w->m, w->wseqs, in.hdr.n_seqs, w->first ? NULL : in.rows,
                        w->last ? NULL : o.rows, w->last ? o.rows : NULL, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    atomic_fetch_add_explicit(&w->busy_us, (uint64_t)(ms_since(&t0, &t1) * 1e3), memory_order_relaxed);
    if (rc == 0 && w->mtp) { /* the NextN layer's proposals, one for each logit row */
        const wk_mtp_row_t *mr;
        const float *ml;
        const int64_t nm = wk_model_mtp(w->m, &mr, &ml);
        for (int32_t k = 0; k < n_out; k++)
            o.mtp[k] = k < nm ? (bp_step_mtp_t){.in = mr[k].in, .tok = mr[k].tok, .p = mr[k].p}
                              : (bp_step_mtp_t){.in = -1, .tok = -1};
    }
    if (rc == 0)
        rc = w->card_out ? bp_cardlink_commit(w->card_out, &o, &err) : bp_ring_commit(w->out, o.nbytes, &err);
    if (rc == 0) {
        atomic_fetch_add_explicit(&w->n_steps, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->n_rows, (uint64_t)in.hdr.n_rows, memory_order_relaxed);
        return;
    }
    /* The error replaces the reserved output (a second reserve replaces the first). */
    char text[BP_STEP_MAX_TEXT];
    if (strncmp(err.msg, "hosttier", 8) == 0 || strncmp(err.msg, w->ctl.label, strlen(w->ctl.label)) == 0)
        snprintf(text, sizeof text, "%s", err.msg);
    else
        snprintf(text, sizeof text, "%s: %s", w->ctl.label, err.msg);
    send_error(w, step, rc, text);
}

static void *step_main(void *arg)
{
    worker_t *w = arg;
    for (;;) {
        const void *msg;
        size_t nbytes;
        bl_err_t err = {0};
        int rc = peek(w, w->in, &msg, &nbytes, &err);
        if (rc == BL_ECLOSED)
            break; /* the router closed our input, or we are stopping */
        if (rc) {
            /* The ring itself is corrupt: nothing more can be read from it. */
            char text[BP_STEP_MAX_TEXT];
            snprintf(text, sizeof text, "%s: input ring: %s", w->ctl.label, err.msg);
            send_error(w, 0, rc, text);
            BL_LOG(BL_LOG_ERROR, "event=ring_broken reason=\"%s\"", err.msg);
            break;
        }
        run_step(w, msg, nbytes);
        if (!w->card_in) {
            bp_ring_release(w->in);
            continue;
        }
        /* The message goes back only once the copy out of its card buffer is done:
         * its release tells the previous stage the buffer is free. */
        if ((rc = bp_cardlink_release(w->card_in, &err)) != 0) {
            char text[BP_STEP_MAX_TEXT];
            snprintf(text, sizeof text, "%s: card link from the previous stage: %s", w->ctl.label, err.msg);
            send_error(w, 0, rc, text);
            BL_LOG(BL_LOG_ERROR, "event=card_link_broken reason=\"%s\"", err.msg);
            break;
        }
    }
    atomic_store_explicit(&w->stop, 1, memory_order_relaxed);
    return NULL;
}

/* ------------------------------------------------------------ control plane */

static int attach(bp_ring_t **r, int fd, const char *what, bp_ring_role_t role, bl_err_t *err)
{
    int rc = bp_ring_attach_fd(r, fd, what, role, err);
    close(fd); /* the handle holds its own dup */
    return rc;
}

/* Everything between the Plan and Ready: rings, model, caches, scratch. */
static int load_stage(worker_t *w, const bp_plan_t *p, bl_err_t *err)
{
    const bp_plan_stage_t *st = NULL;
    int idx = 0;
    for (; idx < p->n_stages; idx++)
        if (p->stages[idx].process == p->you) {
            st = &p->stages[idx];
            break;
        }
    if (!st)
        return bl_err_set(err, BL_EINVAL, "plan: no stage for process %u", p->you);
    w->ctl.process = p->you;
    snprintf(w->ctl.label, sizeof w->ctl.label, "worker %d", idx);
    w->stage = idx;
    w->first = idx == 0;
    w->last = idx + 1 == p->n_stages;
    const int device = st->device >= 0 ? st->device : WK_DEVICE_CPU;
    w->device = device;
    /* The layers of this stage whose routed experts the hosttier or a tier computes:
     * those the placements list; xt says which. */
    int any = 0, rc, plan_host = 0;
    int used[1 + BP_PLAN_MAX_TIERS] = {0};
    if (!(w->xt = calloc(p->n_layers ? p->n_layers : 1, 1)))
        return bl_err_set(err, BL_ENOMEM, "out of memory for %u layers", p->n_layers);
    for (uint32_t l = 0; l < p->n_layers; l++) {
        plan_host |= p->host[l];
        w->xt[l] = p->tier[l];
        if (l >= st->layer_begin && l < st->layer_end && (p->host[l] || p->tier[l])) {
            any = 1;
            used[p->tier[l]] = 1;
        }
    }
    w->remote = p->n_expert > 0 && any;
    w->layer_begin = st->layer_begin;
    w->layer_end = st->layer_end;
    /* msg.c checked slots and context; these two are ours to bound. */
    if (p->n_batch > 65536 || p->threads > 256 || p->threads_batch > 256)
        return bl_err_set(err, BL_EINVAL, "plan: n_batch %u, threads %u or threads_batch %u out of range",
                          p->n_batch, p->threads, p->threads_batch);
    if (p->poll > 100)
        return bl_err_set(err, BL_EINVAL, "plan: poll %u is outside 0..100", p->poll);
    const uint32_t kv_type = p->kv_type; /* a bl_type_t id, as WK_KV_* are */

    if ((rc = attach(&w->in, BP_STEP_FD_IN, "stage-in", BP_RING_CONSUMER, err)) ||
        (rc = attach(&w->out, BP_STEP_FD_OUT, "stage-out", BP_RING_PRODUCER, err)))
        return rc;
    snprintf(w->xl[0].who, sizeof w->xl[0].who, "hosttier");
    if (w->remote && used[0] &&
        ((rc = attach(&w->xl[0].out, BP_STEP_FD_EXPERTS_OUT, "experts-out", BP_RING_PRODUCER, err)) ||
         (rc = attach(&w->xl[0].in, BP_STEP_FD_EXPERTS_IN, "experts-in", BP_RING_CONSUMER, err))))
        return rc;
    for (int k = 0; k < p->n_tiers; k++) {
        struct xlink *x = &w->xl[k + 1];
        snprintf(x->who, sizeof x->who, "tier %d", k);
        const int fd = bp_step_fd_tier(plan_host, k);
        if (used[k + 1] && ((rc = attach(&x->out, fd, "tier-out", BP_RING_PRODUCER, err)) ||
                            (rc = attach(&x->in, fd + 1, "tier-in", BP_RING_CONSUMER, err))))
            return rc;
    }
    /* what wk_model_opts_t.experts_host says of each layer: the host's RAM (which a
     * card may copy from), another process's card, or here */
    uint8_t *where = calloc(p->n_layers ? p->n_layers : 1, 1);
    if (!where)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %u layers", p->n_layers);
    for (uint32_t l = 0; l < p->n_layers; l++)
        where[l] = p->host[l] ? WK_EXPERTS_HOST_RAM : p->tier[l] ? WK_EXPERTS_TIER : 0;

    struct stat sb;
    uint64_t total = stat(p->model_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    bp_child_progress(&w->ctl, 0, total, "mmap");
    wk_model_opts_t o;
    wk_model_opts_default(&o);
    w->ctl.copy_stage = "weights"; /* the weights copied into memory or onto the card */
    o.progress = bp_child_copy_progress;
    o.progress_ud = &w->ctl;
    /* a stage's own counts (a hostfile line's threads=: its host is not the router's)
     * win over the plan-wide -t and -tb */
    o.n_threads = st->threads ? (int)st->threads : p->threads ? (int)p->threads : 1;
    o.n_threads_batch = st->threads_batch ? (int)st->threads_batch : (int)p->threads_batch; /* 0: as n_threads */
    w->threads = o.n_threads;
    w->threads_batch = o.n_threads_batch ? o.n_threads_batch : o.n_threads;
    if (p->n_batch)
        o.n_batch = p->n_batch;
    o.n_ctx_max = p->n_ctx;
    /* a shared cache is whole chunks */
    if (p->kv_pool && (int64_t)(p->kv_pool + WK_KV_CHUNK - 1) / WK_KV_CHUNK * WK_KV_CHUNK > o.n_ctx_max)
        o.n_ctx_max = (int64_t)(p->kv_pool + WK_KV_CHUNK - 1) / WK_KV_CHUNK * WK_KV_CHUNK;
    o.layer_begin = st->layer_begin;
    o.layer_end = st->layer_end;
    o.experts = w->remote ? WK_EXPERTS_REMOTE : WK_EXPERTS_LOCAL;
    o.experts_host = where;
    o.device = device;
    if (p->flash_attn > WK_FLASH_OFF)
        return bl_err_set(err, BL_EINVAL, "plan: flash_attn %u is not 0, 1 or 2", p->flash_attn);
    o.flash_attn = (int)p->flash_attn;
    o.no_mmap = p->no_mmap;
    o.mlock = p->mlock;
    o.no_op_offload = p->no_op_offload;
    o.poll = (int)p->poll;
    o.cpu_strict = p->cpu_strict;
    _Static_assert(WK_EXPERTS_VRAM_AUTO == -1, "Plan.experts_vram's automatic value");
    o.experts_vram = p->experts_vram; /* below -1 bp_msg_unpack refused it */
    o.residency = !p->no_residency;
    o.mtp = p->mtp;
    w->mtp = p->mtp && w->last;
    rc = wk_model_load(&w->m, p->model_path, &o, err);
    free(where); /* copied at load */
    if (rc != 0)
        return rc;
    const wk_config_t *cfg = wk_model_config(w->m);
    if (cfg->n_layer != p->n_layers)
        return bl_err_set(err, BL_EINVAL, "plan: %u layers, the model has %lld", p->n_layers,
                          (long long)cfg->n_layer);
    if (w->remote)
        wk_model_set_experts(w->m, experts_remote, w);
    if (w->last && w->out) { /* the logits go from the card straight into the ring */
        void *map;
        size_t map_bytes;
        bl_err_t e2 = {0};
        bp_ring_mapping(w->out, &map, &map_bytes);
        if (wk_model_pin_host(w->m, map, map_bytes, &e2) != 0)
            BL_LOG(BL_LOG_WARN, "event=ring_pin_failed ring=stage-out reason=\"%s\"", e2.msg);
    }

    w->lim = (bp_step_limits_t){
        .n_slots = (int32_t)p->n_slots, .n_batch = (int32_t)o.n_batch, .n_ctx = p->n_ctx,
        .n_out_max = (int32_t)o.n_batch, .n_embd = (int32_t)cfg->n_embd,
        .n_vocab = (int32_t)cfg->n_vocab, .n_layer = (int32_t)cfg->n_layer,
        .n_expert = (int32_t)cfg->n_expert, .n_expert_used = (int32_t)cfg->n_expert_used};
    w->kvs = calloc(p->n_slots, sizeof *w->kvs);
    w->seqs = calloc(p->n_slots, sizeof *w->seqs);
    w->wseqs = calloc(p->n_slots, sizeof *w->wseqs);
    w->tokens = calloc((size_t)o.n_batch, sizeof *w->tokens);
    if (!w->kvs || !w->seqs || !w->wseqs || !w->tokens)
        return bl_err_set(err, BL_ENOMEM, "slots: out of memory");
    if (p->kv_pool && (rc = wk_kv_pool_create(&w->pool, w->m, p->kv_pool, kv_type, err)) != 0)
        return rc;
    if (p->slot_dir && p->slot_dir[0] && !(w->slot_dir = strdup(p->slot_dir)))
        return bl_err_set(err, BL_ENOMEM, "slots: out of memory");
    w->kv_type = kv_type;
    if (p->cache_dir && p->cache_dir[0]) {
        if (!(w->cache_dir = strdup(p->cache_dir)))
            return bl_err_set(err, BL_ENOMEM, "slots: out of memory");
        if (pthread_create(&w->writer, NULL, writer_main, w) != 0)
            return bl_err_set(err, BL_EIO, "the cache writer thread did not start");
        w->writer_on = 1;
    }
    for (uint32_t i = 0; i < p->n_slots; i++)
        if ((rc = w->pool ? wk_kv_create_in(&w->kvs[i], w->pool, p->n_ctx, err)
                          : wk_kv_create(&w->kvs[i], w->m, p->n_ctx, kv_type, err)) != 0)
            return rc;
    /* the bytes the load moved; a stage that reads its weights from the file mapping
     * moved none, and reports the file */
    bp_child_copy_done(&w->ctl, total);
    return 0;
}

/* ------------------------------------------------------------ card links */

/* bp_cardlink_ops_t over the model's card (ctx: the worker), on the step thread. */
static int card_put(void *ctx, int k, size_t nbytes, bl_err_t *err)
{
    worker_t *w = ctx;
    return wk_model_card_put(w->m, k, (int64_t)(nbytes / (sizeof(float) * (size_t)w->lim.n_embd)), err);
}

static int card_get(void *ctx, int k, size_t nbytes, bl_err_t *err)
{
    worker_t *w = ctx;
    return wk_model_card_get(w->m, k, (int64_t)(nbytes / (sizeof(float) * (size_t)w->lim.n_embd)), err);
}

static int card_settle(void *ctx, bl_err_t *err)
{
    worker_t *w = ctx;
    return wk_model_card_settle(w->m, err);
}

/* The sender's half: buffers exported and offered, or the reason they are not
 * (written into why, cap bytes). */
static void card_offer(worker_t *w, uint32_t link, wk_card_t *exp, bp_card_msg_t *cm, char *why, size_t cap)
{
    bl_err_t err = {0};
    *cm = (bp_card_msg_t){.link = link, .reason = ""};
    if (wk_model_card_export(w->m, BP_CARD_BUFS, exp, &err) != 0) {
        snprintf(why, cap, "%s", err.msg[0] ? err.msg : "the buffers could not be exported");
        cm->reason = why;
        return;
    }
    cm->ok = 1;
    cm->device = exp->device;
    cm->buf_bytes = exp->buf_bytes;
    cm->n_bufs = exp->n_bufs;
    memcpy(cm->mem, exp->mem, sizeof cm->mem);
    memcpy(cm->ev, exp->ev, sizeof cm->ev);
}

/* The receiver's half: the offer opened and the link made, or the reason not (into
 * why), as the answer. */
static void card_answer(worker_t *w, const bp_card_msg_t *offer, bp_card_msg_t *ans, char *why, size_t cap)
{
    static const bp_cardlink_ops_t ops = {.get = card_get, .settle = card_settle};
    bl_err_t err = {0};
    *ans = (bp_card_msg_t){.link = offer->link, .answer = 1, .reason = why};
    if (!offer->ok) {
        snprintf(why, cap, "the sender: %s", offer->reason);
        return;
    }
    wk_card_t in = {.device = offer->device, .n_bufs = offer->n_bufs, .buf_bytes = offer->buf_bytes};
    memcpy(in.mem, offer->mem, sizeof in.mem);
    memcpy(in.ev, offer->ev, sizeof in.ev);
    int rc = wk_model_card_import(w->m, &in, &err);
    if (rc == 0 && (rc = bp_cardlink_create(&w->card_in, w->in, in.n_bufs, in.buf_bytes, &ops, w, &err)) != 0)
        wk_model_card_close(w->m, WK_CARD_IN);
    if (rc) {
        snprintf(why, cap, "%s", err.msg);
        return;
    }
    *ans = (bp_card_msg_t){.link = offer->link, .answer = 1, .ok = 1, .reason = ""};
    w->lim.card_bufs = in.n_bufs;
}

/* The sender learns the answer: the link made, or the buffers let go of. */
static void card_answered(worker_t *w, int idx, const bp_card_msg_t *ans, const wk_card_t *exp)
{
    static const bp_cardlink_ops_t ops = {.put = card_put};
    bl_err_t err = {0};
    if (!ans->ok) {
        BL_LOG(BL_LOG_WARN, "event=card_link_off link=%d role=send reason=\"the receiver: %s\"", idx, ans->reason);
        wk_model_card_close(w->m, WK_CARD_OUT);
    } else if (bp_cardlink_create(&w->card_out, w->out, exp->n_bufs, exp->buf_bytes, &ops, w, &err) != 0) {
        /* the receiver takes rows in the message as well: nothing to tell it */
        BL_LOG(BL_LOG_WARN, "event=card_link_off link=%d role=send reason=\"%s\"", idx, err.msg);
        wk_model_card_close(w->m, WK_CARD_OUT);
    } else {
        BL_LOG(BL_LOG_INFO, "event=card_link link=%d role=send buffers=%d device=%d", idx, exp->n_bufs, exp->device);
    }
}

/* The card links of this stage (Plan.stages[].card_next), between the Plan and
 * Ready, on the control thread: as the sender of the link to the next stage it
 * exports and offers its buffers; as the receiver of the link from the previous
 * stage it opens the offer the router relays and answers; as the sender again it
 * learns the answer. Where either end cannot, both keep the host ring, and each
 * logs why. Only a lost router (BL_ECLOSED) fails the start; a message that cannot
 * be sent leaves the peer waiting, which the router's load timeout ends. */
static int card_setup(worker_t *w, const bp_plan_t *p, bl_err_t *err)
{
    const int idx = w->stage;
    const int send = idx + 1 < p->n_stages && p->stages[idx].card_next;
    const int recv = idx > 0 && p->stages[idx - 1].card_next;
    bp_card_msg_t cm = {0};
    wk_card_t exp;
    char why[sizeof err->msg + 16];
    int rc;
    if (send) {
        card_offer(w, (uint32_t)idx, &exp, &cm, why, sizeof why);
        if (!cm.ok)
            BL_LOG(BL_LOG_WARN, "event=card_link_off link=%d role=send reason=\"%s\"", idx, why);
        if ((rc = bp_child_send_card(&w->ctl, &cm, err)) != 0) {
            wk_model_card_close(w->m, WK_CARD_OUT);
            return rc == BL_ECLOSED ? rc : bl_err_set(err, BL_EIO, "card link %d: the offer: %s", idx, err->msg);
        }
    }
    int need_offer = recv, need_answer = send && cm.ok;
    while (need_offer || need_answer) {
        bp_msg_t hold = {0};
        bp_card_msg_t in;
        rc = bp_child_recv_card(&w->ctl, &hold, &in, err);
        if (rc == 0 && need_offer && !in.answer && (int)in.link == idx - 1) {
            bp_card_msg_t ans;
            card_answer(w, &in, &ans, why, sizeof why);
            need_offer = 0;
            if (ans.ok)
                BL_LOG(BL_LOG_INFO, "event=card_link link=%d role=receive buffers=%d from_device=%d", idx - 1,
                       in.n_bufs, in.device);
            else
                BL_LOG(BL_LOG_WARN, "event=card_link_off link=%d role=receive reason=\"%s\"", idx - 1, why);
            if ((rc = bp_child_send_card(&w->ctl, &ans, err)) != 0 && rc != BL_ECLOSED)
                BL_LOG(BL_LOG_WARN, "event=card_link_answer_lost link=%d reason=\"%s\"", idx - 1, err->msg);
        } else if (rc == 0 && need_answer && in.answer && (int)in.link == idx) {
            need_answer = 0;
            card_answered(w, idx, &in, &exp);
        } else if (rc == 0) {
            BL_LOG(BL_LOG_WARN, "event=card_link_unexpected link=%u answer=%d", in.link, in.answer);
        } else if (rc != BL_ECLOSED) {
            BL_LOG(BL_LOG_WARN, "event=bad_control_message reason=\"%s\"", err->msg);
        }
        bp_msg_free(&hold);
        if (rc == BL_ECLOSED)
            return rc;
    }
    return 0;
}

/* The Stats counters (control thread): steps, rows and errors; with residency slots on
 * the card also the slots, their bytes, the moves and evictions, and for each layer of
 * the stage that has counted selections its selections and card hits, named
 * expert_selections_l<l> and expert_card_hits_l<l> (the router shows each pair as one
 * metric with a layer label). Layers past cap are left out. */
static int worker_stats(void *ud, bp_counter_t *out, int cap)
{
    worker_t *w = ud;
    if (cap > BP_CHILD_MAX_COUNTERS)
        cap = BP_CHILD_MAX_COUNTERS; /* stat_names has no more */
    if (cap < 4)
        return 0;
    int n = 0;
    out[n++] = (bp_counter_t){"steps", atomic_load(&w->n_steps)};
    out[n++] = (bp_counter_t){"rows", atomic_load(&w->n_rows)};
    out[n++] = (bp_counter_t){"step_errors", atomic_load(&w->n_errors)};
    out[n++] = (bp_counter_t){"busy_us", atomic_load(&w->busy_us)};
    wk_resid_stats_t rs = {0};
    wk_model_resid_stats(w->m, &rs);
    if (rs.slots <= 0 || n + 4 > cap)
        return n;
    out[n++] = (bp_counter_t){"expert_slots", (uint64_t)rs.slots};
    out[n++] = (bp_counter_t){"expert_slot_bytes", (uint64_t)rs.slot_bytes};
    out[n++] = (bp_counter_t){"expert_moves", rs.moves};
    out[n++] = (bp_counter_t){"expert_evictions", rs.evictions};
    for (int64_t l = w->layer_begin; l < w->layer_end && n + 2 <= cap; l++) {
        uint64_t sel = 0, hits = 0;
        wk_model_resid_layer(w->m, l, &sel, &hits);
        if (sel == 0)
            continue;
        snprintf(w->stat_names[n], sizeof w->stat_names[n], "expert_selections_l%d", (int)l); /* l < 4096 */
        out[n] = (bp_counter_t){w->stat_names[n], sel};
        n++;
        snprintf(w->stat_names[n], sizeof w->stat_names[n], "expert_card_hits_l%d", (int)l);
        out[n] = (bp_counter_t){w->stat_names[n], hits};
        n++;
    }
    return n;
}

/* The CPU's model name for the device inventory. */
static void cpu_name(char *buf, size_t cap)
{
    snprintf(buf, cap, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(buf, cap, "%s", colon + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    }
    if (f)
        fclose(f);
}

/* The names list_gpus points into. */
typedef struct kcuda_names {
    char name[16][256];
} kcuda_names_t;

/* This host's CUDA devices for the Hello (none in a build without CUDA, or where
 * there is no GPU or driver); listing them creates no context on them. */
static int list_gpus(bp_gpu_t *out, kcuda_names_t *names, int cap)
{
    int n = 0;
#if BL_HAVE_CUDA
    bl_err_t err = {0};
    if (kcuda_device_count(&n, &err) != 0) {
        BL_LOG(BL_LOG_WARN, "event=cuda_unavailable reason=\"%s\"", err.msg);
        return 0;
    }
    n = n < cap ? n : cap;
    int k = 0;
    for (int i = 0; i < n; i++) {
        kcuda_device_info_t info;
        if (kcuda_device_query(i, &info, &err) != 0) {
            BL_LOG(BL_LOG_WARN, "event=cuda_device_unreadable device=%d reason=\"%s\"", i, err.msg);
            continue;
        }
        snprintf(names->name[k], sizeof names->name[k], "%s", info.name);
        out[k] = (bp_gpu_t){.name = names->name[k], .memory_bytes = info.total_bytes,
                            .cc_major = (uint32_t)info.cc_major, .cc_minor = (uint32_t)info.cc_minor,
                            .sms = (uint32_t)info.sm_count, .index = i};
        k++;
    }
    n = k;
#else
    (void)out, (void)names, (void)cap;
#endif
    return n;
}

/* --list-devices: this host's CUDA devices as the router's placement plan reads them,
 * one line each, "cuda INDEX TOTAL_BYTES FREE_BYTES read_mbps=N NAME" (free memory
 * needs a context on each device, which this process makes and leaves by exiting; the
 * rate a copy on it, read_mbps=0 where that failed). Nothing in a build without CUDA
 * or where there is no GPU. */
static int print_devices(void)
{
    bl_device_t devs[64];
    int n = 0;
    bl_err_t err = {0};
    if (wk_devices(devs, 64, &n, &err) != 0) {
        fprintf(stderr, "bloomery-worker: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        /* the card's rate, for a hostfile's split: a copy of 64 MiB, after its free
         * memory was read (a card that cannot spare it keeps 0: not known); only
         * here, not in every placement that lists the cards */
        double bps = 0;
        bl_err_t e2 = {0};
        if (devs[i].free_bytes > ((uint64_t)256 << 20) &&
            wk_cuda_copy_rate(devs[i].index, (size_t)64 << 20, &bps, &e2) == 0)
            devs[i].read_mbps = bps / 1e6 < 100000000.0 ? (uint32_t)(bps / 1e6) : 100000000u;
        char name[sizeof devs[i].name];
        size_t k = 0;
        for (const char *c = devs[i].name; *c && k + 1 < sizeof name; c++) /* one line, printable */
            name[k++] = (*c >= 0x20 && *c < 0x7f) ? *c : '?';
        name[k] = '\0';
        printf("cuda %d %llu %llu read_mbps=%u %s\n", devs[i].index, (unsigned long long)devs[i].total_bytes,
               (unsigned long long)devs[i].free_bytes, devs[i].read_mbps, name);
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

static void worker_free(worker_t *w, uint32_t n_slots)
{
    if (w->writer_on) { /* the queued parts are written before the writer ends */
        pthread_mutex_lock(&w->wmu);
        w->writer_stop = 1;
        pthread_cond_broadcast(&w->wcv);
        pthread_mutex_unlock(&w->wmu);
        pthread_join(w->writer, NULL);
        w->writer_on = 0;
        for (int i = 0; i < w->n_jobs; i++)
            if (w->jobs[i].dropped)
                wk_kv_state_free(w->m, w->jobs[i].mem);
        w->n_jobs = 0;
    }
    free(w->cache_dir);
    for (uint32_t i = 0; w->kvs && i < n_slots; i++)
        wk_kv_free(w->kvs[i]);
    free(w->kvs);
    wk_kv_pool_free(w->pool);
    free(w->slot_dir);
    for (size_t i = 0; i < w->n_entries; i++)
        wk_kv_state_free(w->m, w->entries[i].mem);
    for (int i = 0; i < w->n_spare; i++)
        wk_kv_state_free(w->m, w->spare[i].mem);
    free(w->entries);
    free(w->seqs);
    free(w->wseqs);
    free(w->tokens);
    bp_cardlink_destroy(w->card_in);
    bp_cardlink_destroy(w->card_out);
    wk_model_free(w->m); /* its card buffers with it */
    bp_ring_destroy(w->in);
    bp_ring_destroy(w->out);
    for (int k = 0; k <= BP_PLAN_MAX_TIERS; k++) {
        bp_ring_destroy(w->xl[k].out);
        bp_ring_destroy(w->xl[k].in);
    }
    free(w->xt);
    bp_child_stop(&w->ctl);
}

/* ------------------------------------------------------------ an expert tier */

/* A worker that is one of the plan's expert tiers: the routed experts of the layers
 * the plan gives it, loaded alone on its card (WK_EXPERTS_ONLY), computed for every
 * stage on that stage's ring pair by one thread (proto/xserve.h); the main thread
 * keeps the control plane. */
typedef struct tier {
    bp_child_t *ctl;
    wk_model_t *m;
    bp_xserve_t xs;
    _Atomic int stop;
} tier_t;

static int tier_experts(void *ctx, int32_t layer, const float *rows, int32_t n, const int32_t *counts,
                        const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    return wk_model_experts(ctx, layer, rows, n, counts, ids, wts, out, err);
}

static int tier_stats(void *ud, bp_counter_t *out, int cap)
{
    return bp_xserve_stats(&((tier_t *)ud)->xs, out, cap);
}

static int tier_load(tier_t *t, const bp_plan_t *p, int k, int cards_as_cpu, bl_err_t *err)
{
    const bp_plan_tier_t *tr = &p->tiers[k];
    if (p->n_batch > 65536 || p->threads > 256 || p->poll > 100)
        return bl_err_set(err, BL_EINVAL, "plan: n_batch %u, threads %u or poll %u out of range", p->n_batch,
                          p->threads, p->poll);
    bp_xserve_t *x = &t->xs;
    snprintf(t->ctl->label, sizeof t->ctl->label, "tier %d", k);
    x->who = t->ctl->label;
    x->stop = &t->stop;
    x->fn = tier_experts;
    int rc = bp_xserve_attach(x, p->n_stages, err);
    if (rc)
        return rc;
    uint8_t *mine = calloc(p->n_layers ? p->n_layers : 1, 1);
    if (!mine)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %u layers", p->n_layers);
    int any = 0;
    for (uint32_t l = 0; l < p->n_layers; l++)
        any |= mine[l] = p->tier[l] == k + 1;
    struct stat sb;
    const uint64_t total = stat(p->model_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    wk_model_opts_t o;
    wk_model_opts_default(&o);
    t->ctl->copy_stage = "experts";
    o.progress = bp_child_copy_progress;
    o.progress_ud = t->ctl;
    o.experts = WK_EXPERTS_ONLY;
    o.experts_host = mine;
    o.device = tr->device >= 0 && !cards_as_cpu ? tr->device : WK_DEVICE_CPU;
    o.n_threads = p->threads ? (int)p->threads : 1;
    if (p->n_batch)
        o.n_batch = p->n_batch;
    o.no_mmap = p->no_mmap;
    o.mlock = p->mlock;
    o.poll = (int)p->poll;
    o.cpu_strict = p->cpu_strict;
    rc = any ? wk_model_load(&t->m, p->model_path, &o, err)
             : bl_err_set(err, BL_EINVAL, "plan: tier %d computes no layer's experts", k);
    free(mine);
    if (rc != 0)
        return rc;
    const wk_config_t *c = wk_model_config(t->m);
    if (c->n_layer != p->n_layers)
        return bl_err_set(err, BL_EINVAL, "plan: %u layers, the model has %lld", p->n_layers, (long long)c->n_layer);
    x->ctx = t->m;
    x->lim = (bp_step_limits_t){.n_slots = (int32_t)p->n_slots, .n_batch = (int32_t)o.n_batch, .n_ctx = p->n_ctx,
                                .n_embd = (int32_t)c->n_embd, .n_vocab = (int32_t)c->n_vocab,
                                .n_layer = (int32_t)c->n_layer, .n_expert = (int32_t)c->n_expert,
                                .n_expert_used = (int32_t)c->n_expert_used};
    if ((rc = bp_xserve_init(x, err)) != 0)
        return rc;
    bp_child_copy_done(t->ctl, total);
    return 0;
}

static void tier_free(tier_t *t)
{
    bp_xserve_free(&t->xs);
    wk_model_free(t->m);
}

/* The worker as tier k of plan p, until the router stops it; the exit status. */
static int run_tier(bp_child_t *ctl, const bp_plan_t *p, int k, int cards_as_cpu)
{
    static tier_t t;
    t.ctl = ctl;
    ctl->process = p->you;
    bl_err_t err = {0};
    if (tier_load(&t, p, k, cards_as_cpu, &err) != 0) {
        bp_child_fatal(ctl, &err);
        tier_free(&t);
        return 1;
    }
    const int device = p->tiers[k].device >= 0 && !cards_as_cpu ? p->tiers[k].device : -1;
    char kernels[BP_MSG_MAX_KERNELS + 1];
    if (device >= 0)
        snprintf(kernels, sizeof kernels, "CUDA%d %s", device, wk_model_kernels(t.m));
    else
        snprintf(kernels, sizeof kernels, "CPU %s", wk_model_kernels(t.m));
    bp_child_ready(ctl, 0, 0, 0, kernels);
    BL_LOG(BL_LOG_INFO, "event=ready role=tier tier=%d stages=%d kernels=%s", k, t.xs.n_pairs, kernels);
    pthread_t th;
    if (pthread_create(&th, NULL, bp_xserve_main, &t.xs) != 0) {
        bl_err_set(&err, BL_ENOMEM, "cannot start the ring thread");
        bp_child_fatal(ctl, &err);
        tier_free(&t);
        return 1;
    }
    bp_child_control_loop(ctl, &t.stop, tier_stats, &t);
    pthread_join(th, NULL);
    tier_free(&t);
    return 0;
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *name = "worker", *identity = NULL;
    int64_t parent = 0;
    int verbose = 0, quiet = 0, help = 0, colors = 0, devices = 0, cards_as_cpu = 0;
    int64_t verbosity = -1;
    bl_arg_t args[] = {
        {"--control", NULL, BL_ARG_STR, &endpoint, .metavar = "ENDPOINT", .help = "the router's control socket"},
        {"--name", NULL, BL_ARG_STR, &name, .metavar = "NAME", .help = "this process in logs and errors (worker0)"},
        {"--identity", NULL, BL_ARG_STR, &identity, .metavar = "ID", .help = "routing id on the control socket"},
        {"--parent", NULL, BL_ARG_I64, &parent, 1, INT32_MAX, .metavar = "PID", .help = "the router's pid"},
        {"-v,--verbose", NULL, BL_ARG_FLAG, &verbose, .help = "log at DEBUG"},
        {"--log-disable", NULL, BL_ARG_FLAG, &quiet, .help = "write no log lines"},
        {"-lv,--verbosity", NULL, BL_ARG_I64, &verbosity, 0, 100, .metavar = "N", .help = "llama.cpp's log threshold: 1 error, 2 warning, 3 info, 4 debug"},
        {"--log-colors", NULL, BL_ARG_FLAG, &colors, .help = "colour the level names"},
        {"--list-devices", NULL, BL_ARG_FLAG, &devices, .help = "print this host's CUDA devices (index, bytes, free bytes, name) and exit"},
        {"--cards-as-cpu", NULL, BL_ARG_FLAG, &cards_as_cpu, .help = "run the stage or expert tier the plan puts on a card on the CPU (tests of multi-card plans on a machine without cards)"},
    };
    int n_args = (int)(sizeof args / sizeof args[0]);
    bl_err_t err = {0};
    if (bl_args_parse(args, n_args, argc, argv, NULL, &help, &err)) {
        fprintf(stderr, "bloomery-worker: %s\n", err.msg);
        return 2;
    }
    if (devices && !help)
        return print_devices();
    if (help || !endpoint || !parent) {
        bl_args_usage(help ? stdout : stderr, "bloomery-worker",
                      "--control ENDPOINT --parent PID [options] (started by bloomery-serve)",
                      args, n_args);
        return help ? 0 : 2;
    }
    bl_log_init(name, quiet           ? BL_LOG_OFF
                    : verbosity >= 0 ? bl_log_level_of_verbosity(verbosity)
                    : verbose        ? BL_LOG_DEBUG
                                     : BL_LOG_INFO);
    bl_log_set_colors(colors);
    static worker_t w;
    pthread_mutex_init(&w.wmu, NULL);
    pthread_cond_init(&w.wcv, NULL);
    int rc = bp_child_start(&w.ctl, endpoint, identity ? identity : name, (pid_t)parent, name, &err);
    if (rc) {
        BL_LOG(BL_LOG_ERROR, "event=start_failed reason=\"%s\"", err.msg);
        bp_child_stop(&w.ctl);
        return 1;
    }
    char cpu[128];
    cpu_name(cpu, sizeof cpu);
    bp_gpu_t gpus[16];
    kcuda_names_t names;
    const int n_gpus = list_gpus(gpus, &names, 16);
    bp_child_hello_gpus(&w.ctl, BP_CHILD_WORKER, cpu, gpus, n_gpus);
    bp_msg_t plan = {0};
    if ((rc = bp_child_recv_plan(&w.ctl, &plan, &err)) != 0) {
        bp_msg_free(&plan);
        worker_free(&w, 0);
        return rc == BL_ECLOSED ? 0 : 1;
    }
    static bp_plan_t pl;
    if ((rc = bp_plan_read(&plan, &pl, &err)) != 0) {
        bp_child_fatal(&w.ctl, &err);
        bp_msg_free(&plan);
        worker_free(&w, 0);
        return 1;
    }
    for (int k = 0; k < pl.n_tiers; k++)
        if (pl.tiers[k].process == pl.you) {
            rc = run_tier(&w.ctl, &pl, k, cards_as_cpu);
            bp_msg_free(&plan);
            worker_free(&w, 0);
            return rc;
        }
    if (cards_as_cpu)
        for (int i = 0; i < pl.n_stages; i++) {
            pl.stages[i].device = -1;
            pl.stages[i].card_next = 0;
        }
    uint32_t n_slots = pl.n_slots;
    if ((rc = load_stage(&w, &pl, &err)) != 0) {
        bp_child_fatal(&w.ctl, &err);
        bp_msg_free(&plan);
        worker_free(&w, n_slots);
        return 1;
    }
    if ((rc = card_setup(&w, &pl, &err)) != 0) {
        if (rc != BL_ECLOSED)
            bp_child_fatal(&w.ctl, &err);
        bp_msg_free(&plan);
        worker_free(&w, n_slots);
        return rc == BL_ECLOSED ? 0 : 1;
    }
    int to_tier = 0; /* some layer of this stage sends its experts to a tier */
    for (int k = 1; k <= pl.n_tiers; k++)
        to_tier |= w.xl[k].out != NULL;
    char vram[24] = "auto";
    if (pl.experts_vram != WK_EXPERTS_VRAM_AUTO)
        snprintf(vram, sizeof vram, "%lld", (long long)pl.experts_vram);
    BL_LOG(BL_LOG_INFO, "event=ready layers=%lld..%lld threads=%d threads_batch=%d kernels=%s experts=%s "
           "residency=%s experts_vram=%s", (long long)w.layer_begin, (long long)w.layer_end, w.threads,
           w.threads_batch, wk_model_kernels(w.m), !w.remote ? "local" : w.xl[0].out && to_tier ? "hosttier+tier"
                                                   : w.xl[0].out ? "hosttier" : "tier", pl.no_residency ? "off" : "on",
           vram);
    bp_msg_free(&plan);
    char kernels[BP_MSG_MAX_KERNELS + 1];
    if (w.device >= 0)
        snprintf(kernels, sizeof kernels, "CUDA%d %s", w.device, wk_model_kernels(w.m));
    else
        snprintf(kernels, sizeof kernels, "CPU %s", wk_model_kernels(w.m));
    bp_child_ready(&w.ctl, (uint64_t)w.lim.n_vocab, (uint64_t)w.lim.n_embd,
                   (uint64_t)wk_model_config(w.m)->n_layer, kernels);

    pthread_t th;
    if (pthread_create(&th, NULL, step_main, &w) != 0) {
        bl_err_set(&err, BL_ENOMEM, "cannot start the step thread");
        bp_child_fatal(&w.ctl, &err);
        worker_free(&w, n_slots);
        return 1;
    }
    bp_child_control_loop(&w.ctl, &w.stop, worker_stats, &w);
    pthread_join(th, NULL);
    worker_free(&w, n_slots);
    return 0;
}
