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

#include "arch.h"
#include "gguf.h"
#include "model.h"

/* The architecture's facts (common/arch.c) as the forward pass reads them. */
int wk__qwen3_config(wk_model_t *m, bl_err_t *err)
{
    bl_arch_t a;
    int rc = bl_arch_read(&a, m->g, m->path, err);
    if (rc < 0)
        return rc;
    wk_config_t *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", a.name);
    c->moe = a.moe;
    c->n_layer = a.n_layer;
    c->n_embd = a.n_embd;
    c->n_head = a.n_head;
    c->n_head_kv = a.n_head_kv;
    c->head_dim = a.head_dim;
    c->n_ff = a.n_ff;
    c->n_expert = a.n_expert;
    c->n_expert_used = a.n_expert_used;
    c->n_ff_exp = a.n_ff_exp;
    c->n_vocab = a.n_vocab;
    c->n_ctx_train = a.n_ctx_train;
    c->rope_base = a.rope_base;
    c->eps = a.eps;
    c->tied_output = a.tied_output;
    return 0;
}

int wk__qwen3_map(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    const int64_t E = c->n_embd, nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
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
        const int use_exps = wk__layer_local_experts(m, l);
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
                       (wk__layer_local_experts(m, l) &&
                        ((rc = op->add(b, &e->gate_exps, 0, err)) < 0 || (rc = op->add(b, &e->up_exps, 0, err)) < 0 ||
                         (rc = op->add(b, &e->down_exps, 0, err)) < 0))))
            return rc;
        if (c->moe && wk__layer_remote(m, l) && (rc = op->add_host(b, l, e, err)) < 0)
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
        rc = c->moe ? op->moe(b, l, &L->moe, wk__layer_remote(m, l) ? &m->remote : NULL, s->xn, n, s->x, err)
                    : op->ffn(b, &L->ffn_gate, &L->ffn_up, &L->ffn_down, s->xn, n, s->x, err);
    }
    if (rc == 0 && m->le == c->n_layer)
        rc = op->head(b, w->output_norm.p, c->eps, &w->output, s->x, err);
    return op->end(b, st, rc, s->x, err);
}
