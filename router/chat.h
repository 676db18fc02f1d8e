/* Chat prompts: a conversation (OpenAI-style messages) rendered through a model's
 * chat template, with the variables chat templates expect (bos_token, eos_token,
 * add_generation_prompt, and caller-supplied keyword arguments such as
 * enable_thinking or tools). Shared by the CLI and the server's chat routes. */
#ifndef RT_CHAT_H
#define RT_CHAT_H

#include <jansson.h>
#include <stddef.h>

#include "err.h"
#include "template.h"
#include "tokenizer.h"

/* Compiles the template of a model: the text of file when given, else the GGUF key
 * tokenizer.chat_template. BL_ENOENT when neither exists; the compiler's codes
 * otherwise, with err naming the source. Caller frees with rt_template_destroy. */
int rt_chat_template_load(rt_template_t **out, const bl_gguf_t *g, const char *file,
                          bl_err_t *err) BL_WUR;

/* Renders messages (a JSON array of {role, content, ...}) through tpl. kwargs (a JSON
 * object or NULL) adds variables; its members win over the defaults. *out is
 * NUL-terminated, caller frees with free(). Errors as rt_template_render, and
 * BL_EINVAL when messages is not an array. */
int rt_chat_render(const rt_template_t *tpl, const rt_tokenizer_t *tok, const json_t *messages,
                   int add_generation_prompt, const json_t *kwargs, char **out, size_t *out_len,
                   bl_err_t *err) BL_WUR;

/* Whether tpl writes a tool call's arguments only when they are an object (GLM-4.5's
 * and Qwen3-Coder's templates walk their items): it renders an assistant call with
 * the arguments as JSON text and as an object, and answers 1 when only the object
 * shows the argument's name. */
int rt_chat_object_args(const rt_template_t *tpl, const rt_tokenizer_t *tok);

/* messages with every tool call's arguments that are JSON text of an object turned
 * into that object (other arguments as they are): a new reference, NULL when out of
 * memory. */
json_t *rt_chat_args_as_objects(const json_t *messages);

#endif
