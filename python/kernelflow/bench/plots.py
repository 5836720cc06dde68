"""Figures from benchmark JSON (needs matplotlib); every point drawn is one the file holds.

    python3 -m kernelflow.bench.plots kernelflow_bench.json FIGURES_DIR   # a bench run's record
    python3 -m kernelflow.bench.plots docs/results docs/figures            # docs/results/ files

From the record of `python -m kernelflow bench` (draw_all): the time per layer against batch of
every layer variant with the floors drawn (layer_time.png); the achieved bandwidth against batch
of the decode kernels and FlashMLA at h_q 16 (decode_bandwidth.png); the 8-bit speedup over bf16
against s_k (sk_speedup.png); a roofline with both regimes (roofline.png). The GPU, the date and
the command are written under each figure.

From docs/results/ (draw_results): decode_h200.json (the decode grid with the baselines) and the
"sk_sweep" run of formats_h200.json, in the compact form tools/compact_results.py writes (the raw
--json output of kernelflow.bench.decode works too): decode_h16_bandwidth.png,
decode_h128_tflops.png and sk_sweep_formats.png.
"""
import argparse
import json
import os
import textwrap

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


def series(rows, kernel, h_q, s_k, key, s_q=1):
    """(batches, values) of one kernel's curve; rows of other s_q (a grid run with --s-q 1 2)
    are not on it."""
    pts = sorted((r["b"], r[key]) for r in rows
                 if r.get("kernel") == kernel and r["h_q"] == h_q and r["s_k"] == s_k
                 and r.get("s_q", 1) == s_q and r.get(key) is not None)
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


def draw_results(results, figures):
    """The docs/results/ figures (see the module docstring)."""
    os.makedirs(figures, exist_ok=True)
    bench = load(results, "decode_h200.json")
    peaks = bench["peaks"]
    mma_peak = peaks.get("mma_sync_bf16_TFLOPS") or peaks.get("mma_sync", {}).get("TFLOPS")
    run = f"{bench.get('device', 'H200')}, {bench.get('commit', '?')}"
    plot_grid(bench, figures, 16, "GBps", read_peak(bench), "measured read peak",
              "cache bytes read / time (GB/s)",
              "decode_h16_bandwidth.png", f"MLA decode, h_q = 16 (memory-bound), bf16, {run}")
    plot_grid(bench, figures, 128, "TFLOPS", mma_peak,
              "measured mma.sync peak (FlashMLA uses wgmma)", "TFLOPS",
              "decode_h128_tflops.png", f"MLA decode, h_q = 128 (compute-bound), bf16, {run}")
    formats_path = os.path.join(results, "formats_h200.json")
    if os.path.exists(formats_path):
        plot_sweep(load(results, "formats_h200.json")["sk_sweep"], figures)
    print(f"wrote figures to {figures}")


# ---- figures of a `python -m kernelflow bench` record ---------------------------------------------

BENCH_LABELS = dict(LABELS, flashinfer="FlashInfer (same run)")
LAYER_STYLES = {"unfused eager": "-.v", "unfused graph": "--s", "fused bf16": "-o",
                "fused fp8_e4m3": "-^", "fused int8": "-D"}


def caption(record) -> str:
    """GPU, date and command, wrapped to the figure's width."""
    gpu = record.get("gpu", {})
    text = f"{gpu.get('name', '?')}, {record.get('date', '?')}; {record.get('command', '?')}"
    return "\n".join(textwrap.wrap(text, 150))


def new_figure():
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    return fig, ax


def finish(fig, ax, record, path, xlog2=True):
    if xlog2:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    text = caption(record)
    fig.tight_layout(rect=(0, 0.03 + 0.025 * text.count("\n") + 0.02, 1, 1))
    fig.text(0.01, 0.01, text, fontsize=6.5, color="0.3", va="bottom")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def measured_once(record) -> list:
    """The decode rows with every baseline once: kernelflow's rows of each family, the other
    kernels' from the first family's run (a forced family's run repeats them or leaves them out)."""
    first = (record.get("families") or [None])[0]
    return [r for r in record["decode"]["rows"]
            if r.get("kernel") == "kernelflow" or r.get("family") in (first, None)]


def plot_layer_time(record, out):
    """us per layer against batch for every layer variant, with the bf16 and 8-bit floors."""
    from kernelflow.bench.cli import layer_us

    rows = sorted((r for r in record["layer"].get("rows", []) if "floor_us" in r),
                  key=lambda r: r["b"])
    fig, ax = new_figure()
    for name, style in LAYER_STYLES.items():
        pts = [(r["b"], layer_us(r)[name]) for r in rows if layer_us(r)[name] is not None]
        if pts:
            ax.plot(*zip(*pts), style, label=name)
    for fmt, label in (("bf16", "floor, bf16 cache"), ("int8", "floor, 8-bit cache")):
        ax.plot([r["b"] for r in rows], [r["floor_us"][fmt] for r in rows], ":", color="gray"
                if fmt == "bf16" else "black", label=f"{label} (bytes / read peak)")
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("microseconds per layer")
    ax.set_title("Decode layer (DeepSeek-V2-Lite, s_k 4096): time per layer", fontsize=10)
    return finish(fig, ax, record, os.path.join(out, "layer_time.png"))


def plot_decode_bandwidth(record, out, h_q=16):
    """Achieved GB/s against batch at h_q 16 for every decode kernel (each family) and FlashMLA."""
    rows = measured_once(record)
    fig, ax = new_figure()
    groups = sorted({(r["kernel"], r.get("family"), r["s_k"]) for r in rows
                     if r.get("h_q") == h_q and r.get("kernel") != "torch" and "GBps" in r})
    for (kernel, fam, s_k), style in zip(groups, STYLES * len(groups)):
        x, y = series([r for r in rows if r.get("family") == fam], kernel, h_q, s_k, "GBps")
        fam_txt = f" [{fam}]" if kernel == "kernelflow" else ""
        ax.plot(x, y, style, label=f"{BENCH_LABELS.get(kernel, kernel)}{fam_txt}, s_k={s_k}")
    peak = read_peak(record)
    ax.axhline(peak, color="gray", lw=1, ls=":", label=f"read peak {peak:.0f} GB/s")
    ax.set_xlabel("batch")
    ax.set_ylabel("bytes read / time (GB/s)")
    ax.set_title(f"MLA decode, h_q = {h_q} (memory-bound), bf16 cache: achieved bandwidth",
                 fontsize=10)
    return finish(fig, ax, record, os.path.join(out, "decode_bandwidth.png"))


def plot_sk_speedup(record, out):
    """FP8 and INT8 time over bf16 against s_k."""
    rows = [r for r in record["formats"]["rows"] if "speedup_vs_bf16" in r]
    fig, ax = new_figure()
    for fmt, style in (("fp8_e4m3", "-o"), ("int8", "--s")):
        pts = sorted((r["s_k"], r["speedup_vs_bf16"]) for r in rows if r["format"] == fmt)
        if pts:
            ax.plot(*zip(*pts), style, label=f"{fmt} (h_q 16, b {rows[0]['b']})")
    ax.axhline(1152 / 644, color="gray", lw=1, ls=":", label="bytes ratio 1152 / 644 = 1.79")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("s_k (cached tokens per request)")
    ax.set_ylabel("speedup over the bf16 cache (bf16 time / time)")
    ax.set_title("8-bit caches: speedup over bf16 against sequence length", fontsize=10)
    return finish(fig, ax, record, os.path.join(out, "sk_speedup.png"))


def plot_roofline(record, out):
    """TFLOPS against flops per byte: the roof min(intensity x read peak, mma.sync peak) and
    every decode row of the kernels, h_q 16 and h_q 128 marked apart."""
    pk = record["peaks"]
    read, mma = pk["read_GBps"], pk["mma_sync_bf16_TFLOPS"]
    rows = [r for r in measured_once(record) if "TFLOPS" in r and r.get("GBps")]
    fig, ax = new_figure()
    xs = [r["TFLOPS"] * 1e3 / r["GBps"] for r in rows] or [1.0]
    lo, hi = min(xs) / 2, max(xs) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(x * read / 1e3, mma) for x in grid], color="black", lw=1.2,
            label=f"roof: read {read:.0f} GB/s, mma.sync {mma:.0f} TFLOPS")
    markers = {16: "o", 128: "^"}
    for kernel in ("kernelflow", "triton", "flashmla", "flashmla_spec", "flashinfer"):
        for h_q in (16, 128):
            sel = [r for r in rows if r["kernel"] == kernel and r["h_q"] == h_q]
            if sel:
                ax.scatter([r["TFLOPS"] * 1e3 / r["GBps"] for r in sel],
                           [r["TFLOPS"] for r in sel], marker=markers.get(h_q, "x"), s=18,
                           label=f"{BENCH_LABELS.get(kernel, kernel)}, h_q {h_q}")
    ax.axvline(mma * 1e3 / read, color="gray", lw=0.8, ls=":",
               label=f"ridge {mma * 1e3 / read:.0f} flop/byte")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("arithmetic intensity (flop / byte read)")
    ax.set_ylabel("TFLOPS")
    ax.set_title("MLA decode roofline: h_q 16 memory-bound, h_q 128 compute-bound", fontsize=10)
    return finish(fig, ax, record, os.path.join(out, "roofline.png"), xlog2=False)


def draw_all(record, out) -> list:
    """Every figure the record has the sections for; returns the paths written."""
    os.makedirs(out, exist_ok=True)
    paths = []
    if record.get("layer", {}).get("rows"):
        paths.append(plot_layer_time(record, out))
    if record.get("decode", {}).get("rows"):
        paths.append(plot_decode_bandwidth(record, out))
        paths.append(plot_roofline(record, out))
    if record.get("formats", {}).get("rows"):
        paths.append(plot_sk_speedup(record, out))
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kernelflow.bench.plots",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a `python -m kernelflow bench` JSON, or a folder holding "
                                   "docs/results' decode_h200.json and formats_h200.json")
    ap.add_argument("figures", help="the folder to write the PNG files into")
    args = ap.parse_args(argv)
    if os.path.isdir(args.source):
        draw_results(args.source, args.figures)
        return 0
    with open(args.source) as f:
        for path in draw_all(json.load(f), args.figures):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
