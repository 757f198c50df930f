// The cuBLAS path's helpers (kernels/cublas.go): the GEMM itself is
// cublasGemmEx's; these kernels give it its operands in 16 bits and the bias.
//
// blas_nvfp4_f16 dequantizes NVFP4 weight rows to fp16 without rounding: an
// E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6: at most 2 significant bits) times
// its E4M3 block scale (at most 4 significant bits; 2^-9 .. 448) has at most
// 6 significant bits and lies in 2^-10 .. 2688, every such value an fp16
// normal (11 significant bits, 2^-14 .. 65504), and also a bf16 one (8 bits).
// The global float32 scale would round them; the host passes it as
// cublasGemmEx's alpha instead, so the sums are the own GEMM's
// (gemm_nvfp4_*: fp16 weights times fp16 x, float32 sums, times the global
// scale), in cuBLAS's order. E4M3's NaN (0x7f, 0xff) stays NaN.

// An E2M1 code's value from its bits (kE2M1 without the constant-memory
// lookup, which serializes a warp's distinct indices): magnitude codes 2-7
// are 2^(e-1) x (1 + m/2) for e = code >> 1, m = code & 1; 1 is 0.5, 0 is 0;
// bit 3 the sign (code 8 gives -0, as kE2M1).
__device__ __forceinline__ float e2m1_f32(uint32_t c) {
    const uint32_t mag = c & 7u;
    float v = __uint_as_float(((126u + (mag >> 1)) << 23) | ((mag & 1u) << 22));
    v = mag >= 2u ? v : (mag == 1u ? 0.5f : 0.f);
    return (c & 8u) ? -v : v;
}

// w[r][k] (fp16, rows n0 .. n0 + rows - 1 of the weight, row-major, K per
// row) from P (E2M1 pairs, low nibble first) and S (E4M3 per 16 elements),
// both starting at row n0. One thread per 8 elements (4 bytes of P, one
// scale); K % 16 == 0.
extern "C" __global__ void blas_nvfp4_f16(uint4* __restrict__ w, const uint32_t* __restrict__ P, const uint8_t* __restrict__ S,
                                          int rows, int K) {
    pdl_entry();
    const long units = (long)rows * (K / 8);
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < units; i += (long)gridDim.x * blockDim.x) {
        const uint32_t p = P[i];
        const float s = e4m3_to_f32(S[i >> 1]);  // 8 elements a unit, 16 a scale: every row's units pair up as K % 16 == 0
        uint32_t h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t b = (p >> (8 * j)) & 0xff;
            h[j] = f2h2(e2m1_f32(b & 0xf) * s, e2m1_f32(b >> 4) * s);
        }
        w[i] = make_uint4(h[0], h[1], h[2], h[3]);
    }
}

// xh = x rounded to fp16 (as gemm_x_h8 rounds it for the own NVFP4 GEMM),
// one thread per 8 elements, units = m K / 8.
extern "C" __global__ void blas_x_f16(uint4* __restrict__ xh, const float4* __restrict__ x, int units) {
    pdl_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < units; i += gridDim.x * blockDim.x) {
        const float4 a = x[2 * i], b = x[2 * i + 1];
        xh[i] = make_uint4(f2h2(a.x, a.y), f2h2(a.z, a.w), f2h2(b.x, b.y), f2h2(b.z, b.w));
    }
}

// y[i][n] = bias[n] for the m rows of N: the GEMMs after it add to it (beta 1).
extern "C" __global__ void blas_bias_rows(float* __restrict__ y, const float* __restrict__ bias, int m, int N) {
    pdl_entry();
    const long total = (long)m * N;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        y[i] = bias[i % N];
    }
}

// y[i][n] = c[i][n] + c[m + i][n] (+ bias[n]): the stacked bf16 path's sum
// of W·hi (c's first m rows) and W·lo (its last m), one GEMM over 2m
// columns having read the weight once (kernels/cublas.go).
extern "C" __global__ void blas_add_halves(float* __restrict__ y, const float* __restrict__ c, const float* __restrict__ bias,
                                           int m, int N) {
    pdl_entry();
    const long total = (long)m * N;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        float v = c[i] + c[total + i];
        if (bias) v += bias[i % N];
        y[i] = v;
    }
}
