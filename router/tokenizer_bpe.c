/* Byte-level BPE: the pre-tokenizer regexes (PCRE2, UTF + Unicode properties, JIT)
 * that cut text into words, and the merge of each word's bytes by merge rank, with
 * a cache of whole-word results. */
#include "tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* The split regexes, as the models' tokenizer.json files give them, with one
 * change: \s is written [\s\x{85}] (and \S its complement) because the reference
 * engine counts U+0085 (NEL) as white space and PCRE2's \s does not; otherwise
 * PCRE2 with PCRE2_UCP matches the same classes. (?i:...) is kept as written: with
 * UCP it folds case by Unicode rules, as the reference does. */
#define WS "[\\s\\x{85}]"
#define NWS "[^\\s\\x{85}]"
#define CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"

/* Qwen2 / Qwen2.5 / Qwen3: single digits. */
static const char re_qwen2[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\x{85}\\p{L}\\p{N}]+[\\r\\n]*|"
    WS "*[\\r\\n]+|" WS "+(?!" NWS ")|" WS "+";

/* Llama 3: the same with runs of up to three digits. */
static const char re_llama3[] =
    CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\x{85}\\p{L}\\p{N}]+[\\r\\n]*|"
    WS "*[\\r\\n]+|" WS "+(?!" NWS ")|" WS "+";

/* DeepSeek-V3: three splits in sequence, each applied to every piece the previous
 * one left (matches and the text between them both stay pieces): digit runs of up
 * to three, runs of CJK ideographs and kana, then a GPT-4-like word split. */
static const char re_ds3_digits[] = "\\p{N}{1,3}";
static const char re_ds3_cjk[] = "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+";
static const char re_ds3_words[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
    "[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|"
    WS "*[\\r\\n]+|" WS "+(?!" NWS ")|" WS "+";

/* GPT-4o / gpt-oss ("gpt-4o", tiktoken's o200k_base): letters are cut where the
 * case changes. A word is an optional run of upper-case letters then a run of
 * lower-case ones, or a run of upper-case letters with an optional lower-case tail
 * ("HelloWorld" -> "Hello" "World", "HTTPServer" stays whole, "iPHONE" -> "i"
 * "PHONE"); Lm, Lo and marks count as both cases. Either kind may take a
 * contraction after it and one character that is no letter, digit, CR or LF
 * before it. Digits go in runs of up to three; a punctuation run takes the CRs,
 * LFs and slashes after it. This is the pattern of gpt-oss's tokenizer.json
 * (tiktoken's, character for character) with only the \s change above.
 * llama.cpp's copy rewrites the letter classes as ((?=[\p{L}])([^a-z])) and
 * ((?=[\p{L}])([^A-Z])) and the contractions as '[sS]|..., for an engine that
 * knows neither \p{Lu}-style subcategories nor (?i:); that copy is looser (a
 * letter outside a-z counts as upper case, one outside A-Z as lower case, marks as
 * neither: it keeps "hello" + Cyrillic "Privet" whole), so it is not followed. */
#define GPT4O_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define GPT4O_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
static const char re_gpt4o[] =
    "[^\\r\\n\\p{L}\\p{N}]?" GPT4O_UPPER "*" GPT4O_LOWER "+" CONTRACTIONS "?|"
    "[^\\r\\n\\p{L}\\p{N}]?" GPT4O_UPPER "+" GPT4O_LOWER "*" CONTRACTIONS "?|"
    "\\p{N}{1,3}| ?[^\\s\\x{85}\\p{L}\\p{N}]+[\\r\\n/]*|"
    WS "*[\\r\\n]+|" WS "+(?!" NWS ")|" WS "+";

int rt__bpe_init(rt_tokenizer_t *tok, bl_err_t *err)
{
    const char *pats[RT__MAX_REGEX];
    uint32_t n = 0;
    switch (tok->pre) {
    case RT__PRE_QWEN2: pats[n++] = re_qwen2; break;
    case RT__PRE_LLAMA3: pats[n++] = re_llama3; break;
    case RT__PRE_GPT4O: pats[n++] = re_gpt4o; break;
    case RT__PRE_DEEPSEEK3:
        pats[n++] = re_ds3_digits;
        pats[n++] = re_ds3_cjk;
        pats[n++] = re_ds3_words;
        break;
    case RT__PRE_NONE: break;
    }
    for (uint32_t i = 0; i < n; i++) {
        int ec;
        PCRE2_SIZE eo;
        tok->re[i] = pcre2_compile((PCRE2_SPTR)pats[i], PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        if (!tok->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return bl_err_set(err, BL_EINVAL, "tokenizer: pre-tokenizer regex %u does not "
                              "compile at offset %zu: %s", i, (size_t)eo, (const char *)msg);
        }
        tok->n_re = i + 1;
        /* Without JIT (a platform PCRE2 cannot JIT for) matching still works,
         * only slower, so a JIT failure is not an error. */
        (void)pcre2_jit_compile(tok->re[i], PCRE2_JIT_COMPLETE);
    }
    return rt__bpe_match_init(tok, err);
}

int rt__bpe_match_init(rt_tokenizer_t *tok, bl_err_t *err)
{
    tok->md = pcre2_match_data_create(1, NULL);
    tok->mctx = pcre2_match_context_create(NULL);
    /* Long runs of white space backtrack deeply in "\s+(?!\S)"; the default 32 KiB
     * JIT stack would fail on them. */
    tok->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!tok->md || !tok->mctx || !tok->jit_stack)
        return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for regex matching");
    pcre2_jit_stack_assign(tok->mctx, NULL, tok->jit_stack);
    /* A run of white space is matched in time linear in its length, but the
     * backtracking over it counts against the match limit (10 million by default),
     * which a long run of spaces exceeds; no pattern here is exponential, so the
     * limit is lifted rather than failing valid input. */
    (void)pcre2_set_match_limit(tok->mctx, UINT32_MAX);
    return 0;
}

void rt__bpe_fini(rt_tokenizer_t *tok)
{
    for (uint32_t i = 0; i < tok->n_re; i++)
        pcre2_code_free(tok->re[i]);
    tok->n_re = 0;
    rt__bpe_match_fini(tok);
}

void rt__bpe_match_fini(rt_tokenizer_t *tok)
{
    pcre2_match_data_free(tok->md);
    pcre2_match_context_free(tok->mctx);
    pcre2_jit_stack_free(tok->jit_stack);
    tok->md = NULL;
    tok->mctx = NULL;
    tok->jit_stack = NULL;
}

static int push_span(rt_tokenizer_t *tok, int which, size_t *n, size_t off, size_t len)
{
    if (*n == tok->pieces_cap[which]) {
        void *p = tok->pieces[which];
        if (rt__reserve(&p, &tok->pieces_cap[which], *n + 1, sizeof(rt__span_t)))
            return BL_ENOMEM;
        tok->pieces[which] = p;
    }
    tok->pieces[which][(*n)++] = (rt__span_t){ off, len };
    return 0;
}

int rt__pretokenize(rt_tokenizer_t *tok, const char *s, size_t n, rt__span_t **out,
                    size_t *n_out, bl_err_t *err)
{
    int cur = 0;
    size_t nc = 0;
    if (push_span(tok, cur, &nc, 0, n))
        goto nomem;
    for (uint32_t r = 0; r < tok->n_re; r++) {
        int nxt = cur ^ 1;
        size_t nn = 0;
        for (size_t k = 0; k < nc; k++) {
            /* Each piece is its own subject, so that lookaheads end at its end, as
             * when the reference splits each piece as a separate string. */
            rt__span_t pc = tok->pieces[cur][k];
            const PCRE2_SPTR subj = (PCRE2_SPTR)(s + pc.off);
            size_t at = 0, gap = 0;
            while (at < pc.len) {
                int rc = pcre2_match(tok->re[r], subj, pc.len, at, PCRE2_NO_UTF_CHECK, tok->md,
                                     tok->mctx);
                if (rc == PCRE2_ERROR_NOMATCH)
                    break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[128];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    return bl_err_set(err, rc == PCRE2_ERROR_NOMEMORY ? BL_ENOMEM : BL_ERANGE,
                                      "tokenizer: pre-tokenizer regex failed at byte %zu: %s",
                                      pc.off + at, (const char *)msg);
                }
                const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(tok->md);
                size_t ms = ov[0], me = ov[1];
                if (me == ms) {
                    /* None of these patterns matches empty; stepping one character
                     * keeps a future pattern that does from looping. */
                    at = ms + 1;
                    while (at < pc.len && ((uint8_t)s[pc.off + at] & 0xC0) == 0x80)
                        at++;
                    continue;
                }
                if (ms > gap && push_span(tok, nxt, &nn, pc.off + gap, ms - gap))
                    goto nomem;
                if (push_span(tok, nxt, &nn, pc.off + ms, me - ms))
                    goto nomem;
                gap = at = me;
            }
            if (gap < pc.len && push_span(tok, nxt, &nn, pc.off + gap, pc.len - gap))
                goto nomem;
        }
        cur = nxt;
        nc = nn;
    }
    *out = tok->pieces[cur];
    *n_out = nc;
    return 0;
nomem:
    return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for pre-tokens");
}

/* --- merging ------------------------------------------------------------------- */

static inline const rt__merge_t *find_merge(const rt_tokenizer_t *tok, int32_t l, int32_t r)
{
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    uint32_t i = rt__merge_slot(key, tok->mmap_mask);
    for (;;) {
        const rt__merge_t *m = &tok->mmap[i];
        if (m->key == key)
            return m;
        if (!m->key)
            return NULL;
        i = (i + 1) & tok->mmap_mask;
    }
}

static inline void try_pair(const rt_tokenizer_t *tok, rt__pair_t *h, size_t *nh, int32_t l,
                            int32_t r)
{
    if (l < 0 || r < 0)
        return;
    int32_t lid = tok->syms[l].id, rid = tok->syms[r].id;
    if (lid < 0 || rid < 0)
        return;
    const rt__merge_t *m = find_merge(tok, lid, rid);
    if (m)
        rt__heap_push(h, nh, (rt__pair_t){ .prio = (double)m->rank, .left = l, .right = r, .lid = lid,
                                       .rid = rid, .id = m->id });
}

static int encode_word(rt_tokenizer_t *tok, const uint8_t *w, size_t n, rt_tokens_t *out)
{
    if (n == 1) {
        int32_t id = tok->byte_tok[w[0]];
        return id >= 0 ? rt_tokens_push(out, id) : 0;
    }
    uint64_t h = rt__hash(w, n);
    rt__cache_slot_t *slot = NULL;
    if (n <= RT__CACHE_WORD) {
        slot = &tok->cache[h & (RT__CACHE_SLOTS - 1)];
        if (slot->wlen == n && slot->hash == h && memcmp(slot->word, w, n) == 0) {
            for (uint32_t i = 0; i < slot->nids; i++)
                if (rt_tokens_push(out, slot->ids[i]))
                    return BL_ENOMEM;
            return 0;
        }
    }
    size_t first = out->n;

    int32_t whole = -1;
    if (tok->ignore_merges) {
        void *p = tok->mapped;
        if (rt__reserve(&p, &tok->mapped_cap, 2 * n, 1))
            return BL_ENOMEM;
        tok->mapped = p;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t cp = tok->byte_cp[w[i]];
            if (cp < 0x80) {
                tok->mapped[m++] = (char)cp;
            } else {
                tok->mapped[m++] = (char)(0xC0 | (cp >> 6));
                tok->mapped[m++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        whole = rt__lookup(tok, tok->mapped, m);
    }
    if (whole >= 0) {
        if (rt_tokens_push(out, whole))
            return BL_ENOMEM;
    } else {
        void *p = tok->syms;
        if (rt__reserve(&p, &tok->syms_cap, n, sizeof *tok->syms))
            return BL_ENOMEM;
        tok->syms = p;
        p = tok->heap;
        /* Each merge pushes at most two pairs: n - 1 at the start, 2 per merge. */
        if (rt__reserve(&p, &tok->heap_cap, 3 * n, sizeof *tok->heap))
            return BL_ENOMEM;
        tok->heap = p;
        rt__sym_t *sy = tok->syms;
        for (size_t i = 0; i < n; i++)
            sy[i] = (rt__sym_t){ .id = tok->byte_tok[w[i]], .prev = (int32_t)i - 1,
                                 .next = i + 1 < n ? (int32_t)i + 1 : -1 };
        /* The merge table is larger than the caches: touch every first-round slot
         * before reading any, so that their misses overlap instead of queueing. */
        for (size_t i = 0; i + 1 < n; i++) {
            uint64_t key = (((uint64_t)(uint32_t)sy[i].id << 32) | (uint32_t)sy[i + 1].id) + 1;
            __builtin_prefetch(&tok->mmap[rt__merge_slot(key, tok->mmap_mask)]);
        }
        size_t nh = 0;
        for (size_t i = 0; i + 1 < n; i++)
            try_pair(tok, tok->heap, &nh, (int32_t)i, (int32_t)i + 1);
        while (nh) {
            rt__pair_t pr = rt__heap_pop(tok->heap, &nh);
            rt__sym_t *l = &sy[pr.left];
            /* Stale when either side has merged since the pair was pushed. */
            if (l->id != pr.lid || l->next != pr.right || sy[pr.right].id != pr.rid)
                continue;
            rt__sym_t *r = &sy[pr.right];
            l->id = pr.id;
            l->next = r->next;
            if (r->next >= 0)
                sy[r->next].prev = pr.left;
            r->id = -2; /* dead: absorbed into its left neighbour */
            try_pair(tok, tok->heap, &nh, l->prev, pr.left);
            try_pair(tok, tok->heap, &nh, pr.left, l->next);
        }
        /* Symbol 0 is never absorbed (only right symbols are), so the list starts
         * there. A byte no token covers (id -1) is dropped. */
        for (int32_t i = 0; i >= 0; i = sy[i].next)
            if (sy[i].id >= 0 && rt_tokens_push(out, sy[i].id))
                return BL_ENOMEM;
    }

    size_t nids = out->n - first;
    if (slot && nids <= RT__CACHE_IDS) {
        slot->hash = h;
        slot->wlen = (uint8_t)n;
        slot->nids = (uint8_t)nids;
        memcpy(slot->word, w, n);
        memcpy(slot->ids, out->ids + first, nids * sizeof *out->ids);
    }
    return 0;
}

int rt__bpe_encode(rt_tokenizer_t *tok, const char *s, size_t n, rt_tokens_t *out,
                   bl_err_t *err)
{
    rt__span_t *pcs;
    size_t np;
    int rc = rt__pretokenize(tok, s, n, &pcs, &np, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < np; i++)
        if (encode_word(tok, (const uint8_t *)s + pcs[i].off, pcs[i].len, out))
            return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for the ids of a %zu-byte "
                              "word", pcs[i].len);
    return 0;
}
