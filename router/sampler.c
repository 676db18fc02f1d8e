/* Token sampling: llama-server's chain over one row of logits. See sampler.h for
 * the order; each stage below narrows or reweights the candidate list in place. */
#include "sampler.h"

#include "args.h"
#include "grammar.h"
#include "rng.h"
#include "tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

typedef struct cand {
    int32_t id;
    float logit;
    float p;   /* probability, filled by softmax() */
    float key; /* a stage's own sort key (typical-p: distance from the entropy) */
} cand_t;

struct rt_sampler {
    rt_sampler_params_t p; /* p.logit_bias points at bias below */
    const rt_tokenizer_t *tok; /* the infill stage's vocabulary; may be NULL */
    rt_logit_bias_t *bias;
    /* the biases in token order for take_top_k: the entries sorted by (token, place
     * in the list), and the n_bias_tok tokens they name with their biased logits */
    struct bias_at { int32_t token; uint32_t at; } *bias_sorted;
    int32_t *bias_tok;
    float *bias_val;
    size_t n_bias_tok;
    int full_path;         /* rt_sampler_full_path: no take_top_k */
    int32_t n_vocab;
    uint32_t seed;
    bl_rng_t rng;

    /* penalty window: the last `window` accepted tokens, a ring */
    int32_t window;
    int32_t *ring;
    int32_t ring_head, ring_len;
    uint32_t *counts;      /* (n_vocab) occurrences in the window, zero between calls */

    rt_grammar_t *grammar; /* compiled params.grammar, or NULL */
    rt_grammar_match_t *gm; /* where the generated text leaves the grammar */
    /* with a grammar: the vocabulary's pieces as a trie (end tokens left out, as the
     * grammar's completion decides them), and the scan's answer per token */
    const rt_grammar_vocab_t *vocab; /* borrowed, or own_vocab */
    rt_grammar_vocab_t *own_vocab;
    unsigned char *allowed; /* (n_vocab) */

    /* the thought budget (params.think_budget): where the generated text stands */
    int think;             /* THINK_MAYBE, THINK_IN, THINK_OUT */
    int32_t think_used;    /* tokens of the thought so far */
    const char *tag[2];    /* the thought's open and close tags */
    size_t tag_n[2];
    char think_tail[RT_SAMPLER_MAX_TAG]; /* the last bytes generated: a tag being written */
    size_t think_tail_n;
    const char *close_need; /* while forcing: the rest of the end tag, close_n bytes */
    size_t close_n;

    cand_t *cand;          /* (n_vocab) candidate list of the current call */
    size_t n_cand;
    int cand_sorted;       /* cand is in descending logit order */
};

enum { THINK_MAYBE, THINK_IN, THINK_OUT };

// --- random numbers ------------------------------------------------------------------

static void seed_rng(rt_sampler_t *s) { bl_rng_seed(&s->rng, s->seed); }

static uint32_t random_seed(void)
{
    uint32_t v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v && v != RT_SEED_RANDOM)
        return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v = (uint32_t)(ts.tv_nsec ^ ts.tv_sec ^ (uint64_t)(uintptr_t)&ts);
    return v == RT_SEED_RANDOM ? 0 : v;
}

// --- parameters -----------------------------------------------------------------------

/* llama-server's default order of the stages (less dry, top_n_sigma and xtc,
 * which are off). */
static const uint8_t default_chain[] = {
    RT_STAGE_PENALTIES, RT_STAGE_TOP_K, RT_STAGE_TYPICAL_P,
    RT_STAGE_TOP_P,     RT_STAGE_MIN_P, RT_STAGE_TEMPERATURE,
};

static const char *const stage_names[] = {
    [RT_STAGE_PENALTIES] = "penalties", [RT_STAGE_DRY] = "dry",
    [RT_STAGE_TOP_N_SIGMA] = "top_n_sigma", [RT_STAGE_TOP_K] = "top_k",
    [RT_STAGE_TYPICAL_P] = "typ_p",     [RT_STAGE_TOP_P] = "top_p",
    [RT_STAGE_MIN_P] = "min_p",         [RT_STAGE_XTC] = "xtc",
    [RT_STAGE_TEMPERATURE] = "temperature", [RT_STAGE_INFILL] = "infill",
};

const char *rt_sampler_stage_name(int stage)
{
    return stage >= 0 && stage <= RT_STAGE_INFILL ? stage_names[stage] : "";
}

int rt_sampler_chain_add(rt_sampler_params_t *s, const char *text, size_t len, int letters,
                         bl_err_t *err)
{
    for (size_t i = 0; i < (letters ? len : 1); i++) {
        const int st = letters ? rt_sampler_stage_by_char(text[i]) : rt_sampler_stage_by_name(text, len);
        if (st < 0 && letters)
            return bl_err_set(err, BL_EINVAL, "'%c' is not a sampler letter (e d s k y p m x t i)",
                              text[i] >= ' ' && text[i] < 127 ? text[i] : '?');
        if (st < 0)
            return bl_err_set(err, BL_EINVAL, "unknown sampler \"%.*s\"",
                              (int)(len > 64 ? 64 : len), text);
        if (s->n_stages >= RT_SAMPLER_MAX_STAGES)
            return bl_err_set(err, BL_EINVAL, "more than %d samplers", RT_SAMPLER_MAX_STAGES);
        s->stages[s->n_stages++] = (uint8_t)st;
    }
    return 0;
}

int rt_sampler_stage_by_name(const char *name, size_t len)
{
    static const struct {
        const char *name;
        int stage;
    } names[] = {
        {"penalties", RT_STAGE_PENALTIES}, {"dry", RT_STAGE_DRY},
        {"top_n_sigma", RT_STAGE_TOP_N_SIGMA}, {"top_k", RT_STAGE_TOP_K},
        {"top-k", RT_STAGE_TOP_K},         {"typ_p", RT_STAGE_TYPICAL_P},
        {"typical_p", RT_STAGE_TYPICAL_P}, {"typical-p", RT_STAGE_TYPICAL_P},
        {"typical", RT_STAGE_TYPICAL_P},   {"typ-p", RT_STAGE_TYPICAL_P},
        {"typ", RT_STAGE_TYPICAL_P},       {"top_p", RT_STAGE_TOP_P},
        {"top-p", RT_STAGE_TOP_P},         {"nucleus", RT_STAGE_TOP_P},
        {"min_p", RT_STAGE_MIN_P},         {"min-p", RT_STAGE_MIN_P},
        {"xtc", RT_STAGE_XTC},             {"temperature", RT_STAGE_TEMPERATURE},
        {"temp", RT_STAGE_TEMPERATURE},    {"infill", RT_STAGE_INFILL},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strlen(names[i].name) == len && memcmp(names[i].name, name, len) == 0)
            return names[i].stage;
    return -1;
}

int rt_sampler_stage_by_char(char c)
{
    switch (c) {
    case 'e': return RT_STAGE_PENALTIES;
    case 'd': return RT_STAGE_DRY;
    case 's': return RT_STAGE_TOP_N_SIGMA;
    case 'k': return RT_STAGE_TOP_K;
    case 'y': return RT_STAGE_TYPICAL_P;
    case 'p': return RT_STAGE_TOP_P;
    case 'm': return RT_STAGE_MIN_P;
    case 'x': return RT_STAGE_XTC;
    case 't': return RT_STAGE_TEMPERATURE;
    case 'i': return RT_STAGE_INFILL;
    default: return -1;
    }
}

void rt_sampler_params_default(rt_sampler_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->typical_p = 1.0f;
    p->penalty_last_n = 64;
    p->repeat_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->min_keep = 0;
    p->seed = RT_SEED_RANDOM;
    memcpy(p->stages, default_chain, sizeof default_chain);
    p->n_stages = (int)sizeof default_chain;
}

int rt_sampler_params_check(const rt_sampler_params_t *p, int32_t n_vocab, bl_err_t *err)
{
    const struct { const char *name; float v; } finite[] = {
        {"temperature", p->temp},         {"top_p", p->top_p},
        {"min_p", p->min_p},              {"typical_p", p->typical_p},
        {"repeat_penalty", p->repeat_penalty}, {"presence_penalty", p->presence_penalty},
        {"frequency_penalty", p->frequency_penalty},
    };
    for (size_t i = 0; i < sizeof finite / sizeof finite[0]; i++)
        if (!isfinite(finite[i].v))
            return bl_err_set(err, BL_EINVAL, "sampler: %s is not a finite number", finite[i].name);
    if (p->top_p < 0 || p->top_p > 1)
        return bl_err_set(err, BL_EINVAL, "sampler: top_p %g is outside [0, 1]", p->top_p);
    if (p->think_budget < 0)
        return bl_err_set(err, BL_EINVAL, "sampler: thought budget %d is negative",
                          (int)p->think_budget);
    if (p->min_p < 0 || p->min_p > 1)
        return bl_err_set(err, BL_EINVAL, "sampler: min_p %g is outside [0, 1]", p->min_p);
    if (p->typical_p < 0 || p->typical_p > 1)
        return bl_err_set(err, BL_EINVAL, "sampler: typical_p %g is outside [0, 1]", p->typical_p);
    if (p->repeat_penalty <= 0)
        return bl_err_set(err, BL_EINVAL, "sampler: repeat_penalty %g must be positive",
                          p->repeat_penalty);
    if (p->penalty_last_n < -1)
        return bl_err_set(err, BL_EINVAL, "sampler: repeat_last_n %d must be -1 or more",
                          p->penalty_last_n);
    if (p->min_keep < 0)
        return bl_err_set(err, BL_EINVAL, "sampler: min_keep %d is negative", p->min_keep);
    if (p->n_logit_bias && !p->logit_bias)
        return bl_err_set(err, BL_EINVAL, "sampler: logit_bias count without entries");
    if (p->n_stages < 0 || p->n_stages > RT_SAMPLER_MAX_STAGES)
        return bl_err_set(err, BL_EINVAL, "sampler: %d samplers (at most %d)", p->n_stages,
                          RT_SAMPLER_MAX_STAGES);
    for (int i = 0; i < p->n_stages; i++)
        if (p->stages[i] > RT_STAGE_INFILL)
            return bl_err_set(err, BL_EINVAL, "sampler: samplers[%d] is not a stage", i);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        const rt_logit_bias_t *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return bl_err_set(err, BL_EINVAL,
                              "sampler: logit_bias token %d is outside the vocabulary (%d tokens)",
                              b->token, n_vocab);
        if (isnan(b->bias) || b->bias == INFINITY)
            return bl_err_set(err, BL_EINVAL, "sampler: logit_bias for token %d is %g",
                              b->token, b->bias);
    }
    return 0;
}

// --- life cycle -------------------------------------------------------------------------

int rt_sampler_grammar_vocab(rt_grammar_vocab_t **out, const rt_tokenizer_t *tok, bl_err_t *err)
{
    *out = NULL;
    int32_t n = rt_tokenizer_n_vocab(tok);
    const char **pieces = malloc((size_t)(n > 0 ? n : 1) * sizeof *pieces);
    size_t *lens = malloc((size_t)(n > 0 ? n : 1) * sizeof *lens);
    int rc;
    if (!pieces || !lens) {
        rc = bl_err_set(err, BL_ENOMEM, "sampler: out of memory for the grammar's vocabulary");
    } else {
        /* every token's piece but the end tokens': the grammar's completion decides them */
        for (int32_t i = 0; i < n; i++) {
            rt_str_t piece = rt_tokenizer_piece(tok, i);
            pieces[i] = piece.ptr;
            lens[i] = rt_tokenizer_is_eog(tok, i) ? 0 : piece.len;
        }
        rc = rt_grammar_vocab_create(out, pieces, lens, n, err);
    }
    free(pieces);
    free(lens);
    return rc;
}

static int grammar_vocab(rt_sampler_t *s, const rt_grammar_vocab_t *shared, bl_err_t *err)
{
    s->allowed = calloc((size_t)s->n_vocab, 1);
    if (!s->allowed)
        return bl_err_set(err, BL_ENOMEM, "sampler: out of memory for the grammar's vocabulary");
    if (shared) {
        s->vocab = shared;
        return 0;
    }
    int rc = rt_sampler_grammar_vocab(&s->own_vocab, s->tok, err);
    s->vocab = s->own_vocab;
    return rc;
}

/* The biases by token, then by their place in the list (qsort is not stable). */
static int by_token_then_place(const void *a, const void *b)
{
    const struct bias_at *x = a, *y = b;
    if (x->token != y->token)
        return x->token < y->token ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

void rt_sampler_full_path(rt_sampler_t *s) { s->full_path = 1; }

int rt_sampler_create(rt_sampler_t **out, const rt_sampler_params_t *p, int32_t n_vocab,
                      int32_t n_ctx, const rt_tokenizer_t *tok, bl_err_t *err)
{
    *out = NULL;
    if (n_vocab <= 0)
        return bl_err_set(err, BL_EINVAL, "sampler: vocabulary size %d", n_vocab);
    int rc = rt_sampler_params_check(p, n_vocab, err);
    if (rc)
        return rc;
    if (!tok && memchr(p->stages, RT_STAGE_INFILL, (size_t)p->n_stages))
        return bl_err_set(err, BL_EINVAL, "sampler: the infill sampler needs the vocabulary");
    if (!tok && p->grammar)
        return bl_err_set(err, BL_EINVAL, "sampler: a grammar needs the vocabulary");
    if (!tok && p->think_budget > 0)
        return bl_err_set(err, BL_EINVAL, "sampler: a thought budget needs the vocabulary");
    static const char *const DEFAULT_TAGS[2] = {"<think>", "</think>"};
    for (int i = 0; i < 2; i++) {
        const char *t = p->think_tags[i] ? p->think_tags[i] : DEFAULT_TAGS[i];
        if (!*t || strlen(t) > RT_SAMPLER_MAX_TAG)
            return bl_err_set(err, BL_EINVAL, "sampler: a thought tag of %zu bytes (1 to %d)",
                              strlen(t), RT_SAMPLER_MAX_TAG);
    }

    rt_sampler_t *s = calloc(1, sizeof *s);
    if (!s)
        return bl_err_set(err, BL_ENOMEM, "sampler: out of memory");
    s->p = *p;
    s->tok = tok;
    for (int i = 0; i < 2; i++) {
        s->tag[i] = p->think_tags[i] ? p->think_tags[i] : DEFAULT_TAGS[i];
        s->tag_n[i] = strlen(s->tag[i]);
    }
    s->n_vocab = n_vocab;
    s->window = p->penalty_last_n == -1 ? (n_ctx > 0 ? n_ctx : 0) : p->penalty_last_n;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->ring = malloc((size_t)(s->window > 0 ? s->window : 1) * sizeof *s->ring);
    if (p->n_logit_bias) {
        s->bias = malloc(p->n_logit_bias * sizeof *s->bias);
        s->bias_sorted = malloc(p->n_logit_bias * sizeof *s->bias_sorted);
        s->bias_tok = malloc(p->n_logit_bias * sizeof *s->bias_tok);
        s->bias_val = malloc(p->n_logit_bias * sizeof *s->bias_val);
    }
    if (!s->cand || !s->counts || !s->ring ||
        (p->n_logit_bias && (!s->bias || !s->bias_sorted || !s->bias_tok || !s->bias_val))) {
        rt_sampler_destroy(s);
        return bl_err_set(err, BL_ENOMEM, "sampler: out of memory for %d tokens", n_vocab);
    }
    if (p->n_logit_bias) {
        memcpy(s->bias, p->logit_bias, p->n_logit_bias * sizeof *s->bias);
        for (size_t i = 0; i < p->n_logit_bias; i++)
            s->bias_sorted[i] = (struct bias_at){p->logit_bias[i].token, (uint32_t)i};
        qsort(s->bias_sorted, p->n_logit_bias, sizeof *s->bias_sorted, by_token_then_place);
        for (size_t i = 0; i < p->n_logit_bias; i++)
            if (i == 0 || s->bias_sorted[i].token != s->bias_sorted[i - 1].token)
                s->bias_tok[s->n_bias_tok++] = s->bias_sorted[i].token;
    }
    s->p.logit_bias = s->bias;
    s->p.grammar = NULL; /* borrowed text: only the compiled form is kept */
    if (p->grammar && ((rc = rt_grammar_parse(&s->grammar, p->grammar, p->grammar_len, err)) ||
                       (rc = rt_grammar_match_create(&s->gm, s->grammar, err)) ||
                       (rc = grammar_vocab(s, p->grammar_vocab, err)))) {
        rt_sampler_destroy(s);
        return rc;
    }
    s->seed = p->seed == RT_SEED_RANDOM ? random_seed() : p->seed;
    seed_rng(s);
    s->think = p->think_open ? THINK_IN : THINK_MAYBE;
    *out = s;
    return 0;
}

void rt_sampler_destroy(rt_sampler_t *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s->counts);
    free(s->ring);
    free(s->bias);
    free(s->bias_sorted);
    free(s->bias_tok);
    free(s->bias_val);
    rt_grammar_match_destroy(s->gm);
    rt_grammar_destroy(s->grammar);
    rt_grammar_vocab_destroy(s->own_vocab);
    free(s->allowed);
    free(s);
}

uint32_t rt_sampler_seed(const rt_sampler_t *s) { return s->seed; }

void rt_sampler_accept(rt_sampler_t *s, int32_t token)
{
    if (s->window <= 0 || token < 0 || token >= s->n_vocab)
        return;
    s->ring[(s->ring_head + s->ring_len) % s->window] = token;
    if (s->ring_len < s->window)
        s->ring_len++;
    else
        s->ring_head = (s->ring_head + 1) % s->window;
}

/* Follows the generated text for the thought budget: a thought opens with the text's
 * first bytes the open tag (or at the start, with think_open) and ends at the close
 * tag. */
static void think_feed(rt_sampler_t *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n && s->think != THINK_OUT; i++) {
        if (s->think_tail_n == sizeof s->think_tail) {
            memmove(s->think_tail, s->think_tail + 1, sizeof s->think_tail - 1);
            s->think_tail_n--;
        }
        s->think_tail[s->think_tail_n++] = p[i];
        if (s->think == THINK_MAYBE) {
            /* only a reply that begins with the open tag has a thought */
            if (memcmp(s->think_tail, s->tag[0], s->think_tail_n) != 0)
                s->think = THINK_OUT;
            else if (s->think_tail_n == s->tag_n[0]) {
                s->think = THINK_IN;
                s->think_tail_n = 0;
            }
        } else if (s->think_tail_n >= s->tag_n[1] &&
                   !memcmp(s->think_tail + s->think_tail_n - s->tag_n[1], s->tag[1],
                           s->tag_n[1])) {
            s->think = THINK_OUT;
        }
    }
}

/* Whether the thought is over its budget; then close_need says what must follow:
 * the end tag less what the text already ends with of it. */
static int think_forced(rt_sampler_t *s)
{
    if (s->p.think_budget <= 0 || s->think != THINK_IN ||
        s->think_used < s->p.think_budget)
        return 0;
    const size_t tag_n = s->tag_n[1];
    size_t k = s->think_tail_n < tag_n - 1 ? s->think_tail_n : tag_n - 1;
    for (; k > 0; k--)
        if (!memcmp(s->think_tail + s->think_tail_n - k, s->tag[1], k))
            break;
    s->close_need = s->tag[1] + k;
    s->close_n = tag_n - k;
    return 1;
}

/* While forcing: a token may come when its piece goes on with the end tag (and the
 * grammar decides what comes after the tag's last byte). */
static int close_allows(const rt_sampler_t *s, int32_t id)
{
    if (rt_tokenizer_is_eog(s->tok, id))
        return 0;
    rt_str_t piece = rt_tokenizer_piece(s->tok, id);
    size_t m = piece.len < s->close_n ? piece.len : s->close_n;
    return piece.len > 0 && memcmp(piece.ptr, s->close_need, m) == 0;
}

void rt_sampler_accept_generated(rt_sampler_t *s, int32_t token)
{
    rt_sampler_accept(s, token);
    if (s->p.think_budget > 0 && s->think != THINK_OUT && !rt_tokenizer_is_eog(s->tok, token)) {
        int was_in = s->think == THINK_IN;
        rt_str_t piece = rt_tokenizer_piece(s->tok, token);
        think_feed(s, piece.ptr, piece.len);
        s->think_used += was_in || s->think == THINK_IN;
    }
    if (s->gm && !rt_tokenizer_is_eog(s->tok, token)) {
        rt_str_t piece = rt_tokenizer_piece(s->tok, token);
        /* sample() chose a token the grammar allows; a token from elsewhere that it
         * does not leaves the grammar where it was */
        int rc = rt_grammar_match_feed(s->gm, piece.ptr, piece.len);
        (void)rc;
    }
}

void rt_sampler_reset(rt_sampler_t *s)
{
    s->ring_head = s->ring_len = 0;
    s->think = s->p.think_open ? THINK_IN : THINK_MAYBE;
    s->think_used = 0;
    s->think_tail_n = 0;
    if (s->gm)
        rt_grammar_match_reset(s->gm);
    seed_rng(s);
}

// --- stages -------------------------------------------------------------------------------

static size_t keep_floor(const rt_sampler_t *s) { return s->p.min_keep > 1 ? (size_t)s->p.min_keep : 1; }

static int by_logit_desc(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id; /* ties: lower id first, for determinism */
}

static void sort_desc(rt_sampler_t *s)
{
    if (!s->cand_sorted)
        qsort(s->cand, s->n_cand, sizeof *s->cand, by_logit_desc);
    s->cand_sorted = 1;
}

/* Probabilities of the candidates (softmax of their logits, in double). */
static void softmax(rt_sampler_t *s)
{
    float max = -INFINITY;
    for (size_t i = 0; i < s->n_cand; i++)
        if (s->cand[i].logit > max)
            max = s->cand[i].logit;
    double sum = 0;
    for (size_t i = 0; i < s->n_cand; i++) {
        double e = s->cand[i].logit == -INFINITY ? 0.0 : exp((double)s->cand[i].logit - max);
        s->cand[i].p = (float)e;
        sum += e;
    }
    for (size_t i = 0; i < s->n_cand; i++)
        s->cand[i].p = (float)(s->cand[i].p / sum);
}

static void apply_penalties(rt_sampler_t *s)
{
    const rt_sampler_params_t *p = &s->p;
    if (s->ring_len == 0 ||
        (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f))
        return;
    for (int32_t i = 0; i < s->ring_len; i++)
        s->counts[s->ring[(s->ring_head + i) % s->window]]++;
    /* The candidate list is still the full vocabulary in id order here. */
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t t = s->ring[(s->ring_head + i) % s->window];
        uint32_t c = s->counts[t];
        if (c == 0)
            continue; /* already applied for an earlier copy of t */
        float *l = &s->cand[t].logit;
        /* a repeat penalty pushes the logit towards -inf whatever its sign */
        if (*l <= 0)
            *l *= p->repeat_penalty;
        else
            *l /= p->repeat_penalty;
        *l -= (float)c * p->frequency_penalty + p->presence_penalty;
        s->counts[t] = 0;
    }
}

/* Offers c to the min-heap h of the best k (n held; root = the smallest by
 * by_logit_desc). */
static void heap_offer(cand_t *h, size_t *n, size_t k, cand_t c)
{
    size_t j;
    if (*n < k) {
        j = (*n)++;
        while (j > 0) { /* sift up */
            size_t parent = (j - 1) / 2;
            if (by_logit_desc(&h[parent], &c) >= 0)
                break;
            h[j] = h[parent];
            j = parent;
        }
        h[j] = c;
        return;
    }
    if (by_logit_desc(&c, &h[0]) >= 0) /* not better than the smallest kept */
        return;
    j = 0;
    for (;;) { /* sift down */
        size_t l = 2 * j + 1, r = l + 1, m = j;
        const cand_t *mv = &c;
        if (l < *n && by_logit_desc(&h[l], mv) > 0)
            m = l, mv = &h[l];
        if (r < *n && by_logit_desc(&h[r], mv) > 0)
            m = r, mv = &h[r];
        if (m == j)
            break;
        h[j] = h[m];
        j = m;
    }
    h[j] = c;
}

/* Moves the k largest to the front, sorted. A bounded min-heap keeps it O(n log k). */
static void top_k(rt_sampler_t *s, size_t k)
{
    if (k >= s->n_cand)
        return;
    if (s->cand_sorted) {
        s->n_cand = k;
        return;
    }
    size_t n = 0; /* the heap grows in cand[0..n), behind the one read (n <= i) */
    for (size_t i = 0; i < s->n_cand; i++)
        heap_offer(s->cand, &n, k, s->cand[i]);
    s->n_cand = k;
    qsort(s->cand, k, sizeof *s->cand, by_logit_desc);
    s->cand_sorted = 1;
}

static int by_key_asc(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Locally typical sampling: keep the tokens whose surprise is closest to the
 * entropy of the distribution, until their mass reaches typical_p. */
static void typical(rt_sampler_t *s, float tp)
{
    softmax(s);
    double ent = 0;
    for (size_t i = 0; i < s->n_cand; i++)
        if (s->cand[i].p > 0)
            ent -= s->cand[i].p * log(s->cand[i].p);
    for (size_t i = 0; i < s->n_cand; i++) {
        double surprise = s->cand[i].p > 0 ? -log(s->cand[i].p) : INFINITY;
        s->cand[i].key = (float)fabs(surprise - ent);
    }
    qsort(s->cand, s->n_cand, sizeof *s->cand, by_key_asc);
    s->cand_sorted = 0;
    double cum = 0;
    for (size_t i = 0; i < s->n_cand; i++) {
        cum += s->cand[i].p;
        if (cum >= tp && i + 1 >= keep_floor(s)) {
            s->n_cand = i + 1;
            return;
        }
    }
}

static void top_p(rt_sampler_t *s, float tp)
{
    sort_desc(s);
    softmax(s);
    double cum = 0;
    for (size_t i = 0; i < s->n_cand; i++) {
        cum += s->cand[i].p;
        if (cum >= tp && i + 1 >= keep_floor(s)) {
            s->n_cand = i + 1;
            return;
        }
    }
}

/* Keeps the tokens at least min_p times as likely as the best: on logits, those
 * within log(min_p) of the largest. */
static void min_p(rt_sampler_t *s, float mp)
{
    float max = -INFINITY;
    for (size_t i = 0; i < s->n_cand; i++)
        if (s->cand[i].logit > max)
            max = s->cand[i].logit;
    float min_logit = max + logf(mp);
    size_t n = 0;
    for (size_t i = 0; i < s->n_cand; i++)
        n += s->cand[i].logit >= min_logit;
    if (n < keep_floor(s)) { /* too few pass: keep the best min_keep instead */
        sort_desc(s);
        if (keep_floor(s) < s->n_cand)
            s->n_cand = keep_floor(s);
        return;
    }
    n = 0;
    for (size_t i = 0; i < s->n_cand; i++)
        if (s->cand[i].logit >= min_logit)
            s->cand[n++] = s->cand[i];
    s->n_cand = n; /* filtering keeps the relative order, so sortedness stays */
}

static void temperature(rt_sampler_t *s, float t)
{
    if (t <= 0) { /* only the most likely survives */
        size_t best = 0;
        for (size_t i = 1; i < s->n_cand; i++)
            if (by_logit_desc(&s->cand[i], &s->cand[best]) < 0)
                best = i;
        s->cand[0] = s->cand[best];
        s->n_cand = 1;
        s->cand_sorted = 1;
        return;
    }
    for (size_t i = 0; i < s->n_cand; i++)
        s->cand[i].logit /= t;
}

/* The text of a candidate for the infill stage's prefix test: control tokens have
 * none (they are never a prefix of anything, as in llama.cpp). */
static rt_str_t infill_text(const rt_sampler_t *s, int32_t id)
{
    if (rt_tokenizer_token_type(s->tok, id) == RT_TOKEN_CONTROL)
        return (rt_str_t){NULL, 0};
    return rt_tokenizer_piece(s->tok, id);
}

/* Keeps the candidates keep() says yes to, renormalised; returns how many text
 * (not end-of-generation) tokens are kept. */
static size_t infill_keep(rt_sampler_t *s, float thold)
{
    size_t n = 0, n_text = 0;
    double sum = 0;
    for (size_t i = 0; i < s->n_cand; i++) {
        const int eog = rt_tokenizer_is_eog(s->tok, s->cand[i].id);
        if (!eog && s->cand[i].p < thold)
            continue;
        n_text += !eog;
        sum += s->cand[i].p;
        s->cand[n++] = s->cand[i];
    }
    s->n_cand = n;
    for (size_t i = 0; i < n && sum > 0; i++)
        s->cand[i].p = (float)(s->cand[i].p / sum);
    return n_text;
}

/* Candidates compared for shared prefixes: the likeliest ones. What lies beyond
 * holds too little mass to lift a token over the 0.2 threshold, and comparing every
 * pair of a whole vocabulary would cost seconds a token. */
#define INFILL_MERGE_MAX 1024

/* llama.cpp's infill stage (see rt_sampler_stage_t). It decides on probabilities;
 * the logits of the survivors become log p, so the draw samples what it kept. */
static void infill(rt_sampler_t *s)
{
    sort_desc(s);
    softmax(s);
    double p_txt = 0, p_eog = 0;
    for (size_t i = 0; i < s->n_cand; i++)
        *(rt_tokenizer_is_eog(s->tok, s->cand[i].id) ? &p_eog : &p_txt) += s->cand[i].p;
    if (3 * p_eog * (double)s->n_cand > p_txt) {
        (void)infill_keep(s, INFINITY); /* the end-of-generation tokens alone */
    } else {
        const size_t m = s->n_cand < INFILL_MERGE_MAX ? s->n_cand : INFILL_MERGE_MAX;
        for (size_t i0 = 0; i0 < m; i0++) {
            for (size_t i1 = 0; i1 < m; i1++) {
                if (s->cand[i0].logit == -INFINITY)
                    break;
                if (i0 == i1 || s->cand[i1].logit == -INFINITY)
                    continue;
                const rt_str_t a = infill_text(s, s->cand[i0].id), b = infill_text(s, s->cand[i1].id);
                if (a.len == 0 || a.len > b.len || memcmp(a.ptr, b.ptr, a.len) != 0)
                    continue;
                /* i0's text begins i1's: the likelier of the two takes both */
                cand_t *dst = &s->cand[i0], *src = &s->cand[i1];
                if (src->p > dst->p) {
                    cand_t *t = dst;
                    dst = src;
                    src = t;
                }
                dst->p += src->p;
                src->p = 0.0f;
                src->logit = -INFINITY;
            }
        }
        const size_t n_text = infill_keep(s, 0.2f);
        if (n_text == 0) { /* nothing worth writing: end the turn */
            int32_t eot = rt_tokenizer_eot(s->tok);
            if (eot < 0)
                eot = rt_tokenizer_eos(s->tok);
            s->cand[0] = (cand_t){.id = eot >= 0 ? eot : s->cand[0].id, .logit = 0, .p = 1};
            s->n_cand = 1;
        } else {
            (void)infill_keep(s, 1.0f / (float)(n_text + 1));
        }
    }
    for (size_t i = 0; i < s->n_cand; i++)
        s->cand[i].logit = s->cand[i].p > 0 ? logf(s->cand[i].p) : -INFINITY;
    s->cand_sorted = 0;
}

static int32_t draw(rt_sampler_t *s)
{
    softmax(s);
    double r = bl_rng_uniform(&s->rng), cum = 0;
    for (size_t i = 0; i < s->n_cand; i++) {
        cum += s->cand[i].p;
        if (r < cum)
            return s->cand[i].id;
    }
    /* rounding left r above the total: the last token with any mass */
    for (size_t i = s->n_cand; i-- > 0;)
        if (s->cand[i].p > 0)
            return s->cand[i].id;
    return s->cand[0].id;
}

// --- entry points ---------------------------------------------------------------------------

/* Whether the grammar allows token next: an end token once it is complete, another
 * token when its bytes can follow. An empty piece never: it would not move on. */
static int grammar_allows(rt_sampler_t *s, int32_t id)
{
    if (rt_tokenizer_is_eog(s->tok, id))
        return rt_grammar_match_done(s->gm);
    rt_str_t piece = rt_tokenizer_piece(s->tok, id);
    return piece.len > 0 && rt_grammar_match_accepts(s->gm, piece.ptr, piece.len);
}

/* The candidate list from logits, biased; with mask, the tokens the grammar does
 * not allow are out (-inf), and with forcing those that do not go on with the
 * thought's end tag. Returns the number of candidates left finite. */
static size_t fill(rt_sampler_t *s, const float *logits, int mask, int forcing)
{
    const rt_sampler_params_t *p = &s->p;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        s->cand[i].id = i;
        s->cand[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
    }
    s->n_cand = (size_t)s->n_vocab;
    s->cand_sorted = 0;
    for (size_t i = 0; i < p->n_logit_bias; i++)
        s->cand[p->logit_bias[i].token].logit += p->logit_bias[i].bias;
    if (!mask && !forcing)
        return (size_t)s->n_vocab;
    /* one walk over the vocabulary's trie says which pieces can follow; the end
     * tokens can once the grammar is complete */
    int done = 1;
    if (mask) {
        rt_grammar_match_scan(s->gm, s->vocab, s->allowed);
        done = rt_grammar_match_done(s->gm);
    }
    size_t live = 0;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        int ok = !mask || (rt_tokenizer_is_eog(s->tok, i) ? done : s->allowed[i]);
        if (!ok || (forcing && !close_allows(s, i)))
            s->cand[i].logit = -INFINITY;
    }
    /* the chain then runs over the allowed tokens only */
    for (size_t i = 0; i < s->n_cand; i++)
        if (s->cand[i].logit > -INFINITY)
            s->cand[live++] = s->cand[i];
    s->n_cand = live;
    return live;
}

/* Whether the chain's first stage with an effect is top_k over the (biased) logits:
 * no penalty in force (the stages before it do nothing here) and a k below the
 * vocabulary. fill then top_k would give the k best; take_top_k finds them without
 * the full candidate list, whatever the biases (a ban list of thousands included). */
static size_t first_top_k(const rt_sampler_t *s)
{
    const rt_sampler_params_t *p = &s->p;
    if (s->full_path || p->top_k <= 0)
        return 0;
    const size_t k = (size_t)p->top_k > keep_floor(s) ? (size_t)p->top_k : keep_floor(s);
    if (k >= (size_t)s->n_vocab)
        return 0;
    const int pen = s->ring_len > 0 && (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
                                        p->frequency_penalty != 0.0f);
    for (int i = 0; i < p->n_stages; i++) {
        switch ((rt_sampler_stage_t)p->stages[i]) {
        case RT_STAGE_TOP_K:
            return k;
        case RT_STAGE_PENALTIES:
            if (pen)
                return 0;
            break;
        case RT_STAGE_DRY:
        case RT_STAGE_TOP_N_SIGMA:
        case RT_STAGE_XTC:
            break; /* off (run_chain) */
        default:
            return 0;
        }
    }
    return 0;
}

/* The k best of the biased logits (NaN as -inf) into cand[0..k), sorted, as fill
 * then top_k leave them: the order is (logit desc, id asc), a total order, so the
 * set is the same. The biased tokens' values are summed in list order, as fill
 * adds them, and offered after the scan, which skips them (their ids in increasing
 * order, walked beside the scan's). In the scan ids come in increasing order,
 * so a logit equal to the heap's smallest never enters (its id is larger), and a
 * run of 16 with none above it is skipped whole. */
static void take_top_k(rt_sampler_t *s, const float *logits, size_t k)
{
    const rt_sampler_params_t *p = &s->p;
    const int32_t *bt = s->bias_tok;
    float *bv = s->bias_val;
    const size_t nb = s->n_bias_tok;
    for (size_t u = 0, e = 0; u < nb; u++) {
        const int32_t t = bt[u];
        float v = isnan(logits[t]) ? -INFINITY : logits[t];
        for (; e < p->n_logit_bias && s->bias_sorted[e].token == t; e++)
            v += p->logit_bias[s->bias_sorted[e].at].bias;
        bv[u] = v;
    }
    size_t bi = 0; /* the first biased token at or past the scan */
    cand_t *h = s->cand;
    size_t n = 0;
    const int32_t V = s->n_vocab;
    for (int32_t i0 = 0; i0 < V; i0 += 16) {
        const int32_t i1 = i0 + 16 < V ? i0 + 16 : V;
        if (n == k && i1 - i0 == 16) {
            const float thr = h[0].logit;
            int above = 0;
            for (int32_t i = i0; i < i0 + 16; i++)
                above |= logits[i] > thr; /* a NaN never is */
            if (!above)
                continue;
        }
        for (int32_t i = i0; i < i1; i++) {
            const float l = isnan(logits[i]) ? -INFINITY : logits[i];
            if (n == k && !(l > h[0].logit))
                continue;
            while (bi < nb && bt[bi] < i)
                bi++;
            if (bi < nb && bt[bi] == i)
                continue; /* biased: offered with its bias below */
            heap_offer(h, &n, k, (cand_t){.id = i, .logit = l});
        }
    }
    for (size_t u = 0; u < nb; u++)
        heap_offer(h, &n, k, (cand_t){.id = bt[u], .logit = bv[u]});
    s->n_cand = n;
    qsort(s->cand, n, sizeof *s->cand, by_logit_desc);
    s->cand_sorted = 1;
}

static int32_t run_chain(rt_sampler_t *s)
{
    const rt_sampler_params_t *p = &s->p;
    for (int i = 0; i < p->n_stages; i++) {
        switch ((rt_sampler_stage_t)p->stages[i]) {
        case RT_STAGE_PENALTIES:
            apply_penalties(s);
            break;
        case RT_STAGE_TOP_K:
            if (p->top_k > 0)
                top_k(s, (size_t)p->top_k > keep_floor(s) ? (size_t)p->top_k : keep_floor(s));
            break;
        case RT_STAGE_TYPICAL_P:
            if (p->typical_p < 1.0f)
                typical(s, p->typical_p);
            break;
        case RT_STAGE_TOP_P:
            if (p->top_p < 1.0f)
                top_p(s, p->top_p);
            break;
        case RT_STAGE_MIN_P:
            if (p->min_p > 0.0f)
                min_p(s, p->min_p);
            break;
        case RT_STAGE_TEMPERATURE:
            temperature(s, p->temp);
            break;
        case RT_STAGE_INFILL:
            infill(s);
            break;
        case RT_STAGE_DRY:
        case RT_STAGE_TOP_N_SIGMA:
        case RT_STAGE_XTC:
            break; /* off: their parameters take no other value here */
        }
    }
    return draw(s);
}

int32_t rt_sampler_sample(rt_sampler_t *s, const float *logits)
{
    int forcing = think_forced(s);
    const size_t k = first_top_k(s);
    if (k)
        take_top_k(s, logits, k); /* the chain's top_k then has nothing to do */
    else
        fill(s, logits, 0, 0);
    int32_t tok = run_chain(s);
    if ((!s->gm || grammar_allows(s, tok)) && (!forcing || close_allows(s, tok)))
        return tok;
    if (fill(s, logits, s->gm != NULL, forcing) == 0) {
        /* nothing the grammar allows is left (banned or -inf): end the text */
        for (int32_t i = 0; i < s->n_vocab; i++)
            if (rt_tokenizer_is_eog(s->tok, i))
                return i;
        return tok;
    }
    return run_chain(s);
}

static int prob_before(float p, int32_t id, const float *probs, const int32_t *ids, size_t j)
{
    return p > probs[j] || (p == probs[j] && id < ids[j]);
}

size_t rt_sampler_last_candidates(const rt_sampler_t *s, int32_t *ids, float *probs,
                                  size_t max_n)
{
    /* draw() left the probabilities in cand; an insertion sort into the caller's
     * arrays keeps the best max_n without reordering cand */
    size_t n = 0;
    for (size_t i = 0; i < s->n_cand; i++) {
        const cand_t *c = &s->cand[i];
        size_t j;
        if (n < max_n)
            j = n++;
        else if (max_n > 0 && prob_before(c->p, c->id, probs, ids, max_n - 1))
            j = max_n - 1;
        else
            continue;
        for (; j > 0 && prob_before(c->p, c->id, probs, ids, j - 1); j--) {
            ids[j] = ids[j - 1];
            probs[j] = probs[j - 1];
        }
        ids[j] = c->id;
        probs[j] = c->p;
    }
    return n;
}

int rt_logit_bias_parse(const char *v, rt_logit_bias_t *out, bl_err_t *err)
{
    const char *sign = strpbrk(v, "+-");
    if (!sign || sign == v)
        return bl_err_set(err, BL_EINVAL, "'%.64s' is not TOKEN+BIAS or TOKEN-BIAS", v);
    char id[32];
    const size_t n = (size_t)(sign - v);
    if (n >= sizeof id)
        return bl_err_set(err, BL_EINVAL, "'%.64s': token id too long", v);
    memcpy(id, v, n);
    id[n] = 0;
    int64_t tok;
    float b;
    if (bl_parse_i64(id, &tok) || tok < 0 || tok > INT32_MAX)
        return bl_err_set(err, BL_EINVAL, "'%.64s': bad token id", v);
    if (!strcmp(sign + 1, "inf"))
        b = INFINITY;
    else if (bl_parse_f32(sign + 1, &b) || !isfinite(b))
        return bl_err_set(err, BL_EINVAL, "'%.64s': bad bias", v);
    if (*sign == '-')
        b = -b;
    if (b == INFINITY)
        return bl_err_set(err, BL_EINVAL, "'%.64s': a bias of +inf is not allowed", v);
    *out = (rt_logit_bias_t){(int32_t)tok, b};
    return 0;
}
