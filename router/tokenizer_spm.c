/* SentencePiece BPE ("llama" vocabularies): characters merge pairwise, the pair
 * whose joined text is the token with the highest score first; characters left
 * that are not tokens fall back to <0xXX> byte tokens. */
#include "tokenizer_impl.h"

#include <string.h>

/* Symbols are contiguous in s, so the text of two neighbours is one span of s. */
static void try_pair(const rt_tokenizer_t *tok, const char *s, rt__pair_t *h, size_t *nh,
                     int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const rt__sym_t *a = &tok->syms[l], *b = &tok->syms[r];
    int32_t id = rt__lookup(tok, s + a->start, a->len + b->len);
    if (id < 0)
        return;
    rt__heap_push(h, nh, (rt__pair_t){ .prio = -(double)tok->scores[id], .left = l, .right = r,
                                   .lid = (int32_t)a->len, .rid = (int32_t)b->len, .id = id });
}

int rt__spm_encode(rt_tokenizer_t *tok, const char *s, size_t n, rt_tokens_t *out,
                   bl_err_t *err)
{
    if (n == 0)
        return 0;
    if (n > INT32_MAX)
        return bl_err_set(err, BL_ERANGE, "tokenizer: a fragment of %zu bytes is too long", n);
    void *p = tok->syms;
    if (rt__reserve(&p, &tok->syms_cap, n, sizeof *tok->syms))
        goto nomem;
    tok->syms = p;
    p = tok->heap;
    if (rt__reserve(&p, &tok->heap_cap, 3 * n, sizeof *tok->heap))
        goto nomem;
    tok->heap = p;

    /* One symbol per character (the text is valid UTF-8 by now). */
    rt__sym_t *sy = tok->syms;
    int32_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = rt__utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0)
            k = 1;
        sy[ns] = (rt__sym_t){ .id = 0, .prev = ns - 1, .next = ns + 1, .start = (uint32_t)i,
                              .len = (uint32_t)k };
        ns++;
        i += (size_t)k;
    }
    sy[ns - 1].next = -1;

    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        try_pair(tok, s, tok->heap, &nh, i, i + 1);
    while (nh) {
        rt__pair_t pr = rt__heap_pop(tok->heap, &nh);
        rt__sym_t *l = &sy[pr.left], *r = &sy[pr.right];
        /* Stale when either side has grown or been absorbed since the push. */
        if (l->len != (uint32_t)pr.lid || r->len != (uint32_t)pr.rid || l->next != pr.right)
            continue;
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0)
            sy[r->next].prev = pr.left;
        r->len = 0;
        try_pair(tok, s, tok->heap, &nh, l->prev, pr.left);
        try_pair(tok, s, tok->heap, &nh, pr.left, l->next);
    }

    for (int32_t i = 0; i >= 0; i = sy[i].next) {
        int32_t id = rt__lookup(tok, s + sy[i].start, sy[i].len);
        if (id >= 0) {
            if (rt_tokens_push(out, id))
                goto nomem;
            continue;
        }
        /* Byte fallback; a byte without a <0xXX> token becomes unk, or is dropped
         * when there is no unk either. */
        for (uint32_t k = 0; k < sy[i].len; k++) {
            int32_t b = tok->byte_tok[(uint8_t)s[sy[i].start + k]];
            if (b < 0)
                b = tok->unk;
            if (b >= 0 && rt_tokens_push(out, b))
                goto nomem;
        }
    }
    return 0;
nomem:
    return bl_err_set(err, BL_ENOMEM, "tokenizer: no memory for %zu bytes of text", n);
}
