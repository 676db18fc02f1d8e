/* libFuzzer target for the chat-message parsing of the OpenAI and Anthropic routes:
 * router/api_gen.c's rt__gen_chat_options and rt__gen_chat_messages (roles, content
 * strings and parts, tool_calls, prefill), router/api_anthropic.c's conversion of
 * system, messages, tool_use, tool_result and tools into those messages, then the
 * render through Qwen3's template and the tokenizing of the prompt (fuzz_app.c), and
 * the forced-call grammar of tool_choice. api_openai.c and api_anthropic.c are
 * included so that their request-side steps (static there) run exactly as the routes
 * run them; the rest of the server is linked.
 *
 * Input: a JSON request body, read as the HTTP layer reads it (NUL allowed in
 * strings; only objects go on). The same body goes through both routes' steps.
 *
 * Invariants beside the sanitizers' (leaks included):
 *   - a refusal is BL_EINVAL, BL_ENOMEM or BL_ERANGE (a prompt too long for a slot)
 *     with a message; a BL_EINVAL one names a field of the request, and the element
 *     it starts with (messages[3], tools[1], system[0]) is one the body has;
 *   - what the Anthropic converter makes is a message list the OpenAI parser takes,
 *     but for llama-server's rule against two assistant messages at the end;
 *   - a forced tool call's grammar compiles, and is refused only for what a tool's
 *     own parameters are refused for (or for a limit on the whole).
 * Seeds: tests/fuzz/corpus/fuzz_chat/. */
#include "api_openai.c"
#include "api_anthropic.c"

#include "fuzz_app.h"
#include "grammar.h"
#include "json_schema.h"
#include "log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what, const bl_err_t *err)
{
    if (!ok) {
        fprintf(stderr, "fuzz_chat: %s\n", what);
        if (err)
            fprintf(stderr, "code %d: %s\n", err->code, err->msg);
        abort();
    }
}

/* The request fields a refusal may name (as 'x', x[...] or in a sentence). */
static const char *const fields[] = {
    "messages", "system", "tools", "tool_choice", "tool_calls", "tool_use", "tool_result",
    "parallel_tool_calls", "functions", "function_call", "reasoning_format",
    "reasoning_effort", "chat_template_kwargs", "enable_thinking", "add_generation_prompt",
    "thinking", "content", "role", "name", "tool_call_id", "reasoning_content", "text",
    "type", "input", "id", "tool_use_id", "function", "parameters", "description",
    "input_schema",
};

/* A refusal that starts with a path into one of the body's top-level arrays
 * ("messages[3]: ...", "tools[1].function ...", "system[0] must ...") names an
 * element the body has. Later text may quote the client's own strings, so only the
 * head is read. */
static int indices_exist(const char *msg, const json_t *body)
{
    static const char *const arrays[] = {"messages", "tools", "system"};
    for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++) {
        size_t kl = strlen(arrays[a]);
        if (strncmp(msg, arrays[a], kl) || msg[kl] != '[' || msg[kl + 1] < '0' || msg[kl + 1] > '9')
            continue;
        char *e;
        unsigned long i = strtoul(msg + kl + 1, &e, 10);
        return *e == ']' && i < json_array_size(json_object_get(body, arrays[a]));
    }
    return 1;
}

static void check_refusal(int rc, const bl_err_t *err, const json_t *body)
{
    /* the routes answer every refusal but BL_ENOMEM as 400; err keeps the code of the
     * step that refused (a template's RT_E*), which only the message reaches */
    check(rc == BL_EINVAL || rc == BL_ENOMEM || rc == BL_ERANGE, "a refusal with another code",
          err);
    check(err->msg[0] != '\0', "a refusal without a message", err);
    /* a prompt too long for a slot is the context's refusal (exceed_context_size) */
    if (rc == BL_ERANGE)
        return;
    /* a template's own refusal (raise_exception) is the request's, named by the
     * template; the tokenizer's names the prompt */
    if (!strncmp(err->msg, "chat template: ", 15) || !strncmp(err->msg, "tokenizing the prompt", 21))
        return;
    int named = 0;
    for (size_t i = 0; i < sizeof fields / sizeof *fields && !named; i++)
        named = strstr(err->msg, fields[i]) != NULL;
    check(named, "a refusal names no field", err);
    check(indices_exist(err->msg, body), "a refusal names an element the body lacks", err);
}

static void check_grammar(const rt_gen_params_t *p)
{
    rt_grammar_t *g = NULL;
    bl_err_t err = {0};
    if (p->grammar && rt_grammar_parse(&g, p->grammar, strlen(p->grammar), &err) != 0) {
        fprintf(stderr, "%s\n", p->grammar);
        check(0, "a forced call's grammar does not compile", &err);
    }
    rt_grammar_destroy(g);
}

/* A forced call's grammar holds the tools' parameters side by side: when each one
 * converts alone, the forced call must convert too, unless it passes a limit on the
 * whole (depth, size, schemas walked). tools: OpenAI's form; name: the one forced. */
static void check_force_refusal(const json_t *tools, const char *name, const bl_err_t *err)
{
    if (!strstr(err->msg, "json_schema: ") || strstr(err->msg, "nests deeper than") ||
        strstr(err->msg, "expands to more than") || strstr(err->msg, "would be larger than"))
        return;
    size_t i;
    json_t *t;
    int named = !name; /* a forced name no tool has is refused for the name (which may
                        * itself hold "json_schema: "), not for a schema */
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *n = json_string_value(json_object_get(fn, "name"));
        named |= name && n && !strcmp(n, name);
    }
    if (!named)
        return;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *n = json_string_value(json_object_get(fn, "name"));
        json_t *params = json_object_get(fn, "parameters");
        if ((name && n && strcmp(n, name)) || !params || json_is_null(params))
            continue;
        char *g = NULL;
        bl_err_t e2 = {0};
        int rc = rt_json_schema_to_gbnf(params, &g, &e2);
        free(g);
        if (rc)
            return; /* this tool's own parameters are refused: so is the call */
    }
    check(0, "a forced call is refused though every tool's parameters convert alone", err);
}

static rt_app_t g_app;

static void openai(const json_t *body)
{
    rt_tokens_t toks = {0};
    int reasoning = 0, tools = 0, think_open = 0, think_off = 0;
    const char *force = NULL;
    bl_err_t err = {0};
    size_t n_min = 0;
    int rc = chat_prompt(&g_app, body, &toks, &reasoning, &tools, &force, &think_open,
                         &think_off, &n_min, &err);
    if (!rc && force) {
        rt_gen_params_t p;
        memset(&p, 0, sizeof p);
        json_t *pc = json_object_get(body, "parallel_tool_calls");
        rc = rt__gen_force_tools(&p, json_object_get(body, "tools"), *force ? force : NULL,
                                 json_is_false(pc), think_open ? 2 : think_off ? 0 : 1, &err);
        if (!rc)
            check_grammar(&p);
        else
            check_force_refusal(json_object_get(body, "tools"), *force ? force : NULL, &err);
        rt__gen_params_fini(&p);
    }
    if (rc)
        check_refusal(rc, &err, body);
    rt_tokens_free(&toks);
}

static void anthropic(const json_t *body)
{
    rt_tokens_t toks = {0};
    int think_open = 0, prefilled = 0, tools = 0, one_call = 0, think_off = 0;
    const char *force = NULL;
    bl_err_t err = {0};
    size_t n_min = 0;
    int rc = anthropic_prompt(&g_app, body, &toks, &think_open, &prefilled, &tools, &one_call,
                              &force, &think_off, &n_min, &err);
    if (!rc && force) {
        json_t *list = NULL;
        rt_gen_params_t p;
        memset(&p, 0, sizeof p);
        if (!(rc = convert_tools(json_object_get(body, "tools"), &list, &err)))
            rc = rt__gen_force_tools(&p, list, *force ? force : NULL, one_call,
                                     think_open ? 2 : think_off ? 0 : 1, &err);
        if (!rc)
            check_grammar(&p);
        else if (list)
            check_force_refusal(list, *force ? force : NULL, &err);
        rt__gen_params_fini(&p);
        json_decref(list);
    }
    if (rc)
        check_refusal(rc, &err, body);
    rt_tokens_free(&toks);

    /* the converter's output on its own: the OpenAI parser must take it */
    json_t *msgs = NULL;
    if (rt__gen_anthropic_messages(body, &msgs, &err) == 0) {
        json_t *out = NULL;
        rt_gen_buf_t prefill = {0};
        rc = rt__gen_chat_messages(msgs, &out, &prefill, &err);
        check(rc == 0 || strstr(err.msg, "2 or more assistant messages at the end"),
              "the Anthropic converter made messages the chat parser refuses", &err);
        json_decref(out);
        rt__gen_buf_free(&prefill);
        json_decref(msgs);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_app.tok) {
        bl_log_init("fuzz_chat", BL_LOG_OFF);
        rt_app_defaults(&g_app);
        g_app.tok = fz_tokenizer();
        g_app.tpl = fz_template();
        g_app.tpl_source = fz_template_source();
        g_app.n_vocab = rt_tokenizer_n_vocab(g_app.tok);
    }
    json_error_t je;
    json_t *body = json_loadb((const char *)data, size, JSON_ALLOW_NUL, &je);
    if (!json_is_object(body)) {
        json_decref(body);
        return 0;
    }
    openai(body);
    anthropic(body);
    json_decref(body);
    return 0;
}
