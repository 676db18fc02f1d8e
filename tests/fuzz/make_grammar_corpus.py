#!/usr/bin/python3
"""Writes seeds for fuzz_grammar into a folder: GBNF grammars and JSON schemas as
requests send them, each with a text to run (format: one byte, even for GBNF and odd
for a schema, the spec, a NUL, the text).

  /usr/bin/python3 tests/fuzz/make_grammar_corpus.py CORPUS_DIR
"""
import json
import os
import sys

GRAMMARS = [
    ('root ::= ("yes" | "no") " " [0-9]{1,3} "."\n', "yes 42."),
    ('root ::= list\nlist ::= "[" ws ( item ( ws "," ws item )* )? ws "]"\n'
     'item ::= [0-9]+ | list\nws ::= [ \\t\\n]*\n', "[1, [2, 3], []]"),
    ('root ::= "\\u00e9" [\\u03b1-\\u03c9]+ "\\xe2" . # comment\n', "\u00e9\u03b2\u03b3\u00e2x"),
    ('root ::= x*\nx ::= "a" | "aa" | y\ny ::= "a" "a"?\n', "aaaaaaa"),
    ('root ::= "<think>" .* "</think>" [ \\n]{0,2} "{" [^}]* "}"\n', "<think>hm</think>\n{a}"),
]

SCHEMAS = [
    ({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},
                                       "s": {"type": "string", "maxLength": 4}},
      "required": ["ok"]}, '{"ok": true, "n": -12, "s": "ab"}'),
    ({"type": "array", "items": {"enum": ["red", "green", 1, None]}, "minItems": 1,
      "maxItems": 3}, '["red", 1]'),
    ({"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {
        "v": {"type": "number"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}}},
     '{"v": 1.5, "kids": [{"v": 2}]}'),
    ({"anyOf": [{"type": "null"}, {"const": "x\"y"}, {"type": "string", "format": "date"}]},
     '"2026-11-30"'),
    ({}, '{"a": [1, 2.5e3, "\\u00e9", null]}'),
    ({"type": "object", "properties": {
        "p": {"type": "number", "minimum": -0.5, "exclusiveMaximum": 2.25},
        "q": {"type": "integer", "exclusiveMinimum": -3, "maximum": 12}}},
     '{"p": 2.2499, "q": 11}'),
]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = [(0, g, t) for g, t in GRAMMARS] + [(1, json.dumps(s), t) for s, t in SCHEMAS]
    for i, (kind, spec, text) in enumerate(seeds):
        with open(os.path.join(out, "seed-%02d" % i), "wb") as f:
            f.write(bytes([kind + 2 * i % 256]) + spec.encode() + b"\0" + text.encode())


if __name__ == "__main__":
    main()
