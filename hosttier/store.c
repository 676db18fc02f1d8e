/* The hosttier's expert store (store.h). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "gguf.h"
#include "heat.h"
#include "kcpu.h"
#include "log.h"
#include "store.h"
#include "wmem.h"
#include "xread.h"

/* Read-ahead: while a call of layer L computes, experts of the next held layer that
 * have no slot are read by a thread of the pager's own, on a second reader; the next
 * call waits for them before it looks at its slots. Which experts: by the router
 * (the next layer's gate run early on this call's rows, its top-k of each row), or
 * by heat (the hottest of that layer, each only into the slot of a colder one). */
typedef struct ahead {
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, done, stop; /* under mu */
    int rc;                  /* under mu: the batch's result */
    bl_xr_t *xr;
    bl_xr_req_t *reqs;       /* (3 * max) */
    int32_t *lx;             /* (3 * max): (layer, expert, slot) */
    int n;                   /* items in the batch */
    int max;                 /* experts a batch reads at most (0: read-ahead off) */
    int policy;              /* HT_AHEAD_ROUTER or HT_AHEAD_HEAT */
    double *cand;            /* (n_expert) scratch */
    kcpu_mat_t *gate;        /* (n_layer) router: layer l's gate (n_expert x n_embd, where
                              * the file maps it); data NULL for a layer not held */
    const float **gate_b;    /* (n_layer) its logits' bias (gpt-oss), or NULL */
    const float **probs_b;   /* (n_layer) its choice's bias (exp_probs_b), or NULL */
    float *score;            /* (AHEAD_ROWS, n_expert) the gate's logits */
    int32_t *ids;            /* (AHEAD_ROWS, n_expert_used) the predicted choice */
    float *wts;              /* (AHEAD_ROWS, n_expert_used) and its weights */
} ahead_t;

#define AHEAD_ROWS 8 /* the rows of a call whose routes predict the next layer's */

/* The pager: experts stay in the file and are read into slots of one arena; a slot
 * holds one (layer, expert)'s three slices, each piece with room for the aligned
 * superset O_DIRECT reads. */
typedef struct pager {
    bl_xr_t *xr;
    uint8_t *arena;
    size_t arena_len;
    size_t slot_bytes, piece_off[3];
    int64_t n_slots;
    int32_t *slot_layer, *slot_expert; /* (n_slots): what a slot holds, -1: nothing */
    uint64_t *slot_tick;               /* (n_slots): last use */
    int64_t *slot_pass;                /* (n_slots): the pass that needs it now */
    int32_t *where;                    /* (n_layer * n_expert): its slot, or -1 */
    const void **slices;               /* (n_layer * 3 * n_expert): kcpu_experts_t.slices */
    uint64_t src_off[3];               /* scratch */
    bl_heat_t *heat;
    int64_t last_layer;
    uint64_t tick;
    int64_t pass;
    uint64_t hits, misses, bytes_read, read_ns; /* read by ht_store_pager_stats from another thread */
    bl_xr_req_t *reqs;                 /* (3 * n_slots) */
    int32_t *req_slot;                 /* (n_slots) */
    uint8_t *used;                     /* (n_expert) */
    uint8_t *slot_ahead;               /* (n_slots): read ahead and not used since */
    uint8_t *held;                     /* (n_layer): the store's */
    int64_t n_layer;
    ahead_t ah;
    uint64_t ahead_reads, ahead_used;  /* experts read ahead, and those a call used */
} pager_t;

#define SLOT_LOADING INT64_MAX /* slot_pass of a slot the read-ahead fills: never a victim */

#define HEAT_HALF_LIFE 256.0 /* steps, as residency's */

struct ht_store {
    bl_gguf_t *g;
    bl_arch_t a;
    char path[256];
    int64_t n_batch;
    uint8_t *held;          /* (n_layer) */
    kcpu_experts_t *layers; /* (n_layer): views into the copy (or the mapping) */
    uint8_t *copy;          /* anonymous memory holding the experts, or NULL */
    size_t copy_len;
    int64_t n_copied;   /* held layers in the copy */
    uint64_t bytes;
    kcpu_ctx_t *kc;
    kcpu_experts_scratch_t *xs;
    pager_t *pg;                                /* NULL: every held expert in RAM */
    const bl_gguf_tensor_t *(*src)[3];          /* (n_layer): the file's tensors */
};

static void ahead_stop(ahead_t *a)
{
    if (a->started) {
        pthread_mutex_lock(&a->mu);
        a->stop = 1;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->thread, NULL);
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        a->started = 0;
    }
    bl_xr_close(a->xr);
    free(a->reqs);
    free(a->lx);
    free(a->cand);
    free(a->gate);
    free(a->score);
    free(a->gate_b);
    free(a->probs_b);
    free(a->ids);
    free(a->wts);
}

static void pager_free(pager_t *p)
{
    if (!p)
        return;
    ahead_stop(&p->ah);
    bl_xr_close(p->xr);
    if (p->arena)
        munmap(p->arena, p->arena_len);
    free(p->slot_layer);
    free(p->slot_expert);
    free(p->slot_tick);
    free(p->slot_pass);
    free(p->where);
    free(p->slices);
    free(p->reqs);
    free(p->req_slot);
    free(p->used);
    free(p->slot_ahead);
    bl_heat_free(p->heat);
    free(p);
}

void ht_store_close(ht_store_t *s)
{
    if (!s)
        return;
    kcpu_experts_scratch_destroy(s->xs);
    kcpu_ctx_destroy(s->kc);
    pager_free(s->pg);
    free(s->src);
    if (s->copy)
        munmap(s->copy, s->copy_len);
    free(s->layers);
    free(s->held);
    bl_gguf_close(s->g);
    free(s);
}

const bl_arch_t *ht_store_arch(const ht_store_t *s) { return &s->a; }
const char *ht_store_kernels(const ht_store_t *s)
{
    (void)s;
    return kcpu_variant_name();
}
uint64_t ht_store_bytes(const ht_store_t *s) { return s->bytes; }

int64_t ht_store_layers_copied(const ht_store_t *s) { return s->n_copied; }

/* The three expert tensors of layer l, checked. */
static int find_layer(ht_store_t *s, int64_t l, const bl_gguf_tensor_t *t[3], bl_err_t *err)
{
    const bl_arch_t *a = &s->a;
    static const char *const names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)l, names[i]);
        const int64_t ne0 = i < 2 ? a->n_embd : a->n_ff_exp, ne1 = i < 2 ? a->n_ff_exp : a->n_embd;
        int rc = bl_arch_tensor(s->g, s->path, name, ne0, ne1, a->n_expert, 0, &t[i], err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* gpt-oss's expert biases of layer l (f32, read where the file maps them: a few
 * KB an expert, so they are not paged). */
static int find_biases(ht_store_t *s, int64_t l, kcpu_experts_t *e, bl_err_t *err)
{
    const bl_arch_t *a = &s->a;
    static const char *const names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    const float **dst[3] = {&e->gate_b, &e->up_b, &e->down_b};
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%lld.%s.bias", (long long)l, names[i]);
        const bl_gguf_tensor_t *t;
        int rc = bl_arch_tensor(s->g, s->path, name, i < 2 ? a->n_ff_exp : a->n_embd, a->n_expert, 1, 1, &t, err);
        if (rc < 0)
            return rc;
        *dst[i] = t->data;
    }
    return 0;
}

// --- the pager ---------------------------------------------------------------------------

/* Expert x of layer l's slice i in its file: part, offset, bytes. */
static void slice_src(const ht_store_t *s, int64_t l, int i, int64_t x, uint32_t *part, uint64_t *off, size_t *len)
{
    const bl_gguf_tensor_t *t = s->src[l][i];
    *len = (size_t)(t->nbytes / (uint64_t)s->a.n_expert);
    *part = t->part;
    *off = t->file_offset + (uint64_t)x * *len;
}

static uint64_t now_ns(void);

/* The read-ahead thread: one batch at a time, each request's data set as a call's. */
static void *ahead_main(void *arg)
{
    ahead_t *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->pending && !a->stop)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->stop)
            break;
        pthread_mutex_unlock(&a->mu);
        bl_err_t err = {0};
        const int rc = bl_xr_read(a->xr, a->reqs, 3 * a->n, &err);
        if (rc < 0) /* the call that needs the expert reads it again and reports */
            BL_LOG(BL_LOG_DEBUG, "event=read_ahead_failed reason=\"%s\"", err.msg);
        pthread_mutex_lock(&a->mu);
        a->rc = rc;
        a->pending = 0;
        a->done = 1;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static size_t up_to(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* The three requests of each (layer, expert, slot) load of lx into reqs. */
static void fill_reqs(ht_store_t *s, const bl_xr_t *xr, const int32_t *lx, int n, bl_xr_req_t *reqs)
{
    pager_t *p = s->pg;
    for (int k = 0; k < n; k++) {
        const int64_t l = lx[3 * k], x = lx[3 * k + 1], v = lx[3 * k + 2];
        for (int i = 0; i < 3; i++) {
            uint32_t part;
            uint64_t off;
            size_t len;
            slice_src(s, l, i, x, &part, &off, &len);
            reqs[3 * k + i] = (bl_xr_req_t){.file = (int)part, .off = off, .len = len,
                                            .buf = p->arena + (size_t)v * p->slot_bytes + p->piece_off[i],
                                            .cap = (i < 2 ? p->piece_off[i + 1] : p->slot_bytes) - p->piece_off[i]};
            __atomic_fetch_add(&p->bytes_read, bl_xr_span(xr, (int)part, off, len), __ATOMIC_RELAXED);
        }
    }
}

/* The loads of lx after their reads: each in its slot, or (rc < 0) the slots empty. */
static void commit_reads(ht_store_t *s, const int32_t *lx, int n, const bl_xr_req_t *reqs, int rc)
{
    pager_t *p = s->pg;
    const int64_t NE = s->a.n_expert;
    for (int k = 0; k < n; k++) {
        const int64_t l = lx[3 * k], x = lx[3 * k + 1], v = lx[3 * k + 2];
        if (rc < 0) {
            p->slot_layer[v] = p->slot_expert[v] = -1;
            continue;
        }
        p->where[l * NE + x] = (int32_t)v;
        for (int i = 0; i < 3; i++)
            p->slices[(l * NE + x) * 3 + i] = reqs[3 * k + i].data;
    }
}

/* Reads the n (layer, expert, slot) loads of items into their slots: three requests
 * each, depth at a time. On failure the slots are left empty. */
static int pager_read(ht_store_t *s, const int32_t *lx, int n, bl_err_t *err)
{
    pager_t *p = s->pg;
    int rc = bl_xr_check(p->xr, err);
    if (rc == 0) {
        fill_reqs(s, p->xr, lx, n, p->reqs);
        const uint64_t t0 = now_ns();
        rc = bl_xr_read(p->xr, p->reqs, 3 * n, err);
        __atomic_fetch_add(&p->read_ns, now_ns() - t0, __ATOMIC_RELAXED);
    }
    commit_reads(s, lx, n, p->reqs, rc);
    __atomic_fetch_add(&p->misses, (uint64_t)n, __ATOMIC_RELAXED);
    return rc;
}

/* Waits for the read-ahead batch in flight, if any, and puts its experts in their
 * slots (a failed batch leaves them empty: a call that needs one reads it itself). */
static void ahead_finish(ht_store_t *s)
{
    pager_t *p = s->pg;
    ahead_t *a = &p->ah;
    if (!a->n)
        return;
    const uint64_t t0 = now_ns();
    pthread_mutex_lock(&a->mu);
    while (!a->done)
        pthread_cond_wait(&a->cv, &a->mu);
    a->done = 0;
    int rc = a->rc;
    pthread_mutex_unlock(&a->mu);
    __atomic_fetch_add(&p->read_ns, now_ns() - t0, __ATOMIC_RELAXED);
    if (rc == 0 && bl_xr_check(p->xr, NULL) < 0)
        rc = BL_EIO; /* read from a changed file: the call's own read reports it */
    commit_reads(s, a->lx, a->n, a->reqs, rc);
    for (int k = 0; k < a->n; k++) {
        const int32_t v = a->lx[3 * k + 2];
        p->slot_pass[v] = 0;
        p->slot_ahead[v] = rc == 0;
    }
    if (rc == 0)
        __atomic_fetch_add(&p->ahead_reads, (uint64_t)a->n, __ATOMIC_RELAXED);
    a->n = 0;
}

/* The held layer after l (the first after the last: the next token's). */
static int64_t next_held(const pager_t *p, int64_t l)
{
    for (int64_t i = 1; i <= p->n_layer; i++) {
        const int64_t n = (l + i) % p->n_layer;
        if (p->held[n])
            return n;
    }
    return l;
}

/* The slot to load into: an empty one, else the coldest by decayed heat (then the
 * least recently used) that this pass does not need. -1: every slot is needed. */
static int64_t pager_victim(pager_t *p)
{
    int64_t best = -1;
    double best_heat = 0;
    for (int64_t v = 0; v < p->n_slots; v++) {
        if (p->slot_pass[v] == p->pass || p->slot_pass[v] == SLOT_LOADING)
            continue;
        if (p->slot_layer[v] < 0)
            return v;
        const double h = bl_heat_of(p->heat, p->slot_layer[v], p->slot_expert[v]);
        if (best < 0 || h < best_heat || (h == best_heat && p->slot_tick[v] < p->slot_tick[best])) {
            best = v;
            best_heat = h;
        }
    }
    return best;
}

static void pager_evict(ht_store_t *s, int64_t v)
{
    pager_t *p = s->pg;
    const int64_t NE = s->a.n_expert;
    if (p->slot_layer[v] < 0)
        return;
    const int64_t at = (int64_t)p->slot_layer[v] * NE + p->slot_expert[v];
    p->where[at] = -1;
    for (int i = 0; i < 3; i++)
        p->slices[at * 3 + i] = NULL;
    p->slot_layer[v] = p->slot_expert[v] = -1;
    p->slot_ahead[v] = 0;
}

/* The experts the next layer nl will likely route the rows xn (n, n_embd) to: each
 * of the first AHEAD_ROWS rows' choice under nl's router (the file's gate and biases
 * on the store's threads, through the routing the workers run, kcpu_moe_route);
 * cand[x] is set to the largest weight that chose x, so the surest come first. */
static void predict_routes(ht_store_t *s, int64_t nl, const float *xn, int64_t n)
{
    ahead_t *a = &s->pg->ah;
    const bl_arch_t *c = &s->a;
    const int64_t NE = c->n_expert, K = c->n_expert_used, rows = n < AHEAD_ROWS ? n : AHEAD_ROWS;
    kcpu_matmul(s->kc, &a->gate[nl], xn, rows, a->score);
    for (int64_t r = 0; a->gate_b[nl] && r < rows; r++)
        for (int64_t x = 0; x < NE; x++)
            a->score[r * NE + x] += a->gate_b[nl][x];
    const kcpu_route_t rt = {.n_expert = NE, .k = K, .n_group = c->n_group, .topk_group = c->topk_group,
                             .gating = (int)c->gating, .norm = c->expert_norm, .scale = c->expert_scale,
                             .bias = a->probs_b[nl]};
    kcpu_moe_route(s->kc, a->score, rows, &rt, a->ids, a->wts);
    for (int64_t i = 0; i < rows * K; i++) {
        /* ranked by the weight, shifted positive (cand > 0 marks a candidate) */
        const double v = 1e6 + (double)a->wts[i];
        if (v > a->cand[a->ids[i]])
            a->cand[a->ids[i]] = v;
    }
}

/* Starts reading experts of the layer after `layer` that have no slot, at most
 * ah.max of them, into slots the call in progress does not use: by the router, the
 * experts it predicts for the call's rows (the predicted ones already in a slot are
 * kept from eviction); by heat, the hottest, each only in place of a colder one. */
static void ahead_start(ht_store_t *s, int64_t layer, const float *xn, int64_t n)
{
    pager_t *p = s->pg;
    ahead_t *a = &p->ah;
    const int64_t NE = s->a.n_expert, nl = next_held(p, layer);
    const int router = a->policy == HT_AHEAD_ROUTER;
    if (!a->max || (router && (nl <= layer || !a->gate[nl].data)))
        return; /* the router predicts within a token only; ahead_finish checks the file */
    if (router) {
        for (int64_t x = 0; x < NE; x++)
            a->cand[x] = 0;
        predict_routes(s, nl, xn, n);
        for (int64_t x = 0; x < NE; x++) {
            const int32_t v = p->where[nl * NE + x];
            if (a->cand[x] > 0 && v >= 0) {
                p->slot_pass[v] = p->pass; /* not a victim of this read-ahead */
                a->cand[x] = -1;
            }
        }
    } else {
        for (int64_t x = 0; x < NE; x++)
            a->cand[x] = p->where[nl * NE + x] >= 0 ? -1.0 : bl_heat_of(p->heat, nl, x);
    }
    int k = 0;
    while (k < a->max) {
        int64_t best = -1;
        for (int64_t x = 0; x < NE; x++)
            if (a->cand[x] > 0 && (best < 0 || a->cand[x] > a->cand[best]))
                best = x;
        if (best < 0)
            break;
        const double h = a->cand[best];
        a->cand[best] = -1;
        const int64_t w = pager_victim(p);
        if (w < 0 || (!router && p->slot_layer[w] >= 0 &&
                      bl_heat_of(p->heat, p->slot_layer[w], p->slot_expert[w]) >= h))
            break; /* no slot holds a colder expert */
        pager_evict(s, w);
        p->slot_layer[w] = (int32_t)nl;
        p->slot_expert[w] = (int32_t)best;
        p->slot_pass[w] = SLOT_LOADING;
        p->slot_tick[w] = ++p->tick;
        a->lx[3 * k] = (int32_t)nl;
        a->lx[3 * k + 1] = (int32_t)best;
        a->lx[3 * k + 2] = (int32_t)w;
        k++;
    }
    if (!k)
        return;
    fill_reqs(s, a->xr, a->lx, k, a->reqs);
    pthread_mutex_lock(&a->mu);
    a->n = k;
    a->pending = 1;
    a->done = 0;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* A layer's experts through the slots: passes over ascending expert ids, each as
 * many of the call's experts as the slots hold at once, their misses read in one
 * batch, computed with kcpu_experts_range onto what the passes before it summed
 * (the bits of one pass over every expert). */
static int pager_experts(ht_store_t *s, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                         const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    pager_t *p = s->pg;
    const int64_t NE = s->a.n_expert, K = s->a.n_expert_used;
    int64_t pairs = 0;
    for (int64_t r = 0; r < n; r++)
        pairs += counts ? counts[r] : K;
    ahead_finish(s);
    if (layer <= p->last_layer)
        bl_heat_step(p->heat);
    p->last_layer = layer;
    bl_heat_add(p->heat, layer, ids, pairs);
    memset(p->used, 0, (size_t)NE);
    for (int64_t j = 0; j < pairs; j++)
        p->used[ids[j]] = 1;
    int first = 1;
    for (int64_t lo = 0; lo < NE;) {
        p->pass++;
        int nm = 0;
        int64_t hi = lo;
        for (int64_t x = lo; x < NE; x++) {
            if (p->used[x]) {
                const int32_t v = p->where[layer * NE + x];
                if (v >= 0) {
                    p->slot_pass[v] = p->pass;
                    p->slot_tick[v] = ++p->tick;
                    __atomic_fetch_add(&p->hits, 1, __ATOMIC_RELAXED);
                    if (p->slot_ahead[v]) {
                        p->slot_ahead[v] = 0;
                        __atomic_fetch_add(&p->ahead_used, 1, __ATOMIC_RELAXED);
                    }
                } else {
                    const int64_t w = pager_victim(p);
                    if (w < 0)
                        break;
                    pager_evict(s, w);
                    p->slot_pass[w] = p->pass;
                    p->slot_tick[w] = ++p->tick;
                    p->slot_layer[w] = (int32_t)layer;
                    p->slot_expert[w] = (int32_t)x;
                    p->req_slot[3 * nm] = (int32_t)layer;
                    p->req_slot[3 * nm + 1] = (int32_t)x;
                    p->req_slot[3 * nm + 2] = (int32_t)w;
                    nm++;
                }
            }
            hi = x + 1;
        }
        int rc = nm ? pager_read(s, p->req_slot, nm, err) : 0;
        if (rc < 0)
            return rc;
        if (hi == NE) /* the last pass: read the next layer's while it computes */
            ahead_start(s, layer, xn, n);
        kcpu_experts_range(s->kc, s->xs, &s->layers[layer], xn, n, counts, K, ids, wts, out, lo, hi, !first);
        first = 0;
        lo = hi;
    }
    return 0;
}

/* The router's gates of the held layers, viewed where the file maps them, for the
 * read-ahead's predictions. */
static int load_gates(ht_store_t *s, bl_err_t *err)
{
    ahead_t *a = &s->pg->ah;
    const bl_arch_t *c = &s->a;
    const size_t L = (size_t)c->n_layer, R = AHEAD_ROWS;
    if (!(a->gate = calloc(L, sizeof *a->gate)) || !(a->gate_b = calloc(L, sizeof *a->gate_b)) ||
        !(a->probs_b = calloc(L, sizeof *a->probs_b)) ||
        !(a->score = malloc(sizeof(float) * R * (size_t)c->n_expert)) ||
        !(a->ids = malloc(sizeof(int32_t) * R * (size_t)c->n_expert_used)) ||
        !(a->wts = malloc(sizeof(float) * R * (size_t)c->n_expert_used)))
        return bl_err_set(err, BL_ENOMEM, "out of memory for the read-ahead");
    for (int64_t l = 0; l < c->n_layer; l++) {
        if (!s->held[l])
            continue;
        char name[96];
        snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.weight", (long long)l);
        const bl_gguf_tensor_t *t;
        int rc = bl_arch_tensor(s->g, s->path, name, c->n_embd, c->n_expert, 1, 0, &t, err);
        if (rc == 0)
            rc = kcpu_mat_init(&a->gate[l], t->data, t->type, c->n_embd, c->n_expert, err);
        if (rc == 0 && c->router_bias) {
            snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.bias", (long long)l);
            if ((rc = bl_arch_tensor(s->g, s->path, name, c->n_expert, 1, 1, 1, &t, err)) == 0)
                a->gate_b[l] = t->data;
        }
        if (rc == 0 && c->expert_bias) {
            snprintf(name, sizeof name, "blk.%lld.exp_probs_b.bias", (long long)l);
            if ((rc = bl_arch_tensor(s->g, s->path, name, c->n_expert, 1, 1, 1, &t, err)) == 0)
                a->probs_b[l] = t->data;
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The read-ahead's reader and thread, with o->read_ahead experts a batch (-1: the
 * default, or BLOOMERY_READ_AHEAD), at most a quarter of the slots. */
static int ahead_open(ht_store_t *s, const ht_store_opts_t *o, const bl_xr_opts_t *xo, const char *const *paths,
                      int np, bl_err_t *err)
{
    pager_t *p = s->pg;
    ahead_t *a = &p->ah;
    int64_t want = o->read_ahead;
    int rc;
    if (want < 0) {
        const char *e = getenv("BLOOMERY_READ_AHEAD");
        char *end = NULL;
        want = e && *e ? strtoll(e, &end, 10) : HT_READ_AHEAD_DEFAULT;
        if (e && *e && (*end || want < 0 || want > 4096))
            return bl_err_set(err, BL_EINVAL, "BLOOMERY_READ_AHEAD=%s: not a count of experts in 0..4096", e);
    }
    a->policy = o->read_ahead_policy;
    if (a->policy == HT_AHEAD_DEFAULT) {
        const char *e = getenv("BLOOMERY_READ_AHEAD_POLICY");
        a->policy = !e || !*e || !strcmp(e, "router") ? HT_AHEAD_ROUTER : !strcmp(e, "heat") ? HT_AHEAD_HEAT : -1;
        if (a->policy < 0)
            return bl_err_set(err, BL_EINVAL, "BLOOMERY_READ_AHEAD_POLICY=%s: not router or heat", e);
    }
    if (a->policy != HT_AHEAD_ROUTER && a->policy != HT_AHEAD_HEAT)
        return bl_err_set(err, BL_EINVAL, "read-ahead policy %d: not router or heat", a->policy);
    if (want > p->n_slots / 4)
        want = p->n_slots / 4;
    if (want > s->a.n_expert)
        want = s->a.n_expert;
    if (want <= 0)
        return 0;
    if (a->policy == HT_AHEAD_ROUTER && (rc = load_gates(s, err)) < 0)
        return rc;
    a->reqs = calloc(3 * (size_t)want, sizeof *a->reqs);
    a->lx = calloc(3 * (size_t)want, sizeof *a->lx);
    a->cand = calloc((size_t)s->a.n_expert, sizeof *a->cand);
    if (!a->reqs || !a->lx || !a->cand)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the read-ahead");
    rc = bl_xr_open(&a->xr, paths, np, xo, err);
    if (rc == 0)
        rc = bl_xr_register(a->xr, p->arena, p->arena_len, err);
    if (rc < 0)
        return rc;
    BL_LOG(BL_LOG_INFO, "event=read_ahead experts=%lld policy=%s", (long long)want,
           a->policy == HT_AHEAD_ROUTER ? "router" : "heat");
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, ahead_main, a) != 0) {
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        return bl_err_set(err, BL_ENOMEM, "cannot start the read-ahead thread");
    }
    a->started = 1;
    a->max = (int)want;
    return 0;
}

/* The pager for a held share of held_bytes that passes o->ram_bytes: the reader, the
 * slots, and their first fill in layer and expert order. */
static int pager_open(ht_store_t *s, const ht_store_opts_t *o, bl_err_t *err)
{
    const bl_arch_t *a = &s->a;
    const int64_t NE = a->n_expert, L = a->n_layer;
    pager_t *p = calloc(1, sizeof *p);
    if (!p)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the pager");
    s->pg = p;
    const uint32_t np = bl_gguf_n_parts(s->g);
    const char *paths[256];
    if (np < 1 || np > 256)
        return bl_err_set(err, BL_ENOTSUP, "%s: %u parts (the pager reads at most 256)", s->path, np);
    for (uint32_t i = 0; i < np; i++)
        paths[i] = bl_gguf_part_path(s->g, i);
    const bl_xr_opts_t xo = {.kind = o->disk_kind, .direct = !o->disk_cached, .depth = o->disk_depth};
    int rc = bl_xr_open(&p->xr, paths, (int)np, &xo, err);
    if (rc < 0)
        return rc;
    /* a piece holds the largest aligned superset of its slice over every layer */
    size_t cap[3] = {0};
    int64_t held = 0;
    for (int64_t l = 0; l < L; l++) {
        if (!s->held[l])
            continue;
        held += NE;
        for (int i = 0; i < 3; i++)
            for (int64_t x = 0; x < NE; x++) {
                uint32_t part;
                uint64_t off;
                size_t len;
                slice_src(s, l, i, x, &part, &off, &len);
                const size_t sp = bl_xr_span(p->xr, (int)part, off, len);
                cap[i] = sp > cap[i] ? sp : cap[i];
            }
    }
    const size_t al = bl_xr_mem_align(p->xr) > 4096 ? bl_xr_mem_align(p->xr) : 4096;
    p->piece_off[0] = 0;
    p->piece_off[1] = up_to(cap[0], al);
    p->piece_off[2] = p->piece_off[1] + up_to(cap[1], al);
    p->slot_bytes = p->piece_off[2] + up_to(cap[2], al);
    p->n_slots = (int64_t)(o->ram_bytes / p->slot_bytes);
    if (p->n_slots < 1)
        p->n_slots = 1; /* a call needs room for one expert at least */
    if (p->n_slots > held)
        p->n_slots = held;
    const size_t ns = (size_t)p->n_slots;
    p->arena = bl_wmem_alloc((uint64_t)ns * p->slot_bytes, 1, &p->arena_len);
    p->slot_layer = malloc(ns * sizeof *p->slot_layer);
    p->slot_expert = malloc(ns * sizeof *p->slot_expert);
    p->slot_tick = calloc(ns, sizeof *p->slot_tick);
    p->slot_pass = calloc(ns, sizeof *p->slot_pass);
    p->where = malloc((size_t)(L * NE) * sizeof *p->where);
    p->slices = calloc((size_t)(L * NE * 3), sizeof *p->slices);
    p->reqs = calloc(3 * ns, sizeof *p->reqs);
    p->req_slot = calloc(3 * ns, sizeof *p->req_slot);
    p->used = calloc((size_t)NE, 1);
    p->slot_ahead = calloc(ns, 1);
    p->held = s->held;
    p->n_layer = L;
    if (!p->arena || !p->slot_layer || !p->slot_expert || !p->slot_tick || !p->slot_pass || !p->where ||
        !p->slices || !p->reqs || !p->req_slot || !p->used || !p->slot_ahead)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %lld expert slots of %zu bytes", (long long)p->n_slots,
                          p->slot_bytes);
    for (size_t v = 0; v < ns; v++)
        p->slot_layer[v] = p->slot_expert[v] = -1;
    for (int64_t i = 0; i < L * NE; i++)
        p->where[i] = -1;
    p->last_layer = -1;
    if ((rc = bl_heat_create(&p->heat, L, NE, HEAT_HALF_LIFE, err)) < 0 ||
        (rc = bl_xr_register(p->xr, p->arena, p->arena_len, err)) < 0)
        return rc;
    for (int64_t l = 0; l < L; l++)
        if (s->held[l])
            s->layers[l].slices = p->slices + l * NE * 3;
    /* the first fill: the slots in layer and expert order, 64 experts a batch */
    int64_t v = 0, fill = 0;
    for (int64_t l = 0; l < L; l++)
        fill += s->held[l] ? NE : 0;
    fill = fill < p->n_slots ? fill : p->n_slots;
    const uint64_t fill_bytes = (uint64_t)fill * p->slot_bytes;
    for (int64_t l = 0; l < L && v < p->n_slots; l++)
        for (int64_t x = 0; s->held[l] && x < NE && v < p->n_slots;) {
            int nb = 0;
            for (; nb < 64 && x < NE && v < p->n_slots; nb++, x++, v++) {
                p->slot_layer[v] = (int32_t)l;
                p->slot_expert[v] = (int32_t)x;
                p->req_slot[3 * nb] = (int32_t)l;
                p->req_slot[3 * nb + 1] = (int32_t)x;
                p->req_slot[3 * nb + 2] = (int32_t)v;
            }
            if ((rc = pager_read(s, p->req_slot, nb, err)) < 0)
                return rc;
            if (o->fill_progress)
                o->fill_progress(o->progress_ud, (uint64_t)v * p->slot_bytes, fill_bytes);
        }
    __atomic_store_n(&p->misses, 0, __ATOMIC_RELAXED); /* the fill is not a miss */
    if ((rc = ahead_open(s, o, &xo, paths, (int)np, err)) < 0)
        return rc;
    const double fill_s = (double)__atomic_load_n(&p->read_ns, __ATOMIC_RELAXED) / 1e9;
    BL_LOG(BL_LOG_INFO, "event=pager slots=%lld slot_bytes=%zu ram_bytes=%llu experts=%lld backend=%s direct=%d "
           "read_ahead=%d fill_bytes=%llu fill_s=%.2f", (long long)p->n_slots, p->slot_bytes,
           (unsigned long long)((uint64_t)ns * p->slot_bytes), (long long)held, bl_xr_backend(p->xr),
           bl_xr_direct(p->xr, 0), p->ah.max, (unsigned long long)__atomic_load_n(&p->bytes_read, __ATOMIC_RELAXED),
           fill_s);
    return 0;
}

void ht_store_pager_stats(const ht_store_t *s, ht_store_pager_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!s->pg)
        return;
    out->paged = 1;
    out->slots = s->pg->n_slots;
    out->hits = __atomic_load_n(&s->pg->hits, __ATOMIC_RELAXED);
    out->misses = __atomic_load_n(&s->pg->misses, __ATOMIC_RELAXED);
    out->bytes_read = __atomic_load_n(&s->pg->bytes_read, __ATOMIC_RELAXED);
    out->read_ns = __atomic_load_n(&s->pg->read_ns, __ATOMIC_RELAXED);
    out->ahead = s->pg->ah.max;
    out->ahead_reads = __atomic_load_n(&s->pg->ahead_reads, __ATOMIC_RELAXED);
    out->ahead_used = __atomic_load_n(&s->pg->ahead_used, __ATOMIC_RELAXED);
    out->backend = bl_xr_backend(s->pg->xr);
}

int ht_store_open(ht_store_t **out, const ht_store_opts_t *o, bl_err_t *err)
{
    *out = NULL;
    if (!o->path || o->n_threads < 1 || o->n_threads > 256 || o->n_batch < 1 || o->n_batch > 65536)
        return bl_err_set(err, BL_EINVAL, "expert store: %d threads, %lld rows per call", o->n_threads,
                          (long long)o->n_batch);
    ht_store_t *s = calloc(1, sizeof *s);
    if (!s)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the expert store");
    snprintf(s->path, sizeof s->path, "%s", o->path);
    s->n_batch = o->n_batch;
    int rc = bl_gguf_open(&s->g, o->path, err);
    if (rc == 0)
        rc = bl_arch_read(&s->a, s->g, s->path, err);
    const bl_arch_t *a = &s->a;
    if (rc == 0 && !a->moe)
        rc = bl_err_set(err, BL_EINVAL, "%s: a dense model has no routed experts", s->path);
    if (rc < 0)
        goto fail;
    s->held = calloc((size_t)a->n_layer, 1);
    s->layers = calloc((size_t)a->n_layer, sizeof *s->layers);
    s->src = calloc((size_t)a->n_layer, sizeof *s->src);
    if (!s->held || !s->layers || !s->src) {
        rc = bl_err_set(err, BL_ENOMEM, "out of memory for %lld layers", (long long)a->n_layer);
        goto fail;
    }
    /* the held layers' tensors, checked, viewed where the file maps them */
    uint64_t total = 0;
    for (int64_t l = 0; l < a->n_layer; l++) {
        /* every layer with routed experts by default; a leading dense layer has none */
        s->held[l] = (o->layers ? o->layers[l] != 0 : 1) && bl_arch_layer_moe(a, l);
        const bl_gguf_tensor_t *t[3];
        if (!s->held[l])
            continue;
        if ((rc = find_layer(s, l, t, err)) < 0)
            goto fail;
        for (int i = 0; i < 3; i++)
            s->src[l][i] = t[i];
        kcpu_mat_t *m[3] = {&s->layers[l].gate, &s->layers[l].up, &s->layers[l].down};
        for (int i = 0; i < 3; i++) {
            const int64_t ncols = i < 2 ? a->n_embd : a->n_ff_exp, nrows = (i < 2 ? a->n_ff_exp : a->n_embd) * a->n_expert;
            if ((rc = kcpu_mat_init(m[i], t[i]->data, t[i]->type, ncols, nrows, err)) < 0)
                goto fail;
            total += (t[i]->nbytes + 63) & ~(uint64_t)63;
            s->bytes += t[i]->nbytes;
        }
        s->layers[l].n_expert = a->n_expert;
        s->layers[l].n_ff = a->n_ff_exp;
        s->layers[l].n_embd = a->n_embd;
        s->layers[l].act = a->expert_act == BL_ACT_SWIGLU_OAI ? KCPU_ACT_SWIGLU_OAI : KCPU_ACT_SWIGLU;
        if (a->expert_biases && (rc = find_biases(s, l, &s->layers[l], err)) < 0)
            goto fail;
    }
    /* past the RAM budget they stay in the file, paged through slots; else into
     * huge pages where they fit (common/wmem.h) */
    if (o->ram_bytes > 0 && o->ram_bytes < s->bytes) {
        if ((rc = pager_open(s, o, err)) < 0)
            goto fail;
        total = 0;
    }
    /* Where the available memory holds less than all of them beside its margin (a
     * tmpfs file of more than about a third of the RAM), as many whole layers as it
     * does: each layer's experts are read at the rate of the memory they are in
     * (about twice as fast from huge pages: docs/performance.md, 2026-12-07). Not
     * with --mlock, which holds every expert in RAM: the copy or the mapping. */
    s->copy = bl_wmem_alloc_part(total, o->copy_bytes, o->no_mmap, o->mlock, &s->copy_len);
    size_t used = 0;
    bl_wmem_job_t *jobs = s->copy ? calloc((size_t)a->n_layer * 3, sizeof *jobs) : NULL;
    size_t n_jobs = 0;
    int64_t n_held = 0;
    for (int64_t l = 0; l < a->n_layer; l++) {
        kcpu_mat_t *m[3] = {&s->layers[l].gate, &s->layers[l].up, &s->layers[l].down};
        size_t layer = 0;
        for (int i = 0; s->held[l] && i < 3; i++)
            layer += (m[i]->row_bytes * (size_t)m[i]->nrows + 63) & ~(size_t)63;
        n_held += s->held[l] != 0;
        if (!jobs || !s->held[l] || layer > s->copy_len - used)
            continue; /* stays in the file mapping */
        for (int i = 0; i < 3; i++) {
            const size_t nbytes = m[i]->row_bytes * (size_t)m[i]->nrows;
            jobs[n_jobs++] = (bl_wmem_job_t){s->copy + used, m[i]->data, nbytes};
            m[i]->data = s->copy + used;
            used += (nbytes + 63) & ~(size_t)63;
        }
        s->n_copied++;
    }
    if (s->copy && (!jobs || s->n_copied == 0)) { /* no memory for the list, or room for no layer */
        munmap(s->copy, s->copy_len);
        s->copy = NULL;
        s->copy_len = 0;
    }
    if (total && s->n_copied < n_held)
        BL_LOG(BL_LOG_INFO, "event=experts_copy layers=%lld of=%lld bytes=%zu of_bytes=%llu available=%llu "
               "reason=\"the rest stays in the file's mapping: the copy stops at the available memory's margin or its "
               "cap\"",
               (long long)s->n_copied, (long long)n_held, used, (unsigned long long)total,
               (unsigned long long)bl_mem_available());
    /* several threads: the first touches dominate */
    bl_wmem_copy_many_progress(jobs, n_jobs, o->n_threads, o->progress, o->progress_ud);
    free(jobs);
    if (o->mlock)
        bl_wmem_lock(s->copy, used, s->g);
    const int64_t cols = a->n_embd > a->n_ff_exp ? a->n_embd : a->n_ff_exp;
    const kcpu_limits_t lim = {.max_cols = cols, .max_batch = o->n_batch, .max_ctx = 1, .head_dim = a->head_dim};
    if ((rc = kcpu_ctx_create(&s->kc, o->n_threads, KCPU_FAST16, &lim, err)) == 0)
        kcpu_ctx_set_poll(s->kc, o->poll);
    if (rc == 0 && o->cpu_strict)
        rc = kcpu_ctx_pin_strict(s->kc, err);
    if (rc < 0 ||
        (rc = kcpu_experts_scratch_create(&s->xs, o->n_batch, a->n_expert_used, a->n_embd, a->n_ff_exp, err)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    ht_store_close(s);
    return rc;
}

int ht_store_experts(ht_store_t *s, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                     const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    const bl_arch_t *a = &s->a;
    if (layer < 0 || layer >= a->n_layer || !s->held[layer])
        return bl_err_set(err, BL_EINVAL, "experts of layer %lld: this store does not hold them", (long long)layer);
    if (n < 1 || n > s->n_batch)
        return bl_err_set(err, BL_ERANGE, "%lld expert rows, outside 1..%lld", (long long)n, (long long)s->n_batch);
    if (!xn || !ids || !wts || !out)
        return bl_err_set(err, BL_EINVAL, "experts: a NULL buffer");
    const int rc = kcpu_experts_check(a->n_expert, a->n_expert_used, n, counts, ids, err);
    if (rc < 0)
        return rc;
    if (s->pg)
        return pager_experts(s, layer, xn, n, counts, ids, wts, out, err);
    kcpu_experts(s->kc, s->xs, &s->layers[layer], xn, n, counts, a->n_expert_used, ids, wts, out);
    return 0;
}
