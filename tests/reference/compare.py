#!/usr/bin/python3
"""Compare two logit dumps in the oracle JSON format.

Owns: the comparison metrics used by tests and gates:
  - positions: number of prompt positions compared
  - top1_same: positions where both files put the same id first
  - mean_abs_dlogit / max_abs_dlogit: over, at each position, the first
    file's top-`top` ids that also appear in the second file's list
  - n_compared / n_missing: how many such (position, id) pairs were and were
    not found in the second file
  - max_abs_dlse: the largest |lse_a - lse_b|
  - greedy_prefix: length of the common prefix of the two greedy
    continuations (when both files have one), greedy_len: the shorter length

Library: load(path), compare(a, b, top=32) -> dict, check(result, ...) -> list
of failed gate messages. CLI:
  compare.py A.json B.json [--top 32] [--min-top1 FRACTION] [--max-mean X]
             [--max-max X] [--max-lse X] [--min-greedy N] [--json]
prints the metrics and exits 1 when a given gate fails, 2 on unusable input.
"""

import argparse
import json
import sys


class CompareError(ValueError):
    pass


def load(path):
    with open(path) as f:
        return json.load(f)


def compare(a, b, top=32):
    """Metrics of b against a (a is the reference). a, b: dicts or paths."""
    if isinstance(a, str):
        a = load(a)
    if isinstance(b, str):
        b = load(b)
    pa, pb = a.get("positions", []), b.get("positions", [])
    if a.get("prompt_ids") is not None and b.get("prompt_ids") is not None:
        if list(a["prompt_ids"]) != list(b["prompt_ids"]):
            raise CompareError("the two files have different prompt_ids")
    if len(pa) != len(pb):
        raise CompareError("position counts differ: %d vs %d" % (len(pa), len(pb)))
    if a.get("n_vocab") is not None and b.get("n_vocab") is not None and a["n_vocab"] != b["n_vocab"]:
        raise CompareError("n_vocab differs: %s vs %s" % (a["n_vocab"], b["n_vocab"]))
    top1 = 0
    total = 0.0
    n_cmp = 0
    n_missing = 0
    dmax = 0.0
    lse_max = 0.0
    per_pos = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x["ids"] and y["ids"] and x["ids"][0] == y["ids"][0]:
            top1 += 1
        ymap = dict(zip(y["ids"], y["logits"]))
        pmax = 0.0
        for tid, val in list(zip(x["ids"], x["logits"]))[:top]:
            if tid in ymap:
                d = abs(val - ymap[tid])
                total += d
                n_cmp += 1
                pmax = max(pmax, d)
            else:
                n_missing += 1
        dmax = max(dmax, pmax)
        dl = abs(x["lse"] - y["lse"]) if "lse" in x and "lse" in y else 0.0
        lse_max = max(lse_max, dl)
        per_pos.append({"pos": i, "top1_same": bool(x["ids"] and y["ids"] and x["ids"][0] == y["ids"][0]),
                        "max_abs_dlogit": pmax, "abs_dlse": dl})
    res = {
        "positions": len(pa),
        "top1_same": top1,
        "top1_fraction": (top1 / len(pa)) if pa else 1.0,
        "mean_abs_dlogit": (total / n_cmp) if n_cmp else 0.0,
        "max_abs_dlogit": dmax,
        "n_compared": n_cmp,
        "n_missing": n_missing,
        "max_abs_dlse": lse_max,
        "per_position": per_pos,
    }
    ga, gb = a.get("greedy"), b.get("greedy")
    if ga is not None and gb is not None:
        n = min(len(ga), len(gb))
        k = 0
        while k < n and ga[k]["id"] == gb[k]["id"]:
            k += 1
        res["greedy_prefix"] = k
        res["greedy_len"] = n
    return res


def check(res, min_top1=None, max_mean=None, max_max=None, max_lse=None, min_greedy=None):
    """Failed gates as messages (empty list: all passed)."""
    bad = []
    if min_top1 is not None and res["top1_fraction"] < min_top1:
        bad.append("top-1 agreement %d/%d < %.4f" % (res["top1_same"], res["positions"], min_top1))
    if max_mean is not None and res["mean_abs_dlogit"] > max_mean:
        bad.append("mean |dlogit| %.6g > %.6g" % (res["mean_abs_dlogit"], max_mean))
    if max_max is not None and res["max_abs_dlogit"] > max_max:
        bad.append("max |dlogit| %.6g > %.6g" % (res["max_abs_dlogit"], max_max))
    if max_lse is not None and res["max_abs_dlse"] > max_lse:
        bad.append("max |dlse| %.6g > %.6g" % (res["max_abs_dlse"], max_lse))
    if min_greedy is not None:
        if "greedy_prefix" not in res:
            bad.append("greedy continuation missing from a file")
        elif res["greedy_prefix"] < min_greedy:
            bad.append("greedy prefix %d < %d" % (res["greedy_prefix"], min_greedy))
    return bad


def summary(res):
    s = ("positions %d  top-1 same %d (%.4f)  mean |dlogit| %.6g  max |dlogit| %.6g  "
         "max |dlse| %.6g  compared %d  missing %d"
         % (res["positions"], res["top1_same"], res["top1_fraction"], res["mean_abs_dlogit"],
            res["max_abs_dlogit"], res["max_abs_dlse"], res["n_compared"], res["n_missing"]))
    if "greedy_prefix" in res:
        s += "  greedy prefix %d/%d" % (res["greedy_prefix"], res["greedy_len"])
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(description="compare two oracle-format logit dumps (A = reference)")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--top", type=int, default=32)
    ap.add_argument("--min-top1", type=float, help="minimum fraction of positions with the same top-1")
    ap.add_argument("--max-mean", type=float, help="maximum mean |dlogit|")
    ap.add_argument("--max-max", type=float, help="maximum max |dlogit|")
    ap.add_argument("--max-lse", type=float, help="maximum |dlse|")
    ap.add_argument("--min-greedy", type=int, help="minimum common greedy prefix")
    ap.add_argument("--json", action="store_true", help="print the metrics as JSON")
    a = ap.parse_args(argv)
    try:
        res = compare(a.a, a.b, top=a.top)
    except (CompareError, OSError, ValueError, KeyError) as e:
        print("compare: %s" % e, file=sys.stderr)
        return 2
    bad = check(res, a.min_top1, a.max_mean, a.max_max, a.max_lse, a.min_greedy)
    if a.json:
        r = dict(res)
        r.pop("per_position")
        r["failed"] = bad
        print(json.dumps(r, indent=1))
    else:
        print(summary(res))
        for m in bad:
            print("FAIL: " + m)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
