/* qwen3next and qwen35moe (Qwen3-Next, Qwen3.5/3.6 MoE), written once over the
 * backend ops: gated DeltaNet layers (a recurrent state per sequence, the backend's
 * deltanet op) between gated full-attention layers (q/k norms, partial NEOX RoPE, the
 * attended values times sigmoid of a gate that attn_q gives beside each head's q),
 * and in every layer the softmax router's experts plus a shared expert behind its
 * own sigmoid gate. The math is in docs/models.md; qwen35moe differs in its beta and
 * alpha projections (two matrices, not one grouped by k head), in which q/k head a v
 * head reads, and in its NextN layers: gated attention blocks, the first of which runs
 * after the head when the stage proposes tokens with it (model.c's wk__mtp_forward),
 * the others checked at load. */
#include <stdio.h>

#include "arch.h"
#include "model.h"

/* A DeltaNet layer's tensors. */
static int map_dnet(wk_model_t *m, int64_t l, int use, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    layer_t *L = &m->w.layers[l];
    const int64_t E = c->n_embd, S = c->ssm_state, Hv = c->ssm_heads, V = S * Hv;
    const int64_t ch = S * (2 * c->ssm_groups + Hv);
    char n[96];
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), n)
    if (bl_gguf_find_tensor(m->g, NAME("ssm_in.weight")) && !bl_gguf_find_tensor(m->g, NAME("attn_qkv.weight")))
        return bl_err_set(err, BL_ENOTSUP, "%s: %s: the older file form with one ssm_in is not supported (convert "
                          "the model again: attn_qkv and attn_gate)", m->path, n);
    if ((rc = wk__find_mat(m, NAME("attn_qkv.weight"), E, ch, 1, use, &L->wqkv, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("attn_gate.weight"), E, V, 1, use, &L->wgate, err)) < 0 ||
        (rc = wk__find_vec2(m, NAME("ssm_conv1d.weight"), c->ssm_conv, ch, &L->ssm_conv, err)) < 0 ||
        (rc = wk__find_vec(m, NAME("ssm_dt.bias"), Hv, &L->ssm_dt, err)) < 0 ||
        (rc = wk__find_vec(m, NAME("ssm_a"), Hv, &L->ssm_a, err)) < 0 ||
        (rc = wk__find_vec(m, NAME("ssm_norm.weight"), S, &L->ssm_norm, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("ssm_out.weight"), V, E, 1, use, &L->ssm_out, err)) < 0)
        return rc;
    if (c->ssm_ba)
        return wk__find_mat(m, NAME("ssm_ba.weight"), E, 2 * Hv, 1, use, &L->ssm_ba, err);
    if ((rc = wk__find_mat(m, NAME("ssm_beta.weight"), E, Hv, 1, use, &L->ssm_beta, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("ssm_alpha.weight"), E, Hv, 1, use, &L->ssm_alpha, err)) < 0)
        return rc;
#undef NAME
    return 0;
}

/* A gated attention layer's tensors: attn_q gives 2 head_dim a head. */
static int map_attn(wk_model_t *m, int64_t l, int use, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    layer_t *L = &m->w.layers[l];
    const int64_t E = c->n_embd, nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    char n[96];
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), n)
    if ((rc = wk__find_mat(m, NAME("attn_q.weight"), E, 2 * nq, 1, use, &L->wq, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("attn_k.weight"), E, nkv, 1, use, &L->wk, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("attn_v.weight"), E, nkv, 1, use, &L->wv, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("attn_output.weight"), nq, E, 1, use, &L->wo, err)) < 0 ||
        (rc = wk__find_vec(m, NAME("attn_q_norm.weight"), c->head_dim, &L->q_norm, err)) < 0 ||
        (rc = wk__find_vec(m, NAME("attn_k_norm.weight"), c->head_dim, &L->k_norm, err)) < 0)
        return rc;
#undef NAME
    return 0;
}

int wk__q3n_map(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    int rc = wk__map_io(m, err);
    for (int64_t l = 0; rc == 0 && l < wk__layers_held(m); l++) { /* the NextN layer's: attention */
        char n[96];
        snprintf(n, sizeof n, "blk.%lld.attn_norm.weight", (long long)l);
        const int use = m->opts.experts != WK_EXPERTS_ONLY && wk__in_stage(m, l);
        if ((rc = wk__find_vec(m, n, c->n_embd, &m->w.layers[l].attn_norm, err)) < 0 ||
            (rc = l < c->n_layer && wk__layer_recurrent(c, l) ? map_dnet(m, l, use, err)
                                                              : map_attn(m, l, use, err)) < 0)
            break;
        rc = wk__map_ffn(m, l, err);
    }
    if (rc == 0)
        rc = wk__map_mtp(m, err);
    return rc < 0 ? rc : wk__check_nextn(m, err);
}

/* The widest of a and b. */
static int64_t wider(int64_t a, int64_t b) { return a > b ? a : b; }

int wk__q3n_place(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t S = c->ssm_state, Hv = c->ssm_heads, V = S * Hv, ch = S * (2 * c->ssm_groups + Hv);
    const int64_t nq = c->n_head * c->head_dim, nkv = c->n_head_kv * c->head_dim;
    if (!op->deltanet || !op->split_heads || !op->mul_sigmoid)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s: the %s backend has no gated DeltaNet (run it with -ngl 0)",
                          m->path, c->arch, op->name(b));
    int rc = wk__place_io(m, err);
    for (int64_t l = m->lb; rc == 0 && l < wk__layers_held(m); l++) {
        if (!wk__in_stage(m, l))
            continue; /* the layers between the stage's last and the NextN layer */
        layer_t *L = &m->w.layers[l];
        if ((rc = op->add_vec(b, &L->attn_norm, c->n_embd, err)) < 0)
            break;
        if (l < c->n_layer && wk__layer_recurrent(c, l)) {
            if ((rc = op->add_vec(b, &L->ssm_conv, ch * c->ssm_conv, err)) < 0 ||
                (rc = op->add_vec(b, &L->ssm_dt, Hv, err)) < 0 || (rc = op->add_vec(b, &L->ssm_a, Hv, err)) < 0 ||
                (rc = op->add_vec(b, &L->ssm_norm, S, err)) < 0 || (rc = op->add(b, &L->wqkv, 0, err)) < 0 ||
                (rc = op->add(b, &L->wgate, 0, err)) < 0 ||
                (c->ssm_ba && (rc = op->add(b, &L->ssm_ba, 0, err)) < 0) ||
                (!c->ssm_ba && ((rc = op->add(b, &L->ssm_beta, 0, err)) < 0 ||
                                (rc = op->add(b, &L->ssm_alpha, 0, err)) < 0)) ||
                (rc = op->add(b, &L->ssm_out, 0, err)) < 0)
                break;
        } else {
            wk_tensor_t *const qkv[3] = {&L->wq, &L->wk, &L->wv};
            if ((rc = op->add_vec(b, &L->q_norm, c->head_dim, err)) < 0 ||
                (rc = op->add_vec(b, &L->k_norm, c->head_dim, err)) < 0 || (rc = op->add_stack(b, qkv, err)) < 0 ||
                (rc = op->add(b, &L->wo, 0, err)) < 0)
                break;
        }
        rc = wk__place_ffn(m, l, err);
    }
    if (rc == 0 && m->mtp_l >= 0)
        rc = wk__place_mtp(m, err);
    /* q: the convolution's channels or the queries; k: the output gate z or the keys;
     * v: beta (and alpha) or the values; att: attn_q's q and gate, the DeltaNet's
     * output or the attended values; extra: qwen35moe's alpha or the attention's gate */
    return rc < 0 ? rc
                  : wk__place_done(m, wider(ch, nq), wider(wider(nkv, V), 2 * Hv), wider(2 * nq, V),
                                   wider(nq, Hv), err);
}

int wk__q3n_block(wk_model_t *m, int64_t l, int64_t n, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const run_state_t *s = &m->s;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t E = c->n_embd, nq = c->n_head * c->head_dim;
    const layer_t *L = &m->w.layers[l];
    int rc;
    if ((rc = op->rms_norm(b, "attn_norm", s->xn, s->x, L->attn_norm.p, n, E, c->eps, err)) < 0)
        return rc;
    if (l < c->n_layer && wk__layer_recurrent(c, l)) {
        const kcpu_dnet_t d = {.conv_w = L->ssm_conv.p, .dt_bias = L->ssm_dt.p, .a = L->ssm_a.p,
                               .norm = L->ssm_norm.p, .K = c->ssm_conv, .S = c->ssm_state,
                               .Hk = c->ssm_groups, .Hv = c->ssm_heads, .tiled = c->ssm_tiled,
                               .ba = c->ssm_ba, .eps = c->eps};
        /* projections, the recurrence with its gated norm, the output onto the residual */
        if ((rc = op->matmul(b, "attn_qkv", &L->wqkv, NULL, s->xn, n, s->q, 0, err)) < 0 ||
            (rc = op->matmul(b, "attn_gate", &L->wgate, NULL, s->xn, n, s->k, 0, err)) < 0 ||
            (c->ssm_ba && (rc = op->matmul(b, "ssm_ba", &L->ssm_ba, NULL, s->xn, n, s->v, 0, err)) < 0) ||
            (!c->ssm_ba && ((rc = op->matmul(b, "ssm_beta", &L->ssm_beta, NULL, s->xn, n, s->v, 0, err)) < 0 ||
                            (rc = op->matmul(b, "ssm_alpha", &L->ssm_alpha, NULL, s->xn, n, s->extra, 0, err)) < 0)) ||
            (rc = op->deltanet(b, l, &d, s->q, s->k, s->v, s->extra, s->att, err)) < 0 ||
            (rc = op->matmul(b, "ssm_out", &L->ssm_out, NULL, s->att, n, s->x, 1, err)) < 0)
            return rc;
    } else {
        const wk_attn_t a = {.n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = c->head_dim,
                             .n_rot = c->n_rot, .eps = c->eps, .rope_base = c->rope_base,
                             .scale = c->attn_scale, .q_norm = L->q_norm.p, .k_norm = L->k_norm.p};
        /* attn_q's rows: each head's q then its gate; the attended values times
         * sigmoid(gate) */
        if ((rc = op->qkv(b, &L->wq, &L->wk, &L->wv, NULL, s->xn, n, s->att, s->k, s->v, err)) < 0 ||
            (rc = op->split_heads(b, s->att, n, c->n_head, c->head_dim, s->q, s->extra, err)) < 0 ||
            (rc = op->attention(b, l, &a, s->q, s->k, s->v, s->att, err)) < 0 ||
            (rc = op->mul_sigmoid(b, s->att, s->extra, n, nq, err)) < 0 ||
            (rc = op->matmul(b, "attn_output", &L->wo, NULL, s->att, n, s->x, 1, err)) < 0)
            return rc;
    }
    return wk__forward_ffn(m, l, n, err);
}

int wk__q3n_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err)
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
        rc = wk__q3n_block(m, l, st->n, err);
    if (rc == 0 && m->le == c->n_layer)
        rc = op->head(b, w->output_norm.p, c->eps, &w->output, s->x, err);
    return op->end(b, st, rc, s->x, err);
}
