/* Tests of common/plan.c: small qwen3moe and qwen3 files written with the GGUF writer
 * (zero data: the plan reads only metadata and tensor sizes) are placed on made-up
 * device inventories, one test per flag behaviour and per refusal, with every byte
 * count computed from the shapes; a hostfile's stages on CPUs and on cards of
 * several hosts; and a file of about 200 GB (its header, then a hole) on two H200s
 * and on a DGX Spark pair (a GB10 on each of two hosts), larger than one card. plan.c
 * is included (not linked) so that its allocations can be made to fail. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "arch.h"
#include "gguf.h"
#include "gguf_writer.h"

/* --- allocation failure injection ------------------------------------------------ */

/* Allocations plan.c may still make before they fail; negative is unlimited. */
static long alloc_budget = -1;

static int take_budget(void)
{
    if (alloc_budget == 0)
        return 0;
    if (alloc_budget > 0)
        alloc_budget--;
    return 1;
}
static void *failing_malloc(size_t n) { return take_budget() ? malloc(n) : NULL; }
static void *failing_calloc(size_t n, size_t m) { return take_budget() ? calloc(n, m) : NULL; }

#define malloc(n) failing_malloc(n)
#define calloc(n, m) failing_calloc(n, m)
#include "../../common/plan.c"
#undef malloc
#undef calloc

/* --- the models ------------------------------------------------------------------ */

#define N_LAYER 8
#define N_EMBD 64
#define N_HEAD 4
#define N_HEAD_KV 2
#define HEAD_DIM (N_EMBD / N_HEAD) /* no key_length key: the default */
#define NQ (N_HEAD * HEAD_DIM)
#define NKV (N_HEAD_KV * HEAD_DIM)
#define N_EXPERT 16
#define N_EXPERT_USED 4
#define N_FF_EXP 32
#define N_FF 128
#define N_VOCAB 100
#define N_CTX 1024 /* n_ctx_total of every plan here */

/* Bytes, every tensor f32. One layer's attention: attn_norm (n_embd), q (n_embd, nq),
 * k and v (n_embd, nkv), output (nq, n_embd), q_norm and k_norm (head_dim). */
#define ATTN_BYTES (4ull * (N_EMBD + N_EMBD * NQ + 2 * N_EMBD * NKV + NQ * N_EMBD + 2 * HEAD_DIM))
/* A MoE layer's dense part: attention, ffn_norm (n_embd), ffn_gate_inp (n_embd, n_expert). */
#define D_BYTES (ATTN_BYTES + 4ull * N_EMBD + 4ull * N_EMBD * N_EXPERT)
/* A MoE layer's routed experts: gate and up (n_embd, n_ff_exp, n_expert), down
 * (n_ff_exp, n_embd, n_expert). */
#define X_BYTES (3ull * 4 * N_EMBD * N_FF_EXP * N_EXPERT)
/* A dense layer: attention, ffn_norm, gate and up (n_embd, n_ff), down (n_ff, n_embd). */
#define DD_BYTES (ATTN_BYTES + 4ull * N_EMBD + 3ull * 4 * N_EMBD * N_FF)
#define EMBD_BYTES (4ull * N_EMBD * N_VOCAB)
#define OUT_NORM_BYTES (4ull * N_EMBD)
#define HEAD_BYTES (4ull * N_EMBD * N_VOCAB)
/* One layer's K and V in f16 over N_CTX positions. */
#define KV_LAYER_BYTES (2ull * NKV * 2 * N_CTX)
/* Everything of the MoE file. */
#define W_ALL (N_LAYER * (D_BYTES + X_BYTES) + EMBD_BYTES + OUT_NORM_BYTES + HEAD_BYTES)
#define KV_ALL (N_LAYER * KV_LAYER_BYTES)
#define MARGIN_DEFAULT (1024ull << 20)
#define GIB_BYTES (1ull << 30)

_Static_assert(D_BYTES == 53888, "a MoE layer's dense bytes");
_Static_assert(X_BYTES == 393216, "a MoE layer's expert bytes");

enum { MOE = 0, TIED, DENSE, N_MODELS };

static struct {
    char path[N_MODELS][256];
    bl_gguf_t *g[N_MODELS];
    bl_arch_t a[N_MODELS];
} M;

/* The file of about 200 GB (write_big_model), written at its first use. */
static struct {
    char path[256];
    bl_gguf_t *g;
    bl_arch_t a;
} BIG;

static int add_t(bl_gguf_writer_t *w, const char *name, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                 bl_err_t *err)
{
    const int64_t ne[3] = {ne0, ne1, ne2};
    return bl_gw_add_tensor(w, name, BL_TYPE_F32, n_dims, ne, err);
}

/* Writes the model of kind to path, tensors in llama.cpp's shapes, data all zero. */
static int write_model(const char *path, int kind, bl_err_t *err)
{
    const int moe = kind != DENSE;
    const char *arch = moe ? "qwen3moe" : "qwen3";
    static const uint8_t zeros[1 << 16];
    bl_gguf_writer_t *w = NULL;
    char key[96], name[64];
    int rc = bl_gw_create(&w, err);
    if (rc < 0)
        return rc;
#define SET_U32(k, v) (snprintf(key, sizeof key, "%s.%s", arch, k), bl_gw_set_u32(w, key, v, err))
    if ((rc = bl_gw_set_str(w, "general.architecture", arch, err)) < 0 ||
        (rc = SET_U32("block_count", N_LAYER)) < 0 || (rc = SET_U32("embedding_length", N_EMBD)) < 0 ||
        (rc = SET_U32("attention.head_count", N_HEAD)) < 0 ||
        (rc = SET_U32("attention.head_count_kv", N_HEAD_KV)) < 0 || (rc = SET_U32("context_length", 4096)) < 0)
        goto out;
    if (moe && ((rc = SET_U32("expert_count", N_EXPERT)) < 0 ||
                (rc = SET_U32("expert_used_count", N_EXPERT_USED)) < 0 ||
                (rc = SET_U32("expert_feed_forward_length", N_FF_EXP)) < 0))
        goto out;
    if (!moe && (rc = SET_U32("feed_forward_length", N_FF)) < 0)
        goto out;
#undef SET_U32
    if ((rc = add_t(w, "token_embd.weight", 2, N_EMBD, N_VOCAB, 1, err)) < 0 ||
        (rc = add_t(w, "output_norm.weight", 1, N_EMBD, 1, 1, err)) < 0)
        goto out;
    if (kind != TIED && (rc = add_t(w, "output.weight", 2, N_EMBD, N_VOCAB, 1, err)) < 0)
        goto out;
    for (int l = 0; l < N_LAYER; l++) {
        static const struct {
            const char *t;
            int n_dims;
            int64_t ne0, ne1, ne2;
            int moe; /* 1: MoE only, 0: dense only, -1: both */
        } spec[] = {
            {"attn_norm", 1, N_EMBD, 1, 1, -1},       {"attn_q", 2, N_EMBD, NQ, 1, -1},
            {"attn_k", 2, N_EMBD, NKV, 1, -1},        {"attn_v", 2, N_EMBD, NKV, 1, -1},
            {"attn_output", 2, NQ, N_EMBD, 1, -1},    {"attn_q_norm", 1, HEAD_DIM, 1, 1, -1},
            {"attn_k_norm", 1, HEAD_DIM, 1, 1, -1},   {"ffn_norm", 1, N_EMBD, 1, 1, -1},
            {"ffn_gate_inp", 2, N_EMBD, N_EXPERT, 1, 1},
            {"ffn_gate_exps", 3, N_EMBD, N_FF_EXP, N_EXPERT, 1},
            {"ffn_up_exps", 3, N_EMBD, N_FF_EXP, N_EXPERT, 1},
            {"ffn_down_exps", 3, N_FF_EXP, N_EMBD, N_EXPERT, 1},
            {"ffn_gate", 2, N_EMBD, N_FF, 1, 0},      {"ffn_up", 2, N_EMBD, N_FF, 1, 0},
            {"ffn_down", 2, N_FF, N_EMBD, 1, 0},
        };
        for (size_t i = 0; i < sizeof spec / sizeof *spec; i++) {
            if (spec[i].moe >= 0 && spec[i].moe != moe)
                continue;
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, spec[i].t);
            if ((rc = add_t(w, name, spec[i].n_dims, spec[i].ne0, spec[i].ne1, spec[i].ne2, err)) < 0)
                goto out;
        }
    }
    uint64_t left = 0;
    for (size_t i = 0; i < bl_gw_tensor_count(w); i++)
        left += bl_gw_tensor_nbytes(w, i);
    if ((rc = bl_gw_begin(w, path, err)) < 0)
        goto out;
    while (left > 0) {
        const size_t n = left < sizeof zeros ? (size_t)left : sizeof zeros;
        if ((rc = bl_gw_write_data(w, zeros, n, err)) < 0)
            goto out;
        left -= n;
    }
    rc = bl_gw_finish(w, err);
out:
    bl_gw_destroy(w);
    return rc;
}

static int models_setup(void **state)
{
    (void)state;
    static const char *const tag[N_MODELS] = {"moe", "tied", "dense"};
    const char *dir = getenv("TMPDIR");
    for (int k = 0; k < N_MODELS; k++) {
        bl_err_t err = {0};
        snprintf(M.path[k], sizeof M.path[k], "%s/bl_test_plan_%s_%d.gguf", dir && *dir ? dir : "/tmp", tag[k],
                 (int)getpid());
        if (write_model(M.path[k], k, &err) < 0 || bl_gguf_open(&M.g[k], M.path[k], &err) < 0 ||
            bl_arch_read(&M.a[k], M.g[k], M.path[k], &err) < 0) {
            print_error("%s: %s\n", M.path[k], err.msg);
            return -1;
        }
    }
    return 0;
}

static int models_teardown(void **state)
{
    (void)state;
    for (int k = 0; k < N_MODELS; k++) {
        bl_gguf_close(M.g[k]);
        M.g[k] = NULL;
        if (M.path[k][0])
            unlink(M.path[k]);
    }
    bl_gguf_close(BIG.g);
    BIG.g = NULL;
    if (BIG.path[0])
        unlink(BIG.path);
    return 0;
}

/* --- devices, options and checks -------------------------------------------------- */

/* The plan of the running test; freed again after each test, so that a failed
 * assertion leaves nothing behind (bl_plan_free may be called twice). */
static bl_plan_t g_plan;

static int free_plan(void **state)
{
    (void)state;
    bl_plan_free(&g_plan);
    return 0;
}

/* Cards with far more free memory than the model needs. */
static const bl_device_t big1[1] = {{.index = 0, .name = "NVIDIA Test", .total_bytes = 96 * GIB_BYTES,
                                     .free_bytes = 80 * GIB_BYTES}};
static const bl_device_t big2[2] = {
    {.index = 0, .name = "NVIDIA Test", .total_bytes = 96 * GIB_BYTES, .free_bytes = 80 * GIB_BYTES},
    {.index = 1, .name = "NVIDIA Test", .total_bytes = 96 * GIB_BYTES, .free_bytes = 80 * GIB_BYTES},
};

/* What the programs pass when no placement flag is given. */
static bl_place_opts_t opts(void)
{
    return (bl_place_opts_t){.main_gpu = 0, .fit_target_mib = -1, .n_ctx_total = N_CTX, .kv_elem_bytes = 2.0,
                             .n_batch = 512};
}

static bl_device_t card(int index, uint64_t free_bytes)
{
    bl_device_t d = {.index = index, .total_bytes = free_bytes + GIB_BYTES, .free_bytes = free_bytes};
    snprintf(d.name, sizeof d.name, "NVIDIA Test");
    return d;
}

static void build_ok(bl_plan_t *p, int model, const bl_device_t *devs, int n_devs, const bl_place_opts_t *o)
{
    bl_err_t err = {0};
    const int rc = bl_plan_build(p, M.g[model], &M.a[model], devs, n_devs, o, &err);
    if (rc != 0)
        fail_msg("bl_plan_build: %d: %s", rc, err.msg);
    assert_non_null(p->host);
}

/* Builds and expects code, needle in the message and nothing left to free. */
static void expect_refusal(int model, const bl_device_t *devs, int n_devs, const bl_place_opts_t *o, int code,
                           const char *needle)
{
    bl_plan_t p;
    bl_err_t err = {0};
    const int rc = bl_plan_build(&p, M.g[model], &M.a[model], devs, n_devs, o, &err);
    if (rc == 0)
        bl_plan_free(&p);
    if (rc != code)
        fail_msg("expected %d, got %d (%s)", code, rc, err.msg);
    if (!strstr(err.msg, needle))
        fail_msg("'%s' does not name '%s'", err.msg, needle);
    assert_int_equal(err.code, code);
    assert_null(p.host);
}

static void assert_stage(const bl_plan_t *p, int i, int device, int64_t lb, int64_t le)
{
    assert_true(i < p->n_stages);
    if (p->stage[i].device != device || p->stage[i].lb != lb || p->stage[i].le != le)
        fail_msg("stage %d: device %d layers [%lld, %lld), expected device %d [%lld, %lld)", i, p->stage[i].device,
                 (long long)p->stage[i].lb, (long long)p->stage[i].le, device, (long long)lb, (long long)le);
}

/* mask: one '0' or '1' per layer, '1' where the layer's experts are in host RAM; also
 * checks that a layer is all or nothing, the counts and the hosttier flag. */
static void assert_host(const bl_plan_t *p, const char *mask)
{
    assert_int_equal(strlen(mask), p->n_layer);
    int n = 0, n_there = 0;
    for (int64_t l = 0; l < p->n_layer; l++) {
        const int want = mask[l] == '1';
        if (bl_plan_layer_host(p, l) != want)
            fail_msg("layer %lld: host %d, expected %d (mask %s)", (long long)l, bl_plan_layer_host(p, l), want,
                     mask);
        for (int64_t e = 0; e < p->n_expert; e++)
            assert_int_equal(p->host[l * p->n_expert + e], want);
        /* this host's hosttier's, or another host's (its stage's) */
        const int there = bl_plan_layer_node_hosttier(p, l);
        n += want && !there;
        n_there += want && there;
    }
    assert_int_equal(p->n_host_layers, n);
    assert_true(p->host_bytes == (uint64_t)n * X_BYTES);
    assert_int_equal(p->hosttier, n > 0);
    assert_int_equal(p->n_node_host_layers, n_there);
    assert_true(p->node_host_bytes == (uint64_t)n_there * X_BYTES);
}

/* Sizes of a stage: weights and experts exact, KV from the layer count, scratch only
 * on a card. */
static void assert_sizes(const bl_plan_t *p, int i, uint64_t weight_bytes, uint64_t expert_bytes)
{
    const bl_plan_stage_t *st = &p->stage[i];
    if (st->weight_bytes != weight_bytes || st->expert_bytes != expert_bytes)
        fail_msg("stage %d: weights %llu experts %llu, expected %llu and %llu", i,
                 (unsigned long long)st->weight_bytes, (unsigned long long)st->expert_bytes,
                 (unsigned long long)weight_bytes, (unsigned long long)expert_bytes);
    assert_true(st->kv_bytes == (uint64_t)(st->le - st->lb) * KV_LAYER_BYTES);
    assert_true(st->state_bytes == 0); /* no DeltaNet layers here */
    uint64_t hosted = 0;
    for (int64_t l = st->lb; l < st->le; l++)
        hosted += bl_plan_layer_host(p, l) ? X_BYTES : 0;
    assert_true(st->host_expert_bytes == hosted);
    if (st->device < 0)
        assert_true(st->scratch_bytes == 0);
    else
        assert_true(st->scratch_bytes > 0);
}

static uint64_t need_of(const bl_plan_stage_t *st, uint64_t margin)
{
    return st->weight_bytes + st->kv_bytes + st->scratch_bytes + margin;
}

/* Every card's stage within what its card has free, less the margin. */
static void assert_fits(const bl_plan_t *p, const bl_device_t *devs, int n_devs, uint64_t margin)
{
    for (int i = 0; i < p->n_stages; i++) {
        const bl_plan_stage_t *st = &p->stage[i];
        if (st->device < 0)
            continue;
        const bl_device_t *d = NULL;
        for (int j = 0; j < n_devs; j++)
            if (devs[j].index == st->device)
                d = &devs[j];
        assert_non_null(d);
        if (need_of(st, margin) > d->free_bytes)
            fail_msg("stage %d on CUDA%d needs %llu bytes with the margin, the card has %llu free", i, st->device,
                     (unsigned long long)need_of(st, margin), (unsigned long long)d->free_bytes);
        assert_true(bl_plan_stage_need(st) + margin == need_of(st, margin));
        if (margin == (uint64_t)p->fit_target_mib << 20)
            assert_int_equal(bl_plan_stage_fit(p, i), BL_PLAN_FITS);
    }
}

/* The scratch estimate of one card stage holding every layer and all its experts
 * (the last stage: the head piece dominates; host experts add a buffer of one
 * layer's experts, X_BYTES). */
static uint64_t scratch_of_one_stage(void)
{
    const bl_device_t d = card(0, 0);
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    assert_int_equal(p->n_stages, 1);
    const uint64_t s = p->stage[0].scratch_bytes;
    bl_plan_free(p);
    return s;
}

/* --- stages without flags ------------------------------------------------------------ */

static void test_plan_no_devices_is_one_cpu_stage(void **state)
{
    (void)state;
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, NULL, 0, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, N_LAYER);
    assert_sizes(p, 0, W_ALL, N_LAYER * X_BYTES);
    assert_int_equal(p->n_layer, N_LAYER);
    assert_int_equal(p->n_expert, N_EXPERT);
    assert_host(p, "00000000");
    assert_int_equal(p->fit_moved, 0);
    assert_int_equal(p->fit_cpu_layers, 0);
    bl_plan_free(p);
}

static void test_plan_cpu_stages_split_layers_earlier_take_the_remainder(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.n_cpu_stages = 3;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, NULL, 0, &o);
    assert_int_equal(p->n_stages, 3);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 3);
    assert_stage(p, 1, BL_PLAN_DEVICE_CPU, 3, 6);
    assert_stage(p, 2, BL_PLAN_DEVICE_CPU, 6, 8);
    assert_sizes(p, 0, EMBD_BYTES + 3 * (D_BYTES + X_BYTES), 3 * X_BYTES);
    assert_sizes(p, 1, 3 * (D_BYTES + X_BYTES), 3 * X_BYTES);
    assert_sizes(p, 2, 2 * (D_BYTES + X_BYTES) + OUT_NORM_BYTES + HEAD_BYTES, 2 * X_BYTES);
    assert_host(p, "00000000");
    bl_plan_free(p);

    o.n_cpu_stages = N_LAYER; /* a stage per layer */
    build_ok(p, MOE, NULL, 0, &o);
    assert_int_equal(p->n_stages, N_LAYER);
    for (int i = 0; i < N_LAYER; i++)
        assert_stage(p, i, BL_PLAN_DEVICE_CPU, i, i + 1);
    bl_plan_free(p);

    o.n_cpu_stages = 20; /* more stages than CPU layers: refused, not changed */
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "--workers 20");
}

/* A hostfile's layers=: the CPU stages end where it says, uneven; ends that do not
 * cover the CPU layers in order are refused. */
static void test_plan_stage_ends_given(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    const int64_t ends[3] = {1, 6, N_LAYER};
    o.n_cpu_stages = 3;
    o.stage_ends = ends;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, NULL, 0, &o);
    assert_int_equal(p->n_stages, 3);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 1);
    assert_stage(p, 1, BL_PLAN_DEVICE_CPU, 1, 6);
    assert_stage(p, 2, BL_PLAN_DEVICE_CPU, 6, N_LAYER);
    assert_sizes(p, 1, 5 * (D_BYTES + X_BYTES), 5 * X_BYTES);
    bl_plan_free(p);

    const int64_t short_[3] = {1, 6, N_LAYER - 1}, back[3] = {4, 4, N_LAYER}, past[3] = {2, N_LAYER + 1, N_LAYER};
    o.stage_ends = short_;
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "must cover");
    o.stage_ends = back;
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "stage 1 of the CPU layers ends at layer 4, after 4");
    o.stage_ends = past;
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "must cover");
}

/* --- a hostfile's CPU stages split by their hosts (bl_plan_split_hosts) ---------------- */

static bl_stage_host_t host(const char *name, int threads, int n_cpus, uint64_t mem_avail)
{
    return (bl_stage_host_t){.name = name, .remote = 1, .threads = threads, .n_cpus = n_cpus, .mem_avail = mem_avail};
}

/* Splits n_layers layers of bytes_each (the first stage also holding first, the last
 * last) over the n hosts and checks what every split must hold: ends increasing to
 * n_layers, a layer at least per stage. */
static int split(int64_t n_layers, uint64_t bytes_each, uint64_t first, uint64_t last, const bl_stage_host_t *h,
                 int n, int64_t *ends, bl_err_t *err)
{
    uint64_t bytes[4096];
    assert_true(n_layers <= 4096);
    for (int64_t l = 0; l < n_layers; l++)
        bytes[l] = bytes_each;
    const int rc = bl_plan_split_hosts(bytes, n_layers, first, last, h, NULL, n, ends, err);
    for (int i = 0; rc == 0 && i < n; i++)
        assert_true(ends[i] >= (i ? ends[i - 1] : 0) + 1);
    if (rc == 0)
        assert_int_equal(ends[n - 1], n_layers);
    return rc;
}

/* The same, expecting the ends want. */
static void expect_ends(int64_t n_layers, uint64_t bytes_each, uint64_t first, uint64_t last, const bl_stage_host_t *h,
                        int n, const int64_t *want)
{
    int64_t ends[BL_PLAN_MAX_STAGES];
    bl_err_t err = {0};
    const int rc = split(n_layers, bytes_each, first, last, h, n, ends, &err);
    if (rc)
        fail_msg("split: %d: %s", rc, err.msg);
    for (int i = 0; i < n; i++)
        if (ends[i] != want[i])
            fail_msg("stage %d ends at %lld, expected %lld", i, (long long)ends[i], (long long)want[i]);
}

#define HOSTS(...) ((const bl_stage_host_t[]){__VA_ARGS__})
#define ENDS(...) ((const int64_t[]){__VA_ARGS__})

static void test_plan_split_cpu_follows_the_threads(void **state)
{
    (void)state;
    expect_ends(48, 100, 0, 0, HOSTS(host("a", 8, 0, 0), host("b", 8, 0, 0), host("c", 8, 0, 0)), 3, ENDS(16, 32, 48));
    expect_ends(48, 100, 0, 0, HOSTS(host("a", 1, 0, 0), host("b", 3, 0, 0)), 2, ENDS(12, 48));
    /* a share that does not divide: the largest remainder takes the layer left */
    expect_ends(4, 100, 0, 0, HOSTS(host("a", 1, 0, 0), host("b", 3, 0, 0)), 2, ENDS(1, 4));
    /* 1.33 and 2.67: the second's remainder is larger */
    expect_ends(4, 100, 0, 0, HOSTS(host("a", 1, 0, 0), host("b", 2, 0, 0)), 2, ENDS(1, 4));
}

static void test_plan_split_cpu_caps_threads_by_the_hosts_cpus(void **state)
{
    (void)state;
    /* 16 threads on 4 CPUs run as fast as 4 threads on 4 CPUs */
    expect_ends(48, 100, 0, 0, HOSTS(host("a", 16, 4, 0), host("b", 4, 8, 0)), 2, ENDS(24, 48));
}

static void test_plan_split_cpu_gives_every_stage_a_layer(void **state)
{
    (void)state;
    const bl_stage_host_t *h = HOSTS(host("a", 1000, 0, 0), host("b", 1, 0, 0), host("c", 1, 0, 0));
    expect_ends(10, 100, 0, 0, h, 3, ENDS(8, 9, 10));
    expect_ends(3, 100, 0, 0, h, 3, ENDS(1, 2, 3));
    int64_t ends[3];
    bl_err_t err = {0};
    assert_int_equal(split(2, 100, 0, 0, h, 3, ends, &err), BL_EINVAL); /* more stages than layers */
    assert_non_null(strstr(err.msg, "3 workers for 2 layers"));
    assert_int_equal(split(2, 100, 0, 0, h, 0, ends, &err), BL_EINVAL);
}

static void test_plan_split_cpu_keeps_each_host_within_its_memory(void **state)
{
    (void)state;
    /* b would take 15 of 20 layers by its threads; its memory holds 5 */
    expect_ends(20, 100, 0, 0, HOSTS(host("a", 1, 0, 0), host("b", 3, 0, 500)), 2, ENDS(15, 20));
    /* the last stage holds the head too: 4 layers and it */
    expect_ends(20, 100, 50, 70, HOSTS(host("a", 1, 0, 0), host("b", 3, 0, 500)), 2, ENDS(16, 20));
    /* the first stage holds the embedding: a's memory with it holds 3 layers */
    expect_ends(20, 100, 50, 70, HOSTS(host("a", 1, 0, 350), host("b", 3, 0, 0)), 2, ENDS(3, 20));
    /* two stages of one host (named as the hostfile compares names) share its memory;
     * the layers they give go to the third */
    expect_ends(30, 100, 0, 0, HOSTS(host("a", 1, 0, 1000), host("A", 1, 0, 1000), host("c", 1, 0, 0)), 3,
                ENDS(5, 10, 30));
}

static void test_plan_split_cpu_refuses_what_no_split_fits(void **state)
{
    (void)state;
    int64_t ends[2];
    bl_err_t err = {0};
    /* 20 layers of 100 bytes, 1500 bytes of memory in all */
    assert_int_equal(split(20, 100, 0, 0, HOSTS(host("gpu-a", 1, 0, 1000), host("10.0.0.2", 1, 0, 500)), 2, ends,
                           &err), BL_ENOMEM);
    assert_non_null(strstr(err.msg, "no split of the 20 CPU layers fits"));
    assert_true(strstr(err.msg, "gpu-a has") || strstr(err.msg, "10.0.0.2 has"));
    assert_non_null(strstr(err.msg, "MemAvailable"));
    assert_non_null(strstr(err.msg, "bytes of weights and KV cache"));
    /* a host whose memory does not hold even one layer */
    assert_int_equal(split(20, 100, 0, 0, HOSTS(host("a", 1, 0, 0), host("small-host", 1, 0, 99)), 2, ends, &err),
                     BL_ENOMEM);
    assert_non_null(strstr(err.msg, "small-host has 0.0 MiB available (MemAvailable, 99 bytes) and its 1 stage "
                                    "needs 0.0 MiB (100 bytes of weights and KV cache) with one layer each"));
}

/* The plan with a hostfile's hosts: its CPU stages split by threads, the sizes of
 * each as the split counted them; a host short of memory refused by name; -ngl with
 * no card among them changes nothing; a remote stage's routed experts never go to
 * this machine's hosttier for want of its RAM. */
static void test_plan_cpu_hosts_split_the_cpu_stages(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    bl_stage_host_t h[2] = {host("router", 1, 0, 0), host("10.0.0.2", 3, 0, 0)};
    h[0].remote = 0;
    o.n_cpu_stages = 2;
    o.hosts = h;
    o.n_hosts = 2;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, NULL, 0, &o);
    assert_int_equal(p->n_stages, 2);
    assert_sizes(p, 0, EMBD_BYTES + 2 * (D_BYTES + X_BYTES), 2 * X_BYTES);
    assert_sizes(p, 1, 6 * (D_BYTES + X_BYTES) + OUT_NORM_BYTES + HEAD_BYTES, 6 * X_BYTES);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 2);
    bl_plan_free(p);

    /* 10.0.0.2 holds three layers with the head: the rest go to the router's host */
    h[1].mem_avail = 3 * (D_BYTES + X_BYTES + KV_LAYER_BYTES) + OUT_NORM_BYTES + HEAD_BYTES;
    build_ok(p, MOE, NULL, 0, &o);
    assert_true(p->stage[1].weight_bytes + p->stage[1].kv_bytes <= h[1].mem_avail);
    assert_stage(p, 1, BL_PLAN_DEVICE_CPU, 5, N_LAYER);
    bl_plan_free(p);
    h[0].mem_avail = 2 * (D_BYTES + X_BYTES + KV_LAYER_BYTES);
    expect_refusal(MOE, NULL, 0, &o, BL_ENOMEM, "has");
    h[0].mem_avail = h[1].mem_avail = 0;

    /* layers= wins over the hosts */
    const int64_t ends[2] = {4, N_LAYER};
    o.stage_ends = ends;
    build_ok(p, MOE, NULL, 0, &o);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 4);
    bl_plan_free(p);

    /* --experts-ram auto with little RAM here: the router host's stage's experts go to
     * the hosttier, the other host's stay in its worker */
    o.experts_ram = BL_EXPERTS_RAM_AUTO;
    o.ram_avail = 1;
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "11110000");
    bl_plan_free(p);
    o.experts_ram = 0;
    o.ram_avail = 0;

    /* no stage has a card: -ngl has nothing to put there (the server warns), and the
     * devices of this machine are not the hostfile's */
    o.gpu_layers = "4";
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 4); /* layers= above */
    assert_stage(p, 1, BL_PLAN_DEVICE_CPU, 4, N_LAYER);
    bl_plan_free(p);
}

/* --- a hostfile's stages on cards ------------------------------------------------------ */

/* A stage on card d of host name (another host than the router's). */
static bl_stage_host_t card_host(const char *name, const bl_device_t *d)
{
    return (bl_stage_host_t){.name = name, .remote = 1, .threads = 4, .n_cpus = 8, .card = d};
}

static const bl_device_t k_gb10 = {.index = 0, .name = "NVIDIA GB10", .total_bytes = 128 * GIB_BYTES,
                                   .free_bytes = 130000000000ull};
static const bl_device_t k_gb10_1 = {.index = 1, .name = "NVIDIA GB10", .total_bytes = 128 * GIB_BYTES,
                                     .free_bytes = 130000000000ull};

static void test_plan_split_hosts_weighs_a_card_as_many_threads(void **state)
{
    (void)state;
    /* a CPU stage of 16 threads and a card: 16 and BL_PLAN_CARD_THREADS of the weight */
    _Static_assert(BL_PLAN_CARD_THREADS == 64, "the card's weight these ends follow");
    expect_ends(80, 100, 0, 0, HOSTS(host("a", 16, 0, 0), card_host("b", &k_gb10)), 2, ENDS(16, 80));
    /* a CPU stage's threads past its CPUs count as its CPUs; a card's threads and CPUs
     * change nothing */
    bl_stage_host_t c = card_host("b", &k_gb10);
    c.threads = 1;
    c.n_cpus = 1;
    expect_ends(80, 100, 0, 0, HOSTS(host("a", 64, 16, 0), c), 2, ENDS(16, 80));
    /* two cards alike: half each; in hostfile order, whatever the ordinals */
    expect_ends(48, 100, 0, 0, HOSTS(card_host("spark-a", &k_gb10_1), card_host("spark-b", &k_gb10)), 2, ENDS(24, 48));
}

/* h with measured read rates (MB/s). */
static bl_stage_host_t rated(bl_stage_host_t h, uint32_t one, uint32_t all)
{
    h.read_mbps_one = one;
    h.read_mbps_all = all;
    return h;
}

static void test_plan_split_follows_measured_read_rates(void **state)
{
    (void)state;
    /* rates count only when every host has both */
    const bl_stage_host_t both[2] = {rated(host("a", 8, 8, 0), 2000, 10000), rated(host("b", 8, 8, 0), 5000, 30000)};
    const bl_stage_host_t part[2] = {rated(host("a", 8, 8, 0), 2000, 10000), rated(host("b", 8, 8, 0), 5000, 0)};
    assert_true(bl_plan_hosts_measured(both, 2));
    assert_false(bl_plan_hosts_measured(part, 2));
    assert_true(bl_plan_hosts_measured(part, 1));
    /* the same threads on hosts that read at 10 and 30 GB/s: a quarter and three */
    expect_ends(48, 100, 0, 0, HOSTS(rated(host("a", 8, 8, 0), 2000, 10000), rated(host("b", 8, 8, 0), 5000, 30000)),
                2, ENDS(12, 48));
    /* a host's threads past what its memory feeds add nothing: 4 threads of 5 GB/s
     * read 20 GB/s, 16 threads of the same host's kind at most its 20 */
    expect_ends(48, 100, 0, 0, HOSTS(rated(host("a", 4, 16, 0), 5000, 20000), rated(host("b", 16, 16, 0), 5000, 20000)),
                2, ENDS(24, 48));
    /* two stages of one host share its rate; a host of its own reads at its own:
     * a and a' 4 threads each of 40 GB/s together (20 each), b 8 threads of 20 */
    expect_ends(48, 100, 0, 0,
                HOSTS(rated(host("a", 4, 8, 0), 10000, 40000), rated(host("a", 4, 8, 0), 10000, 40000),
                      rated(host("b", 8, 8, 0), 10000, 20000)),
                3, ENDS(16, 32, 48));
    /* a card weighs BL_PLAN_CARD_THREADS of its host's one-thread rate: 64 x 5 GB/s
     * against a CPU stage's 80 (16 threads of 5, within its 100) */
    _Static_assert(BL_PLAN_CARD_THREADS == 64, "the card's weight these ends follow");
    expect_ends(80, 100, 0, 0, HOSTS(rated(host("a", 16, 16, 0), 5000, 100000), rated(card_host("b", &k_gb10), 5000, 100000)),
                2, ENDS(16, 80));
    /* a card's measured rate, where its host lists it, is its weight: 240 GB/s against
     * a CPU stage's 80 */
    bl_device_t gb10_rated = k_gb10;
    gb10_rated.read_mbps = 240000;
    expect_ends(80, 100, 0, 0, HOSTS(rated(host("a", 16, 16, 0), 5000, 100000), rated(card_host("b", &gb10_rated), 5000, 100000)),
                2, ENDS(20, 80));
    /* one host without rates: every stage by its threads, as without any */
    expect_ends(48, 100, 0, 0, HOSTS(rated(host("a", 8, 8, 0), 2000, 10000), host("b", 8, 8, 0)), 2, ENDS(24, 48));
}

/* Splits 20 layers of 100 bytes (the first stage also holding 50, the last 70) over
 * h with the cards' rooms, into ends. */
static int split_room(const bl_stage_host_t *h, const uint64_t *room, int n, int64_t *ends, bl_err_t *err)
{
    uint64_t bytes[20];
    for (int l = 0; l < 20; l++)
        bytes[l] = 100;
    return bl_plan_split_hosts(bytes, 20, 50, 70, h, room, n, ends, err);
}

static void test_plan_split_hosts_keeps_each_card_within_its_room(void **state)
{
    (void)state;
    int64_t ends[3];
    bl_err_t err = {0};
    /* the card would take 16 of 20 layers by its weight; its room holds 9 with the head */
    const bl_stage_host_t *h = HOSTS(host("a", 16, 0, 0), card_host("b", &k_gb10));
    assert_int_equal(split_room(h, (const uint64_t[]){UINT64_MAX, 1000}, 2, ends, &err), 0);
    assert_true(ends[0] == 11 && ends[1] == 20);
    /* no room given, or not known: no cap */
    assert_int_equal(split_room(h, NULL, 2, ends, &err), 0);
    assert_true(ends[0] == 4);
    assert_int_equal(split_room(h, (const uint64_t[]){0, UINT64_MAX}, 2, ends, &err), 0);
    assert_true(ends[0] == 4);
    /* a host's card and its CPU stage draw on two memories: the host's RAM (500 with
     * the embedding: 4 layers) holds the CPU stage, the card's room the rest */
    const bl_stage_host_t *mixed = HOSTS(host("a", 16, 0, 500), card_host("a", &k_gb10));
    assert_int_equal(split_room(mixed, (const uint64_t[]){0, 1700}, 2, ends, &err), 0);
    assert_true(ends[0] == 4 && ends[1] == 20);
    /* two cards of one host: a room each */
    const bl_stage_host_t *two = HOSTS(card_host("a", &k_gb10), card_host("a", &k_gb10_1), host("c", 1, 0, 0));
    assert_int_equal(split_room(two, (const uint64_t[]){550, 500, 0}, 3, ends, &err), 0);
    if (ends[0] != 5 || ends[1] != 10 || ends[2] != 20)
        fail_msg("ends %lld %lld %lld", (long long)ends[0], (long long)ends[1], (long long)ends[2]);
}

static void test_plan_split_hosts_refuses_a_card_by_host_and_bytes(void **state)
{
    (void)state;
    int64_t ends[2];
    bl_err_t err = {0};
    /* two cards with room for 1500 bytes in all, 2120 to hold */
    const bl_stage_host_t *h = HOSTS(card_host("spark-a", &k_gb10), card_host("spark-b", &k_gb10));
    assert_int_equal(split_room(h, (const uint64_t[]){750, 750}, 2, ends, &err), BL_ENOMEM);
    assert_non_null(strstr(err.msg, "no split of the 20 layers fits the stages' memory: CUDA0 (NVIDIA GB10) of "
                                    "spark-"));
    assert_non_null(strstr(err.msg, "has room for 0.0 MiB of weights and KV cache (750 bytes: its 121.07 GiB "
                                    "free less the -fitt margin and the scratch) and its stage needs"));
    assert_non_null(strstr(err.msg, "no other stage has room"));
    /* a card whose room holds not one layer */
    assert_int_equal(split_room(HOSTS(host("a", 1, 0, 0), card_host("spark-b", &k_gb10)),
                                (const uint64_t[]){0, 99}, 2, ends, &err), BL_ENOMEM);
    assert_non_null(strstr(err.msg, "CUDA0 (NVIDIA GB10) of spark-b has room for 0.0 MiB of weights and KV cache "
                                    "(99 bytes"));
    assert_non_null(strstr(err.msg, "needs 0.0 MiB (170 bytes) with one layer"));
    /* beside cards, a host's RAM that is over is named as the host's, its CPU stages' */
    assert_int_equal(split_room(HOSTS(host("gpu-a", 1, 0, 120), card_host("b", &k_gb10)),
                                (const uint64_t[]){0, 100}, 2, ends, &err), BL_ENOMEM);
    assert_non_null(strstr(err.msg, "no split of the 20 layers fits the stages' memory"));
}

/* Every split of many made-up inventories of CPU and card stages: the layers covered
 * in order, one at least each, no memory over what it holds (a host's RAM for its CPU
 * stages together, a card its room), or a refusal for want of memory. */
static void test_plan_split_hosts_holds_its_rules_on_many_inventories(void **state)
{
    (void)state;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    static const char *const names[4] = {"a", "b", "c", "d"};
    static const bl_device_t cards[2] = {{.index = 0, .name = "X", .free_bytes = 1}, {.index = 1, .name = "Y",
                                                                                       .free_bytes = 1}};
    for (int round = 0; round < 500; round++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int n = 1 + (int)((x >> 33) % 6);
        const int64_t n_layers = n + (int64_t)((x >> 20) % 60);
        bl_stage_host_t h[6];
        uint64_t bytes[64 + 6], room[6];
        for (int64_t l = 0; l < n_layers; l++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            bytes[l] = 50 + (x >> 40) % 200;
        }
        for (int i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = host(names[(x >> 10) % 4], 1 + (int)((x >> 20) % 32), (int)((x >> 30) % 16),
                        (x >> 40) % 3 ? 0 : (uint64_t)(500 + (x >> 45) % 8000));
            /* a card of its host that no earlier stage there has */
            const bl_device_t *c = (x >> 50) % 2 ? &cards[(x >> 52) % 2] : NULL;
            for (int k = 0; c && k < i; k++)
                if (h[k].card == c && !strcmp(h[k].name, h[i].name))
                    c = NULL;
            h[i].card = c;
            room[i] = (x >> 55) % 3 ? (uint64_t)(300 + (x >> 20) % 6000) : UINT64_MAX;
        }
        int64_t ends[6];
        bl_err_t err = {0};
        const int rc = bl_plan_split_hosts(bytes, n_layers, 30, 70, h, room, n, ends, &err);
        if (rc != 0) {
            assert_int_equal(rc, BL_ENOMEM);
            continue;
        }
        int64_t at = 0;
        for (int i = 0; i < n; i++) {
            assert_true(ends[i] > at);
            at = ends[i];
        }
        assert_int_equal(at, n_layers);
        for (int k = 0; k < n; k++) {
            const uint64_t cap = h[k].card ? room[k] : h[k].mem_avail ? h[k].mem_avail : UINT64_MAX;
            uint64_t sum = 0;
            for (int i = 0; i < n; i++) {
                if (strcmp(h[i].name, h[k].name) != 0 || h[i].card != h[k].card)
                    continue;
                for (int64_t l = i ? ends[i - 1] : 0; l < ends[i]; l++)
                    sum += bytes[l];
                sum += (i == 0 ? 30 : 0) + (i == n - 1 ? 70 : 0);
            }
            if (sum > cap)
                fail_msg("round %d: stage %d's memory holds %llu bytes of %llu", round, k, (unsigned long long)sum,
                         (unsigned long long)cap);
        }
    }
}

/* A hostfile of a CPU line of 16 threads on the router's host and a line of another
 * host (10.0.0.2) on card d, into h, and the options that plan them. */
static bl_place_opts_t card_line_opts(bl_stage_host_t h[2], const bl_device_t *d)
{
    h[0] = host("router", 16, 0, 0);
    h[0].remote = 0;
    h[1] = card_host("10.0.0.2", d);
    bl_place_opts_t o = opts();
    o.hosts = h;
    o.n_hosts = 2;
    return o;
}

/* A hostfile of a CPU line on the router's host and a card line of another: the card
 * stage on its card with its facts, the split by weight; the card's size checked. */
static void test_plan_hosts_put_a_card_line_on_its_card(void **state)
{
    (void)state;
    const bl_device_t d = card(1, 80 * GIB_BYTES);
    bl_stage_host_t h[2];
    bl_place_opts_t o = card_line_opts(h, &d);
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, NULL, 0, &o);
    /* 8 layers by 16 and 64: 1.6 and 6.4, the larger remainder the CPU's */
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 2);
    assert_stage(p, 1, 1, 2, N_LAYER);
    assert_sizes(p, 1, 6 * (D_BYTES + X_BYTES) + OUT_NORM_BYTES + HEAD_BYTES, 6 * X_BYTES);
    assert_string_equal(p->stage[1].card.name, "NVIDIA Test");
    assert_true(p->stage[1].card.free_bytes == d.free_bytes);
    assert_true(p->stage[0].card.total_bytes == 0);
    assert_int_equal(bl_plan_stage_fit(p, 1), BL_PLAN_FITS);
    assert_host(p, "00000000");
    char text[2048];
    bl_plan_format(p, text, sizeof text);
    assert_non_null(strstr(text, "stage 1: layers 2..7 on CUDA1 (NVIDIA Test)"));
    bl_plan_free(p);

    /* a card whose free memory holds three of its layers with the scratch: the rest go
     * to the CPU stage */
    bl_device_t small = d;
    const bl_stage_host_t whole = card_host("10.0.0.2", &small);
    o.hosts = (const bl_stage_host_t[]){h[0], whole};
    small.free_bytes = 0;
    build_ok(p, MOE, NULL, 0, &o); /* not known: nothing held against it */
    const uint64_t scratch = p->stage[1].scratch_bytes;
    bl_plan_free(p);
    small.free_bytes = MARGIN_DEFAULT + scratch + 3 * (D_BYTES + X_BYTES + KV_LAYER_BYTES) + OUT_NORM_BYTES +
                       HEAD_BYTES;
    build_ok(p, MOE, NULL, 0, &o);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 5);
    assert_stage(p, 1, 1, 5, N_LAYER);
    assert_int_equal(bl_plan_stage_fit(p, 1), BL_PLAN_FITS);
    bl_plan_free(p);
    /* and without the CPU stage, the card alone cannot hold the model */
    o.hosts = &whole;
    o.n_hosts = 1;
    expect_refusal(MOE, NULL, 0, &o, BL_ENOMEM, "no split of the 8 layers fits the stages' memory: CUDA1 (NVIDIA "
                                                "Test) of 10.0.0.2 has room for");
}

/* layers= decides a hostfile's stages with cards too; a card its stage does not fit
 * is refused with its host and the bytes, not changed. */
static void test_plan_hosts_layers_given_on_cards(void **state)
{
    (void)state;
    bl_device_t d = card(1, 80 * GIB_BYTES);
    bl_stage_host_t h[2];
    bl_place_opts_t o = card_line_opts(h, &d);
    const int64_t ends[2] = {5, N_LAYER};
    o.stage_ends = ends;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, NULL, 0, &o);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 5);
    assert_stage(p, 1, 1, 5, N_LAYER);
    bl_plan_free(p);
    d.free_bytes = 3 * (D_BYTES + X_BYTES) + OUT_NORM_BYTES + HEAD_BYTES; /* the weights, not the cache */
    expect_refusal(MOE, NULL, 0, &o, BL_ENOMEM, "plan: layers 5..7 on CUDA1 (NVIDIA Test) of 10.0.0.2 need");
    char want[64];
    snprintf(want, sizeof want, "free, %llu bytes (fewer layers", (unsigned long long)d.free_bytes);
    expect_refusal(MOE, NULL, 0, &o, BL_ENOMEM, want);
    const int64_t bad[2] = {N_LAYER, N_LAYER};
    o.stage_ends = bad;
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "stage 1 of the layers ends at layer 8, after 8");
}

/* The expert flags beside another host's card: host RAM there would be a hosttier's,
 * and without a hosttier line of that host --cpu-moe and -ncmoe that reach its layers
 * are refused by name; beside this host's card they go to the hosttier as on one
 * host, on a CPU stage they stay in its worker, and HOSTTIER is taken for any stage.
 * The flags that choose cards are the hostfile's to give. */
static void test_plan_hosts_expert_flags_and_card_flags(void **state)
{
    (void)state;
    const bl_device_t d = card(1, 80 * GIB_BYTES);
    bl_stage_host_t h[2];
    bl_place_opts_t o = card_line_opts(h, &d);
    bl_plan_t *p = &g_plan;
    o.cpu_moe = 1;
    expect_refusal(MOE, NULL, 0, &o, BL_ENOTSUP, "--cpu-moe \\.ffn_(up|down|gate)_exps=CPU: blk.2.ffn_");
    expect_refusal(MOE, NULL, 0, &o, BL_ENOTSUP, "is on CUDA1 of 10.0.0.2, another host than the router's");
    expect_refusal(MOE, NULL, 0, &o, BL_ENOTSUP, "add a line '10.0.0.2 PORT hosttier' to the hostfile");
    o.cpu_moe = 0;
    o.n_cpu_moe = 2; /* the CPU stage's layers: they stay in its worker */
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "00000000");
    bl_plan_free(p);
    o.n_cpu_moe = 3;
    expect_refusal(MOE, NULL, 0, &o, BL_ENOTSUP, "blk.2.ffn_");
    o.n_cpu_moe = 0;
    const char *ot[1] = {"blk\\.[67]\\.ffn_.*_exps=HOSTTIER"};
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "00000011");
    assert_stage(p, 1, 1, 2, N_LAYER);
    assert_true(p->stage[1].host_expert_bytes == 2 * X_BYTES);
    bl_plan_free(p);
    ot[0] = "blk\\.[67]\\.ffn_.*_exps=CUDA1";
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "with a hostfile, routed experts stay on their stage's card");
    o.n_override_tensor = 0;

    /* the card of the router's host: --cpu-moe puts its layers' experts in the
     * hosttier, the CPU stage's stay */
    h[1].remote = 0;
    o.cpu_moe = 1;
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "00111111");
    bl_plan_free(p);
    o.cpu_moe = 0;

    o.devices = "cuda1";
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "--device cuda1: with a hostfile, its worker lines choose the cards");
    o.devices = NULL;
    o.tensor_split = "1,1";
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "--tensor-split 1,1");
    o.tensor_split = NULL;
    o.split_mode = "none";
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "--split-mode none");
    o.split_mode = "layer";
    build_ok(p, MOE, NULL, 0, &o);
    bl_plan_free(p);
    o.split_mode = NULL;
    o.gpu_layers = "4";
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "--gpu-layers 4: with a hostfile");
    o.gpu_layers = "all";
    build_ok(p, MOE, NULL, 0, &o);
    bl_plan_free(p);
    o.gpu_layers = NULL;
    o.n_hosts = N_LAYER + 1;
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "9 workers for 8 layers");
    o.n_hosts = 0;
    expect_refusal(MOE, NULL, 0, &o, BL_EINVAL, "0 stages of a hostfile");
}

/* A hosttier line of the card's host: --cpu-moe puts that stage's routed experts in
 * its host's RAM, the hosttier there computes them (node_hosttier), and this host's
 * hosttier has none of them (host_bytes, hosttier); -ot ...=HOSTTIER of that stage
 * goes there too, while the CPU stage's HOSTTIER layers stay with this host's. Their
 * bytes are held against that host's memory as its node reports it. */
static void test_plan_hosts_a_hosttier_of_another_host(void **state)
{
    (void)state;
    const bl_device_t d = card(1, 80 * GIB_BYTES);
    bl_stage_host_t h[2];
    bl_place_opts_t o = card_line_opts(h, &d);
    h[1].hosttier = 1;
    bl_plan_t *p = &g_plan;
    o.cpu_moe = 1;
    build_ok(p, MOE, NULL, 0, &o);
    assert_stage(p, 1, 1, 2, N_LAYER);
    assert_host(p, "00111111");
    assert_int_equal(p->stage[0].node_hosttier, 0);
    assert_int_equal(p->stage[1].node_hosttier, 1);
    assert_true(p->stage[1].host_expert_bytes == 6 * X_BYTES);
    assert_int_equal(p->hosttier, 0);
    assert_true(p->host_bytes == 0 && p->n_host_layers == 0);
    assert_true(p->node_host_bytes == 6 * X_BYTES && p->n_node_host_layers == 6);
    assert_int_equal(bl_plan_layer_node_hosttier(p, 1), 0);
    assert_int_equal(bl_plan_layer_node_hosttier(p, 2), 1);
    assert_int_equal(bl_plan_layer_host(p, 2), 1);
    char text[2048];
    bl_plan_format(p, text, sizeof text);
    assert_non_null(strstr(text, "routed experts in host RAM of other hosts"));
    bl_plan_free(p);
    o.cpu_moe = 0;

    const char *ot[1] = {"blk\\.[0167]\\.ffn_.*_exps=HOSTTIER"};
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "11000011");
    assert_int_equal(p->stage[1].node_hosttier, 1);
    assert_int_equal(p->hosttier, 1);
    assert_true(p->host_bytes == 2 * X_BYTES && p->node_host_bytes == 2 * X_BYTES);
    assert_int_equal(bl_plan_layer_node_hosttier(p, 0), 0);
    assert_int_equal(bl_plan_layer_node_hosttier(p, 7), 1);
    bl_plan_free(p);
    o.n_override_tensor = 0;

    /* no layer of it in host RAM: no hosttier there */
    build_ok(p, MOE, NULL, 0, &o);
    assert_int_equal(p->stage[1].node_hosttier, 0);
    assert_true(p->node_host_bytes == 0);
    bl_plan_free(p);

    /* that host's memory: room for them with the margin, then one byte short */
    o.cpu_moe = 1;
    h[1].mem_avail = 64 * GIB_BYTES;
    build_ok(p, MOE, NULL, 0, &o);
    bl_plan_free(p);
    h[1].mem_avail = 6 * X_BYTES + bl_mem_margin(6 * X_BYTES) - 1;
    expect_refusal(MOE, NULL, 0, &o, BL_ENOMEM, "plan: the hosttier of 10.0.0.2 would keep");
    expect_refusal(MOE, NULL, 0, &o, BL_ENOMEM, "and 10.0.0.2 has");
}

static void test_plan_one_device_defaults_put_every_layer_on_the_card(void **state)
{
    (void)state;
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_sizes(p, 0, W_ALL, N_LAYER * X_BYTES);
    assert_host(p, "00000000");
    assert_int_equal(p->fit_moved, 0);
    assert_int_equal(p->fit_cpu_layers, 0);
    assert_int_equal(p->fit_target_mib, 1024);
    bl_plan_free(p);
}

static void test_plan_free_memory_not_known_is_not_checked(void **state)
{
    (void)state;
    const bl_device_t d = card(0, 0);
    bl_place_opts_t o = opts();
    o.fit = "on";
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_host(p, "00000000");
    assert_int_equal(p->fit_moved, 0);
    bl_plan_free(p);
    o.fit = "off";
    build_ok(p, MOE, &d, 1, &o);
    assert_stage(p, 0, 0, 0, N_LAYER);
    bl_plan_free(p);
}

/* --- -ngl ---------------------------------------------------------------------------- */

static void test_plan_ngl_zero_puts_every_layer_on_the_cpu(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.gpu_layers = "0";
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, N_LAYER);
    assert_sizes(p, 0, W_ALL, N_LAYER * X_BYTES);
    assert_host(p, "00000000");
    bl_plan_free(p);
}

static void test_plan_ngl_puts_the_last_layers_on_the_card(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.gpu_layers = "3";
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 5);
    assert_stage(p, 1, 0, 5, 8);
    assert_sizes(p, 0, EMBD_BYTES + 5 * (D_BYTES + X_BYTES), 5 * X_BYTES);
    assert_sizes(p, 1, 3 * (D_BYTES + X_BYTES) + OUT_NORM_BYTES + HEAD_BYTES, 3 * X_BYTES);
    assert_host(p, "00000000");
    bl_plan_free(p);

    o.n_cpu_stages = 2; /* the CPU layers split, the card's stage after them */
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 3);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 3);
    assert_stage(p, 1, BL_PLAN_DEVICE_CPU, 3, 5);
    assert_stage(p, 2, 0, 5, 8);
    bl_plan_free(p);
}

static void test_plan_ngl_all_forms_put_every_layer_on_the_card(void **state)
{
    (void)state;
    static const char *const v[] = {"99", "8", "all", "auto", "-1"};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        bl_place_opts_t o = opts();
        o.gpu_layers = v[i];
        bl_plan_t *p = &g_plan;
        build_ok(p, MOE, big1, 1, &o);
        if (p->n_stages != 1)
            fail_msg("-ngl %s: %d stages", v[i], p->n_stages);
        assert_stage(p, 0, 0, 0, N_LAYER);
        assert_sizes(p, 0, W_ALL, N_LAYER * X_BYTES);
        bl_plan_free(p);
    }
}

static void test_plan_ngl_garbage_is_refused(void **state)
{
    (void)state;
    static const char *const v[] = {"x", "3x", "-2", "", "all0"};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        bl_place_opts_t o = opts();
        o.gpu_layers = v[i];
        expect_refusal(MOE, big1, 1, &o, BL_EINVAL, "--gpu-layers");
    }
}

/* --- --cpu-moe and -ncmoe --------------------------------------------------------------- */

/* Fails with plan.c as it is: --cpu-moe's pattern is compiled with length 26, one past
 * the 25 characters of "\.ffn_(up|down|gate)_exps", so it holds a trailing NUL and
 * finds no tensor; every layer stays on the card. */
static void test_plan_cpu_moe_with_a_card_puts_every_layer_in_host_ram(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.cpu_moe = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_host(p, "11111111");
    assert_sizes(p, 0, W_ALL - N_LAYER * X_BYTES, 0);
    assert_int_equal(p->fit_moved, 0);
    bl_plan_free(p);
}

/* Fails with plan.c as it is, for the reason above. */
static void test_plan_cpu_moe_hosts_only_the_card_layers(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.cpu_moe = 1;
    o.gpu_layers = "3";
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 5);
    assert_stage(p, 1, 0, 5, 8);
    assert_host(p, "00000111");
    assert_sizes(p, 0, EMBD_BYTES + 5 * (D_BYTES + X_BYTES), 5 * X_BYTES);
    assert_sizes(p, 1, 3 * D_BYTES + OUT_NORM_BYTES + HEAD_BYTES, 0);
    bl_plan_free(p);
}

static void test_plan_cpu_moe_without_a_card_keeps_experts_in_the_cpu_worker(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.cpu_moe = 1;
    o.gpu_layers = "0";
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, N_LAYER);
    assert_host(p, "00000000");
    assert_sizes(p, 0, W_ALL, N_LAYER * X_BYTES);
    bl_plan_free(p);

    o.gpu_layers = NULL;
    build_ok(p, MOE, NULL, 0, &o);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, N_LAYER);
    assert_host(p, "00000000");
    bl_plan_free(p);
}

/* --experts-ram: the host experts past the budget stay on disk; a budget below a CPU
 * stage's own experts moves every CPU layer's experts to the hosttier (its pager);
 * auto spares a margin of the available memory; the zero value is no limit. */
static void test_plan_experts_ram_budget(void **state)
{
    (void)state;
    bl_plan_t *p = &g_plan;
    bl_place_opts_t o = opts();
    o.cpu_moe = 1;
    o.experts_ram = (int64_t)(3 * X_BYTES); /* 3 of the 8 host layers' experts */
    build_ok(p, MOE, big1, 1, &o);
    assert_host(p, "11111111");
    assert_true(p->host_ram_bytes == 3 * X_BYTES && p->host_disk_bytes == 5 * X_BYTES);
    assert_true(p->experts_ram == 3 * X_BYTES);
    char text[2048];
    bl_plan_format(p, text, sizeof text);
    assert_non_null(strstr(text, "on disk"));
    bl_plan_free(p);

    o.experts_ram = (int64_t)(100 * X_BYTES); /* room for all: nothing on disk */
    build_ok(p, MOE, big1, 1, &o);
    assert_true(p->host_ram_bytes == 8 * X_BYTES && p->host_disk_bytes == 0);
    bl_plan_format(p, text, sizeof text);
    assert_null(strstr(text, "on disk"));
    bl_plan_free(p);

    /* the CPU only: the CPU worker's experts go to the hosttier when they do not fit */
    o = opts();
    o.experts_ram = (int64_t)X_BYTES;
    build_ok(p, MOE, NULL, 0, &o);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, N_LAYER);
    assert_host(p, "11111111");
    assert_int_equal(p->disk_moved, N_LAYER);
    assert_sizes(p, 0, W_ALL - N_LAYER * X_BYTES, 0);
    assert_true(p->host_ram_bytes == X_BYTES && p->host_disk_bytes == 7 * X_BYTES);
    bl_plan_free(p);

    /* auto: the available memory less its margin (2 GiB at least) and the CPU stage's
     * other weights; unknown memory is no limit, and so is the zero value */
    o = opts();
    o.experts_ram = BL_EXPERTS_RAM_AUTO;
    o.ram_avail = 2 * GIB_BYTES + (W_ALL - N_LAYER * X_BYTES) + 2 * X_BYTES;
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "11111111");
    assert_true(p->host_disk_bytes > 0 && p->host_ram_bytes <= 2 * X_BYTES + N_CTX * 4096);
    bl_plan_free(p);
    o.ram_avail = 0;
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "00000000");
    assert_true(p->host_disk_bytes == 0);
    bl_plan_free(p);
    o.experts_ram = 0;
    o.ram_avail = 1;
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "00000000");
    bl_plan_free(p);

    /* a dense model has no experts to page */
    o.experts_ram = 1;
    build_ok(p, DENSE, NULL, 0, &o);
    assert_true(p->host_disk_bytes == 0 && p->n_host_layers == 0);
    bl_plan_free(p);
}

static void test_plan_ncmoe_hosts_the_first_layers(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.n_cpu_moe = 3;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_host(p, "11100000");
    assert_sizes(p, 0, W_ALL - 3 * X_BYTES, 5 * X_BYTES);
    assert_int_equal(p->fit_moved, 0);
    bl_plan_free(p);
}

static void test_plan_ncmoe_of_every_layer_hosts_them_all(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.n_cpu_moe = N_LAYER;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_host(p, "11111111");
    assert_sizes(p, 0, W_ALL - N_LAYER * X_BYTES, 0);
    bl_plan_free(p);
}

static void test_plan_ncmoe_above_the_layer_count_is_refused(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.n_cpu_moe = N_LAYER + 1;
    expect_refusal(MOE, big1, 1, &o, BL_EINVAL, "--n-cpu-moe 9");
    o.n_cpu_moe = -1;
    expect_refusal(MOE, big1, 1, &o, BL_EINVAL, "--n-cpu-moe -1");
}

/* --- -ot ---------------------------------------------------------------------------------- */

static void test_plan_ot_cpu_hosts_the_card_layers_it_names(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.[0-2]\\.ffn_.*_exps=CPU"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_host(p, "11100000");
    assert_sizes(p, 0, W_ALL - 3 * X_BYTES, 5 * X_BYTES);
    bl_plan_free(p);
}

static void test_plan_ot_hosttier_on_a_cpu_plan_uses_the_hosttier(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.[67]\\.ffn_.*_exps=hosttier"}; /* any case */
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, NULL, 0, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, N_LAYER);
    assert_host(p, "00000011");
    assert_sizes(p, 0, W_ALL - 2 * X_BYTES, 6 * X_BYTES);
    bl_plan_free(p);
}

static void test_plan_ot_cpu_on_a_cpu_stage_changes_nothing(void **state)
{
    (void)state;
    const char *ot[] = {"ffn_.*_exps=CPU"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, NULL, 0, &o);
    assert_host(p, "00000000");
    bl_plan_free(p);
}

static void test_plan_ot_pattern_matching_nothing_is_refused(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.42\\.ffn_up_exps=CPU"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    expect_refusal(MOE, big1, 1, &o, BL_ENOTSUP, "--override-tensor blk\\.42\\.ffn_up_exps=CPU");
}

static void test_plan_ot_bad_regex_is_refused(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.(=CPU"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    expect_refusal(MOE, big1, 1, &o, BL_EINVAL, "--override-tensor blk\\.(=CPU: the pattern does not compile");
}

static void test_plan_ot_malformed_items_are_refused(void **state)
{
    (void)state;
    static const struct {
        const char *v, *needle;
    } c[] = {
        {"ffn_.*_exps=FOO", "buffer type 'FOO'"},
        {"ffn_.*_exps=CUDA", "buffer type 'CUDA'"},
        {"ffn_.*_exps", "not REGEX=BUFFER_TYPE"},
        {"=CPU", "not REGEX=BUFFER_TYPE"},
        {"", "--override-tensor: an empty value"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        const char *ot[] = {c[i].v};
        bl_place_opts_t o = opts();
        o.override_tensor = ot;
        o.n_override_tensor = 1;
        expect_refusal(MOE, big1, 1, &o, BL_EINVAL, c[i].needle);
    }
}

static void test_plan_ot_missing_cuda_device_is_refused(void **state)
{
    (void)state;
    const char *ot[] = {"ffn_.*_exps=CUDA5"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    expect_refusal(MOE, big1, 1, &o, BL_ENOTSUP, "--override-tensor ffn_.*_exps=CUDA5: no such device");
}

static void test_plan_ot_splitting_a_layers_experts_is_refused(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.0\\.ffn_up_exps=CPU"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    expect_refusal(MOE, big1, 1, &o, BL_ENOTSUP, "routed experts of layer 0 would be split");
}

static void test_plan_ot_moving_a_dense_tensor_is_refused(void **state)
{
    (void)state;
    static const struct {
        const char *v, *needle;
    } c[] = {
        {"attn_q=CPU", "blk.0.attn_q.weight (attention)"},
        {"token_embd=CPU", "token_embd.weight (token_embd)"},
        {"blk\\.3\\.ffn_gate_inp=HOSTTIER", "blk.3.ffn_gate_inp.weight (router)"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        const char *ot[] = {c[i].v};
        bl_place_opts_t o = opts();
        o.override_tensor = ot;
        o.n_override_tensor = 1;
        expect_refusal(MOE, big1, 1, &o, BL_ENOTSUP, c[i].needle);
    }
}

static void test_plan_ot_dense_tensor_on_its_own_stage_is_accepted(void **state)
{
    (void)state;
    const char *ot[] = {"attn_q=CUDA0"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_host(p, "00000000");
    bl_plan_free(p);
}

static void test_plan_ot_card_for_experts_of_a_cpu_stage_is_refused(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.0\\.ffn_.*_exps=CUDA0"};
    bl_place_opts_t o = opts();
    o.gpu_layers = "4";
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    /* CUDA0 holds the last 4 layers: an expert tier is a card without layers */
    expect_refusal(MOE, big1, 1, &o, BL_ENOTSUP, "and CUDA0 holds layers");
}

/* Fails with plan.c as it is: --cpu-moe finds no tensor (see above), so only the -ot
 * part shows and every layer stays on the card. */
static void test_plan_ot_comes_before_cpu_moe(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.1\\.ffn_.*_exps=CUDA0"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    o.cpu_moe = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_host(p, "10111111");
    assert_sizes(p, 0, W_ALL - 7 * X_BYTES, X_BYTES);
    bl_plan_free(p);
}

static void test_plan_ot_comes_before_ncmoe(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.1\\.ffn_.*_exps=CUDA0"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    o.n_cpu_moe = 3;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_host(p, "10100000");
    bl_plan_free(p);
}

static void test_plan_ot_first_pattern_decides(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.0\\.ffn_.*_exps=CUDA0", "ffn_.*_exps=CPU"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 2;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_host(p, "01111111");
    bl_plan_free(p);
}

static void test_plan_ot_takes_comma_separated_items(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.0\\.ffn_.*_exps=CPU,blk\\.5\\.ffn_.*_exps=CPU", "blk\\.7\\.ffn_.*_exps=CPU"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 2;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_host(p, "10000101");
    bl_plan_free(p);
}

static void test_plan_ot_splits_an_item_at_its_last_equals(void **state)
{
    (void)state;
    const char *ot[] = {"(?=blk\\.2\\.)blk.*_exps=CPU"}; /* a lookahead holds '=' */
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_host(p, "00100000");
    bl_plan_free(p);
}

/* --- -dev, -sm, -mg, -ts ------------------------------------------------------------------ */

static void test_plan_dev_none_is_the_cpu(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.devices = "none";
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big2, 2, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, N_LAYER);
    bl_plan_free(p);
}

static void test_plan_dev_selects_the_named_devices(void **state)
{
    (void)state;
    static const char *const v[] = {"cuda1", "CUDA1"};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        bl_place_opts_t o = opts();
        o.devices = v[i];
        bl_plan_t *p = &g_plan;
        build_ok(p, MOE, big2, 2, &o);
        assert_int_equal(p->n_stages, 1);
        assert_stage(p, 0, 1, 0, N_LAYER);
        assert_sizes(p, 0, W_ALL, N_LAYER * X_BYTES);
        bl_plan_free(p);
    }
    bl_place_opts_t o = opts();
    o.devices = "cuda1,cuda0"; /* in the order listed */
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big2, 2, &o);
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, 1, 0, 4);
    assert_stage(p, 1, 0, 4, 8);
    bl_plan_free(p);
}

static void test_plan_dev_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *v;
        int code;
        const char *needle;
    } c[] = {
        {"cuda7", BL_ENOTSUP, "--device cuda7: no such device"},
        {"gpu0", BL_EINVAL, "--device: 'gpu0' is not none or cudaN"},
        {"cuda", BL_EINVAL, "--device: 'cuda'"},
        {"cuda0,cuda0", BL_EINVAL, "--device: cuda0 is listed twice"},
        {"cuda0,,cuda1", BL_EINVAL, "--device"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        bl_place_opts_t o = opts();
        o.devices = c[i].v;
        expect_refusal(MOE, big2, 2, &o, c[i].code, c[i].needle);
    }
}

static void test_plan_sm_row_is_refused(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.split_mode = "row";
    expect_refusal(MOE, big2, 2, &o, BL_ENOTSUP, "--split-mode row");
    o.split_mode = "rows";
    expect_refusal(MOE, big2, 2, &o, BL_EINVAL, "--split-mode rows: not none, layer or row");
}

static void test_plan_sm_none_uses_the_main_gpu_only(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.split_mode = "none";
    o.main_gpu = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big2, 2, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 1, 0, N_LAYER);
    bl_plan_free(p);

    o.main_gpu = 0;
    build_ok(p, MOE, big2, 2, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, N_LAYER);
    bl_plan_free(p);

    o.split_mode = "layer"; /* the default: a stage per device */
    build_ok(p, MOE, big2, 2, &o);
    assert_int_equal(p->n_stages, 2);
    bl_plan_free(p);
}

static void test_plan_mg_out_of_range_is_refused(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.split_mode = "none";
    o.main_gpu = 2;
    expect_refusal(MOE, big2, 2, &o, BL_EINVAL, "--main-gpu 2: there are 2 devices");
    o.main_gpu = -1;
    expect_refusal(MOE, big2, 2, &o, BL_EINVAL, "--main-gpu -1");
}

static void test_plan_ts_splits_layers_by_proportion(void **state)
{
    (void)state;
    static const struct {
        const char *v;
        int n_stages;
        int dev0, le0, dev1;
    } c[] = {
        {"1,1", 2, 0, 4, 1}, {"3,1", 2, 0, 6, 1}, {"1/3", 2, 0, 2, 1}, {"0,1", 1, 1, 8, -1}, {"1", 1, 0, 8, -1},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        bl_place_opts_t o = opts();
        o.tensor_split = c[i].v;
        bl_plan_t *p = &g_plan;
        build_ok(p, MOE, big2, 2, &o);
        if (p->n_stages != c[i].n_stages)
            fail_msg("-ts %s: %d stages, expected %d", c[i].v, p->n_stages, c[i].n_stages);
        assert_stage(p, 0, c[i].dev0, 0, c[i].le0);
        const int64_t le0 = c[i].le0;
        assert_sizes(p, 0, EMBD_BYTES + (uint64_t)le0 * (D_BYTES + X_BYTES) +
                                 (le0 == N_LAYER ? OUT_NORM_BYTES + HEAD_BYTES : 0),
                     (uint64_t)le0 * X_BYTES);
        if (c[i].n_stages == 2) {
            assert_stage(p, 1, c[i].dev1, le0, N_LAYER);
            assert_sizes(p, 1, (uint64_t)(N_LAYER - le0) * (D_BYTES + X_BYTES) + OUT_NORM_BYTES + HEAD_BYTES,
                         (uint64_t)(N_LAYER - le0) * X_BYTES);
        }
        bl_plan_free(p);
    }
}

static void test_plan_ts_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *v, *needle;
    } c[] = {
        {"1,1,1", "--tensor-split 1,1,1: 3 proportions for 2 devices"},
        {"0,0", "--tensor-split 0,0: the proportions sum to 0"},
        {"a,1", "--tensor-split: 'a' is not a proportion"},
        {"-1,2", "--tensor-split: '-1' is not a proportion"},
        {"1,,1", "--tensor-split"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        bl_place_opts_t o = opts();
        o.tensor_split = c[i].v;
        expect_refusal(MOE, big2, 2, &o, BL_EINVAL, c[i].needle);
    }
}

static void test_plan_default_split_follows_free_memory(void **state)
{
    (void)state;
    const bl_device_t d[2] = {card(0, 60 * GIB_BYTES), card(1, 20 * GIB_BYTES)};
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, d, 2, &o);
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, 0, 0, 6);
    assert_stage(p, 1, 1, 6, 8);
    assert_host(p, "00000000");
    bl_plan_free(p);
}

/* --- --fit ---------------------------------------------------------------------------------- */

/* Room for the dense parts, the KV cache, the scratch, the margin and 5.5 layers of
 * experts: the experts of the first 3 layers must go. */
/* With experts in host RAM the card also keeps a buffer of one layer's experts (the
 * prompt offload copies a host layer there): X_BYTES more scratch. */
static uint64_t free_for_five_and_a_half_layers(void)
{
    return W_ALL - N_LAYER * X_BYTES + KV_ALL + scratch_of_one_stage() + X_BYTES + MARGIN_DEFAULT + 5 * X_BYTES +
           X_BYTES / 2;
}

static void test_plan_fit_moves_the_experts_of_as_few_leading_layers_as_needed(void **state)
{
    (void)state;
    const bl_device_t d = card(0, free_for_five_and_a_half_layers());
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_int_equal(p->fit_moved, 3);
    assert_int_equal(p->fit_cpu_layers, 0);
    assert_host(p, "11100000");
    assert_sizes(p, 0, W_ALL - 3 * X_BYTES, 5 * X_BYTES);
    assert_fits(p, &d, 1, MARGIN_DEFAULT);
    /* one layer fewer would not fit */
    assert_true(need_of(&p->stage[0], MARGIN_DEFAULT) + X_BYTES > d.free_bytes);
    bl_plan_free(p);
}

static void test_plan_fit_target_raised_moves_more_layers(void **state)
{
    (void)state;
    const bl_device_t d = card(0, free_for_five_and_a_half_layers());
    bl_place_opts_t o = opts();
    o.fit_target_mib = 1025; /* 1 MiB more is 2.67 layers of experts: 6 move */
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    assert_int_equal(p->fit_target_mib, 1025);
    assert_int_equal(p->fit_moved, 6);
    assert_host(p, "11111100");
    assert_sizes(p, 0, W_ALL - 6 * X_BYTES, 2 * X_BYTES);
    assert_fits(p, &d, 1, MARGIN_DEFAULT + MIB);
    assert_true(need_of(&p->stage[0], MARGIN_DEFAULT + MIB) + X_BYTES > d.free_bytes);
    bl_plan_free(p);
}

static void test_plan_fit_off_refuses_a_card_too_small_with_the_sizes(void **state)
{
    (void)state;
    bl_device_t d = card(0, W_ALL + KV_ALL - 1);
    bl_place_opts_t o = opts();
    o.fit = "off";
    /* weights 3628288 B, KV 1 MiB, free 4676863 B */
    expect_refusal(MOE, &d, 1, &o, BL_ENOMEM,
                   "plan: layers 0..7 on CUDA0 need 3.5 MiB of weights and 1.0 MiB of KV cache");
    expect_refusal(MOE, &d, 1, &o, BL_ENOMEM, "the card has 4.5 MiB free");
    expect_refusal(MOE, &d, 1, &o, BL_ENOMEM, "--fit on");

    d.free_bytes = W_ALL + KV_ALL; /* the weights and the KV cache fit exactly: accepted as given */
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_host(p, "00000000");
    assert_int_equal(p->fit_moved, 0);
    /* accepted, but the scratch and the margin do not fit: tight, as a report says */
    assert_int_equal(bl_plan_stage_fit(p, 0), BL_PLAN_TIGHT);
    assert_int_equal(p->stage[0].card.free_bytes, d.free_bytes); /* the stage keeps its card's facts */
    assert_string_equal(p->stage[0].card.name, d.name);
    p->stage[0].card.free_bytes = W_ALL + KV_ALL - 1;
    assert_int_equal(bl_plan_stage_fit(p, 0), BL_PLAN_OVER);
    p->stage[0].card.free_bytes = 0; /* not known: nothing is held against it */
    assert_int_equal(bl_plan_stage_fit(p, 0), BL_PLAN_FITS);
    bl_plan_free(p);
}

static void test_plan_fit_moves_leading_layers_to_the_cpu_when_the_dense_part_does_not_fit(void **state)
{
    (void)state;
    const uint64_t layer = D_BYTES + KV_LAYER_BYTES;
    /* room for 6.5 layers' dense parts and KV with every expert in host RAM (and the
     * buffer of one layer's experts the prompt offload keeps on the card) */
    const bl_device_t d = card(0, 6 * layer + OUT_NORM_BYTES + HEAD_BYTES + scratch_of_one_stage() + X_BYTES +
                                      MARGIN_DEFAULT + layer / 2);
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, 2);
    assert_stage(p, 1, 0, 2, 8);
    assert_int_equal(p->fit_cpu_layers, 2);
    assert_true(p->fit_moved > 0);
    /* the CPU layers keep their experts in their worker, the card's are in host RAM */
    assert_host(p, "00111111");
    assert_sizes(p, 0, EMBD_BYTES + 2 * (D_BYTES + X_BYTES), 2 * X_BYTES);
    assert_sizes(p, 1, 6 * D_BYTES + OUT_NORM_BYTES + HEAD_BYTES, 0);
    assert_fits(p, &d, 1, MARGIN_DEFAULT);
    assert_true(need_of(&p->stage[1], MARGIN_DEFAULT) + layer > d.free_bytes);
    bl_plan_free(p);
}

static void test_plan_fit_with_a_card_that_holds_nothing_is_the_cpu(void **state)
{
    (void)state;
    const bl_device_t d = card(0, 1);
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, BL_PLAN_DEVICE_CPU, 0, N_LAYER);
    assert_int_equal(p->fit_cpu_layers, N_LAYER);
    assert_host(p, "00000000");
    assert_sizes(p, 0, W_ALL, N_LAYER * X_BYTES);
    bl_plan_free(p);
}

/* Fails with plan.c as it is: after moving experts, only the first card's stage gives
 * layers to the CPU; the second card's stage (whose scratch holds the 256 MiB head
 * piece) stays over its card and the plan comes back as if it fitted. */
static void test_plan_fit_never_returns_a_card_over_its_memory(void **state)
{
    (void)state;
    const bl_device_t d[2] = {card(0, MARGIN_DEFAULT + (64ull << 20)), card(1, MARGIN_DEFAULT + (64ull << 20))};
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    bl_err_t err = {0};
    const int rc = bl_plan_build(p, M.g[MOE], &M.a[MOE], d, 2, &o, &err);
    if (rc == 0) {
        assert_fits(p, d, 2, MARGIN_DEFAULT);
        bl_plan_free(p);
    } else {
        assert_int_equal(rc, BL_ENOMEM);
        assert_null(p->host);
    }
}

static void test_plan_fit_garbage_is_refused(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.fit = "maybe";
    expect_refusal(MOE, big1, 1, &o, BL_EINVAL, "--fit: 'maybe' is not on or off");
}

static void test_plan_explicit_ngl_keeps_the_experts_on_the_card(void **state)
{
    (void)state;
    const bl_device_t d = card(0, free_for_five_and_a_half_layers());
    bl_place_opts_t o = opts();
    o.gpu_layers = "8";
    o.fit = "on";
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_int_equal(p->fit_moved, 0);
    assert_int_equal(p->fit_cpu_layers, 0);
    assert_host(p, "00000000");
    bl_plan_free(p);

    o.gpu_layers = NULL; /* -ncmoe is a choice too: fit adds nothing to it */
    o.n_cpu_moe = 1;
    build_ok(p, MOE, &d, 1, &o);
    assert_int_equal(p->fit_moved, 0);
    assert_host(p, "10000000");
    bl_plan_free(p);
}

/* --- other models ----------------------------------------------------------------------------- */

static void test_plan_dense_model_takes_cpu_moe_and_changes_nothing(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.cpu_moe = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, DENSE, big1, 1, &o);
    assert_int_equal(p->n_expert, 0);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, N_LAYER);
    assert_int_equal(bl_plan_layer_host(p, 0), 0);
    assert_int_equal(p->n_host_layers, 0);
    assert_true(p->host_bytes == 0);
    assert_int_equal(p->hosttier, 0);
    const uint64_t w = N_LAYER * DD_BYTES + EMBD_BYTES + OUT_NORM_BYTES + HEAD_BYTES;
    assert_true(p->stage[0].weight_bytes == w);
    assert_true(p->stage[0].expert_bytes == 0);
    bl_plan_free(p);

    o.cpu_moe = 0;
    o.n_cpu_moe = 3;
    build_ok(p, DENSE, big1, 1, &o);
    assert_int_equal(p->n_host_layers, 0);
    assert_int_equal(p->hosttier, 0);
    bl_plan_free(p);
}

static void test_plan_dense_model_ffn_tensor_stays_with_its_layer(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.2\\.ffn_up=CPU"};
    bl_place_opts_t o = opts();
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    expect_refusal(DENSE, big1, 1, &o, BL_ENOTSUP, "blk.2.ffn_up.weight (ffn)");
}

static void test_plan_tied_head_counts_token_embd_once(void **state)
{
    (void)state;
    assert_int_equal(M.a[TIED].tied_output, 1);
    bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, TIED, big1, 1, &o);
    assert_int_equal(p->n_stages, 1);
    assert_sizes(p, 0, N_LAYER * (D_BYTES + X_BYTES) + EMBD_BYTES + OUT_NORM_BYTES, N_LAYER * X_BYTES);
    bl_plan_free(p);

    /* over two stages the last holds its own copy of the head */
    o.tensor_split = "1,1";
    build_ok(p, TIED, big2, 2, &o);
    assert_int_equal(p->n_stages, 2);
    assert_sizes(p, 0, 4 * (D_BYTES + X_BYTES) + EMBD_BYTES, 4 * X_BYTES);
    assert_sizes(p, 1, 4 * (D_BYTES + X_BYTES) + OUT_NORM_BYTES + EMBD_BYTES, 4 * X_BYTES);
    bl_plan_free(p);
}

/* --- bl_plan_model_bytes ------------------------------------------------------------------------ */

static void test_plan_model_bytes_by_role_and_type(void **state)
{
    (void)state;
    bl_model_bytes_t mb;
    bl_plan_model_bytes(M.g[MOE], &M.a[MOE], &mb);
    assert_true(mb.bytes == W_ALL);
    assert_true(mb.role_bytes[BL_ROLE_EXPERTS] == N_LAYER * X_BYTES);
    assert_true(mb.role_params[BL_ROLE_EXPERTS] == N_LAYER * X_BYTES / 4); /* f32 */
    assert_true(mb.role_bytes[BL_ROLE_TOKEN_EMBD] == EMBD_BYTES);
    assert_true(mb.role_bytes[BL_ROLE_OUTPUT] == HEAD_BYTES);
    assert_true(mb.role_bytes[BL_ROLE_OUTPUT_NORM] == OUT_NORM_BYTES);
    assert_true(mb.role_bytes[BL_ROLE_GATE_INP] == N_LAYER * 4ull * N_EMBD * N_EXPERT);
    assert_true(mb.role_bytes[BL_ROLE_OTHER] == 0);
    assert_true(mb.params * 4 == mb.bytes);
    assert_true(mb.type_bytes[BL_TYPE_F32] == mb.bytes);
    assert_true(mb.type_tensors[BL_TYPE_F32] == mb.tensors);
    assert_true(mb.tensors == bl_gguf_n_tensors(M.g[MOE]));
    uint64_t sum = 0;
    for (int r = 0; r < BL_PLAN_N_ROLES; r++)
        sum += mb.role_bytes[r];
    assert_true(sum == mb.bytes);

    /* what the plan places is the file's tensors, the routed experts in the hosttier included */
    bl_place_opts_t o = opts();
    o.n_cpu_moe = 3;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    assert_true(p->stage[0].weight_bytes + p->host_bytes == mb.bytes);
    assert_true(p->stage[0].host_expert_bytes == p->host_bytes);
    bl_plan_free(p);
}

/* --- bl_plan_format, bl_plan_free, allocation failure ------------------------------------------- */

static void test_plan_format_names_each_stage_and_the_host_ram(void **state)
{
    (void)state;
    const char *ot[] = {"blk\\.[34]\\.ffn_.*_exps=CPU"};
    bl_place_opts_t o = opts();
    o.gpu_layers = "5";
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, big1, 1, &o);
    char buf[4096];
    const size_t n = bl_plan_format(p, buf, sizeof buf);
    assert_int_equal(n, strlen(buf));
    /* stage 0: embd + 3 layers = 1366912 B; stage 1: 5 layers' dense parts, 3 layers'
     * experts, the norm and the head = 1474944 B */
    static const char *const want[] = {
        "stage 0: layers 0..2 on the CPU: weights 1.3 MiB (routed experts 1.1 MiB)",
        "stage 1: layers 3..7 on CUDA0 (NVIDIA Test): weights 1.4 MiB (routed experts 1.1 MiB)",
        "routed experts in host RAM 0.8 MiB (2 of 8 layers, the hosttier)",
        "routed experts with their stage per layer: 0-2: 16 3-4: 0 5-7: 16\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(buf, want[i]))
            fail_msg("'%s' not in:\n%s", want[i], buf);
    assert_null(strstr(buf, "--fit"));

    /* a small buffer: the full length back, what fits NUL-terminated */
    char small[10];
    memset(small, 'x', sizeof small);
    assert_int_equal(bl_plan_format(p, small, sizeof small), n);
    assert_int_equal(small[9], '\0');
    assert_memory_equal(small, buf, 9);
    assert_int_equal(bl_plan_format(p, NULL, 0), n);
    bl_plan_free(p);
}

static void test_plan_format_reports_fit(void **state)
{
    (void)state;
    const bl_device_t d = card(0, free_for_five_and_a_half_layers());
    const bl_place_opts_t o = opts();
    bl_plan_t *p = &g_plan;
    build_ok(p, MOE, &d, 1, &o);
    char buf[4096];
    (void)bl_plan_format(p, buf, sizeof buf); /* the length is checked elsewhere */
    const char *want = "--fit: experts of 3 layers put in host RAM, 0 layers moved to the CPU, to keep 1024 MiB "
                       "free on each card\n";
    if (!strstr(buf, want))
        fail_msg("'%s' not in:\n%s", want, buf);
    bl_plan_free(p);
}

static void test_plan_free_is_safe_after_a_failed_build_and_twice(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.split_mode = "row";
    bl_plan_t *p = &g_plan;
    bl_err_t err = {0};
    assert_int_equal(bl_plan_build(p, M.g[MOE], &M.a[MOE], big1, 1, &o, &err), BL_ENOTSUP);
    assert_null(p->host);
    bl_plan_free(p);
    bl_plan_free(p);

    o.split_mode = NULL;
    build_ok(p, MOE, big1, 1, &o);
    bl_plan_free(p);
    assert_null(p->host);
    bl_plan_free(p);
    bl_plan_free(NULL);
}

/* Every allocation of bl_plan_build made to fail in turn: BL_ENOMEM, nothing left
 * (the sanitizer build checks the leaks), then a build that succeeds. */
/* Builds o's plan into g_plan with each allocation budget from 0 until it succeeds:
 * every failure on the way is BL_ENOMEM, says so, and leaves nothing to free. */
static void build_through_failing_allocations(int model, const bl_device_t *devs, int n_devs,
                                              const bl_place_opts_t *o)
{
    for (long budget = 0; budget < 64; budget++) {
        bl_plan_t *p = &g_plan;
        bl_err_t err = {0};
        alloc_budget = budget;
        const int rc = bl_plan_build(p, M.g[model], &M.a[model], devs, n_devs, o, &err);
        alloc_budget = -1;
        if (rc == 0) {
            assert_true(budget > 0);
            return;
        }
        if (rc != BL_ENOMEM)
            fail_msg("budget %ld: %d (%s)", budget, rc, err.msg);
        assert_non_null(strstr(err.msg, "out of memory"));
        assert_null(p->host);
    }
    fail_msg("no plan within 64 allocations");
}

static void test_plan_allocation_failure_is_enomem(void **state)
{
    (void)state;
    bl_place_opts_t o = opts();
    o.n_cpu_moe = 2;
    build_through_failing_allocations(MOE, big1, 1, &o);
    assert_host(&g_plan, "11000000");
    bl_plan_free(&g_plan);
    /* and with a hostfile's hosts to split the CPU layers by */
    const bl_stage_host_t h[2] = {{.name = "a", .threads = 1}, {.name = "b", .threads = 3}};
    o = opts();
    o.n_cpu_stages = 2;
    o.hosts = h;
    o.n_hosts = 2;
    build_through_failing_allocations(MOE, NULL, 0, &o);
    assert_stage(&g_plan, 1, BL_PLAN_DEVICE_CPU, 2, N_LAYER);
}

/* The residency flags come with the placement flags: --experts-vram defaults to auto
 * (not 0, which is no slots), takes a size or auto from the command line or its
 * variable, and --no-residency is a flag with a boolean variable. */
static void test_plan_args_carry_the_residency_flags(void **state)
{
    (void)state;
    bl_arg_t a[32];
    int n = 0;
    static bl_place_flags_t f;
    memset(&f, 0, sizeof f);
    assert_int_equal(bl_plan_args(a, &n, 32, &f), 0);
    assert_true(f.experts_vram == BL_EXPERTS_VRAM_AUTO);
    bl_err_t err = {0};
    char *argv[] = {"prog", "--experts-vram", "2G", "--no-residency", NULL};
    assert_int_equal(bl_args_parse(a, n, 4, argv, NULL, NULL, &err), 0);
    assert_true(f.experts_vram == (int64_t)2 << 30);
    assert_int_equal(f.no_residency, 1);

    memset(&f, 0, sizeof f);
    n = 0;
    assert_int_equal(bl_plan_args(a, &n, 32, &f), 0);
    setenv("BLOOMERY_EXPERTS_VRAM", "512", 1);
    setenv("BLOOMERY_NO_RESIDENCY", "1", 1);
    char *none[] = {"prog", NULL};
    assert_int_equal(bl_args_parse(a, n, 1, none, NULL, NULL, &err), 0);
    assert_true(f.experts_vram == (int64_t)512 << 20);
    assert_int_equal(f.no_residency, 1);
    setenv("BLOOMERY_EXPERTS_VRAM", "12Q", 1);
    assert_int_equal(bl_args_parse(a, n, 1, none, NULL, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "--experts-vram"));
    assert_non_null(strstr(err.msg, "BLOOMERY_EXPERTS_VRAM"));
    unsetenv("BLOOMERY_EXPERTS_VRAM");
    unsetenv("BLOOMERY_NO_RESIDENCY");
    char *neg[] = {"prog", "--experts-vram", "-5", NULL};
    assert_int_equal(bl_args_parse(a, n, 3, neg, NULL, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "--experts-vram"));
    /* a table too small for them is refused, not overrun */
    n = 30;
    assert_int_equal(bl_plan_args(a, &n, 32, &f), BL_ERANGE);
}

/* --- two H200s and a model larger than one of them ----------------------------------- */

/* Qwen3-235B-A22B's widths over 20 layers, every tensor f32: a layer's routed experts
 * take 9.66 GB and the file about 204 GB, more than one H200 holds, less than two. */
#define BIG_LAYER 20
#define BIG_EMBD 4096
#define BIG_HEAD 64
#define BIG_HEAD_KV 4
#define BIG_HEAD_DIM 128
#define BIG_EXPERT 128
#define BIG_FF_EXP 1536
#define BIG_VOCAB 151936
#define BIG_X_BYTES (3ull * 4 * BIG_EMBD * BIG_FF_EXP * BIG_EXPERT)
/* nvidia-smi's 143771 MiB, less what the runtime's context takes */
#define H200_BYTES (143771ull << 20)

/* Writes the big file at path without its bytes: the writer's header (its stream
 * flushed, the file linked to path before the writer removes its own name), then a
 * hole to the size the tensors take with their padding. The plan reads no data. */
static int write_big_model(const char *path, bl_err_t *err)
{
    bl_gguf_writer_t *w = NULL;
    char tmp[300], key[96], name[64];
    snprintf(tmp, sizeof tmp, "%s.head", path);
    int rc = bl_gw_create(&w, err);
    if (rc < 0)
        return rc;
#define SET_U32(k, v) (snprintf(key, sizeof key, "qwen3moe.%s", k), bl_gw_set_u32(w, key, v, err))
    if ((rc = bl_gw_set_str(w, "general.architecture", "qwen3moe", err)) < 0 ||
        (rc = SET_U32("block_count", BIG_LAYER)) < 0 || (rc = SET_U32("embedding_length", BIG_EMBD)) < 0 ||
        (rc = SET_U32("attention.head_count", BIG_HEAD)) < 0 ||
        (rc = SET_U32("attention.head_count_kv", BIG_HEAD_KV)) < 0 ||
        (rc = SET_U32("attention.key_length", BIG_HEAD_DIM)) < 0 ||
        (rc = SET_U32("attention.value_length", BIG_HEAD_DIM)) < 0 || (rc = SET_U32("context_length", 40960)) < 0 ||
        (rc = SET_U32("expert_count", BIG_EXPERT)) < 0 || (rc = SET_U32("expert_used_count", 8)) < 0 ||
        (rc = SET_U32("expert_feed_forward_length", BIG_FF_EXP)) < 0)
        goto out;
#undef SET_U32
    const int64_t nq = BIG_HEAD * BIG_HEAD_DIM, nkv = BIG_HEAD_KV * BIG_HEAD_DIM;
    if ((rc = add_t(w, "token_embd.weight", 2, BIG_EMBD, BIG_VOCAB, 1, err)) < 0 ||
        (rc = add_t(w, "output_norm.weight", 1, BIG_EMBD, 1, 1, err)) < 0 ||
        (rc = add_t(w, "output.weight", 2, BIG_EMBD, BIG_VOCAB, 1, err)) < 0)
        goto out;
    for (int l = 0; l < BIG_LAYER; l++) {
        const struct {
            const char *t;
            int n_dims;
            int64_t ne0, ne1, ne2;
        } spec[] = {
            {"attn_norm", 1, BIG_EMBD, 1, 1},       {"attn_q", 2, BIG_EMBD, nq, 1},
            {"attn_k", 2, BIG_EMBD, nkv, 1},        {"attn_v", 2, BIG_EMBD, nkv, 1},
            {"attn_output", 2, nq, BIG_EMBD, 1},    {"attn_q_norm", 1, BIG_HEAD_DIM, 1, 1},
            {"attn_k_norm", 1, BIG_HEAD_DIM, 1, 1}, {"ffn_norm", 1, BIG_EMBD, 1, 1},
            {"ffn_gate_inp", 2, BIG_EMBD, BIG_EXPERT, 1},
            {"ffn_gate_exps", 3, BIG_EMBD, BIG_FF_EXP, BIG_EXPERT},
            {"ffn_up_exps", 3, BIG_EMBD, BIG_FF_EXP, BIG_EXPERT},
            {"ffn_down_exps", 3, BIG_FF_EXP, BIG_EMBD, BIG_EXPERT},
        };
        for (size_t i = 0; i < sizeof spec / sizeof *spec; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, spec[i].t);
            if ((rc = add_t(w, name, spec[i].n_dims, spec[i].ne0, spec[i].ne1, spec[i].ne2, err)) < 0)
                goto out;
        }
    }
    uint64_t data = 0;
    for (size_t i = 0; i < bl_gw_tensor_count(w); i++)
        data += (bl_gw_tensor_nbytes(w, i) + BL_GGUF_DEFAULT_ALIGNMENT - 1) / BL_GGUF_DEFAULT_ALIGNMENT *
                BL_GGUF_DEFAULT_ALIGNMENT;
    if ((rc = bl_gw_begin(w, tmp, err)) < 0)
        goto out;
    const uint64_t head = bl_gw_bytes_written(w);
    (void)unlink(path);
    if (fflush(NULL) != 0 || link(tmp, path) != 0 || truncate(path, (off_t)(head + data)) != 0)
        rc = bl_err_set(err, BL_EIO, "%s: %s", path, strerror(errno));
out:
    bl_gw_destroy(w); /* removes tmp */
    return rc;
}

/* The big file, written at the first use and removed with the small ones. */
static void big_model(void)
{
    if (BIG.g)
        return;
    const char *dir = getenv("TMPDIR");
    snprintf(BIG.path, sizeof BIG.path, "%s/bl_test_plan_big_%d.gguf", dir && *dir ? dir : "/tmp", (int)getpid());
    bl_err_t err = {0};
    if (write_big_model(BIG.path, &err) < 0 || bl_gguf_open(&BIG.g, BIG.path, &err) < 0 ||
        bl_arch_read(&BIG.a, BIG.g, BIG.path, &err) < 0)
        fail_msg("%s: %s", BIG.path, err.msg);
}

static bl_device_t h200(int index)
{
    bl_device_t d = {.index = index, .total_bytes = H200_BYTES, .free_bytes = H200_BYTES - (600ull << 20)};
    snprintf(d.name, sizeof d.name, "NVIDIA H200");
    return d;
}

static void build_big(bl_plan_t *p, const bl_device_t *devs, int n_devs, const bl_place_opts_t *o)
{
    bl_err_t err = {0};
    big_model();
    const int rc = bl_plan_build(p, BIG.g, &BIG.a, devs, n_devs, o, &err);
    if (rc != 0)
        fail_msg("bl_plan_build: %d: %s", rc, err.msg);
}

/* The layers whose experts --fit moved to host RAM: a prefix of the first stage's
 * layers, as many as the plan says; every card's stage within its free memory less
 * the margin. */
static void assert_big_fits(const bl_plan_t *p, const bl_device_t *devs, int n_devs, int want_moved)
{
    int64_t l = 0;
    while (l < p->n_layer && bl_plan_layer_host(p, l))
        l++;
    assert_int_equal(p->n_host_layers, l);
    assert_int_equal(p->fit_moved, l);
    assert_true(l <= p->stage[0].le);
    if (want_moved >= 0)
        assert_int_equal(l, want_moved);
    assert_int_equal(p->hosttier, l > 0);
    for (int i = 0; i < p->n_stages; i++) {
        assert_true(p->stage[i].device >= 0);
        assert_int_equal(bl_plan_stage_fit(p, i), BL_PLAN_FITS);
    }
}

static void test_plan_two_h200s_split_a_model_larger_than_one(void **state)
{
    (void)state;
    const bl_device_t d[2] = {h200(0), h200(1)};
    big_model();
    /* larger than one card, not than two */
    struct stat st;
    assert_int_equal(stat(BIG.path, &st), 0);
    assert_true((uint64_t)st.st_size > H200_BYTES && (uint64_t)st.st_size < 2 * H200_BYTES);
    bl_plan_t *p = &g_plan;
    /* -sm layer -ts 1,1, -dev CUDA0,CUDA1 and the default (equal free memory): half
     * each, nothing in host RAM */
    static const struct {
        const char *sm, *ts, *dev;
    } even[] = {{"layer", "1,1", NULL}, {NULL, NULL, "CUDA0,CUDA1"}, {NULL, NULL, NULL}};
    for (size_t i = 0; i < sizeof even / sizeof *even; i++) {
        bl_place_opts_t o = opts();
        o.split_mode = even[i].sm;
        o.tensor_split = even[i].ts;
        o.devices = even[i].dev;
        build_big(p, d, 2, &o);
        assert_int_equal(p->n_stages, 2);
        assert_stage(p, 0, 0, 0, 10);
        assert_stage(p, 1, 1, 10, BIG_LAYER);
        assert_big_fits(p, d, 2, 0);
        assert_true(p->stage[0].expert_bytes == 10 * BIG_X_BYTES);
        bl_plan_free(p);
    }
    /* -dev in the other order: CUDA1 runs the first stage */
    bl_place_opts_t o = opts();
    o.devices = "CUDA1,CUDA0";
    build_big(p, d, 2, &o);
    assert_stage(p, 0, 1, 0, 10);
    assert_stage(p, 1, 0, 10, BIG_LAYER);
    bl_plan_free(p);
}

static void test_plan_two_h200s_uneven_split_moves_experts_off_the_fuller_card(void **state)
{
    (void)state;
    const bl_device_t d[2] = {h200(0), h200(1)};
    bl_place_opts_t o = opts();
    o.tensor_split = "3,1"; /* 15 layers: about 150 GB for a card of 150 */
    bl_plan_t *p = &g_plan;
    build_big(p, d, 2, &o);
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, 0, 0, 15);
    assert_stage(p, 1, 1, 15, BIG_LAYER);
    assert_big_fits(p, d, 2, -1);
    print_message("# -ts 3,1: the experts of %d layers in host RAM\n", p->n_host_layers);
    assert_true(p->n_host_layers >= 1 && p->n_host_layers < 15);
    assert_true(bl_plan_stage_need(&p->stage[0]) + BIG_X_BYTES + MARGIN_DEFAULT > d[0].free_bytes);
    assert_true(p->stage[0].host_expert_bytes == (uint64_t)p->n_host_layers * BIG_X_BYTES);
    assert_true(p->stage[1].host_expert_bytes == 0);
    bl_plan_free(p);
    /* --fit off takes the card's word: the stage does not fit, refused with the sizes */
    o.fit = "off";
    bl_plan_t q;
    bl_err_t err = {0};
    big_model();
    assert_int_equal(bl_plan_build(&q, BIG.g, &BIG.a, d, 2, &o, &err), BL_ENOMEM);
    assert_non_null(strstr(err.msg, "CUDA0"));
}

static void test_plan_two_h200s_main_gpu_takes_the_whole_model(void **state)
{
    (void)state;
    const bl_device_t d[2] = {h200(0), h200(1)};
    bl_place_opts_t o = opts();
    o.split_mode = "none";
    o.main_gpu = 1;
    bl_plan_t *p = &g_plan;
    build_big(p, d, 2, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 1, 0, BIG_LAYER);
    /* 20 layers of about 10 GB on a card of 150: the experts of the first few go,
     * as few as fit (one layer fewer would not) */
    assert_big_fits(p, d, 2, -1);
    print_message("# -sm none -mg 1: the experts of %d layers in host RAM\n", p->n_host_layers);
    assert_true(p->n_host_layers >= 2);
    assert_true(bl_plan_stage_need(&p->stage[0]) + BIG_X_BYTES + MARGIN_DEFAULT > d[1].free_bytes);
    bl_plan_free(p);
}

/* Both cards holding layers (-ts 1,1): routed experts of the first card's layers
 * placed on the other card are refused (an expert tier's card holds no layers); the
 * second card's own layers' experts named for it stay where they are. */
static void test_plan_two_h200s_experts_on_the_other_card_are_refused(void **state)
{
    (void)state;
    const bl_device_t d[2] = {h200(0), h200(1)};
    big_model();
    bl_place_opts_t o = opts();
    o.tensor_split = "1,1";
    const char *ot[1] = {"blk\\.[0-4]\\.ffn_.*_exps=CUDA1"};
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    bl_plan_t q;
    bl_err_t err = {0};
    assert_int_equal(bl_plan_build(&q, BIG.g, &BIG.a, d, 2, &o, &err), BL_ENOTSUP);
    assert_non_null(strstr(err.msg, "and CUDA1 holds layers 10..19"));
    ot[0] = "blk\\.1[5-9]\\.ffn_.*_exps=CUDA1";
    bl_plan_t *p = &g_plan;
    build_big(p, d, 2, &o);
    assert_stage(p, 1, 1, 10, BIG_LAYER);
    assert_true(p->stage[1].expert_bytes == 10 * BIG_X_BYTES);
    assert_int_equal(p->n_host_layers, 0);
    bl_plan_free(p);
}

/* An expert tier on the second card (the layers on CUDA0 with -dev, the experts of
 * layers 0-9 on CUDA1): the stage holds the other layers' experts, the tier those ten,
 * each card within its memory; with --cpu-moe beside it the rest go to host RAM; all
 * twenty layers' experts (about 200 GB) do not fit the tier's card and are refused by
 * name. */
static void test_plan_two_h200s_an_expert_tier_on_the_second_card(void **state)
{
    (void)state;
    const bl_device_t d[2] = {h200(0), h200(1)};
    big_model();
    bl_place_opts_t o = opts();
    o.devices = "CUDA0";
    const char *ot[1] = {"blk\\.[0-9]\\.ffn_.*_exps=CUDA1"};
    o.override_tensor = ot;
    o.n_override_tensor = 1;
    bl_plan_t *p = &g_plan;
    build_big(p, d, 2, &o);
    assert_int_equal(p->n_stages, 1);
    assert_stage(p, 0, 0, 0, BIG_LAYER);
    assert_int_equal(p->n_tiers, 1);
    assert_int_equal(p->tier[0].device, 1);
    assert_string_equal(p->tier[0].card.name, "NVIDIA H200");
    assert_int_equal(p->tier[0].n_layers, 10);
    assert_true(p->tier[0].expert_bytes == 10 * BIG_X_BYTES);
    assert_true(p->tier[0].scratch_bytes > 0);
    assert_true(p->stage[0].expert_bytes == 10 * BIG_X_BYTES);
    assert_true(p->stage[0].host_expert_bytes == 0);
    for (int64_t l = 0; l < BIG_LAYER; l++)
        assert_int_equal(p->tier_of[l], l < 10 ? 1 : 0);
    assert_int_equal(p->n_host_layers, 0);
    assert_int_equal(p->hosttier, 0);
    assert_int_equal(bl_plan_stage_fit(p, 0), BL_PLAN_FITS);
    char text[4096];
    bl_plan_format(p, text, sizeof text);
    assert_non_null(strstr(text, "expert tier 0: routed experts of 10 layers on CUDA1 (NVIDIA H200)"));
    bl_plan_free(p);

    o.cpu_moe = 1; /* -ot first: layers 0-9 on the tier, 10-19 in host RAM */
    build_big(p, d, 2, &o);
    assert_int_equal(p->n_tiers, 1);
    assert_int_equal(p->tier[0].n_layers, 10);
    assert_int_equal(p->n_host_layers, 10);
    assert_true(p->stage[0].expert_bytes == 0);
    assert_true(p->stage[0].host_expert_bytes == 10 * BIG_X_BYTES);
    for (int64_t l = 0; l < BIG_LAYER; l++)
        assert_int_equal(bl_plan_layer_host(p, l), l >= 10);
    bl_plan_free(p);

    o.cpu_moe = 0;
    ot[0] = "ffn_.*_exps=CUDA1";
    bl_plan_t q;
    bl_err_t err = {0};
    assert_int_equal(bl_plan_build(&q, BIG.g, &BIG.a, d, 2, &o, &err), BL_ENOMEM);
    assert_non_null(strstr(err.msg, "the routed experts of 20 layers on CUDA1 (an expert tier)"));
}

/* --- a DGX Spark pair: a card on each of two hosts ------------------------------------ */

/* GB10's 128 GB of memory, shared with its CPU; the free memory a node reports */
static bl_device_t gb10(void)
{
    bl_device_t d = {.index = 0, .total_bytes = 128 * GIB_BYTES, .free_bytes = 130000000000ull};
    snprintf(d.name, sizeof d.name, "NVIDIA GB10");
    return d;
}

static void test_plan_spark_pair_splits_a_model_larger_than_one(void **state)
{
    (void)state;
    bl_device_t a = gb10(), b = gb10();
    bl_stage_host_t h[2] = {card_host("spark-a", &a), card_host("spark-b", &b)};
    h[0].remote = 0; /* the router's host */
    big_model();
    struct stat st;
    assert_int_equal(stat(BIG.path, &st), 0);
    assert_true((uint64_t)st.st_size > a.free_bytes && (uint64_t)st.st_size < 2 * a.free_bytes);
    bl_place_opts_t o = opts();
    o.hosts = h;
    o.n_hosts = 2;
    bl_plan_t *p = &g_plan;
    build_big(p, NULL, 0, &o);
    assert_int_equal(p->n_stages, 2);
    assert_stage(p, 0, 0, 0, 10);
    assert_stage(p, 1, 0, 10, BIG_LAYER);
    for (int i = 0; i < 2; i++) {
        assert_string_equal(p->stage[i].card.name, "NVIDIA GB10");
        assert_int_equal(bl_plan_stage_fit(p, i), BL_PLAN_FITS);
    }
    assert_int_equal(p->n_host_layers, 0);
    assert_int_equal(p->hosttier, 0);
    bl_plan_free(p);

    /* less free on spark-b: spark-a takes more of the layers, both within their cards */
    b.free_bytes = 100000000000ull;
    build_big(p, NULL, 0, &o);
    assert_true(p->stage[0].le > 10);
    for (int i = 0; i < 2; i++)
        assert_int_equal(bl_plan_stage_fit(p, i), BL_PLAN_FITS);
    bl_plan_free(p);
    b = gb10();

    /* one Spark alone: refused with the card, the host and the bytes */
    bl_plan_t q;
    bl_err_t err = {0};
    o.n_hosts = 1;
    assert_int_equal(bl_plan_build(&q, BIG.g, &BIG.a, NULL, 0, &o, &err), BL_ENOMEM);
    assert_non_null(strstr(err.msg, "CUDA0 (NVIDIA GB10) of spark-a has room for"));
    assert_non_null(strstr(err.msg, " bytes: its 121.07 GiB free less the -fitt margin and the scratch) and its stage "
                                    "needs"));
    /* layers= that put 15 of 20 layers on spark-a: refused, not changed */
    o.n_hosts = 2;
    const int64_t ends[2] = {15, BIG_LAYER};
    o.stage_ends = ends;
    assert_int_equal(bl_plan_build(&q, BIG.g, &BIG.a, NULL, 0, &o, &err), BL_ENOMEM);
    assert_non_null(strstr(err.msg, "plan: layers 0..14 on CUDA0 (NVIDIA GB10) of spark-a need"));
    assert_non_null(strstr(err.msg, "free, 130000000000 bytes"));
}

/* Each test with the teardown that frees what a failed assertion left. */
#define T(f) cmocka_unit_test_teardown(f, free_plan)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_plan_no_devices_is_one_cpu_stage),
        T(test_plan_cpu_stages_split_layers_earlier_take_the_remainder),
        T(test_plan_stage_ends_given),
        T(test_plan_split_cpu_follows_the_threads),
        T(test_plan_split_cpu_caps_threads_by_the_hosts_cpus),
        T(test_plan_split_cpu_gives_every_stage_a_layer),
        T(test_plan_split_cpu_keeps_each_host_within_its_memory),
        T(test_plan_split_cpu_refuses_what_no_split_fits),
        T(test_plan_cpu_hosts_split_the_cpu_stages),
        T(test_plan_split_hosts_weighs_a_card_as_many_threads),
        T(test_plan_split_follows_measured_read_rates),
        T(test_plan_split_hosts_keeps_each_card_within_its_room),
        T(test_plan_split_hosts_refuses_a_card_by_host_and_bytes),
        T(test_plan_split_hosts_holds_its_rules_on_many_inventories),
        T(test_plan_hosts_put_a_card_line_on_its_card),
        T(test_plan_hosts_layers_given_on_cards),
        T(test_plan_hosts_expert_flags_and_card_flags),
        T(test_plan_hosts_a_hosttier_of_another_host),
        T(test_plan_one_device_defaults_put_every_layer_on_the_card),
        T(test_plan_free_memory_not_known_is_not_checked),
        T(test_plan_ngl_zero_puts_every_layer_on_the_cpu),
        T(test_plan_ngl_puts_the_last_layers_on_the_card),
        T(test_plan_ngl_all_forms_put_every_layer_on_the_card),
        T(test_plan_ngl_garbage_is_refused),
        T(test_plan_cpu_moe_with_a_card_puts_every_layer_in_host_ram),
        T(test_plan_cpu_moe_hosts_only_the_card_layers),
        T(test_plan_cpu_moe_without_a_card_keeps_experts_in_the_cpu_worker),
        T(test_plan_experts_ram_budget),
        T(test_plan_ncmoe_hosts_the_first_layers),
        T(test_plan_ncmoe_of_every_layer_hosts_them_all),
        T(test_plan_ncmoe_above_the_layer_count_is_refused),
        T(test_plan_ot_cpu_hosts_the_card_layers_it_names),
        T(test_plan_ot_hosttier_on_a_cpu_plan_uses_the_hosttier),
        T(test_plan_ot_cpu_on_a_cpu_stage_changes_nothing),
        T(test_plan_ot_pattern_matching_nothing_is_refused),
        T(test_plan_ot_bad_regex_is_refused),
        T(test_plan_ot_malformed_items_are_refused),
        T(test_plan_ot_missing_cuda_device_is_refused),
        T(test_plan_ot_splitting_a_layers_experts_is_refused),
        T(test_plan_ot_moving_a_dense_tensor_is_refused),
        T(test_plan_ot_dense_tensor_on_its_own_stage_is_accepted),
        T(test_plan_ot_card_for_experts_of_a_cpu_stage_is_refused),
        T(test_plan_ot_comes_before_cpu_moe),
        T(test_plan_ot_comes_before_ncmoe),
        T(test_plan_ot_first_pattern_decides),
        T(test_plan_ot_takes_comma_separated_items),
        T(test_plan_ot_splits_an_item_at_its_last_equals),
        T(test_plan_dev_none_is_the_cpu),
        T(test_plan_dev_selects_the_named_devices),
        T(test_plan_dev_refusals),
        T(test_plan_sm_row_is_refused),
        T(test_plan_sm_none_uses_the_main_gpu_only),
        T(test_plan_mg_out_of_range_is_refused),
        T(test_plan_ts_splits_layers_by_proportion),
        T(test_plan_ts_refusals),
        T(test_plan_default_split_follows_free_memory),
        T(test_plan_fit_moves_the_experts_of_as_few_leading_layers_as_needed),
        T(test_plan_fit_target_raised_moves_more_layers),
        T(test_plan_fit_off_refuses_a_card_too_small_with_the_sizes),
        T(test_plan_fit_moves_leading_layers_to_the_cpu_when_the_dense_part_does_not_fit),
        T(test_plan_fit_with_a_card_that_holds_nothing_is_the_cpu),
        T(test_plan_fit_never_returns_a_card_over_its_memory),
        T(test_plan_fit_garbage_is_refused),
        T(test_plan_explicit_ngl_keeps_the_experts_on_the_card),
        T(test_plan_dense_model_takes_cpu_moe_and_changes_nothing),
        T(test_plan_dense_model_ffn_tensor_stays_with_its_layer),
        T(test_plan_tied_head_counts_token_embd_once),
        T(test_plan_model_bytes_by_role_and_type),
        T(test_plan_format_names_each_stage_and_the_host_ram),
        T(test_plan_format_reports_fit),
        T(test_plan_free_is_safe_after_a_failed_build_and_twice),
        T(test_plan_allocation_failure_is_enomem),
        T(test_plan_args_carry_the_residency_flags),
        T(test_plan_two_h200s_split_a_model_larger_than_one),
        T(test_plan_two_h200s_uneven_split_moves_experts_off_the_fuller_card),
        T(test_plan_two_h200s_main_gpu_takes_the_whole_model),
        T(test_plan_two_h200s_experts_on_the_other_card_are_refused),
        T(test_plan_two_h200s_an_expert_tier_on_the_second_card),
        T(test_plan_spark_pair_splits_a_model_larger_than_one),
    };
    return cmocka_run_group_tests(tests, models_setup, models_teardown);
}
