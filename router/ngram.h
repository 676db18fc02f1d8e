/* N-gram speculation (--spec-type ngram-simple, ngram-mod): proposals for a slot's
 * next tokens taken from text it has seen, with no draft model. The engine verifies
 * them as it verifies a draft model's (a step evaluates the pending token and the
 * proposals; the model's own tokens decide), so the text is the model's whatever
 * these propose.
 *
 * toks[0, n) is a slot's sequence up to and including its pending token (the one
 * sampled last, not yet evaluated): the n-gram looked up always ends with it. */
#ifndef RT_NGRAM_H
#define RT_NGRAM_H

#include <stddef.h>
#include <stdint.h>

#define RT_NGRAM_MAX_N 1024 /* the longest n-gram looked up (llama.cpp's bound) */

/* ngram-simple, as llama.cpp's: the last size_n tokens of toks (the pending one
 * last) are searched backwards for their newest earlier occurrence that ends at
 * least two tokens before the pending one and does not start at position 0; the
 * tokens that followed it, before the pending one, are proposed: at most size_m and
 * cap, and none when fewer than size_n follow it (a short run is more likely a
 * coincidence), when there are no more than size_n + size_m + 1 tokens before the
 * pending one, or when nothing matches. Returns how many went to out. */
int rt_ngram_simple(const int32_t *toks, int64_t n, int size_n, int size_m, int32_t *out, int cap);

/* ngram-map-k, as llama.cpp's: ngram-simple's lookup, with the prompt searched
 * first and the reply after it, and a memory per key n-gram of how many of its
 * last proposals the model took: a key proposes that many next time (size_m at
 * first), so a key whose proposals failed proposes nothing again. One a slot,
 * kept across its tasks as rt_ngram_map_begin says. */
typedef struct rt_ngram_map {
    int size_n, size_m;
    int64_t begin;      /* the task's prompt length: where its reply begins */
    int64_t seen;       /* the longest sequence a proposal was asked for (through its
                         * pending token) */
    int n_keys, cap;
    int64_t *key_at;    /* where each key n-gram was found */
    int16_t *taken;     /* how many of its last proposals were taken */
    int last;           /* the key of the last proposals, or -1 */
} rt_ngram_map_t;

#define RT_NGRAM_MAP_KEYS 4096 /* keys a slot remembers; past them new keys propose nothing */

/* A task of prompt length begin starts in the slot. A prompt at least as long as
 * what the slot's last task saw (a chat that goes on: its prompt holds that text and
 * more) keeps every key and what it learned; a shorter one keeps the keys found
 * before the last task's prompt ended, those before its own last size_n + size_m
 * tokens when it is shorter still; keys of another size_n go. A kept key proposes
 * only where its n-gram still stands at its place (the lookup compares the tokens).
 * As llama.cpp's ngram-map-k begins. */
void rt_ngram_map_begin(rt_ngram_map_t *m, int size_n, int size_m, int64_t begin);
/* Proposals for toks[0, n) (the pending token last) into out, at most cap; the
 * count, 0 without memory for a new key. */
int rt_ngram_map_draft(rt_ngram_map_t *m, const int32_t *toks, int64_t n, int32_t *out, int cap);
/* The model took taken of the last proposals. */
void rt_ngram_map_accept(rt_ngram_map_t *m, int taken);
void rt_ngram_map_free(rt_ngram_map_t *m);

/* ngram-mod: a table shared by the slots that maps the hash of size_n tokens to the
 * token that followed them last (a later occurrence overwrites; two n-grams of one
 * hash share an entry, and the verification throws out what that proposes). */
typedef struct rt_ngram_mod rt_ngram_mod_t;

/* A table of entries slots (rounded up to a power of two, at least 1024) for
 * n-grams of size_n (1..RT_NGRAM_MAX_N); NULL without memory. */
rt_ngram_mod_t *rt_ngram_mod_new(int size_n, size_t entries);
void rt_ngram_mod_free(rt_ngram_mod_t *m);
void rt_ngram_mod_reset(rt_ngram_mod_t *m);
int rt_ngram_mod_size_n(const rt_ngram_mod_t *m);
size_t rt_ngram_mod_used(const rt_ngram_mod_t *m);    /* entries that hold a token */
size_t rt_ngram_mod_entries(const rt_ngram_mod_t *m);
/* Records the n-grams of toks[0, n) that have a token after them, those starting
 * at from.. (the caller's mark of what it added before); returns the new mark. */
int64_t rt_ngram_mod_add(rt_ngram_mod_t *m, const int32_t *toks, int64_t n, int64_t from);
/* Proposes by chaining: the token recorded after the last size_n tokens of toks,
 * then the one after the window moved on by that token, and so on, at most n_max
 * (and cap); none at all when the chain breaks before n_min. Returns the count. */
int rt_ngram_mod_draft(const rt_ngram_mod_t *m, const int32_t *toks, int64_t n, int n_min, int n_max,
                       int32_t *out, int cap);

#endif
