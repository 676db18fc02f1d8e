/* The CPU backend: the backend ops over kernels/cpu, on the model's thread with its
 * own thread pool. Weights are read where the file view points (the mapping, or the
 * process's copy of it); activations and KV caches are host memory. A step's
 * products go to the pool whole; its rows never change a bit (kcpu.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arch.h"
#include "backend.h"
#include "blocks.h"
#include "kcpu.h"
#include "model.h"
#include "quant.h"

/* Distinct op names a profile keeps. */
#define PROF_OPS 32

typedef struct cpu {
    wk_backend_t b;
    const wk_config_t *c;
    const wk_model_opts_t *o;
    int64_t lb;
    kcpu_ctx_t *kc;
    const wk_step_t *st; /* the step running */
    void **allocs;       /* what alloc gave out, freed with the backend */
    int n_allocs, cap_allocs;
    /* scratch for n_batch rows */
    float *o_;    // (n_batch, n_embd) a block's output before the residual add
    float *rope;  // (n_batch, n_rot / 2, 2) cos, sin
    int32_t *pos; // (n_batch)
    float *rl;    // (n_batch, n_expert) router logits
    int32_t *ids; // (n_batch, n_expert_used) selected experts
    float *wts;   // (n_batch, n_expert_used) their weights
    float *xg;    // (n_batch, n_embd) the rows the head norms
    float *g;     // (n_batch, n_ff) dense gate, then SwiGLU output
    float *u;     // (n_batch, n_ff) dense up
    kcpu_experts_scratch_t *xs; /* the routed experts' scratch (MoE models) */
    /* deepseek2's latent attention: the absorbed queries and the heads' latent
     * outputs (n_batch, n_head, kv_lora + n_rot), and a group of heads' gathered
     * inputs and outputs (MLA_HEADS, n_batch, the wider of their widths) */
    float *mla_q, *mla_o, *mla_x, *mla_y;
    float *dn_beta, *dn_g; // (n_batch, Hv) a DeltaNet layer's gates
    bl_heat_t *heat;            /* the model's routing counts, or NULL */
    uint8_t *used;              // (n_expert) a step's distinct experts, for the profile
    /* opts.profile: each op's calls, time and weight bytes, in first-call order */
    wk_prof_op_t prof[PROF_OPS];
    int n_prof;
} cpu_t;

/* The profile's clock: 0 when the model does not profile, so that an unprofiled
 * step reads no clock. */
static uint64_t prof_start(const cpu_t *p)
{
    if (!p->o->profile)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Adds a call of op (a static name) that began at t0 and read bytes of weights;
 * ops past PROF_OPS distinct names go to the last entry's name "other". */
static void prof_end(cpu_t *p, const char *op, uint64_t t0, double bytes)
{
    if (!t0)
        return;
    const double us = (double)(prof_start(p) - t0) / 1e3;
    int i = 0;
    while (i < p->n_prof && p->prof[i].op != op && strcmp(p->prof[i].op, op) != 0)
        i++;
    if (i == p->n_prof) {
        if (p->n_prof == PROF_OPS - 1)
            op = "other";
        if (p->n_prof < PROF_OPS)
            p->prof[p->n_prof++] = (wk_prof_op_t){.op = op};
        else
            i = PROF_OPS - 1;
    }
    p->prof[i].calls++;
    p->prof[i].us += us;
    p->prof[i].bytes += bytes;
}

static double mat_bytes(const kcpu_mat_t *m) { return (double)m->nrows * (double)m->row_bytes; }

int wk__cpu_profile(wk_backend_t *b, wk_prof_op_t *out, int cap, int reset)
{
    cpu_t *p = (cpu_t *)b;
    for (int i = 0; i < p->n_prof && i < cap; i++)
        out[i] = p->prof[i];
    const int n = p->n_prof;
    if (reset)
        p->n_prof = 0;
    return n;
}

static const char *cpu_name(const wk_backend_t *b)
{
    (void)b;
    return kcpu_variant_name();
}

static void cpu_destroy(wk_backend_t *b)
{
    cpu_t *p = (cpu_t *)b;
    kcpu_ctx_destroy(p->kc);
    for (int i = 0; i < p->n_allocs; i++)
        free(p->allocs[i]);
    free(p->allocs);
    kcpu_experts_scratch_destroy(p->xs);
    void *bufs[] = {p->o_, p->rope, p->pos, p->rl, p->ids, p->wts, p->xg, p->g, p->u, p->used,
                    p->mla_q, p->mla_o, p->mla_x, p->mla_y, p->dn_beta, p->dn_g};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(p);
}

static void *cpu_alloc(wk_backend_t *b, size_t nbytes)
{
    cpu_t *p = (cpu_t *)b;
    if (p->n_allocs == p->cap_allocs) {
        const int cap = p->cap_allocs ? 2 * p->cap_allocs : 16;
        void **a = realloc(p->allocs, sizeof *a * (size_t)cap);
        if (!a)
            return NULL;
        p->allocs = a;
        p->cap_allocs = cap;
    }
    void *q = NULL;
    if (posix_memalign(&q, 64, nbytes ? (nbytes + 63) & ~(size_t)63 : 64) != 0)
        return NULL;
    p->allocs[p->n_allocs++] = q;
    return q;
}

/* Weights are read in place. */
static int cpu_add(wk_backend_t *b, wk_tensor_t *t, int flags, bl_err_t *err)
{
    (void)b, (void)flags, (void)err;
    t->d = NULL;
    return 0;
}

static int cpu_add_vec(wk_backend_t *b, wk_vec_t *v, int64_t n, bl_err_t *err)
{
    (void)b, (void)n, (void)err;
    v->p = v->h;
    return 0;
}

static int cpu_add_stack(wk_backend_t *b, wk_tensor_t *const t[3], bl_err_t *err)
{
    for (int i = 0; i < 3; i++)
        (void)cpu_add(b, t[i], 0, err);
    return 0;
}

/* The remote hook computes host experts; the CPU backend never copies them. */
static int cpu_add_host(wk_backend_t *b, int64_t l, const wk_moe_t *e, bl_err_t *err)
{
    (void)b, (void)l, (void)e, (void)err;
    return 0;
}

static int cpu_commit(wk_backend_t *b, bl_err_t *err)
{
    (void)b, (void)err;
    return 0;
}

static int cpu_kv_alloc(wk_backend_t *b, wk_kv_t *kv, bl_err_t *err)
{
    (void)b;
    const size_t nbytes = (size_t)kv->n_layer * (size_t)kv->n_planes * (size_t)kv->stride * kv->row_bytes;
    kv->buf = malloc(nbytes ? nbytes : 1); /* a stage of DeltaNet layers only has no rows */
    if (!kv->buf)
        return bl_err_set(err, BL_ENOMEM, "out of memory for a KV cache of %zu bytes", nbytes);
    return 0;
}

static void cpu_kv_free(wk_backend_t *b, wk_kv_t *kv)
{
    (void)b;
    free(kv->buf);
}

static int cpu_kv_copy(wk_backend_t *b, wk_kv_t *kv, void *host, int64_t n, int64_t host_n, int to_host,
                       bl_err_t *err)
{
    (void)b, (void)err;
    const size_t seg = (size_t)n * kv->row_bytes, pitch = (size_t)kv->stride * kv->row_bytes,
                 hpitch = (size_t)host_n * kv->row_bytes;
    for (int64_t i = 0; i < kv->n_layer * kv->n_planes; i++) {
        uint8_t *d = kv->buf + (size_t)i * pitch, *h = (uint8_t *)host + (size_t)i * hpitch;
        memcpy(to_host ? h : d, to_host ? d : h, seg);
    }
    return 0;
}

static int cpu_kv_move(wk_backend_t *b, wk_kv_t *kv, int64_t dst, int64_t src, int64_t n,
                       bl_err_t *err)
{
    (void)b, (void)err;
    const size_t rb = kv->row_bytes, pitch = (size_t)kv->stride * rb;
    for (int64_t i = 0; i < kv->n_layer * kv->n_planes; i++) {
        uint8_t *plane = kv->buf + (size_t)i * pitch;
        memcpy(plane + (size_t)dst * rb, plane + (size_t)src * rb, (size_t)n * rb);
    }
    return 0;
}

static int cpu_state_alloc(wk_backend_t *b, size_t nbytes, void **out, bl_err_t *err)
{
    (void)b;
    if (!(*out = malloc(nbytes ? nbytes : 1)))
        return bl_err_set(err, BL_ENOMEM, "out of memory for a saved cache state of %zu bytes", nbytes);
    return 0;
}

static void cpu_state_free(wk_backend_t *b, void *p)
{
    (void)b;
    free(p);
}

static int cpu_rec_alloc(wk_backend_t *b, size_t nbytes, float **out, bl_err_t *err)
{
    (void)b;
    *out = calloc(1, nbytes ? nbytes : 1);
    return *out ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory for a recurrent state of %zu bytes", nbytes);
}

static void cpu_rec_free(wk_backend_t *b, float *rec)
{
    (void)b;
    free(rec);
}

static int cpu_rec_copy(wk_backend_t *b, float *rec, void *host, size_t nbytes, int to_host, bl_err_t *err)
{
    (void)b, (void)err;
    if (to_host)
        memcpy(host, rec, nbytes);
    else
        memcpy(rec, host, nbytes);
    return 0;
}

// --- a step -----------------------------------------------------------------------------

static void add_rows(float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* A prompt step runs on n_threads_batch; positions and the RoPE table of its rows. */
static int cpu_begin(wk_backend_t *b, const wk_step_t *st, float *x, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    p->st = st;
    int prompt = 0;
    for (int64_t j = 0; j < st->nseg; j++)
        prompt |= st->seg[j].n > 1;
    (void)kcpu_ctx_set_threads(p->kc, prompt && p->o->n_threads_batch > 0 ? p->o->n_threads_batch
                                                                            : p->o->n_threads);
    for (int64_t j = 0; j < st->nseg; j++)
        for (int64_t i = 0; i < st->seg[j].n; i++)
            p->pos[st->seg[j].row0 + i] = (int32_t)(st->seg[j].pos + i);
    if (p->lb > 0 && st->x_in) /* the model checked that a later stage has x_in */
        memcpy(x, st->x_in, sizeof(float) * (size_t)(st->n * p->c->n_embd));
    const wk_config_t *c = p->c;
    const kcpu_rope_t rope = {.n_rot = c->n_rot, .base = c->rope_base, .freq_scale = c->rope_freq_scale,
                              .ext_factor = c->rope_ext_factor, .corr_lo = c->rope_corr_lo,
                              .corr_hi = c->rope_corr_hi, .mscale = c->rope_mscale};
    kcpu_rope_table(p->rope, p->pos, st->n, &rope);
    return 0;
}

static int cpu_end(wk_backend_t *b, const wk_step_t *st, int status, const float *x, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    p->st = NULL;
    if (status < 0)
        return status;
    if (p->heat && !st->mtp)
        bl_heat_step(p->heat);
    if (st->x_out) /* an earlier stage; checked by the model */
        memcpy(st->x_out, x, sizeof(float) * (size_t)(st->n * p->c->n_embd));
    return 0;
}

/* Token embeddings: each row dequantized from the table. */
static int cpu_embed(wk_backend_t *b, const wk_tensor_t *table, float *x, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const wk_step_t *st = p->st;
    const int64_t E = p->c->n_embd;
    const uint64_t t0 = prof_start(p);
    for (int64_t j = 0; j < st->nseg; j++)
        for (int64_t i = 0; i < st->seg[j].n; i++) {
            const int64_t r = st->seg[j].row0 + i;
            const uint8_t *row = (const uint8_t *)table->h.data + (size_t)st->seg[j].tokens[i] * table->h.row_bytes;
            /* The type was checked at load to have a dequantizer: cannot fail. */
            if (bl_dequantize_row_ref(table->h.type, row, x + r * E, E) != 0)
                memset(x + r * E, 0, sizeof(float) * (size_t)E);
        }
    prof_end(p, "embed", t0, (double)st->n * (double)table->h.row_bytes);
    return 0;
}

static int cpu_rms_norm(wk_backend_t *b, const char *op, float *y, const float *x, const float *g, int64_t n,
                        int64_t d, float eps, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const uint64_t t0 = prof_start(p);
    kcpu_rms_norm(p->kc, y, x, g, n, d, d, eps);
    prof_end(p, op, t0, 0);
    return 0;
}

/* y (n, d) += bias (d) on every row */
static void add_bias(float *y, const float *bias, int64_t n, int64_t d)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < d; j++)
            y[r * d + j] += bias[j];
}

static int cpu_qkv(wk_backend_t *b, const wk_tensor_t *wq, const wk_tensor_t *wk, const wk_tensor_t *wv,
                   const float *const *bias, const float *x, int64_t n, float *q, float *k, float *v, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const kcpu_mm_job_t jobs[3] = {{.w = &wq->h, .x = x, .n = n, .y = q},
                                   {.w = &wk->h, .x = x, .n = n, .y = k},
                                   {.w = &wv->h, .x = x, .n = n, .y = v}};
    const uint64_t t0 = prof_start(p);
    kcpu_matmul_many(p->kc, jobs, 3);
    for (int i = 0; bias && i < 3; i++)
        if (bias[i])
            add_bias(jobs[i].y, bias[i], n, jobs[i].w->nrows);
    prof_end(p, "attn_qkv", t0, mat_bytes(&wq->h) + mat_bytes(&wk->h) + mat_bytes(&wv->h));
    return 0;
}

static int cpu_matmul(wk_backend_t *b, const char *op, const wk_tensor_t *w, const float *bias, const float *x,
                      int64_t n, float *y, int acc, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const uint64_t t0 = prof_start(p);
    if (!acc) {
        kcpu_matmul(p->kc, &w->h, x, n, y);
    } else {
        kcpu_matmul(p->kc, &w->h, x, n, p->o_);
        add_rows(y, p->o_, n * w->h.nrows);
    }
    if (bias)
        add_bias(y, bias, n, w->h.nrows);
    prof_end(p, op, t0, mat_bytes(&w->h));
    return 0;
}

/* The cache of model layer l (inside the stage the cache was made for). */
static kcpu_kv_view_t kv_layer(const wk_kv_t *kv, int64_t l)
{
    l = kv->model->kv_index[l];
    const size_t plane = (size_t)kv->stride * kv->row_bytes;
    /* one plane: the value is the key's row */
    kcpu_kv_view_t v = {.k = kv->buf + (size_t)(kv->n_planes * l) * plane,
                        .v = kv->buf + (size_t)(kv->n_planes * l + kv->n_planes - 1) * plane,
                        .type = kv->type, .row_bytes = kv->row_bytes};
    return v;
}

static int cpu_attention(wk_backend_t *b, int64_t l, const wk_attn_t *a, float *q, float *k, const float *v,
                         float *att, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const wk_step_t *st = p->st;
    const int64_t n = st->n, hd = a->head_dim;
    const int64_t nq = a->n_head * hd, nkv = a->n_head_kv * hd;
    const uint64_t t0 = prof_start(p);
    if (a->q_norm)
        kcpu_rms_norm(p->kc, q, q, a->q_norm, n * a->n_head, hd, hd, a->eps);
    if (a->k_norm)
        kcpu_rms_norm(p->kc, k, k, a->k_norm, n * a->n_head_kv, hd, hd, a->eps);
    kcpu_rope_neox(q, p->rope, n, a->n_head, hd, a->n_rot);
    kcpu_rope_neox(k, p->rope, n, a->n_head_kv, hd, a->n_rot);
    for (int64_t j = 0; j < st->nseg; j++) {
        const wk_seg_t *s = &st->seg[j];
        const kcpu_kv_view_t kvl = kv_layer(s->kv, l);
        kcpu_kv_store(&kvl, 0, k + s->row0 * nkv, s->pos, s->n, nkv);
        kcpu_kv_store(&kvl, 1, v + s->row0 * nkv, s->pos, s->n, nkv);
        kcpu_attention_ext(p->kc, &kvl, q + s->row0 * nq, att + s->row0 * nq, s->n, s->pos, a->n_head,
                           a->n_head_kv, hd, a->scale, a->window, a->sinks);
    }
    prof_end(p, "attention", t0, 0);
    return 0;
}

static int cpu_split_heads(wk_backend_t *b, const float *x, int64_t n, int64_t n_head, int64_t hd, float *a, float *g,
                           bl_err_t *err)
{
    (void)b, (void)err;
    for (int64_t r = 0; r < n * n_head; r++) {
        memcpy(a + r * hd, x + r * 2 * hd, sizeof(float) * (size_t)hd);
        memcpy(g + r * hd, x + r * 2 * hd + hd, sizeof(float) * (size_t)hd);
    }
    return 0;
}

static int cpu_mul_sigmoid(wk_backend_t *b, float *y, const float *g, int64_t n, int64_t d, bl_err_t *err)
{
    (void)b, (void)err;
    for (int64_t i = 0; i < n * d; i++)
        y[i] *= 1.0f / (1.0f + expf(-g[i]));
    return 0;
}

static int cpu_deltanet(wk_backend_t *b, int64_t l, const kcpu_dnet_t *d, float *qkv, const float *z, const float *bb,
                        const float *al, float *out, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const wk_step_t *st = p->st;
    const int64_t n = st->n, ch = kcpu_dnet_channels(d), V = d->Hv * d->S;
    const uint64_t t0 = prof_start(p);
    kcpu_dnet_gates(d, bb, d->ba ? 2 * d->Hv : d->Hv, al, d->Hv, n, p->dn_beta, p->dn_g);
    for (int64_t j = 0; j < st->nseg; j++) {
        const wk_seg_t *s = &st->seg[j];
        const wk_model_t *m = s->kv->model;
        float *state = s->kv->rec + (size_t)m->rec_index[l] * m->rec_floats;
        if (s->pos == 0) /* a sequence's first rows start from nothing */
            memset(state, 0, sizeof(float) * m->rec_floats);
        kcpu_deltanet(p->kc, d, qkv + s->row0 * ch, z + s->row0 * V, p->dn_beta + s->row0 * d->Hv,
                      p->dn_g + s->row0 * d->Hv, state, state + (d->K - 1) * ch, out + s->row0 * V, s->n);
    }
    prof_end(p, "deltanet", t0, 0);
    return 0;
}

/* Heads whose per-head products go to the pool together in the latent attention. */
#define MLA_HEADS 16

/* The widest per-head input or output of the latent attention's products. */
static int64_t mla_wide(const wk_config_t *c)
{
    int64_t w = c->kv_lora > c->head_k ? c->kv_lora : c->head_k;
    return w > c->head_v ? w : c->head_v;
}

/* Per head h of [h0, h0 + nh): y_h (n, w_h rows) = x_h (n, w_h cols) w_h^T, with w_h
 * rows h * rows.. of w, x_h gathered from src (row r's head h at src + r * src_ld +
 * h * src_hs, cols floats), y_h scattered to dst likewise. */
static void per_head(cpu_t *p, const kcpu_mat_t *w, int64_t rows, int64_t cols, int64_t h0, int64_t nh, int64_t n,
                     const float *src, int64_t src_ld, int64_t src_hs, float *dst, int64_t dst_ld, int64_t dst_hs)
{
    const wk_config_t *c = p->c;
    const int64_t B = p->o->n_batch, wide = mla_wide(c);
    kcpu_mat_t m[MLA_HEADS];
    kcpu_mm_job_t jobs[MLA_HEADS];
    for (int64_t j = 0; j < nh; j++) {
        float *x = p->mla_x + j * B * wide, *y = p->mla_y + j * B * wide;
        for (int64_t r = 0; r < n; r++)
            memcpy(x + r * cols, src + r * src_ld + (h0 + j) * src_hs, sizeof(float) * (size_t)cols);
        m[j] = kcpu_mat_rows(w, (h0 + j) * rows, rows);
        jobs[j] = (kcpu_mm_job_t){.w = &m[j], .x = x, .n = n, .y = y};
    }
    kcpu_matmul_many(p->kc, jobs, (int)nh);
    for (int64_t j = 0; j < nh; j++)
        for (int64_t r = 0; r < n; r++)
            memcpy(dst + r * dst_ld + (h0 + j) * dst_hs, p->mla_y + j * B * wide + r * rows,
                   sizeof(float) * (size_t)rows);
}

static int cpu_mla(wk_backend_t *b, int64_t l, const wk_mla_t *a, float *q, float *c, float *att, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const wk_step_t *st = p->st;
    const int64_t n = st->n, H = a->n_head, r = a->kv_lora, D = r + a->n_rot, nope = a->head_k - a->n_rot;
    const uint64_t t0 = prof_start(p);
    /* the latent part normed, the rotated parts rotated (q's after each head's
     * qk_nope dims, c's after the latent ones) */
    kcpu_rms_norm(p->kc, c, c, a->kv_norm, n, r, D, a->eps);
    kcpu_rope_norm(q + nope, p->rope, n, H, H * a->head_k, a->head_k, a->n_rot);
    kcpu_rope_norm(c + r, p->rope, n, 1, D, 0, a->n_rot);
    /* the absorbed queries: head h's q_nope through its wk_b rows, then its q_pe */
    for (int64_t h0 = 0; h0 < H; h0 += MLA_HEADS)
        per_head(p, &a->wk_b->h, r, nope, h0, H - h0 < MLA_HEADS ? H - h0 : MLA_HEADS, n, q, H * a->head_k,
                 a->head_k, p->mla_q, H * D, D);
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < H; h++)
            memcpy(p->mla_q + (i * H + h) * D + r, q + (i * H + h) * a->head_k + nope,
                   sizeof(float) * (size_t)a->n_rot);
    /* one cache head for all query heads; the value is the cached row itself (one
     * plane: the model makes this cache's planes one), of which the latent part is
     * kept */
    for (int64_t j = 0; j < st->nseg; j++) {
        const wk_seg_t *s = &st->seg[j];
        const kcpu_kv_view_t kvl = kv_layer(s->kv, l);
        kcpu_kv_store(&kvl, 0, c + s->row0 * D, s->pos, s->n, D);
        if (kvl.v != kvl.k)
            kcpu_kv_store(&kvl, 1, c + s->row0 * D, s->pos, s->n, D);
        kcpu_attention(p->kc, &kvl, p->mla_q + s->row0 * H * D, p->mla_o + s->row0 * H * D, s->n, s->pos, H, 1, D,
                       a->scale);
    }
    /* each head's value through its wv_b rows */
    for (int64_t h0 = 0; h0 < H; h0 += MLA_HEADS)
        per_head(p, &a->wv_b->h, a->head_v, r, h0, H - h0 < MLA_HEADS ? H - h0 : MLA_HEADS, n, p->mla_o, H * D, D,
                 att, H * a->head_v, a->head_v);
    prof_end(p, "attention", t0, mat_bytes(&a->wk_b->h) + mat_bytes(&a->wv_b->h));
    return 0;
}

/* The routed experts of n rows (kcpu_experts, the same code the hosttier runs, so a
 * layer's experts give the same bits in either process). */
static void cpu_experts_into(wk_backend_t *b, const wk_moe_t *e, const float *xn, int64_t n, const int32_t *counts,
                             const int32_t *ids, const float *wts, float *out)
{
    cpu_t *p = (cpu_t *)b;
    const kcpu_experts_t x = {.gate = e->gate_exps.h, .up = e->up_exps.h, .down = e->down_exps.h,
                              .n_expert = e->n_expert, .n_ff = e->n_ff, .n_embd = p->c->n_embd,
                              .act = e->act == BL_ACT_SWIGLU_OAI ? KCPU_ACT_SWIGLU_OAI : KCPU_ACT_SWIGLU,
                              .gate_b = e->gate_b.p, .up_b = e->up_b.p, .down_b = e->down_b.p};
    kcpu_experts(p->kc, p->xs, &x, xn, n, counts, e->n_used, ids, wts, out);
}

static int cpu_experts(wk_backend_t *b, int64_t l, const wk_moe_t *e, const float *xn, int64_t n,
                       const int32_t *counts, const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    (void)l;
    (void)err;
    cpu_experts_into(b, e, xn, n, counts, ids, wts, out);
    return 0;
}

/* The gate and top-k here, the experts here or through the remote hook. */
static int cpu_moe(wk_backend_t *b, int64_t l, const wk_moe_t *e, const wk_remote_t *remote, const float *xn,
                   int64_t n, float *x, bl_err_t *err)
{
    cpu_t *p = (cpu_t *)b;
    uint64_t t0 = prof_start(p);
    kcpu_matmul(p->kc, &e->gate_inp.h, xn, n, p->rl);
    if (e->router_b.p)
        add_bias(p->rl, e->router_b.p, n, e->n_expert);
    const kcpu_route_t r = {.n_expert = e->n_expert, .k = e->n_used, .n_group = e->n_group,
                            .topk_group = e->topk_group, .gating = e->gating, .norm = e->norm,
                            .scale = e->scale, .bias = e->probs_b.p};
    kcpu_moe_route(p->kc, p->rl, n, &r, p->ids, p->wts);
    if (p->heat && l < p->c->n_layer) /* not the NextN layer's */
        bl_heat_add(p->heat, l, p->ids, n * e->n_used);
    prof_end(p, "ffn_moe_router", t0, mat_bytes(&e->gate_inp.h));
    t0 = prof_start(p);
    if (remote) {
        int rc = remote->fn(remote->ctx, l, xn, n, NULL, p->ids, p->wts, p->o_, err);
        if (rc < 0)
            return rc;
    } else {
        cpu_experts_into(b, e, xn, n, NULL, p->ids, p->wts, p->o_);
    }
    add_rows(x, p->o_, n * p->c->n_embd);
    if (t0) { /* the distinct experts' bytes: each is read once for all its rows */
        double bytes = 0;
        memset(p->used, 0, (size_t)e->n_expert);
        for (int64_t i = 0; i < n * e->n_used; i++)
            if (!p->used[p->ids[i]]) {
                p->used[p->ids[i]] = 1;
                bytes += (double)e->n_ff * ((double)e->gate_exps.h.row_bytes + (double)e->up_exps.h.row_bytes) +
                         (double)p->c->n_embd * (double)e->down_exps.h.row_bytes;
            }
        prof_end(p, remote ? "ffn_moe_remote" : "ffn_moe_experts", t0, bytes);
    }
    return 0;
}

static int cpu_ffn(wk_backend_t *b, const wk_tensor_t *gate, const wk_tensor_t *up, const wk_tensor_t *down,
                   const float *gate_inp, const float *xn, int64_t n, float *x, bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const int64_t E = p->c->n_embd;
    const uint64_t t0 = prof_start(p);
    kcpu_matmul(p->kc, &gate->h, xn, n, p->g);
    kcpu_matmul(p->kc, &up->h, xn, n, p->u);
    kcpu_swiglu(p->kc, p->g, p->g, p->u, n * gate->h.nrows);
    kcpu_matmul(p->kc, &down->h, p->g, n, p->o_);
    for (int64_t r = 0; gate_inp && r < n; r++) {
        /* the row's own gate: a dot of two f32 vectors, in double as the norms */
        double d = 0.0;
        for (int64_t i = 0; i < E; i++)
            d += (double)gate_inp[i] * (double)xn[r * E + i];
        const float s = 1.0f / (1.0f + expf(-(float)d));
        for (int64_t i = 0; i < E; i++)
            p->o_[r * E + i] *= s;
    }
    add_rows(x, p->o_, n * E);
    prof_end(p, "ffn", t0, mat_bytes(&gate->h) + mat_bytes(&up->h) + mat_bytes(&down->h));
    return 0;
}

/* Only the rows whose logits were asked for, gathered in order. */
static int cpu_head(wk_backend_t *b, const float *norm, float eps, const wk_tensor_t *out, const float *x,
                    bl_err_t *err)
{
    (void)err;
    cpu_t *p = (cpu_t *)b;
    const wk_step_t *st = p->st;
    const int64_t E = p->c->n_embd;
    int64_t n_out = 0;
    const uint64_t t0 = prof_start(p);
    for (int64_t j = 0; j < st->nseg; j++) {
        const int64_t r0 = st->seg[j].row0 + st->seg[j].n - st->seg[j].n_out;
        kcpu_rms_norm(p->kc, p->xg + n_out * E, x + r0 * E, norm, st->seg[j].n_out, E, E, eps);
        n_out += st->seg[j].n_out;
    }
    if (n_out > 0)
        kcpu_matmul(p->kc, &out->h, p->xg, n_out, st->logits);
    prof_end(p, "output", t0, n_out > 0 ? mat_bytes(&out->h) : 0);
    return 0;
}

static int cpu_copy_rows(wk_backend_t *b, float *dst, const float *src, int64_t n, int64_t d, bl_err_t *err)
{
    (void)b, (void)err;
    memmove(dst, src, sizeof(float) * (size_t)(n * d));
    return 0;
}

static const wk_backend_ops_t cpu_ops = {
    .name = cpu_name, .destroy = cpu_destroy, .alloc = cpu_alloc, .add = cpu_add, .add_vec = cpu_add_vec,
    .add_stack = cpu_add_stack, .add_host = cpu_add_host, .commit = cpu_commit, .kv_alloc = cpu_kv_alloc, .kv_free = cpu_kv_free,
    .kv_copy = cpu_kv_copy, .kv_move = cpu_kv_move, .state_alloc = cpu_state_alloc, .state_free = cpu_state_free,
    .rec_alloc = cpu_rec_alloc, .rec_free = cpu_rec_free, .rec_copy = cpu_rec_copy,
    .begin = cpu_begin, .end = cpu_end, .embed = cpu_embed, .rms_norm = cpu_rms_norm, .qkv = cpu_qkv,
    .matmul = cpu_matmul, .attention = cpu_attention, .mla = cpu_mla, .moe = cpu_moe, .experts = cpu_experts,
    .ffn = cpu_ffn, .head = cpu_head,
    .split_heads = cpu_split_heads, .mul_sigmoid = cpu_mul_sigmoid, .deltanet = cpu_deltanet,
    .copy_rows = cpu_copy_rows,
};

int wk__cpu_backend(wk_backend_t **out, const wk_backend_cfg_t *cfg, bl_err_t *err)
{
    *out = NULL;
    const wk_config_t *c = cfg->c;
    const wk_model_opts_t *o = cfg->o;
    cpu_t *p = calloc(1, sizeof *p);
    if (!p)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the CPU backend");
    p->b.op = &cpu_ops;
    p->c = c;
    p->o = o;
    p->heat = cfg->heat;
    p->lb = cfg->lb;
    const size_t B = (size_t)o->n_batch, E = (size_t)c->n_embd;
    /* the dense FFN's width, or the shared experts' (a MoE model may have both) */
    const size_t ff = (size_t)(c->n_ff > c->n_ff_shexp ? c->n_ff : c->n_ff_shexp > 0 ? c->n_ff_shexp : 1);
    const size_t ne = (size_t)(c->moe ? c->n_expert : 1), nu = (size_t)(c->moe ? c->n_expert_used : 1);
    p->o_ = malloc(sizeof(float) * B * E);
    p->rope = malloc(sizeof(float) * B * (size_t)c->head_dim);
    p->pos = malloc(sizeof(int32_t) * B);
    p->rl = malloc(sizeof(float) * B * ne);
    p->ids = malloc(sizeof(int32_t) * B * nu);
    p->wts = malloc(sizeof(float) * B * nu);
    p->xg = malloc(sizeof(float) * B * E);
    p->g = malloc(sizeof(float) * B * ff);
    p->u = malloc(sizeof(float) * B * ff);
    p->used = malloc(ne);
    if (c->kv_lora > 0) {
        const size_t hd = (size_t)(c->kv_lora + c->n_rot), H = (size_t)c->n_head;
        const size_t wide = (size_t)mla_wide(c);
        p->mla_q = malloc(sizeof(float) * B * H * hd);
        p->mla_o = malloc(sizeof(float) * B * H * hd);
        p->mla_x = malloc(sizeof(float) * MLA_HEADS * B * wide);
        p->mla_y = malloc(sizeof(float) * MLA_HEADS * B * wide);
        if (!p->mla_q || !p->mla_o || !p->mla_x || !p->mla_y) {
            cpu_destroy(&p->b);
            return bl_err_set(err, BL_ENOMEM, "out of memory for the latent attention's scratch (n_batch %zu)", B);
        }
    }
    if (c->ssm_heads > 0 && (!(p->dn_beta = malloc(sizeof(float) * B * (size_t)c->ssm_heads)) ||
                             !(p->dn_g = malloc(sizeof(float) * B * (size_t)c->ssm_heads)))) {
        cpu_destroy(&p->b);
        return bl_err_set(err, BL_ENOMEM, "out of memory for the DeltaNet scratch (n_batch %zu)", B);
    }
    if (!p->o_ || !p->rope || !p->pos || !p->rl || !p->ids || !p->wts || !p->xg || !p->g || !p->u || !p->used) {
        cpu_destroy(&p->b);
        return bl_err_set(err, BL_ENOMEM, "out of memory for the CPU scratch (n_batch %zu)", B);
    }
    int64_t cols = c->n_embd;
    cols = c->n_head * c->head_dim > cols ? c->n_head * c->head_dim : cols;
    cols = c->n_ff > cols ? c->n_ff : cols;
    cols = c->n_ff_exp > cols ? c->n_ff_exp : cols;
    cols = c->n_ff_shexp > cols ? c->n_ff_shexp : cols;
    cols = c->ssm_heads * c->ssm_state > cols ? c->ssm_heads * c->ssm_state : cols;
    const kcpu_limits_t lim = {.max_cols = cols, .max_batch = o->n_batch, .max_ctx = o->n_ctx_max,
                               .head_dim = c->head_dim};
    const int mode = o->precise ? KCPU_PRECISE : o->act_terms == 1 ? KCPU_FAST8 : KCPU_FAST16;
    /* one pool as large as the larger count; each step runs on the count it needs */
    const int nt_max = o->n_threads_batch > o->n_threads ? o->n_threads_batch : o->n_threads;
    int rc = kcpu_ctx_create(&p->kc, nt_max, mode, &lim, err);
    if (rc == 0)
        kcpu_ctx_set_poll(p->kc, o->poll);
    if (rc == 0 && o->cpu_strict)
        rc = kcpu_ctx_pin_strict(p->kc, err);
    if (rc == 0 && c->moe)
        rc = kcpu_experts_scratch_create(&p->xs, o->n_batch, c->n_expert_used, c->n_embd, c->n_ff_exp, err);
    if (rc < 0) {
        cpu_destroy(&p->b);
        return rc;
    }
    *out = &p->b;
    return 0;
}
