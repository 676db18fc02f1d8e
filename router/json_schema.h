/* JSON Schema to GBNF: the grammar that constrains generation for OpenAI's
 * response_format {"type": "json_schema"} and {"type": "json_object"} and for
 * llama-server's "json_schema" field.
 *
 * The converter takes the subset of JSON Schema that structured output uses (types,
 * properties, required, additionalProperties, items, prefixItems, min/maxItems,
 * min/maxLength, enum, const, anyOf/oneOf, allOf of objects, $ref into $defs, a few
 * string formats, minimum/maximum/exclusiveMinimum/exclusiveMaximum on integers) and
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
 * BL_EINVAL naming its keywords. */
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
 * "json_schema: 'pattern' at /properties/a is not supported") for a schema this
 * converter cannot honour or a malformed one; BL_ERANGE for a schema nested deeper
 * than RT_JSON_SCHEMA_MAX_DEPTH, a count too large to express, or a grammar over
 * RT_JSON_SCHEMA_MAX_GBNF bytes; BL_ENOMEM.
 *
 * The schema is untrusted input and only read. Thread-safe (no shared state). */
int rt_json_schema_to_gbnf(const json_t *schema, char **out, bl_err_t *err) BL_WUR;

#endif
