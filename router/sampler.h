/* Token sampling: the chain llama-server applies to one row of logits, with its
 * defaults and in its order:
 *
 *   logit bias -> penalties (repeat, presence, frequency over the last N tokens)
 *   -> top-k -> typical-p -> top-p -> min-p -> temperature -> draw
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

typedef struct rt_logit_bias {
    int32_t token;
    float bias; /* added to the token's logit; -INFINITY bans it */
} rt_logit_bias_t;

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
} rt_sampler_params_t;

typedef struct rt_sampler rt_sampler_t;

/* llama-server's defaults (the values in the comments above). */
void rt_sampler_params_default(rt_sampler_params_t *p);

/* Checks p against the vocabulary: BL_EINVAL naming the field for a NaN, a negative
 * penalty window other than -1, a top_p/min_p/typical_p outside [0, 1], a repeat
 * penalty <= 0, a bias token outside the vocabulary or a NaN/+inf bias. */
int rt_sampler_params_check(const rt_sampler_params_t *p, int32_t n_vocab, bl_err_t *err) BL_WUR;

/* A sampler over n_vocab logits; n_ctx bounds the penalty window when
 * penalty_last_n is -1. Caller frees with rt_sampler_destroy. */
int rt_sampler_create(rt_sampler_t **out, const rt_sampler_params_t *p, int32_t n_vocab,
                      int32_t n_ctx, bl_err_t *err) BL_WUR;
void rt_sampler_destroy(rt_sampler_t *s);

/* The seed in use (the drawn one when params.seed was RT_SEED_RANDOM). */
uint32_t rt_sampler_seed(const rt_sampler_t *s);

/* Records a token of the context (prompt or generated) for the penalties. Tokens
 * outside the vocabulary are ignored. */
void rt_sampler_accept(rt_sampler_t *s, int32_t token);

/* Forgets the accepted tokens and reseeds the generator from the seed in use. */
void rt_sampler_reset(rt_sampler_t *s);

/* Runs the chain over logits (n_vocab floats, left unchanged) and returns the chosen
 * token. Does not accept it: call rt_sampler_accept with the token kept. */
int32_t rt_sampler_sample(rt_sampler_t *s, const float *logits);

/* After rt_sampler_sample: the candidates that survived the filters, with their
 * probabilities after temperature, most likely first (n_out of them, at most max_n).
 * For logprobs and n_probs. */
size_t rt_sampler_last_candidates(const rt_sampler_t *s, int32_t *ids, float *probs,
                                  size_t max_n);

#endif
