/* The tokenizer's core: building the vocabulary tables from plain arrays, the
 * special-token partition and normalisation that precede encoding, the accessors,
 * and the streaming decoder. The encoders live in tokenizer_bpe.c and
 * tokenizer_spm.c, the GGUF front end in tokenizer_gguf.c. */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

/* --- small helpers ------------------------------------------------------------- */

int rt__utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    /* Continuation bytes cannot start a character; C0/C1 only start overlong forms. */
    if (b0 < 0xC2)
        return -1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b0 < 0xE0) {
        need = 1;
        c = b0 & 0x1F;
    } else if (b0 < 0xF0) {
        need = 2;
        c = b0 & 0x0F;
        if (b0 == 0xE0)
            lo = 0xA0; /* overlong */
        if (b0 == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (b0 < 0xF5) {
        need = 3;
        c = b0 & 0x07;
        if (b0 == 0xF0)
            lo = 0x90; /* overlong */
        if (b0 == 0xF4)
            hi = 0x8F; /* past U+10FFFF */
    } else {
        return -1;
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n)
            return 0;
        uint8_t b = s[i];
        if (b < lo || b > hi)
            return -i;
        lo = 0x80;
        hi = 0xBF;
        c = (c << 6) | (b & 0x3F);
    }
    *cp = c;
    return need + 1;
}

uint64_t rt__hash(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    return h;
}

int rt__reserve(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem)
            return BL_ENOMEM;
        c *= 2;
    }
    void *p = realloc(*buf, c * elem);
    if (!p)
        return BL_ENOMEM;
    *buf = p;
    *cap = c;
    return 0;
}

int rt_tokens_push(rt_tokens_t *out, int32_t id)
{
    if (out->n == out->cap) {
        void *p = out->ids;
        if (rt__reserve(&p, &out->cap, out->n + 1, sizeof *out->ids))
            return BL_ENOMEM;
        out->ids = p;
    }
    out->ids[out->n++] = id;
    return 0;
}

void rt_tokens_free(rt_tokens_t *t)
{
    if (!t)
        return;
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

static inline const char *tok_text(const rt_tokenizer_t *tok, uint32_t id, size_t *len)
{
    *len = tok->text_off[id + 1] - tok->text_off[id];
    return tok->text + tok->text_off[id];
}

int32_t rt__lookup(const rt_tokenizer_t *tok, const char *s, size_t n)
{
    uint32_t i = (uint32_t)rt__hash(s, n) & tok->tmap_mask;
    for (;;) {
        uint32_t v = tok->tmap[i];
        if (!v)
            return -1;
        size_t len;
        const char *t = tok_text(tok, v - 1, &len);
        if (len == n && memcmp(t, s, n) == 0)
            return (int32_t)(v - 1);
        i = (i + 1) & tok->tmap_mask;
    }
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t p = 16;
    while (p < n)
        p *= 2;
    return p;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves, the
 * other 68 bytes (controls, space, DEL, NBSP, soft hyphen) take U+0100.. in byte
 * order, so that every byte is a visible character in the vocabulary. */
static void byte_level_map(uint16_t map[256])
{
    uint16_t next = 256;
    for (int i = 0; i < 256; i++) {
        int printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174);
        map[i] = printable ? (uint16_t)i : next++;
    }
}

/* --- construction ---------------------------------------------------------------- */

void rt_tokenizer_desc_init(rt_tokenizer_desc_t *d)
{
    memset(d, 0, sizeof *d);
    d->bos_id = d->eos_id = d->eot_id = d->eom_id = d->pad_id = d->unk_id = -1;
    for (int i = 0; i < 6; i++)
        d->fim_id[i] = -1;
    d->add_bos = d->add_eos = d->add_space_prefix = d->nfc = -1;
}

static int is_byte_token_text(const char *t, size_t n, uint8_t *b)
{
    if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>')
        return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = t[i];
        int d = (c >= '0' && c <= '9') ? c - '0'
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0)
            return 0;
        v = v * 16 + d;
    }
    *b = (uint8_t)v;
    return 1;
}

static int build_text_map(rt_tokenizer_t *tok, bl_err_t *err)
{
    uint32_t size = pow2_at_least(2ull * tok->n_vocab);
    tok->tmap = calloc(size, sizeof *tok->tmap);
    if (!tok->tmap)
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for the token map");
    tok->tmap_mask = size - 1;
    for (uint32_t id = 0; id < tok->n_vocab; id++) {
        size_t len;
        const char *t = tok_text(tok, id, &len);
        /* An empty token can never be matched in text; keep it out of the map. */
        if (len == 0)
            continue;
        uint32_t i = (uint32_t)rt__hash(t, len) & tok->tmap_mask;
        while (tok->tmap[i]) {
            size_t l2;
            const char *t2 = tok_text(tok, tok->tmap[i] - 1, &l2);
            if (l2 == len && memcmp(t, t2, len) == 0)
                return bl_err_set(err, BL_EINVAL,
                                  "tokenizer: token %u ('%.*s') duplicates token %u", id,
                                  (int)(len > 64 ? 64 : len), t, tok->tmap[i] - 1);
            i = (i + 1) & tok->tmap_mask;
        }
        tok->tmap[i] = id + 1;
    }
    return 0;
}

static int build_merges(rt_tokenizer_t *tok, const rt_tokenizer_desc_t *d, bl_err_t *err)
{
    int rc = 0;
    char *cat = NULL;
    size_t cat_cap = 0;
    uint32_t size = pow2_at_least(2ull * d->n_merges);
    tok->mmap = calloc(size, sizeof *tok->mmap);
    if (!tok->mmap)
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for %u merges", d->n_merges);
    tok->mmap_mask = size - 1;
    for (uint32_t r = 0; r < d->n_merges; r++) {
        const char *m = d->merges[r].ptr;
        size_t n = d->merges[r].len;
        /* The separator is the first space after the first byte, as a part never
         * starts with a space in a byte-level vocabulary (spaces are U+0120). */
        const char *sp = (n > 1 && m) ? memchr(m + 1, ' ', n - 1) : NULL;
        if (!sp) {
            rc = bl_err_set(err, BL_EINVAL, "tokenizer: merge %u ('%.*s') is not two parts "
                            "separated by a space", r, m ? (int)(n > 64 ? 64 : n) : 0,
                            m ? m : "");
            goto fail;
        }
        size_t ln = (size_t)(sp - m), rn = n - ln - 1;
        int32_t l = rt__lookup(tok, m, ln), rr = rt__lookup(tok, sp + 1, rn);
        void *cp = cat;
        if (rt__reserve(&cp, &cat_cap, ln + rn + 1, 1)) {
            rc = bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for merge %u", r);
            goto fail;
        }
        cat = cp;
        memcpy(cat, m, ln);
        memcpy(cat + ln, sp + 1, rn);
        int32_t res = rt__lookup(tok, cat, ln + rn);
        if (l < 0 || rr < 0 || res < 0) {
            rc = bl_err_set(err, BL_EINVAL, "tokenizer: merge %u ('%.*s'): '%.*s' is not a token",
                            r, (int)(n > 64 ? 64 : n), m,
                            (int)(l < 0 ? ln : rr < 0 ? rn : ln + rn),
                            l < 0 ? m : rr < 0 ? sp + 1 : cat);
            goto fail;
        }
        uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)rr) + 1;
        uint32_t i = rt__merge_slot(key, tok->mmap_mask);
        while (tok->mmap[i].key && tok->mmap[i].key != key)
            i = (i + 1) & tok->mmap_mask;
        /* A repeated pair keeps its first (best) rank. */
        if (!tok->mmap[i].key) {
            tok->mmap[i].key = key;
            tok->mmap[i].rank = r;
            tok->mmap[i].id = res;
        }
    }
fail:
    free(cat);
    return rc;
}

/* Decodes a token's text into the bytes it stands for (see rt_tokenizer_piece). */
static size_t decode_piece(const rt_tokenizer_t *tok, uint32_t id, char *o)
{
    size_t len;
    const char *t = tok_text(tok, id, &len);
    uint8_t type = tok->types[id];
    uint8_t b;
    if (type == RT_TOKEN_CONTROL || type == RT_TOKEN_USER_DEFINED || type == RT_TOKEN_UNKNOWN) {
        memcpy(o, t, len);
        return len;
    }
    if (type == RT_TOKEN_BYTE && is_byte_token_text(t, len, &b)) {
        o[0] = (char)b;
        return 1;
    }
    if (type != RT_TOKEN_NORMAL && type != RT_TOKEN_BYTE)
        return 0; /* unused and undefined tokens print nothing */
    size_t w = 0;
    if (tok->model == RT__MODEL_SPM) {
        for (size_t i = 0; i < len;) {
            if (i + 3 <= len && memcmp(t + i, "\xE2\x96\x81", 3) == 0) {
                o[w++] = ' ';
                i += 3;
            } else {
                o[w++] = t[i++];
            }
        }
        return w;
    }
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = rt__utf8_next((const uint8_t *)t + i, len - i, &cp);
        /* Texts were validated at creation, so k > 0. */
        if (cp < 324 && tok->cp_to_byte[cp]) {
            o[w++] = (char)(tok->cp_to_byte[cp] - 1);
        } else {
            memcpy(o + w, t + i, (size_t)k);
            w += (size_t)k;
        }
        i += (size_t)k;
    }
    return w;
}

static int build_pieces(rt_tokenizer_t *tok, bl_err_t *err)
{
    /* A piece is never longer than its text (each character gives at most its own
     * bytes, U+2581 gives one), so the text's size bounds the blob. */
    tok->piece = malloc(tok->text_off[tok->n_vocab] + 1);
    tok->piece_off = malloc((tok->n_vocab + 1ull) * sizeof *tok->piece_off);
    if (!tok->piece || !tok->piece_off)
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for token pieces");
    uint32_t w = 0;
    for (uint32_t id = 0; id < tok->n_vocab; id++) {
        tok->piece_off[id] = w;
        w += (uint32_t)decode_piece(tok, id, tok->piece + w);
    }
    tok->piece_off[tok->n_vocab] = w;
    tok->max_text = 1;
    for (uint32_t id = 0; id < tok->n_vocab; id++)
        if (tok->text_off[id + 1] - tok->text_off[id] > tok->max_text)
            tok->max_text = tok->text_off[id + 1] - tok->text_off[id];
    return 0;
}

static int cmp_special(const void *a, const void *b, void *arg)
{
    const rt_tokenizer_t *tok = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = tok->text_off[x + 1] - tok->text_off[x];
    uint32_t ly = tok->text_off[y + 1] - tok->text_off[y];
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int build_specials(rt_tokenizer_t *tok, bl_err_t *err)
{
    uint32_t n = 0;
    for (uint32_t id = 0; id < tok->n_vocab; id++) {
        uint8_t t = tok->types[id];
        if ((t == RT_TOKEN_CONTROL || t == RT_TOKEN_USER_DEFINED || t == RT_TOKEN_UNKNOWN) &&
            tok->text_off[id + 1] > tok->text_off[id])
            n++;
    }
    tok->special = malloc((n ? n : 1) * sizeof *tok->special);
    if (!tok->special)
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for special tokens");
    n = 0;
    for (uint32_t id = 0; id < tok->n_vocab; id++) {
        uint8_t t = tok->types[id];
        if ((t == RT_TOKEN_CONTROL || t == RT_TOKEN_USER_DEFINED || t == RT_TOKEN_UNKNOWN) &&
            tok->text_off[id + 1] > tok->text_off[id])
            tok->special[n++] = (int32_t)id;
    }
    /* Longest first, as a special token that contains another must win over it;
     * equal lengths in id order so that the result never depends on the sort. */
    qsort_r(tok->special, n, sizeof *tok->special, cmp_special, tok);
    tok->n_special = n;
    return 0;
}

static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<|eom_id|>", "<EOT>", "<end_of_utterance>",
    ("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"), /* DeepSeek */
};

static int32_t valid_id(const rt_tokenizer_t *tok, int32_t id)
{
    return (id >= 0 && (uint32_t)id < tok->n_vocab) ? id : -1;
}

/* The texts FIM tokens go by in the vocabularies of code models, in order of
 * preference (StarCoder, CodeLlama, DeepSeek-Coder, Qwen2.5-Coder/Qwen3, CodeGemma). */
#define DS_BAR "\xEF\xBD\x9C" /* the fullwidth bar of DeepSeek's special tokens */
#define DS_SP "\xE2\x96\x81"  /* ▁ */
static const char *const fim_texts[6][7] = {
    [RT_FIM_PRE] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", DS_SP "<PRE>",
                    "<" DS_BAR "fim" DS_SP "begin" DS_BAR ">", NULL},
    [RT_FIM_SUF] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", DS_SP "<SUF>",
                    "<" DS_BAR "fim" DS_SP "hole" DS_BAR ">", NULL},
    [RT_FIM_MID] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", DS_SP "<MID>",
                    "<" DS_BAR "fim" DS_SP "end" DS_BAR ">", NULL},
    [RT_FIM_PAD] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", NULL},
    [RT_FIM_REP] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL},
    [RT_FIM_SEP] = {"<|file_sep|>", "<file_sep>", "<|file_separator|>", NULL},
};

static int parse_model(rt_tokenizer_t *tok, const rt_tokenizer_desc_t *d, bl_err_t *err)
{
    if (!d->model)
        return bl_err_set(err, BL_EINVAL, "tokenizer: no model name (tokenizer.ggml.model)");
    if (strcmp(d->model, "gpt2") == 0) {
        tok->model = RT__MODEL_BPE;
    } else if (strcmp(d->model, "llama") == 0) {
        tok->model = RT__MODEL_SPM;
        tok->pre = RT__PRE_NONE;
        tok->add_bos = 1;
        tok->add_space_prefix = 1;
        return 0;
    } else {
        return bl_err_set(err, BL_ENOTSUP, "tokenizer: unknown model '%.64s' "
                          "(tokenizer.ggml.model; known: gpt2, llama)", d->model);
    }
    const char *p = d->pre ? d->pre : "";
    if (!strcmp(p, "qwen2") || !strcmp(p, "qwen3") || !strcmp(p, "deepseek-r1-qwen")) {
        tok->pre = RT__PRE_QWEN2;
        /* Qwen's tokenizer.json has an NFC normalizer and a GGUF does not record
         * normalizers, so NFC is implied by this pre-tokenizer name; no other
         * supported pre-tokenizer normalises (Llama 3 and DeepSeek-V3 have none). */
        tok->nfc = 1;
    } else if (!strcmp(p, "llama-bpe") || !strcmp(p, "llama3") || !strcmp(p, "llama-v3")) {
        tok->pre = RT__PRE_LLAMA3;
        /* Llama 3's tokenizer.json sets ignore_merges: a word that is a token as a
         * whole is taken as it is. Its prompts start with <|begin_of_text|>. */
        tok->ignore_merges = 1;
        tok->add_bos = 1;
    } else if (!strcmp(p, "deepseek-v3")) {
        tok->pre = RT__PRE_DEEPSEEK3;
    } else if (!strcmp(p, "gpt-4o")) {
        /* GPT-4o and gpt-oss (o200k): no normaliser, no BOS unless the file asks
         * (tokenizer.ggml.add_bos_token), and merges applied as llama.cpp does for
         * this pre type (its ignore_merges stays off) */
        tok->pre = RT__PRE_GPT4O;
    } else if (!strcmp(p, "glm4") || !strcmp(p, "chatglm-bpe")) {
        /* GLM-4's split is Llama 3's; its prompts begin with the template's
         * [gMASK]<sop>, not a BOS token */
        tok->pre = RT__PRE_LLAMA3;
    } else {
        return bl_err_set(err, BL_ENOTSUP, "tokenizer: unknown pre-tokenizer '%.64s' "
                          "(tokenizer.ggml.pre; known: qwen2, llama-bpe, deepseek-v3, glm4, "
                          "gpt-4o)", p);
    }
    return 0;
}

int rt_tokenizer_create(rt_tokenizer_t **out, const rt_tokenizer_desc_t *d, bl_err_t *err)
{
    int rc;
    *out = NULL;
    rt_tokenizer_t *tok = calloc(1, sizeof *tok);
    if (!tok)
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory");

    if ((rc = parse_model(tok, d, err)))
        goto fail;
    if (d->n_vocab == 0 || !d->tokens) {
        rc = bl_err_set(err, BL_EINVAL, "tokenizer: empty vocabulary (tokenizer.ggml.tokens)");
        goto fail;
    }
    if (d->n_vocab > RT__MAX_VOCAB) {
        rc = bl_err_set(err, BL_ERANGE, "tokenizer: %u tokens, more than the limit %u",
                        d->n_vocab, RT__MAX_VOCAB);
        goto fail;
    }
    if (tok->model == RT__MODEL_BPE && d->n_merges > RT__MAX_MERGES) {
        rc = bl_err_set(err, BL_ERANGE, "tokenizer: %u merges, more than the limit %u",
                        d->n_merges, RT__MAX_MERGES);
        goto fail;
    }
    if (tok->model == RT__MODEL_BPE && d->n_merges && !d->merges) {
        rc = bl_err_set(err, BL_EINVAL, "tokenizer: %u merges but no merge array", d->n_merges);
        goto fail;
    }
    tok->n_vocab = d->n_vocab;

    /* Token texts: validated, then copied into one block. */
    uint64_t total = 0;
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        const rt_str_t *s = &d->tokens[i];
        if (s->len && !s->ptr) {
            rc = bl_err_set(err, BL_EINVAL, "tokenizer: token %u has no text", i);
            goto fail;
        }
        if (s->len > RT__MAX_TOKEN_LEN) {
            rc = bl_err_set(err, BL_ERANGE, "tokenizer: token %u is %zu bytes, more than %u",
                            i, s->len, RT__MAX_TOKEN_LEN);
            goto fail;
        }
        for (size_t k = 0; k < s->len;) {
            uint32_t cp;
            int r = rt__utf8_next((const uint8_t *)s->ptr + k, s->len - k, &cp);
            if (r <= 0) {
                rc = bl_err_set(err, BL_EINVAL, "tokenizer: token %u is not valid UTF-8 "
                                "(byte %zu)", i, k);
                goto fail;
            }
            k += (size_t)r;
        }
        total += s->len;
    }
    if (total >= UINT32_MAX) {
        rc = bl_err_set(err, BL_ERANGE, "tokenizer: token texts total %llu bytes",
                        (unsigned long long)total);
        goto fail;
    }
    tok->text = malloc(total + 1);
    tok->text_off = malloc((d->n_vocab + 1ull) * sizeof *tok->text_off);
    tok->types = malloc(d->n_vocab);
    tok->scores = malloc(d->n_vocab * sizeof *tok->scores);
    tok->eog = calloc(d->n_vocab, 1);
    tok->cache = calloc(RT__CACHE_SLOTS, sizeof *tok->cache);
    if (!tok->text || !tok->text_off || !tok->types || !tok->scores || !tok->eog || !tok->cache) {
        rc = bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for %u tokens", d->n_vocab);
        goto fail;
    }
    uint32_t w = 0;
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        tok->text_off[i] = w;
        if (d->tokens[i].len)
            memcpy(tok->text + w, d->tokens[i].ptr, d->tokens[i].len);
        w += (uint32_t)d->tokens[i].len;
        int32_t t = d->types ? d->types[i] : RT_TOKEN_NORMAL;
        if (t < RT_TOKEN_UNDEFINED || t > RT_TOKEN_BYTE) {
            rc = bl_err_set(err, BL_EINVAL, "tokenizer: token %u has type %d (tokenizer.ggml."
                            "token_type: 0..6)", i, (int)t);
            goto fail;
        }
        tok->types[i] = (uint8_t)t;
        tok->scores[i] = d->scores ? d->scores[i] : 0.0f;
    }
    tok->text_off[d->n_vocab] = w;

    if ((rc = build_text_map(tok, err)))
        goto fail;

    /* Bytes: byte-level vocabularies write byte b as one character; SentencePiece
     * ones fall back to <0xXX> tokens. A byte without a token is dropped (BPE) or
     * becomes unk (SentencePiece) when it occurs. */
    for (int b = 0; b < 256; b++)
        tok->byte_tok[b] = -1;
    if (tok->model == RT__MODEL_BPE) {
        byte_level_map(tok->byte_cp);
        for (int b = 0; b < 256; b++) {
            char u[4];
            uint32_t cp = tok->byte_cp[b];
            tok->cp_to_byte[cp] = (uint16_t)(b + 1);
            tok->byte_tok[b] = rt__lookup(tok, u, put_utf8(u, cp));
        }
        if ((rc = build_merges(tok, d, err)))
            goto fail;
    } else {
        for (int b = 0; b < 256; b++) {
            char u[7];
            snprintf(u, sizeof u, "<0x%02X>", b);
            tok->byte_tok[b] = rt__lookup(tok, u, 6);
        }
    }
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        size_t len;
        const char *t = tok_text(tok, i, &len);
        uint8_t b;
        if (tok->types[i] == RT_TOKEN_BYTE && !is_byte_token_text(t, len, &b)) {
            rc = bl_err_set(err, BL_EINVAL, "tokenizer: token %u has type byte but its text "
                            "'%.*s' is not <0xXX>", i, (int)(len > 64 ? 64 : len), t);
            goto fail;
        }
    }

    if ((rc = build_pieces(tok, err)) || (rc = build_specials(tok, err)))
        goto fail;

    /* Special ids. An id out of range is taken as absent, as llama.cpp loads such
     * files with a warning; asking to add an absent token is refused below. */
    tok->bos = valid_id(tok, d->bos_id);
    tok->eos = valid_id(tok, d->eos_id);
    tok->eot = valid_id(tok, d->eot_id);
    tok->pad = valid_id(tok, d->pad_id);
    tok->unk = valid_id(tok, d->unk_id);
    for (int f = 0; f < 6; f++) {
        tok->fim[f] = valid_id(tok, d->fim_id[f]);
        for (int k = 0; tok->fim[f] < 0 && fim_texts[f][k]; k++)
            tok->fim[f] = rt__lookup(tok, fim_texts[f][k], strlen(fim_texts[f][k]));
    }
    if (tok->model == RT__MODEL_SPM) {
        if (d->bos_id < 0)
            tok->bos = valid_id(tok, 1);
        if (d->eos_id < 0)
            tok->eos = valid_id(tok, 2);
        if (d->unk_id < 0)
            tok->unk = valid_id(tok, 0);
    }
    for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++) {
        int32_t id = rt__lookup(tok, eog_texts[k], strlen(eog_texts[k]));
        if (id < 0)
            continue;
        tok->eog[id] = 1;
        if (tok->eot < 0)
            tok->eot = id;
    }
    /* A code model that writes a pad, a repository or a file separator has finished
     * the middle it was asked for (llama.cpp ends generation on them too). */
    for (int f = RT_FIM_PAD; f <= RT_FIM_SEP; f++)
        if (tok->fim[f] >= 0)
            tok->eog[tok->fim[f]] = 1;
    if (tok->eos >= 0)
        tok->eog[tok->eos] = 1;
    if (tok->eot >= 0)
        tok->eog[tok->eot] = 1;
    /* the end of a message that waits for a tool's answer (GLM's <|observation|>) */
    if (valid_id(tok, d->eom_id) >= 0)
        tok->eog[d->eom_id] = 1;
    /* harmony (gpt-oss): <|end|> closes a message and the reply goes on (after the
     * analysis channel comes the final one); a reply ends at <|return|> or <|call|> */
    int32_t h_end = rt__lookup(tok, "<|end|>", 7), h_ret = rt__lookup(tok, "<|return|>", 10),
            h_call = rt__lookup(tok, "<|call|>", 8);
    if (h_end >= 0 && h_ret >= 0 && h_call >= 0) {
        tok->eog[h_end] = 0;
        tok->eog[h_ret] = tok->eog[h_call] = 1;
        if (tok->eot == h_end)
            tok->eot = h_ret;
    }

    if (d->add_bos >= 0)
        tok->add_bos = d->add_bos != 0;
    if (d->add_eos >= 0)
        tok->add_eos = d->add_eos != 0;
    if (d->add_space_prefix >= 0 && tok->model == RT__MODEL_SPM)
        tok->add_space_prefix = d->add_space_prefix != 0;
    if (d->nfc >= 0)
        tok->nfc = d->nfc != 0;
    if (tok->add_bos && tok->bos < 0) {
        rc = bl_err_set(err, BL_EINVAL, "tokenizer: add_bos is set but there is no bos token "
                        "(tokenizer.ggml.bos_token_id)");
        goto fail;
    }
    if (tok->add_eos && tok->eos < 0) {
        rc = bl_err_set(err, BL_EINVAL, "tokenizer: add_eos is set but there is no eos token "
                        "(tokenizer.ggml.eos_token_id)");
        goto fail;
    }

    if (tok->model == RT__MODEL_BPE && (rc = rt__bpe_init(tok, err)))
        goto fail;

    *out = tok;
    return 0;
fail:
    rt_tokenizer_destroy(tok);
    return rc;
}

/* What a tokenizer owns alone: the scratch, the word cache and the matching state. */
static void free_own(rt_tokenizer_t *tok)
{
    free(tok->buf);
    free(tok->frag);
    free(tok->frags);
    free(tok->pieces[0]);
    free(tok->pieces[1]);
    free(tok->syms);
    free(tok->heap);
    free(tok->mapped);
    free(tok->cache);
}

int rt_tokenizer_clone(rt_tokenizer_t **out, const rt_tokenizer_t *src, bl_err_t *err)
{
    *out = NULL;
    rt_tokenizer_t *tok = malloc(sizeof *tok);
    if (!tok)
        return bl_err_set(err, BL_ENOMEM, "tokenizer: out of memory for a clone");
    *tok = *src;
    tok->_source = src->_source ? src->_source : src;
    tok->buf = tok->frag = tok->mapped = NULL;
    tok->buf_cap = tok->frag_cap = tok->mapped_cap = 0;
    tok->frags = NULL;
    tok->frags_cap = 0;
    tok->pieces[0] = tok->pieces[1] = NULL;
    tok->pieces_cap[0] = tok->pieces_cap[1] = 0;
    tok->syms = NULL;
    tok->syms_cap = 0;
    tok->heap = NULL;
    tok->heap_cap = 0;
    tok->md = NULL;
    tok->mctx = NULL;
    tok->jit_stack = NULL;
    tok->cache = calloc(RT__CACHE_SLOTS, sizeof *tok->cache);
    int rc = tok->cache ? 0 : bl_err_set(err, BL_ENOMEM, "tokenizer: out of memory for a clone");
    if (!rc && tok->n_re)
        rc = rt__bpe_match_init(tok, err);
    if (rc) {
        rt_tokenizer_destroy(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

void rt_tokenizer_destroy(rt_tokenizer_t *tok)
{
    if (!tok)
        return;
    if (tok->_source) { /* a clone: the tables are its source's */
        rt__bpe_match_fini(tok);
        free_own(tok);
        free(tok);
        return;
    }
    rt__bpe_fini(tok);
    free(tok->text);
    free(tok->text_off);
    free(tok->types);
    free(tok->scores);
    free(tok->eog);
    free(tok->piece);
    free(tok->piece_off);
    free(tok->tmap);
    free(tok->mmap);
    free(tok->special);
    free_own(tok);
    free(tok);
}

/* --- accessors ------------------------------------------------------------------- */

uint32_t rt_tokenizer_n_vocab(const rt_tokenizer_t *tok) { return tok->n_vocab; }

size_t rt_tokenizer_min_tokens(const rt_tokenizer_t *tok, size_t text_bytes)
{
    /* each token stands for at most max_text bytes of the normalised text, and NFC
     * shrinks text to no less than a third (three jamo, nine bytes, compose into one
     * syllable of three) */
    size_t per = (size_t)tok->max_text * (tok->nfc ? 3 : 1);
    return text_bytes / per;
}
int32_t rt_tokenizer_bos(const rt_tokenizer_t *tok) { return tok->bos; }
int32_t rt_tokenizer_eos(const rt_tokenizer_t *tok) { return tok->eos; }
int32_t rt_tokenizer_eot(const rt_tokenizer_t *tok) { return tok->eot; }
int32_t rt_tokenizer_pad(const rt_tokenizer_t *tok) { return tok->pad; }
int32_t rt_tokenizer_fim(const rt_tokenizer_t *tok, rt_fim_t which)
{
    return (unsigned)which < 6u ? tok->fim[which] : -1;
}
int32_t rt_tokenizer_unk(const rt_tokenizer_t *tok) { return tok->unk; }
int rt_tokenizer_add_bos(const rt_tokenizer_t *tok) { return tok->add_bos; }
int rt_tokenizer_add_eos(const rt_tokenizer_t *tok) { return tok->add_eos; }

int rt_tokenizer_is_eog(const rt_tokenizer_t *tok, int32_t id)
{
    return id >= 0 && (uint32_t)id < tok->n_vocab && tok->eog[id];
}

int rt_tokenizer_token_type(const rt_tokenizer_t *tok, int32_t id)
{
    if (id < 0 || (uint32_t)id >= tok->n_vocab)
        return RT_TOKEN_UNDEFINED;
    return tok->types[id];
}

rt_str_t rt_tokenizer_token_text(const rt_tokenizer_t *tok, int32_t id)
{
    rt_str_t s = { NULL, 0 };
    if (id >= 0 && (uint32_t)id < tok->n_vocab)
        s.ptr = tok_text(tok, (uint32_t)id, &s.len);
    return s;
}

rt_str_t rt_tokenizer_piece(const rt_tokenizer_t *tok, int32_t id)
{
    rt_str_t s = { NULL, 0 };
    if (id >= 0 && (uint32_t)id < tok->n_vocab) {
        s.ptr = tok->piece + tok->piece_off[id];
        s.len = tok->piece_off[id + 1] - tok->piece_off[id];
    }
    return s;
}

int32_t rt_tokenizer_find(const rt_tokenizer_t *tok, const char *s, size_t len)
{
    if (!s || len == 0)
        return -1;
    return rt__lookup(tok, s, len);
}

/* --- text to ids ------------------------------------------------------------------ */

/* Replaces each maximal invalid UTF-8 subsequence with U+FFFD. Returns the text to
 * use: s itself when it is valid (the usual case, no copy), else tok->buf. */
static int sanitize(rt_tokenizer_t *tok, const char *s, size_t n, const char **res,
                    size_t *res_n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        /* ASCII runs are most text; skip them without decoding. */
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        int k = rt__utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0)
            break;
        i += (size_t)k;
    }
    if (i == n) {
        *res = s;
        *res_n = n;
        return 0;
    }
    /* Each invalid byte grows to at most 3 bytes. */
    void *p = tok->buf;
    if (n > SIZE_MAX / 3 || rt__reserve(&p, &tok->buf_cap, n * 3, 1))
        return BL_ENOMEM;
    tok->buf = p;
    memcpy(tok->buf, s, i);
    size_t w = i;
    while (i < n) {
        uint32_t cp;
        int k = rt__utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k > 0) {
            memcpy(tok->buf + w, s + i, (size_t)k);
            w += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(tok->buf + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i += k < 0 ? (size_t)-k : n - i; /* 0: an unfinished character at the end */
        }
    }
    *res = tok->buf;
    *res_n = w;
    return 0;
}

/* Splits s into text and special-token fragments the way llama.cpp does: each
 * special token in turn, longest first, takes all its non-overlapping occurrences
 * (leftmost first) in the text fragments that earlier tokens left. */
static int partition(rt_tokenizer_t *tok, const char *s, size_t n, unsigned flags,
                     rt__frag_t **out, size_t *n_out)
{
    void *p = tok->frags;
    if (rt__reserve(&p, &tok->frags_cap, 16, sizeof *tok->frags))
        return BL_ENOMEM;
    tok->frags = p;
    rt__frag_t *fr = tok->frags;
    size_t nf = 1;
    fr[0] = (rt__frag_t){ 0, n, -1 };

    for (uint32_t k = 0; k < tok->n_special; k++) {
        int32_t id = tok->special[k];
        if (!(flags & RT_TOKENIZE_PARSE_SPECIAL) && tok->types[id] != RT_TOKEN_USER_DEFINED)
            continue;
        size_t tl;
        const char *t = tok_text(tok, (uint32_t)id, &tl);
        /* Most texts hold no special token at all: one search of the whole text
         * rules each token out before any fragment is looked at. */
        if (tl > n || !memmem(s, n, t, tl))
            continue;
        for (size_t f = 0; f < nf; f++) {
            if (fr[f].id >= 0 || fr[f].len < tl)
                continue;
            const char *base = s + fr[f].off;
            const char *hit = memmem(base, fr[f].len, t, tl);
            if (!hit)
                continue;
            size_t before = (size_t)(hit - base);
            size_t after = fr[f].len - before - tl;
            /* Fragments added besides the one replaced. */
            size_t add = (before > 0) + (after > 0);
            p = tok->frags;
            if (rt__reserve(&p, &tok->frags_cap, nf + add, sizeof *tok->frags))
                return BL_ENOMEM;
            tok->frags = fr = p;
            rt__frag_t cur = fr[f];
            memmove(fr + f + 1 + add, fr + f + 1, (nf - f - 1) * sizeof *fr);
            nf += add;
            size_t w = f;
            if (before)
                fr[w++] = (rt__frag_t){ cur.off, before, -1 };
            fr[w++] = (rt__frag_t){ cur.off + before, tl, id };
            if (after)
                fr[w++] = (rt__frag_t){ cur.off + before + tl, after, -1 };
            /* The loop's f++ lands on the text after the match, to search it too. */
            f = after ? w - 2 : w - 1;
        }
    }
    *out = fr;
    *n_out = nf;
    return 0;
}

/* NFC-normalises s when the vocabulary asks for it, touching as little as it can.
 * Code points below U+0300 neither change under NFC nor combine with what precedes
 * them, and their UTF-8 lead bytes are all below 0xCC, so text without such a byte
 * is left as it is. Otherwise the text is cut before each ASCII character (no
 * composition or reordering crosses the start of one) and only the segments that
 * hold a byte >= 0xCC go through utf8proc. */
static int normalize(rt_tokenizer_t *tok, const char *s, size_t n, const char **res,
                     size_t *res_n, bl_err_t *err)
{
    *res = s;
    *res_n = n;
    if (!tok->nfc)
        return 0;
    size_t i = 0;
    while (i < n && (uint8_t)s[i] < 0xCC)
        i++;
    if (i == n)
        return 0;
    /* NFC of a segment is at most 3x its length (the bound UTF-8 NFC allows). */
    void *p = tok->frag;
    if (n > SIZE_MAX / 3 - 1 || rt__reserve(&p, &tok->frag_cap, 3 * n + 1, 1))
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for %zu bytes", n);
    tok->frag = p;
    size_t w = 0;
    for (size_t a = 0; a < n;) {
        /* The next byte >= 0xCC; everything before the ASCII character that
         * starts its segment is copied as it is. */
        size_t j = a;
        while (j < n && (uint8_t)s[j] < 0xCC)
            j++;
        if (j == n) {
            memcpy(tok->frag + w, s + a, n - a);
            w += n - a;
            break;
        }
        size_t st = j;
        while (st > a && (uint8_t)s[st - 1] >= 0x80)
            st--;
        if (st > a)
            st--; /* the ASCII character before the run may take its marks */
        size_t e = j + 1;
        while (e < n && (uint8_t)s[e] >= 0x80)
            e++;
        memcpy(tok->frag + w, s + a, st - a);
        w += st - a;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + st,
                                          (utf8proc_ssize_t)(e - st), &dst,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0 || (size_t)r > 3 * (e - st)) {
            free(dst);
            return bl_err_set(err, r == UTF8PROC_ERROR_NOMEM ? BL_ENOMEM : BL_EINVAL,
                              "tokenizer: NFC failed at byte %zu: %s", st,
                              r < 0 ? utf8proc_errmsg(r) : "result too long");
        }
        memcpy(tok->frag + w, dst, (size_t)r);
        free(dst);
        w += (size_t)r;
        a = e;
    }
    *res = tok->frag;
    *res_n = w;
    return 0;
}

/* SentencePiece input: a space in front when the fragment starts the text or
 * follows a special token (add_space_prefix), and every space as U+2581. */
static int spm_escape(rt_tokenizer_t *tok, const char *s, size_t n, int prefix,
                      const char **res, size_t *res_n)
{
    void *p = tok->frag;
    if (n > (SIZE_MAX - 3) / 3 || rt__reserve(&p, &tok->frag_cap, n * 3 + 3, 1))
        return BL_ENOMEM;
    tok->frag = p;
    size_t w = 0;
    if (prefix) {
        memcpy(tok->frag, "\xE2\x96\x81", 3);
        w = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(tok->frag + w, "\xE2\x96\x81", 3);
            w += 3;
        } else {
            tok->frag[w++] = s[i];
        }
    }
    *res = tok->frag;
    *res_n = w;
    return 0;
}

/* Frees a scratch buffer that one very long input grew past what ordinary inputs
 * need, so that a single huge prompt does not pin its memory for the life of the
 * tokenizer. */
#define SCRATCH_KEEP_BYTES (4u << 20)

#define TRIM(buf, cap)                                         \
    do {                                                       \
        if ((cap) * sizeof *(buf) > SCRATCH_KEEP_BYTES) {      \
            free(buf);                                         \
            (buf) = NULL;                                      \
            (cap) = 0;                                         \
        }                                                      \
    } while (0)

static void trim_scratch(rt_tokenizer_t *tok)
{
    TRIM(tok->buf, tok->buf_cap);
    TRIM(tok->frag, tok->frag_cap);
    TRIM(tok->frags, tok->frags_cap);
    TRIM(tok->pieces[0], tok->pieces_cap[0]);
    TRIM(tok->pieces[1], tok->pieces_cap[1]);
    TRIM(tok->syms, tok->syms_cap);
    TRIM(tok->heap, tok->heap_cap);
    TRIM(tok->mapped, tok->mapped_cap);
}

static int tokenize(rt_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                    rt_tokens_t *out, bl_err_t *err)
{
    int rc;
    const char *s = text ? text : "";
    size_t n = len;
    if (sanitize(tok, s, len, &s, &n))
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for %zu bytes of text", len);

    if ((flags & RT_TOKENIZE_ADD_SPECIAL) && tok->add_bos && rt_tokens_push(out, tok->bos))
        goto nomem;

    if (n) {
        rt__frag_t *fr;
        size_t nf;
        if (partition(tok, s, n, flags, &fr, &nf))
            goto nomem;
        int prev_special = 1;
        for (size_t f = 0; f < nf; f++) {
            /* partition's list lives in tok->frags, which the encoders do not touch. */
            if (fr[f].id >= 0) {
                if (rt_tokens_push(out, fr[f].id))
                    goto nomem;
                prev_special = 1;
                continue;
            }
            const char *t;
            size_t tn;
            if (tok->model == RT__MODEL_BPE) {
                if ((rc = normalize(tok, s + fr[f].off, fr[f].len, &t, &tn, err)))
                    return rc;
                rc = rt__bpe_encode(tok, t, tn, out, err);
            } else {
                if (spm_escape(tok, s + fr[f].off, fr[f].len,
                               tok->add_space_prefix && prev_special, &t, &tn))
                    goto nomem;
                rc = rt__spm_encode(tok, t, tn, out, err);
            }
            if (rc)
                return rc;
            prev_special = 0;
        }
    }

    if ((flags & RT_TOKENIZE_ADD_SPECIAL) && tok->add_eos && rt_tokens_push(out, tok->eos))
        goto nomem;
    return 0;
nomem:
    return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for the ids of %zu bytes", len);
}

int rt_tokenize(rt_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                rt_tokens_t *out, bl_err_t *err)
{
    if (len > RT__MAX_TEXT_LEN)
        return bl_err_set(err, BL_ERANGE, "tokenizer: text of %zu bytes, more than %u",
                          len, RT__MAX_TEXT_LEN);
    if (len && !text)
        return bl_err_set(err, BL_EINVAL, "tokenizer: no text");
    int rc = tokenize(tok, text, len, flags, out, err);
    trim_scratch(tok);
    return rc;
}

/* --- ids to text ------------------------------------------------------------------ */

struct rt_detok {
    const rt_tokenizer_t *tok;
    unsigned flags;
    int32_t *keep;     /* control ids given as text anyway (rt_detok_keep) */
    size_t n_keep;
    uint8_t held[4];   /* an unfinished character from earlier tokens */
    uint32_t n_held;
    char *in;          /* held bytes + the new piece */
    size_t in_cap;
    char *out;         /* what push returns */
    size_t out_cap;
};

int rt_detok_create(rt_detok_t **out, const rt_tokenizer_t *tok, unsigned flags,
                    bl_err_t *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return bl_err_set(err, BL_ENOMEM, "detokenizer: no memory");
    (*out)->tok = tok;
    (*out)->flags = flags;
    return 0;
}

void rt_detok_destroy(rt_detok_t *d)
{
    if (!d)
        return;
    free(d->in);
    free(d->out);
    free(d->keep);
    free(d);
}

void rt_detok_reset(rt_detok_t *d) { d->n_held = 0; }

int rt_detok_keep(rt_detok_t *d, int32_t id)
{
    if (id < 0 || (uint32_t)id >= d->tok->n_vocab)
        return BL_ERANGE;
    for (size_t i = 0; i < d->n_keep; i++)
        if (d->keep[i] == id)
            return 0;
    int32_t *k = realloc(d->keep, (d->n_keep + 1) * sizeof *k);
    if (!k)
        return BL_ENOMEM;
    d->keep = k;
    d->keep[d->n_keep++] = id;
    return 0;
}

static int detok_kept(const rt_detok_t *d, int32_t id)
{
    for (size_t i = 0; i < d->n_keep; i++)
        if (d->keep[i] == id)
            return 1;
    return 0;
}

int rt_detok_push(rt_detok_t *d, int32_t id, const char **text, size_t *len, bl_err_t *err)
{
    const rt_tokenizer_t *tok = d->tok;
    *text = "";
    *len = 0;
    if (id < 0 || (uint32_t)id >= tok->n_vocab)
        return bl_err_set(err, BL_ERANGE, "detokenizer: token id %d out of range (vocabulary "
                          "of %u)", (int)id, tok->n_vocab);
    rt_str_t piece = rt_tokenizer_piece(tok, id);
    uint8_t type = tok->types[id];
    if (!(d->flags & RT_DETOK_SPECIAL) && (type == RT_TOKEN_CONTROL || type == RT_TOKEN_UNKNOWN) &&
        !detok_kept(d, id))
        piece.len = 0;

    size_t n = d->n_held + piece.len;
    void *p = d->in;
    if (rt__reserve(&p, &d->in_cap, n + 1, 1))
        return bl_err_set(err, BL_ENOMEM, "detokenizer: no memory");
    d->in = p;
    p = d->out;
    /* Each byte becomes at most 3 (an invalid one becomes U+FFFD). */
    if (rt__reserve(&p, &d->out_cap, 3 * n + 1, 1))
        return bl_err_set(err, BL_ENOMEM, "detokenizer: no memory");
    d->out = p;
    memcpy(d->in, d->held, d->n_held);
    if (piece.len)
        memcpy(d->in + d->n_held, piece.ptr, piece.len);

    const uint8_t *in = (const uint8_t *)d->in;
    size_t i = 0, w = 0;
    d->n_held = 0;
    while (i < n) {
        uint32_t cp;
        if (in[i] < 0x80) {
            d->out[w++] = (char)in[i++];
            continue;
        }
        int k = rt__utf8_next(in + i, n - i, &cp);
        if (k > 0) {
            memcpy(d->out + w, in + i, (size_t)k);
            w += (size_t)k;
            i += (size_t)k;
        } else if (k < 0) {
            memcpy(d->out + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i += (size_t)-k;
        } else {
            /* A valid start of a character that the next token may finish. */
            d->n_held = (uint32_t)(n - i);
            memcpy(d->held, in + i, d->n_held);
            break;
        }
    }
    d->out[w] = '\0';
    *text = d->out;
    *len = w;
    return 0;
}

void rt_detok_flush(rt_detok_t *d, const char **text, size_t *len)
{
    /* Held bytes are one maximal unfinished subsequence: one U+FFFD. The literal
     * is static, so no allocation can fail here. */
    if (d->n_held) {
        d->n_held = 0;
        *text = "\xEF\xBF\xBD";
        *len = 3;
    } else {
        *text = "";
        *len = 0;
    }
}

int rt_detokenize(const rt_tokenizer_t *tok, const int32_t *ids, size_t n, unsigned flags,
                  char **out, size_t *out_len, bl_err_t *err)
{
    int rc;
    rt_detok_t *d = NULL;
    char *s = NULL;
    size_t len = 0, cap = 0;
    const char *t;
    size_t tn;
    *out = NULL;
    *out_len = 0;
    if ((rc = rt_detok_create(&d, tok, flags, err)))
        return rc;
    void *p = NULL;
    if (rt__reserve(&p, &cap, 64, 1)) {
        rc = bl_err_set(err, BL_ENOMEM, "detokenizer: no memory");
        goto fail;
    }
    s = p;
    for (size_t i = 0; i <= n; i++) {
        if (i < n) {
            if ((rc = rt_detok_push(d, ids[i], &t, &tn, err))) {
                if (rc == BL_ERANGE)
                    bl_err_set(err, rc, "detokenizer: id %d at position %zu out of range "
                               "(vocabulary of %u)", (int)ids[i], i, tok->n_vocab);
                goto fail;
            }
        } else {
            rt_detok_flush(d, &t, &tn);
        }
        p = s;
        if (rt__reserve(&p, &cap, len + tn + 1, 1)) {
            rc = bl_err_set(err, BL_ENOMEM, "detokenizer: no memory");
            goto fail;
        }
        s = p;
        memcpy(s + len, t, tn);
        len += tn;
    }
    s[len] = '\0';
    rt_detok_destroy(d);
    *out = s;
    *out_len = len;
    return 0;
fail:
    free(s);
    rt_detok_destroy(d);
    return rc;
}

// --- merge heap (shared by BPE and SentencePiece) ---------------------------------

static int pair_less(const rt__pair_t *a, const rt__pair_t *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

void rt__heap_push(rt__pair_t *h, size_t *n, rt__pair_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pair_less(&v, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

rt__pair_t rt__heap_pop(rt__pair_t *h, size_t *n)
{
    rt__pair_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && pair_less(&h[c + 1], &h[c]))
            c++;
        if (!pair_less(&h[c], &v))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = v;
    return top;
}
