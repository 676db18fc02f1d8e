/* Matrix-vector products for decode over weights as GGUF stores them (q4_K, q5_K,
 * q6_K, q8_0, f16, bf16, f32) and f32 activations: the plain product (up to
 * KCUDA_MV_MAX_ROWS activation rows per weight load), the routed experts' gate/up
 * (optionally with SwiGLU) and down (with the weighted sum) of 3-D expert tensors,
 * and the embedding gather.
 *
 * Shape: a block of MV_WARPS warps; each warp owns one output row (one weight row,
 * or a gate/up pair). The warp walks its row in groups of whole blocks (about 2 KiB:
 * 8 K-quant super-blocks, 32 q8_0 blocks, 1024 halves, 512 floats), copies each
 * group into its own shared-memory buffer with 16-byte loads (aligned down and up
 * to 16 bytes, which is why weight data must be padded: kcuda.h), then decodes it
 * from shared memory, each lane taking a fixed part of the group (a quarter of a
 * super-block, one q8_0 block, strided elements), and keeps one f32 partial per
 * activation row. A warp shuffle sums the lanes; lane 0 writes. Row groups of any
 * byte alignment (q6_K's 210-byte and q8_0's 34-byte blocks) go through the same
 * path; only the offset into the buffer changes. No block-wide barrier: a warp
 * whose row is past the end simply leaves. */
#include "kcuda_impl.cuh"

#define MV_WARPS 4
/* A group is at most 2048 bytes; aligned down and up to 16 it spans at most 2080. */
#define MV_GROUP_BYTES 2048
#define MV_STAGE_BYTES (MV_GROUP_BYTES + 32)
#define MV_STAGE_VECS ((MV_STAGE_BYTES / 16 + 31) / 32) /* uint4 loads per lane, at most */
#define MAXR KCUDA_MV_MAX_ROWS
/* Blocks per SM the register budget must allow: decode is latency-bound, so
 * occupancy (bytes in flight) matters more than registers per thread. */
#define MV_MIN_BLOCKS 4

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
} mv_args_t;

// --- formats ------------------------------------------------------------------------------
/* BE elements and BB bytes per block; G blocks per staged group (G * BB <= 2048). */
template <int T> struct fmt;
template <> struct fmt<BL_TYPE_Q4_K> { enum { BE = 256, BB = 144, G = 8 }; };
template <> struct fmt<BL_TYPE_Q5_K> { enum { BE = 256, BB = 176, G = 8 }; };
template <> struct fmt<BL_TYPE_Q6_K> { enum { BE = 256, BB = 210, G = 8 }; };
template <> struct fmt<BL_TYPE_Q8_0> { enum { BE = 32, BB = 34, G = 32 }; };
template <> struct fmt<BL_TYPE_F16> { enum { BE = 1, BB = 2, G = 1024 }; };
template <> struct fmt<BL_TYPE_BF16> { enum { BE = 1, BB = 2, G = 1024 }; };
template <> struct fmt<BL_TYPE_F32> { enum { BE = 1, BB = 4, G = 512 }; };

static_assert(fmt<BL_TYPE_Q6_K>::G * fmt<BL_TYPE_Q6_K>::BB <= MV_GROUP_BYTES, "q6_K group");
static_assert(fmt<BL_TYPE_Q5_K>::G * fmt<BL_TYPE_Q5_K>::BB <= MV_GROUP_BYTES, "q5_K group");
static_assert(fmt<BL_TYPE_Q4_K>::G * fmt<BL_TYPE_Q4_K>::BB <= MV_GROUP_BYTES, "q4_K group");
static_assert(fmt<BL_TYPE_Q8_0>::G * fmt<BL_TYPE_Q8_0>::BB <= MV_GROUP_BYTES, "q8_0 group");
static_assert(fmt<BL_TYPE_F16>::G * fmt<BL_TYPE_F16>::BB <= MV_GROUP_BYTES, "f16 group");
static_assert(fmt<BL_TYPE_F32>::G * fmt<BL_TYPE_F32>::BB <= MV_GROUP_BYTES, "f32 group");

static __device__ __forceinline__ uint16_t ld_u16(const uint8_t *p)
{
    return *(const uint16_t *)p;
}

/* Four bytes at a 2-byte aligned shared-memory address. */
static __device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p)
{
    return (uint32_t)ld_u16(p) | (uint32_t)ld_u16(p + 2) << 16;
}

static __device__ __forceinline__ float4 ld_f4(const float *p)
{
    return *(const float4 *)p;
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

/* Copies nbytes at src into the warp's buffer with 16-byte loads of the aligned
 * span around them; returns where src's first byte landed. All lanes call it. */
static __device__ __forceinline__ const uint8_t *stage(uint8_t *buf, const uint8_t *src,
                                                       int nbytes, int lane)
{
    const uintptr_t a0 = (uintptr_t)src & ~(uintptr_t)15;
    const uintptr_t a1 = ((uintptr_t)src + (uintptr_t)nbytes + 15) & ~(uintptr_t)15;
    const int nv = (int)((a1 - a0) >> 4);
    const uint4 *g = (const uint4 *)a0;
    uint4 r[MV_STAGE_VECS];
    __syncwarp(); /* every lane is done with the previous group */
#pragma unroll
    for (int j = 0; j < MV_STAGE_VECS; j++) {
        const int i = lane + 32 * j;
        if (i < nv)
            r[j] = __ldg(g + i);
    }
#pragma unroll
    for (int j = 0; j < MV_STAGE_VECS; j++) {
        const int i = lane + 32 * j;
        if (i < nv)
            ((uint4 *)buf)[i] = r[j];
    }
    __syncwarp();
    return buf + ((uintptr_t)src & 15);
}

// --- one lane's share of a staged group ------------------------------------------------------
/* lane_dot<T>(s, nblk, lane, x, ldx, n, acc): adds to acc[b] (b < n) this lane's part
 * of dot(group, x row b), s the group's first block in shared memory, nblk blocks in
 * it, x the activations at the group's first element. */

template <int T>
static __device__ __forceinline__ void lane_dot(const uint8_t *s, int nblk, int lane, const float *x,
                                                int64_t ldx, int n, float *acc);

/* q4_K: four lanes per super-block; lane part p takes sub-blocks 2p (low nibbles of
 * qs[32p .. 32p+31]) and 2p+1 (high nibbles): elements 64p .. 64p+63. */
template <>
__device__ __forceinline__ void lane_dot<BL_TYPE_Q4_K>(const uint8_t *s, int nblk, int lane,
                                                       const float *x, int64_t ldx, int n, float *acc)
{
    const int blk = lane >> 2, p = lane & 3;
    if (blk >= nblk)
        return;
    const uint8_t *b = s + blk * 144;
    const float d = kc_half(ld_u16(b)), dmin = kc_half(ld_u16(b + 2));
    int sc0, m0, sc1, m1;
    k_scale_min(b + 4, 2 * p, &sc0, &m0);
    k_scale_min(b + 4, 2 * p + 1, &sc1, &m1);
    const uint4 qa = *(const uint4 *)(b + 16 + 32 * p), qb = *(const uint4 *)(b + 32 + 32 * p);
    const uint32_t qw[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    const float d0 = d * (float)sc0, mn0 = dmin * (float)m0;
    const float d1 = d * (float)sc1, mn1 = dmin * (float)m1;
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r >= n)
            break;
        const float *xr = x + r * ldx + blk * 256 + 64 * p;
        float s0 = 0.0f, s1 = 0.0f, x0 = 0.0f, x1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 xl = ld_f4(xr + 4 * i), xh = ld_f4(xr + 32 + 4 * i);
            const uint32_t w = qw[i];
            s0 += (float)(w & 0xf) * xl.x + (float)((w >> 8) & 0xf) * xl.y +
                  (float)((w >> 16) & 0xf) * xl.z + (float)((w >> 24) & 0xf) * xl.w;
            s1 += (float)((w >> 4) & 0xf) * xh.x + (float)((w >> 12) & 0xf) * xh.y +
                  (float)((w >> 20) & 0xf) * xh.z + (float)((w >> 28) & 0xf) * xh.w;
            x0 += xl.x + xl.y + xl.z + xl.w;
            x1 += xh.x + xh.y + xh.z + xh.w;
        }
        acc[r] += d0 * s0 - mn0 * x0 + d1 * s1 - mn1 * x1;
    }
}

/* q5_K: as q4_K, the fifth bit of element 64p + l (low) at bit 2p of qh[l], of
 * element 64p + 32 + l (high) at bit 2p + 1. */
template <>
__device__ __forceinline__ void lane_dot<BL_TYPE_Q5_K>(const uint8_t *s, int nblk, int lane,
                                                       const float *x, int64_t ldx, int n, float *acc)
{
    const int blk = lane >> 2, p = lane & 3;
    if (blk >= nblk)
        return;
    const uint8_t *b = s + blk * 176;
    const float d = kc_half(ld_u16(b)), dmin = kc_half(ld_u16(b + 2));
    int sc0, m0, sc1, m1;
    k_scale_min(b + 4, 2 * p, &sc0, &m0);
    k_scale_min(b + 4, 2 * p + 1, &sc1, &m1);
    const uint4 ha = *(const uint4 *)(b + 16), hb = *(const uint4 *)(b + 32);
    const uint4 qa = *(const uint4 *)(b + 48 + 32 * p), qb = *(const uint4 *)(b + 64 + 32 * p);
    const uint32_t hw[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
    const uint32_t qw[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    const float d0 = d * (float)sc0, mn0 = dmin * (float)m0;
    const float d1 = d * (float)sc1, mn1 = dmin * (float)m1;
    const int lb = 2 * p, hbit = 2 * p + 1;
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r >= n)
            break;
        const float *xr = x + r * ldx + blk * 256 + 64 * p;
        float s0 = 0.0f, s1 = 0.0f, x0 = 0.0f, x1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 xl = ld_f4(xr + 4 * i), xh = ld_f4(xr + 32 + 4 * i);
            const float xlv[4] = {xl.x, xl.y, xl.z, xl.w}, xhv[4] = {xh.x, xh.y, xh.z, xh.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint32_t q = qw[i] >> (8 * j), h = hw[i] >> (8 * j);
                const int ql = (int)(q & 0xf) | (int)((h >> lb) & 1) << 4;
                const int qh = (int)((q >> 4) & 0xf) | (int)((h >> hbit) & 1) << 4;
                s0 += (float)ql * xlv[j];
                s1 += (float)qh * xhv[j];
                x0 += xlv[j];
                x1 += xhv[j];
            }
        }
        acc[r] += d0 * s0 - mn0 * x0 + d1 * s1 - mn1 * x1;
    }
}

/* q6_K: four lanes per super-block; lane part p takes half h = p / 2 and l in
 * 16 (p % 2) .. +15 of that half, and for each l the four elements 128h + 32k + l
 * (k = 0..3): low nibbles from ql[64h + l] (k = 0, 2: low, high nibble) and
 * ql[64h + 32 + l] (k = 1, 3), two high bits at bit 2k of qh[32h + l], scale
 * scales[8h + 2k + p % 2]. Blocks are 210 bytes: only 2-byte reads are aligned. */
template <>
__device__ __forceinline__ void lane_dot<BL_TYPE_Q6_K>(const uint8_t *s, int nblk, int lane,
                                                       const float *x, int64_t ldx, int n, float *acc)
{
    const int blk = lane >> 2, p = lane & 3, h = p >> 1, hl = p & 1;
    if (blk >= nblk)
        return;
    const uint8_t *b = s + blk * 210;
    const float d = kc_half(ld_u16(b + 208));
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + hl;
    const float dk[4] = {d * (float)sc[0], d * (float)sc[2], d * (float)sc[4], d * (float)sc[6]};
    const uint8_t *ql0 = b + 64 * h + 16 * hl, *ql1 = ql0 + 32, *qh = b + 128 + 32 * h + 16 * hl;
    const int e0 = blk * 256 + 128 * h + 16 * hl;
#pragma unroll
    for (int lq = 0; lq < 4; lq++) {
        const uint32_t a = ld_u32_a2(ql0 + 4 * lq), c = ld_u32_a2(ql1 + 4 * lq);
        const uint32_t hb = ld_u32_a2(qh + 4 * lq);
        float wv[4][4]; /* [k][j]: element 128h + 32k + 16hl + 4lq + j */
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t aj = (a >> (8 * j)) & 0xff, cj = (c >> (8 * j)) & 0xff;
            const uint32_t hj = (hb >> (8 * j)) & 0xff;
            wv[0][j] = dk[0] * (float)((int)((aj & 0xf) | (hj & 3) << 4) - 32);
            wv[1][j] = dk[1] * (float)((int)((cj & 0xf) | ((hj >> 2) & 3) << 4) - 32);
            wv[2][j] = dk[2] * (float)((int)((aj >> 4) | ((hj >> 4) & 3) << 4) - 32);
            wv[3][j] = dk[3] * (float)((int)((cj >> 4) | ((hj >> 6) & 3) << 4) - 32);
        }
#pragma unroll
        for (int r = 0; r < MAXR; r++) {
            if (r >= n)
                break;
            const float *xr = x + r * ldx + e0 + 4 * lq;
            float t = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4 xv = ld_f4(xr + 32 * k);
                t += wv[k][0] * xv.x + wv[k][1] * xv.y + wv[k][2] * xv.z + wv[k][3] * xv.w;
            }
            acc[r] += t;
        }
    }
}

/* q8_0: one block of 32 per lane; 34-byte blocks, so 2-byte reads. */
template <>
__device__ __forceinline__ void lane_dot<BL_TYPE_Q8_0>(const uint8_t *s, int nblk, int lane,
                                                       const float *x, int64_t ldx, int n, float *acc)
{
    if (lane >= nblk)
        return;
    const uint8_t *b = s + lane * 34;
    const float d = kc_half(ld_u16(b));
    int32_t qw[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        qw[i] = (int32_t)ld_u32_a2(b + 2 + 4 * i);
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r >= n)
            break;
        const float *xr = x + r * ldx + lane * 32;
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 xv = ld_f4(xr + 4 * i);
            const int32_t w = qw[i];
            t += (float)(int8_t)(w & 0xff) * xv.x + (float)(int8_t)((w >> 8) & 0xff) * xv.y +
                 (float)(int8_t)((w >> 16) & 0xff) * xv.z + (float)(int8_t)((w >> 24) & 0xff) * xv.w;
        }
        acc[r] += d * t;
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

#define PLAIN_LANE_DOT(T)                                                                       \
    template <>                                                                                 \
    __device__ __forceinline__ void lane_dot<T>(const uint8_t *s, int nblk, int lane,           \
                                                const float *x, int64_t ldx, int n, float *acc) \
    {                                                                                           \
        for (int e = lane; e < nblk; e += 32) {                                                 \
            const float w = plain_elem<T>(s, e);                                                \
            _Pragma("unroll") for (int r = 0; r < MAXR; r++)                                    \
            {                                                                                   \
                if (r >= n)                                                                     \
                    break;                                                                      \
                acc[r] += w * x[r * ldx + e];                                                   \
            }                                                                                   \
        }                                                                                       \
    }
PLAIN_LANE_DOT(BL_TYPE_F16)
PLAIN_LANE_DOT(BL_TYPE_BF16)
PLAIN_LANE_DOT(BL_TYPE_F32)

/* This lane's partial dot products of one weight row with n activation rows. */
template <int T>
static __device__ __forceinline__ void row_dot(const uint8_t *wrow, int64_t ncols, const float *x,
                                               int64_t ldx, int n, float *acc, uint8_t *buf, int lane)
{
    typedef fmt<T> F;
    const int64_t nblk = ncols / F::BE;
    for (int64_t g0 = 0; g0 < nblk; g0 += F::G) {
        const int gb = (int)(nblk - g0 < F::G ? nblk - g0 : F::G);
        const uint8_t *s = stage(buf, wrow + g0 * F::BB, gb * F::BB, lane);
        lane_dot<T>(s, gb, lane, x + g0 * F::BE, ldx, n, acc);
    }
}

// --- the kernel ----------------------------------------------------------------------------

/* grid (ceil(nrows / MV_WARPS), slots): slots = 1 (plain), n * k (expert), n (down). */
template <int T>
__global__ void __launch_bounds__(MV_WARPS * 32, MV_MIN_BLOCKS) mv_kernel(const mv_args_t a)
{
    __shared__ __align__(16) uint8_t sbuf[MV_WARPS][MV_STAGE_BYTES];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + warp;
    if (r >= a.nrows)
        return; /* the whole warp: no barrier below spans warps */
    uint8_t *buf = sbuf[warp];
    float acc[MAXR], acc2[MAXR];
#pragma unroll
    for (int i = 0; i < MAXR; i++)
        acc[i] = acc2[i] = 0.0f;
    int nout = 1;
    int64_t yrow = 0;
    if (a.mode == MV_PLAIN) {
        nout = a.n;
        row_dot<T>(a.w + r * a.row_bytes, a.ncols, a.x, a.ldx, a.n, acc, buf, lane);
        if (a.w2)
            row_dot<T>(a.w2 + r * a.row_bytes, a.ncols, a.x, a.ldx, a.n, acc2, buf, lane);
    } else if (a.mode == MV_EXPERT) {
        const int64_t slot = blockIdx.y;
        const int32_t e = a.ids[slot];
        yrow = slot;
        if (e >= 0 && e < a.n_expert) {
            const size_t off = (size_t)(e * a.nrows + r) * a.row_bytes;
            const float *x = a.x + (slot / a.k) * a.ldx;
            row_dot<T>(a.w + off, a.ncols, x, a.ldx, 1, acc, buf, lane);
            if (a.w2)
                row_dot<T>(a.w2 + off, a.ncols, x, a.ldx, 1, acc2, buf, lane);
        }
    } else {
        const int64_t b = blockIdx.y;
        yrow = b;
        for (int j = 0; j < a.k; j++) {
            const int64_t slot = b * a.k + j;
            const int32_t e = a.ids[slot];
            if (e < 0 || e >= a.n_expert)
                continue;
            float t[MAXR];
            t[0] = 0.0f;
            row_dot<T>(a.w + (size_t)(e * a.nrows + r) * a.row_bytes, a.ncols, a.x + slot * a.ldx,
                       a.ldx, 1, t, buf, lane);
            acc[0] += a.wts[slot] * t[0];
        }
    }
#pragma unroll
    for (int i = 0; i < MAXR; i++) {
        if (i >= nout)
            break;
        const float v = kc_warp_sum(acc[i]);
        const float u = a.w2 ? kc_warp_sum(acc2[i]) : 0.0f;
        if (lane == 0) {
            const float o = a.w2 ? kc_silu_mul(v, u) : v;
            float *y = a.y + (yrow + i) * a.ldy + r;
            *y = a.accumulate ? *y + o : o;
        }
    }
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

/* grid (1, n): one block per gathered row; threads take 32-element units. */
template <int T>
__global__ void get_rows_q_kernel(const uint8_t *table, size_t row_bytes, int64_t nrows,
                                  int64_t ncols, const int32_t *ids, float *y, int64_t ldy)
{
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

static int mv_launch(const kcuda_mat_t *w, mv_args_t *a, unsigned slots, void *stream, bl_err_t *err)
{
    const dim3 grid((unsigned)kc_cdiv(a->nrows, MV_WARPS), slots);
    const dim3 block(MV_WARPS * 32);
    cudaStream_t st = (cudaStream_t)stream;
    a->w = (const uint8_t *)w->data;
    a->row_bytes = w->row_bytes;
    a->ncols = w->ncols;
    switch (w->type) {
    case BL_TYPE_Q4_K: mv_kernel<BL_TYPE_Q4_K><<<grid, block, 0, st>>>(*a); break;
    case BL_TYPE_Q5_K: mv_kernel<BL_TYPE_Q5_K><<<grid, block, 0, st>>>(*a); break;
    case BL_TYPE_Q6_K: mv_kernel<BL_TYPE_Q6_K><<<grid, block, 0, st>>>(*a); break;
    case BL_TYPE_Q8_0: mv_kernel<BL_TYPE_Q8_0><<<grid, block, 0, st>>>(*a); break;
    case BL_TYPE_F16: mv_kernel<BL_TYPE_F16><<<grid, block, 0, st>>>(*a); break;
    case BL_TYPE_BF16: mv_kernel<BL_TYPE_BF16><<<grid, block, 0, st>>>(*a); break;
    case BL_TYPE_F32: mv_kernel<BL_TYPE_F32><<<grid, block, 0, st>>>(*a); break;
    default: return bl_err_set(err, BL_ENOTSUP, "matvec: weight type %u", w->type);
    }
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}

static int matvec_plain(const kcuda_mat_t *w, const kcuda_mat_t *w2, const float *d_x, int64_t ldx,
                        int n, float *d_y, int64_t ldy, int accumulate, void *stream, bl_err_t *err)
{
    int rc = check_x(w, d_x, ldx, "matvec", err);
    if (rc < 0)
        return rc;
    if (n < 1 || n > KCUDA_MV_MAX_ROWS || !d_y || ldy < w->nrows)
        return bl_err_set(err, BL_EINVAL, "matvec: %d rows (1..%d), ldy %lld for %lld outputs",
                          n, KCUDA_MV_MAX_ROWS, (long long)ldy, (long long)w->nrows);
    mv_args_t a = {};
    a.w2 = w2 ? (const uint8_t *)w2->data : NULL;
    a.nrows = w->nrows;
    a.x = d_x;
    a.ldx = ldx;
    a.y = d_y;
    a.ldy = ldy;
    a.n = n;
    a.mode = MV_PLAIN;
    a.accumulate = accumulate;
    return mv_launch(w, &a, 1, stream, err);
}

int kcuda_matvec(const kcuda_mat_t *w, const float *d_x, int64_t ldx, int n, float *d_y, int64_t ldy,
                 int accumulate, void *stream, bl_err_t *err)
{
    return matvec_plain(w, NULL, d_x, ldx, n, d_y, ldy, accumulate, stream, err);
}

int kcuda_matvec_swiglu(const kcuda_mat_t *gate, const kcuda_mat_t *up, const float *d_x,
                        int64_t ldx, int n, float *d_y, int64_t ldy, void *stream, bl_err_t *err)
{
    int rc = same_shape(gate, up, "matvec_swiglu", err);
    if (rc < 0)
        return rc;
    return matvec_plain(gate, up, d_x, ldx, n, d_y, ldy, 0, stream, err);
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
                      int64_t ldy, void *stream, bl_err_t *err)
{
    int64_t rpe = 0;
    int rc = check_x(w, d_x, ldx, "matvec_experts", err);
    if (rc < 0 || (rc = experts_args(w, n_expert, d_ids, n, k, "matvec_experts", &rpe, err)) < 0)
        return rc;
    if (!d_y || ldy < rpe)
        return bl_err_set(err, BL_EINVAL, "matvec_experts: ldy %lld for %lld outputs", (long long)ldy,
                          (long long)rpe);
    mv_args_t a = {};
    a.w2 = w2 ? (const uint8_t *)w2->data : NULL;
    a.nrows = rpe;
    a.n_expert = n_expert;
    a.x = d_x;
    a.ldx = ldx;
    a.y = d_y;
    a.ldy = ldy;
    a.ids = d_ids;
    a.n = n;
    a.k = k;
    a.mode = MV_EXPERT;
    return mv_launch(w, &a, (unsigned)(n * k), stream, err);
}

int kcuda_matvec_experts(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids, int n, int k,
                         const float *d_x, int64_t ldx, float *d_y, int64_t ldy, void *stream,
                         bl_err_t *err)
{
    return experts_up(w, NULL, n_expert, d_ids, n, k, d_x, ldx, d_y, ldy, stream, err);
}

int kcuda_matvec_experts_swiglu(const kcuda_mat_t *gate, const kcuda_mat_t *up, int64_t n_expert,
                                const int32_t *d_ids, int n, int k, const float *d_x, int64_t ldx,
                                float *d_y, int64_t ldy, void *stream, bl_err_t *err)
{
    int rc = same_shape(gate, up, "matvec_experts_swiglu", err);
    if (rc < 0)
        return rc;
    return experts_up(gate, up, n_expert, d_ids, n, k, d_x, ldx, d_y, ldy, stream, err);
}

int kcuda_matvec_experts_down(const kcuda_mat_t *w, int64_t n_expert, const int32_t *d_ids,
                              const float *d_wts, int n, int k, const float *d_h, int64_t ldh,
                              float *d_y, int64_t ldy, int accumulate, void *stream, bl_err_t *err)
{
    int64_t rpe = 0;
    int rc = check_x(w, d_h, ldh, "matvec_experts_down", err);
    if (rc < 0 || (rc = experts_args(w, n_expert, d_ids, n, k, "matvec_experts_down", &rpe, err)) < 0)
        return rc;
    if (!d_wts || !d_y || ldy < rpe)
        return bl_err_set(err, BL_EINVAL, "matvec_experts_down: no weights, or ldy %lld for %lld outputs",
                          (long long)ldy, (long long)rpe);
    mv_args_t a = {};
    a.nrows = rpe;
    a.n_expert = n_expert;
    a.x = d_h;
    a.ldx = ldh;
    a.y = d_y;
    a.ldy = ldy;
    a.ids = d_ids;
    a.wts = d_wts;
    a.n = n;
    a.k = k;
    a.mode = MV_EXPERT_DOWN;
    a.accumulate = accumulate;
    return mv_launch(w, &a, (unsigned)n, stream, err);
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
#define GR(K, T) K<T><<<grid, block, 0, st>>>(d, t->row_bytes, t->nrows, t->ncols, d_ids, d_y, ldy)
    switch (t->type) {
    case BL_TYPE_Q4_K: GR(get_rows_q_kernel, BL_TYPE_Q4_K); break;
    case BL_TYPE_Q5_K: GR(get_rows_q_kernel, BL_TYPE_Q5_K); break;
    case BL_TYPE_Q6_K: GR(get_rows_q_kernel, BL_TYPE_Q6_K); break;
    case BL_TYPE_Q8_0: GR(get_rows_q_kernel, BL_TYPE_Q8_0); break;
    case BL_TYPE_F16: GR(get_rows_plain_kernel, BL_TYPE_F16); break;
    case BL_TYPE_BF16: GR(get_rows_plain_kernel, BL_TYPE_BF16); break;
    case BL_TYPE_F32: GR(get_rows_plain_kernel, BL_TYPE_F32); break;
    default: return bl_err_set(err, BL_ENOTSUP, "get_rows: weight type %u", t->type);
    }
#undef GR
    KCUDA_CHECK_LAUNCH(err);
    return 0;
}
