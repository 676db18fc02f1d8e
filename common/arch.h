/* What every process knows of a model's architecture, read once from the file's
 * metadata: the hyperparameters, the kind of cache a layer keeps, and each tensor's
 * role and layer (by llama.cpp's tensor names). One owner: the worker's families,
 * the router's placement plan, the hosttier's expert store and the tools read it
 * here. Architectures: qwen3moe (routed experts), qwen3 (dense), glm4moe (routed
 * and shared experts after leading dense layers, attention biases, partial RoPE,
 * sigmoid routing with a selection bias, NextN layers kept for speculation) and
 * deepseek2 (multi-head latent attention with a compressed cache, YaRN, grouped
 * expert choice) and gpt-oss (sliding-window layers, attention sinks, biases
 * everywhere, a clamped SwiGLU) and qwen3next / qwen35moe (gated DeltaNet layers with a
 * recurrent state per sequence between gated full-attention layers, a gated shared
 * expert; docs/models.md). */
#ifndef BL_ARCH_H
#define BL_ARCH_H

#include <stdint.h>
#include <string.h>

#include "err.h"
#include "gguf.h"

/* Limits on metadata values, far above any real model and low enough that every
 * buffer size computed from them fits in size_t. */
#define BL_ARCH_MAX_DIM (1 << 20)
#define BL_ARCH_MAX_LAYERS 4096
#define BL_ARCH_MAX_EXPERTS 4096
#define BL_ARCH_MAX_VOCAB (1 << 24)
#define BL_ARCH_MAX_CTX (1 << 24)

/* What a layer keeps per position. */
typedef enum bl_cache_kind {
    BL_CACHE_KV = 1, /* K and V rows of n_head_kv * head_dim: a prefix of it is the cache
                      * of the prefix, so a cache can be cut back to any position */
    BL_CACHE_HYBRID = 2, /* K and V rows in the attention layers, and in the DeltaNet
                      * layers one recurrent state a sequence (bl_arch_rec_floats):
                      * the state of the last position only, so the cache cannot be
                      * cut back */
} bl_cache_kind_t;

/* How a MoE router turns its logits into expert scores (llama.cpp's numbering). */
typedef enum bl_gating {
    BL_GATING_SOFTMAX = 1,
    BL_GATING_SIGMOID = 2,
    BL_GATING_SOFTMAX_WEIGHT = 3, /* top k by logit, weighted by the k logits' softmax (gpt-oss) */
} bl_gating_t;

/* A routed expert's activation (kcpu's KCPU_ACT_*). */
typedef enum bl_act {
    BL_ACT_SWIGLU = 0,
    BL_ACT_SWIGLU_OAI = 1, /* gpt-oss's clamped SwiGLU */
} bl_act_t;

typedef struct bl_arch {
    char name[16];        /* general.architecture: "qwen3moe", "qwen3", "glm4moe" */
    int moe;              /* routed experts in the layers from n_dense_lead on (else a
                           * dense FFN in every layer) */
    int64_t n_layer;      /* the layers a forward pass runs */
    int64_t n_layer_file; /* block_count: n_layer and the NextN layers after them */
    int64_t n_nextn;      /* NextN (multi-token prediction) layers, read, not run */
    int64_t n_dense_lead; /* leading layers with a dense FFN in a MoE model */
    int64_t n_embd;
    int64_t n_head;
    int64_t n_head_kv;    /* deepseek2: 1, the latent cache's one head */
    int64_t head_dim;     /* of q and k (deepseek2: of the latent cache, kv_lora + n_rot) */
    int64_t n_rot;        /* dims of each head RoPE rotates */
    int rope_neox;        /* NEOX pairs (i, i + n_rot/2), else consecutive ones (2i, 2i+1) */
    /* RoPE scaling (YaRN; freq_scale 1 and ext_factor 0 without it) and the rotation's
     * magnitude, as llama.cpp derives them from the rope.scaling.* keys */
    float rope_freq_scale, rope_ext_factor, rope_corr_lo, rope_corr_hi, rope_mscale;
    float attn_scale;     /* the scores' scale (1/sqrt(head_dim), or deepseek2's YaRN one) */
    /* deepseek2's multi-head latent attention */
    int64_t q_lora;       /* q's compressed width, 0: q straight from the input */
    int64_t kv_lora;      /* the latent cache's width */
    int64_t head_k, head_v; /* a head's q/k (qk_nope + n_rot) and v widths */
    int mla_split;        /* attn_k_b and attn_v_b (else the legacy attn_kv_b) */
    int64_t n_group, topk_group; /* experts chosen among the topk_group best of n_group groups */
    int64_t n_ff;         /* dense FFN width */
    int64_t n_expert;     /* routed experts per MoE layer */
    int64_t n_expert_used;
    int64_t n_ff_exp;     /* one expert's FFN width */
    int64_t n_ff_shexp;   /* the shared experts' FFN width, 0: none */
    bl_gating_t gating;
    int expert_norm;      /* the chosen weights divided by their sum */
    float expert_scale;   /* and multiplied by this */
    int expert_bias;      /* exp_probs_b: a bias on the scores for the choice only */
    int attn_bias;        /* attn_q/k/v carry biases */
    int qk_norm;          /* per-head RMSNorm of q and k */
    /* gpt-oss */
    int64_t n_swa;        /* sliding layers see this many positions, 0: no sliding layers */
    int64_t swa_period;   /* layer l slides when l % swa_period < swa_period - 1 */
    int attn_sinks;       /* attn_sinks: one more score per head in the softmax */
    int attn_out_bias;    /* attn_output carries a bias */
    int router_bias;      /* ffn_gate_inp carries a bias */
    int expert_biases;    /* the routed experts' gate, up and down carry biases */
    bl_act_t expert_act;
    /* qwen3next / qwen35moe: gated DeltaNet layers (docs/models.md) */
    int64_t ssm_conv;     /* K: taps of the causal convolution */
    int64_t ssm_state;    /* S: a head's key and value width */
    int64_t ssm_groups;   /* Hk: q/k heads */
    int64_t ssm_heads;    /* Hv: v heads, one S x S state each */
    int ssm_tiled;        /* v head j reads q/k head j % Hk (qwen35moe), else j / (Hv / Hk) */
    int ssm_ba;           /* beta and alpha come from one ssm_ba grouped by k head (qwen3next),
                           * else from ssm_beta and ssm_alpha */
    int attn_gate;        /* attn_q gives a sigmoid gate beside each head's q */
    int shexp_gate;       /* ffn_gate_inp_shexp: a sigmoid gate on the shared expert */
    uint64_t recurrent[BL_ARCH_MAX_LAYERS / 64]; /* bit l: layer l is a DeltaNet layer */
    const char *ffn_norm; /* the FFN's input norm: "ffn_norm" or "post_attention_norm" */
    int64_t n_vocab;      /* rows of token_embd.weight */
    int64_t n_ctx_train;
    float rope_base;
    float eps;
    int tied_output;      /* no output.weight: the head is token_embd */
    bl_cache_kind_t cache;
    int cache_prefix_cut; /* the cache can be cut back to a prefix */
    int kv_planes;        /* 2: K and V rows; 1: the value is the key's row (deepseek2) */
} bl_arch_t;

/* Whether layer l has routed experts. */
static inline int bl_arch_layer_moe(const bl_arch_t *a, int64_t l)
{
    return a->moe && l >= a->n_dense_lead && l < a->n_layer;
}

/* Whether the file's first NextN layer runs (--spec-type draft-mtp): it has one, and
 * its family's NextN block is built (glm4moe, qwen35moe). */
static inline int bl_arch_nextn_runs(const bl_arch_t *a)
{
    return a->n_nextn > 0 && (!strcmp(a->name, "glm4moe") || !strcmp(a->name, "qwen35moe"));
}

/* Whether layer l is a gated DeltaNet layer (a recurrent state, no K/V rows). */
static inline int bl_arch_layer_recurrent(const bl_arch_t *a, int64_t l)
{
    return l >= 0 && l < BL_ARCH_MAX_LAYERS && (a->recurrent[l / 64] >> (l % 64) & 1);
}

/* The channels of a DeltaNet layer's convolution: q, k (Hk heads each) and v (Hv). */
static inline int64_t bl_arch_conv_channels(const bl_arch_t *a)
{
    return a->ssm_state * (2 * a->ssm_groups + a->ssm_heads);
}

/* The f32 values of one sequence's recurrent state in one DeltaNet layer: the
 * convolution's last K - 1 inputs and the Hv S x S states (0 without such layers). */
static inline int64_t bl_arch_rec_floats(const bl_arch_t *a)
{
    if (a->ssm_heads == 0)
        return 0;
    return (a->ssm_conv - 1) * bl_arch_conv_channels(a) + a->ssm_heads * a->ssm_state * a->ssm_state;
}

/* Whether layer l attends over a sliding window of n_swa positions. */
static inline int bl_arch_layer_swa(const bl_arch_t *a, int64_t l)
{
    return a->n_swa > 0 && a->swa_period > 0 && l % a->swa_period < a->swa_period - 1;
}

/* Reads and checks a's fields from g (path names the file in messages). Errors:
 * BL_ENOTSUP (another architecture, RoPE scaling, a value length other than the key
 * length), BL_ENOENT (a missing key or token_embd.weight, named), BL_ERANGE (a value
 * out of its range, named), BL_EINVAL (inconsistent heads or experts). */
int bl_arch_read(bl_arch_t *a, const bl_gguf_t *g, const char *path, bl_err_t *err) BL_WUR;

/* The tensor name of g, checked for shape (ne0, ne1, ne2; 1 for an unused
 * dimension), for type (f32 when need_f32, else any type with a reference
 * dequantizer), for whole blocks per row and its size, and for data on a 4-byte
 * boundary; *out points at its info. BL_ENOENT (missing), BL_EINVAL (shape, type,
 * size, alignment: both shapes named), BL_ENOTSUP (a type without a dequantizer). */
int bl_arch_tensor(const bl_gguf_t *g, const char *path, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                   int need_f32, const bl_gguf_tensor_t **out, bl_err_t *err) BL_WUR;

/* A tensor's part in the model. */
typedef enum bl_role {
    BL_ROLE_OTHER = 0,   /* not a tensor the architecture reads */
    BL_ROLE_TOKEN_EMBD,
    BL_ROLE_OUTPUT_NORM,
    BL_ROLE_OUTPUT,
    BL_ROLE_ATTN,        /* attention projections and their norms */
    BL_ROLE_NORM,        /* the FFN's input norm */
    BL_ROLE_GATE_INP,    /* the router of a MoE layer */
    BL_ROLE_EXPERTS,     /* the routed experts' gate, up or down (all experts of a layer) */
    BL_ROLE_FFN,         /* a dense FFN's or the shared experts' matrices */
} bl_role_t;

/* The role of the tensor named name and its layer (-1 outside the layers; a NextN
 * layer's tensors are BL_ROLE_OTHER: no forward pass reads them). */
bl_role_t bl_arch_role(const bl_arch_t *a, const char *name, int64_t *layer);

/* "token_embd", "experts", ...: for messages and the plan's lines. */
const char *bl_role_name(bl_role_t r);

#endif
