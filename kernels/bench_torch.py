"""Reference timings for kernels/BenchmarkGEMV: cuBLAS bf16 through PyTorch's
F.linear at the same shapes, and the device copy bandwidth, measured with CUDA
events (median of repeats) in the same device run. Prints RESULT lines."""
import torch
import torch.nn.functional as F


def median_ms(fn, iters=50, repeats=7):
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


src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
dst = torch.empty_like(src)
ms = median_ms(lambda: dst.copy_(src), iters=20)
print(f"RESULT torch copy_GBps={2 * 4 * (1 << 28) / ms / 1e6:.0f}")
for n, k in [(4096, 14336), (14336, 4096)]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for m in [1, 16, 64, 512]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ms = median_ms(lambda: F.linear(x, w))
        print(f"RESULT torch_bf16 N={n} K={k} m={m} time_us={ms * 1e3:.2f} weight_GBps={2 * n * k / ms / 1e6:.0f}")
