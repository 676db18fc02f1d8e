/* The reply format a chat template teaches its model: how the model writes tool
 * calls and where its reasoning goes. Read off the template's text once, at start;
 * the chat routes split every reply by it (toolcall.c). */
#ifndef RT_CHATFMT_H
#define RT_CHATFMT_H

#include <stddef.h>

typedef enum rt_chatfmt {
    RT_CHATFMT_HERMES = 0,    /* <tool_call>{"name", "arguments"}</tool_call> (Qwen 2.5/3,
                               * Hermes; also templates that name no format) */
    RT_CHATFMT_QWEN3_CODER,   /* <tool_call><function=N><parameter=K>V</parameter>... */
    RT_CHATFMT_DEEPSEEK_R1,   /* <｜tool▁calls▁begin｜>... function<｜tool▁sep｜>N ```json A``` */
    RT_CHATFMT_DEEPSEEK_V31,  /* <｜tool▁calls▁begin｜>... N<｜tool▁sep｜>A ... */
    RT_CHATFMT_KIMI_K2,       /* <|tool_calls_section_begin|>... functions.N:i ... A */
    RT_CHATFMT_GLM45,         /* <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value> */
    RT_CHATFMT_MISTRAL_NEMO,  /* [TOOL_CALLS][{"name", "arguments", "id"}, ...] */
    RT_CHATFMT_MAGISTRAL,     /* [TOOL_CALLS]N[ARGS]A, once per call */
    RT_CHATFMT_LLAMA3,        /* {"name": N, "parameters": A} (Llama 3.1-3.3) */
    RT_CHATFMT_COMMAND_R7B,   /* <|START_ACTION|>[{"tool_name", "parameters"}]<|END_ACTION|> */
    RT_CHATFMT_GPT_OSS,       /* harmony: <|channel|>analysis|commentary to=functions.N|final */
    RT_CHATFMT_N
} rt_chatfmt_t;

/* The format of a template's text (NULL: the default, Hermes). */
rt_chatfmt_t rt_chatfmt_detect(const char *tpl_source);
/* Its name in logs, /props and docs ("hermes", "deepseek-r1", ...). */
const char *rt_chatfmt_name(rt_chatfmt_t f);
/* The texts of the tokens the format's replies are split on (NULL-terminated): the
 * detokenizer must give them as text even where the vocabulary marks them as
 * control tokens, which replies otherwise drop. */
const char *const *rt_chatfmt_markers(rt_chatfmt_t f);
/* The tags around a thought ("<think>", "</think>" for most). */
void rt_chatfmt_think_tags(rt_chatfmt_t f, const char **open, const char **close);
/* What begins the next message after a thought ("" for most; harmony's
 * "<|start|>assistant"). */
const char *rt_chatfmt_think_next(rt_chatfmt_t f);

/* Key/value call arguments: KEY_OPEN key KEY_CLOSE [VAL_OPEN] value VAL_CLOSE per
 * pair (glm-4.5, qwen3-coder). */
typedef struct rt_kvform {
    const char *key_open, *key_close, *val_open, *val_close;
    int strip_nl; /* a value's first and last line break are the layout's */
} rt_kvform_t;

/* How a format writes its calls, for the grammar that forces them:
 *   calls ::= open call (sep call)* close    (one call: open call close)
 * and each call is `call` with %N its name (JSON text with json_name, else raw),
 * %A its arguments (a JSON object of the tool's parameters, or key/value pairs in
 * kv's form), %I a call id of digits, %9 one of nine letters and digits, %_ one
 * space exactly. A space stands for up to 20 spaces, tabs and line breaks; every
 * other byte is itself.
 * single: one call a reply. */
typedef struct rt_callform {
    const char *open, *sep, *close, *call;
    int json_name, single;
    const rt_kvform_t *kv;
} rt_callform_t;

const rt_callform_t *rt_chatfmt_callform(rt_chatfmt_t f);

#endif
