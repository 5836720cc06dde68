"""Figures for docs/optimization.md from the JSON files in docs/results/.

    python3 bench/plot_results.py docs/results docs/figures

Reads decode_h200.json (bench_decode.py's decode grid with the baselines) and the "sk_sweep" run
of formats_h200.json (bench_decode.py --sk-sweep), both in the compact form that
tools/compact_results.py writes (the raw --json output of bench_decode.py works too), and writes
decode_h16_bandwidth.png, decode_h128_tflops.png and sk_sweep_formats.png into the figures
folder. Needs matplotlib; plots only what the files hold, so every point is a measured one.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

LABELS = {
    "kernelflow": "KernelFlow",
    "triton": "Triton (ours)",
    "torch": "PyTorch",
    "flashmla": "FlashMLA (same run)",
    "flashmla_spec": "FlashMLA (docs/spec.md section 5, not this run)",
}
STYLES = ("-o", "--s", ":^", "-.v")


def load(folder, name):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def series(rows, kernel, h_q, s_k, key):
    pts = sorted((r["b"], r[key]) for r in rows
                 if r.get("kernel") == kernel and r["h_q"] == h_q and r["s_k"] == s_k
                 and r.get(key) is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_grid(bench, out, h_q, key, peak, peak_label, ylabel, fname, title):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    lengths = sorted({r["s_k"] for r in bench["rows"] if r["h_q"] == h_q})
    for s_k, style in zip(lengths, STYLES):
        for kernel in ("kernelflow", "triton", "flashmla", "flashmla_spec"):
            x, y = series(bench["rows"], kernel, h_q, s_k, key)
            if x:
                ax.plot(x, y, style, label=f"{LABELS[kernel]}, s_k={s_k}")
    ax.axhline(peak, color="gray", lw=1, ls=":", label=f"{peak_label} {peak:.0f}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("batch")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, fname), dpi=120)
    plt.close(fig)


def plot_sweep(sweep, out):
    peak = read_peak(sweep)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for fmt in ("bf16", "fp8_e4m3", "int8"):
        pts = sorted((r["s_k"], r["GBps"]) for r in sweep["rows"] if r.get("format") == fmt)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=fmt)
    ax.axhline(peak, color="gray", lw=1, ls=":", label=f"measured read peak {peak:.0f}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("s_k (cached tokens per request)")
    ax.set_ylabel("cache bytes read / time (GB/s)")
    ax.set_title(f"h_q = 16, b = 64, by cache format ({sweep.get('device', 'H200')}, "
                 f"{sweep.get('commit', '?')})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sk_sweep_formats.png"), dpi=120)
    plt.close(fig)


def read_peak(run):
    peaks = run["peaks"]
    return peaks.get("read_GBps") or peaks.get("read", {}).get("GBps")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="folder holding decode_h200.json and formats_h200.json")
    ap.add_argument("figures")
    args = ap.parse_args()
    os.makedirs(args.figures, exist_ok=True)
    bench = load(args.results, "decode_h200.json")
    peaks = bench["peaks"]
    mma_peak = peaks.get("mma_sync_bf16_TFLOPS") or peaks.get("mma_sync", {}).get("TFLOPS")
    run = f"{bench.get('device', 'H200')}, {bench.get('commit', '?')}"
    plot_grid(bench, args.figures, 16, "GBps", read_peak(bench), "measured read peak",
              "cache bytes read / time (GB/s)",
              "decode_h16_bandwidth.png", f"MLA decode, h_q = 16 (memory-bound), bf16, {run}")
    plot_grid(bench, args.figures, 128, "TFLOPS", mma_peak,
              "measured mma.sync peak (FlashMLA uses wgmma)", "TFLOPS",
              "decode_h128_tflops.png", f"MLA decode, h_q = 128 (compute-bound), bf16, {run}")
    formats_path = os.path.join(args.results, "formats_h200.json")
    if os.path.exists(formats_path):
        plot_sweep(load(args.results, "formats_h200.json")["sk_sweep"], args.figures)
    print(f"wrote figures to {args.figures}")


if __name__ == "__main__":
    main()
