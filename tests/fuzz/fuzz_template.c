/* libFuzzer target for the chat-template engine (router/template.c,
 * router/template_parse.c). The engine is compiled into this target with lower
 * render limits (tests/fuzz/meson.build: 1 MiB of output, 64 MiB of arena, range()
 * of 1000 items, a million steps), so that one input cannot spend seconds and
 * gigabytes inside the documented limits.
 *
 * Input: the template's source, a NUL, then a JSON object as the context. Without a
 * NUL, or when the rest is not a JSON object, the context is a fixed conversation
 * (system, user, an assistant turn with reasoning and a tool call, a tool result,
 * tools, add_generation_prompt), so that mutations of the source still meet the data
 * real templates read.
 *
 * Invariants beside the sanitizers':
 *   - compile returns 0, RT_ESYNTAX or RT_ELIMIT; render 0, RT_ERENDER, RT_ERAISED,
 *     RT_ELIMIT or BL_ENOTSUP (a known Jinja filter or test this engine lacks);
 *     never another code, and never a crash;
 *   - a failure fills err with the code returned and a message that names the
 *     template line ("template line L:C: ...");
 *   - a render's output is NUL-terminated at out_len and within the output limit;
 *   - rendering again gives the same bytes (unless the template reads the clock).
 * Seeds: tests/fuzz/corpus/fuzz_template/. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what, const bl_err_t *err)
{
    if (!ok) {
        fprintf(stderr, "fuzz_template: %s\n", what);
        if (err)
            fprintf(stderr, "code %d: %s\n", err->code, err->msg);
        abort();
    }
}

static const char default_context[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are terse.\"},"
    "{\"role\": \"user\", \"content\": \"What is the weather in Paris?\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nask the tool\\n</think>\\n\\n\","
    " \"reasoning_content\": \"ask the tool\", \"tool_calls\": [{\"id\": \"call_1\","
    " \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"Paris\"}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"18 C, sunny\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Thanks\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"description\": \"Weather now\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false,"
    " \"bos_token\": \"<|endoftext|>\", \"eos_token\": \"<|im_end|>\"}";

static json_t *g_default;

static int names_line(const bl_err_t *err)
{
    return !strncmp(err->msg, "template line ", 14);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_default) {
        json_error_t je;
        g_default = json_loads(default_context, 0, &je);
        check(g_default != NULL, "the default context does not parse", NULL);
    }
    const char *src = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t src_len = nul ? (size_t)(nul - data) : size;
    json_t *ctx = NULL;
    if (nul) {
        json_error_t je;
        ctx = json_loadb((const char *)nul + 1, size - src_len - 1, 0, &je);
        if (ctx && !json_is_object(ctx)) {
            json_decref(ctx);
            ctx = NULL;
        }
    }
    if (!ctx)
        ctx = json_incref(g_default);

    rt_template_t *tpl = NULL;
    bl_err_t err = {0};
    int rc = rt_template_compile(src, src_len, &tpl, &err);
    if (rc) {
        check(rc == RT_ESYNTAX || rc == RT_ELIMIT, "compile returned an undocumented code", &err);
        check(err.code == rc, "the message's code is not the one returned", &err);
        check(names_line(&err), "a compile error does not name the line", &err);
        check(tpl == NULL, "a failed compile left a template", &err);
        json_decref(ctx);
        return 0;
    }
    char *out = NULL;
    size_t len = 0;
    rc = rt_template_render(tpl, ctx, &out, &len, &err);
    if (rc) {
        check(rc == RT_ERENDER || rc == RT_ERAISED || rc == RT_ELIMIT || rc == BL_ENOTSUP,
              "render returned an undocumented code", &err);
        check(err.code == rc, "the message's code is not the one returned", &err);
        check(names_line(&err), "a render error does not name the line", &err);
        check(out == NULL, "a failed render left output", &err);
    } else {
        check(out != NULL && out[len] == '\0', "the output is not NUL-terminated at its length",
              NULL);
        check(len <= RT_TEMPLATE_MAX_OUTPUT, "the output is over the limit", NULL);
        if (!memmem(src, src_len, "strftime_now", 12)) {
            char *again = NULL;
            size_t len2 = 0;
            bl_err_t err2 = {0};
            check(rt_template_render(tpl, ctx, &again, &len2, &err2) == 0 && len2 == len &&
                      !memcmp(out, again, len),
                  "a second render gives other bytes", &err2);
            free(again);
        }
        free(out);
    }
    rt_template_destroy(tpl);
    json_decref(ctx);
    return 0;
}
