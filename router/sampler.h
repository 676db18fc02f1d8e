/* Token sampling: the chain llama-server applies to one row of logits, with its
 * defaults and in its order:
 *
 *   logit bias -> penalties (repeat, presence, frequency over the last N tokens)
 *   -> top-k -> typical-p -> top-p -> min-p -> temperature -> draw
 *
 * or the stages a request lists ("samplers"), in its order, between the bias and
 * the draw; a stage left out of the list does not run. The list may hold the infill
 * stage of code completion (see rt_sampler_stage_t).
 *
 * With a grammar (params.grammar, GBNF), the token the chain draws must be one the
 * grammar allows after the tokens generated so far; when it is not, the chain runs
 * again over the tokens the grammar allows (llama.cpp's order: the grammar check
 * first on the draw, then on the whole vocabulary). End-of-generation tokens are
 * allowed once the grammar is complete. With a thought budget a reasoning model's
 * <think> span is cut at that many tokens: its end tag is forced, token by token, so
 * that the reply (and a grammar's constraint on it) always gets the rest.
 *
 * A temperature <= 0 keeps only the most likely remaining token (greedy). The draw
 * uses the sampler's own generator, seeded from params.seed: the same seed, logits
 * and accepted tokens give the same choices on every machine.
 *
 * One sampler per slot; not thread-safe. Sampling allocates nothing: every buffer
 * is sized for the vocabulary at creation. */
#ifndef RT_SAMPLER_H
#define RT_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define RT_SEED_RANDOM 0xFFFFFFFFu /* params.seed: draw a seed from the system */

typedef struct rt_tokenizer rt_tokenizer_t;

/* The stages of a chain. dry, top_n_sigma and xtc are names a list may hold; they
 * change nothing, as their parameters are off (the only values taken). infill, for
 * fill-in-the-middle, is llama.cpp's: when end-of-generation tokens hold enough of
 * the mass (3 * p_eog * n > p_text) only they remain; else candidates whose text is
 * a prefix of another's give their probability to the likelier of the two, those
 * under 0.2 and then under 1 / (n_text + 1) go (end-of-generation tokens stay), and
 * when no text token is left the end-of-turn token alone remains. */
typedef enum rt_sampler_stage {
    RT_STAGE_PENALTIES = 0,
    RT_STAGE_DRY,
    RT_STAGE_TOP_N_SIGMA,
    RT_STAGE_TOP_K,
    RT_STAGE_TYPICAL_P,
    RT_STAGE_TOP_P,
    RT_STAGE_MIN_P,
    RT_STAGE_XTC,
    RT_STAGE_TEMPERATURE,
    RT_STAGE_INFILL,
} rt_sampler_stage_t;

#define RT_SAMPLER_MAX_STAGES 32

/* The stage a name of llama.cpp's "samplers" list stands for ("penalties", "dry",
 * "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature", "infill",
 * and the aliases "top-k", "top-p", "nucleus", "typical", "typical_p", "typical-p",
 * "typ-p", "typ", "min-p", "temp"), or -1. */
int rt_sampler_stage_by_name(const char *name, size_t len);
/* The stage of one letter of a "samplers" string (e d s k y p m x t i), or -1. */
int rt_sampler_stage_by_char(char c);
/* llama.cpp's name of a stage ("typ_p" for typical-p); "" for other values. */
const char *rt_sampler_stage_name(int stage);

typedef struct rt_logit_bias {
    int32_t token;
    float bias; /* added to the token's logit; -INFINITY bans it */
} rt_logit_bias_t;

/* A logit bias as llama.cpp's -l flag spells it, "TOKEN(+|-)BIAS" ("15043+1",
 * "15043-inf" bans the token). BL_EINVAL naming the text; +inf is refused. */
int rt_logit_bias_parse(const char *v, rt_logit_bias_t *out, bl_err_t *err) BL_WUR;

typedef struct rt_sampler_params {
    float temp;              /* 0.8; <= 0: greedy */
    int32_t top_k;           /* 40; <= 0: off */
    float top_p;             /* 0.95; >= 1: off */
    float min_p;             /* 0.05; <= 0: off */
    float typical_p;         /* 1.0; >= 1: off */
    int32_t penalty_last_n;  /* 64; 0: off; -1: the whole context (n_ctx) */
    float repeat_penalty;    /* 1.0: off */
    float presence_penalty;  /* 0.0: off */
    float frequency_penalty; /* 0.0: off */
    int32_t min_keep;        /* 0; the filters keep at least max(1, min_keep) tokens */
    uint32_t seed;           /* RT_SEED_RANDOM */
    const rt_logit_bias_t *logit_bias; /* borrowed; copied by rt_sampler_create */
    size_t n_logit_bias;
    uint8_t stages[RT_SAMPLER_MAX_STAGES]; /* rt_sampler_stage_t values, in order: */
    int n_stages;            /* penalties, top_k, typ_p, top_p, min_p, temperature */
    const char *grammar;     /* GBNF text (borrowed, compiled by rt_sampler_create), or */
    size_t grammar_len;      /* NULL: none */
    const struct rt_grammar_vocab *grammar_vocab; /* the vocabulary's trie for grammar
                              * scans (rt_sampler_grammar_vocab), borrowed; NULL: the
                              * sampler builds its own (about 70 ms for 150k tokens) */
    int32_t think_budget;    /* the most tokens a thought may take, from a leading
                              * think_tags[0] (or the start, with think_open) to its
                              * think_tags[1]; past them only the end tag's tokens may
                              * come. 0: no bound */
    int think_open;          /* the prompt opened the thought: generation starts in it */
    const char *think_tags[2]; /* the thought's open and close tags, borrowed, each at
                              * most RT_SAMPLER_MAX_TAG bytes; NULL: "<think>", "</think>" */
} rt_sampler_params_t;

/* The longest thought tag a budget follows. */
#define RT_SAMPLER_MAX_TAG 48

typedef struct rt_sampler rt_sampler_t;
/* Appends to s's chain the stage named text[0..len), or with letters one stage per
 * letter of text. BL_EINVAL (the caller names its field): an unknown name or letter,
 * more than RT_SAMPLER_MAX_STAGES stages. */
int rt_sampler_chain_add(rt_sampler_params_t *s, const char *text, size_t len, int letters,
                         bl_err_t *err) BL_WUR;


/* llama-server's defaults (the values in the comments above). */
void rt_sampler_params_default(rt_sampler_params_t *p);

/* The trie of tok's pieces that grammar scans walk, for params.grammar_vocab when
 * many samplers share one vocabulary. Caller frees with rt_grammar_vocab_destroy. */
int rt_sampler_grammar_vocab(struct rt_grammar_vocab **out, const rt_tokenizer_t *tok,
                             bl_err_t *err) BL_WUR;

/* Checks p against the vocabulary: BL_EINVAL naming the field for a NaN, a negative
 * penalty window other than -1, a top_p/min_p/typical_p outside [0, 1], a repeat
 * penalty <= 0, a bias token outside the vocabulary or a NaN/+inf bias, a stage
 * count outside 0..RT_SAMPLER_MAX_STAGES or an unknown stage. */
int rt_sampler_params_check(const rt_sampler_params_t *p, int32_t n_vocab, bl_err_t *err) BL_WUR;

/* A sampler over n_vocab logits; n_ctx bounds the penalty window when
 * penalty_last_n is -1. tok (borrowed, may be NULL) is the vocabulary the infill
 * stage and a grammar read; a chain with that stage or a grammar and no tok is
 * refused (BL_EINVAL), as is a grammar that does not compile (the message says
 * where). Caller frees with rt_sampler_destroy. */
int rt_sampler_create(rt_sampler_t **out, const rt_sampler_params_t *p, int32_t n_vocab,
                      int32_t n_ctx, const rt_tokenizer_t *tok, bl_err_t *err) BL_WUR;
void rt_sampler_destroy(rt_sampler_t *s);

/* The seed in use (the drawn one when params.seed was RT_SEED_RANDOM). */
uint32_t rt_sampler_seed(const rt_sampler_t *s);

/* Records a token of the context (prompt or generated) for the penalties. Tokens
 * outside the vocabulary are ignored. */
void rt_sampler_accept(rt_sampler_t *s, int32_t token);
/* rt_sampler_accept for a token this sampler chose: the grammar, if any, moves past
 * it too. */
void rt_sampler_accept_generated(rt_sampler_t *s, int32_t token);

/* Forgets the accepted tokens, puts the grammar back at its start and reseeds the
 * generator from the seed in use. */
void rt_sampler_reset(rt_sampler_t *s);

/* Runs the chain over logits (n_vocab floats, left unchanged) and returns the chosen
 * token. Does not accept it: call rt_sampler_accept with the token kept. */
int32_t rt_sampler_sample(rt_sampler_t *s, const float *logits);

/* Every later sample of s takes the full candidate list, never the top-k path
 * straight from the logits: the reference the tests hold that path to. */
void rt_sampler_full_path(rt_sampler_t *s);

/* After rt_sampler_sample: the candidates that survived the filters, with their
 * probabilities after temperature, most likely first (n_out of them, at most max_n).
 * For logprobs and n_probs. */
size_t rt_sampler_last_candidates(const rt_sampler_t *s, int32_t *ids, float *probs,
                                  size_t max_n);

#endif
