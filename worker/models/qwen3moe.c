/* The Qwen3 family's forward pass on the CPU backend: qwen3moe (routed experts) and
 * qwen3 (dense FFN) in one file, since they differ only in the FFN block. Also owns
 * loading (Config from the metadata, Weights as views into the mapping, RunState
 * scratch sized once) and the per-sequence KV cache, until a second architecture
 * gives the shared parts a file of their own.
 *
 * The computation is llama.cpp's for these architectures: RMSNorm, Q/K/V, per-head
 * RMSNorm of q and k, NEOX RoPE, causal GQA attention, residual; RMSNorm, FFN
 * (softmax top-k router renormalised to 1, SwiGLU experts), residual; final norm
 * and head (token_embd when output.weight is absent). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "blocks.h"
#include "gguf.h"
#include "kcpu.h"
#include "log.h"
#include "quant.h"
#include "qwen3moe_impl.h"
#include "wk.h"

/* Limits on metadata values, far above any real Qwen3 and low enough that every
 * buffer size computed from them fits in size_t. */
#define MAX_DIM (1 << 20)
#define MAX_LAYERS 4096
#define MAX_EXPERTS 4096
#define MAX_VOCAB (1 << 24)
#define MAX_CTX (1 << 24)

void wk_model_opts_default(wk_model_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->n_threads = 1;
    o->n_batch = 512;
    o->act_terms = 2;
    o->device = WK_DEVICE_CPU;
    o->cuda_graph = 1;
}

// --- loading ------------------------------------------------------------------------------

/* Reads ARCH.<key> as a u32 in 1..max; a missing key is an error unless def > 0. */
static int get_dim(const bl_gguf_t *g, const char *arch, const char *key, int64_t def,
                   int64_t max, int64_t *out, bl_err_t *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    uint32_t v;
    if (!bl_gguf_find_kv(g, full) && def > 0) {
        *out = def;
        return 0;
    }
    int rc = bl_gguf_get_u32(g, full, &v, err);
    if (rc < 0)
        return rc;
    if (v < 1 || v > max)
        return bl_err_set(err, BL_ERANGE, "metadata %s = %u is outside 1..%lld", full, v,
                          (long long)max);
    *out = v;
    return 0;
}

static int get_float(const bl_gguf_t *g, const char *arch, const char *key, float def,
                     float lo, float hi, float *out, bl_err_t *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (!bl_gguf_find_kv(g, full)) {
        *out = def;
        return 0;
    }
    int rc = bl_gguf_get_f32(g, full, out, err);
    if (rc < 0)
        return rc;
    if (!(*out >= lo && *out <= hi))
        return bl_err_set(err, BL_ERANGE, "metadata %s = %g is outside %g..%g", full,
                          (double)*out, (double)lo, (double)hi);
    return 0;
}

static int read_config(wk_model_t *m, bl_err_t *err)
{
    const bl_gguf_t *g = m->g;
    wk_config_t *c = &m->cfg;
    bl_gguf_str_t a;
    int rc = bl_gguf_get_str(g, "general.architecture", &a, err);
    if (rc < 0)
        return rc;
    if (a.len == 8 && memcmp(a.ptr, "qwen3moe", 8) == 0)
        c->moe = 1;
    else if (a.len == 5 && memcmp(a.ptr, "qwen3", 5) == 0)
        c->moe = 0;
    else
        return bl_err_set(err, BL_ENOTSUP, "%s: architecture '%.*s' is not supported (qwen3moe, qwen3)",
                          m->path, (int)(a.len > 64 ? 64 : a.len), a.ptr);
    snprintf(c->arch, sizeof c->arch, "%s", c->moe ? "qwen3moe" : "qwen3");
    const char *ar = c->arch;
    if ((rc = get_dim(g, ar, "block_count", 0, MAX_LAYERS, &c->n_layer, err)) < 0 ||
        (rc = get_dim(g, ar, "embedding_length", 0, MAX_DIM, &c->n_embd, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.head_count", 0, MAX_DIM, &c->n_head, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.head_count_kv", c->n_head, MAX_DIM, &c->n_head_kv, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.key_length", c->n_embd / c->n_head, MAX_DIM, &c->head_dim, err)) < 0 ||
        (rc = get_dim(g, ar, "context_length", 0, MAX_CTX, &c->n_ctx_train, err)) < 0)
        return rc;
    int64_t vlen = 0;
    if ((rc = get_dim(g, ar, "attention.value_length", c->head_dim, MAX_DIM, &vlen, err)) < 0)
        return rc;
    if (vlen != c->head_dim)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s.attention.value_length %lld differs from key_length %lld",
                          m->path, ar, (long long)vlen, (long long)c->head_dim);
    if (c->head_dim % 2 != 0 || c->n_head % c->n_head_kv != 0 || c->n_head * c->head_dim > MAX_DIM)
        return bl_err_set(err, BL_EINVAL,
                          "%s: head_dim %lld must be even, head_count %lld a multiple of head_count_kv %lld, and their product at most %d",
                          m->path, (long long)c->head_dim, (long long)c->n_head,
                          (long long)c->n_head_kv, MAX_DIM);
    if ((rc = get_float(g, ar, "rope.freq_base", 10000.0f, 1.0f, 1e12f, &c->rope_base, err)) < 0 ||
        (rc = get_float(g, ar, "attention.layer_norm_rms_epsilon", 1e-6f, 0.0f, 1.0f, &c->eps, err)) < 0)
        return rc;
    /* Context extension changes the RoPE angles; refused rather than run wrong. */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", ar);
    bl_gguf_str_t st;
    if (bl_gguf_find_kv(g, key)) {
        if ((rc = bl_gguf_get_str(g, key, &st, err)) < 0)
            return rc;
        if (!(st.len == 4 && memcmp(st.ptr, "none", 4) == 0))
            return bl_err_set(err, BL_ENOTSUP, "%s: %s '%.*s' is not supported", m->path, key,
                              (int)(st.len > 32 ? 32 : st.len), st.ptr);
    }
    if (c->moe) {
        if ((rc = get_dim(g, ar, "expert_count", 0, MAX_EXPERTS, &c->n_expert, err)) < 0 ||
            (rc = get_dim(g, ar, "expert_used_count", 0, MAX_EXPERTS, &c->n_expert_used, err)) < 0 ||
            (rc = get_dim(g, ar, "expert_feed_forward_length", 0, MAX_DIM, &c->n_ff_exp, err)) < 0)
            return rc;
        if (c->n_expert_used > c->n_expert)
            return bl_err_set(err, BL_EINVAL, "%s: %s.expert_used_count %lld exceeds expert_count %lld",
                              m->path, ar, (long long)c->n_expert_used, (long long)c->n_expert);
    } else {
        if ((rc = get_dim(g, ar, "feed_forward_length", 0, MAX_DIM, &c->n_ff, err)) < 0)
            return rc;
    }
    return 0;
}

static void shape_str(char *buf, size_t len, const int64_t ne[4])
{
    snprintf(buf, len, "[%lld, %lld, %lld, %lld]", (long long)ne[0], (long long)ne[1],
             (long long)ne[2], (long long)ne[3]);
}

/* Finds name and checks its shape (ne0, ne1, ne2; 1 for an unused dimension) and
 * type: f32 only when need_f32, else any type with a reference dequantizer. */
static int find(wk_model_t *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                int need_f32, const bl_gguf_tensor_t **out, bl_err_t *err)
{
    const bl_gguf_tensor_t *t = bl_gguf_find_tensor(m->g, name);
    if (!t)
        return bl_err_set(err, BL_ENOENT, "%s: tensor '%s' is missing", m->path, name);
    const int64_t want[4] = {ne0, ne1, ne2, 1};
    if (memcmp(want, t->ne, sizeof want) != 0) {
        char a[96], b[96];
        shape_str(a, sizeof a, t->ne);
        shape_str(b, sizeof b, want);
        return bl_err_set(err, BL_EINVAL, "%s: tensor '%s' has shape %s, expected %s", m->path,
                          name, a, b);
    }
    const bl_type_info_t *ti = bl_type_info(t->type);
    if (need_f32 && t->type != BL_TYPE_F32)
        return bl_err_set(err, BL_EINVAL, "%s: tensor '%s' has type %s, expected f32", m->path,
                          name, ti ? ti->name : "?");
    if (!ti || !ti->has_dequant)
        return bl_err_set(err, BL_ENOTSUP, "%s: tensor '%s' has type %s, which has no dequantizer",
                          m->path, name, ti ? ti->name : "?");
    /* A file may declare an alignment of 1 or 2; the kernels read floats and halves
     * in place, so the data must sit on a 4-byte boundary. */
    if ((uintptr_t)t->data % 4 != 0)
        return bl_err_set(err, BL_EINVAL, "%s: tensor '%s' data at file offset %llu is not 4-byte aligned",
                          m->path, name, (unsigned long long)t->file_offset);
    size_t rb;
    int rc = bl_row_bytes(t->type, ne0, &rb, err);
    if (rc < 0)
        return bl_err_set(err, rc, "%s: tensor '%s': rows of %lld are not whole %s blocks", m->path,
                          name, (long long)ne0, ti->name);
    if ((uint64_t)rb * (uint64_t)ne1 * (uint64_t)ne2 != t->nbytes)
        return bl_err_set(err, BL_EINVAL, "%s: tensor '%s' holds %llu bytes, expected %llu",
                          m->path, name, (unsigned long long)t->nbytes,
                          (unsigned long long)((uint64_t)rb * (uint64_t)ne1 * (uint64_t)ne2));
    *out = t;
    return 0;
}

/* A matrix tensor name (ne0 = ncols, ne1 * ne2 rows). */
static int find_mat(wk_model_t *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                    int use, kcpu_mat_t *out, bl_err_t *err)
{
    const bl_gguf_tensor_t *t = NULL;
    int rc = find(m, name, ne0, ne1, ne2, 0, &t, err);
    if (rc < 0)
        return rc;
    const void *data = t->data;
    /* A matrix another process computes (another stage's, or the routed experts of a
     * worker whose hosttier runs them) is checked but stays in the file mapping,
     * where it costs nothing until read. */
    if (use && m->arena && m->arena_used + t->nbytes <= m->arena_len) {
        memcpy(m->arena + m->arena_used, t->data, t->nbytes);
        data = m->arena + m->arena_used;
        m->arena_used += (t->nbytes + 63) & ~(uint64_t)63;
    }
    return kcpu_mat_init(out, data, t->type, ne0, ne1 * ne2, err);
}

/* Decode streams every active weight once per token, and a file mapping is in 4 KiB
 * pages: a TLB miss every 4 KiB and a hardware prefetcher that stops at each page.
 * The matrices are therefore copied once into anonymous memory advised as huge
 * pages (measured on the 2-core EPYC: tg64 on m8.gguf about +12%). Best effort: a
 * model larger than half the physical memory, or a failed mapping, leaves the
 * matrices in the file mapping, which the page cache can evict; a copy of such a
 * model could not be. Sized for every tensor of the file, which bounds the
 * matrices' total. */
static void weights_arena(wk_model_t *m)
{
    const size_t huge = (size_t)2 << 20;
    uint64_t total = 0;
    for (uint64_t i = 0; i < bl_gguf_n_tensors(m->g); i++)
        total += (bl_gguf_tensor_at(m->g, i)->nbytes + 63) & ~(uint64_t)63;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (total == 0 || total > SIZE_MAX - huge || pages <= 0 || page <= 0 ||
        (!m->opts.no_mmap && total > (uint64_t)pages / 2 * (uint64_t)page))
        return;
    const size_t len = ((size_t)total + huge - 1) & ~(huge - 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE);
#endif
    m->arena = p;
    m->arena_len = len;
}

/* --mlock: the copied matrices, or the file mapping where they stayed, locked in
 * RAM. A refusal (RLIMIT_MEMLOCK, most often) is logged and the load goes on, as
 * llama.cpp does. */
static void lock_weights(wk_model_t *m)
{
    const uint32_t n = m->arena ? 1 : bl_gguf_n_parts(m->g);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = m->arena_used;
        const void *p = m->arena ? (const void *)m->arena : bl_gguf_part_bytes(m->g, i, &len);
        if (!p || len == 0 || len > SIZE_MAX)
            continue;
        if (mlock(p, (size_t)len) != 0)
            BL_LOG(BL_LOG_WARN, "event=mlock_failed bytes=%llu reason=\"%s\" hint=\"raise ulimit "
                   "-l (RLIMIT_MEMLOCK)\"", (unsigned long long)len, strerror(errno));
        else
            BL_LOG(BL_LOG_INFO, "event=mlock bytes=%llu", (unsigned long long)len);
    }
}

static int find_vec(wk_model_t *m, const char *name, int64_t ne0, const float **out, bl_err_t *err)
{
    const bl_gguf_tensor_t *t = NULL;
    int rc = find(m, name, ne0, 1, 1, 1, &t, err);
    if (rc < 0)
        return rc;
    *out = t->data;
    return 0;
}

static int map_weights(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    const int64_t E = c->n_embd, nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    const bl_gguf_tensor_t *te = bl_gguf_find_tensor(m->g, "token_embd.weight");
    if (!te)
        return bl_err_set(err, BL_ENOENT, "%s: tensor 'token_embd.weight' is missing", m->path);
    m->cfg.n_vocab = te->ne[1];
    if (c->n_vocab < 1 || c->n_vocab > MAX_VOCAB)
        return bl_err_set(err, BL_ERANGE, "%s: token_embd.weight has %lld rows, outside 1..%d",
                          m->path, (long long)c->n_vocab, MAX_VOCAB);
    /* What this process computes: its stage's layers (the first stage embeds, the
     * last one has the head; a tied head reads token_embd), or only the experts. */
    const int only = m->opts.experts == WK_EXPERTS_ONLY;
    const int last = m->le == c->n_layer;
    const int use_head = !only && last;
    const int use_embd = !only && (m->lb == 0 || (last && !bl_gguf_find_tensor(m->g, "output.weight")));
    int rc;
    if ((rc = find_mat(m, "token_embd.weight", E, c->n_vocab, 1, use_embd, &w->tok_embd, err)) < 0 ||
        (rc = find_vec(m, "output_norm.weight", E, &w->output_norm, err)) < 0)
        return rc;
    if (bl_gguf_find_tensor(m->g, "output.weight")) {
        if ((rc = find_mat(m, "output.weight", E, c->n_vocab, 1, use_head, &w->output, err)) < 0)
            return rc;
    } else {
        m->cfg.tied_output = 1;
        w->output = w->tok_embd;
    }
    /* The head runs for one row per sequence, even in a prompt: its activations stay
     * two q8 terms, whose packed q6_K kernel streams faster than the q16_K one. */
    w->output.act_q8 = 1;
    w->layers = calloc((size_t)c->n_layer, sizeof *w->layers);
    if (!w->layers)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %lld layers", (long long)c->n_layer);
    for (int64_t l = 0; l < c->n_layer; l++) {
        layer_t *L = &w->layers[l];
        char n[96];
        const int in_stage = l >= m->lb && l < m->le;
        const int use_attn = !only && in_stage;
        const int use_exps = only || (in_stage && m->opts.experts == WK_EXPERTS_LOCAL);
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), n)
        if ((rc = find_vec(m, NAME("attn_norm.weight"), E, &L->attn_norm, err)) < 0 ||
            (rc = find_mat(m, NAME("attn_q.weight"), E, nq, 1, use_attn, &L->wq, err)) < 0 ||
            (rc = find_mat(m, NAME("attn_k.weight"), E, nkv, 1, use_attn, &L->wk, err)) < 0 ||
            (rc = find_mat(m, NAME("attn_v.weight"), E, nkv, 1, use_attn, &L->wv, err)) < 0 ||
            (rc = find_mat(m, NAME("attn_output.weight"), nq, E, 1, use_attn, &L->wo, err)) < 0 ||
            (rc = find_vec(m, NAME("attn_q_norm.weight"), c->head_dim, &L->q_norm, err)) < 0 ||
            (rc = find_vec(m, NAME("attn_k_norm.weight"), c->head_dim, &L->k_norm, err)) < 0 ||
            (rc = find_vec(m, NAME("ffn_norm.weight"), E, &L->ffn_norm, err)) < 0)
            return rc;
        if (c->moe) {
            if ((rc = find_mat(m, NAME("ffn_gate_inp.weight"), E, c->n_expert, 1, use_attn, &L->gate_inp, err)) < 0 ||
                (rc = find_mat(m, NAME("ffn_gate_exps.weight"), E, c->n_ff_exp, c->n_expert, use_exps, &L->gate_exps, err)) < 0 ||
                (rc = find_mat(m, NAME("ffn_up_exps.weight"), E, c->n_ff_exp, c->n_expert, use_exps, &L->up_exps, err)) < 0 ||
                (rc = find_mat(m, NAME("ffn_down_exps.weight"), c->n_ff_exp, E, c->n_expert, use_exps, &L->down_exps, err)) < 0)
                return rc;
        } else {
            if ((rc = find_mat(m, NAME("ffn_gate.weight"), E, c->n_ff, 1, use_attn, &L->ffn_gate, err)) < 0 ||
                (rc = find_mat(m, NAME("ffn_up.weight"), E, c->n_ff, 1, use_attn, &L->ffn_up, err)) < 0 ||
                (rc = find_mat(m, NAME("ffn_down.weight"), c->n_ff, E, 1, use_attn, &L->ffn_down, err)) < 0)
                return rc;
        }
#undef NAME
    }
    return 0;
}

static int alloc_state(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    run_state_t *s = &m->s;
    const size_t B = (size_t)m->opts.n_batch;
    const size_t E = (size_t)c->n_embd, nq = (size_t)(c->n_head * c->head_dim);
    const size_t nkv = (size_t)(c->n_head_kv * c->head_dim);
    const size_t ff = (size_t)(c->moe ? c->n_ff_exp : c->n_ff);
    const size_t ne = (size_t)(c->moe ? c->n_expert : 1), nu = (size_t)(c->moe ? c->n_expert_used : 1);
    s->x = malloc(sizeof(float) * B * E);
    s->xn = malloc(sizeof(float) * B * E);
    s->q = malloc(sizeof(float) * B * nq);
    s->k = malloc(sizeof(float) * B * nkv);
    s->v = malloc(sizeof(float) * B * nkv);
    s->att = malloc(sizeof(float) * B * nq);
    s->o = malloc(sizeof(float) * B * E);
    s->rope = malloc(sizeof(float) * B * (size_t)c->head_dim);
    s->pos = malloc(sizeof(int32_t) * B);
    s->rl = malloc(sizeof(float) * B * ne);
    s->ids = malloc(sizeof(int32_t) * B * nu);
    s->wts = malloc(sizeof(float) * B * nu);
    s->rows = malloc(sizeof(int32_t) * B * nu);
    s->rw = malloc(sizeof(float) * B * nu);
    s->xg = malloc(sizeof(float) * B * E);
    s->g = malloc(sizeof(float) * B * nu * ff);
    s->u = malloc(sizeof(float) * B * nu * ff);
    s->dg = malloc(sizeof(float) * B * nu * E);
    s->segs = malloc(sizeof(seg_t) * B);
    if (!s->segs || !s->x || !s->xn || !s->q || !s->k || !s->v || !s->att || !s->o || !s->rope || !s->pos ||
        !s->rl || !s->ids || !s->wts || !s->rows || !s->rw || !s->xg || !s->g || !s->u || !s->dg)
        return bl_err_set(err, BL_ENOMEM, "out of memory for run state (n_batch %zu)", B);
    return 0;
}

static void free_state(run_state_t *s)
{
    free(s->x); free(s->xn); free(s->q); free(s->k); free(s->v); free(s->att); free(s->o);
    free(s->rope); free(s->pos); free(s->rl); free(s->ids); free(s->wts); free(s->rows);
    free(s->rw); free(s->xg); free(s->g); free(s->u); free(s->dg); free(s->segs);
}

int wk_model_load(wk_model_t **out, const char *path, const wk_model_opts_t *opts, bl_err_t *err)
{
    *out = NULL;
    wk_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return bl_err_set(err, BL_ENOMEM, "out of memory for a model");
    int rc;
    wk_model_opts_default(&m->opts);
    if (opts)
        m->opts = *opts;
    snprintf(m->path, sizeof m->path, "%s", path);
    if (m->opts.n_batch < 1 || m->opts.n_batch > 65536) {
        rc = bl_err_set(err, BL_ERANGE, "n_batch %lld is outside 1..65536", (long long)m->opts.n_batch);
        goto fail;
    }
    if ((rc = bl_gguf_open(&m->g, path, err)) < 0 || (rc = read_config(m, err)) < 0)
        goto fail;
    m->lb = m->opts.layer_begin;
    m->le = m->opts.layer_end;
    if (m->lb == 0 && m->le == 0)
        m->le = m->cfg.n_layer;
    if (m->lb < 0 || m->lb >= m->le || m->le > m->cfg.n_layer) {
        rc = bl_err_set(err, BL_ERANGE, "%s: stage layers %lld..%lld are not a range inside 0..%lld",
                        m->path, (long long)m->lb, (long long)m->le, (long long)m->cfg.n_layer);
        goto fail;
    }
    if (m->opts.experts < WK_EXPERTS_LOCAL || m->opts.experts > WK_EXPERTS_ONLY) {
        rc = bl_err_set(err, BL_EINVAL, "experts mode %d is not local, remote or only", m->opts.experts);
        goto fail;
    }
    if (m->opts.device < WK_DEVICE_CPU) {
        rc = bl_err_set(err, BL_EINVAL, "device %d is not a CUDA ordinal or WK_DEVICE_CPU", m->opts.device);
        goto fail;
    }
    if (m->opts.device >= 0 && m->opts.experts != WK_EXPERTS_LOCAL) {
        rc = bl_err_set(err, BL_ENOTSUP, "%s: on CUDA device %d every expert runs on the card; "
                        "remote or experts-only modes are not supported there", m->path, m->opts.device);
        goto fail;
    }
    if (m->opts.device < 0) /* on a device the weights go to the card instead */
        weights_arena(m);
    if ((rc = map_weights(m, err)) < 0)
        goto fail;
    if (m->opts.mlock)
        lock_weights(m);
    if (m->opts.n_ctx_max <= 0)
        m->opts.n_ctx_max = m->cfg.n_ctx_train;
    if (m->opts.n_ctx_max > MAX_CTX) {
        rc = bl_err_set(err, BL_ERANGE, "n_ctx_max %lld exceeds %d", (long long)m->opts.n_ctx_max, MAX_CTX);
        goto fail;
    }
    if ((rc = alloc_state(m, err)) < 0)
        goto fail;
    const wk_config_t *c = &m->cfg;
    int64_t cols = c->n_embd;
    cols = c->n_head * c->head_dim > cols ? c->n_head * c->head_dim : cols;
    cols = c->n_ff > cols ? c->n_ff : cols;
    cols = c->n_ff_exp > cols ? c->n_ff_exp : cols;
    const kcpu_limits_t lim = {.max_cols = cols, .max_batch = m->opts.n_batch,
                               .max_ctx = m->opts.n_ctx_max, .head_dim = c->head_dim};
    const int mode = m->opts.precise ? KCPU_PRECISE : m->opts.act_terms == 1 ? KCPU_FAST8 : KCPU_FAST16;
    if (m->opts.act_terms != 1 && m->opts.act_terms != 2) {
        rc = bl_err_set(err, BL_EINVAL, "act_terms %d is not 1 or 2", m->opts.act_terms);
        goto fail;
    }
    if (m->opts.n_threads_batch < 0 || m->opts.n_threads_batch > 256) {
        rc = bl_err_set(err, BL_EINVAL, "n_threads_batch %d is outside 0..256", m->opts.n_threads_batch);
        goto fail;
    }
    /* one pool as large as the larger count; each step runs on the count it needs */
    const int nt_max = m->opts.n_threads_batch > m->opts.n_threads ? m->opts.n_threads_batch : m->opts.n_threads;
    if ((rc = kcpu_ctx_create(&m->kc, nt_max, mode, &lim, err)) < 0)
        goto fail;
    if (m->opts.device >= 0 && (rc = wk__cuda_load(m, err)) < 0)
        goto fail;
    *out = m;
    return 0;
fail:
    wk_model_free(m);
    return rc;
}

void wk_model_free(wk_model_t *m)
{
    if (!m)
        return;
    wk__cuda_free(m);
    kcpu_ctx_destroy(m->kc);
    free_state(&m->s);
    free(m->w.layers);
    if (m->arena)
        munmap(m->arena, m->arena_len);
    bl_gguf_close(m->g);
    free(m);
}

const wk_config_t *wk_model_config(const wk_model_t *m) { return &m->cfg; }
const bl_gguf_t *wk_model_gguf(const wk_model_t *m) { return m->g; }
const char *wk_model_kernels(const wk_model_t *m) { return m->cu ? wk__cuda_name(m) : kcpu_variant_name(); }

// --- KV cache ----------------------------------------------------------------------------------

int wk_kv_create(wk_kv_t **out, const wk_model_t *m, int64_t n_ctx, uint32_t type, bl_err_t *err)
{
    *out = NULL;
    const wk_config_t *c = &m->cfg;
    if (n_ctx < 1 || n_ctx > m->opts.n_ctx_max)
        return bl_err_set(err, BL_ERANGE, "KV cache of %lld positions is outside 1..%lld",
                          (long long)n_ctx, (long long)m->opts.n_ctx_max);
    if (type != WK_KV_F32 && type != WK_KV_F16 && type != WK_KV_Q8_0)
        return bl_err_set(err, BL_EINVAL, "KV cache type %u is not f32, f16 or q8_0", type);
    if (m->cu && type != WK_KV_F16)
        return bl_err_set(err, BL_ENOTSUP, "a KV cache of type %s on the card: only f16 is supported there",
                          type == WK_KV_F32 ? "f32" : "q8_0");
    if (type == WK_KV_Q8_0 && c->head_dim % BL_QK != 0)
        return bl_err_set(err, BL_EINVAL, "a q8_0 KV cache needs head_dim %lld to be a multiple of %d",
                          (long long)c->head_dim, BL_QK);
    wk_kv_t *kv = calloc(1, sizeof *kv);
    if (!kv)
        return bl_err_set(err, BL_ENOMEM, "out of memory for a KV cache");
    int rc = bl_row_bytes(type, c->n_head_kv * c->head_dim, &kv->row_bytes, err);
    if (rc < 0) {
        free(kv);
        return rc;
    }
    kv->model = m;
    kv->n_layer = m->le - m->lb;
    kv->n_ctx = n_ctx;
    kv->type = type;
    /* (n_layer <= 4096) * 2 * (n_ctx <= 2^24) * row_bytes may pass 2^63 only for
     * absurd requests; checked rather than assumed. */
    const double want = (double)kv->n_layer * 2.0 * (double)n_ctx * (double)kv->row_bytes;
    if (want > (double)(SIZE_MAX / 2)) {
        free(kv);
        return bl_err_set(err, BL_ERANGE, "KV cache of %lld positions is too large", (long long)n_ctx);
    }
    if (m->cu) {
        if ((rc = wk__cuda_kv_alloc(kv, err)) < 0) {
            free(kv);
            return rc;
        }
        *out = kv;
        return 0;
    }
    kv->buf = malloc((size_t)kv->n_layer * 2 * (size_t)n_ctx * kv->row_bytes);
    if (!kv->buf) {
        free(kv);
        return bl_err_set(err, BL_ENOMEM, "out of memory for a KV cache of %.0f bytes", want);
    }
    *out = kv;
    return 0;
}

void wk_kv_free(wk_kv_t *kv)
{
    if (!kv)
        return;
    if (kv->on_device)
        wk__cuda_kv_free(kv);
    else
        free(kv->buf);
    free(kv);
}

int64_t wk_kv_n_past(const wk_kv_t *kv) { return kv->n_past; }

/* The cache of model layer l (inside the stage the cache was made for). */
static kcpu_kv_view_t kv_layer(const wk_kv_t *kv, int64_t l)
{
    l -= kv->model->lb;
    const size_t plane = (size_t)kv->n_ctx * kv->row_bytes;
    kcpu_kv_view_t v = {.k = kv->buf + (size_t)(2 * l) * plane,
                        .v = kv->buf + (size_t)(2 * l + 1) * plane,
                        .type = kv->type, .row_bytes = kv->row_bytes};
    return v;
}

// --- forward pass -------------------------------------------------------------------------------

static void add_rows(float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* Routed experts for n rows of xn (n, n_embd), each with K expert ids and weights,
 * into out (n, n_embd). Rows are grouped by expert so each expert's weights are
 * read once per batch; each row's sum runs in expert-id order. All experts'
 * products go to the threads together, in two passes (gate and up of every expert,
 * then every down) rather than two per product: the experts read their rows of xn
 * in place, quantized once for all of them. A model with more experts than a job
 * list holds runs expert by expert; both compute the same products on the same
 * data, so they give the same bits, and so does the hosttier (wk_model_experts). */
static void experts_ffn(wk_model_t *m, const layer_t *L, const float *xn, int64_t n,
                        const int32_t *ids, const float *wts, float *out)
{
    const wk_config_t *c = &m->cfg;
    run_state_t *s = &m->s;
    const int64_t E = c->n_embd, F = c->n_ff_exp, K = c->n_expert_used;
    memset(out, 0, sizeof(float) * (size_t)(n * E));
    if (c->n_expert <= MOE_GROUP_MAX) {
        moe_jobs_t *sj = &s->jobs;
        int64_t total = 0;
        int ne = 0;
        for (int64_t e = 0; e < c->n_expert; e++) {
            int64_t k = 0;
            for (int64_t b = 0; b < n; b++)
                for (int64_t j = 0; j < K; j++)
                    if (ids[b * K + j] == e) {
                        s->rows[total + k] = (int32_t)b;
                        s->rw[total + k] = wts[b * K + j];
                        k++;
                    }
            if (k == 0)
                continue;
            sj->gate[ne] = kcpu_mat_rows(&L->gate_exps, e * F, F);
            sj->up[ne] = kcpu_mat_rows(&L->up_exps, e * F, F);
            sj->down[ne] = kcpu_mat_rows(&L->down_exps, e * E, E);
            sj->job[2 * ne] = (kcpu_mm_job_t){.w = &sj->gate[ne], .x = xn, .nx = n,
                                              .rows = s->rows + total, .n = k, .y = s->g + total * F};
            sj->job[2 * ne + 1] = (kcpu_mm_job_t){.w = &sj->up[ne], .x = xn, .nx = n,
                                                  .rows = s->rows + total, .n = k, .y = s->u + total * F};
            sj->at[ne] = total;
            sj->cnt[ne] = k;
            total += k;
            ne++;
        }
        kcpu_matmul_many(m->kc, sj->job, 2 * ne);
        kcpu_swiglu(s->g, s->g, s->u, total * F);
        for (int i = 0; i < ne; i++)
            sj->job[i] = (kcpu_mm_job_t){.w = &sj->down[i], .x = s->g + sj->at[i] * F, .n = sj->cnt[i],
                                         .y = s->dg + sj->at[i] * E};
        kcpu_matmul_many(m->kc, sj->job, ne);
        for (int64_t i = 0; i < total; i++) {
            float *o = out + (int64_t)s->rows[i] * E;
            const float *d = s->dg + i * E;
            for (int64_t j = 0; j < E; j++)
                o[j] += s->rw[i] * d[j];
        }
        return;
    }
    for (int64_t e = 0; e < c->n_expert; e++) {
        int64_t cnt = 0;
        for (int64_t b = 0; b < n; b++)
            for (int64_t j = 0; j < K; j++)
                if (ids[b * K + j] == e) {
                    s->rows[cnt] = (int32_t)b;
                    s->rw[cnt] = wts[b * K + j];
                    memcpy(s->xg + cnt * E, xn + b * E, sizeof(float) * (size_t)E);
                    cnt++;
                }
        if (cnt == 0)
            continue;
        const kcpu_mat_t gate = kcpu_mat_rows(&L->gate_exps, e * F, F);
        const kcpu_mat_t up = kcpu_mat_rows(&L->up_exps, e * F, F);
        const kcpu_mat_t down = kcpu_mat_rows(&L->down_exps, e * E, E);
        kcpu_matmul(m->kc, &gate, s->xg, cnt, s->g);
        kcpu_matmul(m->kc, &up, s->xg, cnt, s->u);
        kcpu_swiglu(s->g, s->g, s->u, cnt * F);
        kcpu_matmul(m->kc, &down, s->g, cnt, s->dg);
        for (int64_t i = 0; i < cnt; i++) {
            float *o = out + (int64_t)s->rows[i] * E;
            const float *d = s->dg + i * E;
            for (int64_t j = 0; j < E; j++)
                o[j] += s->rw[i] * d[j];
        }
    }
}

/* The MoE block for n rows of s->xn into s->o: the gate and top-k here, the experts
 * here or through the remote callback. */
static int moe_ffn(wk_model_t *m, int64_t l, int64_t n, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const layer_t *L = &m->w.layers[l];
    run_state_t *s = &m->s;
    kcpu_matmul(m->kc, &L->gate_inp, s->xn, n, s->rl);
    kcpu_moe_route(s->rl, n, c->n_expert, c->n_expert_used, 1, s->ids, s->wts);
    if (m->opts.experts == WK_EXPERTS_REMOTE)
        return m->efn(m->ectx, l, s->xn, n, s->ids, s->wts, s->o, err);
    experts_ffn(m, L, s->xn, n, s->ids, s->wts, s->o);
    return 0;
}

static void dense_ffn(wk_model_t *m, const layer_t *L, int64_t n)
{
    run_state_t *s = &m->s;
    kcpu_matmul(m->kc, &L->ffn_gate, s->xn, n, s->g);
    kcpu_matmul(m->kc, &L->ffn_up, s->xn, n, s->u);
    kcpu_swiglu(s->g, s->g, s->u, n * m->cfg.n_ff);
    kcpu_matmul(m->kc, &L->ffn_down, s->g, n, s->o);
}

/* One step of the stage's layers over the rows of nseg sequences (n_rows <= n_batch
 * in all). The first stage embeds the tokens, a later one starts from x_in; the last
 * stage writes the logits of each sequence's last n_out rows in sequence order, an
 * earlier one the hidden rows to x_out. The weights see all rows at once; attention
 * and the KV cache go sequence by sequence. Fails only when the remote experts do. */
static int forward(wk_model_t *m, const seg_t *seg, int64_t nseg, int64_t n, const float *x_in,
                   float *x_out, float *logits, bl_err_t *err)
{
    if (m->cu)
        return wk__cuda_forward(m, seg, nseg, n, x_in, x_out, logits, err);
    int prompt = 0;
    for (int64_t j = 0; j < nseg; j++)
        prompt |= seg[j].n > 1;
    (void)kcpu_ctx_set_threads(m->kc, prompt && m->opts.n_threads_batch > 0 ? m->opts.n_threads_batch
                                                                             : m->opts.n_threads);
    const wk_config_t *c = &m->cfg;
    const weights_t *w = &m->w;
    run_state_t *s = &m->s;
    const int64_t E = c->n_embd, hd = c->head_dim;
    const int64_t nq = c->n_head * hd, nkv = c->n_head_kv * hd;
    const float scale = (float)(1.0 / sqrt((double)hd));

    /* Token embeddings (first stage): dequantize each row from the table. */
    for (int64_t j = 0; j < nseg; j++)
        for (int64_t i = 0; i < seg[j].n; i++) {
            const int64_t b = seg[j].row0 + i;
            if (m->lb == 0) {
                const uint8_t *row = (const uint8_t *)w->tok_embd.data +
                                     (size_t)seg[j].tokens[i] * w->tok_embd.row_bytes;
                /* The type was checked at load to have a dequantizer: cannot fail. */
                if (bl_dequantize_row_ref(w->tok_embd.type, row, s->x + b * E, E) != 0)
                    memset(s->x + b * E, 0, sizeof(float) * (size_t)E);
            }
            s->pos[b] = (int32_t)(seg[j].pos + i);
        }
    if (m->lb > 0 && x_in) /* wk_model_stage checked that a later stage has x_in */
        memcpy(s->x, x_in, sizeof(float) * (size_t)(n * E));
    kcpu_rope_table(s->rope, s->pos, n, hd, c->rope_base);

    for (int64_t l = m->lb; l < m->le; l++) {
        const layer_t *L = &w->layers[l];

        /* Attention: norm, projections, per-head q/k norm, RoPE, cache, attend. */
        kcpu_rms_norm(s->xn, s->x, L->attn_norm, n, E, E, c->eps);
        const kcpu_mm_job_t qkv[3] = {{.w = &L->wq, .x = s->xn, .n = n, .y = s->q},
                                      {.w = &L->wk, .x = s->xn, .n = n, .y = s->k},
                                      {.w = &L->wv, .x = s->xn, .n = n, .y = s->v}};
        kcpu_matmul_many(m->kc, qkv, 3);
        kcpu_rms_norm(s->q, s->q, L->q_norm, n * c->n_head, hd, hd, c->eps);
        kcpu_rms_norm(s->k, s->k, L->k_norm, n * c->n_head_kv, hd, hd, c->eps);
        kcpu_rope_neox(s->q, s->rope, n, c->n_head, hd);
        kcpu_rope_neox(s->k, s->rope, n, c->n_head_kv, hd);
        for (int64_t j = 0; j < nseg; j++) {
            const kcpu_kv_view_t kvl = kv_layer(seg[j].kv, l);
            const int64_t r0 = seg[j].row0;
            kcpu_kv_store(&kvl, 0, s->k + r0 * nkv, seg[j].pos, seg[j].n, nkv);
            kcpu_kv_store(&kvl, 1, s->v + r0 * nkv, seg[j].pos, seg[j].n, nkv);
            kcpu_attention(m->kc, &kvl, s->q + r0 * nq, s->att + r0 * nq, seg[j].n, seg[j].pos,
                           c->n_head, c->n_head_kv, hd, scale);
        }
        kcpu_matmul(m->kc, &L->wo, s->att, n, s->o);
        add_rows(s->x, s->o, n * E);

        /* FFN: norm, experts or dense SwiGLU, residual. */
        kcpu_rms_norm(s->xn, s->x, L->ffn_norm, n, E, E, c->eps);
        if (c->moe) {
            int rc = moe_ffn(m, l, n, err);
            if (rc < 0)
                return rc;
        } else {
            dense_ffn(m, L, n);
        }
        add_rows(s->x, s->o, n * E);
    }
    if (m->le < c->n_layer) {
        if (x_out) /* checked by wk_model_stage */
            memcpy(x_out, s->x, sizeof(float) * (size_t)(n * E));
        return 0;
    }

    /* Head, only for the rows whose logits were asked for, gathered in order. */
    int64_t n_out = 0;
    for (int64_t j = 0; j < nseg; j++) {
        const int64_t r0 = seg[j].row0 + seg[j].n - seg[j].n_out;
        kcpu_rms_norm(s->xg + n_out * E, s->x + r0 * E, w->output_norm, seg[j].n_out, E, E, c->eps);
        n_out += seg[j].n_out;
    }
    if (n_out > 0)
        kcpu_matmul(m->kc, &w->output, s->xg, n_out, logits);
    return 0;
}

/* The checks one sequence's part of a step must pass; i names it in messages. A
 * stage after the first reads no tokens. */
static int check_seq(const wk_model_t *m, const wk_kv_t *kv, const int32_t *tokens, int64_t n,
                     int64_t pos, int64_t n_out, int64_t i, bl_err_t *err)
{
    if (!kv || (!tokens && m->lb == 0) || n < 1 || n_out < 0 || n_out > n)
        return bl_err_set(err, BL_EINVAL, "sequence %lld: %lld rows asking for %lld logit rows",
                          (long long)i, (long long)n, (long long)n_out);
    if (kv->model != m)
        return bl_err_set(err, BL_EINVAL, "sequence %lld: the KV cache was made for another model",
                          (long long)i);
    if (pos < 0 || pos > kv->n_past)
        return bl_err_set(err, BL_EINVAL, "sequence %lld: eval at position %lld, but the cache holds %lld",
                          (long long)i, (long long)pos, (long long)kv->n_past);
    if (n > kv->n_ctx - pos)
        return bl_err_set(err, BL_ERANGE, "sequence %lld: positions %lld..%lld do not fit a cache of %lld",
                          (long long)i, (long long)pos, (long long)(pos + n - 1), (long long)kv->n_ctx);
    if (m->lb == 0)
        for (int64_t t = 0; t < n; t++)
            if (tokens[t] < 0 || tokens[t] >= m->cfg.n_vocab)
                return bl_err_set(err, BL_EINVAL, "sequence %lld: token %lld is %d, outside 0..%lld",
                                  (long long)i, (long long)t, tokens[t], (long long)(m->cfg.n_vocab - 1));
    return 0;
}

/* Whether m can run steps, and a whole model's when whole is set. */
static int check_runnable(const wk_model_t *m, int whole, bl_err_t *err)
{
    if (m->opts.experts == WK_EXPERTS_ONLY)
        return bl_err_set(err, BL_EINVAL, "%s: loaded for its experts only; it runs no steps", m->path);
    if (m->opts.experts == WK_EXPERTS_REMOTE && m->cfg.moe && !m->efn)
        return bl_err_set(err, BL_EINVAL, "%s: remote experts but no experts callback set", m->path);
    if (whole && (m->lb != 0 || m->le != m->cfg.n_layer))
        return bl_err_set(err, BL_EINVAL, "%s: loaded as the stage of layers %lld..%lld, not the whole model",
                          m->path, (long long)m->lb, (long long)m->le);
    return 0;
}

int wk_model_eval(wk_model_t *m, wk_kv_t *kv, const int32_t *tokens, int64_t n, int64_t pos,
                  int64_t n_out, float *logits, bl_err_t *err)
{
    int rc = check_runnable(m, 1, err);
    if (rc < 0)
        return rc;
    rc = check_seq(m, kv, tokens, n, pos, n_out, 0, err);
    if (rc < 0)
        return rc;
    if (n_out > 0 && !logits)
        return bl_err_set(err, BL_EINVAL, "logits asked for but no buffer given");
    /* Chunks of n_batch rows; the logit rows (the last n_out of all n) may span the
     * last chunks. */
    const int64_t first_out = n - n_out;
    kv->n_past = pos;
    for (int64_t c0 = 0; c0 < n; c0 += m->opts.n_batch) {
        const int64_t cn = n - c0 < m->opts.n_batch ? n - c0 : m->opts.n_batch;
        const int64_t out0 = first_out > c0 ? (first_out - c0 < cn ? first_out - c0 : cn) : 0;
        float *lg = out0 < cn ? logits + (size_t)(c0 + out0 - first_out) * (size_t)m->cfg.n_vocab : NULL;
        const seg_t sg = {.kv = kv, .tokens = tokens + c0, .row0 = 0, .n = cn, .pos = pos + c0,
                          .n_out = cn - out0};
        rc = forward(m, &sg, 1, cn, NULL, NULL, lg, err);
        if (rc < 0)
            return rc;
        kv->n_past = pos + c0 + cn;
    }
    return 0;
}

int wk_model_stage(wk_model_t *m, const wk_seq_t *seqs, int64_t n_seqs, const float *x_in,
                   float *x_out, float *logits, bl_err_t *err)
{
    int rc = check_runnable(m, 0, err);
    if (rc < 0)
        return rc;
    if (n_seqs < 1 || n_seqs > m->opts.n_batch)
        return bl_err_set(err, BL_ERANGE, "%lld sequences in one step, outside 1..%lld",
                          (long long)n_seqs, (long long)m->opts.n_batch);
    int64_t rows = 0, outs = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        const wk_seq_t *q = &seqs[i];
        rc = check_seq(m, q->kv, q->tokens, q->n, q->pos, q->n_out, i, err);
        if (rc < 0)
            return rc;
        for (int64_t j = 0; j < i; j++)
            if (seqs[j].kv == q->kv)
                return bl_err_set(err, BL_EINVAL, "sequences %lld and %lld share a KV cache",
                                  (long long)j, (long long)i);
        if (q->n > m->opts.n_batch - rows)
            return bl_err_set(err, BL_ERANGE, "the step's rows exceed n_batch %lld",
                              (long long)m->opts.n_batch);
        rows += q->n;
        outs += q->n_out;
    }
    if (m->lb > 0 && !x_in)
        return bl_err_set(err, BL_EINVAL, "a stage from layer %lld needs the hidden state in", (long long)m->lb);
    if (m->le < m->cfg.n_layer && !x_out)
        return bl_err_set(err, BL_EINVAL, "a stage to layer %lld needs a buffer for the hidden state out",
                          (long long)m->le);
    if (m->le == m->cfg.n_layer && outs > 0 && !logits)
        return bl_err_set(err, BL_EINVAL, "logits asked for but no buffer given");
    /* The segments live in the run state's scratch: no allocation in the step. */
    seg_t *sg = m->s.segs;
    rows = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        sg[i] = (seg_t){.kv = seqs[i].kv, .tokens = seqs[i].tokens, .row0 = rows, .n = seqs[i].n,
                        .pos = seqs[i].pos, .n_out = seqs[i].n_out};
        rows += seqs[i].n;
    }
    rc = forward(m, sg, n_seqs, rows, x_in, x_out, logits, err);
    if (rc < 0)
        return rc;
    for (int64_t i = 0; i < n_seqs; i++)
        seqs[i].kv->n_past = seqs[i].pos + seqs[i].n;
    return 0;
}

int wk_model_eval_multi(wk_model_t *m, const wk_seq_t *seqs, int64_t n_seqs, float *logits,
                        bl_err_t *err)
{
    int rc = check_runnable(m, 1, err);
    if (rc < 0)
        return rc;
    return wk_model_stage(m, seqs, n_seqs, NULL, NULL, logits, err);
}

void wk_model_set_experts(wk_model_t *m, wk_experts_fn fn, void *ctx)
{
    m->efn = fn;
    m->ectx = ctx;
}

int wk_model_experts(wk_model_t *m, int64_t layer, const float *xn, int64_t n, const int32_t *ids,
                     const float *wts, float *out, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    if (!c->moe)
        return bl_err_set(err, BL_EINVAL, "%s: %s has no routed experts", m->path, c->arch);
    if (m->opts.experts == WK_EXPERTS_REMOTE)
        return bl_err_set(err, BL_EINVAL, "%s: this process sends its experts away; it cannot compute them",
                          m->path);
    if (layer < 0 || layer >= c->n_layer)
        return bl_err_set(err, BL_EINVAL, "experts of layer %lld, outside 0..%lld", (long long)layer,
                          (long long)(c->n_layer - 1));
    if (m->opts.experts == WK_EXPERTS_LOCAL && (layer < m->lb || layer >= m->le))
        return bl_err_set(err, BL_EINVAL, "experts of layer %lld, outside this stage's %lld..%lld",
                          (long long)layer, (long long)m->lb, (long long)(m->le - 1));
    if (n < 1 || n > m->opts.n_batch)
        return bl_err_set(err, BL_ERANGE, "%lld expert rows, outside 1..%lld", (long long)n,
                          (long long)m->opts.n_batch);
    if (!xn || !ids || !wts || !out)
        return bl_err_set(err, BL_EINVAL, "experts: a NULL buffer");
    for (int64_t i = 0; i < n * c->n_expert_used; i++)
        if (ids[i] < 0 || ids[i] >= c->n_expert)
            return bl_err_set(err, BL_EINVAL, "row %lld: expert id %d, outside 0..%lld",
                              (long long)(i / c->n_expert_used), ids[i], (long long)(c->n_expert - 1));
    experts_ffn(m, &m->w.layers[layer], xn, n, ids, wts, out);
    return 0;
}
