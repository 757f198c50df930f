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
//
// moe_up_fp8 and moe_down_fp8 are the same over FP8 E4M3 experts with 128x128
// float32 tile scales (fp8.cuh; DeepSeek-V3's and V4 -Base's routed
// experts): a chunk is 32 E4M3 bytes, decoded exactly to float32, its dot
// multiplied by its tile's scale (moe_dots_fp8); the table's global scales
// are 2^-14, so that the 2^14 the NVFP4 kernels apply leaves the sums as they
// are. moe_up_bf16 and moe_down_bf16 are the same over bf16 experts
// (Qwen3-MoE's, as released): a chunk is 64 bytes of 32 bf16 values, widened
// exactly (moe_dots_bf16), no scales (global 2^-14 as FP8's).
//
// moe_softmax_route: warp i routes token i as layers.SoftmaxRoute
// (Qwen3-MoE): p = softmax(logits), exp and sum in double, p rounded once to
// float; the K largest p (moe_route's order); w = p_pick, divided by their
// sum (in pick order) when norm; stored in expert order.
#define MOE_MAXK 16
#define MOE_MAXE 1024
#define MOE_RT WARP  // moe_route: a warp per token
#define MOE_ROWS 16
#define MOE_THREADS 256
// The expert weights' formats (moe.go: moeExperts.format).
#define MOE_NVFP4 0
#define MOE_FP8 1
#define MOE_BF16 2

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

// The best of v[0, n) not yet taken (moe_before's order), found by the warp
// and marked taken; every lane returns it. A __syncwarp follows the mark.
__device__ __forceinline__ int moe_take_best(const float* v, bool* taken, int n, int lane) {
    float bv = 0.f;
    int bi = -1;
    for (int e = lane; e < n; e += WARP)
        if (!taken[e] && (bi < 0 || moe_before(v[e], e, bv, bi))) bv = v[e], bi = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || moe_before(ov, oi, bv, bi))) bv = ov, bi = oi;
    }
    if (lane == 0) taken[bi] = true;
    __syncwarp();
    return bi;
}

// The end of a route (one thread): the k picks' scores s[pick] as weights,
// divided by their sum (+1e-20, added in pick order) when norm, times scale,
// stored with the picks in expert order (insertion sort).
__device__ __forceinline__ void moe_store_route(int* ids, float* wts, const int* picks, const float* s, int k, bool norm,
                                                float scale) {
    int pk[MOE_MAXK];
    float w[MOE_MAXK], sum = 0.f;
    for (int j = 0; j < k; j++) {
        pk[j] = picks[j];
        w[j] = s[pk[j]];
        sum += w[j];
    }
    sum += 1e-20f;
    for (int j = 0; j < k; j++) w[j] = (norm ? w[j] / sum : w[j]) * scale;
    for (int j = 1; j < k; j++)
        for (int q = j; q > 0 && pk[q - 1] > pk[q]; q--) {
            const int tp = pk[q];
            pk[q] = pk[q - 1], pk[q - 1] = tp;
            const float tw = w[q];
            w[q] = w[q - 1], w[q - 1] = tw;
        }
    for (int j = 0; j < k; j++) ids[j] = pk[j], wts[j] = w[j];
}

extern "C" __global__ void __launch_bounds__(MOE_RT) moe_route(int* ids, float* wts, const float* logits, const float* bias,
                                                                const int* hash, int E, int K, int sqrtsp, float scale) {
    pdl_entry();
    __shared__ float s_s[MOE_MAXE], s_v[MOE_MAXE];
    __shared__ bool s_taken[MOE_MAXE];
    __shared__ int s_pick[MOE_MAXK];
    const int i = blockIdx.x, lane = threadIdx.x;
    const float* l = logits + (size_t)i * E;
    for (int e = lane; e < E; e += WARP) {
        const float sc = sqrtsp ? moe_sqrt_softplus(l[e]) : mhc_sigmoid(l[e]);
        s_s[e] = sc;
        s_v[e] = bias ? sc + bias[e] : sc;
        s_taken[e] = false;
    }
    __syncwarp();
    if (hash) {
        if (lane < K) s_pick[lane] = hash[(size_t)i * K + lane];
    } else {
        for (int j = 0; j < K; j++) {  // the best remaining expert, K times
            const int bi = moe_take_best(s_v, s_taken, E, lane);
            if (lane == 0) s_pick[j] = bi;
        }
    }
    __syncwarp();
    if (lane == 0) moe_store_route(ids + (size_t)i * K, wts + (size_t)i * K, s_pick, s_s, K, true, scale);
}

// moe_group_route: warp i routes token i as layers.GroupRoute (DeepSeek-V3 /
// V3.2): s = sigmoid(logits) as moe_route, c = s + bias; a group's score is
// the sum of its two largest c (the larger first); the tg best groups (the
// lower group on a tie) keep their experts and the others' c become -inf; the
// k largest c are the picks (moe_route's order); w = s_pick, divided by the
// picks' sum (+1e-20, in pick order) when norm, then times scale; stored in
// expert order. At most MOE_MAXE / 2 groups.
extern "C" __global__ void __launch_bounds__(MOE_RT) moe_group_route(int* ids, float* wts, const float* logits,
                                                                      const float* bias, int E, int K, int G, int tg,
                                                                      int norm, float scale) {
    pdl_entry();
    __shared__ float s_s[MOE_MAXE], s_v[MOE_MAXE], s_g[MOE_MAXE / 2];
    __shared__ bool s_taken[MOE_MAXE], s_keep[MOE_MAXE / 2];
    __shared__ int s_pick[MOE_MAXK];
    const int i = blockIdx.x, lane = threadIdx.x, gs = E / G;
    const float* l = logits + (size_t)i * E;
    for (int e = lane; e < E; e += WARP) {
        const float sc = mhc_sigmoid(l[e]);
        s_s[e] = sc;
        s_v[e] = bias ? sc + bias[e] : sc;
        s_taken[e] = false;
    }
    __syncwarp();
    for (int g = lane; g < G; g += WARP) {  // the two largest of the group
        int b1 = -1, b2 = -1;
        for (int e = g * gs; e < (g + 1) * gs; e++) {
            if (b1 < 0 || moe_before(s_v[e], e, s_v[b1], b1)) b2 = b1, b1 = e;
            else if (b2 < 0 || moe_before(s_v[e], e, s_v[b2], b2)) b2 = e;
        }
        s_g[g] = s_v[b1] + s_v[b2];
        s_keep[g] = false;
    }
    __syncwarp();
    for (int r = 0; r < tg; r++) moe_take_best(s_g, s_keep, G, lane);  // the tg best groups are kept
    for (int e = lane; e < E; e += WARP)
        if (!s_keep[e / gs]) s_v[e] = -INFINITY;
    __syncwarp();
    for (int j = 0; j < K; j++) {  // the best remaining expert, K times
        const int bi = moe_take_best(s_v, s_taken, E, lane);
        if (lane == 0) s_pick[j] = bi;
    }
    if (lane == 0) moe_store_route(ids + (size_t)i * K, wts + (size_t)i * K, s_pick, s_s, K, norm != 0, scale);
}

extern "C" __global__ void __launch_bounds__(MOE_RT) moe_softmax_route(int* ids, float* wts, const float* logits, int E,
                                                                        int K, int norm) {
    pdl_entry();
    __shared__ float s_p[MOE_MAXE];
    __shared__ bool s_taken[MOE_MAXE];
    __shared__ int s_pick[MOE_MAXK];
    const int i = blockIdx.x, lane = threadIdx.x;
    const float* l = logits + (size_t)i * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += WARP) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    double sum = 0.0;  // (a NaN logit makes it NaN, and every p with it, as on the CPU)
    for (int e = lane; e < E; e += WARP) sum += exp((double)(l[e] - mx));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int e = lane; e < E; e += WARP) {
        s_p[e] = (float)(exp((double)(l[e] - mx)) / sum);
        s_taken[e] = false;
    }
    __syncwarp();
    for (int j = 0; j < K; j++) {  // the most probable remaining expert, K times
        const int bi = moe_take_best(s_p, s_taken, E, lane);
        if (lane == 0) s_pick[j] = bi;
    }
    // The sum of the picks' p is at least K/E >= 2^-10, so moe_store_route's
    // 1e-20 leaves it unchanged, as the CPU's sum without it.
    if (lane == 0) moe_store_route(ids + (size_t)i * K, wts + (size_t)i * K, s_pick, s_p, K, norm != 0, 1.f);
}

// Prefetches bytes [0, n) at p into L2, lane l taking the 128-byte lines l,
// l + 32, ...: a warp's weight rows start on their way while the block
// stages its inputs.
__device__ __forceinline__ void moe_prefetch(const void* p, size_t n, int lane) {
    for (size_t o = (size_t)lane * 128; o < n; o += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(p) + o));
}

// Rows j < n of x (K floats each, x + j * K; K % 32 == 0) into xs + j *
// stride in chunk-major order: column 32c + k (c = 32u + l) at ((u * 8 + k /
// 4) * 32 + l) * 4 + k % 4, so that lane l's four columns 32c + 4q .. + 3
// are one float4 and the warp's reads are consecutive. MOE_SB of a thread's
// loads in flight before their stores (the compiler cannot move a global
// load past a store to shared memory through generic pointers: one round
// trip per element otherwise); float4 copies where x is 16-byte aligned.
#define MOE_SB 8
template <typename T>  // float, or float4 where x is 16-byte aligned
__device__ __forceinline__ void moe_stage_as(float* xs, int stride, const float* x, int K, int n) {
    constexpr int V = sizeof(T) / sizeof(float);
    const int kv = K / V, total = n * kv;
    for (int i0 = threadIdx.x; i0 < total; i0 += MOE_SB * blockDim.x) {
        T v[MOE_SB];
#pragma unroll
        for (int u = 0; u < MOE_SB; u++) {
            const int i = i0 + u * blockDim.x;
            if (i < total) v[u] = reinterpret_cast<const T*>(x)[i];
        }
#pragma unroll
        for (int u = 0; u < MOE_SB; u++) {
            const int i = i0 + u * blockDim.x;
            if (i >= total) break;
            const int j = i / kv, col = V * (i - j * kv);
            const int c = col >> 5, k = col & 31, uu = c >> 5, l = c & 31;
            *reinterpret_cast<T*>(xs + j * stride + ((uu * 8 + (k >> 2)) * 32 + l) * 4 + (k & 3)) = v[u];
        }
    }
}
__device__ __forceinline__ void moe_stage(float* xs, int stride, const float* x, int K, int n) {
    if (reinterpret_cast<uintptr_t>(x) % 16 == 0)
        moe_stage_as<float4>(xs, stride, x, K, n);
    else
        moe_stage_as<float>(xs, stride, x, K, n);
}

// This lane's shares of n <= N row dot products (p[q], s[q]) · xs[q] (xs
// staged by moe_stage), unscaled by the global scales and 2^14, into acc;
// the rows' loads for two chunks each are in flight together.
template <int N>
__device__ __forceinline__ void moe_dots(float acc[N], const uint8_t* const p[N], const uint8_t* const s[N],
                                         const float* const xs[N], int n, int K, int lane) {
    const int nc = K >> 5;
#pragma unroll
    for (int q = 0; q < N; q++) acc[q] = 0.f;
    for (int c0 = lane; c0 < nc; c0 += 2 * WARP) {
        uint4 w[N][2];
        uint32_t sc[N][2];
#pragma unroll
        for (int q = 0; q < N; q++)
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int c = c0 + u * WARP;
                if (q < n && c < nc) {
                    w[q][u] = __ldcs(reinterpret_cast<const uint4*>(p[q] + 16 * (size_t)c));
                    sc[q][u] = __ldg(reinterpret_cast<const unsigned short*>(s[q] + 2 * (size_t)c));
                }
            }
#pragma unroll
        for (int q = 0; q < N; q++)
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int c = c0 + u * WARP;
                if (q >= n || c >= nc) continue;
                const float4* xc = reinterpret_cast<const float4*>(xs[q]) + (size_t)((c >> 5) * 8) * 32 + (c & 31);
                const uint32_t words[4] = {w[q][u].x, w[q][u].y, w[q][u].z, w[q][u].w};
                float blk[2] = {0.f, 0.f};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    uint32_t h[4];
                    e2m1x8_to_h2(words[k], h);  // columns 8k + 2j, 8k + 2j + 1
#pragma unroll
                    for (int j = 0; j < 4; j += 2) {
                        const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&h[j]));
                        const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&h[j + 1]));
                        const float4 xv = xc[(2 * k + j / 2) * 32];  // columns 8k + 2j .. + 3
                        blk[k >> 1] = fmaf(f0.x, xv.x, blk[k >> 1]);
                        blk[k >> 1] = fmaf(f0.y, xv.y, blk[k >> 1]);
                        blk[k >> 1] = fmaf(f1.x, xv.z, blk[k >> 1]);
                        blk[k >> 1] = fmaf(f1.y, xv.w, blk[k >> 1]);
                    }
                }
                const uint32_t s2 = e4m3x2_lo(sc[q][u]);  // blocks 2c, 2c + 1
                const float2 sf = __half22float2(*reinterpret_cast<const __half2*>(&s2));
                acc[q] = fmaf(blk[0], sf.x, acc[q]);
                acc[q] = fmaf(blk[1], sf.y, acc[q]);
            }
    }
}

// The FP8 form of moe_dots: p[q] is the row's E4M3 bytes, s[q] its tile
// row's float32 scales (one per 128 columns, chunk c's at c / 4); the sums
// are not scaled further.
template <int N>
__device__ __forceinline__ void moe_dots_fp8(float acc[N], const uint8_t* const p[N], const uint8_t* const s[N],
                                             const float* const xs[N], int n, int K, int lane) {
    const int nc = K >> 5;
#pragma unroll
    for (int q = 0; q < N; q++) acc[q] = 0.f;
    for (int c = lane; c < nc; c += WARP) {
        uint4 w[N][2];
        float sc[N];
#pragma unroll
        for (int q = 0; q < N; q++)
            if (q < n) {
                w[q][0] = __ldcs(reinterpret_cast<const uint4*>(p[q] + 32 * (size_t)c));
                w[q][1] = __ldcs(reinterpret_cast<const uint4*>(p[q] + 32 * (size_t)c + 16));
                sc[q] = __ldg(reinterpret_cast<const float*>(s[q]) + (c >> 2));
            }
#pragma unroll
        for (int q = 0; q < N; q++) {
            if (q >= n) continue;
            const float4* xc = reinterpret_cast<const float4*>(xs[q]) + (size_t)((c >> 5) * 8) * 32 + (c & 31);
            const uint32_t words[8] = {w[q][0].x, w[q][0].y, w[q][0].z, w[q][0].w, w[q][1].x, w[q][1].y, w[q][1].z, w[q][1].w};
            float blk = 0.f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float f[4];
                e4m3x4_f32(words[k], f);  // columns 32c + 4k .. + 3
                const float4 xv = xc[k * 32];
                blk = fmaf(f[0], xv.x, blk);
                blk = fmaf(f[1], xv.y, blk);
                blk = fmaf(f[2], xv.z, blk);
                blk = fmaf(f[3], xv.w, blk);
            }
            acc[q] = fmaf(blk, sc[q], acc[q]);
        }
    }
}

// The bf16 form of moe_dots: p[q] is the row's bf16 values (no scales);
// lane l's chunk c is four 16-byte loads of 8 values, widened exactly.
template <int N>
__device__ __forceinline__ void moe_dots_bf16(float acc[N], const uint8_t* const p[N], const float* const xs[N], int n,
                                              int K, int lane) {
    const int nc = K >> 5;
#pragma unroll
    for (int q = 0; q < N; q++) acc[q] = 0.f;
    for (int c = lane; c < nc; c += WARP) {
        uint4 w[N][4];
#pragma unroll
        for (int q = 0; q < N; q++)
            if (q < n)
#pragma unroll
                for (int u = 0; u < 4; u++) w[q][u] = __ldcs(reinterpret_cast<const uint4*>(p[q] + 64 * (size_t)c) + u);
#pragma unroll
        for (int q = 0; q < N; q++) {
            if (q >= n) continue;
            const float4* xc = reinterpret_cast<const float4*>(xs[q]) + (size_t)((c >> 5) * 8) * 32 + (c & 31);
            const uint32_t words[16] = {w[q][0].x, w[q][0].y, w[q][0].z, w[q][0].w, w[q][1].x, w[q][1].y,
                                        w[q][1].z, w[q][1].w, w[q][2].x, w[q][2].y, w[q][2].z, w[q][2].w,
                                        w[q][3].x, w[q][3].y, w[q][3].z, w[q][3].w};
            float a = acc[q];
#pragma unroll
            for (int k = 0; k < 8; k++) {  // columns 32c + 4k .. + 3: words 2k and 2k + 1, the low half first
                const float4 xv = xc[k * 32];
                a = fmaf(__uint_as_float(words[2 * k] << 16), xv.x, a);
                a = fmaf(__uint_as_float(words[2 * k] & 0xffff0000u), xv.y, a);
                a = fmaf(__uint_as_float(words[2 * k + 1] << 16), xv.z, a);
                a = fmaf(__uint_as_float(words[2 * k + 1] & 0xffff0000u), xv.w, a);
            }
            acc[q] = a;
        }
    }
}

// A weight row's bytes and its scales' address in the MoE kernels' formats:
// NVFP4 (E2M1 pairs, an E4M3 scale per 16 columns), FP8 (E4M3, a float32
// scale per 128 x 128 tile) or bf16 (no scales).
template <int F>
__device__ __forceinline__ size_t moe_row_bytes(int cols) {
    return F == MOE_BF16 ? 2 * (size_t)cols : F == MOE_FP8 ? (size_t)cols : (size_t)cols / 2;
}
template <int F>
__device__ __forceinline__ const uint8_t* moe_row(unsigned long long p, int r, int cols) {
    return (const uint8_t*)p + (size_t)r * moe_row_bytes<F>(cols);
}
template <int F>
__device__ __forceinline__ const uint8_t* moe_srow(unsigned long long s, int r, int cols) {
    if (F == MOE_BF16) return nullptr;
    return F == MOE_FP8 ? (const uint8_t*)s + (size_t)(r / 128) * ((cols + 127) / 128) * 4 : (const uint8_t*)s + (size_t)r * (cols / 16);
}

// n <= N dot products of rows p[q] (scales s[q]) with xs[q] in format F.
template <int F, int N>
__device__ __forceinline__ void moe_dots_of(float acc[N], const uint8_t* const p[N], const uint8_t* const s[N],
                                            const float* const xs[N], int n, int K, int lane) {
    if (F == MOE_FP8) moe_dots_fp8<N>(acc, p, s, xs, n, K, lane);
    else if (F == MOE_BF16) moe_dots_bf16<N>(acc, p, xs, n, K, lane);
    else moe_dots<N>(acc, p, s, xs, n, K, lane);
}

template <int F>
__device__ __forceinline__ void moe_up_body(float* act, const float* x, const int* ids, const MoeExpert* table, int K,
                                            int I, int D, float limit) {
    extern __shared__ __align__(16) float moe_sh[];
    const int pair = blockIdx.y, tok = pair / K, lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const MoeExpert& ex = table[ids[pair]];
    {
        const int r0 = blockIdx.x * MOE_ROWS + warp * (MOE_ROWS / (MOE_THREADS / WARP));
        const int nr = max(0, min(MOE_ROWS / (MOE_THREADS / WARP), I - r0));
        for (int m = 0; m < 2 && nr > 0; m++) {
            moe_prefetch(moe_row<F>(ex.p[m], r0, D), (size_t)nr * moe_row_bytes<F>(D), lane);
            if (F == MOE_NVFP4) moe_prefetch((const uint8_t*)ex.s[m] + (size_t)r0 * (D / 16), (size_t)nr * (D / 16), lane);
        }
    }
    moe_stage(moe_sh, 0, x + (size_t)tok * D, D, 1);
    __syncthreads();
    // This warp's two rows of gate and up: four dot products together.
    constexpr int RW = MOE_ROWS / (MOE_THREADS / WARP);
    static_assert(RW == 2, "moe_up: two rows a warp");
    const int r0 = blockIdx.x * MOE_ROWS + warp * RW, nr = min(RW, I - r0);
    if (nr <= 0) return;
    const uint8_t* pp[4];
    const uint8_t* ss[4];
    const float* xx[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int r = r0 + min(q >> 1, nr - 1), m = q & 1;  // (row, gate / up)
        pp[q] = moe_row<F>(ex.p[m], r, D);
        ss[q] = moe_srow<F>(ex.s[m], r, D);
        xx[q] = moe_sh;
    }
    float d[4];
    moe_dots_of<F, 4>(d, pp, ss, xx, 2 * nr, D, lane);
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        if (rr >= nr) break;
        float g = warp_sum(d[2 * rr]) * (16384.f * ex.g[0]);
        float u = warp_sum(d[2 * rr + 1]) * (16384.f * ex.g[1]);
        if (lane == 0) {
            if (limit > 0.f) {
                g = fminf(g, limit);
                u = fmaxf(fminf(u, limit), -limit);
            }
            act[(size_t)pair * I + r0 + rr] = g / (1.f + __expf(-g)) * u;
        }
    }
}

extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_up(float* act, const float* x, const int* ids,
                                                                 const MoeExpert* table, int K, int I, int D, float limit) {
    pdl_entry();
    moe_up_body<MOE_NVFP4>(act, x, ids, table, K, I, D, limit);
}
extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_up_fp8(float* act, const float* x, const int* ids,
                                                                     const MoeExpert* table, int K, int I, int D, float limit) {
    pdl_entry();
    moe_up_body<MOE_FP8>(act, x, ids, table, K, I, D, limit);
}
extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_up_bf16(float* act, const float* x, const int* ids,
                                                                      const MoeExpert* table, int K, int I, int D, float limit) {
    pdl_entry();
    moe_up_body<MOE_BF16>(act, x, ids, table, K, I, D, limit);
}

template <int F>
__device__ __forceinline__ void moe_down_body(float* out, const float* act, const int* ids, const float* wts,
                                              const MoeExpert* table, int K, int I, int D) {
    extern __shared__ __align__(16) float moe_sh[];
    const int tok = blockIdx.y, lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int stride = (I + 1023) / 1024 * 1024;  // a slot's staged activations (moe_stage's span)
    {
        const int r0 = blockIdx.x * MOE_ROWS + warp * (MOE_ROWS / (MOE_THREADS / WARP));
        const int nr = max(0, min(MOE_ROWS / (MOE_THREADS / WARP), D - r0));
        for (int j = 0; j < K && nr > 0; j++) {
            const MoeExpert& ex = table[ids[(size_t)tok * K + j]];
            moe_prefetch(moe_row<F>(ex.p[2], r0, I), (size_t)nr * moe_row_bytes<F>(I), lane);
            if (F == MOE_NVFP4) moe_prefetch((const uint8_t*)ex.s[2] + (size_t)r0 * (I / 16), (size_t)nr * (I / 16), lane);
        }
    }
    moe_stage(moe_sh, stride, act + (size_t)tok * K * I, I, K);
    __syncthreads();
    // Per row, the K experts' dot products four at a time (their loads in
    // flight together), then added in expert order.
    for (int rr = 0; rr < MOE_ROWS / (MOE_THREADS / WARP); rr++) {
        const int r = blockIdx.x * MOE_ROWS + warp * (MOE_ROWS / (MOE_THREADS / WARP)) + rr;
        if (r >= D) break;
        float acc = out[(size_t)tok * D + r];
        for (int j0 = 0; j0 < K; j0 += 4) {
            const uint8_t* pp[4];
            const uint8_t* ss[4];
            const float* xx[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int j = min(j0 + q, K - 1);
                const MoeExpert& ex = table[ids[(size_t)tok * K + j]];
                pp[q] = moe_row<F>(ex.p[2], r, I);
                ss[q] = moe_srow<F>(ex.s[2], r, I);
                xx[q] = moe_sh + j * stride;
            }
            float d[4];
            moe_dots_of<F, 4>(d, pp, ss, xx, min(4, K - j0), I, lane);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int j = j0 + q;
                if (j >= K) break;
                const float yj = warp_sum(d[q]) * (16384.f * table[ids[(size_t)tok * K + j]].g[2]);
                acc = __fadd_rn(acc, __fmul_rn(wts[(size_t)tok * K + j], yj));
            }
        }
        if (lane == 0) out[(size_t)tok * D + r] = acc;
    }
}

extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_down(float* out, const float* act, const int* ids,
                                                                   const float* wts, const MoeExpert* table, int K, int I,
                                                                   int D) {
    pdl_entry();
    moe_down_body<MOE_NVFP4>(out, act, ids, wts, table, K, I, D);
}
extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_down_fp8(float* out, const float* act, const int* ids,
                                                                       const float* wts, const MoeExpert* table, int K,
                                                                       int I, int D) {
    pdl_entry();
    moe_down_body<MOE_FP8>(out, act, ids, wts, table, K, I, D);
}
extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_down_bf16(float* out, const float* act, const int* ids,
                                                                        const float* wts, const MoeExpert* table, int K,
                                                                        int I, int D) {
    pdl_entry();
    moe_down_body<MOE_BF16>(out, act, ids, wts, table, K, I, D);
}
