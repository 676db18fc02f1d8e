/* The Qwen3 family's forward pass on a CUDA device (kernels/cuda): the same model
 * as qwen3moe.c's forward(), scheduled for the card. Owns the stage's weights in one
 * device arena, the device scratch, the KV caches' device memory, and the CUDA
 * graphs that replay decode steps.
 *
 * Two schedules of one launch sequence (enqueue_step):
 * - decode (every sequence of the step one row, at most GRAPH_MAX_ROWS of them):
 *   each row's cache, position and token come from a small table on the card
 *   (step inputs), filled by one async copy from pinned memory, so the step is
 *   captured once per (rows, context bucket) and replayed;
 * - prompts and mixed steps (enqueue_prompt): tensor-core GEMMs with f16 inputs and
 *   f32 accumulation (weights dequantized to f16 scratch, activations rounded to
 *   f16 once per product), the routed experts grouped by expert on the card (one
 *   grouped launch per expert matrix and layer), flash attention per sequence on
 *   the f16 cache. The residual stream stays f32; the KV cache is f16. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bl_config.h"
#include "qwen3moe_impl.h"

#if BL_HAVE_CUDA

#include "kcuda.h"
#include "log.h"
#include "quant.h"

/* Decode steps of up to this many sequences are captured as graphs. */
#define GRAPH_MAX_ROWS 64
/* Prompt attention runs in chunks of this many rows, which bounds its scratch. */
#define ATT_ROWS 64
/* Context buckets of captured graphs: the grid covers 256 << i positions. */
#define N_BUCKETS 24
/* Each half of the pinned staging buffer the weights are uploaded through. */
#define STAGE_BYTES ((size_t)64 << 20)
/* Launches one profiled step may time, and distinct op names. */
#define PROF_EVENTS 4096
#define PROF_OPS 48

/* A layer's weights on the card (views into the arena). */
typedef struct dlayer {
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm; // (n_embd), (head_dim) x2, (n_embd)
    kcuda_mat_t wq, wk, wv, wo;                          // as layer_t
    kcuda_mat_t wqkv; /* wq and wk, and wv when it has their type too, stacked in
                       * the arena: the decode step's q/k(/v) launch; data NULL when
                       * q and k differ */
    int nstack;       /* matrices in wqkv: 3, 2 (v apart) or 0 */
    kcuda_mat_t gate_inp, gate_exps, up_exps, down_exps; // qwen3moe
    kcuda_mat_t ffn_gate, ffn_up, ffn_down;              // qwen3
} dlayer_t;

/* The model's CUDA side. Owned by the model's thread, as the model is. */
struct wk_cuda {
    int device;
    kcuda_device_info_t info;
    void *stream;
    uint8_t *arena;          /* every weight of the stage, 256-aligned tensors */
    size_t arena_bytes;
    dlayer_t *layers;        // (n_layer): only the stage's [lb, le) are filled
    kcuda_mat_t tok_embd;    /* first stage */
    kcuda_mat_t output;      /* last stage */
    const float *output_norm;
    /* scratch for n_batch rows, on the card */
    float *x;      // (n_batch, n_embd) the residual stream
    float *xn;     // (n_batch, n_embd)
    float *q;      // (n_batch, n_head * head_dim)
    float *k, *v;  // (n_batch, n_head_kv * head_dim)
    float *att;    // (n_batch, n_head * head_dim)
    float *rl;     // (n_batch, n_expert) router logits
    int32_t *ids;  // (n_batch, n_expert_used)
    float *wts;    // (n_batch, n_expert_used)
    float *g, *u;  // (n_batch * n_expert_used, n_ff_exp) or (n_batch, n_ff)
    float *xg;     // (n_batch, n_embd) normed rows for the head
    float *logits; // (n_batch, n_vocab), last stage
    /* the prompt path (enqueue_prompt) */
    int pp_ok;     /* the shapes suit it; else prompts take the row-chunk path */
    int flash;     /* prompts attend through kcuda_attention_prefill (read at load) */
    void *blas;    /* cuBLAS handle on stream */
    void *x16;     // (n_batch, max(n_embd, n_head * head_dim, n_ff)) f16 activations
    void *xs16;    // (n_batch * n_expert_used, max(n_embd, n_ff_exp)) f16, rows by expert
    float *dg;     // (n_batch * n_expert_used, n_embd) experts' down outputs, by expert
    int32_t *srt;  /* expert grouping: counts (ne), offsets (ne+1), tile0 (ne+1),
                    * perm and inv (n_batch * n_expert_used) */
    void *wscr;    /* f16 weights: a whole expert tensor, a dense matrix, the head in pieces */
    size_t wscr_bytes;
    void *att_scratch;
    size_t att_scratch_bytes;
    int64_t max_len_cap;     /* n_ctx_max rounded up to KCUDA_ATT_CHUNK */
    /* step inputs: one region, the same layout on the card and in pinned memory:
     * the rows table (GRAPH_MAX_ROWS), tokens (n_batch), positions (n_batch) */
    uint8_t *d_in, *h_in;
    size_t in_bytes;
    kcuda_kv_row_t *d_rows, *h_rows;
    int32_t *d_tokens, *h_tokens, *d_pos, *h_pos;
    size_t kv_row_bytes;     /* an f16 cache row: n_head_kv * head_dim halves */
    void *graphs[GRAPH_MAX_ROWS + 1][N_BUCKETS];
    /* profiling (opts.profile): an event after every launch of a step */
    void *ev[PROF_EVENTS + 1];
    int ev_op[PROF_EVENTS + 1];
    int n_ev, prof_on;
    wk_prof_op_t ops[PROF_OPS];
    int n_ops;
};

// --- set-up --------------------------------------------------------------------------------

/* Waits for stream on a path that already fails or tears down: its own error, if
 * any, would only repeat the first. */
static void drain(void *stream)
{
    bl_err_t e;
    if (kcuda_sync(stream, &e) < 0)
        return;
}

/* One tensor's place in the arena. */
typedef struct upload {
    const void *src;
    size_t nbytes, off;
} upload_t;

typedef struct plan {
    upload_t *u;
    size_t n, cap, total;
} plan_t;

static int plan_add(plan_t *p, const void *src, size_t nbytes, size_t *off, bl_err_t *err)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 256;
        upload_t *u = realloc(p->u, cap * sizeof *u);
        if (!u)
            return bl_err_set(err, BL_ENOMEM, "out of memory for the upload plan");
        p->u = u;
        p->cap = cap;
    }
    *off = (p->total + 255) & ~(size_t)255;
    p->u[p->n++] = (upload_t){src, nbytes, *off};
    p->total = *off + nbytes;
    return 0;
}

/* Records where a matrix goes; its view is made once the arena exists. */
typedef struct mat_ref {
    const kcpu_mat_t *host;
    kcuda_mat_t *dev;
    size_t off;
} mat_ref_t;

typedef struct vec_ref {
    const float **dev;
    size_t off;
} vec_ref_t;

typedef struct refs {
    mat_ref_t mats[16];
    vec_ref_t vecs[8];
    int nm, nv;
} refs_t;

/* Copies every planned tensor to the arena through two pinned halves: the host
 * fills one while the other's copy runs. */
static int upload_all(struct wk_cuda *cu, const plan_t *p, bl_err_t *err)
{
    void *stage[2] = {NULL, NULL}, *done[2] = {NULL, NULL};
    int used[2] = {0, 0}, rc = 0, k = 0;
    if ((rc = kcuda_host_alloc(&stage[0], STAGE_BYTES, err)) < 0 ||
        (rc = kcuda_host_alloc(&stage[1], STAGE_BYTES, err)) < 0 ||
        (rc = kcuda_event_create(&done[0], err)) < 0 || (rc = kcuda_event_create(&done[1], err)) < 0)
        goto out;
    for (size_t i = 0; i < p->n; i++) {
        const upload_t *u = &p->u[i];
        for (size_t at = 0; at < u->nbytes;) {
            const size_t c = u->nbytes - at < STAGE_BYTES ? u->nbytes - at : STAGE_BYTES;
            if (used[k] && (rc = kcuda_event_sync(done[k], err)) < 0)
                goto out;
            memcpy(stage[k], (const uint8_t *)u->src + at, c);
            if ((rc = kcuda_upload(cu->arena + u->off + at, stage[k], c, cu->stream, err)) < 0 ||
                (rc = kcuda_event_record(done[k], cu->stream, err)) < 0)
                goto out;
            used[k] = 1;
            k ^= 1;
            at += c;
        }
    }
    rc = kcuda_sync(cu->stream, err);
out:
    drain(cu->stream); /* the staging buffers must be idle before freeing */
    kcuda_event_destroy(done[0]);
    kcuda_event_destroy(done[1]);
    kcuda_host_free(stage[0]);
    kcuda_host_free(stage[1]);
    return rc;
}

static int add_mat(plan_t *p, refs_t *r, const kcpu_mat_t *h, kcuda_mat_t *d, bl_err_t *err)
{
    size_t off = 0;
    int rc = plan_add(p, h->data, h->row_bytes * (size_t)h->nrows, &off, err);
    if (rc < 0)
        return rc;
    r->mats[r->nm++] = (mat_ref_t){h, d, off};
    return 0;
}

/* q, k and v: the longest run from q of matrices sharing type and width whose sizes
 * keep 16-byte alignment (q and k; q, k and v) goes back to back in the arena (no
 * padding), so that the run is also one matrix (dlayer_t.wqkv, made by bind_qkv);
 * the others are plain tensors. Qwen3-30B-A3B's files store v as q6_K beside q4_K
 * q and k: two launches instead of three. */
static int add_qkv(plan_t *p, refs_t *r, const layer_t *L, dlayer_t *D, bl_err_t *err)
{
    const kcpu_mat_t *m[3] = {&L->wq, &L->wk, &L->wv};
    kcuda_mat_t *d[3] = {&D->wq, &D->wk, &D->wv};
    int ns = 1;
    while (ns < 3 && m[ns]->type == m[0]->type && m[ns]->ncols == m[0]->ncols &&
           m[ns]->row_bytes == m[0]->row_bytes && (m[ns - 1]->row_bytes * (size_t)m[ns - 1]->nrows) % 16 == 0)
        ns++;
    if (ns < 2)
        ns = 0;
    int64_t rows = 0;
    for (int i = 0; i < 3; i++) {
        const size_t nbytes = m[i]->row_bytes * (size_t)m[i]->nrows;
        size_t off = 0;
        int rc = plan_add(p, m[i]->data, nbytes, &off, err);
        if (rc < 0)
            return rc;
        if (i > 0 && i < ns) { /* right after the one before: p->total is 16-aligned */
            off = p->u[p->n - 2].off + p->u[p->n - 2].nbytes;
            p->u[p->n - 1].off = off;
            p->total = off + nbytes;
        }
        if (i < ns)
            rows += m[i]->nrows;
        r->mats[r->nm++] = (mat_ref_t){m[i], d[i], off};
    }
    D->wqkv.data = NULL;
    D->wqkv.nrows = rows;
    D->nstack = ns;
    return 0;
}

/* The stacked view of a layer whose q, k (and v) add_qkv placed together. */
static int bind_qkv(dlayer_t *D, bl_err_t *err)
{
    if (D->nstack == 0)
        return 0;
    return kcuda_mat_init(&D->wqkv, D->wq.data, D->wq.type, D->wq.ncols, D->wqkv.nrows, err);
}

static int add_vec(plan_t *p, refs_t *r, const float *h, int64_t n, const float **d, bl_err_t *err)
{
    size_t off = 0;
    int rc = plan_add(p, h, sizeof(float) * (size_t)n, &off, err);
    if (rc < 0)
        return rc;
    r->vecs[r->nv++] = (vec_ref_t){d, off};
    return 0;
}

/* Makes the views of one group of planned tensors into the arena. */
static int bind(struct wk_cuda *cu, const refs_t *r, bl_err_t *err)
{
    for (int i = 0; i < r->nm; i++) {
        const kcpu_mat_t *h = r->mats[i].host;
        int rc = kcuda_mat_init(r->mats[i].dev, cu->arena + r->mats[i].off, h->type, h->ncols, h->nrows, err);
        if (rc < 0)
            return rc;
    }
    for (int i = 0; i < r->nv; i++)
        *r->vecs[i].dev = (const float *)(cu->arena + r->vecs[i].off);
    return 0;
}

/* Shapes and types the CUDA kernels take, checked before anything is allocated. */
static int check_shapes(const wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const int64_t nkv = c->n_head_kv * c->head_dim;
    if (c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256)
        return bl_err_set(err, BL_ENOTSUP, "%s: head_dim %lld on CUDA (32, 64, 128 or 256)", m->path,
                          (long long)c->head_dim);
    if (c->n_head / c->n_head_kv > KCUDA_ATT_MAX_GROUP)
        return bl_err_set(err, BL_ENOTSUP, "%s: %lld query heads per KV head on CUDA (at most %d)", m->path,
                          (long long)(c->n_head / c->n_head_kv), KCUDA_ATT_MAX_GROUP);
    if (c->n_embd % 4 || nkv % 8 || (c->moe ? c->n_ff_exp % 4 : c->n_ff % 4))
        return bl_err_set(err, BL_ENOTSUP, "%s: n_embd %lld and the FFN width must be multiples of 4, "
                          "n_head_kv * head_dim %lld of 8, on CUDA", m->path, (long long)c->n_embd,
                          (long long)nkv);
    if (c->moe && (c->n_expert > KCUDA_MOE_MAX_EXPERT || c->n_expert_used > KCUDA_MOE_MAX_K))
        return bl_err_set(err, BL_ENOTSUP, "%s: %lld experts, %lld used, on CUDA (at most %d and %d)", m->path,
                          (long long)c->n_expert, (long long)c->n_expert_used, KCUDA_MOE_MAX_EXPERT,
                          KCUDA_MOE_MAX_K);
    return 0;
}

static int dalloc(void *out, size_t nbytes, bl_err_t *err)
{
    return kcuda_alloc((void **)out, nbytes ? nbytes : 16, err);
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Whether enqueue_prompt takes this model: f16 activation rows 16-byte aligned,
 * the grouped expert GEMM's reduction lengths in steps of 32. */
static int prompt_shapes_ok(const wk_config_t *c)
{
    const int64_t nq = c->n_head * c->head_dim;
    return c->n_embd % 32 == 0 && nq % 8 == 0 && (c->moe ? c->n_ff_exp % 32 == 0 : c->n_ff % 8 == 0);
}

/* The prompt path's scratch: f16 activations, the expert grouping, and one f16
 * weight buffer as large as the largest layer matrix (a whole expert tensor for
 * qwen3moe); the head goes through it in pieces of at most 256 MiB. */
static int alloc_prompt(wk_model_t *m, struct wk_cuda *cu, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const size_t B = (size_t)m->opts.n_batch, E = (size_t)c->n_embd;
    const size_t nq = (size_t)(c->n_head * c->head_dim);
    const size_t K = (size_t)(c->moe ? c->n_expert_used : 1), ne = (size_t)(c->moe ? c->n_expert : 1);
    const size_t ff = (size_t)(c->moe ? c->n_ff_exp : c->n_ff);
    size_t w = 0;
    for (int64_t l = m->lb; l < m->le; l++) {
        const dlayer_t *D = &cu->layers[l];
        const kcuda_mat_t *ms[] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->gate_inp, &D->gate_exps, &D->up_exps,
                                   &D->down_exps, &D->ffn_gate, &D->ffn_up, &D->ffn_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (ms[i]->data)
                w = max_sz(w, kcuda_gemm_scratch_bytes(ms[i]));
    }
    if (m->le == c->n_layer) {
        const size_t head = kcuda_gemm_scratch_bytes(&cu->output);
        w = max_sz(w, head < ((size_t)256 << 20) ? head : ((size_t)256 << 20));
    }
    cu->wscr_bytes = w;
    int rc = kcuda_blas_create(&cu->blas, cu->stream, err);
    if (rc == BL_ENOTSUP) { /* no cuBLAS on this machine: prompts take the row-chunk path */
        BL_LOG(BL_LOG_WARN, "event=prompt_path_rows reason=\"%s\"", err->msg);
        cu->pp_ok = 0;
        return 0;
    }
    if (rc < 0 || (rc = dalloc(&cu->x16, 2 * B * max_sz(max_sz(E, nq), ff), err)) < 0 ||
        (rc = dalloc(&cu->wscr, w, err)) < 0)
        return rc;
    if (c->moe && ((rc = dalloc(&cu->xs16, 2 * B * K * max_sz(E, ff), err)) < 0 ||
                   (rc = dalloc(&cu->dg, sizeof(float) * B * K * E, err)) < 0 ||
                   (rc = dalloc(&cu->srt, 4 * (3 * ne + 2 + 2 * B * K), err)) < 0))
        return rc;
    return 0;
}

static int alloc_scratch(wk_model_t *m, struct wk_cuda *cu, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const size_t B = (size_t)m->opts.n_batch, E = (size_t)c->n_embd;
    const size_t nq = (size_t)(c->n_head * c->head_dim), nkv = (size_t)(c->n_head_kv * c->head_dim);
    const size_t K = (size_t)(c->moe ? c->n_expert_used : 1), ne = (size_t)(c->moe ? c->n_expert : 1);
    const size_t ff = (size_t)(c->moe ? c->n_ff_exp : c->n_ff);
    const size_t f = sizeof(float);
    int rc;
    cu->max_len_cap = (m->opts.n_ctx_max + KCUDA_ATT_CHUNK - 1) / KCUDA_ATT_CHUNK * KCUDA_ATT_CHUNK;
    cu->att_scratch_bytes = kcuda_attention_scratch_bytes(ATT_ROWS > GRAPH_MAX_ROWS ? ATT_ROWS : GRAPH_MAX_ROWS,
                                                          c->n_head, c->head_dim, cu->max_len_cap);
    if ((rc = dalloc(&cu->x, f * B * E, err)) < 0 || (rc = dalloc(&cu->xn, f * B * E, err)) < 0 ||
        (rc = dalloc(&cu->q, f * B * nq, err)) < 0 || (rc = dalloc(&cu->k, f * B * nkv, err)) < 0 ||
        (rc = dalloc(&cu->v, f * B * nkv, err)) < 0 || (rc = dalloc(&cu->att, f * B * nq, err)) < 0 ||
        (rc = dalloc(&cu->rl, f * B * ne, err)) < 0 || (rc = dalloc(&cu->ids, 4 * B * K, err)) < 0 ||
        (rc = dalloc(&cu->wts, f * B * K, err)) < 0 || (rc = dalloc(&cu->g, f * B * K * ff, err)) < 0 ||
        (rc = dalloc(&cu->u, f * B * K * ff, err)) < 0 || (rc = dalloc(&cu->xg, f * B * E, err)) < 0 ||
        (rc = dalloc(&cu->att_scratch, cu->att_scratch_bytes, err)) < 0)
        return rc;
    if (m->le == c->n_layer && (rc = dalloc(&cu->logits, f * B * (size_t)c->n_vocab, err)) < 0)
        return rc;
    if (cu->pp_ok && (rc = alloc_prompt(m, cu, err)) < 0)
        return rc;
    /* The step inputs: the rows table first (32-byte entries), then the ids. */
    const size_t rows_bytes = sizeof(kcuda_kv_row_t) * GRAPH_MAX_ROWS;
    cu->in_bytes = rows_bytes + 2 * 4 * B;
    if ((rc = dalloc(&cu->d_in, cu->in_bytes, err)) < 0 ||
        (rc = kcuda_host_alloc((void **)&cu->h_in, cu->in_bytes, err)) < 0)
        return rc;
    memset(cu->h_in, 0, cu->in_bytes);
    cu->d_rows = (kcuda_kv_row_t *)cu->d_in;
    cu->h_rows = (kcuda_kv_row_t *)cu->h_in;
    cu->d_tokens = (int32_t *)(cu->d_in + rows_bytes);
    cu->h_tokens = (int32_t *)(cu->h_in + rows_bytes);
    cu->d_pos = cu->d_tokens + B;
    cu->h_pos = cu->h_tokens + B;
    cu->kv_row_bytes = nkv * 2;
    return 0;
}

int wk__cuda_load(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    int rc = check_shapes(m, err);
    if (rc < 0)
        return rc;
    struct wk_cuda *cu = calloc(1, sizeof *cu);
    if (!cu)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the CUDA state");
    m->cu = cu;
    cu->device = m->opts.device;
    plan_t p = {0};
    refs_t *r = NULL;
    if ((rc = kcuda_init(cu->device, &cu->info, err)) < 0 ||
        (rc = kcuda_stream_create(&cu->stream, err)) < 0)
        goto out;
    cu->layers = calloc((size_t)c->n_layer, sizeof *cu->layers);
    r = calloc((size_t)c->n_layer + 1, sizeof *r); /* one group per layer, one for the ends */
    if (!cu->layers || !r) {
        rc = bl_err_set(err, BL_ENOMEM, "out of memory for %lld layers", (long long)c->n_layer);
        goto out;
    }

    /* The plan: what the stage computes, in file order. */
    const weights_t *w = &m->w;
    refs_t *ends = &r[c->n_layer];
    if (m->lb == 0 && (rc = add_mat(&p, ends, &w->tok_embd, &cu->tok_embd, err)) < 0)
        goto out;
    /* A tied head on a stage that also embeds reads the same table. */
    const int share_head = c->tied_output && m->lb == 0;
    if (m->le == c->n_layer &&
        ((rc = add_vec(&p, ends, w->output_norm, c->n_embd, &cu->output_norm, err)) < 0 ||
         (!share_head && (rc = add_mat(&p, ends, &w->output, &cu->output, err)) < 0)))
        goto out;
    for (int64_t l = m->lb; l < m->le; l++) {
        const layer_t *L = &w->layers[l];
        dlayer_t *D = &cu->layers[l];
        refs_t *rl = &r[l];
        if ((rc = add_vec(&p, rl, L->attn_norm, c->n_embd, &D->attn_norm, err)) < 0 ||
            (rc = add_vec(&p, rl, L->q_norm, c->head_dim, &D->q_norm, err)) < 0 ||
            (rc = add_vec(&p, rl, L->k_norm, c->head_dim, &D->k_norm, err)) < 0 ||
            (rc = add_vec(&p, rl, L->ffn_norm, c->n_embd, &D->ffn_norm, err)) < 0 ||
            (rc = add_qkv(&p, rl, L, D, err)) < 0 || (rc = add_mat(&p, rl, &L->wo, &D->wo, err)) < 0)
            goto out;
        if (c->moe && ((rc = add_mat(&p, rl, &L->gate_inp, &D->gate_inp, err)) < 0 ||
                       (rc = add_mat(&p, rl, &L->gate_exps, &D->gate_exps, err)) < 0 ||
                       (rc = add_mat(&p, rl, &L->up_exps, &D->up_exps, err)) < 0 ||
                       (rc = add_mat(&p, rl, &L->down_exps, &D->down_exps, err)) < 0))
            goto out;
        if (!c->moe && ((rc = add_mat(&p, rl, &L->ffn_gate, &D->ffn_gate, err)) < 0 ||
                        (rc = add_mat(&p, rl, &L->ffn_up, &D->ffn_up, err)) < 0 ||
                        (rc = add_mat(&p, rl, &L->ffn_down, &D->ffn_down, err)) < 0))
            goto out;
    }

    /* One allocation for every weight: 256-aligned tensors, and kcuda_alloc pads the
     * end, so each matrix's last 16-byte load stays inside. */
    cu->arena_bytes = p.total;
    if ((rc = kcuda_alloc((void **)&cu->arena, p.total + 256, err)) < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = bl_err_set(err, rc, "the weights of layers %lld..%lld (%.2f GiB) on CUDA device %d: "
                        "%s; the whole stage must fit the card (-ngl 0 runs on the CPU)",
                        (long long)m->lb, (long long)m->le - 1, (double)p.total / (1 << 30),
                        cu->device, why);
        goto out;
    }
    for (int64_t i = 0; i <= c->n_layer; i++)
        if ((rc = bind(cu, &r[i], err)) < 0 ||
            (i >= m->lb && i < m->le && (rc = bind_qkv(&cu->layers[i], err)) < 0)) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            bl_err_set(err, rc, "%s: a weight the CUDA kernels cannot read: %s", m->path, why);
            goto out;
        }
    if (m->le == c->n_layer && share_head)
        cu->output = cu->tok_embd;
    /* BLOOMERY_CUDA_PROMPT=rows keeps prompts on the row-chunk matvec path (the
     * reference the GEMM path is checked against; docs/cuda.md). */
    /* BLOOMERY_CUDA_PDL=0 launches every kernel the ordinary way (kcuda_set_pdl), to
     * measure what programmatic dependent launch gives. */
    /* BLOOMERY_CUDA_ATT_SHORT=N moves the longest context decode attention takes in
     * one pass (kcuda_attention_set_short), to measure where the split pays. */
    const char *as_env = getenv("BLOOMERY_CUDA_ATT_SHORT");
    if (as_env && *as_env)
        (void)kcuda_attention_set_short(atoi(as_env));
    const char *pdl_env = getenv("BLOOMERY_CUDA_PDL");
    if (pdl_env && strcmp(pdl_env, "0") == 0)
        (void)kcuda_set_pdl(0);
    /* Flash prefill for head_dim 64 and 128 unless -fa off (WK_FLASH_OFF) asks for
     * the split attention in 64-row pieces (the reference it is compared with); so
     * does BLOOMERY_CUDA_FLASH=0 under -fa auto. -fa on with another head size runs
     * the split kernel and says so. */
    const char *fl_env = getenv("BLOOMERY_CUDA_FLASH");
    const int flash_shape = c->head_dim == 64 || c->head_dim == 128;
    cu->flash = flash_shape && m->opts.flash_attn != WK_FLASH_OFF &&
                !(m->opts.flash_attn == WK_FLASH_AUTO && fl_env && strcmp(fl_env, "0") == 0);
    if (m->opts.flash_attn == WK_FLASH_ON && !flash_shape)
        BL_LOG(BL_LOG_WARN, "event=flash_attn_unavailable head_dim=%lld reason=\"the flash "
               "kernel takes head sizes 64 and 128; prompts use the split attention\"",
               (long long)c->head_dim);
    const char *pp_env = getenv("BLOOMERY_CUDA_PROMPT");
    cu->pp_ok = prompt_shapes_ok(c) && !(pp_env && strcmp(pp_env, "rows") == 0);
    if ((rc = upload_all(cu, &p, err)) < 0 || (rc = alloc_scratch(m, cu, err)) < 0)
        goto out;
    for (int i = 0; i <= PROF_EVENTS; i++) /* cheap; profiling can be switched on later */
            if ((rc = kcuda_event_create(&cu->ev[i], err)) < 0)
                goto out;
    rc = kcuda_sync(cu->stream, err);
out:
    free(p.u);
    free(r);
    return rc; /* on an error wk_model_free calls wk__cuda_free */
}

void wk__cuda_free(wk_model_t *m)
{
    struct wk_cuda *cu = m->cu;
    if (!cu)
        return;
    bl_err_t e;
    if (kcuda_set_device(cu->device, &e) == 0 && cu->stream)
        drain(cu->stream); /* nothing may still read what is freed below */
    for (int i = 0; i <= GRAPH_MAX_ROWS; i++)
        for (int j = 0; j < N_BUCKETS; j++)
            kcuda_graph_destroy(cu->graphs[i][j]);
    for (int i = 0; i <= PROF_EVENTS; i++)
        kcuda_event_destroy(cu->ev[i]);
    void *bufs[] = {cu->arena, cu->x, cu->xn, cu->q, cu->k, cu->v, cu->att, cu->rl, cu->ids, cu->wts,
                    cu->g, cu->u, cu->xg, cu->logits, cu->att_scratch, cu->d_in, cu->x16, cu->xs16,
                    cu->dg, cu->srt, cu->wscr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        kcuda_free(bufs[i]);
    kcuda_host_free(cu->h_in);
    kcuda_blas_destroy(cu->blas);
    kcuda_stream_destroy(cu->stream);
    free(cu->layers);
    free(cu);
    m->cu = NULL;
}

const char *wk__cuda_name(const wk_model_t *m) { return m->cu->info.name; }

int wk__cuda_kv_alloc(wk_kv_t *kv, bl_err_t *err)
{
    const struct wk_cuda *cu = kv->model->cu;
    int rc = kcuda_set_device(cu->device, err);
    if (rc < 0)
        return rc;
    const size_t nbytes = (size_t)kv->n_layer * 2 * (size_t)kv->n_ctx * kv->row_bytes;
    if ((rc = kcuda_alloc((void **)&kv->buf, nbytes, err)) < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return bl_err_set(err, rc, "KV cache of %lld positions (%zu bytes) on CUDA device %d: %s",
                          (long long)kv->n_ctx, nbytes, cu->device, why);
    }
    kv->on_device = 1;
    return 0;
}

void wk__cuda_kv_free(wk_kv_t *kv)
{
    kcuda_free(kv->buf);
}

// --- profiling -----------------------------------------------------------------------------

static int op_index(struct wk_cuda *cu, const char *op)
{
    for (int i = 0; i < cu->n_ops; i++)
        if (cu->ops[i].op == op || strcmp(cu->ops[i].op, op) == 0)
            return i;
    if (cu->n_ops == PROF_OPS)
        return PROF_OPS - 1; /* the last name takes the overflow */
    cu->ops[cu->n_ops] = (wk_prof_op_t){.op = op};
    return cu->n_ops++;
}

/* After a launch: an event that closes op's interval. */
static int prof_mark(struct wk_cuda *cu, const char *op, bl_err_t *err)
{
    if (cu->n_ev >= PROF_EVENTS)
        return 0;
    cu->ev_op[cu->n_ev + 1] = op_index(cu, op);
    return kcuda_event_record(cu->ev[++cu->n_ev], cu->stream, err);
}

/* After the step's synchronisation: each interval is added to its op. */
static int prof_collect(struct wk_cuda *cu, bl_err_t *err)
{
    for (int i = 1; i <= cu->n_ev; i++) {
        float ms = 0;
        int rc = kcuda_event_elapsed_ms(&ms, cu->ev[i - 1], cu->ev[i], err);
        if (rc < 0)
            return rc;
        cu->ops[cu->ev_op[i]].us += 1e3 * (double)ms;
        cu->ops[cu->ev_op[i]].calls++;
    }
    cu->n_ev = 0;
    return 0;
}

int wk_model_profile(wk_model_t *m, wk_prof_op_t *out, int cap, int reset)
{
    struct wk_cuda *cu = m->cu;
    if (!cu)
        return 0;
    for (int i = 0; i < cu->n_ops && i < cap; i++)
        out[i] = cu->ops[i];
    const int n = cu->n_ops;
    if (reset)
        cu->n_ops = 0;
    return n;
}

void wk_model_set_profile(wk_model_t *m, int on)
{
    m->opts.profile = on;
}

int wk_model_device_bandwidth(wk_model_t *m, size_t nbytes, double *bytes_per_s, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    *bytes_per_s = 0;
    if (!cu)
        return bl_err_set(err, BL_ENOTSUP, "%s runs on the CPU", m->path);
    void *a = NULL, *b = NULL, *e0 = NULL, *e1 = NULL;
    int rc = kcuda_set_device(cu->device, err);
    if (rc < 0 || (rc = kcuda_alloc(&a, nbytes, err)) < 0 || (rc = kcuda_alloc(&b, nbytes, err)) < 0 ||
        (rc = kcuda_event_create(&e0, err)) < 0 || (rc = kcuda_event_create(&e1, err)) < 0 ||
        (rc = kcuda_memset(a, 1, nbytes, cu->stream, err)) < 0)
        goto out;
    for (int rep = 0; rep < 5; rep++) {
        float ms = 0;
        if ((rc = kcuda_event_record(e0, cu->stream, err)) < 0 ||
            (rc = kcuda_copy(b, a, nbytes, cu->stream, err)) < 0 ||
            (rc = kcuda_event_record(e1, cu->stream, err)) < 0 || (rc = kcuda_event_sync(e1, err)) < 0 ||
            (rc = kcuda_event_elapsed_ms(&ms, e0, e1, err)) < 0)
            goto out;
        const double bps = 2.0 * (double)nbytes / (1e-3 * (double)ms); /* read + written */
        if (rep > 0 && bps > *bytes_per_s)                              /* rep 0 warms up */
            *bytes_per_s = bps;
    }
out:
    drain(cu->stream);
    kcuda_event_destroy(e0);
    kcuda_event_destroy(e1);
    kcuda_free(a);
    kcuda_free(b);
    return rc;
}

// --- the step ------------------------------------------------------------------------------

/* Every launch goes through OP: a failure returns, and a profiling step records an
 * event after it. */
#define OP(name, call)                                                 \
    do {                                                               \
        int rc_ = (call);                                              \
        if (rc_ < 0)                                                   \
            return rc_;                                                \
        if (cu->prof_on && (rc_ = prof_mark(cu, (name), err)) < 0)     \
            return rc_;                                                \
    } while (0)

/* y (n, w->nrows) = x (n, w->ncols) w^T in chunks of KCUDA_MV_MAX_ROWS rows. */
static int mv(struct wk_cuda *cu, const kcuda_mat_t *w, const float *x, int64_t ldx, int64_t n, float *y,
              int64_t ldy, int acc, bl_err_t *err)
{
    for (int64_t r = 0; r < n; r += KCUDA_MV_MAX_ROWS) {
        const int cn = (int)(n - r < KCUDA_MV_MAX_ROWS ? n - r : KCUDA_MV_MAX_ROWS);
        int rc = kcuda_matvec(w, x + r * ldx, ldx, cn, y + r * ldy, ldy, acc, cu->stream, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* q, k, v of n rows of x, one launch per KCUDA_MV_MAX_ROWS rows (the bits of separate
 * products): the stacked run, and v beside it when it is not in the run. */
static int mv_qkv(struct wk_cuda *cu, const dlayer_t *D, const float *x, int64_t ldx, int64_t n, int64_t nq,
                  int64_t nkv, bl_err_t *err)
{
    for (int64_t r = 0; r < n; r += KCUDA_MV_MAX_ROWS) {
        const int cn = (int)(n - r < KCUDA_MV_MAX_ROWS ? n - r : KCUDA_MV_MAX_ROWS);
        const kcuda_out_t outs[3] = {{cu->q + r * nq, nq, D->wq.nrows},
                                     {cu->k + r * nkv, nkv, D->wk.nrows},
                                     {cu->v + r * nkv, nkv, D->wv.nrows}};
        int rc = D->nstack == 2 ? kcuda_matvec_split2(&D->wqkv, outs, 2, &D->wv, outs[2].d_y, nkv, x + r * ldx,
                                                      ldx, cn, cu->stream, err)
                                : kcuda_matvec_split(&D->wqkv, x + r * ldx, ldx, cn, outs, 3, cu->stream, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int same_shape(const kcuda_mat_t *a, const kcuda_mat_t *b)
{
    return a->type == b->type && a->ncols == b->ncols && a->nrows == b->nrows;
}

/* The routed experts of n rows of xn, added onto x: the gate and top-k, then each
 * row's k experts (gate/up with SwiGLU, then down with the weighted sum). */
static int moe_ffn(wk_model_t *m, const dlayer_t *D, int64_t n, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd, F = c->n_ff_exp, K = c->n_expert_used, NE = c->n_expert;
    void *st = cu->stream;
    OP("ffn_gate_inp", mv(cu, &D->gate_inp, cu->xn, E, n, cu->rl, NE, 0, err));
    /* Gate and up of one shape route in their own launch (each block routes its
     * row); otherwise the routing kernel first. */
    const int fused = same_shape(&D->gate_exps, &D->up_exps);
    if (!fused)
        OP("ffn_route", kcuda_moe_route(cu->rl, n, NE, (int)K, 1, cu->ids, cu->wts, st, err));
    /* The expert kernels index one block row per (row, choice): 65535 at most. */
    const int64_t step = 65535 / K;
    for (int64_t r = 0; r < n; r += step) {
        const int cn = (int)(n - r < step ? n - r : step);
        int32_t *ids = cu->ids + r * K;
        float *g = cu->g + r * K * F, *u = cu->u + r * K * F;
        if (fused) {
            OP("ffn_moe_gate_up", kcuda_matvec_experts_swiglu_route(&D->gate_exps, &D->up_exps, NE, cu->rl + r * NE,
                                                                    1, ids, cu->wts + r * K, cn, (int)K,
                                                                    cu->xn + r * E, E, g, F, st, err));
        } else {
            OP("ffn_moe_gate", kcuda_matvec_experts(&D->gate_exps, NE, ids, cn, (int)K, cu->xn + r * E, E, g,
                                                    F, st, err));
            OP("ffn_moe_up", kcuda_matvec_experts(&D->up_exps, NE, ids, cn, (int)K, cu->xn + r * E, E, u, F,
                                                  st, err));
            OP("ffn_moe_swiglu", kcuda_swiglu(g, g, u, cn * K * F, st, err));
        }
        OP("ffn_moe_down", kcuda_matvec_experts_down(&D->down_exps, NE, ids, cu->wts + r * K, cn, (int)K, g, F,
                                                     cu->x + r * E, E, 1, st, err));
    }
    return 0;
}

/* The dense SwiGLU FFN of n rows of xn, added onto x. */
static int dense_ffn(wk_model_t *m, const dlayer_t *D, int64_t n, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    const int64_t E = m->cfg.n_embd, F = m->cfg.n_ff;
    if (same_shape(&D->ffn_gate, &D->ffn_up)) {
        for (int64_t r = 0; r < n; r += KCUDA_MV_MAX_ROWS) {
            const int cn = (int)(n - r < KCUDA_MV_MAX_ROWS ? n - r : KCUDA_MV_MAX_ROWS);
            OP("ffn_gate_up", kcuda_matvec_swiglu(&D->ffn_gate, &D->ffn_up, cu->xn + r * E, E, cn, cu->g + r * F,
                                                  F, cu->stream, err));
        }
    } else {
        OP("ffn_gate", mv(cu, &D->ffn_gate, cu->xn, E, n, cu->g, F, 0, err));
        OP("ffn_up", mv(cu, &D->ffn_up, cu->xn, E, n, cu->u, F, 0, err));
        OP("ffn_swiglu", kcuda_swiglu(cu->g, cu->g, cu->u, n * F, cu->stream, err));
    }
    OP("ffn_down", mv(cu, &D->ffn_down, cu->g, F, n, cu->x, E, 1, err));
    return 0;
}

/* One layer's cache of a sequence (the classic kernels' view). */
static kcuda_kv_view_t kv_view(const wk_kv_t *kv, int64_t l)
{
    const size_t plane = (size_t)kv->n_ctx * kv->row_bytes;
    l -= kv->model->lb;
    return (kcuda_kv_view_t){.k = kv->buf + (size_t)(2 * l) * plane, .v = kv->buf + (size_t)(2 * l + 1) * plane,
                             .row_bytes = kv->row_bytes};
}

/* Enqueues one step over n rows whose inputs (tokens, positions, and for a decode
 * step the rows table) are on the card already. decode: every sequence is one row
 * and attention reads the rows table, over a grid of max_len positions; this
 * sequence of launches is what a graph captures. Otherwise attention goes sequence
 * by sequence. The last stage leaves the logits of the head's rows in cu->logits:
 * every row for a decode step, else each sequence's last n_out rows in order. */
static int enqueue_step(wk_model_t *m, const seg_t *seg, int64_t nseg, int64_t n, int decode, int64_t max_len,
                        bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd, hd = c->head_dim;
    const int64_t nq = c->n_head * hd, nkv = c->n_head_kv * hd;
    const float scale = (float)(1.0 / sqrt((double)hd));
    void *st = cu->stream;

    if (m->lb == 0)
        OP("embed", kcuda_get_rows(&cu->tok_embd, cu->d_tokens, n, cu->x, E, st, err));
    for (int64_t l = m->lb; l < m->le; l++) {
        const dlayer_t *D = &cu->layers[l];
        /* Attention: norm, projections, per-head q/k norm with RoPE, cache, attend;
         * the output projection adds onto the residual. */
        OP("attn_norm", kcuda_rms_norm(cu->xn, cu->x, D->attn_norm, n, E, E, c->eps, st, err));
        if (D->wqkv.data) {
            OP("attn_qkv", mv_qkv(cu, D, cu->xn, E, n, nq, nkv, err));
        } else {
            OP("attn_q", mv(cu, &D->wq, cu->xn, E, n, cu->q, nq, 0, err));
            OP("attn_k", mv(cu, &D->wk, cu->xn, E, n, cu->k, nkv, 0, err));
            OP("attn_v", mv(cu, &D->wv, cu->xn, E, n, cu->v, nkv, 0, err));
        }
        if (decode) {
            /* q/k norm, RoPE and the cache store fold into the one-pass attention
             * of short contexts; longer ones launch them first */
            OP("attention", kcuda_attention_rows_qkv(cu->d_rows, l - m->lb, cu->kv_row_bytes, cu->q, cu->k, cu->v,
                                                     D->q_norm, D->k_norm, cu->d_pos, cu->att, n, max_len, c->n_head,
                                                     c->n_head_kv, hd, c->eps, c->rope_base, scale, cu->att_scratch,
                                                     cu->att_scratch_bytes, st, err));
        } else {
            OP("attn_qk_norm_rope", kcuda_rms_norm_rope(cu->q, D->q_norm, cu->d_pos, n, c->n_head, hd, c->eps,
                                                        c->rope_base, st, err));
            OP("attn_qk_norm_rope", kcuda_rms_norm_rope(cu->k, D->k_norm, cu->d_pos, n, c->n_head_kv, hd, c->eps,
                                                        c->rope_base, st, err));
            for (int64_t j = 0; j < nseg; j++) {
                const kcuda_kv_view_t kv = kv_view(seg[j].kv, l);
                const int64_t r0 = seg[j].row0;
                OP("kv_store", kcuda_kv_store(&kv, cu->k + r0 * nkv, cu->v + r0 * nkv, nkv, seg[j].pos, seg[j].n,
                                              nkv, st, err));
                for (int64_t a = 0; a < seg[j].n; a += ATT_ROWS) {
                    const int64_t an = seg[j].n - a < ATT_ROWS ? seg[j].n - a : ATT_ROWS;
                    OP("attention", kcuda_attention(&kv, cu->q + (r0 + a) * nq, cu->att + (r0 + a) * nq, an,
                                                    seg[j].pos + a, c->n_head, c->n_head_kv, hd, scale,
                                                    cu->att_scratch, cu->att_scratch_bytes, st, err));
                }
            }
        }
        OP("attn_output", mv(cu, &D->wo, cu->att, nq, n, cu->x, E, 1, err));

        /* FFN: norm, routed experts or dense SwiGLU, both adding onto the residual. */
        OP("ffn_norm", kcuda_rms_norm(cu->xn, cu->x, D->ffn_norm, n, E, E, c->eps, st, err));
        int rc = c->moe ? moe_ffn(m, D, n, err) : dense_ffn(m, D, n, err);
        if (rc < 0)
            return rc;
    }
    if (m->le < c->n_layer)
        return 0;

    /* Head: the rows whose logits are wanted, normed into xg in order. */
    int64_t n_out = 0;
    if (decode) {
        OP("output_norm", kcuda_rms_norm(cu->xg, cu->x, cu->output_norm, n, E, E, c->eps, st, err));
        n_out = n;
    } else {
        for (int64_t j = 0; j < nseg; j++) {
            if (seg[j].n_out == 0)
                continue;
            const int64_t r0 = seg[j].row0 + seg[j].n - seg[j].n_out;
            OP("output_norm", kcuda_rms_norm(cu->xg + n_out * E, cu->x + r0 * E, cu->output_norm, seg[j].n_out, E,
                                             E, c->eps, st, err));
            n_out += seg[j].n_out;
        }
    }
    if (n_out > 0)
        OP("output", mv(cu, &cu->output, cu->xg, E, n_out, cu->logits, c->n_vocab, 0, err));
    return 0;
}

// --- the prompt path ----------------------------------------------------------------------
/* Steps with more than one row per sequence. Every matrix product is a tensor-core
 * GEMM over f16 inputs with f32 accumulation (kcuda_gemm: cuBLAS; the experts:
 * kcuda_gemm_grouped); each product's input rows are rounded to f16 once, into
 * x16, and the residual stream x stays f32. The step is enqueued directly (no
 * graph): its shapes change with every prompt, and nothing in it waits on the host,
 * so the host runs ahead of the card. */

/* y (n, w->nrows) [+]= x w^T with x16 holding x (n, w->ncols) in f16, ldx16 apart. */
static int pp_mm(struct wk_cuda *cu, const kcuda_mat_t *w, const float *x, int64_t ldx, int64_t ldx16,
                 int64_t n, float *y, int64_t ldy, int acc, bl_err_t *err)
{
    return kcuda_gemm(cu->blas, w, cu->x16, ldx16, x, ldx, n, y, ldy, acc, cu->wscr, cu->wscr_bytes, cu->stream,
                      err);
}

/* The routed experts of n rows of xn (x16 holds them in f16), added onto x: router
 * and top-k on the card, the (row, choice) slots sorted by expert on the card, the
 * gathered rows through each expert matrix in one grouped launch (only the chosen
 * experts dequantized), then the weighted sum back in row order. */
static int pp_moe_ffn(wk_model_t *m, const dlayer_t *D, int64_t n, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd, F = c->n_ff_exp, K = c->n_expert_used, NE = c->n_expert, S = n * K;
    void *st = cu->stream;
    int32_t *counts = cu->srt, *offsets = counts + NE, *tile0 = offsets + NE + 1, *perm = tile0 + NE + 1;
    int32_t *inv = perm + m->opts.n_batch * K;
    OP("ffn_gate_inp", pp_mm(cu, &D->gate_inp, cu->xn, E, E, n, cu->rl, NE, 0, err));
    OP("ffn_route", kcuda_moe_route(cu->rl, n, NE, (int)K, 1, cu->ids, cu->wts, st, err));
    OP("ffn_moe_sort", kcuda_moe_sort(cu->ids, S, NE, counts, offsets, tile0, perm, inv, st, err));
    OP("ffn_moe_gather", kcuda_moe_gather_f16(cu->xn, E, perm, S, (int)K, E, cu->xs16, E, st, err));
    OP("ffn_moe_dequant", kcuda_dequant_f16(&D->gate_exps, 0, NE * F, cu->wscr, counts, F, st, err));
    OP("ffn_moe_gate", kcuda_gemm_grouped(cu->wscr, NE, F, E, cu->xs16, offsets, tile0, S, cu->g, F, st, err));
    OP("ffn_moe_dequant", kcuda_dequant_f16(&D->up_exps, 0, NE * F, cu->wscr, counts, F, st, err));
    OP("ffn_moe_up", kcuda_gemm_grouped(cu->wscr, NE, F, E, cu->xs16, offsets, tile0, S, cu->u, F, st, err));
    /* The SwiGLU output, in f16, takes the gathered rows' place. */
    OP("ffn_moe_swiglu", kcuda_swiglu_f16(cu->g, cu->u, S * F, cu->xs16, st, err));
    OP("ffn_moe_dequant", kcuda_dequant_f16(&D->down_exps, 0, NE * E, cu->wscr, counts, E, st, err));
    OP("ffn_moe_down", kcuda_gemm_grouped(cu->wscr, NE, E, F, cu->xs16, offsets, tile0, S, cu->dg, E, st, err));
    OP("ffn_moe_combine", kcuda_moe_combine(cu->dg, E, inv, cu->wts, n, (int)K, E, cu->x, E, 1, st, err));
    return 0;
}

/* The dense SwiGLU FFN of n rows of xn (in x16 as f16), added onto x. */
static int pp_dense_ffn(wk_model_t *m, const dlayer_t *D, int64_t n, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    const int64_t E = m->cfg.n_embd, F = m->cfg.n_ff;
    OP("ffn_gate", pp_mm(cu, &D->ffn_gate, cu->xn, E, E, n, cu->g, F, 0, err));
    OP("ffn_up", pp_mm(cu, &D->ffn_up, cu->xn, E, E, n, cu->u, F, 0, err));
    OP("ffn_swiglu", kcuda_swiglu_f16(cu->g, cu->u, n * F, cu->x16, cu->stream, err));
    /* f32 down weights read the f32 SwiGLU output: make it in place in g. */
    if (D->ffn_down.type == BL_TYPE_F32)
        OP("ffn_swiglu", kcuda_swiglu(cu->g, cu->g, cu->u, n * F, cu->stream, err));
    OP("ffn_down", pp_mm(cu, &D->ffn_down, cu->g, F, F, n, cu->x, E, 1, err));
    return 0;
}

/* enqueue_step for a prompt or mixed step (rows of each sequence contiguous,
 * seg[j].row0 ..): the same ops in the same order, with the products as GEMMs and
 * attention as prefill flash attention per sequence. The head's rows go through
 * the matvec when there are few of them (a prompt's last row), else a GEMM. */
static int enqueue_prompt(wk_model_t *m, const seg_t *seg, int64_t nseg, int64_t n, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd, hd = c->head_dim;
    const int64_t nq = c->n_head * hd, nkv = c->n_head_kv * hd;
    const float scale = (float)(1.0 / sqrt((double)hd));
    void *st = cu->stream;

    if (m->lb == 0)
        OP("embed", kcuda_get_rows(&cu->tok_embd, cu->d_tokens, n, cu->x, E, st, err));
    for (int64_t l = m->lb; l < m->le; l++) {
        const dlayer_t *D = &cu->layers[l];
        OP("attn_norm", kcuda_rms_norm(cu->xn, cu->x, D->attn_norm, n, E, E, c->eps, st, err));
        OP("attn_to_f16", kcuda_to_f16(cu->xn, E, n, E, cu->x16, E, st, err));
        OP("attn_q", pp_mm(cu, &D->wq, cu->xn, E, E, n, cu->q, nq, 0, err));
        OP("attn_k", pp_mm(cu, &D->wk, cu->xn, E, E, n, cu->k, nkv, 0, err));
        OP("attn_v", pp_mm(cu, &D->wv, cu->xn, E, E, n, cu->v, nkv, 0, err));
        OP("attn_qk_norm_rope", kcuda_rms_norm_rope(cu->q, D->q_norm, cu->d_pos, n, c->n_head, hd, c->eps,
                                                    c->rope_base, st, err));
        OP("attn_qk_norm_rope", kcuda_rms_norm_rope(cu->k, D->k_norm, cu->d_pos, n, c->n_head_kv, hd, c->eps,
                                                    c->rope_base, st, err));
        for (int64_t j = 0; j < nseg; j++) {
            const kcuda_kv_view_t kv = kv_view(seg[j].kv, l);
            const int64_t r0 = seg[j].row0;
            OP("kv_store", kcuda_kv_store(&kv, cu->k + r0 * nkv, cu->v + r0 * nkv, nkv, seg[j].pos, seg[j].n, nkv,
                                          st, err));
            if (cu->flash) {
                OP("attention", kcuda_attention_prefill(&kv, cu->q + r0 * nq, cu->att + r0 * nq, seg[j].n, seg[j].pos,
                                                        c->n_head, c->n_head_kv, hd, scale, st, err));
                continue;
            }
            for (int64_t a = 0; a < seg[j].n; a += ATT_ROWS) { /* head_dim 32 or 256 */
                const int64_t an = seg[j].n - a < ATT_ROWS ? seg[j].n - a : ATT_ROWS;
                OP("attention", kcuda_attention(&kv, cu->q + (r0 + a) * nq, cu->att + (r0 + a) * nq, an,
                                                seg[j].pos + a, c->n_head, c->n_head_kv, hd, scale, cu->att_scratch,
                                                cu->att_scratch_bytes, st, err));
            }
        }
        OP("attn_to_f16", kcuda_to_f16(cu->att, nq, n, nq, cu->x16, nq, st, err));
        OP("attn_output", pp_mm(cu, &D->wo, cu->att, nq, nq, n, cu->x, E, 1, err));

        OP("ffn_norm", kcuda_rms_norm(cu->xn, cu->x, D->ffn_norm, n, E, E, c->eps, st, err));
        OP("ffn_to_f16", kcuda_to_f16(cu->xn, E, n, E, cu->x16, E, st, err));
        int rc = c->moe ? pp_moe_ffn(m, D, n, err) : pp_dense_ffn(m, D, n, err);
        if (rc < 0)
            return rc;
    }
    if (m->le < c->n_layer)
        return 0;

    int64_t n_out = 0;
    for (int64_t j = 0; j < nseg; j++) {
        if (seg[j].n_out == 0)
            continue;
        const int64_t r0 = seg[j].row0 + seg[j].n - seg[j].n_out;
        OP("output_norm", kcuda_rms_norm(cu->xg + n_out * E, cu->x + r0 * E, cu->output_norm, seg[j].n_out, E, E,
                                         c->eps, st, err));
        n_out += seg[j].n_out;
    }
    if (n_out > KCUDA_MV_MAX_ROWS) {
        OP("output", kcuda_to_f16(cu->xg, E, n_out, E, cu->x16, E, st, err));
        OP("output", pp_mm(cu, &cu->output, cu->xg, E, E, n_out, cu->logits, c->n_vocab, 0, err));
    } else if (n_out > 0) {
        OP("output", mv(cu, &cu->output, cu->xg, E, n_out, cu->logits, c->n_vocab, 0, err));
    }
    return 0;
}

/* The graph bucket of a decode step whose longest row attends to len positions. */
static int bucket_of(int64_t len)
{
    int i = 0;
    while (i < N_BUCKETS - 1 && ((int64_t)256 << i) < len)
        i++;
    return i;
}

/* Runs a decode step of n rows from its graph, capturing it on first use. */
static int run_graph(wk_model_t *m, const seg_t *seg, int64_t n, int b, int64_t max_len, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    void **exec = &cu->graphs[n][b];
    if (!*exec) {
        int rc = kcuda_graph_begin(cu->stream, err);
        if (rc < 0)
            return rc;
        rc = enqueue_step(m, seg, n, n, 1, max_len, err);
        bl_err_t e2 = {0};
        const int rc2 = kcuda_graph_end(cu->stream, exec, rc < 0 ? &e2 : err);
        if (rc < 0)
            return rc;
        if (rc2 < 0)
            return rc2;
    }
    return kcuda_graph_launch(*exec, cu->stream, err);
}

/* A profiled decode step: the step captured with an event node after every launch
 * (so the timestamps come from the card, without the host's launch gaps), replayed
 * once, then dropped. */
static int run_profiled_graph(wk_model_t *m, const seg_t *seg, int64_t n, int64_t max_len, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    void *exec = NULL;
    int rc = kcuda_graph_begin(cu->stream, err);
    if (rc < 0)
        return rc;
    rc = kcuda_event_record(cu->ev[0], cu->stream, err);
    if (rc == 0)
        rc = enqueue_step(m, seg, n, n, 1, max_len, err);
    bl_err_t e2 = {0};
    const int rc2 = kcuda_graph_end(cu->stream, &exec, rc < 0 ? &e2 : err);
    if (rc == 0 && rc2 == 0)
        rc = kcuda_graph_launch(exec, cu->stream, err);
    if (rc == 0 && rc2 == 0)
        rc = kcuda_sync(cu->stream, err);
    kcuda_graph_destroy(exec);
    return rc < 0 ? rc : rc2;
}

int wk__cuda_forward(wk_model_t *m, const seg_t *seg, int64_t nseg, int64_t n, const float *x_in, float *x_out,
                     float *logits, bl_err_t *err)
{
    struct wk_cuda *cu = m->cu;
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd, V = c->n_vocab;
    int rc = kcuda_set_device(cu->device, err);
    if (rc < 0)
        return rc;

    /* The step's inputs, into pinned memory, then one copy to the card. */
    int decode = nseg <= GRAPH_MAX_ROWS;
    int64_t max_pos = 0;
    for (int64_t j = 0; j < nseg; j++) {
        decode &= seg[j].n == 1;
        for (int64_t i = 0; i < seg[j].n; i++) {
            const int64_t b = seg[j].row0 + i;
            cu->h_tokens[b] = m->lb == 0 ? seg[j].tokens[i] : 0;
            cu->h_pos[b] = (int32_t)(seg[j].pos + i);
        }
        max_pos = seg[j].pos + seg[j].n > max_pos ? seg[j].pos + seg[j].n : max_pos;
    }
    if (decode)
        for (int64_t j = 0; j < nseg; j++) {
            const wk_kv_t *kv = seg[j].kv;
            const uint64_t plane = (uint64_t)kv->n_ctx * kv->row_bytes;
            cu->h_rows[j] = (kcuda_kv_row_t){.k = (uint64_t)(uintptr_t)kv->buf, .layer_bytes = 2 * plane,
                                             .v_bytes = plane, .pos = (int32_t)seg[j].pos};
        }
    if ((rc = kcuda_upload(cu->d_in, cu->h_in, cu->in_bytes, cu->stream, err)) < 0)
        return rc;
    if (m->lb > 0 && x_in && (rc = kcuda_upload(cu->x, x_in, sizeof(float) * (size_t)(n * E), cu->stream, err)) < 0)
        return rc;

    cu->prof_on = m->opts.profile;
    cu->n_ev = 0;
    if (cu->prof_on && !(decode && m->opts.cuda_graph) &&
        (rc = kcuda_event_record(cu->ev[0], cu->stream, err)) < 0)
        return rc;
    if (decode) {
        const int b = bucket_of(max_pos);
        int64_t max_len = (int64_t)256 << b;
        max_len = max_len < cu->max_len_cap ? max_len : cu->max_len_cap;
        if (cu->prof_on && m->opts.cuda_graph)
            rc = run_profiled_graph(m, seg, n, max_len, err);
        else if (m->opts.cuda_graph)
            rc = run_graph(m, seg, n, b, max_len, err);
        else
            rc = enqueue_step(m, seg, nseg, n, 1, max_len, err);
    } else {
        rc = cu->pp_ok ? enqueue_prompt(m, seg, nseg, n, err) : enqueue_step(m, seg, nseg, n, 0, 0, err);
    }
    if (rc < 0) {
        drain(cu->stream);
        return rc;
    }

    /* Outputs: the hidden rows for the next stage, or the logits asked for. */
    if (m->le < c->n_layer) {
        if (x_out && (rc = kcuda_download(x_out, cu->x, sizeof(float) * (size_t)(n * E), cu->stream, err)) < 0)
            return rc;
    } else if (decode) {
        int64_t o = 0;
        for (int64_t j = 0; j < nseg; j++)
            if (seg[j].n_out > 0 &&
                (rc = kcuda_download(logits + (size_t)(o++) * (size_t)V, cu->logits + (size_t)j * (size_t)V,
                                     sizeof(float) * (size_t)V, cu->stream, err)) < 0)
                return rc;
    } else {
        int64_t n_out = 0;
        for (int64_t j = 0; j < nseg; j++)
            n_out += seg[j].n_out;
        if (n_out > 0 && (rc = kcuda_download(logits, cu->logits, sizeof(float) * (size_t)(n_out * V), cu->stream,
                                              err)) < 0)
            return rc;
    }
    if ((rc = kcuda_sync(cu->stream, err)) < 0)
        return rc;
    return cu->prof_on ? prof_collect(cu, err) : 0;
}

#else /* no CUDA in this build */

static int no_cuda(bl_err_t *err)
{
    return bl_err_set(err, BL_ENOTSUP, "device: this build has no CUDA");
}

int wk__cuda_load(wk_model_t *m, bl_err_t *err)
{
    (void)m;
    return no_cuda(err);
}

void wk__cuda_free(wk_model_t *m) { (void)m; }

int wk__cuda_kv_alloc(wk_kv_t *kv, bl_err_t *err)
{
    (void)kv;
    return no_cuda(err);
}

void wk__cuda_kv_free(wk_kv_t *kv) { (void)kv; }

int wk__cuda_forward(wk_model_t *m, const seg_t *seg, int64_t nseg, int64_t n, const float *x_in, float *x_out,
                     float *logits, bl_err_t *err)
{
    (void)m, (void)seg, (void)nseg, (void)n, (void)x_in, (void)x_out, (void)logits;
    return no_cuda(err);
}

const char *wk__cuda_name(const wk_model_t *m)
{
    (void)m;
    return "none";
}

int wk_model_profile(wk_model_t *m, wk_prof_op_t *out, int cap, int reset)
{
    (void)m, (void)out, (void)cap, (void)reset;
    return 0;
}

void wk_model_set_profile(wk_model_t *m, int on) { (void)m, (void)on; }

int wk_model_device_bandwidth(wk_model_t *m, size_t nbytes, double *bytes_per_s, bl_err_t *err)
{
    (void)m, (void)nbytes;
    *bytes_per_s = 0;
    return no_cuda(err);
}

#endif
