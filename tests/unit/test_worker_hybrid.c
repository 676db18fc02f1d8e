/* Tests for the hybrid families (worker/models/qwen3next.c: qwen3next and qwen35moe)
 * through the worker's model API, on tiny random files written here: the config read
 * from them; batched, chunked and token-by-token prompts giving the same bits; the
 * rules of a cache with a recurrent state (no cut back to a prefix, pos 0 starting
 * afresh, whole-state save and load, checkpoints); multi-sequence steps, shared
 * pools and pipeline stages giving each sequence the bits it gets alone; a refused
 * step leaving a pool's cache as it was; and the load refusals of these files.
 *
 * Weights and token ids change every run; the seed is printed and
 * BLOOMERY_TEST_SEED replays it. BLOOMERY_TEST_THREADS sets the thread count
 * (default 2). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "test_seed.h"
#include "wk.h"

// --- the tiny model -----------------------------------------------------------------------------

/* Both files share these shapes (docs/models.md, "qwen3next and qwen35moe: what is
 * computed"), scaled down: layer 3 attends, layers 0-2 and 4 are DeltaNet layers. */
enum {
    N_EMBD = 64,
    N_HEAD = 4,
    HEAD_DIM = 16,
    N_HEAD_KV = 2,
    N_ROT = 8,
    SSM_K = 4,  /* the convolution's taps */
    SSM_S = 16, /* a head's state width */
    SSM_HK = 2, /* q/k heads */
    SSM_HV = 4, /* v heads */
    N_LAYER = 5,
    ATTN_LAYER = 3,
    N_EXPERT = 4,
    N_USED = 2,
    N_FF_EXP = 32,
    N_FF_SH = 32,
    N_VOCAB = 64,
    N_CTX = 256,
};
#define SSM_CH (SSM_S * (2 * SSM_HK + SSM_HV)) /* the convolution's channels */
#define RECURRENT_BITS (((1ull << N_LAYER) - 1) & ~(1ull << ATTN_LAYER)) /* one bit a DeltaNet layer */
#define N_REC_LAYERS 4
/* One DeltaNet layer's state: the convolution's window and the v heads' matrices. */
#define REC_FLOATS ((SSM_K - 1) * SSM_CH + SSM_HV * SSM_S * SSM_S)

enum { Q3N, Q35 }; /* the two architectures, as indices */
static const char *const k_arch[2] = {"qwen3next", "qwen35moe"};
static char g_path[2][512];

/* What the refusal test breaks in a file. */
enum {
    MK_OK,
    MK_NO_SECTIONS,  /* qwen35moe without rope.dimension_sections */
    MK_BAD_SECTIONS, /* sections that leave a rotated pair to the image section */
    MK_SSM_IN,       /* layer 0 in the older form: one ssm_in */
};

enum { T_MAT, T_NORM, T_SSM_A };

typedef struct tdesc {
    char name[BL_GW_MAX_NAME + 1];
    int nd;
    int64_t ne[3];
    int kind;
    double std, mean; /* T_MAT: uniform draws of this spread around mean */
} tdesc_t;

typedef struct tlist {
    tdesc_t t[256];
    size_t n;
    rng_t rng; /* the weights' stream */
} tlist_t;

static void add(tlist_t *L, const char *name, int nd, int64_t ne0, int64_t ne1, int64_t ne2, int kind,
                double std, double mean)
{
    assert_true(L->n < sizeof L->t / sizeof L->t[0]);
    tdesc_t *t = &L->t[L->n++];
    *t = (tdesc_t){.nd = nd, .ne = {ne0, ne1, ne2}, .kind = kind, .std = std, .mean = mean};
    snprintf(t->name, sizeof t->name, "%s", name);
}

/* Block i's tensors, as tools/bloomery-mkmodel.c writes a hybrid block: matrices
 * draw with spread 1/sqrt(fan_in) so activations keep their size, the router twice
 * that so routing is not uniform; the decay rates and time-step bias of
 * bloomery-mkmodel, so that some heads forget within a position and others keep
 * their state over the whole prompt. */
static void add_block(tlist_t *L, int arch, int64_t i, int recurrent, int variant)
{
    const int64_t E = N_EMBD, QD = N_HEAD * HEAD_DIM, KD = N_HEAD_KV * HEAD_DIM, VD = SSM_S * SSM_HV;
    const double ie = 1.0 / sqrt((double)E);
    char n[BL_GW_MAX_NAME + 1];
#define BLK(s) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)i, s), n)
    add(L, BLK("attn_norm.weight"), 1, E, 1, 1, T_NORM, 0, 0);
    if (recurrent) {
        if (variant == MK_SSM_IN && i == 0) {
            add(L, BLK("ssm_in.weight"), 2, E, SSM_CH + VD, 1, T_MAT, ie, 0);
        } else {
            add(L, BLK("attn_qkv.weight"), 2, E, SSM_CH, 1, T_MAT, ie, 0);
            add(L, BLK("attn_gate.weight"), 2, E, VD, 1, T_MAT, ie, 0);
        }
        if (arch == Q3N) {
            add(L, BLK("ssm_ba.weight"), 2, E, 2 * SSM_HV, 1, T_MAT, ie, 0);
        } else {
            add(L, BLK("ssm_beta.weight"), 2, E, SSM_HV, 1, T_MAT, ie, 0);
            add(L, BLK("ssm_alpha.weight"), 2, E, SSM_HV, 1, T_MAT, ie, 0);
        }
        add(L, BLK("ssm_conv1d.weight"), 2, SSM_K, SSM_CH, 1, T_MAT, 1.0 / sqrt((double)SSM_K), 0);
        add(L, BLK("ssm_dt.bias"), 1, SSM_HV, 1, 1, T_MAT, 0.5, -2.0);
        add(L, BLK("ssm_a"), 1, SSM_HV, 1, 1, T_SSM_A, 0, 0);
        add(L, BLK("ssm_norm.weight"), 1, SSM_S, 1, 1, T_NORM, 0, 0);
        add(L, BLK("ssm_out.weight"), 2, VD, E, 1, T_MAT, 1.0 / sqrt((double)VD), 0);
    } else {
        /* per head its q then its gate */
        add(L, BLK("attn_q.weight"), 2, E, 2 * QD, 1, T_MAT, ie, 0);
        add(L, BLK("attn_k.weight"), 2, E, KD, 1, T_MAT, ie, 0);
        add(L, BLK("attn_v.weight"), 2, E, KD, 1, T_MAT, ie, 0);
        add(L, BLK("attn_output.weight"), 2, QD, E, 1, T_MAT, 1.0 / sqrt((double)QD), 0);
        add(L, BLK("attn_q_norm.weight"), 1, HEAD_DIM, 1, 1, T_NORM, 0, 0);
        add(L, BLK("attn_k_norm.weight"), 1, HEAD_DIM, 1, 1, T_NORM, 0, 0);
    }
    add(L, BLK("post_attention_norm.weight"), 1, E, 1, 1, T_NORM, 0, 0);
    add(L, BLK("ffn_gate_inp.weight"), 2, E, N_EXPERT, 1, T_MAT, 2 * ie, 0);
    add(L, BLK("ffn_gate_exps.weight"), 3, E, N_FF_EXP, N_EXPERT, T_MAT, ie, 0);
    add(L, BLK("ffn_up_exps.weight"), 3, E, N_FF_EXP, N_EXPERT, T_MAT, ie, 0);
    add(L, BLK("ffn_down_exps.weight"), 3, N_FF_EXP, E, N_EXPERT, T_MAT, 1.0 / sqrt((double)N_FF_EXP), 0);
    add(L, BLK("ffn_gate_inp_shexp.weight"), 1, E, 1, 1, T_MAT, 2 * ie, 0);
    add(L, BLK("ffn_gate_shexp.weight"), 2, E, N_FF_SH, 1, T_MAT, ie, 0);
    add(L, BLK("ffn_up_shexp.weight"), 2, E, N_FF_SH, 1, T_MAT, ie, 0);
    add(L, BLK("ffn_down_shexp.weight"), 2, N_FF_SH, E, 1, T_MAT, 1.0 / sqrt((double)N_FF_SH), 0);
    if (i >= N_LAYER) { /* qwen35moe's NextN block: read and checked, not run */
        add(L, BLK("nextn.eh_proj.weight"), 2, 2 * E, E, 1, T_MAT, 1.0 / sqrt(2.0 * (double)E), 0);
        add(L, BLK("nextn.enorm.weight"), 1, E, 1, 1, T_NORM, 0, 0);
        add(L, BLK("nextn.hnorm.weight"), 1, E, 1, 1, T_NORM, 0, 0);
        add(L, BLK("nextn.shared_head_norm.weight"), 1, E, 1, 1, T_NORM, 0, 0);
    }
#undef BLK
}

static int fill(void *ud, bl_gguf_writer_t *w, size_t i, bl_err_t *err)
{
    tlist_t *L = ud;
    const tdesc_t *t = &L->t[i];
    const size_t n = (size_t)(t->ne[0] * t->ne[1] * t->ne[2]);
    float *v = malloc(sizeof(float) * n);
    if (!v)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %s", t->name);
    const double a = t->std * sqrt(3.0); /* uniform on [-a, a) has spread std */
    for (size_t j = 0; j < n; j++) {
        if (t->kind == T_NORM) /* gains near 1 */
            v[j] = rng_f(&L->rng, 0.9f, 1.1f);
        else if (t->kind == T_SSM_A) /* -exp(A_log): rates 0.14..1.65 */
            v[j] = -expf(rng_f(&L->rng, -2.0f, 0.5f));
        else
            v[j] = (float)t->mean + rng_f(&L->rng, (float)-a, (float)a);
    }
    int rc = bl_gw_write_data(w, v, sizeof(float) * n, err);
    free(v);
    return rc;
}

/* Writes a random f32 file of arch to path from the seed's stream s. */
static void write_hybrid(const char *path, int arch, int variant, uint64_t s)
{
    tlist_t *L = calloc(1, sizeof *L);
    assert_non_null(L);
    L->rng = rng_for(s);
    const int q35 = arch == Q35;
    const int64_t blocks = N_LAYER + q35; /* qwen35moe: one NextN block after the layers */
    bl_gguf_writer_t *w = NULL;
    bl_err_t err = {0};
    char key[128];
    assert_int_equal(bl_gw_create(&w, &err), 0);
#define K(k) (snprintf(key, sizeof key, "%s.%s", k_arch[arch], k), key)
    int rc = bl_gw_set_str(w, "general.architecture", k_arch[arch], &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("block_count"), (uint32_t)blocks, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("context_length"), N_CTX, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("embedding_length"), N_EMBD, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("attention.head_count"), N_HEAD, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("attention.head_count_kv"), N_HEAD_KV, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("attention.key_length"), HEAD_DIM, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("attention.value_length"), HEAD_DIM, &err);
    rc = rc ? rc : bl_gw_set_f32(w, K("rope.freq_base"), 1e7f, &err);
    rc = rc ? rc : bl_gw_set_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-6f, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("expert_count"), N_EXPERT, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("expert_used_count"), N_USED, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("expert_feed_forward_length"), N_FF_EXP, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("expert_shared_feed_forward_length"), N_FF_SH, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("rope.dimension_count"), N_ROT, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("ssm.conv_kernel"), SSM_K, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("ssm.state_size"), SSM_S, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("ssm.group_count"), SSM_HK, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("ssm.time_step_rank"), SSM_HV, &err);
    rc = rc ? rc : bl_gw_set_u32(w, K("ssm.inner_size"), SSM_S * SSM_HV, &err);
    assert_int_equal(rc, 0);
    if (q35) {
        /* IMRoPE: pair p is in sector p % (the widths' sum), which turns with section
         * sector % 3 while sector < 3 x its width; [2, 1, 1, 0] covers the 4 rotated
         * pairs, [1, 0, 0, 1] leaves pair 1 (sector 1, an empty section) to the image */
        const int32_t good[4] = {2, 1, 1, 0}, bad[4] = {1, 0, 0, 1};
        if (variant != MK_NO_SECTIONS)
            assert_int_equal(bl_gw_set_arr(w, K("rope.dimension_sections"), BL_GGUF_I32,
                                           variant == MK_BAD_SECTIONS ? bad : good, 4, &err), 0);
        /* the layer kinds one bool a block, the NextN block attending */
        uint8_t rec[N_LAYER + 1];
        for (int64_t l = 0; l < blocks; l++)
            rec[l] = (uint8_t)(l < N_LAYER && (RECURRENT_BITS >> l & 1));
        assert_int_equal(bl_gw_set_arr(w, K("attention.recurrent_layers"), BL_GGUF_BOOL, rec, (size_t)blocks, &err),
                         0);
        assert_int_equal(bl_gw_set_u32(w, K("nextn_predict_layers"), 1, &err), 0);
    } else {
        /* layer l attends where (l + 1) % interval == 0: layer 3 alone of 5 */
        assert_int_equal(bl_gw_set_u32(w, K("full_attention_interval"), ATTN_LAYER + 1, &err), 0);
    }
#undef K
    /* qwen35moe ties its head to token_embd (which then draws the head's spread);
     * qwen3next has output.weight */
    add(L, "token_embd.weight", 2, N_EMBD, N_VOCAB, 1, T_MAT, q35 ? 2.0 / sqrt((double)N_EMBD) : 1.0, 0);
    add(L, "output_norm.weight", 1, N_EMBD, 1, 1, T_NORM, 0, 0);
    if (!q35)
        add(L, "output.weight", 2, N_EMBD, N_VOCAB, 1, T_MAT, 2.0 / sqrt((double)N_EMBD), 0);
    for (int64_t i = 0; i < blocks; i++)
        add_block(L, arch, i, i < N_LAYER && (RECURRENT_BITS >> i & 1), variant);
    for (size_t i = 0; i < L->n; i++)
        assert_int_equal(bl_gw_add_tensor(w, L->t[i].name, BL_TYPE_F32, L->t[i].nd, L->t[i].ne, &err), 0);
    rc = bl_gw_write_file(w, path, fill, L, &err);
    if (rc)
        fail_msg("writing %s: %s", path, err.msg);
    bl_gw_destroy(w);
    free(L);
}

static void tmp_path(char *buf, size_t len, const char *tag)
{
    const char *d = getenv("TMPDIR");
    snprintf(buf, len, "%s/bloomery-test-hybrid-%s-%d.gguf", d && *d ? d : "/tmp", tag, (int)getpid());
}

static int files_setup(void **state)
{
    (void)state;
    for (int a = 0; a < 2; a++) {
        tmp_path(g_path[a], sizeof g_path[a], k_arch[a]);
        write_hybrid(g_path[a], a, MK_OK, 1000 + (uint64_t)a);
    }
    return 0;
}

static int files_teardown(void **state)
{
    (void)state;
    for (int a = 0; a < 2; a++)
        unlink(g_path[a]);
    return 0;
}

// --- running it ---------------------------------------------------------------------------------

static int n_threads(void)
{
    const char *e = getenv("BLOOMERY_TEST_THREADS");
    int n = e ? atoi(e) : 2;
    return n >= 1 && n <= 64 ? n : 2;
}

/* The layers [lb, le) of arch's file (0, 0: all) with n_batch rows a pass. */
static wk_model_t *load(int arch, int64_t n_batch, int64_t lb, int64_t le)
{
    wk_model_opts_t o;
    wk_model_opts_default(&o);
    o.n_threads = n_threads();
    o.n_batch = n_batch;
    o.n_ctx_max = 2 * WK_KV_CHUNK;
    o.layer_begin = lb;
    o.layer_end = le;
    wk_model_t *m = NULL;
    bl_err_t err = {0};
    int rc = wk_model_load(&m, g_path[arch], &o, &err);
    if (rc)
        fail_msg("load %s: %s", g_path[arch], err.msg);
    return m;
}

static wk_kv_t *new_kv(const wk_model_t *m, uint32_t type)
{
    wk_kv_t *kv = NULL;
    bl_err_t err = {0};
    int rc = wk_kv_create(&kv, m, 128, type, &err);
    if (rc)
        fail_msg("KV cache: %s", err.msg);
    return kv;
}

static float *logits_of(int64_t rows)
{
    float *p = malloc(sizeof(float) * (size_t)(rows > 0 ? rows : 1) * N_VOCAB);
    assert_non_null(p);
    return p;
}

static void rand_tokens(rng_t *r, int32_t *t, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)(rng_next(r) % N_VOCAB);
}

static void eval_ok(wk_model_t *m, wk_kv_t *kv, const int32_t *t, int64_t n, int64_t pos, int64_t n_out,
                    float *lg)
{
    bl_err_t err = {0};
    int rc = wk_model_eval(m, kv, t, n, pos, n_out, lg, &err);
    if (rc)
        fail_msg("eval of %lld rows at %lld: %s", (long long)n, (long long)pos, err.msg);
    assert_int_equal(wk_kv_n_past(kv), pos + n);
}

/* All n rows' logits of t on a new cache of type; caller frees. */
static float *fresh(wk_model_t *m, const int32_t *t, int64_t n, uint32_t type)
{
    wk_kv_t *kv = new_kv(m, type);
    float *lg = logits_of(n);
    eval_ok(m, kv, t, n, 0, n, lg);
    wk_kv_free(kv);
    return lg;
}

/* Fails unless want and got (rows, N_VOCAB) hold the same bits, naming the first
 * mismatches by row and id. */
static void same_bits(const float *want, const float *got, int64_t rows, const char *what, int arch)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < rows * N_VOCAB; i++)
        if (memcmp(&want[i], &got[i], sizeof(float)) != 0) {
            if (bad < 4)
                print_error("%s (%s): row %lld id %lld: want %.9g, got %.9g\n", what, k_arch[arch],
                            (long long)(i / N_VOCAB), (long long)(i % N_VOCAB), (double)want[i], (double)got[i]);
            bad++;
        }
    if (bad)
        fail_msg("%s (%s): %lld of %lld logits differ", what, k_arch[arch], (long long)bad,
                 (long long)(rows * N_VOCAB));
}

// --- the tests ----------------------------------------------------------------------------------

/* Both files load and the config holds what was written; a cache holds one attention
 * layer's rows and four DeltaNet states; the logits are finite and spread. */
static void test_hybrid_loads_with_config(void **state)
{
    (void)state;
    for (int a = 0; a < 2; a++) {
        wk_model_t *m = load(a, 16, 0, 0);
        const wk_config_t *c = wk_model_config(m);
        assert_string_equal(c->arch, k_arch[a]);
        assert_int_equal(c->moe, 1);
        assert_int_equal(c->n_layer, N_LAYER);
        assert_int_equal(c->n_nextn, a == Q35);
        assert_int_equal(c->n_embd, N_EMBD);
        assert_int_equal(c->n_head, N_HEAD);
        assert_int_equal(c->n_head_kv, N_HEAD_KV);
        assert_int_equal(c->head_dim, HEAD_DIM);
        assert_int_equal(c->n_rot, N_ROT);
        assert_int_equal(c->rope_neox, 1);
        assert_true(c->attn_scale == 1.0f / sqrtf((float)HEAD_DIM));
        assert_int_equal(c->n_expert, N_EXPERT);
        assert_int_equal(c->n_expert_used, N_USED);
        assert_int_equal(c->n_ff_exp, N_FF_EXP);
        assert_int_equal(c->n_ff_shexp, N_FF_SH);
        assert_int_equal(c->n_dense_lead, 0);
        assert_true(c->expert_scale == 1.0f);
        assert_int_equal(c->expert_norm, 1);
        assert_int_equal(c->ssm_conv, SSM_K);
        assert_int_equal(c->ssm_state, SSM_S);
        assert_int_equal(c->ssm_groups, SSM_HK);
        assert_int_equal(c->ssm_heads, SSM_HV);
        assert_int_equal(c->ssm_tiled, a == Q35); /* v head h reads q/k head h % Hk */
        assert_int_equal(c->ssm_ba, a == Q3N);    /* one ssm_ba, not ssm_beta and ssm_alpha */
        assert_int_equal(c->attn_gate, 1);
        assert_int_equal(c->shexp_gate, 1);
        assert_int_equal(c->recurrent[0], RECURRENT_BITS);
        for (size_t i = 1; i < sizeof c->recurrent / sizeof c->recurrent[0]; i++)
            assert_int_equal(c->recurrent[i], 0);
        assert_string_equal(c->ffn_norm, "post_attention_norm");
        assert_int_equal(c->n_vocab, N_VOCAB);
        assert_int_equal(c->n_ctx_train, N_CTX);
        assert_int_equal(c->tied_output, a == Q35);

        wk_kv_t *kv = new_kv(m, WK_KV_F16);
        const size_t row = (size_t)(N_HEAD_KV * HEAD_DIM) * 2; /* f16 */
        assert_int_equal(wk_kv_planes(kv), 2);
        assert_int_equal(wk_kv_row_bytes(kv), row);
        assert_int_equal(wk_kv_ckpt_bytes(kv), (size_t)N_REC_LAYERS * REC_FLOATS * sizeof(float));
        assert_int_equal(wk_kv_state_bytes(kv, 10), 10 * 2 * row + wk_kv_ckpt_bytes(kv));
        rng_t r = rng_for(1 + (uint64_t)a);
        int32_t t[3];
        rand_tokens(&r, t, 3);
        float *lg = logits_of(3);
        eval_ok(m, kv, t, 3, 0, 3, lg);
        for (int64_t row_i = 0; row_i < 3; row_i++) {
            float lo = INFINITY, hi = -INFINITY;
            for (int64_t v = 0; v < N_VOCAB; v++) {
                const float x = lg[row_i * N_VOCAB + v];
                assert_true(isfinite(x));
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
            }
            /* the head's spread: a flat row would let a wrong state pass unseen */
            if (!(hi - lo > 2.0f))
                fail_msg("%s: row %lld's logits span only %g", k_arch[a], (long long)row_i, (double)(hi - lo));
        }
        free(lg);
        wk_kv_free(kv);
        wk_model_free(m);
    }
}

/* A prompt of 40 as one pass (n_batch 64), as one eval that chunks it (n_batch 16),
 * token by token, and as calls of 7 tokens: the same bits at every position, in
 * precise mode and on the fast path. */
static void test_hybrid_batch_chunks_decode_equal(void **state)
{
    (void)state;
    enum { N = 40, STEP = 7 };
    for (int a = 0; a < 2; a++) {
        rng_t r = rng_for(10 + (uint64_t)a);
        int32_t t[N];
        rand_tokens(&r, t, N);
        for (int precise = 0; precise <= 1; precise++) {
            wk_model_opts_t o;
            wk_model_opts_default(&o);
            o.n_threads = n_threads();
            o.n_ctx_max = 2 * WK_KV_CHUNK;
            o.precise = precise;
            wk_model_t *ms[2] = {NULL, NULL};
            bl_err_t err = {0};
            for (int i = 0; i < 2; i++) {
                o.n_batch = i == 0 ? 64 : 16;
                if (wk_model_load(&ms[i], g_path[a], &o, &err))
                    fail_msg("load: %s", err.msg);
            }
            wk_model_t *m = ms[1];
            float *ref = fresh(ms[0], t, N, WK_KV_F16);
            float *got = fresh(m, t, N, WK_KV_F16);
            same_bits(ref, got, N, "one eval in chunks of n_batch 16", a);
            /* the last 10 rows' logits only: they span the last two chunks */
            wk_kv_t *k10 = new_kv(m, WK_KV_F16);
            eval_ok(m, k10, t, N, 0, 10, got);
            same_bits(ref + (N - 10) * N_VOCAB, got, 10, "the last 10 rows of a chunked eval", a);
            wk_kv_free(k10);

            wk_kv_t *kv = new_kv(m, WK_KV_F16);
            for (int64_t i = 0; i < N; i++)
                eval_ok(m, kv, &t[i], 1, i, 1, got + i * N_VOCAB);
            same_bits(ref, got, N, "token by token", a);

            wk_kv_t *kv7 = new_kv(m, WK_KV_F16);
            for (int64_t i = 0; i < N; i += STEP) {
                const int64_t n = N - i < STEP ? N - i : STEP;
                eval_ok(m, kv7, t + i, n, i, n, got + i * N_VOCAB);
            }
            same_bits(ref, got, N, "calls of 7", a);
            wk_kv_free(kv);
            wk_kv_free(kv7);
            free(ref);
            free(got);
            wk_model_free(ms[0]);
            wk_model_free(ms[1]);
        }
    }
}

/* 1, 2 and 3 threads give the same bits for a prompt and a few decode steps: the
 * convolution splits over channels, the recurrence over heads, never inside a sum. */
static void test_hybrid_threads_bitwise_equal(void **state)
{
    (void)state;
    enum { N = 24, D = 4 };
    for (int a = 0; a < 2; a++) {
        rng_t r = rng_for(90 + (uint64_t)a);
        int32_t t[N + D];
        rand_tokens(&r, t, N + D);
        float *ref = NULL, *got = logits_of(N + D);
        for (int threads = 1; threads <= 3; threads++) {
            wk_model_opts_t o;
            wk_model_opts_default(&o);
            o.n_threads = threads;
            o.n_batch = 16;
            o.n_ctx_max = 2 * WK_KV_CHUNK;
            wk_model_t *m = NULL;
            bl_err_t err = {0};
            if (wk_model_load(&m, g_path[a], &o, &err))
                fail_msg("load: %s", err.msg);
            wk_kv_t *kv = new_kv(m, WK_KV_F16);
            eval_ok(m, kv, t, N, 0, N, got);
            for (int64_t i = N; i < N + D; i++)
                eval_ok(m, kv, t + i, 1, i, 1, got + i * N_VOCAB);
            if (!ref) {
                ref = got;
                got = logits_of(N + D);
            } else {
                same_bits(ref, got, N + D, threads == 2 ? "2 threads" : "3 threads", a);
            }
            wk_kv_free(kv);
            wk_model_free(m);
        }
        free(ref);
        free(got);
    }
}

/* A step at a position strictly between 0 and n_past is refused, naming the
 * recurrent state, through wk_model_eval and wk_model_eval_multi, and changes
 * nothing: the sequence then goes on with the bits of a run that never saw it. */
static void test_hybrid_mid_position_refused(void **state)
{
    (void)state;
    enum { N = 40, CUT = 20 };
    for (int a = 0; a < 2; a++) {
        wk_model_t *m = load(a, 16, 0, 0);
        rng_t r = rng_for(20 + (uint64_t)a);
        int32_t t[N];
        rand_tokens(&r, t, N);
        float *ref = fresh(m, t, N, WK_KV_F16);
        wk_kv_t *kv = new_kv(m, WK_KV_F16), *other = new_kv(m, WK_KV_F16);
        float *lg = logits_of(N);
        eval_ok(m, kv, t, CUT, 0, 0, NULL);
        eval_ok(m, other, t, 3, 0, 0, NULL);
        bl_err_t err = {0};
        const int64_t mid[] = {1, CUT / 2, CUT - 1};
        for (size_t i = 0; i < sizeof mid / sizeof mid[0]; i++) {
            memset(&err, 0, sizeof err);
            assert_int_equal(wk_model_eval(m, kv, t + mid[i], 1, mid[i], 1, lg, &err), BL_EINVAL);
            if (!strstr(err.msg, "recurrent state"))
                fail_msg("eval at %lld of %d: %s", (long long)mid[i], CUT, err.msg);
            assert_int_equal(wk_kv_n_past(kv), CUT);
        }
        /* in a step of two, one of them cut back: neither cache changes */
        const wk_seq_t q[2] = {{.kv = other, .tokens = t + 3, .n = 2, .pos = 3, .n_out = 1},
                               {.kv = kv, .tokens = t + 5, .n = 2, .pos = 5, .n_out = 1}};
        memset(&err, 0, sizeof err);
        assert_int_equal(wk_model_eval_multi(m, q, 2, lg, &err), BL_EINVAL);
        if (!strstr(err.msg, "recurrent state"))
            fail_msg("multi: %s", err.msg);
        assert_int_equal(wk_kv_n_past(other), 3);
        assert_int_equal(wk_kv_n_past(kv), CUT);
        /* past the end is refused as for any cache */
        assert_int_equal(wk_model_eval(m, kv, t, 1, CUT + 1, 1, lg, &err), BL_EINVAL);
        eval_ok(m, kv, t + CUT, N - CUT, CUT, N - CUT, lg);
        same_bits(ref + CUT * N_VOCAB, lg, N - CUT, "after refused steps", a);
        eval_ok(m, other, t + 3, N - 3, 3, N - 3, lg);
        same_bits(ref + 3 * N_VOCAB, lg, N - 3, "the other sequence after a refused step", a);
        free(lg);
        free(ref);
        wk_kv_free(kv);
        wk_kv_free(other);
        wk_model_free(m);
    }
}

/* pos 0 on a used cache starts the sequence afresh (state and window zeroed): the
 * bits of a new cache, whether the cache was longer or shorter before, through a
 * chunked eval (only its first chunk starts at 0) and through a multi-sequence step. */
static void test_hybrid_pos0_restarts(void **state)
{
    (void)state;
    enum { N = 40, U = 13 };
    for (int a = 0; a < 2; a++) {
        wk_model_t *m = load(a, 16, 0, 0);
        rng_t r = rng_for(30 + (uint64_t)a);
        int32_t t[N], u[U];
        rand_tokens(&r, t, N);
        rand_tokens(&r, u, U);
        float *ref_t = fresh(m, t, N, WK_KV_F16), *ref_u = fresh(m, u, U, WK_KV_F16);
        float *lg = logits_of(N);
        wk_kv_t *kv = new_kv(m, WK_KV_F16);
        eval_ok(m, kv, t, N, 0, 0, NULL);
        eval_ok(m, kv, u, U, 0, U, lg);
        same_bits(ref_u, lg, U, "pos 0 after a longer sequence", a);
        eval_ok(m, kv, t, N, 0, N, lg);
        same_bits(ref_t, lg, N, "pos 0 after a shorter one, in chunks", a);
        /* one row at 0, then the rest of u one call at a time */
        eval_ok(m, kv, u, 1, 0, 1, lg);
        for (int64_t i = 1; i < U; i++)
            eval_ok(m, kv, u + i, 1, i, 1, lg + i * N_VOCAB);
        same_bits(ref_u, lg, U, "one row at 0 then decode", a);
        /* a multi-sequence step: kv restarts while another sequence goes on */
        wk_kv_t *other = new_kv(m, WK_KV_F16);
        eval_ok(m, other, t, 10, 0, 0, NULL);
        const wk_seq_t q[2] = {{.kv = other, .tokens = t + 10, .n = 1, .pos = 10, .n_out = 1},
                               {.kv = kv, .tokens = t, .n = 5, .pos = 0, .n_out = 5}};
        bl_err_t err = {0};
        if (wk_model_eval_multi(m, q, 2, lg, &err))
            fail_msg("multi: %s", err.msg);
        same_bits(ref_t + 10 * N_VOCAB, lg, 1, "the other sequence beside a restart", a);
        same_bits(ref_t, lg + N_VOCAB, 5, "restart at 0 in a multi-sequence step", a);
        free(ref_t);
        free(ref_u);
        free(lg);
        wk_kv_free(kv);
        wk_kv_free(other);
        wk_model_free(m);
    }
}

/* A whole state (n == n_past) saved and loaded into another cache, fresh or holding
 * another sequence, goes on with the bits of the uninterrupted run, for f16 and f32
 * caches; saving or loading a part is refused, naming the recurrent state. */
static void test_hybrid_save_load_whole_state(void **state)
{
    (void)state;
    enum { N = 30, KEEP = 25 };
    static const uint32_t types[] = {WK_KV_F16, WK_KV_F32};
    for (int a = 0; a < 2; a++) {
        wk_model_t *m = load(a, 16, 0, 0);
        rng_t r = rng_for(40 + (uint64_t)a);
        int32_t t[N], u[9];
        rand_tokens(&r, t, N);
        rand_tokens(&r, u, 9);
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            float *ref = fresh(m, t, N, types[ti]);
            float *lg = logits_of(N);
            wk_kv_t *src = new_kv(m, types[ti]);
            eval_ok(m, src, t, KEEP, 0, 0, NULL);
            bl_err_t err = {0};
            void *buf = NULL;
            const size_t nb = wk_kv_state_bytes(src, KEEP);
            assert_int_equal(nb, (size_t)KEEP * 2 * wk_kv_row_bytes(src) + wk_kv_ckpt_bytes(src));
            assert_int_equal(wk_kv_state_alloc(m, nb, &buf, &err), 0);
            assert_int_equal(wk_kv_save(src, KEEP - 1, buf, &err), BL_EINVAL);
            if (!strstr(err.msg, "recurrent state"))
                fail_msg("save of a part: %s", err.msg);
            assert_int_equal(wk_kv_save(src, KEEP + 1, buf, &err), BL_EINVAL);
            assert_int_equal(wk_kv_save(src, 0, buf, &err), BL_EINVAL);
            assert_int_equal(wk_kv_n_past(src), KEEP);
            if (wk_kv_save(src, KEEP, buf, &err))
                fail_msg("save: %s", err.msg);

            wk_kv_t *dst[2] = {new_kv(m, types[ti]), new_kv(m, types[ti])};
            eval_ok(m, dst[1], u, 9, 0, 0, NULL); /* a state the load replaces */
            for (int d = 0; d < 2; d++) {
                memset(&err, 0, sizeof err);
                assert_int_equal(wk_kv_load(dst[d], KEEP - 1, buf, KEEP, &err), BL_EINVAL);
                if (!strstr(err.msg, "recurrent state"))
                    fail_msg("load of a part: %s", err.msg);
                if (wk_kv_load(dst[d], KEEP, buf, KEEP, &err))
                    fail_msg("load: %s", err.msg);
                assert_int_equal(wk_kv_n_past(dst[d]), KEEP);
                eval_ok(m, dst[d], t + KEEP, N - KEEP, KEEP, N - KEEP, lg);
                same_bits(ref + KEEP * N_VOCAB, lg, N - KEEP, d ? "loaded over another sequence" : "loaded fresh",
                          a);
            }
            /* the saved cache itself goes on as before */
            eval_ok(m, src, t + KEEP, N - KEEP, KEEP, N - KEEP, lg);
            same_bits(ref + KEEP * N_VOCAB, lg, N - KEEP, "the saved cache", a);
            wk_kv_state_free(m, buf);
            wk_kv_free(src);
            wk_kv_free(dst[0]);
            wk_kv_free(dst[1]);
            free(ref);
            free(lg);
        }
        wk_model_free(m);
    }
}

/* A checkpoint at 20 positions, 10 tokens A on top, then back to it and 10 other
 * tokens B: B's logits are those of a new cache fed the first 20 and B, and going
 * back again and replaying A gives A's bits. A checkpoint past n_past (or at 0) is
 * refused and changes nothing. */
static void test_hybrid_checkpoint_rollback(void **state)
{
    (void)state;
    enum { P = 20, M = 10 };
    for (int a = 0; a < 2; a++) {
        wk_model_t *m = load(a, 16, 0, 0);
        rng_t r = rng_for(50 + (uint64_t)a);
        int32_t t[P + M], b[P + M];
        rand_tokens(&r, t, P + M);
        memcpy(b, t, sizeof(int32_t) * P);
        rand_tokens(&r, b + P, M);
        float *ref_a = fresh(m, t, P + M, WK_KV_F16), *ref_b = fresh(m, b, P + M, WK_KV_F16);
        float *lg = logits_of(M);
        wk_kv_t *kv = new_kv(m, WK_KV_F16);
        eval_ok(m, kv, t, P, 0, 0, NULL);
        const size_t cb = wk_kv_ckpt_bytes(kv);
        assert_int_equal(cb, (size_t)N_REC_LAYERS * REC_FLOATS * sizeof(float));
        void *ck = malloc(cb);
        assert_non_null(ck);
        bl_err_t err = {0};
        if (wk_kv_ckpt_save(kv, ck, &err))
            fail_msg("checkpoint: %s", err.msg);
        eval_ok(m, kv, t + P, M, P, M, lg);
        same_bits(ref_a + P * N_VOCAB, lg, M, "A after the checkpoint", a);
        assert_int_equal(wk_kv_ckpt_load(kv, P + M + 1, ck, &err), BL_EINVAL);
        assert_int_equal(wk_kv_ckpt_load(kv, 0, ck, &err), BL_EINVAL);
        assert_int_equal(wk_kv_n_past(kv), P + M);
        if (wk_kv_ckpt_load(kv, P, ck, &err))
            fail_msg("back to the checkpoint: %s", err.msg);
        assert_int_equal(wk_kv_n_past(kv), P);
        eval_ok(m, kv, b + P, M, P, M, lg);
        same_bits(ref_b + P * N_VOCAB, lg, M, "B after going back", a);
        /* the state matters: back to 20 with a zero state (the K/V rows kept) gives
         * other bits, so a state that was not put back could not pass the above */
        void *zero = calloc(1, cb);
        assert_non_null(zero);
        float *lz = logits_of(M);
        if (wk_kv_ckpt_load(kv, P, zero, &err))
            fail_msg("a zero state: %s", err.msg);
        eval_ok(m, kv, b + P, M, P, M, lz);
        assert_true(memcmp(lz, lg, sizeof(float) * M * N_VOCAB) != 0);
        free(zero);
        free(lz);
        /* the checkpoint is still whole: back again, A one token at a time */
        if (wk_kv_ckpt_load(kv, P, ck, &err))
            fail_msg("back again: %s", err.msg);
        for (int64_t i = 0; i < M; i++)
            eval_ok(m, kv, t + P + i, 1, P + i, 1, lg + i * N_VOCAB);
        same_bits(ref_a + P * N_VOCAB, lg, M, "A replayed", a);
        free(ck);
        free(ref_a);
        free(ref_b);
        free(lg);
        wk_kv_free(kv);
        wk_model_free(m);
    }
}

/* Three sequences in one step: two mid-sequence (a chunk of 3 at 12, a decode row at
 * 5) and one restarting at 0 on a used cache; then a decode row each. Each gets the
 * bits it gets alone through wk_model_eval. */
static void test_hybrid_multi_sequence_step(void **state)
{
    (void)state;
    enum { SEQ_LEN = 24 };
    for (int a = 0; a < 2; a++) {
        wk_model_t *m = load(a, 16, 0, 0);
        rng_t r = rng_for(60 + (uint64_t)a);
        int32_t s[3][SEQ_LEN], junk[4];
        for (int i = 0; i < 3; i++)
            rand_tokens(&r, s[i], SEQ_LEN);
        rand_tokens(&r, junk, 4);
        wk_kv_t *kv[3];
        for (int i = 0; i < 3; i++)
            kv[i] = new_kv(m, WK_KV_F16);
        const int64_t pre[3] = {12, 5, 0}, len[3] = {3, 1, 6}, nout[3] = {2, 1, 6};
        eval_ok(m, kv[0], s[0], pre[0], 0, 0, NULL);
        eval_ok(m, kv[1], s[1], pre[1], 0, 0, NULL);
        eval_ok(m, kv[2], junk, 4, 0, 0, NULL);
        wk_seq_t q[3];
        for (int i = 0; i < 3; i++)
            q[i] = (wk_seq_t){.kv = kv[i], .tokens = s[i] + pre[i], .n = len[i], .pos = pre[i], .n_out = nout[i]};
        float *multi = logits_of(9);
        bl_err_t err = {0};
        if (wk_model_eval_multi(m, q, 3, multi, &err))
            fail_msg("multi: %s", err.msg);
        int64_t at = 0;
        for (int i = 0; i < 3; i++) {
            const int64_t end = pre[i] + len[i];
            assert_int_equal(wk_kv_n_past(kv[i]), end);
            float *alone = fresh(m, s[i], end, WK_KV_F16);
            same_bits(alone + (end - nout[i]) * N_VOCAB, multi + at * N_VOCAB, nout[i], "a prompt step's sequence",
                      a);
            free(alone);
            at += nout[i];
        }
        for (int i = 0; i < 3; i++)
            q[i] = (wk_seq_t){.kv = kv[i], .tokens = s[i] + pre[i] + len[i], .n = 1, .pos = pre[i] + len[i],
                              .n_out = 1};
        if (wk_model_eval_multi(m, q, 3, multi, &err))
            fail_msg("decode: %s", err.msg);
        for (int i = 0; i < 3; i++) {
            const int64_t end = pre[i] + len[i] + 1;
            float *alone = fresh(m, s[i], end, WK_KV_F16);
            same_bits(alone + (end - 1) * N_VOCAB, multi + i * N_VOCAB, 1, "a decode step's sequence", a);
            free(alone);
        }
        free(multi);
        for (int i = 0; i < 3; i++)
            wk_kv_free(kv[i]);
        wk_model_free(m);
    }
}

/* Caches in a shared pool behave as caches of their own: interleaved growth, a
 * checkpoint and going back to it, a whole state saved from one pool cache and
 * loaded into another, and a cleared cache starting afresh; every chunk goes back
 * to the pool. */
static void test_hybrid_shared_pool(void **state)
{
    (void)state;
    enum { N = 40, U = 30 };
    for (int a = 0; a < 2; a++) {
        wk_model_t *m = load(a, 16, 0, 0);
        rng_t r = rng_for(70 + (uint64_t)a);
        int32_t t[N], u[U], b[N];
        rand_tokens(&r, t, N);
        rand_tokens(&r, u, U);
        memcpy(b, t, sizeof(int32_t) * 15);
        rand_tokens(&r, b + 15, N - 15);
        float *ref_t = fresh(m, t, N, WK_KV_F16), *ref_u = fresh(m, u, U, WK_KV_F16),
              *ref_b = fresh(m, b, N, WK_KV_F16);
        float *lg = logits_of(N);
        bl_err_t err = {0};
        wk_kv_pool_t *pool = NULL;
        if (wk_kv_pool_create(&pool, m, 2 * WK_KV_CHUNK, WK_KV_F16, &err))
            fail_msg("pool: %s", err.msg);
        wk_kv_t *p0 = NULL, *p1 = NULL;
        assert_int_equal(wk_kv_create_in(&p0, pool, WK_KV_CHUNK, &err), 0);
        assert_int_equal(wk_kv_create_in(&p1, pool, WK_KV_CHUNK, &err), 0);
        assert_int_equal(wk_kv_ckpt_bytes(p0), (size_t)N_REC_LAYERS * REC_FLOATS * sizeof(float));
        /* interleaved: t in 13 + 2 + 25, u in 10 + 20 */
        eval_ok(m, p0, t, 13, 0, 13, lg);
        eval_ok(m, p1, u, 10, 0, 10, lg + 13 * N_VOCAB);
        same_bits(ref_t, lg, 13, "pool, first piece", a);
        same_bits(ref_u, lg + 13 * N_VOCAB, 10, "pool, the other's first piece", a);
        eval_ok(m, p0, t + 13, 2, 13, 2, lg);
        same_bits(ref_t + 13 * N_VOCAB, lg, 2, "pool, second piece", a);
        void *ck = malloc(wk_kv_ckpt_bytes(p0));
        assert_non_null(ck);
        if (wk_kv_ckpt_save(p0, ck, &err))
            fail_msg("checkpoint: %s", err.msg);
        eval_ok(m, p1, u + 10, U - 10, 10, U - 10, lg);
        same_bits(ref_u + 10 * N_VOCAB, lg, U - 10, "pool, the other's rest", a);
        eval_ok(m, p0, t + 15, N - 15, 15, N - 15, lg);
        same_bits(ref_t + 15 * N_VOCAB, lg, N - 15, "pool, the rest", a);
        /* back to 15, then b's continuation */
        if (wk_kv_ckpt_load(p0, 15, ck, &err))
            fail_msg("back to the checkpoint: %s", err.msg);
        eval_ok(m, p0, b + 15, N - 15, 15, N - 15, lg);
        same_bits(ref_b + 15 * N_VOCAB, lg, N - 15, "pool, after going back", a);
        /* p0's whole state into p1 (which held u), then one more token on both */
        void *buf = NULL;
        assert_int_equal(wk_kv_state_alloc(m, wk_kv_state_bytes(p0, N), &buf, &err), 0);
        if (wk_kv_save(p0, N, buf, &err) || wk_kv_load(p1, N, buf, N, &err))
            fail_msg("save and load: %s", err.msg);
        float *l0 = logits_of(1), *l1 = logits_of(1);
        eval_ok(m, p0, t, 1, N, 1, l0);
        eval_ok(m, p1, t, 1, N, 1, l1);
        same_bits(l0, l1, 1, "pool, loaded from another pool cache", a);
        wk_kv_clear(p1);
        assert_int_equal(wk_kv_n_past(p1), 0);
        eval_ok(m, p1, u, U, 0, U, lg);
        same_bits(ref_u, lg, U, "pool, cleared and started afresh", a);
        eval_ok(m, p0, u, U, 0, U, lg);
        same_bits(ref_u, lg, U, "pool, started afresh at 0 without clearing", a);
        wk_kv_state_free(m, buf);
        free(ck);
        free(l0);
        free(l1);
        wk_kv_free(p0);
        wk_kv_free(p1);
        int64_t used = -1, total = -1;
        wk_kv_pool_usage(pool, &used, &total);
        assert_int_equal(used, 0);
        assert_int_equal(total, 2);
        wk_kv_pool_free(pool);
        free(ref_t);
        free(ref_u);
        free(ref_b);
        free(lg);
        wk_model_free(m);
    }
}

/* A restart at 0 that the pool has no room for is refused (BL_ERANGE) and, as wk.h
 * promises of every refused step, leaves the cache as it was: the sequence goes on
 * where it stood, with the bits of a cache of its own. A recurrent state cannot be
 * rebuilt from a prefix, so a cache emptied by a refusal loses its sequence. */
static void test_hybrid_pool_refused_restart_keeps_cache(void **state)
{
    (void)state;
    enum { H = 10, BIG = WK_KV_CHUNK + 1 };
    for (int a = 0; a < 2; a++) {
        wk_model_t *m = load(a, 2 * WK_KV_CHUNK, 0, 0);
        rng_t r = rng_for(100 + (uint64_t)a);
        int32_t t[H + 1], *big = calloc(BIG, sizeof(int32_t));
        assert_non_null(big);
        rand_tokens(&r, t, H + 1);
        float *ref = fresh(m, t, H + 1, WK_KV_F16), *lg = logits_of(2);
        bl_err_t err = {0};
        wk_kv_pool_t *pool = NULL;
        if (wk_kv_pool_create(&pool, m, 2 * WK_KV_CHUNK, WK_KV_F16, &err))
            fail_msg("pool: %s", err.msg);
        wk_kv_t *p0 = NULL, *p1 = NULL;
        assert_int_equal(wk_kv_create_in(&p0, pool, 2 * WK_KV_CHUNK, &err), 0);
        assert_int_equal(wk_kv_create_in(&p1, pool, 2 * WK_KV_CHUNK, &err), 0);
        eval_ok(m, p0, t, H, 0, 0, NULL); /* one chunk each: the pool is full */
        eval_ok(m, p1, t, H, 0, 0, NULL);
        /* BIG positions need both chunks; what went wrong is said after the cleanup,
         * so that a failure here leaks nothing under the sanitizers */
        char bad[1024] = "";
        int rc = wk_model_eval(m, p0, big, BIG, 0, 0, NULL, &err);
        if (rc != BL_ERANGE) {
            snprintf(bad, sizeof bad, "a restart the pool has no room for: rc %d (%s)", rc, err.msg);
        } else if (wk_kv_n_past(p0) != H) {
            snprintf(bad, sizeof bad, "a refused restart (%s) left the cache at %lld positions, not %d", err.msg,
                     (long long)wk_kv_n_past(p0), H);
        } else {
            eval_ok(m, p0, t + H, 1, H, 1, lg);
            same_bits(ref + H * N_VOCAB, lg, 1, "pool, after a refused restart", a);
            /* the same in a step of two: neither cache changes */
            const wk_seq_t q[2] = {{.kv = p1, .tokens = t, .n = 1, .pos = 0, .n_out = 1},
                                   {.kv = p0, .tokens = big, .n = BIG, .pos = 0, .n_out = 1}};
            rc = wk_model_eval_multi(m, q, 2, lg, &err);
            if (rc != BL_ERANGE || wk_kv_n_past(p0) != H + 1 || wk_kv_n_past(p1) != H)
                snprintf(bad, sizeof bad, "a refused step (rc %d: %s) left the caches at %lld and %lld positions, "
                         "not %d and %d", rc, err.msg, (long long)wk_kv_n_past(p0), (long long)wk_kv_n_past(p1),
                         H + 1, H);
        }
        wk_kv_free(p0);
        wk_kv_free(p1);
        wk_kv_pool_free(pool);
        free(big);
        free(ref);
        free(lg);
        wk_model_free(m);
        if (*bad)
            fail_msg("%s: %s", k_arch[a], bad);
    }
}

/* Two stages, layers [0, 2) (DeltaNet only: no K/V rows) and [2, 5), driven with
 * wk_model_stage over a 2-sequence prompt step and three decode steps, give the
 * whole model's bits; so does a decode step from both stages' states saved and
 * loaded into new caches, and one after both stages went back to a checkpoint. */
static void test_hybrid_stages_equal_whole(void **state)
{
    (void)state;
    enum { SPLIT = 2, STEPS = 4 };
    for (int a = 0; a < 2; a++) {
        wk_model_t *whole = load(a, 16, 0, 0);
        wk_model_t *st[2] = {load(a, 16, 0, SPLIT), load(a, 16, SPLIT, N_LAYER)};
        rng_t r = rng_for(80 + (uint64_t)a);
        /* the prompts, the decode steps, and the two steps after them */
        int32_t p0[7 + STEPS + 1], p1[4 + STEPS + 1];
        rand_tokens(&r, p0, 7 + STEPS + 1);
        rand_tokens(&r, p1, 4 + STEPS + 1);
        wk_kv_t *kw[2] = {new_kv(whole, WK_KV_F16), new_kv(whole, WK_KV_F16)};
        wk_kv_t *ks[2][2]; /* [stage][sequence] */
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                ks[i][j] = new_kv(st[i], WK_KV_F16);
        /* stage 0 has no attention layer: its saved state is the recurrent one */
        assert_int_equal(wk_kv_state_bytes(ks[0][0], 5), wk_kv_ckpt_bytes(ks[0][0]));
        assert_int_equal(wk_kv_ckpt_bytes(ks[0][0]), 2 * REC_FLOATS * sizeof(float));
        assert_int_equal(wk_kv_ckpt_bytes(ks[1][0]), 2 * REC_FLOATS * sizeof(float));
        float *want = logits_of(2), *got = logits_of(2);
        float *x = malloc(sizeof(float) * 16 * N_EMBD);
        assert_non_null(x);
        bl_err_t err = {0};
        /* one step of both sequences through the whole model and through the stages */
#define STEP(kw0, kw1, k0, k1, n0, n1, pos0, pos1, what)                                                            \
    do {                                                                                                           \
        wk_seq_t q[2] = {{.kv = (kw0), .tokens = p0 + (pos0), .n = (n0), .pos = (pos0), .n_out = 1},               \
                         {.kv = (kw1), .tokens = p1 + (pos1), .n = (n1), .pos = (pos1), .n_out = 1}};              \
        if (wk_model_eval_multi(whole, q, 2, want, &err))                                                          \
            fail_msg("whole: %s", err.msg);                                                                        \
        for (int s_ = 0; s_ < 2; s_++) {                                                                           \
            q[0].kv = (k0)[s_];                                                                                    \
            q[1].kv = (k1)[s_];                                                                                    \
            if (s_ == 1)                                                                                           \
                q[0].tokens = q[1].tokens = NULL;                                                                  \
            if (wk_model_stage(st[s_], q, 2, s_ ? x : NULL, s_ ? NULL : x, s_ ? got : NULL, &err))                 \
                fail_msg("stage %d: %s", s_, err.msg);                                                             \
        }                                                                                                          \
        same_bits(want, got, 2, what, a);                                                                          \
    } while (0)
        wk_kv_t *k0[2] = {ks[0][0], ks[1][0]}, *k1[2] = {ks[0][1], ks[1][1]};
        STEP(kw[0], kw[1], k0, k1, 7, 4, 0, 0, "stages, prompt step");
        for (int s = 1; s < STEPS; s++)
            STEP(kw[0], kw[1], k0, k1, 1, 1, 6 + s, 3 + s, "stages, decode step");
        const int64_t n0 = 7 + STEPS - 1, n1 = 4 + STEPS - 1;
        assert_int_equal(wk_kv_n_past(ks[1][0]), n0);

        /* a checkpoint of every cache, one more step, back, the step again */
        void *ckw[2], *cks[2][2];
        for (int j = 0; j < 2; j++) {
            ckw[j] = malloc(wk_kv_ckpt_bytes(kw[j]));
            assert_non_null(ckw[j]);
            assert_int_equal(wk_kv_ckpt_save(kw[j], ckw[j], &err), 0);
            for (int i = 0; i < 2; i++) {
                cks[i][j] = malloc(wk_kv_ckpt_bytes(ks[i][j]));
                assert_non_null(cks[i][j]);
                assert_int_equal(wk_kv_ckpt_save(ks[i][j], cks[i][j], &err), 0);
            }
        }
        STEP(kw[0], kw[1], k0, k1, 1, 1, n0, n1, "stages, a step past the checkpoint");
        assert_int_equal(wk_kv_ckpt_load(kw[0], n0, ckw[0], &err), 0);
        assert_int_equal(wk_kv_ckpt_load(kw[1], n1, ckw[1], &err), 0);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(wk_kv_ckpt_load(ks[i][0], n0, cks[i][0], &err), 0);
            assert_int_equal(wk_kv_ckpt_load(ks[i][1], n1, cks[i][1], &err), 0);
        }
        STEP(kw[0], kw[1], k0, k1, 1, 1, n0, n1, "stages, the step again after going back");

        /* both stages' caches of both sequences saved whole and loaded into new ones */
        wk_kv_t *fs0[2], *fs1[2];
        for (int i = 0; i < 2; i++) {
            wk_kv_t *src[2] = {ks[i][0], ks[i][1]};
            wk_kv_t **dst = i ? fs1 : fs0;
            for (int j = 0; j < 2; j++) {
                const int64_t n = wk_kv_n_past(src[j]);
                void *buf = NULL;
                assert_int_equal(wk_kv_state_alloc(st[i], wk_kv_state_bytes(src[j], n), &buf, &err), 0);
                dst[j] = new_kv(st[i], WK_KV_F16);
                if (wk_kv_save(src[j], n, buf, &err) || wk_kv_load(dst[j], n, buf, n, &err))
                    fail_msg("stage %d, sequence %d: %s", i, j, err.msg);
                wk_kv_state_free(st[i], buf);
            }
        }
        wk_kv_t *f0[2] = {fs0[0], fs1[0]}, *f1[2] = {fs0[1], fs1[1]};
        STEP(kw[0], kw[1], f0, f1, 1, 1, n0 + 1, n1 + 1, "stages, from loaded states");
#undef STEP
        for (int j = 0; j < 2; j++) {
            free(ckw[j]);
            wk_kv_free(kw[j]);
            wk_kv_free(fs0[j]);
            wk_kv_free(fs1[j]);
            for (int i = 0; i < 2; i++) {
                free(cks[i][j]);
                wk_kv_free(ks[i][j]);
            }
        }
        free(x);
        free(want);
        free(got);
        wk_model_free(st[0]);
        wk_model_free(st[1]);
        wk_model_free(whole);
    }
}

/* Files these families cannot run are refused by name: qwen35moe without its RoPE
 * sections or with sections that leave a rotated pair to the image section, and the
 * older DeltaNet form with one ssm_in. */
static void test_hybrid_load_refusals(void **state)
{
    (void)state;
    static const struct {
        int arch, variant, rc;
        const char *says;
    } cases[] = {
        {Q35, MK_NO_SECTIONS, BL_ENOENT, "rope.dimension_sections"},
        {Q35, MK_BAD_SECTIONS, BL_ENOTSUP, "rope.dimension_sections"},
        {Q3N, MK_SSM_IN, BL_ENOTSUP, "ssm_in"},
        {Q35, MK_SSM_IN, BL_ENOTSUP, "ssm_in"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512];
        tmp_path(path, sizeof path, "bad");
        write_hybrid(path, cases[i].arch, cases[i].variant, 2000 + i);
        wk_model_t *m = NULL;
        bl_err_t err = {0};
        const int rc = wk_model_load(&m, path, NULL, &err);
        unlink(path);
        if (rc != cases[i].rc || !strstr(err.msg, cases[i].says))
            fail_msg("case %zu: rc %d (want %d): %s", i, rc, cases[i].rc, err.msg);
        assert_null(m);
    }
}

int main(void)
{
    test_seed_init("test_worker_hybrid");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hybrid_loads_with_config),
        cmocka_unit_test(test_hybrid_batch_chunks_decode_equal),
        cmocka_unit_test(test_hybrid_threads_bitwise_equal),
        cmocka_unit_test(test_hybrid_mid_position_refused),
        cmocka_unit_test(test_hybrid_pos0_restarts),
        cmocka_unit_test(test_hybrid_save_load_whole_state),
        cmocka_unit_test(test_hybrid_checkpoint_rollback),
        cmocka_unit_test(test_hybrid_multi_sequence_step),
        cmocka_unit_test(test_hybrid_shared_pool),
        cmocka_unit_test(test_hybrid_pool_refused_restart_keeps_cache),
        cmocka_unit_test(test_hybrid_stages_equal_whole),
        cmocka_unit_test(test_hybrid_load_refusals),
    };
    return cmocka_run_group_tests(tests, files_setup, files_teardown);
}
