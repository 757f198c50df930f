"""Reference timings for kernels/BenchmarkGEMV and BenchmarkBF16GEMM: cuBLAS
bf16 through PyTorch's F.linear at the same shapes, and the device copy
bandwidth, measured with CUDA events (median of repeats) in the same device
run. Prints RESULT lines. torch_bf16_chain is issue 57's bf16 prefill
reference: the linears of one layer of a dense shape at m = 512 (q, k, v,
o, gate, up, down, as transformers runs them), times its layers."""
import torch
import torch.nn.functional as F

from torch_timing import median_ms, print_copy_bandwidth


print_copy_bandwidth()
for n, k in [(4096, 14336), (14336, 4096), (4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288), (151936, 4096)]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for m in [1, 5, 16, 64, 512]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ms = median_ms(lambda: F.linear(x, w))
        print(f"RESULT torch_bf16 N={n} K={k} m={m} time_us={ms * 1e3:.2f} weight_GBps={2 * n * k / ms / 1e6:.0f} "
              f"TFLOPS={2 * m * n * k / ms / 1e9:.1f}")
    del w

# name: hidden, FFN, heads, KV heads, head size, layers (cmd/bench -random's shapes).
SHAPES = {
    "qwen3-8b": (4096, 12288, 32, 8, 128, 36),
    "llama3-8b": (4096, 14336, 32, 8, 128, 32),
    "qwen3-0.6b": (1024, 3072, 16, 8, 128, 28),
    "qwen3-32b": (5120, 25600, 64, 8, 128, 64),
}
m = 512
for name, (h, ffn, heads, kv, hd, layers) in SHAPES.items():
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for n, k in
          [(heads * hd, h), (kv * hd, h), (kv * hd, h), (h, heads * hd), (ffn, h), (ffn, h), (h, ffn)]]
    xs = [torch.randn(m, w.shape[1], device="cuda", dtype=torch.bfloat16) for w in ws]

    def layer():
        for x, w in zip(xs, ws):
            F.linear(x, w)

    ms = median_ms(layer, iters=10)
    print(f"RESULT torch_bf16_chain shape={name} m={m} layers={layers} time_ms={ms * layers:.3f} tok_s={m / (ms * layers) * 1e3:.0f}")
    del ws, xs
