"""Reference timings for kernels/BenchmarkGEMV: cuBLAS bf16 through PyTorch's
F.linear at the same shapes, and the device copy bandwidth, measured with CUDA
events (median of repeats) in the same device run. Prints RESULT lines."""
import torch
import torch.nn.functional as F

from torch_timing import median_ms, print_copy_bandwidth


print_copy_bandwidth()
for n, k in [(4096, 14336), (14336, 4096)]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for m in [1, 16, 64, 512]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ms = median_ms(lambda: F.linear(x, w))
        print(f"RESULT torch_bf16 N={n} K={k} m={m} time_us={ms * 1e3:.2f} weight_GBps={2 * n * k / ms / 1e6:.0f}")
