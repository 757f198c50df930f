"""CUDA-event timing shared by the PyTorch reference scripts (bench_torch.py,
bench_mhc_torch.py): the median time of a call over repeats, and the device
copy bandwidth as a RESULT line, counted as the Go benchmarks count theirs
(bytes read + written)."""
import torch


def median_ms(fn, iters=50, repeats=7):
    """Milliseconds per call of fn: iters calls between two events, the
    median over repeats, after one untimed call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return sorted(times)[len(times) // 2]


def print_copy_bandwidth():
    """Prints the device-to-device copy rate of a 1 GiB buffer."""
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), iters=20)
    print(f"RESULT torch copy_GBps={2 * 4 * (1 << 28) / ms / 1e6:.0f}")
