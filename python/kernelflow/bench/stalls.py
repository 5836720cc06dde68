"""Where a kernel's warps wait, instruction by instruction: Nsight Compute's warp-stall samples per
SASS instruction (`ncu -i REPORT --page source --csv --print-source sass` of a report with the
WarpStateStats and SourceCounters sections) as the stall reasons' shares over the whole kernel and
the hottest instructions with their main reasons. What `python -m kernelflow profile decode
--stalls N` prints.

A sample lands on the instruction a warp is waiting to issue: the first instruction after a
barrier carries that barrier's wait, the branch of an mbarrier try_wait loop the wait for the
copies, a wgmma the tensor pipe's queue. Nothing here needs a GPU.
"""
from __future__ import annotations

import csv

SAMPLES = "Warp Stall Sampling (All Samples)"
REASON_PREFIX = "stall_"


def source_rows(text: str) -> list:
    """The per-instruction rows of the source page's CSV as dicts (the header row is the one
    starting with "Address"; the kernel-name line before it and rows of another width are
    skipped)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"Address"')), None)
    if start is None:
        raise ValueError("no \"Address\" header: not ncu's source page as CSV "
                         "(--page source --csv --print-source sass)")
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    if SAMPLES not in header:
        raise ValueError(f"no {SAMPLES!r} column: the report lacks the SourceCounters section")
    return [dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def reasons_of(row: dict) -> dict:
    """{reason: samples} of one instruction (the all-samples columns, not the not-issued ones)."""
    return {k[len(REASON_PREFIX):]: _number(v) for k, v in row.items()
            if k.startswith(REASON_PREFIX) and "Not Issued" not in k and _number(v) > 0}


def stall_summary(text: str, top: int = 20) -> dict:
    """{"samples": all samples, "reasons": [(reason, share)] largest first, "hot": the `top`
    instructions with the most samples, each {"index" (its place in the kernel's SASS),
    "address", "sass", "samples", "share", "reasons": its two main [(reason, samples)]}}."""
    rows = source_rows(text)
    total = sum(_number(r[SAMPLES]) for r in rows)
    if total == 0:
        raise ValueError("the report holds no warp-stall samples")
    by_reason: dict = {}
    for r in rows:
        for k, v in reasons_of(r).items():
            by_reason[k] = by_reason.get(k, 0.0) + v
    reasons = sorted(((k, v / total) for k, v in by_reason.items()), key=lambda kv: -kv[1])
    ranked = sorted(range(len(rows)), key=lambda i: -_number(rows[i][SAMPLES]))[:top]
    hot = []
    for i in ranked:
        r = rows[i]
        n = _number(r[SAMPLES])
        main = sorted(reasons_of(r).items(), key=lambda kv: -kv[1])[:2]
        hot.append({"index": i, "address": r.get("Address", ""), "sass": r.get("Source", "").strip(),
                    "samples": n, "share": n / total, "reasons": main})
    return {"samples": total, "reasons": reasons, "hot": hot}


def summary_lines(summary: dict) -> list:
    """The summary as printed."""
    lines = [f"warp-stall samples: {summary['samples']:.0f}",
             "by reason: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in summary["reasons"]
                                       if v >= 0.005),
             "hottest instructions (index in the kernel's SASS, share of all samples, main "
             "reasons, instruction):"]
    for h in summary["hot"]:
        why = " ".join(f"{k}:{v:.0f}" for k, v in h["reasons"])
        lines.append(f"  {h['index']:6d} {100 * h['share']:5.1f}%  {why:32s} {h['sass'][:80]}")
    return lines
