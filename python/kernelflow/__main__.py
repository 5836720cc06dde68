"""python -m kernelflow {demo,info,bench,profile}"""

from __future__ import annotations

import argparse
import sys


def info() -> int:
    import kernelflow as kf

    print(f"kernelflow {kf.__version__}")
    print(f"build: {kf.build_info()}")
    from kernelflow.bench.cli import built_families

    print(f"kernel families built: {' '.join(built_families(kf.build_info())) or 'none (CPU only)'}"
          f" (KF_KERNEL_FAMILY=sm80 forces the portable one; docs/design.md)")
    n = kf.cuda_device_count()
    print(f"CUDA devices visible to the library: {n}")
    if n:
        try:
            import torch

            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                print(f"  cuda:{i}: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                      f"{p.total_memory / 2**30:.0f} GiB; default workers for h_q=16/128: "
                      f"{kf.default_num_workers(i, 16)}/{kf.default_num_workers(i, 128)}")
        except ImportError:
            for i in range(n):
                print(f"  cuda:{i}: default workers for h_q=16/128: "
                      f"{kf.default_num_workers(i, 16)}/{kf.default_num_workers(i, 128)}")
    print(f"CPU backend: default workers {kf.default_num_workers('cpu', 16)}")
    return 0


# Subcommands with options of their own: everything after the name goes to their parser
# (python -m kernelflow bench --help lists them).
DELEGATED = {
    "bench": ("kernelflow.bench.cli", "the peaks, the decode regimes per kernel family, the 8-bit "
              "speedups and the layer table on this GPU, beside the baselines; a JSON of it all"),
    "profile": ("kernelflow.bench.profile", "one decode configuration under Nsight Compute (its "
                "key metrics), or the layer graph's kernel count"),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        return importlib.import_module(DELEGATED[argv[0]][0]).main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m kernelflow")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="one DeepSeek-V2-Lite decode step, checked against float64")
    sub.add_parser("info", help="version, build (CUDA architectures), GPUs found")
    for name, (_, text) in DELEGATED.items():
        sub.add_parser(name, help=text + f" (python -m kernelflow {name} --help)")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    from kernelflow._demo import main as demo

    return demo()


if __name__ == "__main__":
    sys.exit(main())
