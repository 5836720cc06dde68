"""The progress bar of `python -m kernelflow bench`: rich when it imports, else tqdm, else one
plain line per step (both are optional: `pip install kernelflow[bench]`). Drawn on stderr, so the
benchmark's own printout can go to a log file while the bar runs."""
from __future__ import annotations

import sys


class Plain:
    """One line per step on stderr: `[done/total] label`."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def step(self, label: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {label}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class Null:
    def step(self, label: str) -> None:
        pass

    def close(self) -> None:
        pass


class Tqdm:
    def __init__(self, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, file=sys.stderr, unit="step", dynamic_ncols=True)

    def step(self, label: str) -> None:
        self.bar.set_description(label[:60])
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class Rich:
    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self.progress = Progress(TextColumn("{task.description:<48}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(file=sys.stderr), redirect_stdout=False,
                                 redirect_stderr=False)
        self.task = self.progress.add_task("starting", total=total)
        self.progress.start()

    def step(self, label: str) -> None:
        self.progress.update(self.task, advance=1, description=label[:48])

    def close(self) -> None:
        self.progress.stop()


def make(total: int, kind: str = "auto"):
    """A bar for `total` steps. kind: auto (rich, tqdm, plain: the first that imports), rich,
    tqdm, plain, or none (no output)."""
    if kind == "none":
        return Null()
    order = {"auto": (Rich, Tqdm, Plain), "rich": (Rich,), "tqdm": (Tqdm,), "plain": (Plain,)}
    for cls in order[kind]:
        try:
            return cls(total)
        except ImportError:
            continue
    return Plain(total)
