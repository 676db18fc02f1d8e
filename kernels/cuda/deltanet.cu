/* The gated DeltaNet of qwen3next and qwen35moe on the card (kcpu_deltanet's math,
 * docs/models.md), and the elementwise pieces of their gated attention and gated
 * shared expert. A step's rows are sequential within a sequence and independent
 * across sequences and heads: the convolution runs a thread per channel down its
 * sequence's rows, the norms a warp per (row, head), the delta rule a block per
 * (head, sequence) whose thread j keeps column j of the head's S x S state in
 * registers for all the rows (each row needs only that column and the row's q and
 * k, which the block shares), and the gated norm a warp per (row, head). The states
 * are read and written once a step; sequences at position 0 read zeros. */
#include <math.h>

#include "kcuda_impl.cuh"

static unsigned dn_blocks(int64_t n, int per)
{
    const int64_t b = kc_cdiv(n, per);
    return (unsigned)(b > 65535 ? 65535 : b);
}

static __device__ __forceinline__ float dn_silu(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float dn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// --- gated attention and the gated shared expert ------------------------------------

__global__ void split_heads_kernel(const float *x, int64_t total, int64_t hd, float *a, float *g)
{
    kc_wait_prior();
    kc_allow_next();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t rh = i / hd, e = i % hd;
        a[i] = x[rh * 2 * hd + e];
        g[i] = x[rh * 2 * hd + hd + e];
    }
}

int kcuda_split_heads(const float *d_x, int64_t n, int64_t n_head, int64_t hd, float *d_a, float *d_g,
                      void *stream, bl_err_t *err)
{
    if (!d_x || !d_a || !d_g || n < 1 || n_head < 1 || hd < 1)
        return bl_err_set(err, BL_EINVAL, "split_heads: %lld rows of %lld heads of %lld", (long long)n,
                          (long long)n_head, (long long)hd);
    const int64_t total = n * n_head * hd;
    KC_LAUNCH(err, split_heads_kernel, dn_blocks(total, 256), 256, 0, (cudaStream_t)stream, d_x, total, hd, d_a,
              d_g);
    return 0;
}

__global__ void mul_sigmoid_kernel(float *y, const float *g, int64_t n)
{
    kc_wait_prior();
    kc_allow_next();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] *= dn_sigmoid(g[i]);
}

int kcuda_mul_sigmoid(float *d_y, const float *d_g, int64_t n, void *stream, bl_err_t *err)
{
    if (!d_y || !d_g || n < 1)
        return bl_err_set(err, BL_EINVAL, "mul_sigmoid: %lld elements", (long long)n);
    KC_LAUNCH(err, mul_sigmoid_kernel, dn_blocks(n, 256), 256, 0, (cudaStream_t)stream, d_y, d_g, n);
    return 0;
}

#define GATED_BLOCK 256

/* grid (n): the row's gate (a block's sum), then the row added. */
__global__ void __launch_bounds__(GATED_BLOCK)
add_gated_kernel(float *x, const float *y, const float *w, const float *xn, int64_t d)
{
    kc_wait_prior();
    kc_allow_next();
    __shared__ float part[GATED_BLOCK / 32];
    const int64_t r = blockIdx.x;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += GATED_BLOCK)
        s += w[i] * xn[r * d + i];
    s = kc_warp_sum(s);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0.0f;
#pragma unroll
    for (int i = 0; i < GATED_BLOCK / 32; i++)
        s += part[i];
    const float gate = dn_sigmoid(s);
    for (int64_t i = threadIdx.x; i < d; i += GATED_BLOCK)
        x[r * d + i] += gate * y[r * d + i];
}

int kcuda_add_gated(float *d_x, const float *d_y, const float *d_w, const float *d_xn, int64_t n, int64_t d,
                    void *stream, bl_err_t *err)
{
    if (!d_x || !d_y || !d_w || !d_xn || n < 1 || d < 1 || n > INT32_MAX)
        return bl_err_set(err, BL_EINVAL, "add_gated: %lld rows of %lld", (long long)n, (long long)d);
    KC_LAUNCH(err, add_gated_kernel, (unsigned)n, GATED_BLOCK, 0, (cudaStream_t)stream, d_x, d_y, d_w, d_xn, d);
    return 0;
}

// --- the DeltaNet ---------------------------------------------------------------------

int kcuda_dnet_supported(int S, int K)
{
    return (S == 16 || S == 32 || S == 64 || S == 128) && K >= 1 && K <= KCUDA_DNET_MAX_K;
}

__global__ void dn_gates_kernel(kcuda_dnet_t d, const float *b, int64_t b_ld, const float *al, int64_t al_ld,
                                int64_t n, float *beta, float *g)
{
    kc_wait_prior();
    kc_allow_next();
    const int Hv = d.Hv, r = d.Hv / d.Hk;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * Hv;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / Hv;
        const int h = (int)(i % Hv);
        float bv, av;
        if (d.ba) { /* [b(r) a(r)] for each k head */
            const int kh = h / r, j = h % r;
            bv = b[t * b_ld + 2 * r * kh + j];
            av = b[t * b_ld + 2 * r * kh + r + j];
        } else {
            bv = b[t * b_ld + h];
            av = al[t * al_ld + h];
        }
        const float x = av + d.d_dt_bias[h];
        const float sp = x > 20.0f ? x : log1pf(expf(x));
        beta[i] = dn_sigmoid(bv);
        g[i] = sp * d.d_a[h];
    }
}

int kcuda_dnet_gates(const kcuda_dnet_t *d, const float *d_b, int64_t b_ld, const float *d_al, int64_t al_ld,
                     int64_t n, float *d_beta, float *d_g, void *stream, bl_err_t *err)
{
    if (!d || !d_b || (!d->ba && !d_al) || !d_beta || !d_g || n < 1 || d->Hk < 1 || d->Hv < 1 ||
        d->Hv % d->Hk != 0 || b_ld < (d->ba ? 2 * d->Hv : d->Hv) || (!d->ba && al_ld < d->Hv))
        return bl_err_set(err, BL_EINVAL, "dnet_gates: %lld rows, %d k heads, %d v heads, ld %lld", (long long)n,
                          d ? d->Hk : 0, d ? d->Hv : 0, (long long)b_ld);
    KC_LAUNCH(err, dn_gates_kernel, dn_blocks(n * d->Hv, 256), 256, 0, (cudaStream_t)stream, *d, d_b, b_ld, d_al,
              al_ld, n, d_beta, d_g);
    return 0;
}

#define CONV_BLOCK 128

/* grid (ceil(channels / CONV_BLOCK), nseg): channel c of a sequence down its rows,
 * the window in registers (the state's K - 1 inputs, then the row). */
__global__ void __launch_bounds__(CONV_BLOCK)
dn_conv_kernel(const kcuda_dn_seg_t *segs, int64_t off, const float *w, float *qkv, int ch, int K)
{
    kc_wait_prior();
    kc_allow_next();
    const kcuda_dn_seg_t sg = segs[blockIdx.y];
    const int c = blockIdx.x * CONV_BLOCK + threadIdx.x;
    if (c >= ch)
        return;
    float *conv = (float *)(uintptr_t)sg.state + off;
    float win[KCUDA_DNET_MAX_K], wc[KCUDA_DNET_MAX_K];
#pragma unroll
    for (int j = 0; j < KCUDA_DNET_MAX_K; j++) {
        wc[j] = j < K ? w[(int64_t)c * K + j] : 0.0f;
        win[j] = j < K - 1 && sg.pos > 0 ? conv[(int64_t)j * ch + c] : 0.0f;
    }
    for (int t = 0; t < sg.n; t++) {
        float *x = qkv + (int64_t)(sg.row0 + t) * ch + c;
        float u = 0.0f;
#pragma unroll
        for (int j = 0; j < KCUDA_DNET_MAX_K; j++) {
            if (j == K - 1)
                win[j] = *x;
            if (j < K)
                u += wc[j] * win[j];
        }
#pragma unroll
        for (int j = 0; j < KCUDA_DNET_MAX_K - 1; j++)
            if (j < K - 1)
                win[j] = win[j + 1];
        *x = dn_silu(u);
    }
#pragma unroll
    for (int j = 0; j < KCUDA_DNET_MAX_K - 1; j++)
        if (j < K - 1)
            conv[(int64_t)j * ch + c] = win[j];
}

#define DN_WARPS 4

/* grid (ceil(n * 2 Hk / DN_WARPS)): a warp per (row, q or k head): x / max(|x|, eps),
 * q also times 1/sqrt(S). */
__global__ void __launch_bounds__(DN_WARPS * 32)
dn_l2_kernel(float *qkv, int64_t n, int ch, int S, int Hk, float eps)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t w = (int64_t)blockIdx.x * DN_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= n * 2 * Hk)
        return;
    const int64_t t = w / (2 * Hk);
    const int h = (int)(w % (2 * Hk));
    float *x = qkv + t * ch + (int64_t)h * S;
    float ss = 0.0f;
    for (int i = lane; i < S; i += 32)
        ss += x[i] * x[i];
    ss = kc_warp_sum(ss);
    const float nrm = sqrtf(ss);
    const float s = (h < Hk ? rsqrtf((float)S) : 1.0f) / (nrm > eps ? nrm : eps);
    for (int i = lane; i < S; i += 32)
        x[i] *= s;
}

/* grid (Hv, nseg, S / C), C * P threads: the delta rule of v head h over a
 * sequence's rows, columns z C .. z C + C - 1 of its state (a column's update needs
 * only that column and the row's q and k, so a head's columns may take several
 * blocks: the same arithmetic, more SMs). Thread (j, p) holds part p of column j
 * of the state (m[i] = M[h][p S/P + i][j]; P lanes side by side share a column, so
 * that S = 128 fits registers); per row, with the decay e^g and beta: m *= decay,
 * d = beta (v_j - m . k), m += k d, o_j = m . q, the dots summed over the P lanes.
 * The row's q and k go through shared memory, two buffers so that one barrier a
 * row orders them; with PF each thread loads its share of the next row (q, k, v,
 * the decay and beta) into registers while this row is computed. out gets o (the
 * gated norm follows). */
/* Row `row`'s inputs of the delta rule held by thread tid of NTH (dn_rule_kernel with
 * PF): its E elements of the row's q and k (tid, tid + NTH, ... below S), column j's
 * v, the decay e^g and beta of v head h. */
template <int S, int NTH, int E>
static __device__ __forceinline__ void dn_row_ahead(const float *qkv, const float *beta, const float *g,
                                                    int64_t row, int ch, int Hk, int Hv, int kh, int h, int j,
                                                    float *q, float *k, float *v, float *decay, float *bt)
{
    const float *x = qkv + row * ch;
    const int tid = threadIdx.x;
#pragma unroll
    for (int e = 0; e < E; e++)
        if (tid + e * NTH < S) {
            q[e] = x[kh * S + tid + e * NTH];
            k[e] = x[(Hk + kh) * S + tid + e * NTH];
        }
    *v = x[(2 * Hk + h) * S + j];
    *decay = expf(g[row * Hv + h]);
    *bt = beta[row * Hv + h];
}

template <int S, int P, int C, bool PF>
__global__ void __launch_bounds__(C * P)
dn_rule_kernel(const kcuda_dn_seg_t *segs, int64_t off, const float *qkv, const float *beta, const float *g,
               float *out, int ch, int Hk, int Hv, int tiled)
{
    constexpr int R = S / P, NTH = C * P, E = (S + NTH - 1) / NTH;
    kc_wait_prior();
    kc_allow_next();
    __shared__ float sq[2][S], sk[2][S];
    const kcuda_dn_seg_t sg = segs[blockIdx.y];
    const int h = blockIdx.x;
    int j = threadIdx.x / P;
    if constexpr (C < S)
        j += (int)blockIdx.z * C;
    const int p = threadIdx.x % P, i0 = p * R;
    const int kh = tiled ? h % Hk : h / (Hv / Hk);
    float *M = (float *)(uintptr_t)sg.state + off + (int64_t)h * S * S;
    float m[R];
#pragma unroll
    for (int i = 0; i < R; i++)
        m[i] = sg.pos > 0 ? M[(i0 + i) * S + j] : 0.0f;
    /* PF: this thread's share of the next row */
    float nq[E], nk[E], nv = 0.0f, nd = 1.0f, nb = 0.0f;
    if constexpr (PF)
        if (sg.n > 0)
            dn_row_ahead<S, NTH, E>(qkv, beta, g, sg.row0, ch, Hk, Hv, kh, h, j, nq, nk, &nv, &nd, &nb);
    for (int t = 0; t < sg.n; t++) {
        const int64_t row = sg.row0 + t;
        const float *x = qkv + row * ch;
        const int b = t & 1;
        float v, decay, bt;
        if constexpr (PF) {
#pragma unroll
            for (int e = 0; e < E; e++)
                if (threadIdx.x + e * NTH < S) {
                    sq[b][threadIdx.x + e * NTH] = nq[e];
                    sk[b][threadIdx.x + e * NTH] = nk[e];
                }
            v = nv;
            decay = nd;
            bt = nb;
            if (t + 1 < sg.n)
                dn_row_ahead<S, NTH, E>(qkv, beta, g, row + 1, ch, Hk, Hv, kh, h, j, nq, nk, &nv, &nd, &nb);
        } else {
            for (int e = threadIdx.x; e < S; e += NTH) {
                sq[b][e] = x[kh * S + e];
                sk[b][e] = x[(Hk + kh) * S + e];
            }
            v = x[(2 * Hk + h) * S + j];
            decay = expf(g[row * Hv + h]);
            bt = beta[row * Hv + h];
        }
        __syncthreads();
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < R; i++) {
            m[i] *= decay;
            d += m[i] * sk[b][i0 + i];
        }
#pragma unroll
        for (int o = 1; o < P; o <<= 1)
            d += __shfl_xor_sync(KCUDA_FULL_MASK, d, o);
        d = bt * (v - d);
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < R; i++) {
            m[i] += sk[b][i0 + i] * d;
            o += m[i] * sq[b][i0 + i];
        }
#pragma unroll
        for (int q = 1; q < P; q <<= 1)
            o += __shfl_xor_sync(KCUDA_FULL_MASK, o, q);
        if (p == 0)
            out[row * Hv * S + (int64_t)h * S + j] = o;
    }
#pragma unroll
    for (int i = 0; i < R; i++)
        M[(i0 + i) * S + j] = m[i];
}

/* grid (ceil(n * Hv / DN_WARPS)): a warp per (row, v head): rmsnorm(o) * norm *
 * silu(z), in place. */
__global__ void __launch_bounds__(DN_WARPS * 32)
dn_out_kernel(float *out, const float *z, const float *norm, int64_t n, int S, int Hv, float eps)
{
    kc_wait_prior();
    kc_allow_next();
    const int64_t w = (int64_t)blockIdx.x * DN_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= n * Hv)
        return;
    float *o = out + w * S;
    const float *zr = z + w * S;
    float ss = 0.0f;
    for (int i = lane; i < S; i += 32)
        ss += o[i] * o[i];
    ss = kc_warp_sum(ss);
    const float s = rsqrtf(ss / (float)S + eps);
    for (int i = lane; i < S; i += 32)
        o[i] = o[i] * s * norm[i] * dn_silu(zr[i]);
}

/* The delta rule's columns a block (kcuda_deltanet_set_cols): 0, a whole head's
 * with the row's loads in turn; 16 (the default), 32, 64 or 128, at most that many
 * with the next row's loads ahead. */
static int g_dn_cols = 16;

int kcuda_deltanet_set_cols(int cols)
{
    const int old = g_dn_cols;
    if (cols == 0 || cols == 16 || cols == 32 || cols == 64 || cols == 128)
        g_dn_cols = cols;
    return old;
}

template <int S, int P, int C, bool PF>
static int rule_go(const kcuda_dnet_t *d, const kcuda_dn_seg_t *segs, int64_t nseg, int64_t off, const float *qkv,
                   const float *beta, const float *g, float *out, int ch, cudaStream_t st, bl_err_t *err)
{
    KC_LAUNCH(err, dn_rule_kernel<S, P, C, PF>, dim3((unsigned)d->Hv, (unsigned)nseg, (unsigned)(S / C)), C * P, 0,
              st, segs, off, qkv, beta, g, out, ch, d->Hk, d->Hv, d->tiled);
    return 0;
}

template <int S, int P>
static int rule(const kcuda_dnet_t *d, const kcuda_dn_seg_t *segs, int64_t nseg, int64_t off, const float *qkv,
                const float *beta, const float *g, float *out, int ch, cudaStream_t st, bl_err_t *err)
{
#define DN_GO(C, PF) rule_go<S, P, C, PF>(d, segs, nseg, off, qkv, beta, g, out, ch, st, err)
    /* a head's columns, at most the setting's (S is 16 at the least) */
    switch (g_dn_cols == 0 ? 0 : g_dn_cols < S ? g_dn_cols : S) {
    case 0: return DN_GO(S, false);
    case 16: return DN_GO(16, true);
    case 32: if constexpr (S > 32) return DN_GO(32, true); break;
    case 64: if constexpr (S > 64) return DN_GO(64, true); break;
    }
    return DN_GO(S, true);
#undef DN_GO
}

int kcuda_deltanet(const kcuda_dnet_t *d, const kcuda_dn_seg_t *d_segs, int64_t nseg, int64_t state_off,
                   float *d_qkv, const float *d_z, const float *d_beta, const float *d_g, float *d_out, int64_t n,
                   void *stream, bl_err_t *err)
{
    if (!d || !d_segs || !d_qkv || !d_z || !d_beta || !d_g || !d_out || nseg < 1 || nseg > 65535 || n < 1 ||
        n > INT32_MAX || state_off < 0 || d->Hk < 1 || d->Hv < 1 || d->Hv % d->Hk != 0 || d->Hv > 65535)
        return bl_err_set(err, BL_EINVAL, "deltanet: %lld rows in %lld sequences, %d k heads, %d v heads",
                          (long long)n, (long long)nseg, d ? d->Hk : 0, d ? d->Hv : 0);
    if (!kcuda_dnet_supported(d->S, d->K))
        return bl_err_set(err, BL_ENOTSUP, "deltanet: heads of %d dims with %d taps on CUDA (16, 32, 64 or 128 "
                          "dims; 1..%d taps)", d->S, d->K, KCUDA_DNET_MAX_K);
    cudaStream_t st = (cudaStream_t)stream;
    const int ch = d->S * (2 * d->Hk + d->Hv);
    const int64_t m_off = state_off + (int64_t)(d->K - 1) * ch;
    KC_LAUNCH(err, dn_conv_kernel, dim3((unsigned)kc_cdiv(ch, CONV_BLOCK), (unsigned)nseg), CONV_BLOCK, 0, st, d_segs,
              state_off, d->d_conv_w, d_qkv, ch, d->K);
    KC_LAUNCH(err, dn_l2_kernel, (unsigned)kc_cdiv(n * 2 * d->Hk, DN_WARPS), DN_WARPS * 32, 0, st, d_qkv, n, ch, d->S,
              d->Hk, d->eps);
    int rc;
    switch (d->S) {
    case 16: rc = rule<16, 1>(d, d_segs, nseg, m_off, d_qkv, d_beta, d_g, d_out, ch, st, err); break;
    case 32: rc = rule<32, 1>(d, d_segs, nseg, m_off, d_qkv, d_beta, d_g, d_out, ch, st, err); break;
    case 64: rc = rule<64, 1>(d, d_segs, nseg, m_off, d_qkv, d_beta, d_g, d_out, ch, st, err); break;
    default: rc = rule<128, 2>(d, d_segs, nseg, m_off, d_qkv, d_beta, d_g, d_out, ch, st, err); break;
    }
    if (rc < 0)
        return rc;
    KC_LAUNCH(err, dn_out_kernel, (unsigned)kc_cdiv(n * d->Hv, DN_WARPS), DN_WARPS * 32, 0, st, d_out, d_z,
              d->d_norm, n, d->S, d->Hv, d->eps);
    return 0;
}
