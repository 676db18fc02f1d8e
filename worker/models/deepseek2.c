/* deepseek2 (DeepSeek-V2/V3/R1/V3.1, Kimi-K2), written once over the backend ops:
 * multi-head latent attention, then the FFN block every family shares (leading dense
 * layers, then sigmoid or softmax routing with grouped choice, a selection bias and
 * shared experts). Its forward pass reads as llama.cpp's: RMSNorm; q through its
 * compression (q_a, RMSNorm, q_b) or straight (attn_q); the compressed keys
 * (attn_kv_a_mqa); the latent attention op (the latent part normed, the rotated
 * parts rotated the NORM way with YaRN, one cache row of kv_lora + n_rot per
 * position, the heads absorbed through attn_k_b and attn_v_b); the output
 * projection; residual; FFN; residual; final norm and head. A legacy file's
 * attn_kv_b is split into the two at load (as f32). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"

/* attn_kv_b (n_head * (qk_nope + head_v) rows of kv_lora) as attn_k_b's form, each
 * head's k rows transposed (kv_lora rows of qk_nope), and attn_v_b's, each head's v
 * rows: f32 copies the model owns. */
static int split_kv_b(wk_model_t *m, const char *name, layer_t *L, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const int64_t H = c->n_head, nope = c->head_k - c->n_rot, hv = c->head_v, r = c->kv_lora;
    wk_tensor_t kv;
    int rc = wk__find_mat(m, name, r, H * (nope + hv), 1, 0, &kv, err);
    if (rc < 0)
        return rc;
    float *kb = malloc(sizeof(float) * (size_t)(H * r * nope)), *vb = malloc(sizeof(float) * (size_t)(H * hv * r));
    float *row = malloc(sizeof(float) * (size_t)r);
    if ((rc = wk__own(m, kb, err)) < 0) {
        free(vb);
        free(row);
        return rc;
    }
    if ((rc = wk__own(m, vb, err)) < 0) {
        free(row);
        return rc;
    }
    if (!row)
        return bl_err_set(err, BL_ENOMEM, "out of memory splitting %s", name);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < nope + hv; i++) {
            const uint8_t *src = (const uint8_t *)kv.h.data + (size_t)(h * (nope + hv) + i) * kv.h.row_bytes;
            /* the type was checked to have a dequantizer: cannot fail */
            if (bl_dequantize_row_ref(kv.h.type, src, row, r) != 0)
                memset(row, 0, sizeof(float) * (size_t)r);
            if (i < nope)
                for (int64_t j = 0; j < r; j++)
                    kb[(h * r + j) * nope + i] = row[j];
            else
                memcpy(vb + (h * hv + i - nope) * r, row, sizeof(float) * (size_t)r);
        }
    free(row);
    if ((rc = kcpu_mat_init(&L->wk_b.h, kb, BL_TYPE_F32, nope, H * r, err)) < 0 ||
        (rc = kcpu_mat_init(&L->wv_b.h, vb, BL_TYPE_F32, r, H * hv, err)) < 0)
        return rc;
    L->wk_b.d = L->wv_b.d = NULL;
    return 0;
}

int wk__ds2_map(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd, H = c->n_head, nope = c->head_k - c->n_rot, r = c->kv_lora;
    int rc = wk__map_io(m, err);
    if (rc < 0)
        return rc;
    for (int64_t l = 0; l < c->n_layer; l++) {
        layer_t *L = &m->w.layers[l];
        char n[96];
        const int use = m->opts.experts != WK_EXPERTS_ONLY && l >= m->lb && l < m->le;
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), n)
        if ((rc = wk__find_vec(m, NAME("attn_norm.weight"), E, &L->attn_norm, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_kv_a_mqa.weight"), E, r + c->n_rot, 1, use, &L->wkv_a, err)) < 0 ||
            (rc = wk__find_vec(m, NAME("attn_kv_a_norm.weight"), r, &L->kv_a_norm, err)) < 0 ||
            (rc = wk__find_mat(m, NAME("attn_output.weight"), H * c->head_v, E, 1, use, &L->wo, err)) < 0)
            return rc;
        if (c->q_lora > 0 ? (rc = wk__find_mat(m, NAME("attn_q_a.weight"), E, c->q_lora, 1, use, &L->wq_a, err)) < 0 ||
                                (rc = wk__find_vec(m, NAME("attn_q_a_norm.weight"), c->q_lora, &L->q_a_norm, err)) < 0 ||
                                (rc = wk__find_mat(m, NAME("attn_q_b.weight"), c->q_lora, H * c->head_k, 1, use,
                                                   &L->wq_b, err)) < 0
                          : (rc = wk__find_mat(m, NAME("attn_q.weight"), E, H * c->head_k, 1, use, &L->wq_b, err)) < 0)
            return rc;
        if (c->mla_split) {
            if ((rc = wk__find_mat(m, NAME("attn_k_b.weight"), nope, r, H, use, &L->wk_b, err)) < 0 ||
                (rc = wk__find_mat(m, NAME("attn_v_b.weight"), r, c->head_v, H, use, &L->wv_b, err)) < 0)
                return rc;
        } else if (use ? (rc = split_kv_b(m, NAME("attn_kv_b.weight"), L, err)) < 0
                       : (rc = wk__find_mat(m, NAME("attn_kv_b.weight"), r, H * (nope + c->head_v), 1, 0, &L->wk_b,
                                            err)) < 0) {
            return rc;
        }
#undef NAME
        if ((rc = wk__map_ffn(m, l, err)) < 0)
            return rc;
    }
    return wk__check_nextn(m, err);
}

int wk__ds2_place(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    if (!op->mla)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s: the %s backend has no latent attention (run it with -ngl 0)",
                          m->path, c->arch, op->name(b));
    int rc = wk__place_io(m, err);
    for (int64_t l = m->lb; rc == 0 && l < m->le; l++) {
        layer_t *L = &m->w.layers[l];
        if ((rc = op->add_vec(b, &L->attn_norm, c->n_embd, err)) < 0 ||
            (c->q_lora > 0 && ((rc = op->add(b, &L->wq_a, 0, err)) < 0 ||
                               (rc = op->add_vec(b, &L->q_a_norm, c->q_lora, err)) < 0)) ||
            (rc = op->add(b, &L->wq_b, 0, err)) < 0 || (rc = op->add(b, &L->wkv_a, 0, err)) < 0 ||
            (rc = op->add_vec(b, &L->kv_a_norm, c->kv_lora, err)) < 0 || (rc = op->add(b, &L->wk_b, 0, err)) < 0 ||
            (rc = op->add(b, &L->wv_b, 0, err)) < 0 || (rc = op->add(b, &L->wo, 0, err)) < 0)
            break;
        rc = wk__place_ffn(m, l, err);
    }
    return rc < 0 ? rc
                  : wk__place_done(m, c->n_head * c->head_k, c->kv_lora + c->n_rot, c->n_head * c->head_v,
                                   c->q_lora, err);
}

int wk__ds2_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const weights_t *w = &m->w;
    const run_state_t *s = &m->s;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t n = st->n, E = c->n_embd;
    int rc = op->begin(b, st, s->x, err);
    if (rc < 0)
        return rc;
    if (rc == WK_STEP_REPLAYED)
        return op->end(b, st, 0, s->x, err);
    if (m->lb == 0)
        rc = op->embed(b, &w->tok_embd, s->x, err);
    for (int64_t l = m->lb; l < m->le && rc == 0; l++) {
        const layer_t *L = &w->layers[l];
        const wk_mla_t a = {.kv_norm = L->kv_a_norm.p, .wk_b = &L->wk_b, .wv_b = &L->wv_b, .n_head = c->n_head,
                            .head_k = c->head_k, .head_v = c->head_v, .kv_lora = c->kv_lora, .n_rot = c->n_rot,
                            .eps = c->eps, .scale = c->attn_scale};
        /* attention: norm; q (through its compression when the file has one) and the
         * compressed keys; the latent attention; the output projection onto the
         * residual */
        if ((rc = op->rms_norm(b, "attn_norm", s->xn, s->x, L->attn_norm.p, n, E, c->eps, err)) < 0)
            break;
        if (c->q_lora > 0)
            rc = (rc = op->matmul(b, "attn_q_a", &L->wq_a, NULL, s->xn, n, s->extra, 0, err)) < 0 ||
                         (rc = op->rms_norm(b, "attn_q_a_norm", s->extra, s->extra, L->q_a_norm.p, n, c->q_lora,
                                            c->eps, err)) < 0 ||
                         (rc = op->matmul(b, "attn_q_b", &L->wq_b, NULL, s->extra, n, s->q, 0, err)) < 0
                     ? rc
                     : 0;
        else
            rc = op->matmul(b, "attn_q", &L->wq_b, NULL, s->xn, n, s->q, 0, err);
        if (rc < 0 || (rc = op->matmul(b, "attn_kv_a", &L->wkv_a, NULL, s->xn, n, s->k, 0, err)) < 0 ||
            (rc = op->mla(b, l, &a, s->q, s->k, s->att, err)) < 0 ||
            (rc = op->matmul(b, "attn_output", &L->wo, NULL, s->att, n, s->x, 1, err)) < 0)
            break;
        rc = wk__forward_ffn(m, l, n, err);
    }
    if (rc == 0 && m->le == c->n_layer)
        rc = op->head(b, w->output_norm.p, c->eps, &w->output, s->x, err);
    return op->end(b, st, rc, s->x, err);
}
