/* N-gram speculation: the proposers (ngram.h). */
#include "ngram.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Whether toks[j, j + len) equals pat[0, len). */
static int same(const int32_t *toks, int64_t j, const int32_t *pat, int len)
{
    return toks[j] == pat[0] && memcmp(toks + j, pat, (size_t)len * sizeof *pat) == 0;
}

int rt_ngram_simple(const int32_t *toks, int64_t n, int size_n, int size_m, int32_t *out, int cap)
{
    const int64_t cur = n - 1; /* the tokens before the pending one, llama.cpp's history */
    if (!toks || size_n < 1 || size_m < 1 || cap < 1 || cur <= (int64_t)size_n + size_m + 1)
        return 0;
    const int32_t *pat = toks + n - size_n; /* ends with the pending token */
    /* newest first, as llama.cpp's: from the window that ends two tokens before the
     * pending one (the one after it would overlap the pattern by all but a token),
     * and never at 0 */
    int64_t at = 0;
    for (int64_t j = cur - size_n - 1; j > 0 && !at; j--)
        if (same(toks, j, pat, size_n))
            at = j;
    if (at == 0)
        return 0;
    int64_t k = cur - (at + size_n); /* tokens after the match, before the pending one */
    if (k > size_m)
        k = size_m;
    if (k < size_n)
        return 0;
    if (k > cap)
        k = cap;
    memcpy(out, toks + at + size_n, (size_t)k * sizeof *out);
    return (int)k;
}

void rt_ngram_map_begin(rt_ngram_map_t *m, int size_n, int size_m, int64_t begin)
{
    /* the keys at or past `cut` go: none when the new prompt holds all the slot saw */
    int64_t cut = m->begin;
    if (cut > begin)
        cut = begin > (int64_t)size_n + size_m ? begin - size_n - size_m : 0;
    if (begin >= m->seen)
        cut = INT64_MAX;
    if (size_n != m->size_n)
        cut = 0;
    int k = 0;
    for (int i = 0; i < m->n_keys; i++)
        if (m->key_at[i] < cut) {
            m->key_at[k] = m->key_at[i];
            m->taken[k] = m->taken[i];
            k++;
        }
    m->n_keys = k;
    m->size_n = size_n;
    m->size_m = size_m;
    m->begin = begin;
    m->seen = begin;
    m->last = -1;
}

int rt_ngram_map_draft(rt_ngram_map_t *m, const int32_t *toks, int64_t n, int32_t *out, int cap)
{
    m->last = -1;
    if (n > m->seen)
        m->seen = n;
    const int sn = m->size_n, sm = m->size_m;
    const int64_t cur = n - 1; /* before the pending token */
    if (!toks || sn < 1 || sm < 1 || cap < 1 || cur < 2 * (int64_t)sn + sm)
        return 0;
    const int32_t *key = toks + n - sn;
    int64_t at = 0, j;
    /* the prompt first (newest there first), then the reply */
    for (j = m->begin - sn - sm - 1; j > 0 && !at; j--)
        if (j + sn + sm < cur && same(toks, j, key, sn))
            at = j;
    for (j = cur - sn - sm - 1; j > m->begin && j > 0 && !at; j--)
        if (same(toks, j, key, sn))
            at = j;
    if (!at)
        return 0;
    int k = 0;
    while (k < m->n_keys && !same(toks, m->key_at[k], key, sn))
        k++;
    if (k == m->n_keys) {
        if (m->n_keys == m->cap) {
            const int c = m->cap ? 2 * m->cap : 64;
            if (c > RT_NGRAM_MAP_KEYS)
                return 0;
            int64_t *ka = realloc(m->key_at, (size_t)c * sizeof *ka);
            if (ka)
                m->key_at = ka;
            int16_t *tk = ka ? realloc(m->taken, (size_t)c * sizeof *tk) : NULL;
            if (tk)
                m->taken = tk;
            if (!ka || !tk)
                return 0;
            m->cap = c;
        }
        m->key_at[k] = at;
        m->taken[k] = (int16_t)sm;
        m->n_keys++;
    }
    int d = m->taken[k] < sm ? m->taken[k] : sm;
    if (d > cap)
        d = cap;
    memcpy(out, toks + at + sn, (size_t)d * sizeof *out);
    m->last = d > 0 ? k : -1;
    return d;
}

void rt_ngram_map_accept(rt_ngram_map_t *m, int taken)
{
    if (m->last >= 0 && m->last < m->n_keys && taken >= 0)
        m->taken[m->last] = (int16_t)(taken < m->size_m ? taken : m->size_m);
    m->last = -1;
}

void rt_ngram_map_free(rt_ngram_map_t *m)
{
    free(m->key_at);
    free(m->taken);
    memset(m, 0, sizeof *m);
    m->last = -1;
}

struct rt_ngram_mod {
    int size_n;
    size_t mask; /* entries - 1 */
    size_t used;
    int32_t *tab; /* the token after an n-gram of this hash, or -1 */
};

rt_ngram_mod_t *rt_ngram_mod_new(int size_n, size_t entries)
{
    if (size_n < 1 || size_n > RT_NGRAM_MAX_N || entries > ((size_t)1 << 30))
        return NULL;
    size_t cap = 1024;
    while (cap < entries)
        cap <<= 1;
    rt_ngram_mod_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->tab = malloc(cap * sizeof *m->tab);
    if (!m->tab) {
        free(m);
        return NULL;
    }
    m->size_n = size_n;
    m->mask = cap - 1;
    rt_ngram_mod_reset(m);
    return m;
}

void rt_ngram_mod_free(rt_ngram_mod_t *m)
{
    if (m) {
        free(m->tab);
        free(m);
    }
}

void rt_ngram_mod_reset(rt_ngram_mod_t *m)
{
    memset(m->tab, 0xff, (m->mask + 1) * sizeof *m->tab);
    m->used = 0;
}

int rt_ngram_mod_size_n(const rt_ngram_mod_t *m) { return m->size_n; }
size_t rt_ngram_mod_used(const rt_ngram_mod_t *m) { return m->used; }
size_t rt_ngram_mod_entries(const rt_ngram_mod_t *m) { return m->mask + 1; }

/* FNV-1a over the tokens' 32-bit values, then a final mix so the low bits (the
 * index) depend on every token. */
static uint64_t mix(uint64_t h, int32_t t)
{
    return (h ^ (uint32_t)t) * 0x100000001b3ull;
}

static size_t slot_of(const rt_ngram_mod_t *m, uint64_t h)
{
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (size_t)h & m->mask;
}

static uint64_t hash_of(const int32_t *g, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++)
        h = mix(h, g[i]);
    return h;
}

int64_t rt_ngram_mod_add(rt_ngram_mod_t *m, const int32_t *toks, int64_t n, int64_t from)
{
    const int sn = m->size_n;
    if (from < 0)
        from = 0;
    int64_t i = from;
    for (; i + sn < n; i++) { /* the n-gram toks[i, i + sn) and the token after it */
        const int32_t next = toks[i + sn];
        if (next < 0)
            continue;
        int32_t *e = &m->tab[slot_of(m, hash_of(toks + i, sn))];
        m->used += *e < 0;
        *e = next;
    }
    return i > from ? i : from;
}

int rt_ngram_mod_draft(const rt_ngram_mod_t *m, const int32_t *toks, int64_t n, int n_min, int n_max,
                       int32_t *out, int cap)
{
    const int sn = m->size_n;
    if (!toks || n < sn || n_max < 1 || cap < 1)
        return 0;
    if (n_max > cap)
        n_max = cap;
    int k = 0;
    while (k < n_max) {
        /* the window: the last sn tokens of toks followed by out[0, k) */
        uint64_t h = 0xcbf29ce484222325ull;
        for (int j = k; j < k + sn; j++)
            h = mix(h, j < sn ? toks[n - sn + j] : out[j - sn]);
        const int32_t t = m->tab[slot_of(m, h)];
        if (t < 0)
            break;
        out[k++] = t;
    }
    return k < n_min ? 0 : k;
}
