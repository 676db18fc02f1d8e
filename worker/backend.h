/* The backend ops a model family's forward pass is written over, once: the CPU
 * backend (backend_cpu.c, kernels/cpu) and the CUDA backend (backend_cuda.c,
 * kernels/cuda) implement them. A family (models/<arch>.c) calls them top to
 * bottom for a step; how a backend schedules them (threads, a CUDA graph per
 * decode batch, tensor-core GEMMs for prompts, fused launches) is its own business.
 *
 * Memory: activations are pointers into the backend's memory (host for the CPU, the
 * card for CUDA), made by alloc and freed with the backend; the forward pass does
 * arithmetic on them but never reads them. Weights are wk_tensor_t: the file's view
 * (what the CPU reads) and the backend's copy where it has one, registered once at
 * load (add, add_vec, add_stack) and placed by commit.
 *
 * A step: begin (the rows, their sequences and caches, where the outputs go), the
 * ops, end. begin may answer WK_STEP_REPLAYED (the CUDA backend replayed a captured
 * graph of the same step shape): the forward pass then skips to end. end is called
 * whatever the ops returned, with their status, so that a capture is closed. */
#ifndef WK_BACKEND_H
#define WK_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "heat.h"
#include "err.h"
#include "kcpu.h"
#include "wk.h"

/* A matrix: rows of a GGML block format. */
typedef struct wk_tensor {
    kcpu_mat_t h; /* the file's view (or the process's copy of it) */
    void *d;      /* the backend's placed copy, NULL where the backend reads h */
} wk_tensor_t;

/* An f32 vector (norm weights). */
typedef struct wk_vec {
    const float *h; /* the file's */
    const float *p; /* what the ops read: h on the CPU, the card's copy on CUDA */
} wk_vec_t;

/* One sequence's rows in a step: rows [row0, row0 + n) at positions pos.., its
 * cache, logits wanted for its last n_out rows. */
typedef struct wk_seg {
    wk_kv_t *kv;
    const int32_t *tokens; /* first stage only */
    int64_t row0, n, pos, n_out;
} wk_seg_t;

typedef struct wk_step {
    const wk_seg_t *seg;
    int64_t nseg;
    int64_t n;        /* rows, <= n_batch */
    const float *x_in; /* a later stage's input rows (host) */
    float *x_out;     /* an earlier stage's output rows (host) */
    float *logits;    /* the last stage's logits (host): the n_out rows in order */
    int mtp;          /* the NextN layer's pass after a step: the rows are its own, the
                       * step's routing was counted already */
} wk_step_t;

/* The routed experts of a MoE layer. */
typedef struct wk_moe {
    wk_tensor_t gate_inp;  // (n_expert, n_embd)
    wk_tensor_t gate_exps; // (n_expert * n_ff_exp, n_embd): expert e is rows e*n_ff_exp..
    wk_tensor_t up_exps;   // (n_expert * n_ff_exp, n_embd)
    wk_tensor_t down_exps; // (n_expert * n_embd, n_ff_exp)
    wk_vec_t probs_b;      // (n_expert) a bias on the scores for the choice only (.p NULL: none)
    wk_vec_t router_b;     // (n_expert) a bias on the router's logits (.p NULL: none)
    wk_vec_t gate_b, up_b; // (n_expert, n_ff) the experts' biases (gpt-oss; .p NULL: none)
    wk_vec_t down_b;       // (n_expert, n_embd)
    int act;               /* bl_act_t: the experts' activation */
    int64_t n_expert, n_used, n_ff;
    int64_t n_group, topk_group; /* the choice among the topk_group best of n_group groups */
    int gating;            /* bl_gating_t: softmax or sigmoid scores */
    int norm;              /* the top-k weights divided by their sum */
    float scale;           /* then multiplied by this */
} wk_moe_t;

/* Attention with optional per-head q/k RMSNorm and NEOX RoPE over the first n_rot
 * dims of each head (Qwen3: norms, every dim; GLM-4.5: no norms, half the dims),
 * optionally over a sliding window and with sinks (gpt-oss). */
typedef struct wk_attn {
    const float *q_norm, *k_norm; /* (head_dim), the backend's, or NULL: no norm */
    const float *sinks;           /* (n_head) gpt-oss's extra score per head, the backend's, or NULL */
    int64_t window;               /* a row sees its last window positions; 0: all */
    int64_t n_head, n_head_kv, head_dim, n_rot;
    float eps, rope_base, scale;
} wk_attn_t;

/* deepseek2's multi-head latent attention (arch.h): per position one cached row of
 * kv_lora latent dims and n_rot rotated ones; a head's q/k has qk_nope + n_rot dims
 * (head_k), its value head_v. */
typedef struct wk_mla {
    const float *kv_norm;     /* (kv_lora), the backend's */
    const wk_tensor_t *wk_b;  /* (n_head * kv_lora, head_k - n_rot) */
    const wk_tensor_t *wv_b;  /* (n_head * head_v, kv_lora) */
    int64_t n_head, head_k, head_v, kv_lora, n_rot;
    float eps, scale;
} wk_mla_t;

#define WK_STEP_REPLAYED 1
#define WK_ADD_PIECES 1
#define WK_ADD_TABLE 2
#define WK_ADD_EXPERTS 4

typedef struct wk_backend wk_backend_t;

/* Computes the experts of rows that are not this backend's (see wk_experts_fn). */
typedef struct wk_remote {
    wk_experts_fn fn;
    void *ctx;
} wk_remote_t;

typedef struct wk_backend_ops {
    const char *(*name)(const wk_backend_t *b);
    void (*destroy)(wk_backend_t *b);
    /* memory for activations: nbytes, 64-aligned; NULL when out of memory */
    void *(*alloc)(wk_backend_t *b, size_t nbytes);
    /* weights, in file order; commit places them all (the CUDA arena). flags:
     * WK_ADD_PIECES, a product the backend may run over pieces of the matrix (the
     * head), so its scratch need not hold all of it; WK_ADD_TABLE, only rows of it
     * are read (token embeddings), it takes part in no product; WK_ADD_EXPERTS, a
     * layer's routed experts (n_expert matrices stacked), which only the expert
     * products read */
    int (*add)(wk_backend_t *b, wk_tensor_t *t, int flags, bl_err_t *err);
    int (*add_vec)(wk_backend_t *b, wk_vec_t *v, int64_t n, bl_err_t *err);
    /* q, k, v of one layer: placed back to back where their formats allow, so that
     * qkv can read them as one matrix */
    int (*add_stack)(wk_backend_t *b, wk_tensor_t *const t[3], bl_err_t *err);
    /* the routed experts of layer l that stay in host memory (the remote hook computes
     * them): a backend may copy them in itself for steps of many rows (the CUDA
     * backend's prompt offload); registered before commit */
    int (*add_host)(wk_backend_t *b, int64_t l, const wk_moe_t *e, bl_err_t *err);
    int (*commit)(wk_backend_t *b, bl_err_t *err);
    /* a KV cache's memory: kv->buf of kv->n_layer * kv->n_planes * kv->stride *
     * row_bytes (the planes of a cache in a shared one begin at kv->buf, stride
     * positions apart) */
    int (*kv_alloc)(wk_backend_t *b, wk_kv_t *kv, bl_err_t *err);
    void (*kv_free)(wk_backend_t *b, wk_kv_t *kv);
    /* positions 0..n of every layer's K and V between kv->buf and host memory, host
     * laid out (n_layer, n_planes, host_n >= n, row_bytes); to_host: the direction.
     * Done on return. */
    int (*kv_copy)(wk_backend_t *b, wk_kv_t *kv, void *host, int64_t n, int64_t host_n, int to_host,
                   bl_err_t *err);
    /* positions src..src+n of every plane of kv to dst..dst+n, ranges that do not
     * overlap; in order with the steps before and after */
    int (*kv_move)(wk_backend_t *b, wk_kv_t *kv, int64_t dst, int64_t src, int64_t n,
                   bl_err_t *err);
    /* host memory for saved cache states, the kind kv_copy moves fastest (page-locked
     * beside a card) */
    int (*state_alloc)(wk_backend_t *b, size_t nbytes, void **out, bl_err_t *err);
    void (*state_free)(wk_backend_t *b, void *p);
    /* a hybrid cache's recurrent state (kv->rec: nbytes, zero) where the backend's
     * deltanet op reads it; rec_copy moves all of it to or from host memory (to_host:
     * the direction), in order with the steps before and after, done on return */
    int (*rec_alloc)(wk_backend_t *b, size_t nbytes, float **out, bl_err_t *err);
    void (*rec_free)(wk_backend_t *b, float *rec); /* NULL is a no-op */
    int (*rec_copy)(wk_backend_t *b, float *rec, void *host, size_t nbytes, int to_host, bl_err_t *err);

    /* --- a step */
    int (*begin)(wk_backend_t *b, const wk_step_t *st, float *x, bl_err_t *err);
    int (*end)(wk_backend_t *b, const wk_step_t *st, int status, const float *x, bl_err_t *err);
    /* x (n, ncols) = the rows of the step's tokens */
    int (*embed)(wk_backend_t *b, const wk_tensor_t *table, float *x, bl_err_t *err);
    /* y (n, d) = RMSNorm of x (n, d) times g */
    int (*rms_norm)(wk_backend_t *b, const char *op, float *y, const float *x, const float *g, int64_t n,
                    int64_t d, float eps, bl_err_t *err);
    /* q, k, v (n, their rows) = x (n, ncols) times each matrix's transpose, plus
     * bias[i] (a value a row of the matrix; bias NULL, or an entry NULL: none) */
    int (*qkv)(wk_backend_t *b, const wk_tensor_t *wq, const wk_tensor_t *wk, const wk_tensor_t *wv,
               const float *const *bias, const float *x, int64_t n, float *q, float *k, float *v, bl_err_t *err);
    /* y (n, w rows) = x (n, w cols) w^T, or y += that when acc; then bias (w rows;
     * NULL for none) added to each row */
    int (*matmul)(wk_backend_t *b, const char *op, const wk_tensor_t *w, const float *bias, const float *x,
                  int64_t n, float *y, int acc, bl_err_t *err);
    /* causal attention of the step's rows for model layer l: q and k normed per head
     * and rotated (in place), k and v stored in each sequence's cache, att (n,
     * n_head * head_dim) the attended values */
    int (*attention)(wk_backend_t *b, int64_t l, const wk_attn_t *a, float *q, float *k, const float *v,
                     float *att, bl_err_t *err);
    /* deepseek2's attention for model layer l: q (n, n_head, head_k) the queries, c
     * (n, kv_lora + n_rot) the compressed keys; the latent part of c RMS-normed by
     * kv_norm, the rotated parts of q and c rotated, c stored as the position's cache
     * row (both planes), each head's scores against the cache through wk_b (the
     * absorbed form) and its output through wv_b: att (n, n_head * head_v). q and c
     * are changed. NULL where the backend has none. */
    int (*mla)(wk_backend_t *b, int64_t l, const wk_mla_t *a, float *q, float *c, float *att, bl_err_t *err);
    /* x (n, n_embd) += the routed experts of the rows xn: the router, its scores
     * (softmax or sigmoid), top-k (by score plus probs_b), each row's experts (those
     * placed elsewhere through remote, when set), weighted (normed, scaled) */
    int (*moe)(wk_backend_t *b, int64_t l, const wk_moe_t *e, const wk_remote_t *remote, const float *xn,
               int64_t n, float *x, bl_err_t *err);
    /* out (n, n_embd), host memory = the routed experts of layer l of rows xn (host):
     * row i's counts[i] (expert, weight) pairs packed row after row in ids and wts
     * (counts NULL: n_used each), as wk_experts_fn; what an expert tier computes for
     * a stage (wk_model_experts). Done on return. */
    int (*experts)(wk_backend_t *b, int64_t l, const wk_moe_t *e, const float *xn, int64_t n, const int32_t *counts,
                   const int32_t *ids, const float *wts, float *out, bl_err_t *err);
    /* x += down(silu(gate xn) * up xn), a dense SwiGLU FFN (or shared experts), times
     * sigmoid(gate_inp . xn) per row when gate_inp (n_embd, the backend's) is set */
    int (*ffn)(wk_backend_t *b, const wk_tensor_t *gate, const wk_tensor_t *up, const wk_tensor_t *down,
               const float *gate_inp, const float *xn, int64_t n, float *x, bl_err_t *err);
    /* a and g (n, n_head * hd): the first and the second hd values of each head's 2 hd
     * in x (n, n_head * 2 hd): a gated attention's q and gate. NULL where the backend
     * has none. */
    int (*split_heads)(wk_backend_t *b, const float *x, int64_t n, int64_t n_head, int64_t hd, float *a, float *g,
                       bl_err_t *err);
    /* y (n, d) *= sigmoid(g (n, d)). NULL where the backend has none. */
    int (*mul_sigmoid)(wk_backend_t *b, float *y, const float *g, int64_t n, int64_t d, bl_err_t *err);
    /* The gated DeltaNet of model layer l over the step's rows, each sequence after
     * its cache's recurrent state (zero for a sequence at position 0), which it
     * updates (kcpu_deltanet; d's vectors are the backend's): qkv (n, channels)
     * changed, z (n, Hv S) the gate, bb and al the beta / alpha projections
     * (kcpu_dnet_gates; al unused when d->ba), out (n, Hv S). NULL where the
     * backend has none. */
    int (*deltanet)(wk_backend_t *b, int64_t l, const kcpu_dnet_t *d, float *qkv, const float *z, const float *bb,
                    const float *al, float *out, bl_err_t *err);
    /* the logits of each sequence's last n_out rows of x: norm, then the head */
    int (*head)(wk_backend_t *b, const float *norm, float eps, const wk_tensor_t *out, const float *x,
                bl_err_t *err);
    /* dst (n, d) = src (n, d), in the backend's memory (the NextN layer's pass). NULL
     * where the backend has none (it runs no NextN layer). */
    int (*copy_rows)(wk_backend_t *b, float *dst, const float *src, int64_t n, int64_t d, bl_err_t *err);

    /* --- activations card to card between two stages (wk_model_card_*); NULL where
     * the backend has no card. export: n_bufs buffers of n_batch rows of n_embd
     * floats and an event each, their handles into out; import: the previous stage's,
     * opened; close: what export (WK_CARD_OUT) or import (WK_CARD_IN) set up, freed
     * (no step in flight) */
    int (*card_export)(wk_backend_t *b, int n_bufs, wk_card_t *out, bl_err_t *err);
    int (*card_import)(wk_backend_t *b, const wk_card_t *in, bl_err_t *err);
    void (*card_close)(wk_backend_t *b, int which);
    /* put: nbytes of x (the last step's output rows) into exported buffer k, k's
     * event recorded after; get: nbytes of imported buffer k into x once k's event is
     * reached, queued before the next step; settle: returns once the gets are done */
    int (*card_put)(wk_backend_t *b, int k, const float *x, size_t nbytes, bl_err_t *err);
    int (*card_get)(wk_backend_t *b, int k, float *x, size_t nbytes, bl_err_t *err);
    int (*card_settle)(wk_backend_t *b, bl_err_t *err);

    /* Pins nbytes of host memory at p (page-aligned), the memory the step's outputs
     * are copied into (a last stage's logits ring), so that the device writes it
     * directly; undone at destroy. NULL where the backend copies nothing out. */
    int (*pin_host)(wk_backend_t *b, void *p, size_t nbytes, bl_err_t *err);

    /* residency's stats (wk_model_resid_stats, wk_model_resid_layer); NULL where the
     * backend has no card slots. Called from any thread. */
    void (*resid)(const wk_backend_t *b, wk_resid_stats_t *out);
    void (*resid_layer)(const wk_backend_t *b, int64_t l, uint64_t *selections, uint64_t *hits);
} wk_backend_ops_t;

/* What a backend sizes its scratch for. */
typedef struct wk_backend_cfg {
    const char *path; /* the model's file, for messages */
    const wk_config_t *c;
    const wk_model_opts_t *o;
    int64_t lb, le; /* the stage's layers */
    int remote;     /* some layer's routed experts go through the remote hook */
    bl_heat_t *heat; /* the routing counts to add to (a CPU backend: every MoE layer's choice; a
                      * card: its host layers', which residency reads), or NULL */
} wk_backend_cfg_t;

struct wk_backend {
    const wk_backend_ops_t *op;
};

/* The CPU backend; its experts op is what a hosttier computes (kcpu_experts). */
int wk__cpu_backend(wk_backend_t **out, const wk_backend_cfg_t *cfg, bl_err_t *err) BL_WUR;
/* The CPU backend's op times (wk_model_profile). */
int wk__cpu_profile(wk_backend_t *b, wk_prof_op_t *out, int cap, int reset);
/* The CUDA backend on cfg->o->device; BL_ENOTSUP in a build without CUDA. */
int wk__cuda_backend(wk_backend_t **out, const wk_backend_cfg_t *cfg, bl_err_t *err) BL_WUR;
int wk__cuda_profile(wk_backend_t *b, wk_prof_op_t *out, int cap, int reset);
int wk__cuda_bandwidth(wk_backend_t *b, size_t nbytes, double *bytes_per_s, bl_err_t *err) BL_WUR;

#endif
