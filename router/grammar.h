/* Grammars that constrain generation: llama.cpp's GBNF (the `grammar` request field,
 * and what JSON schemas become), compiled once per request, and a matcher that
 * follows the text generated so far and says which next bytes may come.
 *
 * GBNF: rules `name ::= alternatives`, the start rule `root`; alternatives separated
 * by `|`; items: "literal", [class] / [^class] with ranges, `.` (any character), a
 * rule name, ( group ), each optionally followed by *, +, ?, {m}, {m,}, {m,n}; `#`
 * comments. Escapes: \n \r \t \\ \" \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH. A rule ends at
 * the end of its line unless a group is open. Matching is over Unicode code points;
 * a token may end inside a UTF-8 sequence.
 *
 * Not thread-safe: one matcher per slot; a grammar may be shared by matchers. */
#ifndef RT_GRAMMAR_H
#define RT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct rt_grammar rt_grammar_t;
typedef struct rt_grammar_match rt_grammar_match_t;

/* Compiles text[0..len). BL_EINVAL with err naming the line and column and what is
 * wrong (a syntax error, an undefined rule, no root rule, left recursion, a
 * repetition count over 1000), BL_ERANGE (over 100,000 rules or elements),
 * BL_ENOMEM. Caller frees with rt_grammar_destroy. */
int rt_grammar_parse(rt_grammar_t **out, const char *text, size_t len, bl_err_t *err) BL_WUR;
void rt_grammar_destroy(rt_grammar_t *g);

/* A matcher at the start of g's root rule (g is borrowed and must outlive it).
 * Caller frees with rt_grammar_match_destroy. */
int rt_grammar_match_create(rt_grammar_match_t **out, const rt_grammar_t *g,
                            bl_err_t *err) BL_WUR;
void rt_grammar_match_destroy(rt_grammar_match_t *m);
/* Back to the start of the root rule. */
void rt_grammar_match_reset(rt_grammar_match_t *m);

/* 1 when bytes[0..len) can follow the text so far (some continuation of it may still
 * complete the grammar), else 0. An empty piece is accepted. Does not move m. */
int rt_grammar_match_accepts(rt_grammar_match_t *m, const char *bytes, size_t len);
/* Moves m past bytes[0..len): 0, or BL_EINVAL when they cannot follow (m is then
 * unchanged). */
int rt_grammar_match_feed(rt_grammar_match_t *m, const char *bytes, size_t len) BL_WUR;
/* A vocabulary as a trie of its pieces' bytes, so that a scan walks each shared
 * prefix once. pieces[i] (lens[i] bytes) is token i's text; tokens whose length is
 * 0 are left out. Caller frees with rt_grammar_vocab_destroy. BL_ENOMEM. */
typedef struct rt_grammar_vocab rt_grammar_vocab_t;
int rt_grammar_vocab_create(rt_grammar_vocab_t **out, const char *const *pieces,
                            const size_t *lens, int32_t n, bl_err_t *err) BL_WUR;
void rt_grammar_vocab_destroy(rt_grammar_vocab_t *v);

/* allowed[i] = 1 for every token of v whose piece can follow the text so far (what
 * rt_grammar_match_accepts says of it), else 0; allowed has n entries. Returns the
 * number allowed. Does not move m. */
size_t rt_grammar_match_scan(rt_grammar_match_t *m, const rt_grammar_vocab_t *v,
                             unsigned char *allowed);

/* 1 when the text so far is a whole match of the root rule (generation may end). */
int rt_grammar_match_done(const rt_grammar_match_t *m);

#endif
