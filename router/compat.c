/* llama-server's flags without a meaning here: see compat.h. */
#include "compat.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

typedef enum kind {
    SAME,     /* what this server always does: it works by doing nothing */
    NOEFFECT, /* accepted; what it sets does not exist here */
    REFUSE,   /* refused at start */
    OFF_ONLY, /* accepted with the values in ok (what llama-server takes as "off"),
               * refused with any other */
} kind_t;

typedef struct entry {
    const char *names, *env, *meta; /* meta NULL: a flag without a value */
    kind_t kind;
    const char *ok; /* OFF_ONLY: the values taken, '|'-separated; numbers compare as numbers */
    const char *why;
} entry_t;

#define NO_DRAFT "the draft model (-md) runs in a process of its own, whole on one card or on the CPU (-ngld, -devd), with the model's cache type and -td threads: llama.cpp's draft context has no such setting here"
#define NGRAM_MAP "the ngram-map-k4v type is not supported (--spec-type refuses it)"
#define NGRAM_KHITS "ngram-map-k counts no hits, as llama.cpp's (ngram-map-k4v would, which is not supported)"
#define NGRAM_HITS "ngram-simple proposes after the newest earlier occurrence and counts no hits, as llama.cpp's"
#define ONE_POOL "prompt steps run on the same threads and CPUs as decode steps (-t, -C, -Cr, --cpu-strict, --prio, --poll), one pool a worker"
#define NO_ROUTER "serving several models (router mode) is not supported: give one model with -m or -hf"
#define TEXT_ONLY "no multimodal projector is ever loaded (text only: --mmproj is refused)"

static const entry_t k_table[] = {
    /* threads */
    {"-Cb,--cpu-mask-batch", NULL, "M", NOEFFECT, NULL, ONE_POOL},
    {"-Crb,--cpu-range-batch", NULL, "lo-hi", NOEFFECT, NULL, ONE_POOL},
    {"--cpu-strict-batch", NULL, "<0|1>", NOEFFECT, NULL, ONE_POOL},
    {"--prio-batch", NULL, "N", NOEFFECT, NULL, ONE_POOL},
    {"--poll-batch", NULL, "<0|1>", NOEFFECT, NULL, ONE_POOL},
    /* lookup and speculative decoding */
    {"-lcs,--lookup-cache-static", NULL, "FNAME", REFUSE, NULL, "lookup decoding is not supported"},
    {"-lcd,--lookup-cache-dynamic", NULL, "FNAME", REFUSE, NULL, "lookup decoding is not supported"},
    {"--spec-draft-hf,-hfd,-hfrd,--hf-repo-draft", "LLAMA_ARG_SPEC_DRAFT_HF_REPO", "<user>/<model>[:quant]", REFUSE,
     NULL, "a draft model from Hugging Face is not fetched: download it and pass -md FILE"},
    {"--spec-draft-threads-batch,-tbd,--threads-batch-draft", NULL, "N", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-cpu-mask,-Cd,--cpu-mask-draft", NULL, "M", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-cpu-range,-Crd,--cpu-range-draft", NULL, "lo-hi", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-cpu-strict,--cpu-strict-draft", NULL, "<0|1>", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-prio,--prio-draft", NULL, "N", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-poll,--poll-draft", NULL, "<0|1>", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-cpu-mask-batch,-Cbd,--cpu-mask-batch-draft", NULL, "M", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-cpu-strict-batch,--cpu-strict-batch-draft", NULL, "<0|1>", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-prio-batch,--prio-batch-draft", NULL, "N", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-poll-batch,--poll-batch-draft", NULL, "<0|1>", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-type-k,-ctkd,--cache-type-k-draft", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", "TYPE", NOEFFECT, NULL,
     NO_DRAFT},
    {"--spec-draft-type-v,-ctvd,--cache-type-v-draft", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", "TYPE", NOEFFECT, NULL,
     NO_DRAFT},
    {"--spec-draft-override-tensor,-otd,--override-tensor-draft", NULL, "PATTERN=BUFFER,...", NOEFFECT, NULL,
     NO_DRAFT},
    {"--spec-draft-cpu-moe,-cmoed,--cpu-moe-draft", "LLAMA_ARG_SPEC_DRAFT_CPU_MOE", NULL, NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-n-cpu-moe,--spec-draft-ncmoe,-ncmoed,--n-cpu-moe-draft", "LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE", "N",
     NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-p-split,--draft-p-split", "LLAMA_ARG_SPEC_DRAFT_P_SPLIT", "P", NOEFFECT, NULL, NO_DRAFT},
    {"--spec-draft-backend-sampling", "LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING", NULL, NOEFFECT, NULL, NO_DRAFT},
    {"--no-spec-draft-backend-sampling", NULL, NULL, NOEFFECT, NULL, NO_DRAFT},
    {"--spec-ngram-simple-min-hits", NULL, "N", NOEFFECT, NULL, NGRAM_HITS},
    {"--spec-ngram-map-k-min-hits", NULL, "N", NOEFFECT, NULL, NGRAM_KHITS},
    {"--spec-ngram-map-k4v-size-n", NULL, "N", NOEFFECT, NULL, NGRAM_MAP},
    {"--spec-ngram-map-k4v-size-m", NULL, "N", NOEFFECT, NULL, NGRAM_MAP},
    {"--spec-ngram-map-k4v-min-hits", NULL, "N", NOEFFECT, NULL, NGRAM_MAP},
    {"--spec-ngram-min-hits", NULL, "N", NOEFFECT, NULL, NGRAM_HITS},
    {"--spec-default", NULL, NULL, REFUSE, NULL,
     "the default draft models are fetched from Hugging Face: pass -md FILE instead"},
    /* context and cache */
    {"-cms,--checkpoint-min-step", "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT", "N", NOEFFECT, NULL,
     "checkpoints are taken before a prompt's last token and every -cpent prompt tokens"},
    {"-no-kvu,--no-kv-unified", NULL, NULL, SAME, NULL, "each slot owns its share of the context (-c / -np)"},
    /* prompts and text of the command-line programs */
    {"-p,--prompt", NULL, "PROMPT", NOEFFECT, NULL, "the server takes its prompts from requests"},
    {"-f,--file", NULL, "FNAME", NOEFFECT, NULL, "the server takes its prompts from requests"},
    {"-bf,--binary-file", NULL, "FNAME", NOEFFECT, NULL, "the server takes its prompts from requests"},
    {"--perf", "LLAMA_ARG_PERF", NULL, SAME, NULL, "every reply carries its timings"},
    {"--no-perf", NULL, NULL, NOEFFECT, NULL, "every reply carries its timings"},
    {"--warmup", NULL, NULL, NOEFFECT, NULL, "no warm-up run is made: loading reads every weight already"},
    /* samplers this server does not have: their "off" values only */
    {"--top-nsigma,--top-n-sigma", NULL, "N", OFF_ONLY, "-1|0", "top-n-sigma sampling is not supported (-1: off)"},
    {"--xtc-probability", NULL, "N", OFF_ONLY, "0", "XTC sampling is not supported (0: off)"},
    {"--xtc-threshold", NULL, "N", NOEFFECT, NULL, "XTC runs only with --xtc-probability above 0, which is refused"},
    {"--dry-multiplier", NULL, "N", OFF_ONLY, "0", "DRY sampling is not supported (0: off)"},
    {"--dry-base", NULL, "N", NOEFFECT, NULL, "DRY runs only with --dry-multiplier above 0, which is refused"},
    {"--dry-allowed-length", NULL, "N", NOEFFECT, NULL,
     "DRY runs only with --dry-multiplier above 0, which is refused"},
    {"--dry-penalty-last-n", NULL, "N", NOEFFECT, NULL,
     "DRY runs only with --dry-multiplier above 0, which is refused"},
    {"--dry-sequence-breaker", NULL, "STRING", NOEFFECT, NULL,
     "DRY runs only with --dry-multiplier above 0, which is refused"},
    {"--adaptive-target", NULL, "N", OFF_ONLY, "-1", "adaptive-p sampling is not supported (-1: off)"},
    {"--adaptive-decay", NULL, "N", NOEFFECT, NULL,
     "adaptive-p runs only with --adaptive-target of 0 or more, which is refused"},
    {"--dynatemp-range", NULL, "N", OFF_ONLY, "0", "dynamic temperature is not supported (0: off)"},
    {"--dynatemp-exp", NULL, "N", NOEFFECT, NULL, "dynamic temperature runs only with --dynatemp-range above 0, "
                                                  "which is refused"},
    {"--mirostat", NULL, "N", OFF_ONLY, "0", "mirostat sampling is not supported (0: off)"},
    {"--mirostat-lr", NULL, "N", NOEFFECT, NULL, "mirostat runs only with --mirostat 1 or 2, which is refused"},
    {"--mirostat-ent", NULL, "N", NOEFFECT, NULL, "mirostat runs only with --mirostat 1 or 2, which is refused"},
    {"-bs,--backend-sampling", "LLAMA_ARG_BACKEND_SAMPLING", NULL, NOEFFECT, NULL,
     "tokens are sampled in the server from each step's logits; where sampling runs changes no result"},
    /* RoPE */
    {"--rope-scale", "LLAMA_ARG_ROPE_SCALE", "N", REFUSE, NULL, "RoPE scaling is not supported: positions use the "
                                                               "model's own RoPE"},
    {"--rope-freq-scale", "LLAMA_ARG_ROPE_FREQ_SCALE", "N", REFUSE, NULL,
     "RoPE scaling is not supported: positions use the model's own RoPE"},
    {"--yarn-orig-ctx", "LLAMA_ARG_YARN_ORIG_CTX", "N", NOEFFECT, NULL,
     "YaRN runs only with --rope-scaling yarn, which is refused"},
    {"--yarn-ext-factor", "LLAMA_ARG_YARN_EXT_FACTOR", "N", NOEFFECT, NULL,
     "YaRN runs only with --rope-scaling yarn, which is refused"},
    {"--yarn-attn-factor", "LLAMA_ARG_YARN_ATTN_FACTOR", "N", NOEFFECT, NULL,
     "YaRN runs only with --rope-scaling yarn, which is refused"},
    {"--yarn-beta-slow", "LLAMA_ARG_YARN_BETA_SLOW", "N", NOEFFECT, NULL,
     "YaRN runs only with --rope-scaling yarn, which is refused"},
    {"--yarn-beta-fast", "LLAMA_ARG_YARN_BETA_FAST", "N", NOEFFECT, NULL,
     "YaRN runs only with --rope-scaling yarn, which is refused"},
    /* memory and devices */
    {"-kvo,--kv-offload", "LLAMA_ARG_KV_OFFLOAD", NULL, SAME, NULL,
     "each layer's KV cache lives where the layer runs (on the card for a card's layers)"},
    {"--repack", "LLAMA_ARG_REPACK", NULL, NOEFFECT, NULL,
     "the CPU kernels read the weights in the file's own layout; there is no repacked copy to make"},
    {"--no-host", "LLAMA_ARG_NO_HOST", NULL, NOEFFECT, NULL,
     "there are no host buffer types to bypass: host memory for a card is allocated as the plan needs it"},
    {"--mmproj-auto", "LLAMA_ARG_MMPROJ_AUTO", NULL, NOEFFECT, NULL, TEXT_ONLY},
    {"--no-mmproj-auto", NULL, NULL, SAME, NULL, TEXT_ONLY},
    {"--mmproj-offload", "LLAMA_ARG_MMPROJ_OFFLOAD", NULL, NOEFFECT, NULL, TEXT_ONLY},
    {"--no-mmproj-offload", NULL, NULL, NOEFFECT, NULL, TEXT_ONLY},
    {"--image-min-tokens", "LLAMA_ARG_IMAGE_MIN_TOKENS", "N", NOEFFECT, NULL, TEXT_ONLY},
    {"--image-max-tokens", "LLAMA_ARG_IMAGE_MAX_TOKENS", "N", NOEFFECT, NULL, TEXT_ONLY},
    {"--mtmd-batch-max-tokens", "LLAMA_ARG_MTMD_BATCH_MAX_TOKENS", "N", NOEFFECT, NULL, TEXT_ONLY},
    {"--rpc", "LLAMA_ARG_RPC", "SERVERS", REFUSE, NULL,
     "RPC backends are not supported (this server's own processes span cards and hosts)"},
    {"--mmap", "LLAMA_ARG_MMAP", NULL, SAME, NULL, "weights are read through the file mapping (unless --no-mmap)"},
    {"-ndio,--no-direct-io", NULL, NULL, SAME, NULL, "weights are read through the page cache"},
    {"--check-tensors", NULL, NULL, REFUSE, NULL,
     "checking every weight's values at load is not implemented (shapes, types and sizes are always checked)"},
    {"--control-vector", NULL, "FNAME", REFUSE, NULL, "control vectors are not supported"},
    {"--control-vector-scaled", NULL, "FNAME:SCALE,...", REFUSE, NULL, "control vectors are not supported"},
    {"--control-vector-layer-range", NULL, "START END", REFUSE, NULL, "control vectors are not supported"},
    {"--embd-normalize", NULL, "N", NOEFFECT, NULL, "embeddings are not served (--embedding is refused)"},
    /* the web page and its tools */
    {"--ui-config,--webui-config", "LLAMA_ARG_UI_CONFIG", "JSON", NOEFFECT, NULL,
     "the built-in page keeps its settings in the browser and takes no defaults from the server"},
    {"--ui-config-file,--webui-config-file", "LLAMA_ARG_UI_CONFIG_FILE", "PATH", NOEFFECT, NULL,
     "the built-in page keeps its settings in the browser and takes no defaults from the server"},
    {"--ui-mcp-proxy,--webui-mcp-proxy", "LLAMA_ARG_UI_MCP_PROXY", NULL, REFUSE, NULL,
     "the server proxies no MCP servers for the page"},
    {"--no-ui-mcp-proxy,--no-webui-mcp-proxy", NULL, NULL, SAME, NULL, "the server proxies no MCP servers"},
    {"--mcp-servers-config", "LLAMA_ARG_MCP_SERVERS_CONFIG", "PATH", REFUSE, NULL,
     "the server connects to no MCP servers"},
    {"--mcp-servers-json", "LLAMA_ARG_MCP_SERVERS_JSON", "JSON", REFUSE, NULL,
     "the server connects to no MCP servers"},
    {"-ag,--agent", "LLAMA_ARG_AGENT", NULL, REFUSE, NULL, "the server runs no agent loop of its own"},
    {"-no-ag,--no-agent", NULL, NULL, SAME, NULL, "the server runs no agent loop of its own"},
    {"--ssl-key-file", "LLAMA_ARG_SSL_KEY_FILE", "FNAME", REFUSE, NULL,
     "TLS is not built in: put a TLS proxy in front of the server"},
    {"--ssl-cert-file", "LLAMA_ARG_SSL_CERT_FILE", "FNAME", REFUSE, NULL,
     "TLS is not built in: put a TLS proxy in front of the server"},
    {"--models-max", "LLAMA_ARG_MODELS_MAX", "N", REFUSE, NULL, NO_ROUTER},
    {"--lora-init-without-apply", NULL, NULL, NOEFFECT, NULL, "no LoRA adapters are loaded (--lora is refused)"},
    {"--log-prompts-dir", NULL, "PATH", REFUSE, NULL, "writing each prompt to a folder is not supported"},
    /* presets that download other families */
    {"--embd-gemma-default", NULL, NULL, REFUSE, NULL, "embeddings are not served, and gemma3 is not a family "
                                                       "this server runs"},
    {"--fim-qwen-1.5b-default", NULL, NULL, REFUSE, NULL, "the qwen2 family of Qwen2.5-Coder is not served"},
    {"--fim-qwen-3b-default", NULL, NULL, REFUSE, NULL, "the qwen2 family of Qwen2.5-Coder is not served"},
    {"--fim-qwen-7b-default", NULL, NULL, REFUSE, NULL, "the qwen2 family of Qwen2.5-Coder is not served"},
    {"--fim-qwen-7b-spec", NULL, NULL, REFUSE, NULL,
     "the qwen2 family of Qwen2.5-Coder is not served, nor speculative decoding"},
    {"--fim-qwen-14b-spec", NULL, NULL, REFUSE, NULL,
     "the qwen2 family of Qwen2.5-Coder is not served, nor speculative decoding"},
    {"--gpt-oss-20b-default", NULL, NULL, REFUSE, NULL, "the gpt-oss family is not served yet"},
    {"--gpt-oss-120b-default", NULL, NULL, REFUSE, NULL, "the gpt-oss family is not served yet"},
    {"--vision-gemma-4b-default", NULL, NULL, REFUSE, NULL, "images are not served (text only)"},
    {"--vision-gemma-12b-default", NULL, NULL, REFUSE, NULL, "images are not served (text only)"},
    {"--cache-idle-slots", "LLAMA_ARG_CACHE_IDLE_SLOTS", NULL, SAME, NULL,
     "an idle slot's cache state goes to the prompt cache in host RAM when a new prompt takes the slot (-cram)"},
    {"--no-cache-idle-slots", NULL, NULL, NOEFFECT, NULL,
     "a slot's state is saved only when a new prompt would overwrite it; -cram 0 turns the prompt cache off"},
    {"--tools", "LLAMA_ARG_TOOLS", "TOOL1,TOOL2,...", REFUSE, NULL,
     "the server runs no built-in tools (a request's tools are the client's to run)"},
    {"-sps,--slot-prompt-similarity", NULL, "SIMILARITY", NOEFFECT, NULL,
     "a request takes the free slot whose cached prompt shares the longest prefix with it, whatever the share"},
    {"--sse-ping-interval", "LLAMA_ARG_SSE_PING_INTERVAL", "N", NOEFFECT, NULL,
     "a stream sends each token as it is made, with no silence between its first and last event to fill"},
    {"--reasoning-budget-message", "LLAMA_ARG_THINK_BUDGET_MESSAGE", "MESSAGE", REFUSE, NULL,
     "a message before a thought's forced end is not supported yet (--reasoning-budget N ends it with the "
     "tag alone)"},
    /* what serve.c refused before this table: the same refusals */
    {"--lora", NULL, "FNAME", REFUSE, NULL, "LoRA adapters are not supported"},
    {"-mm,--mmproj", "LLAMA_ARG_MMPROJ", "FILE", REFUSE, NULL, "multimodal projectors are not supported (text only)"},
    {"-mmu,--mmproj-url", "LLAMA_ARG_MMPROJ_URL", "URL", REFUSE, NULL,
     "multimodal projectors are not supported (text only)"},
    {"--embedding,--embeddings", "LLAMA_ARG_EMBEDDINGS", NULL, REFUSE, NULL,
     "embeddings are not served (the routes answer 501)"},
    {"--reranking,--rerank", "LLAMA_ARG_RERANKING", NULL, REFUSE, NULL,
     "reranking is not served (the routes answer 501)"},
    {"--props", "LLAMA_ARG_ENDPOINT_PROPS", NULL, REFUSE, NULL,
     "changing the server's properties by POST /props is not supported"},
    {"-nkvo,--no-kv-offload", NULL, NULL, REFUSE, NULL, "the KV cache stays beside the layers it belongs to"},
    {"--override-kv", NULL, "KEY=TYPE:VALUE", REFUSE, NULL, "overriding the model's metadata is not supported"},
    {"--rope-freq-base", "LLAMA_ARG_ROPE_FREQ_BASE", "N", REFUSE, NULL, "the RoPE base comes from the model file"},
    {"--rope-scaling", "LLAMA_ARG_ROPE_SCALING_TYPE", "TYPE", REFUSE, NULL, "RoPE scaling is not supported"},
    {"--pooling", "LLAMA_ARG_POOLING", "TYPE", REFUSE, NULL,
     "embeddings are not served, so there is nothing to pool"},
    {"--models-dir", "LLAMA_ARG_MODELS_DIR", "PATH", REFUSE, NULL, NO_ROUTER},
    {"--models-preset", "LLAMA_ARG_MODELS_PRESET", "PATH", REFUSE, NULL, NO_ROUTER},
    {"--models-autoload", "LLAMA_ARG_MODELS_AUTOLOAD", NULL, REFUSE, NULL, NO_ROUTER},
    {"--no-models-autoload", NULL, NULL, REFUSE, NULL, NO_ROUTER},
    {"--media-path", NULL, "PATH", REFUSE, NULL, "multimodal input is not supported (text only)"},
    {"-dio,--direct-io", "LLAMA_ARG_DIO", NULL, REFUSE, NULL,
     "weights are read through the page cache (mmap); the expert pager of --experts-ram reads with O_DIRECT"},
    {"-nr,--no-repack", NULL, NULL, NOEFFECT, NULL,
     "the CPU kernels read the weights in the file's own layout; there is no repacked copy to turn off"},
};

_Static_assert(sizeof k_table / sizeof *k_table <= RT_COMPAT_MAX, "RT_COMPAT_MAX is too small");

#define N_TABLE ((int)(sizeof k_table / sizeof *k_table))

/* The help text of entry e (static storage: the table is fixed). */
static const char *help_of(int i)
{
    static char help[N_TABLE][384];
    const entry_t *e = &k_table[i];
    if (!help[i][0]) {
        switch (e->kind) {
        case SAME:
            snprintf(help[i], sizeof help[i], "works: what this server does anyway: %s", e->why);
            break;
        case NOEFFECT:
            snprintf(help[i], sizeof help[i], "accepted, no effect here: %s", e->why);
            break;
        case REFUSE:
            snprintf(help[i], sizeof help[i], "refused: %s", e->why);
            break;
        case OFF_ONLY:
            snprintf(help[i], sizeof help[i], "accepted as %s (off), other values refused: %s", e->ok, e->why);
            break;
        }
    }
    return help[i];
}

int rt_compat_args(bl_arg_t *a, int *n, int cap, rt_compat_seen_t *seen)
{
    if (*n + N_TABLE > cap)
        return BL_ERANGE;
    for (int i = 0; i < N_TABLE; i++) {
        const entry_t *e = &k_table[i];
        a[(*n)++] = (bl_arg_t){.names = e->names, .env = e->env, .kind = e->meta ? BL_ARG_STR : BL_ARG_FLAG,
                               .dst = e->meta ? (void *)&seen->value[i] : (void *)&seen->flag[i],
                               .metavar = e->meta, .help = help_of(i)};
    }
    return 0;
}

/* The last long spelling of names ("--embeddings" of "--embedding,--embeddings"). */
static void name_of(const char *names, char *out, size_t cap)
{
    const char *p = names, *best = names;
    for (const char *q; (q = strstr(p, "--")); p = q + 2)
        if (q == names || q[-1] == ',')
            best = q;
    const char *comma = strchr(best, ',');
    snprintf(out, cap, "%.*s", (int)(comma ? (size_t)(comma - best) : strlen(best)), best);
}

/* Is v one of ok's '|'-separated values (numbers compared as numbers)? */
static int value_ok(const char *ok, const char *v)
{
    double dv = 0;
    const int v_num = bl_parse_f64(v, &dv) == 0;
    for (const char *p = ok; *p;) {
        const char *bar = strchr(p, '|');
        const size_t len = bar ? (size_t)(bar - p) : strlen(p);
        char tok[32];
        snprintf(tok, sizeof tok, "%.*s", (int)len, p);
        double dt = 0;
        if (!strcmp(tok, v) || (v_num && bl_parse_f64(tok, &dt) == 0 && dt == dv))
            return 1;
        if (!bar)
            break;
        p = bar + 1;
    }
    return 0;
}

int rt_compat_check(const rt_compat_seen_t *seen, bl_err_t *err)
{
    for (int i = 0; i < N_TABLE; i++) {
        const entry_t *e = &k_table[i];
        const char *v = seen->value[i];
        if (!v && !seen->flag[i])
            continue;
        char name[64];
        name_of(e->names, name, sizeof name);
        if (e->kind == REFUSE)
            return bl_err_set(err, BL_ENOTSUP, "%s: %s", name, e->why);
        if (e->kind == OFF_ONLY && !value_ok(e->ok, v))
            return bl_err_set(err, BL_ENOTSUP, "%s %.64s: %s", name, v, e->why);
    }
    for (int i = 0; i < N_TABLE; i++) {
        const entry_t *e = &k_table[i];
        if (!seen->value[i] && !seen->flag[i])
            continue;
        char name[64];
        name_of(e->names, name, sizeof name);
        BL_LOG(BL_LOG_INFO, "event=flag_%s flag=%s reason=\"%s\"", e->kind == SAME ? "same" : "no_effect", name,
               e->why);
    }
    return 0;
}
