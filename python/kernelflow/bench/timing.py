"""CUDA-event timing shared by the benchmark modules."""
from __future__ import annotations


def event_times_ms(fn, replays: int) -> list:
    """Milliseconds of each of `replays` calls of fn, from CUDA events recorded around each call
    on the current stream; all calls are queued before one synchronization."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, stop in zip(starts, stops):
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(stop) for start, stop in zip(starts, stops)]
