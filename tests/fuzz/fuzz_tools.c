/* libFuzzer target for the tool-call parsers: the reply-side splitters of
 * router/toolcall.c in every format (rt__gen_tools_feed behind the thought splitter
 * of api_gen.c, as a reply runs through them; rt__gen_harmony_feed for gpt-oss), and
 * the request-side checks of api_tools.c, rt__gen_message_tool_calls and
 * rt__gen_check_tools.
 *
 * Input: a size byte, a mode byte (bit 0: split the thought out first; bit 1: the
 * reply starts inside it; bits 2-5: the format, rt_chatfmt_t modulo their number),
 * then the model's text. The text runs through the splitters twice: whole, and cut
 * into pieces of 1 to 8 bytes as the size byte's bits say, with empty pieces between
 * some. When the text is JSON it also goes to the request-side checks.
 *
 * Invariants beside the sanitizers':
 *   - the reasoning, the text and the calls (name and arguments; ids are random) do
 *     not depend on how the text was cut;
 *   - nothing stays held once the text has ended;
 *   - every call has a non-empty id (one made here is "call_" and 24 letters or
 *     digits, and those of one reply differ), type "function", and string name and
 *     arguments;
 *   - what a stream was shown of a call (its header, then pieces of its arguments)
 *     adds up to the call's arguments (equal as JSON where they are JSON);
 *   - the calls found are accepted back as an assistant message's tool_calls, with
 *     their names and arguments unchanged (a client sends them back next turn);
 *   - rt__gen_message_tool_calls keeps each call's name, writes object arguments as
 *     JSON text that reads back equal, and a refusal names messages[0]; a refusal of
 *     rt__gen_check_tools names 'tools' or the entry.
 * Seeds: tests/fuzz/corpus/fuzz_tools/. */
#include <ctype.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_gen_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_tools: %s\n", what);
        abort();
    }
}

static void check_ok(int rc)
{
    check(rc == 0, "out of memory, or a splitter failed");
}

typedef struct out {
    rt_gen_buf_t reason, text;
    json_t *calls;
    json_t *shown; /* per call index: the arguments' pieces a stream was shown, joined */
} out_t;

static void check_shown(const json_t *calls, const json_t *shown);

/* What the last feed showed of calls not yet whole, into o->shown. */
static void take_events(const rt_gen_tools_t *t, out_t *o)
{
    for (size_t i = 0; i < t->n_ev; i++) {
        const rt_gen_call_ev_t *e = &t->ev[i];
        while (json_array_size(o->shown) <= e->idx)
            check_ok(json_array_append_new(o->shown, json_null()));
        json_t *cur = json_array_get(o->shown, e->idx);
        if (e->kind == RT_CALL_OPEN) {
            check(json_is_null(cur), "a call's header was shown twice");
            check(json_is_string(e->name) && json_string_length(e->name), "a shown call has no name");
            check_ok(json_array_set_new(o->shown, e->idx, json_string("")));
        } else if (e->kind == RT_CALL_ARGS && json_is_false(cur)) {
            continue; /* bytes that are not UTF-8 were shown: not checked further */
        } else if (e->kind == RT_CALL_ARGS) {
            check(json_is_string(cur), "arguments were shown before their call");
            size_t len = json_string_length(cur);
            char *joined = malloc(len + e->args.n + 1);
            check(joined != NULL, "out of memory");
            memcpy(joined, json_string_value(cur), len);
            memcpy(joined + len, e->args.p, e->args.n);
            /* the model's text here is bytes (a reply's is UTF-8 after the detokenizer) */
            json_t *js = json_stringn(joined, len + e->args.n);
            free(joined);
            check_ok(json_array_set_new(o->shown, e->idx, js ? js : json_false()));
        } else {
            check_ok(json_array_set_new(o->shown, e->idx, json_null()));
        }
    }
}

/* One run of the reply path over pieces of text: lens[i] bytes each (0: an empty
 * feed), as deliver_text in api_gen.c feeds them. */
static void run(const char *s, const size_t *lens, size_t n_pieces, int reasoning, int open,
                rt_chatfmt_t fmt, const json_t *tool_list, out_t *o)
{
    rt_gen_think_t think;
    rt_gen_tools_t tools;
    rt__gen_think_init(&think, open, fmt);
    rt__gen_tools_init(&tools, fmt, (json_t *)tool_list);
    memset(o, 0, sizeof *o);
    o->shown = json_array();
    check(o->shown != NULL, "out of memory");
    check_ok(rt__gen_buf_add(&o->reason, "", 0) || rt__gen_buf_add(&o->text, "", 0));
    size_t off = 0;
    for (size_t i = 0; i <= n_pieces; i++) {
        int last = i == n_pieces;
        size_t n = last ? 0 : lens[i];
        rt_gen_buf_t content = {0};
        if (fmt == RT_CHATFMT_GPT_OSS) {
            check_ok(rt__gen_harmony_feed(&tools, s + off, n, last, 1, reasoning ? &o->reason : NULL,
                                          &o->text));
            take_events(&tools, o);
            off += n;
            continue;
        }
        if (reasoning) {
            if (n)
                check_ok(rt__gen_think_feed(&think, s + off, n, &o->reason, &content));
            if (last)
                check_ok(rt__gen_think_finish(&think, &o->reason, &content));
        } else if (n) {
            check_ok(rt__gen_buf_add(&content, s + off, n));
        }
        check_ok(rt__gen_tools_feed(&tools, content.p ? content.p : "", content.n, last, &o->text));
        take_events(&tools, o);
        rt__gen_buf_free(&content);
        off += n;
    }
    check(think.hold.n == 0 || !reasoning, "the <think> splitter holds text after the end");
    check(tools.hold.n == 0 && !tools.in_call, "the tool-call splitter holds text after the end");
    check_shown(tools.calls, o->shown);
    o->calls = tools.calls ? json_incref(tools.calls) : json_array();
    rt__gen_think_fini(&think);
    rt__gen_tools_fini(&tools);
}

static void out_free(out_t *o)
{
    rt__gen_buf_free(&o->reason);
    rt__gen_buf_free(&o->text);
    json_decref(o->calls);
    json_decref(o->shown);
}

static const char *fn_field(const json_t *call, const char *k)
{
    return json_string_value(json_object_get(json_object_get(call, "function"), k));
}

/* A made id: "call_" and 24 letters or digits. */
static int made_id(const char *id)
{
    if (strlen(id) != 29 || strncmp(id, "call_", 5))
        return 0;
    for (size_t k = 5; k < 29; k++)
        if (!isalnum((unsigned char)id[k]))
            return 0;
    return 1;
}

static void check_calls(const json_t *calls, rt_chatfmt_t fmt)
{
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        const char *id = json_string_value(json_object_get(c, "id"));
        check(id && id[0] && strlen(id) < 64, "a call has no id, or one too long");
        /* only kimi-k2 and the mistral formats write their own ids */
        if (fmt != RT_CHATFMT_KIMI_K2 && fmt != RT_CHATFMT_MISTRAL_NEMO &&
            fmt != RT_CHATFMT_MAGISTRAL && fmt != RT_CHATFMT_COMMAND_R7B)
            check(made_id(id), "a call id is not call_ + 24 letters or digits");
        const char *type = json_string_value(json_object_get(c, "type"));
        check(type && !strcmp(type, "function"), "a call's type is not \"function\"");
        check(fn_field(c, "name") && fn_field(c, "name")[0], "a call has no name");
        check(fn_field(c, "arguments") != NULL, "a call has no arguments text");
        for (size_t j = 0; j < i && made_id(id); j++)
            check(strcmp(id, json_string_value(json_object_get(json_array_get(calls, j), "id"))),
                  "two calls of one reply share an id");
    }
}

/* Each call a stream was shown was shown its arguments: the pieces joined are the
 * same JSON (a format's own layout may differ), or the same text. */
static void check_shown(const json_t *calls, const json_t *shown)
{
    for (size_t i = 0; i < json_array_size(calls) && i < json_array_size(shown); i++) {
        const json_t *sh = json_array_get(shown, i);
        if (!json_is_string(sh))
            continue;
        const char *args = fn_field(json_array_get(calls, i), "arguments");
        json_t *a = json_loads(args, 0, NULL);
        json_t *b = json_loads(json_string_value(sh), 0, NULL);
        if ((a || b) && !(a && b && json_equal(a, b)))
            fprintf(stderr, "call %zu args [%s] shown [%s]\n", i, args, json_string_value(sh));
        if (a || b)
            check(a && b && json_equal(a, b), "a call's shown arguments are not its arguments");
        json_decref(a);
        json_decref(b);
    }
}

/* The calls two runs found agree but for their ids. */
static int same_calls(const json_t *a, const json_t *b)
{
    if (json_array_size(a) != json_array_size(b))
        return 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
        if (strcmp(fn_field(x, "name"), fn_field(y, "name")) ||
            strcmp(fn_field(x, "arguments"), fn_field(y, "arguments")))
            return 0;
    }
    return 1;
}

/* A reply's calls go back as an assistant message's tool_calls, unchanged. */
static void check_round_trip(const json_t *calls)
{
    if (json_array_size(calls) == 0)
        return;
    json_t *back = NULL;
    bl_err_t err = {0};
    int rc = rt__gen_message_tool_calls(calls, 0, &back, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    check(rc == 0, "a reply's calls are refused as tool_calls");
    check(same_calls(calls, back), "tool_calls changed a reply's calls");
    json_decref(back);
}

static void check_request_side(const char *s, size_t n)
{
    json_error_t je;
    json_t *j = json_loadb(s, n, JSON_DECODE_ANY, &je);
    if (!j)
        return;
    bl_err_t err = {0};
    json_t *out = NULL;
    if (rt__gen_message_tool_calls(j, 0, &out, &err) == 0) {
        check(json_is_array(j) && json_array_size(out) == json_array_size(j),
              "tool_calls gave another number of calls");
        for (size_t i = 0; i < json_array_size(j); i++) {
            const json_t *in = json_object_get(json_array_get(j, i), "function");
            const json_t *o = json_array_get(out, i);
            check(!strcmp(fn_field(o, "name"), json_string_value(json_object_get(in, "name"))),
                  "tool_calls changed a name");
            const json_t *args = json_object_get(in, "arguments");
            if (json_is_object(args)) {
                json_t *re = json_loads(fn_field(o, "arguments"), 0, NULL);
                check(re && json_equal(re, args), "object arguments do not read back equal");
                json_decref(re);
            }
        }
        json_decref(out);
    } else {
        check(out == NULL, "a refusal of tool_calls left a result");
        check(strstr(err.msg, "messages[0]") != NULL, "a refusal of tool_calls names no message");
    }
    if (rt__gen_check_tools(j, &err) != 0)
        check(strstr(err.msg, "tools") != NULL, "a refusal of tools names no field");
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const uint8_t sizes = data[0], mode = data[1];
    const char *s = (const char *)data + 2;
    const size_t n = size - 2;
    int reasoning = mode & 1, open = (mode >> 1) & 1;
    const rt_chatfmt_t fmt = (rt_chatfmt_t)((mode >> 2) % RT_CHATFMT_N);
    /* a tool whose parameters are typed, for the key/value formats */
    json_t *tool_list = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                                   "\"parameters\": {\"type\": \"object\", \"properties\": "
                                   "{\"s\": {\"type\": \"string\"}, \"n\": {\"type\": "
                                   "\"integer\"}}}}}]", 0, NULL);
    check(tool_list != NULL, "out of memory");

    /* the pieces: 1..8 bytes each, with an empty one before some */
    size_t *lens = malloc(2 * (n + 1) * sizeof *lens), np = 0;
    check(lens != NULL, "out of memory");
    for (size_t off = 0, i = 0; off < n; i++) {
        if ((sizes + i) % 7 == 0)
            lens[np++] = 0;
        size_t k = 1 + ((sizes >> (i % 6)) & 7);
        if (k > n - off)
            k = n - off;
        lens[np++] = k;
        off += k;
    }
    size_t whole = n;

    out_t a, b;
    run(s, &whole, n ? 1 : 0, reasoning, open, fmt, tool_list, &a);
    run(s, lens, np, reasoning, open, fmt, tool_list, &b);
    free(lens);
    json_decref(tool_list);
    check(a.reason.n == b.reason.n && !memcmp(a.reason.p, b.reason.p, a.reason.n),
          "the reasoning depends on the cut");
    check(a.text.n == b.text.n && !memcmp(a.text.p, b.text.p, a.text.n),
          "the text depends on the cut");
    check(same_calls(a.calls, b.calls), "the calls depend on the cut");
    check_calls(a.calls, fmt);
    check_calls(b.calls, fmt);
    check_round_trip(a.calls);
    out_free(&a);
    out_free(&b);

    check_request_side(s, n);
    return 0;
}
