/* Tests of router/sampler.c: each stage of the chain alone, the chain's order and
 * a request's own list of stages, the infill stage, determinism under a seed, and
 * the refusal of bad parameters. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "sampler.h"
#include "tokenizer.h"
#include "test_seed.h"

/* Parameters with every filter off, so a test switches on only what it tests. */
static rt_sampler_params_t plain(void)
{
    rt_sampler_params_t p;
    rt_sampler_params_default(&p);
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.penalty_last_n = 0;
    p.seed = 1234;
    return p;
}

static rt_sampler_t *make(const rt_sampler_params_t *p, int32_t n_vocab)
{
    rt_sampler_t *s = NULL;
    bl_err_t err = {0};
    int rc = rt_sampler_create(&s, p, n_vocab, 4096, NULL, &err);
    if (rc)
        fail_msg("rt_sampler_create: %s", err.msg);
    return s;
}

/* How often each token comes out of n draws. */
static void histogram(rt_sampler_t *s, const float *logits, int32_t n_vocab, int n, int *hist)
{
    memset(hist, 0, (size_t)n_vocab * sizeof *hist);
    for (int i = 0; i < n; i++) {
        int32_t t = rt_sampler_sample(s, logits);
        assert_in_range(t, 0, n_vocab - 1);
        hist[t]++;
    }
}

static void test_sampler_defaults_are_llama_server_defaults(void **state)
{
    (void)state;
    rt_sampler_params_t p;
    rt_sampler_params_default(&p);
    assert_float_equal(p.temp, 0.8f, 0);
    assert_int_equal(p.top_k, 40);
    assert_float_equal(p.top_p, 0.95f, 0);
    assert_float_equal(p.min_p, 0.05f, 0);
    assert_float_equal(p.typical_p, 1.0f, 0);
    assert_int_equal(p.penalty_last_n, 64);
    assert_float_equal(p.repeat_penalty, 1.0f, 0);
    assert_int_equal(p.seed, RT_SEED_RANDOM);
}

static void test_sampler_zero_temperature_is_argmax(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.temp = 0.0f;
    enum { V = 1000 };
    float logits[V];
    srand(7);
    for (int i = 0; i < V; i++)
        logits[i] = (float)rand() / (float)RAND_MAX * 10.0f - 5.0f;
    logits[613] = 9.0f;
    rt_sampler_t *s = make(&p, V);
    for (int i = 0; i < 20; i++)
        assert_int_equal(rt_sampler_sample(s, logits), 613);
    rt_sampler_destroy(s);
}

static void test_sampler_top_k_one_is_argmax(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.top_k = 1;
    float logits[6] = {0.1f, 2.0f, 1.9f, -1.0f, 1.99f, 0.0f};
    rt_sampler_t *s = make(&p, 6);
    for (int i = 0; i < 50; i++)
        assert_int_equal(rt_sampler_sample(s, logits), 1);
    rt_sampler_destroy(s);
}

static void test_sampler_top_k_keeps_only_k(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.top_k = 3;
    float logits[8] = {1.0f, 1.1f, 0.2f, 1.2f, 0.3f, 0.1f, 0.0f, 0.4f};
    int hist[8];
    rt_sampler_t *s = make(&p, 8);
    histogram(s, logits, 8, 3000, hist);
    for (int i = 0; i < 8; i++) {
        if (i == 0 || i == 1 || i == 3)
            assert_true(hist[i] > 0);
        else
            assert_int_equal(hist[i], 0);
    }
    rt_sampler_destroy(s);
}

static void test_sampler_same_seed_same_tokens(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.seed = 42;
    enum { V = 50 };
    float logits[V];
    for (int i = 0; i < V; i++)
        logits[i] = (float)(i % 7) * 0.3f;
    rt_sampler_t *a = make(&p, V), *b = make(&p, V);
    int same_as_other_seed = 0;
    p.seed = 43;
    rt_sampler_t *c = make(&p, V);
    for (int i = 0; i < 200; i++) {
        int32_t ta = rt_sampler_sample(a, logits), tb = rt_sampler_sample(b, logits);
        assert_int_equal(ta, tb);
        same_as_other_seed += ta == rt_sampler_sample(c, logits);
    }
    assert_true(same_as_other_seed < 150);
    rt_sampler_reset(a);
    rt_sampler_reset(b);
    assert_int_equal(rt_sampler_sample(a, logits), rt_sampler_sample(b, logits));
    rt_sampler_destroy(a);
    rt_sampler_destroy(b);
    rt_sampler_destroy(c);
}

static void test_sampler_random_seed_is_reported(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.seed = RT_SEED_RANDOM;
    rt_sampler_t *s = make(&p, 4);
    assert_int_not_equal(rt_sampler_seed(s), RT_SEED_RANDOM);
    rt_sampler_destroy(s);
}

static void test_sampler_draws_follow_the_distribution(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    /* probabilities 0.5, 0.25, 0.125, 0.125 */
    float logits[4] = {logf(4), logf(2), 0, 0};
    int hist[4];
    rt_sampler_t *s = make(&p, 4);
    enum { N = 40000 };
    histogram(s, logits, 4, N, hist);
    const double want[4] = {0.5, 0.25, 0.125, 0.125};
    for (int i = 0; i < 4; i++) {
        double got = (double)hist[i] / N, sd = sqrt(want[i] * (1 - want[i]) / N);
        if (fabs(got - want[i]) > 5 * sd)
            fail_msg("token %d drawn %.4f of the time, expected %.4f", i, got, want[i]);
    }
    rt_sampler_destroy(s);
}

static void test_sampler_temperature_sharpens(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.temp = 0.25f; /* logits 1 and 0 become 4 and 0: p = e^4/(e^4+1) = 0.982 */
    float logits[2] = {1.0f, 0.0f};
    int hist[2];
    rt_sampler_t *s = make(&p, 2);
    histogram(s, logits, 2, 10000, hist);
    assert_in_range(hist[0], 9700, 9950);
    rt_sampler_destroy(s);
}

static void test_sampler_top_p_keeps_the_smallest_covering_set(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.top_p = 0.7f; /* 0.5 + 0.25 covers 0.7: tokens 0 and 1 stay */
    float logits[4] = {logf(4), logf(2), 0, 0};
    int hist[4];
    rt_sampler_t *s = make(&p, 4);
    histogram(s, logits, 4, 3000, hist);
    assert_true(hist[0] > 0 && hist[1] > 0);
    assert_int_equal(hist[2] + hist[3], 0);
    rt_sampler_destroy(s);
}

static void test_sampler_min_p_drops_unlikely_tokens(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.min_p = 0.3f; /* relative to the best (0.5): 0.25 passes, 0.125 does not */
    float logits[4] = {logf(4), logf(2), 0, 0};
    int hist[4];
    rt_sampler_t *s = make(&p, 4);
    histogram(s, logits, 4, 3000, hist);
    assert_true(hist[0] > 0 && hist[1] > 0);
    assert_int_equal(hist[2] + hist[3], 0);
    rt_sampler_destroy(s);
}

static void test_sampler_typical_p_prefers_typical_tokens(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    /* one dominant token and many equal small ones: the entropy is low, so the
     * dominant token is the typical one and a small typical_p keeps only it */
    enum { V = 64 };
    float logits[V];
    for (int i = 0; i < V; i++)
        logits[i] = 0.0f;
    logits[5] = 8.0f;
    p.typical_p = 0.2f;
    int hist[V];
    rt_sampler_t *s = make(&p, V);
    histogram(s, logits, V, 500, hist);
    assert_int_equal(hist[5], 500);
    rt_sampler_destroy(s);
}

static void test_sampler_logit_bias_bans_and_forces(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.temp = 0.0f;
    rt_logit_bias_t bias[2] = {{2, -INFINITY}, {0, 5.0f}};
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    float logits[3] = {1.0f, 2.0f, 3.0f};
    rt_sampler_t *s = make(&p, 3);
    assert_int_equal(rt_sampler_sample(s, logits), 1);
    rt_sampler_destroy(s);
    p.n_logit_bias = 2;
    s = make(&p, 3);
    assert_int_equal(rt_sampler_sample(s, logits), 0);
    rt_sampler_destroy(s);
}

static void test_sampler_repeat_penalty_pushes_down_seen_tokens(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.temp = 0.0f;
    p.penalty_last_n = 4;
    p.repeat_penalty = 2.0f;
    float logits[3] = {3.0f, 2.0f, -1.0f};
    rt_sampler_t *s = make(&p, 3);
    assert_int_equal(rt_sampler_sample(s, logits), 0);
    rt_sampler_accept(s, 0); /* 3 / 2 = 1.5 < 2 */
    assert_int_equal(rt_sampler_sample(s, logits), 1);
    rt_sampler_accept(s, 1); /* 2 / 2 = 1 < 1.5 */
    assert_int_equal(rt_sampler_sample(s, logits), 0);
    /* the window holds 4 tokens: after four more of token 2, 0 and 1 are forgotten */
    for (int i = 0; i < 4; i++)
        rt_sampler_accept(s, 2);
    assert_int_equal(rt_sampler_sample(s, logits), 0);
    logits[0] = -1.5f;
    logits[1] = -1.5f; /* -1 * 2 = -2 < -1.5: a negative logit is multiplied */
    assert_int_equal(rt_sampler_sample(s, logits), 0);
    rt_sampler_destroy(s);
}

static void test_sampler_frequency_and_presence_penalties(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.temp = 0.0f;
    p.penalty_last_n = 64;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    float logits[2] = {2.0f, 1.0f};
    rt_sampler_t *s = make(&p, 2);
    rt_sampler_accept(s, 0); /* 2 - 0.5 - 0.25 = 1.25 > 1 */
    assert_int_equal(rt_sampler_sample(s, logits), 0);
    rt_sampler_accept(s, 0); /* 2 - 1.0 - 0.25 = 0.75 < 1 */
    assert_int_equal(rt_sampler_sample(s, logits), 1);
    rt_sampler_reset(s); /* forgets the window */
    assert_int_equal(rt_sampler_sample(s, logits), 0);
    rt_sampler_destroy(s);
}

static void test_sampler_candidates_are_sorted_probabilities(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    p.top_k = 3;
    float logits[5] = {0.0f, 3.0f, 1.0f, 2.0f, -1.0f};
    rt_sampler_t *s = make(&p, 5);
    (void)rt_sampler_sample(s, logits);
    int32_t ids[5];
    float probs[5];
    size_t n = rt_sampler_last_candidates(s, ids, probs, 5);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 2);
    assert_float_equal(probs[0] + probs[1] + probs[2], 1.0f, 1e-5);
    assert_true(probs[0] > probs[1] && probs[1] > probs[2]);
    assert_int_equal(rt_sampler_last_candidates(s, ids, probs, 2), 2);
    assert_int_equal(ids[1], 3);
    rt_sampler_destroy(s);
}

static void test_sampler_nan_logits_are_never_chosen(void **state)
{
    (void)state;
    rt_sampler_params_t p = plain();
    float logits[3] = {NAN, 0.0f, NAN};
    rt_sampler_t *s = make(&p, 3);
    for (int i = 0; i < 20; i++)
        assert_int_equal(rt_sampler_sample(s, logits), 1);
    rt_sampler_destroy(s);
}

/* The default chain's top_k taken straight from the logits (a few biases, no
 * penalty in force) against the full candidate list (rt_sampler_full_path). Random
 * logits over 1,000 to 152,000 tokens with ties, NaN, -inf and runs of equal values,
 * biases raising, banning and repeating tokens, and a ban list of thousands of
 * tokens (repeated ones among them) beside them; every k, token and candidate list
 * the same. */
static void test_sampler_top_k_fast_path_matches(void **state)
{
    (void)state;
    rng_t r = rng_for(11);
    const int32_t sizes[] = {1000, 1003, 151936};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        const int32_t V = sizes[z];
        float *lg = malloc(sizeof(float) * (size_t)V);
        assert_non_null(lg);
        const int32_t ks[] = {1, 2, 40, 100, V - 1};
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            rt_sampler_params_t p;
            rt_sampler_params_default(&p);
            p.seed = 77;
            p.top_k = ks[ki];
            p.repeat_penalty = ki == 2 ? 1.1f : 1.0f; /* no effect until a token is seen */
            const int nreal = ki == 1 ? 0 : 4;
            enum { NBAN = 2000 };
            static rt_logit_bias_t bias[4 + NBAN];
            bias[0] = (rt_logit_bias_t){.token = 7, .bias = 3.0f};
            bias[1] = (rt_logit_bias_t){.token = V - 1, .bias = -INFINITY};
            bias[2] = (rt_logit_bias_t){.token = 7, .bias = 0.5f};
            bias[3] = (rt_logit_bias_t){.token = 900, .bias = 10.0f};
            /* with k = 100: a ban list as long as Qwen3's pieces that are not whole UTF-8 */
            const int nban = ks[ki] == 100 ? NBAN : 0;
            for (int i = 0; i < nban; i++)
                bias[nreal + i] = (rt_logit_bias_t){.token = (int32_t)(rng_next(&r) % (uint64_t)V),
                                                    .bias = i % 7 == 0 ? -2.5f : -INFINITY};
            p.logit_bias = bias;
            p.n_logit_bias = (size_t)(nreal + nban);
            rt_sampler_t *fast = make(&p, V);
            rt_sampler_t *full = make(&p, V);
            rt_sampler_full_path(full);
            for (int round = 0; round < 6; round++) {
                const int coarse = round % 3 == 1; /* few distinct values: many ties */
                for (int32_t i = 0; i < V; i++)
                    lg[i] = coarse ? (float)(rng_next(&r) % 8) : rng_f(&r, -8.0f, 8.0f);
                for (int j = 0; j < 20; j++) {
                    const int32_t at = (int32_t)(rng_next(&r) % (uint64_t)V);
                    lg[at] = j % 3 == 0 ? NAN : j % 3 == 1 ? -INFINITY : 9.0f;
                }
                const int32_t a = rt_sampler_sample(fast, lg), b = rt_sampler_sample(full, lg);
                assert_int_equal(a, b);
                if (ki != 2) { /* the penalty, once in force, takes the long way in both */
                    rt_sampler_accept_generated(fast, a);
                    rt_sampler_accept_generated(full, b);
                }
                int32_t ia[128], ib[128];
                float pa[128], pb[128];
                const size_t na = rt_sampler_last_candidates(fast, ia, pa, 128);
                const size_t nb = rt_sampler_last_candidates(full, ib, pb, 128);
                assert_int_equal(na, nb);
                for (size_t i = 0; i < na; i++) {
                    assert_int_equal(ia[i], ib[i]);
                    assert_memory_equal(&pa[i], &pb[i], sizeof pa[i]);
                }
            }
            rt_sampler_destroy(fast);
            rt_sampler_destroy(full);
        }
        free(lg);
    }
}

static void test_sampler_rejects_bad_parameters(void **state)
{
    (void)state;
    const char *fields[] = {"top_p", "min_p", "temperature", "repeat_penalty",
                            "repeat_last_n", "logit_bias"};
    rt_logit_bias_t far = {99, 1.0f};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        rt_sampler_params_t p = plain();
        switch (i) {
        case 0: p.top_p = 1.5f; break;
        case 1: p.min_p = -0.1f; break;
        case 2: p.temp = NAN; break;
        case 3: p.repeat_penalty = 0.0f; break;
        case 4: p.penalty_last_n = -2; break;
        case 5: p.logit_bias = &far; p.n_logit_bias = 1; break;
        }
        rt_sampler_t *s = NULL;
        bl_err_t err = {0};
        assert_int_equal(rt_sampler_create(&s, &p, 10, 100, NULL, &err), BL_EINVAL);
        assert_null(s);
        if (!strstr(err.msg, fields[i]))
            fail_msg("error for %s does not name it: %s", fields[i], err.msg);
    }
}

/* A request's list: only the stages it names run, in its order. */
static void test_sampler_chain_of_the_request(void **state)
{
    (void)state;
    const float logits[4] = {1.0f, 0.9f, 0.8f, 0.7f};
    int hist[4];
    rt_sampler_params_t p = plain();
    p.temp = 0.0f;
    p.n_stages = 0; /* no stage: temperature 0 does not apply, the draw is random */
    rt_sampler_t *s = make(&p, 4);
    histogram(s, logits, 4, 400, hist);
    for (int i = 0; i < 4; i++)
        assert_true(hist[i] > 40);
    rt_sampler_destroy(s);

    p.stages[0] = RT_STAGE_TEMPERATURE; /* now greedy */
    p.n_stages = 1;
    s = make(&p, 4);
    histogram(s, logits, 4, 100, hist);
    assert_int_equal(hist[0], 100);
    rt_sampler_destroy(s);

    /* top_k 2 then top_p 0.5 keeps one token; top_p 0.5 over four then top_k 2
     * keeps two (p of the best is 0.29 < 0.5) */
    p = plain();
    p.top_k = 2;
    p.top_p = 0.5f;
    p.stages[0] = RT_STAGE_TOP_K;
    p.stages[1] = RT_STAGE_TOP_P;
    p.n_stages = 2;
    s = make(&p, 4);
    histogram(s, logits, 4, 200, hist);
    assert_int_equal(hist[0], 200);
    rt_sampler_destroy(s);
    p.stages[0] = RT_STAGE_TOP_P;
    p.stages[1] = RT_STAGE_TOP_K;
    s = make(&p, 4);
    histogram(s, logits, 4, 200, hist);
    assert_true(hist[0] > 0 && hist[1] > 0 && hist[2] == 0 && hist[3] == 0);
    rt_sampler_destroy(s);

    /* names and letters */
    assert_int_equal(rt_sampler_stage_by_name("typ_p", 5), RT_STAGE_TYPICAL_P);
    assert_int_equal(rt_sampler_stage_by_name("nucleus", 7), RT_STAGE_TOP_P);
    assert_int_equal(rt_sampler_stage_by_name("top_k2", 6), -1);
    assert_int_equal(rt_sampler_stage_by_char('i'), RT_STAGE_INFILL);
    assert_int_equal(rt_sampler_stage_by_char('q'), -1);
    assert_string_equal(rt_sampler_stage_name(RT_STAGE_TYPICAL_P), "typ_p");

    /* bad lists */
    bl_err_t err = {0};
    p.n_stages = RT_SAMPLER_MAX_STAGES + 1;
    assert_int_equal(rt_sampler_params_check(&p, 4, &err), BL_EINVAL);
    p.n_stages = 1;
    p.stages[0] = 77;
    assert_int_equal(rt_sampler_params_check(&p, 4, &err), BL_EINVAL);
    p.stages[0] = RT_STAGE_INFILL; /* needs the vocabulary */
    assert_int_equal(rt_sampler_create(&s, &p, 4, 16, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "infill"));
}

/* A tiny vocabulary for the infill stage: a ab abc x b c y z, and <|im_end|>
 * (control, the end of a turn). */
enum { T_A, T_AB, T_ABC, T_X, T_B, T_C, T_END, T_Y, T_Z, N_TOY };
static rt_tokenizer_t *toy_vocab(void)
{
    static const rt_str_t texts[N_TOY] = {{"a", 1}, {"ab", 2}, {"abc", 3}, {"x", 1},
                                          {"b", 1}, {"c", 1}, {"<|im_end|>", 10}, {"y", 1},
                                          {"z", 1}};
    static const int32_t types[N_TOY] = {1, 1, 1, 1, 1, 1, RT_TOKEN_CONTROL, 1, 1};
    rt_tokenizer_desc_t d;
    rt_tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.pre = "qwen2";
    d.n_vocab = N_TOY;
    d.tokens = texts;
    d.types = types;
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = {0};
    if (rt_tokenizer_create(&tok, &d, &err))
        fail_msg("toy vocabulary: %s", err.msg);
    assert_true(rt_tokenizer_is_eog(tok, T_END));
    return tok;
}

/* A vocabulary for thoughts: the model would think ("hmm") forever. */
enum { H_OPEN, H_CLOSE, H_LT_SLASH, H_THINK, H_GT, H_HMM, H_OBJ, H_END, H_LT, N_THINK };
static rt_tokenizer_t *think_vocab(void)
{
    static const rt_str_t texts[N_THINK] = {{"<think>", 7}, {"</think>", 8}, {"</", 2},
                                            {"think", 5},   {">", 1},        {"hmm", 3},
                                            {"{}", 2},      {"<|im_end|>", 10}, {"<", 1}};
    static const int32_t types[N_THINK] = {1, 1, 1, 1, 1, 1, 1, RT_TOKEN_CONTROL, 1};
    rt_tokenizer_desc_t d;
    rt_tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.pre = "qwen2";
    d.n_vocab = N_THINK;
    d.tokens = texts;
    d.types = types;
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = {0};
    if (rt_tokenizer_create(&tok, &d, &err))
        fail_msg("think vocabulary: %s", err.msg);
    return tok;
}

/* Samples until the end token or n steps; the text in out. */
static void think_run(rt_sampler_t *s, const rt_tokenizer_t *tok, const float *lg, int n,
                      char *out, size_t cap)
{
    out[0] = 0;
    for (int step = 0; step < n; step++) {
        int32_t t = rt_sampler_sample(s, lg);
        rt_sampler_accept_generated(s, t);
        if (t == H_END)
            break;
        rt_str_t piece = rt_tokenizer_piece(tok, t);
        if (strlen(out) + piece.len < cap)
            strncat(out, piece.ptr, piece.len);
    }
}

static void test_sampler_thought_budget_forces_the_end_tag(void **state)
{
    (void)state;
    rt_tokenizer_t *tok = think_vocab();
    /* "hmm" is likeliest, then the end tag in pieces; the whole tag is unlikely */
    const float lg[N_THINK] = {2, -9, 1, 0.5f, 0.5f, 6, 0, -1, 0.2f};
    static const char gbnf[] = "root ::= \"<think>\" [^<]* \"</think>\" \"{}\"\n";
    rt_sampler_params_t p = plain();
    p.temp = 0; /* greedy: the model's own choice wherever it is free */
    p.grammar = gbnf;
    p.grammar_len = sizeof gbnf - 1;
    char text[512];
    /* without a budget the thought never ends */
    rt_sampler_t *s = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_sampler_create(&s, &p, N_THINK, 64, tok, &err), 0);
    think_run(s, tok, lg, 40, text, sizeof text);
    assert_null(strstr(text, "</think>"));
    rt_sampler_destroy(s);
    /* with one: 5 tokens of thought (the open tag among them), the tag, the reply */
    p.think_budget = 5;
    assert_int_equal(rt_sampler_create(&s, &p, N_THINK, 64, tok, &err), 0);
    for (int run = 0; run < 2; run++) {
        think_run(s, tok, lg, 40, text, sizeof text);
        assert_string_equal(text, "<think>hmmhmmhmmhmm</think>{}");
        rt_sampler_reset(s);
    }
    rt_sampler_destroy(s);
    /* no grammar: the tag is forced all the same; then the model goes on */
    p.grammar = NULL;
    p.grammar_len = 0;
    p.think_budget = 3;
    assert_int_equal(rt_sampler_create(&s, &p, N_THINK, 64, tok, &err), 0);
    think_run(s, tok, lg, 8, text, sizeof text);
    assert_string_equal(text, "hmmhmmhmmhmmhmmhmmhmmhmm"); /* no "<think>": no thought */
    rt_sampler_destroy(s);
    /* the prompt opened the thought: it counts from the first token */
    p.think_open = 1;
    assert_int_equal(rt_sampler_create(&s, &p, N_THINK, 64, tok, &err), 0);
    think_run(s, tok, lg, 8, text, sizeof text);
    assert_string_equal(text, "hmmhmmhmm</think>hmmhmm");
    rt_sampler_destroy(s);
    /* a tag the model began itself is finished, not begun again */
    const float lg2[N_THINK] = {2, -9, 1, 0.5f, 0.5f, 6, 0, -1, 0.2f};
    p.think_open = 1;
    p.think_budget = 2;
    assert_int_equal(rt_sampler_create(&s, &p, N_THINK, 64, tok, &err), 0);
    rt_sampler_accept_generated(s, H_HMM);
    rt_sampler_accept_generated(s, H_LT_SLASH); /* "</": the budget is spent here */
    think_run(s, tok, lg2, 3, text, sizeof text);
    assert_string_equal(text, "think>hmm");
    rt_sampler_destroy(s);
    p.think_budget = -1;
    assert_int_equal(rt_sampler_create(&s, &p, N_THINK, 64, tok, &err), BL_EINVAL);
    p.think_budget = 4;
    assert_int_equal(rt_sampler_create(&s, &p, N_THINK, 64, NULL, &err), BL_EINVAL);
    rt_tokenizer_destroy(tok);
}

/* A format's own tags: mistral's [THINK] ... [/THINK], and a close tag longer than
 * "</think>" (harmony's analysis channel ends at <|end|>, opens with 30 bytes). */
static void test_sampler_thought_budget_other_tags(void **state)
{
    (void)state;
    enum { M_OPEN, M_CLOSE, M_LB, M_SLASH, M_THINK, M_RB, M_HMM, M_END, M_HOPEN, M_HEND,
           M_HRET, M_HCALL, N_M };
    static const rt_str_t texts[N_M] = {{"[THINK]", 7}, {"[/THINK]", 8}, {"[", 1},
                                        {"/", 1},       {"THINK", 5},    {"]", 1},
                                        {"hmm", 3},     {"<|im_end|>", 10},
                                        {"<|channel|>analysis<|message|>", 30},
                                        {"<|end|>", 7}, {"<|return|>", 10}, {"<|call|>", 8}};
    /* harmony's markers are control tokens: <|end|> goes on, <|return|> and <|call|> end */
    static const int32_t types[N_M] = {1, 1, 1, 1, 1, 1, 1, RT_TOKEN_CONTROL, 1,
                                       RT_TOKEN_CONTROL, RT_TOKEN_CONTROL, RT_TOKEN_CONTROL};
    rt_tokenizer_desc_t d;
    rt_tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.pre = "qwen2";
    d.n_vocab = N_M;
    d.tokens = texts;
    d.types = types;
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = {0};
    if (rt_tokenizer_create(&tok, &d, &err))
        fail_msg("vocabulary: %s", err.msg);
    assert_false(rt_tokenizer_is_eog(tok, M_HEND));
    assert_true(rt_tokenizer_is_eog(tok, M_HRET) && rt_tokenizer_is_eog(tok, M_HCALL));
    rt_sampler_params_t p = plain();
    p.temp = 0;
    p.think_budget = 3;
    p.think_tags[0] = "[THINK]";
    p.think_tags[1] = "[/THINK]";
    /* the model opens the thought and would think forever; the close tag is unlikely
     * whole, so it comes in pieces */
    float lg[N_M] = {9, -9, 1, 0.5f, 0.5f, 0.5f, 6, -1, -9, -9, -9, -9};
    rt_sampler_t *s = NULL;
    assert_int_equal(rt_sampler_create(&s, &p, N_M, 64, tok, &err), 0);
    char out[256] = "";
    for (int step = 0; step < 8; step++) {
        int32_t t = rt_sampler_sample(s, lg);
        rt_sampler_accept_generated(s, t);
        lg[M_OPEN] = -9; /* opened once */
        rt_str_t piece = rt_tokenizer_piece(tok, t);
        strncat(out, piece.ptr, piece.len);
    }
    assert_string_equal(out, "[THINK]hmmhmm[/THINK]hmm"); /* the tag came in 4 pieces */
    rt_sampler_destroy(s);
    /* "<think>" is not this format's tag: no thought, no bound */
    float lg3[N_M] = {-9, -9, 1, 0.5f, 0.5f, 0.5f, 6, -1, -9, -9, -9, -9};
    p.think_open = 0;
    assert_int_equal(rt_sampler_create(&s, &p, N_M, 64, tok, &err), 0);
    out[0] = 0;
    for (int step = 0; step < 5; step++) {
        int32_t t = rt_sampler_sample(s, lg3);
        rt_sampler_accept_generated(s, t);
        strncat(out, rt_tokenizer_piece(tok, t).ptr, rt_tokenizer_piece(tok, t).len);
    }
    assert_string_equal(out, "hmmhmmhmmhmmhmm");
    rt_sampler_destroy(s);
    /* harmony: the analysis channel opens with one long token, <|end|> closes it */
    p.think_tags[0] = "<|channel|>analysis<|message|>";
    p.think_tags[1] = "<|end|>";
    p.think_budget = 2;
    float lg2[N_M] = {-9, -9, -9, -9, -9, -9, 6, -1, 9, -5, -9, -9};
    assert_int_equal(rt_sampler_create(&s, &p, N_M, 64, tok, &err), 0);
    out[0] = 0;
    for (int step = 0; step < 5; step++) {
        int32_t t = rt_sampler_sample(s, lg2);
        rt_sampler_accept_generated(s, t);
        lg2[M_HOPEN] = -9;
        strncat(out, rt_tokenizer_piece(tok, t).ptr, rt_tokenizer_piece(tok, t).len);
    }
    assert_string_equal(out, "<|channel|>analysis<|message|>hmm<|end|>hmmhmm");
    rt_sampler_destroy(s);
    /* a tag longer than the sampler follows, or empty, is refused */
    char long_tag[RT_SAMPLER_MAX_TAG + 2];
    memset(long_tag, 'x', sizeof long_tag - 1);
    long_tag[sizeof long_tag - 1] = 0;
    p.think_tags[1] = long_tag;
    assert_int_equal(rt_sampler_create(&s, &p, N_M, 64, tok, &err), BL_EINVAL);
    p.think_tags[1] = "";
    assert_int_equal(rt_sampler_create(&s, &p, N_M, 64, tok, &err), BL_EINVAL);
    rt_tokenizer_destroy(tok);
}

static void test_sampler_infill_stage(void **state)
{
    (void)state;
    rt_tokenizer_t *tok = toy_vocab();
    rt_sampler_params_t p = plain();
    p.stages[0] = RT_STAGE_INFILL;
    p.n_stages = 1;
    rt_sampler_t *s = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_sampler_create(&s, &p, N_TOY, 64, tok, &err), 0);
    int hist[N_TOY];
    int32_t ids[N_TOY];
    float probs[N_TOY];

    /* the end of generation holds enough of the mass: only it remains */
    float eog[N_TOY] = {0, 0, 0, 0, 0, 0, 1.0f, 0, 0};
    histogram(s, eog, N_TOY, 50, hist);
    assert_int_equal(hist[T_END], 50);

    /* a takes ab and abc (its text begins theirs): 0.75; x (0.15), b, c fall under
     * 0.2; the end token stays */
    const float pr[N_TOY] = {0.30f, 0.25f, 0.20f, 0.15f, 0.03f, 0.02f, 0.01f, 0.02f, 0.02f};
    float lg[N_TOY];
    for (int i = 0; i < N_TOY; i++)
        lg[i] = logf(pr[i]);
    histogram(s, lg, N_TOY, 300, hist);
    assert_int_equal(hist[T_AB] + hist[T_ABC] + hist[T_X] + hist[T_B] + hist[T_C] + hist[T_Y] +
                         hist[T_Z], 0);
    assert_true(hist[T_A] > 280);
    (void)rt_sampler_sample(s, lg);
    size_t n = rt_sampler_last_candidates(s, ids, probs, N_TOY);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], T_A);
    assert_float_equal(probs[0], 0.75f / 0.76f, 1e-4);
    assert_int_equal(ids[1], T_END);

    /* no text token reaches 0.2 (five at 0.198): the end of the turn alone */
    const float flat[N_TOY] = {-90.0f, -90.0f, -90.0f, 0, 0, 0, logf(0.01f / 0.198f), 0, 0};
    histogram(s, flat, N_TOY, 20, hist);
    assert_int_equal(hist[T_END], 20);
    rt_sampler_destroy(s);
    rt_tokenizer_destroy(tok);
}

/* The grammar "ab" ("x" | "y")* "c", on the toy vocabulary: the model prefers what
 * the grammar forbids, and the sampler must still write only what it allows, and
 * end (<|im_end|>) exactly when it is complete. */
static void test_sampler_grammar_constrains_every_token(void **state)
{
    (void)state;
    rt_tokenizer_t *tok = toy_vocab();
    static const char gbnf[] = "root ::= \"ab\" (\"x\" | \"y\")* \"c\"\n";
    rt_sampler_params_t p = plain();
    p.temp = 1.0f;
    p.grammar = gbnf;
    p.grammar_len = sizeof gbnf - 1;
    rt_sampler_t *s = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_sampler_create(&s, &p, N_TOY, 64, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "grammar"));
    assert_int_equal(rt_sampler_create(&s, &p, N_TOY, 64, tok, &err), 0);
    /* z, abc and the end are likeliest; the grammar allows none of them at first */
    const float lg[N_TOY] = {0, -1, 3, -2, -2, -1, 4, -3, 5};
    for (int run = 0; run < 20; run++) {
        char text[64] = "";
        int32_t t = -1;
        for (int step = 0; step < 12; step++) {
            t = rt_sampler_sample(s, lg);
            rt_sampler_accept_generated(s, t);
            if (t == T_END)
                break;
            rt_str_t piece = rt_tokenizer_piece(tok, t);
            strncat(text, piece.ptr, piece.len);
        }
        /* ab, then x or y any number of times, then c, then the end */
        size_t n = strlen(text);
        assert_true(n >= 3);
        assert_memory_equal(text, "ab", 2);
        assert_int_equal(text[n - 1], 'c');
        assert_int_equal(strspn(text + 2, "xy"), n - 3);
        assert_int_equal(t, T_END);
        rt_sampler_reset(s);
    }
    rt_sampler_destroy(s);

    /* a trie built once and shared gives the same draws as the sampler's own */
    rt_grammar_vocab_t *shared = NULL;
    assert_int_equal(rt_sampler_grammar_vocab(&shared, tok, &err), 0);
    rt_sampler_t *a = NULL, *b = NULL;
    p.seed = 1234;
    assert_int_equal(rt_sampler_create(&a, &p, N_TOY, 64, tok, &err), 0);
    p.grammar_vocab = shared;
    assert_int_equal(rt_sampler_create(&b, &p, N_TOY, 64, tok, &err), 0);
    for (int step = 0; step < 12; step++) {
        int32_t x = rt_sampler_sample(a, lg), y = rt_sampler_sample(b, lg);
        assert_int_equal(x, y);
        rt_sampler_accept_generated(a, x);
        rt_sampler_accept_generated(b, y);
        if (x == T_END) {
            rt_sampler_reset(a);
            rt_sampler_reset(b);
        }
    }
    rt_sampler_destroy(a);
    rt_sampler_destroy(b);
    rt_grammar_vocab_destroy(shared);
    p.grammar_vocab = NULL;

    /* a grammar that does not compile is refused, naming the place */
    p.grammar = "root ::= (\"a\"\n";
    p.grammar_len = strlen(p.grammar);
    assert_int_equal(rt_sampler_create(&s, &p, N_TOY, 64, tok, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "line 1"));
    rt_tokenizer_destroy(tok);
}

int main(void)
{
    test_seed_init("test_router_sampler");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_defaults_are_llama_server_defaults),
        cmocka_unit_test(test_sampler_zero_temperature_is_argmax),
        cmocka_unit_test(test_sampler_top_k_one_is_argmax),
        cmocka_unit_test(test_sampler_top_k_keeps_only_k),
        cmocka_unit_test(test_sampler_same_seed_same_tokens),
        cmocka_unit_test(test_sampler_random_seed_is_reported),
        cmocka_unit_test(test_sampler_draws_follow_the_distribution),
        cmocka_unit_test(test_sampler_temperature_sharpens),
        cmocka_unit_test(test_sampler_top_p_keeps_the_smallest_covering_set),
        cmocka_unit_test(test_sampler_min_p_drops_unlikely_tokens),
        cmocka_unit_test(test_sampler_typical_p_prefers_typical_tokens),
        cmocka_unit_test(test_sampler_logit_bias_bans_and_forces),
        cmocka_unit_test(test_sampler_repeat_penalty_pushes_down_seen_tokens),
        cmocka_unit_test(test_sampler_frequency_and_presence_penalties),
        cmocka_unit_test(test_sampler_candidates_are_sorted_probabilities),
        cmocka_unit_test(test_sampler_nan_logits_are_never_chosen),
        cmocka_unit_test(test_sampler_top_k_fast_path_matches),
        cmocka_unit_test(test_sampler_rejects_bad_parameters),
        cmocka_unit_test(test_sampler_chain_of_the_request),
        cmocka_unit_test(test_sampler_infill_stage),
        cmocka_unit_test(test_sampler_grammar_constrains_every_token),
        cmocka_unit_test(test_sampler_thought_budget_forces_the_end_tag),
        cmocka_unit_test(test_sampler_thought_budget_other_tags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
