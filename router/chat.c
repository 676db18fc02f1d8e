/* Chat prompts: a conversation through the model's chat template. See chat.h. */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"
#include "gguf.h"

#define CHAT_TEMPLATE_FILE_MAX (16u << 20) /* a template file larger than this is refused */

int rt_chat_template_load(rt_template_t **out, const bl_gguf_t *g, const char *file,
                          bl_err_t *err)
{
    *out = NULL;
    if (file) {
        char *text;
        size_t len;
        int rc = bl_read_file(file, CHAT_TEMPLATE_FILE_MAX, &text, &len, err);
        if (rc)
            return rc;
        rc = rt_template_compile(text, len, out, err);
        free(text);
        if (rc && err) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            bl_err_set(err, rc, "chat template %s: %s", file, msg);
        }
        return rc;
    }
    bl_gguf_str_t s;
    if (!g || !bl_gguf_find_kv(g, "tokenizer.chat_template"))
        return bl_err_set(err, BL_ENOENT,
                          "the model has no tokenizer.chat_template; give --chat-template-file");
    int rc = bl_gguf_get_str(g, "tokenizer.chat_template", &s, err);
    if (rc)
        return rc;
    rc = rt_template_compile(s.ptr, (size_t)s.len, out, err);
    if (rc && err) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        bl_err_set(err, rc, "the model's chat template: %s", msg);
    }
    return rc;
}

/* The text of a special token as a template sees it, or "" when there is none. */
static json_t *token_string(const rt_tokenizer_t *tok, int32_t id)
{
    if (id < 0)
        return json_string("");
    rt_str_t s = rt_tokenizer_token_text(tok, id);
    return s.ptr ? json_stringn(s.ptr, s.len) : json_string("");
}

int rt_chat_render(const rt_template_t *tpl, const rt_tokenizer_t *tok, const json_t *messages,
                   int add_generation_prompt, const json_t *kwargs, char **out, size_t *out_len,
                   bl_err_t *err)
{
    *out = NULL;
    if (!json_is_array(messages))
        return bl_err_set(err, BL_EINVAL, "chat: messages is not an array");
    if (kwargs && !json_is_object(kwargs))
        return bl_err_set(err, BL_EINVAL, "chat: template arguments are not an object");
    json_t *ctx = json_object();
    if (!ctx)
        return bl_err_set(err, BL_ENOMEM, "chat: out of memory");
    int rc = BL_ENOMEM;
    /* json_object_set_new takes its value even when it fails, so nothing leaks */
    if (json_object_set(ctx, "messages", (json_t *)messages) ||
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt)) ||
        json_object_set_new(ctx, "bos_token", token_string(tok, rt_tokenizer_bos(tok))) ||
        json_object_set_new(ctx, "eos_token", token_string(tok, rt_tokenizer_eos(tok))) ||
        (kwargs && json_object_update(ctx, (json_t *)kwargs))) {
        bl_err_set(err, rc, "chat: out of memory");
        goto done;
    }
    rc = rt_template_render(tpl, ctx, out, out_len, err);
done:
    json_decref(ctx);
    return rc;
}

json_t *rt_chat_args_as_objects(const json_t *messages)
{
    json_t *out = json_deep_copy(messages);
    size_t i, j;
    json_t *m, *c;
    json_array_foreach(out, i, m) {
        json_t *calls = json_is_object(m) ? json_object_get(m, "tool_calls") : NULL;
        json_array_foreach(calls, j, c) {
            json_t *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
            json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
            if (!json_is_string(args))
                continue;
            json_t *o = json_loadb(json_string_value(args), json_string_length(args),
                                   JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
            if (json_is_object(o))
                json_object_set(fn, "arguments", o);
            json_decref(o);
        }
    }
    return out;
}

/* Whether the conversation of probe, with the call's arguments args, renders and
 * shows the argument's name. */
static int shows_arg(const rt_template_t *tpl, const rt_tokenizer_t *tok, json_t *args)
{
    static const char key[] = "bl_probe_argument";
    json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:s, s:{s:s, s:o}}]}, {s:s, s:s, s:s}]",
                             "role", "user", "content", "go", "role", "assistant", "content", "",
                             "tool_calls", "type", "function", "id", "call0", "function", "name", "probe",
                             "arguments", args, "role", "tool", "tool_call_id", "call0", "content", "done");
    if (!msgs)
        return 0;
    char *text = NULL;
    size_t len = 0;
    bl_err_t err;
    const int ok = rt_chat_render(tpl, tok, msgs, 1, NULL, &text, &len, &err) == 0 && strstr(text, key);
    free(text);
    json_decref(msgs);
    return ok;
}

int rt_chat_object_args(const rt_template_t *tpl, const rt_tokenizer_t *tok)
{
    return !shows_arg(tpl, tok, json_string("{\"bl_probe_argument\": \"x\"}")) &&
           shows_arg(tpl, tok, json_pack("{s:s}", "bl_probe_argument", "x"));
}
