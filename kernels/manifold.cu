// Manifold's CUDA kernels. Each kernel's reference is the CPU backend
// (backend/cpu) or the layers package; kernels/cuda_test.go holds them to it.
// Activations are float32; weights stay in their stored format (f32, bf16,
// NVFP4) and are decoded in registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define WARP 32

// MANIFOLD_DEV is defined for the dev image only (kernels/build.sh dev,
// kernels/manifold-dev.fatbin): the kernels that only the experiments of the
// dev build launch (kernels/dev.go), the tracing instances, and the
// ablation and timeline branches are compiled there alone. DEV_ON is 1 in
// the dev image and 0 in the production one, for the branches inside
// production kernels: their arguments and flag bits stay as they are, and
// the production image compiles the branches away.
#ifdef MANIFOLD_DEV
#define DEV_ON 1
#else
#define DEV_ON 0
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// Programmatic dependent launch (kernels launched with it, kernels/queue.go):
// pdl_launch lets the next kernel in the stream start its blocks now;
// pdl_wait waits until the previous kernel has finished and its writes are
// visible. A kernel launched with the attribute must pdl_wait before it reads
// what earlier work wrote or writes what earlier work reads.
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// The start of a kernel with nothing to do before the wait: the next kernel
// may be scheduled at once, and this one waits for the one before.
__device__ __forceinline__ void pdl_entry() {
    pdl_launch();
    pdl_wait();
}

// Asynchronous copies global -> shared (cp.async, Ampere on): 16 bytes (both
// ends 16-byte aligned) or 4; a thread's copies are grouped by commit, and
// wait<N> returns once at most N of its groups are still in flight.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async16_l2(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// 16 bytes from src if valid, else 16 zero bytes (src is not read).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// block_sum: every thread gets the sum over the block (blockDim.x <= 1024).
__device__ float block_sum(float v, float* shared) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + WARP - 1) / WARP;
    v = lane < nw ? shared[lane] : 0.f;
    return warp_sum(v);
}

__device__ float block_max(float v, float* shared) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + WARP - 1) / WARP;
    v = lane < nw ? shared[lane] : -INFINITY;
    return warp_max(v);
}

__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float(((uint32_t)h) << 16); }

// E4M3 (fn) to float: no infinities, 0x7f/0xff are NaN.
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
    uint32_t s = (b >> 7) & 1, e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 0) v = (float)m * 0.001953125f;  // m * 2^-9
    else if (e == 15 && m == 7) v = __int_as_float(0x7fc00000);
    else v = __uint_as_float(((e + 120) << 23) | (m << 20));
    return s ? -v : v;
}

__constant__ float kE2M1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// ---------------------------------------------------------------------------
// GEMV / small-m GEMM: y[i, r] = sum_k x[i, k] * W[r, k] (+ bias[r]).
// One warp per output row; each lane streams 16-byte chunks of the row, and
// up to MT input rows are accumulated per pass over the weight row.
#define MT 4

template <typename Loader>
__device__ __forceinline__ void gemv_row(const Loader& ld, const float* __restrict__ x, float* __restrict__ y,
                                         const float* __restrict__ bias, int N, int K, int m, int r) {
    int lane = threadIdx.x % WARP;
    for (int i0 = 0; i0 < m; i0 += MT) {
        float acc[MT];
#pragma unroll
        for (int t = 0; t < MT; t++) acc[t] = 0.f;
        int mt = min(MT, m - i0);
        for (int k = lane * Loader::kChunk; k < K; k += WARP * Loader::kChunk) {
            float w[Loader::kChunk];
            ld.load(r, k, w);
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (t < mt) {
                    const float* xr = x + (size_t)(i0 + t) * K + k;
#pragma unroll
                    for (int j = 0; j < Loader::kChunk; j += 4) {
                        float4 xv = *reinterpret_cast<const float4*>(xr + j);
                        acc[t] += w[j] * xv.x + w[j + 1] * xv.y + w[j + 2] * xv.z + w[j + 3] * xv.w;
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MT; t++) {
            float s = warp_sum(acc[t]);
            if (lane == 0 && t < mt) y[(size_t)(i0 + t) * N + r] = s * ld.scale() + (bias ? bias[r] : 0.f);
        }
    }
}

struct F32Loader {
    static constexpr int kChunk = 4;
    const float* W; int K;
    __device__ void load(int r, int k, float* w) const {
        float4 v = __ldg(reinterpret_cast<const float4*>(W + (size_t)r * K + k));
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    }
    __device__ float scale() const { return 1.f; }
};

struct BF16Loader {
    static constexpr int kChunk = 8;
    const uint16_t* W; int K;
    __device__ void load(int r, int k, float* w) const {
        uint4 v = __ldg(reinterpret_cast<const uint4*>(W + (size_t)r * K + k));
        uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            w[2 * j] = __uint_as_float(u[j] << 16);
            w[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
        }
    }
    __device__ float scale() const { return 1.f; }
};

// dst = src over n 4-byte words, not overlapping (Backend.Copy): a kernel
// rather than the driver's copy, so that the programmatic chain of a decode
// step goes on through it.
extern "C" __global__ void copy_words(uint32_t* dst, const uint32_t* src, long long n) {
    pdl_entry();
    const long long stride = (long long)gridDim.x * blockDim.x, i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long done = 0;
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
        const long long n4 = n / 4;
        for (long long j = i; j < n4; j += stride) reinterpret_cast<uint4*>(dst)[j] = reinterpret_cast<const uint4*>(src)[j];
        done = 4 * n4;
    }
    for (long long j = done + i; j < n; j += stride) dst[j] = src[j];
}

// Rows per block: 8 warps.
extern "C" __global__ void gemv_f32(const float* W, const float* x, float* y, const float* bias, int N, int K, int m) {
    pdl_entry();
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= N) return;
    F32Loader ld{W, K};
    gemv_row(ld, x, y, bias, N, K, m, r);
}

extern "C" __global__ void gemv_bf16(const uint16_t* W, const float* x, float* y, const float* bias, int N, int K, int m) {
    pdl_entry();
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= N) return;
    BF16Loader ld{W, K};
    gemv_row(ld, x, y, bias, N, K, m, r);
}

// bf16 GEMV for few output rows (the MoE routers: N of 32 to 256, K in the
// thousands), where a warp per row leaves most multiprocessors idle and each
// warp a long chain of loads: a block of 256 threads per row, thread t
// taking the 16-byte chunks k = 8 (t + 256 j), four of its weight loads in
// flight at once, the block's sums added in shared memory. m <= MT rows of x
// per pass; K % 8 == 0, x 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256) gemv_bf16_sk(const uint16_t* W, const float* x, float* y,
                                                               const float* bias, int N, int K, int m) {
    pdl_entry();
    __shared__ float red[MT][8];
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const BF16Loader ld{W, K};
    for (int i0 = 0; i0 < m; i0 += MT) {
        const int mt = min(MT, m - i0);
        float acc[MT];
#pragma unroll
        for (int t = 0; t < MT; t++) acc[t] = 0.f;
        for (int k0 = 8 * tid; k0 < K; k0 += 4 * 8 * 256) {
            float w[4][8];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (k0 + u * 2048 < K) ld.load(r, k0 + u * 2048, w[u]);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int k = k0 + u * 2048;
                if (k >= K) break;
#pragma unroll
                for (int t = 0; t < MT; t++) {
                    if (t < mt) {
                        const float* xr = x + (size_t)(i0 + t) * K + k;
                        const float4 a = *reinterpret_cast<const float4*>(xr), b = *reinterpret_cast<const float4*>(xr + 4);
                        acc[t] += w[u][0] * a.x + w[u][1] * a.y + w[u][2] * a.z + w[u][3] * a.w + w[u][4] * b.x +
                                  w[u][5] * b.y + w[u][6] * b.z + w[u][7] * b.w;
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MT; t++) {
            const float v = warp_sum(acc[t]);
            if (lane == 0) red[t][warp] = v;
        }
        __syncthreads();
        if (tid < mt) {
            float v = 0.f;
#pragma unroll
            for (int w2 = 0; w2 < 8; w2++) v += red[tid][w2];
            y[(size_t)(i0 + tid) * N + r] = v + (bias ? bias[r] : 0.f);
        }
        __syncthreads();
    }
}

// Tail-safe GEMV for K not a multiple of the chunk: plain per-element loads.
extern "C" __global__ void gemv_f32_any(const float* W, const float* x, float* y, const float* bias, int N, int K, int m) {
    pdl_entry();
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= N) return;
    for (int i = 0; i < m; i++) {
        float acc = 0.f;
        for (int k = lane; k < K; k += WARP) acc += W[(size_t)r * K + k] * x[(size_t)i * K + k];
        acc = warp_sum(acc);
        if (lane == 0) y[(size_t)i * N + r] = acc + (bias ? bias[r] : 0.f);
    }
}

extern "C" __global__ void gemv_bf16_any(const uint16_t* W, const float* x, float* y, const float* bias, int N, int K, int m) {
    pdl_entry();
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= N) return;
    for (int i = 0; i < m; i++) {
        float acc = 0.f;
        for (int k = lane; k < K; k += WARP) acc += bf16_to_f32(W[(size_t)r * K + k]) * x[(size_t)i * K + k];
        acc = warp_sum(acc);
        if (lane == 0) y[(size_t)i * N + r] = acc + (bias ? bias[r] : 0.f);
    }
}

// ---------------------------------------------------------------------------
// Up to kIdBlock row ids travel by value in a kernel's parameters (rows_gather).
#define kIdBlock 256
struct IdBlock { int v[kIdBlock]; };

// RMSNorm: one block per row of n values; dst may alias x.
extern "C" __global__ void rmsnorm(float* dst, const float* x, const float* w, int n, float eps) {
    __shared__ float red[32];
    pdl_launch();
    pdl_wait();
    const float* xr = x + (size_t)blockIdx.x * n;
    float* dr = dst + (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) ss += xr[j] * xr[j];
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / n + eps);
    for (int j = threadIdx.x; j < n; j += blockDim.x) dr[j] = w[j] * (xr[j] * inv);
}

// Causal attention: one block per (head, query row). Scores live in dynamic
// shared memory (one float per visible key). keys/values: [pos, kvHeads, hd].
extern "C" __global__ void attention(float* out, const float* q, const float* keys, const float* values, int pos0,
                                     int heads, int kvHeads, int hd, float scale, int window) {
    pdl_entry();
    extern __shared__ float sh[];
    __shared__ float red[32];
    int h = blockIdx.x, i = blockIdx.y;
    int p = pos0 + i;
    int start = window > 0 ? max(0, p - window + 1) : 0;
    int n = p - start + 1;
    int kh = h / (heads / kvHeads);
    const float* qv = q + ((size_t)i * heads + h) * hd;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    float mx = -INFINITY;
    for (int t = warp; t < n; t += nw) {
        const float* kv = keys + ((size_t)(start + t) * kvHeads + kh) * hd;
        float d = 0.f;
        for (int j = lane; j < hd; j += WARP) d += qv[j] * kv[j];
        d = warp_sum(d) * scale;
        if (lane == 0) sh[t] = d;
        mx = fmaxf(mx, d);
    }
    mx = block_max(mx, red);
    __syncthreads();
    float sum = 0.f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float e = __expf(sh[t] - mx);
        sh[t] = e;
        sum += e;
    }
    sum = block_sum(sum, red);
    __syncthreads();
    float inv = 1.f / sum;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        float acc = 0.f;
        for (int t = 0; t < n; t++) acc += sh[t] * values[((size_t)(start + t) * kvHeads + kh) * hd + j];
        out[((size_t)i * heads + h) * hd + j] = acc * inv;
    }
}

// Elementwise.
extern "C" __global__ void swiglu(float* dst, const float* gate, const float* up, int n, float limit) {
    pdl_entry();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i], u = up[i];
    if (limit > 0.f) {
        g = fminf(g, limit);
        u = fmaxf(fminf(u, limit), -limit);
    }
    dst[i] = g / (1.f + __expf(-g)) * u;
}

extern "C" __global__ void add(float* dst, const float* a, const float* b, int n) {
    pdl_entry();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = a[i] + b[i];
}

extern "C" __global__ void scale(float* dst, const float* a, float s, int n) {
    pdl_launch();  // DSA's indexer after it may stage its queries meanwhile (dsa.go)
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = a[i] * s;
}

extern "C" __global__ void gemv_nvfp4_any(const uint8_t* P, const uint8_t* S, float global, const float* x, float* y,
                                          const float* bias, int N, int K, int m) {
    pdl_entry();
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= N) return;
    for (int i = 0; i < m; i++) {
        float acc = 0.f;
        for (int k = lane; k < K; k += WARP) {
            uint8_t b = P[(size_t)r * (K / 2) + k / 2];
            float w = kE2M1[(b >> (4 * (k & 1))) & 0xf] * e4m3_to_f32(S[(size_t)r * (K / 16) + k / 16]);
            acc += w * x[(size_t)i * K + k];
        }
        acc = warp_sum(acc);
        if (lane == 0) y[(size_t)i * N + r] = acc * global + (bias ? bias[r] : 0.f);
    }
}

// ---------------------------------------------------------------------------
// NVFP4 matmul on the tensor cores: y[i, n] = global * sum_k x[i, k] * W[n, k].
//
// One warp computes 8 output features (n) for every input row, with
// mma.sync m16n8k16 (fp16 inputs, fp32 accumulators). Each 16-element block
// of a weight row times its E4M3 scale is exact in fp16 once scaled by 2^-14
// (at most 8 significant bits, no smaller than 2^-24), so the weights reach
// the tensor cores without rounding; the activations are rounded to fp16
// (|x| must stay below 65504) and the global scale and 2^14 are applied to
// the fp32 sums.
//
// The sum over k is order-free, so each lane may own any k as long as the A
// and B fragments agree: within a 128-element chunk, lane (g, t) loads the 16
// bytes of elements [32t, 32t+32) of row n0+g (one 16-byte load) and uses
// elements 32t+4j..32t+4j+3 as its k-slots {2t, 2t+1, 2t+8, 2t+9} of the
// j-th mma; the x fragments are gathered with the same mapping.

__device__ __forceinline__ uint32_t f2h2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
}

// fp16x2 words (times 2^-14) of the 8 E2M1 codes in u: word j holds the codes
// of byte j (low nibble in the low half).
__device__ __forceinline__ void e2m1x8_to_h2(uint32_t u, uint32_t w[4]) {
    uint32_t lo = u & 0x0F0F0F0Fu, hi = (u >> 4) & 0x0F0F0F0Fu;
    // fp16 high byte of a code n (s e1 e0 m): s<<7 | (e1 e0 m)<<1.
    uint32_t flo = ((lo & 0x07070707u) << 1) | ((lo & 0x08080808u) << 4);
    uint32_t fhi = ((hi & 0x07070707u) << 1) | ((hi & 0x08080808u) << 4);
    // word j = [0, flo byte j, 0, fhi byte j]; prmt selectors index bytes 0-3 of
    // flo and 4-7 of fhi.
    w[0] = __byte_perm(flo, fhi, 0x4000) & 0xFF00FF00u;
    w[1] = __byte_perm(flo, fhi, 0x5010) & 0xFF00FF00u;
    w[2] = __byte_perm(flo, fhi, 0x6020) & 0xFF00FF00u;
    w[3] = __byte_perm(flo, fhi, 0x7030) & 0xFF00FF00u;
}

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#include "sample.cuh"
#include "mhc.cuh"
#include "dsv4.cuh"
#include "dsa.cuh"
#include "htree.cuh"
#include "gemv.cuh"
#include "fp8.cuh"   // e4m3x2_lo from gemv.cuh
#include "gemm.cuh"  // fp4x8_decode, x8_pairs, e4m3x2_lo from gemv.cuh
#include "bf16.cuh"  // the bf16 and f16 GEMM
#include "cublas.cuh"  // f2h2, e4m3_to_f32: the cuBLAS path's operands
#include "moe.cuh"  // e4m3x2_lo from gemv.cuh
#include "decode.cuh"
#include "paged.cuh"  // warp_sum, pdl_entry
