/* Tool calls in the forms chat templates teach their models, split out of a reply
 * as it is generated (one owner for every format; rt_chatfmt_t names them):
 *
 *   hermes        <tool_call>{"name": "f", "arguments": {...}}</tool_call>
 *   qwen3-coder   <tool_call><function=f><parameter=k>v</parameter></function></tool_call>
 *   deepseek-r1   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
 *                 ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
 *   deepseek-v3.1 <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}
 *                 <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
 *   kimi-k2       <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
 *                 <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
 *   glm-4.5       <tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
 *   mistral-nemo  [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "..."}, ...]
 *   magistral     [TOOL_CALLS]f[ARGS]{...}, once per call
 *   llama-3.x     {"name": "f", "parameters": {...}}
 *   command-r7b   <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f",
 *                 "parameters": {...}}]<|END_ACTION|>
 *   gpt-oss       <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>
 *
 * A call section is parsed again from its start each time text arrives (sections
 * are short); the calls it finishes are kept at once, and the one still open shows
 * its name and the arguments so far, so that a stream sends them as they come.
 * Arguments written as key/value text (glm-4.5, qwen3-coder) become a JSON object,
 * each value typed by the tool's parameter schema: text for a string parameter,
 * else JSON when it parses as JSON.
 *
 * Thread: the loop thread. */
#include "api_gen_impl.h"
#include "chatfmt.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* DeepSeek's markers are built of U+FF5C and U+2581 */
#define BAR "\xef\xbd\x9c"  /* U+FF5C */
#define LOW "\xe2\x96\x81"  /* U+2581 */
#define DS_CALLS_BEGIN "<" BAR "tool" LOW "calls" LOW "begin" BAR ">"
#define DS_CALLS_END "<" BAR "tool" LOW "calls" LOW "end" BAR ">"
#define DS_CALL_BEGIN "<" BAR "tool" LOW "call" LOW "begin" BAR ">"
#define DS_CALL_END "<" BAR "tool" LOW "call" LOW "end" BAR ">"
#define DS_SEP "<" BAR "tool" LOW "sep" BAR ">"

/* ---------------------------------------------------------------------------- */
/* the formats                                                                    */
/* ---------------------------------------------------------------------------- */

static const char *const M_HERMES[] = {"<tool_call>", "</tool_call>", "<think>", "</think>", NULL};
static const char *const M_DS[] = {DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END,
                                   DS_SEP, "<think>", "</think>", NULL};
static const char *const M_KIMI[] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                     "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                     "<|tool_call_end|>", "<think>", "</think>", NULL};
static const char *const M_GLM[] = {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                                    "<arg_value>", "</arg_value>", "<think>", "</think>", NULL};
static const char *const M_MISTRAL[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]",
                                        "[/THINK]", NULL};
static const char *const M_LLAMA3[] = {"<|python_tag|>", NULL};
static const char *const M_CMDR[] = {"<|START_ACTION|>", "<|END_ACTION|>", "<|START_RESPONSE|>",
                                     "<|END_RESPONSE|>", "<|START_THINKING|>",
                                     "<|END_THINKING|>", NULL};
static const char *const M_OSS[] = {"<|channel|>", "<|message|>", "<|start|>", "<|end|>",
                                    "<|constrain|>", "<|call|>", "<|return|>", NULL};

/* What begins a call section in text, per format. */
static const char *const O_TOOL_CALL[] = {"<tool_call>", NULL};
static const char *const O_DS[] = {DS_CALLS_BEGIN, NULL};
static const char *const O_KIMI[] = {"<|tool_calls_section_begin|>", NULL};
static const char *const O_MISTRAL[] = {"[TOOL_CALLS]", NULL};
static const char *const O_LLAMA3[] = {"<|python_tag|>", "{", NULL};
static const char *const O_CMDR[] = {"<|START_ACTION|>", NULL};
static const char *const O_NONE[] = {NULL};
/* Markers dropped from the text. */
static const char *const D_CMDR[] = {"<|START_RESPONSE|>", "<|END_RESPONSE|>", NULL};

static const struct fmt_info {
    const char *name;
    const char *const *markers, *const *opens, *const *drops;
    const char *think_open, *think_close;
    const char *think_next; /* NULL: "" */
} k_fmt[RT_CHATFMT_N] = {
    [RT_CHATFMT_HERMES] = {"hermes", M_HERMES, O_TOOL_CALL, O_NONE, "<think>", "</think>"},
    [RT_CHATFMT_QWEN3_CODER] = {"qwen3-coder", M_HERMES, O_TOOL_CALL, O_NONE, "<think>", "</think>"},
    [RT_CHATFMT_DEEPSEEK_R1] = {"deepseek-r1", M_DS, O_DS, O_NONE, "<think>", "</think>"},
    [RT_CHATFMT_DEEPSEEK_V31] = {"deepseek-v3.1", M_DS, O_DS, O_NONE, "<think>", "</think>"},
    [RT_CHATFMT_KIMI_K2] = {"kimi-k2", M_KIMI, O_KIMI, O_NONE, "<think>", "</think>"},
    [RT_CHATFMT_GLM45] = {"glm-4.5", M_GLM, O_TOOL_CALL, O_NONE, "<think>", "</think>"},
    [RT_CHATFMT_MISTRAL_NEMO] = {"mistral-nemo", M_MISTRAL, O_MISTRAL, O_NONE, "[THINK]", "[/THINK]"},
    [RT_CHATFMT_MAGISTRAL] = {"magistral", M_MISTRAL, O_MISTRAL, O_NONE, "[THINK]", "[/THINK]"},
    [RT_CHATFMT_LLAMA3] = {"llama-3.x", M_LLAMA3, O_LLAMA3, O_NONE, "<think>", "</think>"},
    [RT_CHATFMT_COMMAND_R7B] = {"command-r7b", M_CMDR, O_CMDR, D_CMDR, "<|START_THINKING|>",
                                "<|END_THINKING|>"},
    /* harmony's thought is the analysis channel (its replies are split by the
     * channels, rt__gen_harmony_feed; the tags bound the thought and find it open) */
    [RT_CHATFMT_GPT_OSS] = {"gpt-oss", M_OSS, O_NONE, O_NONE, "<|channel|>analysis<|message|>",
                            "<|end|>", "<|start|>assistant"},
};

/* Key/value arguments (glm-4.5, qwen3-coder): the parser's and the forcing
 * grammar's. */
static const rt_kvform_t KV_GLM = {"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", 0};
static const rt_kvform_t KV_QWEN = {"<parameter=", ">", NULL, "</parameter>", 1};

/* The forms that force calls (rt__gen_force_tools). */
static const rt_callform_t k_forms[RT_CHATFMT_N] = {
    [RT_CHATFMT_HERMES] = {" ", " ", "",
                           "<tool_call> { \"name\" : %N , \"arguments\" : %A } </tool_call>", 1, 0,
                           NULL},
    [RT_CHATFMT_QWEN3_CODER] = {" ", " ", "", "<tool_call> <function=%N>%A </function> </tool_call>",
                                0, 0, &KV_QWEN},
    [RT_CHATFMT_DEEPSEEK_R1] = {" " DS_CALLS_BEGIN " ", " ", " " DS_CALLS_END,
                                DS_CALL_BEGIN "function" DS_SEP "%N\n```json %A ``` " DS_CALL_END,
                                0, 0, NULL},
    [RT_CHATFMT_DEEPSEEK_V31] = {" " DS_CALLS_BEGIN " ", " ", " " DS_CALLS_END,
                                 DS_CALL_BEGIN "%N" DS_SEP "%A " DS_CALL_END, 0, 0, NULL},
    [RT_CHATFMT_KIMI_K2] = {" <|tool_calls_section_begin|> ", " ", " <|tool_calls_section_end|>",
                            "<|tool_call_begin|>functions.%N:%I <|tool_call_argument_begin|> %A "
                            "<|tool_call_end|>",
                            0, 0, NULL},
    [RT_CHATFMT_GLM45] = {" ", " ", "", "<tool_call>%N%A </tool_call>", 0, 0, &KV_GLM},
    [RT_CHATFMT_MISTRAL_NEMO] = {" [TOOL_CALLS] [ ", " , ", " ]",
                                 "{ \"name\" : %N , \"arguments\" : %A , \"id\" : \"%9\" }", 1, 0,
                                 NULL},
    [RT_CHATFMT_MAGISTRAL] = {" ", " ", "", "[TOOL_CALLS]%N[ARGS]%A", 0, 0, NULL},
    [RT_CHATFMT_LLAMA3] = {" ", " ", "", "{ \"name\" : %N , \"parameters\" : %A }", 1, 0, NULL},
    [RT_CHATFMT_COMMAND_R7B] = {" <|START_ACTION|> [ ", " , ", " ] <|END_ACTION|>",
                                "{ \"tool_call_id\" : \"%I\" , \"tool_name\" : %N , "
                                "\"parameters\" : %A }",
                                1, 0, NULL},
    /* a harmony message holds one call (the next comes after its result), and its
     * header comes first: a reply that begins otherwise is text; the header's spaces
     * are single ones, as the model writes them */
    [RT_CHATFMT_GPT_OSS] = {"", "", "", "<|channel|>commentary%_to=functions.%N%_<|constrain|>json"
                            "<|message|>%A", 0, 1, NULL},
};

const rt_callform_t *rt_chatfmt_callform(rt_chatfmt_t f)
{
    return &k_forms[(unsigned)f < RT_CHATFMT_N ? f : 0];
}

static int has(const char *s, const char *what) { return strstr(s, what) != NULL; }

rt_chatfmt_t rt_chatfmt_detect(const char *src)
{
    if (!src)
        return RT_CHATFMT_HERMES;
    if (has(src, "<|channel|>"))
        return RT_CHATFMT_GPT_OSS;
    if (has(src, DS_CALLS_BEGIN))
        return has(src, "```json") ? RT_CHATFMT_DEEPSEEK_R1 : RT_CHATFMT_DEEPSEEK_V31;
    if (has(src, "<|tool_calls_section_begin|>"))
        return RT_CHATFMT_KIMI_K2;
    if (has(src, "<arg_key>"))
        return RT_CHATFMT_GLM45;
    if (has(src, "<function=") && has(src, "<parameter="))
        return RT_CHATFMT_QWEN3_CODER;
    if (has(src, "<tool_call>"))
        return RT_CHATFMT_HERMES;
    if (has(src, "[TOOL_CALLS]"))
        return has(src, "[ARGS]") ? RT_CHATFMT_MAGISTRAL : RT_CHATFMT_MISTRAL_NEMO;
    if (has(src, "<|START_ACTION|>"))
        return RT_CHATFMT_COMMAND_R7B;
    if (has(src, "<|start_header_id|>ipython<|end_header_id|>") || has(src, "<|python_tag|>"))
        return RT_CHATFMT_LLAMA3;
    return RT_CHATFMT_HERMES;
}

const char *rt_chatfmt_name(rt_chatfmt_t f)
{
    return (unsigned)f < RT_CHATFMT_N ? k_fmt[f].name : "?";
}

const char *const *rt_chatfmt_markers(rt_chatfmt_t f)
{
    return k_fmt[(unsigned)f < RT_CHATFMT_N ? f : 0].markers;
}

const char *rt_chatfmt_think_next(rt_chatfmt_t f)
{
    const char *n = k_fmt[(unsigned)f < RT_CHATFMT_N ? f : 0].think_next;
    return n ? n : "";
}

void rt_chatfmt_think_tags(rt_chatfmt_t f, const char **open, const char **close)
{
    const struct fmt_info *i = &k_fmt[(unsigned)f < RT_CHATFMT_N ? f : 0];
    *open = i->think_open;
    *close = i->think_close;
}

/* ---------------------------------------------------------------------------- */
/* reading a section                                                              */
/* ---------------------------------------------------------------------------- */

enum { P_OK = 0, P_MORE, P_NO };

typedef struct cur {
    const char *p;
    size_t n, i;
    int fin; /* the text has ended: nothing more will come */
} cur_t;

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static void ws(cur_t *c)
{
    while (c->i < c->n && is_blank(c->p[c->i]))
        c->i++;
}

/* s next: consumed. MORE when the text ends inside it (and more may come). */
static int lit(cur_t *c, const char *s)
{
    size_t m = strlen(s), r = c->n - c->i, k = r < m ? r : m;
    if (memcmp(c->p + c->i, s, k))
        return P_NO;
    if (r < m)
        return c->fin ? P_NO : P_MORE;
    c->i += m;
    return P_OK;
}

/* A closing marker: as lit, but an ended text may lack it (a model that stops at
 * the end of its call). */
static int lit_end(cur_t *c, const char *s)
{
    size_t m = strlen(s), r = c->n - c->i, k = r < m ? r : m;
    if (memcmp(c->p + c->i, s, k))
        return P_NO;
    if (r < m && !c->fin)
        return P_MORE;
    c->i += k;
    return P_OK;
}

/* The text up to marker, [*a, *b); the marker is consumed. An ended text without
 * it: NO, or (to_end) all of it. */
static int until(cur_t *c, const char *marker, int to_end, size_t *a, size_t *b)
{
    size_t m = strlen(marker);
    const char *f = c->n - c->i >= m ? memmem(c->p + c->i, c->n - c->i, marker, m) : NULL;
    *a = c->i;
    if (!f) {
        if (!c->fin)
            return P_MORE;
        if (!to_end)
            return P_NO;
        *b = c->i = c->n;
        return P_OK;
    }
    *b = (size_t)(f - c->p);
    c->i = *b + m;
    return P_OK;
}

/* One JSON value's text, [*a, *b), read only far enough to find its end. */
static int json_span(cur_t *c, size_t *a, size_t *b)
{
    size_t i = c->i;
    if (i >= c->n)
        return c->fin ? P_NO : P_MORE;
    *a = i;
    const char *p = c->p;
    char ch = p[i];
    if (ch == '{' || ch == '[' || ch == '"') {
        int depth = 0, in_str = 0, esc = 0;
        for (; i < c->n; i++) {
            char x = p[i];
            if (in_str) {
                if (esc)
                    esc = 0;
                else if (x == '\\')
                    esc = 1;
                else if (x == '"' && (in_str = 0, depth == 0))
                    break;
            } else if (x == '"') {
                in_str = 1;
            } else if (x == '{' || x == '[') {
                depth++;
            } else if (x == '}' || x == ']') {
                if (--depth == 0)
                    break;
            }
        }
        if (i >= c->n)
            return c->fin ? P_NO : P_MORE;
        *b = c->i = i + 1;
        return P_OK;
    }
    if (ch != '-' && !(ch >= '0' && ch <= '9') && ch != 't' && ch != 'f' && ch != 'n')
        return P_NO;
    while (i < c->n && !is_blank(p[i]) && p[i] != ',' && p[i] != '}' && p[i] != ']' &&
           p[i] != '<' && p[i] != '[')
        i++;
    if (i >= c->n && !c->fin)
        return P_MORE;
    *b = c->i = i;
    return P_OK;
}

/* How much of s[0..n) is whole UTF-8 (a character cut at the end is held back). */
static size_t utf8_whole(const char *s, size_t n)
{
    size_t k = n, back = 0;
    while (k > 0 && back < 4 && ((unsigned char)s[k - 1] & 0xC0) == 0x80)
        k--, back++;
    if (k == 0)
        return n;
    unsigned char lead = (unsigned char)s[k - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return need > back + 1 ? k - 1 : n;
}

/* ---------------------------------------------------------------------------- */
/* what a parse finds                                                             */
/* ---------------------------------------------------------------------------- */

typedef struct pcall {
    json_t *name;
    char id[64];
    char *args;   /* the reply's arguments text */
    char *stream; /* what a stream's pieces add up to (raw JSON as written), or NULL: args */
} pcall_t;

typedef struct px {
    const rt_gen_tools_t *t;
    size_t skip;        /* calls already kept: counted, not built again */
    pcall_t *calls;     /* calls[skip..n_calls) */
    size_t n_calls, cap;
    size_t end_ok;      /* where the last whole call ends */
    int oom;
    /* the call the text ends inside, when its name is known */
    json_t *open_name;
    char open_id[64];
    const char *open_raw; /* its arguments so far as written (JSON formats), or NULL */
    size_t open_raw_len;
    rt_gen_buf_t built;   /* key/value formats: the object so far, "{...", no closing */
    int built_open;
} px_t;

static void px_free(px_t *x)
{
    for (size_t i = x->skip; i < x->n_calls; i++) {
        json_decref(x->calls[i - x->skip].name);
        free(x->calls[i - x->skip].args);
        free(x->calls[i - x->skip].stream);
    }
    free(x->calls);
    json_decref(x->open_name);
    rt__gen_buf_free(&x->built);
}

/* Whether call n is one already kept (only counted). */
static int px_known(px_t *x) { return x->n_calls < x->skip; }

/* Adds a whole call: name (stolen), args (stolen), stream (stolen, may be NULL). */
static int px_add(px_t *x, json_t *name, const char *id, char *args, char *stream)
{
    if (px_known(x)) {
        x->n_calls++;
        json_decref(name);
        free(args);
        free(stream);
        return 0;
    }
    size_t k = x->n_calls - x->skip;
    pcall_t *grown = NULL;
    if (name && args && k == x->cap)
        grown = realloc(x->calls, (x->cap ? x->cap * 2 : 4) * sizeof *grown);
    if (!name || !args || (k == x->cap && !grown)) {
        json_decref(name);
        free(args);
        free(stream);
        x->oom = 1;
        return P_NO;
    }
    if (grown) {
        x->calls = grown;
        x->cap = x->cap ? x->cap * 2 : 4;
    }
    pcall_t *c = &x->calls[k];
    c->name = name;
    snprintf(c->id, sizeof c->id, "%s", id ? id : "");
    c->args = args;
    c->stream = stream;
    x->n_calls++;
    return 0;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* A function's name as the model wrote it: some text without control characters
 * (NUL among them) and not too long. */
static int name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 256)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20)
            return 0;
    return 1;
}

/* A whole call whose arguments are JSON text [a, b) (an object, or a string that
 * holds one): NO when they are not. */
static int px_add_json(px_t *x, const char *name, size_t name_len, const char *id,
                       const char *args, size_t args_len)
{
    if (px_known(x))
        return px_add(x, NULL, NULL, NULL, NULL);
    if (memchr(args, '\0', args_len)) /* JSON has no raw NUL, though a loader may stop there */
        return P_NO;
    json_error_t e;
    json_t *v = args_len ? json_loadb(args, args_len, JSON_DECODE_ANY, &e) : json_object();
    char *text = NULL;
    if (json_is_object(v))
        text = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    else if (json_is_string(v))
        text = strdup(json_string_value(v));
    int bad = !v || (!json_is_object(v) && !json_is_string(v));
    json_decref(v);
    if (bad)
        return P_NO;
    json_t *n = name_ok(name, name_len) ? json_stringn(name, name_len) : NULL; /* not UTF-8: none */
    if (!n || !json_string_length(n) || !text) {
        json_decref(n);
        free(text);
        if (!text)
            x->oom = 1;
        return P_NO;
    }
    return px_add(x, n, id, text, dup_n(args, args_len));
}

/* The call the text ends inside: its name (0), or -1 when it is no usable name. */
static int px_open_name(px_t *x, const char *name, size_t name_len, const char *id)
{
    json_t *n = name_ok(name, name_len) ? json_stringn(name, name_len) : NULL;
    if (!n || !json_string_length(n)) {
        json_decref(n);
        return -1;
    }
    json_decref(x->open_name);
    x->open_name = n;
    snprintf(x->open_id, sizeof x->open_id, "%s", id ? id : "");
    return 0;
}

/* ... and its arguments so far as written. */
static void px_open_raw(px_t *x, const char *name, size_t name_len, const char *id,
                        const char *args, size_t args_len)
{
    if (px_open_name(x, name, name_len, id))
        return;
    x->open_raw = args;
    x->open_raw_len = args ? args_len : 0;
}

/* ---------------------------------------------------------------------------- */
/* calls written as one JSON object                                               */
/* ---------------------------------------------------------------------------- */

/* The keys of a call object: the name's, the arguments', the id's (or NULL). */
typedef struct jkeys {
    const char *name, *args, *alt_args, *id;
} jkeys_t;

static const jkeys_t K_HERMES = {"name", "arguments", "parameters", NULL};
static const jkeys_t K_NEMO = {"name", "arguments", NULL, "id"};
static const jkeys_t K_LLAMA3 = {"name", "parameters", "arguments", NULL};
static const jkeys_t K_CMDR = {"tool_name", "parameters", NULL, "tool_call_id"};

static int key_is(const char *p, size_t a, size_t b, const char *key)
{
    size_t m = key ? strlen(key) : 0;
    return key && b - a == m + 2 && !memcmp(p + a + 1, key, m);
}

/* The members of a call object [from, ...): the name and id (JSON string texts)
 * and where the arguments' value begins and ends. Reads as far as the text goes. */
typedef struct jmembers {
    size_t name_a, name_b, id_a, id_b, args_a, args_b;
    int has_name, has_id, has_args, args_whole;
} jmembers_t;

static void read_members(const char *p, size_t n, size_t from, int fin, const jkeys_t *k,
                         jmembers_t *m)
{
    memset(m, 0, sizeof *m);
    cur_t c = {p, n, from, fin};
    ws(&c);
    if (lit(&c, "{") != P_OK)
        return;
    for (;;) {
        ws(&c);
        size_t ka, kb;
        if (c.i >= n || p[c.i] != '"' || json_span(&c, &ka, &kb) != P_OK)
            return;
        ws(&c);
        if (lit(&c, ":") != P_OK)
            return;
        ws(&c);
        size_t va, vb;
        int is_args = key_is(p, ka, kb, k->args) || key_is(p, ka, kb, k->alt_args);
        if (is_args && !m->has_args) {
            m->has_args = 1;
            m->args_a = c.i;
        }
        int r = json_span(&c, &va, &vb);
        if (r != P_OK)
            return;
        if (is_args && m->args_a == va && !m->args_whole) {
            m->args_b = vb;
            m->args_whole = 1;
        } else if (key_is(p, ka, kb, k->name) && p[va] == '"') {
            m->has_name = 1, m->name_a = va, m->name_b = vb;
        } else if (key_is(p, ka, kb, k->id) && p[va] == '"') {
            m->has_id = 1, m->id_a = va, m->id_b = vb;
        }
        ws(&c);
        if (c.i >= n || p[c.i] != ',')
            return;
        c.i++;
    }
}

/* A JSON string's text as a C string in out (cut to cap). 0, or -1 when not one. */
static int json_text(const char *p, size_t a, size_t b, char *out, size_t cap)
{
    json_error_t e;
    json_t *s = json_loadb(p + a, b - a, JSON_DECODE_ANY, &e);
    if (!json_is_string(s)) {
        json_decref(s);
        return -1;
    }
    snprintf(out, cap, "%s", json_string_value(s));
    json_decref(s);
    return 0;
}

/* One call object at c: whole (added), or open (its header shown). */
static int json_call(cur_t *c, px_t *x, const jkeys_t *k)
{
    size_t a, b, from = c->i;
    int r = json_span(c, &a, &b);
    if (r == P_NO || (r == P_OK && c->p[a] != '{'))
        return P_NO;
    jmembers_t m;
    read_members(c->p, r == P_OK ? b : c->n, from, c->fin, k, &m);
    char name[256], id[64] = "";
    if (m.has_id && json_text(c->p, m.id_a, m.id_b, id, sizeof id))
        id[0] = '\0';
    if (r == P_MORE) {
        if (m.has_name && m.has_args && c->p[m.args_a] == '{' &&
            !json_text(c->p, m.name_a, m.name_b, name, sizeof name)) {
            size_t end = m.args_whole ? m.args_b : c->n;
            px_open_raw(x, name, strlen(name), id[0] ? id : NULL, c->p + m.args_a,
                        utf8_whole(c->p + m.args_a, end - m.args_a));
        }
        return P_MORE;
    }
    if (!m.has_name || json_text(c->p, m.name_a, m.name_b, name, sizeof name))
        return P_NO;
    return px_add_json(x, name, strlen(name), id[0] ? id : NULL,
                       m.has_args ? c->p + m.args_a : "", m.has_args ? m.args_b - m.args_a : 0);
}

/* ---------------------------------------------------------------------------- */
/* calls written as key/value text                                                */
/* ---------------------------------------------------------------------------- */

/* The schema type of parameter key of tool name in the request's tools (OpenAI's
 * form or Anthropic's), or NULL. */
static const char *param_type(const json_t *tools, const char *name, const char *key)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        json_t *n = json_object_get(fn ? fn : t, "name");
        if (!json_is_string(n) || strcmp(json_string_value(n), name))
            continue;
        json_t *params = fn ? json_object_get(fn, "parameters") : json_object_get(t, "input_schema");
        json_t *ty = json_object_get(json_object_get(json_object_get(params, "properties"), key),
                                     "type");
        return json_string_value(ty);
    }
    return NULL;
}

/* Appends "key":value to the object being built: the value as text for a string
 * parameter, else as JSON when it is JSON. */
static int built_pair(px_t *x, const char *fname, const char *p, size_t ka, size_t kb,
                      size_t va, size_t vb)
{
    rt_gen_buf_t *o = &x->built;
    json_t *key = json_stringn(p + ka, kb - ka);
    if (!key) /* not UTF-8: not a call */
        return P_NO;
    char *kname = strdup(json_string_value(key));
    const char *type = kname ? param_type(x->t->tools, fname, kname) : NULL;
    json_t *v = NULL;
    if (!type || strcmp(type, "string")) {
        json_error_t e;
        v = json_loadb(p + va, vb - va, JSON_DECODE_ANY, &e);
    }
    if (!v && !(v = json_stringn(p + va, vb - va))) {
        json_decref(key);
        free(kname);
        return P_NO;
    }
    char *kt = json_dumps(key, JSON_ENCODE_ANY);
    char *vt = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    int rc = !kt || !vt || rt__gen_buf_add(o, o->n > 1 ? "," : "", o->n > 1) ||
             rt__gen_buf_add(o, kt, strlen(kt)) || rt__gen_buf_add(o, ":", 1) ||
             rt__gen_buf_add(o, vt, strlen(vt));
    json_decref(key);
    json_decref(v);
    free(kname);
    free(kt);
    free(vt);
    if (rc)
        x->oom = 1;
    return rc ? P_NO : P_OK;
}

static int built_begin(px_t *x)
{
    rt__gen_buf_free(&x->built);
    x->built_open = 0;
    if (rt__gen_buf_add(&x->built, "{", 1)) {
        x->oom = 1;
        return P_NO;
    }
    return P_OK;
}

/* The call whose pairs are all read: whole. */
static int built_end(px_t *x, const char *name, size_t name_len)
{
    if (px_known(x)) {
        rt__gen_buf_free(&x->built);
        return px_add(x, NULL, NULL, NULL, NULL);
    }
    if (rt__gen_buf_add(&x->built, "}", 1)) {
        x->oom = 1;
        return P_NO;
    }
    json_t *n = name_ok(name, name_len) ? json_stringn(name, name_len) : NULL;
    char *args = x->built.p;
    x->built.p = NULL;
    rt__gen_buf_free(&x->built);
    if (!n || !json_string_length(n)) {
        json_decref(n);
        free(args);
        return P_NO;
    }
    return px_add(x, n, NULL, args, NULL);
}

/* The call the text ends inside, its pairs so far. */
static void built_open(px_t *x, const char *name, size_t name_len)
{
    if (px_open_name(x, name, name_len, NULL) == 0)
        x->built_open = 1;
}

static void trim(const char *p, size_t *a, size_t *b)
{
    while (*a < *b && is_blank(p[*a]))
        (*a)++;
    while (*b > *a && is_blank(p[*b - 1]))
        (*b)--;
}

/* The pairs of the call named name at c, to the first thing that is not a pair (OK);
 * on MORE the call is shown open with the pairs so far. */
static int kv_pairs(cur_t *c, px_t *x, const char *name, const rt_kvform_t *f)
{
    if (built_begin(x))
        return P_NO;
    for (;;) {
        ws(c);
        int r = lit(c, f->key_open);
        if (r == P_NO)
            return P_OK;
        size_t ka, kb, va, vb;
        if (r == P_MORE || (r = until(c, f->key_close, 0, &ka, &kb)) ||
            (f->val_open && (ws(c), r = lit(c, f->val_open))) ||
            (r = until(c, f->val_close, 0, &va, &vb))) {
            if (r == P_MORE)
                built_open(x, name, strlen(name));
            return r;
        }
        trim(c->p, &ka, &kb);
        if (f->strip_nl && va < vb && c->p[va] == '\n')
            va++;
        if (f->strip_nl && vb > va && c->p[vb - 1] == '\n')
            vb--;
        if (built_pair(x, name, c->p, ka, kb, va, vb))
            return P_NO;
    }
}

/* After the pairs: r, the closing markers' result; the call whole on OK. */
static int kv_done(cur_t *c, px_t *x, const char *name, int r)
{
    if (r == P_MORE)
        built_open(x, name, strlen(name));
    if (r)
        return r;
    if (built_end(x, name, strlen(name)))
        return P_NO;
    x->end_ok = c->i;
    return P_OK;
}

/* A function's name [na, nb) as a C string in name (256 bytes); NO when it is empty
 * or long. */
static int kv_name(const cur_t *c, size_t na, size_t nb, char *name)
{
    trim(c->p, &na, &nb);
    if (na == nb || nb - na > 200 || memchr(c->p + na, '<', nb - na))
        return P_NO;
    snprintf(name, 256, "%.*s", (int)(nb - na), c->p + na);
    return P_OK;
}

/* glm-4.5: <tool_call>NAME (<arg_key>K</arg_key> <arg_value>V</arg_value>)* </tool_call> */
static int parse_glm(cur_t *c, px_t *x)
{
    int r;
    if ((r = lit(c, "<tool_call>")))
        return r;
    size_t na = c->i, nb = na;
    while (nb < c->n && c->p[nb] != '\n' && c->p[nb] != '<')
        nb++;
    if (nb == c->n && !c->fin)
        return P_MORE;
    c->i = nb;
    char name[256];
    if (kv_name(c, na, nb, name) || (r = kv_pairs(c, x, name, &KV_GLM)))
        return r ? r : P_NO;
    return kv_done(c, x, name, lit_end(c, "</tool_call>"));
}

/* qwen3-coder: <tool_call> <function=NAME> (<parameter=K> V </parameter>)* </function>
 * </tool_call> */
static int parse_qwen3_coder(cur_t *c, px_t *x)
{
    int r;
    size_t na, nb;
    char name[256];
    if ((r = lit(c, "<tool_call>")) || (ws(c), r = lit(c, "<function=")) ||
        (r = until(c, ">", 0, &na, &nb)))
        return r;
    if (kv_name(c, na, nb, name) || (r = kv_pairs(c, x, name, &KV_QWEN)))
        return r ? r : P_NO;
    if (!(r = lit(c, "</function>")))
        r = (ws(c), lit_end(c, "</tool_call>"));
    return kv_done(c, x, name, r);
}

/* ---------------------------------------------------------------------------- */
/* the sections of each format                                                    */
/* ---------------------------------------------------------------------------- */

/* Arguments as JSON at c, of the call named [na, nb): whole, or open. */
static int json_args(cur_t *c, px_t *x, size_t na, size_t nb, const char *id)
{
    size_t a, b;
    int r = json_span(c, &a, &b);
    if (r == P_MORE && c->i < c->n && c->p[c->i] == '{')
        px_open_raw(x, c->p + na, nb - na, id, c->p + c->i, utf8_whole(c->p + c->i, c->n - c->i));
    if (r)
        return r;
    if (c->p[a] != '{')
        return P_NO;
    if (px_known(x)) /* json_args_done counts it */
        return P_OK;
    /* the arguments are whole but the call may not be: keep them shown */
    px_open_raw(x, c->p + na, nb - na, id, c->p + a, b - a);
    return P_OK;
}

/* The call json_args read is whole. */
static int json_args_done(px_t *x, const char *p, size_t na, size_t nb, const char *id)
{
    if (px_known(x))
        return px_add(x, NULL, NULL, NULL, NULL);
    const char *args = x->open_raw;
    size_t len = x->open_raw_len;
    if (!x->open_name || !args) /* json_args found no usable name */
        return P_NO;
    json_decref(x->open_name);
    x->open_name = NULL;
    x->open_raw = NULL;
    return px_add_json(x, p + na, nb - na, id, args, len);
}

static int parse_hermes(cur_t *c, px_t *x)
{
    int r;
    if ((r = lit(c, "<tool_call>")) || (ws(c), r = json_call(c, x, &K_HERMES)))
        return r;
    x->end_ok = c->i;
    ws(c);
    return lit_end(c, "</tool_call>");
}

static int parse_deepseek(cur_t *c, px_t *x, int r1)
{
    int r = lit(c, DS_CALLS_BEGIN);
    if (r)
        return r;
    for (;;) {
        ws(c);
        if ((r = lit_end(c, DS_CALLS_END)) != P_NO)
            return r;
        size_t ta, tb, na, nb;
        if ((r = lit(c, DS_CALL_BEGIN)))
            return r;
        if (r1) { /* function<sep>NAME\n```json\n{...}\n``` */
            if ((r = until(c, DS_SEP, 0, &ta, &tb)) || (r = until(c, "\n", 0, &na, &nb)))
                return r;
            trim(c->p, &na, &nb);
            if ((r = lit(c, "```json")))
                return r;
            ws(c);
        } else if ((r = until(c, DS_SEP, 0, &na, &nb))) {
            return r;
        } else {
            trim(c->p, &na, &nb);
        }
        if (na == nb || nb - na > 200)
            return P_NO;
        if ((r = json_args(c, x, na, nb, NULL)))
            return r;
        ws(c);
        if (r1 && (r = lit(c, "```")))
            return r;
        ws(c);
        if ((r = lit_end(c, DS_CALL_END)))
            return r;
        if (json_args_done(x, c->p, na, nb, NULL))
            return P_NO;
        x->end_ok = c->i;
    }
}

static int parse_kimi(cur_t *c, px_t *x)
{
    int r = lit(c, "<|tool_calls_section_begin|>");
    if (r)
        return r;
    for (;;) {
        ws(c);
        if ((r = lit_end(c, "<|tool_calls_section_end|>")) != P_NO)
            return r;
        size_t ia, ib;
        if ((r = lit(c, "<|tool_call_begin|>")) ||
            (r = until(c, "<|tool_call_argument_begin|>", 0, &ia, &ib)))
            return r;
        trim(c->p, &ia, &ib);
        /* functions.NAME:INDEX; the whole is the call's id */
        size_t na = ia, nb = ib;
        if (nb - na > 10 && !memcmp(c->p + na, "functions.", 10))
            na += 10;
        const char *colon = memrchr(c->p + na, ':', nb - na);
        if (colon)
            nb = (size_t)(colon - c->p);
        if (na == nb || ib - ia >= 64)
            return P_NO;
        char id[64];
        snprintf(id, sizeof id, "%.*s", (int)(ib - ia), c->p + ia);
        ws(c);
        if ((r = json_args(c, x, na, nb, id)))
            return r;
        ws(c);
        if ((r = lit_end(c, "<|tool_call_end|>")))
            return r;
        if (json_args_done(x, c->p, na, nb, id))
            return P_NO;
        x->end_ok = c->i;
    }
}

/* [call, call, ...] of call objects with keys k; an ended text may lack the ]. */
static int json_call_list(cur_t *c, px_t *x, const jkeys_t *k)
{
    int r = lit(c, "[");
    if (r)
        return r;
    for (;;) {
        ws(c);
        if ((r = json_call(c, x, k)))
            return r;
        x->end_ok = c->i;
        ws(c);
        if ((r = lit(c, ",")) == P_NO)
            return lit_end(c, "]");
        if (r)
            return r;
    }
}

/* [TOOL_CALLS] then a JSON array of call objects (mistral-nemo), or NAME[ARGS]{...}
 * (magistral; a [CALL_ID]id may come between). */
static int parse_mistral(cur_t *c, px_t *x, int nemo)
{
    int r = lit(c, "[TOOL_CALLS]");
    if (r)
        return r;
    ws(c);
    if (!nemo) {
        size_t na, nb, ia = 0, ib = 0;
        if ((r = until(c, "[ARGS]", 0, &na, &nb)))
            return r;
        const char *cid = memmem(c->p + na, nb - na, "[CALL_ID]", 9);
        if (cid) {
            ia = (size_t)(cid - c->p) + 9, ib = nb;
            nb = (size_t)(cid - c->p);
        }
        trim(c->p, &na, &nb);
        trim(c->p, &ia, &ib);
        if (na == nb || nb - na > 200 || ib - ia >= 64 || memchr(c->p + na, '[', nb - na))
            return P_NO;
        char id[64];
        snprintf(id, sizeof id, "%.*s", (int)(ib - ia), c->p + ia);
        if ((r = json_args(c, x, na, nb, id[0] ? id : NULL)))
            return r;
        if (json_args_done(x, c->p, na, nb, id[0] ? id : NULL))
            return P_NO;
        x->end_ok = c->i;
        return P_OK;
    }
    return json_call_list(c, x, &K_NEMO);
}

/* {"name": ..., "parameters": {...}} as the reply, or after <|python_tag|>. A
 * brace that does not begin such an object is text, decided at its first key. */
static int parse_llama3(cur_t *c, px_t *x)
{
    if (lit(c, "<|python_tag|>") == P_OK)
        ws(c);
    size_t at = c->i;
    int r = lit(c, "{");
    if (r)
        return r;
    ws(c);
    cur_t k1 = *c, k2 = *c;
    int r1 = lit(&k1, "\"name\""), r2 = lit(&k2, "\"type\"");
    if (r1 == P_NO && r2 == P_NO)
        return P_NO;
    if (r1 == P_MORE || r2 == P_MORE)
        return P_MORE;
    c->i = at;
    r = json_call(c, x, &K_LLAMA3);
    if (!r)
        x->end_ok = c->i;
    return r;
}

static int parse_cmdr(cur_t *c, px_t *x)
{
    int r;
    if ((r = lit(c, "<|START_ACTION|>")) || (ws(c), r = json_call_list(c, x, &K_CMDR)))
        return r;
    ws(c);
    return lit_end(c, "<|END_ACTION|>");
}

static int parse_section(cur_t *c, px_t *x)
{
    switch (x->t->fmt) {
    case RT_CHATFMT_QWEN3_CODER:
        return parse_qwen3_coder(c, x);
    case RT_CHATFMT_DEEPSEEK_R1:
    case RT_CHATFMT_DEEPSEEK_V31:
        return parse_deepseek(c, x, x->t->fmt == RT_CHATFMT_DEEPSEEK_R1);
    case RT_CHATFMT_KIMI_K2:
        return parse_kimi(c, x);
    case RT_CHATFMT_GLM45:
        return parse_glm(c, x);
    case RT_CHATFMT_MISTRAL_NEMO:
    case RT_CHATFMT_MAGISTRAL:
        return parse_mistral(c, x, x->t->fmt == RT_CHATFMT_MISTRAL_NEMO);
    case RT_CHATFMT_LLAMA3:
        return parse_llama3(c, x);
    case RT_CHATFMT_COMMAND_R7B:
        return parse_cmdr(c, x);
    default:
        return parse_hermes(c, x);
    }
}

/* ---------------------------------------------------------------------------- */
/* the splitter                                                                   */
/* ---------------------------------------------------------------------------- */

void rt__gen_tools_init(rt_gen_tools_t *t, rt_chatfmt_t fmt, json_t *tools)
{
    memset(t, 0, sizeof *t);
    t->fmt = (unsigned)fmt < RT_CHATFMT_N ? fmt : RT_CHATFMT_HERMES;
    t->tools = json_incref(tools);
}

static void events_clear(rt_gen_tools_t *t)
{
    for (size_t i = 0; i < t->n_ev; i++) {
        json_decref(t->ev[i].name);
        rt__gen_buf_free(&t->ev[i].args);
    }
    t->n_ev = 0;
}

void rt__gen_tools_fini(rt_gen_tools_t *t)
{
    events_clear(t);
    free(t->ev);
    rt__gen_buf_free(&t->hold);
    rt__gen_buf_free(&t->h_args);
    json_decref(t->h_name);
    json_decref(t->calls);
    json_decref(t->tools);
    memset(t, 0, sizeof *t);
}

/* "call_" and 24 random letters and digits, as OpenAI's ids look. */
static void call_id(char out[64])
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[24];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        static unsigned seq;
        for (size_t i = 0; i < sizeof r; i++)
            r[i] = (unsigned char)(++seq * 2654435761u >> 24);
    }
    memcpy(out, "call_", 5);
    for (size_t i = 0; i < sizeof r; i++)
        out[5 + i] = abc[r[i] % (sizeof abc - 1)];
    out[29] = '\0';
}

/* Whether an id the model wrote is UTF-8 (else one is made). */
static int utf8_ok(const char *s)
{
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

static rt_gen_call_ev_t *call_event(rt_gen_tools_t *t, int kind)
{
    size_t idx = json_array_size(t->calls);
    if (kind == RT_CALL_ARGS && t->n_ev && t->ev[t->n_ev - 1].kind == kind &&
        t->ev[t->n_ev - 1].idx == idx)
        return &t->ev[t->n_ev - 1];
    if (t->n_ev == t->cap_ev) {
        size_t cap = t->cap_ev ? t->cap_ev * 2 : 4;
        rt_gen_call_ev_t *e = realloc(t->ev, cap * sizeof *e);
        if (!e)
            return NULL;
        t->ev = e;
        t->cap_ev = cap;
    }
    rt_gen_call_ev_t *e = &t->ev[t->n_ev++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->idx = idx;
    return e;
}

/* The open call's arguments text grew to s[0..n): the new bytes shown. */
static int show_args(rt_gen_tools_t *t, const char *s, size_t n)
{
    if (n <= t->args_sent)
        return 0;
    rt_gen_call_ev_t *e = call_event(t, RT_CALL_ARGS);
    if (!e || rt__gen_buf_add(&e->args, s + t->args_sent, n - t->args_sent))
        return BL_ENOMEM;
    t->args_sent = n;
    return 0;
}

static int show_open(rt_gen_tools_t *t, json_t *name, const char *id)
{
    rt_gen_call_ev_t *e = call_event(t, RT_CALL_OPEN);
    if (!e)
        return BL_ENOMEM;
    t->open = 1;
    t->args_sent = 0;
    if (id && id[0] && utf8_ok(id))
        snprintf(t->open_id, sizeof t->open_id, "%s", id);
    else
        call_id(t->open_id);
    snprintf(e->id, sizeof e->id, "%s", t->open_id);
    e->name = json_incref(name);
    return 0;
}

static int show_drop(rt_gen_tools_t *t)
{
    if (!t->open)
        return 0;
    t->open = 0;
    rt_gen_call_ev_t *e = call_event(t, RT_CALL_DROP);
    return e ? 0 : BL_ENOMEM;
}

/* Keeps a whole call (the open one's id when it was shown, its last pieces too). */
static int keep_call(rt_gen_tools_t *t, pcall_t *c)
{
    char id[64];
    if (t->open) {
        const char *s = c->stream ? c->stream : c->args;
        if (show_args(t, s, strlen(s)))
            return BL_ENOMEM;
        snprintf(id, sizeof id, "%s", t->open_id);
        t->open = 0;
    } else if (c->id[0] && utf8_ok(c->id)) {
        snprintf(id, sizeof id, "%s", c->id);
    } else {
        call_id(id);
    }
    json_t *call = json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
                             "name", c->name, "arguments", c->args);
    if (!call || (!t->calls && !(t->calls = json_array())) ||
        json_array_append_new(t->calls, call))
        return BL_ENOMEM;
    return 0;
}

/* Where the first of the markers of lists[0..n_lists) begins in s[0..n): *len its
 * length, *which its list. NULL when none. */
static const char *first_marker(const char *const *const *lists, int n_lists, const char *s, size_t n,
                                size_t *len, int *which)
{
    const char *best = NULL;
    for (int d = 0; d < n_lists; d++) {
        for (const char *const *m = lists[d]; *m; m++) {
            size_t ml = strlen(*m);
            const char *f = n >= ml ? memmem(s, n, *m, ml) : NULL;
            if (f && (!best || f < best)) {
                best = f;
                *len = ml;
                *which = d;
            }
        }
    }
    return best;
}

/* How many bytes at the end of s[0..n) may begin one of those markers (a
 * one-byte marker is decided where it stands). */
static size_t marker_tail(const char *const *const *lists, int n_lists, const char *s, size_t n)
{
    size_t k = 0;
    for (int d = 0; d < n_lists; d++)
        for (const char *const *m = lists[d]; *m; m++) {
            size_t ml = strlen(*m);
            size_t tk = ml == 1 ? 0 : rt__gen_tag_tail(s, n, *m, ml);
            if (tk > k)
                k = tk;
        }
    return k;
}

/* The section at hold's start, read again: its whole calls kept, the open one
 * shown. *used: bytes to drop when it ended (OK), or kept calls' bytes (NO). */
static int read_section(rt_gen_tools_t *t, int last, int *status, size_t *used)
{
    rt_gen_buf_t *h = &t->hold;
    px_t x = {.t = t, .skip = t->n_done};
    cur_t c = {h->p, h->n, 0, last};
    int r = parse_section(&c, &x);
    if (r == P_MORE && last)
        r = P_NO;
    int rc = x.oom ? BL_ENOMEM : 0;
    for (size_t i = t->n_done; !rc && i < x.n_calls; i++)
        rc = keep_call(t, &x.calls[i - x.skip]);
    if (!rc)
        t->n_done = x.n_calls;
    if (!rc && r == P_MORE && x.open_name) {
        if (!t->open)
            rc = show_open(t, x.open_name, x.open_id);
        if (!rc && x.open_raw)
            rc = show_args(t, x.open_raw, x.open_raw_len);
        else if (!rc && x.built_open)
            rc = show_args(t, x.built.p, x.built.n);
    }
    if (!rc && r == P_NO)
        rc = show_drop(t);
    if (r == P_OK && x.n_calls == 0)
        r = P_NO; /* a section without a call is text */
    *status = r;
    *used = r == P_OK ? c.i : x.n_calls ? x.end_ok : 0;
    px_free(&x);
    return rc;
}

int rt__gen_tools_feed(rt_gen_tools_t *t, const char *s, size_t n, int last, rt_gen_buf_t *text)
{
    rt_gen_buf_t *h = &t->hold;
    events_clear(t);
    if (n && rt__gen_buf_add(h, s, n))
        return BL_ENOMEM;
    for (;;) {
        if (!t->in_call) {
            /* the format's openers, and the markers it drops */
            const char *const *lists[2] = {k_fmt[t->fmt].opens, k_fmt[t->fmt].drops};
            size_t len = 0;
            int drop = 0;
            const char *o = h->n ? first_marker(lists, 2, h->p, h->n, &len, &drop) : NULL;
            if (!o) /* text, but for an end that may begin a marker */
                return rt__gen_buf_move(h, h->n - (last ? 0 : marker_tail(lists, 2, h->p, h->n)), text);
            if (rt__gen_buf_move(h, (size_t)(o - h->p), text))
                return BL_ENOMEM;
            if (drop) {
                rt__gen_buf_consume(h, len);
                continue;
            }
            t->in_call = 1;
            t->open_len = len;
            t->n_done = 0;
            continue;
        }
        int status;
        size_t used;
        if (read_section(t, last, &status, &used))
            return BL_ENOMEM;
        if (status == P_MORE)
            return 0;
        t->in_call = 0;
        if (status == P_NO && !used) { /* not a call: its opener is text */
            if (rt__gen_buf_move(h, t->open_len, text))
                return BL_ENOMEM;
        } else {
            rt__gen_buf_consume(h, used);
        }
        t->n_done = 0;
        if (h->n == 0)
            return 0;
    }
}

/* ---------------------------------------------------------------------------- */
/* gpt-oss (harmony)                                                              */
/* ---------------------------------------------------------------------------- */

/* A reply is messages: [<|start|>assistant] <|channel|>CHANNEL [to=RECIPIENT]
 * [<|constrain|>TYPE] <|message|> BODY, each ended by <|end|>, <|call|>, <|return|>
 * or the end of the text. */
enum { H_HEAD = 0, H_BODY };
enum { HK_CONTENT = 0, HK_REASON, HK_CALL };

static const char *const H_ENDS[] = {"<|end|>", "<|call|>", "<|return|>", NULL};

/* The header h[0..n) (up to <|message|>): the message's kind, and the function's
 * name for a call. */
static int h_header(const char *h, size_t n, char *fname, size_t cap)
{
    char hdr[512];
    snprintf(hdr, sizeof hdr, "%.*s", (int)(n < sizeof hdr - 1 ? n : sizeof hdr - 1), h);
    const char *to = strstr(hdr, "to=functions.");
    if (to) {
        to += 13;
        size_t k = strcspn(to, " <\t\n");
        snprintf(fname, cap, "%.*s", (int)k, to);
        if (name_ok(fname, strlen(fname)))
            return HK_CALL;
    }
    const char *ch = strstr(hdr, "<|channel|>");
    if (ch && !strncmp(ch + 11, "analysis", 8))
        return HK_REASON;
    return HK_CONTENT;
}

int rt__gen_harmony_feed(rt_gen_tools_t *t, const char *s, size_t n, int last, int calls,
                         rt_gen_buf_t *reason, rt_gen_buf_t *content)
{
    rt_gen_buf_t *h = &t->hold;
    events_clear(t);
    if (n && rt__gen_buf_add(h, s, n))
        return BL_ENOMEM;
    for (;;) {
        if (t->h_state == H_HEAD) {
            /* a header is short: one not found in its first bytes is text */
            static const char msg[] = "<|message|>";
            enum { HEAD_MAX = 512 + sizeof msg - 1 };
            const size_t look = h->n < HEAD_MAX ? h->n : HEAD_MAX;
            const char *m = look ? memmem(h->p, look, msg, sizeof msg - 1) : NULL;
            /* a reply that does not begin with a header is content */
            int headed = h->n && (h->p[0] == '<' || h->p[0] == ' ' || h->p[0] == '\n');
            if (h->n && !headed) {
                t->h_state = H_BODY;
                t->h_kind = HK_CONTENT;
                continue;
            }
            if (!m && h->n >= HEAD_MAX) { /* no header after all: text */
                t->h_state = H_BODY;
                t->h_kind = HK_CONTENT;
                continue;
            }
            if (!m) {
                if (last && rt__gen_buf_move(h, h->n, content))
                    return BL_ENOMEM;
                return 0;
            }
            char fname[256] = "";
            t->h_kind = h_header(h->p, (size_t)(m - h->p), fname, sizeof fname);
            if (t->h_kind == HK_CALL && !calls)
                t->h_kind = HK_CONTENT;
            rt__gen_buf_consume(h, (size_t)(m - h->p) + sizeof msg - 1);
            t->h_state = H_BODY;
            rt__gen_buf_free(&t->h_args);
            if (t->h_kind == HK_CALL) {
                json_decref(t->h_name);
                if (!(t->h_name = json_string(fname))) /* not UTF-8: said, not called */
                    t->h_kind = HK_CONTENT;
                else if (show_open(t, t->h_name, NULL))
                    return BL_ENOMEM;
            }
            continue;
        }
        const char *const *ends[1] = {H_ENDS};
        size_t elen = 0;
        int which;
        const char *e = h->n ? first_marker(ends, 1, h->p, h->n, &elen, &which) : NULL;
        size_t take = e ? (size_t)(e - h->p) : h->n - (last ? 0 : marker_tail(ends, 1, h->p, h->n));
        if (!e && !last && t->h_kind != HK_CALL)
            take = utf8_whole(h->p, take);
        rt_gen_buf_t *to = t->h_kind == HK_REASON ? (reason ? reason : content)
                           : t->h_kind == HK_CALL ? &t->h_args
                                                  : content;
        if (rt__gen_buf_move(h, take, to))
            return BL_ENOMEM;
        if (t->h_kind == HK_CALL &&
            show_args(t, t->h_args.p ? t->h_args.p : "", utf8_whole(t->h_args.p ? t->h_args.p : "",
                                                                    t->h_args.n)))
            return BL_ENOMEM;
        if (!e && !last)
            return 0;
        if (t->h_kind == HK_CALL) { /* the call is whole */
            size_t a = 0, b = t->h_args.n;
            const char *p = t->h_args.p ? t->h_args.p : "";
            trim(p, &a, &b);
            json_error_t je;
            json_t *v = json_loadb(p + a, b - a, JSON_DECODE_ANY, &je);
            /* arguments that are not a JSON object go as written (made UTF-8) */
            json_t *raw = json_is_object(v) ? NULL : rt__gen_json_piece(p + a, b - a);
            char *args = json_is_object(v) ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER)
                         : raw           ? strdup(json_string_value(raw))
                                         : NULL;
            json_decref(raw);
            json_decref(v);
            pcall_t c = {.name = t->h_name, .args = args, .stream = dup_n(p, t->h_args.n)};
            int rc = !args || !c.stream || keep_call(t, &c);
            free(args);
            free(c.stream);
            json_decref(t->h_name);
            t->h_name = NULL;
            if (rc)
                return BL_ENOMEM;
        }
        rt__gen_buf_consume(h, elen);
        t->h_state = H_HEAD;
        if (!e)
            return 0;
    }
}
