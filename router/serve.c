/* bloomery-serve: the router's main. It reads llama-server's flags (command line,
 * --config file, LLAMA_ARG_* variables), opens the model's metadata, builds the
 * tokenizer and chat template, starts the cluster of child processes and the
 * engine, serves HTTP on the loop, and on SIGINT/SIGTERM drains and stops it all.
 *
 * Thread: main runs the libuv loop; the engine and the cluster have their own. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "api.h"
#include "compat.h"
#include "grammar.h"
#include "json_schema.h"
#include "args.h"
#include "cpuset.h"
#include "bl_config.h"
#include "file.h"
#include "slotfile.h"
#include "hub.h"
#include "plan.h"
#include "dryrun.h"
#include "ngram.h"
#include "wmem.h"
#include "quant.h"
#include "hostfile.h"
#include "link.h"
#include "log.h"
#include "node.h"


#define PROG "bloomery-serve"
#define MAX_BODY_BYTES ((size_t)32 << 20)  /* request bodies larger than this: 413 */
#define CONFIG_FILE_MAX ((size_t)1 << 20)
#define KEY_FILE_MAX ((size_t)1 << 20)
#define TEMPLATE_FILE_MAX ((size_t)16 << 20)
#define DRAIN_LIMIT_MS 5000                /* longest wait for open requests at shutdown */
#define WATCH_MS 100                       /* how often the cluster's state is read */
#define MAX_ARGS 400 /* the flags of build_args, with room */
#define MAX_DEFAULT_BIAS 1024 /* -l flags */

/* A chat template for models that carry none and for --chat-template chatml. */
static const char chatml_template[] =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/* --- flags ------------------------------------------------------------------------- */

typedef struct opts {
    const char *model, *alias, *host, *tags;
    bl_hub_opts_t hub; /* -hf and its companions */
    int64_t port, ctx, parallel, n_predict, threads, threads_batch, batch, ubatch, poll;
    const char *chat_template, *chat_template_file;
    int jinja, metrics;
    const char *api_key, *api_key_file;
    int64_t timeout;
    int log_disable, verbose, kv_unified;
    /* speculative decoding */
    const char *draft_model, *draft_device, *spec_type;
    int64_t draft_max, draft_min, draft_ngl, draft_threads;
    float draft_p_min;
    /* n-gram speculation; -1: not given */
    int64_t ng_simple_n, ng_simple_m, ng_mod_match, ng_mod_min, ng_mod_max, ng_map_n, ng_map_m, ng_n, ng_m;
    int64_t workers;
    const char *hostfile, *cluster_secret; /* stages on other hosts (docs/deploy.md) */
    const char *cache_type_k, *cache_type_v;
    const char *config;
    const char *slot_save_path;
    /* placement */
    bl_place_flags_t place;
    bl_cpu_flags_t cpu; /* -C, -Cr, --cpu-strict */
    /* the requests' defaults (llama-server's sampling flags) */
    float temp, top_p, min_p, typical, repeat_penalty, presence_penalty, frequency_penalty;
    int64_t top_k, repeat_last_n, seed, min_keep;
    const char *samplers, *sampling_seq;
    /* memory and kernels */
    int flash_attn; /* BL_FLASH_* */
    int no_mmap, mlock;
    /* chat */
    const char *reasoning_format, *chat_template_kwargs;
    int64_t reasoning_budget;
    /* what this server always or never does, in llama-server's words */
    int cont_batching, no_cont_batching, context_shift, no_context_shift, spm_infill;
    int slots, no_slots, no_webui, no_warmup, swa_full;
    int64_t cache_reuse;
    const char *log_file;
    /* HTTP and logs */
    const char *api_prefix, *log_colors;
    int64_t threads_http, log_verbosity, keep, cache_ram, ctx_checkpoints, checkpoint_every, cache_disk_size;
    int64_t pipeline;
    const char *cache_disk;
    int list_devices, no_mmproj, no_op_offload, op_offload, cache_list, completion_bash, fim_qwen_30b;
    int no_peer_copy;
    rt_compat_seen_t compat; /* llama-server's flags without a meaning here (compat.h) */
    /* request defaults beside the sampling ones */
    int ignore_eos, cache_prompt, no_cache_prompt, ui, log_prefix, no_log_prefix, log_timestamps,
        no_log_timestamps;
    const char *log_format;
    rt_logit_bias_t bias[MAX_DEFAULT_BIAS];
    int n_bias;
    const char *grammar, *grammar_file, *json_schema, *json_schema_file;
    const char *cors_origins, *cors_methods, *cors_headers, *reasoning, *static_path;
    int no_jinja, reasoning_preserve, no_reasoning_preserve, skip_chat_parsing, no_skip_chat_parsing;
    int prefill_assistant, no_prefill_assistant, special, escape, no_escape;
    const char *reverse[RT_MAX_STOP];
    int n_reverse;
    const char *load_mode;
    int cors_credentials, no_cors_credentials, reuse_port;
    double defrag_thold;
    int64_t sleep_idle; /* --sleep-idle-seconds: -1 never */
    int dry_run;        /* --dry-run: print the plan and exit */
} opts_t;

/* --api-prefix: a path of plain segments, "/v2" or "/a/b", without a trailing '/'. */
static int parse_api_prefix(void *ud, const char *value, bl_err_t *err)
{
    size_t n = strlen(value);
    if (n > 0 && (value[0] != '/' || value[n - 1] == '/' || n > 256 || strstr(value, "//")))
        return bl_err_set(err, BL_EINVAL, "'%.64s' is not /PATH without a trailing '/'", value);
    for (const char *p = value; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("/-._~", *p))
            return bl_err_set(err, BL_EINVAL, "'%.64s': a prefix is letters, digits and / - . _ ~",
                              value);
    *(const char **)ud = value;
    return 0;
}

/* --sleep-idle-seconds: -1 (never) or a number of seconds; llama-server refuses 0
 * and anything below -1. */
static int parse_sleep_idle(void *ud, const char *value, bl_err_t *err)
{
    int64_t v = 0;
    if (bl_parse_i64(value, &v) != 0 || v == 0 || v < -1 || v > 86400 * 365)
        return bl_err_set(err, BL_EINVAL, "'%.32s' is not -1 (never) or a number of seconds (1..31536000)",
                          value);
    *(int64_t *)ud = v;
    return 0;
}

/* -r: one more default stop string. */
static int parse_reverse(void *ud, const char *value, bl_err_t *err)
{
    opts_t *o = ud;
    if (o->n_reverse == RT_MAX_STOP)
        return bl_err_set(err, BL_ERANGE, "more than %d stop strings", RT_MAX_STOP);
    if (!*value)
        return bl_err_set(err, BL_EINVAL, "an empty stop string");
    o->reverse[o->n_reverse++] = value;
    return 0;
}

/* The escapes llama.cpp reads in -r's strings: \n \r \t \' \" \\ (others stay as
 * written). Into a new string. */
static char *unescape(const char *s)
{
    char *out = malloc(strlen(s) + 1), *o = out;
    if (!out)
        return NULL;
    for (; *s; s++) {
        if (*s == '\\' && s[1]) {
            const char c = s[1];
            const char *m = strchr("nrt'\"\\", c);
            if (m) {
                *o++ = c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
                s++;
                continue;
            }
        }
        *o++ = *s;
    }
    *o = 0;
    return out;
}

/* -l: one more default logit bias (rt_logit_bias_parse). */
static int parse_default_bias(void *ud, const char *value, bl_err_t *err)
{
    opts_t *o = ud;
    if (o->n_bias == MAX_DEFAULT_BIAS)
        return bl_err_set(err, BL_ERANGE, "more than %d biases", MAX_DEFAULT_BIAS);
    const int rc = rt_logit_bias_parse(value, &o->bias[o->n_bias], err);
    if (rc == 0)
        o->n_bias++;
    return rc;
}

/* -ot may be given several times; each value is a comma list of PATTERN=BUFFER. */
enum { A_CONFIG = 0 };


static int build_args(bl_arg_t *a, opts_t *o)
{
    int n = 0;
#define STR(NAMES, ENV, DST, META, HELP)                                                           \
    a[n++] = (bl_arg_t){.names = NAMES, .env = ENV, .kind = BL_ARG_STR, .dst = DST, .metavar = META, \
                        .help = HELP}
#define I64(NAMES, ENV, DST, LO, HI, META, HELP)                                                   \
    a[n++] = (bl_arg_t){.names = NAMES, .env = ENV, .kind = BL_ARG_I64, .dst = DST, .min = LO,       \
                        .max = HI, .metavar = META, .help = HELP}
#define FLAG(NAMES, ENV, DST, HELP)                                                                \
    a[n++] = (bl_arg_t){.names = NAMES, .env = ENV, .kind = BL_ARG_FLAG, .dst = DST, .help = HELP}
#define F32(NAMES, DST, LO, HI, HELP)                                                              \
    a[n++] = (bl_arg_t){.names = NAMES, .kind = BL_ARG_F32, .dst = DST, .fmin = LO, .fmax = HI,       \
                        .metavar = "N", .help = HELP}
    /* A_CONFIG first: main reads it after parsing */
    STR("--config", "BLOOMERY_ARG_CONFIG", &o->config, "FILE",
        "JSON object of these flags by long name without dashes; the command line wins");
    STR("-m,--model", "LLAMA_ARG_MODEL", &o->model, "FNAME", "model path (GGUF)");
    {
        const bl_arg_t hub[] = {BL_HUB_ARGS(&o->hub)};
        for (size_t i = 0; i < sizeof hub / sizeof *hub; i++)
            a[n++] = hub[i];
    }
    STR("-a,--alias", "LLAMA_ARG_ALIAS", &o->alias, "NAME[,NAME...]",
        "model names, comma-separated: /v1/models lists them all as aliases, and the first in byte order "
        "names the model in responses (default: the file name, or -hf's USER/MODEL:QUANT)");
    STR("--tags", "LLAMA_ARG_TAGS", &o->tags, "TAG[,TAG...]",
        "the model's tags, comma-separated, listed in /v1/models (informational)");
    STR("--host", "LLAMA_ARG_HOST", &o->host, "HOST", "address to listen on (default 127.0.0.1)");
    STR("-md,--model-draft,--spec-draft-model", "LLAMA_ARG_SPEC_DRAFT_MODEL", &o->draft_model, "FNAME",
        "a draft model (GGUF, the model's vocabulary) for speculative decoding: it runs in a "
        "process of its own and proposes tokens that the model verifies in one step");
    I64("--draft,--draft-n,--draft-max", "LLAMA_ARG_DRAFT_MAX", &o->draft_max, 1, 64, "N",
        "tokens the draft proposes per step at most (default 16; the n-gram types have their own)");
    I64("--spec-draft-n-max", "LLAMA_ARG_SPEC_DRAFT_N_MAX", &o->draft_max, 1, 64, "N",
        "as --draft-max");
    I64("--draft-min,--draft-n-min", "LLAMA_ARG_DRAFT_MIN", &o->draft_min, 0, 64, "N",
        "fewest proposals worth a verification (default 0; the n-gram types have their own)");
    I64("--spec-draft-n-min", "LLAMA_ARG_SPEC_DRAFT_N_MIN", &o->draft_min, 0, 64, "N",
        "as --draft-min");
    a[n++] = (bl_arg_t){.names = "--draft-p-min,--spec-draft-p-min", .env = "LLAMA_ARG_SPEC_DRAFT_P_MIN",
                        .kind = BL_ARG_F32, .dst = &o->draft_p_min, .fmin = 0.0f, .fmax = 1.0f,
                        .metavar = "P", .help = "the draft stops proposing at a token it gives "
                        "less than this probability (default 0.75)"};
    I64("-ngld,--gpu-layers-draft,--n-gpu-layers-draft,--spec-draft-ngl", "LLAMA_ARG_N_GPU_LAYERS_DRAFT",
        &o->draft_ngl, -1, INT32_MAX, "N",
        "0: the draft runs on the CPU; any other (default -1, all): whole on one card when there "
        "is one (a draft is not split)");
    STR("-devd,--device-draft,--spec-draft-device", NULL, &o->draft_device, "DEV",
        "the draft's device: none (the CPU) or CUDAn (default: the first card)");
    I64("-td,--threads-draft,--spec-draft-threads", NULL, &o->draft_threads, -1, 1024, "N",
        "the draft process's threads (default: as -t)");
    STR("--spec-type", "LLAMA_ARG_SPEC_TYPE", &o->spec_type, "TYPE",
        "none (no speculative decoding, also with -md), draft (a draft model, -md; the "
        "default with -md), draft-mtp (the model's own NextN layer proposes one token a step: "
        "glm4moe and qwen35moe, on the CPU), ngram-simple (the tokens that followed the newest "
        "earlier occurrence of the last N), ngram-map-k (as ngram-simple, each N-gram proposing as many "
        "as the model took of its last proposals) or ngram-mod (chained from a table of what followed "
        "each N tokens, shared by the slots); ngram-map-k4v and ngram-cache are refused");
    I64("--spec-ngram-simple-size-n", NULL, &o->ng_simple_n, 1, RT_NGRAM_MAX_N, "N",
        "ngram-simple: the tokens looked up, the pending one last (default 12)");
    I64("--spec-ngram-simple-size-m", NULL, &o->ng_simple_m, 1, 64, "N",
        "ngram-simple: tokens proposed per step at most (default 48; at most 64 here)");
    I64("--spec-ngram-map-k-size-n", NULL, &o->ng_map_n, 1, RT_NGRAM_MAX_N, "N",
        "ngram-map-k: the tokens looked up, the pending one last (default 12)");
    I64("--spec-ngram-map-k-size-m", NULL, &o->ng_map_m, 1, 64, "N",
        "ngram-map-k: tokens proposed per step at most (default 48; at most 64 here)");
    I64("--spec-ngram-mod-n-match", NULL, &o->ng_mod_match, 1, RT_NGRAM_MAX_N, "N",
        "ngram-mod: the tokens each table entry is keyed by (default 24)");
    I64("--spec-ngram-mod-n-min", NULL, &o->ng_mod_min, 0, 64, "N",
        "ngram-mod: fewer proposals than this are none (default 48)");
    I64("--spec-ngram-mod-n-max", NULL, &o->ng_mod_max, 1, 64, "N",
        "ngram-mod: tokens proposed per step at most (default 64; at most 64 here)");
    I64("--spec-ngram-size-n", NULL, &o->ng_n, 1, RT_NGRAM_MAX_N, "N",
        "the older name of the chosen n-gram type's N (--spec-ngram-simple-size-n, "
        "--spec-ngram-map-k-size-n, --spec-ngram-mod-n-match); the type's own flag wins");
    I64("--spec-ngram-size-m", NULL, &o->ng_m, 1, 64, "N",
        "the older name of --spec-ngram-simple-size-m and --spec-ngram-map-k-size-m; the type's own "
        "flag wins");
    STR("--slot-save-path", NULL, &o->slot_save_path, "PATH",
        "folder of slot files: POST /slots/ID?action=save|restore writes and reads a slot's "
        "cache there (created if missing); without it slot actions answer 501");
    I64("--port", "LLAMA_ARG_PORT", &o->port, 0, 65535, "PORT", "port to listen on (default 8080)");
    I64("-c,--ctx-size", "LLAMA_ARG_CTX_SIZE", &o->ctx, 0, INT32_MAX, "N",
        "total context over all slots (default 4096, at most the model's; 0: the model's)");
    I64("-np,--parallel", "LLAMA_ARG_N_PARALLEL", &o->parallel, 1, 256, "N",
        "slots: requests served at once, each with ctx-size / N positions (default 1)");
    FLAG("-kvu,--kv-unified", "LLAMA_ARG_KV_UNIFIED", &o->kv_unified,
         "one KV cache of ctx-size positions shared by all slots, each slot up to all of it "
         "(taken in chunks of 256 as it grows; when it is full, idle slots' caches go first, "
         "then the newest task waits and is recomputed); without it each slot owns ctx-size "
         "/ np positions");
    I64("-n,--predict,--n-predict", "LLAMA_ARG_N_PREDICT", &o->n_predict, -1, INT32_MAX, "N",
        "most tokens one request may generate (default -1: no limit)");
    I64("-t,--threads", "LLAMA_ARG_THREADS", &o->threads, -1, 1024, "N",
        "threads per worker for decode steps (default, or -1 as llama.cpp: one per physical core of the "
        "CPUs it may use)");
    I64("-tb,--threads-batch", "LLAMA_ARG_THREADS_BATCH", &o->threads_batch, 1, 1024, "N",
        "threads per worker for prompt steps (default: --threads)");
    I64("--poll", NULL, &o->poll, 0, 100, "0..100",
        "how the CPU thread pools' idle threads wait for work, as llama.cpp's polling level: they "
        "yield for 4 us per level before they sleep (default 50; 0: they sleep after a short spin)");
    I64("-b,--batch-size", "LLAMA_ARG_BATCH", &o->batch, 1, 1 << 20, "N",
        "logical batch: most prompt tokens per step together with -ub (default 2048)");
    I64("-ub,--ubatch-size", "LLAMA_ARG_UBATCH", &o->ubatch, 1, 1 << 20, "N",
        "rows per step (default 512)");
    STR("--chat-template", "LLAMA_ARG_CHAT_TEMPLATE", &o->chat_template, "NAME|TEXT",
        "chat template: a built-in name (chatml) or the Jinja text itself");
    STR("--chat-template-file", "LLAMA_ARG_CHAT_TEMPLATE_FILE", &o->chat_template_file, "FILE",
        "chat template from a Jinja file");
    FLAG("--jinja", "LLAMA_ARG_JINJA", &o->jinja,
         "render chats with the model's Jinja template (the default; LLAMA_ARG_JINJA=0 is --no-jinja)");
    FLAG("--no-jinja", NULL, &o->no_jinja,
         "render chats with the built-in template the model's one matches (chatml for a template with "
         "<|im_start|>; --chat-template takes only a built-in name then); a request with tools or a "
         "tool_choice other than auto gets 400, as llama-server without Jinja");
    STR("-rea,--reasoning", "LLAMA_ARG_REASONING", &o->reasoning, "on|off|auto",
        "thinking: on and off give the template enable_thinking true or false; auto (the default) "
        "leaves it to the template; a request's chat_template_kwargs win");
    FLAG("--reasoning-preserve", "LLAMA_ARG_REASONING_PRESERVE", &o->reasoning_preserve,
         "the template keeps the reasoning of every assistant turn (preserve_reasoning true)");
    FLAG("--no-reasoning-preserve", NULL, &o->no_reasoning_preserve,
         "the template keeps only the last turn's reasoning (preserve_reasoning false)");
    FLAG("--skip-chat-parsing", "LLAMA_ARG_SKIP_CHAT_PARSING", &o->skip_chat_parsing,
         "leave reasoning and tool calls as they were generated in the reply's content");
    FLAG("--no-skip-chat-parsing", NULL, &o->no_skip_chat_parsing,
         "split reasoning and tool calls out of the reply (the default)");
    FLAG("--prefill-assistant", "LLAMA_ARG_PREFILL_ASSISTANT", &o->prefill_assistant,
         "a chat whose last message is the assistant's is continued: the reply follows its text (the "
         "default)");
    FLAG("--no-prefill-assistant", NULL, &o->no_prefill_assistant,
         "a last assistant message is a whole turn; the reply is a new one after it");
    a[n++] = (bl_arg_t){.names = "-r,--reverse-prompt", .kind = BL_ARG_FN, .fn = parse_reverse, .ud = o,
                        .metavar = "PROMPT",
                        .help = "a stop string every request gets that sends no stop of its own (repeatable; "
                                "escapes such as \\n are read unless --no-escape)"};
    FLAG("-e,--escape", NULL, &o->escape, "read \\n, \\t, \\\\ ... in -r's strings (the default)");
    FLAG("--no-escape", NULL, &o->no_escape, "take -r's strings as written");
    FLAG("-sp,--special", NULL, &o->special,
         "every request's default: control tokens are written into the text (a request's own field wins)");
    STR("-lm,--load-mode", "LLAMA_ARG_LOAD_MODE", &o->load_mode, "MODE",
        "how weights are read: auto or mmap (the file mapping, the default), none (copied, as --no-mmap), "
        "mlock or mmap+mlock (locked, as --mlock); dio is refused as -dio is");
    FLAG("--metrics", "LLAMA_ARG_ENDPOINT_METRICS", &o->metrics,
         "accepted: /metrics is always served");
    STR("--api-key", "LLAMA_API_KEY", &o->api_key, "KEY[,KEY...]",
        "accept only requests carrying one of these keys (/health and /v1/models stay public)");
    STR("--api-key-file", "LLAMA_ARG_API_KEY_FILE", &o->api_key_file, "FILE", "file with one API key per line");
    I64("-to,--timeout", "LLAMA_ARG_TIMEOUT", &o->timeout, 1, 86400 * 7, "N",
        "seconds a connection may idle and a request may wait for a slot (default 600)");
    FLAG("--log-disable", NULL, &o->log_disable, "write no log lines");
    FLAG("-v,--verbose,--log-verbose", NULL, &o->verbose,
         "log at DEBUG (children too); the OpenAI completion replies carry \"__verbose\"");
    I64("-lv,--verbosity,--log-verbosity", "LLAMA_ARG_LOG_VERBOSITY", &o->log_verbosity, 0, 100, "N",
        "log threshold: 0 nothing, 1 errors, 2 warnings, 3 info (default), 4 debug; above 9 "
        "the OpenAI completion replies carry \"__verbose\"");
    STR("--log-colors", "LLAMA_ARG_LOG_COLORS", &o->log_colors, "on|off|auto",
        "colour the level names (auto: when stderr is a terminal; the default)");
    a[n++] = (bl_arg_t){.names = "--api-prefix", .env = "LLAMA_ARG_API_PREFIX",
                        .kind = BL_ARG_FN, .fn = parse_api_prefix, .ud = &o->api_prefix,
                        .metavar = "PREFIX",
                        .help = "serve every route under this path (\"/v2\": /v2/health, ...)"};
    I64("--threads-http", "LLAMA_ARG_THREADS_HTTP", &o->threads_http, -1, 1024, "N",
        "accepted and logged: HTTP runs on one event-loop thread, generation elsewhere");
    I64("--workers", "BLOOMERY_ARG_WORKERS", &o->workers, 1, 1024, "N",
        "CPU worker processes: the layers split into N pipeline stages (default 1)");
    STR("--hostfile", "BLOOMERY_ARG_HOSTFILE", &o->hostfile, "FILE",
        "the cluster's hostfile: a stage per worker line, in order, on its host's CPU or on each GPU it names; a "
        "line of another host than the router's runs under the node there; layers by the lines' layers=, else by "
        "each stage's speed (a CPU stage's threads, a card's) within each host's and card's memory "
        "(docs/deploy.md)");
    STR("--cluster-secret", "BLOOMERY_ARG_CLUSTER_SECRET", &o->cluster_secret, "FILE",
        "the cluster's secret (mode 0600, at least 32 bytes): the keys of the links to other hosts");
    STR("-ctk,--cache-type-k", "LLAMA_ARG_CACHE_TYPE_K", &o->cache_type_k, "TYPE",
        "KV cache type: f16 (default), f32, q8_0; -ctv must match");
    STR("-ctv,--cache-type-v", "LLAMA_ARG_CACHE_TYPE_V", &o->cache_type_v, "TYPE",
        "KV cache type of V: must equal -ctk");
    if (bl_plan_args(a, &n, MAX_ARGS, &o->place) != 0 || bl_cpu_args(a, &n, MAX_ARGS, &o->cpu) != 0)
        abort(); /* MAX_ARGS is sized for the table: a build error, not an input's */
    a[n++] = (bl_arg_t){.names = "-fa,--flash-attn", .env = "LLAMA_ARG_FLASH_ATTN",
                        .kind = BL_ARG_FN, .fn = bl_arg_flash_attn, .ud = &o->flash_attn,
                        .metavar = "on|off|auto",
                        .help = "prompt attention on a GPU as one flash kernel (on), as "
                                "score/softmax/value pieces (off), or flash where the head size "
                                "has it (auto, the default); the CPU path is the same either way"};
    FLAG("--no-mmap", "LLAMA_ARG_NO_MMAP", &o->no_mmap,
         "copy every weight into the processes' memory, even a model larger than half the RAM "
         "(default: such a model stays in the file mapping)");
    FLAG("--mlock", "LLAMA_ARG_MLOCK", &o->mlock,
         "lock the weights in RAM (a refusal, such as RLIMIT_MEMLOCK, is logged and ignored)");
    STR("--reasoning-format", "LLAMA_ARG_THINK", &o->reasoning_format, "FORMAT",
        "where a reply's thought goes: auto or deepseek (reasoning_content, the default), "
        "deepseek-legacy (reasoning_content and the content), none (left in the content); a "
        "request's reasoning_format wins");
    I64("--reasoning-budget", "LLAMA_ARG_THINK_BUDGET", &o->reasoning_budget, -1, INT32_MAX, "N",
        "-1: no bound (the default); 0: no thinking (templates get enable_thinking false); N: a "
        "thought ends after N tokens, its end tag forced");
    STR("--chat-template-kwargs", "LLAMA_ARG_CHAT_TEMPLATE_KWARGS", &o->chat_template_kwargs,
        "JSON", "a JSON object of chat template arguments every request gets (its own "
        "chat_template_kwargs win)");
    FLAG("-cb,--cont-batching", "LLAMA_ARG_CONT_BATCHING", &o->cont_batching,
         "accepted: batching is always continuous");
    FLAG("-nocb,--no-cont-batching", "LLAMA_ARG_NO_CONT_BATCHING", &o->no_cont_batching,
         "refused: batching is always continuous");
    FLAG("--no-context-shift", "LLAMA_ARG_NO_CONTEXT_SHIFT", &o->no_context_shift,
         "accepted: a full context ends generation (llama-server's default)");
    FLAG("--context-shift", "LLAMA_ARG_CONTEXT_SHIFT", &o->context_shift,
         "refused: the context is never shifted");
    I64("--cache-reuse", "LLAMA_ARG_CACHE_REUSE", &o->cache_reuse, 0, INT32_MAX, "N",
        "0 (default) is accepted; reusing cached chunks by shifting them is refused (the "
        "prompt cache keeps the longest common prefix)");
    FLAG("--spm-infill", NULL, &o->spm_infill,
         "fill-in-the-middle prompts put the suffix before the prefix");
    FLAG("--slots", "LLAMA_ARG_ENDPOINT_SLOTS", &o->slots, "serve GET /slots (the default)");
    FLAG("--no-slots", "LLAMA_ARG_NO_ENDPOINT_SLOTS", &o->no_slots, "GET /slots answers 501");
    FLAG("--no-webui,--no-ui", "LLAMA_ARG_NO_WEBUI", &o->no_webui, "no chat page at GET / (404)");
    FLAG("--ui,--webui", "LLAMA_ARG_UI", &o->ui,
         "serve the chat page at GET / (the default; LLAMA_ARG_UI=0 turns it off as --no-ui does)");
    FLAG("--ignore-eos", NULL, &o->ignore_eos,
         "every request's default ignore_eos: end tokens are not sampled (a request's own field wins)");
    FLAG("--cache-prompt", "LLAMA_ARG_CACHE_PROMPT", &o->cache_prompt,
         "every request's default cache_prompt: reuse the slot's cached prefix (the default)");
    FLAG("--no-cache-prompt", NULL, &o->no_cache_prompt,
         "every request's default cache_prompt false: each prompt is evaluated whole (a request's own "
         "field wins)");
    a[n++] = (bl_arg_t){.names = "-l,--logit-bias", .kind = BL_ARG_FN, .fn = parse_default_bias, .ud = o,
                        .metavar = "TOKEN_ID(+/-)BIAS",
                        .help = "a logit bias every request gets (repeatable: 15043+1, 15043-inf; a request's "
                                "own logit_bias replaces them)"};
    STR("--grammar", NULL, &o->grammar, "GRAMMAR",
        "a GBNF grammar every request gets that sends no grammar, json_schema or response_format");
    STR("--grammar-file", NULL, &o->grammar_file, "FNAME", "--grammar from a file");
    STR("-j,--json-schema", NULL, &o->json_schema, "SCHEMA",
        "a JSON schema every request's text must follow that sends no constraint of its own");
    STR("-jf,--json-schema-file", NULL, &o->json_schema_file, "FILE", "--json-schema from a file");
    STR("--cors-origins", "LLAMA_ARG_CORS_ORIGINS", &o->cors_origins, "ORIGINS",
        "Access-Control-Allow-Origin as llama-server sends it: * (the default) echoes the request's Origin "
        "while credentials are allowed; localhost echoes only an Origin on localhost, 127.0.0.1 or [::1]; "
        "anything else is sent as given");
    STR("--cors-methods", "LLAMA_ARG_CORS_METHODS", &o->cors_methods, "METHODS",
        "Access-Control-Allow-Methods of a preflight (default \"GET, POST, DELETE, OPTIONS\")");
    STR("--cors-headers", "LLAMA_ARG_CORS_HEADERS", &o->cors_headers, "HEADERS",
        "Access-Control-Allow-Headers of a preflight (default *)");
    FLAG("--cors-credentials", "LLAMA_ARG_CORS_CREDENTIALS", &o->cors_credentials,
         "Access-Control-Allow-Credentials: true in a preflight (the default)");
    FLAG("--no-cors-credentials", NULL, &o->no_cors_credentials,
         "Access-Control-Allow-Credentials: false; with it, --cors-origins * is sent as *");
    STR("--path", "LLAMA_ARG_STATIC_PATH", &o->static_path, "PATH",
        "serve this folder's files in place of the built-in page (GET /: its index.html), public as the page "
        "is; a missing folder stops the start");
    FLAG("--reuse-port", "LLAMA_ARG_REUSE_PORT", &o->reuse_port,
         "SO_REUSEPORT on the listening socket, so that several servers may share the port");
    FLAG("--log-prefix", "LLAMA_ARG_LOG_PREFIX", &o->log_prefix,
         "each log line names its level and process (the default)");
    FLAG("--no-log-prefix", NULL, &o->no_log_prefix, "log lines without the level and process names");
    FLAG("--log-timestamps", "LLAMA_ARG_LOG_TIMESTAMPS", &o->log_timestamps,
         "each log line starts with its UTC time (the default)");
    FLAG("--no-log-timestamps", NULL, &o->no_log_timestamps, "log lines without their time");
    STR("--log-format", "BLOOMERY_LOG_FORMAT", &o->log_format, "text|json",
        "log lines as text (the default) or one JSON object each, the event's fields as members "
        "(docs/agents.md); the server's processes follow it");
    FLAG("--no-warmup", NULL, &o->no_warmup, "accepted: no warm-up run is made");
    FLAG("--swa-full", "LLAMA_ARG_SWA_FULL", &o->swa_full,
         "accepted: the models served here have no sliding-window attention");
    a[n++] = (bl_arg_t){.names = "-dt,--defrag-thold", .env = "LLAMA_ARG_DEFRAG_THOLD",
                        .kind = BL_ARG_F64, .dst = &o->defrag_thold, .fmin = -1e9, .fmax = 1e9,
                        .metavar = "N",
                        .help = "accepted: deprecated in llama.cpp; each slot's cache is one "
                                "contiguous range here"};
    STR("--log-file", "LLAMA_ARG_LOG_FILE", &o->log_file, "FNAME",
        "append the log (the server's and its processes') to this file instead of stderr");
    /* sampling: the defaults of every request, which its own fields override */
    F32("--temp,--temperature", &o->temp, -1e6, 1e6, "temperature (default 0.8; <= 0: greedy)");
    I64("--top-k", "LLAMA_ARG_TOP_K", &o->top_k, 0, INT32_MAX, "N", "top-k sampling (default 40, 0: off)");
    F32("--top-p", &o->top_p, 0, 1, "top-p sampling (default 0.95, 1.0: off)");
    F32("--min-p", &o->min_p, 0, 1, "min-p sampling (default 0.05, 0.0: off)");
    F32("--typical,--typical-p", &o->typical, 0, 1, "locally typical sampling (default 1.0: off)");
    F32("--repeat-penalty", &o->repeat_penalty, 1e-6, 1e6,
        "penalise repeated tokens (default 1.0: off)");
    I64("--repeat-last-n", NULL, &o->repeat_last_n, -1, INT32_MAX, "N",
        "tokens the penalties look back over (default 64; 0: off; -1: the context)");
    F32("--presence-penalty", &o->presence_penalty, -1e6, 1e6, "presence penalty (default 0.0)");
    F32("--frequency-penalty", &o->frequency_penalty, -1e6, 1e6,
        "frequency penalty (default 0.0)");
    I64("-s,--seed", NULL, &o->seed, -1, UINT32_MAX, "SEED", "sampling seed (default -1: random)");
    I64("--min-keep", NULL, &o->min_keep, 0, INT32_MAX, "N",
        "the least tokens the filters keep (default 0)");
    STR("--samplers", NULL, &o->samplers, "SAMPLERS",
        "the sampler chain, names separated by ';' (default "
        "penalties;top_k;typ_p;top_p;min_p;temperature)");
    STR("--sampling-seq,--sampler-seq", NULL, &o->sampling_seq, "SEQUENCE",
        "the sampler chain as letters (e k y p m t i; default ekypmt)");
    I64("--keep", "LLAMA_ARG_KEEP", &o->keep, -1, INT32_MAX, "N",
        "accepted and logged: the context is never shifted, so no tokens are kept for it");
    FLAG("--list-devices", NULL, &o->list_devices, "print the CUDA devices and exit");
    FLAG("--dry-run", NULL, &o->dry_run,
         "print the plan a start with these flags would make and exit: the machine, the model, what goes "
         "where (per stage: weights, routed experts, KV cache, recurrent state, scratch), the context, and "
         "whether it fits (if not, the start's error and status); reads the model's metadata and tensor "
         "table only, starts no worker and opens no port; -hf reads the cache only, as --offline");
    FLAG("--fim-qwen-30b-default", NULL, &o->fim_qwen_30b,
         "llama-server's preset: -hf ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF (its Q8_0 file), --port "
         "8012, -b and -ub 1024, -c 0, for code completion (/infill); flags given beside it win. Its cache reuse "
         "(--cache-reuse 256) is not done here: a slot reuses its longest common prefix");
    FLAG("-cl,--cache-list", NULL, &o->cache_list, "print the GGUF files in the model cache (-hf's) and exit");
    FLAG("--completion-bash", NULL, &o->completion_bash,
         "print a bash completion script for these flags and exit (source it, or put it in bash-completion's "
         "folder)");
    a[n++] = (bl_arg_t){.names = "--sleep-idle-seconds", .kind = BL_ARG_FN, .fn = parse_sleep_idle,
                        .ud = &o->sleep_idle, .metavar = "SECONDS",
                        .help = "after this long without a request, stop the model's processes (memory and "
                                "GPUs freed); the next request loads it again (default -1: never)"};
    FLAG("--no-mmproj", "LLAMA_ARG_NO_MMPROJ", &o->no_mmproj,
         "accepted: no multimodal projector is ever loaded");
    FLAG("--op-offload", NULL, &o->op_offload,
         "a card copies a layer's host-RAM experts in for a prompt step of at least 64 rows (the "
         "default; --no-op-offload wins when both are given)");
    FLAG("--no-op-offload", NULL, &o->no_op_offload,
         "a card never copies a layer's host-RAM experts in for a prompt step (by default a step "
         "of at least 64 rows computes them on the card)");
    FLAG("--no-peer-copy", "BLOOMERY_ARG_NO_PEER_COPY", &o->no_peer_copy,
         "two cards of this host pass a step's activations between their stages through host memory "
         "(the stages' shared-memory ring) instead of card to card (CUDA IPC, the default where the "
         "cards reach each other's memory)");
    STR("--cache-disk", "BLOOMERY_ARG_CACHE_DISK", &o->cache_disk, "PATH",
        "the prompt cache on disk (made if missing): what a finished request leaves in its "
        "slot is written there off the request's path, and a prompt that shares more with an "
        "entry there than with the RAM cache starts from it, also after a restart");
    I64("--pipeline", "BLOOMERY_ARG_PIPELINE", &o->pipeline, 0, RT_CLUSTER_MAX_INFLIGHT, "N",
        "steps in flight at once when the model runs in several stages (--workers, cards), "
        "each over its own share of the busy slots, so that every stage works at once "
        "(default 0: the stage count; 1: one step at a time); a draft model, -kvu and a "
        "recurrent model (qwen3next) run one at a time");
    I64("--cache-disk-size", "BLOOMERY_ARG_CACHE_DISK_SIZE", &o->cache_disk_size, -1,
        INT64_MAX >> 20, "MiB",
        "bytes the --cache-disk folder's entries may take (default 32768; -1: no bound); the "
        "least recently used go first");
    I64("-cram,--cache-ram", "LLAMA_ARG_CACHE_RAM", &o->cache_ram, -1, INT64_MAX >> 20, "MiB",
        "the prompt cache in host RAM: what a new prompt would overwrite in a slot is saved "
        "there, and a prompt that shares more with a saved state starts from it; at most this "
        "much (default 8192, -1 no limit, 0 off)");
    I64("-ctxcp,--ctx-checkpoints,--swa-checkpoints", "LLAMA_ARG_CTX_CHECKPOINTS",
        &o->ctx_checkpoints, 0, 1024, "N",
        "checkpoints of the recurrent state a slot keeps (qwen3next, qwen35moe): a later prompt "
        "that shares a prefix starts from the latest inside it (default 8; 0: none, such a "
        "prompt runs whole); other models' caches are cut back to any prefix");
    I64("-cpent,--checkpoint-every-n-tokens", "LLAMA_ARG_CHECKPOINT_EVERY_NT", &o->checkpoint_every, -1,
        INT32_MAX, "N",
        "a checkpoint every N prompt tokens, besides the one before a prompt's last token "
        "(default 8192; -1: only that one)");
    if (rt_compat_args(a, &n, MAX_ARGS, &o->compat) != 0)
        abort(); /* MAX_ARGS is sized for the table */
#undef STR
#undef I64
#undef FLAG
#undef F32
    if (n > MAX_ARGS) { /* a programming error: the table outgrew its array */
        fprintf(stderr, "build_args: %d flags for %d places\n", n, MAX_ARGS);
        abort();
    }
    return n;
}

/* Values from --config; strings made from numbers are kept until exit. */
typedef struct keep {
    json_t *root;
    char **strs;
    size_t n;
} keep_t;

static const char *keep_str(keep_t *k, const char *s)
{
    char **p = realloc(k->strs, (k->n + 1) * sizeof *p);
    if (!p)
        return NULL;
    k->strs = p;
    p[k->n] = strdup(s);
    if (!p[k->n])
        return NULL;
    return p[k->n++];
}

static int has_long_name(const char *names, const char *key)
{
    size_t klen = strlen(key);
    for (const char *p = names; *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == klen + 2 && p[0] == '-' && p[1] == '-' && memcmp(p + 2, key, klen) == 0)
            return 1;
        if (!comma)
            break;
        p = comma + 1;
    }
    return 0;
}

/* The config value as the text a flag would take; NULL with err set. */
static const char *config_value_text(keep_t *k, const char *path, const char *key, json_t *v,
                                     bl_err_t *err)
{
    char buf[64];
    switch (json_typeof(v)) {
    case JSON_STRING:
        return json_string_value(v);
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return keep_str(k, buf);
    case JSON_REAL:
        snprintf(buf, sizeof buf, "%.17g", json_real_value(v));
        return keep_str(k, buf);
    case JSON_TRUE:
    case JSON_FALSE:
        return json_is_true(v) ? "on" : "off";
    case JSON_ARRAY: {
        /* a list joins with commas, as the flags take lists */
        size_t cap = 1, i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_string(e) && !json_is_integer(e) && !json_is_real(e)) {
                bl_err_set(err, BL_EINVAL, "--config %s: '%s'[%zu] must be a string or a number",
                           path, key, i);
                return NULL;
            }
            cap += (json_is_string(e) ? json_string_length(e) : 32) + 1;
        }
        char *s = calloc(1, cap);
        if (!s)
            return NULL;
        json_array_foreach(v, i, e) {
            if (i)
                strcat(s, ",");
            if (json_is_string(e))
                strcat(s, json_string_value(e));
            else if (json_is_integer(e))
                snprintf(s + strlen(s), cap - strlen(s), "%" JSON_INTEGER_FORMAT,
                         json_integer_value(e));
            else
                snprintf(s + strlen(s), cap - strlen(s), "%.17g", json_real_value(e));
        }
        const char *r = keep_str(k, s);
        free(s);
        return r;
    }
    default:
        bl_err_set(err, BL_EINVAL, "--config %s: '%s' must be a string, number, boolean or list",
                   path, key);
        return NULL;
    }
}

/* Applies the members of the JSON object in path to the flags not given on the
 * command line (so: command line > config file > environment). */
static int apply_config(bl_arg_t *args, int n_args, const char *path, keep_t *k, bl_err_t *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = bl_read_file(path, CONFIG_FILE_MAX, &text, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    if (!root)
        return bl_err_set(err, BL_EINVAL, "--config %s: line %d, column %d: %s", path, je.line,
                          je.column, je.text);
    k->root = root;
    if (!json_is_object(root))
        return bl_err_set(err, BL_EINVAL, "--config %s: expected a JSON object of flags", path);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int idx = -1;
        for (int i = 0; i < n_args && idx < 0; i++)
            if (has_long_name(args[i].names, key))
                idx = i;
        if (idx < 0 || idx == A_CONFIG)
            return bl_err_set(err, BL_EINVAL, "--config %s: unknown key '%.64s'", path, key);
        bl_arg_t *a = &args[idx];
        if (a->seen == 1 || json_is_null(v))
            continue;
        if (a->kind == BL_ARG_FLAG) {
            if (!json_is_boolean(v))
                return bl_err_set(err, BL_EINVAL, "--config %s: '%s' must be true or false", path,
                                  key);
            *(int *)a->dst = json_is_true(v);
            a->seen = 3;
            continue;
        }
        const char *value = config_value_text(k, path, key, v, err);
        if (!value)
            return err && err->code ? err->code : bl_err_set(err, BL_ENOMEM, "out of memory");
        char flag[96];
        snprintf(flag, sizeof flag, "--%s", key);
        char *argv[] = {PROG, flag, (char *)value, NULL};
        bl_arg_t one = *a;
        one.env = NULL;
        bl_err_t inner = {0};
        if (bl_args_parse(&one, 1, 3, argv, NULL, NULL, &inner) != 0)
            return bl_err_set(err, BL_EINVAL, "--config %s: %s", path, inner.msg);
        a->seen = 3;
    }
    return 0;
}

/* Whether a flag was given at all (command line, config or environment). */
static int arg_seen(const bl_arg_t *args, int n_args, const char *long_name)
{
    for (int i = 0; i < n_args; i++)
        if (has_long_name(args[i].names, long_name + 2))
            return args[i].seen != 0;
    return 0;
}

/* --- start-up checks ---------------------------------------------------------------- */

static int find_bin_dir(char *buf, size_t cap, bl_err_t *err);

/* --list-devices: llama-server's list, one CUDA device a line, as bloomery-worker
 * finds them; status 0. */
static int list_devices(void)
{
    char bin_dir[PATH_MAX];
    bl_device_t devs[BL_PLAN_MAX_DEVICES];
    int n = 0;
    bl_err_t err = {0};
    if (find_bin_dir(bin_dir, sizeof bin_dir, &err) || rt_cluster_devices(bin_dir, devs, BL_PLAN_MAX_DEVICES, &n, &err)) {
        fprintf(stderr, "%s: %s\n", PROG, err.msg);
        return 1;
    }
    printf("Available devices:\n");
    if (n == 0)
        printf("  (none: every layer runs on the CPU)\n");
    for (int i = 0; i < n; i++)
        printf("  CUDA%d: %s (%llu MiB, %llu MiB free)\n", devs[i].index, devs[i].name,
               (unsigned long long)(devs[i].total_bytes >> 20), (unsigned long long)(devs[i].free_bytes >> 20));
    return 0;
}

/* The plan as /props shows it. */
static json_t *placement_json(const bl_plan_t *p)
{
    json_t *stages = json_array(), *host = json_array();
    for (int i = 0; i < p->n_stages; i++) {
        const bl_plan_stage_t *st = &p->stage[i];
        char dev[16];
        snprintf(dev, sizeof dev, st->device >= 0 ? "CUDA%d" : "CPU", st->device);
        json_array_append_new(stages, json_pack("{s:s,s:[I,I],s:I,s:I,s:I,s:I,s:I,s:b}", "device", dev, "layers",
                                                (json_int_t)st->lb, (json_int_t)st->le - 1, "weight_bytes",
                                                (json_int_t)st->weight_bytes, "expert_bytes",
                                                (json_int_t)st->expert_bytes, "kv_bytes", (json_int_t)st->kv_bytes,
                                                "scratch_bytes", (json_int_t)st->scratch_bytes, "host_expert_bytes",
                                                (json_int_t)st->host_expert_bytes, "node_hosttier",
                                                st->node_hosttier));
    }
    for (int64_t l = 0; l < p->n_layer; l++)
        if (bl_plan_layer_host(p, l))
            json_array_append_new(host, json_integer(l));
    json_t *tiers = json_array();
    for (int k = 0; k < p->n_tiers; k++) {
        json_t *layers = json_array();
        for (int64_t l = 0; l < p->n_layer; l++)
            if (p->tier_of[l] == k + 1)
                json_array_append_new(layers, json_integer(l));
        char dev[16];
        snprintf(dev, sizeof dev, "CUDA%d", p->tier[k].device);
        json_array_append_new(tiers, json_pack("{s:s,s:o,s:I}", "device", dev, "expert_layers", layers,
                                               "expert_bytes", (json_int_t)p->tier[k].expert_bytes));
    }
    return json_pack("{s:o,s:o,s:o,s:I,s:I,s:I,s:I,s:b,s:{s:i,s:i,s:I}}", "stages", stages, "expert_tiers", tiers,
                     "host_expert_layers", host, "node_host_expert_bytes", (json_int_t)p->node_host_bytes,
                     "host_expert_bytes", (json_int_t)p->host_bytes, "host_expert_ram_bytes",
                     (json_int_t)p->host_ram_bytes, "host_expert_disk_bytes", (json_int_t)p->host_disk_bytes,
                     "hosttier", p->hosttier, "fit", "expert_layers", p->fit_moved, "cpu_layers", p->fit_cpu_layers,
                     "target_mib", (json_int_t)p->fit_target_mib);
}

/* A hostfile's worker line as the start uses it (hostfile_lines), and its host's CUDA
 * devices (stage_hosts). */
typedef struct hf_line {
    char host[256];   /* its HOST as written */
    char remote[300]; /* the node's endpoint ("tcp://HOST:PORT") of another host than the
                       * router's; "" for this host */
    int line;         /* in the hostfile, for messages */
    int threads;      /* its threads=, 0: -t and -tb */
    int64_t end;      /* its layers= end, when the lines give them */
    int all_gpus, n_gpus;            /* its GPUS: all, or n_gpus ordinals; neither: cpu */
    int gpus[BL_HOSTFILE_MAX_GPUS];
    bl_device_t devs[BL_PLAN_MAX_DEVICES]; /* its host's, as its node (or this machine) reports */
    int n_devs;
    char name[BL_HOSTFILE_MAX_NAME + 1]; /* its name=, "" none */
    /* another host's hosttier line: its stages' routed experts in host RAM go to a
     * hosttier their nodes start there, with these threads= (0: -t) and name= */
    int hosttier, ht_threads;
    char ht_name[BL_HOSTFILE_MAX_NAME + 1];
} hf_line_t;

/* A hostfile's stage: a CPU worker line, or one card of a line. */
typedef struct hf_stage {
    const hf_line_t *line;
    const bl_device_t *card; /* one of line->devs, or NULL: the line's host's CPU */
} hf_stage_t;

/* A hostfile's names (name=, "" where not given): the router's line's, the
 * hosttier's, and each stage's ("NAME" for a line of one stage, "NAME.K" for the
 * K-th card of a line of several). */
typedef struct hf_names {
    char router[BL_HOSTFILE_MAX_NAME + 1], hosttier[BL_HOSTFILE_MAX_NAME + 1];
    char stage[RT_CLUSTER_MAX_STAGES][BL_HOSTFILE_MAX_NAME + 12]; /* K < 64: at most 23 bytes */
} hf_names_t;

/* A hostfile's worker lines, in file order, into lines (*n_lines), the threads= of
 * the router's host's hosttier line into *ht_threads (0: none given, -t's), and the
 * router's and that hosttier's name= into names; another host's hosttier line goes
 * with that host's worker lines (hf_line_t.hosttier). threads= above the 256 of a
 * worker's or a hosttier's pool is refused by line, and so is a hosttier line of a
 * host without a worker line. */
static int hostfile_lines(const opts_t *o, hf_line_t *lines, int *n_lines, int *has_ends, int *ht_threads,
                          hf_names_t *names, bl_err_t *err)
{
    bl_hostfile_t hf = {0};
    int rc = bl_hostfile_load(o->hostfile, &hf, err);
    if (rc)
        return rc;
    const bl_host_entry_t *router = bl_hostfile_router(&hf);
    int n = 0, any_remote = 0;
    for (int i = 0; rc == 0 && i < hf.n; i++) {
        const bl_host_entry_t *e = &hf.e[i];
        const int here = strcasecmp(e->host, router->host) == 0;
        if (e->role == BL_HOST_ROUTER)
            snprintf(names->router, sizeof names->router, "%s", e->name);
        else if (e->role == BL_HOST_HOSTTIER && here)
            snprintf(names->hosttier, sizeof names->hosttier, "%s", e->name);
        if (e->role != BL_HOST_ROUTER && e->threads > 256) { /* the hostfile takes up to 1024, a pool 256 */
            rc = bl_err_set(err, BL_EINVAL, "%s:%d: threads=%d: a %s runs at most 256 threads", o->hostfile, e->line,
                            e->threads, e->role == BL_HOST_HOSTTIER ? "hosttier" : "worker");
            break;
        }
        if (e->role == BL_HOST_HOSTTIER && here)
            *ht_threads = e->threads; /* the parser allows one a host */
        if (e->role == BL_HOST_HOSTTIER && !here) {
            int workers = 0;
            for (int j = 0; j < hf.n; j++)
                workers += hf.e[j].role == BL_HOST_WORKER && strcasecmp(hf.e[j].host, e->host) == 0;
            if (!workers) {
                rc = bl_err_set(err, BL_EINVAL, "%s:%d: a hosttier on %s, where no worker line runs a stage (its "
                                "stages' nodes start it)", o->hostfile, e->line, e->host);
                break;
            }
        }
        if (e->role != BL_HOST_WORKER)
            continue;
        if (n == RT_CLUSTER_MAX_STAGES) {
            rc = bl_err_set(err, BL_EINVAL, "%s: more than %d workers", o->hostfile, RT_CLUSTER_MAX_STAGES);
            break;
        }
        hf_line_t *h = &lines[n];
        memset(h, 0, sizeof *h);
        snprintf(h->host, sizeof h->host, "%s", e->host);
        h->line = e->line;
        h->threads = e->threads;
        snprintf(h->name, sizeof h->name, "%s", e->name);
        h->all_gpus = e->all_gpus;
        h->n_gpus = e->n_gpus;
        memcpy(h->gpus, e->gpus, sizeof h->gpus);
        /* layers= is on every worker or none, tiling from 0 (the parser's rules) */
        *has_ends = e->layer_end > 0;
        h->end = e->layer_end;
        if (strcasecmp(e->host, router->host) != 0) {
            snprintf(h->remote, sizeof h->remote, strchr(e->host, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u", e->host,
                     (unsigned)e->port);
            any_remote = 1;
            for (int j = 0; j < hf.n; j++) { /* its host's hosttier line, if any (one a host) */
                const bl_host_entry_t *t = &hf.e[j];
                if (t->role != BL_HOST_HOSTTIER || strcasecmp(t->host, e->host) != 0)
                    continue;
                h->hosttier = 1;
                h->ht_threads = t->threads;
                snprintf(h->ht_name, sizeof h->ht_name, "%s", t->name);
            }
        }
        n++;
    }
    if (rc == 0 && any_remote && !o->cluster_secret)
        rc = bl_err_set(err, BL_EINVAL, "%s: workers on other hosts need --cluster-secret FILE", o->hostfile);
    if (rc == 0)
        *n_lines = n;
    bl_hostfile_free(&hf);
    return rc;
}

/* Stage i's name (the stages hs[0 .. n) of a hostfile): its line's name=, with ".K"
 * when the line gives several stages and this is its K-th; NULL when the line has
 * none. */
static const char *stage_name(hf_names_t *names, const hf_stage_t *hs, int n, int i)
{
    const hf_line_t *l = hs[i].line;
    if (!l->name[0])
        return NULL;
    int k = 0, of = 0;
    for (int j = 0; j < n; j++)
        if (hs[j].line == l) {
            k += j < i;
            of++;
        }
    if (of == 1)
        snprintf(names->stage[i], sizeof names->stage[i], "%s", l->name);
    else
        snprintf(names->stage[i], sizeof names->stage[i], "%s.%d", l->name, k);
    return names->stage[i];
}

/* "CUDA0 (NVIDIA GB10), CUDA1 (...)", or "no CUDA device": what a host reports. */
static void devices_text(char *buf, size_t cap, const bl_device_t *devs, int n)
{
    size_t at = 0;
    buf[0] = '\0';
    if (n == 0)
        snprintf(buf, cap, "no CUDA device");
    for (int i = 0; i < n && at < cap; i++) {
        const int k = snprintf(buf + at, cap - at, "%sCUDA%d (%s)", i ? ", " : "", devs[i].index, devs[i].name);
        at += k > 0 ? (size_t)k : 0;
    }
}

/* The stages of worker line h, whose host reports h->devs: the line's CPU, or a
 * stage on each card its GPUS names (all: every card there), in order, appended to
 * hs from *n. A card its host lacks is refused by line, host and ordinal; so is a
 * line of another host with more than one card (its node serves one stage) and
 * layers= on a line of several. */
static int line_stages(const opts_t *o, const hf_line_t *h, hf_stage_t *hs, int *n, bl_err_t *err)
{
    const char *where = h->remote[0] ? "its node reports" : "this host has";
    char have[512];
    devices_text(have, sizeof have, h->devs, h->n_devs);
    const int n_cards = h->all_gpus ? h->n_devs : h->n_gpus;
    if (h->all_gpus && h->n_devs == 0)
        return bl_err_set(err, BL_EINVAL, "%s:%d: GPUS all on %s: %s no CUDA device", o->hostfile, h->line, h->host,
                          where);
    if (n_cards > 1 && h->remote[0])
        return bl_err_set(err, BL_ENOTSUP, "%s:%d: %d GPUs of %s on one line: its node serves one stage, so a "
                          "card of another host takes a line of its own, with its own PORT and node (%s %s)",
                          o->hostfile, h->line, n_cards, h->host, where, have);
    if (n_cards > 1 && h->end > 0)
        return bl_err_set(err, BL_EINVAL, "%s:%d: layers= on a line of %d GPUs: give each GPU a line of its own "
                          "with its layers", o->hostfile, h->line, n_cards);
    if (*n + (n_cards ? n_cards : 1) > RT_CLUSTER_MAX_STAGES)
        return bl_err_set(err, BL_EINVAL, "%s: more than %d stages", o->hostfile, RT_CLUSTER_MAX_STAGES);
    if (n_cards == 0) {
        hs[(*n)++] = (hf_stage_t){.line = h};
        return 0;
    }
    for (int k = 0; k < n_cards; k++) {
        const bl_device_t *card = NULL;
        for (int d = 0; d < h->n_devs && !card; d++)
            if (h->all_gpus ? d == k : h->devs[d].index == h->gpus[k])
                card = &h->devs[d];
        if (!card)
            return bl_err_set(err, BL_EINVAL, "%s:%d: GPU %d of %s: %s %s", o->hostfile, h->line, h->gpus[k],
                              h->host, where, have);
        hs[(*n)++] = (hf_stage_t){.line = h, .card = card};
    }
    return 0;
}

/* Each hostfile line's host (this machine's CPUs, memory and devs for a line of the
 * router's host, what the node answers for another's: bp_node_probe; the start fails
 * when a node does not answer, as it would when its stage starts), then the stages
 * of the lines in order (line_stages), into hs and hosts (*n of them), as the plan
 * sees them (common/plan.h). */
static int stage_hosts(const opts_t *o, hf_line_t *lines, int n_lines, const bl_device_t *devs, int n_devs,
                       hf_stage_t *hs, bl_stage_host_t *hosts, int *n, bl_err_t *err)
{
    uint8_t key[32];
    int have_key = 0, rc = 0, n_cpus[RT_CLUSTER_MAX_STAGES];
    uint64_t avail[RT_CLUSTER_MAX_STAGES], total[RT_CLUSTER_MAX_STAGES];
    uint32_t one[RT_CLUSTER_MAX_STAGES], all[RT_CLUSTER_MAX_STAGES], here_one = 0, here_all = 0;
    *n = 0;
    for (int i = 0; rc == 0 && i < n_lines; i++) {
        hf_line_t *h = &lines[i];
        if (!h->remote[0]) {
            n_cpus[i] = bl_cpu_count();
            avail[i] = bl_mem_available();
            total[i] = bl_mem_total();
            /* this host's read rates, once (what a node measures for its host), for a
             * split the lines' layers= do not fix */
            if (!here_one && h->end <= 0) {
                here_one = bl_mem_read_mbps(1);
                here_all = bl_mem_read_mbps(n_cpus[i]);
            }
            one[i] = here_one;
            all[i] = here_all;
            h->n_devs = n_devs;
            memcpy(h->devs, devs, sizeof *devs * (size_t)n_devs);
        } else {
            static bp_node_host_t nh; /* 1.5 KB: the start's one thread */
            if (!have_key && (rc = bp_secret_load(o->cluster_secret, key, err)) != 0)
                break;
            have_key = 1;
            const uint32_t ask = h->end <= 0 ? BP_NODE_PROBE_RATES : 0; /* as this host's, above */
            if ((rc = bp_node_probe(h->remote, key, BL_VERSION, ask, 10000, &nh, err)) != 0)
                break;
            n_cpus[i] = (int)nh.n_cpus;
            avail[i] = nh.mem_available;
            total[i] = nh.mem_total;
            one[i] = nh.read_mbps_one;
            all[i] = nh.read_mbps_all;
            h->n_devs = (int)nh.n_devices; /* at most BL_PLAN_MAX_DEVICES: bp_node_host_read's */
            for (int d = 0; d < h->n_devs; d++) {
                bl_device_t *c = &h->devs[d];
                memset(c, 0, sizeof *c);
                c->index = nh.device[d].index;
                snprintf(c->name, sizeof c->name, "%s", nh.device[d].name);
                c->total_bytes = nh.device[d].total_bytes;
                c->free_bytes = nh.device[d].free_bytes;
                c->read_mbps = nh.device[d].read_mbps;
            }
        }
        const int first = *n;
        if ((rc = line_stages(o, h, hs, n, err)) != 0)
            break;
        for (int k = first; k < *n; k++) {
            bl_stage_host_t *sh = &hosts[k];
            *sh = (bl_stage_host_t){.name = h->host, .remote = h->remote[0] != 0,
                                    .threads = h->threads ? h->threads : (int)o->threads, .n_cpus = n_cpus[i],
                                    .mem_avail = avail[i], .mem_total = total[i], .read_mbps_one = one[i],
                                    .read_mbps_all = all[i], .card = hs[k].card, .hosttier = h->hosttier};
            char card[200] = "cpu", name[160];
            if (sh->card)
                snprintf(card, sizeof card, "CUDA%d card_free=%llu card_total=%llu card_name=\"%s\"", sh->card->index,
                         (unsigned long long)sh->card->free_bytes, (unsigned long long)sh->card->total_bytes,
                         bl_log_escape(name, sizeof name, sh->card->name, strlen(sh->card->name)));
            BL_LOG(BL_LOG_INFO, "event=stage_host stage=%d host=%s node=%s cpus=%d mem_available=%llu "
                   "mem_total=%llu read_mbps_one=%u read_mbps_all=%u threads=%d device=%s", k, sh->name,
                   sh->remote ? h->remote : "-", sh->n_cpus, (unsigned long long)sh->mem_avail,
                   (unsigned long long)sh->mem_total, sh->read_mbps_one, sh->read_mbps_all, sh->threads, card);
        }
    }
    memset(key, 0, sizeof key);
    return rc;
}

/* The placement (common/plan.c) from the placement flags, the model's file and the
 * devices bloomery-worker reports, printed at start; with a hostfile, its worker lines
 * (lines) placed on their hosts' CPUs and cards, whose facts it asks the nodes for:
 * the stages into hs and hosts (o->workers of them). */
static int place(opts_t *o, const bl_gguf_t *g, const char *bin_dir, int64_t n_ctx, uint32_t kv_type,
                 int64_t rows, hf_line_t *lines, int n_lines, int has_ends, hf_stage_t *hs, bl_stage_host_t *hosts,
                 bl_plan_t *plan, bl_device_t *devs, int *n_devs, int *n_found, const char **gpu_note,
                 bl_err_t *err)
{
    *n_found = -1;
    *gpu_note = NULL;
    bl_arch_t a;
    int rc = bl_arch_read(&a, g, o->model, err);
    if (rc)
        return rc;
    if ((rc = rt_cluster_devices(bin_dir, devs, BL_PLAN_MAX_DEVICES, n_devs, err)) != 0)
        return rc;
    *n_found = *n_devs;
    int n_stages = 0, local_cards = 0, any_card = 0;
    int64_t stage_ends[RT_CLUSTER_MAX_STAGES];
    /* a node that does not answer fails the start, as it would when its stage starts */
    if (o->hostfile) {
        if ((rc = stage_hosts(o, lines, n_lines, devs, *n_devs, hs, hosts, &n_stages, err)) != 0)
            return rc;
        o->workers = n_stages;
        for (int i = 0; i < n_stages; i++) {
            stage_ends[i] = hs[i].line->end;
            any_card |= hs[i].card != NULL;
            local_cards |= hs[i].card && !hosts[i].remote;
        }
        if (*n_devs > 0 && !local_cards) {
            *gpu_note = "no worker line of this host names one of its GPUs (--hostfile)";
            BL_LOG(BL_LOG_WARN, "event=gpu_layers_ignored flag=--hostfile reason=%s", *gpu_note);
        }
    }
    const bl_place_flags_t *f = &o->place;
    if ((o->hostfile ? !any_card : *n_devs == 0) && f->gpu_layers && strcmp(f->gpu_layers, "0") &&
        strcmp(f->gpu_layers, "auto") && strcmp(f->gpu_layers, "-1"))
        /* llama-server's answer on a machine without a GPU: a warning, and the CPU */
        BL_LOG(BL_LOG_WARN, "event=gpu_layers_ignored flag=--gpu-layers value=%s reason=%s: every layer runs on the "
               "CPU", f->gpu_layers, o->hostfile ? "no worker line of the hostfile names a GPU" : "no CUDA device");
    bl_place_opts_t po = {
        .n_cpu_stages = (int)o->workers, .stage_ends = o->hostfile && has_ends ? stage_ends : NULL,
        .hosts = o->hostfile ? hosts : NULL, .n_hosts = o->hostfile ? n_stages : 0, .n_ctx_total = n_ctx,
        .kv_elem_bytes = kv_type == BL_TYPE_F32 ? 4.0 : kv_type == BL_TYPE_Q8_0 ? 34.0 / 32.0 : 2.0,
        .n_batch = rows, .n_seqs = o->parallel, .ram_avail = bl_mem_available(),
        .mtp = o->spec_type && !strcmp(o->spec_type, "draft-mtp")};
    if ((rc = bl_plan_opts(&po, f, err)) != 0)
        return rc;
    if ((rc = bl_plan_build(plan, g, &a, devs, *n_devs, &po, err)) != 0)
        return rc;
    char text[8192];
    bl_plan_format(plan, text, sizeof text);
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl)
            break;
        *nl = '\0';
        BL_LOG(BL_LOG_INFO, "event=plan %s", line);
    }
    if (plan->n_stages > RT_CLUSTER_MAX_STAGES)
        return bl_err_set(err, BL_EINVAL, "the plan has %d stages (at most %d)", plan->n_stages, RT_CLUSTER_MAX_STAGES);
    return 0;
}

/* Steps in flight (--pipeline): the stage count unless the flag says otherwise; one
 * where a step must see the last one's answer before it is built (a draft's
 * proposals, a shared cache's chunks). A recurrent state's checkpoints wait for the
 * steps in flight to drain (the engine's ck_pending): they come once a prompt. */
static int pipeline_depth(const opts_t *o, int n_stages, int draft, int64_t kv_pool)
{
    int64_t d = o->pipeline > 0 ? o->pipeline : n_stages;
    const char *why = draft ? "speculative decoding" : kv_pool ? "-kvu" : NULL;
    if (d > 1 && why) {
        if (o->pipeline > 1)
            BL_LOG(BL_LOG_WARN, "event=pipeline_off flag=--pipeline value=%lld reason=%s runs one step at a time",
                   (long long)o->pipeline, why);
        d = 1;
    }
    if (d > RT_CLUSTER_MAX_INFLIGHT)
        d = RT_CLUSTER_MAX_INFLIGHT;
    if (d > 1)
        BL_LOG(BL_LOG_INFO, "event=pipeline steps_in_flight=%lld stages=%d", (long long)d, n_stages);
    return (int)(d < 1 ? 1 : d);
}

/* The requests' defaults from the sampling flags (o starts from
 * rt_sampler_params_default, so an unset flag keeps llama-server's value). */
static int sampling_defaults(const opts_t *o, rt_task_params_t *d, bl_err_t *err)
{
    rt_task_params_default(d);
    rt_sampler_params_t *s = &d->sampling;
    s->temp = o->temp;
    s->top_k = (int32_t)o->top_k;
    s->top_p = o->top_p;
    s->min_p = o->min_p;
    s->typical_p = o->typical;
    s->repeat_penalty = o->repeat_penalty;
    s->penalty_last_n = (int32_t)o->repeat_last_n;
    s->presence_penalty = o->presence_penalty;
    s->frequency_penalty = o->frequency_penalty;
    s->seed = o->seed < 0 ? RT_SEED_RANDOM : (uint32_t)o->seed;
    s->min_keep = (int32_t)o->min_keep;
    s->logit_bias = o->n_bias ? o->bias : NULL;
    s->n_logit_bias = (size_t)o->n_bias;
    d->ignore_eos = o->ignore_eos;
    if (o->cache_prompt && o->no_cache_prompt)
        return bl_err_set(err, BL_EINVAL, "--cache-prompt and --no-cache-prompt contradict each other");
    d->cache_prompt = !o->no_cache_prompt;
    if (o->samplers && o->sampling_seq)
        return bl_err_set(err, BL_EINVAL, "--samplers and --sampling-seq both name the chain");
    bl_err_t e2;
    int rc = 0;
    if (o->samplers) { /* names separated by ';' */
        s->n_stages = 0;
        for (const char *p = o->samplers; !rc;) {
            const char *semi = strchr(p, ';');
            rc = rt_sampler_chain_add(s, p, semi ? (size_t)(semi - p) : strlen(p), 0, &e2);
            if (!semi)
                break;
            p = semi + 1;
        }
        if (rc)
            return bl_err_set(err, rc, "--samplers: %s", e2.msg);
    }
    if (o->sampling_seq) {
        s->n_stages = 0;
        if ((rc = rt_sampler_chain_add(s, o->sampling_seq, strlen(o->sampling_seq), 1, &e2)))
            return bl_err_set(err, rc, "--sampling-seq: %s", e2.msg);
    }
    return rt_sampler_params_check(s, INT32_MAX, err);
}

/* The grammar of --grammar, --grammar-file, -j or -jf (one of them), checked, into
 * *out (the caller frees it; NULL: none). */
static int default_grammar(const opts_t *o, char **out, bl_err_t *err)
{
    *out = NULL;
    const int n = !!o->grammar + !!o->grammar_file + !!o->json_schema + !!o->json_schema_file;
    if (n == 0)
        return 0;
    if (n > 1)
        return bl_err_set(err, BL_EINVAL, "give one of --grammar, --grammar-file, --json-schema and "
                                          "--json-schema-file");
    const char *flag = o->grammar ? "--grammar" : o->grammar_file ? "--grammar-file"
                       : o->json_schema ? "--json-schema" : "--json-schema-file";
    char *text = NULL;
    size_t len = 0;
    bl_err_t e2 = {0};
    int rc = 0;
    if (o->grammar || o->json_schema)
        rc = (text = strdup(o->grammar ? o->grammar : o->json_schema)) ? 0 : BL_ENOMEM;
    else
        rc = bl_read_file(o->grammar_file ? o->grammar_file : o->json_schema_file, RT_GRAMMAR_MAX_BYTES, &text,
                          &len, &e2);
    if (rc)
        return bl_err_set(err, rc, "%s: %s", flag, rc == BL_ENOMEM ? "out of memory" : e2.msg);
    if (o->json_schema || o->json_schema_file) {
        json_error_t je;
        json_t *schema = json_loads(text, 0, &je);
        free(text);
        text = NULL;
        if (!schema)
            return bl_err_set(err, BL_EINVAL, "%s: not JSON: %s (line %d)", flag, je.text, je.line);
        rc = rt_json_schema_to_gbnf(schema, &text, &e2);
        json_decref(schema);
        if (rc)
            return bl_err_set(err, rc, "%s: %s", flag, e2.msg);
    }
    rt_grammar_t *g = NULL;
    if (strlen(text) > RT_GRAMMAR_MAX_BYTES)
        rc = bl_err_set(&e2, BL_EINVAL, "%zu bytes of grammar; at most %d", strlen(text), RT_GRAMMAR_MAX_BYTES);
    else
        rc = rt_grammar_parse(&g, text, strlen(text), &e2);
    rt_grammar_destroy(g);
    if (rc) {
        free(text);
        return bl_err_set(err, rc, "%s: %s", flag, e2.msg);
    }
    *out = text;
    return 0;
}

/* The template arguments of -rea, --reasoning-budget 0 and --reasoning-preserve, put
 * into *kw (made when NULL) where --chat-template-kwargs did not set them. */
static int chat_kwargs(const opts_t *o, json_t **kw, bl_err_t *err)
{
    int think = -1; /* -1: the template's default */
    if (o->reasoning) {
        const char *r = o->reasoning;
        if (!strcmp(r, "on") || !strcmp(r, "true") || !strcmp(r, "1") || !strcmp(r, "enabled"))
            think = 1;
        else if (!strcmp(r, "off") || !strcmp(r, "false") || !strcmp(r, "0") || !strcmp(r, "disabled"))
            think = 0;
        else if (strcmp(r, "auto") && strcmp(r, "-1"))
            return bl_err_set(err, BL_EINVAL, "--reasoning: '%.32s' is not on, off or auto", r);
    }
    if (o->reasoning_budget == 0) {
        if (think == 1)
            return bl_err_set(err, BL_EINVAL, "--reasoning on and --reasoning-budget 0 contradict each other");
        think = 0;
    }
    if (o->reasoning_preserve && o->no_reasoning_preserve)
        return bl_err_set(err, BL_EINVAL, "--reasoning-preserve and --no-reasoning-preserve contradict each other");
    const int preserve = o->reasoning_preserve ? 1 : o->no_reasoning_preserve ? 0 : -1;
    if (think < 0 && preserve < 0)
        return 0;
    if (!*kw && !(*kw = json_object()))
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    if (think >= 0 && !json_object_get(*kw, "enable_thinking"))
        json_object_set_new(*kw, "enable_thinking", json_boolean(think));
    if (preserve >= 0 && !json_object_get(*kw, "preserve_reasoning"))
        json_object_set_new(*kw, "preserve_reasoning", json_boolean(preserve));
    return 0;
}

static int kv_type_of(const char *flag, const char *s, uint32_t *out, bl_err_t *err)
{
    if (!s || !strcmp(s, "f16"))
        *out = BL_TYPE_F16;
    else if (!strcmp(s, "f32"))
        *out = BL_TYPE_F32;
    else if (!strcmp(s, "q8_0"))
        *out = BL_TYPE_Q8_0;
    else
        return bl_err_set(err, BL_ENOTSUP, "%s %.32s: not a KV cache type of this build "
                                           "(f16, f32, q8_0)",
                          flag, s);
    return 0;
}

/* Keys from --api-key (comma list) and --api-key-file (one per line). */
typedef struct keys {
    char **v;
    size_t n;
} keys_t;

static int keys_add(keys_t *k, const char *s, size_t len, const char *from, bl_err_t *err)
{
    while (len && (s[len - 1] == '\r' || s[len - 1] == ' ' || s[len - 1] == '\t'))
        len--;
    while (len && (*s == ' ' || *s == '\t')) {
        s++;
        len--;
    }
    if (len == 0)
        return bl_err_set(err, BL_EINVAL, "%s: an API key is empty", from);
    char **p = realloc(k->v, (k->n + 1) * sizeof *p);
    if (!p)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    k->v = p;
    p[k->n] = strndup(s, len);
    if (!p[k->n])
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    k->n++;
    return 0;
}

static int load_keys(const opts_t *o, keys_t *k, bl_err_t *err)
{
    if (o->api_key) {
        for (const char *p = o->api_key;;) {
            const char *comma = strchr(p, ',');
            size_t n = comma ? (size_t)(comma - p) : strlen(p);
            int rc = keys_add(k, p, n, "--api-key", err);
            if (rc)
                return rc;
            if (!comma)
                break;
            p = comma + 1;
        }
    }
    if (o->api_key_file) {
        char *text;
        size_t len;
        int rc = bl_read_file(o->api_key_file, KEY_FILE_MAX, &text, &len, err);
        if (rc)
            return rc;
        size_t before = k->n;
        for (char *p = text; p < text + len;) {
            char *nl = memchr(p, '\n', (size_t)(text + len - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(text + len - p);
            int blank = 1;
            for (size_t i = 0; i < n; i++)
                if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
                    blank = 0;
            if (!blank && (rc = keys_add(k, p, n, o->api_key_file, err)) != 0) {
                free(text);
                return rc;
            }
            if (!nl)
                break;
            p = nl + 1;
        }
        free(text);
        if (k->n == before)
            return bl_err_set(err, BL_EINVAL, "--api-key-file %s: no key in the file",
                              o->api_key_file);
    }
    return 0;
}

/* The chat template's text: --chat-template (a built-in name or Jinja text),
 * --chat-template-file, the model's tokenizer.chat_template, or chatml. */
static int template_source(const opts_t *o, const bl_gguf_t *g, char **out, bl_err_t *err)
{
    *out = NULL;
    if (o->chat_template && o->chat_template_file)
        return bl_err_set(err, BL_EINVAL, "--chat-template and --chat-template-file exclude "
                                          "each other");
    if (o->no_jinja) { /* a built-in template only: by name, or the one the model's matches */
        if (o->chat_template_file)
            return bl_err_set(err, BL_EINVAL, "--chat-template-file is a Jinja template: not with --no-jinja");
        bl_gguf_str_t m;
        const int has = bl_gguf_find_kv(g, "tokenizer.chat_template") &&
                        bl_gguf_get_str(g, "tokenizer.chat_template", &m, NULL) == 0;
        if (o->chat_template ? strcmp(o->chat_template, "chatml") != 0
                             : has && !memmem(m.ptr, (size_t)m.len, "<|im_start|>", 12))
            return bl_err_set(err, BL_ENOTSUP, "--no-jinja: %s no built-in template (built in: chatml); "
                                               "leave --no-jinja out to use the model's Jinja template",
                              o->chat_template ? "--chat-template names" : "the model's template matches");
        BL_LOG(BL_LOG_INFO, "event=chat_template source=chatml reason=--no-jinja");
        *out = strdup(chatml_template);
        return *out ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    if (o->chat_template) {
        const char *t = o->chat_template;
        if (strstr(t, "{{") || strstr(t, "{%")) {
            *out = strdup(t);
        } else if (!strcmp(t, "chatml")) {
            *out = strdup(chatml_template);
        } else {
            return bl_err_set(err, BL_EINVAL,
                              "--chat-template %.64s: unknown built-in template (built in: "
                              "chatml); pass the Jinja text or --chat-template-file",
                              t);
        }
        return *out ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    if (o->chat_template_file) {
        size_t len;
        int rc = bl_read_file(o->chat_template_file, TEMPLATE_FILE_MAX, out, &len, err);
        if (rc == 0 && strlen(*out) != len) {
            free(*out);
            *out = NULL;
            return bl_err_set(err, BL_EINVAL, "--chat-template-file %s: holds a NUL byte",
                              o->chat_template_file);
        }
        return rc;
    }
    bl_gguf_str_t s;
    if (bl_gguf_find_kv(g, "tokenizer.chat_template") &&
        bl_gguf_get_str(g, "tokenizer.chat_template", &s, NULL) == 0 &&
        memchr(s.ptr, 0, (size_t)s.len) == NULL) {
        *out = strndup(s.ptr, (size_t)s.len);
    } else {
        BL_LOG(BL_LOG_WARN, "event=chat_template source=chatml reason=the model has none");
        *out = strdup(chatml_template);
    }
    return *out ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory");
}

/* The folder holding this program, where bloomery-worker and bloomery-hosttier are
 * expected; in a meson build tree they sit in bin/ beside router/. */
static int find_bin_dir(char *buf, size_t cap, bl_err_t *err)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1)
        return bl_err_set(err, BL_EIO, "cannot read /proc/self/exe: %s", strerror(errno));
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash)
        return bl_err_set(err, BL_EIO, "/proc/self/exe is not a path");
    *slash = 0;
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/bloomery-worker", buf);
    if (access(probe, X_OK) != 0) {
        snprintf(probe, sizeof probe, "%s/../bin/bloomery-worker", buf);
        if (access(probe, X_OK) == 0 && strlen(buf) + 8 < cap)
            strcat(buf, "/../bin");
    }
    return 0;
}

static void remove_runtime_dir(const char *dir);

/* The folder a flag names, made if missing (as llama-server makes --slot-save-path's):
 * its real path in *out (caller frees). */
static int made_folder(const char *flag, const char *path, int dry_run, char **out, bl_err_t *err)
{
    struct stat st;
    bl_err_t e2 = {0};
    if (dry_run && path[0] && stat(path, &st) != 0 && errno == ENOENT) /* a dry run makes nothing */
        return (*out = strdup(path)) ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory");
    if (!path[0] || bl_make_dirs(path, 1, &e2) || !(*out = realpath(path, NULL)) ||
        stat(*out, &st) != 0 || !S_ISDIR(st.st_mode))
        return bl_err_set(err, BL_EINVAL, "%s %s: %s", flag, path, e2.msg[0] ? e2.msg : "not a folder");
    return 0;
}

/* The draft's device: -devd none or CUDAn, else the first card unless -ngld 0. */
static int draft_device(const opts_t *o, int n_devs, int *dev, bl_err_t *err)
{
    *dev = o->draft_ngl != 0 && n_devs > 0 ? 0 : -1;
    if (!o->draft_device)
        return 0;
    if (!strcmp(o->draft_device, "none")) {
        *dev = -1;
        return 0;
    }
    char *end = NULL;
    long k = !strncmp(o->draft_device, "CUDA", 4) ? strtol(o->draft_device + 4, &end, 10) : -1;
    if (k < 0 || !end || *end || end == o->draft_device + 4 || k >= n_devs)
        return bl_err_set(err, BL_EINVAL, "-devd %.40s: not none or one of this host's %d CUDA "
                          "devices (CUDA0..)", o->draft_device, n_devs);
    *dev = (int)k;
    return 0;
}

/* The start time of process pid (clock ticks after boot, /proc/PID/stat field 22),
 * or 0 when there is no such process. With the pid it names one process for good:
 * a pid that was reused has another start time. */
static unsigned long long proc_start_time(long pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    if (!p)
        return 0;
    p++;
    for (int field = 3; field < 22 && p; field++) /* p: the space before field `field` */
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

#define RUNTIME_OWNER "owner" /* "PID STARTTIME\n" of the server that made the folder */

/* Removes the runtime folders under base that a server which no longer runs left
 * behind (killed with SIGKILL, or lost with its machine's power): folders of this
 * user named bloomery-serve-PID-*, whose owner file names a process that is gone
 * or whose start time differs (the pid was reused). A folder without an owner file
 * is removed only when its pid is gone: it may be a server's that is starting. */
static void clean_stale_runtime_dirs(const char *base)
{
    DIR *d = opendir(base);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid;
        char rest[16], path[PATH_MAX], owner[PATH_MAX + 16];
        if (sscanf(e->d_name, "bloomery-serve-%ld-%15s", &pid, rest) != 2 || pid <= 0 ||
            pid == (long)getpid())
            continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", base, e->d_name) >= sizeof path)
            continue;
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
            continue;
        snprintf(owner, sizeof owner, "%s/" RUNTIME_OWNER, path);
        unsigned long long started = 0, now;
        long opid = 0;
        FILE *f = fopen(owner, "r");
        int have_owner = f && fscanf(f, "%ld %llu", &opid, &started) == 2 && opid == pid;
        if (f)
            fclose(f);
        now = proc_start_time(pid);
        if (have_owner ? now == started : (now != 0 || kill((pid_t)pid, 0) == 0 || errno == EPERM))
            continue;
        BL_LOG(BL_LOG_INFO, "event=runtime_dir_stale path=%s pid=%ld reason=%s", path, pid,
               now ? "pid_reused" : "process_gone");
        remove_runtime_dir(path);
    }
    closedir(d);
}

/* A private folder for this process's control sockets, removed at exit; the stale
 * folders of servers that died without removing theirs go first. */
static int make_runtime_dir(char *buf, size_t cap, bl_err_t *err)
{
    const char *base = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    if (!base || !*base || stat(base, &st) != 0 || !S_ISDIR(st.st_mode) || access(base, W_OK) != 0)
        base = "/tmp";
    clean_stale_runtime_dirs(base);
    if ((size_t)snprintf(buf, cap, "%s/bloomery-serve-%ld-XXXXXX", base, (long)getpid()) >= cap)
        return bl_err_set(err, BL_ERANGE, "runtime folder path too long under %s", base);
    if (!mkdtemp(buf))
        return bl_err_set(err, BL_EIO, "cannot create a runtime folder under %s: %s", base,
                          strerror(errno));
    char owner[PATH_MAX + 16];
    snprintf(owner, sizeof owner, "%s/" RUNTIME_OWNER, buf);
    FILE *f = fopen(owner, "wx");
    int ok = f && fprintf(f, "%ld %llu\n", (long)getpid(), proc_start_time((long)getpid())) > 0;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok) {
        int e = errno;
        remove_runtime_dir(buf);
        return bl_err_set(err, BL_EIO, "cannot write %s: %s", owner, strerror(e));
    }
    return 0;
}

/* Removes what dir holds: files, and at depth 0 the folders in it (the draft's
 * control folder) with their files; a symlink is removed, never followed. */
static void empty_dir(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
            continue;
        struct stat st;
        if (depth == 0 && lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            empty_dir(path, depth + 1);
            rmdir(path);
        } else {
            unlink(path);
        }
    }
    closedir(d);
}

static void remove_runtime_dir(const char *dir)
{
    if (!dir || !*dir)
        return;
    empty_dir(dir, 0);
    if (rmdir(dir) != 0 && errno != ENOENT)
        BL_LOG(BL_LOG_WARN, "event=runtime_dir_left path=%s error=%s", dir, strerror(errno));
}

/* --- the running server ------------------------------------------------------------ */

typedef struct serve {
    uv_loop_t loop;
    rt_app_t app;
    rt_http_t *http;
    uv_signal_t sigint, sigterm;
    uv_timer_t watch;   /* the cluster's state */
    uv_timer_t drain;   /* shutdown: waits for the engine and open requests */
    int ever_ready;
    int log_disable;    /* --log-disable: a load failure still goes to stderr */
    char screen_url[300]; /* on a terminal: the address the start screen names once ready ("" none) */
    int shutting_down;
    int exit_code;
    uint64_t drain_deadline;
    rt_cluster_state_t last_state;
} serve_t;

static void on_drain(uv_timer_t *t)
{
    serve_t *s = t->data;
    int engine_done = !s->app.engine || rt_engine_drained(s->app.engine);
    size_t open = rt_http_open_requests(s->http);
    if ((engine_done && open == 0) || uv_now(&s->loop) >= s->drain_deadline) {
        if (!engine_done || open)
            BL_LOG(BL_LOG_WARN, "event=drain_timeout engine_drained=%d open_requests=%zu",
                   engine_done, open);
        uv_stop(&s->loop);
    }
}

static void begin_shutdown(serve_t *s, int exit_code, const char *why)
{
    if (s->shutting_down) {
        BL_LOG(BL_LOG_WARN, "event=shutdown_now reason=%s", why);
        uv_stop(&s->loop);
        return;
    }
    s->shutting_down = 1;
    s->exit_code = exit_code;
    BL_LOG(BL_LOG_INFO, "event=shutdown reason=%s", why);
    rt_http_stop_accepting(s->http);
    s->app.stopping = 1;
    if (s->app.engine)
        rt_engine_shutdown(s->app.engine);
    s->drain_deadline = uv_now(&s->loop) + DRAIN_LIMIT_MS;
    uv_timer_start(&s->drain, on_drain, 0, 20);
}

static void on_signal(uv_signal_t *h, int signum)
{
    serve_t *s = h->data;
    begin_shutdown(s, 0, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

static void on_watch(uv_timer_t *t)
{
    serve_t *s = t->data;
    rt_cluster_state_t st = rt_cluster_state(s->app.cluster);
    if (st == s->last_state)
        return;
    s->last_state = st;
    char why[512];
    switch (st) {
    case RT_CLUSTER_READY:
        s->app.loading = 0;
        if (!s->ever_ready) {
            BL_LOG(BL_LOG_INFO, "event=ready model=%s", s->app.model_alias);
            if (s->screen_url[0]) { /* the start screen's last lines: the kernels, the address */
                char kernels[2048];
                rt_cluster_kernels(s->app.cluster, kernels, sizeof kernels);
                fprintf(stderr, "\nkernels\n%s\n  ready: open %s/ for the chat page; the OpenAI API is %s/v1, "
                        "llama-server's routes are at %s/\n\n", kernels, s->screen_url, s->screen_url,
                        s->screen_url);
            }
        } else {
            BL_LOG(BL_LOG_INFO, "event=ready after=restart");
        }
        s->ever_ready = 1;
        break;
    case RT_CLUSTER_FAILED:
        rt_cluster_error(s->app.cluster, why, sizeof why);
        BL_LOG(BL_LOG_ERROR, "event=%s reason=%s", s->ever_ready ? "cluster_failed" : "load_failed",
               why[0] ? why : "unknown");
        if (s->log_disable)
            fprintf(stderr, "%s: %s\n", PROG, why[0] ? why : "the model failed to load");
        if (!s->shutting_down)
            begin_shutdown(s, 1, s->ever_ready ? "cluster failed" : "model failed to load");
        break;
    case RT_CLUSTER_RESTARTING:
        rt_cluster_error(s->app.cluster, why, sizeof why);
        BL_LOG(BL_LOG_WARN, "event=restarting reason=%s", why[0] ? why : "unknown");
        break;
    default:
        break;
    }
}

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* --- model facts -------------------------------------------------------------------- */

static void model_facts(rt_app_t *app, const bl_gguf_t *g)
{
    int64_t v = 0;
    app->n_ctx_train = bl_gguf_get_arch_i64(g, "context_length", &v, NULL) == 0 && v > 0 ? v : 0;
    uint64_t nt = bl_gguf_n_tensors(g);
    int64_t params = 0;
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < nt; i++) {
        const bl_gguf_tensor_t *t = bl_gguf_tensor_at(g, i);
        if (!t)
            continue;
        params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        bytes += t->nbytes;
    }
    app->n_params = params;
    app->model_bytes = bytes;
}

/* The model's layer count (0 when the file does not say). */

/* The model name shown to clients: -a, else the file name. */
static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A comma-separated list of names (-a, --tags) as llama-server keeps it: each
 * trimmed, empty ones dropped, sorted by bytes, repeats dropped. NULL: none. */
static int split_names(const char *flag, const char *list, char ***out, size_t *n, bl_err_t *err)
{
    *out = NULL;
    *n = 0;
    if (!list)
        return 0;
    size_t cap = 1;
    for (const char *p = list; *p; p++)
        cap += *p == ',';
    char **v = calloc(cap, sizeof *v);
    if (!v)
        return bl_err_set(err, BL_ENOMEM, "%s: out of memory", flag);
    size_t k = 0;
    for (const char *p = list;;) {
        const char *comma = strchr(p, ',');
        const char *e = comma ? comma : p + strlen(p);
        while (p < e && isspace((unsigned char)*p))
            p++;
        while (e > p && isspace((unsigned char)e[-1]))
            e--;
        if (e > p && !(v[k++] = strndup(p, (size_t)(e - p)))) {
            for (size_t i = 0; i < k; i++)
                free(v[i]);
            free(v);
            return bl_err_set(err, BL_ENOMEM, "%s: out of memory", flag);
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    qsort(v, k, sizeof *v, by_name);
    size_t u = 0;
    for (size_t i = 0; i < k; i++) {
        if (u && !strcmp(v[u - 1], v[i]))
            free(v[i]);
        else
            v[u++] = v[i];
    }
    *out = v;
    *n = u;
    return 0;
}

static void free_names(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static char *default_alias(const char *path)
{
    const char *slash = strrchr(path, '/');
    return strdup(slash ? slash + 1 : path);
}

int main(int argc, char **argv)
{
#ifdef __GLIBC__
    /* Request bodies and prompts of megabytes come and go on several threads (the
     * loop, the body parse pool, the preparers). With glibc's sliding threshold a
     * freed big block raises it, later big blocks come from the heaps, and each
     * thread's heap keeps what it once held. A fixed threshold maps every block of
     * 1 MiB or more by itself and unmaps it on free, so the router's memory returns
     * after each large request. */
    (void)mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
    opts_t o = {0};
    o.host = "127.0.0.1";
    o.port = 8080;
    o.ctx = 4096;
    o.parallel = 1;
    o.n_predict = -1;
    o.threads = 0; /* not given: one per physical core of the CPUs -C leaves (below) */
    o.threads_batch = 0;
    o.poll = 50; /* llama.cpp's default polling level */
    o.batch = 2048;
    o.ubatch = 512;
    o.timeout = 600;
    o.sleep_idle = -1;
    o.log_verbosity = -1;
    o.threads_http = -1;
    o.cache_ram = -2; /* not given */
    o.ctx_checkpoints = 8; /* llama-server's defaults */
    o.checkpoint_every = 8192;
    o.cache_disk_size = 32768;
    o.draft_max = 16;
    o.draft_ngl = -1;
    o.draft_threads = -1;
    o.draft_p_min = 0.75f;
    o.ng_simple_n = o.ng_simple_m = o.ng_mod_match = o.ng_mod_min = o.ng_mod_max = o.ng_map_n = o.ng_map_m = -1;
    o.ng_n = o.ng_m = -1;
    o.workers = 1;
    rt_sampler_params_t sd;
    rt_sampler_params_default(&sd);
    o.temp = sd.temp;
    o.top_k = sd.top_k;
    o.top_p = sd.top_p;
    o.min_p = sd.min_p;
    o.typical = sd.typical_p;
    o.repeat_penalty = sd.repeat_penalty;
    o.repeat_last_n = sd.penalty_last_n;
    o.presence_penalty = sd.presence_penalty;
    o.frequency_penalty = sd.frequency_penalty;
    o.seed = -1;
    o.reasoning_budget = -1;
    o.min_keep = sd.min_keep;

    bl_arg_t args[MAX_ARGS];
    int n_args = build_args(args, &o);
    int help = 0;
    bl_err_t err = {0};
    bl_log_init("serve", BL_LOG_INFO);
    if (bl_args_parse(args, n_args, argc, argv, NULL, &help, &err) != 0) {
        fprintf(stderr, "%s: %s\n", PROG, err.msg);
        fprintf(stderr, "Try '%s --help'.\n", PROG);
        return 2;
    }
    if (help) {
        if (help == BL_ARGS_VERSION)
            return 0;
        bl_args_usage(stdout, PROG, "-m FILE [options]", args, n_args);
        return 0;
    }
    if (o.list_devices)
        return list_devices();
    if (o.completion_bash) {
        bl_args_completion_bash(stdout, PROG, args, n_args);
        return 0;
    }
    if (o.cache_list) {
        if (bl_hub_list(stdout, &err) != 0) {
            fprintf(stderr, "%s: %s\n", PROG, err.msg);
            return 1;
        }
        return 0;
    }
    keep_t keep = {0};
    bl_plan_t plan = {0};
    bl_device_t devs[BL_PLAN_MAX_DEVICES];
    int n_devs = 0;
    keys_t keys = {0};
    char *tpl_text = NULL, *alias = NULL, *model_path = NULL, *grammar_text = NULL;
    char *stops[RT_MAX_STOP] = {0};
    char *static_dir = NULL, *slot_dir = NULL, *cache_dir = NULL;
    json_t *tpl_kwargs = NULL;
    bl_gguf_t *g = NULL;
    rt_tokenizer_t *tok = NULL;
    rt_template_t *tpl = NULL;
    rt_cluster_t *cluster = NULL, *draft = NULL;
    char draft_dir[PATH_MAX + 16] = "";
    rt_engine_t *engine = NULL;
    rt_prep_t *prep = NULL, *prep_inspect = NULL;
    char runtime_dir[PATH_MAX] = "";
    int exit_code = 1;
    serve_t *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, "%s: out of memory\n", PROG);
        return 1;
    }
    int loop_inited = 0;

    if (o.config && apply_config(args, n_args, o.config, &keep, &err) != 0) {
        fprintf(stderr, "%s: %s\n", PROG, err.msg);
        exit_code = 2;
        goto out;
    }
    if (o.fim_qwen_30b) { /* llama-server's preset, under the flags given beside it */
        if (!o.model && !o.hub.spec && !o.hub.url) {
            o.hub.spec = "ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF";
            if (!o.hub.file)
                o.hub.file = "qwen3-coder-30b-a3b-instruct-q8_0.gguf";
        }
        if (!arg_seen(args, n_args, "--port"))
            o.port = 8012;
        if (!arg_seen(args, n_args, "--batch-size"))
            o.batch = 1024;
        if (!arg_seen(args, n_args, "--ubatch-size"))
            o.ubatch = 1024;
        if (!arg_seen(args, n_args, "--ctx-size"))
            o.ctx = 0;
    }
    if (o.log_file) {
        /* stderr itself goes to the file, so the processes started later log there too */
        int fd = open(o.log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) {
            fprintf(stderr, "%s: --log-file %s: %s\n", PROG, o.log_file, strerror(errno));
            if (fd >= 0)
                close(fd);
            goto out;
        }
        close(fd);
    }
    int colors = 0;
    if (o.log_colors) {
        if (!strcmp(o.log_colors, "on") || !strcmp(o.log_colors, "auto"))
            colors = !strcmp(o.log_colors, "on") || isatty(STDERR_FILENO);
        else if (strcmp(o.log_colors, "off") != 0) {
            fprintf(stderr, "%s: --log-colors: '%.32s' is not on, off or auto\n", PROG,
                    o.log_colors);
            exit_code = 2;
            goto out;
        }
    } else {
        colors = isatty(STDERR_FILENO);
    }
    if (o.log_verbosity == 0) /* nothing logged; a start failure still reaches stderr */
        o.log_disable = 1;
    bl_log_init("serve", o.log_disable           ? BL_LOG_OFF
                         : o.log_verbosity > 0   ? bl_log_level_of_verbosity(o.log_verbosity)
                         : o.verbose             ? BL_LOG_DEBUG
                                                 : BL_LOG_INFO);
    if ((o.log_prefix && o.no_log_prefix) || (o.log_timestamps && o.no_log_timestamps)) {
        fprintf(stderr, "%s: --log-prefix/--log-timestamps and their --no- forms contradict each other\n", PROG);
        exit_code = 2;
        goto out;
    }
    /* through the environment, so that the children's lines look the same */
    if (o.no_log_timestamps || o.log_timestamps)
        setenv("LLAMA_ARG_LOG_TIMESTAMPS", o.no_log_timestamps ? "0" : "1", 1);
    if (o.no_log_prefix || o.log_prefix)
        setenv("LLAMA_ARG_LOG_PREFIX", o.no_log_prefix ? "0" : "1", 1);
    if (o.log_format) {
        if (bl_log_set_format(o.log_format) != 0) {
            fprintf(stderr, "%s: --log-format takes text or json, not '%s'\n", PROG, o.log_format);
            exit_code = 2;
            goto out;
        }
        setenv("BLOOMERY_LOG_FORMAT", o.log_format, 1);
    }
    bl_log_init("serve", bl_log_level());
    bl_log_set_colors(colors);
    if (o.threads_http != -1)
        BL_LOG(BL_LOG_INFO, "event=flag_accepted flag=--threads-http value=%lld reason=HTTP runs "
                            "on one event-loop thread",
               (long long)o.threads_http);
    if (rt_compat_check(&o.compat, &err) != 0) /* before any download or load */
        goto fail;
    if (o.static_path) { /* --path: its real path, so that served files are checked against it */
        struct stat st;
        if (!(static_dir = realpath(o.static_path, NULL)) || stat(static_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            bl_err_set(&err, BL_ENOENT, "--path %s: not a folder", o.static_path);
            goto fail;
        }
    }
    if (o.cors_credentials && o.no_cors_credentials) {
        bl_err_set(&err, BL_EINVAL, "--cors-credentials and --no-cors-credentials contradict each other");
        goto fail;
    }
    /* speculative decoding: the type, the draft file */
    int draft_on = 0, draft_dev = -1;
    int64_t draft_layers = 0;
    /* draft-mtp: the model's own NextN layer proposes (checked against the file and the
     * plan below) */
    const int mtp_on = o.spec_type && !strcmp(o.spec_type, "draft-mtp");
    /* ngram-simple, ngram-map-k, ngram-mod: proposals from the slot's own tokens
     * (router/ngram.h), llama.cpp's defaults; the engine's draft limits are the type's
     * (--draft-max and --draft-min give way to them; event=draft says which hold) */
    const int ngram = !o.spec_type ? RT_NGRAM_NONE
                      : !strcmp(o.spec_type, "ngram-simple") ? RT_NGRAM_SIMPLE
                      : !strcmp(o.spec_type, "ngram-mod") ? RT_NGRAM_MOD
                      : !strcmp(o.spec_type, "ngram-map-k") ? RT_NGRAM_MAP_K : RT_NGRAM_NONE;
    int64_t ng_n = 0;
    if (o.spec_type && strcmp(o.spec_type, "none") && strcmp(o.spec_type, "draft") &&
        strcmp(o.spec_type, "draft-simple") && !mtp_on && !ngram) {
        bl_err_set(&err, BL_ENOTSUP, "--spec-type %.40s: only none, draft (a draft model, -md), draft-mtp "
                   "(the model's NextN layer), ngram-simple, ngram-map-k and ngram-mod are supported (one type, "
                   "not a list)",
                   o.spec_type);
        goto fail;
    }
    if (ngram && o.draft_model) {
        bl_err_set(&err, BL_ENOTSUP, "--spec-type %s proposes from the slots' own tokens; a draft model "
                   "(-md %s) beside it is not supported", o.spec_type, o.draft_model);
        goto fail;
    }
    if (ngram == RT_NGRAM_SIMPLE) {
        ng_n = o.ng_simple_n > 0 ? o.ng_simple_n : o.ng_n > 0 ? o.ng_n : 12;
        o.draft_max = o.ng_simple_m > 0 ? o.ng_simple_m : o.ng_m > 0 ? o.ng_m : 48;
        o.draft_min = 0;
    } else if (ngram == RT_NGRAM_MAP_K) {
        ng_n = o.ng_map_n > 0 ? o.ng_map_n : o.ng_n > 0 ? o.ng_n : 12;
        o.draft_max = o.ng_map_m > 0 ? o.ng_map_m : o.ng_m > 0 ? o.ng_m : 48;
        o.draft_min = 0;
    } else if (ngram == RT_NGRAM_MOD) {
        ng_n = o.ng_mod_match > 0 ? o.ng_mod_match : o.ng_n > 0 ? o.ng_n : 24;
        o.draft_max = o.ng_mod_max > 0 ? o.ng_mod_max : 64;
        o.draft_min = o.ng_mod_min >= 0 ? o.ng_mod_min : 48;
        if (o.draft_min > o.draft_max) {
            bl_err_set(&err, BL_EINVAL, "--spec-ngram-mod-n-min %lld is above --spec-ngram-mod-n-max %lld",
                       (long long)o.draft_min, (long long)o.draft_max);
            goto fail;
        }
    }
    if (mtp_on && o.draft_model) {
        bl_err_set(&err, BL_ENOTSUP, "--spec-type draft-mtp proposes with the NextN layer of the model's own file; "
                   "a NextN head in a file of its own (-md %s) is not supported", o.draft_model);
        goto fail;
    }
    if (o.spec_type && strcmp(o.spec_type, "none") && !mtp_on && !ngram && !o.draft_model) {
        bl_err_set(&err, BL_EINVAL, "--spec-type %s needs a draft model (-md FILE)", o.spec_type);
        goto fail;
    }
    draft_on = o.draft_model && !(o.spec_type && !strcmp(o.spec_type, "none"));
    if ((draft_on || mtp_on) && o.draft_min > o.draft_max) {
        bl_err_set(&err, BL_EINVAL, "--draft-min %lld is above --draft-max %lld", (long long)o.draft_min,
                   (long long)o.draft_max);
        goto fail;
    }
    if ((o.cache_disk && made_folder("--cache-disk", o.cache_disk, o.dry_run, &cache_dir, &err)) ||
        (o.slot_save_path && made_folder("--slot-save-path", o.slot_save_path, o.dry_run, &slot_dir, &err)))
        goto fail;
    {
        const char *j = getenv("LLAMA_ARG_JINJA"); /* a flag's variable can say "off" too */
        if (j && (!strcmp(j, "0") || !strcmp(j, "false") || !strcmp(j, "off")) && !o.jinja)
            o.no_jinja = 1;
    }
    static const char *const both[][2] = {{"--jinja", "--no-jinja"}, {"--prefill-assistant", "--no-prefill-assistant"},
                                          {"--escape", "--no-escape"}, {"--skip-chat-parsing", "--no-skip-chat-parsing"}};
    const int pairs[][2] = {{o.jinja, o.no_jinja}, {o.prefill_assistant, o.no_prefill_assistant},
                            {o.escape, o.no_escape}, {o.skip_chat_parsing, o.no_skip_chat_parsing}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
        if (pairs[i][0] && pairs[i][1]) {
            bl_err_set(&err, BL_EINVAL, "%s and %s contradict each other", both[i][0], both[i][1]);
            goto fail;
        }
    if (o.load_mode) { /* llama.cpp's newer spelling of --no-mmap and --mlock */
        const char *m = o.load_mode;
        if (!strcmp(m, "none"))
            o.no_mmap = 1;
        else if (!strcmp(m, "mlock") || !strcmp(m, "mmap+mlock"))
            o.mlock = 1;
        else if (!strcmp(m, "dio")) {
            bl_err_set(&err, BL_ENOTSUP, "--load-mode dio: weights are read through the page cache (mmap); the "
                                         "expert pager of --experts-ram reads with O_DIRECT");
            goto fail;
        } else if (strcmp(m, "auto") && strcmp(m, "mmap")) {
            bl_err_set(&err, BL_EINVAL, "--load-mode: '%.32s' is not auto, none, mmap, mlock, mmap+mlock or dio",
                       m);
            goto fail;
        }
    }
    {
        const char *ui = getenv("LLAMA_ARG_UI"); /* a flag's variable can say "off" too */
        if (ui && (!strcmp(ui, "0") || !strcmp(ui, "false") || !strcmp(ui, "off")) && !o.ui)
            o.no_webui = 1;
        if (o.ui && o.no_webui) {
            bl_err_set(&err, BL_EINVAL, "--ui and --no-ui contradict each other");
            goto fail;
        }
    }
    if (!o.model && !o.hub.spec && !o.hub.url) {
        BL_LOG(BL_LOG_ERROR, "event=start_failed reason=no model: give -m FILE or -hf REPO");
        fprintf(stderr, "%s: no model: give -m FILE or -hf REPO (see --help)\n", PROG);
        goto out;
    }
    /* a hub model is downloaded (or found in the cache) before anything else starts;
     * a dry run takes only what the cache holds */
    if (o.dry_run)
        o.hub.offline = 1;
    if (bl_hub_model_path(&o.hub, o.model, &model_path, &err) != 0) {
        BL_LOG(BL_LOG_ERROR, "event=start_failed reason=%s", err.msg);
        if (o.log_disable)
            fprintf(stderr, "%s: %s\n", PROG, err.msg);
        goto out;
    }
    o.model = model_path;
    uint32_t ktype, vtype;
    if (kv_type_of("--cache-type-k", o.cache_type_k, &ktype, &err) ||
        kv_type_of("--cache-type-v", o.cache_type_v, &vtype, &err) || load_keys(&o, &keys, &err))
        goto fail;
    if (ktype != vtype) {
        bl_err_set(&err, BL_ENOTSUP, "--cache-type-k %s and --cache-type-v %s differ: this build "
                                     "keeps K and V in one type",
                   o.cache_type_k ? o.cache_type_k : "f16", o.cache_type_v ? o.cache_type_v : "f16");
        goto fail;
    }
    if (bl_cpu_flags_apply(&o.cpu, &err) != 0) /* the children started later inherit it too */
        goto fail;
    if (o.threads <= 0)
        o.threads = bl_cpu_default_threads();
    if (o.threads_batch == 0)
        o.threads_batch = o.threads;
    rt_task_params_t defaults;
    if (sampling_defaults(&o, &defaults, &err) != 0 || default_grammar(&o, &grammar_text, &err) != 0)
        goto fail;
    if (grammar_text) {
        defaults.sampling.grammar = grammar_text;
        defaults.sampling.grammar_len = strlen(grammar_text);
    }
    for (int i = 0; i < o.n_reverse; i++) {
        if (!(stops[i] = o.no_escape ? strdup(o.reverse[i]) : unescape(o.reverse[i]))) {
            bl_err_set(&err, BL_ENOMEM, "out of memory");
            goto fail;
        }
        defaults.stop[i] = stops[i];
    }
    defaults.n_stop = o.n_reverse;
    defaults.special = o.special;
    if (o.keep != 0)
        BL_LOG(BL_LOG_INFO, "event=flag_accepted flag=--keep value=%lld reason=the context is "
                            "never shifted",
               (long long)o.keep);
    if (o.cache_ram == -2)
        o.cache_ram = 8192; /* llama-server's default */
    if (o.cpu.mask || o.cpu.range || o.cpu.strict) {
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        char list[256] = "?";
        if (sched_getaffinity(0, sizeof cpus, &cpus) == 0)
            bl_cpu_list(&cpus, list, sizeof list);
        BL_LOG(BL_LOG_INFO, "event=cpu_affinity cpus=%s strict=%lld", list, (long long)o.cpu.strict);
    }
    if (o.no_cont_batching || o.context_shift || o.cache_reuse > 0 || (o.slots && o.no_slots)) {
        bl_err_set(&err, BL_ENOTSUP, "%s",
                   o.no_cont_batching ? "--no-cont-batching: batching is always continuous here"
                   : o.context_shift  ? "--context-shift: shifting the context is not supported; "
                                        "a full context ends generation"
                   : o.cache_reuse > 0 ? "--cache-reuse: reusing cached chunks by shifting them "
                                         "is not supported (the prompt cache keeps the longest "
                                         "common prefix); use --cache-reuse 0"
                                       : "--slots and --no-slots contradict each other");
        goto fail;
    }
    /* chat defaults */
    int reasoning = 1;
    if (o.reasoning_format) {
        if (!strcmp(o.reasoning_format, "none")) {
            reasoning = 0;
        } else if (!strcmp(o.reasoning_format, "deepseek-legacy")) {
            reasoning = RT_REASONING_LEGACY;
        } else if (strcmp(o.reasoning_format, "auto") && strcmp(o.reasoning_format, "deepseek") &&
                   strcmp(o.reasoning_format, "deepseek-legacy")) {
            bl_err_set(&err, BL_EINVAL, "--reasoning-format: '%.32s' is not none, auto, deepseek "
                       "or deepseek-legacy", o.reasoning_format);
            goto fail;
        }
    }
    if (o.chat_template_kwargs) {
        json_error_t je;
        tpl_kwargs = json_loads(o.chat_template_kwargs, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(tpl_kwargs)) {
            json_decref(tpl_kwargs);
            tpl_kwargs = NULL;
            bl_err_set(&err, BL_EINVAL, "--chat-template-kwargs: not a JSON object (%s)",
                       je.text[0] ? je.text : "another JSON value");
            goto fail;
        }
    }
    if (chat_kwargs(&o, &tpl_kwargs, &err) != 0)
        goto fail;

    /* the model's metadata, tokenizer and chat template */
    if (bl_gguf_open(&g, o.model, &err) != 0)
        goto fail;
    if (rt_tokenizer_from_gguf(&tok, g, &err) != 0)
        goto fail;
    if (template_source(&o, g, &tpl_text, &err) != 0)
        goto fail;
    if (rt_template_compile(tpl_text, strlen(tpl_text), &tpl, &err) != 0)
        goto fail;

    rt_app_t *app = &s->app;
    rt_app_defaults(app);
    model_facts(app, g);
    int64_t n_ctx = o.ctx;
    if (n_ctx == 0) {
        if (app->n_ctx_train <= 0) {
            bl_err_set(&err, BL_EINVAL, "--ctx-size 0 asks for the model's context length, "
                                        "which %s does not give", o.model);
            goto fail;
        }
        n_ctx = app->n_ctx_train;
    } else if (!arg_seen(args, n_args, "--ctx-size") && app->n_ctx_train > 0 && n_ctx > app->n_ctx_train) {
        n_ctx = app->n_ctx_train;
    } else if (app->n_ctx_train > 0 && n_ctx > app->n_ctx_train) {
        BL_LOG(BL_LOG_WARN, "event=ctx_over_train ctx=%lld n_ctx_train=%lld", (long long)n_ctx,
               (long long)app->n_ctx_train);
    }
    /* -kvu: one cache of n_ctx positions that the slots share, each up to all of it
     * (llama.cpp's unified cache); else each slot owns n_ctx / np */
    const int64_t kv_pool = o.kv_unified && o.parallel > 1 ? n_ctx : 0;
    int64_t n_ctx_slot = kv_pool ? n_ctx : n_ctx / o.parallel;
    if (kv_pool)
        BL_LOG(BL_LOG_INFO, "event=kv_unified positions=%lld slots=%lld chunk=%d", (long long)kv_pool,
               (long long)o.parallel, RT_KV_CHUNK);
    if (n_ctx_slot < 1) {
        bl_err_set(&err, BL_EINVAL, "--ctx-size %lld over --parallel %lld leaves no context per slot",
                   (long long)n_ctx, (long long)o.parallel);
        goto fail;
    }
    int64_t rows = o.ubatch < o.batch ? o.ubatch : o.batch;
    if (split_names("--alias", o.alias, &app->aliases, &app->n_aliases, &err) != 0 ||
        split_names("--tags", o.tags, &app->tags, &app->n_tags, &err) != 0)
        goto fail;
    alias = app->n_aliases ? strdup(app->aliases[0]) : o.hub.spec ? strdup(o.hub.spec) : default_alias(o.model);
    if (!alias) {
        bl_err_set(&err, BL_ENOMEM, "out of memory");
        goto fail;
    }
    app->tok = tok;
    app->tpl = tpl;
    app->tpl_source = tpl_text;
    app->chatfmt = rt_chatfmt_detect(tpl_text);
    app->object_args = tpl && rt_chat_object_args(tpl, tok);
    app->gguf = g;
    app->model_path = o.model;
    app->model_alias = alias;
    app->n_ctx_slot = n_ctx_slot;
    app->n_batch = o.batch;
    app->n_ctx_total = n_ctx;
    app->n_slots = (int)o.parallel;
    app->n_vocab = rt_tokenizer_n_vocab(tok);
    if (draft_on) { /* the draft must speak the model's vocabulary */
        bl_gguf_t *dg = NULL;
        const bl_gguf_arr_t *dt = NULL, *mt = NULL;
        bl_err_t e2 = {0};
        int rc2 = bl_gguf_open(&dg, o.draft_model, &e2);
        if (rc2 == 0)
            rc2 = bl_gguf_get_arch_i64(dg, "block_count", &draft_layers, &e2);
        if (rc2 == 0 && (bl_gguf_get_arr(dg, "tokenizer.ggml.tokens", &dt, &e2) ||
                         bl_gguf_get_arr(g, "tokenizer.ggml.tokens", &mt, &e2)))
            rc2 = BL_EINVAL;
        if (rc2 == 0 && bl_gguf_arr_count(dt) != bl_gguf_arr_count(mt))
            rc2 = bl_err_set(&e2, BL_EINVAL, "its vocabulary has %llu tokens, the model's %llu",
                             (unsigned long long)bl_gguf_arr_count(dt),
                             (unsigned long long)bl_gguf_arr_count(mt));
        bl_arch_t da;
        if (rc2 == 0 && (rc2 = bl_arch_read(&da, dg, o.draft_model, &e2)) == 0 && !da.cache_prefix_cut)
            rc2 = bl_err_set(&e2, BL_ENOTSUP, "a draft whose cache holds a recurrent state (%s) cannot be cut "
                             "back after a rejected proposal (not supported)", da.name);
        bl_gguf_close(dg);
        if (rc2) {
            bl_err_set(&err, rc2, "-md %s: %s", o.draft_model, e2.msg);
            goto fail;
        }
    }
    /* a recurrent state (qwen3next) holds only its last position: the slots go back to
     * checkpoints; what needs a cut to any prefix is refused by name */
    bl_arch_t march;
    if (bl_arch_read(&march, g, o.model, &err) != 0)
        goto fail;
    const int recurrent = !march.cache_prefix_cut;
    if (mtp_on && !bl_arch_nextn_runs(&march)) {
        bl_err_set(&err, BL_ENOTSUP, "--spec-type draft-mtp: %s %s", o.model, march.n_nextn < 1
                       ? "has no NextN (multi-token prediction) layer (nextn_predict_layers is 0)"
                       : "has a NextN layer that does not run yet (glm4moe's and qwen35moe's do)");
        goto fail;
    }
    app->n_predict_default = o.n_predict;
    app->defaults = defaults;
    app->reasoning = o.skip_chat_parsing ? 0 : reasoning;
    app->no_jinja = o.no_jinja;
    app->skip_chat_parsing = o.skip_chat_parsing;
    app->verbose_replies = o.verbose || o.log_verbosity > 9;
    app->no_prefill_assistant = o.no_prefill_assistant;
    app->static_dir = static_dir;
    app->slot_dir = slot_dir;
    app->reasoning_budget = o.reasoning_budget > 0 ? o.reasoning_budget : 0;
    app->spm_infill = o.spm_infill;
    app->no_slots = o.no_slots;
    app->no_webui = o.no_webui;
    app->tpl_kwargs = tpl_kwargs;
    tpl_kwargs = NULL;
    app->started = time(NULL);
    app->loading = 1;
    char experts_vram[24] = "auto";
    if (o.place.experts_vram != BL_EXPERTS_VRAM_AUTO)
        snprintf(experts_vram, sizeof experts_vram, "%lld", (long long)o.place.experts_vram);
    BL_LOG(BL_LOG_INFO,
           "event=config model=%s alias=%s n_ctx=%lld slots=%lld n_ctx_slot=%lld rows_per_step=%lld "
           "threads=%lld threads_batch=%lld poll=%lld workers=%lld kv=%s chat_format=%s api_keys=%zu "
           "residency=%s experts_vram=%s",
           o.model, alias, (long long)n_ctx, (long long)o.parallel, (long long)n_ctx_slot,
           (long long)rows, (long long)o.threads, (long long)o.threads_batch, (long long)o.poll, (long long)o.workers,
           o.cache_type_k ? o.cache_type_k : "f16", rt_chatfmt_name(app->chatfmt), keys.n,
           o.place.no_residency ? "off" : "on", experts_vram);

    /* the listener first (a busy port fails before any child is started; nothing is
     * served until the loop runs), then the child processes and the engine */
    char bin_dir[PATH_MAX];
    static hf_line_t lines[RT_CLUSTER_MAX_STAGES];
    static hf_stage_t hs[RT_CLUSTER_MAX_STAGES];
    bl_stage_host_t hosts[RT_CLUSTER_MAX_STAGES];
    int has_ends = 0, n_lines = 0, ht_threads = 0;
    static hf_names_t names;
    if (o.hostfile && o.workers != 1 && bl_err_set(&err, BL_EINVAL, "--workers and --hostfile: the hostfile's "
                                                   "worker lines are the stages") < 0)
        goto fail;
    int n_found = -1;
    const char *gpu_note = NULL;
    if ((o.hostfile && hostfile_lines(&o, lines, &n_lines, &has_ends, &ht_threads, &names, &err)) ||
        find_bin_dir(bin_dir, sizeof bin_dir, &err))
        goto fail;
    if (names.router[0]) /* the router line's name= labels this process's lines */
        bl_log_init(names.router, bl_log_level());
    int placed = place(&o, g, bin_dir, n_ctx, ktype, rows, lines, n_lines, has_ends, hs, hosts, &plan, devs,
                       &n_devs, &n_found, &gpu_note, &err);
    const int plan_made = placed == 0;
    if (placed == 0 && draft_on)
        placed = draft_device(&o, n_devs, &draft_dev, &err);
    if (placed == 0 && mtp_on && plan.stage[plan.n_stages - 1].device >= 0)
        placed = bl_err_set(&err, BL_ENOTSUP, "--spec-type draft-mtp: the NextN layer runs on the CPU only for now, "
                            "and the plan puts the last layers on CUDA%d (-ngl 0 keeps them on the CPU)",
                            plan.stage[plan.n_stages - 1].device);
    /* on a terminal (text log), the start screen: the dry run's report of the plan
     * being started, then the address once it serves (on_watch) */
    const int screen = !o.dry_run && placed == 0 && isatty(STDERR_FILENO) && !o.log_disable &&
                       !(o.log_format && !strcmp(o.log_format, "json"));
    if (o.dry_run || screen) {
        /* the report of what the start would do, from the same plan, and the same
         * failure (status and log line) when it would not start */
        rt_dry_run_t dr = {
            .model_path = o.model, .g = g, .a = &march, .devs = devs, .n_devs = n_found,
            .gpu_note = gpu_note, .plan = plan_made ? &plan : NULL,
            .error = placed ? err.msg : NULL, .n_ctx = n_ctx, .n_ctx_slot = n_ctx_slot,
            .n_slots = o.parallel, .kv_unified = kv_pool > 0, .kv_type = ktype, .threads = o.threads,
            .threads_batch = o.threads_batch, .experts_vram = o.place.experts_vram,
            .residency = !o.place.no_residency, .draft_path = draft_on ? o.draft_model : NULL,
            .draft_layers = draft_layers, .draft_device = draft_dev, .mtp = mtp_on, .starting = screen};
        for (int i = 0; o.hostfile && plan_made && i < plan.n_stages && i < RT_CLUSTER_MAX_STAGES; i++)
            dr.remote[i] = hs[i].line->remote[0] ? hs[i].line->remote : NULL;
        if (o.hostfile && plan_made) {
            dr.hosts = hosts;
            dr.hosts_split = !has_ends;
        }
        rt_dry_run_print(screen ? stderr : stdout, &dr);
    }
    if (o.dry_run) {
        if (placed)
            goto fail;
        BL_LOG(BL_LOG_INFO, "event=dry_run fits=yes stages=%d", plan.n_stages);
        exit_code = 0;
        goto out;
    }
    if (placed || make_runtime_dir(runtime_dir, sizeof runtime_dir, &err))
        goto fail;
    if (uv_loop_init(&s->loop) != 0) {
        bl_err_set(&err, BL_EIO, "cannot create the event loop");
        goto fail;
    }
    loop_inited = 1;
    rt_http_opts_t ho = {
        .host = o.host,
        .port = (int)o.port,
        .api_keys = (const char *const *)keys.v,
        .n_api_keys = keys.n,
        .max_body_bytes = MAX_BODY_BYTES,
        .timeout_s = (int)o.timeout,
        .api_prefix = o.api_prefix,
        .cors_origins = o.cors_origins,
        .cors_methods = o.cors_methods,
        .cors_headers = o.cors_headers,
        .no_cors_credentials = o.no_cors_credentials,
        .reuse_port = o.reuse_port,
    };
    if (rt_http_create(&s->http, &s->loop, &ho, app, &err) != 0)
        goto fail;
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error code, not a signal */
    rt_cluster_opts_t co = {
        .model_path = o.model,
        .bin_dir = bin_dir,
        .runtime_dir = runtime_dir,
        .n_workers = (int)o.workers,
        .n_threads = (int)o.threads,
        .n_threads_batch = (int)o.threads_batch,
        .n_threads_hosttier = ht_threads ? ht_threads : (int)o.threads, /* a hostfile's hosttier line wins */
        .n_slots = (int)o.parallel,
        .n_ctx_slot = n_ctx_slot,
        .kv_pool = kv_pool,
        .slot_dir = slot_dir,
        .cache_dir = cache_dir,
        .n_batch = rows,
        .logit_rows = draft_on || ngram ? o.parallel * (1 + o.draft_max) : mtp_on ? o.parallel * 2 : 0,
        .mtp = mtp_on,
        .kv_type = ktype,
        .verbose = o.verbose,
        .quiet = o.log_disable,
        .verbosity = o.log_verbosity > 0 ? (int)o.log_verbosity : -1,
        .log_colors = colors,
        .flash_attn = o.flash_attn,
        .no_mmap = o.no_mmap,
        .mlock = o.mlock,
        .no_op_offload = o.no_op_offload,
        .no_peer_copy = o.no_peer_copy,
        .poll = (int)o.poll,
        .cpu_strict = (int)o.cpu.strict,
        .experts_vram = o.place.experts_vram,
        .no_residency = o.place.no_residency,
        .experts_ram = plan.host_disk_bytes ? (int64_t)plan.experts_ram : 0,
    };
    co.step_timeout_ms = (int)(o.timeout * 1000); /* at most 7 days: fits an int */
    app->placement = placement_json(&plan);
    co.n_workers = co.n_stage_ends = plan.n_stages;
    for (int i = 0; i < plan.n_stages; i++) {
        co.stage_end[i] = plan.stage[i].le;
        co.stage_device[i] = plan.stage[i].device;
        co.remote[i] = o.hostfile && hs[i].line->remote[0] ? hs[i].line->remote : NULL;
        co.stage_threads[i] = o.hostfile ? hs[i].line->threads : 0;
        co.stage_name[i] = o.hostfile ? stage_name(&names, hs, plan.n_stages, i) : NULL;
        co.node_hosttier[i] = (uint8_t)plan.stage[i].node_hosttier; /* a hostfile's remote stage only */
        if (co.node_hosttier[i]) {
            co.node_hosttier_threads[i] = hs[i].line->ht_threads;
            co.node_hosttier_name[i] = hs[i].line->ht_name[0] ? hs[i].line->ht_name : NULL;
        }
    }
    co.hosttier_name = names.hosttier[0] ? names.hosttier : NULL;
    co.secret_path = o.cluster_secret;
    for (int64_t l = 0; l < plan.n_layer && l < RT_CLUSTER_MAX_LAYERS; l++) {
        co.host_layers[l] = (uint8_t)(bl_plan_layer_node_hosttier(&plan, l) ? 2 : bl_plan_layer_host(&plan, l));
        co.tier_layers[l] = plan.tier_of[l];
    }
    co.n_tiers = plan.n_tiers;
    for (int k = 0; k < plan.n_tiers; k++)
        co.tier_device[k] = plan.tier[k].device;
    if (rt_cluster_create(&cluster, &co, &err) != 0)
        goto fail;
    app->cluster = cluster;
    if (draft_on) {
        /* the draft: a process of its own, its own control socket, no placement of
         * experts, the slots and context of the model's (without -kvu's sharing) */
        rt_cluster_opts_t dco = co;
        dco.model_path = o.draft_model;
        memset(dco.remote, 0, sizeof dco.remote); /* the draft runs on this host */
        memset(dco.stage_threads, 0, sizeof dco.stage_threads); /* with -td or -t */
        memset(dco.stage_name, 0, sizeof dco.stage_name);
        memset(dco.node_hosttier, 0, sizeof dco.node_hosttier);
        dco.hosttier_name = NULL;
        dco.n_workers = 1;
        dco.n_stage_ends = draft_dev >= 0;
        dco.stage_end[0] = draft_layers;
        dco.stage_device[0] = draft_dev;
        memset(dco.host_layers, 0, sizeof dco.host_layers);
        memset(dco.tier_layers, 0, sizeof dco.tier_layers);
        dco.n_tiers = 0;
        dco.kv_pool = 0;
        dco.n_ctx_slot = kv_pool ? n_ctx / o.parallel : n_ctx_slot;
        dco.slot_dir = dco.cache_dir = NULL;
        dco.experts_vram = 0;
        dco.experts_ram = 0;
        dco.logit_rows = 0; /* one row a slot: the draft only proposes */
        if (o.draft_threads > 0)
            dco.n_threads = dco.n_threads_batch = (int)o.draft_threads;
        snprintf(draft_dir, sizeof draft_dir, "%s/draft", runtime_dir);
        dco.runtime_dir = draft_dir;
        if (rt_cluster_create(&draft, &dco, &err) != 0)
            goto fail;
        app->speculative = 1;
        BL_LOG(BL_LOG_INFO, "event=draft model=%s device=%d draft_max=%lld draft_min=%lld p_min=%.2f",
               o.draft_model, draft_dev, (long long)o.draft_max, (long long)o.draft_min,
               (double)o.draft_p_min);
    }
    if (ngram) {
        app->speculative = 1;
        BL_LOG(BL_LOG_INFO, "event=draft kind=%s n=%lld draft_max=%lld draft_min=%lld", o.spec_type, (long long)ng_n,
               (long long)o.draft_max, (long long)o.draft_min);
    }
    if (mtp_on) {
        app->speculative = 1;
        BL_LOG(BL_LOG_INFO, "event=draft kind=mtp layer=%lld draft_max=1 draft_min=%lld p_min=%.2f", (long long)march.n_layer,
               (long long)o.draft_min, (double)o.draft_p_min);
    }
    s->last_state = RT_CLUSTER_LOADING;
    s->log_disable = o.log_disable;
    rt_engine_opts_t eo = {
        .markers = rt_chatfmt_markers(app->chatfmt),
        .n_slots = (int)o.parallel,
        .n_ctx_slot = n_ctx_slot,
        .kv_pool = kv_pool,
        .draft = draft,
        .draft_max = (int)o.draft_max,
        .draft_min = (int)o.draft_min,
        .draft_p_min = o.draft_p_min,
        .ngram = ngram,
        .ngram_n = (int)ng_n,
        .draft_ctx = kv_pool ? n_ctx / o.parallel : n_ctx_slot,
        .slot_dir = slot_dir,
        .cache_dir = cache_dir,
        .cache_disk = o.cache_disk_size >= 0 ? o.cache_disk_size * 1024 * 1024 : -1,
        .model_id = slot_dir || cache_dir ? rt_slotfile_model_id(g) : 0,
        .kv_type = ktype,
        .n_layer = (uint32_t)plan.n_layer,
        .n_batch = rows,
        .n_predict_max = o.n_predict,
        .timeout_ms = o.timeout * 1000,
        .sleep_idle_ms = o.sleep_idle > 0 ? o.sleep_idle * 1000 : 0,
        .cache_ram = o.cache_ram > 0 ? o.cache_ram * 1024 * 1024 : o.cache_ram,
        /* the NextN layer's proposals come with each answer: a hybrid's verify steps
         * keep checkpoints, which run one step at a time */
        .pipeline = pipeline_depth(&o, plan.n_stages, draft_on || ((mtp_on || ngram) && recurrent), kv_pool),
        .mtp = mtp_on,
        .recurrent = recurrent,
        .ctx_checkpoints = (int)o.ctx_checkpoints,
        .checkpoint_every = o.checkpoint_every,
    };
    if (rt_engine_create(&engine, &eo, cluster, tok, &s->loop, &err) != 0)
        goto fail;
    app->engine = engine;
    /* prompts are templated and tokenized off the loop, with a tokenizer of their own */
    rt_tokenizer_t *prep_tok = NULL;
    if (rt_tokenizer_clone(&prep_tok, tok, &err) != 0 ||
        rt_prep_create(&prep, &s->loop, prep_tok, &err) != 0)
        goto fail;
    app->prep = prep;
    prep_tok = NULL;
    if (rt_tokenizer_clone(&prep_tok, tok, &err) != 0 ||
        rt_prep_create(&prep_inspect, &s->loop, prep_tok, &err) != 0)
        goto fail;
    app->prep_inspect = prep_inspect;

    rt_api_info_register(s->http);
    rt_api_gen_register(s->http);

    uv_signal_init(&s->loop, &s->sigint);
    uv_signal_init(&s->loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_timer_init(&s->loop, &s->watch);
    uv_timer_init(&s->loop, &s->drain);
    s->watch.data = s->drain.data = s;
    uv_timer_start(&s->watch, on_watch, 0, WATCH_MS);

    BL_LOG(BL_LOG_INFO, "event=listening addr=%s:%d", o.host, rt_http_port(s->http));
    if (screen) {
        const char *h = !strcmp(o.host, "0.0.0.0") || !strcmp(o.host, "::") ? "127.0.0.1" : o.host;
        snprintf(s->screen_url, sizeof s->screen_url, strchr(h, ':') ? "http://[%s]:%d%s" : "http://%s:%d%s", h,
                 rt_http_port(s->http), o.api_prefix ? o.api_prefix : "");
    }
    uv_run(&s->loop, UV_RUN_DEFAULT);
    exit_code = s->exit_code;

    /* teardown, in the reverse order of start-up (a prompt still being prepared is
     * answered 503 while its connection is open) */
    rt_prep_destroy(prep_inspect);
    rt_prep_destroy(prep);
    prep = prep_inspect = NULL;
    app->prep = app->prep_inspect = NULL;
    rt_http_destroy(s->http);
    s->http = NULL;
    rt_engine_destroy(engine);
    engine = NULL;
    app->engine = NULL;
    rt_cluster_destroy(cluster);
    cluster = NULL;
    app->cluster = NULL;
    rt_cluster_destroy(draft);
    draft = NULL;
    BL_LOG(BL_LOG_INFO, "event=stopped exit_code=%d", exit_code);
    goto out;

fail:
    BL_LOG(BL_LOG_ERROR, "event=start_failed reason=%s", err.msg);
    if (o.log_disable)
        fprintf(stderr, "%s: %s\n", PROG, err.msg);
    exit_code = 1;
out:
    rt_prep_destroy(prep_inspect);
    rt_prep_destroy(prep);
    s->app.prep = s->app.prep_inspect = NULL;
    if (s->http)
        rt_http_destroy(s->http);
    if (engine) {
        rt_engine_shutdown(engine);
        rt_engine_destroy(engine);
    }
    rt_cluster_destroy(cluster);
    rt_cluster_destroy(draft);
    if (draft_dir[0])
        (void)rmdir(draft_dir);
    if (loop_inited) {
        uv_walk(&s->loop, close_walk, NULL);
        for (int i = 0; i < 100 && uv_loop_alive(&s->loop); i++)
            uv_run(&s->loop, UV_RUN_NOWAIT);
        if (uv_loop_close(&s->loop) != 0)
            BL_LOG(BL_LOG_WARN, "event=loop_not_closed");
    }
    remove_runtime_dir(runtime_dir);
    rt_template_destroy(tpl);
    rt_tokenizer_destroy(tok);
    bl_gguf_close(g);
    bl_plan_free(&plan);
    json_decref(s->app.placement);
    free(tpl_text);
    free(grammar_text);
    free(static_dir);
    free(slot_dir);
    free(cache_dir);
    for (int i = 0; i < RT_MAX_STOP; i++)
        free(stops[i]);
    free(alias);
    free_names(s->app.aliases, s->app.n_aliases);
    free_names(s->app.tags, s->app.n_tags);
    free(model_path);
    json_decref(tpl_kwargs);
    json_decref(s->app.tpl_kwargs);
    for (size_t i = 0; i < keys.n; i++)
        free(keys.v[i]);
    free(keys.v);
    for (size_t i = 0; i < keep.n; i++)
        free(keep.strs[i]);
    free(keep.strs);
    json_decref(keep.root);
    free(s);
    return exit_code;
}
