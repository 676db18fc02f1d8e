#!/usr/bin/env python3
"""Byte-level BPE pieces a server should not emit on a random model.

    bpe_bans.py TOKENIZER_JSON

prints a request body ({"logit_bias": [[id, false], ...]}) that bans the vocabulary's
pieces that are not whole UTF-8 and its added (control) tokens: llama-server's output
parser refuses a stream of pieces that are not whole UTF-8, which a random model emits.
byte_decoder() is the GPT-2 byte alphabet the tests decode pieces with.
"""
import json
import sys


def byte_decoder():
    """GPT-2's byte-level alphabet, code point -> byte."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
          list(range(ord("\xae"), ord("\xff") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def bans(tokenizer):
    """The ids of the added tokens and of the pieces that are not whole UTF-8."""
    dec = byte_decoder()
    out = set(a["id"] for a in tokenizer.get("added_tokens", []))
    for piece, i in tokenizer["model"]["vocab"].items():
        try:
            bytes(dec[ch] for ch in piece).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            out.add(i)
    return sorted(out)


def main(argv):
    if len(argv) != 2:
        print("usage: bpe_bans.py TOKENIZER_JSON", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            tok = json.load(f)
        ids = bans(tok)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"bpe_bans: {argv[1]}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"logit_bias": [[i, False] for i in ids]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
