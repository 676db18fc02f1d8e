#!/usr/bin/python3
"""Command line front end of the float64 reference forward pass.

Owns: the `reference.py` CLI and the writer of the oracle JSON format

  {"model", "n_vocab", "prompt_ids",
   "positions": [{"lse", "ids", "logits"}, ...],      one per prompt position
   "greedy": [{"id", "top": {"lse", "ids", "logits"}}, ...]}   with -n N

Usage:
  reference.py MODEL.gguf (--ids 1,2,3 | --ids-file F.json | --oracle O.json)
               --dump-logits OUT.json [--top 32] [-n N] [--greedy-top 4] [--mtp] [--lazy] [-q]

--ids-file takes a JSON list of ids or an object with "prompt_ids";
--oracle takes the prompt_ids of an oracle file. "-" as OUT writes stdout.

--mtp: the rows of the model's first NextN layer instead, one for each greedy id of
the input (an oracle file's "greedy" ids after its prompt_ids, P of them then G):
positions i = P-1 .. P+G-2 of the NextN layer, row i reading the hidden state at i
and the id after it, and predicting the id after that (what bloomery-cli --mtp
dumps as "mtp").
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import model as refmodel  # noqa: E402


def run(model_path, prompt_ids, top=32, n_greedy=0, greedy_top=4, model=None, log=None):
    """Forward pass over prompt_ids; returns the oracle-format dict."""
    t0 = time.time()
    m = model if model is not None else refmodel.Model(model_path)
    t1 = time.time()
    h = m.hidden(prompt_ids)
    t2 = time.time()
    lse, ids, vals = m.head(h, top=top)
    t3 = time.time()
    out = {
        "model": model_path,
        "n_vocab": int(m.n_vocab),
        "prompt_ids": [int(i) for i in prompt_ids],
        "positions": [
            {"lse": float(lse[i]), "ids": ids[i].tolist(), "logits": vals[i].tolist()}
            for i in range(len(prompt_ids))
        ],
    }
    if n_greedy > 0:
        g = refmodel.greedy(m, prompt_ids, n_greedy, top=greedy_top)
        out["greedy"] = [
            {"id": tid, "top": {"lse": l, "ids": tids, "logits": tvals}}
            for tid, l, tids, tvals in g
        ]
    t4 = time.time()
    if log is not None:
        log("reference: %s, %d positions: load %.1fs, layers %.1fs, head %.1fs, greedy %.1fs"
            % (model_path, len(prompt_ids), t1 - t0, t2 - t1, t3 - t2, t4 - t3))
    return out


def run_mtp(model, prompt_ids, greedy_ids, top=32):
    """The NextN layer's rows after each greedy id, in the oracle format."""
    ids = list(prompt_ids) + list(greedy_ids)
    rows = model.mtp_hidden(ids)[len(prompt_ids) - 1:]
    lse, tid, vals = model.mtp_head(rows, top=top)
    return {
        "model": model.path,
        "n_vocab": int(model.n_vocab),
        "prompt_ids": [int(i) for i in ids],
        "positions": [{"lse": float(lse[i]), "ids": tid[i].tolist(), "logits": vals[i].tolist()}
                      for i in range(len(greedy_ids))],
    }


def dumps(doc):
    """Serialize in the oracle files' layout: one position per line."""
    head = {k: doc[k] for k in ("model", "n_vocab", "prompt_ids")}
    s = json.dumps(head)[:-1]
    s += ',\n "positions": [\n' + ",\n".join(json.dumps(p) for p in doc["positions"]) + "\n]"
    if "greedy" in doc:
        s += ',\n "greedy": [\n' + ",\n".join(json.dumps(g) for g in doc["greedy"]) + "\n]"
    return s + "}\n"


def parse_ids(text):
    return [int(x) for x in text.replace(" ", "").split(",") if x != ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 reference forward pass (%s)"
                                 % ", ".join(refmodel.SUPPORTED_ARCHS))
    ap.add_argument("model", help="GGUF model file")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="comma-separated token ids")
    src.add_argument("--ids-file", help="JSON list of ids, or an object with prompt_ids")
    src.add_argument("--oracle", help="oracle JSON file whose prompt_ids to use")
    ap.add_argument("--dump-logits", required=True, metavar="OUT", help="output JSON ('-' for stdout)")
    ap.add_argument("--top", type=int, default=32, help="ids per position (default 32)")
    ap.add_argument("-n", type=int, default=0, help="greedy continuation length")
    ap.add_argument("--greedy-top", type=int, default=4, help="ids per greedy step (default 4)")
    ap.add_argument("--mtp", action="store_true",
                    help="the NextN layer's rows after each greedy id of the input (see above)")
    ap.add_argument("--lazy", action="store_true",
                    help="decode weights as they are used (automatic for large files)")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)

    gids = []
    try:
        if a.ids is not None:
            ids = parse_ids(a.ids)
        else:
            with open(a.ids_file or a.oracle) as f:
                doc = json.load(f)
            ids = doc["prompt_ids"] if isinstance(doc, dict) else doc
            ids = [int(i) for i in ids]
            gids = [int(g["id"]) for g in doc.get("greedy", [])] if isinstance(doc, dict) else []
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error("cannot read token ids: %s" % e)
    if not ids:
        ap.error("no token ids")
    if a.mtp and (a.ids is not None or not gids):
        ap.error("--mtp needs an oracle or ids file with greedy ids")

    log = None if a.quiet else (lambda msg: print(msg, file=sys.stderr))
    try:
        m = refmodel.Model(a.model, lazy=True if a.lazy else None)
        if a.mtp:
            out = run_mtp(m, ids, gids, top=a.top)
        else:
            out = run(a.model, ids, top=a.top, n_greedy=a.n, greedy_top=a.greedy_top, model=m, log=log)
        text = dumps(out)
        if a.dump_logits == "-":
            sys.stdout.write(text)
        else:
            with open(a.dump_logits, "w") as f:
                f.write(text)
    except (OSError, ValueError, KeyError, NotImplementedError) as e:
        print("reference.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
