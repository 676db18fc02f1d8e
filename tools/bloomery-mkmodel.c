/* bloomery-mkmodel: writes deterministic synthetic GGUF models of the qwen3moe,
 * qwen3, glm4moe, deepseek2, gpt-oss, qwen3next and qwen35moe architectures (tensor
 * names, shapes and keys as llama.cpp's converter writes them and llama.cpp loads
 * them; deepseek2's multi-head latent attention in the MLA form of today's converter
 * or, with --legacy-kv-b, the older attn_kv_b form; gpt-oss's attention biases and
 * sinks, sliding-window layers, biased router and experts with biases, the experts
 * in MXFP4 as in OpenAI's release; qwen3next's and qwen35moe's gated DeltaNet layers
 * between gated full-attention ones, with a gated shared expert beside the routed
 * ones; --preset gives the real shapes of GLM-4.5, GLM-4.5-Air, DeepSeek-V3,
 * DeepSeek-V2-Lite, gpt-oss-20b, gpt-oss-120b, Qwen3-Next-80B-A3B or
 * Qwen3.5-35B-A3B), with
 * random zero-mean weights quantized by common/quant.c's reference quantizers, and
 * either a small built-in BPE vocabulary with the family's special tokens and chat
 * template (gpt-oss: the harmony format), or a Hugging Face tokenizer folder; with
 * --router-zipf, a qwen3moe router whose expert choices follow a Zipf law per
 * layer.
 * Same flags and seed give the same bytes on every machine. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "err.h"
#include "gguf_writer.h"
#include "mkmodel_vocab.h"
#include "quant.h"
#include "rng.h"

#define PROG "bloomery-mkmodel"
#define EXIT_USAGE 2
#define MAX_THREADS 64
#define ZIPF_CONST_CH 32 /* --router-zipf: channels of the constant (one q4_K sub-block) */

enum {
    ARCH_QWEN3MOE, ARCH_QWEN3, ARCH_GLM4MOE, ARCH_DEEPSEEK2, ARCH_GPTOSS, ARCH_QWEN3NEXT,
    ARCH_QWEN35MOE, ARCH_COUNT
};

/* qwen3next and qwen35moe: the hybrids of gated DeltaNet and gated attention layers. */
#define IS_HYBRID(arch) ((arch) == ARCH_QWEN3NEXT || (arch) == ARCH_QWEN35MOE)

/* Embedding rows of the real checkpoints, more than their tokenizers' ids: the
 * default --vocab with --tokenizer. */
#define QWEN3_VOCAB_ROWS 151936
#define GLM45_VOCAB_ROWS 151552
#define DSV3_VOCAB_ROWS 129280
#define GPTOSS_VOCAB_ROWS 201088
#define QWEN35_VOCAB_ROWS 248320

/* What an architecture's files carry besides its tensors: the pre-tokenizer name,
 * the built-in vocabulary's family and the --tokenizer default rows. */
typedef struct arch_info {
    const char *name;
    const char *pre;
    mk_family_t family;
    int64_t tok_rows;
} arch_info_t;

static const arch_info_t archs[ARCH_COUNT] = {
    [ARCH_QWEN3MOE] = {"qwen3moe", "qwen2", MK_FAMILY_QWEN, QWEN3_VOCAB_ROWS},
    [ARCH_QWEN3] = {"qwen3", "qwen2", MK_FAMILY_QWEN, QWEN3_VOCAB_ROWS},
    [ARCH_GLM4MOE] = {"glm4moe", "glm4", MK_FAMILY_GLM, GLM45_VOCAB_ROWS},
    [ARCH_DEEPSEEK2] = {"deepseek2", "deepseek-v3", MK_FAMILY_DEEPSEEK, DSV3_VOCAB_ROWS},
    [ARCH_GPTOSS] = {"gpt-oss", "gpt-4o", MK_FAMILY_HARMONY, GPTOSS_VOCAB_ROWS},
    [ARCH_QWEN3NEXT] = {"qwen3next", "qwen2", MK_FAMILY_QWEN, QWEN3_VOCAB_ROWS},
    [ARCH_QWEN35MOE] = {"qwen35moe", "qwen2", MK_FAMILY_QWEN35, QWEN35_VOCAB_ROWS},
};

/* The router of glm4moe and deepseek2: llama.cpp's expert_gating_func values. */
enum { GATING_SOFTMAX = 1, GATING_SIGMOID = 2 };

/* The shapes of a real model (--preset); every field stands in for its flag when
 * the flag is not given. glm4moe's rotated dims are not listed: both GLM-4.5
 * models rotate half of each head, the default. The deepseek2 fields (q_lora
 * onwards) are left 0 for glm4moe, which ignores them; n_swa is gpt-oss's alone
 * (which rotates whole heads and has no dense, shared or NextN layers, and no
 * expert_weights_scale unless --expert-scale asks for one); n_ff_shexp and the
 * ssm_* fields are qwen3next's and qwen35moe's (whose dense width n_ff is not
 * written, their layers having none). */
typedef struct preset {
    const char *name;
    const char *note; /* follows a value the preset chose, in messages */
    int arch;
    int64_t n_layer, n_nextn, n_embd, n_head, n_head_kv, head_dim, n_ff;
    int64_t n_expert, n_expert_used, n_shared, n_ff_exp, n_dense_lead, n_vocab, n_ctx;
    double expert_scale, rope_base, eps;
    int qk_norm, gating, no_expert_norm;
    int64_t n_q_lora, n_kv_lora, n_qk_nope, n_rot, n_v_head, n_group, n_group_used;
    double yarn, yarn_log_mul; /* yarn: the YaRN factor, 0 for none */
    int64_t yarn_orig_ctx;
    int no_probs_bias;
    int64_t n_swa; /* gpt-oss: the sliding window */
    int64_t n_ff_shexp, ssm_conv, ssm_state, ssm_groups, ssm_heads;
} preset_t;

static const preset_t presets[] = {
    {.name = "glm-4.5-air", .note = " (the glm-4.5-air preset's)", .arch = ARCH_GLM4MOE,
     .n_layer = 46, .n_nextn = 1, .n_embd = 4096, .n_head = 96, .n_head_kv = 8, .head_dim = 128,
     .n_ff = 10944, .n_expert = 128, .n_expert_used = 8, .n_shared = 1, .n_ff_exp = 1408,
     .n_dense_lead = 1, .n_vocab = GLM45_VOCAB_ROWS, .n_ctx = 131072, .expert_scale = 1.0,
     .rope_base = 1e6, .eps = 1e-5, .qk_norm = 0, .gating = GATING_SIGMOID},
    {.name = "glm-4.5", .note = " (the glm-4.5 preset's)", .arch = ARCH_GLM4MOE, .n_layer = 92,
     .n_nextn = 1, .n_embd = 5120, .n_head = 96, .n_head_kv = 8, .head_dim = 128, .n_ff = 12288,
     .n_expert = 160, .n_expert_used = 8, .n_shared = 1, .n_ff_exp = 1536, .n_dense_lead = 3,
     .n_vocab = GLM45_VOCAB_ROWS, .n_ctx = 131072, .expert_scale = 2.5, .rope_base = 1e6,
     .eps = 1e-5, .qk_norm = 1, .gating = GATING_SIGMOID},
    /* DeepSeek-V3 / R1 / V3.1 (671B); its MTP layer is not in converted files */
    {.name = "deepseek-v3", .note = " (the deepseek-v3 preset's)", .arch = ARCH_DEEPSEEK2,
     .n_layer = 61, .n_nextn = 0, .n_embd = 7168, .n_head = 128, .n_ff = 18432,
     .n_expert = 256, .n_expert_used = 8, .n_shared = 1, .n_ff_exp = 2048, .n_dense_lead = 3,
     .n_vocab = DSV3_VOCAB_ROWS, .n_ctx = 163840, .expert_scale = 2.5, .rope_base = 10000,
     .eps = 1e-6, .gating = GATING_SIGMOID, .no_expert_norm = 0, .n_q_lora = 1536,
     .n_kv_lora = 512, .n_qk_nope = 128, .n_rot = 64, .n_v_head = 128, .n_group = 8,
     .n_group_used = 4, .yarn = 40, .yarn_orig_ctx = 4096, .yarn_log_mul = 0.1,
     .no_probs_bias = 0},
    /* DeepSeek-V2-Lite (16B): no q compression, softmax routing, no selection bias */
    {.name = "deepseek-v2-lite", .note = " (the deepseek-v2-lite preset's)",
     .arch = ARCH_DEEPSEEK2, .n_layer = 27, .n_nextn = 0, .n_embd = 2048, .n_head = 16,
     .n_ff = 10944, .n_expert = 64, .n_expert_used = 6, .n_shared = 2, .n_ff_exp = 1408,
     .n_dense_lead = 1, .n_vocab = 102400, .n_ctx = 163840, .expert_scale = 1.0,
     .rope_base = 10000, .eps = 1e-6, .gating = GATING_SOFTMAX, .no_expert_norm = 1,
     .n_q_lora = 0, .n_kv_lora = 512, .n_qk_nope = 128, .n_rot = 64, .n_v_head = 128,
     .n_group = 1, .n_group_used = 1, .yarn = 40, .yarn_orig_ctx = 4096, .yarn_log_mul = 0.0707,
     .no_probs_bias = 1},
    /* gpt-oss-20b and gpt-oss-120b: alternating 128-token sliding and full layers */
    {.name = "gpt-oss-20b", .note = " (the gpt-oss-20b preset's)", .arch = ARCH_GPTOSS,
     .n_layer = 24, .n_embd = 2880, .n_head = 64, .n_head_kv = 8, .head_dim = 64, .n_ff = 2880,
     .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880, .n_vocab = GPTOSS_VOCAB_ROWS,
     .n_ctx = 131072, .rope_base = 150000, .eps = 1e-5, .yarn = 32, .yarn_orig_ctx = 4096,
     .n_swa = 128},
    {.name = "gpt-oss-120b", .note = " (the gpt-oss-120b preset's)", .arch = ARCH_GPTOSS,
     .n_layer = 36, .n_embd = 2880, .n_head = 64, .n_head_kv = 8, .head_dim = 64, .n_ff = 2880,
     .n_expert = 128, .n_expert_used = 4, .n_ff_exp = 2880, .n_vocab = GPTOSS_VOCAB_ROWS,
     .n_ctx = 131072, .rope_base = 150000, .eps = 1e-5, .yarn = 32, .yarn_orig_ctx = 4096,
     .n_swa = 128},
    /* Qwen3-Next-80B-A3B and Qwen3.5-35B-A3B (also Qwen3.6-35B-A3B): three DeltaNet
     * layers to one gated attention layer, a quarter of each head rotated */
    {.name = "qwen3-next-80b-a3b", .note = " (the qwen3-next-80b-a3b preset's)",
     .arch = ARCH_QWEN3NEXT, .n_layer = 48, .n_nextn = 0, .n_embd = 2048, .n_head = 16,
     .n_head_kv = 2, .head_dim = 256, .n_expert = 512, .n_expert_used = 10, .n_ff_exp = 512,
     .n_ff_shexp = 512, .n_vocab = QWEN3_VOCAB_ROWS, .n_ctx = 262144, .rope_base = 1e7,
     .eps = 1e-6, .n_rot = 64, .ssm_conv = 4, .ssm_state = 128, .ssm_groups = 16,
     .ssm_heads = 32},
    {.name = "qwen3.5-35b-a3b", .note = " (the qwen3.5-35b-a3b preset's)",
     .arch = ARCH_QWEN35MOE, .n_layer = 40, .n_nextn = 1, .n_embd = 2048, .n_head = 16,
     .n_head_kv = 2, .head_dim = 256, .n_expert = 256, .n_expert_used = 8, .n_ff_exp = 512,
     .n_ff_shexp = 512, .n_vocab = QWEN35_VOCAB_ROWS, .n_ctx = 262144, .rope_base = 1e7,
     .eps = 1e-6, .n_rot = 64, .ssm_conv = 4, .ssm_state = 128, .ssm_groups = 16,
     .ssm_heads = 32},
};

/* Everything the flags decide. The *_set fields remember which flags were given,
 * for the flags whose default depends on others or which only some archs take. */
typedef struct opts {
    const char *out;
    int arch;
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    int64_t n_expert, n_expert_used, n_ff_exp, n_ff;
    int64_t n_vocab, n_ctx;
    double rope_base, eps;
    uint64_t seed;
    bl_type_t type, type_attn_v, type_ffn_down, type_output, type_embd;
    const char *tok_dir;
    int tied;
    int header_only; /* --header-only: the tensor data a hole (a sparse file) */
    int bench_fill;  /* --bench-fill: quantized matrices repeat BENCH_POOL rows */
    int64_t n_threads;
    double router_zipf; /* Zipf exponent of the routing; 0: the random router */
    /* glm4moe and deepseek2: n_layer blocks run, then n_nextn NextN blocks; the
     * first n_dense_lead blocks have a dense FFN of n_ff, the others n_shared shared
     * experts besides the routed ones; RoPE turns the first n_rot dims of each head
     * (deepseek2: the n_rot dims after the n_qk_nope unrotated ones). */
    int64_t n_nextn, n_dense_lead, n_shared, n_rot;
    int qk_norm, no_expert_norm, gating;
    double expert_scale;
    /* deepseek2: q compressed to n_q_lora (0: not), keys and values to one latent of
     * n_kv_lora; heads of n_qk_nope + n_rot q/k dims and n_v_head value dims; the
     * router's n_group expert groups, of which the best n_group_used are chosen
     * from; YaRN by the factor yarn (0: none) */
    int64_t n_q_lora, n_kv_lora, n_qk_nope, n_v_head, n_group, n_group_used, yarn_orig_ctx;
    double yarn, yarn_log_mul;
    int legacy_kv_b, no_probs_bias;
    /* gpt-oss: sliding windows of n_swa keys in the layers i with i % swa_period <
     * swa_period - 1; the routed experts' type */
    int64_t n_swa, swa_period;
    bl_type_t type_experts;
    /* qwen3next and qwen35moe: the shared expert's width; the DeltaNet layers'
     * convolution taps (K), key dims a head (S, also the value dims), q/k heads
     * (Hk) and value heads (Hv, a multiple of Hk); every full_attn_interval-th
     * layer attends, unless recurrent_pat spells each layer's kind ('1' DeltaNet,
     * '0' attention); qwen35moe's IMRoPE sections, derived from n_rot */
    int64_t n_ff_shexp, ssm_conv, ssm_state, ssm_groups, ssm_heads, full_attn_interval;
    const char *recurrent_pat;
    int32_t rope_sections[4];
    const preset_t *preset;
    int vocab_set, ff_set, attn_v_set, ffn_down_set, output_set, embd_set, expert_scale_set;
} opts_t;

/* How a tensor's values are drawn. KIND_K_B and KIND_V_B: deepseek2's attn_k_b and
 * attn_v_b, the values of the attn_kv_b the legacy form of the same flags and seed
 * holds (k_b transposed per head, as llama.cpp's converter splits attn_kv_b), so
 * that both forms describe one model. KIND_SSM_A: the DeltaNet decay rates ssm_a,
 * -e^u with u uniform (see draw_ssm_a). */
enum { KIND_NORM, KIND_MAT, KIND_K_B, KIND_V_B, KIND_SSM_A };

/* What --router-zipf changes in a tensor after its draw (see "skewed router"). */
enum {
    ZR_NONE,
    ZR_EMBD,        /* token_embd: noise channels drawn Gumbel, constant channels set */
    ZR_HIDE,        /* attn_norm, output_norm: gains of the constant channels 0 */
    ZR_ROUTER_NORM, /* ffn_norm: gains of the noise and constant channels exactly 1 */
    ZR_READ,        /* ffn_gate_exps, ffn_up_exps: columns of the constant channels 0 */
    ZR_WRITE,       /* attn_output, ffn_down_exps: rows writing reserved channels 0 */
    ZR_ROUTER,      /* ffn_gate_inp: computed, not drawn */
};

typedef struct tdesc {
    char name[BL_GW_MAX_NAME + 1];
    int n_dims;
    int64_t ne[3];      /* ne[0] = row length */
    bl_type_t type;
    int kind;
    double std;         /* KIND_MAT: standard deviation of the values */
    double mean;        /* KIND_MAT: their mean (0 but for ssm_dt.bias) */
    const char *row_flag;  /* the flag(s) that set ne[0], for error messages */
    const char *type_flag; /* the flag that chose the type */
    int zrole;             /* ZR_*: what --router-zipf changes */
    int64_t layer;         /* the block, for ZR_ROUTER */
    /* KIND_K_B, KIND_V_B: the attn_kv_b whose rows are drawn, and the widths that
     * place a head's rows in it */
    char src[BL_GW_MAX_NAME + 1];
    int64_t qk_nope, v_head;
} tdesc_t;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: " PROG " -o FILE [options]\n"
        "\n"
        "Writes a synthetic GGUF model with random zero-mean weights; the same flags and\n"
        "seed give a byte-identical file on any machine.\n"
        "\n"
        "  -o, --output FILE      file to write (required)\n"
        "  --arch NAME            qwen3moe (default), qwen3 (dense), glm4moe (GLM-4.5:\n"
        "                         leading dense layers, then routed and shared experts;\n"
        "                         attention biases, partial RoPE, NextN layers),\n"
        "                         deepseek2 (DeepSeek-V2/V3/R1: multi-head latent\n"
        "                         attention, leading dense layers, routed experts in\n"
        "                         groups, shared experts, YaRN) or gpt-oss (OpenAI\n"
        "                         gpt-oss: attention biases and sinks, sliding-window\n"
        "                         and full layers in turn, routed experts with biases,\n"
        "                         MXFP4 experts, the harmony chat format), qwen3next\n"
        "                         (Qwen3-Next: gated DeltaNet layers between gated\n"
        "                         attention ones, partial RoPE, routed experts and a\n"
        "                         gated shared expert) or qwen35moe (Qwen3.5/3.6 MoE:\n"
        "                         as qwen3next, with separate beta and alpha\n"
        "                         projections, tiled DeltaNet heads, IMRoPE sections\n"
        "                         and NextN layers)\n"
        "  --preset NAME          a real model's shapes (implies its --arch); flags given\n"
        "                         as well override the preset's values, e.g. --layers 4\n"
        "                         --vocab 1024 for a cut-down file:\n"
        "                           glm-4.5-air  --layers 46 --nextn 1 --n-embd 4096\n"
        "                                        --heads 96 --kv-heads 8 --head-dim 128\n"
        "                                        --ff 10944 --experts 128 --experts-used 8\n"
        "                                        --shared-experts 1 --expert-ff 1408\n"
        "                                        --dense-lead 1 --expert-scale 1\n"
        "                           glm-4.5      --layers 92 --nextn 1 --n-embd 5120\n"
        "                                        --heads 96 --kv-heads 8 --head-dim 128\n"
        "                                        --ff 12288 --experts 160 --experts-used 8\n"
        "                                        --shared-experts 1 --expert-ff 1536\n"
        "                                        --dense-lead 3 --expert-scale 2.5 --qk-norm\n"
        "                         both: --vocab 151552 --ctx 131072 --rope-base 1e6\n"
        "                         --eps 1e-5, and the glm4moe defaults: --rope-dim 64\n"
        "                         (half of --head-dim), sigmoid gating, routed weights\n"
        "                         normalised\n"
        "                           deepseek-v3  (deepseek2; DeepSeek-V3/R1/V3.1 671B)\n"
        "                                        --layers 61 --n-embd 7168 --heads 128\n"
        "                                        --q-lora 1536 --ff 18432 --experts 256\n"
        "                                        --experts-used 8 --shared-experts 1\n"
        "                                        --expert-ff 2048 --dense-lead 3\n"
        "                                        --expert-scale 2.5 --gating sigmoid\n"
        "                                        --groups 8 --groups-used 4\n"
        "                                        --yarn-log-mul 0.1 --vocab 129280\n"
        "                           deepseek-v2-lite  (deepseek2; 16B) --layers 27\n"
        "                                        --n-embd 2048 --heads 16 --q-lora 0\n"
        "                                        --ff 10944 --experts 64 --experts-used 6\n"
        "                                        --shared-experts 2 --expert-ff 1408\n"
        "                                        --dense-lead 1 --gating softmax\n"
        "                                        --no-expert-norm --no-probs-bias\n"
        "                                        --yarn-log-mul 0.0707 --vocab 102400\n"
        "                         both: --kv-lora 512 --qk-nope 128 --rope-dim 64\n"
        "                         --v-head 128 --nextn 0 --yarn 40 --yarn-orig-ctx 4096\n"
        "                         --ctx 163840 --rope-base 10000 --eps 1e-6. The\n"
        "                         671B shape's MoE layers are 11G values each: cut\n"
        "                         --experts too for a small file\n"
        "                           gpt-oss-20b  (gpt-oss) --layers 24 --experts 32\n"
        "                           gpt-oss-120b (gpt-oss) --layers 36 --experts 128\n"
        "                         both: --n-embd 2880 --heads 64 --kv-heads 8\n"
        "                         --head-dim 64 --ff 2880 --expert-ff 2880\n"
        "                         --experts-used 4 --swa 128 --yarn 32 --yarn-orig-ctx\n"
        "                         4096 --vocab 201088 --ctx 131072 --rope-base 150000\n"
        "                         --eps 1e-5 (--type q8_0, --type-experts mxfp4: the\n"
        "                         20b file is about 12 GB)\n"
        "                           qwen3-next-80b-a3b  (qwen3next) --layers 48\n"
        "                                        --experts 512 --experts-used 10\n"
        "                                        --vocab 151936\n"
        "                           qwen3.5-35b-a3b  (qwen35moe; also Qwen3.6-35B-A3B)\n"
        "                                        --layers 40 --nextn 1 --experts 256\n"
        "                                        --experts-used 8 --vocab 248320\n"
        "                         both: --n-embd 2048 --heads 16 --kv-heads 2\n"
        "                         --head-dim 256 --rope-dim 64 --expert-ff 512\n"
        "                         --shared-ff 512 --ssm-conv 4 --ssm-state 128\n"
        "                         --ssm-groups 16 --ssm-heads 32\n"
        "                         --full-attention-interval 4 --ctx 262144\n"
        "                         --rope-base 1e7 --eps 1e-6\n"
        "  --layers N             blocks the forward pass runs (default 4)\n"
        "  --n-embd N             embedding width (default 256)\n"
        "  --heads N              attention heads (default 4)\n"
        "  --kv-heads N           key/value heads, dividing --heads (default 2; not\n"
        "                         deepseek2: its heads are --qk-nope, --rope-dim and\n"
        "                         --v-head wide, key and value per query head)\n"
        "  --head-dim N           width of one head, even (default 128, gpt-oss 64,\n"
        "                         qwen3next and qwen35moe 32; not deepseek2)\n"
        "  --experts N            routed experts per layer, all but qwen3 (default 8)\n"
        "  --experts-used N       experts chosen per token, all but qwen3 (default 2)\n"
        "  --expert-ff N          expert FFN width, all but qwen3 (default 256)\n"
        "  --ff N                 dense FFN width: the FFN of qwen3, of the leading dense\n"
        "                         layers of glm4moe and deepseek2, metadata only for\n"
        "                         qwen3moe and gpt-oss (default 3 x --n-embd; gpt-oss\n"
        "                         --expert-ff, as its converter writes); not qwen3next\n"
        "                         or qwen35moe, which have no dense FFN\n"
        "  --vocab N              tokens (rows of token_embd). Built-in vocabulary: default\n"
        "                         1024, at least %d (glm4moe %d, deepseek2 %d, gpt-oss\n"
        "                         %d); rows past the tokens it learns are unused\n"
        "                         padding. With --tokenizer: default the larger of the\n"
        "                         tokenizer's size and the real checkpoints' embedding\n"
        "                         rows (Qwen3 and Qwen3-Next %d, GLM-4.5 %d,\n"
        "                         DeepSeek-V3 %d, gpt-oss %d, Qwen3.5 %d; a\n"
        "                         preset's --vocab)\n"
        "  --ctx N                context_length (default 4096)\n"
        "  --rope-base X          RoPE frequency base (default 1000000; deepseek2 10000,\n"
        "                         gpt-oss 150000, qwen3next and qwen35moe 10000000)\n"
        "  --eps X                RMS norm epsilon (default 1e-6; gpt-oss 1e-5)\n"
        "  --seed N               weight seed, decimal or 0x hex (default 1)\n"
        "  --type T               matrix type: f32, f16, bf16, q8_0, q4_K, q5_K, q6_K\n"
        "                         (default q4_K; gpt-oss q8_0, and its routed experts\n"
        "                         take --type-experts). Norms, biases, attention sinks\n"
        "                         and the router are always f32. glm4moe, deepseek2 and\n"
        "                         gpt-oss store a K-quant matrix whose rows are not\n"
        "                         whole 256-value blocks (GLM-4.5-Air's widths 1408 and\n"
        "                         10944, deepseek2's attn_k_b rows of --qk-nope,\n"
        "                         gpt-oss's 2880) as q8_0, as llama.cpp's quantizer\n"
        "                         falls back; so do qwen3next and qwen35moe (their\n"
        "                         tiny defaults' ssm_out and attn_output rows of 64\n"
        "                         and 128). Their ssm_conv1d, ssm_dt, ssm_a and\n"
        "                         shared expert gate are f32\n"
        "  --type-attn-v T        attn_v type, and deepseek2's attn_v_b or attn_kv_b\n"
        "                         (default q6_K when --type is q4_K or q5_K, else --type)\n"
        "  --type-ffn-down T      ffn_down / ffn_down_exps / ffn_down_shexp type (default\n"
        "                         as --type-attn-v; gpt-oss: --type-experts)\n"
        "  --type-output T        output.weight type, and the NextN layers'\n"
        "                         nextn.shared_head_head (default as --type-attn-v)\n"
        "  --type-embd T          token_embd type, and the NextN layers'\n"
        "                         nextn.embed_tokens (default --type)\n"
        "  --tokenizer DIR        take the vocabulary, merges, special tokens and chat\n"
        "                         template from DIR/tokenizer.json and\n"
        "                         DIR/tokenizer_config.json (a Qwen3 or, with glm4moe, a\n"
        "                         GLM-4.5, with deepseek2 a DeepSeek-V3, with gpt-oss a\n"
        "                         gpt-oss tokenizer); the pre-tokenizer is recorded as\n"
        "                         qwen2 (also qwen3next and qwen35moe), glm4 for\n"
        "                         glm4moe, deepseek-v3 for deepseek2, gpt-4o for\n"
        "                         gpt-oss (whose eom is then <|call|>)\n"
        "  --tied                 no output.weight: the head reuses token_embd (not\n"
        "                         gpt-oss, whose files always carry output.weight)\n"
        "  --header-only          write the metadata and the tensor table and leave the\n"
        "                         weights a hole of zeros (a sparse file of the full\n"
        "                         size, no disk blocks, written in a moment): for\n"
        "                         bloomery-serve --dry-run and the placement plan, not\n"
        "                         for running (every weight is 0)\n"
        "  --bench-fill           quantize 256 random rows of each quantized matrix and\n"
        "                         fill its other rows with copies of them in a random\n"
        "                         order (norms and routers stay whole): the shapes,\n"
        "                         types and routing of a real file, written at about\n"
        "                         the disk's speed, for speed measurements; its answers\n"
        "                         mean nothing\n"
        "  --threads N            threads quantizing weights (default: online CPUs, at\n"
        "                         most %d); the file does not depend on it\n"
        "  --router-zipf S        qwen3moe: route each token to k experts drawn without\n"
        "                         replacement with weights 1/rank^S over a random ranking\n"
        "                         of each layer's experts, S in 0..4 (default 0: the\n"
        "                         random router). Needs --n-embd >= 2 x (--experts + %d)\n"
        "\n"
        "glm4moe and deepseek2 (also qwen35moe: --nextn, --rope-dim; qwen3next:\n"
        "--rope-dim):\n"
        "  --nextn N              NextN (multi-token prediction) layers appended after\n"
        "                         --layers, 0..4 (default 1; deepseek2 0): block_count is\n"
        "                         their sum. Each is a MoE layer plus its nextn.* tensors\n"
        "                         (qwen35moe: a gated attention layer, and no\n"
        "                         embed_tokens or shared_head_head of its own)\n"
        "  --dense-lead N         leading layers with a dense FFN of --ff, less than\n"
        "                         --layers (default 1)\n"
        "  --shared-experts N     shared experts, each as wide as --expert-ff, run for\n"
        "                         every token beside the routed ones (default 1; 0: none)\n"
        "  --rope-dim N           dims of each head RoPE rotates, even: glm4moe\n"
        "                         2..--head-dim (default --head-dim / 2); qwen3next and\n"
        "                         qwen35moe 2..--head-dim (default --head-dim / 4);\n"
        "                         deepseek2 the rotated part after --qk-nope (default 16)\n"
        "  --expert-scale X       factor on the routed experts' weights (default 1). gpt-oss\n"
        "                         writes expert_weights_scale only when this is given, a\n"
        "                         key llama.cpp and bloomery do not read for gpt-oss\n"
        "  --gating G             the router's scores: sigmoid (default) or softmax\n"
        "  --no-expert-norm       leave the chosen experts' weights undivided by their sum\n"
        "\n"
        "glm4moe only:\n"
        "  --qk-norm              per-head RMS norms of q and k (GLM-4.5 has them,\n"
        "                         GLM-4.5-Air not; default off)\n"
        "\n"
        "deepseek2 only (a q/k head is --qk-nope + --rope-dim wide, a value head --v-head):\n"
        "  --q-lora N             rank q is compressed to: attn_q_a, attn_q_a_norm,\n"
        "                         attn_q_b (default 64; 0: no compression, attn_q)\n"
        "  --kv-lora N            rank of the latent keys and values are made from\n"
        "                         (default 64)\n"
        "  --qk-nope N            unrotated dims of each q/k head (default 32)\n"
        "  --v-head N             dims of each value head (default 32)\n"
        "  --legacy-kv-b          the older file form: one attn_kv_b per layer,\n"
        "                         key_length/value_length the head widths, head_count_kv\n"
        "                         --heads, no *_mla keys. Default: today's MLA form,\n"
        "                         attn_k_b and attn_v_b (the same values, split),\n"
        "                         key_length --kv-lora + --rope-dim, value_length\n"
        "                         --kv-lora, key_length_mla, value_length_mla,\n"
        "                         head_count_kv 1\n"
        "  --groups N             expert groups, dividing --experts (default 1)\n"
        "  --groups-used N        groups the routed experts are chosen from, at most\n"
        "                         --groups (default 1)\n"
        "  --no-probs-bias        no exp_probs_b selection bias (written by default with\n"
        "                         sigmoid gating; never with softmax)\n"
        "  --yarn F               YaRN context extension by F > 1: rope.scaling.type yarn\n"
        "                         and its factor (default none; 0: none); also gpt-oss,\n"
        "                         with no log multiplier\n"
        "  --yarn-orig-ctx N      rope.scaling.original_context_length, with --yarn\n"
        "                         (default 4096); also gpt-oss\n"
        "  --yarn-log-mul X       rope.scaling.yarn_log_multiplier as stored (0.1 x\n"
        "                         mscale_all_dim, as the converter writes it), with --yarn\n"
        "                         (default 0.1)\n"
        "\n"
        "gpt-oss only (also --expert-scale, --yarn and --yarn-orig-ctx above):\n"
        "  --swa N                the sliding window: a sliding layer's query sees the N\n"
        "                         latest keys, its own included (default 4, so that a\n"
        "                         short prompt crosses it; the presets 128)\n"
        "  --swa-period P         layer i slides when i %% P < P - 1, the others attend\n"
        "                         to everything (default 2: even layers slide; written\n"
        "                         as attention.sliding_window_pattern when not 2; 1:\n"
        "                         no sliding layer)\n"
        "  --type-experts T       the routed experts' type: mxfp4 (default, as OpenAI\n"
        "                         ships them), f32, f16, bf16 or q8_0; ffn_down_exps\n"
        "                         too unless --type-ffn-down is given\n"
        "\n"
        "qwen3next and qwen35moe only (see also --rope-dim above, and --nextn for\n"
        "qwen35moe). A DeltaNet layer convolves 2 x --ssm-groups q/k heads and\n"
        "--ssm-heads value heads of --ssm-state values each; qwen35moe's\n"
        "rope.dimension_sections split the --rope-dim / 2 rotated pairs over the three\n"
        "text sections, the first ones taking the remainder ([11, 11, 10, 0] for 64):\n"
        "  --shared-ff N          the shared expert's width (default --expert-ff)\n"
        "  --ssm-conv K           convolution taps, 2..64 (default 4)\n"
        "  --ssm-state S          key (and value) dims of a DeltaNet head (default 16)\n"
        "  --ssm-groups N         q/k heads of a DeltaNet layer (default 2)\n"
        "  --ssm-heads N          value heads, a multiple of --ssm-groups (default 4)\n"
        "  --full-attention-interval N\n"
        "                         layer i is a gated attention layer when (i + 1) %% N\n"
        "                         is 0, a DeltaNet layer otherwise (default 4; 1: no\n"
        "                         DeltaNet layer)\n"
        "  --recurrent-layers P   each layer's kind instead, one character a layer of\n"
        "                         --layers: 1 DeltaNet, 0 attention (e.g. 1101),\n"
        "                         written as attention.recurrent_layers instead of\n"
        "                         full_attention_interval (llama.cpp reads only the\n"
        "                         latter)\n"
        "  -h, --help             this text\n"
        "\n"
        "Exit status: 0 written, 1 a file could not be read or written, 2 bad flags.\n",
        MK_VOCAB_BUILTIN_MIN, MK_VOCAB_BUILTIN_MIN_GLM, MK_VOCAB_BUILTIN_MIN_DEEPSEEK,
        MK_VOCAB_BUILTIN_MIN_HARMONY, QWEN3_VOCAB_ROWS, GLM45_VOCAB_ROWS, DSV3_VOCAB_ROWS,
        GPTOSS_VOCAB_ROWS, QWEN35_VOCAB_ROWS, MAX_THREADS, ZIPF_CONST_CH);
}

static int flag_error(const char *fmt, ...) BL_PRINTF(1, 2);

/* Prints one line naming the flag at fault and returns the usage exit status. */
static int flag_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(PROG ": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see --help)\n", stderr);
    va_end(ap);
    return EXIT_USAGE;
}

/* The weight types this tool writes (the ones common/quant.c can quantize to). */
static int parse_type(void *ud, const char *arg, bl_err_t *err)
{
    static const bl_type_t ok[] = {BL_TYPE_F32, BL_TYPE_F16, BL_TYPE_BF16, BL_TYPE_Q8_0,
                                   BL_TYPE_Q4_K, BL_TYPE_Q5_K, BL_TYPE_Q6_K};
    bl_type_t t;
    if (bl_type_from_name(arg, &t) == 0)
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
            if (ok[i] == t) {
                *(bl_type_t *)ud = t;
                return 0;
            }
    return bl_err_set(err, BL_EINVAL, "'%.32s' is not one of f32, f16, bf16, q8_0, q4_K, q5_K, q6_K",
                      arg);
}

/* gpt-oss's routed experts: MXFP4 as released, or a plain type to compare with. */
static int parse_type_experts(void *ud, const char *arg, bl_err_t *err)
{
    static const bl_type_t ok[] = {BL_TYPE_MXFP4, BL_TYPE_F32, BL_TYPE_F16, BL_TYPE_BF16,
                                   BL_TYPE_Q8_0};
    bl_type_t t;
    if (bl_type_from_name(arg, &t) == 0)
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
            if (ok[i] == t) {
                *(bl_type_t *)ud = t;
                return 0;
            }
    return bl_err_set(err, BL_EINVAL, "'%.32s' is not one of mxfp4, f32, f16, bf16, q8_0", arg);
}

static int parse_arch(void *ud, const char *arg, bl_err_t *err)
{
    for (int a = 0; a < ARCH_COUNT; a++)
        if (strcmp(arg, archs[a].name) == 0) {
            *(int *)ud = a;
            return 0;
        }
    return bl_err_set(err, BL_EINVAL,
                      "'%.32s' is not qwen3moe, qwen3, glm4moe, deepseek2, gpt-oss, qwen3next or "
                      "qwen35moe", arg);
}

static int parse_preset(void *ud, const char *arg, bl_err_t *err)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(arg, presets[i].name) == 0) {
            *(const preset_t **)ud = &presets[i];
            return 0;
        }
    return bl_err_set(err, BL_EINVAL,
                      "'%.32s' is not glm-4.5-air, glm-4.5, deepseek-v3, deepseek-v2-lite, "
                      "gpt-oss-20b, gpt-oss-120b, qwen3-next-80b-a3b or qwen3.5-35b-a3b", arg);
}

static int parse_gating(void *ud, const char *arg, bl_err_t *err)
{
    if (strcmp(arg, "sigmoid") == 0)
        *(int *)ud = GATING_SIGMOID;
    else if (strcmp(arg, "softmax") == 0)
        *(int *)ud = GATING_SOFTMAX;
    else
        return bl_err_set(err, BL_EINVAL, "'%.32s' is not sigmoid or softmax", arg);
    return 0;
}

/* A seed: any unsigned 64-bit value, decimal or 0x hex; a sign is a mistake. */
static int parse_seed(void *ud, const char *arg, bl_err_t *err)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 0);
    if (errno || end == arg || *end || arg[0] == '-' || arg[0] == '+')
        return bl_err_set(err, BL_EINVAL, "'%.32s' is not an unsigned 64-bit integer", arg);
    *(uint64_t *)ud = v;
    return 0;
}

/* Indices into parse_args' table, for the flags whose presence matters. */
enum {
    A_OUTPUT, A_ARCH, A_PRESET, A_LAYERS, A_N_EMBD, A_HEADS, A_KV_HEADS, A_HEAD_DIM,
    A_EXPERTS, A_EXPERTS_USED, A_EXPERT_FF, A_FF, A_VOCAB, A_CTX, A_ROPE_BASE, A_EPS, A_SEED,
    A_TYPE, A_TYPE_ATTN_V, A_TYPE_FFN_DOWN, A_TYPE_OUTPUT, A_TYPE_EMBD, A_TOKENIZER, A_TIED,
    A_THREADS, A_ROUTER_ZIPF, A_HEADER_ONLY, A_BENCH_FILL,
    /* glm4moe and deepseek2 */
    A_NEXTN, A_DENSE_LEAD, A_SHARED, A_ROPE_DIM, A_EXPERT_SCALE, A_GATING, A_NO_EXPERT_NORM,
    /* glm4moe only */
    A_QK_NORM,
    /* deepseek2 only */
    A_Q_LORA, A_KV_LORA, A_QK_NOPE, A_V_HEAD, A_LEGACY_KV_B, A_GROUPS, A_GROUPS_USED,
    A_NO_PROBS_BIAS, A_YARN, A_YARN_ORIG_CTX, A_YARN_LOG_MUL,
    /* gpt-oss only */
    A_SWA, A_SWA_PERIOD, A_TYPE_EXPERTS,
    /* qwen3next and qwen35moe only */
    A_SHARED_FF, A_SSM_CONV, A_SSM_STATE, A_SSM_GROUPS, A_SSM_HEADS, A_FULL_ATTN_INTERVAL,
    A_RECURRENT_LAYERS,
    A_COUNT
};

/* The architectures each flag applies to (a set of 1 << ARCH_*; 0: all); a flag
 * given for another is refused, the first such in this order named. */
#define F_QWEN3MOE (1u << ARCH_QWEN3MOE)
#define F_QWEN3 (1u << ARCH_QWEN3)
#define F_GLM4MOE (1u << ARCH_GLM4MOE)
#define F_DEEPSEEK2 (1u << ARCH_DEEPSEEK2)
#define F_GPTOSS (1u << ARCH_GPTOSS)
#define F_QWEN3NEXT (1u << ARCH_QWEN3NEXT)
#define F_QWEN35MOE (1u << ARCH_QWEN35MOE)
#define F_HYBRID (F_QWEN3NEXT | F_QWEN35MOE)
#define F_MOE (F_QWEN3MOE | F_GLM4MOE | F_DEEPSEEK2 | F_GPTOSS | F_HYBRID)
#define F_GQA (F_QWEN3MOE | F_QWEN3 | F_GLM4MOE | F_GPTOSS | F_HYBRID)
static const unsigned flag_archs[A_COUNT] = {
    [A_KV_HEADS] = F_GQA, [A_HEAD_DIM] = F_GQA,
    [A_EXPERTS] = F_MOE, [A_EXPERTS_USED] = F_MOE, [A_EXPERT_FF] = F_MOE,
    /* the hybrids have no dense FFN, hence no feed_forward_length */
    [A_FF] = F_QWEN3MOE | F_QWEN3 | F_GLM4MOE | F_DEEPSEEK2 | F_GPTOSS,
    /* the skewed router's channels assume qwen3moe's blocks: nothing but the
     * attention and the routed experts writes the residual */
    [A_ROUTER_ZIPF] = F_QWEN3MOE,
    [A_NEXTN] = F_GLM4MOE | F_DEEPSEEK2 | F_QWEN35MOE, [A_DENSE_LEAD] = F_GLM4MOE | F_DEEPSEEK2,
    [A_SHARED] = F_GLM4MOE | F_DEEPSEEK2, [A_ROPE_DIM] = F_GLM4MOE | F_DEEPSEEK2 | F_HYBRID,
    [A_EXPERT_SCALE] = F_GLM4MOE | F_DEEPSEEK2 | F_GPTOSS, [A_GATING] = F_GLM4MOE | F_DEEPSEEK2,
    [A_NO_EXPERT_NORM] = F_GLM4MOE | F_DEEPSEEK2,
    [A_QK_NORM] = F_GLM4MOE,
    [A_Q_LORA] = F_DEEPSEEK2, [A_KV_LORA] = F_DEEPSEEK2, [A_QK_NOPE] = F_DEEPSEEK2,
    [A_V_HEAD] = F_DEEPSEEK2, [A_LEGACY_KV_B] = F_DEEPSEEK2, [A_GROUPS] = F_DEEPSEEK2,
    [A_GROUPS_USED] = F_DEEPSEEK2, [A_NO_PROBS_BIAS] = F_DEEPSEEK2,
    [A_YARN] = F_DEEPSEEK2 | F_GPTOSS, [A_YARN_ORIG_CTX] = F_DEEPSEEK2 | F_GPTOSS,
    [A_YARN_LOG_MUL] = F_DEEPSEEK2,
    [A_SWA] = F_GPTOSS, [A_SWA_PERIOD] = F_GPTOSS, [A_TYPE_EXPERTS] = F_GPTOSS,
    [A_SHARED_FF] = F_HYBRID, [A_SSM_CONV] = F_HYBRID, [A_SSM_STATE] = F_HYBRID,
    [A_SSM_GROUPS] = F_HYBRID, [A_SSM_HEADS] = F_HYBRID, [A_FULL_ATTN_INTERVAL] = F_HYBRID,
    [A_RECURRENT_LAYERS] = F_HYBRID,
};

/* "--flag applies to --arch a, b and c only" for a flag of set m. */
static int arch_error(const char *flag, unsigned m)
{
    char list[128] = "";
    int n = 0, k = 0;
    for (int a = 0; a < ARCH_COUNT; a++)
        n += (m >> a) & 1;
    for (int a = 0; a < ARCH_COUNT; a++)
        if ((m >> a) & 1) {
            k++;
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                     k == 1 ? "" : k == n ? " and " : ", ", archs[a].name);
        }
    return flag_error("%s applies to --arch %s only", flag, list);
}

/* Takes the preset's value for every flag not given. */
static void apply_preset(opts_t *o, const bl_arg_t *args)
{
    const preset_t *p = o->preset;
#define P(a, field)                 \
    do {                            \
        if (!args[a].seen)          \
            o->field = p->field;    \
    } while (0)
    P(A_LAYERS, n_layer);
    P(A_NEXTN, n_nextn);
    P(A_N_EMBD, n_embd);
    P(A_HEADS, n_head);
    P(A_KV_HEADS, n_head_kv);
    P(A_HEAD_DIM, head_dim);
    P(A_FF, n_ff);
    P(A_EXPERTS, n_expert);
    P(A_EXPERTS_USED, n_expert_used);
    P(A_SHARED, n_shared);
    P(A_EXPERT_FF, n_ff_exp);
    P(A_DENSE_LEAD, n_dense_lead);
    P(A_VOCAB, n_vocab);
    P(A_CTX, n_ctx);
    P(A_EXPERT_SCALE, expert_scale);
    P(A_ROPE_BASE, rope_base);
    P(A_EPS, eps);
    P(A_QK_NORM, qk_norm);
    P(A_GATING, gating);
    P(A_NO_EXPERT_NORM, no_expert_norm);
    P(A_ROPE_DIM, n_rot);
    P(A_Q_LORA, n_q_lora);
    P(A_KV_LORA, n_kv_lora);
    P(A_QK_NOPE, n_qk_nope);
    P(A_V_HEAD, n_v_head);
    P(A_GROUPS, n_group);
    P(A_GROUPS_USED, n_group_used);
    P(A_NO_PROBS_BIAS, no_probs_bias);
    P(A_YARN, yarn);
    P(A_YARN_ORIG_CTX, yarn_orig_ctx);
    P(A_YARN_LOG_MUL, yarn_log_mul);
    P(A_SWA, n_swa);
    P(A_SHARED_FF, n_ff_shexp);
    P(A_SSM_CONV, ssm_conv);
    P(A_SSM_STATE, ssm_state);
    P(A_SSM_GROUPS, ssm_groups);
    P(A_SSM_HEADS, ssm_heads);
#undef P
}

/* The YaRN flags of deepseek2 and gpt-oss. */
static int check_yarn(const opts_t *o, const bl_arg_t *args)
{
    if (o->yarn != 0 && o->yarn <= 1)
        return flag_error("--yarn %g: give a factor above 1, or 0 for none", o->yarn);
    if (o->yarn == 0 && (args[A_YARN_ORIG_CTX].seen || args[A_YARN_LOG_MUL].seen))
        return flag_error("%s applies with --yarn only",
                          args[A_YARN_ORIG_CTX].seen ? "--yarn-orig-ctx" : "--yarn-log-mul");
    return 0;
}

/* The deepseek2 rules (the shared MoE ones are checked before). */
static int check_deepseek2(opts_t *o, const bl_arg_t *args)
{
#define BY_PRESET(a) (o->preset && !args[a].seen ? o->preset->note : "")
    if (o->n_rot % 2)
        return flag_error("--rope-dim %lld%s is odd; RoPE rotates pairs", (long long)o->n_rot,
                          BY_PRESET(A_ROPE_DIM));
    if (o->n_expert % o->n_group)
        return flag_error("--groups %lld%s does not divide --experts %lld%s",
                          (long long)o->n_group, BY_PRESET(A_GROUPS), (long long)o->n_expert,
                          BY_PRESET(A_EXPERTS));
    if (o->n_group_used > o->n_group)
        return flag_error("--groups-used %lld%s is more than --groups %lld%s",
                          (long long)o->n_group_used, BY_PRESET(A_GROUPS_USED),
                          (long long)o->n_group, BY_PRESET(A_GROUPS));
    /* a group's score is the sum of its two best experts' */
    const int64_t per_group = o->n_expert / o->n_group;
    if (o->n_group > 1 && per_group < 2)
        return flag_error("--groups %lld%s leaves groups of one expert; a group's score sums "
                          "its best two", (long long)o->n_group, BY_PRESET(A_GROUPS));
    if (o->n_expert_used > o->n_group_used * per_group)
        return flag_error("--experts-used %lld%s is more than the %lld experts of --groups-used "
                          "%lld%s groups of %lld", (long long)o->n_expert_used,
                          BY_PRESET(A_EXPERTS_USED), (long long)(o->n_group_used * per_group),
                          (long long)o->n_group_used, BY_PRESET(A_GROUPS_USED),
                          (long long)per_group);
#undef BY_PRESET
    return check_yarn(o, args);
}

/* The qwen3next and qwen35moe rules (the shared MoE ones are checked before); sets
 * the default --rope-dim and qwen35moe's RoPE sections. */
static int check_hybrid(opts_t *o, const bl_arg_t *args)
{
#define BY_PRESET(a) (o->preset && !args[a].seen ? o->preset->note : "")
    if (o->n_layer + o->n_nextn > 4096)
        return flag_error("--layers %lld%s and --nextn %lld%s make more than 4096 blocks",
                          (long long)o->n_layer, BY_PRESET(A_LAYERS), (long long)o->n_nextn,
                          BY_PRESET(A_NEXTN));
    if (o->ssm_heads % o->ssm_groups)
        return flag_error("--ssm-heads %lld%s is not a multiple of --ssm-groups %lld%s",
                          (long long)o->ssm_heads, BY_PRESET(A_SSM_HEADS),
                          (long long)o->ssm_groups, BY_PRESET(A_SSM_GROUPS));
    /* the real models rotate a quarter of each head (64 of 256); NEOX pairs dim i
     * with i + n_rot/2 */
    if (!args[A_ROPE_DIM].seen && !o->preset) {
        o->n_rot = o->head_dim / 4;
        if (o->n_rot % 2 || o->n_rot == 0)
            return flag_error("--head-dim %lld: a quarter of it, the default --rope-dim, is not "
                              "an even count of 2 or more; give --rope-dim", (long long)o->head_dim);
    }
    if (o->n_rot % 2 || o->n_rot > o->head_dim)
        return flag_error("--rope-dim %lld%s is not an even count of 2..--head-dim %lld%s",
                          (long long)o->n_rot, BY_PRESET(A_ROPE_DIM), (long long)o->head_dim,
                          BY_PRESET(A_HEAD_DIM));
    if (o->recurrent_pat) {
        const size_t n = strlen(o->recurrent_pat);
        if (args[A_FULL_ATTN_INTERVAL].seen)
            return flag_error("give --recurrent-layers or --full-attention-interval, not both");
        if (n != (size_t)o->n_layer)
            return flag_error("--recurrent-layers has %zu characters, not one for each of "
                              "--layers %lld%s", n, (long long)o->n_layer, BY_PRESET(A_LAYERS));
        for (size_t i = 0; i < n; i++)
            if (o->recurrent_pat[i] != '0' && o->recurrent_pat[i] != '1')
                return flag_error("--recurrent-layers: character %zu is not 1 (DeltaNet) or 0 "
                                  "(attention)", i + 1);
    }
    /* IMRoPE gives rotated pair p to section p % 3 while p < 3 x that section's
     * width: the n_rot / 2 pairs split as evenly as they go, the first sections
     * taking the remainder, cover every pair (for text all sections turn by the
     * token's position, the fourth, images' only, is empty) */
    const int64_t pairs = o->n_rot / 2;
    for (int k = 0; k < 3; k++)
        o->rope_sections[k] = (int32_t)((pairs + 2 - k) / 3);
    o->rope_sections[3] = 0;
#undef BY_PRESET
    return 0;
}

/* Parses argv into o. Returns 0, -1 after --help (exit 0), or EXIT_USAGE. */
static int parse_args(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){
        .arch = ARCH_QWEN3MOE, .n_layer = 4, .n_embd = 256, .n_head = 4, .n_head_kv = 2,
        .head_dim = 128, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256, .n_vocab = 1024,
        .n_ctx = 4096, .rope_base = 1e6, .eps = 1e-6, .seed = 1, .type = BL_TYPE_Q4_K,
        .n_nextn = 1, .n_dense_lead = 1, .n_shared = 1, .gating = GATING_SIGMOID,
        .expert_scale = 1.0,
        .n_q_lora = 64, .n_kv_lora = 64, .n_qk_nope = 32, .n_v_head = 32, .n_group = 1,
        .n_group_used = 1, .yarn_orig_ctx = 4096, .yarn_log_mul = 0.1,
        .n_swa = 4, .swa_period = 2, .type_experts = BL_TYPE_MXFP4,
        .ssm_conv = 4, .ssm_state = 16, .ssm_groups = 2, .ssm_heads = 4, .full_attn_interval = 4,
    };
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->n_threads = ncpu < 1 ? 1 : ncpu > MAX_THREADS ? MAX_THREADS : ncpu;
    const int64_t big = 1 << 20;
    bl_arg_t args[A_COUNT] = {
        [A_OUTPUT] = {"-o,--output", NULL, BL_ARG_STR, &o->out},
        [A_ARCH] = {"--arch", NULL, BL_ARG_FN, NULL, .fn = parse_arch, .ud = &o->arch},
        [A_PRESET] = {"--preset", NULL, BL_ARG_FN, NULL, .fn = parse_preset, .ud = &o->preset},
        [A_LAYERS] = {"--layers", NULL, BL_ARG_I64, &o->n_layer, 1, 4096},
        [A_N_EMBD] = {"--n-embd", NULL, BL_ARG_I64, &o->n_embd, 1, 1 << 16},
        [A_HEADS] = {"--heads", NULL, BL_ARG_I64, &o->n_head, 1, 4096},
        [A_KV_HEADS] = {"--kv-heads", NULL, BL_ARG_I64, &o->n_head_kv, 1, 4096},
        [A_HEAD_DIM] = {"--head-dim", NULL, BL_ARG_I64, &o->head_dim, 2, 4096},
        [A_EXPERTS] = {"--experts", NULL, BL_ARG_I64, &o->n_expert, 1, 4096},
        [A_EXPERTS_USED] = {"--experts-used", NULL, BL_ARG_I64, &o->n_expert_used, 1, 4096},
        [A_EXPERT_FF] = {"--expert-ff", NULL, BL_ARG_I64, &o->n_ff_exp, 1, big},
        [A_FF] = {"--ff", NULL, BL_ARG_I64, &o->n_ff, 1, big},
        [A_VOCAB] = {"--vocab", NULL, BL_ARG_I64, &o->n_vocab, 1, 1 << 24},
        [A_CTX] = {"--ctx", NULL, BL_ARG_I64, &o->n_ctx, 1, UINT32_MAX},
        [A_ROPE_BASE] = {"--rope-base", NULL, BL_ARG_F64, &o->rope_base, .fmin = 1e-3, .fmax = 1e12},
        [A_EPS] = {"--eps", NULL, BL_ARG_F64, &o->eps, .fmin = 1e-12, .fmax = 1e-1},
        [A_SEED] = {"--seed", NULL, BL_ARG_FN, NULL, .fn = parse_seed, .ud = &o->seed},
        [A_TYPE] = {"--type", NULL, BL_ARG_FN, NULL, .fn = parse_type, .ud = &o->type},
        [A_TYPE_ATTN_V] = {"--type-attn-v", NULL, BL_ARG_FN, NULL, .fn = parse_type, .ud = &o->type_attn_v},
        [A_TYPE_FFN_DOWN] = {"--type-ffn-down", NULL, BL_ARG_FN, NULL, .fn = parse_type, .ud = &o->type_ffn_down},
        [A_TYPE_OUTPUT] = {"--type-output", NULL, BL_ARG_FN, NULL, .fn = parse_type, .ud = &o->type_output},
        [A_TYPE_EMBD] = {"--type-embd", NULL, BL_ARG_FN, NULL, .fn = parse_type, .ud = &o->type_embd},
        [A_TOKENIZER] = {"--tokenizer", NULL, BL_ARG_STR, &o->tok_dir},
        [A_TIED] = {"--tied", NULL, BL_ARG_FLAG, &o->tied},
        [A_THREADS] = {"--threads", NULL, BL_ARG_I64, &o->n_threads, 1, MAX_THREADS},
        [A_ROUTER_ZIPF] = {"--router-zipf", NULL, BL_ARG_F64, &o->router_zipf, .fmin = 0,
                           .fmax = 4},
        [A_HEADER_ONLY] = {"--header-only", NULL, BL_ARG_FLAG, &o->header_only},
        [A_BENCH_FILL] = {"--bench-fill", NULL, BL_ARG_FLAG, &o->bench_fill},
        [A_NEXTN] = {"--nextn", NULL, BL_ARG_I64, &o->n_nextn, 0, 4},
        [A_DENSE_LEAD] = {"--dense-lead", NULL, BL_ARG_I64, &o->n_dense_lead, 0, 4095},
        [A_SHARED] = {"--shared-experts", NULL, BL_ARG_I64, &o->n_shared, 0, 64},
        [A_ROPE_DIM] = {"--rope-dim", NULL, BL_ARG_I64, &o->n_rot, 2, 4096},
        [A_EXPERT_SCALE] = {"--expert-scale", NULL, BL_ARG_F64, &o->expert_scale, .fmin = 1e-3,
                            .fmax = 1e3},
        [A_GATING] = {"--gating", NULL, BL_ARG_FN, NULL, .fn = parse_gating, .ud = &o->gating},
        [A_NO_EXPERT_NORM] = {"--no-expert-norm", NULL, BL_ARG_FLAG, &o->no_expert_norm},
        [A_QK_NORM] = {"--qk-norm", NULL, BL_ARG_FLAG, &o->qk_norm},
        [A_Q_LORA] = {"--q-lora", NULL, BL_ARG_I64, &o->n_q_lora, 0, big},
        [A_KV_LORA] = {"--kv-lora", NULL, BL_ARG_I64, &o->n_kv_lora, 1, big},
        [A_QK_NOPE] = {"--qk-nope", NULL, BL_ARG_I64, &o->n_qk_nope, 1, 4096},
        [A_V_HEAD] = {"--v-head", NULL, BL_ARG_I64, &o->n_v_head, 1, 4096},
        [A_LEGACY_KV_B] = {"--legacy-kv-b", NULL, BL_ARG_FLAG, &o->legacy_kv_b},
        [A_GROUPS] = {"--groups", NULL, BL_ARG_I64, &o->n_group, 1, 4096},
        [A_GROUPS_USED] = {"--groups-used", NULL, BL_ARG_I64, &o->n_group_used, 1, 4096},
        [A_NO_PROBS_BIAS] = {"--no-probs-bias", NULL, BL_ARG_FLAG, &o->no_probs_bias},
        [A_YARN] = {"--yarn", NULL, BL_ARG_F64, &o->yarn, .fmin = 0, .fmax = 1e4},
        [A_YARN_ORIG_CTX] = {"--yarn-orig-ctx", NULL, BL_ARG_I64, &o->yarn_orig_ctx, 1,
                             UINT32_MAX},
        [A_YARN_LOG_MUL] = {"--yarn-log-mul", NULL, BL_ARG_F64, &o->yarn_log_mul, .fmin = 0,
                            .fmax = 10},
        [A_SWA] = {"--swa", NULL, BL_ARG_I64, &o->n_swa, 1, UINT32_MAX},
        [A_SWA_PERIOD] = {"--swa-period", NULL, BL_ARG_I64, &o->swa_period, 1, 4096},
        [A_TYPE_EXPERTS] = {"--type-experts", NULL, BL_ARG_FN, NULL, .fn = parse_type_experts,
                            .ud = &o->type_experts},
        [A_SHARED_FF] = {"--shared-ff", NULL, BL_ARG_I64, &o->n_ff_shexp, 1, big},
        [A_SSM_CONV] = {"--ssm-conv", NULL, BL_ARG_I64, &o->ssm_conv, 2, 64},
        [A_SSM_STATE] = {"--ssm-state", NULL, BL_ARG_I64, &o->ssm_state, 1, 4096},
        [A_SSM_GROUPS] = {"--ssm-groups", NULL, BL_ARG_I64, &o->ssm_groups, 1, 4096},
        [A_SSM_HEADS] = {"--ssm-heads", NULL, BL_ARG_I64, &o->ssm_heads, 1, 4096},
        [A_FULL_ATTN_INTERVAL] = {"--full-attention-interval", NULL, BL_ARG_I64,
                                  &o->full_attn_interval, 1, 4096},
        [A_RECURRENT_LAYERS] = {"--recurrent-layers", NULL, BL_ARG_STR, &o->recurrent_pat},
    };
    int help = 0;
    bl_err_t err = {0};
    if (bl_args_parse(args, A_COUNT, argc, argv, NULL, &help, &err))
        return flag_error("%s", err.msg);
    if (help) {
        usage(stdout);
        return -1;
    }
    if (!o->out)
        return flag_error("-o FILE is required");

    /* A preset is a model of its architecture; its values stand in for the flags
     * not given. */
    if (o->preset) {
        if (args[A_ARCH].seen && o->arch != o->preset->arch)
            return flag_error("--preset %s is a %s model, not --arch %s", o->preset->name,
                              archs[o->preset->arch].name, archs[o->arch].name);
        o->arch = o->preset->arch;
        apply_preset(o, args);
    }
    const int ds = o->arch == ARCH_DEEPSEEK2, oss = o->arch == ARCH_GPTOSS;
    /* deepseek2's defaults where they differ from glm4moe's: no NextN layer (the
     * converter drops DeepSeek-V3's), DeepSeek's RoPE base and rotated dims */
    if (ds && !o->preset) {
        if (!args[A_NEXTN].seen)
            o->n_nextn = 0;
        if (!args[A_ROPE_BASE].seen)
            o->rope_base = 10000;
        if (!args[A_ROPE_DIM].seen)
            o->n_rot = 16;
    }
    /* gpt-oss's defaults: the real models' RoPE base, epsilon and head width, and
     * q8_0 matrices beside the MXFP4 experts, as in the converted release */
    if (oss && !o->preset) {
        if (!args[A_ROPE_BASE].seen)
            o->rope_base = 150000;
        if (!args[A_EPS].seen)
            o->eps = 1e-5;
        if (!args[A_HEAD_DIM].seen)
            o->head_dim = 64;
    }
    if (oss && !args[A_TYPE].seen)
        o->type = BL_TYPE_Q8_0;
    /* The hybrids' defaults: narrow heads (a quarter of each rotated, check_hybrid)
     * and the real models' RoPE base; the shared expert as wide as a routed one, as
     * in both real models; qwen3next files have no NextN layer */
    const int hyb = IS_HYBRID(o->arch);
    if (hyb && !o->preset) {
        if (!args[A_ROPE_BASE].seen)
            o->rope_base = 1e7;
        if (!args[A_HEAD_DIM].seen)
            o->head_dim = 32;
        if (!args[A_SHARED_FF].seen)
            o->n_ff_shexp = o->n_ff_exp;
    }
    if (o->arch == ARCH_QWEN3NEXT)
        o->n_nextn = 0;
    /* Notes a value the preset chose (the flag was not given), for messages. */
#define BY_PRESET(a) (o->preset && !args[a].seen ? o->preset->note : "")
    o->ff_set = args[A_FF].seen || o->preset;
    o->vocab_set = args[A_VOCAB].seen; /* the preset's rows are also the --tokenizer default */
    o->attn_v_set = args[A_TYPE_ATTN_V].seen;
    o->ffn_down_set = args[A_TYPE_FFN_DOWN].seen;
    o->output_set = args[A_TYPE_OUTPUT].seen;
    o->embd_set = args[A_TYPE_EMBD].seen;
    o->expert_scale_set = args[A_EXPERT_SCALE].seen;

    /* Cross-flag rules. gpt-oss always has its own head (llama.cpp requires
     * output.weight). */
    if (oss && o->tied)
        return flag_error("--tied: gpt-oss files always carry their own output.weight");
    for (int i = 0; i < A_COUNT; i++)
        if (args[i].seen && flag_archs[i] && !((flag_archs[i] >> o->arch) & 1))
            return arch_error(args[i].names, flag_archs[i]);
    /* deepseek2's heads are shaped by its own flags (check_deepseek2) */
    if (!ds && o->n_head % o->n_head_kv)
        return flag_error("--heads %lld%s is not a multiple of --kv-heads %lld%s",
                          (long long)o->n_head, BY_PRESET(A_HEADS), (long long)o->n_head_kv,
                          BY_PRESET(A_KV_HEADS));
    if (!ds && o->head_dim % 2)
        return flag_error("--head-dim %lld is odd; RoPE rotates pairs", (long long)o->head_dim);
    if (o->arch != ARCH_QWEN3 && o->n_expert_used > o->n_expert)
        return flag_error("--experts-used %lld%s is more than --experts %lld%s",
                          (long long)o->n_expert_used, BY_PRESET(A_EXPERTS_USED),
                          (long long)o->n_expert, BY_PRESET(A_EXPERTS));
    if (o->arch == ARCH_GLM4MOE || ds) {
        if (o->n_layer + o->n_nextn > 4096)
            return flag_error("--layers %lld%s and --nextn %lld%s make more than 4096 blocks",
                              (long long)o->n_layer, BY_PRESET(A_LAYERS), (long long)o->n_nextn,
                              BY_PRESET(A_NEXTN));
        if (o->n_dense_lead >= o->n_layer)
            return flag_error("--dense-lead %lld%s leaves no MoE layer in --layers %lld; give "
                              "--dense-lead less than --layers",
                              (long long)o->n_dense_lead, BY_PRESET(A_DENSE_LEAD),
                              (long long)o->n_layer);
    }
    if (o->arch == ARCH_GLM4MOE) {
        /* GLM-4.5 rotates half of each head; NEOX pairs dim i with i + n_rot/2. */
        if (!args[A_ROPE_DIM].seen) {
            o->n_rot = o->head_dim / 2;
            if (o->n_rot % 2)
                return flag_error("--head-dim %lld: half of it, the default --rope-dim, is odd; "
                                  "give an even --rope-dim", (long long)o->head_dim);
        }
        if (o->n_rot % 2 || o->n_rot > o->head_dim)
            return flag_error("--rope-dim %lld is not an even count of 2..--head-dim %lld",
                              (long long)o->n_rot, (long long)o->head_dim);
    }
    int rc;
    if (ds && (rc = check_deepseek2(o, args)))
        return rc;
    if (oss && (rc = check_yarn(o, args)))
        return rc;
    if (oss)
        o->n_rot = o->head_dim; /* RoPE turns whole heads */
    if (hyb && (rc = check_hybrid(o, args)))
        return rc;
    /* The skewed router reserves a channel per expert and the constant's channels,
     * which the blocks may not write; half the width stays theirs. */
    if (o->router_zipf > 0 && 2 * (o->n_expert + ZIPF_CONST_CH) > o->n_embd)
        return flag_error("--router-zipf needs --n-embd of at least 2 x (--experts %lld + %d) = "
                          "%lld, not %lld",
                          (long long)o->n_expert, ZIPF_CONST_CH,
                          (long long)(2 * (o->n_expert + ZIPF_CONST_CH)), (long long)o->n_embd);
    if (o->tied && o->output_set)
        return flag_error("--type-output has no tensor to apply to with --tied");
    mk_family_t fam = archs[o->arch].family;
    if (!o->tok_dir && (size_t)o->n_vocab < mk_vocab_builtin_min(fam))
        return flag_error("--vocab %lld%s: the built-in vocabulary needs at least %zu tokens",
                          (long long)o->n_vocab, BY_PRESET(A_VOCAB), mk_vocab_builtin_min(fam));
#undef BY_PRESET
    if (!o->ff_set)
        o->n_ff = oss ? o->n_ff_exp : 3 * o->n_embd;

    /* Role types: K-quant files keep the most sensitive matrices at q6_K, as the
     * usual Q4_K_M / Q5_K_M mixes do; other types apply everywhere. */
    int kmix = o->type == BL_TYPE_Q4_K || o->type == BL_TYPE_Q5_K;
    bl_type_t sensitive = kmix ? BL_TYPE_Q6_K : o->type;
    if (!o->attn_v_set) o->type_attn_v = sensitive;
    if (!o->ffn_down_set) o->type_ffn_down = sensitive;
    if (!o->output_set) o->type_output = sensitive;
    if (!o->embd_set) o->type_embd = o->type;
    if (oss && !o->ffn_down_set) o->type_ffn_down = o->type_experts;
    return 0;
}

/* --- tensors ------------------------------------------------------------------------- */

typedef struct tlist {
    tdesc_t *t;
    size_t n, cap;
} tlist_t;

static int add_t(tlist_t *L, const char *name, int n_dims, int64_t ne0, int64_t ne1, int64_t ne2,
                 bl_type_t type, int kind, double std, const char *row_flag, const char *type_flag)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        tdesc_t *t = realloc(L->t, cap * sizeof *t);
        if (!t)
            return BL_ENOMEM;
        L->t = t;
        L->cap = cap;
    }
    tdesc_t *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->type = type;
    t->kind = kind;
    t->std = std;
    t->row_flag = row_flag;
    t->type_flag = type_flag;
    return 0;
}

/* The standard deviation of token_embd's values: with tied embeddings its rows are
 * also the head, hence the head's scale. */
static double embd_std(const opts_t *o)
{
    return o->tied ? 2 * (1.0 / sqrt((double)o->n_embd)) : 1.0;
}

/* Small draws for glm4moe's vectors: the attention biases, and the selection bias
 * of the router (exp_probs_b), large enough against the sigmoid scores' gaps to
 * move about a fifth of the choices at 8 experts, so a reader that ignores it (or
 * adds it to the weights too) gives other logits. */
#define ATTN_BIAS_STD 0.02
#define EXP_PROBS_B_STD 0.05

/* The NextN tensors of a glm4moe, deepseek2 or qwen35moe NextN block i: they
 * predict one more token from the last hidden state and the next token's
 * embedding. own_head: the block's own embedding and head (glm4moe, deepseek2);
 * qwen35moe's reuse the model's. */
static int add_nextn(const opts_t *o, tlist_t *L, int64_t i, int own_head)
{
    const int64_t E = o->n_embd, V = o->n_vocab;
    const double inv_e = 1.0 / sqrt((double)E);
    const bl_type_t f32 = BL_TYPE_F32;
    const char *e_flag = o->embd_set ? "--type-embd" : "--type";
    const char *out_flag = o->output_set ? "--type-output" : "--type";
    char nm[BL_GW_MAX_NAME + 1];
    int rc = 0;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
    /* (2E, E): [enorm(embedding of the next token), hnorm(hidden state)] -> E */
    rc |= add_t(L, BLK("nextn.eh_proj.weight"), 2, 2 * E, E, 1, o->type, KIND_MAT,
                1.0 / sqrt((double)(2 * E)), "2 x --n-embd", "--type");
    rc |= add_t(L, BLK("nextn.enorm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    rc |= add_t(L, BLK("nextn.hnorm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    if (own_head) {
        rc |= add_t(L, BLK("nextn.embed_tokens.weight"), 2, E, V, 1, o->type_embd, KIND_MAT, 1.0,
                    "--n-embd", e_flag);
        rc |= add_t(L, BLK("nextn.shared_head_head.weight"), 2, E, V, 1, o->type_output,
                    KIND_MAT, 2 * inv_e, "--n-embd", out_flag);
    }
    rc |= add_t(L, BLK("nextn.shared_head_norm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL,
                NULL);
#undef BLK
    return rc;
}

/* Block i's attention of glm4moe and gpt-oss: attn_norm, then q, k and v each with
 * its bias, then the output projection. */
static int add_biased_attn(const opts_t *o, tlist_t *L, int64_t i)
{
    const int64_t E = o->n_embd, QD = o->n_head * o->head_dim, KD = o->n_head_kv * o->head_dim;
    const double inv_e = 1.0 / sqrt((double)E);
    const bl_type_t f32 = BL_TYPE_F32;
    const char *tf = "--type";
    const char *v_flag = o->attn_v_set ? "--type-attn-v" : "--type";
    char nm[BL_GW_MAX_NAME + 1];
    int rc = 0;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
    rc |= add_t(L, BLK("attn_norm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    rc |= add_t(L, BLK("attn_q.weight"), 2, E, QD, 1, o->type, KIND_MAT, inv_e, "--n-embd", tf);
    rc |= add_t(L, BLK("attn_q.bias"), 1, QD, 1, 1, f32, KIND_MAT, ATTN_BIAS_STD, NULL, NULL);
    rc |= add_t(L, BLK("attn_k.weight"), 2, E, KD, 1, o->type, KIND_MAT, inv_e, "--n-embd", tf);
    rc |= add_t(L, BLK("attn_k.bias"), 1, KD, 1, 1, f32, KIND_MAT, ATTN_BIAS_STD, NULL, NULL);
    rc |= add_t(L, BLK("attn_v.weight"), 2, E, KD, 1, o->type_attn_v, KIND_MAT, inv_e,
                "--n-embd", v_flag);
    rc |= add_t(L, BLK("attn_v.bias"), 1, KD, 1, 1, f32, KIND_MAT, ATTN_BIAS_STD, NULL, NULL);
    rc |= add_t(L, BLK("attn_output.weight"), 2, QD, E, 1, o->type, KIND_MAT,
                1.0 / sqrt((double)QD), "--heads x --head-dim", tf);
#undef BLK
    return rc;
}

/* The FFN part of block i of a glm4moe or deepseek2 file: a dense FFN in the leading
 * blocks, else the router (and its selection bias when probs_b), the routed experts
 * and the shared ones; then, past n_layer, the NextN tensors. */
static int add_ffn_block(const opts_t *o, tlist_t *L, int64_t i, int probs_b)
{
    const int64_t E = o->n_embd;
    const int64_t X = o->n_expert, FE = o->n_ff_exp, F = o->n_ff, FS = o->n_ff_exp * o->n_shared;
    const double inv_e = 1.0 / sqrt((double)E);
    const bl_type_t f32 = BL_TYPE_F32;
    const char *tf = "--type";
    const char *d_flag = o->ffn_down_set ? "--type-ffn-down" : "--type";
    char nm[BL_GW_MAX_NAME + 1];
    int rc = 0;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
    if (i < o->n_dense_lead) {
        rc |= add_t(L, BLK("ffn_gate.weight"), 2, E, F, 1, o->type, KIND_MAT, inv_e, "--n-embd", tf);
        rc |= add_t(L, BLK("ffn_up.weight"), 2, E, F, 1, o->type, KIND_MAT, inv_e, "--n-embd", tf);
        rc |= add_t(L, BLK("ffn_down.weight"), 2, F, E, 1, o->type_ffn_down, KIND_MAT,
                    1.0 / sqrt((double)F), "--ff", d_flag);
    } else {
        rc |= add_t(L, BLK("ffn_gate_inp.weight"), 2, E, X, 1, f32, KIND_MAT, 2 * inv_e, NULL,
                    NULL);
        if (probs_b)
            rc |= add_t(L, BLK("exp_probs_b.bias"), 1, X, 1, 1, f32, KIND_MAT, EXP_PROBS_B_STD,
                        NULL, NULL);
        rc |= add_t(L, BLK("ffn_gate_exps.weight"), 3, E, FE, X, o->type, KIND_MAT, inv_e,
                    "--n-embd", tf);
        rc |= add_t(L, BLK("ffn_up_exps.weight"), 3, E, FE, X, o->type, KIND_MAT, inv_e,
                    "--n-embd", tf);
        rc |= add_t(L, BLK("ffn_down_exps.weight"), 3, FE, E, X, o->type_ffn_down, KIND_MAT,
                    1.0 / sqrt((double)FE), "--expert-ff", d_flag);
        if (o->n_shared) {
            rc |= add_t(L, BLK("ffn_gate_shexp.weight"), 2, E, FS, 1, o->type, KIND_MAT, inv_e,
                        "--n-embd", tf);
            rc |= add_t(L, BLK("ffn_up_shexp.weight"), 2, E, FS, 1, o->type, KIND_MAT, inv_e,
                        "--n-embd", tf);
            rc |= add_t(L, BLK("ffn_down_shexp.weight"), 2, FS, E, 1, o->type_ffn_down, KIND_MAT,
                        1.0 / sqrt((double)FS), "--expert-ff x --shared-experts", d_flag);
        }
    }
#undef BLK
    if (i >= o->n_layer)
        rc |= add_nextn(o, L, i, 1);
    return rc;
}

/* Block i of a glm4moe file: attention with q/k/v biases (and per-head q/k norms
 * with --qk-norm), post_attention_norm as the FFN's input norm, then a dense FFN
 * in the leading blocks, else the router, its selection bias, the routed experts
 * and the shared ones. A NextN block (i >= n_layer) is a MoE block plus the
 * tensors that predict one more token from the last hidden state and the next
 * token's embedding. Scales as build_tensors says. */
static int add_glm4moe_block(const opts_t *o, tlist_t *L, int64_t i)
{
    const int64_t E = o->n_embd, H = o->head_dim;
    const bl_type_t f32 = BL_TYPE_F32;
    char nm[BL_GW_MAX_NAME + 1];
    int rc = 0;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
    rc |= add_biased_attn(o, L, i);
    if (o->qk_norm) {
        rc |= add_t(L, BLK("attn_q_norm.weight"), 1, H, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
        rc |= add_t(L, BLK("attn_k_norm.weight"), 1, H, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    }
    rc |= add_t(L, BLK("post_attention_norm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
#undef BLK
    rc |= add_ffn_block(o, L, i, 1);
    return rc;
}

/* Block i of a deepseek2 file, in the order llama.cpp's converter writes it:
 * attn_norm; q, through the rank --q-lora and its norm (attn_q_a, attn_q_a_norm,
 * attn_q_b) or directly (attn_q); attn_kv_a_mqa, which makes the --kv-lora latent
 * (normed by attn_kv_a_norm) and the one shared rotated key of --rope-dim; the
 * latent's per-head keys and values (attn_k_b and attn_v_b, or attn_kv_b in the
 * legacy form); attn_output; ffn_norm; then a dense FFN in the leading blocks, else
 * the router, its selection bias (sigmoid gating), the routed experts and the
 * shared ones; NextN blocks (i >= n_layer) add their nextn.* tensors. Scales as
 * build_tensors says; the latent's matrices read kv_lora values, their fan-in. */
static int add_deepseek2_block(const opts_t *o, tlist_t *L, int64_t i)
{
    const int64_t E = o->n_embd, NH = o->n_head, QL = o->n_q_lora, KL = o->n_kv_lora;
    const int64_t NOPE = o->n_qk_nope, ROT = o->n_rot, HV = o->n_v_head, HK = NOPE + ROT;
    const double inv_e = 1.0 / sqrt((double)E), inv_kl = 1.0 / sqrt((double)KL);
    const bl_type_t f32 = BL_TYPE_F32;
    const char *tf = "--type";
    const char *v_flag = o->attn_v_set ? "--type-attn-v" : "--type";
    char nm[BL_GW_MAX_NAME + 1], kv_b[BL_GW_MAX_NAME + 1];
    int rc = 0;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
    snprintf(kv_b, sizeof kv_b, "blk.%lld.attn_kv_b.weight", (long long)i);
    rc |= add_t(L, BLK("attn_norm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    if (QL) {
        rc |= add_t(L, BLK("attn_q_a.weight"), 2, E, QL, 1, o->type, KIND_MAT, inv_e, "--n-embd",
                    tf);
        rc |= add_t(L, BLK("attn_q_a_norm.weight"), 1, QL, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
        rc |= add_t(L, BLK("attn_q_b.weight"), 2, QL, NH * HK, 1, o->type, KIND_MAT,
                    1.0 / sqrt((double)QL), "--q-lora", tf);
    } else {
        rc |= add_t(L, BLK("attn_q.weight"), 2, E, NH * HK, 1, o->type, KIND_MAT, inv_e,
                    "--n-embd", tf);
    }
    rc |= add_t(L, BLK("attn_kv_a_mqa.weight"), 2, E, KL + ROT, 1, o->type, KIND_MAT, inv_e,
                "--n-embd", tf);
    rc |= add_t(L, BLK("attn_kv_a_norm.weight"), 1, KL, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    if (o->legacy_kv_b) {
        /* head h: rows h (NOPE + HV) .. + NOPE make its k_nope, the next HV its v */
        rc |= add_t(L, kv_b, 2, KL, NH * (NOPE + HV), 1, o->type_attn_v, KIND_MAT, inv_kl,
                    "--kv-lora", v_flag);
    } else {
        /* head h: KL rows of NOPE (k_b), HV rows of KL (v_b) */
        rc |= add_t(L, BLK("attn_k_b.weight"), 3, NOPE, KL, NH, o->type, KIND_K_B, inv_kl,
                    "--qk-nope", tf);
        rc |= add_t(L, BLK("attn_v_b.weight"), 3, KL, HV, NH, o->type_attn_v, KIND_V_B, inv_kl,
                    "--kv-lora", v_flag);
        for (size_t k = L->n - 2; !rc && k < L->n; k++) {
            snprintf(L->t[k].src, sizeof L->t[k].src, "%s", kv_b);
            L->t[k].qk_nope = NOPE;
            L->t[k].v_head = HV;
        }
    }
    rc |= add_t(L, BLK("attn_output.weight"), 2, NH * HV, E, 1, o->type, KIND_MAT,
                1.0 / sqrt((double)(NH * HV)), "--heads x --v-head", tf);
    rc |= add_t(L, BLK("ffn_norm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
#undef BLK
    rc |= add_ffn_block(o, L, i, o->gating == GATING_SIGMOID && !o->no_probs_bias);
    return rc;
}

/* gpt-oss's vectors: the attention sinks spread like the scores they compete with
 * (about 1), so that a head's sink takes a visible share of its weights; the router
 * bias moves some choices (as exp_probs_b does); the expert biases are small like
 * the attention ones. */
#define SINK_STD 0.5
#define ROUTER_BIAS_STD 0.05
#define EXPERT_BIAS_STD 0.02

/* Block i of a gpt-oss file: attention with biases on q, k, v and the output and
 * one sink logit per head, post_attention_norm as the FFN's input norm, the router
 * and its bias, and the routed experts, each matrix with a bias per expert. The
 * experts take --type-experts (MXFP4 by default, as released; ffn_down_exps
 * --type-ffn-down when given), the rest --type and its role flags. Scales as
 * build_tensors says. */
static int add_gptoss_block(const opts_t *o, tlist_t *L, int64_t i)
{
    const int64_t E = o->n_embd;
    const int64_t X = o->n_expert, FE = o->n_ff_exp;
    const double inv_e = 1.0 / sqrt((double)E);
    const bl_type_t f32 = BL_TYPE_F32;
    const char *x_flag = "--type-experts";
    const char *d_flag = o->ffn_down_set ? "--type-ffn-down" : "--type-experts";
    char nm[BL_GW_MAX_NAME + 1];
    int rc = 0;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
    rc |= add_biased_attn(o, L, i);
    rc |= add_t(L, BLK("attn_output.bias"), 1, E, 1, 1, f32, KIND_MAT, ATTN_BIAS_STD, NULL, NULL);
    rc |= add_t(L, BLK("attn_sinks.weight"), 1, o->n_head, 1, 1, f32, KIND_MAT, SINK_STD, NULL,
                NULL);
    rc |= add_t(L, BLK("post_attention_norm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    rc |= add_t(L, BLK("ffn_gate_inp.weight"), 2, E, X, 1, f32, KIND_MAT, 2 * inv_e, NULL, NULL);
    rc |= add_t(L, BLK("ffn_gate_inp.bias"), 1, X, 1, 1, f32, KIND_MAT, ROUTER_BIAS_STD, NULL,
                NULL);
    rc |= add_t(L, BLK("ffn_gate_exps.weight"), 3, E, FE, X, o->type_experts, KIND_MAT, inv_e,
                "--n-embd", x_flag);
    rc |= add_t(L, BLK("ffn_gate_exps.bias"), 2, FE, X, 1, f32, KIND_MAT, EXPERT_BIAS_STD, NULL,
                NULL);
    rc |= add_t(L, BLK("ffn_up_exps.weight"), 3, E, FE, X, o->type_experts, KIND_MAT, inv_e,
                "--n-embd", x_flag);
    rc |= add_t(L, BLK("ffn_up_exps.bias"), 2, FE, X, 1, f32, KIND_MAT, EXPERT_BIAS_STD, NULL,
                NULL);
    rc |= add_t(L, BLK("ffn_down_exps.weight"), 3, FE, E, X, o->type_ffn_down, KIND_MAT,
                1.0 / sqrt((double)FE), "--expert-ff", d_flag);
    rc |= add_t(L, BLK("ffn_down_exps.bias"), 2, E, X, 1, f32, KIND_MAT, EXPERT_BIAS_STD, NULL,
                NULL);
#undef BLK
    return rc;
}

/* Whether block l of a qwen3next or qwen35moe file is a DeltaNet layer: as
 * --recurrent-layers spells it, else all but every --full-attention-interval-th.
 * NextN blocks attend. */
static int layer_recurrent(const opts_t *o, int64_t l)
{
    if (l >= o->n_layer)
        return 0;
    if (o->recurrent_pat)
        return o->recurrent_pat[l] == '1';
    return (l + 1) % o->full_attn_interval != 0;
}

/* The DeltaNet time constants. A head's state decays by e^g a position, with
 * g = softplus(alpha . x + ssm_dt.bias) * ssm_a: ssm_a = -e^u, u uniform in
 * [SSM_A_LOG_MIN, SSM_A_LOG_MAX) (rates 0.14..1.65), and biases near -2, which
 * make the softplus about 0.2. In the tiny default files e^g then spreads from
 * about 0.65 to 0.99 (median 0.92): heads remember from a few positions to a few
 * tens, so a 40-token prompt depends on the state carried across it, and the
 * decay still varies with the token. */
#define SSM_A_LOG_MIN (-2.0)
#define SSM_A_LOG_MAX 0.5
#define SSM_DT_BIAS_MEAN (-2.0)
#define SSM_DT_BIAS_STD 0.5

/* Block i of a qwen3next or qwen35moe file: attn_norm; a DeltaNet mixer (attn_qkv
 * making the convolution's channels: the q heads, the k heads, the v heads;
 * attn_gate the output gate z; ssm_ba, or ssm_beta and ssm_alpha, the write
 * strength and decay inputs; the convolution, the decay's bias and rates, the
 * per-head output norm and ssm_out) or a gated attention one (attn_q giving each
 * head its q then its gate, per-head q/k norms); post_attention_norm; the softmax
 * router, the routed experts, and the shared expert with its sigmoid gate
 * (ffn_gate_inp_shexp, one scalar a token); past n_layer, qwen35moe's NextN
 * tensors. Scales as build_tensors says; the shared expert's gate draws twice
 * 1/sqrt(n_embd), as the router, so that it varies from token to token; the
 * convolution 1/sqrt(K), keeping its outputs near unit size. */
static int add_hybrid_block(const opts_t *o, tlist_t *L, int64_t i)
{
    const int64_t E = o->n_embd, H = o->head_dim, QD = o->n_head * H, KD = o->n_head_kv * H;
    const int64_t S = o->ssm_state, HK = o->ssm_groups, HV = o->ssm_heads, K = o->ssm_conv;
    const int64_t CH = S * (2 * HK + HV), VD = S * HV;
    const int64_t X = o->n_expert, FE = o->n_ff_exp, FS = o->n_ff_shexp;
    const double inv_e = 1.0 / sqrt((double)E);
    const bl_type_t f32 = BL_TYPE_F32;
    const char *tf = "--type";
    const char *v_flag = o->attn_v_set ? "--type-attn-v" : "--type";
    const char *d_flag = o->ffn_down_set ? "--type-ffn-down" : "--type";
    char nm[BL_GW_MAX_NAME + 1];
    int rc = 0;
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
    rc |= add_t(L, BLK("attn_norm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    if (layer_recurrent(o, i)) {
        /* (E, 2 S Hk + S Hv): [q heads | k heads | v heads] */
        rc |= add_t(L, BLK("attn_qkv.weight"), 2, E, CH, 1, o->type, KIND_MAT, inv_e, "--n-embd",
                    tf);
        rc |= add_t(L, BLK("attn_gate.weight"), 2, E, VD, 1, o->type, KIND_MAT, inv_e,
                    "--n-embd", tf);
        if (o->arch == ARCH_QWEN3NEXT) {
            /* (E, 2 Hv): per k head, its v heads' b then their a */
            rc |= add_t(L, BLK("ssm_ba.weight"), 2, E, 2 * HV, 1, o->type, KIND_MAT, inv_e,
                        "--n-embd", tf);
        } else {
            rc |= add_t(L, BLK("ssm_beta.weight"), 2, E, HV, 1, o->type, KIND_MAT, inv_e,
                        "--n-embd", tf);
            rc |= add_t(L, BLK("ssm_alpha.weight"), 2, E, HV, 1, o->type, KIND_MAT, inv_e,
                        "--n-embd", tf);
        }
        /* (K, channels): a channel's taps, the current position's last */
        rc |= add_t(L, BLK("ssm_conv1d.weight"), 2, K, CH, 1, f32, KIND_MAT,
                    1.0 / sqrt((double)K), NULL, NULL);
        rc |= add_t(L, BLK("ssm_dt.bias"), 1, HV, 1, 1, f32, KIND_MAT, SSM_DT_BIAS_STD, NULL,
                    NULL);
        if (!rc)
            L->t[L->n - 1].mean = SSM_DT_BIAS_MEAN;
        rc |= add_t(L, BLK("ssm_a"), 1, HV, 1, 1, f32, KIND_SSM_A, 0, NULL, NULL);
        rc |= add_t(L, BLK("ssm_norm.weight"), 1, S, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
        rc |= add_t(L, BLK("ssm_out.weight"), 2, VD, E, 1, o->type, KIND_MAT,
                    1.0 / sqrt((double)VD), "--ssm-state x --ssm-heads", tf);
    } else {
        /* (E, 2 H hd): per head its q then its gate */
        rc |= add_t(L, BLK("attn_q.weight"), 2, E, 2 * QD, 1, o->type, KIND_MAT, inv_e,
                    "--n-embd", tf);
        rc |= add_t(L, BLK("attn_k.weight"), 2, E, KD, 1, o->type, KIND_MAT, inv_e, "--n-embd",
                    tf);
        rc |= add_t(L, BLK("attn_v.weight"), 2, E, KD, 1, o->type_attn_v, KIND_MAT, inv_e,
                    "--n-embd", v_flag);
        rc |= add_t(L, BLK("attn_output.weight"), 2, QD, E, 1, o->type, KIND_MAT,
                    1.0 / sqrt((double)QD), "--heads x --head-dim", tf);
        rc |= add_t(L, BLK("attn_q_norm.weight"), 1, H, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
        rc |= add_t(L, BLK("attn_k_norm.weight"), 1, H, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    }
    rc |= add_t(L, BLK("post_attention_norm.weight"), 1, E, 1, 1, f32, KIND_NORM, 0, NULL, NULL);
    rc |= add_t(L, BLK("ffn_gate_inp.weight"), 2, E, X, 1, f32, KIND_MAT, 2 * inv_e, NULL, NULL);
    rc |= add_t(L, BLK("ffn_gate_exps.weight"), 3, E, FE, X, o->type, KIND_MAT, inv_e,
                "--n-embd", tf);
    rc |= add_t(L, BLK("ffn_up_exps.weight"), 3, E, FE, X, o->type, KIND_MAT, inv_e, "--n-embd",
                tf);
    rc |= add_t(L, BLK("ffn_down_exps.weight"), 3, FE, E, X, o->type_ffn_down, KIND_MAT,
                1.0 / sqrt((double)FE), "--expert-ff", d_flag);
    rc |= add_t(L, BLK("ffn_gate_inp_shexp.weight"), 1, E, 1, 1, f32, KIND_MAT, 2 * inv_e, NULL,
                NULL);
    rc |= add_t(L, BLK("ffn_gate_shexp.weight"), 2, E, FS, 1, o->type, KIND_MAT, inv_e,
                "--n-embd", tf);
    rc |= add_t(L, BLK("ffn_up_shexp.weight"), 2, E, FS, 1, o->type, KIND_MAT, inv_e, "--n-embd",
                tf);
    rc |= add_t(L, BLK("ffn_down_shexp.weight"), 2, FS, E, 1, o->type_ffn_down, KIND_MAT,
                1.0 / sqrt((double)FS), "--shared-ff", d_flag);
#undef BLK
    if (i >= o->n_layer)
        rc |= add_nextn(o, L, i, 0);
    return rc;
}

/* glm4moe, deepseek2, gpt-oss, qwen3next and qwen35moe store a K-quant matrix whose
 * rows are not whole 256-value blocks as q8_0, as llama.cpp's quantizer does for
 * GLM-4.5-Air's widths 1408 and 10944, DeepSeek's attn_k_b rows of 128 or
 * gpt-oss's 2880 (it takes q8_0 for q6_K and q5_0 / q5_1 for q4_K / q5_K, which
 * this tool does not write). A row that fits no 32-value block either keeps its
 * type, so that check_blocks names the flag that set it. */
static void kquant_fallback_types(tlist_t *L)
{
    for (size_t i = 0; i < L->n; i++) {
        tdesc_t *t = &L->t[i];
        if (bl_type_info((uint32_t)t->type)->block_elems == 256 && t->ne[0] % 256 &&
            t->ne[0] % 32 == 0)
            t->type = BL_TYPE_Q8_0;
    }
}

/* The tensor list, in the order llama.cpp's converter writes it. Shapes are
 * GGUF's (ne[0] first, the row length): a matrix (in, out) maps in -> out.
 * Scales: matrices draw N(0, 1/fan_in) so activations keep their size through
 * each layer; the router and the head draw twice that, so that routing is not
 * uniform and the logits spread (std about 2). --router-zipf computes the router
 * instead and changes a few channels of other tensors (see "skewed router"). */
static int build_tensors(const opts_t *o, tlist_t *L)
{
    const int64_t E = o->n_embd, V = o->n_vocab, H = o->head_dim;
    const int64_t QD = o->n_head * H, KD = o->n_head_kv * H;
    const int64_t X = o->n_expert, FE = o->n_ff_exp, F = o->n_ff;
    const double inv_e = 1.0 / sqrt((double)E);
    const char *tf = "--type";
    const char *v_flag = o->attn_v_set ? "--type-attn-v" : "--type";
    const char *d_flag = o->ffn_down_set ? "--type-ffn-down" : "--type";
    const char *e_flag = o->embd_set ? "--type-embd" : "--type";
    const char *qd_flag = "--heads x --head-dim";
    const int zipf = o->router_zipf > 0;
    char nm[BL_GW_MAX_NAME + 1];
    int rc = 0;
    /* Marks the tensor just added with what --router-zipf changes in it. */
#define ZROLE(role)                                                                         \
    do {                                                                                    \
        if (zipf && !rc)                                                                    \
            L->t[L->n - 1].zrole = (role);                                                  \
    } while (0)

    /* (E, V) */
    rc |= add_t(L, "token_embd.weight", 2, E, V, 1, o->type_embd, KIND_MAT, embd_std(o),
                "--n-embd", e_flag);
    ZROLE(ZR_EMBD);
    rc |= add_t(L, "output_norm.weight", 1, E, 1, 1, BL_TYPE_F32, KIND_NORM, 0, "--n-embd", NULL);
    ZROLE(ZR_HIDE);
    if (!o->tied)
        rc |= add_t(L, "output.weight", 2, E, V, 1, o->type_output, KIND_MAT, 2 * inv_e,
                    "--n-embd", o->output_set ? "--type-output" : "--type");
    if (o->arch == ARCH_GLM4MOE) {
        for (int64_t i = 0; i < o->n_layer + o->n_nextn && !rc; i++)
            rc |= add_glm4moe_block(o, L, i);
        if (!rc)
            kquant_fallback_types(L);
        return rc ? BL_ENOMEM : 0;
    }
    if (o->arch == ARCH_DEEPSEEK2) {
        for (int64_t i = 0; i < o->n_layer + o->n_nextn && !rc; i++)
            rc |= add_deepseek2_block(o, L, i);
        if (!rc)
            kquant_fallback_types(L);
        return rc ? BL_ENOMEM : 0;
    }
    if (o->arch == ARCH_GPTOSS) {
        for (int64_t i = 0; i < o->n_layer && !rc; i++)
            rc |= add_gptoss_block(o, L, i);
        if (!rc)
            kquant_fallback_types(L);
        return rc ? BL_ENOMEM : 0;
    }
    if (IS_HYBRID(o->arch)) {
        for (int64_t i = 0; i < o->n_layer + o->n_nextn && !rc; i++)
            rc |= add_hybrid_block(o, L, i);
        if (!rc)
            kquant_fallback_types(L);
        return rc ? BL_ENOMEM : 0;
    }
    for (int64_t i = 0; i < o->n_layer && !rc; i++) {
#define BLK(suffix) (snprintf(nm, sizeof nm, "blk.%lld." suffix, (long long)i), nm)
        rc |= add_t(L, BLK("attn_norm.weight"), 1, E, 1, 1, BL_TYPE_F32, KIND_NORM, 0, NULL, NULL);
        ZROLE(ZR_HIDE);
        rc |= add_t(L, BLK("attn_q.weight"), 2, E, QD, 1, o->type, KIND_MAT, inv_e, "--n-embd", tf);
        rc |= add_t(L, BLK("attn_k.weight"), 2, E, KD, 1, o->type, KIND_MAT, inv_e, "--n-embd", tf);
        rc |= add_t(L, BLK("attn_v.weight"), 2, E, KD, 1, o->type_attn_v, KIND_MAT, inv_e,
                    "--n-embd", v_flag);
        rc |= add_t(L, BLK("attn_output.weight"), 2, QD, E, 1, o->type, KIND_MAT,
                    1.0 / sqrt((double)QD), qd_flag, tf);
        ZROLE(ZR_WRITE);
        rc |= add_t(L, BLK("attn_q_norm.weight"), 1, H, 1, 1, BL_TYPE_F32, KIND_NORM, 0, NULL, NULL);
        rc |= add_t(L, BLK("attn_k_norm.weight"), 1, H, 1, 1, BL_TYPE_F32, KIND_NORM, 0, NULL, NULL);
        rc |= add_t(L, BLK("ffn_norm.weight"), 1, E, 1, 1, BL_TYPE_F32, KIND_NORM, 0, NULL, NULL);
        ZROLE(ZR_ROUTER_NORM);
        if (o->arch == ARCH_QWEN3MOE) {
            rc |= add_t(L, BLK("ffn_gate_inp.weight"), 2, E, X, 1, BL_TYPE_F32, KIND_MAT, 2 * inv_e,
                        NULL, NULL);
            ZROLE(ZR_ROUTER);
            if (!rc)
                L->t[L->n - 1].layer = i;
            rc |= add_t(L, BLK("ffn_gate_exps.weight"), 3, E, FE, X, o->type, KIND_MAT, inv_e,
                        "--n-embd", tf);
            ZROLE(ZR_READ);
            rc |= add_t(L, BLK("ffn_up_exps.weight"), 3, E, FE, X, o->type, KIND_MAT, inv_e,
                        "--n-embd", tf);
            ZROLE(ZR_READ);
            rc |= add_t(L, BLK("ffn_down_exps.weight"), 3, FE, E, X, o->type_ffn_down, KIND_MAT,
                        1.0 / sqrt((double)FE), "--expert-ff", d_flag);
            ZROLE(ZR_WRITE);
        } else {
            rc |= add_t(L, BLK("ffn_gate.weight"), 2, E, F, 1, o->type, KIND_MAT, inv_e,
                        "--n-embd", tf);
            rc |= add_t(L, BLK("ffn_up.weight"), 2, E, F, 1, o->type, KIND_MAT, inv_e, "--n-embd", tf);
            rc |= add_t(L, BLK("ffn_down.weight"), 2, F, E, 1, o->type_ffn_down, KIND_MAT,
                        1.0 / sqrt((double)F), "--ff", d_flag);
        }
#undef BLK
    }
#undef ZROLE
    return rc ? BL_ENOMEM : 0;
}

/* Every row length must be whole blocks of its type; the message names the flag
 * that set the length and the one that chose the type. */
static int check_blocks(const tlist_t *L)
{
    for (size_t i = 0; i < L->n; i++) {
        const tdesc_t *t = &L->t[i];
        const bl_type_info_t *ti = bl_type_info((uint32_t)t->type);
        if (t->ne[0] % ti->block_elems)
            return flag_error("%s %lld does not fit %s (%s): rows of %s hold %lld values, not a "
                              "multiple of its %u-value blocks",
                              t->row_flag ? t->row_flag : "shape", (long long)t->ne[0], ti->name,
                              t->type_flag ? t->type_flag : "fixed", t->name, (long long)t->ne[0],
                              ti->block_elems);
    }
    return 0;
}

/* --- weights -------------------------------------------------------------------------
 * Each row has its own random stream, keyed by (seed, tensor name, row index): a
 * tensor's values do not depend on which other tensors exist (--tied leaves
 * token_embd's rows alone) nor on the order rows are produced in. Values use
 * integer arithmetic and one double multiply, so no libm call can make two
 * machines disagree. */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
    return h;
}

static void rng_for_row(bl_rng_t *r, uint64_t tensor_key, uint64_t row)
{
    bl_rng_seed(r, tensor_key ^ (row * 0xD1B54A32D192ED03ull));
}

/* Standard deviation of a sum of four uniform 16-bit integers: sqrt(4 (2^32 - 1) / 12). */
#define SUM4_STD 37837.22692

/* n values of mean exactly 0 and standard deviation std: each is the sum of four
 * uniform 16-bit integers, centred (an Irwin-Hall draw, close to a normal one and
 * symmetric, so the weights are zero-mean), then scaled. */
static void draw_row(bl_rng_t *r, float *x, int64_t n, double std, double offset)
{
    const double k = std / SUM4_STD;
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = bl_rng_next(r);
        int64_t s = (int64_t)(u & 0xFFFF) + (int64_t)((u >> 16) & 0xFFFF) +
                    (int64_t)((u >> 32) & 0xFFFF) + (int64_t)(u >> 48) - 2 * 65535;
        x[i] = (float)(offset + (double)s * k);
    }
}

/* e^x for |x| <= 2 from IEEE additions, multiplications and divisions only, as
 * det_log: the Taylor series of e^|x|, converged by its 40th term, inverted for a
 * negative x. */
static double det_exp(double x)
{
    const double a = x < 0 ? -x : x;
    double term = 1.0, sum = 1.0;
    for (int k = 1; k <= 40; k++) {
        term *= a / (double)k;
        sum += term;
    }
    return x < 0 ? 1.0 / sum : sum;
}

/* n DeltaNet decay rates (ssm_a): -e^u, u uniform in [SSM_A_LOG_MIN, SSM_A_LOG_MAX)
 * from 53 random bits each, as the converter stores -exp(A_log). */
static void draw_ssm_a(bl_rng_t *r, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const double u01 = (double)(bl_rng_next(r) >> 11) * 0x1p-53;
        x[i] = (float)-det_exp(SSM_A_LOG_MIN + (SSM_A_LOG_MAX - SSM_A_LOG_MIN) * u01);
    }
}

/* --- skewed router (--router-zipf) -----------------------------------------------------
 * The law: in every MoE layer a token's k experts are k draws without replacement,
 * each picking expert e with probability proportional to 1 / rank(e)^S, where rank is
 * a random ranking of that layer's experts (1 = hottest), drawn from the seed. Top-k
 * selection gives exactly that when logit_e = -S ln rank(e) + G_e with G_e independent
 * standard Gumbel draws (the Gumbel-top-k trick), so the weights supply both terms
 * through channels reserved at the top of the width:
 *
 *   noise channels [d0, c0), one per expert: token_embd holds a Gumbel draw there,
 *     centred and scaled to the embedding's standard deviation a; router row e reads
 *     one of them with weight ZIPF_LOGIT_STD / a (a per-layer permutation, so that the
 *     token's draws land on other experts in every layer);
 *   constant channels [c0, n_embd), ZIPF_CONST_CH of them: every token_embd row holds
 *     a there; router row e reads them with a weight giving the offset -S ln rank(e),
 *     in the same units, to every token alike.
 *
 * The router reads nothing else, so a token's experts depend on the token and the
 * layer only. The channels must reach every layer's router unchanged:
 *   - no block writes them (attn_output and ffn_down_exps rows for them are 0). The
 *     rest of the residual drifts toward one direction shared by all tokens with
 *     depth, and a router reading it follows (without this flag, the last layers of
 *     a 48-layer file send 96-99 % of their selections to a quarter of the experts);
 *   - ffn_norm's gains for them are exactly 1, so the router sees them unweighted.
 *     RMSNorm divides a token's channels alike, so the order of the logits (all
 *     top-k depends on) is the same at every depth; only their scale shrinks as the
 *     residual grows, which makes the mixing weights of deep layers flatter;
 *   - only the router sees the constant: attn_norm's and output_norm's gains for it
 *     are 0 and so are ffn_gate_exps' and ffn_up_exps' columns, as a bias shared by
 *     every token would otherwise enter every projection. The noise channels stay
 *     visible to attention, experts and head like any embedding channel.
 * The constant fills a whole sub-block when n_embd is a multiple of 32, which the
 * quantized types store within 6 % (q4_K; q6_K 2 %, q8_0 0.01 %) of a, so a token's
 * offsets vary that much around the law. */

/* The router logits' spread at the first layer, as the random router's. */
#define ZIPF_LOGIT_STD 2.0
#define GUMBEL_STD 1.2825498301618641 /* pi / sqrt(6) */
#define EULER_GAMMA 0.5772156649015329

typedef struct zipf {
    double s;              /* the exponent; 0: off */
    int64_t n_embd;
    int64_t d0, c0;        /* noise channels [d0, c0), constant channels [c0, n_embd) */
    double a;              /* the constant: token_embd's standard deviation */
    int64_t n_expert;
    int32_t *rank, *chan;  /* (n_expert) for the router being written: rank - 1, channel - d0 */
} zipf_t;

/* ln x for a positive normal x, from IEEE additions, multiplications and divisions
 * only, which every machine rounds alike (libm's log may differ in the last bit, and
 * the router is stored as f32 as computed). x = m 2^e with m in [sqrt(1/2), sqrt(2)),
 * ln m = 2 atanh((m - 1) / (m + 1)), whose series has converged by the 41st power. */
static double det_log(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    int64_t e = (int64_t)((b >> 52) & 0x7FF) - 1023;
    b = (b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
    double m;
    memcpy(&m, &b, sizeof m);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e++;
    }
    const double z = (m - 1.0) / (m + 1.0), z2 = z * z;
    double term = z, sum = 0.0;
    for (int k = 1; k <= 41; k += 2) {
        sum += term / (double)k;
        term *= z2;
    }
    return 2.0 * sum + (double)e * 0.6931471805599453;
}

/* A standard Gumbel draw, -ln(-ln u), u uniform in (0, 1) from 53 random bits. */
static double gumbel(bl_rng_t *r)
{
    const double u = ((double)(bl_rng_next(r) >> 11) + 0.5) * 0x1p-53;
    return -det_log(-det_log(u));
}

/* The layer of the router keyed by key: a random ranking of its experts and a random
 * assignment of noise channels, from their own stream. */
static void zipf_layer(zipf_t *z, uint64_t key)
{
    bl_rng_t r;
    bl_rng_seed(&r, key ^ 0x5A1F5A1F5A1F5A1Full);
    int32_t *perm[2] = {z->rank, z->chan};
    for (int p = 0; p < 2; p++) {
        for (int64_t e = 0; e < z->n_expert; e++)
            perm[p][e] = (int32_t)e;
        for (int64_t e = z->n_expert - 1; e > 0; e--) { /* Fisher-Yates */
            const int64_t j = (int64_t)(bl_rng_next(&r) % (uint64_t)(e + 1));
            const int32_t t = perm[p][e];
            perm[p][e] = perm[p][j];
            perm[p][j] = t;
        }
    }
}

/* Router row e (n_embd values): the noise weight at the expert's channel, the offset
 * weight over the constant channels, zero elsewhere. */
static void zipf_router_row(const zipf_t *z, int64_t e, float *x)
{
    const double k = ZIPF_LOGIT_STD / GUMBEL_STD; /* logit units per Gumbel unit */
    const double n_c = (double)(z->n_embd - z->c0);
    const double w = -k * z->s * det_log((double)z->rank[e] + 1.0) / (n_c * z->a);
    memset(x, 0, sizeof *x * (size_t)z->n_embd);
    x[z->d0 + z->chan[e]] = (float)(ZIPF_LOGIT_STD / z->a);
    for (int64_t i = z->c0; i < z->n_embd; i++)
        x[i] = (float)w;
}

/* What the skewed router changes in row r of t after its draw (x, ne[0] values; rng
 * is the row's stream, past the draw). */
static void zipf_apply(const zipf_t *z, const tdesc_t *t, int64_t r, bl_rng_t *rng, float *x)
{
    switch (t->zrole) {
    case ZR_EMBD:
        for (int64_t i = z->d0; i < z->c0; i++)
            x[i] = (float)(z->a * (gumbel(rng) - EULER_GAMMA) / GUMBEL_STD);
        for (int64_t i = z->c0; i < z->n_embd; i++)
            x[i] = (float)z->a;
        break;
    case ZR_HIDE:
    case ZR_READ:
        for (int64_t i = z->c0; i < z->n_embd; i++)
            x[i] = 0.0f;
        break;
    case ZR_ROUTER_NORM:
        for (int64_t i = z->d0; i < z->n_embd; i++)
            x[i] = 1.0f;
        break;
    case ZR_WRITE: /* rows are output channels, expert after expert */
        if (r % t->ne[1] >= z->d0)
            memset(x, 0, sizeof *x * (size_t)t->ne[0]);
        break;
    default:
        break;
    }
}

/* Rows are drawn and quantized by several threads into a batch buffer, which the
 * main thread then writes in row order. Each row depends only on its own key, so
 * the bytes are the same for any thread count. */
#define BATCH_BYTES (8u << 20)

typedef struct job {
    const tdesc_t *t;
    const zipf_t *z;
    uint64_t key;
    int64_t r0, r1;   /* rows [r0, r1) */
    size_t row_bytes;
    uint8_t *out;     /* row r goes to out + (r - r0) * row_bytes */
    float *row;       /* (ne[0]) scratch */
    float *head;      /* KIND_K_B: (qk_nope x kv_lora) scratch, the k rows of attn_kv_b */
    int64_t head_id;  /* the head whose rows head holds; -1: none */
    int rc;
} job_t;

/* Row r of a deepseek2 attn_v_b or attn_k_b, from the rows of the attn_kv_b it is
 * split from (key is that tensor's; attn_kv_b holds, per head, qk_nope k rows then
 * v_head v rows of kv_lora values). v_b's row (h, j) is v row j of head h; k_b's
 * row (h, c) is column c of head h's k rows, which are drawn into j->head once per
 * head the job meets. */
static void draw_split_row(job_t *j, int64_t r, float *x)
{
    const tdesc_t *t = j->t;
    const int64_t nope = t->qk_nope, per_head = t->qk_nope + t->v_head;
    bl_rng_t rng;
    if (t->kind == KIND_V_B) {
        const int64_t h = r / t->ne[1], v = r % t->ne[1];
        rng_for_row(&rng, j->key, (uint64_t)(h * per_head + nope + v));
        draw_row(&rng, x, t->ne[0], t->std, 0.0);
        return;
    }
    const int64_t kl = t->ne[1], h = r / kl, c = r % kl;
    if (j->head_id != h) {
        for (int64_t d = 0; d < nope; d++) {
            rng_for_row(&rng, j->key, (uint64_t)(h * per_head + d));
            draw_row(&rng, j->head + d * kl, kl, t->std, 0.0);
        }
        j->head_id = h;
    }
    for (int64_t d = 0; d < nope; d++)
        x[d] = j->head[d * kl + c];
}

static void *run_job(void *p)
{
    job_t *j = p;
    const tdesc_t *t = j->t;
    j->rc = 0;
    for (int64_t r = j->r0; r < j->r1 && !j->rc; r++) {
        bl_rng_t rng;
        rng_for_row(&rng, j->key, (uint64_t)r);
        if (t->kind == KIND_K_B || t->kind == KIND_V_B)
            draw_split_row(j, r, j->row);
        else if (t->zrole == ZR_ROUTER)
            zipf_router_row(j->z, r, j->row);
        else if (t->kind == KIND_NORM)
            draw_row(&rng, j->row, t->ne[0], 0.05, 1.0); /* norm gains near 1 */
        else if (t->kind == KIND_SSM_A)
            draw_ssm_a(&rng, j->row, t->ne[0]);
        else
            draw_row(&rng, j->row, t->ne[0], t->std, t->mean);
        if (t->zrole != ZR_NONE)
            zipf_apply(j->z, t, r, &rng, j->row);
        j->rc = bl_quantize_row_ref(t->type, j->row, j->out + (size_t)(r - j->r0) * j->row_bytes,
                                    t->ne[0]);
    }
    return NULL;
}

typedef struct gen {
    const tlist_t *L;
    uint64_t seed;
    int n_threads;
    zipf_t z;
    float *rows[MAX_THREADS]; /* per thread: one row of the widest tensor */
    float *heads[MAX_THREADS]; /* per thread, with attn_k_b: one head's k rows (job_t) */
    uint8_t *batch;           /* BATCH_BYTES, or one row if a row is larger */
    size_t batch_bytes;
    int bench_fill;           /* --bench-fill: quantized matrices repeat BENCH_POOL rows */
} gen_t;

/* --bench-fill: the rows a quantized matrix's others are copies of */
#define BENCH_POOL 256

/* --header-only: tensor i's bytes left a hole */
static int skip_tensor(void *ud, bl_gguf_writer_t *w, size_t i, bl_err_t *err)
{
    (void)ud;
    return bl_gw_skip_data(w, bl_gw_tensor_nbytes(w, i), err);
}

static int fill_tensor(void *ud, bl_gguf_writer_t *w, size_t i, bl_err_t *err)
{
    gen_t *g = ud;
    const tdesc_t *t = &g->L->t[i];
    size_t row_bytes;
    int rc = bl_row_bytes((uint32_t)t->type, t->ne[0], &row_bytes, err);
    if (rc)
        return rc;
    /* attn_k_b and attn_v_b draw the rows of the attn_kv_b they are split from */
    uint64_t key = bl_splitmix64(&(uint64_t){g->seed ^ fnv1a(t->src[0] ? t->src : t->name)});
    if (t->zrole == ZR_ROUTER)
        zipf_layer(&g->z, key);
    int64_t rows = t->ne[1] * t->ne[2];
    int64_t per_batch = (int64_t)(g->batch_bytes / row_bytes);
    /* --bench-fill: the first BENCH_POOL rows of a quantized matrix as always (one
     * batch), the others copies of them in a random order (filled below); f32 and
     * f16 tensors (norms, routers: what decides the routing) stay whole */
    const int pool = g->bench_fill && rows > BENCH_POOL && per_batch >= BENCH_POOL &&
                     t->type != BL_TYPE_F32 && t->type != BL_TYPE_F16 && t->type != BL_TYPE_BF16;
    const int64_t computed = pool ? BENCH_POOL : rows;
    if (pool)
        per_batch = BENCH_POOL;
    for (int64_t b = 0; b < computed; b += per_batch) {
        int64_t n = rows - b < per_batch ? rows - b : per_batch;
        int nt = n < g->n_threads ? (int)n : g->n_threads;
        job_t jobs[MAX_THREADS];
        pthread_t tid[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        for (int k = 0; k < nt; k++) {
            int64_t r0 = b + n * k / nt, r1 = b + n * (k + 1) / nt;
            jobs[k] = (job_t){t, &g->z, key, r0, r1, row_bytes,
                              g->batch + (size_t)(r0 - b) * row_bytes, g->rows[k], g->heads[k],
                              -1, 0};
        }
        /* Job 0 runs here; a thread that cannot start runs here too. */
        for (int k = 1; k < nt; k++)
            started[k] = pthread_create(&tid[k], NULL, run_job, &jobs[k]) == 0;
        run_job(&jobs[0]);
        for (int k = 1; k < nt; k++) {
            if (started[k])
                pthread_join(tid[k], NULL);
            else
                run_job(&jobs[k]);
        }
        for (int k = 0; k < nt; k++)
            if (jobs[k].rc)
                return bl_err_set(err, jobs[k].rc, "%s: quantizing to %s failed: %s", t->name,
                                  bl_type_info((uint32_t)t->type)->name, bl_strerror(jobs[k].rc));
        if ((rc = bl_gw_write_data(w, g->batch, (size_t)n * row_bytes, err)))
            return rc;
    }
    if (!pool)
        return 0;
    uint8_t *src = malloc((size_t)BENCH_POOL * row_bytes);
    if (!src)
        return bl_err_set(err, BL_ENOMEM, "%s: out of memory for %d rows", t->name, BENCH_POOL);
    memcpy(src, g->batch, (size_t)BENCH_POOL * row_bytes);
    per_batch = (int64_t)(g->batch_bytes / row_bytes);
    for (int64_t b = BENCH_POOL; b < rows && rc == 0; b += per_batch) {
        const int64_t n = rows - b < per_batch ? rows - b : per_batch;
        for (int64_t r = 0; r < n; r++) {
            uint64_t s = key + (uint64_t)(b + r);
            memcpy(g->batch + (size_t)r * row_bytes, src + (size_t)(bl_splitmix64(&s) % BENCH_POOL) * row_bytes,
                   row_bytes);
        }
        rc = bl_gw_write_data(w, g->batch, (size_t)n * row_bytes, err);
    }
    free(src);
    return rc;
}

/* --- metadata -------------------------------------------------------------------------- */

/* general.file_type: llama.cpp's name for the file's main type (LLAMA_FTYPE_*);
 * the q4_K and q5_K mixes with q6_K for the sensitive matrices are its _M kinds.
 * A gpt-oss file with MXFP4 experts is MOSTLY_MXFP4_MOE (write_metadata). */
#define FTYPE_MXFP4_MOE 38
static uint32_t file_type(bl_type_t t)
{
    switch (t) {
    case BL_TYPE_F32: return 0;
    case BL_TYPE_F16: return 1;
    case BL_TYPE_Q8_0: return 7;
    case BL_TYPE_Q4_K: return 15;
    case BL_TYPE_Q5_K: return 17;
    case BL_TYPE_Q6_K: return 18;
    case BL_TYPE_BF16: return 32;
    default: return 0;
    }
}

static int write_metadata(bl_gguf_writer_t *w, const opts_t *o, const mk_vocab_t *v, bl_err_t *err)
{
    const char *arch = archs[o->arch].name;
    const int glm = o->arch == ARCH_GLM4MOE, ds = o->arch == ARCH_DEEPSEEK2;
    const int oss = o->arch == ARCH_GPTOSS, hyb = IS_HYBRID(o->arch);
    const int q35 = o->arch == ARCH_QWEN35MOE;
    const uint32_t ftype = oss && o->type_experts == BL_TYPE_MXFP4 ? FTYPE_MXFP4_MOE
                                                                    : file_type(o->type);
    /* deepseek2's attention keys: the latent cache's one head of kv_lora + n_rot
     * (MLA form), or the decompressed heads (legacy form) */
    const int64_t hk = o->n_qk_nope + o->n_rot;
    const int64_t n_kv = !ds ? o->n_head_kv : o->legacy_kv_b ? o->n_head : 1;
    const int64_t klen = !ds ? o->head_dim : o->legacy_kv_b ? hk : o->n_kv_lora + o->n_rot;
    const int64_t vlen = !ds ? o->head_dim : o->legacy_kv_b ? o->n_v_head : o->n_kv_lora;
    char key[128], name[96];
    int rc;
#define K(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    snprintf(name, sizeof name, "synthetic-%s-%lldL", o->preset ? o->preset->name : arch,
             (long long)o->n_layer);
    if (o->router_zipf > 0) /* the routing law, for whoever reads the file's name */
        snprintf(name + strlen(name), sizeof name - strlen(name), "-zipf%g", o->router_zipf);
    if ((rc = bl_gw_set_str(w, "general.architecture", arch, err)) ||
        (rc = bl_gw_set_str(w, "general.name", name, err)) ||
        (rc = bl_gw_set_u32(w, "general.alignment", BL_GGUF_DEFAULT_ALIGNMENT, err)) ||
        (rc = bl_gw_set_u32(w, "general.file_type", ftype, err)) ||
        (rc = bl_gw_set_u32(w, "general.quantization_version", 2, err)) ||
        (rc = bl_gw_set_u32(w, K("block_count"),
                            (uint32_t)(o->n_layer + (glm || ds || q35 ? o->n_nextn : 0)), err)) ||
        (rc = bl_gw_set_u32(w, K("context_length"), (uint32_t)o->n_ctx, err)) ||
        (rc = bl_gw_set_u32(w, K("embedding_length"), (uint32_t)o->n_embd, err)))
        return rc;
    /* the hybrids have no dense FFN */
    if (!hyb && (rc = bl_gw_set_u32(w, K("feed_forward_length"), (uint32_t)o->n_ff, err)))
        return rc;
    if ((rc = bl_gw_set_u32(w, K("attention.head_count"), (uint32_t)o->n_head, err)) ||
        (rc = bl_gw_set_u32(w, K("attention.head_count_kv"), (uint32_t)n_kv, err)) ||
        (rc = bl_gw_set_u32(w, K("attention.key_length"), (uint32_t)klen, err)) ||
        (rc = bl_gw_set_u32(w, K("attention.value_length"), (uint32_t)vlen, err)) ||
        (rc = bl_gw_set_f32(w, K("rope.freq_base"), (float)o->rope_base, err)) ||
        (rc = bl_gw_set_f32(w, K("attention.layer_norm_rms_epsilon"), (float)o->eps, err)))
        return rc;
    if (o->arch != ARCH_QWEN3 &&
        ((rc = bl_gw_set_u32(w, K("expert_count"), (uint32_t)o->n_expert, err)) ||
         (rc = bl_gw_set_u32(w, K("expert_used_count"), (uint32_t)o->n_expert_used, err)) ||
         (rc = bl_gw_set_u32(w, K("expert_feed_forward_length"), (uint32_t)o->n_ff_exp, err))))
        return rc;
    if ((glm || ds) &&
        ((rc = bl_gw_set_u32(w, K("rope.dimension_count"), (uint32_t)o->n_rot, err)) ||
         (rc = bl_gw_set_u32(w, K("expert_shared_count"), (uint32_t)o->n_shared, err)) ||
         (rc = bl_gw_set_u32(w, K("leading_dense_block_count"), (uint32_t)o->n_dense_lead,
                             err)) ||
         (rc = bl_gw_set_f32(w, K("expert_weights_scale"), (float)o->expert_scale, err)) ||
         (rc = bl_gw_set_bool(w, K("expert_weights_norm"), !o->no_expert_norm, err)) ||
         (rc = bl_gw_set_u32(w, K("expert_gating_func"), (uint32_t)o->gating, err))))
        return rc;
    /* deepseek2 files have no NextN layer unless asked for (the converter drops
     * DeepSeek-V3's), so the key is absent at 0, as there */
    if ((glm || (ds && o->n_nextn)) &&
        (rc = bl_gw_set_u32(w, K("nextn_predict_layers"), (uint32_t)o->n_nextn, err)))
        return rc;
    /* qwen3next and qwen35moe: the shared expert's width, the rotated dims (and
     * qwen35moe's IMRoPE sections), the DeltaNet shapes, the layer kinds (as an
     * interval, or one bool a block, the NextN ones attending), and qwen35moe's
     * NextN layers, whose key its files always carry */
    if (hyb) {
        const int64_t blocks = o->n_layer + o->n_nextn;
        if ((rc = bl_gw_set_u32(w, K("expert_shared_feed_forward_length"),
                                (uint32_t)o->n_ff_shexp, err)) ||
            (rc = bl_gw_set_u32(w, K("rope.dimension_count"), (uint32_t)o->n_rot, err)))
            return rc;
        if (q35 && (rc = bl_gw_set_arr(w, K("rope.dimension_sections"), BL_GGUF_I32,
                                       o->rope_sections, 4, err)))
            return rc;
        if ((rc = bl_gw_set_u32(w, K("ssm.conv_kernel"), (uint32_t)o->ssm_conv, err)) ||
            (rc = bl_gw_set_u32(w, K("ssm.state_size"), (uint32_t)o->ssm_state, err)) ||
            (rc = bl_gw_set_u32(w, K("ssm.group_count"), (uint32_t)o->ssm_groups, err)) ||
            (rc = bl_gw_set_u32(w, K("ssm.time_step_rank"), (uint32_t)o->ssm_heads, err)) ||
            (rc = bl_gw_set_u32(w, K("ssm.inner_size"), (uint32_t)(o->ssm_state * o->ssm_heads),
                                err)))
            return rc;
        if (o->recurrent_pat) {
            uint8_t *flags = calloc((size_t)blocks, 1);
            if (!flags)
                return bl_err_set(err, BL_ENOMEM, "out of memory for %lld layer kinds",
                                  (long long)blocks);
            for (int64_t l = 0; l < blocks; l++)
                flags[l] = (uint8_t)layer_recurrent(o, l);
            rc = bl_gw_set_arr(w, K("attention.recurrent_layers"), BL_GGUF_BOOL, flags,
                               (size_t)blocks, err);
            free(flags);
        } else {
            rc = bl_gw_set_u32(w, K("full_attention_interval"), (uint32_t)o->full_attn_interval,
                               err);
        }
        if (rc || (q35 && (rc = bl_gw_set_u32(w, K("nextn_predict_layers"),
                                              (uint32_t)o->n_nextn, err))))
            return rc;
    }
    if (ds) {
        if (o->n_q_lora &&
            (rc = bl_gw_set_u32(w, K("attention.q_lora_rank"), (uint32_t)o->n_q_lora, err)))
            return rc;
        if ((rc = bl_gw_set_u32(w, K("attention.kv_lora_rank"), (uint32_t)o->n_kv_lora, err)))
            return rc;
        if (!o->legacy_kv_b &&
            ((rc = bl_gw_set_u32(w, K("attention.key_length_mla"), (uint32_t)hk, err)) ||
             (rc = bl_gw_set_u32(w, K("attention.value_length_mla"), (uint32_t)o->n_v_head,
                                 err))))
            return rc;
        if ((rc = bl_gw_set_u32(w, K("expert_group_count"), (uint32_t)o->n_group, err)) ||
            (rc = bl_gw_set_u32(w, K("expert_group_used_count"), (uint32_t)o->n_group_used,
                                err)))
            return rc;
        if (o->yarn > 0 &&
            ((rc = bl_gw_set_str(w, K("rope.scaling.type"), "yarn", err)) ||
             (rc = bl_gw_set_f32(w, K("rope.scaling.factor"), (float)o->yarn, err)) ||
             (rc = bl_gw_set_u32(w, K("rope.scaling.original_context_length"),
                                 (uint32_t)o->yarn_orig_ctx, err)) ||
             (rc = bl_gw_set_f32(w, K("rope.scaling.yarn_log_multiplier"),
                                 (float)o->yarn_log_mul, err))))
            return rc;
    }
    /* gpt-oss: whole heads rotated; the window, and its period when not the usual
     * 2; expert_weights_scale only when asked for (a key the readers ignore for
     * gpt-oss: a file to check that); YaRN without a log multiplier */
    if (oss) {
        if ((rc = bl_gw_set_u32(w, K("rope.dimension_count"), (uint32_t)o->n_rot, err)) ||
            (rc = bl_gw_set_u32(w, K("attention.sliding_window"), (uint32_t)o->n_swa, err)))
            return rc;
        if (o->swa_period != 2 &&
            (rc = bl_gw_set_u32(w, K("attention.sliding_window_pattern"),
                                (uint32_t)o->swa_period, err)))
            return rc;
        if (o->expert_scale_set &&
            (rc = bl_gw_set_f32(w, K("expert_weights_scale"), (float)o->expert_scale, err)))
            return rc;
        if (o->yarn > 0 &&
            ((rc = bl_gw_set_str(w, K("rope.scaling.type"), "yarn", err)) ||
             (rc = bl_gw_set_f32(w, K("rope.scaling.factor"), (float)o->yarn, err)) ||
             (rc = bl_gw_set_u32(w, K("rope.scaling.original_context_length"),
                                 (uint32_t)o->yarn_orig_ctx, err))))
            return rc;
    }
#undef K
    if ((rc = bl_gw_set_str(w, "tokenizer.ggml.model", "gpt2", err)) ||
        (rc = bl_gw_set_str(w, "tokenizer.ggml.pre", archs[o->arch].pre, err)) ||
        (rc = bl_gw_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, v->n,
                                err)) ||
        (rc = bl_gw_set_arr(w, "tokenizer.ggml.token_type", BL_GGUF_I32, v->types, v->n, err)) ||
        (rc = bl_gw_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                v->n_merges, err)))
        return rc;
    if (v->eos_id >= 0 && (rc = bl_gw_set_u32(w, "tokenizer.ggml.eos_token_id",
                                              (uint32_t)v->eos_id, err)))
        return rc;
    if (v->pad_id >= 0 && (rc = bl_gw_set_u32(w, "tokenizer.ggml.padding_token_id",
                                              (uint32_t)v->pad_id, err)))
        return rc;
    if (v->bos_id >= 0 && (rc = bl_gw_set_u32(w, "tokenizer.ggml.bos_token_id",
                                              (uint32_t)v->bos_id, err)))
        return rc;
    if (v->eot_id >= 0 && (rc = bl_gw_set_u32(w, "tokenizer.ggml.eot_token_id",
                                              (uint32_t)v->eot_id, err)))
        return rc;
    if (v->eom_id >= 0 && (rc = bl_gw_set_u32(w, "tokenizer.ggml.eom_token_id",
                                              (uint32_t)v->eom_id, err)))
        return rc;
    if ((rc = bl_gw_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos, err)))
        return rc;
    if (v->chat_template && (rc = bl_gw_set_str(w, "tokenizer.chat_template", v->chat_template, err)))
        return rc;
    return 0;
}

/* --- main -------------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;

    double t0 = now_s();
    bl_err_t err = {0};
    mk_vocab_t v = {0};
    tlist_t L = {0};
    bl_gguf_writer_t *w = NULL;
    gen_t g = {0};
    int status = 1;

    /* Shapes are checked before the (slow) tokenizer is read; the vocabulary size
     * only sets the embedding's row count, which no block rule depends on. */
    if (build_tensors(&o, &L)) {
        bl_err_set(&err, BL_ENOMEM, "out of memory for the tensor list");
        goto fail;
    }
    if (check_blocks(&L)) {
        status = EXIT_USAGE; /* check_blocks printed which flag */
        goto fail;
    }
    L.n = 0;

    if (o.tok_dir) {
        if (mk_vocab_load(&v, o.tok_dir, &err))
            goto fail;
        /* The checkpoints have more embedding rows than their tokenizers have ids. */
        const int64_t rows = o.preset ? o.preset->n_vocab : archs[o.arch].tok_rows;
        if (!o.vocab_set)
            o.n_vocab = (int64_t)v.n > rows ? (int64_t)v.n : rows;
        if (o.arch == ARCH_GLM4MOE)
            mk_vocab_glm_ids(&v);
        if (o.arch == ARCH_GPTOSS)
            mk_vocab_harmony_ids(&v);
        if ((size_t)o.n_vocab < v.n) {
            status = flag_error("--vocab %lld is smaller than the %zu tokens of %s",
                                (long long)o.n_vocab, v.n, o.tok_dir);
            goto fail;
        }
        if (mk_vocab_pad(&v, (size_t)o.n_vocab, &err))
            goto fail;
    } else if (mk_vocab_builtin(&v, (size_t)o.n_vocab, archs[o.arch].family, &err)) {
        goto fail;
    }

    if (build_tensors(&o, &L)) {
        bl_err_set(&err, BL_ENOMEM, "out of memory for the tensor list");
        goto fail;
    }

    int64_t max_row = 0, max_head = 0;
    uint64_t n_params = 0;
    for (size_t i = 0; i < L.n; i++) {
        if (L.t[i].ne[0] > max_row)
            max_row = L.t[i].ne[0];
        if (L.t[i].kind == KIND_K_B && L.t[i].ne[0] * L.t[i].ne[1] > max_head)
            max_head = L.t[i].ne[0] * L.t[i].ne[1];
        n_params += (uint64_t)L.t[i].ne[0] * (uint64_t)L.t[i].ne[1] * (uint64_t)L.t[i].ne[2];
    }
    g.L = &L;
    g.seed = o.seed;
    g.n_threads = (int)o.n_threads;
    if (o.router_zipf > 0) {
        g.z = (zipf_t){.s = o.router_zipf, .n_embd = o.n_embd, .n_expert = o.n_expert,
                       .c0 = o.n_embd - ZIPF_CONST_CH, .a = embd_std(&o)};
        g.z.d0 = g.z.c0 - o.n_expert;
        g.z.rank = malloc(sizeof *g.z.rank * (size_t)o.n_expert);
        g.z.chan = malloc(sizeof *g.z.chan * (size_t)o.n_expert);
        if (!g.z.rank || !g.z.chan) {
            bl_err_set(&err, BL_ENOMEM, "out of memory for the router of %lld experts",
                       (long long)o.n_expert);
            goto fail;
        }
    }
    /* A row is at most 4 bytes per value (f32); a batch holds at least one. */
    g.bench_fill = (int)o.bench_fill;
    g.batch_bytes = (size_t)max_row * sizeof(float) > BATCH_BYTES ? (size_t)max_row * sizeof(float)
                                                                   : BATCH_BYTES;
    g.batch = malloc(g.batch_bytes);
    int nomem = !g.batch;
    for (int k = 0; k < g.n_threads; k++) {
        nomem |= !(g.rows[k] = malloc((size_t)max_row * sizeof(float)));
        if (max_head)
            nomem |= !(g.heads[k] = malloc((size_t)max_head * sizeof(float)));
    }
    if (nomem) {
        bl_err_set(&err, BL_ENOMEM, "out of memory for rows of %lld values", (long long)max_row);
        goto fail;
    }

    if (bl_gw_create(&w, &err) || write_metadata(w, &o, &v, &err))
        goto fail;
    for (size_t i = 0; i < L.n; i++)
        if (bl_gw_add_tensor(w, L.t[i].name, L.t[i].type, L.t[i].n_dims, L.t[i].ne, &err))
            goto fail;
    if (bl_gw_write_file(w, o.out, o.header_only ? skip_tensor : fill_tensor, &g, &err))
        goto fail;

    char layers[96] = "";
    if (o.arch == ARCH_GLM4MOE || o.arch == ARCH_DEEPSEEK2)
        snprintf(layers, sizeof layers, " + %lld NextN", (long long)o.n_nextn);
    if (IS_HYBRID(o.arch)) {
        int64_t n_rec = 0;
        for (int64_t l = 0; l < o.n_layer; l++)
            n_rec += layer_recurrent(&o, l);
        snprintf(layers, sizeof layers, " (%lld DeltaNet, %lld attention)", (long long)n_rec,
                 (long long)(o.n_layer - n_rec));
        if (o.arch == ARCH_QWEN35MOE)
            snprintf(layers + strlen(layers), sizeof layers - strlen(layers), " + %lld NextN",
                     (long long)o.n_nextn);
    }
    if (o.arch == ARCH_GPTOSS)
        snprintf(layers, sizeof layers, " (sliding window %lld, period %lld)",
                 (long long)o.n_swa, (long long)o.swa_period);
    printf("wrote %s: %s, %lld layers%s, n_embd %lld, %zu tokens, %zu tensors, %.2fM parameters, "
           "%llu bytes in %.2f s\n",
           o.out, archs[o.arch].name, (long long)o.n_layer, layers, (long long)o.n_embd, v.n, L.n,
           (double)n_params / 1e6, (unsigned long long)bl_gw_bytes_written(w), now_s() - t0);
    status = 0;
fail:
    /* Usage errors were reported where they were found; the rest carry err. */
    if (status == 1)
        fprintf(stderr, PROG ": %s\n", err.msg[0] ? err.msg : bl_strerror(err.code));
    bl_gw_destroy(w);
    free(g.batch);
    free(g.z.rank);
    free(g.z.chan);
    for (int k = 0; k < MAX_THREADS; k++) {
        free(g.rows[k]);
        free(g.heads[k]);
    }
    free(L.t);
    mk_vocab_free(&v);
    return status;
}
