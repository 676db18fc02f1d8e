/* Inside worker/: the model a family loads (weights as views into the file, the run
 * state in the backend's memory, the KV cache) and the helpers model.c gives the
 * families. model.c owns the wk.h API (loading, caches, the checks of a step, its
 * chunking); models/<arch>.c owns an architecture's metadata, tensors and forward
 * pass, written once over the backend ops (backend.h). */
#ifndef WK_MODEL_H
#define WK_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "gguf.h"
#include "wk.h"
#include "wmem.h"

typedef struct layer {
    wk_vec_t attn_norm;   // (n_embd)
    wk_tensor_t wq;       // (n_head * head_dim, n_embd)
    wk_tensor_t wk;       // (n_head_kv * head_dim, n_embd)
    wk_tensor_t wv;       // (n_head_kv * head_dim, n_embd)
    wk_tensor_t wo;       // (n_embd, n_head * head_dim)
    wk_vec_t bq, bk, bv;  // (n_head * head_dim), (n_head_kv * head_dim) x 2: attn_bias
    wk_vec_t bo;          // (n_embd) attn_output's bias (gpt-oss)
    wk_vec_t sinks;       // (n_head) attention sinks (gpt-oss)
    wk_vec_t q_norm;      // (head_dim), qk_norm
    wk_vec_t k_norm;      // (head_dim)
    wk_vec_t ffn_norm;    // (n_embd) the FFN's input norm (glm4moe: post_attention_norm)
    wk_moe_t moe;         /* a MoE layer's routed experts */
    wk_tensor_t sh_gate;  // (n_ff_shexp, n_embd) a MoE layer's shared experts
    wk_tensor_t sh_up;    // (n_ff_shexp, n_embd)
    wk_tensor_t sh_down;  // (n_embd, n_ff_shexp)
    wk_vec_t sh_gate_inp; // (n_embd) the shared expert's sigmoid gate (qwen3next)
    /* qwen3next / qwen35moe's gated DeltaNet layers (docs/models.md) */
    wk_tensor_t wqkv;     // (2 S Hk + S Hv, n_embd) attn_qkv
    wk_tensor_t wgate;    // (S Hv, n_embd) attn_gate: the output gate z
    wk_tensor_t ssm_ba;   // (2 Hv, n_embd) beta and alpha grouped by k head (qwen3next)
    wk_tensor_t ssm_beta, ssm_alpha; // (Hv, n_embd) each (qwen35moe)
    wk_vec_t ssm_conv;    // (channels, K) the convolution's weights
    wk_vec_t ssm_dt;      // (Hv) the time-step bias
    wk_vec_t ssm_a;       // (Hv) -exp(A_log)
    wk_vec_t ssm_norm;    // (S) the output's RMSNorm
    wk_tensor_t ssm_out;  // (n_embd, S Hv)
    /* deepseek2's latent attention */
    wk_tensor_t wq_a;     // (q_lora, n_embd), q_lora > 0
    wk_vec_t q_a_norm;    // (q_lora)
    wk_tensor_t wq_b;     // (n_head * head_k, q_lora); wq (n_head * head_k, n_embd) without q_lora
    wk_tensor_t wkv_a;    // (kv_lora + n_rot, n_embd)
    wk_vec_t kv_a_norm;   // (kv_lora)
    wk_tensor_t wk_b;     // (n_head * kv_lora, qk_nope): head h's rows h * kv_lora..
    wk_tensor_t wv_b;     // (n_head * head_v, kv_lora)
    wk_tensor_t ffn_gate; // (n_ff, n_embd) a dense layer's FFN
    wk_tensor_t ffn_up;   // (n_ff, n_embd)
    wk_tensor_t ffn_down; // (n_embd, n_ff)
} layer_t;

typedef struct weights {
    wk_tensor_t tok_embd;  // (n_vocab, n_embd)
    wk_vec_t output_norm;  // (n_embd)
    wk_tensor_t output;    // (n_vocab, n_embd); tok_embd's rows when tied
    layer_t *layers;       // (n_layer, and the NextN layer the stage runs: wk__layers_held)
    /* the NextN layer's own parts (mtp_l >= 0): eh_proj (n_embd, 2 n_embd) as the two
     * halves of its columns (the next token's embedding, the hidden state), its norms,
     * its head (nextn.shared_head_head, or output) and embedding (nextn.embed_tokens,
     * or token_embd) */
    wk_tensor_t mtp_eh_e, mtp_eh_h, mtp_head, mtp_embd;
    wk_vec_t mtp_enorm, mtp_hnorm, mtp_head_norm;
} weights_t;

/* The activations of one step of up to n_batch rows, in the backend's memory. */
typedef struct run_state {
    float *x;   // (n_batch, n_embd) the residual stream
    float *xn;  // (n_batch, n_embd) normed input of a block
    float *q;   // (n_batch, n_head * head_dim)
    float *k;   // (n_batch, n_head_kv * head_dim)
    float *v;   // (n_batch, n_head_kv * head_dim)
    float *att; // (n_batch, n_head * head_dim) attention output
    float *extra; // a family's own rows (deepseek2: the compressed q), or NULL
    wk_seg_t *segs; // (n_batch) host: the sequences of a step
} run_state_t;

/* A family: its tensors, their registration with the backend, its forward pass
 * (models/<family>.c), for the architectures named arch. */
typedef struct wk__family {
    const char *arch;
    int (*map)(wk_model_t *m, bl_err_t *err);
    int (*place)(wk_model_t *m, bl_err_t *err);
    int (*forward)(wk_model_t *m, const wk_step_t *st, bl_err_t *err);
    /* x += layer l's block (its attention, then its FFN) over the n rows of the step
     * begun, for the NextN layer's pass (wk__mtp_forward); NULL: the family runs none */
    int (*block)(wk_model_t *m, int64_t l, int64_t n, bl_err_t *err);
} wk__family_t;

struct wk_model {
    wk_config_t cfg;
    const wk__family_t *fam;
    void **owned;     /* weights the model made (converted from the file's form) */
    size_t n_owned, cap_owned;
    weights_t w;
    run_state_t s;
    wk_model_opts_t opts;
    wk_backend_t *be;
    bl_gguf_t *g;
    uint8_t *arena;   /* anonymous copy of the matrices (weights_arena), or NULL */
    size_t arena_len, arena_used;
    uint64_t arena_missed; /* bytes of matrices this process reads that did not fit the
                            * arena and stay in the file mapping */
    bl_heat_t *heat;       /* routing counts of a CPU stage's MoE layers (wk_model_heat), or NULL */
    bl_wmem_job_t *copies; /* the arena's copies, made together after the mapping */
    size_t n_copies, cap_copies;
    char path[256];   /* for messages; truncated */
    int64_t lb, le;   /* the stage's layers [lb, le) */
    wk_remote_t remote; /* WK_EXPERTS_REMOTE: where routed experts go */
    /* a hybrid (qwen3next): each stage layer's place in a cache, -1 where the layer
     * has no such part: K/V rows (attention layers, kv_index) or a recurrent state
     * (DeltaNet layers, rec_index); rec_floats: one layer's state */
    int64_t *kv_index, *rec_index;
    int64_t n_kv_layers, n_rec_layers;
    size_t rec_floats;
    uint8_t *host;      /* (n_layer): 1 where the layer's routed experts are another
                         * process's (REMOTE) or this one's (ONLY) */
    /* the card links to the neighbouring stages (wk_model_card_*): the buffers this
     * stage exported for the next and those of the previous one it opened (0: no
     * link), and the rows on the card between two calls: the last step's output a
     * put may copy, the input a get put in place for the next step (0: none) */
    int card_out_n, card_in_n;
    int64_t card_out_rows, card_in_rows;
    /* the NextN layer (opts.mtp on the last stage): its index (n_layer: the file's
     * first NextN block), or -1; the last step's rows (wk_model_mtp) and the logits of
     * those with a proposal; the pass's scratch: its rows' tokens and sequences (host),
     * the embedded tokens and the hidden states (the backend's, n_batch rows each) */
    int64_t mtp_l;
    wk_mtp_row_t *mtp_rows;  /* (n_batch) */
    int64_t n_mtp_rows;
    float *mtp_logits;       /* (mtp_logits_cap, n_vocab) */
    int64_t mtp_logits_cap;
    int32_t *mtp_tok;        /* (n_batch) */
    wk_seg_t *mtp_segs;      /* (n_batch) */
    struct wk__mtp_seg *mtp_plan; /* (n_batch) model.c's */
    float *mtp_e, *mtp_h;    /* (n_batch, n_embd) */
};

/* The layers m holds: the model's, and the NextN layer it runs. */
static inline int64_t wk__layers_held(const wk_model_t *m)
{
    return m->cfg.n_layer + (m->mtp_l >= 0 ? 1 : 0);
}

/* Whether this process computes layer l (its stage's, or the NextN layer it runs). */
static inline int wk__in_stage(const wk_model_t *m, int64_t l)
{
    return (l >= m->lb && l < m->le) || (m->mtp_l >= 0 && l == m->mtp_l);
}

/* Whether layer l has routed experts (a MoE model past its leading dense layers). */
static inline int wk__layer_moe(const wk_model_t *m, int64_t l)
{
    return m->cfg.moe && l >= m->cfg.n_dense_lead;
}

/* Whether layer l's routed experts go through the remote hook. */
static inline int wk__layer_remote(const wk_model_t *m, int64_t l)
{
    return m->opts.experts == WK_EXPERTS_REMOTE && m->host[l] && wk__layer_moe(m, l);
}

/* Whether this process computes layer l's routed experts (and so maps them). */
static inline int wk__layer_local_experts(const wk_model_t *m, int64_t l)
{
    if (!wk__layer_moe(m, l))
        return 0;
    if (m->opts.experts == WK_EXPERTS_ONLY)
        return m->host[l];
    return wk__in_stage(m, l) && !wk__layer_remote(m, l);
}

struct wk_kv {
    const wk_model_t *model; /* the model it was made for; another's is refused */
    int64_t n_layer, n_ctx, n_past; /* n_layer: the stage's layers that keep K/V rows */
    uint32_t type;
    int n_planes;     /* 2: K and V; 1: the value is the key's own row (deepseek2's
                       * latent cache), one plane a layer */
    size_t row_bytes; /* one position of one layer's K (or V) */
    int64_t stride;   /* positions from one plane to the next: n_ctx, or the pool's */
    float *rec;       // (model n_rec_layers, rec_floats) the DeltaNet layers' recurrent state
                      // after position n_past (host memory), or NULL
    uint8_t *buf;     // (n_layer, n_planes, stride, row_bytes): K then V per layer, in the
                      // backend's memory; in a pool, its first chunk's place there
    wk_kv_pool_t *pool; /* the shared cache it takes chunks of, or NULL: its own */
    int64_t c0, nc;     /* in a pool: its chunks c0..c0+nc */
    /* the NextN layer's pass (wk__mtp_forward): the final hidden state of position
     * mtp_pos kept for the next step, which reads the token after it (mtp_kept set),
     * and the token the layer read after it (-1: none yet) */
    float *mtp_h;       /* (n_embd), host */
    int64_t mtp_pos;
    int32_t mtp_tok;
    int mtp_kept;
};

/* Caches of several sequences in one buffer of n_chunks * WK_KV_CHUNK positions:
 * each holds a run of chunks, taken as it grows and given back as it shrinks. */
struct wk_kv_pool {
    wk_kv_t own;      /* the whole buffer (n_ctx = stride = every position) */
    int64_t n_chunks;
    wk_kv_t **owner;  /* (n_chunks) the cache holding each chunk, or NULL */
    int64_t n_moves;  /* cache moves (a compaction's too), and compactions */
    int64_t n_compactions;
};

// --- what model.c gives a family ---------------------------------------------------

/* Matrix name (ne0 = ncols, ne1 * ne2 rows), checked for shape, type and size; use:
 * this process computes with it, so it goes to the weights' copy where there is
 * one. */
int wk__find_mat(wk_model_t *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int use,
                 wk_tensor_t *out, bl_err_t *err) BL_WUR;
/* An f32 vector of ne0, and an f32 matrix (ne0, ne1) seen as one vector. */
int wk__find_vec(wk_model_t *m, const char *name, int64_t ne0, wk_vec_t *out, bl_err_t *err) BL_WUR;
int wk__find_vec2(wk_model_t *m, const char *name, int64_t ne0, int64_t ne1, wk_vec_t *out, bl_err_t *err) BL_WUR;

// --- a family (models/<arch>.c) -----------------------------------------------------

/* What every family shares (model.c): the embedding and head (map_io, place_io),
 * a layer's FFN block (its norm, then a dense SwiGLU or the router, routed and
 * shared experts), the NextN layers' check, the commit and the run state of
 * q_width, k_width (k and v), att_width and extra_width floats a row. */
int wk__map_io(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__map_ffn(wk_model_t *m, int64_t l, bl_err_t *err) BL_WUR;
int wk__check_nextn(wk_model_t *m, bl_err_t *err) BL_WUR;
/* The NextN layer's own parts (nothing when the stage runs none), after its block's
 * tensors; and their registration with the backend, after the stage's layers'. */
int wk__map_mtp(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__place_mtp(wk_model_t *m, bl_err_t *err) BL_WUR;
/* The NextN layer's pass after a step of the last stage (docs/models.md, "NextN"): it
 * reads the step's final rows and the tokens after them, extends the layer's cache, and
 * proposes a token for each sequence's row where greedy decoding would go on. */
int wk__mtp_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err) BL_WUR;
int wk__place_io(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__place_ffn(wk_model_t *m, int64_t l, bl_err_t *err) BL_WUR;
int wk__place_done(wk_model_t *m, int64_t q_width, int64_t k_width, int64_t att_width, int64_t extra_width,
                   bl_err_t *err) BL_WUR;
/* x += the FFN block of layer l over the step's n rows */
int wk__forward_ffn(wk_model_t *m, int64_t l, int64_t n, bl_err_t *err) BL_WUR;
/* Frees p with the model; p NULL is out of memory. */
int wk__own(wk_model_t *m, void *p, bl_err_t *err) BL_WUR;

/* gqa.c: qwen3moe, qwen3, glm4moe and gpt-oss; deepseek2.c: deepseek2; qwen3next.c:
 * qwen3next and qwen35moe. */
int wk__gqa_map(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__gqa_place(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__gqa_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err) BL_WUR;
int wk__gqa_block(wk_model_t *m, int64_t l, int64_t n, bl_err_t *err) BL_WUR;
int wk__q3n_block(wk_model_t *m, int64_t l, int64_t n, bl_err_t *err) BL_WUR;
int wk__ds2_map(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__ds2_place(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__ds2_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err) BL_WUR;
int wk__q3n_map(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__q3n_place(wk_model_t *m, bl_err_t *err) BL_WUR;
int wk__q3n_forward(wk_model_t *m, const wk_step_t *st, bl_err_t *err) BL_WUR;

/* Whether layer l is a gated DeltaNet layer. */
static inline int wk__layer_recurrent(const wk_config_t *c, int64_t l)
{
    return l >= 0 && l < 64 * 64 && (c->recurrent[l / 64] >> (l % 64) & 1);
}

#endif
