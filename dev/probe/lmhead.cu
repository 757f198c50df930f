// LM-head probe: how close a bf16 m = 1 matmul of the Llama-3-8B LM head's
// shape (128256 x 4096, 1.05 GB) comes to the fastest read of the same bytes,
// by which loop. Standalone (CUDA runtime, not part of the kernel image); on
// the device:
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a dev/probe/lmhead.cu -o /tmp/lmhead && /tmp/lmhead
//
// Reads: 16-byte ld.global.nc over the whole matrix, grid-stride (probe.cuh's
// k_ldg, which the stream probe times too). Matmuls (y = W x, W bf16 row-major, x fp32):
//   u4      gemv_bf16_u4 as committed (gemv.cuh): a warp a row, four 16-byte
//           loads a lane in flight, 8 warps a block, a block per 8 rows
//   rowsR   persistent warps (B blocks a multiprocessor), each taking rows
//           warp, warp + warps, ...: R rows at once, every 16-byte load of
//           them issued before the first is used (16 a lane per row at K = 4096)
// Each matmul's output is checked against u4's.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <cuda_runtime.h>
#include "probe.cuh"

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffff, v, m);
    return v;
}

// gemv.cuh's gemv_bf16_u4 at m = 1 (no bias).
__global__ void __launch_bounds__(256, 4) gemv_u4(const uint16_t* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int N, int K) {
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= N) return;
    const uint16_t* wr = W + (size_t)r * K;
    float acc = 0.f;
    for (int k = lane * 8; k < K; k += 4 * 32 * 8) {
        uint4 wv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int kk = k + u * 32 * 8;
            wv[u] = kk < K ? __ldg(reinterpret_cast<const uint4*>(wr + kk)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int kk = k + u * 32 * 8;
            if (kk >= K) break;
            uint32_t uw[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
            float4 xa = *reinterpret_cast<const float4*>(x + kk), xb = *reinterpret_cast<const float4*>(x + kk + 4);
            acc += __uint_as_float(uw[0] << 16) * xa.x + __uint_as_float(uw[0] & 0xffff0000u) * xa.y +
                   __uint_as_float(uw[1] << 16) * xa.z + __uint_as_float(uw[1] & 0xffff0000u) * xa.w +
                   __uint_as_float(uw[2] << 16) * xb.x + __uint_as_float(uw[2] & 0xffff0000u) * xb.y +
                   __uint_as_float(uw[3] << 16) * xb.z + __uint_as_float(uw[3] & 0xffff0000u) * xb.w;
        }
    }
    float s = warp_sum(acc);
    if (lane == 0) y[r] = s;
}

// Persistent warps, R rows at a time, K = 4096 (16 uint4 a lane a row), x in
// shared memory as fp32.
template <int R>
__global__ void __launch_bounds__(256) gemv_rows(const uint16_t* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int N) {
    constexpr int K = 4096, L = K / 8 / 32;  // uint4 a lane a row
    __shared__ float4 xs[K / 4];
    for (int i = threadIdx.x; i < K / 4; i += blockDim.x) xs[i] = reinterpret_cast<const float4*>(x)[i];
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const int warps = gridDim.x * (blockDim.x / 32);
    for (int r0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * R; r0 < N; r0 += warps * R) {
        uint4 wv[R][L];
#pragma unroll
        for (int q = 0; q < R; q++) {
            const uint4* wr = reinterpret_cast<const uint4*>(W + (size_t)min(r0 + q, N - 1) * K);
#pragma unroll
            for (int u = 0; u < L; u++) wv[q][u] = ldg_stream(wr + lane + 32 * u);
        }
        __syncwarp();  // every load issued before the first use
#pragma unroll
        for (int q = 0; q < R; q++) {
            float acc = 0.f;
#pragma unroll
            for (int u = 0; u < L; u++) {
                const int e = 8 * (lane + 32 * u);
                const float4 xa = xs[e / 4], xb = xs[e / 4 + 1];
                const uint4 w = wv[q][u];
                acc += __uint_as_float(w.x << 16) * xa.x + __uint_as_float(w.x & 0xffff0000u) * xa.y +
                       __uint_as_float(w.y << 16) * xa.z + __uint_as_float(w.y & 0xffff0000u) * xa.w +
                       __uint_as_float(w.z << 16) * xb.x + __uint_as_float(w.z & 0xffff0000u) * xb.y +
                       __uint_as_float(w.w << 16) * xb.z + __uint_as_float(w.w & 0xffff0000u) * xb.w;
            }
            acc = warp_sum(acc);
            if (lane == 0 && r0 + q < N) y[r0 + q] = acc;
        }
    }
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s sms %d l2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
    const int N = 128256, K = 4096;
    const size_t bytes = (size_t)N * K * 2, big = 1ull << 30;
    uint8_t *a, *b; float *x, *y0, *y1, *out;
    CK(cudaMalloc(&a, big)); CK(cudaMalloc(&b, big)); CK(cudaMalloc(&out, 16));  // a holds the matrix (bytes <= big)
    CK(cudaMalloc(&x, K * 4)); CK(cudaMalloc(&y0, N * 4)); CK(cudaMalloc(&y1, N * 4));
    {   // random bf16 weights in [-1, 1), x in [-1, 1)
        uint16_t* h = (uint16_t*)malloc(bytes);
        uint32_t s = 12345;
        for (size_t i = 0; i < bytes / 2; i++) { s = s * 1664525u + 1013904223u; float f = (s >> 8) * (2.f / 16777216.f) - 1.f; uint32_t u; memcpy(&u, &f, 4); h[i] = u >> 16; }
        CK(cudaMemcpy(a, h, bytes, cudaMemcpyHostToDevice));
        free(h);
        float hx[K];
        for (int i = 0; i < K; i++) { s = s * 1664525u + 1013904223u; hx[i] = (s >> 8) * (2.f / 16777216.f) - 1.f; }
        CK(cudaMemcpy(x, hx, K * 4, cudaMemcpyHostToDevice));
    }
    auto timeit = [&](auto launch, int iters) { return time_us(launch, iters, 2); };  // us
    const double copyBW = copy_bandwidth(b, a, big, 2, "copy 1 GiB");
    auto report = [&](const char* name, double us) {
        printf("RESULT lmhead %-34s %8.2f us %6.0f GB/s %6.1f%% of copy\n", name, us, bytes / (us * 1e-6) / 1e9, 100.0 * bytes / (us * 1e-6) / copyBW);
    };
    auto check = [&](const char* name) {
        static float h0[128256], h1[128256];
        CK(cudaMemcpy(h0, y0, N * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h1, y1, N * 4, cudaMemcpyDeviceToHost));
        double md = 0;
        for (int i = 0; i < N; i++) md = fmax(md, fabs((double)h0[i] - h1[i]));
        printf("check %s max |diff| %.3g\n", name, md);
    };
    for (int pass = 0; pass < 2; pass++) {
        for (int bps : {2, 4, 8}) for (int U : {4, 8}) {
            char nm[64]; snprintf(nm, 64, "read U%d blocks/sm %d x256", U, bps);
            auto go = [&] { if (U == 4) k_ldg<4><<<sms * bps, 256>>>((const uint4*)a, bytes / 16, out); else k_ldg<8><<<sms * bps, 256>>>((const uint4*)a, bytes / 16, out); };
            report(nm, timeit(go, 20));
        }
        report("u4 (committed)", timeit([&] { gemv_u4<<<(N + 7) / 8, 256>>>((const uint16_t*)a, x, y0, N, K); }, 20));
        for (int bps : {1, 2, 3, 4}) {
            char nm[64];
            snprintf(nm, 64, "rows1 blocks/sm %d", bps);
            report(nm, timeit([&] { gemv_rows<1><<<sms * bps, 256>>>((const uint16_t*)a, x, y1, N); }, 20));
            if (pass == 0 && bps == 2) check(nm);
            snprintf(nm, 64, "rows2 blocks/sm %d", bps);
            report(nm, timeit([&] { gemv_rows<2><<<sms * bps, 256>>>((const uint16_t*)a, x, y1, N); }, 20));
            if (pass == 0 && bps == 2) check(nm);
        }
    }
    return 0;
}
