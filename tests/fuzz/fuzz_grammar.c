/* libFuzzer target for router/grammar.c and router/json_schema.c, the parsers of the
 * `grammar`, `json_schema` and `response_format` request fields. The input is a
 * grammar (first byte even) or a JSON schema (odd), a NUL, then text. Invariants
 * checked beside the sanitizers':
 *   - every grammar the schema converter writes compiles;
 *   - rt_grammar_match_accepts says what rt_grammar_match_feed then does, piece by
 *     piece, whatever the pieces' sizes;
 *   - the vocabulary scan agrees with accepts on every piece of the text.
 * Seeds: tests/fuzz/make_grammar_corpus.py. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_PIECES 64

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_grammar: %s\n", what);
        abort();
    }
}

static void run_text(const rt_grammar_t *g, const char *text, size_t n, uint8_t sizes)
{
    rt_grammar_match_t *m = NULL;
    bl_err_t err;
    if (rt_grammar_match_create(&m, g, &err))
        return; /* a start past the matcher's bounds is refused, not a failure */
    /* the text's pieces, of 1..8 bytes as the size byte says, form a vocabulary */
    const char *pieces[MAX_PIECES];
    size_t lens[MAX_PIECES];
    int np = 0;
    for (size_t i = 0; i < n && np < MAX_PIECES; np++) {
        size_t k = 1 + ((sizes >> (np % 8)) & 1) * 3 + (size_t)(np % 5);
        if (k > n - i)
            k = n - i;
        pieces[np] = text + i;
        lens[np] = k;
        i += k;
    }
    rt_grammar_vocab_t *v = NULL;
    unsigned char allowed[MAX_PIECES];
    if (np && rt_grammar_vocab_create(&v, pieces, lens, np, &err) == 0) {
        for (int step = 0; step < np; step++) {
            rt_grammar_match_scan(m, v, allowed);
            for (int t = 0; t < np; t++)
                check(allowed[t] == rt_grammar_match_accepts(m, pieces[t], lens[t]),
                      "the scan and accepts disagree");
            int acc = rt_grammar_match_accepts(m, pieces[step], lens[step]);
            int fed = rt_grammar_match_feed(m, pieces[step], lens[step]) == 0;
            check(acc == fed, "accepts and feed disagree");
            if (!fed)
                break;
        }
        (void)rt_grammar_match_done(m);
        rt_grammar_vocab_destroy(v);
    }
    rt_grammar_match_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    size_t head = nul ? (size_t)(nul - data) - 1 : size - 1;
    const char *spec = (const char *)data + 1;
    const char *text = nul ? (const char *)nul + 1 : "";
    size_t text_len = nul ? size - (size_t)(nul - data) - 1 : 0;
    bl_err_t err;
    rt_grammar_t *g = NULL;
    if (data[0] & 1) {
        json_error_t je;
        json_t *schema = json_loadb(spec, head, JSON_DECODE_ANY, &je);
        if (!schema)
            return 0;
        char *gbnf = NULL;
        if (rt_json_schema_to_gbnf(schema, &gbnf, &err) == 0) {
            int rc = rt_grammar_parse(&g, gbnf, strlen(gbnf), &err);
            if (rc)
                fprintf(stderr, "%s\n%s\n", err.msg, gbnf);
            check(rc == 0, "a converted schema does not compile");
            free(gbnf);
        }
        json_decref(schema);
    } else if (rt_grammar_parse(&g, spec, head, &err) != 0) {
        check(err.msg[0] != '\0', "a refusal without a message");
        return 0;
    }
    if (g)
        run_text(g, text, text_len, data[0]);
    rt_grammar_destroy(g);
    return 0;
}
