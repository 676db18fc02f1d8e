/* Architecture facts from GGUF metadata (arch.h). The keys and tensor names are
 * llama.cpp's for these architectures. */
#include <math.h>
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
        return bl_err_set(err, BL_ERANGE, "%s: metadata %s = %u is outside 1..%lld", bl_gguf_part_path(g, 0), full, v,
                          (long long)max);
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
        return bl_err_set(err, BL_ERANGE, "%s: metadata %s = %g is outside %g..%g", bl_gguf_part_path(g, 0), full,
                          (double)*out, (double)lo, (double)hi);
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
        return bl_err_set(err, BL_ERANGE, "%s: metadata %s = %u is outside 0..%lld", bl_gguf_part_path(g, 0), full, v,
                          (long long)max);
    *out = v;
    return 0;
}

/* The architectures read here. */
static const struct {
    const char *name;
    int moe;
} k_archs[] = {{"qwen3moe", 1}, {"qwen3", 0}, {"glm4moe", 1}, {"deepseek2", 1}, {"gpt-oss", 1},
                {"qwen3next", 1}, {"qwen35moe", 1}};

static int is_arch(const bl_arch_t *a, const char *name) { return strcmp(a->name, name) == 0; }

/* The routing keys glm4moe and deepseek2 share: the shared experts' count (required),
 * the gating function (0, "none", read as def, as llama.cpp does for each), the
 * chosen weights' scale (0: none) and norm. */
static int read_routing(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_gating_t def, int64_t *shared,
                        bl_err_t *err)
{
    const char *ar = a->name;
    int64_t gating = 0;
    int rc;
    if ((rc = get_count(g, ar, "expert_shared_count", -1, 64, shared, err)) < 0 ||
        (rc = get_count(g, ar, "expert_gating_func", 0, 16, &gating, err)) < 0 ||
        (rc = get_float(g, ar, "expert_weights_scale", 1.0f, 0.0f, 1e6f, &a->expert_scale, err)) < 0)
        return rc;
    if (*shared < 0)
        return bl_err_set(err, BL_ENOENT, "%s: metadata %s.expert_shared_count is missing", path, ar);
    if (gating == 0)
        gating = def;
    if (gating != BL_GATING_SOFTMAX && gating != BL_GATING_SIGMOID)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s.expert_gating_func %lld is not supported (1 softmax, 2 sigmoid)",
                          path, ar, (long long)gating);
    a->gating = (bl_gating_t)gating;
    if (a->expert_scale == 0.0f)
        a->expert_scale = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", ar);
    a->expert_norm = 0;
    if (bl_gguf_find_kv(g, key) && (rc = bl_gguf_get_bool(g, key, &a->expert_norm, err)) < 0)
        return rc;
    return 0;
}

/* The layers glm4moe and deepseek2 run (block_count less the NextN ones), their
 * leading dense layers with the dense FFN's width, and the shared experts' width. */
static int read_layer_kinds(bl_arch_t *a, const bl_gguf_t *g, int64_t shared, bl_err_t *err)
{
    const char *ar = a->name;
    int rc;
    a->n_layer = a->n_layer_file - a->n_nextn;
    if ((rc = get_count(g, ar, "leading_dense_block_count", 0, a->n_layer, &a->n_dense_lead, err)) < 0)
        return rc;
    if (a->n_dense_lead > 0 && (rc = get_dim(g, ar, "feed_forward_length", 0, BL_ARCH_MAX_DIM, &a->n_ff, err)) < 0)
        return rc;
    a->n_ff_shexp = shared * a->n_ff_exp;
    return 0;
}

/* glm4moe's routing and layer kinds: sigmoid scores with a selection bias, shared
 * experts, leading dense layers, NextN layers at the end of the file. */
static int read_glm4moe(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err)
{
    const char *ar = a->name;
    int64_t shared = 0;
    int rc;
    if ((rc = get_count(g, ar, "nextn_predict_layers", 0, a->n_layer_file - 1, &a->n_nextn, err)) < 0 ||
        (rc = read_routing(a, g, path, BL_GATING_SIGMOID, &shared, err)) < 0)
        return rc;
    if ((rc = read_layer_kinds(a, g, shared, err)) < 0)
        return rc;
    a->expert_bias = 1;
    a->attn_bias = 1;
    a->ffn_norm = "post_attention_norm";
    /* the q/k norms are optional (GLM-4.5 has them, GLM-4.5-Air not): the first
     * layer says, every layer must then agree */
    a->qk_norm = bl_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL;
    return 0;
}

/* deepseek2: the latent attention's widths (the MLA form of today's converter, or
 * the legacy attn_kv_b form), the expert groups, shared experts and dense layers. */
static int read_deepseek2(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err)
{
    const char *ar = a->name;
    int64_t shared = -1, klen = 0, vlen = 0, kmla = 0, vmla = 0;
    int rc;
    if ((rc = get_count(g, ar, "attention.q_lora_rank", 0, BL_ARCH_MAX_DIM, &a->q_lora, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.kv_lora_rank", 0, BL_ARCH_MAX_DIM, &a->kv_lora, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.key_length", 0, BL_ARCH_MAX_DIM, &klen, err)) < 0 ||
        (rc = get_dim(g, ar, "attention.value_length", 0, BL_ARCH_MAX_DIM, &vlen, err)) < 0 ||
        (rc = get_count(g, ar, "attention.key_length_mla", 0, BL_ARCH_MAX_DIM, &kmla, err)) < 0 ||
        (rc = get_count(g, ar, "attention.value_length_mla", 0, BL_ARCH_MAX_DIM, &vmla, err)) < 0 ||
        (rc = get_dim(g, ar, "rope.dimension_count", 0, BL_ARCH_MAX_DIM, &a->n_rot, err)) < 0 ||
        (rc = get_count(g, ar, "nextn_predict_layers", 0, a->n_layer_file - 1, &a->n_nextn, err)) < 0 ||
        (rc = get_count(g, ar, "expert_group_count", 1, BL_ARCH_MAX_EXPERTS, &a->n_group, err)) < 0 ||
        (rc = get_count(g, ar, "expert_group_used_count", 1, BL_ARCH_MAX_EXPERTS, &a->topk_group, err)) < 0 ||
        /* 0 ("none"): the softmax of DeepSeek-V2's files, as llama.cpp reads them */
        (rc = read_routing(a, g, path, BL_GATING_SOFTMAX, &shared, err)) < 0)
        return rc;
    char key[128];
    if ((kmla != 0) != (vmla != 0))
        return bl_err_set(err, BL_EINVAL, "%s: metadata %s.attention.%s is missing (key_length_mla and "
                          "value_length_mla come together)", path, ar, kmla ? "value_length_mla" : "key_length_mla");
    a->mla_split = kmla != 0;
    a->head_k = a->mla_split ? kmla : klen;
    a->head_v = a->mla_split ? vmla : vlen;
    if (a->mla_split && (klen != a->kv_lora + a->n_rot || vlen != a->kv_lora))
        return bl_err_set(err, BL_EINVAL, "%s: %s.attention.key_length %lld and value_length %lld are not kv_lora_rank "
                          "+ rope.dimension_count and kv_lora_rank (%lld, %lld)", path, ar, (long long)klen,
                          (long long)vlen, (long long)(a->kv_lora + a->n_rot), (long long)a->kv_lora);
    if (a->n_rot % 2 || a->head_k <= a->n_rot || a->head_v < 1)
        return bl_err_set(err, BL_EINVAL, "%s: %s: a head of %lld q/k dims must hold the %lld rotated ones (even) and "
                          "more", path, ar, (long long)a->head_k, (long long)a->n_rot);
    /* the latent cache: one head of kv_lora + n_rot per position */
    a->head_dim = a->kv_lora + a->n_rot;
    a->n_head_kv = 1;
    if (a->head_dim > BL_ARCH_MAX_DIM || a->n_head * a->head_dim > BL_ARCH_MAX_DIM ||
        a->n_head * a->head_k > BL_ARCH_MAX_DIM)
        return bl_err_set(err, BL_ERANGE, "%s: %s: %lld heads of %lld latent dims pass %d", path, ar,
                          (long long)a->n_head, (long long)a->head_dim, BL_ARCH_MAX_DIM);
    if (a->n_group < 1 || a->n_expert % a->n_group || a->topk_group < 1 || a->topk_group > a->n_group ||
        (a->topk_group < a->n_group && a->n_expert_used > a->topk_group * (a->n_expert / a->n_group)))
        return bl_err_set(err, BL_EINVAL, "%s: %s.expert_group_count %lld must divide expert_count %lld and "
                          "expert_group_used_count %lld groups hold the %lld used experts", path, ar,
                          (long long)a->n_group, (long long)a->n_expert, (long long)a->topk_group,
                          (long long)a->n_expert_used);
    if ((rc = read_layer_kinds(a, g, shared, err)) < 0)
        return rc;
    /* exp_probs_b is optional (DeepSeek-V3 has it, V2 not): the first MoE layer says */
    snprintf(key, sizeof key, "blk.%lld.exp_probs_b.bias", (long long)a->n_dense_lead);
    a->expert_bias = bl_gguf_find_tensor(g, key) != NULL;
    a->qk_norm = 0;
    a->rope_neox = 0;
    return 0;
}

/* gpt-oss: sliding-window layers every other layer (by default), attention sinks,
 * biases on every projection and expert, the router's softmax over its top k, and
 * the clamped SwiGLU. */
static int read_gptoss(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err)
{
    const char *ar = a->name;
    char key[128];
    int rc;
    if ((rc = get_dim(g, ar, "attention.sliding_window", 0, BL_ARCH_MAX_CTX, &a->n_swa, err)) < 0)
        return rc;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", ar);
    a->swa_period = 2;
    const bl_gguf_kv_t *kv = bl_gguf_find_kv(g, key);
    if (kv && bl_gguf_kv_type(kv) == BL_GGUF_ARRAY)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s is not a u32 period (a per-layer array is not supported)", path,
                          key);
    if (kv && (rc = get_dim(g, ar, "attention.sliding_window_pattern", 2, 64, &a->swa_period, err)) < 0)
        return rc;
    /* llama.cpp's gpt-oss graph never scales the chosen experts' weights (nor does
     * OpenAI's model): a file that has expert_weights_scale is not scaled */
    a->expert_scale = 1.0f;
    /* llama.cpp's heads are n_rot wide here, and a sliding layer may have its own
     * RoPE base: files that differ are refused rather than run otherwise */
    if (a->n_rot != a->head_dim)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s.rope.dimension_count %lld differs from key_length %lld", path, ar,
                          (long long)a->n_rot, (long long)a->head_dim);
    float base_swa = a->rope_base;
    if ((rc = get_float(g, ar, "rope.freq_base_swa", a->rope_base, 1.0f, 1e12f, &base_swa, err)) < 0)
        return rc;
    if (base_swa != a->rope_base)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s.rope.freq_base_swa %g differs from rope.freq_base %g (not "
                          "supported)", path, ar, (double)base_swa, (double)a->rope_base);
    a->gating = BL_GATING_SOFTMAX_WEIGHT;
    a->expert_norm = 0;
    a->qk_norm = 0;
    a->attn_bias = a->attn_out_bias = a->attn_sinks = a->router_bias = a->expert_biases = 1;
    a->expert_act = BL_ACT_SWIGLU_OAI;
    a->ffn_norm = "post_attention_norm";
    return 0;
}

/* Which of the file's layers are DeltaNet layers: attention.recurrent_layers (a bool a
 * layer of block_count), else all but every full_attention_interval-th (default 4).
 * NextN layers are attention layers. */
static int read_recurrent_layers(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err)
{
    const char *ar = a->name;
    char key[128];
    int rc;
    memset(a->recurrent, 0, sizeof a->recurrent);
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", ar);
    const bl_gguf_kv_t *kv = bl_gguf_find_kv(g, key);
    if (kv) {
        const bl_gguf_arr_t *arr = NULL;
        if ((rc = bl_gguf_get_arr(g, key, &arr, err)) < 0)
            return rc;
        if (bl_gguf_arr_count(arr) != (uint64_t)a->n_layer_file)
            return bl_err_set(err, BL_EINVAL, "%s: %s has %llu values, not block_count %lld", path, key,
                              (unsigned long long)bl_gguf_arr_count(arr), (long long)a->n_layer_file);
        for (int64_t l = 0; l < a->n_layer_file; l++) {
            int v = 0;
            if ((rc = bl_gguf_arr_bool(arr, (uint64_t)l, &v, err)) < 0)
                return rc;
            if (v && l >= a->n_layer)
                return bl_err_set(err, BL_EINVAL, "%s: %s marks NextN layer %lld recurrent", path, key, (long long)l);
            if (v)
                a->recurrent[l / 64] |= 1ull << (l % 64);
        }
        return 0;
    }
    int64_t every = 4;
    if ((rc = get_dim(g, ar, "full_attention_interval", 4, BL_ARCH_MAX_LAYERS, &every, err)) < 0)
        return rc;
    for (int64_t l = 0; l < a->n_layer; l++)
        if ((l + 1) % every != 0)
            a->recurrent[l / 64] |= 1ull << (l % 64);
    return 0;
}

/* qwen3next / qwen35moe: gated DeltaNet layers between gated full-attention ones, a
 * softmax router with a gated shared expert, no dense layers; qwen35moe's NextN
 * layers at the end of the file and its IMRoPE sections (for text, every section
 * rotates by the token's position: NEOX exactly, when the three text sections cover
 * every rotated pair). */
static int read_qwen3next(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err)
{
    const char *ar = a->name;
    const int q35 = is_arch(a, "qwen35moe");
    int64_t inner = 0;
    int rc;
    if ((q35 && (rc = get_count(g, ar, "nextn_predict_layers", 0, a->n_layer_file - 1, &a->n_nextn, err)) < 0) ||
        (rc = get_dim(g, ar, "expert_shared_feed_forward_length", 0, BL_ARCH_MAX_DIM, &a->n_ff_shexp, err)) < 0 ||
        (rc = get_dim(g, ar, "ssm.conv_kernel", 0, 64, &a->ssm_conv, err)) < 0 ||
        (rc = get_dim(g, ar, "ssm.state_size", 0, 4096, &a->ssm_state, err)) < 0 ||
        (rc = get_dim(g, ar, "ssm.group_count", 0, 4096, &a->ssm_groups, err)) < 0 ||
        (rc = get_dim(g, ar, "ssm.time_step_rank", 0, 4096, &a->ssm_heads, err)) < 0 ||
        (rc = get_dim(g, ar, "ssm.inner_size", 0, BL_ARCH_MAX_DIM, &inner, err)) < 0)
        return rc;
    /* llama.cpp never reads expert_weights_scale for these two (nor does Qwen's
     * model scale the routed experts): a file that has the key is not scaled */
    a->expert_scale = 1.0f;
    if (a->ssm_conv < 2 || a->ssm_heads % a->ssm_groups != 0 || inner != a->ssm_state * a->ssm_heads ||
        bl_arch_conv_channels(a) > BL_ARCH_MAX_DIM || bl_arch_rec_floats(a) > ((int64_t)1 << 32))
        return bl_err_set(err, BL_EINVAL, "%s: %s.ssm: conv_kernel %lld must be 2 or more, time_step_rank %lld a "
                          "multiple of group_count %lld, inner_size %lld = state_size %lld x time_step_rank",
                          path, ar, (long long)a->ssm_conv, (long long)a->ssm_heads, (long long)a->ssm_groups,
                          (long long)inner, (long long)a->ssm_state);
    a->n_layer = a->n_layer_file - a->n_nextn;
    if ((rc = read_recurrent_layers(a, g, path, err)) < 0)
        return rc;
    if (q35) {
        char key[128];
        snprintf(key, sizeof key, "%s.rope.dimension_sections", ar);
        const bl_gguf_arr_t *arr = NULL;
        if (!bl_gguf_find_kv(g, key))
            return bl_err_set(err, BL_ENOENT, "%s: metadata %s is missing", path, key);
        if ((rc = bl_gguf_get_arr(g, key, &arr, err)) < 0)
            return rc;
        int64_t sec[4] = {0, 0, 0, 0};
        for (uint64_t i = 0; i < 4 && i < bl_gguf_arr_count(arr); i++)
            if ((rc = bl_gguf_arr_i64(arr, i, &sec[i], err)) < 0)
                return rc;
        /* IMRoPE, as ggml interleaves it: pair p falls in sector p % (the sections'
         * sum), which is text (the token's position, so NEOX) when sector < 3
         * sec[sector % 3] and the fourth (image) section otherwise */
        const int64_t dims = sec[0] + sec[1] + sec[2] + sec[3];
        for (int64_t p = 0; p < a->n_rot / 2; p++) {
            const int64_t sector = dims > 0 ? p % dims : 0;
            if (dims <= 0 || sec[0] < 0 || sec[1] < 0 || sec[2] < 0 || sec[3] < 0 || !(sector < 3 * sec[sector % 3]))
                return bl_err_set(err, BL_ENOTSUP, "%s: %s [%lld, %lld, %lld, %lld] leave rotated pair %lld to "
                                  "the fourth (image) section (not supported)", path, key, (long long)sec[0],
                                  (long long)sec[1], (long long)sec[2], (long long)sec[3], (long long)p);
        }
    }
    a->ssm_tiled = q35;
    a->ssm_ba = !q35;
    a->attn_gate = 1;
    a->shexp_gate = 1;
    a->ffn_norm = "post_attention_norm";
    return 0;
}

/* llama.cpp's attention temperature of a YaRN context extension by s. */
static double get_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 1.0 + 0.1 * m * log(s); }

/* The rope.scaling.* keys: none, or YaRN (its angle mix over the pairs between the
 * correction dims, the rotation's magnitude, and deepseek2's score scale), as
 * llama.cpp derives them; other kinds are refused rather than run wrong. */
static int read_rope_scaling(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err)
{
    const char *ar = a->name;
    const int ds2 = is_arch(a, "deepseek2");
    char key[128];
    float factor = 1.0f, log_mul = 0.0f, attn = 1.0f, fast = 32.0f, slow = 1.0f;
    int64_t orig = a->n_ctx_train;
    int yarn = 0, rc;
    snprintf(key, sizeof key, "%s.rope.scaling.type", ar);
    if (bl_gguf_find_kv(g, key)) {
        bl_gguf_str_t st;
        if ((rc = bl_gguf_get_str(g, key, &st, err)) < 0)
            return rc;
        yarn = st.len == 4 && memcmp(st.ptr, "yarn", 4) == 0;
        if (!yarn && !(st.len == 4 && memcmp(st.ptr, "none", 4) == 0))
            return bl_err_set(err, BL_ENOTSUP, "%s: %s '%.*s' is not supported (none, yarn)", path, key,
                              (int)(st.len > 32 ? 32 : st.len), st.ptr);
    }
    if ((rc = get_float(g, ar, "rope.scaling.factor", 1.0f, 0.0f, 1e6f, &factor, err)) < 0 ||
        (rc = get_float(g, ar, "rope.scaling.yarn_log_multiplier", 0.0f, -100.0f, 100.0f, &log_mul, err)) < 0 ||
        (rc = get_float(g, ar, "rope.scaling.attn_factor", 1.0f, 0.0f, 100.0f, &attn, err)) < 0 ||
        (rc = get_float(g, ar, "rope.scaling.yarn_beta_fast", 32.0f, 0.0f, 1e6f, &fast, err)) < 0 ||
        (rc = get_float(g, ar, "rope.scaling.yarn_beta_slow", 1.0f, 0.0f, 1e6f, &slow, err)) < 0 ||
        (rc = get_dim(g, ar, "rope.scaling.original_context_length", a->n_ctx_train, BL_ARCH_MAX_CTX, &orig, err)) < 0)
        return rc;
    /* the converter stores deepseek2's multiplier times 0.1 */
    if (ds2)
        log_mul /= 0.1f;
    a->rope_freq_scale = 1.0f;
    a->rope_ext_factor = 0.0f;
    a->rope_corr_lo = a->rope_corr_hi = 0.0f;
    double af = attn, lnf = 0.0;
    if (yarn && factor > 1.0f && (fast <= 0.0f || slow <= 0.0f || a->rope_base <= 1.0f))
        return bl_err_set(err, BL_EINVAL, "%s: %s: YaRN needs rope.scaling.yarn_beta_fast %g and yarn_beta_slow %g "
                          "above 0 and rope.freq_base %g above 1", path, ar, (double)fast, (double)slow,
                          (double)a->rope_base);
    if (yarn && factor > 1.0f) {
        lnf = log((double)factor);
        a->rope_freq_scale = 1.0f / factor;
        a->rope_ext_factor = 1.0f;
        const double nr = (double)a->n_rot, lb = 2.0 * log((double)a->rope_base);
        const double lo = floor(nr * log((double)orig / ((double)fast * 2.0 * M_PI)) / lb);
        const double hi = ceil(nr * log((double)orig / ((double)slow * 2.0 * M_PI)) / lb);
        a->rope_corr_lo = (float)(lo > 0.0 ? lo : 0.0);
        a->rope_corr_hi = (float)(hi < nr - 1.0 ? hi : nr - 1.0);
        if (log_mul != 0.0f) {
            const double m = ds2 && log_mul != 1.0f ? log_mul : 1.0;
            af = get_mscale(factor, m) / get_mscale(factor, log_mul);
        } else {
            af = get_mscale(factor, 1.0);
        }
        af = af / (1.0 + 0.1 * lnf) * attn;
    }
    /* the rotation multiplies cos and sin by the attention factor, and by YaRN's
     * 1 + 0.1 ln(factor) when it mixes */
    a->rope_mscale = (float)(af * (a->rope_ext_factor != 0.0f ? 1.0 + 0.1 * lnf : 1.0));
    if (ds2) {
        const double org = af * (1.0 + 0.1 * lnf);
        const double ms = org * (1.0 + 0.1 * (double)log_mul * lnf);
        a->attn_scale = (float)(ms * ms / sqrt((double)a->head_k));
    } else {
        a->attn_scale = (float)(1.0 / sqrt((double)a->head_dim));
    }
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
        return bl_err_set(err, BL_ENOTSUP, "%s: architecture '%.*s' is not supported (qwen3moe, qwen3, glm4moe, deepseek2, gpt-oss, "
                          "qwen3next, qwen35moe)",
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
    /* deepseek2's heads are read with its latent attention (read_deepseek2) */
    const int gqa = !is_arch(a, "deepseek2");
    int64_t vlen = 0;
    if (gqa && (rc = get_dim(g, ar, "attention.value_length", a->head_dim, BL_ARCH_MAX_DIM, &vlen, err)) < 0)
        return rc;
    if (gqa && vlen != a->head_dim)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s.attention.value_length %lld differs from key_length %lld", path,
                          ar, (long long)vlen, (long long)a->head_dim);
    if (gqa && (a->head_dim % 2 != 0 || a->n_head % a->n_head_kv != 0 || a->n_head * a->head_dim > BL_ARCH_MAX_DIM))
        return bl_err_set(err, BL_EINVAL,
                          "%s: head_dim %lld must be even, head_count %lld a multiple of head_count_kv %lld, and their product at most %d",
                          path, (long long)a->head_dim, (long long)a->n_head, (long long)a->n_head_kv,
                          BL_ARCH_MAX_DIM);
    if (gqa && (rc = get_dim(g, ar, "rope.dimension_count", a->head_dim, a->head_dim, &a->n_rot, err)) < 0)
        return rc;
    if (a->n_rot % 2 != 0)
        return bl_err_set(err, BL_EINVAL, "%s: %s.rope.dimension_count %lld is odd", path, ar, (long long)a->n_rot);
    if ((rc = get_float(g, ar, "rope.freq_base", 10000.0f, 1.0f, 1e12f, &a->rope_base, err)) < 0 ||
        (rc = get_float(g, ar, "attention.layer_norm_rms_epsilon", 1e-6f, 0.0f, 1.0f, &a->eps, err)) < 0)
        return rc;
    a->rope_neox = 1;
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
    if ((is_arch(a, "glm4moe") && (rc = read_glm4moe(a, g, path, err)) < 0) ||
        (is_arch(a, "deepseek2") && (rc = read_deepseek2(a, g, path, err)) < 0) ||
        (is_arch(a, "gpt-oss") && (rc = read_gptoss(a, g, path, err)) < 0) ||
        ((is_arch(a, "qwen3next") || is_arch(a, "qwen35moe")) && (rc = read_qwen3next(a, g, path, err)) < 0) ||
        (rc = read_rope_scaling(a, g, path, err)) < 0)
        return rc;
    const bl_gguf_tensor_t *te = bl_gguf_find_tensor(g, "token_embd.weight");
    if (!te)
        return bl_err_set(err, BL_ENOENT, "%s: tensor 'token_embd.weight' is missing", path);
    a->n_vocab = te->ne[1];
    if (a->n_vocab < 1 || a->n_vocab > BL_ARCH_MAX_VOCAB)
        return bl_err_set(err, BL_ERANGE, "%s: token_embd.weight has %lld rows, outside 1..%d", path,
                          (long long)a->n_vocab, BL_ARCH_MAX_VOCAB);
    a->tied_output = !bl_gguf_find_tensor(g, "output.weight");
    a->cache = a->ssm_heads ? BL_CACHE_HYBRID : BL_CACHE_KV;
    a->cache_prefix_cut = a->cache == BL_CACHE_KV;
    a->kv_planes = a->kv_lora > 0 ? 1 : 2;
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
                                       "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
                                       /* deepseek2's latent attention */
                                       "attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight",
                                       "attn_kv_a_mqa.weight", "attn_kv_a_norm.weight", "attn_k_b.weight",
                                       "attn_v_b.weight", "attn_kv_b.weight",
                                       /* the DeltaNet layers of qwen3next / qwen35moe */
                                       "attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_dt.bias",
                                       "ssm_a", "ssm_ba.weight", "ssm_beta.weight", "ssm_alpha.weight",
                                       "ssm_norm.weight", "ssm_out.weight"};
    static const char *const bias[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                                       "attn_sinks.weight"};
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
    if (moe && (!strcmp(t, "ffn_gate_inp.weight") || (a->expert_bias && !strcmp(t, "exp_probs_b.bias")) ||
                (a->router_bias && !strcmp(t, "ffn_gate_inp.bias"))))
        r = BL_ROLE_GATE_INP;
    for (size_t i = 0; moe && i < sizeof exps / sizeof *exps && !r; i++)
        if (!strcmp(t, exps[i]))
            r = BL_ROLE_EXPERTS;
    /* the experts' biases travel with them (the hosttier computes them) */
    for (size_t i = 0; moe && a->expert_biases && i < sizeof exps / sizeof *exps && !r; i++) {
        const size_t k = strlen(exps[i]) - strlen("weight");
        if (!strncmp(t, exps[i], k) && !strcmp(t + k, "bias"))
            r = BL_ROLE_EXPERTS;
    }
    for (size_t i = 0; moe && a->n_ff_shexp && i < sizeof shexp / sizeof *shexp && !r; i++)
        if (!strcmp(t, shexp[i]))
            r = BL_ROLE_FFN;
    if (moe && a->shexp_gate && !r && !strcmp(t, "ffn_gate_inp_shexp.weight"))
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

