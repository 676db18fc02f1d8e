/* Tests of router/tokenizer.c and its encoders: BPE merges, SentencePiece with byte
 * fallback, special-token matching, the pre-tokenizer splits, the streaming
 * decoder, refusal of bad vocabularies, and the Qwen3 oracle from ../shared. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "tokenizer.h"
#include "tokenizer_impl.h"

/* --- a small vocabulary builder ---------------------------------------------------- */

#define VB_MAX 600

typedef struct vb {
    rt_str_t toks[VB_MAX];
    int32_t types[VB_MAX];
    float scores[VB_MAX];
    uint32_t n;
    rt_str_t merges[64];
    uint32_t nm;
    char bytes[256][3]; /* byte-level characters, for the first 256 tokens */
} vb_t;

static int32_t vb_add(vb_t *v, const char *text, int type, float score)
{
    assert_true(v->n < VB_MAX);
    v->toks[v->n] = (rt_str_t){ text, strlen(text) };
    v->types[v->n] = type;
    v->scores[v->n] = score;
    return (int32_t)v->n++;
}

static void vb_merge(vb_t *v, const char *m)
{
    v->merges[v->nm++] = (rt_str_t){ m, strlen(m) };
}

/* Tokens 0..255: the byte-level character of each byte, so that id == byte. The
 * mapping is the GPT-2 one, written out here independently of the tokenizer. */
static void vb_bytes(vb_t *v)
{
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = keep ? b : next++;
        char *o = v->bytes[b];
        memset(o, 0, 3);
        if (cp < 0x80) {
            o[0] = (char)cp;
        } else {
            o[0] = (char)(0xC0 | (cp >> 6));
            o[1] = (char)(0x80 | (cp & 0x3F));
        }
        vb_add(v, o, RT_TOKEN_NORMAL, 0);
    }
}

static rt_tokenizer_desc_t vb_desc(vb_t *v, const char *model, const char *pre)
{
    rt_tokenizer_desc_t d;
    rt_tokenizer_desc_init(&d);
    d.model = model;
    d.pre = pre;
    d.n_vocab = v->n;
    d.tokens = v->toks;
    d.types = v->types;
    d.scores = v->scores;
    d.n_merges = v->nm;
    d.merges = v->merges;
    return d;
}

static rt_tokenizer_t *vb_build(vb_t *v, const char *model, const char *pre)
{
    rt_tokenizer_desc_t d = vb_desc(v, model, pre);
    d.add_bos = 0;
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = { 0 };
    int rc = rt_tokenizer_create(&tok, &d, &err);
    if (rc)
        print_error("create: %s\n", err.msg);
    assert_int_equal(rc, 0);
    return tok;
}

static void expect_ids(rt_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                       const int32_t *want, size_t n_want)
{
    rt_tokens_t out = { 0 };
    bl_err_t err = { 0 };
    assert_int_equal(rt_tokenize(tok, text, len, flags, &out, &err), 0);
    if (out.n != n_want || memcmp(out.ids, want, n_want * sizeof *want) != 0) {
        print_error("text '%.*s': got", (int)len, text);
        for (size_t i = 0; i < out.n; i++)
            print_error(" %d", out.ids[i]);
        print_error(", want");
        for (size_t i = 0; i < n_want; i++)
            print_error(" %d", want[i]);
        print_error("\n");
        fail();
    }
    rt_tokens_free(&out);
}

#define EXPECT(tok, text, flags, ...)                                                     \
    do {                                                                                  \
        const int32_t want_[] = { __VA_ARGS__ };                                          \
        expect_ids(tok, text, strlen(text), flags, want_, sizeof want_ / sizeof *want_); \
    } while (0)

/* --- byte-level BPE ---------------------------------------------------------------- */

static void test_bpe_merges_follow_rank(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    int32_t ab = vb_add(&v, "ab", 1, 0), bc = vb_add(&v, "bc", 1, 0);
    int32_t abc = vb_add(&v, "abc", 1, 0);
    vb_merge(&v, "a b");
    vb_merge(&v, "ab c");
    vb_merge(&v, "b c");
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "qwen2");
    EXPECT(tok, "abc", 0, abc);
    EXPECT(tok, "ab", 0, ab);
    EXPECT(tok, "bc", 0, bc);
    EXPECT(tok, "cab", 0, 'c', ab);
    rt_tokenizer_destroy(tok);

    /* With "b c" ranked first, "abc" becomes a + bc and nothing merges those. */
    v.nm = 0;
    vb_merge(&v, "b c");
    vb_merge(&v, "a b");
    vb_merge(&v, "ab c");
    tok = vb_build(&v, "gpt2", "qwen2");
    EXPECT(tok, "abc", 0, 'a', bc);
    rt_tokenizer_destroy(tok);
}

static void test_bpe_equal_pairs_merge_leftmost_first(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    int32_t aa = vb_add(&v, "aa", 1, 0);
    vb_merge(&v, "a a");
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "qwen2");
    EXPECT(tok, "aaa", 0, aa, 'a');
    EXPECT(tok, "aaaa", 0, aa, aa);
    /* The second call comes from the word cache and must agree. */
    EXPECT(tok, "aaa", 0, aa, 'a');
    rt_tokenizer_destroy(tok);
}

static void test_bpe_space_is_byte_level_character(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    int32_t ga = vb_add(&v, "\xC4\xA0" "a", 1, 0);
    int32_t gab = vb_add(&v, "\xC4\xA0" "ab", 1, 0);
    vb_merge(&v, "\xC4\xA0 a");
    vb_merge(&v, "\xC4\xA0" "a b");
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "qwen2");
    EXPECT(tok, " ab", 0, gab);
    EXPECT(tok, "x a", 0, 'x', ga);
    rt_str_t p = rt_tokenizer_piece(tok, gab);
    assert_int_equal(p.len, 3);
    assert_memory_equal(p.ptr, " ab", 3);
    p = rt_tokenizer_piece(tok, ' ');
    assert_int_equal(p.len, 1);
    assert_int_equal(p.ptr[0], ' ');
    assert_int_equal(rt_tokenizer_find(tok, "\xC4\xA0" "ab", 4), gab);
    assert_int_equal(rt_tokenizer_find(tok, "zz", 2), -1);
    rt_tokenizer_destroy(tok);
}

static void test_bpe_invalid_utf8_input_becomes_replacement(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "qwen2");
    /* U+FFFD is EF BF BD; each maximal invalid subsequence gives one. */
    EXPECT(tok, "a\xFF" "b", 0, 'a', 0xEF, 0xBF, 0xBD, 'b');
    EXPECT(tok, "a\xE2\x82", 0, 'a', 0xEF, 0xBF, 0xBD);
    EXPECT(tok, "\xC0\xAF", 0, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
    EXPECT(tok, "\xED\xA0\x80", 0, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD);
    /* A NUL byte is text like any other. */
    const int32_t want[] = { 0, 'a' };
    expect_ids(tok, "\0a", 2, 0, want, 2);
    rt_tokens_t out = { 0 };
    bl_err_t err = { 0 };
    assert_int_equal(rt_tokenize(tok, "", 0, RT_TOKENIZE_ADD_SPECIAL, &out, &err), 0);
    assert_int_equal(out.n, 0);
    rt_tokens_free(&out);
    rt_tokenizer_destroy(tok);
}

static void test_bpe_long_space_run_is_not_refused(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "qwen2");
    /* Backtracking over a white-space run counts against PCRE2's match limit (10
     * million steps by default); a longer run must still tokenize. */
    size_t n = 12u << 20;
    char *text = malloc(n + 1);
    assert_non_null(text);
    memset(text, ' ', n);
    text[n] = 'a';
    rt_tokens_t out = { 0 };
    bl_err_t err = { 0 };
    int rc = rt_tokenize(tok, text, n + 1, 0, &out, &err);
    if (rc)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(out.n, n + 1);
    assert_int_equal(out.ids[0], ' ');
    assert_int_equal(out.ids[n], 'a');
    rt_tokens_free(&out);
    free(text);
    rt_tokenizer_destroy(tok);
}

/* --- special tokens -------------------------------------------------------------------- */

static void test_special_tokens_longest_first(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    int32_t x = vb_add(&v, "<|x|>", RT_TOKEN_CONTROL, 0);
    int32_t xy = vb_add(&v, "<|x|>y", RT_TOKEN_CONTROL, 0);
    int32_t u = vb_add(&v, "<u>", RT_TOKEN_USER_DEFINED, 0);
    int32_t ab = vb_add(&v, "AB", RT_TOKEN_CONTROL, 0);
    int32_t bcd = vb_add(&v, "BCD", RT_TOKEN_CONTROL, 0);
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "qwen2");
    EXPECT(tok, "a<|x|>y<|x|>b<u>", RT_TOKENIZE_PARSE_SPECIAL, 'a', xy, x, 'b', u);
    /* Longer tokens claim their text first, wherever they are: "ABCD" gives
     * A + BCD although AB starts earlier. */
    EXPECT(tok, "ABCD", RT_TOKENIZE_PARSE_SPECIAL, 'A', bcd);
    EXPECT(tok, "ABAB", RT_TOKENIZE_PARSE_SPECIAL, ab, ab);
    /* Without parse_special control tokens are text; user-defined ones still match. */
    EXPECT(tok, "<|x|><u>", 0, '<', '|', 'x', '|', '>', u);
    rt_tokenizer_destroy(tok);
}

static void test_special_ids_and_flags(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    int32_t eot = vb_add(&v, "<|im_end|>", RT_TOKEN_CONTROL, 0);
    int32_t bos = vb_add(&v, "<|bos|>", RT_TOKEN_CONTROL, 0);
    rt_tokenizer_desc_t d = vb_desc(&v, "gpt2", "llama-bpe");
    d.bos_id = bos;
    d.eos_id = 9999; /* out of range: taken as absent */
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = { 0 };
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
    assert_int_equal(rt_tokenizer_n_vocab(tok), v.n);
    assert_int_equal(rt_tokenizer_bos(tok), bos);
    assert_int_equal(rt_tokenizer_eos(tok), -1);
    assert_int_equal(rt_tokenizer_eot(tok), eot); /* found by its text */
    assert_int_equal(rt_tokenizer_pad(tok), -1);
    assert_true(rt_tokenizer_add_bos(tok)); /* llama-bpe's default */
    assert_false(rt_tokenizer_add_eos(tok));
    assert_true(rt_tokenizer_is_eog(tok, eot));
    assert_false(rt_tokenizer_is_eog(tok, bos));
    assert_false(rt_tokenizer_is_eog(tok, -5));
    assert_int_equal(rt_tokenizer_token_type(tok, eot), RT_TOKEN_CONTROL);
    assert_int_equal(rt_tokenizer_token_type(tok, 1 << 30), RT_TOKEN_UNDEFINED);
    assert_null(rt_tokenizer_piece(tok, -1).ptr);
    EXPECT(tok, "hi", RT_TOKENIZE_ADD_SPECIAL, bos, 'h', 'i');
    EXPECT(tok, "hi", 0, 'h', 'i');
    rt_tokenizer_destroy(tok);
}

/* FIM tokens: by their usual texts (the first text in the preference order wins),
 * or by the ids the file names; pad, repository and file separator end generation. */
static void test_fim_tokens(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    int32_t pre = vb_add(&v, "<|fim_prefix|>", RT_TOKEN_USER_DEFINED, 0);
    int32_t suf = vb_add(&v, "<|fim_suffix|>", RT_TOKEN_USER_DEFINED, 0);
    int32_t mid = vb_add(&v, "<|fim_middle|>", RT_TOKEN_USER_DEFINED, 0);
    int32_t pad = vb_add(&v, "<|fim_pad|>", RT_TOKEN_USER_DEFINED, 0);
    int32_t rep = vb_add(&v, "<|repo_name|>", RT_TOKEN_USER_DEFINED, 0);
    int32_t sep = vb_add(&v, "<|file_sep|>", RT_TOKEN_USER_DEFINED, 0);
    int32_t alt = vb_add(&v, "<PRE>", RT_TOKEN_USER_DEFINED, 0);
    rt_tokenizer_desc_t d = vb_desc(&v, "gpt2", "qwen2");
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = { 0 };
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
    assert_int_equal(rt_tokenizer_fim(tok, RT_FIM_PRE), pre);
    assert_int_equal(rt_tokenizer_fim(tok, RT_FIM_SUF), suf);
    assert_int_equal(rt_tokenizer_fim(tok, RT_FIM_MID), mid);
    assert_int_equal(rt_tokenizer_fim(tok, RT_FIM_PAD), pad);
    assert_int_equal(rt_tokenizer_fim(tok, RT_FIM_REP), rep);
    assert_int_equal(rt_tokenizer_fim(tok, RT_FIM_SEP), sep);
    assert_int_equal(rt_tokenizer_fim(tok, (rt_fim_t)6), -1);
    assert_false(rt_tokenizer_is_eog(tok, pre));
    assert_false(rt_tokenizer_is_eog(tok, mid));
    assert_true(rt_tokenizer_is_eog(tok, pad));
    assert_true(rt_tokenizer_is_eog(tok, rep));
    assert_true(rt_tokenizer_is_eog(tok, sep));
    rt_tokenizer_destroy(tok);

    /* The file's ids win over the texts; an id out of range falls back to them. */
    d.fim_id[RT_FIM_PRE] = alt;
    d.fim_id[RT_FIM_SUF] = 1 << 20;
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
    assert_int_equal(rt_tokenizer_fim(tok, RT_FIM_PRE), alt);
    assert_int_equal(rt_tokenizer_fim(tok, RT_FIM_SUF), suf);
    rt_tokenizer_destroy(tok);

    /* A vocabulary without them. */
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    d = vb_desc(&v, "gpt2", "qwen2");
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
    for (int f = RT_FIM_PRE; f <= RT_FIM_SEP; f++)
        assert_int_equal(rt_tokenizer_fim(tok, (rt_fim_t)f), -1);
    rt_tokenizer_destroy(tok);
}

/* --- SentencePiece ---------------------------------------------------------------------- */

typedef struct spm {
    vb_t v;
    char hex[256][7];
    int32_t s_h, s_he, s_ll, s_llo, s_hello, s_shello, s_sp;
} spm_t;

static rt_tokenizer_t *build_spm(spm_t *s, int add_space_prefix)
{
    memset(s, 0, sizeof *s);
    vb_t *v = &s->v;
    vb_add(v, "<unk>", RT_TOKEN_UNKNOWN, 0);
    vb_add(v, "<s>", RT_TOKEN_CONTROL, 0);
    vb_add(v, "</s>", RT_TOKEN_CONTROL, 0);
    for (int b = 0; b < 256; b++) {
        snprintf(s->hex[b], sizeof s->hex[b], "<0x%02X>", b);
        vb_add(v, s->hex[b], RT_TOKEN_BYTE, 0);
    }
    s->s_sp = vb_add(v, "\xE2\x96\x81", 1, -10);
    vb_add(v, "h", 1, -10);
    vb_add(v, "e", 1, -10);
    vb_add(v, "l", 1, -10);
    vb_add(v, "o", 1, -10);
    /* Scores decide the order: ll, llo, he, hello, then the space joins. */
    s->s_ll = vb_add(v, "ll", 1, -1);
    s->s_llo = vb_add(v, "llo", 1, -2);
    s->s_he = vb_add(v, "he", 1, -3);
    s->s_hello = vb_add(v, "hello", 1, -4);
    s->s_shello = vb_add(v, "\xE2\x96\x81hello", 1, -5);
    s->s_h = vb_add(v, "\xE2\x96\x81h", 1, -6);
    rt_tokenizer_desc_t d = vb_desc(v, "llama", NULL);
    d.add_space_prefix = add_space_prefix;
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = { 0 };
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
    return tok;
}

static void test_spm_merges_by_score(void **state)
{
    (void)state;
    static spm_t s;
    rt_tokenizer_t *tok = build_spm(&s, -1);
    assert_int_equal(rt_tokenizer_bos(tok), 1);
    assert_int_equal(rt_tokenizer_eos(tok), 2);
    assert_int_equal(rt_tokenizer_unk(tok), 0);
    assert_true(rt_tokenizer_add_bos(tok));
    EXPECT(tok, "hello", 0, s.s_shello);
    EXPECT(tok, "hello", RT_TOKENIZE_ADD_SPECIAL, 1, s.s_shello);
    /* A special token restarts the text, so the space prefix comes back. */
    EXPECT(tok, "<s>hello", RT_TOKENIZE_PARSE_SPECIAL, 1, s.s_shello);
    EXPECT(tok, "hello hello", 0, s.s_shello, s.s_shello);
    rt_tokenizer_destroy(tok);

    tok = build_spm(&s, 0);
    EXPECT(tok, "hello", 0, s.s_hello);
    rt_tokenizer_destroy(tok);
}

static void test_spm_byte_fallback(void **state)
{
    (void)state;
    static spm_t s;
    rt_tokenizer_t *tok = build_spm(&s, -1);
    /* é is no token: its two UTF-8 bytes become <0xC3> <0xA9> (ids 3 + byte). */
    EXPECT(tok, "h\xC3\xA9", 0, s.s_h, 3 + 0xC3, 3 + 0xA9);
    rt_str_t p = rt_tokenizer_piece(tok, 3 + 0xC3);
    assert_int_equal(p.len, 1);
    assert_int_equal((uint8_t)p.ptr[0], 0xC3);
    p = rt_tokenizer_piece(tok, s.s_shello);
    assert_int_equal(p.len, 6);
    assert_memory_equal(p.ptr, " hello", 6);

    char *text = NULL;
    size_t len = 0;
    bl_err_t err = { 0 };
    const int32_t ids[] = { s.s_shello, 3 + 0xC3, 3 + 0xA9, 2 };
    assert_int_equal(rt_detokenize(tok, ids, 4, 0, &text, &len, &err), 0);
    assert_string_equal(text, " hello\xC3\xA9");
    free(text);
    assert_int_equal(rt_detokenize(tok, ids, 4, RT_DETOK_SPECIAL, &text, &len, &err), 0);
    assert_string_equal(text, " hello\xC3\xA9</s>");
    free(text);
    rt_tokenizer_destroy(tok);
}

/* --- the streaming decoder ------------------------------------------------------------- */

static void push_expect(rt_detok_t *d, int32_t id, const char *want)
{
    const char *t;
    size_t n;
    bl_err_t err = { 0 };
    assert_int_equal(rt_detok_push(d, id, &t, &n, &err), 0);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(t, want, n);
}

static void test_detok_holds_split_characters(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    int32_t ctl = vb_add(&v, "<|c|>", RT_TOKEN_CONTROL, 0);
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "qwen2");
    rt_detok_t *d = NULL;
    bl_err_t err = { 0 };
    assert_int_equal(rt_detok_create(&d, tok, 0, &err), 0);

    push_expect(d, 'a', "a");
    push_expect(d, 0xC3, "");
    push_expect(d, 0xA9, "\xC3\xA9");
    /* A four-byte character over four tokens. */
    push_expect(d, 0xF0, "");
    push_expect(d, 0x9F, "");
    push_expect(d, 0xA6, "");
    push_expect(d, 0x99, "\xF0\x9F\xA6\x99");
    /* A byte that cannot start a character is replaced at once. */
    push_expect(d, 0x80, "\xEF\xBF\xBD");
    /* A started character broken by a new one: U+FFFD, then the new text. */
    push_expect(d, 0xC3, "");
    push_expect(d, 'b', "\xEF\xBF\xBD" "b");
    /* Control tokens print nothing unless asked. */
    push_expect(d, ctl, "");

    const char *t;
    size_t n;
    push_expect(d, 0xE2, "");
    push_expect(d, 0x82, "");
    rt_detok_flush(d, &t, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(t, "\xEF\xBF\xBD", 3);
    rt_detok_flush(d, &t, &n);
    assert_int_equal(n, 0);

    push_expect(d, 0xE2, "");
    rt_detok_reset(d);
    push_expect(d, 'c', "c");
    assert_int_equal(rt_detok_push(d, (int32_t)v.n, &t, &n, &err), BL_ERANGE);
    assert_int_equal(rt_detok_push(d, -1, &t, &n, &err), BL_ERANGE);
    rt_detok_destroy(d);

    assert_int_equal(rt_detok_create(&d, tok, RT_DETOK_SPECIAL, &err), 0);
    push_expect(d, ctl, "<|c|>");
    rt_detok_destroy(d);

    /* A control token kept (a reply format's marker) prints without the flag; the
     * others still print nothing. */
    int32_t other = vb_add(&v, "<|o|>", RT_TOKEN_CONTROL, 0);
    rt_tokenizer_destroy(tok);
    tok = vb_build(&v, "gpt2", "qwen2");
    assert_int_equal(rt_detok_create(&d, tok, 0, &err), 0);
    assert_int_equal(rt_detok_keep(d, ctl), 0);
    assert_int_equal(rt_detok_keep(d, ctl), 0);
    assert_int_equal(rt_detok_keep(d, -1), BL_ERANGE);
    assert_int_equal(rt_detok_keep(d, (int32_t)v.n), BL_ERANGE);
    push_expect(d, ctl, "<|c|>");
    push_expect(d, other, "");
    push_expect(d, 'a', "a");
    rt_detok_destroy(d);

    char *text = NULL;
    size_t len = 0;
    const int32_t bad[] = { 'a', 99999 };
    assert_int_equal(rt_detokenize(tok, bad, 2, 0, &text, &len, &err), BL_ERANGE);
    assert_null(text);
    assert_non_null(strstr(err.msg, "position 1"));
    rt_tokenizer_destroy(tok);
}

/* --- refused vocabularies ----------------------------------------------------------------- */

static int try_create(vb_t *v, const char *model, const char *pre, bl_err_t *err)
{
    rt_tokenizer_desc_t d = vb_desc(v, model, pre);
    d.add_bos = 0;
    rt_tokenizer_t *tok = (rt_tokenizer_t *)1;
    int rc = rt_tokenizer_create(&tok, &d, err);
    if (rc)
        assert_null(tok);
    rt_tokenizer_destroy(tok);
    return rc;
}

static void test_create_rejects_bad_vocabularies(void **state)
{
    (void)state;
    static vb_t v;
    bl_err_t err = { 0 };
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    vb_add(&v, "ab", 1, 0);
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), 0);

    assert_int_equal(try_create(&v, "bert", "qwen2", &err), BL_ENOTSUP);
    assert_non_null(strstr(err.msg, "bert"));
    assert_int_equal(try_create(&v, NULL, "qwen2", &err), BL_EINVAL);
    assert_int_equal(try_create(&v, "gpt2", "gpt-9", &err), BL_ENOTSUP);
    assert_non_null(strstr(err.msg, "gpt-9"));
    assert_int_equal(try_create(&v, "gpt2", NULL, &err), BL_ENOTSUP);

    v.nm = 0;
    vb_merge(&v, "ab");
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "merge 0"));
    v.nm = 0;
    vb_merge(&v, "a b");
    vb_merge(&v, "a zz");
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "merge 1"));
    v.nm = 0;
    vb_merge(&v, "c a"); /* "ca" is no token */
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    v.nm = 0;
    vb_merge(&v, "");
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    v.nm = 0;

    vb_add(&v, "ab", 1, 0);
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "duplicates"));
    v.n--;
    vb_add(&v, "a\xFF", 1, 0);
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "UTF-8"));
    v.n--;
    vb_add(&v, "q1", 9, 0);
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    v.n--;
    vb_add(&v, "<0xZZ>", RT_TOKEN_BYTE, 0);
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    v.n--;
    v.toks[v.n++] = (rt_str_t){ NULL, 3 };
    assert_int_equal(try_create(&v, "gpt2", "qwen2", &err), BL_EINVAL);
    v.n--;

    rt_tokenizer_desc_t d = vb_desc(&v, "gpt2", "qwen2");
    rt_tokenizer_t *tok = NULL;
    d.add_bos = 1; /* and no bos */
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), BL_EINVAL);
    d = vb_desc(&v, "gpt2", "qwen2");
    d.n_merges = 3;
    d.merges = NULL;
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), BL_EINVAL);
    d = vb_desc(&v, "gpt2", "qwen2");
    d.n_vocab = 0;
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), BL_EINVAL);
    assert_null(tok);
}

/* --- pre-tokenizer splits -------------------------------------------------------------- */

static void expect_split(rt_tokenizer_t *tok, const char *text, const char *const *want,
                         size_t n_want)
{
    rt__span_t *sp;
    size_t n;
    bl_err_t err = { 0 };
    assert_int_equal(rt__pretokenize(tok, text, strlen(text), &sp, &n, &err), 0);
    int same = n == n_want;
    for (size_t i = 0; same && i < n; i++)
        same = sp[i].len == strlen(want[i]) && memcmp(text + sp[i].off, want[i], sp[i].len) == 0;
    if (!same) {
        print_error("split of '%s':", text);
        for (size_t i = 0; i < n; i++)
            print_error(" [%.*s]", (int)sp[i].len, text + sp[i].off);
        print_error("\n");
        fail();
    }
}

#define SPLIT(tok, text, ...)                                              \
    do {                                                                   \
        const char *const want_[] = { __VA_ARGS__ };                       \
        expect_split(tok, text, want_, sizeof want_ / sizeof *want_);      \
    } while (0)

static void test_pretokenize_qwen2(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "qwen2");
    SPLIT(tok, "Hello world", "Hello", " world");
    SPLIT(tok, "12345", "1", "2", "3", "4", "5");
    SPLIT(tok, "I'm DON'T", "I", "'m", " DON", "'T");
    SPLIT(tok, "a  b", "a", " ", " b");
    SPLIT(tok, "x\n\ny", "x", "\n\n", "y");
    SPLIT(tok, "hi\xE6\x97\xA5\xE6\x9C\xAC", "hi\xE6\x97\xA5\xE6\x9C\xAC");
    /* U+0085 counts as white space, as in the reference engine. */
    SPLIT(tok, "a\xC2\x85 b", "a", "\xC2\x85", " b");
    rt_tokenizer_destroy(tok);
}

static void test_pretokenize_llama3(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "llama-bpe");
    SPLIT(tok, "Hello world", "Hello", " world");
    /* Digits in runs of up to three; the space before them stands alone. */
    SPLIT(tok, "I'm 12345 ok", "I", "'m", " ", "123", "45", " ok");
    SPLIT(tok, "they'LL", "they", "'LL");
    SPLIT(tok, "a  b", "a", " ", " b");
    SPLIT(tok, "!!!? x", "!!!?", " x");
    SPLIT(tok, "x\n\n  y", "x", "\n\n", " ", " y");
    SPLIT(tok, "end.\n", "end", ".\n");
    SPLIT(tok, "trailing   ", "trailing", "   ");
    rt_tokenizer_destroy(tok);
}

static void test_pretokenize_deepseek_v3(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "deepseek-v3");
    SPLIT(tok, "abc123def", "abc", "123", "def");
    SPLIT(tok, "1234567", "123", "456", "7");
    /* CJK and kana runs are cut out before the word split. */
    SPLIT(tok, "hi\xE6\x97\xA5\xE6\x9C\xAC", "hi", "\xE6\x97\xA5\xE6\x9C\xAC");
    SPLIT(tok, "\xE6\x97\xA5\xE6\x9C\xAC\xE3\x81\xA7\xE3\x81\x99",
          "\xE6\x97\xA5\xE6\x9C\xAC\xE3\x81\xA7\xE3\x81\x99");
    /* One ASCII punctuation mark joins the letters after it. */
    SPLIT(tok, ".Hello world", ".Hello", " world");
    SPLIT(tok, "a, b", "a", ",", " b");
    /* Each piece is split alone: the space before a digit run ends its piece. */
    SPLIT(tok, "x 1", "x", " ", "1");
    SPLIT(tok, "a\n\nb", "a", "\n\n", "b");
    rt_tokenizer_destroy(tok);
}

/* GPT-4o / gpt-oss (o200k). The expected pieces were produced by Python's `regex`
 * module running the pattern of gpt-oss's tokenizer.json unchanged (its \s, like
 * the reference engine's, includes U+0085). */
static void test_pretokenize_gpt4o(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    rt_tokenizer_t *tok = vb_build(&v, "gpt2", "gpt-4o");
    /* Case changes cut words; an upper-case run keeps its lower-case tail. */
    SPLIT(tok, "Hello world", "Hello", " world");
    SPLIT(tok, "HelloWorld", "Hello", "World");
    SPLIT(tok, "helloWorld", "hello", "World");
    SPLIT(tok, "HTTPServer iPHONE", "HTTPServer", " i", "PHONE");
    /* Contractions in either case stay on their word; a quote after a space does
     * not start one. */
    SPLIT(tok, "I'm DON'T they'LL we've", "I'm", " DON'T", " they'LL", " we've");
    SPLIT(tok, "don'tStop", "don't", "Stop");
    SPLIT(tok, "She'S HE'd", "She'S", " HE'd");
    SPLIT(tok, " 's", " '", "s");
    /* Digits in runs of up to three, apart from letters and punctuation. */
    SPLIT(tok, "12345", "123", "45");
    SPLIT(tok, "a1234567b", "a", "123", "456", "7", "b");
    SPLIT(tok, "$100 3.14159", "$", "100", " ", "3", ".", "141", "59");
    /* White space: a run before a word leaves its last space to the word; newlines
     * end a run. */
    SPLIT(tok, "x\n\n  y", "x", "\n\n", " ", " y");
    SPLIT(tok, "a  b", "a", " ", " b");
    SPLIT(tok, "trailing   ", "trailing", "   ");
    SPLIT(tok, "\tindent\n    code", "\tindent", "\n", "   ", " code");
    SPLIT(tok, "x\r\ny", "x", "\r\n", "y");
    SPLIT(tok, "a \n b", "a", " \n", " b");
    /* Other scripts: Cyrillic case (a case change cuts across scripts too), CJK and
     * kana (Lo counts as either case), a combining mark (M, likewise), a titlecase
     * letter (Lt, upper), Greek with a capital final sigma. */
    SPLIT(tok, "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xD0\xBC\xD0\xB8\xD1\x80",
          "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", " \xD0\xBC\xD0\xB8\xD1\x80");
    SPLIT(tok, "hello\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82",
          "hello", "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82");
    SPLIT(tok, "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E" "\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88",
          "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E" "\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88");
    SPLIT(tok, "nai\xCC\x88ve", "nai\xCC\x88ve");
    SPLIT(tok, "\xC7\x85ungla", "\xC7\x85ungla");
    SPLIT(tok, "\xCE\x91\xCE\xB8\xCE\xAE\xCE\xBD\xCE\xB1\xCE\xA3 x",
          "\xCE\x91\xCE\xB8\xCE\xAE\xCE\xBD\xCE\xB1", "\xCE\xA3", " x");
    /* An emoji and its skin-tone modifier are neither letters, digits nor space:
     * they split as punctuation does. */
    SPLIT(tok, "hi \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD there",
          "hi", " \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD", " there");
    /* Punctuation runs take the newlines and slashes after them. */
    SPLIT(tok, "!!!? x", "!!!?", " x");
    SPLIT(tok, "end.\n", "end", ".\n");
    SPLIT(tok, "path/to//file", "path", "/to", "//", "file");
    SPLIT(tok, "a...\r\n/b", "a", "...\r\n/", "b");
    SPLIT(tok, "foo(); // x\n", "foo", "();", " //", " x", "\n");
    SPLIT(tok, "__init__", "__", "init", "__");
    SPLIT(tok, "\xC2\xA1Hola!", "\xC2\xA1Hola", "!");
    /* U+0085 counts as white space and U+FEFF does not, as in the reference
     * engine (JavaScript's \s has it the other way round); (?i:'s) folds by Unicode,
     * so 's' matches U+017F. */
    SPLIT(tok, "a\xC2\x85 b", "a", "\xC2\x85", " b");
    SPLIT(tok, "a \xC2\x85" "b", "a", " ", "\xC2\x85" "b");
    SPLIT(tok, "x\xEF\xBB\xBF#", "x", "\xEF\xBB\xBF#");
    SPLIT(tok, "it'\xC5\xBFs", "it'\xC5\xBF", "s");
    rt_tokenizer_destroy(tok);
}

/* What "gpt-4o" implies besides the split, as llama.cpp has it: no BOS unless the
 * file asks, no NFC, and merges applied to every word (ignore_merges off; for
 * gpt-oss's vocabulary every token is what its own merges give, so this matches
 * its tokenizer.json's ignore_merges = true). */
static void test_gpt4o_defaults(void **state)
{
    (void)state;
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    int32_t ab = vb_add(&v, "ab", RT_TOKEN_NORMAL, 0);
    vb_add(&v, "abc", RT_TOKEN_NORMAL, 0); /* a token no merge makes */
    int32_t bos = vb_add(&v, "<|startoftext|>", RT_TOKEN_CONTROL, 0);
    vb_merge(&v, "a b");
    rt_tokenizer_desc_t d = vb_desc(&v, "gpt2", "gpt-4o");
    d.bos_id = bos;
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = { 0 };
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
    assert_false(rt_tokenizer_add_bos(tok));
    EXPECT(tok, "abc", RT_TOKENIZE_ADD_SPECIAL, ab, 'c');
    /* e + U+0301 stays as written (NFC would make it U+00E9: C3 A9) */
    EXPECT(tok, "e\xCC\x81", 0, 'e', 0xCC, 0x81);
    rt_tokenizer_destroy(tok);

    d.add_bos = 1; /* tokenizer.ggml.add_bos_token */
    assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
    assert_true(rt_tokenizer_add_bos(tok));
    EXPECT(tok, "abc", RT_TOKENIZE_ADD_SPECIAL, bos, ab, 'c');
    rt_tokenizer_destroy(tok);
}

/* --- random round trips ------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint64_t test_seed(void)
{
    const char *env = getenv("BLOOMERY_TEST_SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) * 2654435761u;
    if (!seed)
        seed = 1;
    print_message("seed %llu (BLOOMERY_TEST_SEED replays it)\n", (unsigned long long)seed);
    return seed;
}

/* Random text: ASCII, white space, two- to four-byte characters, and, when
 * invalid is set, stray bytes that are not UTF-8. */
static size_t random_text(uint64_t *rng, char *buf, size_t cap, int invalid)
{
    static const uint32_t cps[] = { 'a', 'Z', '7', ' ', '\n', '\t', '\r', '.', '\'', 0xE9,
                                    0x301, 0x85, 0xA0, 0x440, 0x3B1, 0x4E2D, 0x3042, 0x1F999,
                                    0x200D, 0xFFFD, 0x2581 };
    size_t n = rng_next(rng) % (cap / 8), w = 0;
    for (size_t i = 0; i < n && w + 4 < cap; i++) {
        uint64_t r = rng_next(rng);
        if (invalid && r % 17 == 0) {
            buf[w++] = (char)(0x80 + (r >> 8) % 0x80);
            continue;
        }
        uint32_t cp = cps[(r >> 8) % (sizeof cps / sizeof *cps)];
        if (cp < 0x80) {
            buf[w++] = (char)cp;
        } else if (cp < 0x800) {
            buf[w++] = (char)(0xC0 | (cp >> 6));
            buf[w++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            buf[w++] = (char)(0xE0 | (cp >> 12));
            buf[w++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[w++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[w++] = (char)(0xF0 | (cp >> 18));
            buf[w++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[w++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[w++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return w;
}

static int valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = rt__utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

static void round_trips(rt_tokenizer_t *tok, uint64_t *rng, const char *prefix)
{
    char text[512];
    for (int iter = 0; iter < 2000; iter++) {
        int invalid = iter % 2;
        size_t n = random_text(rng, text, sizeof text, invalid);
        rt_tokens_t ids = { 0 };
        bl_err_t err = { 0 };
        assert_int_equal(rt_tokenize(tok, text, n, 0, &ids, &err), 0);
        char *back = NULL;
        size_t bl = 0;
        assert_int_equal(rt_detokenize(tok, ids.ids, ids.n, 0, &back, &bl, &err), 0);
        assert_true(valid_utf8(back, bl));
        /* U+2581 in SentencePiece text reads back as a space, by design. */
        int spm_space = *prefix && memmem(text, n, "\xE2\x96\x81", 3);
        if (valid_utf8(text, n) && !spm_space) {
            size_t pl = n ? strlen(prefix) : 0;
            if (bl != pl + n || memcmp(back, prefix, pl) != 0 || memcmp(back + pl, text, n) != 0) {
                print_error("round trip of %zu bytes differs (iteration %d)\n", n, iter);
                for (size_t q = 0; q < n; q++)
                    print_error("%02x", (uint8_t)text[q]);
                print_error("\n");
                for (size_t q = 0; q < bl; q++)
                    print_error("%02x", (uint8_t)back[q]);
                print_error("\n");
                fail();
            }
        }
        free(back);
        rt_tokens_free(&ids);
    }
}

static void test_random_text_round_trips(void **state)
{
    (void)state;
    uint64_t rng = test_seed();
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    vb_add(&v, "\xC4\xA0" "a", 1, 0);
    vb_add(&v, "aZ", 1, 0);
    vb_merge(&v, "\xC4\xA0 a");
    vb_merge(&v, "a Z");
    const char *pres[] = { "qwen2", "llama-bpe", "deepseek-v3", "gpt-4o" };
    for (size_t p = 0; p < sizeof pres / sizeof *pres; p++) {
        rt_tokenizer_desc_t d = vb_desc(&v, "gpt2", pres[p]);
        d.add_bos = 0;
        d.nfc = 0; /* NFC would change the text; the BPE round trip is exact */
        rt_tokenizer_t *tok = NULL;
        bl_err_t err = { 0 };
        assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
        round_trips(tok, &rng, "");
        rt_tokenizer_destroy(tok);
    }
    /* SentencePiece gives the text back behind the space it adds in front. */
    static spm_t s;
    rt_tokenizer_t *tok = build_spm(&s, -1);
    round_trips(tok, &rng, " ");
    rt_tokenizer_destroy(tok);
}

/* A clone tokenizes as its source, on another thread at the same time. */
#define CLONE_TEXTS 400
typedef struct clone_run {
    rt_tokenizer_t *tok;
    char (*texts)[512];
    size_t *lens;
    rt_tokens_t *out;
} clone_run_t;

static void *clone_worker(void *arg)
{
    clone_run_t *c = arg;
    for (int i = 0; i < CLONE_TEXTS; i++) {
        bl_err_t err = { 0 };
        if (rt_tokenize(c->tok, c->texts[i], c->lens[i], RT_TOKENIZE_PARSE_SPECIAL, &c->out[i], &err)) {
            c->out[i].n = (size_t)-1;
        }
    }
    return NULL;
}

static void clone_check(rt_tokenizer_t *tok, uint64_t *rng)
{
    static char texts[CLONE_TEXTS][512];
    static size_t lens[CLONE_TEXTS];
    for (int i = 0; i < CLONE_TEXTS; i++)
        lens[i] = random_text(rng, texts[i], sizeof texts[i], i % 2);
    rt_tokenizer_t *clone = NULL;
    bl_err_t err = { 0 };
    assert_int_equal(rt_tokenizer_clone(&clone, tok, &err), 0);
    rt_tokens_t *a = calloc(CLONE_TEXTS, sizeof *a), *b = calloc(CLONE_TEXTS, sizeof *b);
    clone_run_t ra = { tok, texts, lens, a }, rb = { clone, texts, lens, b };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, clone_worker, &rb), 0);
    clone_worker(&ra);
    assert_int_equal(pthread_join(t, NULL), 0);
    for (int i = 0; i < CLONE_TEXTS; i++) {
        assert_int_equal(a[i].n, b[i].n);
        assert_true(a[i].n == (size_t)-1 || a[i].n == 0 ||
                    !memcmp(a[i].ids, b[i].ids, a[i].n * sizeof *a[i].ids));
        if (a[i].n != (size_t)-1)
            rt_tokens_free(&a[i]);
        if (b[i].n != (size_t)-1)
            rt_tokens_free(&b[i]);
    }
    free(a);
    free(b);
    /* a clone of a clone reads the same tables; either may go first */
    rt_tokenizer_t *second = NULL;
    assert_int_equal(rt_tokenizer_clone(&second, clone, &err), 0);
    rt_tokenizer_destroy(clone);
    rt_tokens_t ids = { 0 };
    assert_int_equal(rt_tokenize(second, "hello", 5, 0, &ids, &err), 0);
    rt_tokens_free(&ids);
    rt_tokenizer_destroy(second);
}

static void test_clone_tokenizes_as_its_source_at_once(void **state)
{
    (void)state;
    uint64_t rng = test_seed();
    static vb_t v;
    memset(&v, 0, sizeof v);
    vb_bytes(&v);
    vb_add(&v, "\xC4\xA0" "a", 1, 0);
    vb_add(&v, "aZ", 1, 0);
    vb_merge(&v, "\xC4\xA0 a");
    vb_merge(&v, "a Z");
    const char *pres[] = { "qwen2", "llama-bpe", "deepseek-v3", "gpt-4o" };
    for (size_t p = 0; p < sizeof pres / sizeof *pres; p++) {
        rt_tokenizer_desc_t d = vb_desc(&v, "gpt2", pres[p]);
        d.add_bos = 0;
        rt_tokenizer_t *tok = NULL;
        bl_err_t err = { 0 };
        assert_int_equal(rt_tokenizer_create(&tok, &d, &err), 0);
        clone_check(tok, &rng);
        rt_tokenizer_destroy(tok);
    }
    static spm_t s;
    rt_tokenizer_t *tok = build_spm(&s, -1);
    clone_check(tok, &rng);
    rt_tokenizer_destroy(tok);
}

/* --- the Qwen3 vocabulary and the oracle -------------------------------------------------- */

static const char *shared_dir(char *buf, size_t cap)
{
    const char *env = getenv("BLOOMERY_SHARED");
    snprintf(buf, cap, "%s", env && *env ? env : BL_SOURCE_ROOT "/../shared");
    return buf;
}

static rt_tokenizer_t *open_qwen3(void)
{
    char dir[1024], path[1200];
    shared_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/models/qwen3moe-tiny-q4k.gguf", dir);
    if (access(path, R_OK) != 0)
        return NULL;
    bl_gguf_t *g = NULL;
    bl_err_t err = { 0 };
    int rc = bl_gguf_open(&g, path, &err);
    if (rc)
        print_error("open: %s\n", err.msg);
    assert_int_equal(rc, 0);
    rt_tokenizer_t *tok = NULL;
    rc = rt_tokenizer_from_gguf(&tok, g, &err);
    if (rc)
        print_error("from_gguf: %s\n", err.msg);
    assert_int_equal(rc, 0);
    bl_gguf_close(g); /* the tokenizer keeps copies */
    return tok;
}

static void test_qwen3_oracle(void **state)
{
    (void)state;
    char dir[1024], path[1200];
    shared_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/oracle/tokenizer/qwen3.jsonl", dir);
    FILE *f = fopen(path, "r");
    rt_tokenizer_t *tok = f ? open_qwen3() : NULL;
    if (!tok) {
        if (f)
            fclose(f);
        print_message("skipped: %s or the qwen3moe-tiny model is absent\n", path);
        skip();
    }
    assert_int_equal(rt_tokenizer_n_vocab(tok), 151936);
    assert_int_equal(rt_tokenizer_bos(tok), 151643);
    assert_int_equal(rt_tokenizer_eos(tok), 151645);
    assert_int_equal(rt_tokenizer_eot(tok), 151645);
    assert_int_equal(rt_tokenizer_pad(tok), 151643);
    assert_false(rt_tokenizer_add_bos(tok));
    assert_true(rt_tokenizer_is_eog(tok, 151643));

    char *line = NULL;
    size_t cap = 0;
    int n = 0, good = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *j = json_loads(line, JSON_ALLOW_NUL, &je);
        assert_non_null(j);
        json_t *jt = json_object_get(j, "text"), *ji = json_object_get(j, "ids");
        const char *text = json_string_value(jt);
        size_t tl = json_string_length(jt);
        rt_tokens_t out = { 0 };
        bl_err_t err = { 0 };
        assert_int_equal(rt_tokenize(tok, text, tl, RT_TOKENIZE_PARSE_SPECIAL, &out, &err), 0);
        int same = out.n == json_array_size(ji);
        for (size_t i = 0; same && i < out.n; i++)
            same = out.ids[i] == json_integer_value(json_array_get(ji, i));
        if (!same)
            print_error("oracle line %d differs: %.80s\n", n + 1, text);
        good += same;
        n++;

        /* Decoding gives the text back, NFC-normalised: compare where NFC keeps it. */
        char *back = NULL;
        size_t bl = 0;
        assert_int_equal(rt_detokenize(tok, out.ids, out.n, RT_DETOK_SPECIAL, &back, &bl, &err), 0);
        int nfc_moves = 0;
        for (size_t i = 0; i < tl; i++)
            nfc_moves |= (uint8_t)text[i] >= 0xCC;
        if (!nfc_moves) {
            assert_int_equal(bl, tl);
            assert_memory_equal(back, text, tl);
        }
        free(back);
        rt_tokens_free(&out);
        json_decref(j);
    }
    free(line);
    fclose(f);
    print_message("qwen3 oracle: %d of %d strings match\n", good, n);
    assert_int_equal(n, 88);
    assert_int_equal(good, n);
    rt_tokenizer_destroy(tok);
}

static void test_qwen3_stream_decodes_split_emoji(void **state)
{
    (void)state;
    rt_tokenizer_t *tok = open_qwen3();
    if (!tok) {
        print_message("skipped: the qwen3moe-tiny model is absent\n");
        skip();
    }
    /* " this is 🦙.cpp": the llama's four bytes span three tokens. */
    const char *text = " this is \xF0\x9F\xA6\x99.cpp";
    rt_tokens_t ids = { 0 };
    bl_err_t err = { 0 };
    assert_int_equal(rt_tokenize(tok, text, strlen(text), 0, &ids, &err), 0);
    rt_detok_t *d = NULL;
    assert_int_equal(rt_detok_create(&d, tok, 0, &err), 0);
    char acc[128] = "";
    size_t al = 0;
    for (size_t i = 0; i < ids.n; i++) {
        const char *t;
        size_t n;
        assert_int_equal(rt_detok_push(d, ids.ids[i], &t, &n, &err), 0);
        /* Every chunk is whole UTF-8 on its own. */
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            int r = rt__utf8_next((const uint8_t *)t + k, n - k, &cp);
            assert_true(r > 0);
            k += (size_t)r;
        }
        memcpy(acc + al, t, n);
        al += n;
    }
    assert_int_equal(al, strlen(text));
    assert_memory_equal(acc, text, al);
    /* <|im_end|> is a control token: silent by default. */
    const char *t;
    size_t n;
    assert_int_equal(rt_detok_push(d, 151645, &t, &n, &err), 0);
    assert_int_equal(n, 0);
    rt_detok_destroy(d);
    rt_tokens_free(&ids);
    rt_tokenizer_destroy(tok);
}

/* --- the GGUF front end --------------------------------------------------------------------- */

/* Writes a GGUF holding only the given keys; returns its path in buf. */
static void write_gguf(char *path, size_t cap, int with_model, int tokens_as_ints)
{
    snprintf(path, cap, "/tmp/test_router_tokenizer_%d_XXXXXX", (int)getpid());
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    bl_gguf_writer_t *w = NULL;
    bl_err_t err = { 0 };
    assert_int_equal(bl_gw_create(&w, &err), 0);
    if (with_model)
        assert_int_equal(bl_gw_set_str(w, "tokenizer.ggml.model", "gpt2", &err), 0);
    assert_int_equal(bl_gw_set_str(w, "tokenizer.ggml.pre", "qwen2", &err), 0);
    if (tokens_as_ints) {
        const int32_t v[] = { 1, 2, 3 };
        assert_int_equal(bl_gw_set_arr(w, "tokenizer.ggml.tokens", BL_GGUF_I32, v, 3, &err), 0);
    } else {
        const char *const v[] = { "a", "b", "ab" };
        assert_int_equal(bl_gw_set_arr_str(w, "tokenizer.ggml.tokens", v, 3, &err), 0);
    }
    const char *const m[] = { "a b" };
    assert_int_equal(bl_gw_set_arr_str(w, "tokenizer.ggml.merges", m, 1, &err), 0);
    assert_int_equal(bl_gw_set_u32(w, "tokenizer.ggml.eos_token_id", 2, &err), 0);
    assert_int_equal(bl_gw_write_file(w, path, NULL, NULL, &err), 0);
    bl_gw_destroy(w);
}

static int from_file(const char *path, rt_tokenizer_t **tok, bl_err_t *err)
{
    bl_gguf_t *g = NULL;
    assert_int_equal(bl_gguf_open(&g, path, err), 0);
    int rc = rt_tokenizer_from_gguf(tok, g, err);
    bl_gguf_close(g);
    return rc;
}

static void test_from_gguf_small_and_broken(void **state)
{
    (void)state;
    char path[256];
    rt_tokenizer_t *tok = NULL;
    bl_err_t err = { 0 };

    write_gguf(path, sizeof path, 1, 0);
    assert_int_equal(from_file(path, &tok, &err), 0);
    assert_int_equal(rt_tokenizer_n_vocab(tok), 3);
    assert_int_equal(rt_tokenizer_eos(tok), 2);
    EXPECT(tok, "ab", 0, 2);
    rt_tokenizer_destroy(tok);
    unlink(path);

    write_gguf(path, sizeof path, 0, 0);
    assert_int_equal(from_file(path, &tok, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.model"));
    unlink(path);

    write_gguf(path, sizeof path, 1, 1);
    assert_int_equal(from_file(path, &tok, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.tokens"));
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clone_tokenizes_as_its_source_at_once),
        cmocka_unit_test(test_bpe_merges_follow_rank),
        cmocka_unit_test(test_bpe_equal_pairs_merge_leftmost_first),
        cmocka_unit_test(test_bpe_space_is_byte_level_character),
        cmocka_unit_test(test_bpe_invalid_utf8_input_becomes_replacement),
        cmocka_unit_test(test_bpe_long_space_run_is_not_refused),
        cmocka_unit_test(test_special_tokens_longest_first),
        cmocka_unit_test(test_special_ids_and_flags),
        cmocka_unit_test(test_fim_tokens),
        cmocka_unit_test(test_spm_merges_by_score),
        cmocka_unit_test(test_spm_byte_fallback),
        cmocka_unit_test(test_detok_holds_split_characters),
        cmocka_unit_test(test_create_rejects_bad_vocabularies),
        cmocka_unit_test(test_pretokenize_qwen2),
        cmocka_unit_test(test_pretokenize_llama3),
        cmocka_unit_test(test_pretokenize_deepseek_v3),
        cmocka_unit_test(test_pretokenize_gpt4o),
        cmocka_unit_test(test_gpt4o_defaults),
        cmocka_unit_test(test_random_text_round_trips),
        cmocka_unit_test(test_qwen3_oracle),
        cmocka_unit_test(test_qwen3_stream_decodes_split_emoji),
        cmocka_unit_test(test_from_gguf_small_and_broken),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
