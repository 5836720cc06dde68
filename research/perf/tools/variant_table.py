# Side by side: the rows of research/perf/time_variants.sh's output, one line per shape, each
# variant's bf16 / fp8 / int8 microseconds in the order the variants ran.
#   usage: python3 variant_table.py output.txt
import re
import sys

text = open(sys.argv[1]).read()
parts = re.split(r"^== (\S+)\n", text, flags=re.M)[1:]
rows, order = {}, []
for name, body in zip(parts[::2], parts[1::2]):
    for line in body.strip().split("\n"):
        f = line.split()
        if len(f) < 12 or not f[0].isdigit():
            continue
        key = tuple(f[:3])
        if key not in rows:
            order.append(key)
        rows.setdefault(key, []).append(f"{name}:{f[4]}/{f[7]}/{f[11]}")
for key in order:
    print("h_q %s b %s s_k %s  " % key + "  ".join(rows[key]))
