# Sum the warp-stall samples of an `ncu --page source --csv --print-source sass` export (gzip)
# by stall reason and by opcode: python3 ncu_stalls.py kernel_sass.csv.gz ...
import csv, gzip, sys, collections, re
for fn in sys.argv[1:]:
    rows = list(csv.reader(gzip.open(fn, 'rt')))
    hdr = rows[1]; data = rows[2:]
    idx = {h:i for i,h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
    tot = collections.Counter(); op = collections.Counter(); opn = collections.Counter()
    allS = 0
    for r in data:
        if len(r) < len(hdr): continue
        s = int(r[idx['Warp Stall Sampling (All Samples)']] or 0); allS += s
        for c in stall_cols: tot[c] += int(r[idx[c]] or 0)
        m = re.match(r'\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)', r[idx['Source']])
        o = m.group(2) if m else '?'
        op[o] += s; opn[o] += int(r[idx['Instructions Executed']] or 0)
    print(fn, 'samples', allS)
    for c, v in tot.most_common(10): print(f'  {c:28s} {v:8d} {100*v/allS:5.1f}%')
    print('  by opcode (samples, executed warp-instr):')
    for o, v in op.most_common(14): print(f'    {o:10s} {v:8d} {100*v/allS:5.1f}%  exec {opn[o]}')
