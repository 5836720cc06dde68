"""Text and JSON forms of the estimate (kernelflow.estimate.run_estimate's dict)."""
from __future__ import annotations

import json

_PIPE_COLUMNS = ("tensor", "fp32", "int", "conversion", "mufu", "shared", "global", "barrier")
_BOUND_SHORT = {"memory": "mem", "tensor": "tc", "issue": "iss", "fp32+int": "alu",
                "shared": "smem", "conversion": "cvt"}


def dumps(value, indent=0):
    """JSON with each flat object or list on one line, so a row per line and diffable."""
    if not isinstance(value, (dict, list)) or not any(isinstance(v, (dict, list)) for v in
                                                      (value.values() if isinstance(value, dict)
                                                       else value)):
        return json.dumps(value)
    pad = " " * (indent + 1)
    if isinstance(value, list):
        inner = [pad + dumps(v, indent + 1) for v in value]
        return "[\n" + ",\n".join(inner) + "\n" + " " * indent + "]"
    inner = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in value.items()]
    return "{\n" + ",\n".join(inner) + "\n" + " " * indent + "}"


def kernel_lines(kernels):
    head = (f"{'arch':6} {'format':9} {'tile':6} {'warps':>5} {'regs':>4} {'smem B':>6} "
            + " ".join(f"{p[:6]:>6}" for p in _PIPE_COLUMNS) + f" {'issue':>6}")
    lines = ["Kernels: one KV tile, per warp (tensor in m16n8k16 HMMAs, shared/global in "
             "128-byte wavefronts, others in instructions)", head]
    for k in kernels:
        c = k["per_warp_tile"]
        lines.append(f"{k['arch']:6} {k['format']:9} {k['tile']:6} {k['warps']:>5} {k['regs']:>4} "
                     f"{k['smem_bytes']:>6} " + " ".join(f"{c[p]:>6.0f}" for p in _PIPE_COLUMNS)
                     + f" {k['issue_per_warp_tile']:>6.0f}")
    return lines


def prediction_lines(result):
    lines = ["Estimated time per call, us (bound: mem = memory traffic, tc = tensor pipe, "
             "iss = issue, alu = fp32+int datapath)"]
    for key, gpu in result["gpus"].items():
        proxy = f", counted on {gpu['sass_counted']} SASS" if gpu["sass_counted"] != gpu["arch"] else ""
        lines.append(f"{gpu['name']} ({gpu['arch']}{proxy}; {gpu['sms']} SMs, "
                     f"{gpu['clock_MHz']:.0f} MHz, read {gpu['read_GBps']:.0f} GB/s)")
        rows = [r for r in result["rows"] if r["gpu"] == key]
        groups = sorted({(r["format"], r["h_q"], r["s_k"]) for r in rows},
                        key=lambda g: (("bf16", "fp8_e4m3", "int8").index(g[0]), g[1], g[2]))
        for fmt, h_q, s_k in groups:
            cells = [r for r in rows if (r["format"], r["h_q"], r["s_k"]) == (fmt, h_q, s_k)]
            text = "  ".join(f"b={r['b']}: {r['us']:.1f} {_BOUND_SHORT.get(r['bound'], r['bound'])}"
                             for r in sorted(cells, key=lambda r: r["b"]))
            lines.append(f"  estimate {fmt:8} h_q={h_q:<3} s_k={s_k:<5} {text}")
    return lines


def validation_lines(validation):
    lines = ["H200 validation: estimate from the sm_90 SASS against the measured time per call",
             f"{'measured in':34} {'format':8} {'h_q':>3} {'b':>3} {'s_k':>5} "
             f"{'measured us':>11} {'estimate us':>11} {'error':>7}  bound"]
    for r in validation["rows"]:
        lines.append(f"{r['source']:34} {r['format']:8} {r['h_q']:>3} {r['b']:>3} {r['s_k']:>5} "
                     f"{r['measured_us']:>11.1f} {r['estimate_us']:>11.1f} "
                     f"{100 * r['error']:>6.1f}%  {r['bound']}")
    for s in validation["summary"]:
        lines.append(f"estimate error, {s['which']}: median {100 * s['median_abs_error']:.1f}%, "
                     f"max {100 * s['max_abs_error']:.1f}% over {s['cells']} cells")
    return lines


def _span(values, scale=1.0, unit=""):
    if not values:
        return "n/a"
    lo, hi = values[0] * scale, values[1] * scale
    return f"{lo:.3g}-{hi:.3g}{unit}" if lo != hi else f"{lo:.3g}{unit}"


def reference_lines(cmp):
    mem, comp, sp = cmp["memory_bound"], cmp["compute_bound"], cmp["speedup_vs_bf16"]
    ref_sp = sp["reference"]
    lines = [f"RTX 3090: estimate beside the {cmp['reference_label']}",
             f"  memory-bound (h_q 16, b >= 64, bf16): estimate {_span(mem['estimate_GBps'])} GB/s "
             f"= {_span(mem['estimate_frac_read_peak'], 100, '%')} of 873.8 GB/s; reference "
             f"{_span(mem['reference']['GBps'])} GB/s = "
             f"{_span(mem['reference']['frac_read_peak'], 100, '%')}",
             f"  compute-bound (h_q 128, b >= 16, bf16): estimate {_span(comp['estimate_TFLOPS'])} "
             f"TFLOPS = {_span(comp['estimate_frac_bf16_peak'], 100, '%')} of 70.0 TFLOPS; "
             f"reference {_span(comp['reference']['TFLOPS'])} TFLOPS = "
             f"{_span(comp['reference']['frac_bf16_peak'], 100, '%')}"]
    for label, values in sp["estimate"].items():
        fmt = label.split(",")[0]
        lines.append(f"  speedup over bf16, {label}: estimate {_span(values, unit='x')}; "
                     f"reference {_span(ref_sp[fmt], unit='x')} (byte ratio {ref_sp['byte_ratio']}x)")
    return lines


def report_lines(result):
    lines = [f"Estimate from {result['library']}'s SASS: {result['what']}", ""]
    lines += kernel_lines(result["kernels"]) + [""]
    lines += prediction_lines(result) + [""]
    if "h200_validation" in result:
        lines += validation_lines(result["h200_validation"]) + [""]
    if "rtx3090_vs_reference" in result:
        lines += reference_lines(result["rtx3090_vs_reference"]) + [""]
    lines += [f"note: {n}" for n in result["notes"]]
    return lines
