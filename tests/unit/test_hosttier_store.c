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
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bl_config.h"
#include "store.h"
#include "test_seed.h"
#include "xread.h"
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

/* Random calls (1..K distinct experts a row) over the held layers, several rounds. */
typedef struct calls {
    int64_t n_calls, n, E, K;
    float *xn, *wts;
    int32_t *ids, *counts;
    int64_t *layer;
} calls_t;

static void make_calls(calls_t *c, rng_t *r, const bl_arch_t *a, int64_t n_calls)
{
    c->n_calls = n_calls;
    c->n = 6;
    c->E = a->n_embd;
    c->K = a->n_expert_used;
    c->xn = malloc(sizeof(float) * (size_t)(n_calls * c->n * c->E));
    c->wts = malloc(sizeof(float) * (size_t)(n_calls * c->n * c->K));
    c->ids = malloc(sizeof(int32_t) * (size_t)(n_calls * c->n * c->K));
    c->counts = malloc(sizeof(int32_t) * (size_t)(n_calls * c->n));
    c->layer = malloc(sizeof(int64_t) * (size_t)n_calls);
    for (int64_t i = 0; i < n_calls * c->n * c->E; i++)
        c->xn[i] = rng_f(r, -1.0f, 1.0f);
    for (int64_t q = 0; q < n_calls; q++) {
        c->layer[q] = q % a->n_layer;
        int32_t *ids = c->ids + q * c->n * c->K;
        float *w = c->wts + q * c->n * c->K;
        int64_t at = 0;
        for (int64_t row = 0; row < c->n; row++) {
            int32_t cnt = (int32_t)(1 + rng_next(r) % (uint64_t)c->K);
            c->counts[q * c->n + row] = cnt;
            for (int32_t j = 0; j < cnt; j++) {
                int32_t id;
                int again;
                do { /* skewed: low ids more often, as routing is */
                    id = (int32_t)(rng_next(r) % (uint64_t)(rng_next(r) % 3 ? (a->n_expert + 3) / 4 : a->n_expert));
                    again = 0;
                    for (int32_t z = 0; z < j; z++)
                        again |= ids[at + z] == id;
                } while (again);
                ids[at + j] = id;
                w[at + j] = rng_f(r, 0.0f, 1.0f);
            }
            at += cnt;
        }
    }
}

static void free_calls(calls_t *c)
{
    free(c->xn);
    free(c->wts);
    free(c->ids);
    free(c->counts);
    free(c->layer);
}

/* Every call's output through store s into out (n_calls, n, E); the return code of
 * the first failing call, or 0. */
static int run_calls(ht_store_t *s, const calls_t *c, float *out, bl_err_t *err)
{
    for (int64_t q = 0; q < c->n_calls; q++) {
        const int rc = ht_store_experts(s, c->layer[q], c->xn + q * c->n * c->E, c->n, c->counts + q * c->n,
                                        c->ids + q * c->n * c->K, c->wts + q * c->n * c->K,
                                        out + q * c->n * c->E, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* The reference for the stores of the tests below: the shared model's store with
 * every expert copied, per_layer calls a layer on fresh rows (seed k) into *c, their
 * outputs into a new buffer (*out_n floats); *a its arch, *all its expert bytes. */
static float *reference_outputs(int k, int per_layer, calls_t *c, size_t *out_n, bl_arch_t *a, uint64_t *all)
{
    ht_store_t *s = NULL;
    bl_err_t err = {0};
    const ht_store_opts_t so = {.path = g_moe, .n_threads = 2, .n_batch = 16};
    assert_int_equal(ht_store_open(&s, &so, &err), 0);
    *a = *ht_store_arch(s);
    *all = ht_store_bytes(s);
    assert_int_equal(ht_store_layers_copied(s), a->n_layer); /* every layer has experts */
    rng_t r = rng_for(k);
    make_calls(c, &r, a, per_layer * a->n_layer);
    *out_n = (size_t)(c->n_calls * c->n * c->E);
    float *want = malloc(sizeof(float) * *out_n);
    assert_non_null(want);
    assert_int_equal(run_calls(s, c, want, &err), 0);
    ht_store_pager_stats_t st;
    ht_store_pager_stats(s, &st);
    assert_int_equal(st.paged, 0);
    ht_store_close(s);
    return want;
}

/* The paged store gives the all-RAM store's bits at every budget (one slot, a few,
 * half, all), through each reader (pread and auto, O_DIRECT and cached) and with
 * the read-ahead of the next layer's experts on (by the router and by heat); its
 * counts say what was read. */
static void test_paged_store_is_bitwise_at_every_budget(void **state)
{
    (void)state;
    NEED_MODELS();
    ht_store_t *s = NULL;
    bl_err_t err = {0};
    ht_store_opts_t so = {.path = g_moe, .n_threads = 2, .n_batch = 16};
    bl_arch_t arch;
    const bl_arch_t *a = &arch;
    uint64_t all;
    calls_t c;
    size_t out_n;
    float *want = reference_outputs(2, 3, &c, &out_n, &arch, &all), *got = malloc(sizeof(float) * out_n);
    const int64_t experts = a->n_layer * a->n_expert;
    ht_store_pager_stats_t st;

    const uint64_t per = all / (uint64_t)experts; /* about one expert's bytes */
    const uint64_t budgets[] = {1, 3 * per + per / 2, all / 2, all - 1};
    for (int b = 0; b < 4; b++)
        for (int kind = 0; kind < 4; kind++) {
            so.ram_bytes = budgets[b];
            so.disk_kind = kind == 1 ? BL_XR_PREAD : BL_XR_AUTO;
            so.disk_cached = kind == 1;
            so.disk_depth = 1 + b;
            so.read_ahead = kind >= 2 ? 4 : 0;
            so.read_ahead_policy = kind == 3 ? HT_AHEAD_HEAT : HT_AHEAD_ROUTER;
            assert_int_equal(ht_store_open(&s, &so, &err), 0);
            memset(got, 0, sizeof(float) * out_n);
            const int rc = run_calls(s, &c, got, &err);
            if (rc)
                print_error("budget %llu: %s\n", (unsigned long long)budgets[b], err.msg);
            assert_int_equal(rc, 0);
            assert_memory_equal(got, want, sizeof(float) * out_n);
            ht_store_pager_stats(s, &st);
            assert_int_equal(st.paged, 1);
            assert_non_null(st.backend);
            assert_true(st.slots >= 1 && st.slots <= experts);
            assert_true(st.bytes_read > 0); /* the first fill at least */
            if (kind >= 2 && b == 2) /* enough slots for a read-ahead */
                assert_true(st.ahead > 0);
            if (kind < 2)
                assert_int_equal(st.ahead, 0);
            if (st.slots == experts) /* the first fill holds everything */
                assert_int_equal(st.misses, 0);
            else if (b < 2) /* a few slots: the calls use more experts than that */
                assert_true(st.misses > 0);
            printf("# budget %llu B: %lld slots, %llu hits, %llu misses, %llu bytes read (%s), %llu read ahead, "
                   "%llu of them used\n", (unsigned long long)budgets[b], (long long)st.slots,
                   (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.bytes_read,
                   st.backend, (unsigned long long)st.ahead_reads, (unsigned long long)st.ahead_used);
            ht_store_close(s);
        }
    free(want);
    free(got);
    free_calls(&c);
}

/* A copy of only some layers (the available memory's margin, here copy_bytes): the
 * layers past it are read from the file's mapping, with the same bits. */
static void test_partly_copied_store_is_bitwise(void **state)
{
    (void)state;
    NEED_MODELS();
    ht_store_t *s = NULL;
    bl_err_t err = {0};
    ht_store_opts_t so = {.path = g_moe, .n_threads = 2, .n_batch = 16};
    bl_arch_t a;
    uint64_t all;
    calls_t c;
    size_t out_n;
    float *want = reference_outputs(3, 2, &c, &out_n, &a, &all), *got = malloc(sizeof(float) * out_n);
    const int64_t held = a.n_layer;
    /* the copy in whole huge pages: a budget under 2 MiB copies no layer */
    const uint64_t budgets[] = {1, all / 2 + ((uint64_t)2 << 20), all - all / held / 2};
    for (int b = 0; b < 3; b++) {
        so.copy_bytes = budgets[b];
        assert_int_equal(ht_store_open(&s, &so, &err), 0);
        const int64_t copied = ht_store_layers_copied(s);
        printf("# copy of at most %llu of %llu bytes: %lld of %lld layers\n", (unsigned long long)budgets[b],
               (unsigned long long)all, (long long)copied, (long long)held);
        assert_true(copied < held);
        if (b == 0)
            assert_int_equal(copied, 0);
        else
            assert_true(copied >= 1);
        memset(got, 0, sizeof(float) * out_n);
        assert_int_equal(run_calls(s, &c, got, &err), 0);
        assert_memory_equal(got, want, sizeof(float) * out_n);
        ht_store_close(s);
    }
    free(want);
    free(got);
    free_calls(&c);
}

/* A copy of the model changed under a paged store: the next read refuses, naming
 * the file, and computes nothing. */
static void test_paged_store_notices_a_changed_file(void **state)
{
    (void)state;
    NEED_MODELS();
    char dir[] = "/var/tmp/bl_store_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    FILE *in = fopen(g_moe, "rb"), *out = fopen(path, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, k, out), k);
    fclose(in);
    assert_int_equal(fclose(out), 0);
    ht_store_t *s = NULL;
    bl_err_t err = {0};
    ht_store_opts_t so = {.path = path, .n_threads = 1, .n_batch = 16, .ram_bytes = 1};
    assert_int_equal(ht_store_open(&s, &so, &err), 0);
    rng_t r = rng_for(3);
    calls_t c;
    make_calls(&c, &r, ht_store_arch(s), 2);
    float *o = malloc(sizeof(float) * (size_t)(c.n * c.E * 2));
    assert_int_equal(run_calls(s, &c, o, &err), 0);
    struct timespec ts[2] = {{.tv_sec = 1000000}, {.tv_sec = 1000000}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
    assert_int_equal(run_calls(s, &c, o, &err), BL_EIO);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "modified"));
    ht_store_close(s);
    free(o);
    free_calls(&c);
    unlink(path);
    rmdir(dir);
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
        cmocka_unit_test(test_paged_store_is_bitwise_at_every_budget),
        cmocka_unit_test(test_partly_copied_store_is_bitwise),
        cmocka_unit_test(test_paged_store_notices_a_changed_file),
        cmocka_unit_test(test_store_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
