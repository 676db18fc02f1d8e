/* Tests of router/grammar.c: GBNF compile errors that name the place, and the
 * matcher against texts a grammar does and does not take, fed whole, in pieces and
 * byte by byte (pieces that split UTF-8 sequences included). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar.h"
#include "test_seed.h"

/* A number in [0, n) from r. */
static int pick(rng_t *r, int n)
{
    return (int)(rng_next(r) % (uint64_t)n);
}

static rt_grammar_t *compile(const char *text)
{
    rt_grammar_t *g = NULL;
    bl_err_t err = {0};
    int rc = rt_grammar_parse(&g, text, strlen(text), &err);
    if (rc)
        fail_msg("grammar did not compile: %s\n%s", err.msg, text);
    return g;
}

static void refused(const char *text, const char *needle)
{
    rt_grammar_t *g = NULL;
    bl_err_t err = {0};
    int rc = rt_grammar_parse(&g, text, strlen(text), &err);
    if (rc == 0)
        fail_msg("grammar compiled but should not: %s", text);
    assert_null(g);
    if (!strstr(err.msg, needle))
        fail_msg("error '%s' does not say '%s'", err.msg, needle);
}

/* Whether the whole text matches: fed whole, then byte by byte, then in pieces of 3
 * (all three must agree). */
static int matches(const rt_grammar_t *g, const char *text)
{
    int results[3];
    size_t n = strlen(text);
    for (int mode = 0; mode < 3; mode++) {
        rt_grammar_match_t *m = NULL;
        bl_err_t err = {0};
        assert_int_equal(rt_grammar_match_create(&m, g, &err), 0);
        size_t piece = mode == 0 ? (n ? n : 1) : mode == 1 ? 1 : 3;
        int ok = 1;
        for (size_t i = 0; i < n && ok; i += piece) {
            size_t k = n - i < piece ? n - i : piece;
            int acc = rt_grammar_match_accepts(m, text + i, k);
            int fed = rt_grammar_match_feed(m, text + i, k) == 0;
            assert_int_equal(acc, fed); /* accepts says what feed does */
            ok = fed;
        }
        results[mode] = ok && rt_grammar_match_done(m);
        rt_grammar_match_destroy(m);
    }
    assert_int_equal(results[0], results[1]);
    assert_int_equal(results[0], results[2]);
    return results[0];
}

static void test_grammar_literals_alternatives_and_groups(void **state)
{
    (void)state;
    rt_grammar_t *g = compile("root ::= \"yes\" | \"no\" | ( \"may\" \"be\" )  # a comment\n");
    assert_true(matches(g, "yes"));
    assert_true(matches(g, "no"));
    assert_true(matches(g, "maybe"));
    assert_false(matches(g, "ye"));
    assert_false(matches(g, "yess"));
    assert_false(matches(g, ""));
    rt_grammar_destroy(g);
}

static void test_grammar_classes_ranges_negation_and_any(void **state)
{
    (void)state;
    rt_grammar_t *g = compile("root ::= [a-cx] [^0-9\\]] . \"\\n\"\n");
    assert_true(matches(g, "a!z\n"));
    assert_true(matches(g, "xQ\xc3\xa9\n")); /* . takes one code point, é */
    assert_false(matches(g, "d!z\n"));
    assert_false(matches(g, "a5z\n"));
    assert_false(matches(g, "a]z\n"));
    rt_grammar_destroy(g);
}

static void test_grammar_repetitions(void **state)
{
    (void)state;
    rt_grammar_t *g = compile("root ::= \"a\"{2,4} \"b\"* \"c\"+ \"d\"? \"e\"{2} \"f\"{1,}\n");
    assert_true(matches(g, "aacceef"));
    assert_true(matches(g, "aaaabbbcdeeff"));
    assert_false(matches(g, "acceef"));      /* one a */
    assert_false(matches(g, "aaaaacceef"));  /* five */
    assert_false(matches(g, "aaeef"));       /* no c */
    assert_false(matches(g, "aacceeef"));    /* three e */
    assert_false(matches(g, "aaccee"));      /* no f */
    rt_grammar_destroy(g);
}

static void test_grammar_rules_recursion_and_newlines_in_groups(void **state)
{
    (void)state;
    rt_grammar_t *g = compile("root ::= list\n"
                              "list ::= \"[\" ws ( item ( ws \",\" ws item )* )? ws \"]\"\n"
                              "item ::= num | list\n"
                              "num ::= \"-\"? [0-9]+\n"
                              "ws ::= (\n"
                              "  \" \" | \"\\n\"\n"
                              ")*\n");
    assert_true(matches(g, "[]"));
    assert_true(matches(g, "[1, -22,[3,[ ]],\n4]"));
    assert_false(matches(g, "[1,]"));
    assert_false(matches(g, "[1 2]"));
    assert_false(matches(g, "[[1]"));
    rt_grammar_destroy(g);
}

static void test_grammar_utf8_split_between_pieces(void **state)
{
    (void)state;
    rt_grammar_t *g = compile("root ::= \"\xce\xb1\" [\xce\xb2-\xcf\x89]+ \"\xe2\x82\xac\"\n"); /* α [β-ω]+ € */
    assert_true(matches(g, "\xce\xb1\xce\xb2\xcf\x89\xe2\x82\xac"));
    assert_false(matches(g, "\xce\xb1\xe2\x82\xac"));
    rt_grammar_match_t *m = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_grammar_match_create(&m, g, &err), 0);
    /* a piece that ends inside α is taken; one that starts a character no set holds is not */
    assert_true(rt_grammar_match_accepts(m, "\xce", 1));
    assert_false(rt_grammar_match_accepts(m, "\xe2", 1));
    assert_false(rt_grammar_match_accepts(m, "\xff", 1)); /* never UTF-8 */
    rt_grammar_match_t *d = NULL;
    rt_grammar_t *digits = compile("root ::= [0-9]+\n");
    assert_int_equal(rt_grammar_match_create(&d, digits, &err), 0);
    /* E0 begins U+0800..U+0FFF only (a shorter form would be overlong): no digit */
    assert_false(rt_grammar_match_accepts(d, "\xe0", 1));
    assert_false(rt_grammar_match_accepts(d, "\xc2", 1));
    assert_true(rt_grammar_match_accepts(d, "7", 1));
    rt_grammar_match_destroy(d);
    rt_grammar_destroy(digits);
    assert_int_equal(rt_grammar_match_feed(m, "\xce", 1), 0);
    assert_false(rt_grammar_match_done(m));
    assert_false(rt_grammar_match_accepts(m, "a", 1)); /* the sequence must go on */
    assert_int_equal(rt_grammar_match_feed(m, "\xb1\xce\xb2\xe2", 4), 0);
    assert_int_equal(rt_grammar_match_feed(m, "\x82", 1), 0);
    assert_false(rt_grammar_match_done(m));
    assert_int_equal(rt_grammar_match_feed(m, "x", 1), BL_EINVAL);
    assert_int_equal(rt_grammar_match_feed(m, "\xac", 1), 0);
    assert_true(rt_grammar_match_done(m));
    rt_grammar_match_reset(m);
    assert_false(rt_grammar_match_done(m));
    assert_true(rt_grammar_match_accepts(m, "\xce\xb1", 2));
    rt_grammar_match_destroy(m);
    rt_grammar_destroy(g);
}

static void test_grammar_empty_alternative_and_done(void **state)
{
    (void)state;
    rt_grammar_t *g = compile("root ::= \"a\" tail\ntail ::= \"b\" tail |\n");
    assert_true(matches(g, "a"));
    assert_true(matches(g, "abbb"));
    assert_false(matches(g, "ab a"));
    rt_grammar_destroy(g);
}

static void test_grammar_ambiguous_grammar_stays_bounded(void **state)
{
    (void)state;
    /* every split of the a's is a parse: the stacks must not multiply without end */
    rt_grammar_t *g = compile("root ::= x*\nx ::= \"a\" | \"aa\" | \"aaa\" | x2\nx2 ::= \"a\" \"a\"?\n");
    char text[2001];
    memset(text, 'a', 2000);
    text[2000] = '\0';
    assert_true(matches(g, text));
    rt_grammar_destroy(g);
}

static void test_grammar_errors_name_the_place(void **state)
{
    (void)state;
    refused("", "empty");
    refused("root ::= \"a\"\nroot ::= \"b\"\n", "defined twice");
    refused("root = \"a\"\n", "'::='");
    refused("root ::= other\n", "'other' is used but not defined");
    refused("start ::= \"a\"\n", "no rule named 'root'");
    refused("root ::= root \"a\" | \"b\"\n", "left-recursive");
    refused("root ::= a\na ::= b \"x\"\nb ::= c a | \"y\"\nc ::= \"z\"?\n", "left-recursive");
    refused("root ::= \"abc\n", "closing '\"'");
    refused("root ::= [abc\n", "closing ']'");
    refused("root ::= ( \"a\"\n", "closing ')'");
    refused("root ::= []\n", "empty character class");
    refused("root ::= [z-a]\n", "below its start");
    refused("root ::= \"\\q\"\n", "unknown escape");
    refused("root ::= \"\\x4\"\n", "hex digits");
    refused("root ::= \"a\"{1001}\n", "over 1000");
    refused("root ::= \"a\"{3,2}\n", "n below m");
    refused("root ::= \"a\"**\n", "nothing before it");
    refused("root ::= * \"a\"\n", "nothing before it");
    refused("root ::= \"\xff\"\n", "UTF-8");
    refused("root ::= \"a\" ) \n", "unexpected character");
    refused("root ::= \"a\"\n  | \"b\"\n", "expected a rule name");
    /* the line and column of the error */
    refused("root ::= \"a\"\nx ::= \"b\" @\n", "line 2, column 11");
    char deep[2000];
    size_t n = (size_t)snprintf(deep, sizeof deep, "root ::= ");
    for (int i = 0; i < 300; i++)
        deep[n++] = '(';
    deep[n] = '\0';
    refused(deep, "deeper than 256");
}

static void test_grammar_random_bytes_never_crash(void **state)
{
    (void)state;
    /* fresh random grammars of GBNF's characters: refused or compiled, never a crash,
     * and a compiled one runs on random text */
    static const char alphabet[] = "root::=\"ab\"[]^-()|*+?{},.#\n\\x2 ";
    rng_t r = rng_for(1);
    for (int t = 0; t < 3000; t++) {
        char text[64];
        size_t n = 8 + (size_t)pick(&r, 40);
        memcpy(text, "root ::= ", 9);
        for (size_t i = 9; i < n; i++)
            text[i] = alphabet[pick(&r, (int)(sizeof alphabet - 1))];
        rt_grammar_t *g = NULL;
        bl_err_t err = {0};
        if (rt_grammar_parse(&g, text, n, &err) == 0) {
            rt_grammar_match_t *m = NULL;
            if (rt_grammar_match_create(&m, g, &err) == 0) {
                for (int k = 0; k < 20; k++) {
                    char c = "ab\"[]x"[pick(&r, 6)];
                    (void)rt_grammar_match_accepts(m, &c, 1);
                    int fed = rt_grammar_match_feed(m, &c, 1); /* either is fine */
                    (void)fed;
                }
                (void)rt_grammar_match_done(m);
                rt_grammar_match_destroy(m);
            }
            rt_grammar_destroy(g);
        } else {
            assert_true(err.msg[0] != '\0');
        }
    }
}

/* The trie scan says of every token what rt_grammar_match_accepts says (the scan is
 * the fast path, accepts its reference), at each state of random walks. Fresh
 * random pieces each run, UTF-8 fragments included. */
static void test_grammar_vocab_scan_matches_accepts(void **state)
{
    (void)state;
    rng_t r = rng_for(2);
    static const char *const bits[] = {"{", "}", "\"", ":", ",", " ", "\n", "a", "b", "ab", "1",
                                       "-", "0", "tr", "ue", "null", "\xc3", "\xa9", "\xc3\xa9",
                                       "\xe2\x82", "\xac", "\\", "[", "]", "x"};
    enum { N = 3000 };
    char *pieces[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        char buf[64] = "";
        int k = i == 7 ? 0 : 1 + pick(&r, 4); /* one empty piece: left out */
        for (int j = 0; j < k; j++)
            strcat(buf, bits[pick(&r, (int)(sizeof bits / sizeof *bits))]);
        pieces[i] = strdup(buf);
        lens[i] = strlen(buf);
    }
    rt_grammar_vocab_t *v = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_grammar_vocab_create(&v, (const char *const *)pieces, lens, N, &err), 0);
    rt_grammar_t *g = compile("root ::= ws value ws\n"
                              "value ::= obj | arr | str | num | \"true\" | \"null\"\n"
                              "obj ::= \"{\" ws ( str ws \":\" ws value ( ws \",\" ws str ws \":\" ws value )* )? ws \"}\"\n"
                              "arr ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
                              "str ::= \"\\\"\" ( [^\"\\\\] | \"\\\\\" [\"\\\\n] )* \"\\\"\"\n"
                              "num ::= \"-\"? [0-9]+\n"
                              "ws ::= [ \\n]{0,3}\n");
    rt_grammar_match_t *m = NULL;
    assert_int_equal(rt_grammar_match_create(&m, g, &err), 0);
    unsigned char *allowed = malloc(N);
    for (int walk = 0; walk < 6; walk++) {
        rt_grammar_match_reset(m);
        for (int stepn = 0; stepn < 25; stepn++) {
            size_t n_ok = rt_grammar_match_scan(m, v, allowed);
            size_t n_ref = 0;
            int32_t chosen[N];
            for (int i = 0; i < N; i++) {
                int ref = lens[i] > 0 && rt_grammar_match_accepts(m, pieces[i], lens[i]);
                if (ref != allowed[i])
                    fail_msg("token %d (\"%s\"): the scan says %d, accepts says %d (walk %d step %d)",
                             i, pieces[i], allowed[i], ref, walk, stepn);
                if (ref)
                    chosen[n_ref++] = i;
            }
            assert_int_equal(n_ok, n_ref);
            if (!n_ref)
                break;
            int t = chosen[pick(&r, (int)n_ref)];
            assert_int_equal(rt_grammar_match_feed(m, pieces[t], lens[t]), 0);
        }
    }
    free(allowed);
    rt_grammar_match_destroy(m);
    rt_grammar_destroy(g);
    rt_grammar_vocab_destroy(v);
    for (int i = 0; i < N; i++)
        free(pieces[i]);
}

int main(void)
{
    test_seed_init("test_router_grammar");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar_literals_alternatives_and_groups),
        cmocka_unit_test(test_grammar_classes_ranges_negation_and_any),
        cmocka_unit_test(test_grammar_repetitions),
        cmocka_unit_test(test_grammar_rules_recursion_and_newlines_in_groups),
        cmocka_unit_test(test_grammar_utf8_split_between_pieces),
        cmocka_unit_test(test_grammar_empty_alternative_and_done),
        cmocka_unit_test(test_grammar_ambiguous_grammar_stays_bounded),
        cmocka_unit_test(test_grammar_errors_name_the_place),
        cmocka_unit_test(test_grammar_random_bytes_never_crash),
        cmocka_unit_test(test_grammar_vocab_scan_matches_accepts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
