/* JSON Schema to GBNF: the grammar that constrains generation for OpenAI's
 * response_format {"type": "json_schema"} and {"type": "json_object"} and for
 * llama-server's "json_schema" field.
 *
 * The converter takes the subset of JSON Schema that structured output uses (types,
 * properties, required, additionalProperties, items, prefixItems, min/maxItems,
 * min/maxLength, pattern, enum, const, anyOf/oneOf, allOf of objects, $ref into $defs,
 * a few string formats, minimum/maximum/exclusiveMinimum/exclusiveMaximum on integers) and
 * refuses, by name, every keyword it cannot honour, so that a grammar never accepts
 * text the schema rejects for a reason the converter skipped (bounds on a "number",
 * draft-4 boolean exclusive bounds and multipleOf other than 1 are refused).
 * Annotations (title, description, default, examples, ...) are ignored.
 *
 * Where JSON Schema leaves a choice to the text (key order, number spelling), the
 * grammar takes one: present properties come in the schema's order, extra keys after
 * them; integers have at most 16 digits, fractions and exponents at most 16; whitespace
 * between tokens is at most 20 characters of space, tab or newline (rule "ws").
 *
 * Integer bounds are exact for any bounds within int64: the grammar takes the integers
 * from the lower bound to the upper one written canonically (no leading zeros, no "-0";
 * non-integral bounds round inward, bounds past int64 clamp to its ends), as
 * alternatives by digit count and shared prefix, never by listing values. A side
 * without a bound stops at 16 digits like any integer, unless the other bound lies past
 * 16 digits: then it stops at the end of int64. A range with no integer in it is
 * BL_EINVAL naming its keywords.
 *
 * A string's "pattern" (ECMA-262, no flags) takes literals and escaped metacharacters,
 * '.' (not a line break), classes [...] [^...] with ranges, \d \D \w \W \s \S, \t \n
 * \r \f \v \0 \xHH \uHHHH (a surrogate pair outside a class is its character), groups
 * ( ) and (?: ), '|', * + ? {m} {m,} {m,n} (counts up to 1000, else BL_ERANGE; lazy ones
 * read as greedy), '^' at the start and '$' at the end of a top-level alternative; a
 * side without its anchor takes any characters. The grammar matches the string's JSON
 * text: '"', '\' and control characters as their escapes (short ones, else \u00xx),
 * every other character raw. Lookarounds, backreferences, \b, named groups, anchors
 * elsewhere, flags and other escapes are BL_EINVAL naming 'pattern' and the part; a
 * pattern over 4096 bytes or with groups nested deeper than 64 is BL_ERANGE. A pattern
 * beside minLength, maxLength or a known format is refused. */
#ifndef RT_JSON_SCHEMA_H
#define RT_JSON_SCHEMA_H

#include <jansson.h>

#include "err.h"

/* The most nesting of schemas (objects in objects, $ref in $ref, ...) converted, and
 * the largest grammar produced, in bytes. */
#define RT_JSON_SCHEMA_MAX_DEPTH 64
#define RT_JSON_SCHEMA_MAX_GBNF (1u << 20)

/* JSON Schema (the subset structured output uses) to a GBNF grammar whose rule
 * "root" matches exactly the JSON texts the schema accepts, with optional
 * whitespace between tokens.
 *
 * *out: NUL-terminated GBNF text, caller frees with free(); NULL on failure.
 * Returns 0; BL_EINVAL with err naming the keyword and its JSON path (e.g.
 * "json_schema: 'not' at /properties/a is not supported") for a schema this
 * converter cannot honour or a malformed one; BL_ERANGE for a schema nested deeper
 * than RT_JSON_SCHEMA_MAX_DEPTH, a count too large to express, or a grammar over
 * RT_JSON_SCHEMA_MAX_GBNF bytes; BL_ENOMEM.
 *
 * The schema is untrusted input and only read. Thread-safe (no shared state). */
int rt_json_schema_to_gbnf(const json_t *schema, char **out, bl_err_t *err) BL_WUR;

#endif
