/* The tokenizer's GGUF front end: reads the tokenizer.ggml.* keys into a
 * rt_tokenizer_desc_t and hands it to rt_tokenizer_create. */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "gguf.h"

#define KEY(s) "tokenizer.ggml." s

/* An optional string key as a NUL-terminated copy in buf; "" when absent. */
static int get_name(const bl_gguf_t *g, const char *key, char *buf, size_t cap, int required,
                    bl_err_t *err)
{
    buf[0] = '\0';
    const bl_gguf_kv_t *kv = bl_gguf_find_kv(g, key);
    if (!kv)
        return required ? bl_err_set(err, BL_ENOENT, "tokenizer: no key %s in the model", key)
                        : 0;
    bl_gguf_str_t s;
    int rc = bl_gguf_kv_str(kv, &s, err);
    if (rc)
        return rc;
    if (s.len >= cap || memchr(s.ptr, '\0', s.len))
        return bl_err_set(err, BL_EINVAL, "tokenizer: %s is not a short name", key);
    memcpy(buf, s.ptr, s.len);
    buf[s.len] = '\0';
    return 0;
}

/* An optional token id; -1 when absent. Ids past int32 count as out of range,
 * which rt_tokenizer_create treats as absent. */
static int get_id(const bl_gguf_t *g, const char *key, int32_t *out, bl_err_t *err)
{
    *out = -1;
    const bl_gguf_kv_t *kv = bl_gguf_find_kv(g, key);
    if (!kv)
        return 0;
    uint64_t v;
    int rc = bl_gguf_kv_u64(kv, &v, err);
    if (rc)
        return rc;
    *out = v > INT32_MAX ? INT32_MAX : (int32_t)v;
    return 0;
}

static int get_flag(const bl_gguf_t *g, const char *key, int *out, bl_err_t *err)
{
    *out = -1;
    const bl_gguf_kv_t *kv = bl_gguf_find_kv(g, key);
    if (!kv)
        return 0;
    return bl_gguf_kv_bool(kv, out, err);
}

/* An array key: NULL when absent and not required. */
static int get_arr(const bl_gguf_t *g, const char *key, int required, const bl_gguf_arr_t **out,
                   bl_err_t *err)
{
    *out = NULL;
    const bl_gguf_kv_t *kv = bl_gguf_find_kv(g, key);
    if (!kv)
        return required ? bl_err_set(err, BL_ENOENT, "tokenizer: no key %s in the model", key)
                        : 0;
    return bl_gguf_kv_arr(kv, out, err);
}

static int get_strings(const bl_gguf_arr_t *a, const char *key, rt_str_t **out, bl_err_t *err)
{
    uint64_t n = bl_gguf_arr_count(a);
    *out = NULL;
    if (bl_gguf_arr_type(a) != BL_GGUF_STRING)
        return bl_err_set(err, BL_EINVAL, "tokenizer: %s is an array of %s, not of strings", key,
                          bl_gguf_type_name(bl_gguf_arr_type(a)));
    if (n > RT__MAX_MERGES)
        return bl_err_set(err, BL_ERANGE, "tokenizer: %s has %llu entries", key,
                          (unsigned long long)n);
    rt_str_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for %s", key);
    for (uint64_t i = 0; i < n; i++) {
        bl_gguf_str_t s;
        int rc = bl_gguf_arr_str(a, i, &s, err);
        if (rc) {
            free(v);
            return rc;
        }
        v[i] = (rt_str_t){ s.ptr, (size_t)s.len };
    }
    *out = v;
    return 0;
}

int rt_tokenizer_from_gguf(rt_tokenizer_t **out, const bl_gguf_t *g, bl_err_t *err)
{
    int rc;
    char model[64], pre[64];
    const bl_gguf_arr_t *a_tok = NULL, *a_type = NULL, *a_score = NULL, *a_merge = NULL;
    rt_str_t *tokens = NULL, *merges = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    rt_tokenizer_desc_t d;
    rt_tokenizer_desc_init(&d);
    *out = NULL;

    if ((rc = get_name(g, KEY("model"), model, sizeof model, 1, err)) ||
        (rc = get_name(g, KEY("pre"), pre, sizeof pre, 0, err)))
        goto fail;
    d.model = model;
    d.pre = pre;
    int bpe = strcmp(model, "gpt2") == 0;

    if ((rc = get_arr(g, KEY("tokens"), 1, &a_tok, err)) ||
        (rc = get_arr(g, KEY("token_type"), 0, &a_type, err)) ||
        (rc = get_arr(g, KEY("scores"), 0, &a_score, err)) ||
        (bpe && (rc = get_arr(g, KEY("merges"), 1, &a_merge, err))))
        goto fail;
    if ((rc = get_strings(a_tok, KEY("tokens"), &tokens, err)))
        goto fail;
    uint64_t n = bl_gguf_arr_count(a_tok);
    if (n == 0 || n > RT__MAX_VOCAB) {
        rc = bl_err_set(err, n ? BL_ERANGE : BL_EINVAL, "tokenizer: %s has %llu tokens",
                        KEY("tokens"), (unsigned long long)n);
        goto fail;
    }
    d.n_vocab = (uint32_t)n;
    d.tokens = tokens;

    /* Types and scores may be longer than the vocabulary (llama.cpp reads the first
     * n_vocab), never shorter. */
    if (a_type) {
        if (bl_gguf_arr_count(a_type) < n) {
            rc = bl_err_set(err, BL_EINVAL, "tokenizer: %s has %llu entries for %llu tokens",
                            KEY("token_type"), (unsigned long long)bl_gguf_arr_count(a_type),
                            (unsigned long long)n);
            goto fail;
        }
        if (!(types = malloc(n * sizeof *types))) {
            rc = bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for token types");
            goto fail;
        }
        for (uint64_t i = 0; i < n; i++) {
            int64_t v;
            if ((rc = bl_gguf_arr_i64(a_type, i, &v, err)))
                goto fail;
            types[i] = (v < INT32_MIN || v > INT32_MAX) ? -1 : (int32_t)v;
        }
        d.types = types;
    }
    if (a_score) {
        if (bl_gguf_arr_count(a_score) < n) {
            rc = bl_err_set(err, BL_EINVAL, "tokenizer: %s has %llu entries for %llu tokens",
                            KEY("scores"), (unsigned long long)bl_gguf_arr_count(a_score),
                            (unsigned long long)n);
            goto fail;
        }
        if (!(scores = malloc(n * sizeof *scores))) {
            rc = bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for token scores");
            goto fail;
        }
        for (uint64_t i = 0; i < n; i++)
            if ((rc = bl_gguf_arr_f32(a_score, i, &scores[i], err)))
                goto fail;
        d.scores = scores;
    }
    if (a_merge) {
        if ((rc = get_strings(a_merge, KEY("merges"), &merges, err)))
            goto fail;
        uint64_t nm = bl_gguf_arr_count(a_merge);
        if (nm > UINT32_MAX) {
            rc = bl_err_set(err, BL_ERANGE, "tokenizer: %s has %llu entries", KEY("merges"),
                            (unsigned long long)nm);
            goto fail;
        }
        d.n_merges = (uint32_t)nm;
        d.merges = merges;
    }

    if ((rc = get_id(g, KEY("bos_token_id"), &d.bos_id, err)) ||
        (rc = get_id(g, KEY("eos_token_id"), &d.eos_id, err)) ||
        (rc = get_id(g, KEY("eot_token_id"), &d.eot_id, err)) ||
        (rc = get_id(g, KEY("eom_token_id"), &d.eom_id, err)) ||
        (rc = get_id(g, KEY("padding_token_id"), &d.pad_id, err)) ||
        (rc = get_id(g, KEY("unknown_token_id"), &d.unk_id, err)) ||
        (rc = get_id(g, KEY("fim_pre_token_id"), &d.fim_id[RT_FIM_PRE], err)) ||
        (rc = get_id(g, KEY("fim_suf_token_id"), &d.fim_id[RT_FIM_SUF], err)) ||
        (rc = get_id(g, KEY("fim_mid_token_id"), &d.fim_id[RT_FIM_MID], err)) ||
        (rc = get_id(g, KEY("fim_pad_token_id"), &d.fim_id[RT_FIM_PAD], err)) ||
        (rc = get_id(g, KEY("fim_rep_token_id"), &d.fim_id[RT_FIM_REP], err)) ||
        (rc = get_id(g, KEY("fim_sep_token_id"), &d.fim_id[RT_FIM_SEP], err)) ||
        (rc = get_flag(g, KEY("add_bos_token"), &d.add_bos, err)) ||
        (rc = get_flag(g, KEY("add_eos_token"), &d.add_eos, err)) ||
        (rc = get_flag(g, KEY("add_space_prefix"), &d.add_space_prefix, err)))
        goto fail;

    rc = rt_tokenizer_create(out, &d, err);
fail:
    free(tokens);
    free(merges);
    free(types);
    free(scores);
    return rc;
}
