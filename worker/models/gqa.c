/* The GQA transformers with SwiGLU FFNs, written once over the backend ops:
 * qwen3moe (routed experts), qwen3 (dense FFN), glm4moe (leading dense layers,
 * then routed and shared experts) and gpt-oss. Their metadata (common/arch.c), their tensors,
 * and a forward pass that reads as llama.cpp's for these architectures: RMSNorm,
 * Q/K/V (plus biases in glm4moe), per-head RMSNorm of q and k where the file has
 * them, NEOX RoPE over n_rot dims, causal GQA attention, residual; RMSNorm, FFN
 * (a dense SwiGLU, or the router's top-k experts: softmax renormalised to 1 in
 * qwen3moe, sigmoid with a selection bias, normed and scaled in glm4moe; plus the
 * shared experts), residual; final norm and head (token_embd when output.weight is
 * absent). glm4moe's first NextN layer runs as a block after the head when the stage
 * proposes tokens with it (model.c's wk__mtp_forward); the others are checked at load
 * and not run. gpt-oss's layers
 * add attention sinks, sliding windows on every other layer, biases on the output
 * projection, the router and the experts, and a clamped SwiGLU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "gguf.h"
#include "model.h"

int wk__gqa_map(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd, nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    int rc = wk__map_io(m, err);
    if (rc < 0)
        return rc;
    for (int64_t l = 0; l < wk__layers_held(m); l++) {
        layer_t *L = &m->w.layers[l];
        char n[96];
        const int use = m->opts.experts != WK_EXPERTS_ONLY && wk__in_stage(m, l);
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), n)
        if ((rc = wk__find_vec(m, NAME("attn_norm.weight"), E, &L->attn_norm, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_q.weight"), E, nq, 1, use, &L->wq, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_k.weight"), E, nkv, 1, use, &L->wk, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_v.weight"), E, nkv, 1, use, &L->wv, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_output.weight"), nq, E, 1, use, &L->wo, err)) < 0)
            return rc;
        if (c->qk_norm && ((rc = wk__find_vec(m, NAME("attn_q_norm.weight"), c->head_dim, &L->q_norm, err)) < 0 ||
                           (rc = wk__find_vec(m, NAME("attn_k_norm.weight"), c->head_dim, &L->k_norm, err)) < 0))
            return rc;
        if (c->attn_bias && ((rc = wk__find_vec(m, NAME("attn_q.bias"), nq, &L->bq, err)) < 0 ||
                             (rc = wk__find_vec(m, NAME("attn_k.bias"), nkv, &L->bk, err)) < 0 ||
                             (rc = wk__find_vec(m, NAME("attn_v.bias"), nkv, &L->bv, err)) < 0))
            return rc;
        if ((c->attn_out_bias && (rc = wk__find_vec(m, NAME("attn_output.bias"), E, &L->bo, err)) < 0) ||
            (c->attn_sinks && (rc = wk__find_vec(m, NAME("attn_sinks.weight"), c->n_head, &L->sinks, err)) < 0))
            return rc;
#undef NAME
        if ((rc = wk__map_ffn(m, l, err)) < 0)
            return rc;
    }
    return (rc = wk__map_mtp(m, err)) < 0 ? rc : wk__check_nextn(m, err);
}

/* Layer l's tensors registered with the backend. */
static int place_layer(wk_model_t *m, int64_t l, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    layer_t *L = &m->w.layers[l];
    wk_tensor_t *const qkv[3] = {&L->wq, &L->wk, &L->wv};
    int rc;
    if ((rc = op->add_vec(b, &L->attn_norm, c->n_embd, err)) < 0 ||
        (c->qk_norm && ((rc = op->add_vec(b, &L->q_norm, c->head_dim, err)) < 0 ||
                        (rc = op->add_vec(b, &L->k_norm, c->head_dim, err)) < 0)) ||
        (c->attn_bias && ((rc = op->add_vec(b, &L->bq, nq, err)) < 0 || (rc = op->add_vec(b, &L->bk, nkv, err)) < 0 ||
                          (rc = op->add_vec(b, &L->bv, nkv, err)) < 0)) ||
        (c->attn_out_bias && (rc = op->add_vec(b, &L->bo, c->n_embd, err)) < 0) ||
        (c->attn_sinks && (rc = op->add_vec(b, &L->sinks, c->n_head, err)) < 0) ||
        (rc = op->add_stack(b, qkv, err)) < 0 || (rc = op->add(b, &L->wo, 0, err)) < 0)
        return rc;
    return wk__place_ffn(m, l, err);
}

/* Registers what the stage computes with the backend, in file order, places it, and
 * makes the run state. */
int wk__gqa_place(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const int64_t nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    int rc = wk__place_io(m, err);
    for (int64_t l = m->lb; rc == 0 && l < m->le; l++)
        rc = place_layer(m, l, err);
    if (rc == 0 && m->mtp_l >= 0 && (rc = place_layer(m, m->mtp_l, err)) == 0)
        rc = wk__place_mtp(m, err);
    return rc < 0 ? rc : wk__place_done(m, nq, nkv, nq, 0, err);
}

int wk__gqa_block(wk_model_t *m, int64_t l, int64_t n, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const layer_t *L = &m->w.layers[l];
    const run_state_t *s = &m->s;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t E = c->n_embd;
    const wk_attn_t a = {.n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                         .n_rot = c->n_rot, .eps = c->eps, .rope_base = c->rope_base, .scale = c->attn_scale,
                         .q_norm = c->qk_norm ? L->q_norm.p : NULL, .k_norm = c->qk_norm ? L->k_norm.p : NULL,
                         .sinks = c->attn_sinks ? L->sinks.p : NULL,
                         .window = c->n_swa > 0 && c->swa_period > 0 && l % c->swa_period < c->swa_period - 1
                                       ? c->n_swa : 0};
    const float *const qkv_b[3] = {L->bq.p, L->bk.p, L->bv.p};
    int rc;
    /* attention: norm, projections (and their biases), per-head q/k norm and RoPE,
     * cache, attend, the output projection (and its bias) onto the residual */
    if ((rc = op->rms_norm(b, "attn_norm", s->xn, s->x, L->attn_norm.p, n, E, c->eps, err)) < 0 ||
        (rc = op->qkv(b, &L->wq, &L->wk, &L->wv, c->attn_bias ? qkv_b : NULL, s->xn, n, s->q, s->k, s->v, err)) <
            0 ||
        (rc = op->attention(b, l, &a, s->q, s->k, s->v, s->att, err)) < 0 ||
        (rc = op->matmul(b, "attn_output", &L->wo, c->attn_out_bias ? L->bo.p : NULL, s->att, n, s->x, 1, err)) < 0)
        return rc;
    /* FFN: norm, then the routed experts and the shared ones, or the dense SwiGLU,
     * onto the residual */
    return wk__forward_ffn(m, l, n, err);
}

/* One step of the stage's layers over the step's rows. The first stage embeds the
 * tokens, a later one starts from the rows the stage before sent; the last stage
 * computes the logits each sequence asked for, an earlier one sends the rows on.
 * The weights see all rows at once; attention and the KV cache go sequence by
 * sequence. */
int wk__gqa_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const weights_t *w = &m->w;
    const run_state_t *s = &m->s;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;

    int rc = op->begin(b, st, s->x, err);
    if (rc < 0)
        return rc;
    if (rc == WK_STEP_REPLAYED)
        return op->end(b, st, 0, s->x, err);
    if (m->lb == 0)
        rc = op->embed(b, &w->tok_embd, s->x, err);
    for (int64_t l = m->lb; l < m->le && rc == 0; l++)
        rc = wk__gqa_block(m, l, st->n, err);
    if (rc == 0 && m->le == c->n_layer)
        rc = op->head(b, w->output_norm.p, c->eps, &w->output, s->x, err);
    return op->end(b, st, rc, s->x, err);
}
