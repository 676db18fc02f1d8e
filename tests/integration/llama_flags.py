"""llama-server's flags (../shared/docs/llama-server-flags.tsv) against bloomery-serve's
own table, as its --help prints it: what each flag does here, a sample value for
each, and the table of docs/serving.md ("llama-server's flags"), which is made from
them. `python3 tests/integration/llama_flags.py --write` rewrites that table after a
flag changes; the tests check that it matches."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("BLOOMERY_BIN") or os.path.join(ROOT, "build", "bin")
SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(ROOT), "shared")
TSV = os.path.join(SHARED, "docs", "llama-server-flags.tsv")
DOC = os.path.join(ROOT, "docs", "serving.md")
BEGIN = "<!-- llama-server flags: made by tests/integration/llama_flags.py --write -->"
END = "<!-- end of llama-server flags -->"


def rows():
    """(spellings, value, variable) of each row of the list."""
    out = []
    with open(TSV, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            c = line.rstrip("\n").split("\t")
            names = c[0].replace("|", " ").split()
            out.append((names, c[1] if len(c) > 1 else "", c[2] if len(c) > 2 else ""))
    return out


def serve_help():
    """spelling -> (help text, variable or None), from bloomery-serve --help."""
    p = subprocess.run([os.path.join(BIN, "bloomery-serve"), "--help"], capture_output=True, text=True,
                       check=True)
    table = {}
    for line in p.stdout.splitlines():
        m = re.match(r"  (-\S.*?)  +(.*)$", line)
        if not m:
            continue
        left, text = m.group(1), m.group(2)
        env = re.search(r" \(env: (\w+)\)$", text)
        if env:
            text = text[:env.start()]
        for part in left.split(", "):
            table[part.split()[0]] = (text, env.group(1) if env else None)
    return table


# a value each kind of llama-server value takes here (the flag's own checks pass)
SAMPLES = {
    "N": "1", "M": "1", "lo-hi": "0-0", "<0|1>": "0", "<0...100>": "50", "[on|off|auto]": "auto",
    "[on|off]": "on", "TYPE": "f16", "FNAME": "/nonexistent", "FILE": "/nonexistent", "PATH": "/nonexistent",
    "JINJA_TEMPLATE_FILE": "/nonexistent", "JINJA_TEMPLATE": "chatml", "PROMPT": "x", "STRING": "x",
    "SEED": "1", "SEQUENCE": "k", "SAMPLERS": "top_k", "TOKEN_ID(+/-)BIAS": "15+1", "GRAMMAR": 'root ::= "a"',
    "SCHEMA": "{}", "JSON": "{}", "{none,mean,cls,last,rank}": "none", "{none,linear,yarn}": "none",
    "{none,layer,row,tensor}": "layer", "SERVERS": "h:1", "<dev1,dev2,..>": "none", "INDEX": "0",
    "<tensor name pattern>=<buffer type>,...": "blk=CPU", "N0,N1,N2,...": "1", "MiB0,MiB1,MiB2,...": "1024",
    "KEY=TYPE:VALUE,...": "a=int:1", "FNAME:SCALE,...": "x:1", "START": "0", "HOST": "127.0.0.1",
    "PORT": "8080", "PREFIX": "/x", "ORIGINS": "*", "METHODS": "GET", "HEADERS": "*", "KEY": "k",
    "SECONDS": "60", "SIMILARITY": "0.1", "TOOL1,TOOL2,...": "read_file", "<user>/<model>[:quant]": "a/b",
    "MODE": "auto", "FORMAT": "auto", "P": "0.5", "MESSAGE": "x", "SIZE": "1",
}


# the list's value column holds a description for these, not a value
DESCRIPTIONS = {"Log disable", "Enable prefix in log messages", "Enable timestamps in log messages"}
# flags whose value the column does not show, or shows as another kind's
BY_FLAG = {"--numa": "distribute", "--spec-type": "none"}


def sample(value, name=None):
    """The value to pass with flag name whose list entry shows value (None: no value)."""
    if name in BY_FLAG:
        return BY_FLAG[name]
    if not value or value in DESCRIPTIONS:
        return None
    return SAMPLES.get(value, "1")


def state(text):
    """The table's words for a flag whose --help line is text."""
    for prefix, words in (("refused: ", "refused because "), ("accepted, no effect here: ", "accepted, no "
                          "effect here because "), ("works: what this server does anyway: ", "works (what this "
                          "server does anyway: "), ("accepted and logged: ", "accepted, no effect here because "),
                         ("accepted: ", "accepted, no effect here because ")):
        if text.startswith(prefix):
            rest = text[len(prefix):]
            return words + rest + (")" if words.startswith("works (") else "")
    m = re.match(r"accepted as (\S+) \(off\), other values refused: (.*)$", text)
    if m:
        return "works with %s (off); other values refused because %s" % (m.group(1).replace("|", " or "),
                                                                          m.group(2))
    return "works: " + text


def table():
    """The markdown table of every row of the list, as docs/serving.md holds it."""
    help_ = serve_help()
    lines = [BEGIN, "", "| llama-server's flag | variable | here |", "|---|---|---|"]
    for names, value, env in rows():
        states = []
        for n in names:
            s = state(help_[n][0]) if n in help_ else "unknown"
            if s not in states:
                states.append(s)
        flag = " ".join("`%s`" % n for n in names) + (" `%s`" % value if sample(value, names[0]) else "")
        lines.append("| %s | %s | %s |" % (flag.replace("|", "\\|"), "`%s`" % env if env else "",
                                           "; ".join(states).replace("|", "\\|")))
    lines += ["", END]
    return "\n".join(lines)


def doc_table():
    """The table docs/serving.md holds now."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    a, b = text.find(BEGIN), text.find(END)
    return text[a:b + len(END)] if a >= 0 and b > a else None


def write():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        sys.exit("%s has no %s ... %s markers" % (DOC, BEGIN, END))
    new = table()  # before the file is opened for writing: a failure leaves it whole
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(text[:a] + new + text[b + len(END):])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(table())
