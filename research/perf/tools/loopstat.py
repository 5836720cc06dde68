# Instruction mix of the innermost SASS loops that contain HMMA (per iteration = per KV tile).
# usage: python loopstat.py file.sass   (cuobjdump -sass output, one function or many)
# Prints, per kernel, each innermost loop's instruction range, its head's slot (index mod 8
# in a 128-byte line) and its opcode counts.
import re, sys, collections
funcs = re.split(r"\n\s*Function : ", open(sys.argv[1]).read())
for fn in funcs[1:]:
    name = fn.split("\n", 1)[0].strip()
    ins = []
    for line in fn.split("\n"):
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m: ins.append((int(m.group(1), 16), m.group(2).strip()))
    addr = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r"BRA (?:P\d, )?(?:`\()?0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) < a:
            s = addr.get(int(m.group(1), 16))
            if s is not None and any("HMMA" in x for _, x in ins[s:i + 1]): loops.append((s, i))
    # innermost: no other loop strictly inside
    inner = [l for l in loops if not any(o != l and o[0] >= l[0] and o[1] <= l[1] for o in loops)]
    short = re.sub(r"_ZN2kf4cuda2(v\d+\w*?)22mla_decode_sm80_kernelINS\d_15MlaDecodeTraitsI(.*?)EE.*", r"\1 \2", name)
    print(short[:90], "total", len(ins))
    for s, e in inner:
        c = collections.Counter()
        for _, t in ins[s:e + 1]:
            op = re.sub(r"^@!?P\w+ ", "", t).split()[0]
            c[op.split(".")[0]] += 1
        tot = e - s + 1
        top = ", ".join(f"{k} {v}" for k, v in c.most_common(18))
        # The head's index mod 8 (its slot in a 128-byte line): the FP8 loop ran 8-11% slower
        # at two placements (research/perf/NOTES.md, fifth session), so an A/B reports it.
        print(f"  loop {s}-{e} (head mod 8 = {s % 8}): {tot} instr: {top}")
