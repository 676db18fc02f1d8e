/* The placement plan (plan.h). Regexes of -ot are PCRE2's, searched anywhere in the
 * tensor name, as llama.cpp's std::regex_search does. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "args.h"
#include "gguf.h"
#include "plan.h"
#include "wmem.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((double)(1u << 30))
#define MAX_OVERRIDES 256
/* The largest piece of the head the CUDA backend dequantizes at once for a GEMM. */
#define HEAD_PIECE ((uint64_t)256 << 20)

enum { BUFT_STAGE = 0, BUFT_CPU, BUFT_CUDA, BUFT_HOSTTIER };
/* apply_overrides' per-layer choice for routed experts on card d, an expert tier */
#define BUFT_TIER(d) (16 + (d))

typedef struct override {
    pcre2_code *re;
    char text[160];  /* "RE=BUFT" as given, for messages */
    const char *flag;
    int buft, cuda;  /* BUFT_*, and the CUDA ordinal for BUFT_CUDA */
    int64_t hits;    /* tensors it decided */
    int64_t seen;    /* tensors it finds, decided by it or by an earlier pattern */
} override_t;

/* Bytes of each layer's parts, from the file's tensors. */
typedef struct sizes {
    uint64_t *dense;   /* (n_layer) attention, norms, router, dense FFN */
    uint64_t *experts; /* (n_layer) the three expert tensors */
    uint64_t *exp_f16; /* (n_layer) the largest of them in f16 where a card's prompt copies
                        * it so (bl_type_gemm_via_f16), else 0 */
    uint64_t embd, head, out_norm;
    uint64_t nextn;    /* the first NextN layer's tensors (blk.n_layer.*) */
} sizes_t;

void bl_plan_free(bl_plan_t *p)
{
    if (p) {
        free(p->host);
        free(p->tier_of);
        p->host = NULL;
        p->tier_of = NULL;
    }
}

int bl_plan_layer_host(const bl_plan_t *p, int64_t l)
{
    /* a layer's routed experts are placed together (host_layer, and the CPU stages'
     * clearing), so its first expert says for all: O(1) where the fit loops ask
     * for every layer after each move */
    return p->n_expert > 0 && p->host[l * p->n_expert] != 0;
}

int bl_plan_layer_node_hosttier(const bl_plan_t *p, int64_t l)
{
    if (!bl_plan_layer_host(p, l))
        return 0;
    for (int i = 0; i < p->n_stages; i++)
        if (l >= p->stage[i].lb && l < p->stage[i].le)
            return p->stage[i].node_hosttier;
    return 0;
}

/* Layer l's routed experts on an expert tier on card d (made here at its first
 * layer); a layer without them stays as it is. */
static const bl_device_t *device_of(const bl_device_t *devs, int n, int index);

static int tier_layer(bl_plan_t *p, const bl_arch_t *a, int64_t l, int d, const bl_device_t *devs, int n_devs,
                      bl_err_t *err)
{
    if (!bl_arch_layer_moe(a, l))
        return 0;
    int k = 0;
    while (k < p->n_tiers && p->tier[k].device != d)
        k++;
    if (k == p->n_tiers) {
        if (k == BL_PLAN_MAX_TIERS)
            return bl_err_set(err, BL_ENOTSUP, "--override-tensor: more than %d expert tiers", BL_PLAN_MAX_TIERS);
        p->tier[k] = (bl_plan_tier_t){.device = d};
        const bl_device_t *card = device_of(devs, n_devs, d);
        if (card)
            p->tier[k].card = *card;
        p->n_tiers++;
    }
    p->tier_of[l] = (uint8_t)(k + 1);
    return 0;
}

/* Whether layer l's routed experts are apart from its stage: host RAM or a tier. */
static int experts_apart(const bl_plan_t *p, int64_t l)
{
    return bl_plan_layer_host(p, l) || p->tier_of[l];
}

/* Puts layer l's routed experts in the hosttier; a layer without them (a leading
 * dense layer) stays as it is. */
static void host_layer(bl_plan_t *p, const bl_arch_t *a, int64_t l)
{
    if (bl_arch_layer_moe(a, l))
        memset(p->host + l * p->n_expert, 1, (size_t)p->n_expert);
}

static void free_overrides(override_t *ov, int n)
{
    for (int i = 0; i < n; i++)
        pcre2_code_free(ov[i].re);
}

/* "CPU", "CUDA0", "HOSTTIER" (any case). */
static int parse_buft(const char *s, size_t n, const bl_device_t *devs, int n_devs, int *buft, int *cuda)
{
    if (n == 3 && !strncasecmp(s, "CPU", 3)) {
        *buft = BUFT_CPU;
        return 0;
    }
    if (n == 8 && !strncasecmp(s, "HOSTTIER", 8)) {
        *buft = BUFT_HOSTTIER;
        return 0;
    }
    if (n > 4 && n < 12 && !strncasecmp(s, "CUDA", 4)) {
        char num[12];
        memcpy(num, s + 4, n - 4);
        num[n - 4] = '\0';
        int64_t v = -1;
        if (num[0] < '0' || num[0] > '9' || bl_parse_i64(num, &v) != 0 || v < 0)
            return BL_EINVAL;
        for (int i = 0; i < n_devs; i++)
            if (devs[i].index == v) {
                *buft = BUFT_CUDA;
                *cuda = (int)v;
                return 0;
            }
        return BL_ENOTSUP;
    }
    return BL_EINVAL;
}

static int add_override(override_t *ov, int *n, const char *flag, const char *re, size_t re_len, int buft,
                        int cuda, const char *text, bl_err_t *err)
{
    if (*n >= MAX_OVERRIDES)
        return bl_err_set(err, BL_EINVAL, "%s: more than %d patterns", flag, MAX_OVERRIDES);
    int ec = 0;
    PCRE2_SIZE eo = 0;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, re_len, 0, &ec, &eo, NULL);
    if (!c) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return bl_err_set(err, BL_EINVAL, "%s %s: the pattern does not compile at offset %zu: %s", flag, text,
                          (size_t)eo, (const char *)msg);
    }
    override_t *o = &ov[(*n)++];
    memset(o, 0, sizeof *o);
    o->re = c;
    o->flag = flag;
    o->buft = buft;
    o->cuda = cuda;
    snprintf(o->text, sizeof o->text, "%s", text);
    return 0;
}

/* The -ot patterns in order, then --cpu-moe's and -ncmoe's. */
static int read_overrides(const bl_place_opts_t *o, const bl_arch_t *a, const bl_device_t *devs, int n_devs,
                          override_t *ov, int *n, bl_err_t *err)
{
    *n = 0;
    int rc;
    for (int i = 0; i < o->n_override_tensor; i++) {
        const char *v = o->override_tensor[i];
        if (!*v)
            return bl_err_set(err, BL_EINVAL, "--override-tensor: an empty value (REGEX=BUFFER_TYPE)");
        for (const char *p = v; *p;) {
            const char *comma = strchr(p, ',');
            const size_t len = comma ? (size_t)(comma - p) : strlen(p);
            const char *eq = NULL;
            for (const char *q = p + len; q > p; q--) /* the last '=' of the item: a regex may hold one */
                if (q[-1] == '=') {
                    eq = q - 1;
                    break;
                }
            char text[160];
            snprintf(text, sizeof text, "%.*s", (int)(len < 150 ? len : 150), p);
            if (!eq || eq == p)
                return bl_err_set(err, BL_EINVAL, "--override-tensor %s: not REGEX=BUFFER_TYPE", text);
            int buft = 0, cuda = -1;
            rc = parse_buft(eq + 1, (size_t)(p + len - eq - 1), devs, n_devs, &buft, &cuda);
            if (o->hosts && (rc == BL_ENOTSUP || buft == BUFT_CUDA))
                /* CUDA0 names a card of each host; the experts stay on their stage's */
                return bl_err_set(err, BL_EINVAL, "--override-tensor %s: with a hostfile, routed experts stay on "
                                  "their stage's card, or go to CPU or HOSTTIER", text);
            if (rc == BL_ENOTSUP)
                return bl_err_set(err, BL_ENOTSUP, "--override-tensor %s: no such device (%d CUDA device%s here)",
                                  text, n_devs, n_devs == 1 ? "" : "s");
            if (rc)
                return bl_err_set(err, BL_EINVAL, "--override-tensor %s: buffer type '%.*s' is not CPU, CUDAn or "
                                  "HOSTTIER", text, (int)(p + len - eq - 1), eq + 1);
            if ((rc = add_override(ov, n, "--override-tensor", p, (size_t)(eq - p), buft, cuda, text, err)) < 0)
                return rc;
            if (!comma)
                break;
            p = comma + 1;
        }
    }
    static const char cpu_moe[] = "\\.ffn_(up|down|gate)_exps";
    if (o->cpu_moe && (rc = add_override(ov, n, "--cpu-moe", cpu_moe, strlen(cpu_moe), BUFT_CPU, -1,
                                         "\\.ffn_(up|down|gate)_exps=CPU", err)) < 0)
        return rc;
    if (o->n_cpu_moe < 0 || o->n_cpu_moe > a->n_layer)
        return bl_err_set(err, BL_EINVAL, "--n-cpu-moe %lld: the model has %lld layers", (long long)o->n_cpu_moe,
                          (long long)a->n_layer);
    if (o->n_cpu_moe > 0) {
        /* a pattern per layer keeps one rule for every override */
        for (int64_t l = 0; l < o->n_cpu_moe; l++) {
            char one[64], text[96];
            snprintf(one, sizeof one, "^blk\\.%lld\\.ffn_(up|down|gate)_exps", (long long)l);
            snprintf(text, sizeof text, "%s=CPU", one);
            if ((rc = add_override(ov, n, "--n-cpu-moe", one, strlen(one), BUFT_CPU, -1, text, err)) < 0)
                return rc;
        }
    }
    return 0;
}

static uint64_t max_u64(uint64_t x, uint64_t y) { return x > y ? x : y; }

static int read_sizes(const bl_gguf_t *g, const bl_arch_t *a, sizes_t *s, bl_err_t *err)
{
    s->dense = calloc((size_t)a->n_layer, sizeof *s->dense);
    s->experts = calloc((size_t)a->n_layer, sizeof *s->experts);
    s->exp_f16 = calloc((size_t)a->n_layer, sizeof *s->exp_f16);
    if (!s->dense || !s->experts || !s->exp_f16)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the plan of %lld layers", (long long)a->n_layer);
    char nextn[32];
    const int nextn_len = snprintf(nextn, sizeof nextn, "blk.%lld.", (long long)a->n_layer);
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        const char *name = t->name;
        if (a->n_nextn > 0 && !strncmp(name, nextn, (size_t)nextn_len))
            s->nextn += t->nbytes;
        int64_t l = -1;
        switch (bl_arch_role(a, name, &l)) {
        case BL_ROLE_TOKEN_EMBD: s->embd = t->nbytes; break;
        case BL_ROLE_OUTPUT: s->head = t->nbytes; break;
        case BL_ROLE_OUTPUT_NORM: s->out_norm = t->nbytes; break;
        case BL_ROLE_EXPERTS: {
            s->experts[l] += t->nbytes;
            uint64_t n = 1;
            for (uint32_t d = 0; d < t->n_dims; d++)
                n *= (uint64_t)t->ne[d];
            if (bl_type_gemm_via_f16(t->type))
                s->exp_f16[l] = max_u64(s->exp_f16[l], 2 * n);
            break;
        }
        case BL_ROLE_ATTN: case BL_ROLE_NORM: case BL_ROLE_GATE_INP: case BL_ROLE_FFN:
            s->dense[l] += t->nbytes;
            break;
        case BL_ROLE_OTHER: break;
        }
    }
    if (a->tied_output)
        s->head = s->embd;
    return 0;
}

void bl_plan_model_bytes(const bl_gguf_t *g, const bl_arch_t *a, bl_model_bytes_t *out)
{
    memset(out, 0, sizeof *out);
    for (uint64_t i = 0; i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        int64_t l = -1;
        const bl_role_t role = bl_arch_role(a, t->name, &l);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n *= (uint64_t)t->ne[d];
        const int r = (int)role >= 0 && (int)role < BL_PLAN_N_ROLES ? (int)role : BL_ROLE_OTHER;
        out->role_bytes[r] += t->nbytes;
        out->role_params[r] += n;
        if (t->type < BL_TYPE_COUNT) {
            out->type_bytes[t->type] += t->nbytes;
            out->type_tensors[t->type]++;
        }
        out->bytes += t->nbytes;
        out->params += n;
        out->tensors++;
    }
}

static void free_sizes(sizes_t *s)
{
    free(s->dense);
    free(s->experts);
    free(s->exp_f16);
}

/* What backend_cuda.c allocates beside the weights for a stage: the activations and
 * scratch of n_batch rows, the prompt path's f16 buffers and the largest dense
 * matrix (or K-quant expert tensor) in f16, the attention scratch, the logits of the
 * last stage. An estimate: cuBLAS and the CUDA context come on top, which -fitt's
 * margin is for. */
static uint64_t cuda_scratch(const bl_arch_t *a, const bl_place_opts_t *o, const sizes_t *s,
                             const bl_plan_t *p, const bl_plan_stage_t *st, int last)
{
    const uint64_t B = (uint64_t)(o->n_batch > 0 ? o->n_batch : 512), E = (uint64_t)a->n_embd;
    const uint64_t nq = (uint64_t)(a->n_head * a->head_dim), nkv = (uint64_t)(a->n_head_kv * a->head_dim);
    const uint64_t K = (uint64_t)(a->moe ? a->n_expert_used : 1), NE = (uint64_t)(a->moe ? a->n_expert : 1);
    const uint64_t ff = (uint64_t)(a->moe ? a->n_ff_exp : a->n_ff);
    uint64_t f32 = B * (3 * E + 2 * nq + 2 * nkv + NE + 2 * K + 2 * K * ff);
    if (last)
        f32 += B * (uint64_t)a->n_vocab;
    uint64_t bytes = 4 * f32;
    bytes += 2 * B * max_u64(max_u64(E, nq), ff) + 2 * B * K * max_u64(E, ff) + 4 * B * K * E;
    /* the f16 copy of the largest dense matrix a GEMM reads (bounded by the layer's
     * dense bytes), or expert tensor of a type the grouped GEMM reads through such a
     * copy (the K-quants; the others are read as stored), the stage's or a host
     * layer's */
    uint64_t w = 0, off = 0;
    for (int64_t l = st->lb; l < st->le; l++) {
        w = max_u64(w, s->dense[l] * 4 / 3);
        if (!p->tier_of[l])
            w = max_u64(w, s->exp_f16[l]);
        /* a host layer's experts: a prompt step copies them in (the op offload) into
         * one buffer of a layer's experts */
        if (bl_plan_layer_host(p, l))
            off = max_u64(off, s->experts[l]);
    }
    bytes += off;
    if (last)
        w = max_u64(w, HEAD_PIECE);
    bytes += w;
    const uint64_t ctx = (uint64_t)(o->n_ctx_total > 0 ? o->n_ctx_total : 4096);
    bytes += 4 * 64 * (uint64_t)a->n_head * (ctx / 256 + 1) * (uint64_t)(a->head_dim + 2);
    return bytes;
}

static void size_stages(bl_plan_t *p, const bl_arch_t *a, const bl_place_opts_t *o, const sizes_t *s);

/* Whether stage i is a CPU stage of this machine, whose memory is ram_avail's (a
 * hostfile's stage on another host has its own). */
static int local_cpu_stage(const bl_plan_t *p, const bl_place_opts_t *o, int i)
{
    return p->stage[i].device < 0 && !(o->hosts && i < o->n_hosts && o->hosts[i].remote);
}

/* The host experts' RAM budget (o->experts_ram, resolved) and what of them it leaves
 * on disk. When a CPU stage's own experts pass it, every CPU layer's experts of this
 * machine go to the hosttier, whose pager alone reads from disk. */
static void ram_budget(bl_plan_t *p, const bl_arch_t *a, const bl_place_opts_t *o, const sizes_t *s)
{
    uint64_t budget = UINT64_MAX;
    if (o->experts_ram > 0) {
        budget = (uint64_t)o->experts_ram;
    } else if (o->experts_ram == BL_EXPERTS_RAM_AUTO && o->ram_avail > 0) {
        uint64_t other = 0; /* what the CPU stages hold besides routed experts */
        for (int i = 0; i < p->n_stages; i++)
            if (local_cpu_stage(p, o, i))
                other += p->stage[i].weight_bytes - p->stage[i].expert_bytes + p->stage[i].kv_bytes;
        const uint64_t margin = bl_mem_margin(o->ram_avail);
        budget = o->ram_avail > margin + other ? o->ram_avail - margin - other : 0;
    }
    p->experts_ram = budget;
    uint64_t cpu_experts = 0;
    for (int i = 0; i < p->n_stages; i++)
        if (local_cpu_stage(p, o, i))
            cpu_experts += p->stage[i].expert_bytes;
    if (a->moe && p->n_expert > 0 && cpu_experts > 0 && cpu_experts + p->host_bytes > budget) {
        for (int i = 0; i < p->n_stages; i++)
            for (int64_t l = p->stage[i].lb; local_cpu_stage(p, o, i) && l < p->stage[i].le; l++) {
                if (p->tier_of[l]) /* on its tier's card */
                    continue;
                host_layer(p, a, l);
                p->disk_moved += bl_arch_layer_moe(a, l);
            }
        size_stages(p, a, o, s);
    }
    p->host_ram_bytes = p->host_bytes < budget ? p->host_bytes : budget;
    p->host_disk_bytes = p->host_bytes - p->host_ram_bytes;
}

/* Layer l's cache: its K/V rows over every position (an attention layer) or every
 * slot's recurrent state (a DeltaNet layer). */
static uint64_t layer_kv_bytes(const bl_arch_t *a, const bl_place_opts_t *o, int64_t l)
{
    if (bl_arch_layer_recurrent(a, l))
        return (uint64_t)bl_arch_rec_floats(a) * 4u * (uint64_t)(o->n_seqs > 0 ? o->n_seqs : 1);
    const double kv_pos_layer = (double)a->kv_planes * (double)(a->n_head_kv * a->head_dim) *
                                (o->kv_elem_bytes > 0 ? o->kv_elem_bytes : 2.0);
    return (uint64_t)(kv_pos_layer * (double)(o->n_ctx_total > 0 ? o->n_ctx_total : 0));
}

/* What layer l adds to its CPU stage: its dense part, its routed experts unless the
 * hosttier keeps them, its cache (size_stages' sum, layer by layer). */
static uint64_t layer_bytes(const bl_plan_t *p, const bl_arch_t *a, const bl_place_opts_t *o, const sizes_t *s,
                            int64_t l)
{
    return s->dense[l] + (experts_apart(p, l) ? 0 : s->experts[l]) + layer_kv_bytes(a, o, l);
}

/* Fills each stage's sizes. */
static void size_stages(bl_plan_t *p, const bl_arch_t *a, const bl_place_opts_t *o, const sizes_t *s)
{
    p->host_bytes = p->node_host_bytes = 0;
    p->n_host_layers = p->n_node_host_layers = 0;
    for (int i = 0; i < p->n_stages; i++) {
        bl_plan_stage_t *st = &p->stage[i];
        const int first = st->lb == 0, last = st->le == a->n_layer;
        /* a stage of another host whose host runs a hosttier: its host RAM is there */
        st->node_hosttier = o->hosts && i < o->n_hosts && o->hosts[i].remote && o->hosts[i].hosttier;
        st->weight_bytes = st->expert_bytes = st->host_expert_bytes = 0;
        int n_host = 0;
        for (int64_t l = st->lb; l < st->le; l++) {
            st->weight_bytes += s->dense[l];
            if (bl_plan_layer_host(p, l)) {
                st->host_expert_bytes += s->experts[l];
                n_host++;
            } else if (!p->tier_of[l]) {
                st->expert_bytes += s->experts[l];
            }
        }
        st->node_hosttier &= n_host > 0;
        if (st->node_hosttier) {
            p->node_host_bytes += st->host_expert_bytes;
            p->n_node_host_layers += n_host;
        } else {
            p->host_bytes += st->host_expert_bytes;
            p->n_host_layers += n_host;
        }
        st->weight_bytes += st->expert_bytes;
        if (first)
            st->weight_bytes += s->embd;
        if (last)
            st->weight_bytes += s->out_norm + (a->tied_output && first ? 0 : s->head);
        /* K/V rows in the attention layers; a DeltaNet layer's recurrent state a slot */
        st->kv_bytes = st->state_bytes = 0;
        for (int64_t l = st->lb; l < st->le; l++) {
            const uint64_t kv = layer_kv_bytes(a, o, l);
            st->kv_bytes += kv;
            st->state_bytes += bl_arch_layer_recurrent(a, l) ? kv : 0;
        }
        if (last && o->mtp) { /* the NextN layer the last stage runs: its tensors and rows */
            st->weight_bytes += s->nextn;
            st->kv_bytes += layer_kv_bytes(a, o, a->n_layer);
        }
        st->scratch_bytes = st->device >= 0 ? cuda_scratch(a, o, s, p, st, last) : 0;
    }
    /* a tier's scratch (the CUDA backend's alloc_only): a call of n_batch rows' rows,
     * choices, gate/up products and sums, on the card and pinned, and a prompt's
     * grouped GEMMs' (the rows by expert in f16, their down products, the sort, the
     * f16 copy of the largest K-quant expert tensor it holds) */
    const uint64_t B = (uint64_t)(o->n_batch > 0 ? o->n_batch : 512), E = (uint64_t)a->n_embd;
    const uint64_t K = (uint64_t)(a->moe ? a->n_expert_used : 1), F = (uint64_t)(a->moe ? a->n_ff_exp : 1);
    const uint64_t NE = (uint64_t)(a->moe ? a->n_expert : 1);
    for (int k = 0; k < p->n_tiers; k++) {
        bl_plan_tier_t *t = &p->tier[k];
        uint64_t copy = 0;
        t->n_layers = 0;
        t->expert_bytes = 0;
        for (int64_t l = 0; l < a->n_layer; l++)
            if (p->tier_of[l] == k + 1) {
                t->n_layers++;
                t->expert_bytes += s->experts[l];
                copy = max_u64(copy, s->exp_f16[l]);
            }
        t->scratch_bytes = 4 * B * (3 * E + 2 * K + 2 * K * F + K * E) + 2 * B * K * max_u64(E, F) + 4 * B * K * E +
                           4 * (3 * NE + 2 + 2 * B * K) + copy;
    }
}

static const bl_device_t *device_of(const bl_device_t *devs, int n, int index)
{
    for (int i = 0; i < n; i++)
        if (devs[i].index == index)
            return &devs[i];
    return NULL;
}

/* A card stage's total on its card against what the card has free less the margin:
 * 0 when it fits, the free memory is not known, or it is a CPU stage. */
static int over(const bl_plan_stage_t *st, uint64_t margin)
{
    if (st->device < 0 || st->card.free_bytes == 0)
        return 0;
    return bl_plan_stage_need(st) + margin > st->card.free_bytes;
}

/* Certain not to fit: the weights and the KV cache alone pass the free memory. */
static int cannot_fit(const bl_plan_stage_t *st)
{
    return st->device >= 0 && st->card.free_bytes && st->weight_bytes + st->kv_bytes > st->card.free_bytes;
}

int bl_plan_stage_fit(const bl_plan_t *p, int i)
{
    const bl_plan_stage_t *st = &p->stage[i];
    if (st->device < 0)
        return BL_PLAN_FITS;
    if (cannot_fit(st))
        return BL_PLAN_OVER;
    return over(st, (uint64_t)p->fit_target_mib * MIB) ? BL_PLAN_TIGHT : BL_PLAN_FITS;
}

/* -dev: "none", or a comma list of CUDA devices ("cuda0", "CUDA1"); each must exist. */
static int parse_devices(const char *v, const bl_device_t *devs, int n_devs, int *gpus, int *n, bl_err_t *err)
{
    *n = 0;
    if (!strcmp(v, "none"))
        return 0;
    if (!*v)
        return bl_err_set(err, BL_EINVAL, "--device: an empty value (none, or a list of cudaN)");
    for (const char *p = v;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char one[32];
        int64_t idx = -1;
        if (len >= sizeof one || len == 0)
            return bl_err_set(err, BL_EINVAL, "--device: '%.40s' is not none or a list of cudaN", v);
        memcpy(one, p, len);
        one[len] = '\0';
        if (strncasecmp(one, "cuda", 4) != 0 || bl_parse_i64(one + 4, &idx) != 0 || idx < 0)
            return bl_err_set(err, BL_EINVAL, "--device: '%s' is not none or cudaN", one);
        if (!device_of(devs, n_devs, (int)idx))
            return bl_err_set(err, BL_ENOTSUP, "--device %s: no such device (this machine has %d CUDA device%s)",
                              one, n_devs, n_devs == 1 ? "" : "s");
        for (int i = 0; i < *n; i++)
            if (gpus[i] == idx)
                return bl_err_set(err, BL_EINVAL, "--device: %s is listed twice", one);
        if (*n >= BL_PLAN_MAX_DEVICES)
            return bl_err_set(err, BL_EINVAL, "--device: more than %d devices", BL_PLAN_MAX_DEVICES);
        gpus[(*n)++] = (int)idx;
        if (!comma)
            break;
        p = comma + 1;
    }
    return 0;
}

/* -ngl: the number of layers (the head counting as one past the last) on the GPUs;
 * INT64_MAX for every one. *given: a number the user chose (not auto/all/-1). */
static int parse_ngl(const char *v, int64_t *n, int *given, bl_err_t *err)
{
    *given = 0;
    *n = INT64_MAX;
    if (!v || !strcmp(v, "auto") || !strcmp(v, "all"))
        return 0;
    if (bl_parse_i64(v, n) != 0 || *n < -1)
        return bl_err_set(err, BL_EINVAL, "--gpu-layers: '%.32s' is not a number, auto or all", v);
    if (*n == -1)
        *n = INT64_MAX;
    else
        *given = 1;
    return 0;
}

/* -ts: one proportion per GPU. */
static int parse_split(const char *v, int n_gpus, double *w, bl_err_t *err)
{
    int n = 0;
    double sum = 0;
    for (const char *p = v; *p;) {
        const char *sep = p + strcspn(p, ",/");
        char one[32];
        const size_t len = (size_t)(sep - p);
        double x = -1;
        if (len == 0 || len >= sizeof one)
            return bl_err_set(err, BL_EINVAL, "--tensor-split: '%.40s' is not a list of proportions", v);
        memcpy(one, p, len);
        one[len] = '\0';
        if (bl_parse_f64(one, &x) != 0 || !(x >= 0))
            return bl_err_set(err, BL_EINVAL, "--tensor-split: '%s' is not a proportion", one);
        if (n >= BL_PLAN_MAX_DEVICES)
            return bl_err_set(err, BL_EINVAL, "--tensor-split: more than %d proportions", BL_PLAN_MAX_DEVICES);
        if (n < n_gpus)
            w[n] = x;
        n++;
        sum += x;
        if (!*sep)
            break;
        p = sep + 1;
    }
    if (n > n_gpus)
        return bl_err_set(err, BL_EINVAL, "--tensor-split %s: %d proportions for %d device%s", v, n, n_gpus,
                          n_gpus == 1 ? "" : "s");
    for (int i = n; i < n_gpus; i++)
        w[i] = 0; /* llama.cpp: a device without a proportion gets nothing */
    if (!(sum > 0))
        return bl_err_set(err, BL_EINVAL, "--tensor-split %s: the proportions sum to 0", v);
    return 0;
}

/* Layers [lb, le) over the GPUs by weights w: stage boundaries at the rounded
 * cumulative shares, a device whose share rounds to no layer gets no stage. Each
 * stage keeps its card's facts (gpus are devices of devs: parse_devices'). */
static int split_gpu_layers(bl_plan_t *p, int64_t lb, int64_t le, const bl_device_t *devs, int n_devs,
                            const int *gpus, const double *w, int n_gpus, bl_err_t *err)
{
    double sum = 0, acc = 0;
    for (int i = 0; i < n_gpus; i++)
        sum += w[i];
    int64_t at = lb;
    for (int i = 0; i < n_gpus && at < le; i++) {
        acc += w[i];
        int64_t end = i == n_gpus - 1 ? le : lb + (int64_t)((double)(le - lb) * acc / sum + 0.5);
        end = end > le ? le : end;
        if (end <= at)
            continue;
        if (p->n_stages >= BL_PLAN_MAX_STAGES)
            return bl_err_set(err, BL_EINVAL, "plan: more than %d stages", BL_PLAN_MAX_STAGES);
        p->stage[p->n_stages++] = (bl_plan_stage_t){.device = gpus[i], .lb = at, .le = end,
                                                    .card = *device_of(devs, n_devs, gpus[i])};
        at = end;
    }
    return 0;
}

// --- the layers over a hostfile's stages -----------------------------------------------

/* A stage's share of the layers: a card's BL_PLAN_CARD_THREADS, a CPU stage its
 * threads, capped by its host's CPUs. */
static double host_weight(const bl_stage_host_t *h)
{
    if (h->card)
        return (double)BL_PLAN_CARD_THREADS;
    int t = h->threads > 0 ? h->threads : 1;
    if (h->n_cpus > 0 && t > h->n_cpus)
        t = h->n_cpus;
    return (double)t;
}

static int same_host(const bl_stage_host_t *x, const bl_stage_host_t *y)
{
    return strcasecmp(x->name ? x->name : "", y->name ? y->name : "") == 0;
}

int bl_plan_hosts_measured(const bl_stage_host_t *hosts, int n)
{
    for (int i = 0; i < n; i++)
        if (hosts[i].read_mbps_one == 0 || hosts[i].read_mbps_all == 0)
            return 0;
    return 1;
}

/* The n stages' weights w[i] (bl_plan_split_hosts says how): by threads, or, where
 * every host's read rates are known, by the rate each stage's threads get. */
static void stage_weights(const bl_stage_host_t *hosts, int n, double *w)
{
    for (int i = 0; i < n; i++)
        w[i] = host_weight(&hosts[i]);
    if (!bl_plan_hosts_measured(hosts, n))
        return;
    double t[BL_PLAN_MAX_STAGES];
    for (int i = 0; i < n; i++)
        t[i] = w[i]; /* a CPU stage's threads, capped by its host's CPUs */
    for (int i = 0; i < n; i++) {
        const bl_stage_host_t *h = &hosts[i];
        if (h->card) { /* its measured rate, else the guess */
            w[i] = h->card->read_mbps ? (double)h->card->read_mbps
                                      : (double)BL_PLAN_CARD_THREADS * (double)h->read_mbps_one;
            continue;
        }
        double sum_t = 0.0;
        for (int j = 0; j < n; j++)
            if (!hosts[j].card && same_host(h, &hosts[j]))
                sum_t += t[j];
        const double busy = h->n_cpus > 0 && sum_t > (double)h->n_cpus ? (double)h->n_cpus : sum_t;
        double rate = busy * (double)h->read_mbps_one;
        rate = rate < (double)h->read_mbps_all ? rate : (double)h->read_mbps_all;
        w[i] = rate * t[i] / sum_t;
    }
}

/* Whether two stages draw on one memory: the RAM of one host (its CPU stages), or one
 * card of one host. */
static int same_pool(const bl_stage_host_t *x, const bl_stage_host_t *y)
{
    if (!same_host(x, y) || !x->card != !y->card)
        return 0;
    return !x->card || x->card->index == y->card->index;
}

/* What stage i's memory holds for its layers: a card's room (room[i]; UINT64_MAX or no
 * room given: not known), a CPU stage's host's MemAvailable (0: not known). */
static uint64_t pool_cap(const bl_stage_host_t *hosts, const uint64_t *room, int i)
{
    if (hosts[i].card)
        return room ? room[i] : UINT64_MAX;
    return hosts[i].mem_avail > 0 ? hosts[i].mem_avail : UINT64_MAX;
}

/* Bytes of stage i, layers [at[i], at[i + 1]), through the prefix sums pre. */
static uint64_t split_stage_bytes(const uint64_t *pre, const int64_t *at, int i, int n, uint64_t first,
                                  uint64_t last)
{
    return pre[at[i + 1]] - pre[at[i]] + (i == 0 ? first : 0) + (i == n - 1 ? last : 0);
}

/* What the stages of stage h's memory hold together. */
static uint64_t split_pool_bytes(const uint64_t *pre, const int64_t *at, const bl_stage_host_t *hosts, int n, int h,
                                 uint64_t first, uint64_t last)
{
    uint64_t sum = 0;
    for (int i = 0; i < n; i++)
        if (same_pool(&hosts[i], &hosts[h]))
            sum += split_stage_bytes(pre, at, i, n, first, last);
    return sum;
}

/* The refusal of a split none of whose moves fits: the memory that is over (a card or
 * a host's RAM), what it has and what its stages need. */
static int split_refused(const bl_stage_host_t *hosts, const uint64_t *room, int n, int over, uint64_t need,
                         int64_t n_layers, int any_card, int donor, bl_err_t *err)
{
    const bl_stage_host_t *h = &hosts[over];
    const char *name = h->name ? h->name : "a host";
    const char *why = donor < 0 ? "with one layer each (fewer workers there, or a smaller -c)"
                                : "and no other stage has room for more of its layers (a smaller -c, or more hosts)";
    char have[32], needs[32];
    bl_plan_fmt_size(needs, sizeof needs, need);
    if (h->card) {
        char f[32];
        const uint64_t cap = pool_cap(hosts, room, over);
        bl_plan_fmt_size(have, sizeof have, cap);
        bl_plan_fmt_size(f, sizeof f, h->card->free_bytes);
        return bl_err_set(err, BL_ENOMEM, "plan: no split of the %lld layers fits the stages' memory: CUDA%d (%s) "
                          "of %s has room for %s of weights and KV cache (%llu bytes: its %s free less the -fitt "
                          "margin and the scratch) and its stage needs %s (%llu bytes) %s", (long long)n_layers,
                          h->card->index, h->card->name, name, have, (unsigned long long)cap, f, needs,
                          (unsigned long long)need, donor < 0 ? "with one layer (a smaller -c, or more hosts)" : why);
    }
    int n_there = 0;
    for (int i = 0; i < n; i++)
        n_there += same_pool(&hosts[i], h);
    bl_plan_fmt_size(have, sizeof have, h->mem_avail);
    return bl_err_set(err, BL_ENOMEM, "plan: no split of the %lld %slayers fits the %s memory: %s has %s available "
                      "(MemAvailable, %llu bytes) and its %d %sstage%s need%s %s (%llu bytes of weights and KV cache) "
                      "%s", (long long)n_layers, any_card ? "" : "CPU ", any_card ? "stages'" : "hosts'", name, have,
                      (unsigned long long)h->mem_avail, n_there, any_card ? "CPU " : "", n_there == 1 ? "" : "s",
                      n_there == 1 ? "s" : "", needs, (unsigned long long)need, why);
}

int bl_plan_split_hosts(const uint64_t *bytes, int64_t n_layers, uint64_t first, uint64_t last,
                        const bl_stage_host_t *hosts, const uint64_t *room, int n, int64_t *ends, bl_err_t *err)
{
    if (n < 1 || n > BL_PLAN_MAX_STAGES)
        return bl_err_set(err, BL_EINVAL, "plan: %d stages (1..%d)", n, BL_PLAN_MAX_STAGES);
    int any_card = 0;
    for (int i = 0; i < n; i++)
        any_card |= hosts[i].card != NULL;
    if (n_layers < n)
        return bl_err_set(err, BL_EINVAL, "plan: %d workers for %lld layer%s%s", n, (long long)n_layers,
                          n_layers == 1 ? "" : "s", any_card ? "" : " on the CPU");
    uint64_t *pre = malloc(sizeof *pre * (size_t)(n_layers + 1));
    if (!pre)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the plan");
    pre[0] = 0;
    for (int64_t l = 0; l < n_layers; l++)
        pre[l + 1] = pre[l] + bytes[l];
    /* the shares by weight: each stage its rounded-down share (at least one), then the
     * layers left to the largest remainders, or taken back from the largest excesses */
    double w[BL_PLAN_MAX_STAGES], q[BL_PLAN_MAX_STAGES], sum_w = 0;
    int64_t c[BL_PLAN_MAX_STAGES], at[BL_PLAN_MAX_STAGES + 1], total = 0;
    stage_weights(hosts, n, w);
    for (int i = 0; i < n; i++)
        sum_w += w[i];
    for (int i = 0; i < n; i++) {
        q[i] = (double)n_layers * w[i] / sum_w;
        c[i] = (int64_t)q[i] < 1 ? 1 : (int64_t)q[i];
        total += c[i];
    }
    for (; total != n_layers; total += total < n_layers ? 1 : -1) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            const double d = total < n_layers ? q[i] - (double)c[i] : (double)c[i] - q[i];
            if ((total < n_layers || c[i] > 1) &&
                (best < 0 || d > (total < n_layers ? q[best] - (double)c[best] : (double)c[best] - q[best])))
                best = i;
        }
        c[best] += total < n_layers ? 1 : -1; /* n <= n_layers: a stage above one layer exists */
    }
    /* then the memories: one that is over (a host's RAM, its CPU stages together, or a
     * card) gives layers, one at a time, from its stage with the most per weight to the
     * stage with the fewest per weight among those whose memory was not (yet) found
     * over. A memory's stages never take layers back, so this ends within n * n_layers
     * moves. */
    int frozen[BL_PLAN_MAX_STAGES] = {0}, rc = 0;
    for (int64_t move = 0;; move++) {
        at[0] = 0;
        for (int i = 0; i < n; i++)
            at[i + 1] = at[i] + c[i];
        int over = -1;
        for (int h = 0; h < n && over < 0; h++)
            if (split_pool_bytes(pre, at, hosts, n, h, first, last) > pool_cap(hosts, room, h))
                over = h;
        if (over < 0)
            break;
        int donor = -1, taker = -1;
        for (int i = 0; i < n; i++) {
            if (!same_pool(&hosts[i], &hosts[over]))
                continue;
            frozen[i] = 1;
            if (c[i] > 1 && (donor < 0 || (double)c[i] / w[i] > (double)c[donor] / w[donor]))
                donor = i;
        }
        for (int i = 0; i < n; i++)
            if (!frozen[i] && (taker < 0 || (double)(c[i] + 1) / w[i] < (double)(c[taker] + 1) / w[taker]))
                taker = i;
        if (donor < 0 || taker < 0 || move > (int64_t)n * n_layers) {
            rc = split_refused(hosts, room, n, over, split_pool_bytes(pre, at, hosts, n, over, first, last),
                               n_layers, any_card, donor, err);
            break;
        }
        c[donor]--;
        c[taker]++;
    }
    for (int i = 0; rc == 0 && i < n; i++)
        ends[i] = at[i + 1];
    free(pre);
    return rc;
}

/* The stages p holds (a hostfile's, o->hosts in order) re-cut by their hosts' speed
 * and memory: a card stage's room is its card's free memory less the margin and the
 * scratch of a stage of every layer (which no stage of fewer passes). */
static int split_by_hosts(bl_plan_t *p, const bl_arch_t *a, const bl_place_opts_t *o, const sizes_t *s,
                          uint64_t margin, bl_err_t *err)
{
    const int n = p->n_stages;
    const int64_t nl = a->n_layer;
    uint64_t *bytes = malloc(sizeof *bytes * (size_t)nl);
    uint64_t room[BL_PLAN_MAX_STAGES];
    int64_t ends[BL_PLAN_MAX_STAGES];
    if (!bytes)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the plan");
    for (int64_t l = 0; l < nl; l++)
        bytes[l] = layer_bytes(p, a, o, s, l);
    for (int i = 0; i < n; i++) {
        const bl_device_t *d = o->hosts[i].card;
        room[i] = UINT64_MAX;
        if (!d || d->free_bytes == 0)
            continue;
        const bl_plan_stage_t all = {.device = d->index, .lb = 0, .le = nl};
        const uint64_t keep = margin + cuda_scratch(a, o, s, p, &all, i == n - 1);
        room[i] = d->free_bytes > keep ? d->free_bytes - keep : 0;
    }
    /* as size_stages counts them: one stage holding the first and the last layer keeps
     * a tied head once */
    const uint64_t last = s->out_norm + (a->tied_output && n == 1 ? 0 : s->head);
    const int rc = bl_plan_split_hosts(bytes, nl, s->embd, last, o->hosts, room, n, ends, err);
    free(bytes);
    for (int i = 0; rc == 0 && i < n; i++) {
        p->stage[i].lb = i == 0 ? 0 : ends[i - 1];
        p->stage[i].le = ends[i];
    }
    return rc;
}

/* Each other host whose hosttier keeps routed experts: those, beside its CPU stages'
 * weights and caches, within its MemAvailable less the margin the workers keep
 * (unknown memory: no check). BL_ENOMEM naming the host and the bytes. */
static int node_hosttier_ram(const bl_plan_t *p, const bl_place_opts_t *o, bl_err_t *err)
{
    for (int i = 0; i < p->n_stages && o->hosts; i++) {
        const bl_stage_host_t *h = &o->hosts[i];
        if (!p->stage[i].node_hosttier || h->mem_avail == 0)
            continue;
        uint64_t experts = 0, cpu = 0;
        for (int j = 0; j < p->n_stages && j < o->n_hosts; j++) {
            if (!same_host(&o->hosts[j], h))
                continue;
            if (j < i && p->stage[j].node_hosttier) /* this host was checked at its first stage */
                goto next;
            if (p->stage[j].node_hosttier)
                experts += p->stage[j].host_expert_bytes;
            if (!o->hosts[j].card)
                cpu += p->stage[j].weight_bytes + p->stage[j].kv_bytes;
        }
        const uint64_t margin = bl_mem_margin(h->mem_avail);
        if (experts + cpu + margin > h->mem_avail) {
            char e[32], c[32], have[32];
            bl_plan_fmt_size(e, sizeof e, experts);
            bl_plan_fmt_size(c, sizeof c, cpu);
            bl_plan_fmt_size(have, sizeof have, h->mem_avail);
            return bl_err_set(err, BL_ENOMEM, "plan: the hosttier of %s would keep %s of routed experts in its RAM "
                              "(%llu bytes) beside %s of its CPU stages, and %s has %s available (MemAvailable, "
                              "%llu bytes, less a margin of %llu): fewer of them in host RAM (-ncmoe, -ot), or more "
                              "hosts", h->name ? h->name : "a host", e, (unsigned long long)experts, c,
                              h->name ? h->name : "the host", have, (unsigned long long)h->mem_avail,
                              (unsigned long long)margin);
        }
    next:;
    }
    return 0;
}

static int stage_of(const bl_plan_t *p, int64_t l)
{
    for (int i = 0; i < p->n_stages; i++)
        if (l >= p->stage[i].lb && l < p->stage[i].le)
            return i;
    return -1;
}

/* The overrides against every tensor of the file: the routed experts a pattern puts
 * in host RAM are marked, those it puts on a card without a stage (of devs) make an
 * expert tier there; what a plan cannot do is refused by name. as_cpu: as if
 * every stage were a CPU stage (what a hostfile's split counts before it has placed
 * the layers on their stages' cards): host RAM keeps a layer's experts with it. */
static int apply_overrides(bl_plan_t *p, const bl_gguf_t *g, const bl_arch_t *a, const bl_place_opts_t *o,
                           const bl_device_t *devs, int n_devs, override_t *ov, int n_ov, int as_cpu, bl_err_t *err)
{
    /* per layer: what the first expert tensor decided, to refuse a split of them */
    int *layer_buft = malloc(sizeof(int) * (size_t)a->n_layer);
    if (!layer_buft)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the plan");
    for (int64_t l = 0; l < a->n_layer; l++)
        layer_buft[l] = -1;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = md ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory for the plan");
    for (uint64_t i = 0; rc == 0 && i < bl_gguf_n_tensors(g); i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        const char *name = t->name;
        int64_t l = -1;
        const bl_role_t role = bl_arch_role(a, name, &l);
        override_t *hit = NULL;
        for (int j = 0; j < n_ov; j++)
            if (pcre2_match(ov[j].re, (PCRE2_SPTR)name, t->name_len, 0, 0, md, NULL) >= 0) {
                ov[j].seen++;
                if (!hit)
                    hit = &ov[j];
            }
        if (role == BL_ROLE_EXPERTS) {
            const int s = stage_of(p, l);
            const int dev = as_cpu ? BL_PLAN_DEVICE_CPU : p->stage[s].device;
            int b = BUFT_STAGE;
            if (hit) {
                hit->hits++;
                if (hit->buft == BUFT_HOSTTIER || (hit->buft == BUFT_CPU && dev >= 0))
                    b = BUFT_HOSTTIER;
                if (hit->buft == BUFT_CPU && dev >= 0 && o->hosts && o->hosts[s].remote && !o->hosts[s].hosttier)
                    /* beside a card, host RAM is a hosttier's: its host's, when the
                     * hostfile runs one there */
                    rc = bl_err_set(err, BL_ENOTSUP, "%s %s: %s is on CUDA%d of %s, another host than the "
                                    "router's, whose routed experts in host RAM need a hosttier there: add a line "
                                    "'%s PORT hosttier' to the hostfile, keep them on its card, or compute them on "
                                    "the router's host with -ot ...=HOSTTIER", hit->flag, hit->text, name, dev,
                                    o->hosts[s].name, o->hosts[s].name);
                else if (hit->buft == BUFT_CUDA && hit->cuda != dev) {
                    /* another card: an expert tier, if no stage is there */
                    b = BUFT_TIER(hit->cuda);
                    for (int j = 0; rc == 0 && j < p->n_stages; j++)
                        if (p->stage[j].device == hit->cuda)
                            rc = bl_err_set(err, BL_ENOTSUP, "%s %s: %s belongs to layer %lld's stage, and CUDA%d "
                                            "holds layers %lld..%lld; routed experts go to another card than "
                                            "their layer's only where that card holds no layers (an expert tier: "
                                            "keep the layers off it with -dev or -sm none -mg)", hit->flag,
                                            hit->text, name, (long long)l, hit->cuda, (long long)p->stage[j].lb,
                                            (long long)p->stage[j].le - 1);
                }
            }
            if (rc == 0 && layer_buft[l] >= 0 && layer_buft[l] != b)
                rc = bl_err_set(err, BL_ENOTSUP, "%s: the routed experts of layer %lld would be split between "
                                "two places (gate, up and down of a layer's experts go together)",
                                hit ? hit->text : name, (long long)l);
            layer_buft[l] = b;
            continue;
        }
        if (!hit)
            continue;
        hit->hits++;
        const int s = l >= 0 ? stage_of(p, l) : (role == BL_ROLE_TOKEN_EMBD ? 0 : p->n_stages - 1);
        const int dev = s >= 0 && !as_cpu ? p->stage[s].device : BL_PLAN_DEVICE_CPU;
        const int same = (hit->buft == BUFT_CPU && dev < 0) || (hit->buft == BUFT_CUDA && hit->cuda == dev);
        if (!same && role != BL_ROLE_OTHER)
            rc = bl_err_set(err, BL_ENOTSUP, "%s %s: %s (%s) would leave its layer's stage on %s; only routed "
                            "experts can be placed apart from their layer", hit->flag, hit->text, name,
                            bl_role_name(role), dev >= 0 ? "the card" : "the CPU");
    }
    for (int j = 0; rc == 0 && j < n_ov; j++)
        if (ov[j].seen == 0 && !strcmp(ov[j].flag, "--override-tensor"))
            rc = bl_err_set(err, BL_ENOTSUP, "--override-tensor %s: the pattern matches no tensor of the model",
                            ov[j].text);
    p->n_tiers = 0;
    memset(p->tier_of, 0, (size_t)a->n_layer);
    for (int64_t l = 0; rc == 0 && l < a->n_layer; l++)
        if (layer_buft[l] == BUFT_HOSTTIER)
            host_layer(p, a, l);
        else if (layer_buft[l] >= BUFT_TIER(0))
            rc = tier_layer(p, a, l, layer_buft[l] - BUFT_TIER(0), devs, n_devs, err);
    pcre2_match_data_free(md);
    free(layer_buft);
    return rc;
}

uint64_t bl_plan_stage_need(const bl_plan_stage_t *st)
{
    return st->weight_bytes + st->kv_bytes + st->scratch_bytes;
}

void bl_plan_fmt_size(char *b, size_t n, uint64_t bytes)
{
    if (bytes >= (uint64_t)1 << 30)
        snprintf(b, n, "%.2f GiB", (double)bytes / GIB);
    else
        snprintf(b, n, "%.1f MiB", (double)bytes / (double)MIB);
}

/* A placement the user chose (or --fit off, or a hostfile's) is not changed; what
 * cannot fit is refused with the sizes, and a hostfile's card with its host. */
static int refuse_over(const bl_plan_t *p, const bl_place_opts_t *o, uint64_t margin, bl_err_t *err)
{
    for (int k = 0; k < p->n_tiers; k++) {
        const bl_plan_tier_t *t = &p->tier[k];
        if (!t->card.free_bytes || t->expert_bytes + t->scratch_bytes + margin <= t->card.free_bytes)
            continue;
        char w[32], f[32];
        bl_plan_fmt_size(w, sizeof w, t->expert_bytes + t->scratch_bytes);
        bl_plan_fmt_size(f, sizeof f, t->card.free_bytes);
        return bl_err_set(err, BL_ENOMEM, "plan: the routed experts of %d layers on CUDA%d (an expert tier) need %s "
                          "with its scratch and -fitt %llu MiB kept free, but the card has %s free (fewer layers' "
                          "experts on it with -ot, the others with their stage or in host RAM)", t->n_layers,
                          t->device, w, (unsigned long long)(margin / MIB), f);
    }
    for (int i = 0; i < p->n_stages; i++) {
        const bl_plan_stage_t *st = &p->stage[i];
        if (!cannot_fit(st))
            continue;
        char w[32], k[32], s[32], f[32], where[300] = "";
        bl_plan_fmt_size(w, sizeof w, st->weight_bytes);
        bl_plan_fmt_size(k, sizeof k, st->kv_bytes);
        bl_plan_fmt_size(s, sizeof s, st->scratch_bytes);
        bl_plan_fmt_size(f, sizeof f, st->card.free_bytes);
        if (o->hosts)
            snprintf(where, sizeof where, " (%s) of %s", st->card.name, o->hosts[i].name ? o->hosts[i].name : "?");
        return bl_err_set(err, BL_ENOMEM, "plan: layers %lld..%lld on CUDA%d%s need %s of weights and %s of KV "
                          "cache (and about %s of scratch, with -fitt %llu MiB kept free), but the card has %s free, "
                          "%llu bytes (%s)", (long long)st->lb, (long long)st->le - 1, st->device, where, w, k, s,
                          (unsigned long long)(margin / MIB), f, (unsigned long long)st->card.free_bytes,
                          o->hosts ? "fewer layers on it with the hostfile's layers=, routed experts elsewhere with "
                                     "--cpu-moe, -ncmoe N or -ot, or a smaller -c"
                                   : "put routed experts in host RAM with --cpu-moe or -ncmoe N, fewer layers with "
                                     "-ngl, a smaller -c, or leave the placement to --fit on");
    }
    return 0;
}

/* Stages [p->n_stages, + n) over layers [0, n_layers) (what: "CPU " or "", for
 * messages): at ends (increasing, the last n_layers, else BL_EINVAL), or evenly,
 * earlier stages taking the remainder; the devices are the caller's to set. */
static int cut_layers(bl_plan_t *p, int n, int64_t n_layers, const int64_t *ends, const char *what, bl_err_t *err)
{
    const int64_t base = n_layers / n, extra = n_layers % n;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const int64_t end = ends ? ends[i] : at + base + (i < extra ? 1 : 0);
        if (end <= at || end > n_layers || (i == n - 1 && end != n_layers))
            return bl_err_set(err, BL_EINVAL, "stage %d of the %slayers ends at layer %lld, after %lld: the stages "
                              "must cover the %lld %slayers in order", i, what, (long long)end, (long long)at,
                              (long long)n_layers, what);
        p->stage[p->n_stages++] = (bl_plan_stage_t){.device = BL_PLAN_DEVICE_CPU, .lb = at, .le = end};
        at = end;
    }
    return 0;
}

/* The stages from the flags: the CPU layers first, in o->n_cpu_stages, then the GPU
 * layers over the cards -dev, -sm and -ts choose (-ngl: how many). *ngl_given: -ngl
 * gave a number; *n_gpus: the cards the GPU layers may use. */
static int flag_stages(bl_plan_t *p, const bl_arch_t *a, const bl_device_t *devs, int n_devs,
                       const bl_place_opts_t *o, int *ngl_given, int *n_gpus_out, bl_err_t *err)
{
    int gpus[BL_PLAN_MAX_DEVICES], n_gpus = 0, rc = 0;
    *n_gpus_out = 0;
    for (int i = 0; i < n_devs && n_gpus < BL_PLAN_MAX_DEVICES; i++)
        gpus[n_gpus++] = devs[i].index;
    if (o->devices && (rc = parse_devices(o->devices, devs, n_devs, gpus, &n_gpus, err)) < 0)
        return rc;
    if (o->split_mode && strcmp(o->split_mode, "layer") && strcmp(o->split_mode, "none"))
        return bl_err_set(err, !strcmp(o->split_mode, "row") ? BL_ENOTSUP : BL_EINVAL, "--split-mode %.32s: %s",
                          o->split_mode, !strcmp(o->split_mode, "row")
                              ? "splitting matrices by rows across GPUs is not supported (layer puts a pipeline "
                                "stage on each device)"
                              : "not none, layer or row");
    if (o->split_mode && !strcmp(o->split_mode, "none") && n_gpus > 0) {
        if (o->main_gpu < 0 || o->main_gpu >= n_gpus)
            return bl_err_set(err, BL_EINVAL, "--main-gpu %lld: there %s %d device%s", (long long)o->main_gpu,
                              n_gpus == 1 ? "is" : "are", n_gpus, n_gpus == 1 ? "" : "s");
        gpus[0] = gpus[o->main_gpu];
        n_gpus = 1;
    }
    int64_t ngl;
    if ((rc = parse_ngl(o->gpu_layers, &ngl, ngl_given, err)) < 0)
        return rc;
    if (n_gpus == 0)
        ngl = 0;
    /* llama.cpp's default split: by free memory (evenly where a card's is not known);
     * -sm none leaves one card, and -ts nothing to split */
    double w[BL_PLAN_MAX_DEVICES];
    int known = 1;
    for (int i = 0; i < n_gpus; i++) {
        const bl_device_t *d = device_of(devs, n_devs, gpus[i]);
        known &= d && d->free_bytes;
        w[i] = d && d->free_bytes ? (double)d->free_bytes : 1.0;
    }
    for (int i = 0; !known && i < n_gpus; i++)
        w[i] = 1.0;
    const int one_card = o->split_mode && !strcmp(o->split_mode, "none");
    if (o->tensor_split && !one_card && (rc = parse_split(o->tensor_split, n_gpus > 0 ? n_gpus : 1, w, err)) < 0)
        return rc;
    const int64_t n_gpu_layers = ngl >= a->n_layer ? a->n_layer : ngl;
    const int64_t n_cpu_layers = a->n_layer - n_gpu_layers;

    /* stages: the CPU layers first, split into n_cpu_stages, then the GPU layers */
    const int ncs = o->n_cpu_stages > 0 ? o->n_cpu_stages : 1;
    if (n_cpu_layers > 0) {
        if (ncs > n_cpu_layers)
            return bl_err_set(err, BL_EINVAL, "--workers %d: %lld layer%s on the CPU to split into stages", ncs,
                              (long long)n_cpu_layers, n_cpu_layers == 1 ? "" : "s");
        if (ncs > BL_PLAN_MAX_STAGES - n_gpus)
            return bl_err_set(err, BL_EINVAL, "plan: more than %d stages", BL_PLAN_MAX_STAGES);
        if ((rc = cut_layers(p, ncs, n_cpu_layers, o->stage_ends, "CPU ", err)) < 0)
            return rc;
    }
    if (n_gpu_layers > 0 &&
        (rc = split_gpu_layers(p, n_cpu_layers, a->n_layer, devs, n_devs, gpus, w, n_gpus, err)) < 0)
        return rc;
    *n_gpus_out = n_gpus;
    return 0;
}

/* The stages of a hostfile (o->hosts), in its order: each on its card or on its host's
 * CPU, at o->stage_ends or evenly until split_by_hosts cuts them. The flags that
 * choose cards are the hostfile's GPUS to give: -dev, -ts, -sm other than layer are
 * refused, and so is -ngl N where a stage has a card (without one it changes
 * nothing, as on a machine without a GPU). */
static int host_stages(bl_plan_t *p, const bl_arch_t *a, const bl_place_opts_t *o, bl_err_t *err)
{
    const int n = o->n_hosts;
    if (n < 1 || n > BL_PLAN_MAX_STAGES)
        return bl_err_set(err, BL_EINVAL, "plan: %d stages of a hostfile (1..%d)", n, BL_PLAN_MAX_STAGES);
    if (n > a->n_layer)
        return bl_err_set(err, BL_EINVAL, "plan: %d workers for %lld layer%s", n, (long long)a->n_layer,
                          a->n_layer == 1 ? "" : "s");
    int n_cards = 0;
    for (int i = 0; i < n; i++) {
        const bl_device_t *d = o->hosts[i].card;
        if (d && (d->index < 0 || d->index > 255))
            return bl_err_set(err, BL_EINVAL, "plan: stage %d's card has CUDA ordinal %d (0..255)", i, d->index);
        n_cards += d != NULL;
    }
    const char *flag = o->devices ? "--device" : o->tensor_split ? "--tensor-split" : NULL;
    const char *value = o->devices ? o->devices : o->tensor_split;
    if (!flag && o->split_mode && strcmp(o->split_mode, "layer")) {
        flag = "--split-mode";
        value = o->split_mode;
    }
    if (flag)
        return bl_err_set(err, BL_EINVAL, "%s %.40s: with a hostfile, its worker lines choose the cards (GPUS: cpu, "
                          "all or CUDA ordinals), a stage on each", flag, value);
    int64_t ngl;
    int given = 0, rc;
    if ((rc = parse_ngl(o->gpu_layers, &ngl, &given, err)) < 0)
        return rc;
    if (given && n_cards > 0)
        return bl_err_set(err, BL_EINVAL, "--gpu-layers %.32s: with a hostfile, its worker lines put layers on "
                          "cards (GPUS) and layers= says which", o->gpu_layers);
    if ((rc = cut_layers(p, n, a->n_layer, o->stage_ends, "", err)) < 0)
        return rc;
    for (int i = 0; i < n; i++)
        if (o->hosts[i].card) {
            p->stage[i].device = o->hosts[i].card->index;
            p->stage[i].card = *o->hosts[i].card;
        }
    return 0;
}

int bl_plan_build(bl_plan_t *p, const bl_gguf_t *g, const bl_arch_t *a, const bl_device_t *devs, int n_devs,
                  const bl_place_opts_t *o, bl_err_t *err)
{
    memset(p, 0, sizeof *p);
    p->ram_avail = o->ram_avail;
    p->n_layer = a->n_layer;
    p->n_expert = a->moe ? a->n_expert : 0;
    p->n_dense_lead = a->moe ? a->n_dense_lead : 0;
    p->host = calloc((size_t)(a->n_layer * (p->n_expert ? p->n_expert : 1)), 1);
    p->tier_of = calloc((size_t)(a->n_layer > 0 ? a->n_layer : 1), 1);
    if (!p->host || !p->tier_of) {
        bl_plan_free(p);
        return bl_err_set(err, BL_ENOMEM, "out of memory for the plan");
    }
    int n_gpus = 0, ngl_given = 0, rc = 0, n_ov = 0;
    override_t *ov = NULL;
    sizes_t sz = {0};
    if (o->fit && strcmp(o->fit, "on") && strcmp(o->fit, "off")) {
        rc = bl_err_set(err, BL_EINVAL, "--fit: '%.32s' is not on or off", o->fit);
        goto out;
    }
    if ((rc = o->hosts ? host_stages(p, a, o, err) : flag_stages(p, a, devs, n_devs, o, &ngl_given, &n_gpus, err)) < 0)
        goto out;

    ov = calloc(MAX_OVERRIDES, sizeof *ov);
    if (!ov) {
        rc = bl_err_set(err, BL_ENOMEM, "out of memory for the plan");
        goto out;
    }
    if ((rc = read_overrides(o, a, devs, n_devs, ov, &n_ov, err)) < 0 ||
        (rc = read_sizes(g, a, &sz, err)) < 0)
        goto out;
    const uint64_t margin = (uint64_t)(o->fit_target_mib >= 0 ? o->fit_target_mib : 1024) * MIB;
    p->fit_target_mib = (int64_t)(margin / MIB);
    /* a hostfile's stages without layers=: by their hosts' speed and memory. The split
     * needs each layer's bytes, which depend on where the overrides put its experts,
     * which depends on the stage (beside a card, host RAM is the hosttier's): it is cut
     * with the experts that host RAM would keep counted with their layer, which the
     * overrides' placement afterwards can only lighten on a card (a layer's experts
     * leave it, and its scratch grows by at most one layer's). On CPU stages alone
     * both placements are one. */
    if (o->hosts && !o->stage_ends) {
        if ((rc = apply_overrides(p, g, a, o, devs, n_devs, ov, n_ov, 1, err)) < 0 ||
            (rc = split_by_hosts(p, a, o, &sz, margin, err)) < 0)
            goto out;
        memset(p->host, 0, (size_t)(a->n_layer * (p->n_expert ? p->n_expert : 1)));
        for (int j = 0; j < n_ov; j++)
            ov[j].hits = ov[j].seen = 0;
    }
    /* a dense model has no routed experts: --cpu-moe and -ncmoe change nothing there */
    if ((rc = apply_overrides(p, g, a, o, devs, n_devs, ov, n_ov, 0, err)) < 0)
        goto out;
    size_stages(p, a, o, &sz);
    const int fit = !o->fit || !strcmp(o->fit, "on");
    const int chosen = ngl_given || o->cpu_moe || o->n_cpu_moe > 0 || o->n_override_tensor > 0;
    if (fit && !chosen && n_gpus > 0) {
        /* the experts of leading layers of each card's stage to host RAM until it fits */
        for (int i = 0; i < p->n_stages; i++) {
            bl_plan_stage_t *st = &p->stage[i];
            for (int64_t l = st->lb; st->device >= 0 && a->moe && l < st->le && over(st, margin); l++) {
                host_layer(p, a, l);
                p->fit_moved += bl_arch_layer_moe(a, l);
                size_stages(p, a, o, &sz);
            }
        }
        /* then whole leading layers of the first card's stage to the CPU */
        while (p->n_stages > 0) {
            int gi = -1;
            for (int i = 0; i < p->n_stages && gi < 0; i++)
                if (p->stage[i].device >= 0)
                    gi = i;
            if (gi < 0 || !over(&p->stage[gi], margin))
                break;
            bl_plan_stage_t *st = &p->stage[gi];
            if (gi > 0 && p->stage[gi - 1].device < 0) {
                p->stage[gi - 1].le++;
            } else {
                if (p->n_stages >= BL_PLAN_MAX_STAGES)
                    break;
                memmove(&p->stage[1], &p->stage[0], sizeof *p->stage * (size_t)p->n_stages);
                p->n_stages++;
                gi++;
                st = &p->stage[gi];
                p->stage[0] = (bl_plan_stage_t){.device = BL_PLAN_DEVICE_CPU, .lb = st->lb, .le = st->lb + 1};
            }
            /* a layer on the CPU keeps its experts in its worker */
            memset(p->host + st->lb * p->n_expert, 0, (size_t)p->n_expert);
            st->lb++;
            p->fit_cpu_layers++;
            if (st->lb == st->le) {
                memmove(&p->stage[gi], &p->stage[gi + 1], sizeof *p->stage * (size_t)(p->n_stages - gi - 1));
                p->n_stages--;
            }
            size_stages(p, a, o, &sz);
        }
        p->fit_moved = p->n_host_layers;
        for (int i = 0; i < p->n_stages; i++)
            if (over(&p->stage[i], margin)) {
                const bl_plan_stage_t *st = &p->stage[i];
                char need[32], f[32];
                bl_plan_fmt_size(need, sizeof need, bl_plan_stage_need(st));
                bl_plan_fmt_size(f, sizeof f, st->card.free_bytes);
                rc = bl_err_set(err, BL_ENOMEM, "--fit: layers %lld..%lld on CUDA%d need about %s with their routed "
                                "experts in host RAM, and the card has %s free with %lld MiB to keep (give the "
                                "layers with -ts or -ngl, or a smaller -c)", (long long)st->lb,
                                (long long)st->le - 1, st->device, need, f, (long long)p->fit_target_mib);
                goto out;
            }
    } else if ((rc = refuse_over(p, o, margin, err)) < 0) {
        goto out;
    }
    ram_budget(p, a, o, &sz);
    p->hosttier = p->n_host_layers > 0;
    rc = node_hosttier_ram(p, o, err);
out:
    if (ov)
        free_overrides(ov, n_ov);
    free(ov);
    free_sizes(&sz);
    if (rc < 0)
        bl_plan_free(p);
    return rc;
}

static size_t put(char *buf, size_t cap, size_t at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return at;
    if (at < cap)
        snprintf(buf + at, cap - at, "%s", tmp);
    return at + (size_t)n;
}

size_t bl_plan_format(const bl_plan_t *p, char *buf, size_t cap)
{
    size_t at = 0;
    if (cap)
        buf[0] = '\0';
    uint64_t card = 0, cpu = 0;
    for (int i = 0; i < p->n_stages; i++) {
        const bl_plan_stage_t *st = &p->stage[i];
        char wb[32], eb[32], kb[32], sb[32];
        bl_plan_fmt_size(wb, sizeof wb, st->weight_bytes);
        bl_plan_fmt_size(eb, sizeof eb, st->expert_bytes);
        bl_plan_fmt_size(kb, sizeof kb, st->kv_bytes);
        bl_plan_fmt_size(sb, sizeof sb, st->scratch_bytes);
        if (st->device >= 0) {
            card += st->weight_bytes;
            at = put(buf, cap, at, "stage %d: layers %lld..%lld on CUDA%d (%s): weights %s (routed experts %s), "
                     "KV %s, scratch ~%s\n", i, (long long)st->lb, (long long)st->le - 1, st->device,
                     st->card.name[0] ? st->card.name : "?", wb, eb, kb, sb);
        } else {
            cpu += st->weight_bytes;
            at = put(buf, cap, at, "stage %d: layers %lld..%lld on the CPU: weights %s (routed experts %s), KV %s\n",
                     i, (long long)st->lb, (long long)st->le - 1, wb, eb, kb);
        }
    }
    for (int k = 0; k < p->n_tiers; k++) {
        const bl_plan_tier_t *t = &p->tier[k];
        char xb[32], sb[32];
        bl_plan_fmt_size(xb, sizeof xb, t->expert_bytes);
        bl_plan_fmt_size(sb, sizeof sb, t->scratch_bytes);
        card += t->expert_bytes;
        at = put(buf, cap, at, "expert tier %d: routed experts of %d layers on CUDA%d (%s): %s, scratch ~%s\n", k,
                 t->n_layers, t->device, t->card.name[0] ? t->card.name : "?", xb, sb);
    }
    char cb[32], rb[32], hb[32];
    bl_plan_fmt_size(cb, sizeof cb, card);
    bl_plan_fmt_size(rb, sizeof rb, cpu);
    bl_plan_fmt_size(hb, sizeof hb, p->host_bytes);
    if (p->host_disk_bytes > 0) {
        char ramb[32], db[32], bb[32];
        bl_plan_fmt_size(ramb, sizeof ramb, p->host_ram_bytes);
        bl_plan_fmt_size(db, sizeof db, p->host_disk_bytes);
        bl_plan_fmt_size(bb, sizeof bb, p->experts_ram);
        at = put(buf, cap, at, "on the cards %s; in the CPU workers %s; routed experts of %d of %lld layers with the "
                 "hosttier: %s, of which %s in host RAM and %s on disk (--experts-ram %s)\n", cb, rb,
                 p->n_host_layers, (long long)p->n_layer, hb, ramb, db, bb);
    } else {
        at = put(buf, cap, at, "on the cards %s; in the CPU workers %s; routed experts in host RAM %s (%d of %lld "
                 "layers, the hosttier)\n", cb, rb, hb, p->n_host_layers, (long long)p->n_layer);
    }
    if (p->n_node_host_layers > 0) {
        char nb[32];
        bl_plan_fmt_size(nb, sizeof nb, p->node_host_bytes);
        at = put(buf, cap, at, "routed experts in host RAM of other hosts %s (%d layers, each host's hosttier for its "
                 "stages)\n", nb, p->n_node_host_layers);
    }
    if (p->n_expert > 0) {
        /* routed experts on a card per layer, as runs: "0-35: 0, 36-47: 128" (leading
         * dense layers have none) */
        at = put(buf, cap, at, "routed experts with their stage per layer:");
        if (p->n_dense_lead > 0)
            at = put(buf, cap, at, " 0-%lld: dense,", (long long)p->n_dense_lead - 1);
        int64_t l0 = p->n_dense_lead;
        for (int64_t l = l0 + 1; l <= p->n_layer; l++) {
            const int h0 = experts_apart(p, l0);
            if (l < p->n_layer && experts_apart(p, l) == h0)
                continue;
            at = put(buf, cap, at, " %lld-%lld: %lld", (long long)l0, (long long)l - 1,
                     (long long)(h0 ? 0 : p->n_expert));
            l0 = l;
        }
        at = put(buf, cap, at, "\n");
    }
    if (p->fit_moved || p->fit_cpu_layers)
        at = put(buf, cap, at, "--fit: experts of %d layers put in host RAM, %d layers moved to the CPU, to keep "
                 "%lld MiB free on each card\n", p->fit_moved, p->fit_cpu_layers, (long long)p->fit_target_mib);
    return at;
}

// --- the flags ---------------------------------------------------------------------------

static int add_ot(void *ud, const char *value, bl_err_t *err)
{
    bl_place_flags_t *f = ud;
    if (!value || !*value)
        return bl_err_set(err, BL_EINVAL, "an empty value (expected PATTERN=BUFFER_TYPE)");
    if (f->n_override_tensor >= BL_PLAN_MAX_OT)
        return bl_err_set(err, BL_ERANGE, "more than %d values", BL_PLAN_MAX_OT);
    f->override_tensor[f->n_override_tensor++] = value; /* checked by bl_plan_build */
    return 0;
}

int bl_plan_args(bl_arg_t *a, int *n, int cap, bl_place_flags_t *f)
{
    const bl_arg_t t[] = {
        {"-ngl,--gpu-layers,--n-gpu-layers", "LLAMA_ARG_N_GPU_LAYERS", BL_ARG_STR, &f->gpu_layers, .metavar = "N",
         .help = "layers on the GPUs, the last N (above the layer count: all, the head too); auto, all or -1 "
                 "(default): every layer when there is a CUDA device; 0: the CPU"},
        {"-dev,--device", "LLAMA_ARG_DEVICE", BL_ARG_STR, &f->devices, .metavar = "DEV",
         .help = "devices: none (the CPU) or a comma list of cudaN (default: every CUDA device)"},
        {"-sm,--split-mode", "LLAMA_ARG_SPLIT_MODE", BL_ARG_STR, &f->split_mode, .metavar = "none|layer|row",
         .help = "several GPUs: layer (the default: the GPU layers split over the devices), none (the main GPU "
                 "only); row is refused"},
        {"-mg,--main-gpu", "LLAMA_ARG_MAIN_GPU", BL_ARG_I64, &f->main_gpu, 0, BL_PLAN_MAX_DEVICES - 1,
         .metavar = "INDEX", .help = "with -sm none, which of the devices runs the model (default 0)"},
        {"-ts,--tensor-split", "LLAMA_ARG_TENSOR_SPLIT", BL_ARG_STR, &f->tensor_split, .metavar = "N0,N1,...",
         .help = "the GPU layers split over the devices by these proportions (default: by free memory)"},
        {"-cmoe,--cpu-moe", "LLAMA_ARG_CPU_MOE", BL_ARG_FLAG, &f->cpu_moe,
         .help = "every layer's routed experts in host RAM (on a CPU stage they stay in its worker)"},
        {"-ncmoe,--n-cpu-moe", "LLAMA_ARG_N_CPU_MOE", BL_ARG_I64, &f->n_cpu_moe, 0, 1 << 20, .metavar = "N",
         .help = "the routed experts of the first N layers in host RAM"},
        {"-ot,--override-tensor", "LLAMA_ARG_OVERRIDE_TENSOR", BL_ARG_FN, NULL, .fn = add_ot, .ud = f,
         .metavar = "PATTERN=TYPE,...",
         .help = "tensors whose name the regex finds go to TYPE: CPU (host RAM), CUDAn, or HOSTTIER (the "
                 "hosttier process even beside a CPU worker); only routed experts may leave their layer's "
                 "stage, to a card without layers an expert tier; repeatable"},
        {"-fit,--fit", "LLAMA_ARG_FIT", BL_ARG_STR, &f->fit, .metavar = "on|off",
         .help = "on (default): without -ngl N, --cpu-moe, -ncmoe or -ot, put the routed experts of as many "
                 "leading layers in host RAM (then leading layers on the CPU) as each card needs to keep "
                 "-fitt MiB free; off: a stage that cannot fit its card is refused with the sizes"},
        {"-fitt,--fit-target", "LLAMA_ARG_FIT_TARGET", BL_ARG_STR, &f->fit_target, .metavar = "MiB0,MiB1,...",
         .help = "the memory --fit leaves free on each card (default 1024; one value for all cards)"},
        {"-fitc,--fit-ctx", "LLAMA_ARG_FIT_CTX", BL_ARG_I64, &f->fit_ctx, 0, INT32_MAX, .metavar = "N",
         .help = "the smallest context --fit may choose (default 4096): --fit never lowers the context here, "
                 "so the bound always holds"},
        {"--experts-vram", "BLOOMERY_EXPERTS_VRAM", BL_ARG_FN, NULL, .fn = bl_arg_experts_vram,
         .ud = &f->experts_vram, .metavar = "SIZE|auto",
         .help = "card memory for the slots that hold a card stage's hottest host-RAM experts: MiB, or with "
                 "a K, M or G suffix; auto (default): what the card has free at the first step less 2 GiB, at "
                 "most what the host-RAM layers need; 0: no slots"},
        {"--experts-ram", "BLOOMERY_EXPERTS_RAM", BL_ARG_FN, NULL, .fn = bl_arg_experts_vram,
         .ud = &f->experts_ram, .metavar = "SIZE|auto",
         .help = "host RAM for the routed experts that are not on a card: MiB, or with a K, M or G suffix; "
                 "the rest stay in the model file and the hosttier reads them from disk as they are called "
                 "(io_uring, O_DIRECT), keeping the hottest; auto (default): what the machine has available "
                 "less a margin (the larger of 2 GiB and 10 %) and the CPU layers' other weights; 0: one "
                 "expert at a time"},
        {"--no-residency", "BLOOMERY_NO_RESIDENCY", BL_ARG_FLAG, &f->no_residency,
         .help = "host-RAM experts stay where --cpu-moe, -ncmoe or -ot put them (no card slots)"},
    };
    const int k = (int)(sizeof t / sizeof t[0]);
    if (*n + k > cap)
        return BL_ERANGE;
    memcpy(a + *n, t, sizeof t);
    *n += k;
    f->experts_vram = BL_EXPERTS_VRAM_AUTO; /* zero would mean no slots */
    f->experts_ram = BL_EXPERTS_RAM_AUTO;
    return 0;
}

int bl_plan_opts(bl_place_opts_t *o, const bl_place_flags_t *f, bl_err_t *err)
{
    o->gpu_layers = f->gpu_layers;
    o->devices = f->devices;
    o->split_mode = f->split_mode;
    o->main_gpu = f->main_gpu;
    o->tensor_split = f->tensor_split;
    o->cpu_moe = f->cpu_moe;
    o->n_cpu_moe = f->n_cpu_moe;
    o->override_tensor = f->override_tensor;
    o->n_override_tensor = f->n_override_tensor;
    o->fit = f->fit;
    /* the options' 0 is "no limit"; the flag's 0 is the smallest budget (one slot) */
    o->experts_ram = f->experts_ram == 0 ? 1 : f->experts_ram;
    o->fit_target_mib = -1;
    const char *v = f->fit_target;
    for (const char *p = v; p && *p;) {
        const char *comma = strchr(p, ',');
        char one[32];
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int64_t x = -1;
        if (len == 0 || len >= sizeof one)
            return bl_err_set(err, BL_EINVAL, "--fit-target: '%.40s' is not a list of MiB", v);
        memcpy(one, p, len);
        one[len] = '\0';
        if (bl_parse_i64(one, &x) != 0 || x < 0 || x > ((int64_t)1 << 40))
            return bl_err_set(err, BL_EINVAL, "--fit-target: '%s' is not a number of MiB", one);
        if (o->fit_target_mib >= 0 && x != o->fit_target_mib)
            return bl_err_set(err, BL_ENOTSUP, "--fit-target %s: a margin per card differing between cards is not "
                              "supported yet; give one value", v);
        o->fit_target_mib = x;
        if (!comma)
            break;
        p = comma + 1;
    }
    return 0;
}
