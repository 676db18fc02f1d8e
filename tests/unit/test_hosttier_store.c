/* Tests of hosttier/store.c: the hosttier's expert store gives the bits of a CPU
 * worker's own experts (the same kernels/cpu pass) on fresh random rows, holds only
 * the layers it is given, and refuses what it cannot compute by name. Needs the
 * shared models (../shared, or BLOOMERY_SHARED); skips without them. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bl_config.h"
#include "store.h"
#include "test_seed.h"
#include "wk.h"

static char g_moe[1200], g_dense[1200];
static int g_have;

static void find_models(void)
{
    const char *e = getenv("BLOOMERY_SHARED");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", e && *e ? e : BL_SOURCE_ROOT "/../shared");
    snprintf(g_moe, sizeof g_moe, "%s/models/qwen3moe-trained-q8.gguf", dir);
    snprintf(g_dense, sizeof g_dense, "%s/models/qwen3-draft-trained-q8.gguf", dir);
    struct stat st;
    g_have = stat(g_moe, &st) == 0;
}

#define NEED_MODELS()                                                                                        \
    do {                                                                                                     \
        if (!g_have)                                                                                         \
            skip();                                                                                          \
    } while (0)

static void test_store_matches_the_worker(void **state)
{
    (void)state;
    NEED_MODELS();
    wk_model_opts_t mo;
    wk_model_opts_default(&mo);
    mo.n_threads = 2;
    mo.n_batch = 16;
    wk_model_t *m = NULL;
    bl_err_t err = {0};
    assert_int_equal(wk_model_load(&m, g_moe, &mo, &err), 0);
    const wk_config_t *c = wk_model_config(m);
    uint8_t layers[64] = {0};
    assert_true(c->n_layer <= 64);
    for (int64_t l = 1; l < c->n_layer; l += 2)
        layers[l] = 1;
    ht_store_t *s = NULL;
    const ht_store_opts_t so = {.path = g_moe, .layers = layers, .n_threads = 2, .n_batch = 16};
    assert_int_equal(ht_store_open(&s, &so, &err), 0);
    assert_true(ht_store_bytes(s) > 0);
    assert_int_equal(ht_store_arch(s)->n_expert, c->n_expert);

    rng_t r = rng_for(1);
    const int64_t E = c->n_embd, K = c->n_expert_used, n = 5;
    float *xn = malloc(sizeof(float) * (size_t)(n * E)), *a = malloc(sizeof(float) * (size_t)(n * E)),
          *b = malloc(sizeof(float) * (size_t)(n * E));
    int32_t ids[5 * 64], counts[5];
    float wts[5 * 64];
    assert_true(K <= 64);
    for (int64_t i = 0; i < n * E; i++)
        xn[i] = rng_f(&r, -1.0f, 1.0f);
    int64_t at = 0;
    for (int64_t row = 0; row < n; row++) { /* 1..K distinct experts a row */
        counts[row] = (int32_t)(1 + rng_next(&r) % (uint64_t)K);
        for (int32_t j = 0; j < counts[row]; j++) {
            int32_t id;
            int again;
            do {
                id = (int32_t)(rng_next(&r) % (uint64_t)c->n_expert);
                again = 0;
                for (int32_t q = 0; q < j; q++)
                    again |= ids[at + q] == id;
            } while (again);
            ids[at + j] = id;
            wts[at + j] = rng_f(&r, 0.0f, 1.0f);
        }
        at += counts[row];
    }
    for (int64_t l = 1; l < c->n_layer; l += 2) {
        assert_int_equal(wk_model_experts(m, l, xn, n, counts, ids, wts, a, &err), 0);
        assert_int_equal(ht_store_experts(s, l, xn, n, counts, ids, wts, b, &err), 0);
        assert_memory_equal(a, b, sizeof(float) * (size_t)(n * E));
    }
    /* a layer it does not hold, a bad count, a bad id, no rows, too many rows */
    assert_int_equal(ht_store_experts(s, 0, xn, n, counts, ids, wts, b, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "does not hold"));
    assert_int_equal(ht_store_experts(s, c->n_layer, xn, n, counts, ids, wts, b, &err), BL_EINVAL);
    int32_t bad = 0;
    assert_int_equal(ht_store_experts(s, 1, xn, 1, &bad, ids, wts, b, &err), BL_EINVAL);
    bad = (int32_t)K + 1;
    assert_int_equal(ht_store_experts(s, 1, xn, 1, &bad, ids, wts, b, &err), BL_EINVAL);
    int32_t one = 1, big = (int32_t)c->n_expert;
    assert_int_equal(ht_store_experts(s, 1, xn, 1, &one, &big, wts, b, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "expert id"));
    assert_int_equal(ht_store_experts(s, 1, xn, 0, counts, ids, wts, b, &err), BL_ERANGE);
    assert_int_equal(ht_store_experts(s, 1, xn, 17, counts, ids, wts, b, &err), BL_ERANGE);
    free(xn);
    free(a);
    free(b);
    ht_store_close(s);
    wk_model_free(m);
}

static void test_store_refusals(void **state)
{
    (void)state;
    NEED_MODELS();
    ht_store_t *s = NULL;
    bl_err_t err = {0};
    ht_store_opts_t so = {.path = g_dense, .n_threads = 1, .n_batch = 8};
    assert_int_equal(ht_store_open(&s, &so, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "dense"));
    assert_null(s);
    so.path = "/no/such/model.gguf";
    assert_true(ht_store_open(&s, &so, &err) < 0);
    so.path = g_moe;
    so.n_threads = 0;
    assert_int_equal(ht_store_open(&s, &so, &err), BL_EINVAL);
    so.n_threads = 1;
    so.n_batch = 0;
    assert_int_equal(ht_store_open(&s, &so, &err), BL_EINVAL);
    ht_store_close(NULL);
}

int main(void)
{
    test_seed_init("test_hosttier_store");
    find_models();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_matches_the_worker),
        cmocka_unit_test(test_store_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
