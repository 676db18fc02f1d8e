/* The worker's model API: load a model from a GGUF file (validated against its
 * metadata), keep one KV cache per sequence, and run forward passes over it on the
 * CPU backend (kernels/cpu). A CLI or the stage runner drives these calls.
 *
 * Threads: a wk_model_t and the caches used with it belong to one owning thread;
 * the model's own thread pool does the parallel work inside each call. */
#ifndef WK_H
#define WK_H

#include <stddef.h>
#include <stdint.h>

#include "heat.h"
#include "args.h"
#include "err.h"
#include "gguf.h"
#include "plan.h"
#include "progress.h"

/* KV cache element types (their bl_type_t ids). f16 is the default, as in
 * llama.cpp; f32 for checking against the exact oracle; q8_0 halves the memory. */
#define WK_KV_F32 0u
#define WK_KV_F16 1u
#define WK_KV_Q8_0 8u
#define WK_KV_DEFAULT WK_KV_F16

typedef struct wk_model_opts {
    int precise;       /* 1: f32 activations and exactly dequantized weights (slow, for
                        * checking); 0: the fast path (8-bit activations, integer dots) */
    int act_terms;     /* fast path: 2 (default) keeps about 16-bit activations (int16
                        * rows for K-quant weights, a q8 value plus a q8 residual for
                        * q8_0 and the head; kernels/cpu/kcpu.h); 1 is llama.cpp's single
                        * q8 term: less arithmetic, more error */
    int n_threads;     /* threads the ops split over, 1..256 */
    int n_threads_batch; /* threads for a step that carries a prompt (a sequence of more
                          * than one row), 1..256; 0: n_threads */
    int poll;            /* how the CPU pool's idle threads wait, 0..100 (llama.cpp's
                          * --poll; kcpu_pool_set_poll); default KCPU_POLL_DEFAULT (50) */
    int cpu_strict;      /* --cpu-strict: each CPU pool thread pinned to one CPU of the
                          * process's affinity set (kcpu_pool_pin_strict) */
    int64_t n_batch;   /* most rows one forward pass takes; longer prompts run in chunks */
    int64_t n_ctx_max; /* longest KV cache a wk_kv_t may hold; 0: the file's context_length */
    int64_t layer_begin; /* a pipeline stage: this process runs layers [layer_begin, */
    int64_t layer_end;   /* layer_end); 0 and 0: every layer. The first stage embeds
                          * tokens, the last computes logits; wk_model_stage passes
                          * the hidden state between them */
    int experts;       /* WK_EXPERTS_*: where the routed experts are computed */
    const uint8_t *experts_host; /* (n_layer) or NULL. WK_EXPERTS_REMOTE: where a
                        * layer's routed experts go to the callback, WK_EXPERTS_HOST_RAM
                        * (the hosttier: a card may copy them from the file mapping for a
                        * prompt or its slots) or WK_EXPERTS_TIER (another process's
                        * card: only the callback); 0 where they stay here (NULL: every
                        * layer's to the host); WK_EXPERTS_ONLY: nonzero for the layers
                        * whose experts this process loads (NULL: all). Copied at load */
    int device;        /* WK_DEVICE_CPU, or a CUDA ordinal: the stage's weights, scratch
                        * and KV caches live on that card and the forward pass runs
                        * there (f32 activations, weights dequantized exactly; f16 KV
                        * caches only; every expert local) */
    int cuda_graph;    /* device: capture each decode step (every sequence one row) as
                        * a CUDA graph per sequence count and replay it (default 1);
                        * 0 enqueues the same launches one by one */
    int flash_attn;    /* device: prompt attention as one flash kernel (WK_FLASH_ON), as
                        * score/softmax/value pieces (WK_FLASH_OFF), or flash where the
                        * head size has it (WK_FLASH_AUTO, the default) */
    int no_mmap;       /* CPU: copy every matrix into anonymous memory even when the
                        * model is larger than half the RAM (default: as many matrices
                        * as half the RAM and the available memory's margin hold are
                        * copied, the rest stay in the file mapping, which the page
                        * cache can evict) */
    uint64_t copy_bytes; /* CPU: at most this many bytes of matrices copied (0: as above) */
    int no_op_offload; /* device: never copy a layer's host-RAM experts to the card for a
                        * prompt step (llama.cpp's --no-op-offload); by default a step of
                        * at least WK_OP_OFFLOAD_ROWS rows computes them on the card */
    int mlock;         /* lock the weights in RAM (mlock); a refusal (RLIMIT_MEMLOCK) is
                        * logged and the load goes on, as in llama.cpp */
    int64_t experts_vram; /* device, a stage with host-RAM experts: card bytes for the
                        * expert slots residency fills (WK_EXPERTS_VRAM_AUTO: what the
                        * card has free at the first step, after the stage, its caches
                        * and WK_RESID_MARGIN; 0: no slots) */
    int residency;     /* device: the hottest host-RAM experts move into card slots and
                        * the coldest out while it runs (default 1); 0 keeps the plan */
    int profile;       /* time every op of a step: on a device with CUDA events (a
                        * decode step is captured afresh with an event node after
                        * each launch), on the CPU with the clock around each op;
                        * read with wk_model_profile, switch with
                        * wk_model_set_profile */
    int mtp;           /* the last stage also runs the file's first NextN (multi-token
                        * prediction) layer, which proposes the token after each
                        * sequence's next one (wk_model_mtp); glm4moe on the CPU. Other
                        * stages ignore it */
    bl_progress_fn progress; /* or NULL: bytes of weights copied into memory or onto
                        * the card during wk_model_load, called on the loading thread */
    void *progress_ud;
} wk_model_opts_t;

#define WK_FLASH_AUTO BL_FLASH_AUTO /* the values bl_arg_flash_attn parses -fa into */
#define WK_FLASH_ON BL_FLASH_ON
#define WK_FLASH_OFF BL_FLASH_OFF

/* The fewest rows of a prompt step for which a card copies a layer's host-RAM experts
 * in and computes them itself (BLOOMERY_OP_OFFLOAD_ROWS overrides it, to measure). */
#define WK_OP_OFFLOAD_ROWS 64

/* wk_model_opts_t.experts_vram: size the slots from the card's free memory. */
#define WK_EXPERTS_VRAM_AUTO (-1)
/* What an automatic slot budget leaves free on the card (graphs, later caches). */
#define WK_RESID_MARGIN ((int64_t)2 << 30)

/* The CPU (the default of wk_model_opts_t.device). */
#define WK_DEVICE_CPU (-1)

/* Where a MoE model's routed experts run (a dense model ignores it). */
#define WK_EXPERTS_LOCAL 0  /* here, in the step (default) */
#define WK_EXPERTS_REMOTE 1 /* the gate and top-k run here; the selected experts run in
                             * the callback of wk_model_set_experts (the hosttier); their
                             * weights are not copied into this process's memory */
#define WK_EXPERTS_ONLY 2   /* an expert tier (on the CPU or a card): only the routed
                             * experts' weights are loaded, and only wk_model_experts
                             * runs */

/* wk_model_opts_t.experts_host's values for a layer whose experts go to the callback. */
#define WK_EXPERTS_HOST_RAM 1
#define WK_EXPERTS_TIER 2

/* Defaults: fast path with act_terms 2, 1 thread, n_batch 512, n_ctx_max 0, every
 * layer, experts local, the CPU (graphs on, profile off for a device). */
void wk_model_opts_default(wk_model_opts_t *o);

/* What the forward pass reads from the file's metadata. */
typedef struct wk_config {
    char arch[16];         /* "qwen3moe", "qwen3", "glm4moe", "deepseek2", "gpt-oss", "qwen3next",
                            * "qwen35moe" */
    int moe;               /* routed experts in layers n_dense_lead.. (else a dense FFN) */
    int64_t n_layer;       /* the layers a forward pass runs (NextN layers not counted) */
    int64_t n_embd;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t head_dim;
    int64_t n_rot;         /* dims of each head RoPE rotates */
    int rope_neox;         /* NEOX pairs (i, i + n_rot/2), else consecutive ones */
    float rope_freq_scale, rope_ext_factor, rope_corr_lo, rope_corr_hi, rope_mscale; /* YaRN (arch.h) */
    float attn_scale;      /* the scores' scale */
    int64_t q_lora, kv_lora, head_k, head_v; /* deepseek2's latent attention (arch.h) */
    int mla_split;         /* attn_k_b and attn_v_b, else attn_kv_b */
    int kv_planes;         /* a cache's planes a layer: 2 (K, V), 1 (the value is the key) */
    int64_t n_group, topk_group; /* grouped expert choice */
    int64_t n_ff;          /* dense FFN width (qwen3; glm4moe's leading dense layers) */
    int64_t n_expert;      /* MoE models */
    int64_t n_expert_used;
    int64_t n_ff_exp;      /* one expert's FFN width */
    int64_t n_ff_shexp;    /* the shared experts' width, 0: none */
    int64_t n_dense_lead;  /* leading layers with a dense FFN in a MoE model */
    int64_t n_nextn;       /* NextN layers after the n_layer (read, not run) */
    int gating;            /* bl_gating_t: how router logits become scores */
    int expert_norm;       /* chosen weights divided by their sum */
    float expert_scale;    /* then multiplied by this */
    int expert_bias;       /* exp_probs_b biases the choice */
    int attn_bias;         /* q, k and v have biases */
    int qk_norm;           /* per-head RMSNorm of q and k */
    int64_t n_swa, swa_period; /* gpt-oss's sliding-window layers (arch.h) */
    int attn_sinks, attn_out_bias, router_bias, expert_biases; /* gpt-oss's extras (arch.h) */
    int expert_act;        /* bl_act_t */
    /* qwen3next / qwen35moe's gated DeltaNet layers (arch.h); ssm_heads 0: none */
    int64_t ssm_conv, ssm_state, ssm_groups, ssm_heads;
    int ssm_tiled, ssm_ba;
    int attn_gate;         /* attn_q gives a sigmoid gate beside each head's q */
    int shexp_gate;        /* a sigmoid gate on the shared expert (ffn_gate_inp_shexp) */
    uint64_t recurrent[64]; /* bit l: layer l is a DeltaNet layer (BL_ARCH_MAX_LAYERS bits) */
    char ffn_norm[24];     /* the FFN's input norm's name: "ffn_norm", "post_attention_norm" */
    int64_t n_vocab;
    int64_t n_ctx_train;
    float rope_base;
    float eps;
    int tied_output;       /* no output.weight: the head is token_embd */
} wk_config_t;

typedef struct wk_model wk_model_t;
typedef struct wk_kv wk_kv_t;
typedef struct wk_kv_pool wk_kv_pool_t;

/* A shared cache hands out positions in chunks of this many (proto's BP_KV_CHUNK). */
#define WK_KV_CHUNK 256

/* Opens path, checks every tensor the architecture needs for presence, type and
 * shape against the metadata, and sets *out (caller frees with wk_model_free).
 * Weights stay in the file's mapping; with opts.device >= 0 the stage's weights are
 * then uploaded to that card (BL_ENOTSUP in a build without CUDA, for remote
 * experts, or for a type or shape the CUDA kernels do not take). Errors: the reader's (bl_gguf_open),
 * BL_ENOTSUP (an architecture other than qwen3moe/qwen3/glm4moe/deepseek2/gpt-oss, a tensor type without a
 * dequantizer), BL_ENOENT (a missing key or tensor, named), BL_EINVAL (a tensor of
 * the wrong shape or type, named with both shapes), BL_ERANGE, BL_ENOMEM. */
int wk_model_load(wk_model_t **out, const char *path, const wk_model_opts_t *opts,
                  bl_err_t *err) BL_WUR;
void wk_model_free(wk_model_t *m); /* NULL is a no-op */

const wk_config_t *wk_model_config(const wk_model_t *m);

/* The routing counts of a MoE model: every step's choice of routed experts per
 * layer, decaying by half every WK_HEAT_HALF_LIFE steps (common/heat.h); on a card,
 * of the layers whose experts are in host RAM only. NULL for a dense model, a card
 * stage without host layers, or a model of experts only. */
#define WK_HEAT_HALF_LIFE 256
const bl_heat_t *wk_model_heat(const wk_model_t *m);
/* Residency on a card (wk_model_opts_t.residency): its slots and moves so far, and
 * per layer of the stage the routed selections of host-RAM layers and how many of
 * them a card slot served. Safe to call from any thread while steps run. */
typedef struct wk_resid_stats {
    int64_t slots;       /* expert slots on the card, all layers (0: residency is off) */
    int64_t slot_bytes;  /* their card memory */
    uint64_t moves;      /* experts copied into a slot so far */
    uint64_t evictions;  /* experts a slot gave up for a hotter one */
} wk_resid_stats_t;
void wk_model_resid_stats(const wk_model_t *m, wk_resid_stats_t *out);
/* Layer l's counted selections and card hits since load; 0 and 0 for a layer that
 * is not counted (its experts are all on the card, or not a host-RAM layer of a card). */
void wk_model_resid_layer(const wk_model_t *m, int64_t l, uint64_t *selections, uint64_t *hits);

/* The open GGUF file the model reads (metadata, tokenizer, template); borrowed,
 * valid until wk_model_free. */
const bl_gguf_t *wk_model_gguf(const wk_model_t *m);
/* The CPU kernel set in use ("avx2", "ref"), chosen once per process; for a model
 * on a CUDA device, the device's name ("NVIDIA H200"). */
const char *wk_model_kernels(const wk_model_t *m);

/* A KV cache for one sequence of up to n_ctx positions (1..n_ctx_max) with elements
 * of type (WK_KV_*; q8_0 needs head_dim a multiple of 32). On a model's CUDA
 * device the cache lives on the card and must be f16 (another type: BL_ENOTSUP
 * naming it). Caller frees with wk_kv_free, before the model. */
int wk_kv_create(wk_kv_t **out, const wk_model_t *m, int64_t n_ctx, uint32_t type,
                 bl_err_t *err) BL_WUR;
void wk_kv_free(wk_kv_t *kv);
int64_t wk_kv_n_past(const wk_kv_t *kv); /* positions filled so far */
size_t wk_kv_row_bytes(const wk_kv_t *kv); /* one position of one layer's K (or V) */
int wk_kv_planes(const wk_kv_t *kv);       /* 2 (K, V), or 1 (deepseek2: the value is the key) */
int64_t wk_kv_layers(const wk_kv_t *kv);   /* the stage's layers that keep K/V rows */

/* One cache of n_positions (rounded up to whole WK_KV_CHUNKs; at most n_ctx_max;
 * type as wk_kv_create's) that several caches made with wk_kv_create_in share:
 * llama.cpp's unified KV cache. A cache in it holds the
 * chunks its positions need: a step or a load that needs more takes them (moving
 * the cache, or compacting the pool, when its neighbours are in the way), and
 * rewinding gives them back. Free the caches first, then the pool. */
int wk_kv_pool_create(wk_kv_pool_t **out, const wk_model_t *m, int64_t n_positions, uint32_t type,
                      bl_err_t *err) BL_WUR;
void wk_kv_pool_free(wk_kv_pool_t *p);
/* Chunks held by caches, of all; caches moved to make room, and compactions. */
void wk_kv_pool_usage(const wk_kv_pool_t *p, int64_t *used, int64_t *total);
void wk_kv_pool_moves(const wk_kv_pool_t *p, int64_t *moves, int64_t *compactions);
/* A cache of up to n_ctx positions (at most the pool's) in pool; it holds no chunk
 * until it has positions. Free with wk_kv_free. */
int wk_kv_create_in(wk_kv_t **out, wk_kv_pool_t *pool, int64_t n_ctx, bl_err_t *err) BL_WUR;
/* Empties kv: n_past 0, its chunks back to the pool. */
void wk_kv_clear(wk_kv_t *kv);

/* The host bytes positions 0..n of kv take (this stage's layers, K and V: its planes). */
size_t wk_kv_state_bytes(const wk_kv_t *kv, int64_t n);
/* Host memory for saved states of m's caches, of the kind its copies move fastest
 * (page-locked beside a card); free with wk_kv_state_free. BL_ENOMEM. */
int wk_kv_state_alloc(const wk_model_t *m, size_t nbytes, void **out, bl_err_t *err) BL_WUR;
void wk_kv_state_free(const wk_model_t *m, void *p); /* NULL is a no-op */
/* Copies positions 0..n (n in 1..n_past) of kv to dst (wk_kv_state_bytes(kv, n)
 * bytes of host memory). BL_EINVAL for n out of range. */
int wk_kv_save(wk_kv_t *kv, int64_t n, void *dst, bl_err_t *err) BL_WUR;
/* Puts the first n positions of a state of n_saved positions, saved from a cache of
 * the same model, stage and type, into kv's positions 0..n; kv's n_past becomes n.
 * BL_EINVAL for n out of 1..min(n_ctx, n_saved); on a copy error n_past is 0 (the
 * cache holds nothing usable). */
int wk_kv_load(wk_kv_t *kv, int64_t n, const void *src, int64_t n_saved, bl_err_t *err) BL_WUR;

/* A cache whose model has recurrent (DeltaNet) layers holds their state after its
 * last position only: it cannot be cut back to a prefix (wk_model_eval refuses a pos
 * other than n_past or 0; wk_kv_save and wk_kv_load take whole states). A checkpoint
 * is that state alone (wk_kv_ckpt_bytes, 0 without such layers): saved at n_past,
 * put back together with cutting the K/V rows back to the checkpoint's position. */
size_t wk_kv_ckpt_bytes(const wk_kv_t *kv);
int wk_kv_ckpt_save(wk_kv_t *kv, void *dst, bl_err_t *err) BL_WUR;
/* kv cut back to n positions (n <= n_past: those the checkpoint was saved at) with
 * the state src. BL_EINVAL for n out of range. */
int wk_kv_ckpt_load(wk_kv_t *kv, int64_t n, const void *src, bl_err_t *err) BL_WUR;

/* Runs tokens[0..n) at positions pos.. (pos <= wk_kv_n_past: rewinding drops what
 * came after) through the model, appending their K/V to kv, and writes the logits
 * of the last n_out rows to logits (n_out, n_vocab); n_out may be 0. Afterwards
 * wk_kv_n_past(kv) == pos + n. Errors: BL_EINVAL (a token id out of range, n < 1,
 * n_out > n, pos past n_past, a cache made for another model), BL_ERANGE (pos + n >
 * the cache's n_ctx). On an error nothing has been computed and kv is unchanged.
 * Batched rows give the same bits as the same rows one at a time, and the thread
 * count never changes a bit. */
int wk_model_eval(wk_model_t *m, wk_kv_t *kv, const int32_t *tokens, int64_t n, int64_t pos,
                  int64_t n_out, float *logits, bl_err_t *err) BL_WUR;

/* One sequence's part of a multi-sequence step. */
typedef struct wk_seq {
    wk_kv_t *kv;           /* its cache; each sequence of a step has its own */
    const int32_t *tokens; /* (n) */
    int64_t n;             /* rows: 1 for a decode step, more for a prompt chunk */
    int64_t pos;           /* position of tokens[0], <= wk_kv_n_past(kv) */
    int64_t n_out;         /* logits for its last n_out rows, 0..n */
} wk_seq_t;

/* One forward pass over the rows of n_seqs sequences together (decode: one row per
 * slot), so that each weight row is read once for all of them. Logits go to logits
 * (sum of n_out, n_vocab) in sequence order. The rows of all sequences together are
 * at most n_batch (no chunking here). Each sequence gives the same bits as it would
 * alone through wk_model_eval. Errors as wk_model_eval, naming the sequence, plus
 * BL_EINVAL for two sequences sharing a cache and BL_ERANGE for too many rows;
 * on an error no cache has changed. */
int wk_model_eval_multi(wk_model_t *m, const wk_seq_t *seqs, int64_t n_seqs, float *logits,
                        bl_err_t *err) BL_WUR;

/* --- the NextN layer's proposals (opts.mtp) ---------------------------------------- */

/* One logit row's part of the NextN layer's pass. The layer reads the row's hidden
 * state and the token after it. Within a sequence of the step that token is the
 * next row's, as long as the next row's token is the row's most likely one (greedy
 * decoding would have taken it); the first row where it is not, or the sequence's
 * last row, reads its most likely token instead, and its proposal is the token the
 * layer finds most likely after that one: what greedy decoding would draft. */
typedef struct wk_mtp_row {
    int32_t in;  /* the token the layer read after this row when it proposes from it; -1:
                  * no proposal from this row */
    int32_t tok; /* the proposed token (-1 with in) */
    float p;     /* its probability under the layer's softmax */
} wk_mtp_row_t;

/* After a step of a model loaded with opts.mtp (the last stage): one row for each
 * logit row of the step, in order (*rows), and the layer's logits, n_vocab floats for
 * each row with in >= 0, in the same order (*logits; at most one such row a sequence).
 * Returns the count, 0 before a step, after a failed one, or without the layer.
 * Valid until the next step. */
int64_t wk_model_mtp(const wk_model_t *m, const wk_mtp_row_t **rows, const float **logits);

/* --- a model on a CUDA device ---------------------------------------------------- */

/* One op's share of the steps a profiling model (opts.profile) ran. */
typedef struct wk_prof_op {
    const char *op;  /* "attn_q", "ffn_moe_down", ...; static */
    int64_t calls;   /* launches (card) or calls (CPU) timed */
    double us;       /* their total time on the card, or on the CPU's clock */
    double bytes;    /* CPU: the weight bytes the calls read (0 where none, and on a card) */
} wk_prof_op_t;

/* Copies up to cap ops, in first-call order, into out and returns how many there
 * are; resets the totals when reset is set. */
int wk_model_profile(wk_model_t *m, wk_prof_op_t *out, int cap, int reset);

/* Turns the per-op timing of later steps on or off (opts.profile is the initial
 * state). */
void wk_model_set_profile(wk_model_t *m, int on);

/* Device memory bandwidth: the best of a few device-to-device copies of nbytes on
 * the model's card, as bytes read plus written per second. BL_ENOTSUP on the CPU. */
int wk_model_device_bandwidth(wk_model_t *m, size_t nbytes, double *bytes_per_s,
                              bl_err_t *err) BL_WUR;

/* The same measure on CUDA device `device` without a model (BL_ENOTSUP in a build
 * without CUDA). */
int wk_cuda_copy_rate(int device, size_t nbytes, double *bytes_per_s, bl_err_t *err) BL_WUR;

/* The positions the card's decode attention covers (its grid) when the step's
 * longest row attends to `positions` of a context of n_ctx: the next power of two
 * from 256 up (the step's graph bucket), at most n_ctx rounded up to
 * KCUDA_ATT_CHUNK. CUDA builds only (bloomery-bench --attention follows it). */
int64_t wk_cuda_att_grid(int64_t positions, int64_t n_ctx);

/* The card's attention and launch knobs from the environment, as the CUDA backend
 * reads them when it starts (docs/cuda.md): BLOOMERY_CUDA_ATT_SHORT=N the longest
 * context decode attention takes in one pass (kcuda_attention_set_short),
 * BLOOMERY_CUDA_ATT_CHUNK=N the shortest chunk of the split pass
 * (kcuda_attention_set_chunk), BLOOMERY_CUDA_ATT_SPLITS=N its most blocks per row and
 * KV head (kcuda_attention_set_splits), BLOOMERY_CUDA_MMA=N the fewest activation
 * rows the tensor-core products take (kcuda_matvec_set_mma), BLOOMERY_CUDA_GROUP=P
 * the bound for grouping routed experts by expert (kcuda_matvec_set_group),
 * BLOOMERY_CUDA_PDL=0 every kernel launched the ordinary way (kcuda_set_pdl).
 * Process-wide; nothing in a build without CUDA. */
void wk_cuda_knobs_from_env(void);

/* --- pipeline stages and remote experts ------------------------------------------- */

/* Computes routed experts of n rows for one layer (see wk_model_experts) into out
 * (n, n_embd): for each row the sum over its counts[i] (expert, weight) pairs (row
 * i's follow row i-1's in ids and wts; counts NULL: n_expert_used each) of weight
 * times the expert's SwiGLU FFN of the row. Returns 0 or a negative BL_E* code with
 * err set; a failure fails the step. */
typedef int (*wk_experts_fn)(void *ctx, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                             const int32_t *ids, const float *wts, float *out, bl_err_t *err);

/* Where a WK_EXPERTS_REMOTE model sends the routed experts of its layers that are
 * not its own; called on the step's thread, inside wk_model_stage. */
void wk_model_set_experts(wk_model_t *m, wk_experts_fn fn, void *ctx);

/* The hosttier's computation: layer's routed experts for n rows (1..n_batch) of
 * normed hidden states xn (n, n_embd), row i with counts[i] (1..n_expert_used)
 * distinct experts (counts NULL: n_expert_used each), their ids and weights packed
 * row after row, into out (n, n_embd). With every pair of a row sent, the bits equal
 * what the same rows get from the experts inside wk_model_eval (on the CPU; a card's
 * sums are within its gates of them). Needs the layer's experts in this process
 * (WK_EXPERTS_LOCAL in a CPU stage, or _ONLY with the layer listed, on the CPU or a
 * card). BL_EINVAL (layer, a count or an id out of range, named; a non-MoE model;
 * the wrong experts mode), BL_ENOTSUP (a stage on a card: its experts run in its
 * steps), BL_ERANGE (n outside 1..n_batch). */
int wk_model_experts(wk_model_t *m, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                     const int32_t *ids, const float *wts, float *out, bl_err_t *err) BL_WUR;

/* One step of this process's stage over the rows of n_seqs sequences, as
 * wk_model_eval_multi: the first stage reads seqs[].tokens, a later one reads the
 * hidden state x_in (rows, n_embd) the stage before wrote, where tokens may be NULL;
 * the last stage writes the logits of each sequence's last n_out rows, an earlier one
 * writes the hidden state of every row to x_out (rows, n_embd). x_in may be NULL
 * right after a wk_model_card_get of the step's rows, x_out NULL on a stage that
 * exported card buffers (wk_model_card_put then passes the rows on). KV caches made
 * for this model hold only the stage's layers. Splitting the layers over stages gives
 * the same bits as one stage. Errors as wk_model_eval_multi, plus BL_EINVAL for a
 * missing x_in/x_out, and the experts callback's error (the caches may then hold
 * part of the step; the caller drops the step). */
int wk_model_stage(wk_model_t *m, const wk_seq_t *seqs, int64_t n_seqs, const float *x_in,
                   float *x_out, float *logits, bl_err_t *err) BL_WUR;

/* --- activations card to card between two stages on one host ---------------------- */

/* Buffers a stage exports at most, and the size of an exported handle (proto's
 * BP_CARD_MAX_BUFS and BP_CARD_HANDLE_BYTES; the worker checks they agree). */
#define WK_CARD_MAX_BUFS 4
#define WK_CARD_HANDLE_BYTES 64

/* Card buffers an earlier stage exported for the next one: n_bufs buffers of
 * buf_bytes on CUDA device `device`, each with an event, as opaque handles. */
typedef struct wk_card {
    int device;
    int n_bufs;
    size_t buf_bytes;
    uint8_t mem[WK_CARD_MAX_BUFS][WK_CARD_HANDLE_BYTES];
    uint8_t ev[WK_CARD_MAX_BUFS][WK_CARD_HANDLE_BYTES];
} wk_card_t;

/* A stage on a card that is not the last: n_bufs (1..WK_CARD_MAX_BUFS) buffers of
 * n_batch rows of n_embd floats and their events, exported for another process of
 * this host into *out. Afterwards wk_model_stage may take x_out NULL (the rows stay
 * on the card), and wk_model_card_put copies them into a buffer. BL_ENOTSUP (the
 * CPU, the last stage, a build without CUDA), BL_EINVAL (n_bufs, exported already),
 * the runtime's errors (nothing is left exported). */
int wk_model_card_export(wk_model_t *m, int n_bufs, wk_card_t *out, bl_err_t *err) BL_WUR;
/* A stage on a card after the first: the previous stage's buffers opened here.
 * Afterwards wk_model_card_get fills the next step's input from one of them.
 * BL_ENOTSUP (the CPU, the first stage, the two cards cannot reach each other's
 * memory: err says which), BL_EINVAL (buffers smaller than n_batch rows, a count out
 * of range, opened already), the runtime's errors (nothing is left open). */
int wk_model_card_import(wk_model_t *m, const wk_card_t *in, bl_err_t *err) BL_WUR;
/* Frees what export (WK_CARD_OUT) or import (WK_CARD_IN) set up, or both (a stage
 * between two others may have both); the peer must be done with it (the exporter's
 * buffers outlive the importer's mappings). Also done by wk_model_free. */
#define WK_CARD_OUT 1
#define WK_CARD_IN 2
void wk_model_card_close(wk_model_t *m, int which);
/* After a wk_model_stage with x_out NULL: its n_rows output rows into exported buffer
 * k, ordered before the importer's wait on k (an event). BL_EINVAL (k, n_rows not
 * the last step's). */
int wk_model_card_put(wk_model_t *m, int k, int64_t n_rows, bl_err_t *err) BL_WUR;
/* Before a wk_model_stage with x_in NULL over n_rows rows: those rows from imported
 * buffer k, copied once the exporter's put of k is reached, in order before the
 * stage. BL_EINVAL (k, n_rows outside 1..n_batch). */
int wk_model_card_get(wk_model_t *m, int k, int64_t n_rows, bl_err_t *err) BL_WUR;
/* Returns once every wk_model_card_get so far has finished reading its buffer (the
 * exporter may then write it again). */
int wk_model_card_settle(wk_model_t *m, bl_err_t *err) BL_WUR;

/* The host memory at p (page-aligned, nbytes) that wk_model_stage's logits (or rows)
 * will be written into, pinned by a card's backend so that its copies go there
 * directly instead of through the driver's staging; a no-op for the CPU backend.
 * Kept until wk_model_free, which must come before p is unmapped. */
int wk_model_pin_host(wk_model_t *m, void *p, size_t nbytes, bl_err_t *err) BL_WUR;

/* --- placement for a program that runs the model in its own process --------------- */

/* This host's CUDA devices with their free memory (none in a build without CUDA or
 * where there is no GPU or driver; a context is made on each to read it). */
int wk_devices(bl_device_t *out, int cap, int *n, bl_err_t *err) BL_WUR;

/* Where the plan puts a model that a program runs in one stage of its own. */
typedef struct wk_place {
    int device;                      /* WK_DEVICE_CPU or a CUDA ordinal */
    int64_t n_layer;
    uint8_t host[BL_ARCH_MAX_LAYERS]; /* (n_layer): 1 where layer l's routed experts live
                                      * on the host (in RAM or paged from the file) */
    uint64_t experts_ram;            /* RAM for those experts: 0 holds them all; less
                                      * pages them from the file (hosttier/store.h) */
    int tier_device;                 /* the expert tier's card (CUDA ordinal; WK_DEVICE_CPU
                                      * for tests), where some tier[] is set */
    uint8_t tier[BL_ARCH_MAX_LAYERS]; /* (n_layer): 1 where layer l's routed experts are on
                                      * the expert tier */
} wk_place_t;

/* The placement plan (common/plan.c) for path under the flags o on this host's
 * devices, for a program that runs the model in one stage of its own (bloomery-cli,
 * bloomery-bench), with at most one expert tier beside it. The plan's lines go to
 * text (cap bytes). A plan of several stages or tiers is refused with BL_ENOTSUP (the
 * server runs those); the plan's own errors as bl_plan_build. */
int wk_place_one(const char *path, const bl_place_opts_t *o, wk_place_t *out, char *text, size_t cap,
                 bl_err_t *err) BL_WUR;

/* A model placed by wk_place_one in this process: m runs the stage; where the plan
 * puts routed experts on the host, ex holds them (the hosttier's expert store, with
 * m's threads: in RAM, or paged from the file past the budget), and where it puts
 * them on an expert tier, tier holds them (a model of its experts only on the tier's
 * card); m calls those for them, as a worker calls the hosttier and a tier. */
typedef struct wk_placed {
    wk_model_t *m;
    struct ht_store *ex;
    wk_model_t *tier;
    struct wk_placed_route *route; /* what the experts callback reads */
} wk_placed_t;

/* Loads path as wk_place_one placed it (pl NULL: every layer on opts->device, experts
 * with it), so that a program plans once and loads as often as it likes. opts->device
 * is set from pl and the experts fields here. Errors of wk_model_load and
 * ht_store_open. Caller frees with wk_placed_free (also after a failure). */
int wk_load_placed(wk_placed_t *out, const char *path, const wk_model_opts_t *opts, const wk_place_t *pl,
                   bl_err_t *err) BL_WUR;
void wk_placed_free(wk_placed_t *p);

#endif
