#!/usr/bin/env python3
"""Writes a file's bytes as a C array: embed.py INPUT OUTPUT NAME gives
`const char NAME[]` (NUL-terminated) and `const size_t NAME_len` (without the NUL),
so that bloomery-serve carries its web page inside the binary."""
import sys


def main():
    src, dst, name = sys.argv[1:4]
    data = open(src, "rb").read()
    with open(dst, "w") as f:
        f.write("/* Generated from %s by router/webui/embed.py; do not edit. */\n"
                % src.split("/")[-1])
        f.write("#include <stddef.h>\n\nconst char %s[] = {\n" % name)
        for i in range(0, len(data), 16):
            f.write("    " + ", ".join("0x%02x" % b for b in data[i:i + 16]) + ",\n")
        f.write("    0x00};\nconst size_t %s_len = %d;\n" % (name, len(data)))


if __name__ == "__main__":
    main()
