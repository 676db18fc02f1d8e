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
/* Whether a forced call (tool_choice "required" or a named function) can be written
 * as a grammar for the format: the formats whose call is one JSON object. */
int rt_chatfmt_can_force(rt_chatfmt_t f);

#endif
