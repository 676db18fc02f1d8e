/* libFuzzer target for common/arch.c and common/plan.c: every GGUF file is untrusted,
 * and what the GGUF reader accepts goes on to the architecture's reader and the
 * placement plan. When the input opens (bl_gguf_open_memory) and bl_arch_read accepts
 * it, the facts are checked against arch.h's promises; bl_arch_role runs on every
 * tensor name (and a few made-up ones), bl_arch_tensor on the tensors the worker
 * checks with the shapes the architecture implies (for the first, the first MoE, the
 * last and the first NextN layer), and bl_plan_build then bl_plan_format on made-up
 * device lists with several sets of placement flags (no GPU is needed: a plan reads
 * only metadata and tensor sizes), each plan checked (stages cover the layers in
 * order, sizes add up).
 *
 * arch.c and plan.c are compiled into this target (tests/fuzz/meson.build) with
 * -fsanitize=unsigned-integer-overflow on top of the build's ASan and UBSan, so a byte
 * count that wraps around is a finding too.
 *
 * Seeds: tests/fuzz/make_corpus.py (its arch_* files, written here, and the mk_* files
 * bloomery-mkmodel writes: tiny models of each architecture). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "args.h"
#include "gguf.h"
#include "plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "fuzz_arch: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);      \
            abort();                                                                                 \
        }                                                                                            \
    } while (0)

#define GIB ((uint64_t)1 << 30)
#define MIB ((uint64_t)1 << 20)

/* --- the architecture's facts ------------------------------------------------------ */

/* What arch.h promises of the facts bl_arch_read accepted. */
static void check_arch(const bl_arch_t *a)
{
    /* any architecture arch.c reads (more may come); these four are known here */
    CHECK(a->name[0] != '\0' && memchr(a->name, '\0', sizeof a->name) != NULL);
    const int ds2 = !strcmp(a->name, "deepseek2");
    if (!strcmp(a->name, "qwen3"))
        CHECK(!a->moe);
    if (!strcmp(a->name, "qwen3moe") || !strcmp(a->name, "glm4moe") || ds2)
        CHECK(a->moe);
    CHECK(a->n_layer_file >= 1 && a->n_layer_file <= BL_ARCH_MAX_LAYERS);
    CHECK(a->n_layer >= 1 && a->n_nextn >= 0 && a->n_layer + a->n_nextn == a->n_layer_file);
    CHECK(a->n_dense_lead >= 0 && a->n_dense_lead <= a->n_layer);
    CHECK(a->n_embd >= 1 && a->n_embd <= BL_ARCH_MAX_DIM);
    CHECK(a->n_head >= 1 && a->n_head <= BL_ARCH_MAX_DIM);
    CHECK(a->n_head_kv >= 1 && a->n_head_kv <= a->n_head);
    CHECK(a->head_dim >= 1 && a->n_head * a->head_dim <= BL_ARCH_MAX_DIM);
    CHECK(a->n_rot >= 2 && a->n_rot % 2 == 0 && a->n_rot <= a->head_dim);
    CHECK(a->n_vocab >= 1 && a->n_vocab <= BL_ARCH_MAX_VOCAB);
    CHECK(a->n_ctx_train >= 1 && a->n_ctx_train <= BL_ARCH_MAX_CTX);
    /* llama.cpp's numbering of the router's functions */
    CHECK(a->gating >= BL_GATING_SOFTMAX && a->gating <= 16);
    if (!strcmp(a->name, "glm4moe") || ds2)
        CHECK(a->gating == BL_GATING_SOFTMAX || a->gating == BL_GATING_SIGMOID);
    CHECK(a->ffn_norm != NULL && (a->cache == BL_CACHE_KV || a->cache == BL_CACHE_HYBRID));
    CHECK(a->cache_prefix_cut == (a->cache == BL_CACHE_KV));
    if (a->cache == BL_CACHE_HYBRID) {
        /* the DeltaNet layers' shapes, and a state whose bytes fit a size_t */
        CHECK(a->ssm_conv >= 2 && a->ssm_conv <= 64 && a->ssm_state >= 1 && a->ssm_groups >= 1);
        CHECK(a->ssm_heads >= a->ssm_groups && a->ssm_heads % a->ssm_groups == 0);
        CHECK(bl_arch_conv_channels(a) <= BL_ARCH_MAX_DIM && bl_arch_rec_floats(a) <= ((int64_t)1 << 32));
        CHECK(a->moe && a->n_ff_shexp >= 1 && a->shexp_gate && a->attn_gate);
        for (int64_t l = a->n_layer; l < a->n_layer_file; l++)
            CHECK(!bl_arch_layer_recurrent(a, l)); /* NextN layers attend */
    } else {
        CHECK(a->ssm_heads == 0 && bl_arch_rec_floats(a) == 0);
        for (int64_t l = 0; l < a->n_layer_file; l++)
            CHECK(!bl_arch_layer_recurrent(a, l));
    }
    if (a->moe) {
        CHECK(a->n_expert >= 1 && a->n_expert <= BL_ARCH_MAX_EXPERTS);
        CHECK(a->n_expert_used >= 1 && a->n_expert_used <= a->n_expert);
        CHECK(a->n_ff_exp >= 1 && a->n_ff_exp <= BL_ARCH_MAX_DIM);
        CHECK(a->n_ff_shexp >= 0 && a->n_ff_shexp <= 64 * (int64_t)BL_ARCH_MAX_DIM);
    }
    /* a dense FFN wherever a layer has one */
    if (!a->moe || a->n_dense_lead > 0)
        CHECK(a->n_ff >= 1 && a->n_ff <= BL_ARCH_MAX_DIM);
    if (ds2) {
        CHECK(a->n_head_kv == 1 && a->head_dim == a->kv_lora + a->n_rot);
        CHECK(a->kv_lora >= 1 && a->q_lora >= 0 && a->q_lora <= BL_ARCH_MAX_DIM);
        CHECK(a->head_k > a->n_rot && a->head_v >= 1);
        CHECK(a->n_head * a->head_k <= BL_ARCH_MAX_DIM);
        CHECK(a->n_group >= 1 && a->n_expert % a->n_group == 0);
        CHECK(a->topk_group >= 1 && a->topk_group <= a->n_group);
    }
    if (!strcmp(a->name, "qwen3moe") || !strcmp(a->name, "qwen3"))
        CHECK(a->n_dense_lead == 0 && a->n_nextn == 0);
    sink += (uint64_t)(a->rope_freq_scale + a->rope_ext_factor + a->rope_corr_lo + a->rope_corr_hi +
                       a->rope_mscale + a->attn_scale + a->rope_base + a->eps + a->expert_scale > 0);
}

/* --- roles ------------------------------------------------------------------------- */

static void check_role(const bl_arch_t *a, const char *name)
{
    int64_t l = -2;
    const bl_role_t r = bl_arch_role(a, name, &l);
    CHECK(r >= BL_ROLE_OTHER && r <= BL_ROLE_FFN);
    CHECK(bl_role_name(r) != NULL);
    switch (r) {
    case BL_ROLE_OTHER: case BL_ROLE_TOKEN_EMBD: case BL_ROLE_OUTPUT_NORM: case BL_ROLE_OUTPUT:
        CHECK(l == -1);
        break;
    case BL_ROLE_GATE_INP: case BL_ROLE_EXPERTS:
        CHECK(l >= 0 && l < a->n_layer && bl_arch_layer_moe(a, l));
        break;
    default:
        CHECK(l >= 0 && l < a->n_layer);
        break;
    }
}

static void walk_roles(const bl_arch_t *a, const bl_gguf_t *g)
{
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++)
        check_role(a, bl_gguf_tensor_at(g, i)->name);
    /* names a file could hold: the layer number's edges and what strtoll reads */
    char n[96];
    static const char *const made_up[] = {"blk.", "blk.0", "blk.0.", "blk..attn_q.weight", "blk.-1.attn_q.weight",
                                          "blk.+0.attn_q.weight", "blk. 0.attn_q.weight", "blk.0x0.attn_q.weight",
                                          "blk.99999999999999999999.attn_q.weight",
                                          "blk.9223372036854775807.ffn_up_exps.weight", "", "token_embd.weightx"};
    for (size_t i = 0; i < sizeof made_up / sizeof *made_up; i++)
        check_role(a, made_up[i]);
    static const char *const tails[] = {"ffn_gate_exps.weight", "attn_q.bias", "exp_probs_b.bias",
                                        "ffn_up_shexp.weight", "ffn_down.weight", "attn_kv_b.weight"};
    const int64_t layers[] = {0, a->n_dense_lead, a->n_layer - 1, a->n_layer, a->n_layer_file};
    for (size_t i = 0; i < sizeof layers / sizeof *layers; i++)
        for (size_t j = 0; j < sizeof tails / sizeof *tails; j++) {
            snprintf(n, sizeof n, "blk.%lld.%s", (long long)layers[i], tails[j]);
            check_role(a, n);
        }
}

/* --- tensors ----------------------------------------------------------------------- */

/* bl_arch_tensor on name with the shape the worker asks for; what it accepts must be
 * that shape, with its bytes inside the file. */
static void tensor(const bl_gguf_t *g, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int need_f32)
{
    const bl_gguf_tensor_t *t = NULL;
    bl_err_t err = {0};
    const int rc = bl_arch_tensor(g, "fuzz.gguf", name, ne0, ne1, ne2, need_f32, &t, &err);
    if (rc < 0) {
        CHECK(err.msg[0] != '\0');
        return;
    }
    CHECK(rc == 0 && t != NULL && t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == ne2 && t->ne[3] == 1);
    CHECK(t->nbytes > 0 && (uintptr_t)t->data % 4 == 0);
    const uint8_t *p = t->data;
    sink += p[0] + p[t->nbytes - 1];
}

static void tensors_of_layer(const bl_arch_t *a, const bl_gguf_t *g, int64_t l)
{
    const int64_t E = a->n_embd, H = a->n_head;
    char n[96];
#define T(s, ne0, ne1, ne2, f32) (snprintf(n, sizeof n, "blk.%lld.%s", (long long)l, s), tensor(g, n, ne0, ne1, ne2, f32))
    T("attn_norm.weight", E, 1, 1, 1);
    if (!strcmp(a->name, "deepseek2")) {
        const int64_t r = a->kv_lora, nope = a->head_k - a->n_rot;
        T("attn_kv_a_mqa.weight", E, r + a->n_rot, 1, 0);
        T("attn_kv_a_norm.weight", r, 1, 1, 1);
        T("attn_output.weight", H * a->head_v, E, 1, 0);
        if (a->q_lora > 0) {
            T("attn_q_a.weight", E, a->q_lora, 1, 0);
            T("attn_q_a_norm.weight", a->q_lora, 1, 1, 1);
            T("attn_q_b.weight", a->q_lora, H * a->head_k, 1, 0);
        } else {
            T("attn_q.weight", E, H * a->head_k, 1, 0);
        }
        if (a->mla_split) {
            T("attn_k_b.weight", nope, r, H, 0);
            T("attn_v_b.weight", r, a->head_v, H, 0);
        } else {
            T("attn_kv_b.weight", r, H * (nope + a->head_v), 1, 0);
        }
    } else {
        const int64_t nq = H * a->head_dim, nkv = a->n_head_kv * a->head_dim;
        T("attn_q.weight", E, nq, 1, 0);
        T("attn_k.weight", E, nkv, 1, 0);
        T("attn_v.weight", E, nkv, 1, 0);
        T("attn_output.weight", nq, E, 1, 0);
        if (a->qk_norm) {
            T("attn_q_norm.weight", a->head_dim, 1, 1, 1);
            T("attn_k_norm.weight", a->head_dim, 1, 1, 1);
        }
        if (a->attn_bias) {
            T("attn_q.bias", nq, 1, 1, 1);
            T("attn_k.bias", nkv, 1, 1, 1);
            T("attn_v.bias", nkv, 1, 1, 1);
        }
    }
    char norm[48];
    snprintf(norm, sizeof norm, "%s.weight", a->ffn_norm);
    T(norm, E, 1, 1, 1);
    /* a NextN layer (l >= n_layer) is a MoE layer */
    if (l < a->n_layer && !bl_arch_layer_moe(a, l)) {
        T("ffn_gate.weight", E, a->n_ff, 1, 0);
        T("ffn_up.weight", E, a->n_ff, 1, 0);
        T("ffn_down.weight", a->n_ff, E, 1, 0);
    } else if (a->moe) {
        T("ffn_gate_inp.weight", E, a->n_expert, 1, 0);
        T("ffn_gate_exps.weight", E, a->n_ff_exp, a->n_expert, 0);
        T("ffn_up_exps.weight", E, a->n_ff_exp, a->n_expert, 0);
        T("ffn_down_exps.weight", a->n_ff_exp, E, a->n_expert, 0);
        if (a->expert_bias)
            T("exp_probs_b.bias", a->n_expert, 1, 1, 1);
        if (a->n_ff_shexp) {
            T("ffn_gate_shexp.weight", E, a->n_ff_shexp, 1, 0);
            T("ffn_up_shexp.weight", E, a->n_ff_shexp, 1, 0);
            T("ffn_down_shexp.weight", a->n_ff_shexp, E, 1, 0);
        }
    }
    if (l >= a->n_layer) {
        T("nextn.eh_proj.weight", 2 * E, E, 1, 0);
        T("nextn.enorm.weight", E, 1, 1, 1);
        T("nextn.hnorm.weight", E, 1, 1, 1);
    }
#undef T
}

static void walk_tensors(const bl_arch_t *a, const bl_gguf_t *g)
{
    tensor(g, "token_embd.weight", a->n_embd, a->n_vocab, 1, 0);
    tensor(g, "output_norm.weight", a->n_embd, 1, 1, 1);
    if (!a->tied_output)
        tensor(g, "output.weight", a->n_embd, a->n_vocab, 1, 0);
    const int64_t layers[] = {0, a->moe ? a->n_dense_lead : 0, a->n_layer - 1, a->n_layer};
    for (size_t i = 0; i < sizeof layers / sizeof *layers; i++) {
        const int64_t l = layers[i];
        if ((i > 0 && l == layers[i - 1]) || l >= a->n_layer_file || (l == a->n_layer && a->n_nextn == 0))
            continue;
        tensors_of_layer(a, g, l);
    }
}

/* --- plans ------------------------------------------------------------------------- */

static uint64_t total_tensor_bytes(const bl_gguf_t *g)
{
    uint64_t s = 0;
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const uint64_t b = bl_gguf_tensor_at(g, i)->nbytes;
        s = s > UINT64_MAX - b ? UINT64_MAX : s + b;
    }
    return s;
}

static void check_plan(const bl_plan_t *p, const bl_arch_t *a, const bl_gguf_t *g, const bl_device_t *devs,
                       int n_devs)
{
    CHECK(p->n_stages >= 1 && p->n_stages <= BL_PLAN_MAX_STAGES);
    CHECK(p->n_layer == a->n_layer && p->n_expert == (a->moe ? a->n_expert : 0));
    const uint64_t all = total_tensor_bytes(g);
    uint64_t weights = 0;
    int64_t at = 0;
    for (int i = 0; i < p->n_stages; i++) {
        const bl_plan_stage_t *st = &p->stage[i];
        CHECK(st->lb == at && st->le > st->lb);
        at = st->le;
        int known = st->device == BL_PLAN_DEVICE_CPU;
        for (int d = 0; d < n_devs; d++)
            known |= devs[d].index == st->device;
        CHECK(known);
        CHECK(st->expert_bytes <= st->weight_bytes);
        if (st->device < 0)
            CHECK(st->scratch_bytes == 0);
        /* no byte count wraps: what a stage holds is the file's tensors (the head twice
         * at most, tied) */
        CHECK(st->weight_bytes / 2 <= all);
        weights += st->weight_bytes;
    }
    CHECK(at == a->n_layer);
    CHECK(weights / 2 <= all);
    CHECK(p->host_ram_bytes + p->host_disk_bytes == p->host_bytes && p->host_bytes <= all);
    int n_host = 0;
    for (int64_t l = 0; l < p->n_layer; l++) {
        const int h = bl_plan_layer_host(p, l);
        CHECK(!h || bl_arch_layer_moe(a, l));
        n_host += h;
    }
    CHECK(n_host == p->n_host_layers && p->hosttier == (n_host > 0));
    /* the text, whole and cut short */
    char buf[4096];
    const size_t need = bl_plan_format(p, NULL, 0);
    const size_t got = bl_plan_format(p, buf, sizeof buf);
    CHECK(got == need && strlen(buf) == (need < sizeof buf ? need : sizeof buf - 1));
    char tiny[7];
    CHECK(bl_plan_format(p, tiny, sizeof tiny) == need && strlen(tiny) <= 6);
}

/* Two cards: one with room to spare, one just over -fitt's default margin. */
static const bl_device_t k_cards[2] = {
    {.index = 0, .name = "NVIDIA Fuzz", .total_bytes = 96 * GIB, .free_bytes = 80 * GIB},
    {.index = 1, .name = "NVIDIA Fuzz", .total_bytes = 2 * GIB, .free_bytes = GIB + 2 * MIB},
};
static const bl_device_t k_small[1] = {
    {.index = 0, .name = "NVIDIA Fuzz", .total_bytes = 2 * GIB, .free_bytes = GIB + MIB},
};

static void plan(const bl_arch_t *a, const bl_gguf_t *g, const bl_device_t *devs, int n_devs,
                 const bl_place_opts_t *o)
{
    bl_plan_t p;
    bl_err_t err = {0};
    const int rc = bl_plan_build(&p, g, a, devs, n_devs, o, &err);
    if (rc < 0) {
        CHECK(err.msg[0] != '\0');
        CHECK(p.host == NULL);
        return;
    }
    CHECK(rc == 0);
    check_plan(&p, a, g, devs, n_devs);
    bl_plan_free(&p);
}

static void walk_plans(const bl_arch_t *a, const bl_gguf_t *g)
{
    /* what bloomery-serve passes by default: the context the model was trained for,
     * f16 cache, 512 rows a step */
    const bl_place_opts_t base = {.fit_target_mib = -1, .n_ctx_total = a->n_ctx_train, .kv_elem_bytes = 2.0,
                                  .n_batch = 512, .experts_ram = BL_EXPERTS_RAM_AUTO, .ram_avail = 16 * GIB};
    bl_place_opts_t o;
    char ngl[32], ts[] = "1,3";

    /* the CPU alone, its layers over up to three workers */
    o = base;
    o.n_cpu_stages = a->n_layer < 3 ? (int)a->n_layer : 3;
    plan(a, g, NULL, 0, &o);

    /* one card a little short of room: --fit moves experts, then layers, to the host */
    o = base;
    plan(a, g, k_small, 1, &o);

    /* two cards by proportion, the first layer on the CPU, every routed expert in host
     * RAM with one expert's worth of it, an f32 cache, --fit off (refused if over) */
    o = base;
    snprintf(ngl, sizeof ngl, "%lld", (long long)(a->n_layer - 1));
    o.gpu_layers = ngl;
    o.tensor_split = ts;
    o.cpu_moe = 1;
    o.fit = "off";
    o.kv_elem_bytes = 4.0;
    o.n_batch = 4096;
    o.experts_ram = 1;
    plan(a, g, k_cards, 2, &o);

    /* the second card alone, the first layers' experts in host RAM by -ncmoe and an
     * -ot pattern for the rest */
    static const char *const ot[] = {"exps=HOSTTIER"};
    o = base;
    o.devices = "cuda1,cuda0";
    o.split_mode = "none";
    o.main_gpu = 1;
    o.n_cpu_moe = a->n_layer < 2 ? a->n_layer : 2;
    o.override_tensor = ot;
    o.n_override_tensor = a->moe ? 1 : 0;
    o.experts_ram = 0;
    o.ram_avail = 0;
    plan(a, g, k_cards, 2, &o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bl_gguf_t *g = NULL;
    bl_err_t err = {0};
    if (bl_gguf_open_memory(&g, data, size, "fuzz.gguf", &err) != 0)
        return 0;
    bl_arch_t a;
    const int rc = bl_arch_read(&a, g, "fuzz.gguf", &err);
    if (rc == 0) {
        check_arch(&a);
        walk_roles(&a, g);
        walk_tensors(&a, g);
        walk_plans(&a, g);
    } else {
        CHECK(rc < 0 && err.msg[0] != '\0');
    }
    bl_gguf_close(g);
    return 0;
}
