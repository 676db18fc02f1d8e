/* What the CPU and CUDA forward passes of the Qwen3 family share inside worker/:
 * the weights as views into the file (layer_t, weights_t), the CPU run state, the
 * model and the KV cache. qwen3moe.c owns loading, validation and the CPU pass;
 * qwen3moe_cuda.c the same model's pass on a CUDA device (wk__cuda_*). */
#ifndef WK_QWEN3MOE_IMPL_H
#define WK_QWEN3MOE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kcpu.h"
#include "wk.h"

typedef struct layer {
    const float *attn_norm; // (n_embd)
    kcpu_mat_t wq;          // (n_head * head_dim, n_embd)
    kcpu_mat_t wk;          // (n_head_kv * head_dim, n_embd)
    kcpu_mat_t wv;          // (n_head_kv * head_dim, n_embd)
    kcpu_mat_t wo;          // (n_embd, n_head * head_dim)
    const float *q_norm;    // (head_dim)
    const float *k_norm;    // (head_dim)
    const float *ffn_norm;  // (n_embd)
    /* qwen3moe */
    kcpu_mat_t gate_inp;    // (n_expert, n_embd)
    kcpu_mat_t gate_exps;   // (n_expert * n_ff_exp, n_embd): expert e is rows e*n_ff_exp..
    kcpu_mat_t up_exps;     // (n_expert * n_ff_exp, n_embd)
    kcpu_mat_t down_exps;   // (n_expert * n_embd, n_ff_exp)
    /* qwen3 */
    kcpu_mat_t ffn_gate;    // (n_ff, n_embd)
    kcpu_mat_t ffn_up;      // (n_ff, n_embd)
    kcpu_mat_t ffn_down;    // (n_embd, n_ff)
} layer_t;

typedef struct weights {
    kcpu_mat_t tok_embd;      // (n_vocab, n_embd)
    const float *output_norm; // (n_embd)
    kcpu_mat_t output;        // (n_vocab, n_embd); tok_embd when tied
    layer_t *layers;          // (n_layer)
} weights_t;

/* One sequence's rows in a step: rows [row0, row0 + n) of the run state, at
 * positions pos.., logits wanted for its last n_out. */
typedef struct seg {
    wk_kv_t *kv;
    const int32_t *tokens;
    int64_t row0, n, pos, n_out;
} seg_t;

/* Most experts one step's rows may use for the grouped path of moe_ffn: a job list
 * of gate and up per expert must fit kcpu_matmul_many. */
#define MOE_GROUP_MAX (KCPU_MM_MAX_JOBS / 2)

/* The grouped expert pass's job list (kept out of the stack: it is large). */
typedef struct moe_jobs {
    kcpu_mat_t gate[MOE_GROUP_MAX], up[MOE_GROUP_MAX], down[MOE_GROUP_MAX];
    kcpu_mm_job_t job[2 * MOE_GROUP_MAX];
    int64_t at[MOE_GROUP_MAX], cnt[MOE_GROUP_MAX];
} moe_jobs_t;

/* Scratch for one forward pass of up to n_batch rows; allocated at load. */
typedef struct run_state {
    float *x;     // (n_batch, n_embd) the residual stream
    float *xn;    // (n_batch, n_embd) normed input of a block
    float *q;     // (n_batch, n_head, head_dim)
    float *k;     // (n_batch, n_head_kv, head_dim)
    float *v;     // (n_batch, n_head_kv, head_dim)
    float *att;   // (n_batch, n_head, head_dim) attention output
    float *o;     // (n_batch, n_embd) a block's output before the residual add
    float *rope;  // (n_batch, head_dim / 2, 2) cos, sin
    int32_t *pos; // (n_batch)
    float *rl;    // (n_batch, n_expert) router logits
    int32_t *ids; // (n_batch, n_expert_used) selected experts
    float *wts;   // (n_batch, n_expert_used) their weights
    int32_t *rows; // (n_batch * n_expert_used) rows routed to each expert, expert by expert
    float *rw;    // (n_batch * n_expert_used) and their weights
    float *xg;    // (n_batch, n_embd) rows gathered (norm before the head, expert fallback)
    float *g;     // (n_batch * n_expert_used, ffn width) gate, then SwiGLU output
    float *u;     // (n_batch * n_expert_used, ffn width) up
    float *dg;    // (n_batch * n_expert_used, n_embd) down
    moe_jobs_t jobs;
    seg_t *segs;  // (n_batch) the sequences of a multi-sequence step
} run_state_t;

struct wk_model {
    wk_config_t cfg;
    weights_t w;
    run_state_t s;
    wk_model_opts_t opts;
    kcpu_ctx_t *kc;
    bl_gguf_t *g;
    uint8_t *arena;   /* anonymous copy of the matrices (weights_arena), or NULL */
    size_t arena_len, arena_used;
    char path[256]; /* for messages; truncated */
    int64_t lb, le;   /* the stage's layers [lb, le) */
    wk_experts_fn efn; /* WK_EXPERTS_REMOTE: where routed experts go */
    void *ectx;
    struct wk_cuda *cu; /* opts.device >= 0: the weights, scratch and graphs on the card */
};

struct wk_kv {
    const wk_model_t *model; /* the model it was made for; another's is refused */
    int64_t n_layer, n_ctx, n_past; /* n_layer: the stage's layers */
    uint32_t type;
    size_t row_bytes; /* one position of one layer's K (or V) */
    uint8_t *buf;     // (n_layer, 2, n_ctx, row_bytes): K then V per layer; on the
                      // card (kcuda_alloc) when on_device
    int on_device;
};

// --- the CUDA pass (qwen3moe_cuda.c) -------------------------------------------------
/* In a build without CUDA each of these refuses with BL_ENOTSUP, "this build has no
 * CUDA", and wk__cuda_free / wk__cuda_kv_free do nothing. */

/* After validation: uploads the stage's weights to opts.device, sizes the device
 * scratch and sets m->cu. */
int wk__cuda_load(wk_model_t *m, bl_err_t *err);
void wk__cuda_free(wk_model_t *m);
/* Allocates kv->buf on the card (f16 only); kv's other fields are set. */
int wk__cuda_kv_alloc(wk_kv_t *kv, bl_err_t *err);
void wk__cuda_kv_free(wk_kv_t *kv);
/* forward() on the card: same arguments and contract. */
int wk__cuda_forward(wk_model_t *m, const seg_t *seg, int64_t nseg, int64_t n, const float *x_in,
                     float *x_out, float *logits, bl_err_t *err);
/* The device's name ("NVIDIA H200"). */
const char *wk__cuda_name(const wk_model_t *m);

#endif
