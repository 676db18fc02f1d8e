/* The Qwen3 family, written once over the backend ops: qwen3moe (routed experts)
 * and qwen3 (dense FFN), which differ only in the FFN block. Its metadata, its
 * tensors, and its forward pass, which reads as llama.cpp's for these
 * architectures: RMSNorm, Q/K/V, per-head RMSNorm of q and k, NEOX RoPE, causal GQA
 * attention, residual; RMSNorm, FFN (softmax top-k router renormalised to 1, SwiGLU
 * experts), residual; final norm and head (token_embd when output.weight is
 * absent). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model.h"

int wk__qwen3_config(wk_model_t *m, bl_err_t *err)
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
    if ((rc = wk__get_dim(m, "block_count", 0, WK_MAX_LAYERS, &c->n_layer, err)) < 0 ||
        (rc = wk__get_dim(m, "embedding_length", 0, WK_MAX_DIM, &c->n_embd, err)) < 0 ||
        (rc = wk__get_dim(m, "attention.head_count", 0, WK_MAX_DIM, &c->n_head, err)) < 0 ||
        (rc = wk__get_dim(m, "attention.head_count_kv", c->n_head, WK_MAX_DIM, &c->n_head_kv, err)) < 0 ||
        (rc = wk__get_dim(m, "attention.key_length", c->n_embd / c->n_head, WK_MAX_DIM, &c->head_dim, err)) < 0 ||
        (rc = wk__get_dim(m, "context_length", 0, WK_MAX_CTX, &c->n_ctx_train, err)) < 0)
        return rc;
    int64_t vlen = 0;
    if ((rc = wk__get_dim(m, "attention.value_length", c->head_dim, WK_MAX_DIM, &vlen, err)) < 0)
        return rc;
    const char *ar = c->arch;
    if (vlen != c->head_dim)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s.attention.value_length %lld differs from key_length %lld",
                          m->path, ar, (long long)vlen, (long long)c->head_dim);
    if (c->head_dim % 2 != 0 || c->n_head % c->n_head_kv != 0 || c->n_head * c->head_dim > WK_MAX_DIM)
        return bl_err_set(err, BL_EINVAL,
                          "%s: head_dim %lld must be even, head_count %lld a multiple of head_count_kv %lld, and their product at most %d",
                          m->path, (long long)c->head_dim, (long long)c->n_head,
                          (long long)c->n_head_kv, WK_MAX_DIM);
    if ((rc = wk__get_float(m, "rope.freq_base", 10000.0f, 1.0f, 1e12f, &c->rope_base, err)) < 0 ||
        (rc = wk__get_float(m, "attention.layer_norm_rms_epsilon", 1e-6f, 0.0f, 1.0f, &c->eps, err)) < 0)
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
        if ((rc = wk__get_dim(m, "expert_count", 0, WK_MAX_EXPERTS, &c->n_expert, err)) < 0 ||
            (rc = wk__get_dim(m, "expert_used_count", 0, WK_MAX_EXPERTS, &c->n_expert_used, err)) < 0 ||
            (rc = wk__get_dim(m, "expert_feed_forward_length", 0, WK_MAX_DIM, &c->n_ff_exp, err)) < 0)
            return rc;
        if (c->n_expert_used > c->n_expert)
            return bl_err_set(err, BL_EINVAL, "%s: %s.expert_used_count %lld exceeds expert_count %lld",
                              m->path, ar, (long long)c->n_expert_used, (long long)c->n_expert);
    } else {
        if ((rc = wk__get_dim(m, "feed_forward_length", 0, WK_MAX_DIM, &c->n_ff, err)) < 0)
            return rc;
    }
    return 0;
}

int wk__qwen3_map(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    const int64_t E = c->n_embd, nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    const bl_gguf_tensor_t *te = bl_gguf_find_tensor(m->g, "token_embd.weight");
    if (!te)
        return bl_err_set(err, BL_ENOENT, "%s: tensor 'token_embd.weight' is missing", m->path);
    m->cfg.n_vocab = te->ne[1];
    if (c->n_vocab < 1 || c->n_vocab > WK_MAX_VOCAB)
        return bl_err_set(err, BL_ERANGE, "%s: token_embd.weight has %lld rows, outside 1..%d",
                          m->path, (long long)c->n_vocab, WK_MAX_VOCAB);
    /* What this process computes: its stage's layers (the first stage embeds, the
     * last one has the head; a tied head reads token_embd), or only the experts. */
    const int only = m->opts.experts == WK_EXPERTS_ONLY;
    const int last = m->le == c->n_layer;
    const int use_head = !only && last;
    const int use_embd = !only && (m->lb == 0 || (last && !bl_gguf_find_tensor(m->g, "output.weight")));
    int rc;
    if ((rc = wk__find_mat(m, "token_embd.weight", E, c->n_vocab, 1, use_embd, &w->tok_embd, err)) < 0 ||
        (rc = wk__find_vec(m, "output_norm.weight", E, &w->output_norm, err)) < 0)
        return rc;
    if (bl_gguf_find_tensor(m->g, "output.weight")) {
        if ((rc = wk__find_mat(m, "output.weight", E, c->n_vocab, 1, use_head, &w->output, err)) < 0)
            return rc;
    } else {
        m->cfg.tied_output = 1;
        w->output = w->tok_embd;
    }
    /* The head runs for one row per sequence, even in a prompt: its activations stay
     * two q8 terms, whose packed q6_K kernel streams faster than the q16_K one. */
    w->output.h.act_q8 = 1;
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
        if ((rc = wk__find_vec(m, NAME("attn_norm.weight"), E, &L->attn_norm, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_q.weight"), E, nq, 1, use_attn, &L->wq, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_k.weight"), E, nkv, 1, use_attn, &L->wk, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_v.weight"), E, nkv, 1, use_attn, &L->wv, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_output.weight"), nq, E, 1, use_attn, &L->wo, err)) < 0 ||
            (rc = wk__find_vec(m, NAME("attn_q_norm.weight"), c->head_dim, &L->q_norm, err)) < 0 ||
            (rc = wk__find_vec(m, NAME("attn_k_norm.weight"), c->head_dim, &L->k_norm, err)) < 0 ||
            (rc = wk__find_vec(m, NAME("ffn_norm.weight"), E, &L->ffn_norm, err)) < 0)
            return rc;
        if (c->moe) {
            wk_moe_t *e = &L->moe;
            e->n_expert = c->n_expert;
            e->n_used = c->n_expert_used;
            e->n_ff = c->n_ff_exp;
            e->norm = 1;
            if ((rc = wk__find_mat(m, NAME("ffn_gate_inp.weight"), E, c->n_expert, 1, use_attn, &e->gate_inp, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_gate_exps.weight"), E, c->n_ff_exp, c->n_expert, use_exps, &e->gate_exps, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_up_exps.weight"), E, c->n_ff_exp, c->n_expert, use_exps, &e->up_exps, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_down_exps.weight"), c->n_ff_exp, E, c->n_expert, use_exps, &e->down_exps, err)) < 0)
                return rc;
        } else {
            if ((rc = wk__find_mat(m, NAME("ffn_gate.weight"), E, c->n_ff, 1, use_attn, &L->ffn_gate, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_up.weight"), E, c->n_ff, 1, use_attn, &L->ffn_up, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_down.weight"), c->n_ff, E, 1, use_attn, &L->ffn_down, err)) < 0)
                return rc;
        }
#undef NAME
    }
    return 0;
}

/* Registers what the stage computes with the backend, in file order, places it, and
 * makes the run state. */
int wk__qwen3_place(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int first = m->lb == 0, last = m->le == c->n_layer;
    /* A tied head on a stage that also embeds reads the same copy. */
    const int share_head = c->tied_output && first;
    int rc;
    if (first && (rc = op->add(b, &w->tok_embd, share_head ? WK_ADD_PIECES : WK_ADD_TABLE, err)) < 0)
        return rc;
    if (last && ((rc = op->add_vec(b, &w->output_norm, c->n_embd, err)) < 0 ||
                 (!share_head && (rc = op->add(b, &w->output, WK_ADD_PIECES, err)) < 0)))
        return rc;
    for (int64_t l = m->lb; l < m->le; l++) {
        layer_t *L = &w->layers[l];
        wk_tensor_t *const qkv[3] = {&L->wq, &L->wk, &L->wv};
        if ((rc = op->add_vec(b, &L->attn_norm, c->n_embd, err)) < 0 ||
            (rc = op->add_vec(b, &L->q_norm, c->head_dim, err)) < 0 ||
            (rc = op->add_vec(b, &L->k_norm, c->head_dim, err)) < 0 ||
            (rc = op->add_vec(b, &L->ffn_norm, c->n_embd, err)) < 0 ||
            (rc = op->add_stack(b, qkv, err)) < 0 || (rc = op->add(b, &L->wo, 0, err)) < 0)
            return rc;
        wk_moe_t *e = &L->moe;
        if (c->moe && ((rc = op->add(b, &e->gate_inp, 0, err)) < 0 ||
                       (m->opts.experts == WK_EXPERTS_LOCAL &&
                        ((rc = op->add(b, &e->gate_exps, 0, err)) < 0 || (rc = op->add(b, &e->up_exps, 0, err)) < 0 ||
                         (rc = op->add(b, &e->down_exps, 0, err)) < 0))))
            return rc;
        if (!c->moe && ((rc = op->add(b, &L->ffn_gate, 0, err)) < 0 || (rc = op->add(b, &L->ffn_up, 0, err)) < 0 ||
                        (rc = op->add(b, &L->ffn_down, 0, err)) < 0))
            return rc;
    }
    if ((rc = op->commit(b, err)) < 0)
        return rc;
    if (last && share_head)
        w->output.d = w->tok_embd.d;

    run_state_t *s = &m->s;
    const size_t B = (size_t)m->opts.n_batch, f = sizeof(float);
    const size_t E = (size_t)c->n_embd, nq = (size_t)(c->n_head * c->head_dim);
    const size_t nkv = (size_t)(c->n_head_kv * c->head_dim);
    s->x = op->alloc(b, f * B * E);
    s->xn = op->alloc(b, f * B * E);
    s->q = op->alloc(b, f * B * nq);
    s->k = op->alloc(b, f * B * nkv);
    s->v = op->alloc(b, f * B * nkv);
    s->att = op->alloc(b, f * B * nq);
    s->segs = malloc(sizeof(wk_seg_t) * B);
    if (!s->x || !s->xn || !s->q || !s->k || !s->v || !s->att || !s->segs)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the run state (n_batch %zu) on %s", B,
                          op->name(b));
    return 0;
}

/* One step of the stage's layers over the step's rows. The first stage embeds the
 * tokens, a later one starts from the rows the stage before sent; the last stage
 * computes the logits each sequence asked for, an earlier one sends the rows on.
 * The weights see all rows at once; attention and the KV cache go sequence by
 * sequence. */
int wk__qwen3_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const weights_t *w = &m->w;
    const run_state_t *s = &m->s;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t n = st->n, E = c->n_embd;
    const wk_attn_t at = {.n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                          .eps = c->eps, .rope_base = c->rope_base,
                          .scale = (float)(1.0 / sqrt((double)c->head_dim))};
    const wk_remote_t *remote = m->opts.experts == WK_EXPERTS_REMOTE ? &m->remote : NULL;

    int rc = op->begin(b, st, s->x, err);
    if (rc < 0)
        return rc;
    if (rc == WK_STEP_REPLAYED)
        return op->end(b, st, 0, s->x, err);
    if (m->lb == 0)
        rc = op->embed(b, &w->tok_embd, s->x, err);
    for (int64_t l = m->lb; l < m->le && rc == 0; l++) {
        const layer_t *L = &w->layers[l];
        wk_attn_t a = at;
        a.q_norm = L->q_norm.p;
        a.k_norm = L->k_norm.p;
        /* attention: norm, projections, per-head q/k norm and RoPE, cache, attend,
         * the output projection onto the residual */
        if ((rc = op->rms_norm(b, "attn_norm", s->xn, s->x, L->attn_norm.p, n, E, c->eps, err)) < 0 ||
            (rc = op->qkv(b, &L->wq, &L->wk, &L->wv, s->xn, n, s->q, s->k, s->v, err)) < 0 ||
            (rc = op->attention(b, l, &a, s->q, s->k, s->v, s->att, err)) < 0 ||
            (rc = op->matmul(b, "attn_output", &L->wo, s->att, n, s->x, 1, err)) < 0)
            break;
        /* FFN: norm, routed experts or the dense SwiGLU, onto the residual */
        if ((rc = op->rms_norm(b, "ffn_norm", s->xn, s->x, L->ffn_norm.p, n, E, c->eps, err)) < 0)
            break;
        rc = c->moe ? op->moe(b, l, &L->moe, remote, s->xn, n, s->x, err)
                    : op->ffn(b, &L->ffn_gate, &L->ffn_up, &L->ffn_down, s->xn, n, s->x, err);
    }
    if (rc == 0 && m->le == c->n_layer)
        rc = op->head(b, w->output_norm.p, c->eps, &w->output, s->x, err);
    return op->end(b, st, rc, s->x, err);
}
