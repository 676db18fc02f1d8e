/* What api_gen.c, api_openai.c and api_anthropic.c share: request-field parsing
 * into rt_task_params_t, prompt forms, chat messages, the <think> splitter, the
 * JSON pieces of responses, and one generation in flight (rt_gen_req_t) that turns
 * engine events into an API's replies. Everything here runs on the loop thread. */
#ifndef RT_API_GEN_IMPL_H
#define RT_API_GEN_IMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "buf.h"
#include "chatfmt.h"
#include "engine.h"
#include "err.h"
#include "tokenizer.h"

#define RT_MAX_CHOICES 64 /* the most choices (n) one request may ask for */

/* The API a request came through: which fields it reads and how it answers. */
typedef enum rt_gen_api {
    RT_GEN_API_NATIVE = 0, /* llama-server's /completion */
    RT_GEN_API_OAI_CMPL,   /* /v1/completions */
    RT_GEN_API_OAI_CHAT,   /* /v1/chat/completions */
    RT_GEN_API_ANTHROPIC,  /* /v1/messages */
} rt_gen_api_t;

/* --- growable byte buffer --------------------------------------------------- */

typedef bl_buf_t rt_gen_buf_t; /* common/buf.h */

int rt__gen_buf_add(rt_gen_buf_t *b, const char *s, size_t n) BL_WUR; /* 0 or BL_ENOMEM */
void rt__gen_buf_free(rt_gen_buf_t *b);
/* Drops b's first n bytes (all when n >= b->n). */
void rt__gen_buf_consume(rt_gen_buf_t *b, size_t n);
/* Appends from's first n bytes to to and drops them from from. 0 or BL_ENOMEM. */
int rt__gen_buf_move(rt_gen_buf_t *from, size_t n, rt_gen_buf_t *to) BL_WUR;
/* How many bytes at the end of s[0..n) could be the start of tag (a splitter holds
 * them until the next piece decides): 0 when none. */
size_t rt__gen_tag_tail(const char *s, size_t n, const char *tag, size_t tag_len);

/* --- request fields --------------------------------------------------------- */

/* A request's generation options: the engine's part plus what shapes the reply. */
typedef struct rt_gen_params {
    rt_task_params_t task;     /* stop strings point into the request JSON */
    rt_logit_bias_t *bias;     /* owned (task.sampling.logit_bias points here) */
    size_t n_bias;
    size_t cap_bias;
    int stream;
    int include_usage;         /* stream_options.include_usage */
    int return_tokens;
    int post_sampling_probs;   /* report prob instead of logprob */
    int want_probs;            /* report per-token probabilities at all */
    int reasoning;             /* split the thought out of the content; RT_REASONING_LEGACY:
                                * also keep it in the content (deepseek-legacy) */
    int tools;                 /* split tool calls out of the content */
    rt_chatfmt_t fmt;          /* the template's reply format (the app's) */
    int one_call;              /* parallel_tool_calls false: only the first call */
    int timings_per_token;     /* timings in every streamed chunk */
    int n_choices;             /* OpenAI's n (n_cmpl): choices generated one after another */
    int64_t seed_req;          /* the seed as asked (-1: random), for generation_settings */
    const json_t *response_fields; /* native: the final reply's paths to keep; borrowed
                                    * from the request JSON; NULL: all */
    char *grammar;             /* owned GBNF made from a JSON schema (task.sampling.grammar
                                * points here, or into the request's `grammar`) */
    json_t *any_object;        /* owned: the schema of response_format json_object */
    const char *grammar_from;  /* the field the grammar came from ("json_schema",
                                * "response_format", "grammar"), for errors; static */
} rt_gen_params_t;

/* What the parser needs to know about the server. */
typedef struct rt_gen_limits {
    rt_tokenizer_t *tok;       /* for logit_bias string keys; may be NULL (strings refused) */
    int64_t n_vocab;
    int64_t n_ctx_slot;        /* huge token limits are capped here */
    int n_slots;
    int64_t n_predict_default; /* -n: -1 none */
    const rt_task_params_t *defaults; /* the server's; NULL: rt_task_params_default */
    rt_chatfmt_t fmt;          /* the template's reply format */
} rt_gen_limits_t;

/* The server's side of the parser's limits. Always 0. */
int rt__gen_limits(rt_app_t *app, rt_gen_limits_t *out);

/* Reads every generation field of body (an object) for api into *p, refusing what
 * cannot be honoured and wrong types with BL_EINVAL and a message naming the field
 * (the reply's 400 text). BL_ENOMEM. On failure p holds nothing to free; on success
 * free with rt__gen_params_fini. */
int rt__gen_parse_params(const json_t *body, rt_gen_api_t api, const rt_gen_limits_t *lim, rt_gen_params_t *p,
                     bl_err_t *err) BL_WUR;
void rt__gen_params_fini(rt_gen_params_t *p);

/* The ids of a fill-in-the-middle prompt: /infill's fields (api RT_GEN_API_NATIVE) or
 * /v1/completions' "prompt" and "suffix" (RT_GEN_API_OAI_CMPL), laid out as
 * llama-server's /infill does (api_gen.c). BL_EINVAL naming the field, BL_ENOTSUP
 * (the model has no FIM tokens), BL_ENOMEM. */
int rt__gen_fim_tokens(rt_app_t *app, const json_t *body, rt_gen_api_t api, int64_t n_predict,
                       rt_tokens_t *out, bl_err_t *err) BL_WUR;

/* A prompt as /completion and /v1/completions take it: a string, an array of token
 * ids, a mixed array of strings and ids, a one-element array of any of those, or
 * {"prompt_string": ...}. Strings are tokenized with the vocabulary's special
 * tokens added (only before a leading string) and parsed. Ids are checked against
 * the vocabulary. BL_EINVAL naming "prompt", BL_ENOMEM. */
int rt__gen_prompt_tokens(const json_t *prompt, rt_tokenizer_t *tok, int64_t n_vocab, rt_tokens_t *out,
                      bl_err_t *err) BL_WUR;

/* Checks an OpenAI messages array and builds the one the chat template reads: roles
 * system, developer, user, assistant, tool; content a string, null (assistant) or
 * text parts (joined with "\n"); name, tool_call_id and reasoning_content kept.
 * Other part types, tool_calls: refused by name. A last assistant message is a
 * prefill: it is removed and its text returned in *prefill (caller frees; NULL when
 * there is none); with prefill NULL it stays a message like the others
 * (--no-prefill-assistant). BL_EINVAL naming the message, BL_ENOMEM. *out: caller
 * decrefs. */
int rt__gen_chat_messages(const json_t *messages, json_t **out, rt_gen_buf_t *prefill,
                          bl_err_t *err) BL_WUR;

/* The chat routes' options: tools (checked, then given to the template as "tools"
 * unless tool_choice is "none"; *tools, when not NULL, says so), tool_choice (auto,
 * none, required or a named function: *force, when not NULL, is then the name, or ""
 * for any tool; borrowed from body), parallel_tool_calls, chat_template_kwargs (an
 * object or absent), reasoning_format and reasoning_effort; functions and
 * function_call are refused. *kwargs: a new reference to the template arguments or
 * NULL. */
int rt__gen_chat_options(const rt_app_t *app, const json_t *body, json_t **kwargs, int *reasoning,
                         int *tools, const char **force, bl_err_t *err) BL_WUR;

/* The Anthropic request's system and messages as OpenAI-style messages for the
 * template. BL_EINVAL naming the field, BL_ENOMEM. */
int rt__gen_anthropic_messages(const json_t *body, json_t **out, bl_err_t *err) BL_WUR;

/* Renders messages through the app's template with the generation prompt, appends
 * prefill, and reports whether generation starts inside a <think> span. Template
 * errors: 400 text in err, returned code from the template. */
int rt__gen_render_chat(rt_app_t *app, const json_t *messages, const json_t *kwargs,
                    int add_generation_prompt, const rt_gen_buf_t *prefill, char **out,
                        size_t *out_len,
                    int *think_open, bl_err_t *err) BL_WUR;

/* --- <think> splitting --------------------------------------------------------- */

/* Splits generated text into reasoning (inside a leading <think>...</think>) and
 * content, as llama-server's "deepseek" reasoning format does, fed piece by piece.
 * Text that might be the start of a tag, or whitespace at the edges of either part,
 * is held until it is decided. A <think> that is not at the start is content. */
typedef struct rt_gen_think {
    int state;
    rt_gen_buf_t hold;
    const char *open, *close; /* the tags (static) */
} rt_gen_think_t;

/* open: generation starts inside the span (the prompt ended with its tag). The tags
 * are fmt's (rt_chatfmt_think_tags). */
void rt__gen_think_init(rt_gen_think_t *t, int open, rt_chatfmt_t fmt);
void rt__gen_think_fini(rt_gen_think_t *t);
/* Feeds text; the reasoning and content it releases are appended to reason and
 * content. BL_ENOMEM. */
int rt__gen_think_feed(rt_gen_think_t *t, const char *s, size_t n, rt_gen_buf_t *reason,
                   rt_gen_buf_t *content) BL_WUR;
/* The end of the text: releases what is held. */
int rt__gen_think_finish(rt_gen_think_t *t, rt_gen_buf_t *reason, rt_gen_buf_t *content) BL_WUR;

/* --- tool calls (api_tools.c) ------------------------------------------------ */

/* OpenAI "tools": an array of {"type": "function", "function": {"name", "description"?,
 * "parameters"?}}. BL_EINVAL naming the entry. */
int rt__gen_check_tools(const json_t *tools, bl_err_t *err) BL_WUR;
/* A grammar whose text starts with a thought, then body: gbnf's root rule is
 * renamed and body's "%R" stands for it, "%W" for up to 20 spaces, tabs and line
 * breaks. think: 0 no thought, 1 an optional one, 2 only its end (the prompt opened
 * it), in fmt's tags (rt_chatfmt_think_tags; gpt-oss: the analysis message, then
 * "<|start|>assistant"). *out: caller frees. BL_EINVAL, BL_ENOMEM. */
int rt__gen_grammar_wrap(const char *gbnf, int think, rt_chatfmt_t fmt, const char *body,
                         char **out, bl_err_t *err) BL_WUR;
/* gbnf with every rule name (definitions and references; not literals, classes,
 * repetition counts or comments) written with prefix before it, and `root`, when
 * root is not NULL, written as root instead. A new string, or NULL (no memory). */
char *rt__gen_gbnf_rename(const char *gbnf, const char *prefix, const char *root);
/* Appends to b the GBNF literal of s[0..n) (quotes and escapes). BL_ENOMEM. */
int rt__gen_gbnf_lit(bl_buf_t *b, const char *s, size_t n) BL_WUR;
/* Appends to b rules `name`, `name-1`, ... that match any text up to and with the
 * first occurrence of tag (ASCII, 1 to 64 bytes; else BL_EINVAL): an automaton,
 * one rule per how much of the tag the text ends with. Each rule starts on a new
 * line. BL_ENOMEM. */
int rt__gen_gbnf_until(bl_buf_t *b, const char *name, const char *tag) BL_WUR;

/* Forces the reply to be tool calls (tool_choice "required" or a named function,
 * Anthropic's "any" or "tool") in p->fmt's form (toolcall.c's formats: hermes's
 * <tool_call>{"name", "arguments"}</tool_call>, qwen3-coder's and glm-4.5's
 * key/value pairs, deepseek's, kimi-k2's and command-r7b's sections, mistral's
 * [TOOL_CALLS], llama-3.x's bare object, a harmony commentary message): p's grammar
 * becomes a thought in the format's tags (think: 0 none, 1 optional, 2 its end
 * only, as the prompt opened it), then the calls, once when one_call (and always
 * for gpt-oss, whose message holds one call), else once or more; each names one of
 * tools' functions (only `name` when given) with the arguments its parameters
 * schema accepts. tools: OpenAI's form, checked. BL_EINVAL (named tool not in the
 * list, a parameters schema the converter refuses, a grammar already asked for),
 * BL_ERANGE (the grammar too large), BL_ENOMEM. */
int rt__gen_force_tools(rt_gen_params_t *p, const json_t *tools, const char *name, int one_call,
                        int think, bl_err_t *err) BL_WUR;
/* Whether the template is told not to think: enable_thinking false in the request's
 * template arguments (kwargs, as rt__gen_chat_options or the Anthropic options made
 * them; reasoning_effort "none" sets it there), else in --chat-template-kwargs; or
 * the rendered prompt (len bytes) ends with the format's closing think tag. */
int rt__gen_thinking_off(const rt_app_t *app, const json_t *kwargs, const char *prompt, size_t len);

/* An assistant message's "tool_calls" as the template takes them: each
 * {"id"?, "type": "function", "function": {"name", "arguments"}} with the arguments
 * as JSON text (an object is written out). *out a new array. BL_EINVAL naming
 * messages[mi], BL_ENOMEM. */
int rt__gen_message_tool_calls(const json_t *calls, size_t mi, json_t **out, bl_err_t *err) BL_WUR;

/* --- the reply's tool calls and thought in the template's format (toolcall.c) -- */

/* What a stream shows of a call before it is whole: its header as soon as its name
 * is known (OPEN: id and name), then its arguments as they come (ARGS: bytes that,
 * joined, are the arguments' text), or that it was not a call after all (DROP).
 * idx: the index the call takes among the finished calls. */
enum { RT_CALL_OPEN = 0, RT_CALL_ARGS, RT_CALL_DROP };
typedef struct rt_gen_call_ev {
    int kind;
    size_t idx;
    char id[64];
    json_t *name;      /* OPEN */
    rt_gen_buf_t args; /* ARGS */
} rt_gen_call_ev_t;

/* Splits generated content into text and tool calls in the format fmt, fed piece by
 * piece: text that may begin a call is held, a call until it is whole. A call that
 * does not parse stays text, markers and all; a call the text ends inside is taken
 * as far as it is whole. calls: the finished calls, each {"id", "type": "function",
 * "function": {"name", "arguments": JSON text}}. ev: what the last feed showed of
 * calls not yet finished (a feed drops the previous feed's). */
typedef struct rt_gen_tools {
    rt_chatfmt_t fmt;
    json_t *tools;        /* the request's tools (OpenAI's or Anthropic's form), for the
                           * types of parameters written as text; may be NULL */
    int in_call;          /* hold begins with a call section */
    size_t open_len;      /* the length of the marker that opened it */
    size_t n_done;        /* the section's calls already in calls */
    rt_gen_buf_t hold;
    json_t *calls;        /* NULL until the first */
    /* the call being generated, once its name is known */
    int open;
    char open_id[64];
    size_t args_sent;     /* bytes of its arguments' text shown */
    rt_gen_call_ev_t *ev;
    size_t n_ev, cap_ev;
    /* gpt-oss: the message being read */
    int h_state, h_kind;
    json_t *h_name;       /* its function */
    rt_gen_buf_t h_args;
} rt_gen_tools_t;

/* fmt: the template's; tools: the request's (borrowed: a reference is taken). */
void rt__gen_tools_init(rt_gen_tools_t *t, rt_chatfmt_t fmt, json_t *tools);
void rt__gen_tools_fini(rt_gen_tools_t *t);
/* Feeds s[0..n); the text it releases is appended to text. last: the content has
 * ended (everything held is decided). BL_ENOMEM. */
int rt__gen_tools_feed(rt_gen_tools_t *t, const char *s, size_t n, int last, rt_gen_buf_t *text) BL_WUR;
/* gpt-oss replies (harmony): its channels split into reasoning (analysis; into
 * content when reason is NULL), content (final, commentary to no one) and, when
 * calls is set, tool calls (commentary to=functions.NAME) into t. Fed as
 * rt__gen_tools_feed. BL_ENOMEM. */
int rt__gen_harmony_feed(rt_gen_tools_t *t, const char *s, size_t n, int last, int calls,
                         rt_gen_buf_t *reason, rt_gen_buf_t *content) BL_WUR;

/* --- reply pieces -------------------------------------------------------------- */

/* A JSON string of s[0..n), with an incomplete UTF-8 sequence at the end dropped
 * and other invalid bytes replaced with U+FFFD (a token's piece may be part of a
 * character). Never NULL unless out of memory. */
json_t *rt__gen_json_piece(const char *s, size_t n);
/* A real that is never NaN or infinite (JSON has neither): those become the
 * lowest float, as llama-server reports log(0). */
json_t *rt__gen_json_real(double x);
/* llama-server's timings object. */
json_t *rt__gen_timings_json(const rt_timings_t *t);
/* One token's probability entry, llama-server's shape: {id, token, bytes, logprob
 * or prob, top_logprobs or top_probs}. */
json_t *rt__gen_prob_entry(const rt_tokenizer_t *tok, const rt_event_t *ev, int post_sampling);
/* "data: <json>\n\n" (and "event: NAME\n" first when event is not NULL); steals j.
 * Caller frees. NULL when out of memory. */
char *rt__gen_sse(const char *event, json_t *j, size_t *len);
/* A random id: prefix and 32 letters and digits. */
void rt__gen_random_id(char *out, size_t cap, const char *prefix);
/* "stop" or "length" (OpenAI), or the Anthropic stop_reason. */
const char *rt__gen_finish_reason(rt_stop_type_t s);
const char *rt__gen_anthropic_stop_reason(rt_stop_type_t s);
const char *rt__gen_stop_type_name(rt_stop_type_t s);

/* --- one generation in flight ------------------------------------------------- */

typedef struct rt_gen_req rt_gen_req_t;

/* The API's side of a generation, called on the loop thread while the request is
 * open. With n > 1 choices they run one after another on the same request: done is
 * called for each with g->more set for all but the last (then it adds the choice's
 * object to g->choices, or streams its final chunk), and the choice's index is
 * g->choice. start: the stream has just started (streams only; may be NULL). token: the
 * text an event released (after <think> splitting when reasoning is on; either part
 * may be empty); ev is the TOKEN event, or the DONE event for the held-back tail
 * (streams only: a reply that is not streamed reads g->content). done: the final
 * event; it answers or ends the stream. Errors are answered by rt__gen_fail. */
typedef struct rt_gen_ops {
    void (*start)(rt_gen_req_t *g);
    void (*token)(rt_gen_req_t *g, const rt_event_t *ev, const char *reason, size_t reason_len,
                  const char *content, size_t content_len);
    void (*done)(rt_gen_req_t *g, const rt_event_t *ev);
} rt_gen_ops_t;

/* A request's prompt as rt__gen_prepare's work made it: tokens (or a rendered text)
 * and what the chat options said, or the error that refused it. */
typedef struct rt_gen_prep {
    rt_tokens_t toks;
    char *text;             /* apply-template: the rendered prompt (owned) */
    size_t len;
    int rc;                 /* 0, or a BL_E* code with err; BL_ERANGE: it cannot fit */
    bl_err_t err;
    size_t n_min;           /* rc BL_ERANGE: the tokens it takes at least */
    int reasoning, tools, think_off, prefilled, one_call;
    const char *force;      /* tool_choice that forces calls: the function name, "" any */
    unsigned tok_flags;     /* /tokenize: RT_TOKENIZE_* */
    int with_pieces;        /* /tokenize: ids with their pieces */
    int add_gen;            /* apply-template: add_generation_prompt */
    /* private: the job */
    void (*_work)(rt_gen_req_t *g, rt_app_t *app);
    void (*_next)(rt_gen_req_t *g);
    json_t *_body;          /* the request's JSON, held while the job is out */
} rt_gen_prep_t;

struct rt_gen_req {
    rt_req_t *r;
    rt_app_t *app;
    rt_task_t *task;
    const rt_gen_ops_t *ops;
    rt_gen_api_t api;
    rt_gen_params_t params;
    char id[64];
    int64_t created;
    int64_t n_prompt;
    int streaming;          /* the stream has started */
    int in_event;           /* an engine event is being handled */
    int gone;               /* the client left: r must not be touched */
    int think_open;         /* generation starts inside <think> */
    rt_gen_think_t think;
    rt_gen_tools_t calls;      /* tool calls out of the content (params.tools) */
    size_t n_calls_sent;       /* streams: calls already written */
    int call_streaming;        /* chat streams: the open call's header went out; its
                                * arguments follow as they come */
    rt_gen_buf_t content;      /* generated content (not streamed: the reply) */
    rt_gen_buf_t reasoning;
    json_t *probs;          /* array of prob entries (not streamed) */
    json_t *tokens;         /* generated ids (return_tokens) */
    char *prompt_text;      /* /completion's "prompt" field */
    /* API state */
    int n_events;
    int block_index;        /* Anthropic: index of the open content block, -1 none */
    int block_kind;         /* 0 none, 1 thinking, 2 text */
    int has_new_line;
    int64_t text_offset;    /* /v1/completions logprobs: bytes of text before the token */
    int seq;                /* /v1/responses streams: the next event's sequence_number */
    int choice;             /* n > 1: the index of the choice being generated */
    int more;               /* in done: another choice follows (answer only this one's part) */
    json_t *choices;        /* n > 1, not streamed: the finished choices' objects */
    int64_t n_predicted_sum; /* n > 1: the tokens of the finished choices */
    rt_gen_prep_t prep;     /* the prompt, made off the loop (rt__gen_prepare) */
};

/* The final object of /completion: the whole reply, or the stream's last event
 * (api_gen.c). The OpenAI routes add it as "__verbose" when app->verbose_replies. */
json_t *rt__gen_native_final(rt_gen_req_t *g, const rt_event_t *ev);

/* The tool calls a reply keeps: all, or the first when the request said not to call
 * in parallel (api_tools.c). */
size_t rt__gen_calls_kept(const rt_gen_req_t *g);

/* Answers 503 while the model loads or the server stops; returns 1 when it did. */
int rt__gen_unavailable(rt_req_t *r, int anthropic);
/* An error reply in the API's shape (Anthropic's for RT_GEN_API_ANTHROPIC). */
void rt__gen_send_error(rt_req_t *r, rt_gen_api_t api, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Allocates a generation for r (caller fills params, then rt__gen_submit). */
rt_gen_req_t *rt__gen_req_new(rt_req_t *r, rt_app_t *app, rt_gen_api_t api, const rt_gen_ops_t *ops,
                       const char *id_prefix);
/* What every generation route does first: 503 while loading or stopping, the
 * limits into *lim, a new generation for r. NULL when r was answered (503, or 500
 * out of memory). */
rt_gen_req_t *rt__gen_begin(rt_req_t *r, rt_gen_api_t api, const rt_gen_ops_t *ops,
                            const char *id_prefix, rt_gen_limits_t *lim);
/* Makes g's prompt off the loop thread: work(g, app) runs on the preparer's thread
 * with an app whose tokenizer is the preparer's (or at once with g's app where the
 * server has no preparer), and fills g->prep; it may read the request's JSON and the
 * app's settings and nothing else of the loop's. Then next(g) runs on the loop
 * thread, unless the client left meanwhile (g is freed) or the server stopped first
 * (503 answered, g freed). BL_ENOMEM answers 500. */
void rt__gen_prepare(rt_gen_req_t *g, void (*work)(rt_gen_req_t *g, rt_app_t *app),
                     void (*next)(rt_gen_req_t *g));
/* A generation route: rt__gen_begin, the request's fields (a 400 naming the bad
 * one), then rt__gen_prepare(work, next). */
void rt__gen_route(rt_req_t *r, rt_gen_api_t api, const rt_gen_ops_t *ops, const char *id_prefix,
                   void (*work)(rt_gen_req_t *g, rt_app_t *app), void (*next)(rt_gen_req_t *g));
/* rt_tokenize of a prompt that must fit a slot: BL_ERANGE with *n_min, without
 * tokenizing, when its length alone shows that it cannot (n_min NULL: no bound, for
 * the routes that only count). */
int rt__gen_tokenize_prompt(const rt_app_t *app, const char *text, size_t len, unsigned flags,
                            rt_tokens_t *out, size_t *n_min, bl_err_t *err) BL_WUR;
/* BL_ERANGE with *n_min when the chat messages (as rt__gen_chat_messages made them)
 * cannot fit a slot by the length of what every template writes, before rendering;
 * else 0. n_min NULL: no bound. */
int rt__gen_chat_cannot_fit(const rt_app_t *app, const json_t *msgs, const rt_gen_buf_t *prefill,
                            size_t *n_min, bl_err_t *err) BL_WUR;
/* The preparer's side of a "prompt" field: its tokens into p, or p->rc (BL_ERANGE
 * when its length alone shows that it cannot fit a slot). */
void rt__gen_prep_prompt(rt_gen_prep_t *p, const rt_app_t *app, const json_t *prompt);
/* Bounds the thought a reply may open with (g->think_open: the prompt opened it):
 * budget tokens, or with budget 0 half of what the request may generate (its token
 * limit, or what the slot's context leaves after n_prompt), so that a constrained
 * reply always gets room after its thought. */
void rt__gen_bound_thought(rt_gen_req_t *g, size_t n_prompt, int64_t budget);
/* Answers g->prep's error in g's API shape (400 naming the problem, 400
 * exceed_context_size_error, 501 unsupported, 500 out of memory). */
void rt__gen_send_prep_error(rt_gen_req_t *g);
/* Submits prompt; on success the reply is owned by the events (start runs now for a
 * stream). On failure answers the error itself (400 naming the problem, 400
 * exceed_context_size_error, 503) and frees g. */
void rt__gen_submit(rt_gen_req_t *g, const int32_t *prompt, size_t n);
/* Frees g and what it holds (the request is not touched). */
void rt__gen_req_free(rt_gen_req_t *g);
/* The error reply for a failure after submission: the error JSON, or inside a
 * stream that started an SSE error object and the end of the stream. */
void rt__gen_fail(rt_gen_req_t *g, int status, const char *message);
/* llama-server's generation_settings for g's parameters. */
json_t *rt__gen_settings_json(const rt_gen_req_t *g);
/* Streams one piece (copied). */
void rt__gen_write(rt_gen_req_t *g, const char *s, size_t n);
/* Streams j as an SSE event (steals j). */
void rt__gen_write_sse(rt_gen_req_t *g, const char *event, json_t *j);

/* One chat.completion.chunk around delta (stolen); finish_reason NULL: null. */
json_t *rt__gen_chat_chunk(const rt_gen_req_t *g, json_t *delta, const char *finish_reason);
/* OpenAI's usage object. */
json_t *rt__gen_usage_json(int64_t n_prompt, int64_t n_predicted, int64_t n_cached);
/* /v1/completions' logprobs of entries (prob entries as rt__gen_prob_entry makes them):
 * OpenAI's legacy tokens, token_logprobs, top_logprobs, text_offset, and
 * llama-server's content. *offset advances over the tokens' bytes. */
json_t *rt__gen_legacy_logprobs(const json_t *entries, int post, int64_t *offset);

/* Route handlers (api_openai.c, api_anthropic.c). */
void rt__api_chat(rt_req_t *r);
void rt__api_oai_completions(rt_req_t *r);
void rt__api_chat_input_tokens(rt_req_t *r);
void rt__api_messages(rt_req_t *r);
void rt__api_messages_count_tokens(rt_req_t *r);
void rt__api_responses(rt_req_t *r);
void rt__api_responses_input_tokens(rt_req_t *r);
/* The chat route's prompt job and its next step (api_openai.c), which /v1/responses
 * runs with its own reply. */
void rt__gen_chat_work(rt_gen_req_t *g, rt_app_t *app);
void rt__gen_chat_next(rt_gen_req_t *g);

#endif
