/* The GQA transformers with SwiGLU FFNs, written once over the backend ops:
 * qwen3moe (routed experts), qwen3 (dense FFN) and glm4moe (leading dense layers,
 * then routed and shared experts). Their metadata (common/arch.c), their tensors,
 * and a forward pass that reads as llama.cpp's for these architectures: RMSNorm,
 * Q/K/V (plus biases in glm4moe), per-head RMSNorm of q and k where the file has
 * them, NEOX RoPE over n_rot dims, causal GQA attention, residual; RMSNorm, FFN
 * (a dense SwiGLU, or the router's top-k experts: softmax renormalised to 1 in
 * qwen3moe, sigmoid with a selection bias, normed and scaled in glm4moe; plus the
 * shared experts), residual; final norm and head (token_embd when output.weight is
 * absent). glm4moe's NextN layers are checked at load and not run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "gguf.h"
#include "model.h"

/* The architecture's facts (common/arch.c) as the forward pass reads them. */
int wk__gqa_config(wk_model_t *m, bl_err_t *err)
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
    c->n_rot = a.n_rot;
    c->n_ff = a.n_ff;
    c->n_expert = a.n_expert;
    c->n_expert_used = a.n_expert_used;
    c->n_ff_exp = a.n_ff_exp;
    c->n_ff_shexp = a.n_ff_shexp;
    c->n_dense_lead = a.n_dense_lead;
    c->n_nextn = a.n_nextn;
    c->gating = a.gating;
    c->expert_norm = a.expert_norm;
    c->expert_scale = a.expert_scale;
    c->expert_bias = a.expert_bias;
    c->attn_bias = a.attn_bias;
    c->qk_norm = a.qk_norm;
    snprintf(c->ffn_norm, sizeof c->ffn_norm, "%s", a.ffn_norm);
    c->n_vocab = a.n_vocab;
    c->n_ctx_train = a.n_ctx_train;
    c->rope_base = a.rope_base;
    c->eps = a.eps;
    c->tied_output = a.tied_output;
    return 0;
}

/* The NextN layers' tensors: checked as llama.cpp loads them, not mapped (no step
 * runs them; speculation with them is not built). */
static int check_nextn(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd, nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    for (int64_t l = c->n_layer; l < c->n_layer + c->n_nextn; l++) {
        char n[96];
        wk_tensor_t t;
        wk_vec_t v;
        int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), n)
        if ((rc = wk__find_vec(m, NAME("attn_norm.weight"), E, &v, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_q.weight"), E, nq, 1, 0, &t, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_k.weight"), E, nkv, 1, 0, &t, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_v.weight"), E, nkv, 1, 0, &t, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_output.weight"), nq, E, 1, 0, &t, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("ffn_gate_inp.weight"), E, c->n_expert, 1, 0, &t, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("ffn_gate_exps.weight"), E, c->n_ff_exp, c->n_expert, 0, &t, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("ffn_up_exps.weight"), E, c->n_ff_exp, c->n_expert, 0, &t, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("ffn_down_exps.weight"), c->n_ff_exp, E, c->n_expert, 0, &t, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("nextn.eh_proj.weight"), 2 * E, E, 1, 0, &t, err)) < 0 ||
            (rc = wk__find_vec(m, NAME("nextn.enorm.weight"), E, &v, err)) < 0 ||
            (rc = wk__find_vec(m, NAME("nextn.hnorm.weight"), E, &v, err)) < 0)
            return rc;
#undef NAME
    }
    return 0;
}

int wk__gqa_map(wk_model_t *m, bl_err_t *err)
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
    char norm_name[48];
    snprintf(norm_name, sizeof norm_name, "%s.weight", c->ffn_norm);
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
            (rc = wk__find_vec(m, NAME(norm_name), E, &L->ffn_norm, err)) < 0)
            return rc;
        if (c->qk_norm && ((rc = wk__find_vec(m, NAME("attn_q_norm.weight"), c->head_dim, &L->q_norm, err)) < 0 ||
                           (rc = wk__find_vec(m, NAME("attn_k_norm.weight"), c->head_dim, &L->k_norm, err)) < 0))
            return rc;
        if (c->attn_bias && ((rc = wk__find_vec(m, NAME("attn_q.bias"), nq, &L->bq, err)) < 0 ||
                             (rc = wk__find_vec(m, NAME("attn_k.bias"), nkv, &L->bk, err)) < 0 ||
                             (rc = wk__find_vec(m, NAME("attn_v.bias"), nkv, &L->bv, err)) < 0))
            return rc;
        if (wk__layer_moe(m, l)) {
            wk_moe_t *e = &L->moe;
            e->n_expert = c->n_expert;
            e->n_used = c->n_expert_used;
            e->n_ff = c->n_ff_exp;
            e->gating = c->gating;
            e->norm = c->expert_norm;
            e->scale = c->expert_scale;
            if ((rc = wk__find_mat(m, NAME("ffn_gate_inp.weight"), E, c->n_expert, 1, use_attn, &e->gate_inp, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_gate_exps.weight"), E, c->n_ff_exp, c->n_expert, use_exps, &e->gate_exps, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_up_exps.weight"), E, c->n_ff_exp, c->n_expert, use_exps, &e->up_exps, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_down_exps.weight"), c->n_ff_exp, E, c->n_expert, use_exps, &e->down_exps, err)) < 0)
                return rc;
            if (c->expert_bias && (rc = wk__find_vec(m, NAME("exp_probs_b.bias"), c->n_expert, &e->probs_b, err)) < 0)
                return rc;
            if (c->n_ff_shexp &&
                ((rc = wk__find_mat(m, NAME("ffn_gate_shexp.weight"), E, c->n_ff_shexp, 1, use_attn, &L->sh_gate, err)) < 0 ||
                 (rc = wk__find_mat(m, NAME("ffn_up_shexp.weight"), E, c->n_ff_shexp, 1, use_attn, &L->sh_up, err)) < 0 ||
                 (rc = wk__find_mat(m, NAME("ffn_down_shexp.weight"), c->n_ff_shexp, E, 1, use_attn, &L->sh_down, err)) < 0))
                return rc;
        } else {
            if ((rc = wk__find_mat(m, NAME("ffn_gate.weight"), E, c->n_ff, 1, use_attn, &L->ffn_gate, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_up.weight"), E, c->n_ff, 1, use_attn, &L->ffn_up, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("ffn_down.weight"), c->n_ff, E, 1, use_attn, &L->ffn_down, err)) < 0)
                return rc;
        }
#undef NAME
    }
    return check_nextn(m, err);
}

/* Registers what the stage computes with the backend, in file order, places it, and
 * makes the run state. */
int wk__gqa_place(wk_model_t *m, bl_err_t *err)
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
        const int64_t nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
        if ((rc = op->add_vec(b, &L->attn_norm, c->n_embd, err)) < 0 ||
            (c->qk_norm && ((rc = op->add_vec(b, &L->q_norm, c->head_dim, err)) < 0 ||
                            (rc = op->add_vec(b, &L->k_norm, c->head_dim, err)) < 0)) ||
            (c->attn_bias && ((rc = op->add_vec(b, &L->bq, nq, err)) < 0 || (rc = op->add_vec(b, &L->bk, nkv, err)) < 0 ||
                              (rc = op->add_vec(b, &L->bv, nkv, err)) < 0)) ||
            (rc = op->add_vec(b, &L->ffn_norm, c->n_embd, err)) < 0 ||
            (rc = op->add_stack(b, qkv, err)) < 0 || (rc = op->add(b, &L->wo, 0, err)) < 0)
            return rc;
        wk_moe_t *e = &L->moe;
        const int moe = wk__layer_moe(m, l);
        if (moe && ((rc = op->add(b, &e->gate_inp, 0, err)) < 0 ||
                    (c->expert_bias && (rc = op->add_vec(b, &e->probs_b, c->n_expert, err)) < 0) ||
                    (wk__layer_local_experts(m, l) &&
                     ((rc = op->add(b, &e->gate_exps, 0, err)) < 0 || (rc = op->add(b, &e->up_exps, 0, err)) < 0 ||
                      (rc = op->add(b, &e->down_exps, 0, err)) < 0))))
            return rc;
        if (moe && c->n_ff_shexp &&
            ((rc = op->add(b, &L->sh_gate, 0, err)) < 0 || (rc = op->add(b, &L->sh_up, 0, err)) < 0 ||
             (rc = op->add(b, &L->sh_down, 0, err)) < 0))
            return rc;
        if (moe && wk__layer_remote(m, l) && (rc = op->add_host(b, l, e, err)) < 0)
            return rc;
        if (!moe && ((rc = op->add(b, &L->ffn_gate, 0, err)) < 0 || (rc = op->add(b, &L->ffn_up, 0, err)) < 0 ||
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
int wk__gqa_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const weights_t *w = &m->w;
    const run_state_t *s = &m->s;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t n = st->n, E = c->n_embd;
    const int64_t nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    const wk_attn_t at = {.n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                          .n_rot = c->n_rot, .eps = c->eps, .rope_base = c->rope_base,
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
        a.q_norm = c->qk_norm ? L->q_norm.p : NULL;
        a.k_norm = c->qk_norm ? L->k_norm.p : NULL;
        /* attention: norm, projections (and their biases), per-head q/k norm and
         * RoPE, cache, attend, the output projection onto the residual */
        if ((rc = op->rms_norm(b, "attn_norm", s->xn, s->x, L->attn_norm.p, n, E, c->eps, err)) < 0 ||
            (rc = op->qkv(b, &L->wq, &L->wk, &L->wv, s->xn, n, s->q, s->k, s->v, err)) < 0 ||
            (c->attn_bias && ((rc = op->add_bias(b, s->q, L->bq.p, n, nq, err)) < 0 ||
                              (rc = op->add_bias(b, s->k, L->bk.p, n, nkv, err)) < 0 ||
                              (rc = op->add_bias(b, s->v, L->bv.p, n, nkv, err)) < 0)) ||
            (rc = op->attention(b, l, &a, s->q, s->k, s->v, s->att, err)) < 0 ||
            (rc = op->matmul(b, "attn_output", &L->wo, s->att, n, s->x, 1, err)) < 0)
            break;
        /* FFN: norm, then the routed experts and the shared ones, or the dense
         * SwiGLU, onto the residual */
        if ((rc = op->rms_norm(b, "ffn_norm", s->xn, s->x, L->ffn_norm.p, n, E, c->eps, err)) < 0)
            break;
        if (!wk__layer_moe(m, l)) {
            rc = op->ffn(b, &L->ffn_gate, &L->ffn_up, &L->ffn_down, s->xn, n, s->x, err);
            continue;
        }
        if ((rc = op->moe(b, l, &L->moe, wk__layer_remote(m, l) ? &m->remote : NULL, s->xn, n, s->x, err)) == 0 &&
            c->n_ff_shexp)
            rc = op->ffn(b, &L->sh_gate, &L->sh_up, &L->sh_down, s->xn, n, s->x, err);
    }
    if (rc == 0 && m->le == c->n_layer)
        rc = op->head(b, w->output_norm.p, c->eps, &w->output, s->x, err);
    return op->end(b, st, rc, s->x, err);
}
