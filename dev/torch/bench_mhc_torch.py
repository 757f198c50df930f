"""PyTorch eager mHC at DeepSeek-V4 shapes (n = 4, C = 7168), the reference
for kernels/BenchmarkOpsFloorMHC: the same math as layers/mhc (Project,
Activate with 20 Sinkhorn iterations, Pre; Post), float32 streams, the
projection weight kept in float32 (converted once, outside the timing), TF32
off. Timed with CUDA events (median of repeats) in the same device run.
Prints RESULT lines."""
import torch
import torch.nn.functional as F

from torch_timing import median_ms, print_copy_bandwidth

torch.backends.cuda.matmul.allow_tf32 = False
N, C, ITERS, EPS, NORM_EPS = 4, 7168, 20, 1e-6, 1e-6
MIX = N * N + 2 * N


def coeffs(x, fn, base, scale):
    """Project + Activate (layers/mhc): pre, post and the Sinkhorn matrix."""
    b = x.shape[0]
    flat = x.reshape(b, N * C)
    inv = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + NORM_EPS)
    logits = F.linear(flat, fn) * inv
    pre = torch.sigmoid(logits[:, :N] * scale[0] + base[:N]) + EPS
    post = 2 * torch.sigmoid(logits[:, N:2 * N] * scale[1] + base[N:2 * N])
    z = (logits[:, 2 * N:] * scale[2] + base[2 * N:]).view(b, N, N)
    m = torch.softmax(z, dim=-1) + EPS
    m = m / (m.sum(dim=-2, keepdim=True) + EPS)
    for _ in range(ITERS - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + EPS)
        m = m / (m.sum(dim=-2, keepdim=True) + EPS)
    return pre, post, m


def coeffs_pre(x, fn, base, scale):
    pre, post, res = coeffs(x, fn, base, scale)
    return (pre.unsqueeze(-1) * x).sum(dim=1), post, res


def mhc_post(x, out, post, res):
    # dst[k, c] = post[k] out[c] + sum_j res[j, k] x[j, c]
    return post.unsqueeze(-1) * out.unsqueeze(1) + torch.matmul(res.transpose(-1, -2), x)


print_copy_bandwidth()

g = torch.Generator(device="cuda").manual_seed(11)
fn = torch.randn(MIX, N * C, device="cuda", generator=g).bfloat16().float()
base = torch.randn(MIX, device="cuda", generator=g)
scale = torch.tensor([0.5, 0.5, 0.5], device="cuda")
for b in [1, 2, 4, 8, 16, 32, 64, 8192]:
    x = torch.randn(b, N, C, device="cuda", generator=g)
    out = torch.randn(b, C, device="cuda", generator=g)
    _, post, res = coeffs(x, fn, base, scale)
    iters = 5 if b > 64 else 50
    t_cp = median_ms(lambda: coeffs_pre(x, fn, base, scale), iters)
    t_c = median_ms(lambda: coeffs(x, fn, base, scale), iters)
    t_post = median_ms(lambda: mhc_post(x, out, post, res), iters)
    print(f"RESULT torch_mhc B={b} coeffs+pre_us={t_cp * 1e3:.1f} coeffs_us={t_c * 1e3:.1f} post_us={t_post * 1e3:.1f}")
    del x, out
