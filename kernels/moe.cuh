// Mixture of experts on the device (dsv4.MoEOps): DeepSeek-V4's routing with
// no host round trip and the routed experts' SwiGLU FFNs over NVFP4 weights
// that device-side ids pick from a table of the layer's experts.
//
// moe_route: block i routes token i as dsv4.Route: scores s_e = sigmoid or
// sqrt(softplus) of logits[i, e] in double, rounded once (as the CPU); the
// picks are the hashed ids, or the K largest s + bias (NaN largest, as torch;
// the lower expert first on a tie: the CPU's introselect may keep another of
// exactly tied experts); weights s_pick / (sum + 1e-20) * scale, the sum in
// pick order. The (id, weight) pairs are stored in expert order, the order in
// which the CPU path adds the experts.
//
// moe_up: block (tile, i*K + j) computes rows [16 tile, 16 tile + 16) of
// act[i*K + j] = SwiGLU(W1_e x_i, W3_e x_i, limit), e = ids[i*K + j];
// moe_down: block (tile, i) adds sum_j w_ij W2_e act[i*K + j] to out[i] for
// its 16 rows, the experts in order (fadd(out, fmul(w, y)), as ScatterAdd).
// A warp takes two rows; a row's dot product takes 16-byte chunks of 32
// weights, lane l the chunks l, l + 32, ..., decoded exactly to fp16 (x 2^-14)
// and multiplied in float32 with x, which is staged in shared memory in
// chunk-major order so that the lanes' reads are consecutive (moe_stage).
// K % 32 == 0 for every weight (moe.go checks).
#define MOE_MAXK 16
#define MOE_MAXE 1024
#define MOE_RT 256
#define MOE_ROWS 16
#define MOE_THREADS 256

struct MoeExpert {
    unsigned long long p[3], s[3];  // gate (w1), up (w3), down (w2): E2M1 pairs and E4M3 block scales
    float g[3];                     // global scales
    float pad;
};

__device__ __forceinline__ float moe_sqrt_softplus(float x) {
    if (x > 20.f) return (float)sqrt((double)x);
    return (float)sqrt(log1p(exp((double)x)));
}

// a (index ia) ranks before b (index ib): NaN first, then larger, then the lower index.
__device__ __forceinline__ bool moe_before(float a, int ia, float b, int ib) {
    const bool na = a != a, nb = b != b;
    if (na != nb) return na;
    if (!na && a != b) return a > b;
    return ia < ib;
}

extern "C" __global__ void __launch_bounds__(MOE_RT) moe_route(int* ids, float* wts, const float* logits, const float* bias,
                                                                const int* hash, int E, int K, int sqrtsp, float scale) {
    __shared__ float s_s[MOE_MAXE], s_v[MOE_MAXE];
    __shared__ bool s_taken[MOE_MAXE];
    __shared__ float r_v[MOE_RT / WARP];
    __shared__ int r_i[MOE_RT / WARP];
    __shared__ int s_pick[MOE_MAXK];
    const int i = blockIdx.x, tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const float* l = logits + (size_t)i * E;
    for (int e = tid; e < E; e += MOE_RT) {
        const float s = sqrtsp ? moe_sqrt_softplus(l[e]) : mhc_sigmoid(l[e]);
        s_s[e] = s;
        s_v[e] = bias ? s + bias[e] : s;
        s_taken[e] = false;
    }
    __syncthreads();
    if (hash) {
        if (tid < K) s_pick[tid] = hash[(size_t)i * K + tid];
    } else {
        for (int j = 0; j < K; j++) {
            float bv = 0.f;
            int bi = -1;
            for (int e = tid; e < E; e += MOE_RT)
                if (!s_taken[e] && (bi < 0 || moe_before(s_v[e], e, bv, bi))) bv = s_v[e], bi = e;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (oi >= 0 && (bi < 0 || moe_before(ov, oi, bv, bi))) bv = ov, bi = oi;
            }
            if (lane == 0) r_v[warp] = bv, r_i[warp] = bi;
            __syncthreads();
            if (tid == 0) {
                for (int w = 1; w < MOE_RT / WARP; w++)
                    if (r_i[w] >= 0 && (bi < 0 || moe_before(r_v[w], r_i[w], bv, bi))) bv = r_v[w], bi = r_i[w];
                s_pick[j] = bi;
                s_taken[bi] = true;
            }
            __syncthreads();
        }
    }
    __syncthreads();
    if (tid == 0) {
        int pk[MOE_MAXK];
        float w[MOE_MAXK], sum = 0.f;
        for (int j = 0; j < K; j++) {
            pk[j] = s_pick[j];
            w[j] = s_s[pk[j]];
            sum += w[j];
        }
        sum += 1e-20f;
        for (int j = 0; j < K; j++) w[j] = w[j] / sum * scale;
        for (int j = 1; j < K; j++)  // insertion sort by expert
            for (int q = j; q > 0 && pk[q - 1] > pk[q]; q--) {
                const int tp = pk[q];
                pk[q] = pk[q - 1], pk[q - 1] = tp;
                const float tw = w[q];
                w[q] = w[q - 1], w[q - 1] = tw;
            }
        for (int j = 0; j < K; j++) ids[(size_t)i * K + j] = pk[j], wts[(size_t)i * K + j] = w[j];
    }
}

// x[0..K) into xs in chunk-major order: column 32c + k (c = 32u + l) at
// ((u * 16 + k / 2) * 32 + l) * 2 + k % 2.
__device__ __forceinline__ void moe_stage(float* xs, const float* x, int K) {
    for (int col = threadIdx.x; col < K; col += blockDim.x) {
        const int c = col >> 5, k = col & 31, u = c >> 5, l = c & 31;
        xs[((u * 16 + (k >> 1)) * 32 + l) * 2 + (k & 1)] = x[col];
    }
}

// This lane's share of row (p, s) · x (x staged by moe_stage), unscaled by
// the global scale and 2^14.
__device__ __forceinline__ float moe_dot(const uint8_t* __restrict__ p, const uint8_t* __restrict__ s,
                                         const float* xs, int K, int lane) {
    const int nc = K >> 5;
    float acc = 0.f;
    for (int c0 = lane; c0 < nc; c0 += 4 * WARP) {
        uint4 w[4];
        uint32_t sc[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int c = c0 + u * WARP;
            if (c < nc) {
                w[u] = __ldcs(reinterpret_cast<const uint4*>(p + 16 * (size_t)c));
                sc[u] = __ldg(reinterpret_cast<const unsigned short*>(s + 2 * (size_t)c));
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int c = c0 + u * WARP;
            if (c >= nc) break;
            const float2* xc = reinterpret_cast<const float2*>(xs) + (size_t)((c >> 5) * 16) * 32 + (c & 31);
            const uint32_t words[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
            float blk[2] = {0.f, 0.f};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint32_t h[4];
                e2m1x8_to_h2(words[q], h);  // columns 8q + 2j, 8q + 2j + 1
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[j]));
                    const float2 xv = xc[(4 * q + j) * 32];
                    blk[q >> 1] = fmaf(f.x, xv.x, blk[q >> 1]);
                    blk[q >> 1] = fmaf(f.y, xv.y, blk[q >> 1]);
                }
            }
            const uint32_t s2 = e4m3x2_lo(sc[u]);  // blocks 2c, 2c + 1
            const float2 sf = __half22float2(*reinterpret_cast<const __half2*>(&s2));
            acc = fmaf(blk[0], sf.x, acc);
            acc = fmaf(blk[1], sf.y, acc);
        }
    }
    return acc;
}

extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_up(float* act, const float* x, const int* ids,
                                                                 const MoeExpert* table, int K, int I, int D, float limit) {
    extern __shared__ __align__(16) float moe_sh[];
    const int pair = blockIdx.y, tok = pair / K, lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    moe_stage(moe_sh, x + (size_t)tok * D, D);
    const MoeExpert& ex = table[ids[pair]];
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < MOE_ROWS / (MOE_THREADS / WARP); rr++) {
        const int r = blockIdx.x * MOE_ROWS + warp * (MOE_ROWS / (MOE_THREADS / WARP)) + rr;
        if (r >= I) break;
        float g = moe_dot((const uint8_t*)ex.p[0] + (size_t)r * (D / 2), (const uint8_t*)ex.s[0] + (size_t)r * (D / 16), moe_sh, D, lane);
        float u = moe_dot((const uint8_t*)ex.p[1] + (size_t)r * (D / 2), (const uint8_t*)ex.s[1] + (size_t)r * (D / 16), moe_sh, D, lane);
        g = warp_sum(g) * (16384.f * ex.g[0]);
        u = warp_sum(u) * (16384.f * ex.g[1]);
        if (lane == 0) {
            if (limit > 0.f) {
                g = fminf(g, limit);
                u = fmaxf(fminf(u, limit), -limit);
            }
            act[(size_t)pair * I + r] = g / (1.f + __expf(-g)) * u;
        }
    }
}

extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_down(float* out, const float* act, const int* ids,
                                                                   const float* wts, const MoeExpert* table, int K, int I,
                                                                   int D) {
    extern __shared__ __align__(16) float moe_sh[];
    const int tok = blockIdx.y, lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int stride = (I + 1023) / 1024 * 1024;  // a slot's staged activations (moe_stage's span)
    for (int j = 0; j < K; j++) moe_stage(moe_sh + j * stride, act + ((size_t)tok * K + j) * I, I);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < MOE_ROWS / (MOE_THREADS / WARP); rr++) {
        const int r = blockIdx.x * MOE_ROWS + warp * (MOE_ROWS / (MOE_THREADS / WARP)) + rr;
        if (r >= D) break;
        float acc = out[(size_t)tok * D + r];
        for (int j = 0; j < K; j++) {
            const MoeExpert& ex = table[ids[(size_t)tok * K + j]];
            float y = moe_dot((const uint8_t*)ex.p[2] + (size_t)r * (I / 2), (const uint8_t*)ex.s[2] + (size_t)r * (I / 16),
                              moe_sh + j * stride, I, lane);
            y = warp_sum(y) * (16384.f * ex.g[2]);
            acc = __fadd_rn(acc, __fmul_rn(wts[(size_t)tok * K + j], y));
        }
        if (lane == 0) out[(size_t)tok * D + r] = acc;
    }
}
