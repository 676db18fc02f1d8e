/* What the kernels/cuda sources share and nobody else sees: the C headers under
 * extern "C", half/bfloat16 loads, warp reductions, and the launch check. */
#ifndef KCUDA_IMPL_CUH
#define KCUDA_IMPL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "err.h"
#include "kcuda.h"
#include "quant.h"
}

#define KCUDA_FULL_MASK 0xffffffffu

/* After a launch: a bad configuration shows here, a fault in the kernel at the next
 * synchronisation (kcuda_sync). */
#define KCUDA_CHECK_LAUNCH(err) KCUDA_CHECK(cudaGetLastError(), err)

static __device__ __forceinline__ float kc_half(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ float kc_bf16(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ float kc_warp_sum(float v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(KCUDA_FULL_MASK, v, off);
    return v;
}

static __device__ __forceinline__ float kc_warp_max(float v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(KCUDA_FULL_MASK, v, off));
    return v;
}

static __device__ __forceinline__ float kc_silu_mul(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* gpt-oss's clamped SwiGLU (kcpu_swiglu_oai's arithmetic: alpha 1.702, limit 7). */
static __device__ __forceinline__ float kc_act_oai(float g, float u)
{
    const float x = g < 7.0f ? g : 7.0f;
    const float v = u < -7.0f ? -7.0f : u > 7.0f ? 7.0f : u;
    return x / (1.0f + expf(-1.702f * x)) * (v + 1.0f);
}

/* cos and sin of pos * base^(-2i/hd), in double as kcpu_rope_table, rounded to float. */
static __device__ __forceinline__ void kc_rope_cs(int32_t pos, int64_t i, int64_t hd, float base, float *c,
                                                  float *s)
{
    const double theta = (double)pos * pow((double)base, -2.0 * (double)i / (double)hd);
    double sd, cd;
    sincos(theta, &sd, &cd);
    *c = (float)cd;
    *s = (float)sd;
}

/* The same for pair i of a RoPE with YaRN (kcpu_rope_table's arithmetic). */
static __device__ __forceinline__ void kc_rope_cs_ext(int32_t pos, int64_t i, const kcuda_rope_t &r, float *c,
                                                      float *s)
{
    if (r.freq_scale == 1.0f && r.ext_factor == 0.0f && r.mscale == 1.0f) {
        kc_rope_cs(pos, i, r.n_rot, r.base, c, s);
        return;
    }
    const double te = (double)pos * pow((double)r.base, -2.0 * (double)i / (double)r.n_rot);
    double theta = te;
    if (r.freq_scale != 1.0f || r.ext_factor != 0.0f) {
        const double span = (double)r.corr_hi - (double)r.corr_lo;
        double y = ((double)i - (double)r.corr_lo) / (span > 0.001 ? span : 0.001);
        y = y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y;
        const double mix = (1.0 - y) * (double)r.ext_factor;
        theta = (double)r.freq_scale * te * (1.0 - mix) + te * mix;
    }
    double sd, cd;
    sincos(theta, &sd, &cd);
    *c = (float)(cd * (double)r.mscale);
    *s = (float)(sd * (double)r.mscale);
}

/* One head v (hd elements) of q or k of row b, by one warp: RMSNorm with gains g
 * (none when g is NULL: Qwen3 has them, GLM-4.5 not), then NEOX RoPE r at position p
 * (pairs (i, i + n_rot/2), kc_rope_cs_ext, or row b of r.d_cs), the dims past n_rot kept, into y
 * (which may be v); h16, when not NULL, gets the results in f16 too (round to
 * nearest even, the cache's bits). Each lane reads only what it writes, so no
 * barrier is needed. */
static __device__ __forceinline__ void kc_head_norm_rope(float *y, const float *v, const float *g, int64_t b,
                                                         int32_t p, int64_t hd, const kcuda_rope_t &r, float eps,
                                                         int lane, __half *h16)
{
    const int64_t nr = r.n_rot;
    const float2 *cs = r.d_cs ? (const float2 *)(r.d_cs + b * nr) : NULL;
    float sc = 1.0f;
    if (g) {
        float ss = 0.0f;
        for (int64_t i = lane; i < hd; i += 32)
            ss += v[i] * v[i];
        ss = kc_warp_sum(ss);
        sc = rsqrtf(ss / (float)hd + eps);
    }
    const int64_t half = nr / 2;
    for (int64_t i = lane; i < half; i += 32) {
        const float x0 = g ? v[i] * sc * g[i] : v[i], x1 = g ? v[i + half] * sc * g[i + half] : v[i + half];
        float c, s;
        if (cs) {
            const float2 t = cs[i];
            c = t.x;
            s = t.y;
        } else {
            kc_rope_cs_ext(p, i, r, &c, &s);
        }
        const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
        y[i] = y0;
        y[i + half] = y1;
        if (h16) {
            h16[i] = __float2half_rn(y0);
            h16[i + half] = __float2half_rn(y1);
        }
    }
    for (int64_t i = nr + lane; i < hd; i += 32) {
        const float x = g ? v[i] * sc * g[i] : v[i];
        y[i] = x;
        if (h16)
            h16[i] = __float2half_rn(x);
    }
}

/* mxfp4: the doubled E2M1 value of a 4-bit code (bl_e2m1_doubled: magnitudes 0 1 2
 * 3 4 6 8 12 by the low 3 bits, bit 3 the sign), and a block's halved scale
 * bl_e8m0_to_fp32_half, 2^(e - 128) (e < 2: subnormal). */
static __device__ __forceinline__ int kc_mx_val(int code)
{
    const int m = (int)((0xc8643210u >> (4 * (code & 7))) & 0xf);
    return code & 8 ? -m : m;
}

static __device__ __forceinline__ float kc_mx_scale(uint32_t e)
{
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

static inline int64_t kc_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* RMSNorm of one row by a whole block of KC_NORM_BLOCK threads: yr = xr * s * g with
 * s = 1 / sqrt(mean(xr^2) + eps); part: KC_NORM_BLOCK / 32 floats of shared memory.
 * Rows whose length is a multiple of 4 and whose pointers are 16-byte aligned are
 * read as float4, up to KC_NORM_VEC per thread held in registers between the two
 * passes (every load of the first pass issued before any is used); the rest of a
 * longer row, and other rows, element by element, read again in the second pass.
 * The sum's order is fixed by the thread layout, so every caller gets the same bits.
 * The row is read through L2 (a caller may normalise what other blocks just wrote).
 * yr may be xr. Ends with the block synchronised. */
#define KC_NORM_BLOCK 256
#define KC_NORM_VEC 4
static __device__ __forceinline__ void kc_rms_norm_row(float *yr, const float *xr, const float *g, int64_t d,
                                                       float eps, float *part)
{
    const int tid = threadIdx.x;
    const bool vec = d % 4 == 0 && ((uintptr_t)xr % 16) == 0 && ((uintptr_t)yr % 16) == 0 &&
                     ((uintptr_t)g % 16) == 0;
    const int64_t nv = vec ? d / 4 : 0; /* float4s of the row */
    float4 v[KC_NORM_VEC];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < KC_NORM_VEC; c++) {
        const int64_t i = tid + (int64_t)c * KC_NORM_BLOCK;
        v[c] = i < nv ? __ldcg((const float4 *)xr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int c = 0; c < KC_NORM_VEC; c++)
        ss += v[c].x * v[c].x + v[c].y * v[c].y + v[c].z * v[c].z + v[c].w * v[c].w;
    for (int64_t i = tid + (int64_t)KC_NORM_VEC * KC_NORM_BLOCK; i < nv; i += KC_NORM_BLOCK) {
        const float4 t = __ldcg((const float4 *)xr + i);
        ss += t.x * t.x + t.y * t.y + t.z * t.z + t.w * t.w;
    }
    for (int64_t i = 4 * nv + tid; i < d; i += KC_NORM_BLOCK) {
        const float t = __ldcg(xr + i);
        ss += t * t;
    }
    ss = kc_warp_sum(ss);
    if ((tid & 31) == 0)
        part[tid >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int w = 0; w < KC_NORM_BLOCK / 32; w++)
        tot += part[w];
    const float s = rsqrtf(tot / (float)d + eps);
#pragma unroll
    for (int c = 0; c < KC_NORM_VEC; c++) {
        const int64_t i = tid + (int64_t)c * KC_NORM_BLOCK;
        if (i < nv) {
            const float4 gg = ((const float4 *)g)[i];
            ((float4 *)yr)[i] = make_float4(v[c].x * s * gg.x, v[c].y * s * gg.y, v[c].z * s * gg.z, v[c].w * s * gg.w);
        }
    }
    for (int64_t i = tid + (int64_t)KC_NORM_VEC * KC_NORM_BLOCK; i < nv; i += KC_NORM_BLOCK) {
        const float4 t = __ldcg((const float4 *)xr + i), gg = ((const float4 *)g)[i];
        ((float4 *)yr)[i] = make_float4(t.x * s * gg.x, t.y * s * gg.y, t.z * s * gg.z, t.w * s * gg.w);
    }
    for (int64_t i = 4 * nv + tid; i < d; i += KC_NORM_BLOCK)
        yr[i] = __ldcg(xr + i) * s * g[i];
    __syncthreads(); /* part is free again, and the row is written for the block */
}

/* MoE routing of one row by one warp as r says (kcuda_route_t; kcpu_moe_route's
 * arithmetic in f32): the scores of n_expert logits (read through L2, so a caller may
 * route what other blocks of its grid just wrote), the top k by score plus bias (ties
 * to the lower id), optionally among the best groups, weights as r says. Lane l holds
 * experts l, l + 32, ... in registers (PL of them), so k rounds of a warp-wide argmax
 * pick the experts without touching memory again. GEN false: the plain softmax
 * (kcuda_route_plain), which chooses by logit and needs no score per expert. */
template <int PL, bool GEN> /* logits per lane: n_expert <= 32 PL (the loops are unrolled over PL) */
static __device__ __forceinline__ void kc_moe_route_row(const float *l, int n_expert, int k, const kcuda_route_t &r,
                                                        int32_t *ids, float *w, int lane)
{
    const bool sigmoid = GEN && r.gating == KCUDA_GATE_SIGMOID, raw = GEN && r.gating == KCUDA_GATE_SOFTMAX_WEIGHT;
    const bool grouped = GEN && r.n_group > 1 && r.topk_group > 0 && r.topk_group < r.n_group;
    const bool by_logit = !GEN || (!sigmoid && !raw && !r.d_bias && !grouped);
    float v[PL], sel[PL], p[PL];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PL; i++) {
        const int e = lane + 32 * i;
        v[i] = e < n_expert ? __ldcg(l + e) + (GEN && r.d_logit_bias ? r.d_logit_bias[e] : 0.0f) : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = kc_warp_max(mx);
    float sum = 0.0f;
    if (!sigmoid && !raw) {
#pragma unroll
        for (int i = 0; i < PL; i++)
            if (lane + 32 * i < n_expert)
                sum += expf(v[i] - mx);
        sum = kc_warp_sum(sum);
    }
#pragma unroll
    for (int i = 0; i < PL; i++) {
        const int e = lane + 32 * i;
        if (by_logit) {
            sel[i] = v[i];
            p[i] = 0.0f;
        } else {
            p[i] = raw ? v[i] : sigmoid ? 1.0f / (1.0f + expf(-v[i])) : expf(v[i] - mx) / sum;
            sel[i] = e < n_expert ? p[i] + (r.d_bias ? r.d_bias[e] : 0.0f) : -INFINITY;
        }
    }
    uint32_t taken = 0; /* bit i: expert lane + 32 i already chosen (or out of the choice) */
    if (grouped) {
        /* a group scores the sum of its two best; only the topk_group best groups'
         * experts stay in the choice. Lane g ends with group g's score. */
        const int gs = n_expert / r.n_group;
        float mine_g = -INFINITY;
        for (int g = 0; g < r.n_group; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
#pragma unroll
            for (int i = 0; i < PL; i++) {
                const int e = lane + 32 * i;
                if (e < n_expert && e / gs == g) {
                    if (sel[i] > b1) {
                        b2 = b1;
                        b1 = sel[i];
                    } else if (sel[i] > b2) {
                        b2 = sel[i];
                    }
                }
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const float o1 = __shfl_xor_sync(KCUDA_FULL_MASK, b1, off);
                const float o2 = __shfl_xor_sync(KCUDA_FULL_MASK, b2, off);
                const float lo = fminf(b1, o1);
                b1 = fmaxf(b1, o1);
                b2 = fmaxf(lo, fmaxf(b2, o2));
            }
            if (lane == g)
                mine_g = b1 + (gs > 1 ? b2 : 0.0f);
        }
        uint32_t keep = 0;
        for (int j = 0; j < r.topk_group; j++) {
            float bv = (keep >> lane & 1u) || lane >= r.n_group ? -INFINITY : mine_g;
            int bg = (keep >> lane & 1u) || lane >= r.n_group ? INT32_MAX : lane;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const float ov = __shfl_xor_sync(KCUDA_FULL_MASK, bv, off);
                const int og = __shfl_xor_sync(KCUDA_FULL_MASK, bg, off);
                if (og != INT32_MAX && (bg == INT32_MAX || ov > bv || (ov == bv && og < bg))) {
                    bv = ov;
                    bg = og;
                }
            }
            if (bg != INT32_MAX)
                keep |= 1u << bg;
        }
#pragma unroll
        for (int i = 0; i < PL; i++)
            if (!(keep >> ((lane + 32 * i) / gs) & 1u))
                taken |= 1u << i;
    }

    float wsum = 0.0f, mine = 0.0f; /* lane j < k keeps choice j's weight */
    int32_t mine_id = 0;
    for (int j = 0; j < k; j++) {
        /* This lane's best untaken choice; ascending ids, so a strict > keeps the
         * lower id on ties. */
        float bv = -INFINITY, bp = 0.0f;
        int be = INT32_MAX;
#pragma unroll
        for (int i = 0; i < PL; i++) {
            const int e = lane + 32 * i;
            if (e < n_expert && !(taken >> i & 1u) && (be == INT32_MAX || sel[i] > bv)) {
                bv = sel[i];
                bp = p[i];
                be = e;
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(KCUDA_FULL_MASK, bv, off);
            const float op = __shfl_xor_sync(KCUDA_FULL_MASK, bp, off);
            const int oe = __shfl_xor_sync(KCUDA_FULL_MASK, be, off);
            if (oe != INT32_MAX && (be == INT32_MAX || ov > bv || (ov == bv && oe < be))) {
                bv = ov;
                bp = op;
                be = oe;
            }
        }
        if (be != INT32_MAX && (be & 31) == lane)
            taken |= 1u << (be >> 5);
        const float pj = by_logit ? expf(bv - mx) / sum : bp;
        wsum += pj;
        if (lane == j) {
            mine = pj;
            mine_id = be;
        }
    }
    if (raw) { /* the softmax of the chosen logits */
        const float top = kc_warp_max(lane < k ? mine : -INFINITY);
        const float ex = lane < k ? expf(mine - top) : 0.0f;
        const float es = kc_warp_sum(ex);
        mine = ex / es;
        wsum = 1.0f;
    }
    if (lane < k) {
        float wt = r.norm ? mine / fmaxf(wsum, 0x1p-14f) : mine;
        if (GEN && r.scale != 1.0f)
            wt *= r.scale;
        ids[lane] = mine_id;
        w[lane] = wt;
    }
}

/* Devices whose per-kernel settings the launchers remember. */
#define KC_MAX_DEVICES 16

/* Raises kernel's dynamic shared-memory limit to bytes on device dev, once per
 * kernel and device (done: that kernel's flags; a host-side attribute, not a
 * stream operation). */
template <typename K>
static int kc_smem_prepare(K kernel, int *done, int dev, int bytes, bl_err_t *err)
{
    if (dev >= 0 && dev < KC_MAX_DEVICES && done[dev])
        return 0;
    KCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), err);
    if (dev >= 0 && dev < KC_MAX_DEVICES)
        done[dev] = 1;
    return 0;
}

/* Asynchronous copies and tensor-core fragments (sm_80 and later), for the kernels
 * that stage tiles in shared memory: a 16-byte global-to-shared copy (bytes < 16
 * zero-fills the rest; 0 reads nothing), its group commit and wait; ldmatrix of four
 * 8x8 b16 matrices (plain or transposed); mma m16n8k16 f16 x f16 + f32. */
static __device__ __forceinline__ void kc_cp_async16(void *smem, const void *gmem, int bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}

static __device__ __forceinline__ void kc_cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void kc_cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void kc_ldsm_x4(unsigned r[4], const void *smem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

static __device__ __forceinline__ void kc_ldsm_x4_t(unsigned r[4], const void *smem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

static __device__ __forceinline__ void kc_mma16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Programmatic dependent launch (sm_90 and later; kcuda_set_pdl). A kernel launched
 * by kc_launch may start while the previous kernel on its stream still runs: it
 * must call kc_wait_prior() before it reads or writes anything an earlier kernel
 * writes or reads (only constant data, such as weights, may be read before), and
 * every block calls it before it can exit, so that a kernel's completion implies
 * its predecessors' and the chain stays ordered. kc_allow_next() then lets the next
 * kernel's blocks be placed and run their own prologue. Both are no-ops for a
 * kernel launched the ordinary way and on older devices. */
static __device__ __forceinline__ void kc_wait_prior(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void kc_allow_next(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* The scratch buffer of a stream (KC_STREAM_SCRATCH bytes on its device), for
 * kernels that hand data to a later launch on the same stream (the tensor-core
 * products' rounded activations): stream order, and kc_wait_prior before a kernel
 * writes it, keep its users apart. Streams of kcuda_stream_create get one when they
 * are made; the legacy default stream (NULL) one per device at its first use.
 * NULL when there is none (the caller takes another path). device.cu. */
#define KC_STREAM_SCRATCH ((size_t)1 << 20)
void *kc_stream_scratch(cudaStream_t st);

/* The current device (dev), its SM count and its opt-in shared memory a block,
 * asked of the driver once a device (device.cu). */
int kc_device_limits(int *dev, int *sms, int *optin, bl_err_t *err);

/* Whether kc_launch asks for programmatic serialization (device.cu). */
int kcuda__pdl_on(void);

/* kernel<<<grid, block, smem, st>>>(args...), with programmatic stream
 * serialization when it is on and the stream is not the legacy default stream. */
template <typename T> struct kc_same { typedef T type; };
template <typename... P>
static inline cudaError_t kc_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                    typename kc_same<P>::type... args) /* converted as in a call */
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = st && kcuda__pdl_on() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Launches through kc_launch and checks it (KCUDA_CHECK, so it returns on error). */
#define KC_LAUNCH(err, ...) KCUDA_CHECK(kc_launch(__VA_ARGS__), err)

#endif
