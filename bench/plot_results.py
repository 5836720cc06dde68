"""Figures for docs/optimization.md from the JSON that bench_decode.py writes (--json).

    python3 bench/plot_results.py docs/results/h200-2026-11-30 docs/figures

Reads bench.json (the decode grid, with baselines) and bench_sweep.json (--sk-sweep) from the
results folder and writes PNGs into the figures folder. Needs matplotlib; plots only what the
files hold, so every point in a figure is a measured one.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "kernelflow": "KernelFlow",
    "triton": "Triton (ours)",
    "torch": "PyTorch",
    "flashmla_spec": "FlashMLA (SPEC.md, not this run)",
}


def load(folder, name):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def series(rows, kernel, h_q, s_k, key):
    pts = sorted((r["b"], r[key]) for r in rows
                 if r.get("kernel") == kernel and r["h_q"] == h_q and r["s_k"] == s_k
                 and r.get(key) is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_grid(bench, out, h_q, key, peak, ylabel, fname, title):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for s_k, style in ((4096, "-o"), (16384, "--s")):
        for kernel in ("kernelflow", "triton", "flashmla_spec"):
            x, y = series(bench["rows"], kernel, h_q, s_k, key)
            if x:
                ax.plot(x, y, style, label=f"{LABELS[kernel]}, s_k={s_k}")
    ax.axhline(peak, color="gray", lw=1, ls=":", label=f"measured peak {peak:.0f}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, fname), dpi=120)
    plt.close(fig)


def plot_sweep(sweep, out, peak):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for fmt in ("bf16", "fp8_e4m3", "int8"):
        pts = sorted((r["s_k"], r["GBps"]) for r in sweep["rows"] if r.get("format") == fmt)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=fmt)
    ax.axhline(peak, color="gray", lw=1, ls=":", label=f"measured read peak {peak:.0f}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("s_k (cached tokens per request)")
    ax.set_ylabel("cache bytes read / time (GB/s)")
    ax.set_title("h_q = 16, b = 64, by cache format (H200)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "sk_sweep_formats.png"), dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("figures")
    args = ap.parse_args()
    os.makedirs(args.figures, exist_ok=True)
    bench = load(args.results, "bench.json")
    peaks = bench["peaks"]
    read_peak = peaks.get("read_GBps") or peaks.get("read", {}).get("GBps")
    mma_peak = peaks.get("mma_sync_bf16_TFLOPS") or peaks.get("mma_sync", {}).get("TFLOPS")
    plot_grid(bench, args.figures, 16, "GBps", read_peak, "cache bytes read / time (GB/s)",
              "decode_h16_bandwidth.png", "MLA decode, h_q = 16 (memory-bound), bf16, H200")
    plot_grid(bench, args.figures, 128, "TFLOPS", mma_peak, "TFLOPS",
              "decode_h128_tflops.png", "MLA decode, h_q = 128 (compute-bound), bf16, H200")
    sweep_path = os.path.join(args.results, "bench_sweep.json")
    if os.path.exists(sweep_path):
        plot_sweep(load(args.results, "bench_sweep.json"), args.figures, read_peak)
    print(f"wrote figures to {args.figures}")


if __name__ == "__main__":
    main()
