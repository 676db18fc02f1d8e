/* Matrix-vector products for decode over weights as GGUF stores them (q4_K, q5_K,
 * q6_K, q8_0, mxfp4, f16, bf16, f32) and f32 activations: the plain product (up to
 * KCUDA_MV_MAX_ROWS activation rows per weight load), the routed experts' gate/up
 * (optionally with SwiGLU) and down (with the weighted sum) of 3-D expert tensors,
 * and the embedding gather.
 *
 * Shape: blocks of MV_WARPS warps. A warp owns rpw output rows (rpw chosen by the
 * launcher so that the grid is about one wave of the card) and walks its work as a
 * list of segments: for each row, each part (gate and up; or each routed expert
 * for down), each group of whole weight blocks (about 2 KiB). Segments stream into
 * the warp's MV_STAGES shared-memory stages with 16-byte cp.async copies of the
 * aligned span around them (why weight data must be padded: kcuda.h), two segments
 * ahead of the one being decoded, so each warp keeps up to three in flight (five
 * measured no faster on the H200: the expert products are not bound by the bytes
 * a warp keeps in flight).
 *
 * Block formats (q4_K, q5_K, q6_K, q8_0, mxfp4): the block first rounds the
 * activation rows it reads to 8 bits per 32 elements in shared memory (d = amax /
 * 127, q = round(x / d), plus the integer sums of each half), and by default the
 * residual x - d q the same way (two q8 terms, kcuda_matvec_set_act_terms),
 * overlapping the first segments' copies; lanes then take integer dot products of
 * packed weights (mxfp4: its 4-bit codes looked up as doubled E2M1 integers) and
 * each term (dp4a) per sub-block and scale them once. The result is W times
 * the rounded activations, to f32 rounding (docs/cuda.md, "Numerics"): the same
 * weight bytes, twice the integer work. f16, bf16 and f32 weights multiply the f32
 * activations as given (read through L1).
 *
 * A lane's share of a segment is fixed per format (8 lanes per q4_K/q5_K block, 4
 * per q6_K block, one q8_0 or mxfp4 block, strided elements); the rounded
 * activations are laid out per format (xunit) so that the lanes' 16-byte reads hit
 * distinct banks.
 * A warp shuffle sums the lanes; lane 0 writes. Sums have a fixed order: the same
 * inputs give the same bits. */
#include "kcuda_impl.cuh"

#define MV_WARPS 8
#define MV_THREADS (MV_WARPS * 32)
/* A group is at most 2048 bytes; its aligned span at most 2080; unaligned word
 * reads (ldw4) may touch 4 bytes past it. */
#define MV_GROUP_BYTES 2048
#define MV_STAGE_BYTES (MV_GROUP_BYTES + 48)
#define MV_STAGES 3
#define MV_STAGE_ALL (MV_WARPS * MV_STAGES * MV_STAGE_BYTES) /* 50304 bytes per block */
#define MAXR KCUDA_MV_MAX_ROWS
/* Blocks per SM the register budget must allow, and the launcher's wave size. */
/* Blocks per SM the register budget must allow (three for one activation row
 * measured slower on the H200 in a decode step: fewer registers per thread, and
 * less room for the next kernel's blocks to start early). */
#define MV_MIN_BLOCKS 2

enum { MV_PLAIN = 0, MV_EXPERT = 1, MV_EXPERT_DOWN = 2 };

typedef struct mv_args {
    const uint8_t *w;  /* weights (all experts for the expert modes) */
    const uint8_t *w2; /* up, for the SwiGLU pair; NULL otherwise */
    size_t row_bytes;
    int64_t ncols;
    int64_t nrows;     /* output rows per slot (rows per expert in the expert modes) */
    int64_t n_expert;
    const float *x;
    int64_t ldx;
    float *y;
    int64_t ldy;
    const int32_t *ids;
    const float *wts;
    int n;             /* activation rows (plain mode) */
    int k;             /* choices per row (expert modes) */
    int mode;
    int accumulate;
    /* Expert modes: the experts' biases (n_expert, nrows), NULL for none: gate's and
     * up's (b1, b2) added before the activation, or down's (b1) weighted as its
     * output; act, the activation of the SwiGLU pair (KCUDA_ACT_*). */
    const float *b1, *b2;
    int act;
    int rpw;           /* rows per warp */
    int xs;            /* bytes per rounded activation row in shared memory */
    int terms;         /* q8 terms per activation block (block formats): 1 or 2 */
    /* Plain mode, split outputs (kcuda_matvec_split): rows r1.. go to y1 (row r -
     * r1, ldy1 apart), rows r2.. to y2; r1 = r2 = nrows when there is one output. */
    int64_t r1, r2;
    float *y1, *y2;
    int64_t ldy1, ldy2;
    /* Expert mode with routing (kcuda_matvec_experts_swiglu_route): row b's router
     * logits at logits + b * n_expert (n_expert <= MV_ROUTE_MAX); each block routes
     * its row itself and block column 0 of choice 0 writes the row's ids and
     * weights to ids_out and wts_out; ids is unused. */
    const float *logits;
    kcuda_route_t route; /* the plain softmax (kcuda_route_plain) */
    int32_t *ids_out;
    float *wts_out;
    size_t route_off; /* where the warps' routing copies start in shared memory */
    /* Plain mode: each output's bias (one value a row of it, added after the
     * product, and after the accumulation), NULL for none; read only by the
     * kernels built with them (mv_rows' B) */
    const float *pb, *pb1, *pb2;
} mv_args_t;

/* Most experts the routed gate/up takes (logits per lane: MV_ROUTE_MAX / 32), and
 * the shared memory of the warps' routing copies (ids, then weights). */
#define MV_ROUTE_MAX 128
#define MV_ROUTE_BYTES (MV_WARPS * KCUDA_MOE_MAX_K * 8)

// --- formats ------------------------------------------------------------------------------
/* BE elements and BB bytes per block; G blocks per group (G * BB <= 2048); Q: the
 * activations are rounded to 8 bits. */
template <int T> struct fmt;
template <> struct fmt<BL_TYPE_Q4_K> { enum { BE = 256, BB = 144, G = 8, Q = 1 }; };
template <> struct fmt<BL_TYPE_Q5_K> { enum { BE = 256, BB = 176, G = 8, Q = 1 }; };
template <> struct fmt<BL_TYPE_Q6_K> { enum { BE = 256, BB = 210, G = 8, Q = 1 }; };
template <> struct fmt<BL_TYPE_Q8_0> { enum { BE = 32, BB = 34, G = 32, Q = 1 }; };
/* 96 blocks: a 2880-column row (gpt-oss's experts, both ways) is one group. */
template <> struct fmt<BL_TYPE_MXFP4> { enum { BE = 32, BB = 17, G = 96, Q = 1 }; };
template <> struct fmt<BL_TYPE_F16> { enum { BE = 1, BB = 2, G = 1024, Q = 0 }; };
template <> struct fmt<BL_TYPE_BF16> { enum { BE = 1, BB = 2, G = 1024, Q = 0 }; };
template <> struct fmt<BL_TYPE_F32> { enum { BE = 1, BB = 4, G = 512, Q = 0 }; };

static_assert(fmt<BL_TYPE_Q6_K>::G * fmt<BL_TYPE_Q6_K>::BB <= MV_GROUP_BYTES, "q6_K group");
static_assert(fmt<BL_TYPE_Q5_K>::G * fmt<BL_TYPE_Q5_K>::BB <= MV_GROUP_BYTES, "q5_K group");
static_assert(fmt<BL_TYPE_Q4_K>::G * fmt<BL_TYPE_Q4_K>::BB <= MV_GROUP_BYTES, "q4_K group");
static_assert(fmt<BL_TYPE_Q8_0>::G * fmt<BL_TYPE_Q8_0>::BB <= MV_GROUP_BYTES, "q8_0 group");
static_assert(fmt<BL_TYPE_MXFP4>::G * fmt<BL_TYPE_MXFP4>::BB <= MV_GROUP_BYTES && fmt<BL_TYPE_MXFP4>::G % 32 == 0,
              "mxfp4 group: whole passes of one block per lane");
static_assert(fmt<BL_TYPE_F16>::G * fmt<BL_TYPE_F16>::BB <= MV_GROUP_BYTES, "f16 group");
static_assert(fmt<BL_TYPE_F32>::G * fmt<BL_TYPE_F32>::BB <= MV_GROUP_BYTES, "f32 group");

static __device__ __forceinline__ uint16_t ld_u16(const uint8_t *p)
{
    return *(const uint16_t *)p;
}

static __device__ __forceinline__ uint4 ld_u4(const uint8_t *p)
{
    return *(const uint4 *)p;
}

/* Four words at any byte alignment in shared memory (q6_K's 210-byte, q8_0's
 * 34-byte and mxfp4's 17-byte blocks): five aligned reads and funnel shifts. */
static __device__ __forceinline__ void ldw4(const uint8_t *p, uint32_t *w)
{
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *q = (const uint32_t *)(a & ~(uintptr_t)3);
    const int sh = (int)(a & 3) * 8;
    uint32_t t[5];
#pragma unroll
    for (int i = 0; i < 5; i++)
        t[i] = q[i];
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = __funnelshift_r(t[i], t[i + 1], sh);
}

/* The signed 16-bit half hl (0: low) of a packed pair of sums. */
static __device__ __forceinline__ int half_sum(int v, int hl)
{
    return hl ? v >> 16 : (int)(int16_t)(v & 0xffff);
}

static __device__ __forceinline__ int dot4x4(const uint32_t *w, uint4 x, int acc)
{
    acc = __dp4a((int)w[0], (int)x.x, acc);
    acc = __dp4a((int)w[1], (int)x.y, acc);
    acc = __dp4a((int)w[2], (int)x.z, acc);
    return __dp4a((int)w[3], (int)x.w, acc);
}

/* Scale and min j (0..7) of a q4_K/q5_K block (k_scale_min in common/quant.c). */
static __device__ __forceinline__ void k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* The same from the block's first 16 bytes held in registers (scales in y, z, w). */
static __device__ __forceinline__ void k_scale_min_w(uint4 hd, int j, int *sc, int *m)
{
    const int sh = 8 * (j & 3);
    const int a = (int)(hd.y >> sh) & 0xff, b = (int)(hd.z >> sh) & 0xff, c = (int)(hd.w >> sh) & 0xff;
    if (j < 4) {
        *sc = a & 63;
        *m = b & 63;
    } else {
        *sc = (c & 0xf) | (a >> 6) << 4;
        *m = (c >> 4) | (b >> 6) << 4;
    }
}

/* mxfp4's doubled E2M1 values (bl_e2m1_doubled in common/quant_iq.c) as int8, four
 * codes a word: codes 0..3 (0 1 2 3), 4..7 (4 6 8 12), then their negatives. */
#define MX_LO0 0x03020100u
#define MX_LO1 0x0c080604u
#define MX_HI0 0xfdfeff00u
#define MX_HI1 0xf4f8fafcu

/* The four int8 values of the four 4-bit codes in the low 16 bits of c (code i in
 * bits 4i..4i+3 gives byte i): each code's low 3 bits pick from both halves of
 * the table (__byte_perm reads 3 bits a selector), its bit 3 picks the half. */
static __device__ __forceinline__ uint32_t mx_vals4(uint32_t c)
{
    const uint32_t lo = __byte_perm(MX_LO0, MX_LO1, c), hi = __byte_perm(MX_HI0, MX_HI1, c);
    return __byte_perm(lo, hi, 0x3210u | ((c >> 1) & 0x4444u));
}

// --- rounded activations --------------------------------------------------------------------
/* Where the 16-element unit u of a rounded activation row lives (in units of 16
 * bytes), per format, so that each phase of a lane's 16-byte reads covers 8
 * distinct 16-byte bank groups:
 * - q4_K, q5_K: in each 256-element super-block, lane c (of 8) reads unit c (the
 *   low-nibble half it needs) and unit 8 + c (the high-nibble half): unit 4p + t
 *   (sub-block pair p, quarter t) goes to 8 (t / 2) + 2p + t % 2.
 * - q6_K: lane p (of 4) reads, for each k, unit 4 (k ^ parity) + p: unit
 *   8h + 2k + hl goes to 4 (k ^ (super-block & 1)) + 2h + hl, so that two
 *   neighbouring super-blocks use different banks.
 * - q8_0: in each 8 blocks, first halves at 0..7, second halves at 8..15.
 * - mxfp4: as q8_0, of the block's elements reordered as its code bytes hold them
 *   (byte j: elements j and j + 16), 0 16 1 17 .. 15 31 (round_acts reorders).
 * Rows are padded to 256 elements, so every position is inside the row. */
template <int T>
static __device__ __forceinline__ int xunit(int u)
{
    const int U = u & 15, base = u & ~15;
    if (T == BL_TYPE_Q4_K || T == BL_TYPE_Q5_K)
        return base + ((U & 3) >> 1) * 8 + 2 * (U >> 2) + (U & 1);
    if (T == BL_TYPE_Q6_K)
        return base + 4 * (((U >> 1) & 3) ^ ((u >> 4) & 1)) + 2 * (U >> 3) + (U & 1);
    return base + (U & 1) * 8 + (U >> 1);
}

/* The rounded activations a block reads. Activation row i is `terms` rounded
 * rows, v = i * terms + t for term t (0: the value, 1: the residual it left):
 * row v's bytes at q + v * xs (laid out by xunit), its 32-element scales d and
 * packed half sums s (low half: elements 0..15) at v * xs / 32 + block. f: the
 * f32 rows (i at f + i * ldx) for f16, bf16 and f32 weights. */
typedef struct mv_x {
    const uint8_t *q;
    const float *d;
    const int *s;
    int xs;
    int terms;
    const float *f;
    int64_t ldx;
} mv_x_t;

/* One q8 term of 32 activations, four per lane in a quarter-warp (lanes 8i..8i+7,
 * in element order): d = amax / 127, q = roundf(x * (1 / d)), as act_q8_round in
 * tests/gpu/gpu_test.h. Returns this lane's four q packed as bytes; *d the scale,
 * *s16 the sum of q over this lane's half of the 32 (lanes 0-3: elements 0..15),
 * *hi the other half's sum; v becomes the residual x - d q (f32 product, then f32
 * difference, no FMA: the test's reference takes the same two roundings). Every
 * lane of the warp calls it. */
static __device__ __forceinline__ uint32_t q8_term(float4 &v, float *d, int *s16, int *hi)
{
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    amax = fmaxf(amax, __shfl_xor_sync(KCUDA_FULL_MASK, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(KCUDA_FULL_MASK, amax, 2));
    amax = fmaxf(amax, __shfl_xor_sync(KCUDA_FULL_MASK, amax, 4));
    const float dd = amax / 127.0f;
    const float id = dd > 0.0f ? 1.0f / dd : 0.0f;
    const int q0 = (int)roundf(__fmul_rn(v.x, id)), q1 = (int)roundf(__fmul_rn(v.y, id));
    const int q2 = (int)roundf(__fmul_rn(v.z, id)), q3 = (int)roundf(__fmul_rn(v.w, id));
    int sm = q0 + q1 + q2 + q3;
    sm += __shfl_xor_sync(KCUDA_FULL_MASK, sm, 1);
    sm += __shfl_xor_sync(KCUDA_FULL_MASK, sm, 2);
    *hi = __shfl_xor_sync(KCUDA_FULL_MASK, sm, 4);
    *s16 = sm;
    *d = dd;
    v.x = __fsub_rn(v.x, __fmul_rn(dd, (float)q0));
    v.y = __fsub_rn(v.y, __fmul_rn(dd, (float)q1));
    v.z = __fsub_rn(v.z, __fmul_rn(dd, (float)q2));
    v.w = __fsub_rn(v.w, __fmul_rn(dd, (float)q3));
    return (uint32_t)(q0 & 0xff) | (uint32_t)(q1 & 0xff) << 8 | (uint32_t)(q2 & 0xff) << 16 |
           (uint32_t)(q3 & 0xff) << 24;
}

/* Whether round_acts stores float half sums over both terms (lane_dot_q4,
 * lane_dot_q6t: one activation row a block, where their fewer instructions pay)
 * rather than each term's integer half sums (several rows: the register budget). */
template <int T, int NX>
static __device__ __forceinline__ bool half_sums_f(int terms)
{
    return (T == BL_TYPE_Q4_K || T == BL_TYPE_Q6_K) && terms == 2 && NX == 1;
}

/* Rounds nx activation rows (row i at x + i * ldx, ncols a multiple of 32) into
 * q, d, s, as act_q8_round in tests/gpu/gpu_test.h: per 32 elements d = amax /
 * 127, q = roundf(x * (1 / d)); with two terms the residual x - d * q (f32 product,
 * then f32 difference) is rounded the same way into the next rounded row, so the
 * two integer dots together see about 16 bits of each activation. A quarter-warp
 * per 32 elements, 4 per lane; the whole block calls it (terms is uniform). */
template <int T, int NX>
static __device__ void round_acts(const float *x, int64_t ldx, int nx, int64_t ncols, uint8_t *q,
                                  float *d, int *s, int xs, int terms)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane & 7;
    const int nb32 = (int)(ncols / 32), total = nx * nb32, xb = xs / 32;
    /* item blk = i * nb32 + j, advanced without division */
    int bi = 0, bj = warp * 4 + (lane >> 3);
    while (bj >= nb32 && bi < nx) {
        bj -= nb32;
        bi++;
    }
    for (int b0 = warp * 4; b0 < total; b0 += MV_WARPS * 4) {
        const int blk = b0 + (lane >> 3);
        const bool ok = blk < total;
        const int i = ok ? bi : 0, j = ok ? bj : 0;
        bj += MV_WARPS * 4;
        while (bj >= nb32 && bi < nx) {
            bj -= nb32;
            bi++;
        }
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ok)
            v = __ldg((const float4 *)(x + i * ldx + 32 * j + 4 * sub));
        float hs[2] = {0.0f, 0.0f};
        for (int t = 0; t < terms; t++) {
            float dd;
            int sm, hi;
            const uint32_t pk = q8_term(v, &dd, &sm, &hi);
            uint32_t wd = pk;
            if (T == BL_TYPE_MXFP4) {
                /* word sub of the reordered block: elements 2 sub, 16 + 2 sub, 2 sub + 1,
                 * 17 + 2 sub, from lanes sub / 2 and 4 + sub / 2 of this quarter-warp */
                const int src = (lane & ~7) | (sub >> 1);
                const uint32_t a = __shfl_sync(KCUDA_FULL_MASK, pk, src);
                const uint32_t b = __shfl_sync(KCUDA_FULL_MASK, pk, src + 4);
                wd = __byte_perm(a, b, sub & 1 ? 0x7362u : 0x5140u);
            }
            if (ok) {
                const int vr = i * terms + t;
                *(uint32_t *)(q + vr * xs + 16 * xunit<T>(2 * j + (sub >> 2)) + 4 * (sub & 3)) = wd;
                if (sub == 0) {
                    d[vr * xb + j] = dd;
                    if (!half_sums_f<T, NX>(terms))
                        s[vr * xb + j] = (sm & 0xffff) | (hi << 16);
                }
            }
            if (half_sums_f<T, NX>(terms)) {
                hs[0] = fmaf(dd, (float)sm, hs[0]);
                hs[1] = fmaf(dd, (float)hi, hs[1]);
            }
        }
        /* q4_K and q6_K with two terms: s holds instead the rounded values' sums per
         * 16-element half over both terms, d0 Σq0 + d1 Σq1, as floats: half h of
         * block j at row (i * 2 + h), so that a lane reads its blocks' half in one
         * load. */
        if (half_sums_f<T, NX>(terms) && ok && sub == 0) {
            s[(i * 2) * xb + j] = __float_as_int(hs[0]);
            s[(i * 2 + 1) * xb + j] = __float_as_int(hs[1]);
        }
    }
}

// --- one lane's share of a staged group ------------------------------------------------------
/* lane_dot<T, NX>(s, nb, lane, xv, xr0, nxr, e0, part): adds to part[r] (r < nxr)
 * this lane's part of dot(group, activation row xr0 + r), s the group's first
 * block in shared memory, nb blocks in it, e0 the row element of its first. */

/* q4_K, q5_K: 8 lanes per block, 4 blocks per pass. Lane c = 2p + hh takes the 16
 * bytes qs[32p + 16hh ..] (q5_K: and qh[16hh ..]): elements 64p + 16hh + i of
 * sub-block 2p (low nibbles) and 64p + 32 + 16hh + i of sub-block 2p + 1 (high). */
template <int T, int NX>
static __device__ __forceinline__ void lane_dot_k45(const uint8_t *s, int nb, int lane, const mv_x_t &xv,
                                                    int xr0, int nxr, int64_t e0, float *part)
{
    const int c = lane & 7, p = c >> 1, hh = c & 1;
    const int sb0 = (int)(e0 >> 8), xb = xv.xs >> 5;
#pragma unroll
    for (int pass = 0; pass < fmt<T>::G / 4; pass++) {
        const int blk = pass * 4 + (lane >> 3);
        if (blk >= nb)
            break;
        const uint8_t *b = s + blk * fmt<T>::BB;
        const uint4 hd = ld_u4(b);
        uint32_t lo[4], hi[4];
        if (T == BL_TYPE_Q4_K) {
            const uint4 qv = ld_u4(b + 16 + 16 * c);
            const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo[i] = qw[i] & 0x0f0f0f0fu;
                hi[i] = (qw[i] >> 4) & 0x0f0f0f0fu;
            }
        } else {
            const uint4 qv = ld_u4(b + 48 + 16 * c), hv = ld_u4(b + 16 + 16 * hh);
            const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w}, hw[4] = {hv.x, hv.y, hv.z, hv.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo[i] = (qw[i] & 0x0f0f0f0fu) | (((hw[i] >> (2 * p)) << 4) & 0x10101010u);
                hi[i] = ((qw[i] >> 4) & 0x0f0f0f0fu) | (((hw[i] >> (2 * p + 1)) << 4) & 0x10101010u);
            }
        }
        const float d = kc_half((uint16_t)(hd.x & 0xffff)), dmin = kc_half((uint16_t)(hd.x >> 16));
        int sc0, m0, sc1, m1;
        k_scale_min_w(hd, 2 * p, &sc0, &m0);
        k_scale_min_w(hd, 2 * p + 1, &sc1, &m1);
        const float ds0 = d * (float)sc0, dm0 = dmin * (float)m0;
        const float ds1 = d * (float)sc1, dm1 = dmin * (float)m1;
        const int sb = sb0 + blk, j0 = sb * 8 + 2 * p, ul = sb * 16 + c;
#pragma unroll
        for (int r = 0; r < NX; r++) {
            if (r >= nxr)
                break;
#pragma unroll
            for (int t = 0; t < 2; t++) {
                if (t >= xv.terms)
                    break;
                const int xr = (xr0 + r) * xv.terms + t;
                const uint8_t *xq = xv.q + xr * xv.xs;
                const int il = dot4x4(lo, ld_u4(xq + 16 * ul), 0);
                const int ih = dot4x4(hi, ld_u4(xq + 16 * (ul + 8)), 0);
                const float *xd = xv.d + xr * xb + j0;
                const int *xsum = xv.s + xr * xb + j0;
                const int s0 = half_sum(xsum[0], hh), s1 = half_sum(xsum[1], hh);
                part[r] += xd[0] * (ds0 * (float)il - dm0 * (float)s0) + xd[1] * (ds1 * (float)ih - dm1 * (float)s1);
            }
        }
    }
}

/* The scales and mins of blocks 2p and 2p + 1 of a q4_K super-block from its header
 * words (k_scale_min for j = 2p, 2p + 1) without branches: one word, bytes sc(2p),
 * sc(2p + 1), m(2p), m(2p + 1). sel and the masks depend only on p (q4_sel). */
typedef struct q4_sel {
    uint32_t yz, w;   /* __byte_perm selectors: Y/Z bytes k, k + 1; W bytes k, k + 1 twice */
    uint32_t lo, hi;  /* p < 2: 0x3f3f3f3f and 0; p >= 2: 0 and ~0 */
} q4_sel_t;

static __device__ __forceinline__ q4_sel_t q4_sel(int p)
{
    const uint32_t k = p < 2 ? 2 * p : 2 * p - 4;
    q4_sel_t q;
    q.yz = k | (k + 1) << 4 | (k + 4) << 8 | (k + 5) << 12;
    q.w = k | (k + 1) << 4 | k << 8 | (k + 1) << 12;
    q.lo = p < 2 ? 0x3f3f3f3fu : 0u;
    q.hi = p < 2 ? 0u : ~0u;
    return q;
}

static __device__ __forceinline__ uint32_t q4_scales(uint4 hd, const q4_sel_t &q)
{
    const uint32_t a = __byte_perm(hd.y, hd.z, q.yz), w = __byte_perm(hd.w, 0, q.w);
    const uint32_t low = (w & 0x00000f0fu) | ((w >> 4) & 0x0f0f0000u); /* 4 low bits (j >= 4) */
    return (a & q.lo) | ((low | ((a >> 2) & 0x30303030u)) & q.hi);
}

/* q4_K with two activation terms, one activation row (xr0): the lanes as
 * lane_dot_k45, but each block's mins come off once against the rounded values'
 * float half sums over both terms (as round_acts stores them then), and the scales
 * are decoded without branches. */
static __device__ __forceinline__ void lane_dot_q4(const uint8_t *s, int nb, int lane, const mv_x_t &xv, int xr0,
                                                   int64_t e0, float *part)
{
    const int c = lane & 7, p = c >> 1, hh = c & 1;
    const int sb0 = (int)(e0 >> 8), xb = xv.xs >> 5;
    const q4_sel_t qs = q4_sel(p);
#pragma unroll
    for (int pass = 0; pass < fmt<BL_TYPE_Q4_K>::G / 4; pass++) {
        const int blk = pass * 4 + (lane >> 3);
        if (blk >= nb)
            break;
        const uint8_t *b = s + blk * 144;
        const uint4 hd = ld_u4(b), qv = ld_u4(b + 16 + 16 * c);
        const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w};
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = qw[i] & 0x0f0f0f0fu;
            hi[i] = (qw[i] >> 4) & 0x0f0f0f0fu;
        }
        const float2 dd = __half22float2(*(const __half2 *)&hd.x);
        const uint32_t sm = q4_scales(hd, qs);
        const float ds0 = dd.x * (float)(sm & 0xff), ds1 = dd.x * (float)((sm >> 8) & 0xff);
        const float dm0 = dd.y * (float)((sm >> 16) & 0xff), dm1 = dd.y * (float)(sm >> 24);
        const int sb = sb0 + blk, j0 = sb * 8 + 2 * p, ul = sb * 16 + c;
        const int x0 = xr0 * 2;
        const uint8_t *q0 = xv.q + x0 * xv.xs, *q1 = q0 + xv.xs;
        const int il0 = dot4x4(lo, ld_u4(q0 + 16 * ul), 0), ih0 = dot4x4(hi, ld_u4(q0 + 16 * (ul + 8)), 0);
        const int il1 = dot4x4(lo, ld_u4(q1 + 16 * ul), 0), ih1 = dot4x4(hi, ld_u4(q1 + 16 * (ul + 8)), 0);
        const float2 d0 = *(const float2 *)(xv.d + x0 * xb + j0), d1 = *(const float2 *)(xv.d + (x0 + 1) * xb + j0);
        const float2 hs = *(const float2 *)(xv.s + (x0 + hh) * xb + j0);
        const float fl = fmaf(d0.x, (float)il0, d1.x * (float)il1), fh = fmaf(d0.y, (float)ih0, d1.y * (float)ih1);
        part[0] += fmaf(ds0, fl, fmaf(ds1, fh, -fmaf(dm0, hs.x, dm1 * hs.y)));
    }
}

/* A q6_K lane's share of its block b (lane_dot_q6's lanes: half h, positions l in
 * 16 hl .. 16 hl + 15): for each k its 16 six-bit values as bytes (q + 32) in qk[k]
 * and d times the scale in dk[k]. */
static __device__ __forceinline__ void q6_lane_vals(const uint8_t *b, int h, int hl, float dk[4], uint32_t qk[4][4])
{
    uint32_t A[4], C[4], H[4];
    ldw4(b + 64 * h + 16 * hl, A);
    ldw4(b + 64 * h + 32 + 16 * hl, C);
    ldw4(b + 128 + 32 * h + 16 * hl, H);
    const float d = kc_half(ld_u16(b + 208));
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * h + hl);
#pragma unroll
    for (int k = 0; k < 4; k++)
        dk[k] = d * (float)sc[2 * k];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        qk[0][i] = (A[i] & 0x0f0f0f0fu) | ((H[i] << 4) & 0x30303030u);
        qk[1][i] = (C[i] & 0x0f0f0f0fu) | ((H[i] << 2) & 0x30303030u);
        qk[2][i] = ((A[i] >> 4) & 0x0f0f0f0fu) | (H[i] & 0x30303030u);
        qk[3][i] = ((C[i] >> 4) & 0x0f0f0f0fu) | ((H[i] >> 2) & 0x30303030u);
    }
}

/* q6_K: 4 lanes per block; lane p takes half h = p / 2 and l in 16 (p % 2) .. +15
 * of it, and for each l the four elements 128h + 32k + l (k = 0..3): low nibbles
 * from ql[64h + l] (k = 0, 2) and ql[64h + 32 + l] (k = 1, 3), two high bits at bit
 * 2k of qh[32h + l], scale scales[8h + 2k + p % 2]. q - 32 by the activations'
 * half sums. Blocks are 210 bytes: word reads through ldw4. */
template <int NX>
static __device__ __forceinline__ void lane_dot_q6(const uint8_t *s, int nb, int lane, const mv_x_t &xv,
                                                   int xr0, int nxr, int64_t e0, float *part)
{
    const int blk = lane >> 2, p = lane & 3, h = p >> 1, hl = p & 1;
    if (blk >= nb)
        return;
    float dk[4];
    uint32_t qk[4][4];
    q6_lane_vals(s + blk * 210, h, hl, dk, qk);
    const int sb = (int)(e0 >> 8) + blk, par = sb & 1, xb = xv.xs >> 5;
#pragma unroll
    for (int r = 0; r < NX; r++) {
        if (r >= nxr)
            break;
#pragma unroll
        for (int tm = 0; tm < 2; tm++) {
            if (tm >= xv.terms)
                break;
            const int xr = (xr0 + r) * xv.terms + tm;
            const uint8_t *xq = xv.q + xr * xv.xs + 16 * (sb * 16 + p);
            const float *xd = xv.d + xr * xb + sb * 8 + 4 * h;
            const int *xsum = xv.s + xr * xb + sb * 8 + 4 * h;
            float t = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int is = dot4x4(qk[k], ld_u4(xq + 64 * (k ^ par)), 0);
                t += dk[k] * xd[k] * (float)(is - 32 * half_sum(xsum[k], hl));
            }
            part[r] += t;
        }
    }
}

/* q6_K with two activation terms, one activation row (xr0): the lanes as
 * lane_dot_q6, but the -32 comes off once per 32-element group against the float
 * half sums over both terms (as round_acts stores them then), and a lane reads its
 * four groups' scales and sums with one load per term. */
static __device__ __forceinline__ void lane_dot_q6t(const uint8_t *s, int nb, int lane, const mv_x_t &xv, int xr0,
                                                    int64_t e0, float *part)
{
    const int blk = lane >> 2, p = lane & 3, h = p >> 1, hl = p & 1;
    if (blk >= nb)
        return;
    float dk[4];
    uint32_t qk[4][4];
    q6_lane_vals(s + blk * 210, h, hl, dk, qk);
    const int sb = (int)(e0 >> 8) + blk, par = sb & 1, xb = xv.xs >> 5, j0 = sb * 8 + 4 * h;
    const int x0 = xr0 * 2;
    const uint8_t *q0 = xv.q + x0 * xv.xs + 16 * (sb * 16 + p), *q1 = q0 + xv.xs;
    const float4 d0 = *(const float4 *)(xv.d + x0 * xb + j0), d1 = *(const float4 *)(xv.d + (x0 + 1) * xb + j0);
    const float4 hs = *(const float4 *)((const float *)xv.s + (x0 + hl) * xb + j0);
    const float dx0[4] = {d0.x, d0.y, d0.z, d0.w}, dx1[4] = {d1.x, d1.y, d1.z, d1.w};
    const float sx[4] = {hs.x, hs.y, hs.z, hs.w};
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int i0 = dot4x4(qk[k], ld_u4(q0 + 64 * (k ^ par)), 0);
        const int i1 = dot4x4(qk[k], ld_u4(q1 + 64 * (k ^ par)), 0);
        t = fmaf(dk[k], fmaf(dx0[k], (float)i0, fmaf(dx1[k], (float)i1, -32.0f * sx[k])), t);
    }
    part[0] += t;
}

/* The 32 int8 weights w of activation block bi (q8_0's, or mxfp4's codes turned
 * into values) against each rounded activation row and term: part[r] += d * the
 * block's activation scale * the integer sum. */
template <int NX>
static __device__ __forceinline__ void block32_dot(const uint32_t *w, float d, int bi, const mv_x_t &xv, int xr0,
                                                   int nxr, float *part)
{
    const int u0 = (bi >> 3) * 16 + (bi & 7), xb = xv.xs >> 5;
#pragma unroll
    for (int r = 0; r < NX; r++) {
        if (r >= nxr)
            break;
#pragma unroll
        for (int t = 0; t < 2; t++) {
            if (t >= xv.terms)
                break;
            const int xr = (xr0 + r) * xv.terms + t;
            const uint8_t *xq = xv.q + xr * xv.xs;
            const int is = dot4x4(w + 4, ld_u4(xq + 16 * (u0 + 8)), dot4x4(w, ld_u4(xq + 16 * u0), 0));
            part[r] += d * xv.d[xr * xb + bi] * (float)is;
        }
    }
}

/* q8_0: one 34-byte block per lane. */
template <int NX>
static __device__ __forceinline__ void lane_dot_q8(const uint8_t *s, int nb, int lane, const mv_x_t &xv,
                                                   int xr0, int nxr, int64_t e0, float *part)
{
    if (lane >= nb)
        return;
    const uint8_t *b = s + lane * 34;
    const float d = kc_half(ld_u16(b));
    uint32_t w[8];
    ldw4(b + 2, w);
    ldw4(b + 18, w + 4);
    block32_dot<NX>(w, d, (int)(e0 >> 5) + lane, xv, xr0, nxr, part);
}

/* mxfp4: one 17-byte block per lane, G / 32 passes. Code word i (bytes 4i..4i+3)
 * holds elements 4i.. (low nibbles) and 4i + 16.. (high), interleaved as the
 * rounded activations are (xunit), so its low and high 16 bits give the values of
 * activation words 2i and 2i + 1 as they are. Doubled values times the halved
 * scale, as bl_dequantize_row_mxfp4_ref. */
template <int NX>
static __device__ __forceinline__ void lane_dot_mx(const uint8_t *s, int nb, int lane, const mv_x_t &xv,
                                                   int xr0, int nxr, int64_t e0, float *part)
{
    typedef fmt<BL_TYPE_MXFP4> F;
#pragma unroll
    for (int pass = 0; pass < F::G / 32; pass++) {
        const int blk = pass * 32 + lane;
        if (blk >= nb)
            break;
        const uint8_t *b = s + blk * F::BB;
        uint32_t c[4], w[8];
        ldw4(b + 1, c);
        const float d = kc_mx_scale(b[0]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = mx_vals4(c[i]);
            w[2 * i + 1] = mx_vals4(c[i] >> 16);
        }
        block32_dot<NX>(w, d, (int)(e0 >> 5) + blk, xv, xr0, nxr, part);
    }
}

/* f16, bf16, f32: lane-strided elements (conflict-free shared-memory reads,
 * coalesced activation reads); any row length. */
template <int T>
static __device__ __forceinline__ float plain_elem(const uint8_t *s, int e)
{
    if (T == BL_TYPE_F32)
        return *(const float *)(s + 4 * e);
    if (T == BL_TYPE_F16)
        return kc_half(ld_u16(s + 2 * e));
    return kc_bf16(ld_u16(s + 2 * e));
}

template <int T, int NX>
static __device__ __forceinline__ void lane_dot(const uint8_t *s, int nb, int lane, const mv_x_t &xv, int xr0,
                                                int nxr, int64_t e0, float *part)
{
    if (half_sums_f<T, NX>(xv.terms) && T == BL_TYPE_Q4_K) {
        lane_dot_q4(s, nb, lane, xv, xr0, e0, part);
    } else if (T == BL_TYPE_Q4_K || T == BL_TYPE_Q5_K) {
        lane_dot_k45<T, NX>(s, nb, lane, xv, xr0, nxr, e0, part);
    } else if (half_sums_f<T, NX>(xv.terms)) {
        lane_dot_q6t(s, nb, lane, xv, xr0, e0, part);
    } else if (T == BL_TYPE_Q6_K) {
        lane_dot_q6<NX>(s, nb, lane, xv, xr0, nxr, e0, part);
    } else if (T == BL_TYPE_Q8_0) {
        lane_dot_q8<NX>(s, nb, lane, xv, xr0, nxr, e0, part);
    } else if (T == BL_TYPE_MXFP4) {
        lane_dot_mx<NX>(s, nb, lane, xv, xr0, nxr, e0, part);
    } else {
        for (int e = lane; e < nb; e += 32) {
            const float w = plain_elem<T>(s, e);
#pragma unroll
            for (int r = 0; r < NX; r++) {
                if (r >= nxr)
                    break;
                part[r] += w * __ldg(xv.f + (xr0 + r) * xv.ldx + e0 + e);
            }
        }
    }
}

// --- segments and the kernel ---------------------------------------------------------------

static __device__ __forceinline__ void cp16(uint8_t *dst, const void *src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

/* One segment: nb whole blocks at src (NULL: an expert id out of range, nothing);
 * paired (mv_work_t.pair), a second expert's row of nb blocks at src2 too. */
typedef struct mv_seg {
    const uint8_t *src, *src2;
    int nb;
} mv_seg_t;

/* Where a paired segment's second span starts in its stage: each span (4 q6_K
 * blocks, aligned, and ldw4's 4 bytes past) fits its half. */
#define MV_PAIR_OFF 1024
static_assert(16 + 4 * 210 + 4 <= MV_PAIR_OFF && MV_PAIR_OFF + 16 + 4 * 210 + 4 <= MV_STAGE_BYTES, "q6_K pairs");

/* The warp's work: nrow rows r0, r0 + MV_WARPS, ...; each of nparts parts of
 * ngroups groups, walked in that order (segment t is group t % ngroups of part
 * (t / ngroups) % nparts of row t / (ngroups * nparts)). */
typedef struct mv_work {
    int64_t r0;
    int64_t nblk;  /* blocks per row */
    int ngroups, nparts;
    /* Down products over q6_K rows of at most 4 blocks (768 columns: 3 blocks, 12
     * of the warp's 32 lanes): part q holds choices 2q and 2q + 1, one per half of
     * the warp, so each segment keeps 24 lanes busy and there are half as many. */
    int pair;
    /* Expert modes: the block's expert ids (gate/up: its slot's one; down: its
     * row's k), in global memory or, routed, in the warp's shared copy. */
    const int32_t *ids;
    /* Plain and gate/up modes: where part q's rows start (w, w2; the slot's expert's
     * rows), NULL for none (an expert id out of range), found once per block. */
    const uint8_t *base[2];
} mv_work_t;

/* A position in the warp's walk: group g of part q of the warp's row i. The walk
 * advances with increments (no division: the decode loop is instruction-bound). */
typedef struct mv_pos {
    int g, q, i;
} mv_pos_t;

static __device__ __forceinline__ void pos_next(mv_pos_t &p, const mv_work_t &wk)
{
    if (++p.g == wk.ngroups) {
        p.g = 0;
        if (++p.q == wk.nparts) {
            p.q = 0;
            p.i++;
        }
    }
}

template <int T>
static __device__ __forceinline__ mv_seg_t seg_at(const mv_args_t &a, const mv_work_t &wk, const mv_pos_t &p)
{
    const int64_t r = wk.r0 + (int64_t)p.i * MV_WARPS;
    const uint8_t *row = NULL, *row2 = NULL;
    if (a.mode != MV_EXPERT_DOWN) {
        const uint8_t *b = p.q ? wk.base[1] : wk.base[0];
        row = b ? b + r * a.row_bytes : NULL;
    } else if (wk.pair) {
        const int j = 2 * p.q;
        const int32_t e = wk.ids[j], e2 = j + 1 < a.k ? wk.ids[j + 1] : -1;
        if (e >= 0 && e < a.n_expert)
            row = a.w + ((int64_t)e * a.nrows + r) * a.row_bytes;
        if (e2 >= 0 && e2 < a.n_expert)
            row2 = a.w + ((int64_t)e2 * a.nrows + r) * a.row_bytes;
    } else {
        const int32_t e = wk.ids[p.q];
        if (e >= 0 && e < a.n_expert)
            row = a.w + ((int64_t)e * a.nrows + r) * a.row_bytes;
    }
    mv_seg_t sg;
    const int64_t left = wk.nblk - (int64_t)p.g * fmt<T>::G;
    sg.nb = row || row2 ? (int)(left < fmt<T>::G ? left : fmt<T>::G) : 0;
    sg.src = row ? row + (size_t)p.g * fmt<T>::G * fmt<T>::BB : NULL;
    sg.src2 = row2; /* paired segments are whole rows (one group) */
    return sg;
}

/* Starts the copies of a segment's aligned span into a stage (the calling lane's
 * share); the caller commits. */
template <int T>
static __device__ __forceinline__ void issue_span(uint8_t *dst, const uint8_t *src, int nb, int lane)
{
    const uintptr_t a0 = (uintptr_t)src & ~(uintptr_t)15;
    const uintptr_t a1 = ((uintptr_t)src + (uintptr_t)nb * fmt<T>::BB + 15) & ~(uintptr_t)15;
    const int nv = (int)((a1 - a0) >> 4);
    for (int i = lane; i < nv; i += 32)
        cp16(dst + 16 * i, (const void *)(a0 + 16 * (uintptr_t)i));
}

template <int T>
static __device__ __forceinline__ void issue(uint8_t *dst, mv_seg_t sg, int lane)
{
    if (sg.src)
        issue_span<T>(dst, sg.src, sg.nb, lane);
    if (sg.src2)
        issue_span<T>(dst + MV_PAIR_OFF, sg.src2, sg.nb, lane);
}

/* Where output row r of a plain product goes (split outputs: rows r1.. to y1, r2..
 * to y2, the rest to y): the output's base, its ldy in *ldo and the row in it in
 * *ro. mv_args_t and mq_args_t name these fields alike. */
template <typename A>
static __device__ __forceinline__ float *out_row(const A &a, int64_t r, int64_t *ldo, int64_t *ro)
{
    if (r >= a.r2) {
        *ldo = a.ldy2;
        *ro = r - a.r2;
        return a.y2;
    }
    if (r >= a.r1) {
        *ldo = a.ldy1;
        *ro = r - a.r1;
        return a.y1;
    }
    *ldo = a.ldy;
    *ro = r;
    return a.y;
}

/* Output row r's bias (plain mode's split outputs, as out_row), NULL for none. */
template <typename A>
static __device__ __forceinline__ const float *out_bias(const A &a, int64_t r)
{
    if (r >= a.r2)
        return a.pb2 ? a.pb2 + (r - a.r2) : NULL;
    if (r >= a.r1)
        return a.pb1 ? a.pb1 + (r - a.r1) : NULL;
    return a.pb ? a.pb + r : NULL;
}

/* *y = o, or *y + o with acc, then the bias (the order of a product, its
 * accumulation, then a bias added after them). */
static __device__ __forceinline__ void put_out(float *y, float o, int acc, const float *bias)
{
    float t = acc ? *y + o : o;
    if (bias)
        t += *bias;
    *y = t;
}

/* The warp's segments: decode each as it lands, keep MV_STAGES - 1 ahead, sum and
 * write each row when its last part ends. pend: the segments the prologue issued
 * (positions 0 .. MV_STAGES - 2), rotated as the walk goes; stage t % MV_STAGES
 * holds segment t. B: the plain outputs have biases (mv_launch's choice: a kernel
 * without them keeps no bias pointer live across the walk, which costs the
 * products without biases a few per cent). */
template <int T, int NX, int B>
static __device__ __forceinline__ void mv_rows(const mv_args_t &a, const mv_work_t &wk, const mv_x_t &xv,
                                               uint8_t *stg, int nseg, int64_t slot, int lane,
                                               mv_seg_t (&pend)[MV_STAGES - 1])
{
    typedef fmt<T> F;
    float acc[NX], acc2[NX], part[NX];
#pragma unroll
    for (int i = 0; i < NX; i++)
        acc[i] = acc2[i] = part[i] = 0.0f;
    const int nxr = a.mode == MV_PLAIN ? a.n : 1;
    mv_pos_t cur = {0, 0, 0}, ahead = {0, 0, 0};
    for (int j = 0; j < MV_STAGES - 1; j++)
        pos_next(ahead, wk);
    int st = 0, st_ahead = MV_STAGES - 1;
    for (int t = 0; t < nseg; t++) {
        __syncwarp(); /* every lane is done with the stage segment t + MV_STAGES - 1 reuses */
        mv_seg_t nxt = {NULL, NULL, 0};
        if (t + MV_STAGES - 1 < nseg) {
            nxt = seg_at<T>(a, wk, ahead);
            issue<T>(stg + st_ahead * MV_STAGE_BYTES, nxt, lane);
        }
        pos_next(ahead, wk);
        st_ahead = st_ahead == MV_STAGES - 1 ? 0 : st_ahead + 1;
        kc_cp_async_commit();
        kc_cp_async_wait<MV_STAGES - 1>(); /* this lane's copies of segment t have landed */
        __syncwarp();             /* and every lane's */
        const mv_seg_t sg = pend[0];
#pragma unroll
        for (int j = 0; j + 1 < MV_STAGES - 1; j++)
            pend[j] = pend[j + 1];
        pend[MV_STAGES - 2] = nxt;
        const int g = cur.g, q = cur.q, i = cur.i;
        pos_next(cur, wk);
        const uint8_t *sbase = stg + st * MV_STAGE_BYTES;
        st = st == MV_STAGES - 1 ? 0 : st + 1;
        /* paired: this lane's half of the warp and its choice */
        const int half = lane >> 4;
        const uint8_t *mine = half ? sg.src2 : sg.src;
        if (T == BL_TYPE_Q6_K && wk.pair) {
            if (mine)
                lane_dot<T, NX>(sbase + half * MV_PAIR_OFF + ((uintptr_t)mine & 15), sg.nb, lane & 15, xv,
                                2 * q + half, nxr, 0, part);
        } else {
            lane_dot<T, NX>(sbase + ((uintptr_t)sg.src & 15), sg.nb, lane, xv, a.mode == MV_EXPERT_DOWN ? q : 0,
                            nxr, (int64_t)g * F::G * F::BE, part);
        }
        if (g != wk.ngroups - 1)
            continue;
        /* end of a part */
        if (a.mode == MV_EXPERT_DOWN) {
            /* the bias once per choice: on the first lane of those the warp sums */
            const int64_t rb = wk.r0 + (int64_t)i * MV_WARPS;
            if (T == BL_TYPE_Q6_K && wk.pair) {
                if (mine) {
                    const int j = 2 * q + half;
                    acc[0] += a.wts[slot * a.k + j] * part[0];
                    if (a.b1 && (lane & 15) == 0)
                        acc[0] += a.wts[slot * a.k + j] * a.b1[(int64_t)wk.ids[j] * a.nrows + rb];
                }
            } else if (sg.src) {
                acc[0] += a.wts[slot * a.k + q] * part[0];
                if (a.b1 && lane == 0)
                    acc[0] += a.wts[slot * a.k + q] * a.b1[(int64_t)wk.ids[q] * a.nrows + rb];
            }
        } else {
#pragma unroll
            for (int j = 0; j < NX; j++) {
                if (q)
                    acc2[j] = part[j];
                else
                    acc[j] = part[j];
            }
        }
#pragma unroll
        for (int j = 0; j < NX; j++)
            part[j] = 0.0f;
        if (q != wk.nparts - 1)
            continue;
        /* end of a row */
        const int64_t r = wk.r0 + (int64_t)i * MV_WARPS;
        const int64_t yrow = a.mode == MV_PLAIN ? 0 : slot;
        /* the output this row goes to (split outputs: plain mode only) */
        int64_t ldo, ro;
        float *yo = out_row(a, r, &ldo, &ro);
#pragma unroll
        for (int j = 0; j < NX; j++) {
            if (j >= nxr)
                break;
            float v = kc_warp_sum(acc[j]);
            float u = a.w2 ? kc_warp_sum(acc2[j]) : 0.0f;
            if (lane == 0) {
                if (a.mode == MV_EXPERT && (a.b1 || a.b2)) { /* the slot's expert's biases */
                    const int32_t e = wk.ids[0];
                    if (e >= 0 && e < a.n_expert) {
                        if (a.b1)
                            v += a.b1[(int64_t)e * a.nrows + r];
                        if (a.b2)
                            u += a.b2[(int64_t)e * a.nrows + r];
                    }
                }
                const float o = !a.w2 ? v : a.act == KCUDA_ACT_SWIGLU_OAI ? kc_act_oai(v, u) : kc_silu_mul(v, u);
                put_out(yo + (yrow + j) * ldo + ro, o, a.accumulate, B ? out_bias(a, r) : NULL);
            }
            acc[j] = acc2[j] = 0.0f;
        }
    }
}

/* One block of a product: block column bx of grid (ceil(nrows / (MV_WARPS * rpw)),
 * slots): slots = 1 (plain), n * k (expert), n (down). Dynamic shared memory: the
 * stages, then (block formats) the rounded activations: nx * terms rows of xs bytes,
 * then nx * terms * xs / 32 scales and as many sums. */
template <int T, int NX, int B>
static __device__ __forceinline__ void mv_body(const mv_args_t &a, unsigned bx)
{
    typedef fmt<T> F;
    extern __shared__ __align__(16) uint8_t mv_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t *stg = mv_smem + warp * (MV_STAGES * MV_STAGE_BYTES);

    mv_work_t wk;
    wk.r0 = (int64_t)bx * MV_WARPS * a.rpw + warp;
    wk.nblk = a.ncols / F::BE;
    wk.ngroups = (int)((wk.nblk + F::G - 1) / F::G);
    wk.pair = T == BL_TYPE_Q6_K && a.mode == MV_EXPERT_DOWN && wk.nblk <= 4;
    wk.nparts = a.mode == MV_EXPERT_DOWN ? (wk.pair ? (a.k + 1) / 2 : a.k) : (a.w2 ? 2 : 1);
    const int64_t left = a.nrows - wk.r0;
    const int nrow = left > 0 ? (int)min((int64_t)a.rpw, (left + MV_WARPS - 1) / MV_WARPS) : 0;
    const int nseg = nrow * wk.nparts * wk.ngroups;

    /* The activation rows this block reads: row i at xb + i * ldx. */
    const int64_t slot = blockIdx.y;
    const float *xb = a.x;
    int nx = a.n;
    if (a.mode == MV_EXPERT) {
        xb = a.x + (slot / a.k) * a.ldx;
        nx = 1;
    } else if (a.mode == MV_EXPERT_DOWN) {
        xb = a.x + slot * a.k * a.ldx;
        nx = a.k;
    }

    /* The first segments' copies go out before the rounding, which hides under them.
     * A plain product's segments are weights only, so they are issued before
     * waiting for the previous kernel (kc_wait_prior); the expert modes read the
     * routing it wrote to find theirs. */
    const bool early = a.mode == MV_PLAIN;
    if (!early)
        kc_wait_prior();
    /* Routed: each warp routes the block's row from the logits (read through L2)
     * into its own shared copy, so no block barrier is needed before the first
     * copies; the same arithmetic as kcuda_moe_route. */
    wk.ids = a.mode == MV_EXPERT ? a.ids + slot : a.ids + slot * a.k;
    if (a.mode == MV_EXPERT && a.logits) {
        int32_t *rid = (int32_t *)(mv_smem + a.route_off) + warp * KCUDA_MOE_MAX_K;
        float *rwt = (float *)(mv_smem + a.route_off) + (MV_WARPS + warp) * KCUDA_MOE_MAX_K;
        const int64_t row = slot / a.k;
        kc_moe_route_row<MV_ROUTE_MAX / 32, false>(a.logits + row * a.n_expert, (int)a.n_expert, a.k, a.route, rid, rwt,
                                            lane);
        __syncwarp();
        wk.ids = rid + (slot - row * a.k);
        if (bx == 0 && slot == row * a.k && warp == 0 && lane < a.k) {
            a.ids_out[row * a.k + lane] = rid[lane];
            a.wts_out[row * a.k + lane] = rwt[lane];
        }
    }
    wk.base[0] = a.w;
    wk.base[1] = a.w2;
    if (a.mode == MV_EXPERT) {
        const int32_t e = wk.ids[0];
        const size_t off = (size_t)e * (size_t)a.nrows * a.row_bytes;
        const bool ok = e >= 0 && e < a.n_expert;
        wk.base[0] = ok ? a.w + off : NULL;
        wk.base[1] = ok && a.w2 ? a.w2 + off : NULL;
    }
    mv_seg_t pend[MV_STAGES - 1];
    mv_pos_t p0 = {0, 0, 0};
#pragma unroll
    for (int t = 0; t < MV_STAGES - 1; t++) {
        pend[t] = (mv_seg_t){NULL, NULL, 0};
        if (t < nseg) {
            pend[t] = seg_at<T>(a, wk, p0);
            issue<T>(stg + t * MV_STAGE_BYTES, pend[t], lane);
        }
        pos_next(p0, wk);
        kc_cp_async_commit();
    }
    if (early)
        kc_wait_prior();
    kc_allow_next();
    mv_x_t xv;
    xv.f = xb;
    xv.ldx = a.ldx;
    xv.xs = a.xs;
    xv.terms = a.terms;
    xv.q = mv_smem + MV_STAGE_ALL;
    xv.d = (const float *)(xv.q + (size_t)nx * a.terms * a.xs);
    xv.s = (const int *)(xv.d + (size_t)nx * a.terms * (a.xs / 32));
    if (F::Q) {
        round_acts<T, NX>(xb, a.ldx, nx, a.ncols, (uint8_t *)xv.q, (float *)xv.d, (int *)xv.s, a.xs, a.terms);
        __syncthreads(); /* the only block-wide barrier: every warp reaches it */
    }
    if (nseg == 0)
        kc_cp_async_wait<0>();
    else
        mv_rows<T, NX, B>(a, wk, xv, stg, nseg, slot, lane, pend);
}

template <int T, int NX, int B>
__global__ void __launch_bounds__(MV_THREADS, MV_MIN_BLOCKS) mv_kernel(const mv_args_t a)
{
    mv_body<T, NX, B>(a, blockIdx.x);
}

/* Two plain products over the same activations in one launch (kcuda_matvec_split2):
 * block columns below nbx1 are a1's, the rest a2's; each block is what its own
 * launch would run, so the bits are those of the two launches. */
template <int T1, int T2, int NX, int B>
__global__ void __launch_bounds__(MV_THREADS, MV_MIN_BLOCKS)
mv_kernel2(const mv_args_t a1, const mv_args_t a2, unsigned nbx1)
{
    if (blockIdx.x < nbx1)
        mv_body<T1, NX, B>(a1, blockIdx.x);
    else
        mv_body<T2, NX, B>(a2, blockIdx.x - nbx1);
}

// --- small f32 / f16 / bf16 matrices -------------------------------------------------------
/* The plain product of a matrix with few rows (the MoE router: 128 x 2048 f32, 1
 * MB), where the streaming kernel's one-warp-per-row grid would leave most SMs
 * idle and each warp with a long serial walk: here a block of SM_THREADS threads
 * per output row, each thread 4 elements per pass (one 16-byte weight load for
 * f32, 8 bytes for f16/bf16), every pass's loads independent, then a fixed-order
 * block sum (warp shuffles, then the warps in order), so the bits do not depend
 * on timing. ncols a multiple of 4 (row starts 16- or 8-byte aligned). */
#define SM_THREADS 128
#define SM_PRE 4 /* weight passes loaded before kc_wait_prior: 2048 columns */

template <int T>
static __device__ __forceinline__ float4 ld_w4(const uint8_t *row, int64_t e)
{
    if (T == BL_TYPE_F32)
        return __ldg((const float4 *)(row + 4 * e));
    const uint2 h = __ldg((const uint2 *)(row + 2 * e));
    if (T == BL_TYPE_F16)
        return make_float4(kc_half((uint16_t)(h.x & 0xffff)), kc_half((uint16_t)(h.x >> 16)),
                           kc_half((uint16_t)(h.y & 0xffff)), kc_half((uint16_t)(h.y >> 16)));
    return make_float4(kc_bf16((uint16_t)(h.x & 0xffff)), kc_bf16((uint16_t)(h.x >> 16)),
                       kc_bf16((uint16_t)(h.y & 0xffff)), kc_bf16((uint16_t)(h.y >> 16)));
}

/* grid (nrows): block i computes y[j][i] for the n activation rows j. */
template <int T, int NX>
__global__ void __launch_bounds__(SM_THREADS) mv_small_kernel(const mv_args_t a)
{
    __shared__ float red[SM_THREADS / 32][NX];
    const int64_t i = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint8_t *row = a.w + (size_t)i * a.row_bytes;
    /* The first SM_PRE passes' weights (constant) load before the wait for the
     * previous kernel; the activations after it. */
    float4 wpre[SM_PRE];
#pragma unroll
    for (int c = 0; c < SM_PRE; c++) {
        const int64_t e = 4 * (int64_t)tid + (int64_t)c * 4 * SM_THREADS;
        wpre[c] = e < a.ncols ? ld_w4<T>(row, e) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    kc_wait_prior();
    kc_allow_next();
    float acc[NX];
#pragma unroll
    for (int j = 0; j < NX; j++)
        acc[j] = 0.0f;
#pragma unroll
    for (int c = 0; c < SM_PRE; c++) {
        const int64_t e = 4 * (int64_t)tid + (int64_t)c * 4 * SM_THREADS;
        if (e >= a.ncols)
            break;
        const float4 w = wpre[c];
#pragma unroll
        for (int j = 0; j < NX; j++) {
            if (j >= a.n)
                break;
            const float4 x = __ldg((const float4 *)(a.x + j * a.ldx + e));
            acc[j] += w.x * x.x + w.y * x.y + w.z * x.z + w.w * x.w;
        }
    }
#pragma unroll 4
    for (int64_t e = 4 * (int64_t)tid + (int64_t)SM_PRE * 4 * SM_THREADS; e < a.ncols; e += 4 * SM_THREADS) {
        const float4 w = ld_w4<T>(row, e);
#pragma unroll
        for (int j = 0; j < NX; j++) {
            if (j >= a.n)
                break;
            const float4 x = __ldg((const float4 *)(a.x + j * a.ldx + e));
            acc[j] += w.x * x.x + w.y * x.y + w.z * x.z + w.w * x.w;
        }
    }
#pragma unroll
    for (int j = 0; j < NX; j++) {
        if (j >= a.n)
            break;
        const float v = kc_warp_sum(acc[j]);
        if (lane == 0)
            red[warp][j] = v;
    }
    __syncthreads();
    if (tid < a.n && tid < NX) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < SM_THREADS / 32; w++)
            v += red[w][tid];
        put_out(a.y + tid * a.ldy + i, v, a.accumulate, a.pb ? a.pb + i : NULL);
    }
}

/* Whether a plain product goes to mv_small_kernel: f32/f16/bf16 weights, no
 * SwiGLU pair, no split outputs, ncols a multiple of 4 and 16-byte aligned rows
 * (f32) or 8-byte (f16, bf16), and fewer rows than about two waves of the
 * streaming kernel's warps would take. */
static int small_ok(const kcuda_mat_t *w, int sms)
{
    if (w->type != BL_TYPE_F32 && w->type != BL_TYPE_F16 && w->type != BL_TYPE_BF16)
        return 0;
    const size_t al = w->type == BL_TYPE_F32 ? 16 : 8;
    return w->ncols % 4 == 0 && w->row_bytes % al == 0 && w->nrows <= (int64_t)sms * 16 &&
           w->nrows <= 2147483647;
}

template <int T>
static int small_go(const mv_args_t *a, cudaStream_t st, bl_err_t *err)
{
    const dim3 grid((unsigned)a->nrows);
    if (a->n == 1)
        KC_LAUNCH(err, mv_small_kernel<T, 1>, grid, SM_THREADS, 0, st, *a);
    else
        KC_LAUNCH(err, mv_small_kernel<T, MAXR>, grid, SM_THREADS, 0, st, *a);
    return 0;
}

// --- several activation rows on int8 tensor cores ----------------------------------------------
/* Products of several activation rows ("columns" below; from 4 by default,
 * kcuda_matvec_set_mma, to KCUDA_MV_MAX_ROWS) over q4_K and q6_K weights, as
 * mma.sync over int8: the weights' quants are the A tile (16 output rows by 32 or 16
 * elements), the columns' rounded activations (the same q8 terms as the streaming
 * kernel's) the B tile, the int32 tile scaled per 32-element block in f32. A warp's
 * integer work for 8 columns is then what the streaming kernel spends on one, and
 * each weight byte is read once for all the columns. The columns are rounded once
 * per product by mq_round_kernel into the stream's scratch (kc_stream_scratch),
 * where the tiles read them through L1 (the weights bypass L1).
 *
 * The columns are activation rows of a plain product, or, for the routed experts,
 * the (row, choice) slots that chose one expert: block column y takes slot y's
 * expert when y leads it (a multiple of MQ_COLS slots with that expert come
 * before y) and the next MQ_COLS slots with it, so each chosen expert's weights are
 * read once for all its slots and every other block exits at once.
 *
 * Block: MQ_WARPS warps over rt = MQ_WARPS / kw tiles of 16 output rows; the kw
 * warps of a tile split its 256-element super-blocks (warp q takes q, q + kw, ..),
 * and their sums meet in shared memory in warp order (fixed: the same inputs give
 * the same bits, and a column's result does not depend on the other columns). A
 * lane loads its quants straight into registers (rows gid and gid + 8 of the tile,
 * gid = lane / 4), the next super-block's while the current one's tiles run.
 *
 * Which element of a sub-block a lane's fragment register holds does not matter to
 * the sum as long as A and B agree: for q4_K a lane (tig = lane % 4) takes the 8
 * bytes 8 tig.. of each 32-byte quarter of qs (low nibbles: sub-block 2p, high:
 * 2p + 1), so registers a0/a2 hold elements 8 tig + 0..3 / 4..7 and B is read at
 * the same places; q6_K's scales are per 16 elements, so its tiles are m16n8k16,
 * a lane taking elements 4 tig + 0..3 of each 16. */
#define MQ_WARPS 4
#define MQ_THREADS (MQ_WARPS * 32)
#define MQ_COLS 8
enum { MQ_PLAIN = 0, MQ_UP = 1, MQ_DOWN = 2 };

typedef struct mq_args {
    const uint8_t *w, *w2; /* w2: up of the SwiGLU pair, or NULL */
    size_t row_bytes;
    int64_t ncols;
    int64_t nrows;         /* the matrix's rows (plain) or rows per expert */
    int64_t n_expert;
    const float *x;
    int64_t ldx;
    float *y;              /* plain: column c's outputs at y + c * ldy; experts: slot s's at y + s * ldy */
    int64_t ldy;
    int64_t r1, r2;        /* split outputs, as mv_args_t */
    float *y1, *y2;
    int64_t ldy1, ldy2;
    const int32_t *ids;    /* experts: (n, k) */
    int n;                 /* plain: columns; experts: rows */
    int k;
    int mode;              /* MQ_PLAIN; MQ_UP: slot s reads x row s / k; MQ_DOWN: x row s */
    int accumulate;
    int terms;
    int kw;                /* warps splitting a tile's super-blocks: 1, 2 or 4 */
    const uint8_t *xq;     /* the R rounded rows (mq_x_t) */
    int R;
    const float4 *xds;
    const float *pb, *pb1, *pb2; /* the split outputs' biases, as mv_args_t (mq_kernel's B) */
} mq_args_t;

static __device__ __forceinline__ void mma_s8_k32(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void mma_s8_k16(int c[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

/* Weight loads that do not stay in L1 (each weight byte is read once), so that L1
 * keeps the rounded activations every tile reads. */
static __device__ __forceinline__ uint4 ldw_u4(const uint8_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ uint2 ldw_u2(const uint8_t *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

static __device__ __forceinline__ uint32_t ldw_u32(const uint8_t *p)
{
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

static __device__ __forceinline__ uint32_t ldw_u16(const uint8_t *p)
{
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

/* A word of weights at 2-byte alignment (q6_K's 210-byte blocks). */
static __device__ __forceinline__ uint32_t ldg_w2(const uint8_t *p)
{
    if (((uintptr_t)p & 2) == 0)
        return ldw_u32(p);
    return ldw_u16(p) | ldw_u16(p + 2) << 16;
}

/* The quants of one super-block a lane holds: rows gid (index 0) and gid + 8 (1). */
template <int T> struct mq_frag;
template <> struct mq_frag<BL_TYPE_Q4_K> {
    uint4 h[2];    /* d, dmin, scales */
    uint2 q[2][4]; /* quarter p's bytes 8 tig.. */
};
template <> struct mq_frag<BL_TYPE_Q6_K> {
    uint32_t ql[2][8]; /* half h, s (16-element half of l), lo/hi 32: ql[64h + 32c + 16s + 4tig] at [4h + 2s + c] */
    uint32_t qh[2][4]; /* qh[32h + 16s + 4tig] at [2h + s] */
    uint32_t sc[2][4]; /* the 16 int8 scales */
    float d[2];
};

static __device__ __forceinline__ void mq_load(mq_frag<BL_TYPE_Q4_K> &f, const uint8_t *r0, const uint8_t *r1,
                                               int64_t sb, int tig)
{
    const uint8_t *b[2] = {r0 + sb * 144, r1 + sb * 144};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        f.h[r] = ldw_u4(b[r]);
#pragma unroll
        for (int p = 0; p < 4; p++)
            f.q[r][p] = ldw_u2(b[r] + 16 + 32 * p + 8 * tig);
    }
}

static __device__ __forceinline__ void mq_load(mq_frag<BL_TYPE_Q6_K> &f, const uint8_t *r0, const uint8_t *r1,
                                               int64_t sb, int tig)
{
    const uint8_t *b[2] = {r0 + sb * 210, r1 + sb * 210};
#pragma unroll
    for (int r = 0; r < 2; r++) {
#pragma unroll
        for (int i = 0; i < 8; i++) /* i = 4h + 2s + c */
            f.ql[r][i] = ldg_w2(b[r] + 64 * (i >> 2) + 32 * (i & 1) + 16 * ((i >> 1) & 1) + 4 * tig);
#pragma unroll
        for (int i = 0; i < 4; i++) /* i = 2h + s */
            f.qh[r][i] = ldg_w2(b[r] + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * tig);
#pragma unroll
        for (int i = 0; i < 4; i++)
            f.sc[r][i] = ldg_w2(b[r] + 192 + 4 * i);
        f.d[r] = kc_half((uint16_t)ldw_u16(b[r] + 208));
    }
}

/* The rounded activation rows (mq_round_kernel), R of them, laid out so that one
 * block's 32-element pieces of all rows sit together (a warp's B reads of one
 * (term, block) then touch 2 cache lines, not 8): term t of row v's block j at q +
 * ((t * nb32 + j) * R + v) * 32, its scales and sum at ds[j * R + v] = {d of term
 * 0, d of term 1 (0 for one term), the block's sum of the rounded values d0 q0 + d1
 * q1, 0}. A lane reads B from row vb (its column, gid) and the scales of rows v0,
 * v1 (the columns 2 tig, 2 tig + 1 of its accumulators). */
typedef struct mq_x {
    const uint8_t *qb;      /* row vb's piece of block 0, term 0 */
    const float4 *d0, *d1;  /* rows v0's and v1's block 0 */
    int64_t tstride, jstride; /* bytes between terms and between blocks (32 R) */
    int R, terms;
} mq_x_t;

/* tmp[r][c] = (t = 0) or += (t = 1) term t's int32 tile scaled by the activation
 * scale of term t of column c's block (x0, x1: columns 2 tig and 2 tig + 1). */
static __device__ __forceinline__ void mq_scale_term(const int c[4], float4 x0, float4 x1, int t, float tmp[2][2])
{
    const float s0 = t ? x0.y : x0.x, s1 = t ? x1.y : x1.x;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        tmp[r][0] = t ? fmaf(s0, (float)c[2 * r], tmp[r][0]) : s0 * (float)c[2 * r];
        tmp[r][1] = t ? fmaf(s1, (float)c[2 * r + 1], tmp[r][1]) : s1 * (float)c[2 * r + 1];
    }
}

/* The 8 6-bit scales and mins of a q4_K block held in registers (k_scale_min_w for
 * every j at once): sc/mn[0] bytes j = 0..3, [1] bytes j = 4..7. */
static __device__ __forceinline__ void k_scales_all(uint4 hd, uint32_t sc[2], uint32_t mn[2])
{
    sc[0] = hd.y & 0x3f3f3f3fu;
    mn[0] = hd.z & 0x3f3f3f3fu;
    sc[1] = (hd.w & 0x0f0f0f0fu) | ((hd.y >> 2) & 0x30303030u);
    mn[1] = ((hd.w >> 4) & 0x0f0f0f0fu) | ((hd.z >> 2) & 0x30303030u);
}

/* acc[r][c] += this lane's share of super-block sb (rows gid + 8 r, columns 2 tig + c):
 * per 32-element block j, the terms' int32 tiles scaled by their activation scales,
 * then by the row's scale, less the row's min times the block's sum. */
static __device__ __forceinline__ void mq_tiles(const mq_frag<BL_TYPE_Q4_K> &f, int64_t sb, const mq_x_t &xv,
                                                int tig, float acc[2][2])
{
    float d[2], dm[2];
    uint32_t sc[2][2], mn[2][2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        d[r] = kc_half((uint16_t)(f.h[r].x & 0xffff));
        dm[r] = kc_half((uint16_t)(f.h[r].x >> 16));
        k_scales_all(f.h[r], sc[r], mn[r]);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int p = j >> 1, sh = 4 * (j & 1);
        const uint32_t a[4] = {(f.q[0][p].x >> sh) & 0x0f0f0f0fu, (f.q[1][p].x >> sh) & 0x0f0f0f0fu,
                               (f.q[0][p].y >> sh) & 0x0f0f0f0fu, (f.q[1][p].y >> sh) & 0x0f0f0f0fu};
        const int64_t j32 = sb * 8 + j;
        const float4 x0 = __ldg(xv.d0 + j32 * xv.R), x1 = __ldg(xv.d1 + j32 * xv.R);
        float tmp[2][2];
#pragma unroll
        for (int t = 0; t < 2; t++) {
            if (t >= xv.terms)
                break;
            const uint2 b = __ldg((const uint2 *)(xv.qb + t * xv.tstride + j32 * xv.jstride + 8 * tig));
            int c[4] = {0, 0, 0, 0};
            mma_s8_k32(c, a, b.x, b.y);
            mq_scale_term(c, x0, x1, t, tmp);
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int bs = 8 * (j & 3);
            const float ds = d[r] * (float)((sc[r][j >> 2] >> bs) & 0xff);
            const float dn = dm[r] * (float)((mn[r][j >> 2] >> bs) & 0xff);
            acc[r][0] = fmaf(ds, tmp[r][0], fmaf(-dn, x0.z, acc[r][0]));
            acc[r][1] = fmaf(ds, tmp[r][1], fmaf(-dn, x1.z, acc[r][1]));
        }
    }
}

static __device__ __forceinline__ void mq_tiles(const mq_frag<BL_TYPE_Q6_K> &f, int64_t sb, const mq_x_t &xv,
                                                int tig, float acc[2][2])
{
#pragma unroll
    for (int hs = 0; hs < 4; hs++) { /* hs = 2h + s */
        const int h = hs >> 1, s = hs & 1;
        uint32_t q[2][4]; /* the four 32-groups g of this (h, s), as q - 32 */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint32_t A = f.ql[r][4 * h + 2 * s], C = f.ql[r][4 * h + 2 * s + 1], H = f.qh[r][hs];
            q[r][0] = __vsub4((A & 0x0f0f0f0fu) | ((H << 4) & 0x30303030u), 0x20202020u);
            q[r][1] = __vsub4((C & 0x0f0f0f0fu) | ((H << 2) & 0x30303030u), 0x20202020u);
            q[r][2] = __vsub4(((A >> 4) & 0x0f0f0f0fu) | (H & 0x30303030u), 0x20202020u);
            q[r][3] = __vsub4(((C >> 4) & 0x0f0f0f0fu) | ((H >> 2) & 0x30303030u), 0x20202020u);
        }
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int is = 8 * h + 2 * g + s; /* the scale's index */
            const int64_t j32 = sb * 8 + 4 * h + g;
            const float4 x0 = __ldg(xv.d0 + j32 * xv.R), x1 = __ldg(xv.d1 + j32 * xv.R);
            float tmp[2][2];
#pragma unroll
            for (int t = 0; t < 2; t++) {
                if (t >= xv.terms)
                    break;
                const uint32_t b =
                    __ldg((const uint32_t *)(xv.qb + t * xv.tstride + j32 * xv.jstride + 16 * s + 4 * tig));
                int c[4] = {0, 0, 0, 0};
                mma_s8_k16(c, q[0][g], q[1][g], b);
                mq_scale_term(c, x0, x1, t, tmp);
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float ds = f.d[r] * (float)(int8_t)(f.sc[r][is >> 2] >> (8 * (is & 3)));
                acc[r][0] = fmaf(ds, tmp[r][0], acc[r][0]);
                acc[r][1] = fmaf(ds, tmp[r][1], acc[r][1]);
            }
        }
    }
}

/* The block's columns (slots for the experts): *e the expert (-1: plain), cols[i]
 * the slot of column i; 0 columns when the block does not lead its expert. Warp 0
 * only. */
static __device__ int mq_columns(const mq_args_t &a, int lane, int *cols, int32_t *e)
{
    if (a.mode == MQ_PLAIN) {
        if (lane < a.n)
            cols[lane] = lane;
        *e = -1;
        return a.n;
    }
    const int ns = a.n * a.k, y = (int)blockIdx.y;
    const int32_t me = a.ids[y];
    *e = me;
    int before = 0, got = 0;
    for (int s0 = 0; s0 < ns; s0 += 32) {
        const int s = s0 + lane;
        const unsigned m = __ballot_sync(KCUDA_FULL_MASK, s < ns && a.ids[s] == me);
        const unsigned lt = s0 + 32 <= y ? m : s0 >= y ? 0u : m & ((1u << (y - s0)) - 1u);
        before += __popc(lt);
        unsigned ge = m & ~lt;
        while (ge && got < MQ_COLS) {
            const int b = __ffs(ge) - 1;
            if (lane == 0)
                cols[got] = s0 + b;
            got++;
            ge &= ge - 1;
        }
    }
    __syncwarp();
    return before % MQ_COLS == 0 ? got : 0;
}

/* Rounds rows 0..R-1 of x (ldx apart, K columns) into the stream's scratch as mq_x_t
 * describes it: a quarter-warp per 32 elements (q8_term, each term). grid
 * (ceil(R * K / 32 / 32)), 256 threads. */
__global__ void __launch_bounds__(256) mq_round_kernel(const float *x, int64_t ldx, int R, int64_t K, int terms,
                                                       uint8_t *q, float4 *ds)
{
    kc_wait_prior(); /* x is the previous kernel's; the scratch may still be read by the one before */
    kc_allow_next();
    const int lane = threadIdx.x & 31, sub = lane & 7;
    const int64_t nb32 = K / 32, item = (int64_t)blockIdx.x * 32 + (threadIdx.x >> 3);
    const bool ok = item < (int64_t)R * nb32;
    const int64_t v = ok ? item / nb32 : 0, j = ok ? item - v * nb32 : 0;
    float4 x4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (ok)
        x4 = __ldg((const float4 *)(x + v * ldx + 32 * j + 4 * sub));
    float d0 = 0.0f, d1 = 0.0f, sum = 0.0f;
    for (int t = 0; t < terms; t++) {
        float dd;
        int sm, hi;
        const uint32_t pk = q8_term(x4, &dd, &sm, &hi);
        sum = fmaf(dd, (float)(sm + hi), sum);
        if (t)
            d1 = dd;
        else
            d0 = dd;
        if (ok)
            *(uint32_t *)(q + ((t * nb32 + j) * R + v) * 32 + 4 * sub) = pk;
    }
    if (ok && sub == 0)
        ds[j * R + v] = make_float4(d0, d1, sum, 0.0f);
}

/* grid (ceil(nrows / (16 * rt)), 1 or n * k): the rounded rows ready in a.xq. B:
 * the plain outputs have biases (as mv_rows' B). */
template <int T, int PAIR, int B>
__global__ void __launch_bounds__(MQ_THREADS) mq_kernel(const mq_args_t a)
{
    __shared__ int cols[MQ_COLS];
    __shared__ int ncol_s;
    __shared__ int32_t exp_s;
    __shared__ float red[MQ_WARPS][1 + PAIR][16][MQ_COLS]; /* the warps' tiles */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const int kw = a.kw, rt = MQ_WARPS / kw, tile = warp / kw, kq = warp % kw;
    const int64_t r0 = (int64_t)blockIdx.x * 16 * rt + 16 * tile;
    const int64_t nsb = a.ncols / 256;
    const int64_t ra = min(r0 + gid, a.nrows - 1), rb = min(r0 + gid + 8, a.nrows - 1);

    /* the columns first: the experts' need the ids an earlier kernel wrote */
    if (a.mode != MQ_PLAIN)
        kc_wait_prior();
    if (warp == 0) {
        int32_t e = -1;
        const int nc = mq_columns(a, lane, cols, &e);
        if (lane == 0) {
            ncol_s = nc;
            exp_s = e;
        }
    }
    __syncthreads();
    const int ncol = ncol_s;
    const int32_t e = exp_s;
    if (ncol == 0) { /* not this expert's leader */
        kc_wait_prior();
        kc_allow_next();
        return;
    }
    const bool live = a.mode == MQ_PLAIN || (e >= 0 && e < a.n_expert);
    const size_t eoff = a.mode == MQ_PLAIN || !live ? 0 : (size_t)e * (size_t)a.nrows * a.row_bytes;
    const uint8_t *wa = a.w + eoff + (size_t)ra * a.row_bytes, *wb = a.w + eoff + (size_t)rb * a.row_bytes;
    const uint8_t *ua = PAIR ? a.w2 + eoff + (size_t)ra * a.row_bytes : NULL;
    const uint8_t *ub = PAIR ? a.w2 + eoff + (size_t)rb * a.row_bytes : NULL;

    mq_frag<T> f, fu;
    int64_t sb = kq;
    if (live && sb < nsb) { /* weights only: before the wait for a plain product */
        mq_load(f, wa, wb, sb, tig);
        if (PAIR)
            mq_load(fu, ua, ub, sb, tig);
    }
    if (a.mode == MQ_PLAIN)
        kc_wait_prior();
    kc_allow_next();

    /* the rounded rows of this lane's columns (past ncol: column 0's, not written) */
    const int c0 = 2 * tig < ncol ? 2 * tig : 0, c1 = 2 * tig + 1 < ncol ? 2 * tig + 1 : 0;
    const int cb = gid < ncol ? gid : 0;
    const int64_t vb = a.mode == MQ_UP ? cols[cb] / a.k : cols[cb];
    const int64_t v0 = a.mode == MQ_UP ? cols[c0] / a.k : cols[c0], v1 = a.mode == MQ_UP ? cols[c1] / a.k : cols[c1];
    mq_x_t xv;
    xv.R = a.R;
    xv.terms = a.terms;
    xv.jstride = 32 * (int64_t)a.R;
    xv.tstride = (a.ncols / 32) * xv.jstride;
    xv.qb = a.xq + vb * 32;
    xv.d0 = a.xds + v0;
    xv.d1 = a.xds + v1;

    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, accu[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    while (live && sb < nsb) {
        mq_frag<T> g, gu;
        const int64_t nx = sb + kw;
        if (nx < nsb) {
            mq_load(g, wa, wb, nx, tig);
            if (PAIR)
                mq_load(gu, ua, ub, nx, tig);
        }
        mq_tiles(f, sb, xv, tig, acc);
        if (PAIR)
            mq_tiles(fu, sb, xv, tig, accu);
        f = g;
        if (PAIR)
            fu = gu;
        sb = nx;
    }

    /* the kw warps' tiles meet in warp order */
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            red[warp][0][gid + 8 * r][2 * tig + c] = acc[r][c];
            if (PAIR)
                red[warp][PAIR][gid + 8 * r][2 * tig + c] = accu[r][c];
        }
    __syncthreads();
    for (int o = threadIdx.x; o < rt * 16 * MQ_COLS; o += MQ_THREADS) {
        const int t = o / (16 * MQ_COLS), rr = (o / MQ_COLS) % 16, c = o % MQ_COLS;
        const int64_t r = (int64_t)blockIdx.x * 16 * rt + 16 * t + rr;
        if (c >= ncol || r >= a.nrows)
            continue;
        float v = 0.0f, u = 0.0f;
        for (int q = 0; q < kw; q++) {
            v += red[t * kw + q][0][rr][c];
            if (PAIR)
                u += red[t * kw + q][PAIR][rr][c];
        }
        const float out = PAIR ? kc_silu_mul(v, u) : v;
        if (a.mode != MQ_PLAIN) {
            a.y[(int64_t)cols[c] * a.ldy + r] = out;
            continue;
        }
        int64_t ldo, ro;
        float *yo = out_row(a, r, &ldo, &ro);
        put_out(yo + (int64_t)c * ldo + ro, out, a.accumulate, B ? out_bias(a, r) : NULL);
    }
}

/* y (n, rows) (+)= sum over j < k in j order of wts[b k + j] * h[(b k + j), :]: the
 * grouped down products' weighted sum (kcuda_matvec_experts_down_grouped). grid
 * (ceil(rows / 256), n). */
__global__ void mq_wsum_kernel(const float *h, int64_t ldh, const float *wts, int k, int64_t rows, float *y,
                               int64_t ldy, int accumulate)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (i >= rows)
        return;
    float acc = 0.0f;
    for (int j = 0; j < k; j++)
        acc += wts[b * k + j] * h[(b * k + j) * ldh + i];
    float *o = y + b * ldy + i;
    *o = accumulate ? *o + acc : acc;
}

// --- embedding gather ------------------------------------------------------------------------

/* Unit u (32 elements) of a quantized block at b into out, as common/quant.c's
 * reference dequantizers lay the block out. */
template <int T>
static __device__ void deq_unit(const uint8_t *b, int u, float *out);

template <>
__device__ void deq_unit<BL_TYPE_Q4_K>(const uint8_t *b, int u, float *out)
{
    int sc, m;
    k_scale_min(b + 4, u, &sc, &m);
    const float dl = kc_half(ld_u16(b)) * (float)sc, ml = kc_half(ld_u16(b + 2)) * (float)m;
    const uint8_t *q = b + 16 + 32 * (u / 2);
    const int shift = 4 * (u & 1);
    for (int l = 0; l < 32; l++)
        out[l] = dl * (float)((q[l] >> shift) & 0xf) - ml;
}

template <>
__device__ void deq_unit<BL_TYPE_Q5_K>(const uint8_t *b, int u, float *out)
{
    int sc, m;
    k_scale_min(b + 4, u, &sc, &m);
    const float dl = kc_half(ld_u16(b)) * (float)sc, ml = kc_half(ld_u16(b + 2)) * (float)m;
    const uint8_t *qh = b + 16, *q = b + 48 + 32 * (u / 2);
    const int shift = 4 * (u & 1);
    for (int l = 0; l < 32; l++)
        out[l] = dl * (float)(((q[l] >> shift) & 0xf) | ((qh[l] >> u) & 1) << 4) - ml;
}

template <>
__device__ void deq_unit<BL_TYPE_Q6_K>(const uint8_t *b, int u, float *out)
{
    const float d = kc_half(ld_u16(b + 208));
    const int h = u / 4, k = u % 4;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int l = 0; l < 32; l++) {
        const int lo = (b[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xf;
        const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        out[l] = d * (float)sc[(32 * u + l) / 16] * (float)((lo | hi << 4) - 32);
    }
}

template <>
__device__ void deq_unit<BL_TYPE_Q8_0>(const uint8_t *b, int u, float *out)
{
    const float d = kc_half(ld_u16(b));
    for (int l = 0; l < 32; l++)
        out[l] = (float)(int8_t)b[2 + l] * d;
}

template <>
__device__ void deq_unit<BL_TYPE_MXFP4>(const uint8_t *b, int u, float *out)
{
    (void)u; /* one unit per block */
    const float d = kc_mx_scale(b[0]);
    for (int l = 0; l < 16; l++) {
        out[l] = (float)kc_mx_val(b[1 + l] & 0xf) * d;
        out[l + 16] = (float)kc_mx_val(b[1 + l] >> 4) * d;
    }
}

/* grid (1, n): one block per gathered row; threads take 32-element units. */
template <int T>
__global__ void get_rows_q_kernel(const uint8_t *table, size_t row_bytes, int64_t nrows,
                                  int64_t ncols, const int32_t *ids, float *y, int64_t ldy)
{
    kc_wait_prior();
    kc_allow_next();
    typedef fmt<T> F;
    const int64_t i = blockIdx.y;
    const int32_t id = ids[i];
    float *yr = y + i * ldy;
    const int units_per_blk = F::BE / 32;
    const int64_t units = ncols / 32;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
        float v[32];
        if (id >= 0 && id < nrows)
            deq_unit<T>(table + (size_t)id * row_bytes + (size_t)(u / units_per_blk) * F::BB,
                        (int)(u % units_per_blk), v);
        else
            for (int l = 0; l < 32; l++)
                v[l] = 0.0f;
        for (int l = 0; l < 32; l++)
            yr[u * 32 + l] = v[l];
    }
}

template <int T>
__global__ void get_rows_plain_kernel(const uint8_t *table, size_t row_bytes, int64_t nrows,
                                      int64_t ncols, const int32_t *ids, float *y, int64_t ldy)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t i = blockIdx.y;
    const int32_t id = ids[i];
    const uint8_t *row = table + (size_t)(id >= 0 && id < nrows ? id : 0) * row_bytes;
    for (int64_t e = threadIdx.x; e < ncols; e += blockDim.x)
        y[i * ldy + e] = id >= 0 && id < nrows ? plain_elem<T>(row, (int)e) : 0.0f;
}

// --- launchers -------------------------------------------------------------------------------

static int check_x(const kcuda_mat_t *w, const float *x, int64_t ldx, const char *what, bl_err_t *err)
{
    if (!w || !w->data || !x)
        return bl_err_set(err, BL_EINVAL, "%s: a NULL matrix or activation pointer", what);
    if (!kcuda_type_supported(w->type))
        return bl_err_set(err, BL_ENOTSUP, "%s: weight type %u is not read by the CUDA kernels",
                          what, w->type);
    if ((uintptr_t)x % 16 != 0 || ldx % 4 != 0 || ldx < w->ncols)
        return bl_err_set(err, BL_EINVAL,
                          "%s: activations must be 16-byte aligned with ldx (%lld) a multiple of 4 and at least ncols %lld",
                          what, (long long)ldx, (long long)w->ncols);
    if ((uintptr_t)w->data % 16 != 0)
        return bl_err_set(err, BL_EINVAL, "%s: weight data is not 16-byte aligned", what);
    return 0;
}

static int same_shape(const kcuda_mat_t *a, const kcuda_mat_t *b, const char *what, bl_err_t *err)
{
    if (!a || !b || a->type != b->type || a->ncols != b->ncols || a->nrows != b->nrows ||
        a->row_bytes != b->row_bytes || !b->data || (uintptr_t)b->data % 16 != 0)
        return bl_err_set(err, BL_ENOTSUP, "%s: gate and up differ in type or shape", what);
    return 0;
}


/* Shared memory per SM (the blocks of a launch that can share one), per device. */
static int sm_smem(int dev, int *out, bl_err_t *err)
{
    static int cache[KC_MAX_DEVICES];
    if (dev >= 0 && dev < KC_MAX_DEVICES && cache[dev] > 0) {
        *out = cache[dev];
        return 0;
    }
    KCUDA_CHECK(cudaDeviceGetAttribute(out, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev), err);
    if (dev >= 0 && dev < KC_MAX_DEVICES)
        cache[dev] = *out;
    return 0;
}

template <int T, int NX, int B>
static int mv_go(const mv_args_t *a, dim3 grid, size_t smem, int dev, int optin, cudaStream_t st, bl_err_t *err)
{
    static int done[KC_MAX_DEVICES]; /* one set per kernel instance and device */
    int rc = kc_smem_prepare(mv_kernel<T, NX, B>, done, dev, optin, err);
    if (rc < 0)
        return rc;
    KC_LAUNCH(err, mv_kernel<T, NX, B>, grid, MV_THREADS, smem, st, *a);
    return 0;
}

/* Whether a plain product's outputs carry a bias (mv_rows' B). */
static int mv_biased(const mv_args_t *a)
{
    return a->mode == MV_PLAIN && (a->pb || a->pb1 || a->pb2);
}

/* Bytes of shared memory nx rounded activation rows of ncols take (rows padded to
 * 256 elements: xunit's positions), and the padded row. */
static size_t xq_bytes(int64_t ncols, int nx, int *xs)
{
    const int64_t pad = (ncols + 255) / 256 * 256;
    *xs = (int)pad;
    return (size_t)nx * (size_t)pad * 5 / 4; /* bytes, then a scale and a sum per 32 */
}

/* q8 terms per activation block of the block-format products (kcuda.h): read at
 * each launch, so a captured graph keeps the value it was captured with. */
static int g_act_terms = 2;

int kcuda_matvec_set_act_terms(int terms)
{
    const int old = g_act_terms;
    if (terms == 1 || terms == 2)
        g_act_terms = terms;
    return old;
}

int kcuda_matvec_act_terms(void) { return g_act_terms; }

/* The largest activation-row count whose rounded rows (all their terms) fit
 * beside the stages (0: not even one). */
static int rows_that_fit(uint32_t type, int64_t ncols, int optin)
{
    if (!kcuda_type_supported(type))
        return 0;
    if (bl_type_info((bl_type_t)type)->block_elems == 1)
        return KCUDA_MV_MAX_ROWS; /* f16, bf16, f32 read activations from L1 */
    int xs;
    const size_t one = xq_bytes(ncols, g_act_terms, &xs);
    if ((size_t)optin <= MV_STAGE_ALL)
        return 0;
    const size_t n = ((size_t)optin - MV_STAGE_ALL) / one;
    return n > 1024 ? 1024 : (int)n;
}

/* Fills a's weight fields and activation layout for nx activation rows per block;
 * *smem: the dynamic shared memory a block needs. */
static int mv_setup(const kcuda_mat_t *w, mv_args_t *a, int nx, int optin, size_t *smem_out, bl_err_t *err)
{
    a->w = (const uint8_t *)w->data;
    a->row_bytes = w->row_bytes;
    a->ncols = w->ncols;
    if (a->y1 == NULL) /* one output */
        a->r1 = a->r2 = a->nrows;
    const int q = bl_type_info((bl_type_t)w->type)->block_elems > 1;
    a->terms = q ? g_act_terms : 1;
    int xs = 0;
    size_t smem = MV_STAGE_ALL + (q ? xq_bytes(w->ncols, nx * a->terms, &xs) : 0);
    if (a->logits) { /* the routing copies last */
        a->route_off = (smem + 15) / 16 * 16;
        smem = a->route_off + MV_ROUTE_BYTES;
    }
    if (smem > (size_t)optin)
        return bl_err_set(err, BL_ENOTSUP,
                          "matvec: %d activation rows (%d term%s) of %lld columns need %zu bytes of shared memory (the device gives %d)",
                          nx, a->terms, a->terms == 1 ? "" : "s", (long long)w->ncols, smem, optin);
    a->xs = xs;
    *smem_out = smem;
    return 0;
}

/* Rows per warp so that the blocks that fit an SM together (registers:
 * MV_MIN_BLOCKS; shared memory) cover `rows` rows in about one wave. */
static int mv_rpw(int64_t rows, size_t smem, int sms, int smem_sm)
{
    int per_sm = MV_MIN_BLOCKS;
    while (per_sm > 1 && (size_t)per_sm * (smem + 1024) > (size_t)smem_sm)
        per_sm--;
    const int64_t wave = (int64_t)sms * per_sm * MV_WARPS;
    int64_t rpw = (rows + wave - 1) / wave;
    return (int)(rpw < 1 ? 1 : rpw > 1024 ? 1024 : rpw);
}

/* Launches one product: nx activation rows per block (plain: a->n; expert: 1;
 * down: k). */
static int mv_launch(const kcuda_mat_t *w, mv_args_t *a, unsigned slots, int nx, void *stream, bl_err_t *err)
{
    int dev = 0, sms = 0, optin = 0, smem_sm = 0;
    int rc = kc_device_limits(&dev, &sms, &optin, err);
    if (rc < 0 || (rc = sm_smem(dev, &smem_sm, err)) < 0)
        return rc;
    size_t smem = 0;
    if ((rc = mv_setup(w, a, nx, optin, &smem, err)) < 0)
        return rc;
    const int one = a->mode != MV_PLAIN || a->n == 1;
    a->rpw = mv_rpw(a->nrows * (int64_t)slots, smem, sms, smem_sm);
    const dim3 grid((unsigned)kc_cdiv(a->nrows, MV_WARPS * a->rpw), slots);
    cudaStream_t st = (cudaStream_t)stream;
    const int biased = mv_biased(a);
#define MV_GO(T)                                                                                            \
    (biased ? (one ? mv_go<T, 1, 1>(a, grid, smem, dev, optin, st, err)                                     \
                   : mv_go<T, MAXR, 1>(a, grid, smem, dev, optin, st, err))                                 \
            : (one ? mv_go<T, 1, 0>(a, grid, smem, dev, optin, st, err)                                     \
                   : mv_go<T, MAXR, 0>(a, grid, smem, dev, optin, st, err)))
    switch (w->type) {
    case BL_TYPE_Q4_K: return MV_GO(BL_TYPE_Q4_K);
    case BL_TYPE_Q5_K: return MV_GO(BL_TYPE_Q5_K);
    case BL_TYPE_Q6_K: return MV_GO(BL_TYPE_Q6_K);
    case BL_TYPE_Q8_0: return MV_GO(BL_TYPE_Q8_0);
    case BL_TYPE_MXFP4: return MV_GO(BL_TYPE_MXFP4);
    case BL_TYPE_F16: return MV_GO(BL_TYPE_F16);
    case BL_TYPE_BF16: return MV_GO(BL_TYPE_BF16);
    case BL_TYPE_F32: return MV_GO(BL_TYPE_F32);
    default: return bl_err_set(err, BL_ENOTSUP, "matvec: weight type %u", w->type);
    }
#undef MV_GO
}

template <int T1, int T2, int NX, int B>
static int mv_go2(const mv_args_t *a1, const mv_args_t *a2, unsigned nbx1, dim3 grid, size_t smem, int dev,
                  int optin, cudaStream_t st, bl_err_t *err)
{
    static int done[KC_MAX_DEVICES];
    int rc = kc_smem_prepare(mv_kernel2<T1, T2, NX, B>, done, dev, optin, err);
    if (rc < 0)
        return rc;
    KC_LAUNCH(err, mv_kernel2<T1, T2, NX, B>, grid, MV_THREADS, smem, st, *a1, *a2, nbx1);
    return 0;
}

/* The type pairs kcuda_matvec_split2 takes in one launch (q and k in the first
 * type, v in the second, as quantised GGUFs store attention): 1 when launched,
 * 0 when the pair is not one of them (the caller launches twice). */
static int mv_launch2(const kcuda_mat_t *w1, mv_args_t *a1, const kcuda_mat_t *w2, mv_args_t *a2, int nx,
                      void *stream, bl_err_t *err)
{
    const uint32_t t1 = w1->type, t2 = w2->type;
    const int known = (t1 == BL_TYPE_Q4_K && (t2 == BL_TYPE_Q6_K || t2 == BL_TYPE_Q5_K || t2 == BL_TYPE_Q8_0)) ||
                      (t1 == BL_TYPE_Q5_K && (t2 == BL_TYPE_Q6_K || t2 == BL_TYPE_Q8_0));
    if (!known)
        return 0;
    int dev = 0, sms = 0, optin = 0, smem_sm = 0;
    int rc = kc_device_limits(&dev, &sms, &optin, err);
    if (rc < 0 || (rc = sm_smem(dev, &smem_sm, err)) < 0)
        return rc;
    size_t s1 = 0, s2 = 0;
    if ((rc = mv_setup(w1, a1, nx, optin, &s1, err)) < 0 || (rc = mv_setup(w2, a2, nx, optin, &s2, err)) < 0)
        return rc;
    const size_t smem = s1 > s2 ? s1 : s2;
    const int one = nx == 1;
    a1->rpw = a2->rpw = mv_rpw(a1->nrows + a2->nrows, smem, sms, smem_sm);
    const unsigned nbx1 = (unsigned)kc_cdiv(a1->nrows, MV_WARPS * a1->rpw);
    const dim3 grid(nbx1 + (unsigned)kc_cdiv(a2->nrows, MV_WARPS * a2->rpw));
    cudaStream_t st = (cudaStream_t)stream;
    const int biased = mv_biased(a1) || mv_biased(a2);
#define MV_GO2(A, C)                                                                                        \
    rc = biased ? (one ? mv_go2<A, C, 1, 1>(a1, a2, nbx1, grid, smem, dev, optin, st, err)                  \
                       : mv_go2<A, C, MAXR, 1>(a1, a2, nbx1, grid, smem, dev, optin, st, err))              \
                : (one ? mv_go2<A, C, 1, 0>(a1, a2, nbx1, grid, smem, dev, optin, st, err)                  \
                       : mv_go2<A, C, MAXR, 0>(a1, a2, nbx1, grid, smem, dev, optin, st, err))
    if (t1 == BL_TYPE_Q4_K && t2 == BL_TYPE_Q6_K)
        MV_GO2(BL_TYPE_Q4_K, BL_TYPE_Q6_K);
    else if (t1 == BL_TYPE_Q4_K && t2 == BL_TYPE_Q5_K)
        MV_GO2(BL_TYPE_Q4_K, BL_TYPE_Q5_K);
    else if (t1 == BL_TYPE_Q4_K)
        MV_GO2(BL_TYPE_Q4_K, BL_TYPE_Q8_0);
    else if (t2 == BL_TYPE_Q6_K)
        MV_GO2(BL_TYPE_Q5_K, BL_TYPE_Q6_K);
    else
        MV_GO2(BL_TYPE_Q5_K, BL_TYPE_Q8_0);
#undef MV_GO2
    return rc < 0 ? rc : 1;
}

/* The arguments of a plain product of n activation rows starting at row b of x
 * (and of the outputs). */
static mv_args_t plain_args(const kcuda_mat_t *w, const kcuda_mat_t *w2, const float *d_x, int64_t ldx, int n,
                            float *d_y, int64_t ldy, int accumulate, const float *bias, const kcuda_out_t *outs,
                            int nouts, int b)
{
    mv_args_t a = {};
    a.w2 = w2 ? (const uint8_t *)w2->data : NULL;
    a.nrows = w->nrows;
    a.x = d_x + (int64_t)b * ldx;
    a.ldx = ldx;
    a.y = d_y + (int64_t)b * ldy;
    a.ldy = ldy;
    a.pb = outs ? outs[0].d_bias : bias;
    if (outs) {
        a.pb1 = nouts > 1 ? outs[1].d_bias : NULL;
        a.pb2 = nouts > 2 ? outs[2].d_bias : NULL;
        a.r1 = outs[0].rows;
        a.y1 = nouts > 1 ? outs[1].d_y + (int64_t)b * outs[1].ldy : NULL;
        a.ldy1 = nouts > 1 ? outs[1].ldy : 0;
        a.r2 = nouts > 2 ? a.r1 + outs[1].rows : w->nrows;
        a.y2 = nouts > 2 ? outs[2].d_y + (int64_t)b * outs[2].ldy : NULL;
        a.ldy2 = nouts > 2 ? outs[2].ldy : 0;
        if (nouts == 1)
            a.r1 = a.r2 = w->nrows;
    }
    a.n = n;
    a.mode = MV_PLAIN;
    a.accumulate = accumulate;
    return a;
}

// --- several activation rows on tensor cores: launchers ----------------------------------------

static int mq_type_ok(const kcuda_mat_t *w)
{
    return w && (w->type == BL_TYPE_Q4_K || w->type == BL_TYPE_Q6_K) && w->ncols % 256 == 0;
}

/* Bytes of R rounded rows of K columns in the scratch: the quants, then (16-byte
 * aligned) the scales and sums. */
static size_t mq_q_bytes(int64_t R, int64_t K, int terms) { return ((size_t)(R * terms * K) + 15) / 16 * 16; }

static size_t mq_scratch_bytes(int64_t R, int64_t K, int terms)
{
    return mq_q_bytes(R, K, terms) + (size_t)(R * (K / 32)) * sizeof(float4);
}

/* The fewest activation rows the tensor-core products take (kcuda_matvec_set_mma;
 * 0: never). Read at each launch, as the q8 terms. */
static int g_mq_min = 4;

/* Whether the tensor-core products take n columns of w on stream: g_mq_min..MQ_COLS
 * columns, q4_K or q6_K, and a stream with a scratch that holds R rounded rows. */
static int mq_fits(const kcuda_mat_t *w, int n, int64_t R, void *stream)
{
    return g_mq_min >= 1 && n >= g_mq_min && n <= MQ_COLS && mq_type_ok(w) &&
           mq_scratch_bytes(R, w->ncols, g_act_terms) <= KC_STREAM_SCRATCH &&
           kc_stream_scratch((cudaStream_t)stream) != NULL;
}

int kcuda_matvec_set_mma(int min_rows)
{
    const int old = g_mq_min;
    if (min_rows >= 0 && min_rows <= MQ_COLS)
        g_mq_min = min_rows;
    return old;
}

int kcuda_matvec_mma_ok(const kcuda_mat_t *w, int n) { return mq_fits(w, n, n, NULL); }

/* Whether the routed experts' products are grouped by expert: when the step's
 * slots are at least g_mq_group % of the experts (200: twice), so that a chosen
 * expert serves about two slots or more. Fewer (a decode step of 8 rows choosing 8
 * of 128 experts: most chosen experts serve one slot) leave the tiles' columns
 * empty, and the streaming kernel's one slot a block is faster (docs/performance.md,
 * 2026-12-06). */
static int g_mq_group = 200; /* kcuda_matvec_set_group */

static int mq_group(const kcuda_mat_t *w, int n, int k, int64_t n_expert, int64_t R, void *stream)
{
    return (int64_t)n * k * 100 >= (int64_t)g_mq_group * n_expert && mq_fits(w, n, R, stream);
}

int kcuda_matvec_set_group(int pct)
{
    const int old = g_mq_group;
    if (pct >= 0)
        g_mq_group = pct;
    return old;
}

int kcuda_experts_grouped_ok(const kcuda_mat_t *w, int n, int k, int64_t n_expert)
{
    return mq_group(w, n, k, n_expert, (int64_t)n * k, NULL);
}

/* Rounds rows 0..R-1 of x (K columns) into the stream's scratch and points a's
 * xq, xds there; BL_ENOTSUP when the stream has none (mq_fits checks first). */
static int mq_round(const float *x, int64_t ldx, int64_t R, int64_t K, mq_args_t *a, cudaStream_t st, bl_err_t *err)
{
    uint8_t *scr = (uint8_t *)kc_stream_scratch(st);
    if (!scr)
        return bl_err_set(err, BL_ENOTSUP, "matvec: the stream has no scratch for the rounded rows");
    a->terms = g_act_terms;
    a->R = (int)R;
    a->xq = scr;
    a->xds = (const float4 *)(scr + mq_q_bytes(R, K, a->terms));
    const dim3 grid((unsigned)kc_cdiv(R * (K / 32), 32));
    KC_LAUNCH(err, mq_round_kernel, grid, 256, 0, st, x, ldx, (int)R, K, a->terms, scr, (float4 *)a->xds);
    return 0;
}

/* Launches mq_kernel for w (pair: w2) over the rounded rows in a, slots block
 * columns (1 for a plain product). */
static int mq_launch(const kcuda_mat_t *w, const kcuda_mat_t *w2, mq_args_t *a, unsigned slots, void *stream,
                     bl_err_t *err)
{
    a->w = (const uint8_t *)w->data;
    a->w2 = w2 ? (const uint8_t *)w2->data : NULL;
    a->row_bytes = w->row_bytes;
    a->ncols = w->ncols;
    const int64_t nsb = w->ncols / 256;
    a->kw = nsb >= 8 ? 4 : nsb >= 4 ? 2 : 1;
    if (a->mode == MQ_PLAIN && a->y1 == NULL)
        a->r1 = a->r2 = a->nrows;
    const dim3 grid((unsigned)kc_cdiv(a->nrows, 16 * (MQ_WARPS / a->kw)), slots);
    cudaStream_t st = (cudaStream_t)stream;
    /* biases: plain products only, never with the SwiGLU pair */
    const int biased = a->mode == MQ_PLAIN && (a->pb || a->pb1 || a->pb2);
#define MQ_GO(T, P, B) KC_LAUNCH(err, mq_kernel<T, P, B>, grid, MQ_THREADS, 0, st, *a)
    if (w->type == BL_TYPE_Q4_K && w2)
        MQ_GO(BL_TYPE_Q4_K, 1, 0);
    else if (w->type == BL_TYPE_Q4_K && biased)
        MQ_GO(BL_TYPE_Q4_K, 0, 1);
    else if (w->type == BL_TYPE_Q4_K)
        MQ_GO(BL_TYPE_Q4_K, 0, 0);
    else if (w2)
        MQ_GO(BL_TYPE_Q6_K, 1, 0);
    else if (biased)
        MQ_GO(BL_TYPE_Q6_K, 0, 1);
    else
        MQ_GO(BL_TYPE_Q6_K, 0, 0);
#undef MQ_GO
    return 0;
}

/* The arguments of a plain product of n columns (split outputs as plain_args takes
 * them). */
static mq_args_t mq_plain_args(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                               int accumulate, const float *bias, const kcuda_out_t *outs, int nouts)
{
    const mv_args_t p = plain_args(w, NULL, d_x, ldx, n, d_y, ldy, accumulate, bias, outs, nouts, 0);
    mq_args_t a = {};
    a.nrows = w->nrows;
    a.x = p.x;
    a.ldx = ldx;
    a.y = p.y;
    a.ldy = p.ldy;
    a.r1 = p.r1;
    a.r2 = p.r2;
    a.y1 = p.y1;
    a.y2 = p.y2;
    a.ldy1 = p.ldy1;
    a.ldy2 = p.ldy2;
    a.pb = p.pb;
    a.pb1 = p.pb1;
    a.pb2 = p.pb2;
    a.n = n;
    a.mode = MQ_PLAIN;
    a.accumulate = accumulate;
    return a;
}

static int mq_plain(const kcuda_mat_t *w, const kcuda_mat_t *w2, const float *d_x, int64_t ldx, int n, float *d_y,
                    int64_t ldy, int accumulate, const float *bias, const kcuda_out_t *outs, int nouts, void *stream,
                    bl_err_t *err)
{
    mq_args_t a = mq_plain_args(w, d_x, ldx, n, d_y, ldy, accumulate, bias, outs, nouts);
    int rc = mq_round(d_x, ldx, n, w->ncols, &a, (cudaStream_t)stream, err);
    return rc < 0 ? rc : mq_launch(w, w2, &a, 1, stream, err);
}

/* The fields every routed-expert product sets alike, on mv_args_t or mq_args_t
 * (named the same): rpe rows per expert of n_expert, x (ldx apart) to y (ldy apart),
 * n rows of k choices d_ids. */
template <typename A>
static void expert_fields(A &a, int64_t rpe, int64_t n_expert, const float *d_x, int64_t ldx, float *d_y,
                          int64_t ldy, const int32_t *d_ids, int n, int k)
{
    a.nrows = rpe;
    a.n_expert = n_expert;
    a.x = d_x;
    a.ldx = ldx;
    a.y = d_y;
    a.ldy = ldy;
    a.ids = d_ids;
    a.n = n;
    a.k = k;
}

/* The routed experts' products grouped by expert: gate (and up, SwiGLU) with mode
 * MQ_UP into y (n * k, rows), or down with MQ_DOWN into y (n * k, rows) unweighted. */
static int mq_experts(const kcuda_mat_t *w, const kcuda_mat_t *w2, int64_t n_expert, int64_t rpe,
                      const int32_t *d_ids, int n, int k, const float *d_x, int64_t ldx, float *d_y, int64_t ldy,
                      int mode, void *stream, bl_err_t *err)
{
    mq_args_t a = {};
    expert_fields(a, rpe, n_expert, d_x, ldx, d_y, ldy, d_ids, n, k);
    a.mode = mode;
    int rc = mq_round(d_x, ldx, mode == MQ_UP ? n : (int64_t)n * k, w->ncols, &a, (cudaStream_t)stream, err);
    return rc < 0 ? rc : mq_launch(w, w2, &a, (unsigned)(n * k), stream, err);
}

/* outs: NULL (one output d_y, ldy, with bias) or the split outputs
 * (kcuda_matvec_split, their biases in them). */
static int matvec_plain(const kcuda_mat_t *w, const kcuda_mat_t *w2, const float *d_x, int64_t ldx,
                        int n, float *d_y, int64_t ldy, int accumulate, const float *bias,
                        const kcuda_out_t *outs, int nouts, void *stream, bl_err_t *err)
{
    int rc = check_x(w, d_x, ldx, "matvec", err);
    if (rc < 0)
        return rc;
    if (n < 1 || n > KCUDA_MV_MAX_ROWS || !d_y || (!outs && ldy < w->nrows))
        return bl_err_set(err, BL_EINVAL, "matvec: %d rows (1..%d), ldy %lld for %lld outputs",
                          n, KCUDA_MV_MAX_ROWS, (long long)ldy, (long long)w->nrows);
    int dev = 0, sms = 0, optin = 0;
    if ((rc = kc_device_limits(&dev, &sms, &optin, err)) < 0)
        return rc;
    if (!w2 && !outs && small_ok(w, sms)) {
        mv_args_t a = {};
        a.w = (const uint8_t *)w->data;
        a.row_bytes = w->row_bytes;
        a.ncols = w->ncols;
        a.nrows = w->nrows;
        a.x = d_x;
        a.ldx = ldx;
        a.y = d_y;
        a.ldy = ldy;
        a.n = n;
        a.accumulate = accumulate;
        a.pb = bias;
        cudaStream_t st = (cudaStream_t)stream;
        switch (w->type) {
        case BL_TYPE_F32: return small_go<BL_TYPE_F32>(&a, st, err);
        case BL_TYPE_F16: return small_go<BL_TYPE_F16>(&a, st, err);
        default: return small_go<BL_TYPE_BF16>(&a, st, err);
        }
    }
    if (mq_fits(w, n, n, stream))
        return mq_plain(w, w2, d_x, ldx, n, d_y, ldy, accumulate, bias, outs, nouts, stream, err);
    /* Rows whose rounded activations do not fit one block go in several launches,
     * each reading the weights again. */
    const int fit = rows_that_fit(w->type, w->ncols, optin);
    if (fit < 1)
        return bl_err_set(err, BL_ENOTSUP, "matvec: rows of %lld columns do not fit shared memory",
                          (long long)w->ncols);
    for (int b = 0; b < n; b += fit) {
        mv_args_t a =
            plain_args(w, w2, d_x, ldx, n - b < fit ? n - b : fit, d_y, ldy, accumulate, bias, outs, nouts, b);
        if ((rc = mv_launch(w, &a, 1, a.n, stream, err)) < 0)
            return rc;
    }
    return 0;
}

int kcuda_matvec(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                 int accumulate, void *stream, bl_err_t *err)
{
    return matvec_plain(w, NULL, d_x, ldx, n, d_y, ldy, accumulate, NULL, NULL, 0, stream, err);
}

int kcuda_matvec_bias(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n, const float *d_bias, float *d_y,
                      int64_t ldy, int accumulate, void *stream, bl_err_t *err)
{
    return matvec_plain(w, NULL, d_x, ldx, n, d_y, ldy, accumulate, d_bias, NULL, 0, stream, err);
}

static int check_outs(const kcuda_mat_t *w, const kcuda_out_t *outs, int nouts, bl_err_t *err)
{
    if (!w || !outs || nouts < 1 || nouts > KCUDA_MV_MAX_OUTS)
        return bl_err_set(err, BL_EINVAL, "matvec_split: %d outputs (1..%d)", nouts, KCUDA_MV_MAX_OUTS);
    int64_t sum = 0;
    for (int i = 0; i < nouts; i++) {
        if (!outs[i].d_y || outs[i].rows < 1 || outs[i].ldy < outs[i].rows)
            return bl_err_set(err, BL_EINVAL, "matvec_split: output %d: %lld rows, ldy %lld", i,
                              (long long)outs[i].rows, (long long)outs[i].ldy);
        sum += outs[i].rows;
    }
    if (sum != w->nrows)
        return bl_err_set(err, BL_EINVAL, "matvec_split: the outputs take %lld rows of %lld", (long long)sum,
                          (long long)w->nrows);
    return 0;
}

int kcuda_matvec_split(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n, const kcuda_out_t *outs,
                       int nouts, void *stream, bl_err_t *err)
{
    int rc = check_outs(w, outs, nouts, err);
    if (rc < 0)
        return rc;
    return matvec_plain(w, NULL, d_x, ldx, n, outs[0].d_y, outs[0].ldy, 0, NULL, outs, nouts, stream, err);
}

int kcuda_matvec_split2(const kcuda_mat_t *w, const kcuda_out_t *outs, int nouts, const kcuda_mat_t *w2,
                        const kcuda_out_t *out2, const float *d_x, int64_t ldx, int n, void *stream,
                        bl_err_t *err)
{
    int rc = check_outs(w, outs, nouts, err);
    if (rc < 0 || (rc = check_x(w, d_x, ldx, "matvec_split2", err)) < 0 ||
        (rc = check_x(w2, d_x, ldx, "matvec_split2", err)) < 0 || (rc = check_outs(w2, out2, 1, err)) < 0)
        return rc;
    if (n < 1 || n > KCUDA_MV_MAX_ROWS || w2->ncols != w->ncols)
        return bl_err_set(err, BL_EINVAL, "matvec_split2: %d rows (1..%d), a second matrix of %lld columns (%lld)",
                          n, KCUDA_MV_MAX_ROWS, (long long)w2->ncols, (long long)w->ncols);
    float *d_y2 = out2->d_y;
    const int64_t ldy2 = out2->ldy;
    int dev = 0, sms = 0, optin = 0;
    if ((rc = kc_device_limits(&dev, &sms, &optin, err)) < 0)
        return rc;
    /* One launch when both take the n rows in one block and the pair of types is
     * one mv_launch2 knows; otherwise the two products one after the other (the
     * tensor-core products among them). */
    /* Both on tensor cores: the rows rounded once for the two. */
    const int mq1 = mq_fits(w, n, n, stream), mq2 = mq_fits(w2, n, n, stream);
    if (mq1 && mq2) {
        mq_args_t a = mq_plain_args(w, d_x, ldx, n, outs[0].d_y, outs[0].ldy, 0, NULL, outs, nouts);
        mq_args_t b = mq_plain_args(w2, d_x, ldx, n, d_y2, ldy2, 0, out2->d_bias, NULL, 0);
        if ((rc = mq_round(d_x, ldx, n, w->ncols, &a, (cudaStream_t)stream, err)) < 0 ||
            (rc = mq_launch(w, NULL, &a, 1, stream, err)) < 0)
            return rc;
        b.terms = a.terms;
        b.R = a.R;
        b.xq = a.xq;
        b.xds = a.xds;
        return mq_launch(w2, NULL, &b, 1, stream, err);
    }
    if (!mq1 && !mq2 &&
        n <= rows_that_fit(w->type, w->ncols, optin) && n <= rows_that_fit(w2->type, w2->ncols, optin)) {
        mv_args_t a1 = plain_args(w, NULL, d_x, ldx, n, outs[0].d_y, outs[0].ldy, 0, NULL, outs, nouts, 0);
        mv_args_t a2 = plain_args(w2, NULL, d_x, ldx, n, d_y2, ldy2, 0, out2->d_bias, NULL, 0, 0);
        if ((rc = mv_launch2(w, &a1, w2, &a2, n, stream, err)) != 0)
            return rc < 0 ? rc : 0;
    }
    if ((rc = kcuda_matvec_split(w, d_x, ldx, n, outs, nouts, stream, err)) < 0)
        return rc;
    return kcuda_matvec_bias(w2, d_x, ldx, n, out2->d_bias, d_y2, ldy2, 0, stream, err);
}

int kcuda_matvec_swiglu(const kcuda_mat_t *gate, const kcuda_mat_t *up, const float *d_x,
                        int64_t ldx, int n, float *d_y, int64_t ldy, void *stream, bl_err_t *err)
{
    int rc = same_shape(gate, up, "matvec_swiglu", err);
    if (rc < 0)
        return rc;
    return matvec_plain(gate, up, d_x, ldx, n, d_y, ldy, 0, NULL, NULL, 0, stream, err);
}

static int experts_args(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids, int n, int k,
                        const char *what, int64_t *rows_per_expert, bl_err_t *err)
{
    if (n_expert < 1 || w->nrows % n_expert != 0)
        return bl_err_set(err, BL_EINVAL, "%s: %lld rows are not %lld experts' worth", what,
                          (long long)w->nrows, (long long)n_expert);
    if (!d_ids || n < 1 || k < 1 || (int64_t)n * k > 65535)
        return bl_err_set(err, BL_EINVAL, "%s: %d rows of %d choices (at most 65535 slots)", what, n, k);
    *rows_per_expert = w->nrows / n_expert;
    return 0;
}

static int experts_up(const kcuda_mat_t *w, const kcuda_mat_t *w2, int64_t n_expert,
                      const int32_t *d_ids, int n, int k, const float *d_x, int64_t ldx, float *d_y,
                      int64_t ldy, const kcuda_experts_ext_t *ext, void *stream, bl_err_t *err)
{
    int64_t rpe = 0;
    int rc = check_x(w, d_x, ldx, "matvec_experts", err);
    if (rc < 0 || (rc = experts_args(w, n_expert, d_ids, n, k, "matvec_experts", &rpe, err)) < 0)
        return rc;
    if (!d_y || ldy < rpe)
        return bl_err_set(err, BL_EINVAL, "matvec_experts: ldy %lld for %lld outputs", (long long)ldy,
                          (long long)rpe);
    const int plain_act = !ext || (!ext->gate_b && !ext->up_b && ext->act == KCUDA_ACT_SWIGLU);
    if (plain_act && mq_group(w, n, k, n_expert, n, stream))
        return mq_experts(w, w2, n_expert, rpe, d_ids, n, k, d_x, ldx, d_y, ldy, MQ_UP, stream, err);
    mv_args_t a = {};
    a.w2 = w2 ? (const uint8_t *)w2->data : NULL;
    expert_fields(a, rpe, n_expert, d_x, ldx, d_y, ldy, d_ids, n, k);
    a.mode = MV_EXPERT;
    if (ext) {
        if (ext->act != KCUDA_ACT_SWIGLU && ext->act != KCUDA_ACT_SWIGLU_OAI)
            return bl_err_set(err, BL_EINVAL, "matvec_experts: activation %d", ext->act);
        a.b1 = ext->gate_b;
        a.b2 = ext->up_b;
        a.act = ext->act;
    }
    return mv_launch(w, &a, (unsigned)(n * k), 1, stream, err);
}

int kcuda_matvec_experts(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids, int n, int k,
                         const float *d_x, int64_t ldx, float *d_y, int64_t ldy, void *stream,
                         bl_err_t *err)
{
    return experts_up(w, NULL, n_expert, d_ids, n, k, d_x, ldx, d_y, ldy, NULL, stream, err);
}

int kcuda_matvec_experts_swiglu(const kcuda_mat_t *gate, const kcuda_mat_t *up, int64_t n_expert,
                                const int32_t *d_ids, int n, int k, const float *d_x, int64_t ldx,
                                float *d_y, int64_t ldy, void *stream, bl_err_t *err)
{
    return kcuda_matvec_experts_swiglu_ext(gate, up, n_expert, d_ids, n, k, d_x, ldx, d_y, ldy, NULL, stream, err);
}

int kcuda_matvec_experts_swiglu_ext(const kcuda_mat_t *gate, const kcuda_mat_t *up, int64_t n_expert,
                                    const int32_t *d_ids, int n, int k, const float *d_x, int64_t ldx, float *d_y,
                                    int64_t ldy, const kcuda_experts_ext_t *ext, void *stream, bl_err_t *err)
{
    int rc = same_shape(gate, up, "matvec_experts_swiglu", err);
    if (rc < 0)
        return rc;
    return experts_up(gate, up, n_expert, d_ids, n, k, d_x, ldx, d_y, ldy, ext, stream, err);
}

int kcuda_matvec_experts_swiglu_route(const kcuda_mat_t *gate, const kcuda_mat_t *up, int64_t n_expert,
                                      const float *d_logits, const kcuda_route_t *r, int32_t *d_ids, float *d_wts, int n,
                                      int k, const float *d_x, int64_t ldx, float *d_y, int64_t ldy, void *stream,
                                      bl_err_t *err)
{
    if (!d_logits || !d_wts || !r || k < 1 || k > KCUDA_MOE_MAX_K || k > n_expert)
        return bl_err_set(err, BL_EINVAL, "matvec_experts_swiglu_route: top %d of %lld experts, or a NULL buffer",
                          k, (long long)n_expert);
    /* more experts than a warp's registers hold here, or the slots grouped by
     * expert (which needs every row's choices): the routing kernel first */
    if (n_expert > MV_ROUTE_MAX || !kcuda_route_plain(r) || mq_group(gate, n, k, n_expert, n, stream)) {
        int rc = kcuda_moe_route(d_logits, n, n_expert, k, r, d_ids, d_wts, stream, err);
        return rc < 0 ? rc
                      : kcuda_matvec_experts_swiglu(gate, up, n_expert, d_ids, n, k, d_x, ldx, d_y, ldy, stream, err);
    }
    int64_t rpe = 0;
    int rc = same_shape(gate, up, "matvec_experts_swiglu_route", err);
    if (rc < 0 || (rc = check_x(gate, d_x, ldx, "matvec_experts_swiglu_route", err)) < 0 ||
        (rc = experts_args(gate, n_expert, d_ids, n, k, "matvec_experts_swiglu_route", &rpe, err)) < 0)
        return rc;
    if (!d_y || ldy < rpe)
        return bl_err_set(err, BL_EINVAL, "matvec_experts_swiglu_route: ldy %lld for %lld outputs",
                          (long long)ldy, (long long)rpe);
    mv_args_t a = {};
    a.w2 = (const uint8_t *)up->data;
    expert_fields(a, rpe, n_expert, d_x, ldx, d_y, ldy, (const int32_t *)NULL, n, k); /* the ids come from routing */
    a.mode = MV_EXPERT;
    a.logits = d_logits;
    a.route = *r;
    a.ids_out = d_ids;
    a.wts_out = d_wts;
    return mv_launch(gate, &a, (unsigned)(n * k), 1, stream, err);
}

int kcuda_matvec_experts_down(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids,
                              const float *d_wts, int n, int k, const float *d_h, int64_t ldh,
                              float *d_y, int64_t ldy, int accumulate, void *stream, bl_err_t *err)
{
    return kcuda_matvec_experts_down_bias(w, n_expert, d_ids, d_wts, n, k, d_h, ldh, NULL, d_y, ldy, accumulate,
                                          stream, err);
}

int kcuda_matvec_experts_down_bias(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids,
                                   const float *d_wts, int n, int k, const float *d_h, int64_t ldh,
                                   const float *d_down_b, float *d_y, int64_t ldy, int accumulate, void *stream,
                                   bl_err_t *err)
{
    int64_t rpe = 0;
    int rc = check_x(w, d_h, ldh, "matvec_experts_down", err);
    if (rc < 0 || (rc = experts_args(w, n_expert, d_ids, n, k, "matvec_experts_down", &rpe, err)) < 0)
        return rc;
    if (!d_wts || !d_y || ldy < rpe)
        return bl_err_set(err, BL_EINVAL, "matvec_experts_down: no weights, or ldy %lld for %lld outputs",
                          (long long)ldy, (long long)rpe);
    mv_args_t a = {};
    expert_fields(a, rpe, n_expert, d_h, ldh, d_y, ldy, d_ids, n, k);
    a.wts = d_wts;
    a.mode = MV_EXPERT_DOWN;
    a.accumulate = accumulate;
    a.b1 = d_down_b;
    return mv_launch(w, &a, (unsigned)n, k, stream, err);
}

int kcuda_matvec_experts_down_grouped(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids,
                                      const float *d_wts, int n, int k, const float *d_h, int64_t ldh,
                                      const float *d_down_b, float *d_scr, int64_t ldscr, float *d_y, int64_t ldy,
                                      int accumulate, void *stream, bl_err_t *err)
{
    if (d_down_b || !mq_group(w, n, k, n_expert, (int64_t)n * k, stream))
        return kcuda_matvec_experts_down_bias(w, n_expert, d_ids, d_wts, n, k, d_h, ldh, d_down_b, d_y, ldy,
                                              accumulate, stream, err);
    int64_t rpe = 0;
    int rc = check_x(w, d_h, ldh, "matvec_experts_down_grouped", err);
    if (rc < 0 || (rc = experts_args(w, n_expert, d_ids, n, k, "matvec_experts_down_grouped", &rpe, err)) < 0)
        return rc;
    if (!d_wts || !d_y || ldy < rpe || !d_scr || ldscr < rpe)
        return bl_err_set(err, BL_EINVAL,
                          "matvec_experts_down_grouped: no weights or scratch, or ldy %lld / ldscr %lld for %lld outputs",
                          (long long)ldy, (long long)ldscr, (long long)rpe);
    if ((rc = mq_experts(w, NULL, n_expert, rpe, d_ids, n, k, d_h, ldh, d_scr, ldscr, MQ_DOWN, stream, err)) < 0)
        return rc;
    const dim3 grid((unsigned)kc_cdiv(rpe, 256), (unsigned)n);
    KC_LAUNCH(err, mq_wsum_kernel, grid, 256, 0, (cudaStream_t)stream, (const float *)d_scr, ldscr, d_wts, k, rpe,
              d_y, ldy, accumulate);
    return 0;
}

int kcuda_get_rows(const kcuda_mat_t *t, const int32_t *d_ids, int64_t n, float *d_y, int64_t ldy,
                   void *stream, bl_err_t *err)
{
    if (!t || !t->data || !d_ids || !d_y || n < 1 || n > 65535 || ldy < t->ncols)
        return bl_err_set(err, BL_EINVAL, "get_rows: %lld rows (1..65535), ldy %lld for %lld columns",
                          (long long)n, (long long)ldy, t ? (long long)t->ncols : 0LL);
    const dim3 grid(1, (unsigned)n), block(256);
    cudaStream_t st = (cudaStream_t)stream;
    const uint8_t *d = (const uint8_t *)t->data;
#define GR(K, T) KC_LAUNCH(err, K<T>, grid, block, 0, st, d, t->row_bytes, t->nrows, t->ncols, d_ids, d_y, ldy)
    switch (t->type) {
    case BL_TYPE_Q4_K: GR(get_rows_q_kernel, BL_TYPE_Q4_K); break;
    case BL_TYPE_Q5_K: GR(get_rows_q_kernel, BL_TYPE_Q5_K); break;
    case BL_TYPE_Q6_K: GR(get_rows_q_kernel, BL_TYPE_Q6_K); break;
    case BL_TYPE_Q8_0: GR(get_rows_q_kernel, BL_TYPE_Q8_0); break;
    case BL_TYPE_MXFP4: GR(get_rows_q_kernel, BL_TYPE_MXFP4); break;
    case BL_TYPE_F16: GR(get_rows_plain_kernel, BL_TYPE_F16); break;
    case BL_TYPE_BF16: GR(get_rows_plain_kernel, BL_TYPE_BF16); break;
    case BL_TYPE_F32: GR(get_rows_plain_kernel, BL_TYPE_F32); break;
    default: return bl_err_set(err, BL_ENOTSUP, "get_rows: weight type %u", t->type);
    }
#undef GR
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}
