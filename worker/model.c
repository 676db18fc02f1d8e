/* The worker's model API (wk.h) over any family and backend: opening and checking
 * the file (each tensor's shape, type and size), the weights' copy in anonymous
 * memory, the backend a model runs on, the KV caches, and the checks and chunking
 * of a step. A family (models/<arch>.c) reads its metadata, maps its tensors and
 * writes its forward pass over the backend ops; model.c calls it. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arch.h"
#include "blocks.h"
#include "gguf.h"
#include "kcpu.h"
#include "log.h"
#include "model.h"
#include "plan.h"
#include "quant.h"
#include "store.h"
#include "wmem.h"
#include "wk.h"

void wk_model_opts_default(wk_model_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->n_threads = 1;
    o->n_batch = 512;
    o->act_terms = 2;
    o->poll = KCPU_POLL_DEFAULT;
    o->device = WK_DEVICE_CPU;
    o->cuda_graph = 1;
    o->experts_vram = WK_EXPERTS_VRAM_AUTO;
    o->residency = 1;
}

// --- loading ------------------------------------------------------------------------------

/* The tensor name, checked by the architecture's owner (bl_arch_tensor). */
static int find(wk_model_t *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int need_f32,
                const bl_gguf_tensor_t **out, bl_err_t *err)
{
    return bl_arch_tensor(m->g, m->path, name, ne0, ne1, ne2, need_f32, out, err);
}

int wk__find_mat(wk_model_t *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int use,
                 wk_tensor_t *out, bl_err_t *err)
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
        if (m->n_copies == m->cap_copies) {
            const size_t cap = m->cap_copies ? 2 * m->cap_copies : 256;
            bl_wmem_job_t *c = realloc(m->copies, cap * sizeof *c);
            if (c) {
                m->copies = c;
                m->cap_copies = cap;
            }
        }
        if (m->n_copies < m->cap_copies) /* made in wk_model_load, on the threads */
            m->copies[m->n_copies++] = (bl_wmem_job_t){m->arena + m->arena_used, t->data, t->nbytes};
        else
            memcpy(m->arena + m->arena_used, t->data, t->nbytes);
        data = m->arena + m->arena_used;
        m->arena_used += (t->nbytes + 63) & ~(uint64_t)63;
    } else if (use && m->arena) {
        m->arena_missed += t->nbytes;
    }
    out->d = NULL;
    return kcpu_mat_init(&out->h, data, t->type, ne0, ne1 * ne2, err);
}

/* The matrices' copy in huge pages (common/wmem.h), sized for every tensor of the
 * file, which bounds the matrices' total; where the RAM's margin holds less, that
 * much (bl_wmem_alloc_part), and the matrices past it stay in the file mapping
 * (pages of the arena never written take no memory). */
static void weights_arena(wk_model_t *m)
{
    uint64_t total = 0;
    for (uint64_t i = 0; i < bl_gguf_n_tensors(m->g); i++)
        total += (bl_gguf_tensor_at(m->g, i)->nbytes + 63) & ~(uint64_t)63;
    m->arena = bl_wmem_alloc_part(total, m->opts.copy_bytes, m->opts.no_mmap, m->opts.mlock, &m->arena_len);
}

int wk__find_vec2(wk_model_t *m, const char *name, int64_t ne0, int64_t ne1, wk_vec_t *out, bl_err_t *err)
{
    const bl_gguf_tensor_t *t = NULL;
    int rc = find(m, name, ne0, ne1, 1, 1, &t, err);
    if (rc < 0)
        return rc;
    out->h = out->p = t->data;
    return 0;
}

int wk__find_vec(wk_model_t *m, const char *name, int64_t ne0, wk_vec_t *out, bl_err_t *err)
{
    const bl_gguf_tensor_t *t = NULL;
    int rc = find(m, name, ne0, 1, 1, 1, &t, err);
    if (rc < 0)
        return rc;
    out->h = out->p = t->data;
    return 0;
}

// --- what every family shares (model.h) ---------------------------------------------------

/* The architecture's facts (common/arch.c) as the forward passes read them. */
static int read_config(wk_model_t *m, bl_arch_t *a, bl_err_t *err)
{
    int rc = bl_arch_read(a, m->g, m->path, err);
    if (rc < 0)
        return rc;
    wk_config_t *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", a->name);
    c->moe = a->moe;
    c->n_layer = a->n_layer;
    c->n_embd = a->n_embd;
    c->n_head = a->n_head;
    c->n_head_kv = a->n_head_kv;
    c->head_dim = a->head_dim;
    c->n_rot = a->n_rot;
    c->rope_neox = a->rope_neox;
    c->rope_freq_scale = a->rope_freq_scale;
    c->rope_ext_factor = a->rope_ext_factor;
    c->rope_corr_lo = a->rope_corr_lo;
    c->rope_corr_hi = a->rope_corr_hi;
    c->rope_mscale = a->rope_mscale;
    c->attn_scale = a->attn_scale;
    c->q_lora = a->q_lora;
    c->kv_lora = a->kv_lora;
    c->head_k = a->head_k;
    c->head_v = a->head_v;
    c->mla_split = a->mla_split;
    c->kv_planes = a->kv_planes;
    c->n_ff = a->n_ff;
    c->n_expert = a->n_expert;
    c->n_expert_used = a->n_expert_used;
    c->n_ff_exp = a->n_ff_exp;
    c->n_ff_shexp = a->n_ff_shexp;
    c->n_dense_lead = a->n_dense_lead;
    c->n_nextn = a->n_nextn;
    c->n_group = a->n_group;
    c->topk_group = a->topk_group;
    c->gating = a->gating;
    c->expert_norm = a->expert_norm;
    c->expert_scale = a->expert_scale;
    c->expert_bias = a->expert_bias;
    c->attn_bias = a->attn_bias;
    c->qk_norm = a->qk_norm;
    c->n_swa = a->n_swa;
    c->swa_period = a->swa_period;
    c->attn_sinks = a->attn_sinks;
    c->attn_out_bias = a->attn_out_bias;
    c->router_bias = a->router_bias;
    c->expert_biases = a->expert_biases;
    c->expert_act = a->expert_act;
    c->ssm_conv = a->ssm_conv;
    c->ssm_state = a->ssm_state;
    c->ssm_groups = a->ssm_groups;
    c->ssm_heads = a->ssm_heads;
    c->ssm_tiled = a->ssm_tiled;
    c->ssm_ba = a->ssm_ba;
    c->attn_gate = a->attn_gate;
    c->shexp_gate = a->shexp_gate;
    _Static_assert(sizeof c->recurrent == sizeof a->recurrent, "one bit a layer");
    memcpy(c->recurrent, a->recurrent, sizeof c->recurrent);
    snprintf(c->ffn_norm, sizeof c->ffn_norm, "%s", a->ffn_norm);
    c->n_vocab = a->n_vocab;
    c->n_ctx_train = a->n_ctx_train;
    c->rope_base = a->rope_base;
    c->eps = a->eps;
    c->tied_output = a->tied_output;
    return 0;
}

/* The families and the architectures each runs. */
static const wk__family_t k_families[] = {
    {"qwen3moe", wk__gqa_map, wk__gqa_place, wk__gqa_forward, NULL},
    {"qwen3", wk__gqa_map, wk__gqa_place, wk__gqa_forward, NULL},
    {"glm4moe", wk__gqa_map, wk__gqa_place, wk__gqa_forward, wk__gqa_block},
    {"deepseek2", wk__ds2_map, wk__ds2_place, wk__ds2_forward, NULL},
    {"gpt-oss", wk__gqa_map, wk__gqa_place, wk__gqa_forward, NULL},
    {"qwen3next", wk__q3n_map, wk__q3n_place, wk__q3n_forward, NULL},
    {"qwen35moe", wk__q3n_map, wk__q3n_place, wk__q3n_forward, wk__q3n_block},
};

static const wk__family_t *family_of(const char *arch)
{
    for (size_t i = 0; i < sizeof k_families / sizeof *k_families; i++)
        if (!strcmp(k_families[i].arch, arch))
            return &k_families[i];
    return NULL;
}

int wk__own(wk_model_t *m, void *p, bl_err_t *err)
{
    if (!p)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %s's weights", m->path);
    if (m->n_owned == m->cap_owned) {
        const size_t cap = m->cap_owned ? 2 * m->cap_owned : 16;
        void **o = realloc(m->owned, cap * sizeof *o);
        if (!o) {
            free(p);
            return bl_err_set(err, BL_ENOMEM, "out of memory for %s's weights", m->path);
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return 0;
}

int wk__map_io(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    const int64_t E = c->n_embd;
    /* What this process computes: its stage's layers (the first stage embeds, the
     * last one has the head; a tied head reads token_embd), or only the experts. */
    const int only = m->opts.experts == WK_EXPERTS_ONLY;
    const int last = m->le == c->n_layer;
    const int use_head = !only && last;
    const int use_embd = !only && (m->lb == 0 || (last && !bl_gguf_find_tensor(m->g, "output.weight")) ||
                                   m->mtp_l >= 0);
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
    w->layers = calloc((size_t)wk__layers_held(m), sizeof *w->layers);
    if (!w->layers)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %lld layers", (long long)c->n_layer);
    return 0;
}

int wk__map_ffn(wk_model_t *m, int64_t l, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    layer_t *L = &m->w.layers[l];
    const int64_t E = c->n_embd;
    const int use = m->opts.experts != WK_EXPERTS_ONLY && wk__in_stage(m, l);
    const int use_exps = wk__layer_local_experts(m, l);
    char n[96];
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), n)
    char norm[48];
    snprintf(norm, sizeof norm, "%s.weight", c->ffn_norm);
    if ((rc = wk__find_vec(m, NAME(norm), E, &L->ffn_norm, err)) < 0)
        return rc;
    if (!wk__layer_moe(m, l))
        return (rc = wk__find_mat(m, NAME("ffn_gate.weight"), E, c->n_ff, 1, use, &L->ffn_gate, err)) < 0 ||
                       (rc = wk__find_mat(m, NAME("ffn_up.weight"), E, c->n_ff, 1, use, &L->ffn_up, err)) < 0 ||
                       (rc = wk__find_mat(m, NAME("ffn_down.weight"), c->n_ff, E, 1, use, &L->ffn_down, err)) < 0
                   ? rc
                   : 0;
    wk_moe_t *e = &L->moe;
    e->n_expert = c->n_expert;
    e->n_used = c->n_expert_used;
    e->n_ff = c->n_ff_exp;
    e->n_group = c->n_group;
    e->topk_group = c->topk_group;
    e->gating = c->gating;
    e->norm = c->expert_norm;
    e->scale = c->expert_scale;
    e->act = c->expert_act;
    if (c->router_bias && (rc = wk__find_vec(m, NAME("ffn_gate_inp.bias"), c->n_expert, &e->router_b, err)) < 0)
        return rc;
    if (c->expert_biases &&
        ((rc = wk__find_vec2(m, NAME("ffn_gate_exps.bias"), c->n_ff_exp, c->n_expert, &e->gate_b, err)) < 0 ||
         (rc = wk__find_vec2(m, NAME("ffn_up_exps.bias"), c->n_ff_exp, c->n_expert, &e->up_b, err)) < 0 ||
         (rc = wk__find_vec2(m, NAME("ffn_down_exps.bias"), E, c->n_expert, &e->down_b, err)) < 0))
        return rc;
    if ((rc = wk__find_mat(m, NAME("ffn_gate_inp.weight"), E, c->n_expert, 1, use, &e->gate_inp, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("ffn_gate_exps.weight"), E, c->n_ff_exp, c->n_expert, use_exps, &e->gate_exps, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("ffn_up_exps.weight"), E, c->n_ff_exp, c->n_expert, use_exps, &e->up_exps, err)) < 0 ||
        (rc = wk__find_mat(m, NAME("ffn_down_exps.weight"), c->n_ff_exp, E, c->n_expert, use_exps, &e->down_exps, err)) < 0)
        return rc;
    if (c->expert_bias && (rc = wk__find_vec(m, NAME("exp_probs_b.bias"), c->n_expert, &e->probs_b, err)) < 0)
        return rc;
    if (c->n_ff_shexp &&
        ((rc = wk__find_mat(m, NAME("ffn_gate_shexp.weight"), E, c->n_ff_shexp, 1, use, &L->sh_gate, err)) < 0 ||
         (rc = wk__find_mat(m, NAME("ffn_up_shexp.weight"), E, c->n_ff_shexp, 1, use, &L->sh_up, err)) < 0 ||
         (rc = wk__find_mat(m, NAME("ffn_down_shexp.weight"), c->n_ff_shexp, E, 1, use, &L->sh_down, err)) < 0 ||
         (c->shexp_gate && (rc = wk__find_vec(m, NAME("ffn_gate_inp_shexp.weight"), E, &L->sh_gate_inp, err)) < 0)))
        return rc;
#undef NAME
    return 0;
}

int wk__check_nextn(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const int64_t E = c->n_embd;
    for (int64_t l = c->n_layer; l < c->n_layer + c->n_nextn; l++) {
        char n[96];
        wk_tensor_t t;
        wk_vec_t v;
        int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), n)
        if ((rc = wk__find_vec(m, NAME("attn_norm.weight"), E, &v, err)) < 0 ||
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

int wk__place_io(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    wk_backend_t *b = m->be;
    const int first = m->lb == 0, last = m->le == c->n_layer;
    /* A tied head on a stage that also embeds reads the same copy. */
    const int share_head = c->tied_output && first;
    int rc;
    if (first && (rc = b->op->add(b, &w->tok_embd, share_head ? WK_ADD_PIECES : WK_ADD_TABLE, err)) < 0)
        return rc;
    if (last && ((rc = b->op->add_vec(b, &w->output_norm, c->n_embd, err)) < 0 ||
                 (!share_head && (rc = b->op->add(b, &w->output, WK_ADD_PIECES, err)) < 0)))
        return rc;
    return 0;
}

/* A layer's routed experts' biases (where the file has them), and its three expert
 * tensors, registered with the backend. */
static int add_expert_biases(wk_model_t *m, wk_moe_t *e, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    wk_backend_t *b = m->be;
    int rc;
    if (!c->expert_biases)
        return 0;
    return (rc = b->op->add_vec(b, &e->gate_b, c->n_expert * c->n_ff_exp, err)) < 0 ||
                   (rc = b->op->add_vec(b, &e->up_b, c->n_expert * c->n_ff_exp, err)) < 0 ||
                   (rc = b->op->add_vec(b, &e->down_b, c->n_expert * c->n_embd, err)) < 0
               ? rc
               : 0;
}

static int add_experts(wk_model_t *m, wk_moe_t *e, bl_err_t *err)
{
    wk_backend_t *b = m->be;
    int rc;
    return (rc = b->op->add(b, &e->gate_exps, WK_ADD_EXPERTS, err)) < 0 ||
                   (rc = b->op->add(b, &e->up_exps, WK_ADD_EXPERTS, err)) < 0 ||
                   (rc = b->op->add(b, &e->down_exps, WK_ADD_EXPERTS, err)) < 0
               ? rc
               : 0;
}

int wk__place_ffn(wk_model_t *m, int64_t l, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    layer_t *L = &m->w.layers[l];
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    wk_moe_t *e = &L->moe;
    int rc;
    if ((rc = op->add_vec(b, &L->ffn_norm, c->n_embd, err)) < 0)
        return rc;
    if (!wk__layer_moe(m, l))
        return (rc = op->add(b, &L->ffn_gate, 0, err)) < 0 || (rc = op->add(b, &L->ffn_up, 0, err)) < 0 ||
                       (rc = op->add(b, &L->ffn_down, 0, err)) < 0
                   ? rc
                   : 0;
    if ((rc = op->add(b, &e->gate_inp, 0, err)) < 0 ||
        (c->expert_bias && (rc = op->add_vec(b, &e->probs_b, c->n_expert, err)) < 0) ||
        (c->router_bias && (rc = op->add_vec(b, &e->router_b, c->n_expert, err)) < 0) ||
        /* the biases also beside experts kept in host RAM: a card computes such a
         * layer's experts for a long prompt (the offload) and from its slots */
        ((wk__layer_local_experts(m, l) || wk__layer_remote(m, l)) && (rc = add_expert_biases(m, e, err)) < 0) ||
        (wk__layer_local_experts(m, l) && (rc = add_experts(m, e, err)) < 0))
        return rc;
    if (c->n_ff_shexp && ((rc = op->add(b, &L->sh_gate, 0, err)) < 0 || (rc = op->add(b, &L->sh_up, 0, err)) < 0 ||
                          (rc = op->add(b, &L->sh_down, 0, err)) < 0 ||
                          (c->shexp_gate && (rc = op->add_vec(b, &L->sh_gate_inp, c->n_embd, err)) < 0)))
        return rc;
    /* a tier's layers are its own: the card copies only what is in host RAM */
    if (wk__layer_remote(m, l) && m->host[l] == WK_EXPERTS_HOST_RAM && (rc = op->add_host(b, l, e, err)) < 0)
        return rc;
    return 0;
}

/* A model loaded for its experts only (a hosttier's or an expert tier's): the routed
 * experts of its layers and their biases are all the backend holds; no step runs. */
static int place_experts_only(wk_model_t *m, bl_err_t *err)
{
    int rc;
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        wk_moe_t *e = &m->w.layers[l].moe;
        if (wk__layer_local_experts(m, l) &&
            ((rc = add_expert_biases(m, e, err)) < 0 || (rc = add_experts(m, e, err)) < 0))
            return rc;
    }
    return m->be->op->commit(m->be, err);
}

int wk__place_done(wk_model_t *m, int64_t q_width, int64_t k_width, int64_t att_width, int64_t extra_width,
                   bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    int rc;
    if ((rc = op->commit(b, err)) < 0)
        return rc;
    if (m->le == c->n_layer && c->tied_output && m->lb == 0)
        w->output.d = w->tok_embd.d;
    run_state_t *s = &m->s;
    const size_t B = (size_t)m->opts.n_batch, f = sizeof(float), E = (size_t)c->n_embd;
    s->x = op->alloc(b, f * B * E);
    s->xn = op->alloc(b, f * B * E);
    s->q = op->alloc(b, f * B * (size_t)q_width);
    s->k = op->alloc(b, f * B * (size_t)k_width);
    s->v = op->alloc(b, f * B * (size_t)k_width);
    s->att = op->alloc(b, f * B * (size_t)att_width);
    s->extra = extra_width > 0 ? op->alloc(b, f * B * (size_t)extra_width) : NULL;
    s->segs = malloc(sizeof(wk_seg_t) * B);
    if (!s->x || !s->xn || !s->q || !s->k || !s->v || !s->att || !s->segs || (extra_width > 0 && !s->extra))
        return bl_err_set(err, BL_ENOMEM, "out of memory for the run state (n_batch %zu) on %s", B,
                          op->name(b));
    return 0;
}

int wk__forward_ffn(wk_model_t *m, int64_t l, int64_t n, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const layer_t *L = &m->w.layers[l];
    const run_state_t *s = &m->s;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    int rc = op->rms_norm(b, "ffn_norm", s->xn, s->x, L->ffn_norm.p, n, c->n_embd, c->eps, err);
    if (rc < 0)
        return rc;
    if (!wk__layer_moe(m, l))
        return op->ffn(b, &L->ffn_gate, &L->ffn_up, &L->ffn_down, NULL, s->xn, n, s->x, err);
    if ((rc = op->moe(b, l, &L->moe, wk__layer_remote(m, l) ? &m->remote : NULL, s->xn, n, s->x, err)) == 0 &&
        c->n_ff_shexp)
        rc = op->ffn(b, &L->sh_gate, &L->sh_up, &L->sh_down, c->shexp_gate ? L->sh_gate_inp.p : NULL, s->xn, n,
                     s->x, err);
    return rc;
}

// --- the NextN layer's pass (docs/models.md, "NextN") -----------------------------------------

/* One sequence's part of the NextN layer's pass. */
struct wk__mtp_seg {
    wk_kv_t *kv;
    int kept;         /* it reads the cache's kept row first (at the position before the step's) */
    int64_t src, cnt; /* then the step's rows src.. (cnt of them) */
    int64_t keep;     /* the step's row the cache keeps for the next step, always one */
    int64_t keep_pos;
    int32_t keep_tok; /* the token the layer read after it (-1: none yet) */
};

int wk__map_mtp(wk_model_t *m, bl_err_t *err)
{
    if (m->mtp_l < 0)
        return 0;
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    const int64_t E = c->n_embd;
    char n[96];
    wk_tensor_t eh;
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%lld.nextn.%s", (long long)m->mtp_l, s), n)
    if ((rc = wk__find_mat(m, NAME("eh_proj.weight"), 2 * E, E, 1, 0, &eh, err)) < 0 ||
        (rc = wk__find_vec(m, NAME("enorm.weight"), E, &w->mtp_enorm, err)) < 0 ||
        (rc = wk__find_vec(m, NAME("hnorm.weight"), E, &w->mtp_hnorm, err)) < 0 ||
        (rc = wk__find_vec(m, NAME("shared_head_norm.weight"), E, &w->mtp_head_norm, err)) < 0)
        return rc;
    w->mtp_head = w->output; /* the layer's own head and embedding where the file has them */
    if (bl_gguf_find_tensor(m->g, NAME("shared_head_head.weight")) &&
        (rc = wk__find_mat(m, n, E, c->n_vocab, 1, 1, &w->mtp_head, err)) < 0)
        return rc;
    w->mtp_head.h.act_q8 = 1; /* a head: one row a sequence, as the model's */
    w->mtp_embd = w->tok_embd;
    if (bl_gguf_find_tensor(m->g, NAME("embed_tokens.weight")) &&
        (rc = wk__find_mat(m, n, E, c->n_vocab, 1, 1, &w->mtp_embd, err)) < 0)
        return rc;
#undef NAME
    /* eh_proj times [enorm(embedding); hnorm(hidden state)] is the sum of its two
     * column halves' products: each half copied out as a matrix of its own (n_embd
     * rows of n_embd columns), which any backend places as it places the others */
    size_t half;
    if ((rc = bl_row_bytes(eh.h.type, E, &half, NULL)) < 0 || 2 * half != eh.h.row_bytes)
        return bl_err_set(err, BL_ENOTSUP, "%s: blk.%lld.nextn.eh_proj.weight's rows do not split into two whole "
                          "halves of %lld columns in its type", m->path, (long long)m->mtp_l, (long long)E);
    wk_tensor_t *const out[2] = {&w->mtp_eh_e, &w->mtp_eh_h};
    for (int k = 0; k < 2; k++) {
        uint8_t *p = malloc(half * (size_t)E);
        if ((rc = wk__own(m, p, err)) < 0)
            return rc;
        for (int64_t r = 0; r < E; r++)
            memcpy(p + (size_t)r * half, (const uint8_t *)eh.h.data + (size_t)r * eh.h.row_bytes + (size_t)k * half,
                   half);
        out[k]->d = NULL;
        if ((rc = kcpu_mat_init(&out[k]->h, p, eh.h.type, E, E, err)) < 0)
            return rc;
    }
    return 0;
}

int wk__place_mtp(wk_model_t *m, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    weights_t *w = &m->w;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t E = c->n_embd;
    int rc;
    if (!op->copy_rows)
        return bl_err_set(err, BL_ENOTSUP, "%s: the %s backend runs no NextN layer", m->path, op->name(b));
    if ((rc = op->add_vec(b, &w->mtp_enorm, E, err)) < 0 || (rc = op->add_vec(b, &w->mtp_hnorm, E, err)) < 0 ||
        (rc = op->add_vec(b, &w->mtp_head_norm, E, err)) < 0 || (rc = op->add(b, &w->mtp_eh_e, 0, err)) < 0 ||
        (rc = op->add(b, &w->mtp_eh_h, 0, err)) < 0)
        return rc;
    /* the model's head and embedding are placed already where this stage has them */
    if (w->mtp_head.h.data != w->output.h.data && (rc = op->add(b, &w->mtp_head, WK_ADD_PIECES, err)) < 0)
        return rc;
    if ((w->mtp_embd.h.data != w->tok_embd.h.data || m->lb > 0) &&
        (rc = op->add(b, &w->mtp_embd, WK_ADD_TABLE, err)) < 0)
        return rc;
    const size_t B = (size_t)m->opts.n_batch;
    m->mtp_rows = calloc(B, sizeof *m->mtp_rows);
    m->mtp_tok = calloc(B, sizeof *m->mtp_tok);
    m->mtp_segs = calloc(B, sizeof *m->mtp_segs);
    m->mtp_plan = calloc(B, sizeof *m->mtp_plan);
    m->mtp_e = op->alloc(b, sizeof(float) * B * (size_t)E);
    m->mtp_h = op->alloc(b, sizeof(float) * B * (size_t)E);
    if (!m->mtp_rows || !m->mtp_tok || !m->mtp_segs || !m->mtp_plan || !m->mtp_e || !m->mtp_h)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the NextN layer's scratch (n_batch %zu)", B);
    return 0;
}

int wk__mtp_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const weights_t *w = &m->w;
    const run_state_t *s = &m->s;
    wk_backend_t *b = m->be;
    const wk_backend_ops_t *op = b->op;
    const int64_t E = c->n_embd, V = c->n_vocab, B = m->opts.n_batch;
    for (int64_t j = 0; j < st->nseg; j++) {
        const wk_seg_t *g = &st->seg[j];
        if (!g->tokens)
            return bl_err_set(err, BL_EINVAL, "the NextN layer needs the step's tokens (sequence %lld has none)",
                              (long long)j);
        for (int64_t i = 0; i < g->n; i++)
            if (g->tokens[i] < 0 || g->tokens[i] >= V)
                return bl_err_set(err, BL_EINVAL, "sequence %lld: token %lld is %d, outside 0..%lld", (long long)j,
                                  (long long)i, g->tokens[i], (long long)(V - 1));
        if (!g->kv->mtp_h && !(g->kv->mtp_h = malloc(sizeof(float) * (size_t)E)))
            return bl_err_set(err, BL_ENOMEM, "out of memory for the NextN layer's row of a cache");
    }
    /* The plan: each sequence reads its kept row when the layer has not read this
     * step's first token after it, then its rows while the next row's token is the
     * row's most likely one; the row where it is not, or the last row, when it has
     * logits, reads its most likely token and proposes. A last row without logits
     * (a prompt chunk's) is kept for the next step, which has the token after it. */
    struct wk__mtp_seg *plan = m->mtp_plan;
    wk_seg_t *ms = m->mtp_segs;
    int64_t nm = 0, nms = 0, n_out = 0, n_prop = 0;
    for (int64_t j = 0; j < st->nseg; j++) {
        const wk_seg_t *g = &st->seg[j];
        wk_kv_t *kv = g->kv;
        const int64_t first_out = g->n - g->n_out;
        /* a step of n_batch rows has no room for a kept row: its fix waits */
        const int kept = kv->mtp_kept && kv->mtp_pos == g->pos - 1 && kv->mtp_tok != g->tokens[0] &&
                         nm + 1 + g->n <= B;
        int32_t *tok = m->mtp_tok + nm + kept;
        int64_t cnt = 0, prop = -1;
        for (int64_t i = 0; i < g->n; i++) {
            const int out = i >= first_out;
            const int32_t am = out ? (int32_t)kcpu_row_top1(st->logits + (n_out + i - first_out) * V, V, NULL) : -1;
            if (i + 1 < g->n && (!out || am == g->tokens[i + 1])) {
                tok[cnt++] = g->tokens[i + 1];
                continue;
            }
            if (out) {
                tok[cnt++] = am;
                prop = i;
            }
            break;
        }
        for (int64_t k = 0; k < g->n_out; k++)
            m->mtp_rows[n_out + k] = (wk_mtp_row_t){.in = -1, .tok = -1, .p = 0};
        if (prop >= 0)
            m->mtp_rows[n_out + prop - first_out].in = tok[cnt - 1];
        n_out += g->n_out;
        plan[j] = (struct wk__mtp_seg){.kv = kv, .kept = kept, .src = g->row0, .cnt = cnt,
                                       .keep = g->row0 + (prop >= 0 ? prop : g->n - 1),
                                       .keep_pos = g->pos + (prop >= 0 ? prop : g->n - 1),
                                       .keep_tok = prop >= 0 ? tok[cnt - 1] : -1};
        if (kept + cnt == 0)
            continue;
        if (kept)
            m->mtp_tok[nm] = g->tokens[0];
        ms[nms++] = (wk_seg_t){.kv = kv, .tokens = m->mtp_tok + nm, .row0 = nm, .n = kept + cnt,
                               .pos = g->pos - kept, .n_out = prop >= 0};
        nm += kept + cnt;
        n_prop += prop >= 0;
    }
    if (n_prop > m->mtp_logits_cap) {
        float *l = realloc(m->mtp_logits, sizeof(float) * (size_t)(n_prop * V));
        if (!l)
            return bl_err_set(err, BL_ENOMEM, "out of memory for %lld rows of the NextN layer's logits",
                              (long long)n_prop);
        m->mtp_logits = l;
        m->mtp_logits_cap = n_prop;
    }
    const wk_step_t ps = {.seg = ms, .nseg = nms, .n = nm, .logits = m->mtp_logits, .mtp = 1};
    int rc = op->begin(b, &ps, s->x, err);
    if (rc < 0)
        return rc;
    /* the rows it reads: the model's final-normed hidden states */
    rc = op->rms_norm(b, "mtp_hidden", s->xn, s->x, w->output_norm.p, st->n, E, c->eps, err);
    for (int64_t j = 0, at = 0; rc == 0 && j < st->nseg; j++) {
        const struct wk__mtp_seg *q = &plan[j];
        if (q->kept && (rc = op->copy_rows(b, m->mtp_h + at * E, q->kv->mtp_h, 1, E, err)) < 0)
            break;
        if (q->cnt && (rc = op->copy_rows(b, m->mtp_h + (at + q->kept) * E, s->xn + q->src * E, q->cnt, E, err)) < 0)
            break;
        at += q->kept + q->cnt;
    }
    for (int64_t j = 0; rc == 0 && j < st->nseg; j++) {
        const struct wk__mtp_seg *q = &plan[j];
        if ((rc = op->copy_rows(b, q->kv->mtp_h, s->xn + q->keep * E, 1, E, err)) < 0)
            break;
        q->kv->mtp_pos = q->keep_pos;
        q->kv->mtp_tok = q->keep_tok;
        q->kv->mtp_kept = 1;
    }
    /* x = eh_proj [enorm(embedding of the token after); hnorm(hidden state)], the
     * layer's block, its head for the rows that propose */
    if (rc == 0 && nm > 0)
        rc = op->embed(b, &w->mtp_embd, m->mtp_e, err);
    if (rc == 0 && nm > 0)
        rc = op->rms_norm(b, "mtp_enorm", m->mtp_e, m->mtp_e, w->mtp_enorm.p, nm, E, c->eps, err);
    if (rc == 0 && nm > 0)
        rc = op->rms_norm(b, "mtp_hnorm", m->mtp_h, m->mtp_h, w->mtp_hnorm.p, nm, E, c->eps, err);
    if (rc == 0 && nm > 0)
        rc = op->matmul(b, "mtp_eh_proj", &w->mtp_eh_e, NULL, m->mtp_e, nm, s->x, 0, err);
    if (rc == 0 && nm > 0)
        rc = op->matmul(b, "mtp_eh_proj", &w->mtp_eh_h, NULL, m->mtp_h, nm, s->x, 1, err);
    if (rc == 0 && nm > 0)
        rc = m->fam->block(m, m->mtp_l, nm, err);
    if (rc == 0 && n_prop > 0)
        rc = op->head(b, w->mtp_head_norm.p, c->eps, &w->mtp_head, s->x, err);
    if ((rc = op->end(b, &ps, rc, s->x, err)) < 0)
        return rc;
    for (int64_t k = 0, at = 0; k < n_out; k++)
        if (m->mtp_rows[k].in >= 0) {
            m->mtp_rows[k].tok = (int32_t)kcpu_row_top1(m->mtp_logits + at * V, V, &m->mtp_rows[k].p);
            at++;
        }
    m->n_mtp_rows = n_out;
    return 0;
}

int64_t wk_model_mtp(const wk_model_t *m, const wk_mtp_row_t **rows, const float **logits)
{
    *rows = m->mtp_rows;
    *logits = m->mtp_logits;
    return m->mtp_l >= 0 ? m->n_mtp_rows : 0;
}

/* Where each stage layer keeps its part of a cache: K/V rows (attention layers) or a
 * recurrent state (a hybrid's DeltaNet layers). */
static int layer_caches(wk_model_t *m, const bl_arch_t *a, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    const int64_t held = wk__layers_held(m);
    m->kv_index = malloc(sizeof(int64_t) * (size_t)held);
    m->rec_index = malloc(sizeof(int64_t) * (size_t)held);
    if (!m->kv_index || !m->rec_index)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %lld layers", (long long)c->n_layer);
    m->n_kv_layers = m->n_rec_layers = 0;
    for (int64_t l = 0; l < held; l++) { /* the NextN layer's K/V after the stage's */
        m->kv_index[l] = m->rec_index[l] = -1;
        if (!wk__in_stage(m, l))
            continue;
        if (l < c->n_layer && bl_arch_layer_recurrent(a, l))
            m->rec_index[l] = m->n_rec_layers++;
        else
            m->kv_index[l] = m->n_kv_layers++;
    }
    m->rec_floats = (size_t)bl_arch_rec_floats(a);
    return 0;
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
    bl_arch_t arch;
    if ((rc = bl_gguf_open(&m->g, path, err)) < 0 || (rc = read_config(m, &arch, err)) < 0)
        goto fail;
    if (!(m->fam = family_of(m->cfg.arch))) {
        rc = bl_err_set(err, BL_ENOTSUP, "%s: no forward pass for architecture %s", m->path, m->cfg.arch);
        goto fail;
    }
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
    m->mtp_l = -1;
    if (m->opts.mtp && m->opts.experts != WK_EXPERTS_ONLY && m->le == m->cfg.n_layer) {
        if (!bl_arch_nextn_runs(&arch) || !m->fam->block) {
            rc = bl_err_set(err, BL_ENOTSUP, "%s: %s", m->path, m->cfg.n_nextn < 1
                                ? "the file has no NextN (multi-token prediction) layer"
                                : "the NextN layer of this architecture does not run yet (glm4moe's and "
                                  "qwen35moe's do)");
            goto fail;
        }
        if (m->opts.device >= 0) {
            rc = bl_err_set(err, BL_ENOTSUP, "%s: the NextN layer runs on the CPU only for now, not on CUDA device %d",
                            m->path, m->opts.device);
            goto fail;
        }
        m->mtp_l = m->cfg.n_layer;
    }
    if ((rc = layer_caches(m, &arch, err)) < 0)
        goto fail;
    if (m->opts.device < 0) /* on a device the weights go to the card instead */
        weights_arena(m);
    m->host = malloc((size_t)wk__layers_held(m));
    if (!m->host) {
        rc = bl_err_set(err, BL_ENOMEM, "out of memory for %lld layers", (long long)m->cfg.n_layer);
        goto fail;
    }
    for (int64_t l = 0; l < m->cfg.n_layer; l++)
        m->host[l] = m->opts.experts_host ? m->opts.experts_host[l] : WK_EXPERTS_HOST_RAM;
    if (m->mtp_l >= 0)
        m->host[m->mtp_l] = 0; /* the NextN layer's experts are computed here */
    m->opts.experts_host = NULL; /* the copy is m->host */
    if ((rc = m->fam->map(m, err)) < 0)
        goto fail;
    bl_wmem_copy_many_progress(m->copies, m->n_copies, m->opts.n_threads, m->opts.progress, m->opts.progress_ud);
    free(m->copies);
    m->copies = NULL;
    m->n_copies = m->cap_copies = 0;
    if (m->opts.mlock)
        bl_wmem_lock(m->arena, m->arena_used, m->g);
    if (m->arena_missed)
        BL_LOG(BL_LOG_INFO, "event=weights_copy bytes=%zu mapped=%llu available=%llu reason=\"the rest stays in "
               "the file's mapping: the copy stops at the available memory's margin or its cap\"", m->arena_used,
               (unsigned long long)m->arena_missed, (unsigned long long)bl_mem_available());
    if (m->opts.n_ctx_max <= 0)
        m->opts.n_ctx_max = m->cfg.n_ctx_train;
    if (m->opts.n_ctx_max > BL_ARCH_MAX_CTX) {
        rc = bl_err_set(err, BL_ERANGE, "n_ctx_max %lld exceeds %d", (long long)m->opts.n_ctx_max, BL_ARCH_MAX_CTX);
        goto fail;
    }
    if (m->opts.act_terms != 1 && m->opts.act_terms != 2) {
        rc = bl_err_set(err, BL_EINVAL, "act_terms %d is not 1 or 2", m->opts.act_terms);
        goto fail;
    }
    if (m->opts.poll < 0 || m->opts.poll > 100) {
        rc = bl_err_set(err, BL_EINVAL, "poll %d is outside 0..100", m->opts.poll);
        goto fail;
    }
    if (m->opts.n_threads_batch < 0 || m->opts.n_threads_batch > 256) {
        rc = bl_err_set(err, BL_EINVAL, "n_threads_batch %d is outside 0..256", m->opts.n_threads_batch);
        goto fail;
    }
    wk_backend_cfg_t bc = {.path = m->path, .c = &m->cfg, .o = &m->opts, .lb = m->lb, .le = m->le};
    for (int64_t l = m->lb; l < m->le; l++)
        bc.remote |= m->cfg.moe && wk__layer_remote(m, l);
    /* a CPU stage counts its routing; a card its host layers' (for residency) */
    if (m->cfg.moe && m->opts.experts != WK_EXPERTS_ONLY && (m->opts.device < 0 || bc.remote) &&
        (rc = bl_heat_create(&m->heat, m->cfg.n_layer, m->cfg.n_expert, WK_HEAT_HALF_LIFE, err)) < 0)
        goto fail;
    bc.heat = m->heat;
    rc = m->opts.device >= 0 ? wk__cuda_backend(&m->be, &bc, err) : wk__cpu_backend(&m->be, &bc, err);
    if (rc < 0 || (rc = m->opts.experts == WK_EXPERTS_ONLY ? place_experts_only(m, err) : m->fam->place(m, err)) < 0)
        goto fail;
    *out = m;
    return 0;
fail:
    wk_model_free(m);
    return rc;
}

const bl_heat_t *wk_model_heat(const wk_model_t *m) { return m->heat; }

void wk_model_resid_stats(const wk_model_t *m, wk_resid_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (m->be->op->resid)
        m->be->op->resid(m->be, out);
}

void wk_model_resid_layer(const wk_model_t *m, int64_t l, uint64_t *selections, uint64_t *hits)
{
    *selections = *hits = 0;
    if (m->be->op->resid_layer && l >= m->lb && l < m->le)
        m->be->op->resid_layer(m->be, l, selections, hits);
}

void wk_model_free(wk_model_t *m)
{
    if (!m)
        return;
    if (m->be)
        m->be->op->destroy(m->be); /* frees the run state's activations */
    free(m->s.segs);
    free(m->mtp_rows);
    free(m->mtp_logits);
    free(m->mtp_tok);
    free(m->mtp_segs);
    free(m->mtp_plan);
    free(m->host);
    free(m->kv_index);
    free(m->rec_index);
    free(m->w.layers);
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    if (m->arena)
        munmap(m->arena, m->arena_len);
    free(m->copies);
    bl_heat_free(m->heat);
    bl_gguf_close(m->g);
    free(m);
}

const wk_config_t *wk_model_config(const wk_model_t *m) { return &m->cfg; }
const bl_gguf_t *wk_model_gguf(const wk_model_t *m) { return m->g; }
const char *wk_model_kernels(const wk_model_t *m) { return m->be->op->name(m->be); }

// --- KV cache ----------------------------------------------------------------------------------

/* The fields of a cache of n_ctx positions of type for m, without memory. */
static int kv_init(wk_kv_t *kv, const wk_model_t *m, int64_t n_ctx, uint32_t type, bl_err_t *err)
{
    const wk_config_t *c = &m->cfg;
    if (n_ctx < 1 || n_ctx > m->opts.n_ctx_max)
        return bl_err_set(err, BL_ERANGE, "KV cache of %lld positions is outside 1..%lld",
                          (long long)n_ctx, (long long)m->opts.n_ctx_max);
    if (type != WK_KV_F32 && type != WK_KV_F16 && type != WK_KV_Q8_0)
        return bl_err_set(err, BL_EINVAL, "KV cache type %u is not f32, f16 or q8_0", type);
    if (type == WK_KV_Q8_0 && c->head_dim % BL_QK != 0)
        return bl_err_set(err, BL_EINVAL, "a q8_0 KV cache needs head_dim %lld to be a multiple of %d",
                          (long long)c->head_dim, BL_QK);
    int rc = bl_row_bytes(type, c->n_head_kv * c->head_dim, &kv->row_bytes, err);
    if (rc < 0)
        return rc;
    kv->model = m;
    kv->n_layer = m->n_kv_layers;
    kv->n_ctx = kv->stride = n_ctx;
    kv->type = type;
    kv->n_planes = c->kv_planes;
    /* (n_layer <= 4096) * 2 * (n_ctx <= 2^24) * row_bytes may pass 2^63 only for
     * absurd requests; checked rather than assumed. */
    const double want = (double)kv->n_layer * (double)kv->n_planes * (double)n_ctx * (double)kv->row_bytes;
    if (want > (double)(SIZE_MAX / 2))
        return bl_err_set(err, BL_ERANGE, "KV cache of %lld positions is too large", (long long)n_ctx);
    return 0;
}

/* A hybrid cache's recurrent state, in the backend's memory (where its deltanet op
 * reads it), zero until a sequence's first step sets it. */
static int rec_alloc(wk_kv_t *kv, const wk_model_t *m, bl_err_t *err)
{
    kv->rec = NULL;
    if (m->n_rec_layers == 0)
        return 0;
    return m->be->op->rec_alloc(m->be, (size_t)m->n_rec_layers * m->rec_floats * sizeof(float), &kv->rec, err);
}

static void rec_free(wk_kv_t *kv)
{
    if (kv->rec)
        kv->model->be->op->rec_free(kv->model->be, kv->rec);
    kv->rec = NULL;
}

/* The bytes of a saved state's recurrent part (after its rows). */
static size_t rec_bytes(const wk_kv_t *kv)
{
    return (size_t)kv->model->n_rec_layers * kv->model->rec_floats * sizeof(float);
}

static int rec_copy(wk_kv_t *kv, void *host, int to_host, bl_err_t *err)
{
    return kv->model->be->op->rec_copy(kv->model->be, kv->rec, host, rec_bytes(kv), to_host, err);
}

int wk_kv_create(wk_kv_t **out, const wk_model_t *m, int64_t n_ctx, uint32_t type, bl_err_t *err)
{
    *out = NULL;
    wk_kv_t *kv = calloc(1, sizeof *kv);
    if (!kv)
        return bl_err_set(err, BL_ENOMEM, "out of memory for a KV cache");
    int rc = kv_init(kv, m, n_ctx, type, err);
    if (rc == 0 && (rc = rec_alloc(kv, m, err)) == 0 && (rc = m->be->op->kv_alloc(m->be, kv, err)) < 0) {
        rec_free(kv);
        free(kv);
        return rc;
    }
    if (rc < 0) {
        free(kv);
        return rc;
    }
    *out = kv;
    return 0;
}

static int64_t chunks_of(int64_t n) { return (n + WK_KV_CHUNK - 1) / WK_KV_CHUNK; }

int wk_kv_pool_create(wk_kv_pool_t **out, const wk_model_t *m, int64_t n_positions, uint32_t type,
                      bl_err_t *err)
{
    *out = NULL;
    const int64_t n_chunks = chunks_of(n_positions);
    wk_kv_pool_t *p = calloc(1, sizeof *p);
    if (!p || !(p->owner = calloc((size_t)(n_chunks > 0 ? n_chunks : 1), sizeof *p->owner))) {
        free(p);
        return bl_err_set(err, BL_ENOMEM, "out of memory for a shared KV cache");
    }
    int rc = n_positions < 1 ? bl_err_set(err, BL_ERANGE, "a shared KV cache of %lld positions",
                                          (long long)n_positions)
                             : kv_init(&p->own, m, n_chunks * WK_KV_CHUNK, type, err);
    if (rc == 0)
        rc = m->be->op->kv_alloc(m->be, &p->own, err);
    if (rc < 0) {
        free(p->owner);
        free(p);
        return rc;
    }
    p->n_chunks = n_chunks;
    *out = p;
    return 0;
}

void wk_kv_pool_free(wk_kv_pool_t *p)
{
    if (!p)
        return;
    p->own.model->be->op->kv_free(p->own.model->be, &p->own);
    free(p->owner);
    free(p);
}

void wk_kv_pool_usage(const wk_kv_pool_t *p, int64_t *used, int64_t *total)
{
    int64_t u = 0;
    for (int64_t i = 0; i < p->n_chunks; i++)
        u += p->owner[i] != NULL;
    *used = u;
    *total = p->n_chunks;
}

void wk_kv_pool_moves(const wk_kv_pool_t *p, int64_t *moves, int64_t *compactions)
{
    *moves = p->n_moves;
    *compactions = p->n_compactions;
}

int wk_kv_create_in(wk_kv_t **out, wk_kv_pool_t *pool, int64_t n_ctx, bl_err_t *err)
{
    *out = NULL;
    if (n_ctx < 1 || n_ctx > pool->own.n_ctx)
        return bl_err_set(err, BL_ERANGE, "a cache of %lld positions in a shared one of %lld",
                          (long long)n_ctx, (long long)pool->own.n_ctx);
    wk_kv_t *kv = calloc(1, sizeof *kv);
    if (!kv)
        return bl_err_set(err, BL_ENOMEM, "out of memory for a KV cache");
    *kv = pool->own;
    kv->n_ctx = n_ctx;
    kv->n_past = 0;
    kv->mtp_h = NULL;
    kv->mtp_kept = 0;
    kv->pool = pool;
    kv->c0 = kv->nc = 0;
    int rc = rec_alloc(kv, kv->model, err);
    if (rc < 0) {
        free(kv);
        return rc;
    }
    *out = kv;
    return 0;
}

/* Points kv at chunk c0 of its pool, holding nc chunks. */
static void kv_place(wk_kv_t *kv, int64_t c0, int64_t nc)
{
    wk_kv_pool_t *p = kv->pool;
    for (int64_t i = kv->c0; i < kv->c0 + kv->nc; i++)
        if (p->owner[i] == kv)
            p->owner[i] = NULL;
    for (int64_t i = c0; i < c0 + nc; i++)
        p->owner[i] = kv;
    kv->c0 = nc ? c0 : 0;
    kv->nc = nc;
    kv->buf = p->own.buf + (size_t)(kv->c0 * WK_KV_CHUNK) * kv->row_bytes;
}

/* Moves kv's positions 0..n_past to begin at chunk c0 (ranges may overlap: pieces
 * no longer than the distance, in the order that reads each before it is
 * written). The chunks' owners are the caller's. */
static int kv_shift(wk_kv_t *kv, int64_t c0, bl_err_t *err)
{
    wk_kv_pool_t *p = kv->pool;
    const int64_t src = kv->c0 * WK_KV_CHUNK, dst = c0 * WK_KV_CHUNK, n = kv->n_past;
    const int64_t d = dst > src ? dst - src : src - dst;
    if (d == 0 || n == 0)
        return 0;
    p->n_moves++;
    wk_backend_t *b = kv->model->be;
    for (int64_t done = 0; done < n;) {
        const int64_t k = n - done < d ? n - done : d;
        /* leftwards from the start, rightwards from the end */
        const int64_t off = dst < src ? done : n - done - k;
        int rc = b->op->kv_move(b, &p->own, dst + off, src + off, k, err);
        if (rc < 0)
            return rc;
        done += k;
    }
    return 0;
}

/* Frees what kv holds past position n (n_past becomes at most n). */
static void kv_shrink(wk_kv_t *kv, int64_t n)
{
    if (!kv->pool)
        return;
    if (kv->n_past > n)
        kv->n_past = n;
    const int64_t need = chunks_of(n);
    if (need < kv->nc)
        kv_place(kv, kv->c0, need);
}

/* Makes kv hold the chunks of n positions: in place when the next ones are free,
 * else in the largest free run (kv's own chunks count as free), else after
 * compacting the pool. BL_ERANGE when the pool has not that many free. */
static int kv_reserve(wk_kv_t *kv, int64_t n, bl_err_t *err)
{
    wk_kv_pool_t *p = kv->pool;
    if (!p)
        return 0;
    const int64_t need = chunks_of(n);
    if (need <= kv->nc) { /* n_past <= n: the caller shrank first */
        if (need < kv->nc)
            kv_place(kv, kv->c0, need);
        return 0;
    }
    int64_t free_n = 0;
    for (int64_t i = 0; i < p->n_chunks; i++)
        free_n += p->owner[i] == NULL || p->owner[i] == kv;
    if (free_n < need)
        return bl_err_set(err, BL_ERANGE, "the shared KV cache is full: %lld positions need %lld "
                          "chunks of %d, %lld of %lld are free", (long long)n, (long long)need,
                          WK_KV_CHUNK, (long long)(free_n - kv->nc), (long long)p->n_chunks);
    /* in place */
    int64_t e = kv->nc ? kv->c0 + kv->nc : 0, s = kv->nc ? kv->c0 : 0;
    while (e < p->n_chunks && e - s < need && p->owner[e] == NULL)
        e++;
    if (e - s >= need) {
        kv_place(kv, s, need);
        return 0;
    }
    /* the largest run of chunks free or kv's */
    int64_t best = -1, best_len = 0;
    for (int64_t i = 0; i < p->n_chunks;) {
        if (p->owner[i] && p->owner[i] != kv) {
            i++;
            continue;
        }
        int64_t j = i;
        while (j < p->n_chunks && (p->owner[j] == NULL || p->owner[j] == kv))
            j++;
        if (j - i > best_len)
            best = i, best_len = j - i;
        i = j;
    }
    int rc;
    if (best_len >= need) {
        /* after another cache, the middle of the run leaves that one room to grow */
        int64_t at = best > 0 ? best + (best_len - need) / 2 : best;
        if ((rc = kv_shift(kv, at, err)) < 0)
            return rc;
        kv_place(kv, at, need);
        return 0;
    }
    /* compaction: the others packed from chunk 0 in their order, kv last; kv's own
     * positions wait in host memory meanwhile */
    p->n_compactions++;
    wk_backend_t *b = kv->model->be;
    void *tmp = NULL;
    const int64_t keep = kv->n_past;
    if (keep > 0) {
        if ((rc = b->op->state_alloc(b, wk_kv_state_bytes(kv, keep), &tmp, err)) < 0 ||
            (rc = b->op->kv_copy(b, kv, tmp, keep, keep, 1, err)) < 0) {
            if (tmp)
                b->op->state_free(b, tmp);
            return rc;
        }
    }
    kv_place(kv, 0, 0);
    kv->n_past = 0;
    int64_t at = 0;
    rc = 0;
    for (int64_t i = 0; rc == 0 && i < p->n_chunks;) {
        wk_kv_t *o = p->owner[i];
        if (!o) {
            i++;
            continue;
        }
        const int64_t onc = o->nc;
        if (o->c0 != at) {
            rc = kv_shift(o, at, err);
            if (rc == 0)
                kv_place(o, at, onc);
        }
        at += onc;
        i = at > i + onc ? at : i + onc;
    }
    if (rc == 0) {
        kv_place(kv, at, need);
        if (keep > 0 && (rc = b->op->kv_copy(b, kv, tmp, keep, keep, 0, err)) == 0)
            kv->n_past = keep;
    }
    if (tmp)
        b->op->state_free(b, tmp);
    return rc;
}

/* Whether the shared caches of a step's n sequences have the chunks for their ends,
 * counting the chunks they hold now as theirs: checked before any rewind gives chunks
 * back, so that a step refused for room changes no cache. BL_ERANGE naming the
 * shortfall. */
static int kv_room(const wk_seq_t *q, int64_t n, bl_err_t *err)
{
    for (int64_t i = 0; i < n; i++) {
        wk_kv_pool_t *p = q[i].kv->pool;
        int first = 1;
        for (int64_t j = 0; j < i && first; j++)
            first = q[j].kv->pool != p;
        if (!p || !first)
            continue;
        int64_t need = 0, have = 0;
        for (int64_t j = i; j < n; j++)
            if (q[j].kv->pool == p) { /* a cache is in a step once (the caller checks) */
                need += chunks_of(q[j].pos + q[j].n);
                have += q[j].kv->nc;
            }
        for (int64_t c = 0; c < p->n_chunks; c++)
            have += p->owner[c] == NULL;
        if (need > have)
            return bl_err_set(err, BL_ERANGE, "the shared KV cache is full: the step's sequences need %lld "
                              "chunks of %d, %lld of %lld are free or theirs", (long long)need, WK_KV_CHUNK,
                              (long long)have, (long long)p->n_chunks);
    }
    return 0;
}

void wk_kv_clear(wk_kv_t *kv)
{
    kv->n_past = 0;
    kv->mtp_kept = 0;
    kv_shrink(kv, 0);
}

void wk_kv_free(wk_kv_t *kv)
{
    if (!kv)
        return;
    if (kv->pool)
        kv_place(kv, 0, 0);
    else
        kv->model->be->op->kv_free(kv->model->be, kv);
    rec_free(kv);
    free(kv->mtp_h);
    free(kv);
}

int64_t wk_kv_n_past(const wk_kv_t *kv) { return kv->n_past; }
size_t wk_kv_row_bytes(const wk_kv_t *kv) { return kv->row_bytes; }
int wk_kv_planes(const wk_kv_t *kv) { return kv->n_planes; }
int64_t wk_kv_layers(const wk_kv_t *kv) { return kv->n_layer; }

/* The rows of positions 0..n, then a hybrid's recurrent state. */
static size_t rows_bytes(const wk_kv_t *kv, int64_t n)
{
    return (size_t)kv->n_layer * (size_t)kv->n_planes * (size_t)(n > 0 ? n : 0) * kv->row_bytes;
}

size_t wk_kv_state_bytes(const wk_kv_t *kv, int64_t n)
{
    return rows_bytes(kv, n) + (n > 0 ? rec_bytes(kv) : 0);
}

int wk_kv_state_alloc(const wk_model_t *m, size_t nbytes, void **out, bl_err_t *err)
{
    *out = NULL;
    return m->be->op->state_alloc(m->be, nbytes, out, err);
}

void wk_kv_state_free(const wk_model_t *m, void *p)
{
    if (p)
        m->be->op->state_free(m->be, p);
}

int wk_kv_save(wk_kv_t *kv, int64_t n, void *dst, bl_err_t *err)
{
    if (n < 1 || n > kv->n_past)
        return bl_err_set(err, BL_EINVAL, "saving %lld positions of a KV cache that holds %lld",
                          (long long)n, (long long)kv->n_past);
    if (kv->rec && n != kv->n_past)
        return bl_err_set(err, BL_EINVAL, "saving %lld positions of a cache with a recurrent state, which holds "
                          "only its last position's (%lld)", (long long)n, (long long)kv->n_past);
    int rc = kv->model->be->op->kv_copy(kv->model->be, kv, dst, n, n, 1, err);
    if (rc == 0 && kv->rec)
        rc = rec_copy(kv, (uint8_t *)dst + rows_bytes(kv, n), 1, err);
    return rc;
}

int wk_kv_load(wk_kv_t *kv, int64_t n, const void *src, int64_t n_saved, bl_err_t *err)
{
    if (n < 1 || n > kv->n_ctx || n > n_saved)
        return bl_err_set(err, BL_EINVAL, "loading %lld positions of %lld saved into a KV cache of %lld",
                          (long long)n, (long long)n_saved, (long long)kv->n_ctx);
    if (kv->rec && n != n_saved)
        return bl_err_set(err, BL_EINVAL, "loading %lld of %lld saved positions: a recurrent state is only "
                          "whole", (long long)n, (long long)n_saved);
    kv->n_past = 0;
    kv->mtp_kept = 0; /* another sequence's state */
    kv_shrink(kv, 0);
    int rc = kv_reserve(kv, n, err);
    if (rc < 0)
        return rc;
    rc = kv->model->be->op->kv_copy(kv->model->be, kv, (void *)src, n, n_saved, 0, err);
    if (rc == 0 && kv->rec)
        rc = rec_copy(kv, (uint8_t *)src + rows_bytes(kv, n_saved), 0, err);
    if (rc == 0)
        kv->n_past = n;
    return rc;
}

size_t wk_kv_ckpt_bytes(const wk_kv_t *kv) { return kv->rec ? rec_bytes(kv) : 0; }

int wk_kv_ckpt_save(wk_kv_t *kv, void *dst, bl_err_t *err)
{
    return kv->rec ? rec_copy(kv, dst, 1, err) : 0;
}

int wk_kv_ckpt_load(wk_kv_t *kv, int64_t n, const void *src, bl_err_t *err)
{
    if (n < 1 || n > kv->n_past)
        return bl_err_set(err, BL_EINVAL, "a checkpoint at %lld positions into a cache that holds %lld",
                          (long long)n, (long long)kv->n_past);
    const int rc = kv->rec ? rec_copy(kv, (void *)src, 0, err) : 0;
    if (rc < 0) { /* the state is unknown: nothing in the cache is usable */
        kv_shrink(kv, 0);
        kv->n_past = 0;
        return rc;
    }
    kv_shrink(kv, n);
    kv->n_past = n;
    return 0;
}

// --- steps -------------------------------------------------------------------------------

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
    if (kv->rec && pos != kv->n_past && pos != 0)
        return bl_err_set(err, BL_EINVAL, "sequence %lld: eval at position %lld, but the recurrent state is at "
                          "%lld and cannot be cut back (restore a saved state, or start at 0)", (long long)i,
                          (long long)pos, (long long)kv->n_past);
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
    int any_remote = 0;
    for (int64_t l = m->lb; l < m->le; l++)
        any_remote |= wk__layer_remote(m, l);
    if (any_remote && m->cfg.moe && !m->remote.fn)
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
    const wk_seq_t one = {.kv = kv, .tokens = tokens, .n = n, .pos = pos, .n_out = n_out};
    if ((rc = kv_room(&one, 1, err)) < 0)
        return rc;
    kv_shrink(kv, pos);
    if ((rc = kv_reserve(kv, pos + n, err)) < 0)
        return rc;
    kv->n_past = pos;
    for (int64_t c0 = 0; c0 < n; c0 += m->opts.n_batch) {
        const int64_t cn = n - c0 < m->opts.n_batch ? n - c0 : m->opts.n_batch;
        const int64_t out0 = first_out > c0 ? (first_out - c0 < cn ? first_out - c0 : cn) : 0;
        float *lg = out0 < cn ? logits + (size_t)(c0 + out0 - first_out) * (size_t)m->cfg.n_vocab : NULL;
        const wk_seg_t sg = {.kv = kv, .tokens = tokens + c0, .row0 = 0, .n = cn, .pos = pos + c0,
                             .n_out = cn - out0};
        const wk_step_t st = {.seg = &sg, .nseg = 1, .n = cn, .logits = lg};
        m->n_mtp_rows = 0;
        rc = m->fam->forward(m, &st, err);
        if (rc == 0 && m->mtp_l >= 0)
            rc = wk__mtp_forward(m, &st, err);
        if (rc < 0)
            return rc;
        kv->n_past = pos + c0 + cn;
    }
    return 0;
}

int wk_model_stage(wk_model_t *m, const wk_seq_t *seqs, int64_t n_seqs, const float *x_in,
                   float *x_out, float *logits, bl_err_t *err)
{
    /* The input a card get put in place serves this step only, whatever becomes of
     * it, and the step overwrites the output the last one left for a put. */
    const int64_t got = m->card_in_rows;
    m->card_in_rows = m->card_out_rows = 0;
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
    if (m->lb > 0 && !x_in && got != rows)
        return bl_err_set(err, BL_EINVAL, "a stage from layer %lld needs the hidden state in (%lld rows from the card, "
                          "the step has %lld)", (long long)m->lb, (long long)got, (long long)rows);
    if (m->le < m->cfg.n_layer && !x_out && !m->card_out_n)
        return bl_err_set(err, BL_EINVAL, "a stage to layer %lld needs a buffer for the hidden state out",
                          (long long)m->le);
    if (m->le == m->cfg.n_layer && outs > 0 && !logits)
        return bl_err_set(err, BL_EINVAL, "logits asked for but no buffer given");
    /* A shared cache: room for every sequence first (a refused step changes no cache),
     * then every rewind gives its chunks back before any growth takes. */
    if ((rc = kv_room(seqs, n_seqs, err)) < 0)
        return rc;
    for (int64_t i = 0; i < n_seqs; i++)
        kv_shrink(seqs[i].kv, seqs[i].pos);
    for (int64_t i = 0; i < n_seqs; i++)
        if ((rc = kv_reserve(seqs[i].kv, seqs[i].pos + seqs[i].n, err)) < 0)
            return rc;
    /* The segments live in the run state's scratch: no allocation in the step. */
    wk_seg_t *sg = m->s.segs;
    rows = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        sg[i] = (wk_seg_t){.kv = seqs[i].kv, .tokens = seqs[i].tokens, .row0 = rows, .n = seqs[i].n,
                        .pos = seqs[i].pos, .n_out = seqs[i].n_out};
        rows += seqs[i].n;
    }
    const wk_step_t st = {.seg = sg, .nseg = n_seqs, .n = rows, .x_in = x_in, .x_out = x_out,
                          .logits = logits};
    m->n_mtp_rows = 0;
    rc = m->fam->forward(m, &st, err);
    if (rc == 0 && m->mtp_l >= 0)
        rc = wk__mtp_forward(m, &st, err);
    if (rc < 0)
        return rc;
    for (int64_t i = 0; i < n_seqs; i++)
        seqs[i].kv->n_past = seqs[i].pos + seqs[i].n;
    if (m->card_out_n && !x_out)
        m->card_out_rows = rows; /* in the run state's x until the next step */
    return 0;
}

// --- activations card to card ------------------------------------------------------------

int wk_model_card_export(wk_model_t *m, int n_bufs, wk_card_t *out, bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (!m->be->op->card_export || m->le >= m->cfg.n_layer)
        return bl_err_set(err, BL_ENOTSUP, "%s: card buffers for the next stage need a card stage before the last",
                          m->path);
    if (m->card_out_n)
        return bl_err_set(err, BL_EINVAL, "%s: this stage's card buffers are exported already", m->path);
    if (n_bufs < 1 || n_bufs > WK_CARD_MAX_BUFS)
        return bl_err_set(err, BL_EINVAL, "%s: %d card buffers (1..%d)", m->path, n_bufs, WK_CARD_MAX_BUFS);
    int rc = m->be->op->card_export(m->be, n_bufs, out, err);
    if (rc < 0)
        return rc;
    m->card_out_n = n_bufs;
    m->card_out_rows = 0;
    return 0;
}

int wk_model_card_import(wk_model_t *m, const wk_card_t *in, bl_err_t *err)
{
    if (!m->be->op->card_import || m->lb == 0)
        return bl_err_set(err, BL_ENOTSUP, "%s: card buffers of the previous stage need a card stage after the first",
                          m->path);
    if (m->card_in_n)
        return bl_err_set(err, BL_EINVAL, "%s: the previous stage's card buffers are open already", m->path);
    if (in->n_bufs < 1 || in->n_bufs > WK_CARD_MAX_BUFS)
        return bl_err_set(err, BL_EINVAL, "%s: %d card buffers offered (1..%d)", m->path, in->n_bufs,
                          WK_CARD_MAX_BUFS);
    const size_t need = sizeof(float) * (size_t)m->opts.n_batch * (size_t)m->cfg.n_embd;
    if (in->buf_bytes < need)
        return bl_err_set(err, BL_EINVAL, "%s: card buffers of %zu bytes offered, a step's rows take up to %zu",
                          m->path, in->buf_bytes, need);
    int rc = m->be->op->card_import(m->be, in, err);
    if (rc < 0)
        return rc;
    m->card_in_n = in->n_bufs;
    m->card_in_rows = 0;
    return 0;
}

void wk_model_card_close(wk_model_t *m, int which)
{
    which &= (m->card_out_n ? WK_CARD_OUT : 0) | (m->card_in_n ? WK_CARD_IN : 0);
    if (which && m->be->op->card_close)
        m->be->op->card_close(m->be, which);
    if (which & WK_CARD_OUT)
        m->card_out_n = 0, m->card_out_rows = 0;
    if (which & WK_CARD_IN)
        m->card_in_n = 0, m->card_in_rows = 0;
}

int wk_model_card_put(wk_model_t *m, int k, int64_t n_rows, bl_err_t *err)
{
    if (k < 0 || k >= m->card_out_n)
        return bl_err_set(err, BL_EINVAL, "%s: no exported card buffer %d", m->path, k);
    if (n_rows < 1 || n_rows != m->card_out_rows)
        return bl_err_set(err, BL_EINVAL, "%s: %lld rows to pass on, the last step left %lld on the card", m->path,
                          (long long)n_rows, (long long)m->card_out_rows);
    m->card_out_rows = 0; /* once: the next step writes x again */
    return m->be->op->card_put(m->be, k, m->s.x, sizeof(float) * (size_t)(n_rows * m->cfg.n_embd), err);
}

int wk_model_card_get(wk_model_t *m, int k, int64_t n_rows, bl_err_t *err)
{
    if (k < 0 || k >= m->card_in_n)
        return bl_err_set(err, BL_EINVAL, "%s: no imported card buffer %d", m->path, k);
    if (n_rows < 1 || n_rows > m->opts.n_batch)
        return bl_err_set(err, BL_EINVAL, "%s: %lld rows from the card, outside 1..%lld", m->path,
                          (long long)n_rows, (long long)m->opts.n_batch);
    int rc = m->be->op->card_get(m->be, k, m->s.x, sizeof(float) * (size_t)(n_rows * m->cfg.n_embd), err);
    m->card_in_rows = rc < 0 ? 0 : n_rows;
    return rc;
}

int wk_model_card_settle(wk_model_t *m, bl_err_t *err)
{
    return m->card_in_n ? m->be->op->card_settle(m->be, err) : 0;
}

int wk_model_pin_host(wk_model_t *m, void *p, size_t nbytes, bl_err_t *err)
{
    return m->be->op->pin_host ? m->be->op->pin_host(m->be, p, nbytes, err) : 0;
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
    m->remote = (wk_remote_t){fn, ctx};
}

int wk_model_experts(wk_model_t *m, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                     const int32_t *ids, const float *wts, float *out, bl_err_t *err)
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
    if (!wk__layer_local_experts(m, layer))
        return bl_err_set(err, BL_EINVAL, "experts of layer %lld: this process does not hold them",
                          (long long)layer);
    if (n < 1 || n > m->opts.n_batch)
        return bl_err_set(err, BL_ERANGE, "%lld expert rows, outside 1..%lld", (long long)n,
                          (long long)m->opts.n_batch);
    if (!xn || !ids || !wts || !out)
        return bl_err_set(err, BL_EINVAL, "experts: a NULL buffer");
    const int rc = kcpu_experts_check(c->n_expert, c->n_expert_used, n, counts, ids, err);
    if (rc < 0)
        return rc;
    if (m->opts.device >= 0 && m->opts.experts != WK_EXPERTS_ONLY)
        return bl_err_set(err, BL_ENOTSUP, "%s: the experts of a stage on a card are computed in its steps",
                          m->path);
    return m->be->op->experts(m->be, layer, &m->w.layers[layer].moe, xn, n, counts, ids, wts, out, err);
}

// --- a model on a CUDA device ---------------------------------------------------------

int wk_model_profile(wk_model_t *m, wk_prof_op_t *out, int cap, int reset)
{
    return m->opts.device >= 0 ? wk__cuda_profile(m->be, out, cap, reset) : wk__cpu_profile(m->be, out, cap, reset);
}

void wk_model_set_profile(wk_model_t *m, int on) { m->opts.profile = on; }

int wk_model_device_bandwidth(wk_model_t *m, size_t nbytes, double *bytes_per_s, bl_err_t *err)
{
    *bytes_per_s = 0;
    if (m->opts.device < 0)
        return bl_err_set(err, BL_ENOTSUP, "%s runs on the CPU", m->path);
    return wk__cuda_bandwidth(m->be, nbytes, bytes_per_s, err);
}


// --- placement for a program of one stage ---------------------------------------------

int wk_place_one(const char *path, const bl_place_opts_t *o, wk_place_t *out, char *text, size_t cap,
                 bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    out->device = WK_DEVICE_CPU;
    if (cap)
        text[0] = '\0';
    bl_device_t devs[BL_PLAN_MAX_DEVICES];
    int n_devs = 0;
    bl_gguf_t *g = NULL;
    bl_arch_t a;
    bl_plan_t p = {0};
    int rc = wk_devices(devs, BL_PLAN_MAX_DEVICES, &n_devs, err);
    if (rc == 0 && (rc = bl_gguf_open(&g, path, err)) == 0 && (rc = bl_arch_read(&a, g, path, err)) == 0 &&
        (rc = bl_plan_build(&p, g, &a, devs, n_devs, o, err)) == 0) {
        bl_plan_format(&p, text, cap);
        if (p.n_stages != 1)
            rc = bl_err_set(err, BL_ENOTSUP, "the plan has %d stages (layers on the CPU and on a card, or on "
                            "several cards); this program runs one, bloomery-serve runs them all", p.n_stages);
        else if (p.n_tiers > 1)
            rc = bl_err_set(err, BL_ENOTSUP, "the plan has %d expert tiers (CUDA%d, CUDA%d, ...); this program runs "
                            "one, bloomery-serve runs them all", p.n_tiers, p.tier[0].device, p.tier[1].device);
        else if (a.n_layer > BL_ARCH_MAX_LAYERS)
            rc = bl_err_set(err, BL_ENOTSUP, "%s: %lld layers (at most %d here)", path, (long long)a.n_layer,
                            BL_ARCH_MAX_LAYERS);
        if (rc == 0) {
            out->device = p.stage[0].device >= 0 ? p.stage[0].device : WK_DEVICE_CPU;
            out->n_layer = a.n_layer;
            out->experts_ram = p.host_disk_bytes ? p.experts_ram : 0;
            out->tier_device = p.n_tiers ? p.tier[0].device : WK_DEVICE_CPU;
            for (int64_t l = 0; l < a.n_layer; l++) {
                out->host[l] = (uint8_t)bl_plan_layer_host(&p, l);
                out->tier[l] = p.tier_of[l] != 0;
            }
        }
    }
    bl_plan_free(&p);
    bl_gguf_close(g);
    return rc;
}

/* Where a placed model's layers send their routed experts: the store or the tier. A
 * card stage calls its experts hook from a host node of its stream, where no CUDA
 * call may be made; so the tier's calls run on a thread of their own, the hook
 * handing each over and waiting for it (as a stage waits for a tier's process). */
struct wk_placed_route {
    struct ht_store *ex;
    wk_model_t *tier;
    uint8_t on_tier[BL_ARCH_MAX_LAYERS];
    pthread_t th;
    int th_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, stop; /* under mu */
    struct tier_call {
        int64_t layer, n;
        const float *xn, *wts;
        const int32_t *counts, *ids;
        float *out;
        bl_err_t err;
        int rc;
    } call;
};

static void *tier_thread(void *arg)
{
    struct wk_placed_route *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->pending && !r->stop)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        struct tier_call *c = &r->call;
        pthread_mutex_unlock(&r->mu);
        c->rc = wk_model_experts(r->tier, c->layer, c->xn, c->n, c->counts, c->ids, c->wts, c->out, &c->err);
        pthread_mutex_lock(&r->mu);
        r->pending = 0;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static int placed_experts(void *ctx, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                          const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    struct wk_placed_route *r = ctx;
    if (!r->on_tier[layer])
        return ht_store_experts(r->ex, layer, xn, n, counts, ids, wts, out, err);
    pthread_mutex_lock(&r->mu);
    r->call = (struct tier_call){.layer = layer, .n = n, .xn = xn, .wts = wts, .counts = counts, .ids = ids,
                                 .out = out};
    r->pending = 1;
    pthread_cond_broadcast(&r->cv);
    while (r->pending)
        pthread_cond_wait(&r->cv, &r->mu);
    const int rc = r->call.rc;
    if (rc < 0)
        *err = r->call.err;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int wk_load_placed(wk_placed_t *out, const char *path, const wk_model_opts_t *opts, const wk_place_t *pl,
                   bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    wk_model_opts_t o = *opts;
    int any_host = 0, any_tier = 0;
    uint8_t where[BL_ARCH_MAX_LAYERS];
    for (int64_t l = 0; pl && l < pl->n_layer && l < BL_ARCH_MAX_LAYERS; l++) {
        any_host |= pl->host[l];
        any_tier |= pl->tier[l];
        where[l] = pl->host[l] ? WK_EXPERTS_HOST_RAM : pl->tier[l] ? WK_EXPERTS_TIER : 0;
    }
    if (pl)
        o.device = pl->device;
    o.experts = any_host || any_tier ? WK_EXPERTS_REMOTE : WK_EXPERTS_LOCAL;
    o.experts_host = any_host || any_tier ? where : NULL;
    if (!any_host && !any_tier)
        return wk_model_load(&out->m, path, &o, err);
    if (!(out->route = calloc(1, sizeof *out->route)))
        return bl_err_set(err, BL_ENOMEM, "out of memory for the experts' routes");
    pthread_mutex_init(&out->route->mu, NULL);
    pthread_cond_init(&out->route->cv, NULL);
    int rc;
    if (any_host) {
        const ht_store_opts_t so = {.progress = o.progress, .progress_ud = o.progress_ud,
                                    .path = path, .layers = pl->host, .n_threads = o.n_threads,
                                    .n_batch = o.n_batch, .no_mmap = o.no_mmap, .mlock = o.mlock, .poll = o.poll,
                                    .cpu_strict = o.cpu_strict, .ram_bytes = pl->experts_ram, .read_ahead = -1};
        if ((rc = ht_store_open(&out->ex, &so, err)) < 0)
            return rc;
        if ((uint64_t)ht_store_arch(out->ex)->n_layer != (uint64_t)pl->n_layer)
            return bl_err_set(err, BL_EINVAL, "%s: %lld layers planned, the file has %lld", path,
                              (long long)pl->n_layer, (long long)ht_store_arch(out->ex)->n_layer);
    }
    if (any_tier) {
        wk_model_opts_t t = *opts;
        t.device = pl->tier_device;
        t.experts = WK_EXPERTS_ONLY;
        t.experts_host = pl->tier;
        if ((rc = wk_model_load(&out->tier, path, &t, err)) < 0)
            return rc;
        out->route->tier = out->tier;
        if (pthread_create(&out->route->th, NULL, tier_thread, out->route) != 0)
            return bl_err_set(err, BL_ENOMEM, "cannot start the expert tier's thread");
        out->route->th_on = 1;
    }
    if ((rc = wk_model_load(&out->m, path, &o, err)) < 0)
        return rc;
    if (wk_model_config(out->m)->n_layer != pl->n_layer)
        return bl_err_set(err, BL_EINVAL, "%s: %lld layers planned, the file has %lld", path, (long long)pl->n_layer,
                          (long long)wk_model_config(out->m)->n_layer);
    out->route->ex = out->ex;
    memcpy(out->route->on_tier, pl->tier, (size_t)pl->n_layer);
    wk_model_set_experts(out->m, placed_experts, out->route);
    return 0;
}

void wk_placed_free(wk_placed_t *p)
{
    wk_model_free(p->m);
    struct wk_placed_route *r = p->route;
    if (r && r->th_on) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->th, NULL);
    }
    if (r) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
    }
    wk_model_free(p->tier);
    ht_store_close(p->ex);
    free(r);
    memset(p, 0, sizeof *p);
}
