/* Architecture facts from GGUF metadata (arch.h). The keys and tensor names are
 * llama.cpp's for these architectures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "gguf.h"
#include "quant.h"

/* ARCH.key as a u32 in 1..max; a missing key is an error unless def > 0. */
static int get_dim(const bl_gguf_t *g, const char *arch, const char *key, int64_t def, int64_t max,
                   int64_t *out, bl_err_t *err)
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
        return bl_err_set(err, BL_ERANGE, "metadata %s = %u is outside 1..%lld", full, v, (long long)max);
    *out = v;
    return 0;
}

/* ARCH.key as an f32 in lo..hi, def when missing. */
static int get_float(const bl_gguf_t *g, const char *arch, const char *key, float def, float lo, float hi,
                     float *out, bl_err_t *err)
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
        return bl_err_set(err, BL_ERANGE, "metadata %s = %g is outside %g..%g", full, (double)*out, (double)lo,
                          (double)hi);
    return 0;
}

/* ARCH.key as a u32 in 0..max, def when missing. */
static int get_count(const bl_gguf_t *g, const char *arch, const char *key, int64_t def, int64_t max,
                     int64_t *out, bl_err_t *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    uint32_t v;
    if (!bl_gguf_find_kv(g, full)) {
        *out = def;
        return 0;
    }
    int rc = bl_gguf_get_u32(g, full, &v, err);
    if (rc < 0)
        return rc;
    if (v > max)
        return bl_err_set(err, BL_ERANGE, "metadata %s = %u is outside 0..%lld", full, v, (long long)max);
    *out = v;
    return 0;
}

/* The architectures read here. */
static const struct {
    const char *name;
    int moe;
} k_archs[] = {{"qwen3moe", 1}, {"qwen3", 0}, {"glm4moe", 1}};

static int is_arch(const bl_arch_t *a, const char *name) { return strcmp(a->name, name) == 0; }

/* glm4moe's routing and layer kinds: sigmoid scores with a selection bias, shared
 * experts, leading dense layers, NextN layers at the end of the file. */
static int read_glm4moe(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err)
{
    const char *ar = a->name;
    int64_t shared = 0, gating = BL_GATING_SIGMOID;
    int rc;
    if ((rc = get_count(g, ar, "nextn_predict_layers", 0, a->n_layer_file - 1, &a->n_nextn, err)) < 0 ||
        (rc = get_count(g, ar, "expert_shared_count", -1, 64, &shared, err)) < 0 ||
        (rc = get_count(g, ar, "expert_gating_func", BL_GATING_SIGMOID, 16, &gating, err)) < 0 ||
        (rc = get_float(g, ar, "expert_weights_scale", 1.0f, 0.0f, 1e6f, &a->expert_scale, err)) < 0)
        return rc;
    if (shared < 0)
        return bl_err_set(err, BL_ENOENT, "%s: metadata %s.expert_shared_count is missing", path, ar);
    /* 0 ("none") is glm4moe's default as llama.cpp reads it */
    if (gating == 0)
        gating = BL_GATING_SIGMOID;
    if (gating != BL_GATING_SOFTMAX && gating != BL_GATING_SIGMOID)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s.expert_gating_func %lld is not supported (1 softmax, 2 sigmoid)",
                          path, ar, (long long)gating);
    a->gating = (bl_gating_t)gating;
    /* llama.cpp reads a scale of 0 as "no scaling" */
    if (a->expert_scale == 0.0f)
        a->expert_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", ar);
    a->expert_norm = 0;
    if (bl_gguf_find_kv(g, key) && (rc = bl_gguf_get_bool(g, key, &a->expert_norm, err)) < 0)
        return rc;
    a->n_layer = a->n_layer_file - a->n_nextn;
    if ((rc = get_count(g, ar, "leading_dense_block_count", 0, a->n_layer, &a->n_dense_lead, err)) < 0)
        return rc;
    if (a->n_dense_lead > 0 && (rc = get_dim(g, ar, "feed_forward_length", 0, BL_ARCH_MAX_DIM, &a->n_ff, err)) < 0)
        return rc;
    a->n_ff_shexp = shared * a->n_ff_exp;
    a->expert_bias = 1;
    a->attn_bias = 1;
    a->ffn_norm = "post_attention_norm";
    /* the q/k norms are optional (GLM-4.5 has them, GLM-4.5-Air not): the first
     * layer says, every layer must then agree */
    a->qk_norm = bl_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
    return 0;
}

int bl_arch_read(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err)
{
    memset(a, 0, sizeof *a);
    bl_gguf_str_t s;
    int rc = bl_gguf_get_str(g, "general.architecture", &s, err);
    if (rc < 0)
        return rc;
    size_t ai = 0;
    while (ai < sizeof k_archs / sizeof *k_archs &&
           !(s.len == strlen(k_archs[ai].name) && memcmp(s.ptr, k_archs[ai].name, s.len) == 0))
        ai++;
    if (ai == sizeof k_archs / sizeof *k_archs)
        return bl_err_set(err, BL_ENOTSUP, "%s: architecture '%.*s' is not supported (qwen3moe, qwen3, glm4moe)",
                          path, (int)(s.len > 64 ? 64 : s.len), s.ptr);
    snprintf(a->name, sizeof a->name, "%s", k_archs[ai].name);
    a->moe = k_archs[ai].moe;
    const char *ar = a->name;
    if ((rc = get_dim(g, ar, "block_count", 0, BL_ARCH_MAX_LAYERS, &a->n_layer_file, err)) < 0 ||
        (rc = get_dim(g, ar, "embedding_length", 0, BL_ARCH_MAX_DIM, &a->n_embd, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.head_count", 0, BL_ARCH_MAX_DIM, &a->n_head, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.head_count_kv", a->n_head, BL_ARCH_MAX_DIM, &a->n_head_kv, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.key_length", a->n_embd / a->n_head, BL_ARCH_MAX_DIM, &a->head_dim, err)) < 0 ||
        (rc = get_dim(g, ar, "context_length", 0, BL_ARCH_MAX_CTX, &a->n_ctx_train, err)) < 0)
        return rc;
    a->n_layer = a->n_layer_file;
    int64_t vlen = 0;
    if ((rc = get_dim(g, ar, "attention.value_length", a->head_dim, BL_ARCH_MAX_DIM, &vlen, err)) < 0)
        return rc;
    if (vlen != a->head_dim)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s.attention.value_length %lld differs from key_length %lld", path,
                          ar, (long long)vlen, (long long)a->head_dim);
    if (a->head_dim % 2 != 0 || a->n_head % a->n_head_kv != 0 || a->n_head * a->head_dim > BL_ARCH_MAX_DIM)
        return bl_err_set(err, BL_EINVAL,
                          "%s: head_dim %lld must be even, head_count %lld a multiple of head_count_kv %lld, and their product at most %d",
                          path, (long long)a->head_dim, (long long)a->n_head, (long long)a->n_head_kv,
                          BL_ARCH_MAX_DIM);
    if ((rc = get_dim(g, ar, "rope.dimension_count", a->head_dim, a->head_dim, &a->n_rot, err)) < 0)
        return rc;
    if (a->n_rot % 2 != 0)
        return bl_err_set(err, BL_EINVAL, "%s: %s.rope.dimension_count %lld is odd", path, ar, (long long)a->n_rot);
    if ((rc = get_float(g, ar, "rope.freq_base", 10000.0f, 1.0f, 1e12f, &a->rope_base, err)) < 0 ||
        (rc = get_float(g, ar, "attention.layer_norm_rms_epsilon", 1e-6f, 0.0f, 1.0f, &a->eps, err)) < 0)
        return rc;
    /* Context extension changes the RoPE angles; refused rather than run wrong. */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", ar);
    if (bl_gguf_find_kv(g, key)) {
        bl_gguf_str_t st;
        if ((rc = bl_gguf_get_str(g, key, &st, err)) < 0)
            return rc;
        if (!(st.len == 4 && memcmp(st.ptr, "none", 4) == 0))
            return bl_err_set(err, BL_ENOTSUP, "%s: %s '%.*s' is not supported", path, key,
                              (int)(st.len > 32 ? 32 : st.len), st.ptr);
    }
    /* qwen3's layers: per-head q/k norms, no biases, softmax top-k renormalised */
    a->gating = BL_GATING_SOFTMAX;
    a->expert_norm = 1;
    a->expert_scale = 1.0f;
    a->qk_norm = 1;
    a->ffn_norm = "ffn_norm";
    if (a->moe) {
        if ((rc = get_dim(g, ar, "expert_count", 0, BL_ARCH_MAX_EXPERTS, &a->n_expert, err)) < 0 ||
            (rc = get_dim(g, ar, "expert_used_count", 0, BL_ARCH_MAX_EXPERTS, &a->n_expert_used, err)) < 0 ||
            (rc = get_dim(g, ar, "expert_feed_forward_length", 0, BL_ARCH_MAX_DIM, &a->n_ff_exp, err)) < 0)
            return rc;
        if (a->n_expert_used > a->n_expert)
            return bl_err_set(err, BL_EINVAL, "%s: %s.expert_used_count %lld exceeds expert_count %lld", path, ar,
                              (long long)a->n_expert_used, (long long)a->n_expert);
    } else if ((rc = get_dim(g, ar, "feed_forward_length", 0, BL_ARCH_MAX_DIM, &a->n_ff, err)) < 0) {
        return rc;
    }
    if (is_arch(a, "glm4moe") && (rc = read_glm4moe(a, g, path, err)) < 0)
        return rc;
    const bl_gguf_tensor_t *te = bl_gguf_find_tensor(g, "token_embd.weight");
    if (!te)
        return bl_err_set(err, BL_ENOENT, "%s: tensor 'token_embd.weight' is missing", path);
    a->n_vocab = te->ne[1];
    if (a->n_vocab < 1 || a->n_vocab > BL_ARCH_MAX_VOCAB)
        return bl_err_set(err, BL_ERANGE, "%s: token_embd.weight has %lld rows, outside 1..%d", path,
                          (long long)a->n_vocab, BL_ARCH_MAX_VOCAB);
    a->tied_output = !bl_gguf_find_tensor(g, "output.weight");
    a->cache = BL_CACHE_KV;
    a->cache_prefix_cut = 1;
    return 0;
}

static int has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

bl_role_t bl_arch_role(const bl_arch_t *a, const char *name, int64_t *layer)
{
    *layer = -1;
    if (!strcmp(name, "token_embd.weight"))
        return BL_ROLE_TOKEN_EMBD;
    if (!strcmp(name, "output_norm.weight"))
        return BL_ROLE_OUTPUT_NORM;
    if (!strcmp(name, "output.weight"))
        return BL_ROLE_OUTPUT;
    if (!has_prefix(name, "blk."))
        return BL_ROLE_OTHER;
    char *end = NULL;
    const long long l = strtoll(name + 4, &end, 10);
    if (name[4] < '0' || name[4] > '9' || *end != '.' || l >= a->n_layer)
        return BL_ROLE_OTHER;
    const char *t = end + 1;
    static const char *const attn[] = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                       "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight"};
    static const char *const bias[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
    static const char *const exps[] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    static const char *const ffn[] = {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
    static const char *const shexp[] = {"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"};
    const int moe = bl_arch_layer_moe(a, l);
    bl_role_t r = BL_ROLE_OTHER;
    for (size_t i = 0; i < sizeof attn / sizeof *attn && !r; i++)
        if (!strcmp(t, attn[i]))
            r = BL_ROLE_ATTN;
    for (size_t i = 0; a->attn_bias && i < sizeof bias / sizeof *bias && !r; i++)
        if (!strcmp(t, bias[i]))
            r = BL_ROLE_ATTN;
    if (!strncmp(t, a->ffn_norm, strlen(a->ffn_norm)) && !strcmp(t + strlen(a->ffn_norm), ".weight"))
        r = BL_ROLE_NORM;
    if (moe && (!strcmp(t, "ffn_gate_inp.weight") || (a->expert_bias && !strcmp(t, "exp_probs_b.bias"))))
        r = BL_ROLE_GATE_INP;
    for (size_t i = 0; moe && i < sizeof exps / sizeof *exps && !r; i++)
        if (!strcmp(t, exps[i]))
            r = BL_ROLE_EXPERTS;
    for (size_t i = 0; moe && a->n_ff_shexp && i < sizeof shexp / sizeof *shexp && !r; i++)
        if (!strcmp(t, shexp[i]))
            r = BL_ROLE_FFN;
    for (size_t i = 0; !moe && i < sizeof ffn / sizeof *ffn && !r; i++)
        if (!strcmp(t, ffn[i]))
            r = BL_ROLE_FFN;
    if (r)
        *layer = l;
    return r;
}

const char *bl_role_name(bl_role_t r)
{
    switch (r) {
    case BL_ROLE_TOKEN_EMBD: return "token_embd";
    case BL_ROLE_OUTPUT_NORM: return "output_norm";
    case BL_ROLE_OUTPUT: return "output";
    case BL_ROLE_ATTN: return "attention";
    case BL_ROLE_NORM: return "norm";
    case BL_ROLE_GATE_INP: return "router";
    case BL_ROLE_EXPERTS: return "experts";
    case BL_ROLE_FFN: return "ffn";
    case BL_ROLE_OTHER: break;
    }
    return "other";
}

static void shape_str(char *buf, size_t len, const int64_t ne[4])
{
    snprintf(buf, len, "[%lld, %lld, %lld, %lld]", (long long)ne[0], (long long)ne[1],
             (long long)ne[2], (long long)ne[3]);
}

/* Finds name and checks its shape (ne0, ne1, ne2; 1 for an unused dimension) and
 * type: f32 only when need_f32, else any type with a reference dequantizer. */
int bl_arch_tensor(const bl_gguf_t *g, const char *path, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                   int need_f32, const bl_gguf_tensor_t **out, bl_err_t *err)
{
    const bl_gguf_tensor_t *t = bl_gguf_find_tensor(g, name);
    if (!t)
        return bl_err_set(err, BL_ENOENT, "%s: tensor '%s' is missing", path, name);
    const int64_t want[4] = {ne0, ne1, ne2, 1};
    if (memcmp(want, t->ne, sizeof want) != 0) {
        char a[96], b[96];
        shape_str(a, sizeof a, t->ne);
        shape_str(b, sizeof b, want);
        return bl_err_set(err, BL_EINVAL, "%s: tensor '%s' has shape %s, expected %s", path,
                          name, a, b);
    }
    const bl_type_info_t *ti = bl_type_info(t->type);
    if (need_f32 && t->type != BL_TYPE_F32)
        return bl_err_set(err, BL_EINVAL, "%s: tensor '%s' has type %s, expected f32", path,
                          name, ti ? ti->name : "?");
    if (!ti || !ti->has_dequant)
        return bl_err_set(err, BL_ENOTSUP, "%s: tensor '%s' has type %s, which has no dequantizer",
                          path, name, ti ? ti->name : "?");
    /* A file may declare an alignment of 1 or 2; the kernels read floats and halves
     * in place, so the data must sit on a 4-byte boundary. */
    if ((uintptr_t)t->data % 4 != 0)
        return bl_err_set(err, BL_EINVAL, "%s: tensor '%s' data at file offset %llu is not 4-byte aligned",
                          path, name, (unsigned long long)t->file_offset);
    size_t rb;
    int rc = bl_row_bytes(t->type, ne0, &rb, err);
    if (rc < 0)
        return bl_err_set(err, rc, "%s: tensor '%s': rows of %lld are not whole %s blocks", path,
                          name, (long long)ne0, ti->name);
    if ((uint64_t)rb * (uint64_t)ne1 * (uint64_t)ne2 != t->nbytes)
        return bl_err_set(err, BL_EINVAL, "%s: tensor '%s' holds %llu bytes, expected %llu",
                          path, name, (unsigned long long)t->nbytes,
                          (unsigned long long)((uint64_t)rb * (uint64_t)ne1 * (uint64_t)ne2));
    *out = t;
    return 0;
}

