/* Decode attention over an f16 KV cache (flash-decoding) and the cache store.
 *
 * Split pass, grid (n_kv_head, n_split, n) (the KV head fastest, so the blocks of
 * one span's KV heads run together): a block of 128 threads takes one row, one KV
 * head and a span of `per` consecutive chunks of `chunk` positions of its context
 * (att_chunk: 16 to KCUDA_ATT_CHUNK, shorter for short contexts so that a decode
 * step's few rows still give the card a few hundred blocks; att_per: one chunk a
 * block up to KCUDA_ATT_SPLITS chunks, more past it), for all the query heads of
 * that KV head's group, so each K and V row is read once per group. It issues a
 * chunk's K and then its V rows as 16-byte asynchronous copies into shared memory
 * (two groups: the whole chunk in flight at once), scores the positions once K
 * has landed, takes the chunk's softmax against the running maximum (m, l, and
 * the sums so far rescaled), and accumulates p * V from shared memory; the next
 * chunk's K is issued as soon as the scores are taken and its V once p * V is
 * done, so its loads run under this chunk's arithmetic. p * V and the scores run
 * on tensor cores at head_dim 64 and 128 (att_split_kernel's MMA form), else in FP32
 * (head_dim / 8 lanes per position and a shuffle sum for the scores; four
 * dimensions per thread, head_dim / 4 threads per position and phases summed in
 * shared memory for p * V). It writes the unnormalised sum and (m, l) to scratch.
 * Combine pass, grid (n_head, n, head_dim / 32): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M),
 * the weights e^(m_s - M) computed once per split into shared memory, the sum
 * taken by split phases with 16-byte loads.
 * A span past a row's causal end (or wholly before its window) writes m = -inf,
 * l = 0 and drops out.
 *
 * The _rows variants (graph-friendly) take each row's cache address and position
 * from a table on the card (kcuda_kv_row_t) instead of launch arguments, so a
 * captured step replays for any caches and positions; the kernels are the same,
 * with a span past a row's end returning at once and the combine reading only
 * the row's own splits. */
#include <math.h>

#include "kcuda_impl.cuh"

#define ATT_THREADS 128
#define ATT_CHUNK KCUDA_ATT_CHUNK
#define ATT_MAXG KCUDA_ATT_MAX_GROUP

/* Positions per chunk for a grid over max_len positions: 16 up to 4096 positions,
 * then 32, 64, and KCUDA_ATT_CHUNK past 16384 (64 at head_dim 256, whose rows of
 * 128 positions would not fit the shared memory of small cards), so that a context
 * of 1024 to 32768 gets 64 to 256 chunks per (row, KV head) at head_dim up to 128,
 * and past KCUDA_ATT_SPLITS chunks each block takes several (att_per): a decode
 * step of one row over 4 KV heads still puts a few blocks on every SM. The
 * schedule depends on max_len and head_dim alone (never on the row count): a row
 * gives the same bits in any step over the same max_len. */
static int att_chunk_cap(int hd) { return hd > 128 ? ATT_CHUNK / 2 : ATT_CHUNK; }

/* The shortest chunk the schedule may use (kcuda_attention_set_chunk). */
static int g_att_chunk_min = 16;

int kcuda_attention_set_chunk(int min_chunk)
{
    const int old = g_att_chunk_min;
    g_att_chunk_min = min_chunk < 16 ? 16 : min_chunk > ATT_CHUNK ? ATT_CHUNK : min_chunk / 16 * 16;
    return old;
}

static int att_chunk(int64_t max_len, int hd)
{
    int c = max_len <= 4096 ? 16 : max_len <= 8192 ? 32 : max_len <= 16384 ? 64 : ATT_CHUNK;
    c = c > g_att_chunk_min ? c : g_att_chunk_min;
    return c < att_chunk_cap(hd) ? c : att_chunk_cap(hd);
}

/* The most blocks per (row, KV head) the schedule gives before each block takes
 * several chunks (kcuda_attention_set_splits; 0: one chunk a block). */
static int g_att_splits = KCUDA_ATT_SPLITS;

int kcuda_attention_set_splits(int max_splits)
{
    const int old = g_att_splits;
    g_att_splits = max_splits < 0 ? 0 : max_splits > 4096 ? 4096 : max_splits;
    return old;
}

/* Chunks per split block: as few as keep the splits within g_att_splits. */
static int att_per(int64_t max_len, int hd)
{
    const int64_t n_chunk = kc_cdiv(max_len, att_chunk(max_len, hd));
    return g_att_splits > 0 && n_chunk > g_att_splits ? (int)kc_cdiv(n_chunk, g_att_splits) : 1;
}

static int64_t att_splits(int64_t max_len, int hd)
{
    return kc_cdiv(max_len, (int64_t)att_chunk(max_len, hd) * att_per(max_len, hd));
}

/* The most splits any max_len' <= max_len gives (what scratch must hold):
 * att_splits with one chunk a block (several give fewer) is at most 256 up to
 * 16384 positions (32768 where the cap is 128),
 * then ceil(max_len / cap). */
static int64_t att_splits_bound(int64_t max_len, int hd)
{
    const int64_t a = kc_cdiv(max_len, 16), b = kc_cdiv(max_len, att_chunk_cap(hd));
    const int64_t hi = b > 256 ? b : 256;
    return a < hi ? a : hi;
}

/* The combine's shared weights: one float per split, within the default 48 KB
 * beside its 2 KB of phase sums. */
#define ATT_MAX_SPLITS 11500

/* Shared memory of a split block, in floats: (m, l, rescale) per head (padded to 4), then q
 * (group, hd) and the scores (group, ATT_CHUNK), then the chunk's K and V rows
 * (chunk, hd) f16 each. The phase sums of p * V (ATT_THREADS * 4 / hd phases,
 * group, hd) = ATT_PV_FLOATS * group take the place of q, the scores and the rows
 * once all are read. At most 90.4 KB (group 16, head_dim 256, chunk 64). */
#define ATT_PV_FLOATS (ATT_THREADS * 4)
static size_t att_smem_floats(int group, int hd, int chunk)
{
    const size_t body = (size_t)group * (size_t)(hd + ATT_CHUNK) + (size_t)chunk * (size_t)hd;
    const size_t red = (size_t)ATT_PV_FLOATS * (size_t)group;
    return 4 * (size_t)group + (body > red ? body : red);
}

static size_t att_smem_bytes(int group, int hd, int chunk) { return sizeof(float) * att_smem_floats(group, hd, chunk); }


/* The step's work before attention, for att_short_kernel<HD, true>: the raw k and v
 * rows (n, n_kv * HD), the q/k norm gains, RoPE positions and base (kcuda_qkv_rows). */
typedef struct att_qkv {
    const float *k, *v, *qg, *kg;
    const int32_t *pos;
    int n_kv;
    kcuda_rope_t rope;
    float eps;
} att_qkv_t;

/* acc[j] += p(j, t) * V (four dimensions of position t, raw f16) for the group's heads. */
__device__ __forceinline__ void att_pv(float4 *acc, const float *sc, int t, int group, uint2 raw)
{
    const float2 v01 = __half22float2(*(const __half2 *)&raw.x), v23 = __half22float2(*(const __half2 *)&raw.y);
#pragma unroll
    for (int j = 0; j < ATT_MAXG; j++) {
        if (j >= group)
            break;
        const float p = sc[j * ATT_CHUNK + t];
        acc[j].x += p * v01.x;
        acc[j].y += p * v01.y;
        acc[j].z += p * v23.x;
        acc[j].w += p * v23.y;
    }
}

/* q (8 floats) . k (8 floats) */
__device__ __forceinline__ float att_dot8(const float *qq, const float *k)
{
    return qq[0] * k[0] + qq[1] * k[1] + qq[2] * k[2] + qq[3] * k[3] + qq[4] * k[4] + qq[5] * k[5] + qq[6] * k[6] +
           qq[7] * k[7];
}

/* Eight f16 of a K row in shared memory, as floats. */
__device__ __forceinline__ void att_k8(float *kf, const __half *src)
{
    const uint4 raw = *(const uint4 *)src;
    const __half2 *h2 = (const __half2 *)&raw;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __half22float2(h2[i]);
        kf[2 * i] = f.x;
        kf[2 * i + 1] = f.y;
    }
}

/* The place of 16-byte piece c of row t of a chunk's K or V rows in shared memory
 * for the tensor-core form: piece c ^ att_swz(t), so that the 8 rows an ldmatrix
 * reads, and the two rows a quarter-warp's 16-byte reads of K take, fall on
 * distinct banks (rows are 256 bytes, all on the same banks unswizzled). */
__device__ __forceinline__ int att_swz(int t) { return ((t & 1) << 2) | ((t >> 1) & 3); }

/* Rows 0 .. n - 1 of a chunk (src: its first row's piece 0, rb bytes apart; 2^lp
 * 16-byte pieces a row) into dst (rows of 8 * 2^lp f16, pieces placed by att_swz
 * when swz), as asynchronous copies spread over the block's threads. */
__device__ __forceinline__ void att_copy_rows(__half *dst, const uint8_t *src, size_t rb, int n, int lp, bool swz,
                                              int tid)
{
    for (int i = tid; i < n << lp; i += ATT_THREADS) {
        const int t = i >> lp, c = i & ((1 << lp) - 1), cs = swz ? c ^ att_swz(t) : c;
        kc_cp_async16(dst + ((size_t)t << (lp + 3)) + 8 * cs, src + (size_t)t * rb + 16 * (size_t)c, 16);
    }
}

/* A chunk's V rows (att_copy_rows from vc + off), and in the tensor-core form (mma)
 * zeros in the rows from n up to the next 16 (its products take 16 at a time). */
__device__ __forceinline__ void att_copy_v(__half *dst, const uint8_t *vc, size_t off, size_t rb, int n, int lp,
                                           bool mma, int tid)
{
    att_copy_rows(dst, vc + off, rb, n, lp, mma, tid);
    if (mma)
        for (int i = (n << lp) + tid; i < ((n + 15) & ~15) << lp; i += ATT_THREADS)
            kc_cp_async16(dst + ((size_t)(i >> lp) << (lp + 3)) + 8 * (i & ((1 << lp) - 1)), vc, 0);
}

/* f (two floats) as f16 pairs hi + lo: hi = f16(f), lo = f16(f - hi); hi + lo
 * carries about 22 bits of each, so products with f16 K and V keep f32 accuracy. */
__device__ __forceinline__ void att_split_f16(float x, float y, unsigned *hi, unsigned *lo)
{
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    *hi = *(const unsigned *)&h;
    *lo = *(const unsigned *)&l;
}

/* MH (the MMA form): head_dim MH = 64 (gpt-oss) or 128 and a group of up to 16
 * heads (Qwen3-30B-A3B's 8, GLM-4.5's 12, Qwen3-235B-A22B's 16): the scores and
 * p * V are tensor-core products (mma m16n8k16, f32 sums), the group's heads the 16
 * rows (a lane holds rows gq and gq + 8; rows past the group zero), q and p each
 * split into f16 hi + lo (two products each), K and V exact in f16. Scores: a warp
 * per 8 positions, S (heads, 8 positions) = q (heads, 16 dims) K^T (16 dims, 8
 * positions) over MH / 16 steps of 16 dims, whose order is permuted (the same for q
 * and K) so that each lane reads its K row as MH / 32 16-byte pieces. p * V: a warp
 * per MH / 4 dimensions over all the chunk's positions, O (heads, 8 dims) += p
 * (heads, 16 positions) V (16 positions, 8 dims), V read transposed by ldmatrix;
 * each warp writes its own dimensions, so no phase sums. The FP32 form spends about
 * 2,048 multiply-adds a position and KV head in instructions the SMs issue one warp
 * at a time; at 32k positions that, not the memory, was the bound. */
template <int MH>
__global__ void __launch_bounds__(ATT_THREADS, 1)
att_split_kernel(const uint8_t *kc, const uint8_t *vc, size_t rb, const float *q, int64_t pos0,
                 int n_head, int group, int hd, float scale, int64_t n_split, int chunk, int per, float *pacc,
                 float *pml, const kcuda_kv_row_t *rows, int64_t layer, int window)
{
    kc_wait_prior();
    kc_allow_next();
    constexpr bool MMA = MH != 0;
    /* the tensor-core form's 16-dim steps, their pairs, and 8-dim tiles a warp owns */
    constexpr int NS = MMA ? MH / 16 : 1, NU = MMA ? NS / 2 : 1, NT = MMA ? MH / 32 : 1;
    if (MMA)
        hd = MH;
    extern __shared__ float4 att_smem4[];
    float *ml = (float *)att_smem4;                     // (group, 4): m, l, the last chunk's rescale
    float *qs = ml + 4 * group;                         // (group, hd), pre-scaled
    float *sc = qs + group * hd;                        // (group, ATT_CHUNK): scores, then probabilities
    __half *ks = (__half *)(sc + group * ATT_CHUNK);    // (chunk, hd): the chunk's K rows
    __half *vs = ks + (size_t)chunk * hd;               // (chunk, hd): its V rows
    float *red = qs;                                    // (phases, group, hd) once all above is read
    const int64_t s = blockIdx.y;
    const int g = blockIdx.x, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int64_t len = pos0 + b + 1;
    if (rows) {
        const kcuda_kv_row_t r = rows[b];
        kc = (const uint8_t *)(uintptr_t)(r.k + (uint64_t)layer * r.layer_bytes);
        vc = kc + r.v_bytes;
        len = (int64_t)r.pos + 1;
    }
    /* The block's positions: its span of per chunks, cut at the row's end, from the
     * chunk holding the row's first visible position (a window's start) */
    const int64_t span = (int64_t)chunk * per, a0 = s * span;
    const int64_t lo = window > 0 && len > window ? len - window : 0;
    const int64_t t_end = len < a0 + span ? len : a0 + span;
    const int64_t t_beg = lo > a0 ? a0 + (lo - a0) / chunk * chunk : a0;
    const int h0 = g * group;
    /* Head h0 + j's partial for this split: pacc[(ph(j)) * hd + d], pml[ph(j) * 2]. */
#define PH(j) (((size_t)b * n_head + h0 + (j)) * (size_t)n_split + (size_t)s)
    if (t_beg >= t_end || lo >= t_end) {
        if (rows) /* the combine reads only this row's own splits */
            return;
        for (int idx = tid; idx < group * hd; idx += ATT_THREADS)
            pacc[PH(idx / hd) * hd + idx % hd] = 0.0f;
        if (tid < group) {
            pml[PH(tid) * 2] = -INFINITY;
            pml[PH(tid) * 2 + 1] = 0.0f;
        }
        return;
    }
    /* Each chunk's K rows of this KV head, then its V rows, are copied to shared
     * memory as two groups of 16-byte pieces: the first chunk's both at once, then
     * the next chunk's K as soon as this one's scores are taken and its V as soon
     * as p * V is done, so the loads of the next chunk run under this one's
     * arithmetic. The tensor-core form's V rows up to the next 16 positions are
     * zeros (its products take 16 at a time). */
    const size_t hoff = (size_t)g * hd * sizeof(__half);
    const int lp = __ffs(hd >> 3) - 1; /* log2 of the 16-byte pieces of a row */
    int64_t t0 = t_beg;
    int cnt = t_end - t0 < chunk ? (int)(t_end - t0) : chunk;
    att_copy_rows(ks, kc + (size_t)t0 * rb + hoff, rb, cnt, lp, MMA, tid);
    kc_cp_async_commit();
    att_copy_v(vs, vc, (size_t)t0 * rb + hoff, rb, cnt, lp, MMA, tid);
    kc_cp_async_commit();
    const float *qg = q + ((size_t)b * n_head + h0) * hd;
    for (int idx = tid; idx < group * hd; idx += ATT_THREADS)
        qs[idx] = qg[idx] * scale;
    if (tid < group) {
        ml[4 * tid] = -INFINITY;
        ml[4 * tid + 1] = 0.0f;
    }
    __syncthreads();

    const int gq = lane >> 2, tq = lane & 3; /* the tensor-core fragments' row and column group */
    /* MMA: q as the A operand, rows gq and gq + 8 (heads; zero past the group), the NS
     * steps of 16 dims in the permuted order: step 2u + e takes dims 32u + 8tq + 4e +
     * {0, 1} (first pair) and + {2, 3} (second), where K's 16-byte piece 4u + tq of
     * row gq holds them in the same order */
    unsigned qa[NS][2][4]; /* [step][hi, lo][the A fragment: rows gq, gq + 8 of each pair] */
    /* MMA p * V: heads gq ([0], [1]) and gq + 8 ([2], [3]), dims MH / 4 warp + 8 i + 2 tq, + 1 */
    float o[NT][4];
    const bool hi8 = gq + 8 < group; /* the lane's second head is in the group */
    if (MMA) {
#pragma unroll
        for (int u = 0; u < NU; u++) {
#pragma unroll
            for (int rh = 0; rh < 2; rh++) {
                const int j = gq + 8 * rh;
                float x[8];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    x[i] = j < group ? qs[j * MH + 32 * u + 8 * tq + i] : 0.0f;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    att_split_f16(x[4 * e], x[4 * e + 1], &qa[2 * u + e][0][rh], &qa[2 * u + e][1][rh]);
                    att_split_f16(x[4 * e + 2], x[4 * e + 3], &qa[2 * u + e][0][2 + rh], &qa[2 * u + e][1][2 + rh]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < NT; i++)
            o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    }
    /* FP32 p * V: thread (phase ph, dimensions 4 dq ..), 8-byte reads of the V rows;
     * the sums run in position order, phases summed after the last chunk. */
    const int nq = hd >> 2, nph = ATT_THREADS / nq, dq = tid % nq, ph = tid / nq;
    float4 acc[ATT_MAXG];
    if (!MMA)
#pragma unroll
        for (int j = 0; j < ATT_MAXG; j++)
            acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    for (;;) {
        /* positions before the window's first are masked */
        const int skip = lo > t0 ? (int)(lo - t0) : 0;
        kc_cp_async_wait<1>(); /* this chunk's K (its V and nothing else may be in flight) */
        __syncthreads();
        if (MMA) {
            for (int tile = warp; tile * 8 < cnt; tile += ATT_THREADS / 32) {
                const int r = tile * 8 + gq; /* the K row this lane's B fragment reads */
                const uint4 *kr = (const uint4 *)(ks + (size_t)r * MH);
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int u = 0; u < NU; u++) {
                    const uint4 w = kr[(4 * u + tq) ^ att_swz(r)];
#pragma unroll
                    for (int hl = 0; hl < 2; hl++) {
                        kc_mma16816(c, qa[2 * u][hl], w.x, w.y);
                        kc_mma16816(c, qa[2 * u + 1][hl], w.z, w.w);
                    }
                }
                /* c[0], c[1]: head gq's scores of positions tile * 8 + 2 tq, + 1, c[2],
                 * c[3] head gq + 8's (rows past cnt read stale shared memory; their
                 * scores are never read) */
                const int t = tile * 8 + 2 * tq;
                if (gq < group)
                    *(float2 *)&sc[gq * ATT_CHUNK + t] = make_float2(t < skip ? -INFINITY : c[0],
                                                                     t + 1 < skip ? -INFINITY : c[1]);
                if (hi8)
                    *(float2 *)&sc[(gq + 8) * ATT_CHUNK + t] = make_float2(t < skip ? -INFINITY : c[2],
                                                                           t + 1 < skip ? -INFINITY : c[3]);
            }
        } else {
            /* Scores: L lanes per position (eight dimensions each), P positions per
             * warp step, 4 warps. */
            const int L = hd >> 3, P = 32 / L, li = lane % L, pi = lane / L;
            for (int base = warp * P; base < cnt; base += 4 * P) {
                const int t = base + pi;
                float kv8[8];
                if (t < cnt)
                    att_k8(kv8, ks + (size_t)t * hd + li * 8);
                else
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        kv8[i] = 0.0f;
                for (int j = 0; j < group; j++) {
                    float part = att_dot8(qs + j * hd + li * 8, kv8);
                    for (int off = L >> 1; off > 0; off >>= 1)
                        part += __shfl_xor_sync(KCUDA_FULL_MASK, part, off);
                    if (li == 0 && t < cnt)
                        sc[j * ATT_CHUNK + t] = t < skip ? -INFINITY : part;
                }
            }
        }
        __syncthreads(); /* the scores are whole and the K rows free */
        const int64_t t1 = t0 + chunk;
        const int cnt1 = t1 < t_end ? (t_end - t1 < chunk ? (int)(t_end - t1) : chunk) : 0;
        att_copy_rows(ks, kc + (size_t)t1 * rb + hoff, rb, cnt1, lp, MMA, tid);
        kc_cp_async_commit();

        /* The softmax per head, a warp per head, against the running maximum: the
         * sums so far are rescaled by e^(m_old - m_new) (0 at the first chunk, whose
         * m_old is -inf; the first chunk always has a visible position, so m_new is
         * finite). p is 0 from cnt to the next 16 positions (the tensor-core
         * products' last step). */
        const int cnt16 = (cnt + 15) & ~15;
        for (int j = warp; j < group; j += ATT_THREADS / 32) {
            float *sj = sc + j * ATT_CHUNK;
            float m = -INFINITY;
            for (int t = lane; t < cnt; t += 32)
                m = fmaxf(m, sj[t]);
            m = fmaxf(kc_warp_max(m), ml[4 * j]);
            float l = 0.0f;
            for (int t = lane; t < cnt; t += 32) {
                const float p = expf(sj[t] - m);
                sj[t] = p;
                l += p;
            }
            if (MMA)
                for (int t = cnt + lane; t < cnt16; t += 32)
                    sj[t] = 0.0f;
            l = kc_warp_sum(l);
            __syncwarp();
            if (lane == 0) {
                const float a = expf(ml[4 * j] - m);
                ml[4 * j] = m;
                ml[4 * j + 1] = ml[4 * j + 1] * a + l;
                ml[4 * j + 2] = a;
            }
        }
        kc_cp_async_wait<1>(); /* this chunk's V (the next chunk's K may be in flight) */
        __syncthreads();

        if (MMA) {
            /* p * V: warp w takes dims MH / 4 w .. (NT tiles of 8), all positions */
            const float a = ml[4 * (gq < group ? gq : 0) + 2], a8 = hi8 ? ml[4 * (gq + 8) + 2] : 0.0f;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                o[i][0] *= a;
                o[i][1] *= a;
                o[i][2] *= a8;
                o[i][3] *= a8;
            }
            const float *prow = sc + (gq < group ? gq : 0) * ATT_CHUNK;
            const float *prow8 = sc + (hi8 ? gq + 8 : 0) * ATT_CHUNK;
            const int mi = lane >> 3, rr = lane & 7; /* the ldmatrix row this lane addresses */
            for (int k0 = 0; k0 < cnt16; k0 += 16) {
                unsigned ah[4] = {0u, 0u, 0u, 0u}, al[4] = {0u, 0u, 0u, 0u};
                if (gq < group) {
                    const float2 p0 = *(const float2 *)&prow[k0 + 2 * tq];
                    const float2 p1 = *(const float2 *)&prow[k0 + 2 * tq + 8];
                    att_split_f16(p0.x, p0.y, &ah[0], &al[0]);
                    att_split_f16(p1.x, p1.y, &ah[2], &al[2]);
                }
                if (hi8) {
                    const float2 p0 = *(const float2 *)&prow8[k0 + 2 * tq];
                    const float2 p1 = *(const float2 *)&prow8[k0 + 2 * tq + 8];
                    att_split_f16(p0.x, p0.y, &ah[1], &al[1]);
                    att_split_f16(p1.x, p1.y, &ah[3], &al[3]);
                }
                const int vr = k0 + (mi & 1) * 8 + rr;
#pragma unroll
                for (int h2 = 0; h2 < NT / 2; h2++) {
                    const int c = NT * warp + 2 * h2 + (mi >> 1); /* 16-byte piece: dims 8c .. 8c + 7 */
                    unsigned bv[4];
                    kc_ldsm_x4_t(bv, vs + (size_t)vr * MH + 8 * (c ^ att_swz(vr)));
                    kc_mma16816(o[2 * h2], ah, bv[0], bv[1]);
                    kc_mma16816(o[2 * h2], al, bv[0], bv[1]);
                    kc_mma16816(o[2 * h2 + 1], ah, bv[2], bv[3]);
                    kc_mma16816(o[2 * h2 + 1], al, bv[2], bv[3]);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < ATT_MAXG; j++) {
                if (j >= group)
                    break;
                const float a = ml[4 * j + 2];
                acc[j].x *= a;
                acc[j].y *= a;
                acc[j].z *= a;
                acc[j].w *= a;
            }
            const __half *vp = vs + 4 * dq;
#pragma unroll 4
            for (int t = ph; t < cnt; t += nph)
                att_pv(acc, sc, t, group, *(const uint2 *)(vp + (size_t)t * hd));
        }
        __syncthreads(); /* the V rows and the probabilities are free */
        att_copy_v(vs, vc, (size_t)t1 * rb + hoff, rb, cnt1, lp, MMA, tid);
        kc_cp_async_commit();
        if (cnt1 == 0)
            break;
        t0 = t1;
        cnt = cnt1;
    }

    if (MMA) {
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const int d = 8 * NT * warp + 8 * i + 2 * tq;
            if (gq < group)
                *(float2 *)&pacc[PH(gq) * MH + d] = make_float2(o[i][0], o[i][1]);
            if (hi8)
                *(float2 *)&pacc[PH(gq + 8) * MH + d] = make_float2(o[i][2], o[i][3]);
        }
    } else {
        /* red takes the place of q, the scores and the rows (all read: the loop's last barrier) */
#pragma unroll
        for (int j = 0; j < ATT_MAXG; j++) {
            if (j >= group)
                break;
            *(float4 *)&red[(ph * group + j) * hd + 4 * dq] = acc[j];
        }
        __syncthreads();
        for (int idx = tid; idx < group * hd; idx += ATT_THREADS) {
            const int j = idx / hd, d = idx % hd;
            float a = 0.0f;
            for (int p2 = 0; p2 < nph; p2++)
                a += red[(p2 * group + j) * hd + d];
            pacc[PH(j) * hd + d] = a;
        }
    }
    if (tid < group) {
        pml[PH(tid) * 2] = ml[4 * tid];
        pml[PH(tid) * 2 + 1] = ml[4 * tid + 1];
    }
#undef PH
}

/* Raises the split kernel's dynamic shared-memory limit to the most any launch takes
 * (group ATT_MAXG at head_dim 256, whose chunks stop at 64: the largest), once per
 * kernel and device. */
template <int MH>
static int att_split_prepare(bl_err_t *err)
{
    static int done[KC_MAX_DEVICES];
    int dev = 0;
    KCUDA_CHECK(cudaGetDevice(&dev), err);
    const int most = (int)att_smem_bytes(ATT_MAXG, 256, att_chunk_cap(256));
    return kc_smem_prepare(att_split_kernel<MH>, done, dev, most, err);
}

/* Dynamic shared memory of the combine pass: n_split weights, padded to whole
 * 16-byte groups (loads of the weight list may be widened by the compiler). */
static size_t att_combine_smem(int64_t n_split)
{
    return sizeof(float) * (size_t)((n_split + 3) / 4 * 4 + 4);
}

/* grid (n_head, n): merges the splits of one (row, head). Dynamic shared memory:
 * n_split weights. M and L are block reductions in a fixed order, so every
 * thread holds the same values and a row's bits do not depend on the others.
 * grid z: 32 of the head's dimensions per block, so that a long context's
 * splits are read by head_dim / 32 blocks at once. Their sum: thread (split
 * phase sp of 16, four dimensions dq), 16-byte loads, eight splits in flight
 * per thread, then the phases summed in order through shared memory. */
__global__ void __launch_bounds__(ATT_THREADS)
att_combine_kernel(const float *pacc, const float *pml, int n_head, int hd, int64_t n_split, int span,
                   float *out, const kcuda_kv_row_t *rows, int64_t pos0, int window, const float *sinks)
{
    kc_wait_prior();
    kc_allow_next();
    extern __shared__ float att_wsm[];
    __shared__ float wred[ATT_THREADS / 32];
    __shared__ __align__(16) float part[ATT_THREADS / 8 * 32];
    const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t base = ((size_t)b * n_head + h) * (size_t)n_split;
    /* A row of the table has only its own splits written; the splits a launch
     * argument's row skips hold l = 0 and add exact zeros, so both give the same bits. */
    int n_act = (int)n_split;
    if (rows) {
        const int64_t a = ((int64_t)rows[b].pos + span) / span;
        n_act = a < n_split ? (int)a : (int)n_split;
    }
    /* a window's row starts at the split of its first visible position */
    const int64_t len = rows ? (int64_t)rows[b].pos + 1 : pos0 + b + 1;
    const int s_lo = window > 0 && len > window ? (int)((len - window) / span) : 0;
    float M = -INFINITY;
    for (int s = s_lo + tid; s < n_act; s += ATT_THREADS)
        M = fmaxf(M, pml[(base + s) * 2]);
    M = kc_warp_max(M);
    if (lane == 0)
        wred[warp] = M;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < ATT_THREADS / 32; w++)
        M = fmaxf(M, wred[w]);
    if (sinks) /* the sink's score has no value: it only takes its share of the sum */
        M = fmaxf(M, sinks[h]);
    float L = 0.0f;
    for (int s = s_lo + tid; s < n_act; s += ATT_THREADS) {
        const float w = expf(pml[(base + s) * 2] - M);
        att_wsm[s] = w;
        L += pml[(base + s) * 2 + 1] * w;
    }
    L = kc_warp_sum(L);
    __syncthreads(); /* every warp has read wred's maxima */
    if (lane == 0)
        wred[warp] = L;
    __syncthreads();
    L = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_THREADS / 32; w++)
        L += wred[w];
    if (sinks)
        L += expf(sinks[h] - M);
    const float inv = 1.0f / L;
    const int nsp = ATT_THREADS / 8, dq = tid % 8, sp = tid / 8, d0 = 32 * (int)blockIdx.z;
    const float *pa = pacc + base * hd + d0 + 4 * (size_t)dq;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int s = s_lo + sp;
    for (; s + 7 * nsp < n_act; s += 8 * nsp) {
        float4 av[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            av[u] = *(const float4 *)(pa + (size_t)(s + u * nsp) * hd);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const float w = att_wsm[s + u * nsp];
            a.x += av[u].x * w;
            a.y += av[u].y * w;
            a.z += av[u].z * w;
            a.w += av[u].w * w;
        }
    }
    for (; s < n_act; s += nsp) {
        const float4 av = *(const float4 *)(pa + (size_t)s * hd);
        const float w = att_wsm[s];
        a.x += av.x * w;
        a.y += av.y * w;
        a.z += av.z * w;
        a.w += av.w * w;
    }
    *(float4 *)&part[sp * 32 + 4 * dq] = a;
    __syncthreads();
    if (tid < 32) {
        float v = 0.0f;
        for (int p2 = 0; p2 < nsp; p2++)
            v += part[p2 * 32 + tid];
        out[((size_t)b * n_head + h) * hd + d0 + tid] = v * inv;
    }
}

/* The split pass and its combine for n rows over a grid of max_len positions: the
 * caches kc/vc and rows at pos0 .. (kcuda_attention), or the rows' table d_rows
 * and layer (the rows form). The split kernel takes the tensor-core form where
 * head_dim is 128 and the group at most 8. */
static int att_split_run(const char *who, const uint8_t *kc, const uint8_t *vc, size_t rb, const float *d_q,
                         float *d_out, int64_t n, int64_t pos0, int64_t max_len, int64_t n_head, int64_t n_kv_head,
                         int64_t head_dim, float scale, int window, const float *sinks, void *d_scratch,
                         size_t scratch_bytes, const kcuda_kv_row_t *d_rows, int64_t layer, cudaStream_t st,
                         bl_err_t *err)
{
    const int hd = (int)head_dim, group = (int)(n_head / n_kv_head);
    const int chunk = att_chunk(max_len, hd), per = att_per(max_len, hd);
    const int64_t n_split = att_splits(max_len, hd);
    const size_t need = kcuda_attention_scratch_bytes(n, n_head, head_dim, max_len);
    if (scratch_bytes < need)
        return bl_err_set(err, BL_ERANGE, "%s: scratch of %zu bytes, %zu needed", who, scratch_bytes, need);
    if (n_split > ATT_MAX_SPLITS)
        return bl_err_set(err, BL_ENOTSUP, "%s: a context of %lld positions (at most %lld)", who,
                          (long long)max_len, (long long)ATT_MAX_SPLITS * att_chunk_cap(hd));
    float *pacc = (float *)d_scratch;
    float *pml = pacc + (size_t)n * (size_t)n_head * (size_t)n_split * (size_t)head_dim;
    /* the tensor-core form at head_dim 64 and 128, for groups up to ATT_MAXG = 16 (the
     * tiles' 16 rows); the FP32 form at 32 and 256 */
    const int rc = hd == 128 ? att_split_prepare<128>(err) : hd == 64 ? att_split_prepare<64>(err)
                                                                      : att_split_prepare<0>(err);
    if (rc < 0)
        return rc;
    const dim3 g1((unsigned)n_kv_head, (unsigned)n_split, (unsigned)n);
    KC_LAUNCH(err, hd == 128 ? att_split_kernel<128> : hd == 64 ? att_split_kernel<64> : att_split_kernel<0>, g1,
              ATT_THREADS, att_smem_bytes(group, hd, chunk), st, kc, vc, rb, d_q, pos0, (int)n_head, group, hd, scale,
              n_split, chunk, per, pacc, pml, d_rows, layer, window);
    const dim3 g2((unsigned)n_head, (unsigned)n, (unsigned)(head_dim / 32));
    KC_LAUNCH(err, att_combine_kernel, g2, ATT_THREADS, att_combine_smem(n_split), st, pacc, pml, (int)n_head, hd,
              n_split, chunk * per, d_out, d_rows, pos0, window, sinks);
    return 0;
}

/* Short contexts (max_len up to kcuda_attention_set_short's bound, KCUDA_ATT_SHORT by
 * default), rows variant only: grid (n_head, n), a block of ATT_SHORT_THREADS per
 * (row, query head) takes the whole context in one pass and writes the
 * normalised output, so there is no scratch and no combine launch. A decode step
 * over a short context is a chain of tiny launches; the split pass and its combine
 * cost two boundaries for a few microseconds of work.
 * Scores: a thread per position, the head_dim / 8 16-byte K loads of its row issued
 * together, the dot in dimension order against q in shared memory. Softmax: block
 * max and sum, warps in order. p * V: HD / 8 threads per position (8 dimensions
 * each, one 16-byte V load), 8 * ATT_SHORT_THREADS / HD position phases; each thread's first 8
 * positions are loaded before the scores are taken, the rest 8 loads at a time;
 * phases are summed in order. The bits depend on the row's length only. */
#define ATT_SHORT_THREADS 256
static int g_att_short = KCUDA_ATT_SHORT;

int kcuda_attention_set_short(int max_len)
{
    const int old = g_att_short;
    g_att_short = max_len < 0 ? 0 : max_len > KCUDA_ATT_SHORT_MAX ? KCUDA_ATT_SHORT_MAX : max_len;
    return old;
}

/* QKV: kcuda_qkv_rows's work folded in. Warp 0 normalises and rotates the block's q
 * head into shared memory (then scales it), warp 1 its KV head's k (kept in f16, the
 * cache's bits), warp 2 rounds v to f16; the group's first query head writes both to
 * the cache at the row's position, and every block takes the row's own position from
 * shared memory, not from the cache (other blocks may still be writing it). q and k
 * in global memory are left as they were. The same bits as the two launches. */
template <int HD, bool QKV>
__global__ void __launch_bounds__(ATT_SHORT_THREADS, 1)
att_short_kernel(const kcuda_kv_row_t *rows, int64_t layer, size_t rb, const float *q, int n_head, int group,
                 float scale, int max_len, float *out, att_qkv_t f, int window, const float *sinks)
{
    kc_wait_prior();
    kc_allow_next();
    constexpr int TPR = HD / 8;                /* threads per V row */
    constexpr int NPH = ATT_SHORT_THREADS / TPR;     /* position phases */
    __shared__ __align__(16) float qs[HD];
    __shared__ __align__(16) __half kh[QKV ? HD : 8], vh[QKV ? HD : 8];
    __shared__ __align__(16) float kf[QKV ? HD : 4];
    __shared__ float sc[KCUDA_ATT_SHORT_MAX];
    __shared__ float red[NPH * HD];
    __shared__ float wr[2][ATT_SHORT_THREADS / 32];
    const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const kcuda_kv_row_t r = rows[b];
    uint8_t *kc = (uint8_t *)(uintptr_t)(r.k + (uint64_t)layer * r.layer_bytes);
    uint8_t *vc = kc + r.v_bytes;
    const int len = (int)r.pos + 1 < max_len ? (int)r.pos + 1 : max_len;
    const int lo = window > 0 && len > window ? len - window : 0; /* the first position the row sees */
    const int kvh = h / group;
    const size_t hoff = (size_t)kvh * HD * sizeof(__half);
    const int own = QKV ? (int)r.pos : -1; /* the position taken from shared memory */

    /* p * V's first loads (the row's own position later), then q, then the scores */
    const int dq = tid % TPR, ph = tid / TPR;
    const size_t voff = hoff + (size_t)dq * 8 * sizeof(__half);
    uint4 vpre[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int t = ph + u * NPH;
        vpre[u] = t < len && !(QKV && t == own) ? *(const uint4 *)(vc + (size_t)t * rb + voff) : make_uint4(0, 0, 0, 0);
    }
    if (QKV) {
        const int writer = h % group == 0;
        if (warp == 0) {
            kc_head_norm_rope(qs, q + ((size_t)b * n_head + h) * HD, f.qg, b, f.pos[b], HD, f.rope, f.eps, lane, NULL);
            __syncwarp();
            for (int d = lane; d < HD; d += 32)
                qs[d] = qs[d] * scale;
        } else if (warp == 1) {
            kc_head_norm_rope(kf, f.k + ((size_t)b * f.n_kv + kvh) * HD, f.kg, b, f.pos[b], HD, f.rope, f.eps, lane,
                              kh);
            __syncwarp();
            if (writer)
                for (int d = lane; d < HD; d += 32)
                    ((__half *)(kc + (size_t)r.pos * rb + hoff))[d] = kh[d];
        } else if (warp == 2) {
            const float *vr = f.v + ((size_t)b * f.n_kv + kvh) * HD;
            for (int d = lane; d < HD; d += 32) {
                vh[d] = __float2half_rn(vr[d]);
                if (writer)
                    ((__half *)(vc + (size_t)r.pos * rb + hoff))[d] = vh[d];
            }
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (ph + u * NPH == own && own < len)
                vpre[u] = *(const uint4 *)(vh + dq * 8);
    } else {
        for (int d = tid; d < HD; d += ATT_SHORT_THREADS)
            qs[d] = q[((size_t)b * n_head + h) * HD + d] * scale;
        __syncthreads();
    }

    float m = -INFINITY;
#pragma unroll 1
    for (int t = tid; t < len; t += ATT_SHORT_THREADS) {
        if (t < lo) { /* outside the window: probability 0 */
            sc[t] = -INFINITY;
            continue;
        }
        const uint4 *kr = QKV && t == own ? (const uint4 *)kh : (const uint4 *)(kc + (size_t)t * rb + hoff);
        constexpr int KB = TPR < 16 ? TPR : 16; /* loads in flight (HD 256: two rounds) */
        float s = 0.0f;
        /* q stays in registers across positions up to HD 128; HD 256 rereads it */
#pragma unroll(TPR > 16 ? 1 : 2)
        for (int i0 = 0; i0 < TPR; i0 += KB) {
            uint4 raw[KB];
#pragma unroll
            for (int i = 0; i < KB; i++)
                raw[i] = kr[i0 + i];
#pragma unroll
            for (int i = 0; i < KB; i++) {
                const __half2 *h2 = (const __half2 *)&raw[i];
                const float *qq = qs + 8 * (i0 + i);
                const float4 qa = *(const float4 *)qq, qb = *(const float4 *)(qq + 4);
                const float2 k0 = __half22float2(h2[0]), k1 = __half22float2(h2[1]);
                const float2 k2 = __half22float2(h2[2]), k3 = __half22float2(h2[3]);
                s += qa.x * k0.x + qa.y * k0.y + qa.z * k1.x + qa.w * k1.y + qb.x * k2.x + qb.y * k2.y +
                     qb.z * k3.x + qb.w * k3.y;
            }
        }
        sc[t] = s;
        m = fmaxf(m, s);
    }
    m = kc_warp_max(m);
    if (lane == 0)
        wr[0][warp] = m;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < ATT_SHORT_THREADS / 32; w++)
        m = fmaxf(m, wr[0][w]);
    if (sinks)
        m = fmaxf(m, sinks[h]);
    float l = 0.0f;
    for (int t = tid; t < len; t += ATT_SHORT_THREADS) {
        const float p = expf(sc[t] - m);
        sc[t] = p;
        l += p;
    }
    l = kc_warp_sum(l);
    if (lane == 0)
        wr[1][warp] = l;
    __syncthreads();
    l = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_SHORT_THREADS / 32; w++)
        l += wr[1][w];
    if (sinks)
        l += expf(sinks[h] - m);

    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        acc[i] = 0.0f;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int t = ph + u * NPH;
        if (t >= len)
            break;
        const float p = sc[t];
        const __half2 *h2 = (const __half2 *)&vpre[u];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(h2[i]);
            acc[2 * i] += p * f.x;
            acc[2 * i + 1] += p * f.y;
        }
    }
#pragma unroll 1
    for (int t0 = ph + 8 * NPH; t0 < len; t0 += 8 * NPH) {
        uint4 vf[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int t = t0 + u * NPH;
            vf[u] = t >= len ? make_uint4(0, 0, 0, 0)
                    : QKV && t == own ? *(const uint4 *)(vh + dq * 8) : *(const uint4 *)(vc + (size_t)t * rb + voff);
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int t = t0 + u * NPH;
            if (t >= len)
                break;
            const float p = sc[t];
            const __half2 *h2 = (const __half2 *)&vf[u];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 f = __half22float2(h2[i]);
                acc[2 * i] += p * f.x;
                acc[2 * i + 1] += p * f.y;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        red[ph * HD + dq * 8 + i] = acc[i];
    __syncthreads();
    const float inv = 1.0f / l;
    for (int d = tid; d < HD; d += ATT_SHORT_THREADS) {
        float a = 0.0f;
#pragma unroll
        for (int p2 = 0; p2 < NPH; p2++)
            a += red[p2 * HD + d];
        out[((size_t)b * n_head + h) * HD + d] = a * inv;
    }
}

size_t kcuda_attention_scratch_bytes(int64_t n, int64_t n_head, int64_t head_dim, int64_t max_len)
{
    if (n < 1 || n_head < 1 || head_dim < 1 || max_len < 1)
        return 0;
    return sizeof(float) * (size_t)n * (size_t)n_head * (size_t)att_splits_bound(max_len, (int)head_dim) *
           (size_t)(head_dim + 2);
}

int kcuda_attention(const kcuda_kv_view_t *kv, const float *d_q, float *d_out, int64_t n, int64_t pos0,
                    int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale, const kcuda_att_ext_t *ext,
                    void *d_scratch, size_t scratch_bytes, void *stream, bl_err_t *err)
{
    const int window = ext && ext->window > 0 ? ext->window : 0;
    const float *sinks = ext ? ext->d_sinks : NULL;
    if (!kv || !kv->k || !kv->v || !d_q || !d_out || !d_scratch || n < 1 || n > 65535 || pos0 < 0)
        return bl_err_set(err, BL_EINVAL, "attention: %lld rows at position %lld, or a NULL buffer",
                          (long long)n, (long long)pos0);
    if (head_dim != 32 && head_dim != 64 && head_dim != 128 && head_dim != 256)
        return bl_err_set(err, BL_ENOTSUP, "attention: head_dim %lld (32, 64, 128 or 256)",
                          (long long)head_dim);
    if (n_kv_head < 1 || n_kv_head > 65535 || n_head % n_kv_head != 0 || n_head / n_kv_head > ATT_MAXG)
        return bl_err_set(err, BL_ENOTSUP, "attention: %lld query heads over %lld KV heads (groups up to %d)",
                          (long long)n_head, (long long)n_kv_head, ATT_MAXG);
    if (kv->row_bytes % 16 != 0 || kv->row_bytes < (size_t)(n_kv_head * head_dim) * 2 ||
        (uintptr_t)kv->k % 16 != 0 || (uintptr_t)kv->v % 16 != 0)
        return bl_err_set(err, BL_EINVAL, "attention: cache rows of %zu bytes (a multiple of 16, at least %lld) or misaligned",
                          kv->row_bytes, (long long)(n_kv_head * head_dim * 2));
    return att_split_run("attention", (const uint8_t *)kv->k, (const uint8_t *)kv->v, kv->row_bytes, d_q, d_out, n,
                         pos0, pos0 + n, n_head, n_kv_head, head_dim, scale, window, sinks, d_scratch, scratch_bytes,
                         NULL, 0, (cudaStream_t)stream, err);
}

/* kcuda_attention_rows; with f (and a grid within the one-pass bound), the
 * one-pass kernel with kcuda_qkv_rows's work folded in. */
static int attention_rows(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes, const float *d_q,
                          float *d_out, int64_t n, int64_t max_len, int64_t n_head, int64_t n_kv_head,
                          int64_t head_dim, float scale, const kcuda_att_ext_t *ext, void *d_scratch,
                          size_t scratch_bytes, const att_qkv_t *f, void *stream, bl_err_t *err)
{
    const int window = ext && ext->window > 0 ? ext->window : 0;
    const float *sinks = ext ? ext->d_sinks : NULL;
    if (!d_rows || !d_q || !d_out || !d_scratch || n < 1 || n > 65535 || max_len < 1 || layer < 0)
        return bl_err_set(err, BL_EINVAL, "attention_rows: %lld rows, max_len %lld, layer %lld, or a NULL buffer",
                          (long long)n, (long long)max_len, (long long)layer);
    if (head_dim != 32 && head_dim != 64 && head_dim != 128 && head_dim != 256)
        return bl_err_set(err, BL_ENOTSUP, "attention_rows: head_dim %lld (32, 64, 128 or 256)",
                          (long long)head_dim);
    if (n_kv_head < 1 || n_kv_head > 65535 || n_head % n_kv_head != 0 || n_head / n_kv_head > ATT_MAXG)
        return bl_err_set(err, BL_ENOTSUP, "attention_rows: %lld query heads over %lld KV heads (groups up to %d)",
                          (long long)n_head, (long long)n_kv_head, ATT_MAXG);
    if (row_bytes % 16 != 0 || row_bytes < (size_t)(n_kv_head * head_dim) * 2)
        return bl_err_set(err, BL_EINVAL, "attention_rows: cache rows of %zu bytes (a multiple of 16, at least %lld)",
                          row_bytes, (long long)(n_kv_head * head_dim * 2));
    const int group = (int)(n_head / n_kv_head);
    cudaStream_t st = (cudaStream_t)stream;
    if (max_len <= g_att_short) {
        const dim3 gs((unsigned)n_head, (unsigned)n);
        const att_qkv_t fq = f ? *f : att_qkv_t{};
#define ATT_SHORT_GO(HD)                                                                                        \
    do {                                                                                                         \
        if (f)                                                                                                   \
            KC_LAUNCH(err, (att_short_kernel<HD, true>), gs, ATT_SHORT_THREADS, 0, st, d_rows, layer, row_bytes, \
                      d_q, (int)n_head, group, scale, (int)max_len, d_out, fq, window, sinks);                   \
        else                                                                                                     \
            KC_LAUNCH(err, (att_short_kernel<HD, false>), gs, ATT_SHORT_THREADS, 0, st, d_rows, layer,           \
                      row_bytes, d_q, (int)n_head, group, scale, (int)max_len, d_out, fq, window, sinks);        \
    } while (0)
        switch (head_dim) {
        case 32: ATT_SHORT_GO(32); break;
        case 64: ATT_SHORT_GO(64); break;
        case 128: ATT_SHORT_GO(128); break;
        default: ATT_SHORT_GO(256); break;
        }
#undef ATT_SHORT_GO
        return 0;
    }
    return att_split_run("attention_rows", NULL, NULL, row_bytes, d_q, d_out, n, 0, max_len, n_head, n_kv_head,
                         head_dim, scale, window, sinks, d_scratch, scratch_bytes, d_rows, layer, st, err);
}

int kcuda_attention_rows(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes, const float *d_q,
                         float *d_out, int64_t n, int64_t max_len, int64_t n_head, int64_t n_kv_head,
                         int64_t head_dim, float scale, const kcuda_att_ext_t *ext, void *d_scratch,
                         size_t scratch_bytes, void *stream, bl_err_t *err)
{
    return attention_rows(d_rows, layer, row_bytes, d_q, d_out, n, max_len, n_head, n_kv_head, head_dim, scale, ext,
                          d_scratch, scratch_bytes, NULL, stream, err);
}

int kcuda_attention_rows_qkv(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes, float *d_q,
                             float *d_k, const float *d_v, const float *d_q_norm, const float *d_k_norm,
                             const int32_t *d_pos, float *d_out, int64_t n, int64_t max_len, int64_t n_head,
                             int64_t n_kv_head, int64_t head_dim, const kcuda_rope_t *rope, float eps,
                             float scale, const kcuda_att_ext_t *ext, void *d_scratch, size_t scratch_bytes,
                             void *stream, bl_err_t *err)
{
    if (max_len > g_att_short) {
        int rc = kcuda_qkv_rows(d_rows, layer, row_bytes, d_q, d_k, d_v, d_q_norm, d_k_norm, d_pos, n, n_head,
                                n_kv_head, head_dim, rope, eps, stream, err);
        return rc < 0 ? rc
                      : kcuda_attention_rows(d_rows, layer, row_bytes, d_q, d_out, n, max_len, n_head, n_kv_head,
                                             head_dim, scale, ext, d_scratch, scratch_bytes, stream, err);
    }
    if (!d_k || !d_v || !d_pos || !rope || !d_q_norm != !d_k_norm || rope->n_rot < 2 || rope->n_rot > head_dim ||
        rope->n_rot % 2 != 0)
        return bl_err_set(err, BL_EINVAL, "attention_rows_qkv: a NULL buffer, or %d of %lld dims rotated",
                          rope ? rope->n_rot : 0, (long long)head_dim);
    const att_qkv_t f = {d_k, d_v, d_q_norm, d_k_norm, d_pos, (int)n_kv_head, *rope, eps};
    return attention_rows(d_rows, layer, row_bytes, d_q, d_out, n, max_len, n_head, n_kv_head, head_dim, scale,
                          ext, d_scratch, scratch_bytes, &f, stream, err);
}

/* Thread per element of the n rows, K and V together. */
__global__ void kv_store_kernel(uint8_t *kc, uint8_t *vc, size_t rb, const float *k, const float *v,
                                int64_t ld, int64_t pos0, int64_t n, int64_t row_elems)
{
    kc_wait_prior();
    kc_allow_next();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * row_elems;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / row_elems, e = i % row_elems;
        const size_t off = (size_t)(pos0 + b) * rb + (size_t)e * sizeof(__half);
        *(__half *)(kc + off) = __float2half_rn(k[b * ld + e]);
        *(__half *)(vc + off) = __float2half_rn(v[b * ld + e]);
    }
}

int kcuda_kv_store(const kcuda_kv_view_t *kv, const float *d_k, const float *d_v, int64_t ld, int64_t pos0,
                   int64_t n, int64_t row_elems, void *stream, bl_err_t *err)
{
    if (!kv || !kv->k || !kv->v || !d_k || !d_v || n < 1 || pos0 < 0 || row_elems < 1 || ld < row_elems ||
        kv->row_bytes < (size_t)row_elems * 2)
        return bl_err_set(err, BL_EINVAL, "kv_store: %lld rows of %lld at %lld, ld %lld, cache rows of %zu bytes",
                          (long long)n, (long long)row_elems, (long long)pos0, (long long)ld, kv ? kv->row_bytes : 0);
    const int64_t total = n * row_elems;
    const int64_t blocks = kc_cdiv(total, 256);
    KC_LAUNCH(err, kv_store_kernel, (unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, (cudaStream_t)stream, (uint8_t *)kv->k, (uint8_t *)kv->v, kv->row_bytes, d_k, d_v, ld, pos0, n, row_elems);
    return 0;
}

/* Thread per element of the n rows; row b's cache and position from the table. */
__global__ void kv_store_rows_kernel(const kcuda_kv_row_t *rows, int64_t layer, size_t rb, const float *k,
                                     const float *v, int64_t ld, int64_t n, int64_t row_elems)
{
    kc_wait_prior();
    kc_allow_next();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * row_elems;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / row_elems, e = i % row_elems;
        const kcuda_kv_row_t r = rows[b];
        uint8_t *kc = (uint8_t *)(uintptr_t)(r.k + (uint64_t)layer * r.layer_bytes);
        const size_t off = (size_t)r.pos * rb + (size_t)e * sizeof(__half);
        *(__half *)(kc + off) = __float2half_rn(k[b * ld + e]);
        *(__half *)(kc + r.v_bytes + off) = __float2half_rn(v[b * ld + e]);
    }
}

int kcuda_kv_store_rows(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes, const float *d_k,
                        const float *d_v, int64_t ld, int64_t n, int64_t row_elems, void *stream, bl_err_t *err)
{
    if (!d_rows || !d_k || !d_v || n < 1 || layer < 0 || row_elems < 1 || ld < row_elems ||
        row_bytes < (size_t)row_elems * 2)
        return bl_err_set(err, BL_EINVAL, "kv_store_rows: %lld rows of %lld, layer %lld, ld %lld, cache rows of %zu bytes",
                          (long long)n, (long long)row_elems, (long long)layer, (long long)ld, row_bytes);
    const int64_t blocks = kc_cdiv(n * row_elems, 256);
    KC_LAUNCH(err, kv_store_rows_kernel, (unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, (cudaStream_t)stream, d_rows, layer, row_bytes, d_k, d_v, ld, n, row_elems);
    return 0;
}

/* grid (ceil(n * (n_head + 2 n_kv_head) / 4)), 4 warps: a warp per (row, head) of
 * q, then k, then v. */
#define QKV_WARPS 4
__global__ void __launch_bounds__(QKV_WARPS * 32)
qkv_rows_kernel(const kcuda_kv_row_t *rows, int64_t layer, size_t rb, float *q, float *k, const float *v,
                const float *qg, const float *kg, const int32_t *pos, int64_t n, int n_head, int n_kv, int hd,
                kcuda_rope_t rope, float eps)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t w = (int64_t)blockIdx.x * QKV_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, per = n_head + 2 * n_kv;
    if (w >= n * per)
        return;
    const int64_t b = w / per;
    const int j = (int)(w % per);
    if (j < n_head) {
        kc_head_norm_rope(q + (b * n_head + j) * hd, q + (b * n_head + j) * hd, qg, b, pos[b], hd, rope, eps, lane,
                          NULL);
        return;
    }
    const kcuda_kv_row_t r = rows[b];
    uint8_t *kc = (uint8_t *)(uintptr_t)(r.k + (uint64_t)layer * r.layer_bytes) + (size_t)r.pos * rb;
    if (j < n_head + n_kv) {
        const int h = j - n_head;
        kc_head_norm_rope(k + (b * n_kv + h) * hd, k + (b * n_kv + h) * hd, kg, b, pos[b], hd, rope, eps, lane,
                          (__half *)kc + (int64_t)h * hd);
        return;
    }
    const int h = j - n_head - n_kv;
    __half *vc = (__half *)(kc + r.v_bytes) + (int64_t)h * hd;
    const float *vr = v + (b * n_kv + h) * hd;
    for (int i = lane; i < hd; i += 32)
        vc[i] = __float2half_rn(vr[i]);
}

int kcuda_qkv_rows(const kcuda_kv_row_t *d_rows, int64_t layer, size_t row_bytes, float *d_q, float *d_k,
                   const float *d_v, const float *d_q_norm, const float *d_k_norm, const int32_t *d_pos,
                   int64_t n, int64_t n_head, int64_t n_kv_head, int64_t head_dim, const kcuda_rope_t *rope,
                   float eps, void *stream, bl_err_t *err)
{
    if (!d_rows || !d_q || !d_k || !d_v || !d_q_norm != !d_k_norm || !d_pos || !rope || n < 1 || layer < 0 ||
        rope->n_rot < 2 || rope->n_rot > head_dim || rope->n_rot % 2 != 0 ||
        n_head < 1 || n_kv_head < 1 || n_head > 65535 || n_kv_head > 65535 || head_dim < 2 || head_dim % 2 != 0 ||
        head_dim > 65535 || row_bytes < (size_t)(n_kv_head * head_dim) * 2 ||
        n * (n_head + 2 * n_kv_head) > (int64_t)QKV_WARPS * 2147483647)
        return bl_err_set(err, BL_EINVAL,
                          "qkv_rows: %lld rows, %lld heads over %lld of %lld, layer %lld, cache rows of %zu bytes, "
                          "or a NULL buffer",
                          (long long)n, (long long)n_head, (long long)n_kv_head, (long long)head_dim,
                          (long long)layer, row_bytes);
    const int64_t warps = n * (n_head + 2 * n_kv_head);
    KC_LAUNCH(err, qkv_rows_kernel, (unsigned)kc_cdiv(warps, QKV_WARPS), QKV_WARPS * 32, 0, (cudaStream_t)stream,
              d_rows, layer, row_bytes, d_q, d_k, d_v, d_q_norm, d_k_norm, d_pos, n, (int)n_head, (int)n_kv_head,
              (int)head_dim, *rope, eps);
    return 0;
}
