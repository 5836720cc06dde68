"""python -m kernelflow {demo,info}"""

from __future__ import annotations

import argparse
import sys


def info() -> int:
    import kernelflow as kf

    print(f"kernelflow {kf.__version__}")
    print(f"build: {kf.build_info()}")
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelflow")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="one DeepSeek-V2-Lite decode step, checked against float64")
    sub.add_parser("info", help="version, build (CUDA architectures), GPUs found")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    from kernelflow._demo import main as demo

    return demo()


if __name__ == "__main__":
    sys.exit(main())
