/* The server's routes and the state they share. api_info.c: /health, /v1/models,
 * /models, /props, /slots, /metrics, /tokenize, /detokenize. api_gen.c and its
 * neighbours: everything that generates or renders prompts (OpenAI chat and
 * completions, llama-server's /completion, /apply-template, input_tokens, Anthropic
 * messages and count_tokens) and the request-field parsing they share.
 *
 * Thread: the loop thread. */
#ifndef RT_API_H
#define RT_API_H

#include <jansson.h>
#include <stdint.h>
#include <time.h>

#include "chat.h"
#include "cluster.h"
#include "engine.h"
#include "gguf.h"
#include "http.h"
#include "prep.h"
#include "chatfmt.h"
#include "template.h"
#include "tokenizer.h"

/* What every route reads. Built by serve.c before the listener opens. */
#define RT_REASONING_LEGACY 2 /* reasoning_format deepseek-legacy: the thought split out
                               * and also kept in the content */

typedef struct rt_app {
    rt_engine_t *engine;
    const char *slot_dir;       /* --slot-save-path, or NULL: slot actions answer 501 */
    int speculative;            /* a draft model proposes tokens (-md) */
    rt_cluster_t *cluster;
    rt_tokenizer_t *tok;        /* tokenizing requests (loop thread) */
    rt_prep_t *prep;            /* prompts templated and tokenized off the loop, with a
                                 * tokenizer of its own; NULL: on the loop (tests) */
    rt_prep_t *prep_inspect;    /* the same for requests that only inspect a prompt
                                 * (/tokenize, token counts, /apply-template): their
                                 * texts have no context bound, so they queue apart
                                 * from the generations; NULL: app->prep */
    rt_template_t *tpl;         /* the chat template in use */
    const char *tpl_source;     /* its text (for /props chat_template) */
    rt_chatfmt_t chatfmt;       /* how its replies write tool calls and thoughts */
    int object_args;            /* the template reads tool-call arguments as objects */
    const bl_gguf_t *gguf;      /* metadata only (the router maps no weights) */
    const char *model_path;
    const char *model_alias;    /* the first of -a's names in byte order, else the file name */
    char **aliases;             /* -a's names, sorted, no repeats (n_aliases; 0: none given) */
    size_t n_aliases;
    char **tags;                /* --tags, sorted, no repeats: /v1/models lists them */
    size_t n_tags;
    int64_t n_ctx_train;
    int64_t n_ctx_slot;         /* per slot */
    int64_t n_ctx_total;        /* -c */
    int64_t n_batch;            /* -b, the logical batch (/infill's budget for the prefix) */
    int n_slots;
    int64_t n_vocab;
    int64_t n_predict_default;  /* -n (-1: none) */
    rt_task_params_t defaults;  /* a request's fields before its own: the sampling flags
                                 * (--temp, --top-k, --samplers, ...) over llama-server's */
    int reasoning;              /* 1: <think> spans go to reasoning_content (default);
                                 * 0: --reasoning-format none leaves them in the text;
                                 * 2 (RT_REASONING_LEGACY): deepseek-legacy, both */
    int no_jinja;               /* --no-jinja: the built-in template; tools refused */
    int skip_chat_parsing;      /* --skip-chat-parsing: no tool calls split out */
    int verbose_replies;        /* -v or -lv above 9: the OpenAI completion replies carry
                                 * "__verbose", the /completion object, as llama-server's */
    const char *static_dir;     /* --path: a folder whose files GET serves (its real path);
                                 * NULL: the built-in page */
    int no_prefill_assistant;   /* --no-prefill-assistant: a last assistant message is a
                                 * whole turn, not the start of the reply */
    int64_t reasoning_budget;   /* --reasoning-budget N > 0: a thought's most tokens; 0: none */
    json_t *tpl_kwargs;         /* --chat-template-kwargs (and --reasoning-budget 0's
                                 * enable_thinking false), under every request's; or NULL */
    int spm_infill;             /* --spm-infill: FIM prompts put the suffix first */
    int no_slots;               /* --no-slots: GET /slots answers 501 */
    int no_webui;               /* --no-webui: GET / answers 404 */
    json_t *placement;          /* the placement plan as /props shows it ("placement", a
                                 * key of this server's own), or NULL */
    int64_t n_params;           /* model parameters */
    uint64_t model_bytes;       /* bytes of tensor data */
    time_t started;
    int loading;                /* 1 until the cluster is READY: /health 503, generation 503 */
    int stopping;               /* 1 after SIGINT/SIGTERM: generation 503 */
} rt_app_t;

/* Whether the model does not serve because its processes have been restarting for
 * longer than a passing restart takes (a stage's host lost: rt_cluster_down), and
 * why, into why (cap bytes): /health and generation answer 503 with it until the set
 * is whole again. Asked of the cluster each time, so that a route never says less
 * than the engine already acts on. */
int rt_app_down(const rt_app_t *app, char *why, size_t cap);

/* llama-server's defaults for what the flags may change: requests' parameters,
 * reasoning on, no template arguments, no generation cap (api_gen.c). */
void rt_app_defaults(rt_app_t *app);

void rt_api_info_register(rt_http_t *h);   /* api_info.c */
/* The chat page GET / serves (router/webui/index.html, embedded at build time). */
extern const char rt_webui_html[];
extern const size_t rt_webui_html_len;
/* The sampler chain of s as llama.cpp's names (a new array; NULL when out of memory),
 * for generation_settings and /props (api_gen.c). */
json_t *rt_api_samplers_json(const rt_sampler_params_t *s);
/* Sets "speculative.n_max", ".n_min" and ".p_min" in a request's params object, as
 * llama-server shows them (the limits the engine applies to the request). */
void rt_api_spec_limits_json(json_t *params, rt_spec_limits_t l);
void rt_api_gen_register(rt_http_t *h);    /* api_gen.c */


#endif
