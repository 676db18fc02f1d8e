/* The CPU backend's ops (matmul, rms_norm, rope, attention, MoE routing, SwiGLU,
 * KV stores), the thread pool that splits them, the op context that owns their
 * scratch, and the one-time choice of kernel set. Matmuls run one product or a
 * group of them (kcpu_matmul_many) per pair of pool calls; a batch of K-quant rows
 * goes through unpacked weight tiles. The dot kernels themselves are in vec_dot.c
 * (scalar references), vec_dot_avx2.c, vec_dot_q16_avx2.c and vec_dot_q16_avx512.c. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "blocks.h"
#include "kcpu.h"
#include "kcpu_impl.h"
#include "quant.h"

// --- kernel sets and dispatch ----------------------------------------------------------

static const kcpu_kernels_t kernels_ref = {
    .name = "ref",
    .dot_f32_f32 = kcpu_vec_dot_f32_f32_ref,
    .dot_f16_f32 = kcpu_vec_dot_f16_f32_ref,
    .dot_q8_0_q8_0 = kcpu_vec_dot_q8_0_q8_0_ref,
    .dot_q4_0_q8_0 = kcpu_vec_dot_q4_0_q8_0_ref,
    .dot_mxfp4_q8_0 = kcpu_vec_dot_mxfp4_q8_0_ref,
    .dot_q4_K_q8_K = kcpu_vec_dot_q4_K_q8_K_ref,
    .dot_q5_K_q8_K = kcpu_vec_dot_q5_K_q8_K_ref,
    .dot_q6_K_q8_K = kcpu_vec_dot_q6_K_q8_K_ref,
    .dot2_q4_K_q8_K = kcpu_vec_dot2_q4_K_q8_K_ref,
    .dot2_q5_K_q8_K = kcpu_vec_dot2_q5_K_q8_K_ref,
    .dot2_q6_K_q8_K = kcpu_vec_dot2_q6_K_q8_K_ref,
    .dotp_q8_0_q8_0 = kcpu_vec_dotp_q8_0_q8_0_ref,
    .dotp_mxfp4_q8_0 = kcpu_vec_dotp_mxfp4_q8_0_ref,
    .axpy_f32 = kcpu_axpy_f32_ref,
    .axpy_f16 = kcpu_axpy_f16_ref,
    .quantize_q16_K = kcpu_quantize_row_q16_K_ref,
    .quantize_q16_0 = kcpu_quantize_row_q16_0_ref,
    .dotn_q8_0_q16_0 = kcpu_vec_dotn_q8_0_q16_0_ref,
    .dotn_q4_0_q16_0 = kcpu_vec_dotn_q4_0_q16_0_ref,
    .dotn_mxfp4_q16_0 = kcpu_vec_dotn_mxfp4_q16_0_ref,
    .dot_q4_K_q16_K = kcpu_vec_dot_q4_K_q16_K_ref,
    .dot_q5_K_q16_K = kcpu_vec_dot_q5_K_q16_K_ref,
    .dot_q6_K_q16_K = kcpu_vec_dot_q6_K_q16_K_ref,
    .exp_sub = kcpu_exp_sub_ref,
    .top1 = kcpu_row_top1_ref,
    .att_qk_f16 = kcpu_att_qk_f16_ref,
    .att_pv_f16 = kcpu_att_pv_f16_ref,
};

static const kcpu_kernels_t kernels_avx2 = {
    .name = "avx2",
    .dot_f32_f32 = kcpu_vec_dot_f32_f32_avx2,
    .dot_f16_f32 = kcpu_vec_dot_f16_f32_avx2,
    .dot_q8_0_q8_0 = kcpu_vec_dot_q8_0_q8_0_avx2,
    .dot_q4_0_q8_0 = kcpu_vec_dot_q4_0_q8_0_avx2,
    .dot_mxfp4_q8_0 = kcpu_vec_dot_mxfp4_q8_0_avx2,
    .dot_q4_K_q8_K = kcpu_vec_dot_q4_K_q8_K_avx2,
    .dot_q5_K_q8_K = kcpu_vec_dot_q5_K_q8_K_avx2,
    .dot_q6_K_q8_K = kcpu_vec_dot_q6_K_q8_K_avx2,
    .dot2_q4_K_q8_K = kcpu_vec_dot2_q4_K_q8_K_avx2,
    .dot2_q5_K_q8_K = kcpu_vec_dot2_q5_K_q8_K_avx2,
    .dot2_q6_K_q8_K = kcpu_vec_dot2_q6_K_q8_K_avx2,
    .dotp_q8_0_q8_0 = kcpu_vec_dotp_q8_0_q8_0_avx2,
    .dotp_mxfp4_q8_0 = kcpu_vec_dotp_mxfp4_q8_0_avx2,
    .axpy_f32 = kcpu_axpy_f32_avx2,
    .axpy_f16 = kcpu_axpy_f16_avx2,
    .unpack_q4_K = kcpu_unpack_q4_K_avx2,
    .unpack_q5_K = kcpu_unpack_q5_K_avx2,
    .unpack_q6_K = kcpu_unpack_q6_K_avx2,
    .dotu_q4_K_q8_K = kcpu_vec_dotu_q4_K_q8_K_avx2,
    .dotu_q5_K_q8_K = kcpu_vec_dotu_q5_K_q8_K_avx2,
    .dotu_q6_K_q8_K = kcpu_vec_dotu_q6_K_q8_K_avx2,
    .dotu2_q4_K_q8_K = kcpu_vec_dotu2_q4_K_q8_K_avx2,
    .dotu2_q5_K_q8_K = kcpu_vec_dotu2_q5_K_q8_K_avx2,
    .dotu2_q6_K_q8_K = kcpu_vec_dotu2_q6_K_q8_K_avx2,
    .quantize_q16_K = kcpu_quantize_row_q16_K_avx2,
    .quantize_q16_0 = kcpu_quantize_row_q16_0_avx2,
    .dotn_q8_0_q16_0 = kcpu_vec_dotn_q8_0_q16_0_avx2,
    .dotn_q4_0_q16_0 = kcpu_vec_dotn_q4_0_q16_0_avx2,
    .dotn_mxfp4_q16_0 = kcpu_vec_dotn_mxfp4_q16_0_avx2,
    .dot_q4_K_q16_K = kcpu_vec_dot_q4_K_q16_K_avx2,
    .dot_q5_K_q16_K = kcpu_vec_dot_q5_K_q16_K_avx2,
    .dot_q6_K_q16_K = kcpu_vec_dot_q6_K_q16_K_avx2,
    .unpack16_q4_K = kcpu_unpack16_q4_K_avx2,
    .unpack16_q5_K = kcpu_unpack16_q5_K_avx2,
    .unpack16_q6_K = kcpu_unpack16_q6_K_avx2,
    .gemm16 = kcpu_gemm_u16_q16_K_avx2,
    .exp_sub = kcpu_exp_sub_avx2,
    .top1 = kcpu_row_top1_avx2,
    .att_qk_f16 = kcpu_att_qk_f16_avx2,
    .att_pv_f16 = kcpu_att_pv_f16_avx2,
};

const kcpu_kernels_t *kcpu__k = &kernels_ref;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

int kcpu_have_avx2(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* F16C from CPUID leaf 1 (ECX bit 29) directly: clang 14's
     * __builtin_cpu_supports does not know the "f16c" name. */
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29)))
        return 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

int kcpu_have_avx512(void)
{
#if defined(__x86_64__)
    if (!kcpu_have_avx2())
        return 0;
    unsigned a, b, c, d;
    /* OSXSAVE, then XCR0: the OS saves the SSE, AVX, opmask and both ZMM states */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)))
        return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6) != 0xe6)
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    const unsigned f = 1u << 16, bw = 1u << 30, vl = 1u << 31, vnni = 1u << 11;
    return (b & (f | bw | vl)) == (f | bw | vl) && (c & vnni);
#else
    return 0;
#endif
}

/* The avx2 set with the 16-bit activation dots, the multi-row dots, the batch tile
 * and the q8_0 and mxfp4 dots in AVX-512 (the same bits), filled once by
 * init_kernels. */
static kcpu_kernels_t kernels_avx512;

/* The default is the widest set the CPU runs: avx512, else avx2, else ref.
 * BLOOMERY_CPU_KERNELS=ref|avx2|avx512 forces a set (to rule a SIMD kernel in or
 * out when chasing a numeric difference, or to compare speeds); a set the CPU lacks
 * falls back to the default. On the H200's 16-core Xeon host (docs/performance.md,
 * 2026-12-03) avx512 streamed routed experts at 94.6 GB/s against avx2's 81.9 for
 * one row, 69.5 against 30.2 for two, and decoded and prompted faster on the CPU
 * (tg64 28.1 / 29.0 against 26.4 / 26.2, pp512 94.3 against 85.5). */
static void init_kernels(void)
{
    kernels_avx512 = kernels_avx2;
    kernels_avx512.name = "avx512";
    kernels_avx512.dot_q4_K_q16_K = kcpu_vec_dot_q4_K_q16_K_avx512;
    kernels_avx512.dot_q5_K_q16_K = kcpu_vec_dot_q5_K_q16_K_avx512;
    kernels_avx512.dot_q6_K_q16_K = kcpu_vec_dot_q6_K_q16_K_avx512;
    kernels_avx512.gemm16 = kcpu_gemm_u16_q16_K_avx512;
    kernels_avx512.dot_q8_0_q8_0 = kcpu_vec_dot_q8_0_q8_0_avx512;
    kernels_avx512.dot_mxfp4_q8_0 = kcpu_vec_dot_mxfp4_q8_0_avx512;
    kernels_avx512.dotp_q8_0_q8_0 = kcpu_vec_dotp_q8_0_q8_0_avx512;
    kernels_avx512.dotp_mxfp4_q8_0 = kcpu_vec_dotp_mxfp4_q8_0_avx512;
    kernels_avx512.dotn_q4_K_q16_K = kcpu_vec_dotn_q4_K_q16_K_avx512;
    kernels_avx512.dotn_q5_K_q16_K = kcpu_vec_dotn_q5_K_q16_K_avx512;
    kernels_avx512.dotn_q6_K_q16_K = kcpu_vec_dotn_q6_K_q16_K_avx512;
    kernels_avx512.dotu2_q4_K_q8_K = kcpu_vec_dotu2_q4_K_q8_K_avx512;
    kernels_avx512.dotu2_q5_K_q8_K = kcpu_vec_dotu2_q5_K_q8_K_avx512;
    kernels_avx512.dotu2_q6_K_q8_K = kcpu_vec_dotu2_q6_K_q8_K_avx512;
    const char *force = getenv("BLOOMERY_CPU_KERNELS");
    kcpu__k = kcpu_have_avx512() ? &kernels_avx512 : kcpu_have_avx2() ? &kernels_avx2 : &kernels_ref;
    if (force && strcmp(force, "ref") == 0)
        kcpu__k = &kernels_ref;
    else if (force && strcmp(force, "avx2") == 0 && kcpu_have_avx2())
        kcpu__k = &kernels_avx2;
}

const char *kcpu_init(void)
{
    pthread_once(&init_once, init_kernels);
    return kcpu__k->name;
}

int kcpu_select(const char *name)
{
    (void)kcpu_init(); /* later kcpu_init calls must not undo the choice */
    if (strcmp(name, "ref") == 0) {
        kcpu__k = &kernels_ref;
        return 0;
    }
    if (strcmp(name, "avx2") == 0 || strcmp(name, "avx512") == 0) {
        const int wide = strcmp(name, "avx512") == 0;
        if (!(wide ? kcpu_have_avx512() : kcpu_have_avx2()))
            return BL_ENOTSUP;
        kcpu__k = wide ? &kernels_avx512 : &kernels_avx2;
        return 0;
    }
    return BL_EINVAL;
}

const char *kcpu_variant_name(void) { return kcpu__k->name; }

int64_t kcpu_row_top1(const float *x, int64_t n, float *p)
{
    (void)kcpu_init(); /* the router calls it with no kernel context */
    return kcpu__k->top1(x, n, p);
}

int kcpu_act_type(uint32_t t)
{
    switch (t) {
    case BL_TYPE_Q8_0:
    case BL_TYPE_Q4_0:
    case BL_TYPE_MXFP4:
        return BL_TYPE_Q8_0;
    case BL_TYPE_Q4_K:
    case BL_TYPE_Q5_K:
    case BL_TYPE_Q6_K:
        return BL_TYPE_Q8_K;
    default:
        return -1;
    }
}

static kcpu_dot2_fn int_dot2(uint32_t t)
{
    switch (t) {
    case BL_TYPE_Q4_K: return kcpu__k->dot2_q4_K_q8_K;
    case BL_TYPE_Q5_K: return kcpu__k->dot2_q5_K_q8_K;
    case BL_TYPE_Q6_K: return kcpu__k->dot2_q6_K_q8_K;
    default: return NULL;
    }
}

/* The pair dot of a batch's rows, or NULL (a type without one). */
static kcpu_dotp_fn int_dotp(uint32_t t)
{
    switch (t) {
    case BL_TYPE_Q8_0: return kcpu__k->dotp_q8_0_q8_0;
    case BL_TYPE_MXFP4: return kcpu__k->dotp_mxfp4_q8_0;
    default: return NULL;
    }
}

static kcpu_dot_fn int_dot(uint32_t t)
{
    switch (t) {
    case BL_TYPE_Q8_0: return kcpu__k->dot_q8_0_q8_0;
    case BL_TYPE_Q4_0: return kcpu__k->dot_q4_0_q8_0;
    case BL_TYPE_MXFP4: return kcpu__k->dot_mxfp4_q8_0;
    case BL_TYPE_Q4_K: return kcpu__k->dot_q4_K_q8_K;
    case BL_TYPE_Q5_K: return kcpu__k->dot_q5_K_q8_K;
    case BL_TYPE_Q6_K: return kcpu__k->dot_q6_K_q8_K;
    default: return NULL;
    }
}

/* The fast path's activation kind for matrix w in a context of act_terms: the
 * public kcpu_act_type, except that in KCPU_FAST16 (act_terms 2) K-quants take one
 * 16-bit q16_K term (KCPU__ACT_Q16_K) instead of two q8_K rows unless w->act_q8,
 * and q8_0, q4_0 and mxfp4 one q16_0 term (KCPU__ACT_Q16_0) instead of two q8_0
 * rows (faster at every row count, one row included: no act_q8 exception). */
#define KCPU__ACT_Q16_K 0x10016
#define KCPU__ACT_Q16_0 0x10017

static int act_kind(int act_terms, const kcpu_mat_t *w)
{
    const int a = kcpu_act_type(w->type);
    if (act_terms != 2)
        return a;
    if (a == BL_TYPE_Q8_K)
        return w->act_q8 ? a : KCPU__ACT_Q16_K;
    return a == BL_TYPE_Q8_0 ? KCPU__ACT_Q16_0 : a;
}

static kcpu_dotn16_0_fn int_dotn16_0(uint32_t t)
{
    switch (t) {
    case BL_TYPE_Q8_0: return kcpu__k->dotn_q8_0_q16_0;
    case BL_TYPE_Q4_0: return kcpu__k->dotn_q4_0_q16_0;
    case BL_TYPE_MXFP4: return kcpu__k->dotn_mxfp4_q16_0;
    default: return NULL;
    }
}

static kcpu_dot_fn int_dot16(uint32_t t)
{
    switch (t) {
    case BL_TYPE_Q4_K: return kcpu__k->dot_q4_K_q16_K;
    case BL_TYPE_Q5_K: return kcpu__k->dot_q5_K_q16_K;
    case BL_TYPE_Q6_K: return kcpu__k->dot_q6_K_q16_K;
    default: return NULL;
    }
}

static kcpu_dotn16_fn int_dotn16(uint32_t t)
{
    switch (t) {
    case BL_TYPE_Q4_K: return kcpu__k->dotn_q4_K_q16_K;
    case BL_TYPE_Q5_K: return kcpu__k->dotn_q5_K_q16_K;
    case BL_TYPE_Q6_K: return kcpu__k->dotn_q6_K_q16_K;
    default: return NULL;
    }
}

static kcpu_unpack16_fn int_unpack16(uint32_t t)
{
    switch (t) {
    case BL_TYPE_Q4_K: return kcpu__k->unpack16_q4_K;
    case BL_TYPE_Q5_K: return kcpu__k->unpack16_q5_K;
    case BL_TYPE_Q6_K: return kcpu__k->unpack16_q6_K;
    default: return NULL;
    }
}

/* The unpacker and unpacked dot for weight type t, or NULL (no batched kernel). */
static kcpu_dotu_fn int_dotu(uint32_t t, kcpu_unpack_fn *unpack, kcpu_dotu2_fn *dotu2)
{
    switch (t) {
    case BL_TYPE_Q4_K:
        *unpack = kcpu__k->unpack_q4_K;
        *dotu2 = kcpu__k->dotu2_q4_K_q8_K;
        return kcpu__k->dotu_q4_K_q8_K;
    case BL_TYPE_Q5_K:
        *unpack = kcpu__k->unpack_q5_K;
        *dotu2 = kcpu__k->dotu2_q5_K_q8_K;
        return kcpu__k->dotu_q5_K_q8_K;
    case BL_TYPE_Q6_K:
        *unpack = kcpu__k->unpack_q6_K;
        *dotu2 = kcpu__k->dotu2_q6_K_q8_K;
        return kcpu__k->dotu_q6_K_q8_K;
    default:
        *unpack = NULL;
        *dotu2 = NULL;
        return NULL;
    }
}

// --- thread pool -------------------------------------------------------------------------

typedef struct pool_thread {
    struct kcpu_pool *pool;
    int ith;
} pool_thread_t;

/* Waits spin this many pauses (a few microseconds) before sleeping: a decode step
 * runs small ops back to back and a futex wake costs about as much as one, but a
 * long spin starves the other threads when the machine has more runnable threads
 * than cores (measured: 2 threads on 2 loaded cores fell from 82 to 9 tok/s with a
 * spin of 4096). */
#define POOL_SPIN 256

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

/* Then, for 4 us per poll level (kcpu_pool_set_poll, llama.cpp's --poll; 200 us by
 * default), they yield instead of pausing before they sleep: a core with nothing
 * else to run comes straight back, one with other runnable threads is given to them.
 * A hybrid decode step calls the host's pool a few times per layer with the card's
 * work in between (tens of microseconds), longer than the pause spin, and a futex
 * wake of every helper costs about as much again (measured on the H200's host,
 * --cpu-moe tg128: 31.5 tok/s at level 0, 39.6 at 50, 40.6 at 250 us). */
#define POOL_YIELD_US_PER_LEVEL 4

static uint64_t pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins on done(arg) for POOL_SPIN pauses, then yields until yield_us passed:
 * whether done() became true. */
static int pool_spin(int (*done)(void *), void *arg, uint32_t yield_us)
{
    for (int i = 0; i < POOL_SPIN; i++) {
        if (done(arg))
            return 1;
        cpu_relax();
    }
    if (yield_us == 0)
        return done(arg);
    const uint64_t end = pool_now_ns() + (uint64_t)yield_us * 1000u;
    do {
        if (done(arg))
            return 1;
        sched_yield();
    } while (pool_now_ns() < end);
    return done(arg);
}

/* The caller is thread 0. A task starts when the caller bumps gen (release, after
 * writing fn and ctx, so a helper that sees the new gen sees them too); helpers spin
 * on gen, then sleep on cv_go. Each helper decrements pending when done (release, so
 * the caller sees its results); the caller spins on pending, then sleeps on cv_done.
 * Both condition variables are signalled under mu, and sleepers re-check under mu,
 * so no wake-up is lost. */
struct kcpu_pool {
    int n;
    int active;         /* threads a run uses, 1..n (kcpu_pool_set_active); the owner's */
    int run_nth;        /* the current run's: published before gen moves */
    pthread_t *th;      /* (n - 1) helpers */
    pool_thread_t *arg; /* (n - 1) */
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    _Atomic uint64_t gen;
    _Atomic int pending;
    _Atomic int stop;
    _Atomic uint32_t yield_us; /* pool_spin's; helpers read it while they wait */
    kcpu_task_fn fn;
    void *ctx;
};

struct go_wait {
    struct kcpu_pool *pool;
    uint64_t seen;
};

static int go_or_stop(void *arg)
{
    const struct go_wait *w = arg;
    return atomic_load_explicit(&w->pool->gen, memory_order_acquire) != w->seen ||
           atomic_load_explicit(&w->pool->stop, memory_order_relaxed);
}

static int none_pending(void *arg)
{
    return atomic_load_explicit(&((struct kcpu_pool *)arg)->pending, memory_order_acquire) == 0;
}

static void *pool_main(void *p)
{
    pool_thread_t *t = p;
    struct kcpu_pool *pool = t->pool;
    uint64_t seen = 0;
    for (;;) {
        struct go_wait gw = {pool, seen};
        if (!pool_spin(go_or_stop, &gw, atomic_load_explicit(&pool->yield_us, memory_order_relaxed))) {
            pthread_mutex_lock(&pool->mu);
            while (atomic_load_explicit(&pool->gen, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&pool->stop, memory_order_relaxed))
                pthread_cond_wait(&pool->cv_go, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load_explicit(&pool->stop, memory_order_relaxed))
            break;
        seen = atomic_load_explicit(&pool->gen, memory_order_acquire);
        if (t->ith >= pool->run_nth) /* not in this run: pending does not count it */
            continue;
        pool->fn(pool->ctx, t->ith, pool->run_nth);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->mu);
            pthread_cond_signal(&pool->cv_done);
            pthread_mutex_unlock(&pool->mu);
        }
    }
    return NULL;
}

int kcpu_pool_create(kcpu_pool_t **out, int n_threads, bl_err_t *err)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 256)
        return bl_err_set(err, BL_ERANGE, "n_threads %d is outside 1..256", n_threads);
    kcpu_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return bl_err_set(err, BL_ENOMEM, "out of memory for a thread pool");
    p->n = p->active = n_threads;
    atomic_store_explicit(&p->yield_us, KCPU_POLL_DEFAULT * POOL_YIELD_US_PER_LEVEL, memory_order_relaxed);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_go, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->th = calloc((size_t)n_threads - 1, sizeof *p->th);
        p->arg = calloc((size_t)n_threads - 1, sizeof *p->arg);
        if (!p->th || !p->arg) {
            kcpu_pool_destroy(p);
            return bl_err_set(err, BL_ENOMEM, "out of memory for a thread pool");
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        p->arg[i].pool = p;
        p->arg[i].ith = i + 1;
        if (pthread_create(&p->th[i], NULL, pool_main, &p->arg[i]) != 0) {
            kcpu_pool_destroy(p);
            return bl_err_set(err, BL_ENOMEM, "could not start pool thread %d of %d", i + 1,
                              n_threads);
        }
        p->n_started++;
    }
    *out = p;
    return 0;
}

void kcpu_pool_destroy(kcpu_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->cv_go);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p->arg);
    free(p);
}

int kcpu_pool_n_threads(const kcpu_pool_t *p) { return p->active; }

int kcpu_pool_pin_strict(kcpu_pool_t *p, bl_err_t *err)
{
    cpu_set_t all;
    CPU_ZERO(&all);
    if (pthread_getaffinity_np(pthread_self(), sizeof all, &all) != 0 || CPU_COUNT(&all) == 0)
        return bl_err_set(err, BL_EIO, "--cpu-strict: the CPUs this thread may run on could not be read");
    int cpus[CPU_SETSIZE], nc = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all))
            cpus[nc++] = c;
    for (int i = 0; i < p->n; i++) {
        if (i > 0 && i - 1 >= p->n_started)
            break;
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[i % nc], &one);
        const int rc = pthread_setaffinity_np(i == 0 ? pthread_self() : p->th[i - 1], sizeof one, &one);
        if (rc != 0)
            return bl_err_set(err, BL_EIO, "--cpu-strict: pinning thread %d to CPU %d: %s", i, cpus[i % nc],
                              strerror(rc));
    }
    return 0;
}

void kcpu_pool_set_poll(kcpu_pool_t *p, int level)
{
    level = level < 0 ? 0 : level > 100 ? 100 : level;
    atomic_store_explicit(&p->yield_us, (uint32_t)level * POOL_YIELD_US_PER_LEVEL, memory_order_relaxed);
}

int kcpu_pool_set_active(kcpu_pool_t *p, int n)
{
    const int old = p->active;
    p->active = n < 1 ? 1 : n > p->n ? p->n : n;
    return old;
}

void kcpu_pool_run(kcpu_pool_t *p, kcpu_task_fn fn, void *ctx)
{
    if (p->active == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->run_nth = p->active;
    atomic_store_explicit(&p->pending, p->run_nth - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_go);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->run_nth);
    if (pool_spin(none_pending, p, atomic_load_explicit(&p->yield_us, memory_order_relaxed)))
        return;
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* Thread ith's share [*lo, *hi) of n items: contiguous, fixed by (n, ith, nth). */
static void split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi)
{
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

// --- matrices and context ------------------------------------------------------------------

int kcpu_mat_init(kcpu_mat_t *m, const void *data, uint32_t type, int64_t ncols, int64_t nrows,
                  bl_err_t *err)
{
    size_t rb;
    int rc = bl_row_bytes(type, ncols, &rb, err);
    if (rc < 0)
        return rc;
    m->data = data;
    m->type = type;
    m->ncols = ncols;
    m->nrows = nrows;
    m->row_bytes = rb;
    m->precise = 0;
    m->act_q8 = 0;
    return 0;
}

kcpu_mat_t kcpu_mat_rows(const kcpu_mat_t *m, int64_t r0, int64_t n)
{
    kcpu_mat_t s = *m;
    s.data = (const uint8_t *)m->data + (size_t)r0 * m->row_bytes;
    s.nrows = n;
    return s;
}

/* Query heads of one KV head attended together over an f16 cache. */
#define ATT_GROUP 8
/* The split attention's partials (att_rows_f16_split): 4 MiB, a decode row of
 * 32768 positions with 4 KV heads of 8 query heads of 128 */
#define ATT_SPLIT_FLOATS ((int64_t)1 << 20)

/* Weight rows dequantized per tile in the precise path: small enough to stay in
 * L1/L2 while every activation row of the batch passes over them. */
#define MM_TILE 16

/* Weight rows unpacked together in a batched integer matmul, and activation rows
 * per pass over them: the unpacked tile (MM_UROWS rows, 2.2 bytes per weight) stays
 * in L1 while the pass's quantized activation rows (4.6 KB per 2048 columns with two
 * terms) stay in L2, so each weight block is decoded once per MM_UBATCH rows. */
#define MM_UROWS 4
#define MM_UBATCH 64

/* Weight rows per unpacked q16_K tile: 16 rows of 2048 columns are 74 KB, in L2,
 * while each group of 4 activation rows (18 KB) stays in L1 as the tile's row
 * pairs pass over it. */
#define MM_U16ROWS 16

/* The smallest chunk of weight rows a thread takes where no tile is unpacked. */
#define MM_DECODE_CHUNK 4

/* Most rows per product that take the packed multi-row dot (where the set has one)
 * rather than the unpacked tile: on a 2-core EPYC (bench --kernels, q4_K, 2026-12-03)
 * the multi-row dot streamed 24.8 / 15.6 / 8.7 GB/s of weights at 2 / 4 / 8 rows
 * where the tile managed 9.6 / 8.3 / 5.9, and 3.2 against 3.5 at 16. */
#define MM_DOTN_ROWS 8

struct kcpu_ctx {
    kcpu_pool_t *pool;
    int precise;
    int act_terms;        /* fast path: 1 or 2 q8 terms per activation row */
    kcpu_limits_t lim;
    void *actq;           /* (max_batch, act_terms, act_row_bytes) quantized activations */
    size_t act_row_bytes; /* q8_K bytes of max_cols, which also covers q8_0 */
    float *deq;           /* (n_threads, MM_TILE, max_cols) dequantized weight tiles */
    float *att;           /* (n_threads, att_stride) scores and a dequantized head */
    size_t att_stride;
    float *attp;          /* (ATT_SPLIT_FLOATS) the split attention's partials */
};

int kcpu_ctx_create(kcpu_ctx_t **out, int n_threads, int mode, const kcpu_limits_t *lim,
                    bl_err_t *err)
{
    *out = NULL;
    if (mode != KCPU_PRECISE && mode != KCPU_FAST8 && mode != KCPU_FAST16)
        return bl_err_set(err, BL_EINVAL, "unknown kernel mode %d", mode);
    (void)kcpu_init();
    if (lim->max_cols < 1 || lim->max_cols > (1 << 24) || lim->max_batch < 1 ||
        lim->max_batch > (1 << 20) || lim->max_ctx < 1 || lim->max_ctx > (1 << 24) ||
        lim->head_dim < 1 || lim->head_dim > (1 << 16))
        return bl_err_set(err, BL_ERANGE,
                          "kernel limits out of range (cols %lld, batch %lld, ctx %lld, head %lld)",
                          (long long)lim->max_cols, (long long)lim->max_batch,
                          (long long)lim->max_ctx, (long long)lim->head_dim);
    kcpu_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the kernel context");
    int rc = kcpu_pool_create(&c->pool, n_threads, err);
    if (rc < 0)
        goto fail;
    c->precise = mode == KCPU_PRECISE;
    c->act_terms = mode == KCPU_FAST8 ? 1 : 2;
    c->lim = *lim;
    /* Every size below is a product of values bounded above, well inside size_t. */
    c->act_row_bytes = (size_t)((lim->max_cols + BL_QK_K - 1) / BL_QK_K) * sizeof(bl_block_q8_K);
    c->actq = malloc(c->act_row_bytes * 2 * (size_t)lim->max_batch);
    /* Per thread: MM_TILE dequantized f32 rows, which also hold the activation
     * residual and MM_UROWS unpacked K-quant rows (552 bytes per 256 columns). */
    _Static_assert(MM_UROWS * sizeof(kcpu_kunpacked_t) <= MM_TILE * sizeof(float) * BL_QK_K,
                   "unpacked tile fits the dequantization scratch");
    _Static_assert(MM_U16ROWS * sizeof(kcpu_kunpacked16_t) <= MM_TILE * sizeof(float) * BL_QK_K,
                   "unpacked q16_K tile fits the dequantization scratch");
    /* A q16_K row takes the room of two q8_K rows (see mm_prepare). */
    _Static_assert(sizeof(kcpu_block_q16_K) <= 2 * sizeof(bl_block_q8_K), "q16_K row fits");
    c->deq = malloc(sizeof(float) * (size_t)n_threads * MM_TILE * (size_t)lim->max_cols);
    /* Scores of ATT_GROUP heads (f16 caches) or one score row and a dequantized head. */
    /* ... and (f16) a chunk's output and the running output of ATT_GROUP heads */
    c->att_stride = (size_t)(ATT_GROUP * lim->max_ctx + 2 * ATT_GROUP * lim->head_dim + 16);
    c->att = malloc(sizeof(float) * (size_t)n_threads * c->att_stride);
    c->attp = malloc(sizeof(float) * (size_t)ATT_SPLIT_FLOATS);
    if (!c->actq || !c->deq || !c->att || !c->attp) {
        rc = bl_err_set(err, BL_ENOMEM, "out of memory for kernel scratch (%d threads, batch %lld)",
                        n_threads, (long long)lim->max_batch);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    kcpu_ctx_destroy(c);
    return rc;
}

void kcpu_ctx_destroy(kcpu_ctx_t *c)
{
    if (!c)
        return;
    kcpu_pool_destroy(c->pool);
    free(c->actq);
    free(c->deq);
    free(c->att);
    free(c->attp);
    free(c);
}

int kcpu_ctx_mode(const kcpu_ctx_t *c)
{
    return c->precise ? KCPU_PRECISE : c->act_terms == 1 ? KCPU_FAST8 : KCPU_FAST16;
}
int kcpu_ctx_n_threads(const kcpu_ctx_t *c) { return kcpu_pool_n_threads(c->pool); }

int kcpu_ctx_set_threads(kcpu_ctx_t *c, int n) { return kcpu_pool_set_active(c->pool, n); }

void kcpu_ctx_set_poll(kcpu_ctx_t *c, int level) { kcpu_pool_set_poll(c->pool, level); }

int kcpu_ctx_pin_strict(kcpu_ctx_t *c, bl_err_t *err) { return kcpu_pool_pin_strict(c->pool, err); }

// --- matmul --------------------------------------------------------------------------------

enum { MM_F32, MM_F16, MM_DEQ, MM_INT };

/* One matrix product of a group: its dispatch and where its quantized activations
 * live. */
typedef struct mm_task {
    kcpu_ctx_t *c;
    const kcpu_mat_t *w;
    const float *x; /* (nx, ncols) */
    int64_t nx;
    const int32_t *rows; /* output row b reads x row rows[b]; NULL: row b */
    int64_t n;
    float *y;       /* (n, nrows) */
    int mode;
    int act;        /* MM_INT: the activation type, or KCPU__ACT_Q16_K */
    kcpu_dot_fn dot;   /* MM_INT, one term */
    kcpu_dot2_fn dot2; /* MM_INT, two terms */
    kcpu_dotu_fn dotu; /* MM_INT with a batch: the unpacked dot, or NULL */
    kcpu_dotu2_fn dotu2; /* with dotu: two activation rows at once */
    kcpu_unpack_fn unpack;
    kcpu_unpack16_fn unpack16; /* q16_K with a batch and a tile kernel, or NULL */
    kcpu_dotn16_fn dotn;       /* q16_K with a few rows: the packed multi-row dot, or NULL */
    kcpu_dotn16_0_fn dotn0;    /* q16_0: the multi-row dot, for any rows */
    kcpu_dotp_fn dotp;         /* one q8_0 term (KCPU_FAST8), several rows: the pair dot, or NULL */
    int q6;         /* the weights are q6_K (the tile kernel's flag) */
    uint8_t *actq;  /* MM_INT: nx rows xstride bytes apart, a slice of c->actq */
    size_t xstride; /* MM_INT: bytes per quantized activation row */
    int shared_act; /* MM_INT: actq is an earlier product's (same x), not quantized again */
    int terms;      /* MM_INT: q8 terms per activation row */
} mm_task_t;

/* Products run in one pair of pool calls: the activation rows of all of them are
 * quantized in one, the weight rows of all of them split over the threads in the
 * other, so a decode step's small products (an expert's 768 rows) do not each pay
 * two thread wake-ups. */
typedef struct mm_group {
    mm_task_t *t;
    int nt;
    int64_t act_rows; /* sum of nx over MM_INT products that quantize their own */
    int64_t w_rows;   /* sum of nrows */
    /* The weight rows are handed out in chunks of at least min_chunk rows from next
     * (relaxed: the pool's start and end order everything else). */
    _Atomic int64_t next;
    int64_t min_chunk;
} mm_group_t;

/* The activation row output row b of t reads. */
static inline int64_t mm_xrow(const mm_task_t *t, int64_t b) { return t->rows ? t->rows[b] : b; }

/* Quantizes activation row b into act_terms rows of the activation format: the
 * value, then (with 2 terms) the residual it left, so that the two integer dots
 * together see about 16 bits of each activation. */
static void mm_quantize_row(const mm_task_t *t, int64_t b, float *res)
{
    const int64_t k = t->w->ncols;
    const int terms = t->terms;
    const float *x = t->x + b * k;
    if (t->act == KCPU__ACT_Q16_K) {
        kcpu__k->quantize_q16_K(x, (kcpu_block_q16_K *)(t->actq + (size_t)b * t->xstride), k);
        return;
    }
    if (t->act == KCPU__ACT_Q16_0) {
        kcpu__k->quantize_q16_0(x, (kcpu_block_q16_0 *)(t->actq + (size_t)b * t->xstride), k);
        return;
    }
    for (int term = 0; term < terms; term++) {
        void *dst = t->actq + (size_t)b * t->xstride + (size_t)term * t->c->act_row_bytes;
        if (t->act == BL_TYPE_Q8_K) {
            bl_quantize_row_q8_K_ref(x, dst, k);
            if (term + 1 < terms)
                bl_dequantize_row_q8_K_ref(dst, res, k);
        } else {
            bl_quantize_row_q8_0_ref(x, dst, k);
            if (term + 1 < terms)
                bl_dequantize_row_q8_0_ref(dst, res, k);
        }
        if (term + 1 < terms) {
            for (int64_t i = 0; i < k; i++)
                res[i] = x[i] - res[i];
            x = res;
        }
    }
}

static void mm_quantize(void *p, int ith, int nth)
{
    const mm_group_t *g = p;
    float *res = g->t[0].c->deq + (size_t)ith * MM_TILE * (size_t)g->t[0].c->lim.max_cols;
    int64_t lo, hi, at = 0;
    split(g->act_rows, ith, nth, &lo, &hi);
    for (int j = 0; j < g->nt && at < hi; j++) {
        const mm_task_t *t = &g->t[j];
        if (t->mode != MM_INT || t->shared_act)
            continue;
        for (int64_t b = lo > at ? lo - at : 0; b < t->nx && at + b < hi; b++)
            mm_quantize_row(t, b, res);
        at += t->nx;
    }
}

/* MM_INT over a batch with an unpacked dot: rows [lo, hi), tile by tile. Each
 * output is the same call on the same data as in the row-by-row loop, so the bits
 * do not depend on the batch or the thread count. */
static void mm_rows_unpacked(const mm_task_t *t, int ith, int64_t lo, int64_t hi)
{
    const kcpu_mat_t *w = t->w;
    const int64_t k = w->ncols, nr = w->nrows;
    const uint8_t *wd = w->data;
    const int64_t nblk = k / BL_QK_K;
    kcpu_kunpacked_t *u =
        (kcpu_kunpacked_t *)(t->c->deq + (size_t)ith * MM_TILE * (size_t)t->c->lim.max_cols);
    const size_t arb = t->c->act_row_bytes;
    const int terms = t->terms;
    for (int64_t b0 = 0; b0 < t->n; b0 += MM_UBATCH) {
        const int64_t b1 = b0 + MM_UBATCH < t->n ? b0 + MM_UBATCH : t->n;
        for (int64_t r0 = lo; r0 < hi; r0 += MM_UROWS) {
            const int64_t r1 = r0 + MM_UROWS < hi ? r0 + MM_UROWS : hi;
            for (int64_t r = r0; r < r1; r++)
                t->unpack(wd + (size_t)r * w->row_bytes, u + (r - r0) * nblk, k);
            int64_t b = b0;
            for (; b + 1 < b1; b += 2) {
                const uint8_t *xa = t->actq + (size_t)mm_xrow(t, b) * t->xstride;
                const uint8_t *xb = t->actq + (size_t)mm_xrow(t, b + 1) * t->xstride;
                for (int64_t r = r0; r < r1; r++) {
                    float o[2];
                    t->dotu2(u + (r - r0) * nblk, xa, xb, arb, terms, k, o);
                    t->y[b * nr + r] = o[0];
                    t->y[(b + 1) * nr + r] = o[1];
                }
            }
            for (; b < b1; b++) {
                const uint8_t *xq = t->actq + (size_t)mm_xrow(t, b) * t->xstride;
                const void *x1 = terms == 2 ? xq + arb : NULL;
                for (int64_t r = r0; r < r1; r++)
                    t->y[b * nr + r] = t->dotu(u + (r - r0) * nblk, xq, x1, k);
            }
        }
    }
}

/* MM_INT with q16_K activations over a batch: tiles of MM_U16ROWS weight rows are
 * unpacked once for all n activation rows, which pass over them 4 at a time in
 * register tiles of 2 weight rows by 4 activation rows. Each output is the packed
 * dot's bits (kcpu_gemm_u16_q16_K_avx2), whatever the tile it fell in. */
static void mm_rows_unpacked16(const mm_task_t *t, int ith, int64_t lo, int64_t hi)
{
    const kcpu_mat_t *w = t->w;
    const int64_t k = w->ncols, nr = w->nrows;
    const uint8_t *wd = w->data;
    const int64_t nblk = k / BL_QK_K;
    kcpu_kunpacked16_t *u =
        (kcpu_kunpacked16_t *)(t->c->deq + (size_t)ith * MM_TILE * (size_t)t->c->lim.max_cols);
    for (int64_t r0 = lo; r0 < hi; r0 += MM_U16ROWS) {
        const int64_t r1 = r0 + MM_U16ROWS < hi ? r0 + MM_U16ROWS : hi;
        for (int64_t r = r0; r < r1; r++)
            t->unpack16(wd + (size_t)r * w->row_bytes, u + (r - r0) * nblk, k);
        for (int64_t b0 = 0; b0 < t->n; b0 += 4) {
            const int nc = t->n - b0 < 4 ? (int)(t->n - b0) : 4;
            const kcpu_block_q16_K *x[4];
            for (int c = 0; c < 4; c++)
                x[c] = (const kcpu_block_q16_K *)(t->actq +
                                                   (size_t)mm_xrow(t, b0 + (c < nc ? c : 0)) * t->xstride);
            for (int64_t r = r0; r < r1; r += 2) {
                const int nw = r1 - r < 2 ? 1 : 2;
                const kcpu_kunpacked16_t *ur[2] = {u + (r - r0) * nblk, u + (r + nw - 1 - r0) * nblk};
                float o[8];
                kcpu__k->gemm16(ur, nw, x, nc, nblk, t->q6, o);
                for (int i = 0; i < nw; i++)
                    for (int c = 0; c < nc; c++)
                        t->y[(b0 + c) * nr + r + i] = o[4 * i + c];
            }
        }
    }
}

/* A decode step streams each weight row from memory once; the hardware prefetcher
 * stops at page boundaries, so the row MM_PF_ROWS ahead is requested explicitly
 * (measured: tg about +20% on a 2-core EPYC, distances 1..8 alike within noise),
 * into the caches (hint 2, L2 and nearer): a non-temporal hint held a Xeon's
 * decode at 18 tok/s on the 8-layer 30B-A3B file with 2 threads, where hint 2 or 3
 * gives 29.5 (distances 2..8 alike again, 16 less). */
#define MM_PF_ROWS 4
static inline void prefetch_row(const uint8_t *p, size_t nbytes)
{
    for (size_t i = 0; i < nbytes; i += 64)
        __builtin_prefetch(p + i, 0, 2);
}

/* MM_INT with q16_K activations and a few rows, or q16_0 activations and any: each
 * weight row streamed once, as a decode step's, against up to KCPU_DOTN_MAX
 * activation rows at a time (a longer batch meets the row again from the cache). */
static void mm_rows_dotn(const mm_task_t *t, int64_t lo, int64_t hi)
{
    const kcpu_mat_t *w = t->w;
    const int64_t k = w->ncols, nr = w->nrows;
    const uint8_t *wd = w->data;
    for (int64_t r = lo; r < hi; r++) {
        if (r + MM_PF_ROWS < hi)
            prefetch_row(wd + (size_t)(r + MM_PF_ROWS) * w->row_bytes, w->row_bytes);
        for (int64_t b0 = 0; b0 < t->n; b0 += KCPU_DOTN_MAX) {
            const int nx = t->n - b0 < KCPU_DOTN_MAX ? (int)(t->n - b0) : KCPU_DOTN_MAX;
            const void *x[KCPU_DOTN_MAX];
            float o[KCPU_DOTN_MAX];
            for (int c = 0; c < nx; c++)
                x[c] = t->actq + (size_t)mm_xrow(t, b0 + c) * t->xstride;
            if (t->dotn0)
                t->dotn0(wd + (size_t)r * w->row_bytes, (const kcpu_block_q16_0 *const *)x, nx, k, o);
            else
                t->dotn(wd + (size_t)r * w->row_bytes, (const kcpu_block_q16_K *const *)x, nx, k, o);
            for (int c = 0; c < nx; c++)
                t->y[(b0 + c) * nr + r] = o[c];
        }
    }
}

/* Weight rows [lo, hi) of one product on thread ith. */
static void mm_rows_range(const mm_task_t *t, int ith, int64_t lo, int64_t hi)
{
    const kcpu_mat_t *w = t->w;
    const int64_t k = w->ncols, nr = w->nrows;
    const uint8_t *wd = w->data;
    float *deq = t->c->deq + (size_t)ith * MM_TILE * (size_t)t->c->lim.max_cols;
    if (t->mode == MM_INT && (t->dotn || t->dotn0)) {
        mm_rows_dotn(t, lo, hi);
        return;
    }
    if (t->mode == MM_INT && t->unpack16) {
        mm_rows_unpacked16(t, ith, lo, hi);
        return;
    }
    if (t->mode == MM_INT && t->dotu) {
        mm_rows_unpacked(t, ith, lo, hi);
        return;
    }
    for (int64_t r0 = lo; r0 < hi; r0 += MM_TILE) {
        const int64_t r1 = r0 + MM_TILE < hi ? r0 + MM_TILE : hi;
        switch (t->mode) {
        case MM_F32:
            for (int64_t b = 0; b < t->n; b++)
                for (int64_t r = r0; r < r1; r++)
                    t->y[b * nr + r] = kcpu__k->dot_f32_f32(
                        (const float *)(wd + (size_t)r * w->row_bytes), t->x + mm_xrow(t, b) * k, k);
            break;
        case MM_F16:
            for (int64_t b = 0; b < t->n; b++)
                for (int64_t r = r0; r < r1; r++)
                    t->y[b * nr + r] = kcpu__k->dot_f16_f32(
                        (const uint16_t *)(wd + (size_t)r * w->row_bytes), t->x + mm_xrow(t, b) * k, k);
            break;
        case MM_DEQ:
            for (int64_t r = r0; r < r1; r++) {
                /* The type was checked to have a dequantizer when the model loaded. */
                int rc = bl_dequantize_row_ref(w->type, wd + (size_t)r * w->row_bytes,
                                               deq + (r - r0) * k, k);
                KCPU_ASSERT(rc == 0);
            }
            for (int64_t b = 0; b < t->n; b++)
                for (int64_t r = r0; r < r1; r++)
                    t->y[b * nr + r] = kcpu__k->dot_f32_f32(deq + (r - r0) * k, t->x + mm_xrow(t, b) * k, k);
            break;
        case MM_INT: {
            int64_t b = 0;
            if (t->dotp) /* rows in pairs: each weight block decoded once for both */
                for (; b + 1 < t->n; b += 2) {
                    const uint8_t *xa = t->actq + (size_t)mm_xrow(t, b) * t->xstride;
                    const uint8_t *xb = t->actq + (size_t)mm_xrow(t, b + 1) * t->xstride;
                    for (int64_t r = r0; r < r1; r++) {
                        if (r + MM_PF_ROWS < hi)
                            prefetch_row(wd + (size_t)(r + MM_PF_ROWS) * w->row_bytes, w->row_bytes);
                        float o[2];
                        t->dotp(wd + (size_t)r * w->row_bytes, xa, xb, k, o);
                        t->y[b * nr + r] = o[0];
                        t->y[(b + 1) * nr + r] = o[1];
                    }
                }
            for (; b < t->n; b++) {
                const size_t arb = t->c->act_row_bytes;
                const uint8_t *xq = t->actq + (size_t)mm_xrow(t, b) * t->xstride;
                if (t->terms == 2)
                    for (int64_t r = r0; r < r1; r++) {
                        if (r + MM_PF_ROWS < hi)
                            prefetch_row(wd + (size_t)(r + MM_PF_ROWS) * w->row_bytes, w->row_bytes);
                        t->y[b * nr + r] = t->dot2(wd + (size_t)r * w->row_bytes, xq, xq + arb, k);
                    }
                else
                    for (int64_t r = r0; r < r1; r++) {
                        if (r + MM_PF_ROWS < hi)
                            prefetch_row(wd + (size_t)(r + MM_PF_ROWS) * w->row_bytes, w->row_bytes);
                        t->y[b * nr + r] = t->dot(wd + (size_t)r * w->row_bytes, xq, k);
                    }
            }
            break;
        }
        }
    }
}

/* Chunks of the concatenated weight rows of the group, taken by whichever thread
 * is free, each half of an even share of what is left (guided): large while much is
 * left, down to one q16_K tile (a batch that unpacks tiles) or MM_DECODE_CHUNK rows
 * at the end, so that no thread starts a long chunk when the others are about to
 * finish (a decode layer's products take a few hundred microseconds; a chunk of an
 * eighth of a thread's share left a tail of tens). On a machine shared with other work a
 * preempted thread no longer holds up the step with a fixed share either. Which
 * thread computes a row changes no bit: every row's output is the same code on the
 * same data, whatever chunk or tile it is in. */
static void mm_rows(void *p, int ith, int nth)
{
    mm_group_t *g = p;
    for (;;) {
        int64_t lo = atomic_load_explicit(&g->next, memory_order_relaxed), hi;
        do {
            if (lo >= g->w_rows)
                return;
            int64_t c = (g->w_rows - lo) / (2 * (int64_t)nth);
            c = (c + g->min_chunk - 1) / g->min_chunk * g->min_chunk;
            c = c < g->min_chunk ? g->min_chunk : c;
            hi = lo + c < g->w_rows ? lo + c : g->w_rows;
        } while (!atomic_compare_exchange_weak_explicit(&g->next, &lo, hi, memory_order_relaxed,
                                                        memory_order_relaxed));
        int64_t at = 0;
        for (int j = 0; j < g->nt && at < hi; j++) {
            const int64_t nr = g->t[j].w->nrows;
            const int64_t a = lo > at ? lo - at : 0, b = hi - at < nr ? hi - at : nr;
            if (a < b)
                mm_rows_range(&g->t[j], ith, a, b);
            at += nr;
        }
    }
}

/* Fills t for one product; *act_at is where its quantized rows go (advanced). */
static void mm_prepare(kcpu_ctx_t *c, mm_task_t *t, const kcpu_mm_job_t *jb, int64_t *act_at)
{
    const kcpu_mat_t *w = jb->w;
    const int64_t nx = jb->rows ? jb->nx : jb->n;
    KCPU_ASSERT(jb->n >= 0 && nx <= c->lim.max_batch && w->ncols <= c->lim.max_cols);
    *t = (mm_task_t){.c = c, .w = w, .x = jb->x, .nx = nx, .rows = jb->rows, .n = jb->n, .y = jb->y};
    if (w->type == BL_TYPE_F32) {
        t->mode = MM_F32;
    } else if (w->type == BL_TYPE_F16) {
        t->mode = MM_F16;
    } else if (!c->precise && !w->precise && kcpu_act_type(w->type) >= 0) {
        t->mode = MM_INT;
        t->act = act_kind(c->act_terms, w);
        /* Every row has the room of two q8 rows: q8 terms are act_row_bytes apart,
         * a q16_K or q16_0 row takes the room of both. */
        t->actq = (uint8_t *)c->actq + (size_t)(*act_at * 2) * c->act_row_bytes;
        t->q6 = w->type == BL_TYPE_Q6_K;
        if (t->act == KCPU__ACT_Q16_K) {
            t->terms = 1;
            t->xstride = 2 * c->act_row_bytes;
            t->dot = int_dot16(w->type);
            /* One row gains nothing from unpacking: it streams the packed weights;
             * so do a few rows where the set decodes a block once for several. */
            if (jb->n > 1 && jb->n <= MM_DOTN_ROWS)
                t->dotn = int_dotn16(w->type);
            if (jb->n > 1 && !t->dotn && kcpu__k->gemm16)
                t->unpack16 = int_unpack16(w->type);
        } else if (t->act == KCPU__ACT_Q16_0) {
            t->terms = 1;
            t->xstride = 2 * c->act_row_bytes;
            t->dotn0 = int_dotn16_0(w->type);
        } else {
            t->terms = c->act_terms;
            t->xstride = (size_t)t->terms * c->act_row_bytes;
            t->dot = int_dot(w->type);
            t->dot2 = int_dot2(w->type);
            if (jb->n > 1)
                t->dotu = int_dotu(w->type, &t->unpack, &t->dotu2);
            if (jb->n > 1 && !t->dotu)
                t->dotp = int_dotp(w->type);
        }
        *act_at += nx;
    } else {
        t->mode = MM_DEQ;
    }
}

/* Activation elements the caller quantizes alone: a decode step's row or two, or
 * the 8 rows of a layer's experts' down products, take a few microseconds, less
 * than waking the pool for them. */
#define MM_QUANT_INLINE_ELEMS 16384

static void mm_run(kcpu_ctx_t *c, mm_group_t *g)
{
    int64_t elems = 0;
    for (int j = 0; j < g->nt; j++)
        if (g->t[j].mode == MM_INT && !g->t[j].shared_act)
            elems += g->t[j].nx * g->t[j].w->ncols;
    if (elems > MM_QUANT_INLINE_ELEMS)
        kcpu_pool_run(c->pool, mm_quantize, g);
    else if (g->act_rows > 0)
        mm_quantize(g, 0, 1);
    /* Batches that unpack or dequantize weight tiles take whole tiles; the other
     * products can be cut anywhere, so that a small matrix (a router's 128 rows)
     * still reaches every thread. */
    g->min_chunk = MM_DECODE_CHUNK;
    for (int j = 0; j < g->nt; j++)
        if (g->t[j].n > 1 && (g->t[j].unpack16 || g->t[j].dotu || g->t[j].mode == MM_DEQ))
            g->min_chunk = MM_U16ROWS;
    atomic_store_explicit(&g->next, 0, memory_order_relaxed);
    kcpu_pool_run(c->pool, mm_rows, g);
}

void kcpu_matmul(kcpu_ctx_t *c, const kcpu_mat_t *w, const float *x, int64_t n, float *y)
{
    if (n == 0)
        return;
    mm_task_t t;
    int64_t act = 0;
    const kcpu_mm_job_t jb = {.w = w, .x = x, .n = n, .y = y};
    mm_prepare(c, &t, &jb, &act);
    mm_group_t g = {.t = &t, .nt = 1, .act_rows = act, .w_rows = w->nrows};
    mm_run(c, &g);
}

void kcpu_matmul_many(kcpu_ctx_t *c, const kcpu_mm_job_t *jobs, int njobs)
{
    mm_task_t t[KCPU_MM_MAX_JOBS];
    KCPU_ASSERT(njobs >= 0 && njobs <= KCPU_MM_MAX_JOBS);
    mm_group_t g = {.t = t};
    int64_t act = 0;
    for (int j = 0; j < njobs; j++) {
        const kcpu_mm_job_t *jb = &jobs[j];
        if (jb->n == 0)
            continue;
        /* Products reading the same rows in the same format share one quantization. */
        const mm_task_t *same = NULL;
        for (int i = 0; i < g.nt && !same; i++)
            if (t[i].mode == MM_INT && t[i].x == jb->x && t[i].nx == (jb->rows ? jb->nx : jb->n) &&
                t[i].w->ncols == jb->w->ncols && t[i].act == act_kind(c->act_terms, jb->w))
                same = &t[i];
        /* The group's quantized rows must fit the scratch: run what is there first. */
        if (!same && act + (jb->rows ? jb->nx : jb->n) > c->lim.max_batch && g.nt > 0) {
            g.act_rows = act;
            mm_run(c, &g);
            g.nt = 0;
            g.w_rows = 0;
            act = 0;
        }
        int64_t at = act;
        mm_prepare(c, &t[g.nt], jb, &at);
        if (t[g.nt].mode == MM_INT) {
            if (same && !c->precise && !jb->w->precise) {
                t[g.nt].actq = same->actq;
                t[g.nt].shared_act = 1;
            } else {
                act = at;
            }
        }
        g.w_rows += jb->w->nrows;
        g.nt++;
    }
    g.act_rows = act;
    if (g.nt > 0)
        mm_run(c, &g);
}

// --- elementwise ops ---------------------------------------------------------------------------

typedef struct pfor {
    void (*fn)(void *arg, int64_t lo, int64_t hi);
    void *arg;
    int64_t n;
} pfor_t;

static void pfor_run(void *p, int ith, int nth)
{
    const pfor_t *t = p;
    int64_t lo, hi;
    split(t->n, ith, nth, &lo, &hi);
    if (lo < hi)
        t->fn(t->arg, lo, hi);
}

void kcpu_parallel_for(kcpu_ctx_t *c, int64_t n, int64_t min_par, void (*fn)(void *arg, int64_t lo, int64_t hi),
                       void *arg)
{
    if (n <= 0)
        return;
    if (!c || n < min_par || kcpu_pool_n_threads(c->pool) == 1) {
        fn(arg, 0, n);
        return;
    }
    pfor_t t = {fn, arg, n};
    kcpu_pool_run(c->pool, pfor_run, &t);
}

typedef struct rms_args {
    float *y;
    const float *x, *g;
    int64_t d, ld;
    float eps;
} rms_args_t;

static void rms_rows(void *p, int64_t lo, int64_t hi)
{
    const rms_args_t *a = p;
    for (int64_t b = lo; b < hi; b++) {
        const float *xr = a->x + b * a->ld;
        float *yr = a->y + b * a->ld;
        double ss = 0.0;
        for (int64_t i = 0; i < a->d; i++)
            ss += (double)xr[i] * (double)xr[i];
        const float s = (float)(1.0 / sqrt(ss / (double)a->d + (double)a->eps));
        for (int64_t i = 0; i < a->d; i++)
            yr[i] = xr[i] * s * a->g[i];
    }
}

/* Rows (of d elements) a norm runs on this thread below: a decode step's few rows
 * cost less than a pool wake-up. */
#define RMS_PAR_ELEMS 65536

void kcpu_rms_norm(kcpu_ctx_t *c, float *y, const float *x, const float *g, int64_t n, int64_t d, int64_t ld,
                   float eps)
{
    rms_args_t a = {y, x, g, d, ld, eps};
    kcpu_parallel_for(c, n, d > 0 ? RMS_PAR_ELEMS / d + 1 : n + 1, rms_rows, &a);
}

void kcpu_rope_table(float *cs, const int32_t *pos, int64_t n, const kcpu_rope_t *r)
{
    const int64_t half = r->n_rot / 2;
    const double span = (double)r->corr_hi - (double)r->corr_lo;
    for (int64_t b = 0; b < n; b++)
        for (int64_t i = 0; i < half; i++) {
            const double te = (double)pos[b] * pow((double)r->base, -2.0 * (double)i / (double)r->n_rot);
            double theta = te;
            if (r->freq_scale != 1.0f || r->ext_factor != 0.0f) {
                const double ti = (double)r->freq_scale * te;
                double y = ((double)i - (double)r->corr_lo) / (span > 0.001 ? span : 0.001);
                y = y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y;
                const double mix = (1.0 - y) * (double)r->ext_factor;
                theta = ti * (1.0 - mix) + te * mix;
            }
            cs[(b * half + i) * 2] = (float)(cos(theta) * (double)r->mscale);
            cs[(b * half + i) * 2 + 1] = (float)(sin(theta) * (double)r->mscale);
        }
}

void kcpu_rope_neox(float *x, const float *cs, int64_t n, int64_t n_head, int64_t head_dim, int64_t n_rot)
{
    const int64_t half = n_rot / 2;
    for (int64_t b = 0; b < n; b++) {
        const float *t = cs + b * half * 2;
        for (int64_t h = 0; h < n_head; h++) {
            float *v = x + (b * n_head + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                const float c = t[2 * i], s = t[2 * i + 1];
                const float x0 = v[i], x1 = v[i + half];
                v[i] = x0 * c - x1 * s;
                v[i + half] = x0 * s + x1 * c;
            }
        }
    }
}

void kcpu_rope_norm(float *x, const float *cs, int64_t n, int64_t n_head, int64_t row_stride,
                    int64_t head_stride, int64_t n_rot)
{
    const int64_t half = n_rot / 2;
    for (int64_t b = 0; b < n; b++) {
        const float *t = cs + b * half * 2;
        for (int64_t h = 0; h < n_head; h++) {
            float *v = x + b * row_stride + h * head_stride;
            for (int64_t i = 0; i < half; i++) {
                const float c = t[2 * i], s = t[2 * i + 1];
                const float x0 = v[2 * i], x1 = v[2 * i + 1];
                v[2 * i] = x0 * c - x1 * s;
                v[2 * i + 1] = x0 * s + x1 * c;
            }
        }
    }
}

typedef struct swiglu_args {
    float *y;
    const float *g, *u;
} swiglu_args_t;

static void swiglu_range(void *p, int64_t lo, int64_t hi)
{
    const swiglu_args_t *a = p;
    for (int64_t i = lo; i < hi; i++)
        a->y[i] = a->g[i] / (1.0f + expf(-a->g[i])) * a->u[i];
}

/* Elements a SwiGLU runs on this thread below (about 2 ns each). */
#define SWIGLU_PAR_ELEMS 16384

void kcpu_swiglu(kcpu_ctx_t *c, float *y, const float *g, const float *u, int64_t n)
{
    swiglu_args_t a = {y, g, u};
    kcpu_parallel_for(c, n, SWIGLU_PAR_ELEMS, swiglu_range, &a);
}

/* gpt-oss's limit and slope (llama.cpp's swiglu_oai with alpha 1.702, limit 7). */
#define OAI_ALPHA 1.702f
#define OAI_LIMIT 7.0f

static void swiglu_oai_range(void *p, int64_t lo, int64_t hi)
{
    const swiglu_args_t *a = p;
    for (int64_t i = lo; i < hi; i++) {
        const float x = a->g[i] < OAI_LIMIT ? a->g[i] : OAI_LIMIT;
        const float u = a->u[i] < -OAI_LIMIT ? -OAI_LIMIT : a->u[i] > OAI_LIMIT ? OAI_LIMIT : a->u[i];
        a->y[i] = x / (1.0f + expf(-OAI_ALPHA * x)) * (u + 1.0f);
    }
}

void kcpu_swiglu_oai(kcpu_ctx_t *c, float *y, const float *g, const float *u, int64_t n)
{
    swiglu_args_t a = {y, g, u};
    kcpu_parallel_for(c, n, SWIGLU_PAR_ELEMS, swiglu_oai_range, &a);
}

typedef struct route_args {
    const float *logits;
    const kcpu_route_t *r;
    int32_t *ids;
    float *w;
} route_args_t;

/* The largest of v[0..n) not yet taken (skipped: taken[i]), ties to the lower
 * index; -1 when none is left. */
static int64_t best_of(const double *v, const uint8_t *taken, int64_t n)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best]))
            best = i;
    return best;
}

static void route_rows(void *arg, int64_t lo, int64_t hi)
{
    const route_args_t *a = arg;
    const kcpu_route_t *r = a->r;
    const int64_t n_expert = r->n_expert, k = r->k;
    const int sigmoid = r->gating == KCPU_GATE_SIGMOID, raw = r->gating == KCPU_GATE_SOFTMAX_WEIGHT;
    const int grouped = r->n_group > 1 && r->topk_group > 0 && r->topk_group < r->n_group;
    /* Without a bias or groups a softmax chooses by its logits, which order as its
     * probabilities do (and cost no exp per expert). */
    const int by_logit = !sigmoid && !r->bias && !grouped;
    double p[KCPU_ROUTE_MAX_EXPERT], sel[KCPU_ROUTE_MAX_EXPERT], gsc[KCPU_ROUTE_MAX_EXPERT];
    uint8_t taken[KCPU_ROUTE_MAX_EXPERT];
    int32_t *ids = a->ids;
    float *w = a->w;
    for (int64_t b = lo; b < hi; b++) {
        const float *l = a->logits + b * n_expert;
        float mx = l[0];
        for (int64_t e = 1; e < n_expert; e++)
            mx = l[e] > mx ? l[e] : mx;
        double sum = 0.0;
        for (int64_t e = 0; !sigmoid && !raw && e < n_expert; e++)
            sum += exp((double)(l[e] - mx));
        for (int64_t e = 0; e < n_expert; e++) {
            p[e] = raw ? (double)l[e] : sigmoid ? 1.0 / (1.0 + exp(-(double)l[e])) : exp((double)(l[e] - mx)) / sum;
            sel[e] = by_logit ? (double)l[e] : p[e] + (r->bias ? (double)r->bias[e] : 0.0);
            taken[e] = 0;
        }
        if (grouped) {
            /* a group scores the sum of its two best choices; the experts of all but
             * the topk_group best groups are out of the choice */
            const int64_t gs = n_expert / r->n_group;
            uint8_t keep[KCPU_ROUTE_MAX_EXPERT];
            for (int64_t g = 0; g < r->n_group; g++) {
                const int64_t b1 = best_of(sel + g * gs, taken + g * gs, gs); /* gs >= 1 */
                taken[g * gs + b1] = 1;
                const int64_t b2 = gs > 1 ? best_of(sel + g * gs, taken + g * gs, gs) : -1;
                taken[g * gs + b1] = 0;
                gsc[g] = sel[g * gs + b1] + (b2 >= 0 ? sel[g * gs + b2] : 0.0);
                keep[g] = 0;
            }
            for (int64_t j = 0; j < r->topk_group; j++) {
                const int64_t g = best_of(gsc, keep, r->n_group);
                if (g >= 0) /* topk_group < n_group: always */
                    keep[g] = 1;
            }
            for (int64_t e = 0; e < n_expert; e++)
                taken[e] = !keep[e / gs];
        }
        /* The k largest by repeated scan (k and n_expert are small); ties to the lower
         * id. */
        double wsum = 0.0;
        for (int64_t j = 0; j < k; j++) {
            /* k <= the experts left: the model's checks (bl_arch_read) */
            const int64_t best = best_of(sel, taken, n_expert);
            KCPU_ASSERT(best >= 0);
            taken[best] = 1;
            ids[b * k + j] = (int32_t)best;
            w[b * k + j] = (float)p[best];
            wsum += p[best];
        }
        if (raw) { /* the softmax of the chosen logits */
            double top = p[ids[b * k]];
            for (int64_t j = 1; j < k; j++)
                top = p[ids[b * k + j]] > top ? p[ids[b * k + j]] : top;
            wsum = 0.0;
            for (int64_t j = 0; j < k; j++)
                wsum += exp(p[ids[b * k + j]] - top);
            for (int64_t j = 0; j < k; j++)
                w[b * k + j] = (float)(exp(p[ids[b * k + j]] - top) / wsum);
            wsum = 1.0;
        }
        /* llama.cpp keeps the sum at least the smallest normal half, 2^-14 */
        if (r->norm)
            for (int64_t j = 0; j < k; j++)
                w[b * k + j] = (float)((double)w[b * k + j] / (wsum > 0x1p-14 ? wsum : 0x1p-14));
        if (r->scale != 1.0f)
            for (int64_t j = 0; j < k; j++)
                w[b * k + j] *= r->scale;
    }
}

/* Rows a routing runs on this thread below (a few microseconds each). */
#define ROUTE_PAR_ROWS 16

void kcpu_moe_route(kcpu_ctx_t *c, const float *logits, int64_t n, const kcpu_route_t *r, int32_t *ids, float *w)
{
    route_args_t a = {logits, r, ids, w};
    kcpu_parallel_for(c, n, ROUTE_PAR_ROWS, route_rows, &a);
}

// --- KV cache and attention ----------------------------------------------------------------------

void kcpu_kv_store(const kcpu_kv_view_t *kv, int is_v, const float *src, int64_t pos0, int64_t n,
                   int64_t row_elems)
{
    uint8_t *base = is_v ? kv->v : kv->k;
    for (int64_t b = 0; b < n; b++) {
        void *dst = base + (size_t)(pos0 + b) * kv->row_bytes;
        const float *s = src + b * row_elems;
        switch (kv->type) {
        case BL_TYPE_F32: memcpy(dst, s, sizeof(float) * (size_t)row_elems); break;
        case BL_TYPE_F16: bl_quantize_row_f16_ref(s, dst, row_elems); break;
        case BL_TYPE_Q8_0: bl_quantize_row_q8_0_ref(s, dst, row_elems); break;
        default: KCPU_ASSERT(0 && "kv type");
        }
    }
}

typedef struct att_task {
    kcpu_ctx_t *c;
    const kcpu_kv_view_t *kv;
    const float *q;
    float *out;
    int64_t n, pos0, n_head, n_kv_head, hd;
    float scale;
    int64_t window;       /* a row sees its last window positions; 0: all of them */
    const float *sinks;   /* (n_head) an extra score per head with no value, or NULL */
    _Atomic int64_t next; /* f16 caches: the next work item to take */
    int64_t items;        /* f16 caches: the (row, KV head, group of query heads) items */
    float *part;          /* f16 caches, split form: the chunks' partials, or NULL */
    int64_t nchunk;       /* split form: chunks per row (the longest row's) */
} att_task_t;

/* Head kvh of cache row t as a pointer to hd elements of the cache type, or, for
 * q8_0, dequantized into tmp. */
static const void *kv_head(const att_task_t *t, const uint8_t *base, int64_t row, int64_t kvh,
                           float *tmp)
{
    const uint8_t *r = base + (size_t)row * t->kv->row_bytes;
    switch (t->kv->type) {
    case BL_TYPE_F32: return r + sizeof(float) * (size_t)(kvh * t->hd);
    case BL_TYPE_F16: return r + sizeof(uint16_t) * (size_t)(kvh * t->hd);
    default:
        bl_dequantize_row_q8_0_ref(r + sizeof(bl_block_q8_0) * (size_t)(kvh * t->hd / BL_QK), tmp,
                                   t->hd);
        return tmp;
    }
}

/* An f16 cache (the default) is read in chunks of ATT_CHUNK positions: each chunk
 * gives, per query head, its score maximum m, the sum s of exp(score - m) and the
 * unnormalized output o = sum of exp(score - m) * V row; a row's chunks are then
 * merged in order, with the running maximum (att_merge), and the sum divided out.
 * The arithmetic is fixed by the row's length alone, so a row gets the same bits
 * whether one thread walks its chunks in order (a prompt: many rows, enough work
 * items without splitting) or the chunks go to different threads and are merged
 * after (a decode step: one row, whose few KV heads alone would leave most threads
 * idle). Work items are (row, KV head, up to ATT_GROUP of its query heads[, chunk]),
 * so each cache row is read and converted once for the group. */
#define ATT_CHUNK 64

/* Chunk [j0, j1) of a row for ng query heads q of KV head kvh: o (ng, hd), m (ng)
 * and s (ng). sc is the thread's score scratch. */
static void att_chunk(const att_task_t *t, float *sc, const float *q, int ng, int64_t kvh, int64_t j0, int64_t j1,
                      float *o, float *m, double *s)
{
    const int64_t ld = t->c->lim.max_ctx, len = j1 - j0;
    const int64_t kst = (int64_t)(t->kv->row_bytes / sizeof(uint16_t));
    const uint16_t *k = (const uint16_t *)t->kv->k + kvh * t->hd + j0 * kst;
    const uint16_t *v = (const uint16_t *)t->kv->v + kvh * t->hd + j0 * kst;
    const int vec = t->hd % 8 == 0;
    if (vec)
        kcpu__k->att_qk_f16(q, ng, k, kst, len, t->hd, t->scale, sc, ld);
    else
        kcpu_att_qk_f16_ref(q, ng, k, kst, len, t->hd, t->scale, sc, ld);
    for (int g = 0; g < ng; g++) {
        float *e = sc + g * ld, mx = -INFINITY;
        for (int64_t j = 0; j < len; j++)
            mx = e[j] > mx ? e[j] : mx;
        kcpu__k->exp_sub(e, len, mx);
        double sum = 0.0;
        for (int64_t j = 0; j < len; j++)
            sum += e[j];
        m[g] = mx;
        s[g] = sum;
    }
    if (vec)
        kcpu__k->att_pv_f16(sc, ng, ld, v, kst, len, t->hd, o);
    else
        kcpu_att_pv_f16_ref(sc, ng, ld, v, kst, len, t->hd, o);
}

/* Merges a chunk (o, m, s) into the running (O, M, S) of ng heads; first: the
 * running state is the chunk. */
static void att_merge(int ng, int64_t hd, const float *o, const float *m, const double *s, float *O, float *M,
                      double *S, int first)
{
    for (int g = 0; g < ng; g++) {
        if (first) {
            memcpy(O + g * hd, o + g * hd, sizeof(float) * (size_t)hd);
            M[g] = m[g];
            S[g] = s[g];
            continue;
        }
        const float mx = m[g] > M[g] ? m[g] : M[g];
        const float a = expf(M[g] - mx), b = expf(m[g] - mx);
        for (int64_t i = 0; i < hd; i++)
            O[g * hd + i] = O[g * hd + i] * a + o[g * hd + i] * b;
        S[g] = S[g] * a + s[g] * b;
        M[g] = mx;
    }
}

/* out (ng, hd) = O / S; with sinks (the ng heads' own), each head's sink joins the
 * sum as one more score whose value is nothing. */
static void att_finish(int ng, int64_t hd, const float *O, const float *M, const double *S, const float *sinks,
                       float *out)
{
    for (int g = 0; g < ng; g++) {
        double sum = S[g], a = 1.0;
        if (sinks) {
            const float mx = sinks[g] > M[g] ? sinks[g] : M[g];
            a = (double)expf(M[g] - mx);
            sum = S[g] * a + (double)expf(sinks[g] - mx);
        }
        const float inv = (float)(a / sum);
        for (int64_t i = 0; i < hd; i++)
            out[g * hd + i] = O[g * hd + i] * inv;
    }
}

/* The first position row b of t sees (its window's start). */
static int64_t att_lo(const att_task_t *t, int64_t b)
{
    const int64_t len = t->pos0 + b + 1;
    return t->window > 0 && len > t->window ? len - t->window : 0;
}

/* Item idx of the (row, KV head, group of query heads) items: its row b, KV head,
 * first query head h0 and head count ng. */
static void att_item(const att_task_t *t, int64_t idx, int64_t *b, int64_t *kvh, int64_t *h0, int *ng)
{
    const int64_t group = t->n_head / t->n_kv_head, nsub = (group + ATT_GROUP - 1) / ATT_GROUP;
    const int64_t rem = idx % (t->n_kv_head * nsub);
    *b = idx / (t->n_kv_head * nsub);
    *kvh = rem / nsub;
    *h0 = *kvh * group + (rem % nsub) * ATT_GROUP;
    *ng = (int)(*kvh * group + group - *h0 < ATT_GROUP ? *kvh * group + group - *h0 : ATT_GROUP);
}

/* Floats one chunk's partial takes in the split scratch: o, m and s of ATT_GROUP
 * heads (s a double: two floats). */
static int64_t att_part_floats(int64_t hd) { return ATT_GROUP * (hd + 3); }

/* Partial i of the split scratch as its o (ATT_GROUP, hd), m and s. */
static void att_part(const att_task_t *t, int64_t i, float **o, float **m, double **s)
{
    float *p = t->part + i * att_part_floats(t->hd);
    *o = p;
    *m = p + ATT_GROUP * t->hd;
    *s = (double *)(p + ATT_GROUP * (t->hd + 1));
}

/* The end of the chunk of a row of len positions that starts at j0. */
static int64_t att_chunk_end(int64_t j0, int64_t len) { return j0 + ATT_CHUNK < len ? j0 + ATT_CHUNK : len; }

/* Each item walks its row's chunks in order on one thread. */
static void att_rows_f16(att_task_t *t, int ith)
{
    float *sc = t->c->att + (size_t)ith * t->c->att_stride;
    const int64_t hd = t->hd;
    /* the thread's chunk partial and running state, after its scores */
    float *o = sc + ATT_GROUP * t->c->lim.max_ctx, *O = o + ATT_GROUP * hd;
    float m[ATT_GROUP], M[ATT_GROUP];
    double s[ATT_GROUP], S[ATT_GROUP];
    for (int64_t idx = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed); idx < t->items;
         idx = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed)) {
        int64_t b, kvh, h0;
        int ng;
        att_item(t, idx, &b, &kvh, &h0, &ng);
        const int64_t len = t->pos0 + b + 1, lo = att_lo(t, b); /* causal: lo .. pos0 + b */
        const float *q = t->q + (b * t->n_head + h0) * hd;
        for (int64_t j0 = lo; j0 < len; j0 += ATT_CHUNK) {
            att_chunk(t, sc, q, ng, kvh, j0, att_chunk_end(j0, len), o, m, s);
            att_merge(ng, hd, o, m, s, O, M, S, j0 == lo);
        }
        att_finish(ng, hd, O, M, S, t->sinks ? t->sinks + h0 : NULL, t->out + (b * t->n_head + h0) * hd);
    }
}

/* The split form: items are (row, KV head, group, chunk) over t->nchunk chunks per
 * row (the longest row's; a shorter row's items past its end are empty), each
 * partial written to t->part; the caller merges them after (att_rows_merge). */
static void att_rows_f16_split(att_task_t *t, int ith)
{
    float *sc = t->c->att + (size_t)ith * t->c->att_stride;
    const int64_t items = t->items * t->nchunk;
    for (int64_t idx = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed); idx < items;
         idx = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed)) {
        int64_t b, kvh, h0;
        int ng;
        att_item(t, idx / t->nchunk, &b, &kvh, &h0, &ng);
        const int64_t len = t->pos0 + b + 1, j0 = att_lo(t, b) + (idx % t->nchunk) * ATT_CHUNK;
        if (j0 >= len)
            continue;
        float *o, *m;
        double *s;
        att_part(t, idx, &o, &m, &s);
        att_chunk(t, sc, t->q + (b * t->n_head + h0) * t->hd, ng, kvh, j0, att_chunk_end(j0, len), o, m, s);
    }
}

/* Merges the split form's partials of every item in chunk order. */
static void att_rows_merge(att_task_t *t)
{
    const int64_t hd = t->hd;
    float *O = t->c->att; /* thread 0's scratch: the pool is done */
    float M[ATT_GROUP];
    double S[ATT_GROUP];
    for (int64_t it = 0; it < t->items; it++) {
        int64_t b, kvh, h0;
        int ng;
        att_item(t, it, &b, &kvh, &h0, &ng);
        const int64_t len = t->pos0 + b + 1, lo = att_lo(t, b);
        for (int64_t c = 0; lo + c * ATT_CHUNK < len; c++) {
            float *o, *m;
            double *s;
            att_part(t, it * t->nchunk + c, &o, &m, &s);
            att_merge(ng, hd, o, m, s, O, M, S, c == 0);
        }
        att_finish(ng, hd, O, M, S, t->sinks ? t->sinks + h0 : NULL, t->out + (b * t->n_head + h0) * hd);
    }
}

static void att_rows(void *p, int ith, int nth)
{
    att_task_t *t = p;
    if (t->kv->type == BL_TYPE_F16) {
        if (t->part)
            att_rows_f16_split(t, ith);
        else
            att_rows_f16(t, ith);
        return;
    }
    float *scores = t->c->att + (size_t)ith * t->c->att_stride;
    float *tmp = scores + t->c->lim.max_ctx;
    const int64_t group = t->n_head / t->n_kv_head;
    const int is_f16 = t->kv->type == BL_TYPE_F16;
    /* Rows get longer down the batch (causal), so (row, head) pairs are dealt out
     * round-robin rather than in contiguous shares. */
    for (int64_t idx = ith; idx < t->n * t->n_head; idx += nth) {
        const int64_t b = idx / t->n_head, h = idx % t->n_head, kvh = h / group;
        const int64_t len = t->pos0 + b + 1, lo = att_lo(t, b); /* causal: lo .. pos0 + b */
        const float *q = t->q + idx * t->hd;
        float mx = t->sinks ? t->sinks[h] : -INFINITY;
        for (int64_t s = lo; s < len; s++) {
            const void *k = kv_head(t, t->kv->k, s, kvh, tmp);
            const float d = is_f16 ? kcpu__k->dot_f16_f32(k, q, t->hd)
                                   : kcpu__k->dot_f32_f32(k, q, t->hd);
            scores[s] = d * t->scale;
            mx = scores[s] > mx ? scores[s] : mx;
        }
        double sum = t->sinks ? (double)expf(t->sinks[h] - mx) : 0.0;
        for (int64_t s = lo; s < len; s++) {
            scores[s] = expf(scores[s] - mx);
            sum += scores[s];
        }
        const float inv = (float)(1.0 / sum);
        float *o = t->out + idx * t->hd;
        memset(o, 0, sizeof(float) * (size_t)t->hd);
        for (int64_t s = lo; s < len; s++) {
            const void *v = kv_head(t, t->kv->v, s, kvh, tmp);
            if (is_f16)
                kcpu__k->axpy_f16(o, scores[s] * inv, v, t->hd);
            else
                kcpu__k->axpy_f32(o, scores[s] * inv, v, t->hd);
        }
    }
}

void kcpu_attention(kcpu_ctx_t *c, const kcpu_kv_view_t *kv, const float *q, float *out,
                    int64_t n, int64_t pos0, int64_t n_head, int64_t n_kv_head,
                    int64_t head_dim, float scale)
{
    kcpu_attention_ext(c, kv, q, out, n, pos0, n_head, n_kv_head, head_dim, scale, 0, NULL);
}

void kcpu_attention_ext(kcpu_ctx_t *c, const kcpu_kv_view_t *kv, const float *q, float *out, int64_t n,
                        int64_t pos0, int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale,
                        int64_t window, const float *sinks)
{
    KCPU_ASSERT(pos0 + n <= c->lim.max_ctx && head_dim <= c->lim.head_dim);
    KCPU_ASSERT(n_kv_head > 0 && n_head % n_kv_head == 0 && window >= 0);
    att_task_t t = {.c = c, .kv = kv, .q = q, .out = out, .n = n, .pos0 = pos0,
                    .n_head = n_head, .n_kv_head = n_kv_head, .hd = head_dim, .scale = scale,
                    .window = window, .sinks = sinks,
                    .items = n * n_kv_head * ((n_head / n_kv_head + ATT_GROUP - 1) / ATT_GROUP)};
    if (kv->type == BL_TYPE_F16) {
        /* Too few items for the threads and a long enough row: split the rows'
         * chunks over the threads (the same bits; see att_rows_f16). A window
         * bounds the span a row reads. */
        const int64_t span = window > 0 && pos0 + n > window ? window : pos0 + n;
        const int64_t nchunk = (span + ATT_CHUNK - 1) / ATT_CHUNK;
        if (t.items < kcpu_pool_n_threads(c->pool) && nchunk > 1 &&
            t.items * nchunk * att_part_floats(head_dim) <= ATT_SPLIT_FLOATS) {
            t.part = c->attp;
            t.nchunk = nchunk;
            kcpu_pool_run(c->pool, att_rows, &t);
            att_rows_merge(&t);
            return;
        }
    }
    kcpu_pool_run(c->pool, att_rows, &t);
}
