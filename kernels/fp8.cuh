// FP8 E4M3 block-scaled matmuls (DeepSeek-V3/V4's fine-grained FP8, kernels/fp8.go):
// y[i, n] = sum_k x[i, k] * e4m3(W[n, k]) * S[n / 128, k / 128] (+ bias[n]).
//
// W is [N, K] E4M3 bytes as stored (one byte a weight); S is [ceil(N/128),
// ceil(K/128)] float32 (E8M0 scales are widened to float32 at upload, exactly);
// K % 16 == 0 and x 16-byte aligned (fp8.go widens or takes gemv_fp8_any
// otherwise). Two kernels (and gemv_fp8_tma, an m = 1 variant fed by bulk
// copies, below gemv_fp8_m1):
//
// gemv_fp8_m<MR> (m = 1 decode, and small m): CUDA cores, exact in float32.
// A warp takes two weight rows (one scale tile row); its kw-th share of the
// block's warps splits K. Each lane streams 16-byte chunks of both rows, four
// chunks in flight, decodes them with cvt.f16x2.e4m3x2 (exact) to float32 and
// dots them with up to MR rows of x; each chunk's dot is multiplied by its
// tile's scale. The first chunks are loaded before the wait for the previous
// kernel (the weights are constant).
//
// gemm_fp8_t<BM> (larger m): the tensor cores, e4m3 widened to fp16 in
// registers (exact) feeding mma.sync m16n8k16 with the activations rounded
// to fp16 (|x| < 65504), float32 sums. A block takes 128 features (one scale
// tile row, so one scale a k-tile of 128) and BM tokens; each of its 8
// warps 16 features. Stages of one k-tile (128 weight rows x 128 bytes, BM x
// 128 values of x: float32 for BM = 16, fp16 converted beforehand by
// fp8_x_h for BM = 64) are copied by cp.async in an NS-deep ring; a k-tile's
// mma sums are multiplied by its scale into the accumulators. K is split over
// gridDim.z where the tiles alone leave multiprocessors idle: each split
// writes its partial sums, and the last to finish (a ticket a tile) adds them
// in split order, so the result does not depend on timing.

#define FP8_TILE 128

// Four E4M3 bytes of v to four floats (exact).
__device__ __forceinline__ void e4m3x4_f32(uint32_t v, float* f) {
    uint32_t lo = e4m3x2_lo(v), hi = e4m3x2_hi(v);
    float2 a = __half22float2(*reinterpret_cast<__half2*>(&lo)), b = __half22float2(*reinterpret_cast<__half2*>(&hi));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

// One launch: up to three weights of the same K reading the same x, or (m
// = 1) weight j the row at x + j * xs floats (the fusion pass joins them,
// fp8.go); the blocks of weight j end at ends[j].
struct Fp8GemvArgs {
    unsigned long long W[3], S[3], y[3], bias[3];
    unsigned long long x;
    int N[3], ends[3];
    int K, m, kw, ngroups;
    long long xs;
};

// MR rows of x a pass over the weights; m > MR takes several passes.
template <int MR>
__device__ __forceinline__ void gemv_fp8_body(const Fp8GemvArgs& ga) {
    constexpr int U = 4;  // chunks in flight a lane (each: 16 bytes of each of the two rows)
    __shared__ float red[8][2 * MR];
    int gi = 0;
    while (gi < ga.ngroups - 1 && (int)blockIdx.x >= ga.ends[gi]) gi++;
    const int blk = blockIdx.x - (gi ? ga.ends[gi - 1] : 0);
    const uint8_t* __restrict__ W = (const uint8_t*)ga.W[gi];
    const float* __restrict__ S = (const float*)ga.S[gi];
    const float* __restrict__ bias = (const float*)ga.bias[gi];
    float* y = (float*)ga.y[gi];
    const float* x = (const float*)ga.x + gi * ga.xs;
    const int N = ga.N[gi], K = ga.K, m = ga.m, kw = ga.kw;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int wk = warp % kw, rg = warp / kw;
    const int r0 = (blk * (8 / kw) + rg) * 2;
    const bool live = r0 < N;
    const int r1 = min(r0 + 1, N - 1);
    const uint4* w0 = reinterpret_cast<const uint4*>(W + (size_t)min(r0, N - 1) * K);
    const uint4* w1 = reinterpret_cast<const uint4*>(W + (size_t)r1 * K);
    const float* srow = S + (size_t)(min(r0, N - 1) / FP8_TILE) * ((K + FP8_TILE - 1) / FP8_TILE);
    const int C = K / 16, step = kw * WARP, c0 = wk * WARP + lane;
    pdl_launch();
    uint4 a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + u * step;
        if (live && c < C) a[u] = __ldg(w0 + c), b[u] = __ldg(w1 + c);
    }
    pdl_wait();
    for (int i0 = 0; i0 < m; i0 += MR) {
        const int mt = min(MR, m - i0);
        float acc0[MR], acc1[MR];
#pragma unroll
        for (int t = 0; t < MR; t++) acc0[t] = acc1[t] = 0.f;
        if (live) {
            for (int cb = c0; cb < C; cb += U * step) {
                if (i0 > 0 || cb != c0) {  // the first pass's first chunks were loaded before the wait
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        const int c = cb + u * step;
                        if (c < C) a[u] = __ldg(w0 + c), b[u] = __ldg(w1 + c);
                    }
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int c = cb + u * step;
                    if (c >= C) break;
                    const float s = __ldg(srow + c / (FP8_TILE / 16));
                    float fa[16], fb[16];
                    const uint32_t va[4] = {a[u].x, a[u].y, a[u].z, a[u].w}, vb[4] = {b[u].x, b[u].y, b[u].z, b[u].w};
#pragma unroll
                    for (int q = 0; q < 4; q++) e4m3x4_f32(va[q], fa + 4 * q), e4m3x4_f32(vb[q], fb + 4 * q);
#pragma unroll
                    for (int t = 0; t < MR; t++) {
                        if (t < mt) {
                            const float4* xr = reinterpret_cast<const float4*>(x + (size_t)(i0 + t) * K + 16 * c);
                            float da = 0.f, db = 0.f;
#pragma unroll
                            for (int q = 0; q < 4; q++) {
                                const float4 xv = xr[q];
                                da += fa[4 * q] * xv.x + fa[4 * q + 1] * xv.y + fa[4 * q + 2] * xv.z + fa[4 * q + 3] * xv.w;
                                db += fb[4 * q] * xv.x + fb[4 * q + 1] * xv.y + fb[4 * q + 2] * xv.z + fb[4 * q + 3] * xv.w;
                            }
                            acc0[t] = fmaf(da, s, acc0[t]);
                            acc1[t] = fmaf(db, s, acc1[t]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MR; t++) acc0[t] = warp_sum(acc0[t]), acc1[t] = warp_sum(acc1[t]);
        if (kw > 1) {
            if (lane == 0) {
#pragma unroll
                for (int t = 0; t < MR; t++) red[warp][2 * t] = acc0[t], red[warp][2 * t + 1] = acc1[t];
            }
            __syncthreads();
            if (wk == 0 && lane == 0) {
#pragma unroll
                for (int t = 0; t < MR; t++) {
                    float s0 = 0.f, s1 = 0.f;
                    for (int j = 0; j < kw; j++) s0 += red[warp + j][2 * t], s1 += red[warp + j][2 * t + 1];
                    acc0[t] = s0, acc1[t] = s1;
                }
            }
            __syncthreads();
        }
        if (live && wk == 0 && lane == 0) {
#pragma unroll
            for (int t = 0; t < MR; t++) {
                if (t < mt) {
                    y[(size_t)(i0 + t) * N + r0] = acc0[t] + (bias ? bias[r0] : 0.f);
                    if (r0 + 1 < N) y[(size_t)(i0 + t) * N + r0 + 1] = acc1[t] + (bias ? bias[r0 + 1] : 0.f);
                }
            }
        }
    }
}

// Blocks of 8 warps: 8 / kw row pairs a block (kw in 1, 2, 4, 8).
extern "C" __global__ void __launch_bounds__(256) gemv_fp8_m1(const __grid_constant__ Fp8GemvArgs a) { gemv_fp8_body<1>(a); }
extern "C" __global__ void __launch_bounds__(256) gemv_fp8_m4(const __grid_constant__ Fp8GemvArgs a) { gemv_fp8_body<4>(a); }

// gemv_fp8_tma: the m = 1 FP8 matmul fed by bulk copies, on the structure of
// gemv_nvfp4_tma8 (gemv.cuh: its mbarrier ring, producer warp and helpers).
// One block a multiprocessor walks tiles of 16 weight rows (block b takes
// tiles b, b + grid, ...) in stages of 1024 bytes (1024 weights) of each row,
// the last stage partial where K % 1024 != 0 (its bytes a multiple of 16, as a
// bulk copy needs). Warp FP8TMA_CW, the producer, copies a stage's 16 rows
// (lane r < 16: row r, one cp.async.bulk of 1024 bytes) into a ring of NS
// slots of 16 KB, the copies' arrival counted by the slot's "full" mbarrier,
// and refills a slot once the FP8TMA_CW consumer warps have released it on
// its "empty" mbarrier: the copy engine keeps up to NS stages in flight a
// multiprocessor without registers or instructions a byte, where
// gemv_fp8_m1 keeps four 16-byte loads a lane.
//
// Consumer warp w owns rows 2w and 2w+1 of the tile (a warp sum at the
// tile's end, no block reduction): lane l takes the 16-byte chunks l and
// l + 32 of both rows in every stage, decodes them exactly
// (cvt.f16x2.e4m3x2, then float32) and dots them in float32 with x, which
// the consumers stage once a block in shared memory as float32, chunk c's
// four float4 in four planes (plane q holds float4 q of every chunk), so
// that the lanes' loads of x are consecutive 16-byte words. Each chunk's
// dot is multiplied by its 128 x 128 tile's scale (rows 2w and 2w+1 lie in
// one tile row: 16 | 128), as gemv_fp8_m1 does: the same sums in float32,
// in another order.
//
// Shared memory: [NS slots of 16 x 1024 bytes][x: K floats][full, empty: NS
// mbarriers each]. Weight rows past N are copied from row 0 and not written.
#define FP8TMA_CW 8  // consumer warps (the launch bounds: 9 warps with the producer)
#define FP8TMA_ROW 1024
#define FP8TMA_STAGE (16 * FP8TMA_ROW)
extern "C" __global__ void __launch_bounds__(9 * WARP, 1) gemv_fp8_tma(const uint8_t* __restrict__ W,
    const float* __restrict__ S, const float* x, float* y, const float* __restrict__ bias, int N, int K, int NS) {
    extern __shared__ __align__(16) unsigned char fsm[];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int stages = K / FP8TMA_ROW, tail = K % FP8TMA_ROW, nst = stages + (tail != 0);
    const int tiles = (N + 15) / 16, KC = K / 16;  // KC: 16-element chunks of a row
    unsigned char* ring = fsm;
    float4* xs = reinterpret_cast<float4*>(fsm + NS * FP8TMA_STAGE);  // [4][KC] float4
    const uint32_t bars = smem_u32(xs + K / 4);                     // 16-byte aligned: K % 16 == 0
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (NS + s); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), FP8TMA_CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    pdl_launch();

    if (warp == FP8TMA_CW) {
        // Producer: the weights are constant, so the copies start before the
        // wait for the previous kernel (which the producer never joins).
        if (lane >= 16) return;
        int slot = 0;
        uint32_t phase = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            int row = tile * 16 + lane;
            row = row < N ? row : 0;
            const uint8_t* src = W + (size_t)row * K;
            for (int ks = 0; ks < nst; ks++) {
                const uint32_t nb = ks == stages ? tail : FP8TMA_ROW;
                mbar_wait(empty(slot), phase ^ 1);
                if (lane == 0) mbar_expect_tx(full(slot), 16 * nb);
                __syncwarp(0x0000ffff);
                bulk_g2s(smem_u32(ring + slot * FP8TMA_STAGE + lane * FP8TMA_ROW), src + (size_t)ks * FP8TMA_ROW, nb, full(slot));
                if (++slot == NS) slot = 0, phase ^= 1;
            }
        }
        return;
    }

    // Consumers: x into its planes (x is the previous kernel's output: plain
    // loads after the wait).
    pdl_wait();
    constexpr int NT = FP8TMA_CW * WARP;
    for (int j = threadIdx.x; j < K / 4; j += NT) xs[(j & 3) * KC + (j >> 2)] = reinterpret_cast<const float4*>(x)[j];
    asm volatile("bar.sync 1, %0;\n" ::"n"(NT) : "memory");

    const int SC = (K + FP8_TILE - 1) / FP8_TILE;  // scale columns
    uint32_t st = smem_u32(ring), fb = full(0), phase = 0;
    const uint32_t ring_end = smem_u32(ring) + NS * FP8TMA_STAGE, eb = 8 * NS;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int r0 = tile * 16 + 2 * warp;
        const float* srow = S + (size_t)(min(r0, N - 1) / FP8_TILE) * SC;  // (rows past N: a real row's, unused)
        float acc0 = 0.f, acc1 = 0.f;
        for (int ks = 0; ks < nst; ks++) {
            const int nc = ks == stages ? tail / 16 : 64;  // chunks of each row in this stage
            // This lane's chunks l and l + 32: tile columns 8 ks + l / 8 and 8 ks + 4 + l / 8.
            const float s0 = lane < nc ? __ldg(srow + 8 * ks + lane / 8) : 0.f;
            const float s1 = lane + 32 < nc ? __ldg(srow + 8 * ks + 4 + lane / 8) : 0.f;
            mbar_wait(fb, phase);
            uint4 wa[2], wb[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t off = st + 2 * warp * FP8TMA_ROW + (lane + 32 * h) * 16;
                wa[h] = lds128(off);
                wb[h] = lds128(off + FP8TMA_ROW);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(fb + eb);  // every shared read of the slot is done
            st += FP8TMA_STAGE, fb += 8;
            if (st == ring_end) st = smem_u32(ring), fb = full(0), phase ^= 1;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int c = lane + 32 * h;
                if (c >= nc) continue;
                const int xc = ks * 64 + c;  // the chunk's index in x
                float fa[16], fb2[16];
                const uint32_t va[4] = {wa[h].x, wa[h].y, wa[h].z, wa[h].w}, vb[4] = {wb[h].x, wb[h].y, wb[h].z, wb[h].w};
#pragma unroll
                for (int q = 0; q < 4; q++) e4m3x4_f32(va[q], fa + 4 * q), e4m3x4_f32(vb[q], fb2 + 4 * q);
                float da = 0.f, db = 0.f;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float4 xv = xs[q * KC + xc];
                    da += fa[4 * q] * xv.x + fa[4 * q + 1] * xv.y + fa[4 * q + 2] * xv.z + fa[4 * q + 3] * xv.w;
                    db += fb2[4 * q] * xv.x + fb2[4 * q + 1] * xv.y + fb2[4 * q + 2] * xv.z + fb2[4 * q + 3] * xv.w;
                }
                const float s = h ? s1 : s0;
                acc0 = fmaf(da, s, acc0);
                acc1 = fmaf(db, s, acc1);
            }
        }
        acc0 = warp_sum(acc0);
        acc1 = warp_sum(acc1);
        if (lane == 0) {
            if (r0 < N) y[r0] = acc0 + (bias ? bias[r0] : 0.f);
            if (r0 + 1 < N) y[r0 + 1] = acc1 + (bias ? bias[r0 + 1] : 0.f);
        }
    }
}

// Any K and alignment: a warp a row, per-element loads.
extern "C" __global__ void gemv_fp8_any(const uint8_t* W, const float* S, const float* x, float* y, const float* bias,
                                        int N, int K, int m) {
    pdl_entry();
    const int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (r >= N) return;
    const float* srow = S + (size_t)(r / FP8_TILE) * ((K + FP8_TILE - 1) / FP8_TILE);
    for (int i = 0; i < m; i++) {
        float acc = 0.f;
        for (int k = lane; k < K; k += WARP) acc += e4m3_to_f32(W[(size_t)r * K + k]) * srow[k / FP8_TILE] * x[(size_t)i * K + k];
        acc = warp_sum(acc);
        if (lane == 0) y[(size_t)i * N + r] = acc + (bias ? bias[r] : 0.f);
    }
}

// gemm_fp8's shared memory a stage: 128 weight rows of 144 bytes (128 and
// 16 of padding: a lane's 4-byte reads of rows g = 0..7 fall in distinct
// banks) and BM token rows of 144 x values (128 and 16: the 16-byte reads of
// float32 x, tokens g, g+1 at 16t, or the 8-byte reads of fp16 x, tokens g
// .. g+3 at 8t, fall in distinct banks).
#define FP8_WROW 144
#define FP8_XROW 144
__host__ __device__ constexpr int fp8_stage_bytes(int bm, bool xh) { return 128 * FP8_WROW + bm * FP8_XROW * (xh ? 2 : 4); }

// x to fp16 for gemm_fp8_t64: xh[mpad, K] (rows from m on zero), 8 elements
// a thread (K % 16 == 0): converted once, not by every block of features,
// and half the bytes each block copies.
extern "C" __global__ void fp8_x_h(uint4* __restrict__ xh, const float* __restrict__ x, int m, int mpad, int K) {
    pdl_entry();
    const int units = K / 8;
    const long long total = (long long)mpad * units;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int n = (int)(i / units), j = (int)(i % units);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (n < m) {
            const float4 a = *reinterpret_cast<const float4*>(x + (size_t)n * K + 8 * j);
            const float4 b = *reinterpret_cast<const float4*>(x + (size_t)n * K + 8 * j + 4);
            v = make_uint4(f2h2(a.x, a.y), f2h2(a.z, a.w), f2h2(b.x, b.y), f2h2(b.z, b.w));
        }
        xh[i] = v;
    }
}

struct Fp8GemmArgs {
    unsigned long long W, S, x, y, bias, part, ticket;
    int N, K, m, cps;  // cps: k-tiles a split
};

// XH: x is fp16 [mpad, K] (fp8_x_h), else float32 [m, K].
template <int BM, int NS, bool XH>
__device__ __forceinline__ void gemm_fp8_body(const Fp8GemmArgs& a) {
    constexpr int NT = BM / 8;  // 8-token mma tiles
    constexpr int SB = fp8_stage_bytes(BM, XH);
    extern __shared__ __align__(16) unsigned char fsm[];
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, g = lane >> 2, t = lane & 3;
    const int N = a.N, K = a.K, m = a.m;
    const int n0 = blockIdx.x * 128, i0 = blockIdx.y * BM;
    const int KT = (K + FP8_TILE - 1) / FP8_TILE;
    const int kt0 = blockIdx.z * a.cps, nkt = max(0, min(KT, kt0 + a.cps) - kt0);
    const uint8_t* W = (const uint8_t*)a.W;
    const float* x = (const float*)a.x;
    const float* srow = (const float*)a.S + (size_t)blockIdx.x * KT;
    const uint32_t base = smem_u32(fsm);
    // Weight copies: 128 rows x 8 chunks of 16 bytes, 4 a thread (row tid/8 + 32j, chunk tid%8).
    auto issueW = [&](int i) {
        const int kt = kt0 + i, st = i % NS;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int row = tid / 8 + 32 * j, ch = tid % 8, k = kt * FP8_TILE + ch * 16;
            const int r = min(n0 + row, N - 1);
            cp_async16_zfill(base + st * SB + row * FP8_WROW + ch * 16, W + (size_t)r * K + min(k, K - 16), k < K);
        }
    };
    // x copies: BM rows x 32 chunks of 16 bytes, BM / 8 a thread (row tid/32
    // + 8j, chunk tid%32); fp16: BM rows x 16 chunks, BM / 16 a thread.
    auto issueX = [&](int i) {
        const int kt = kt0 + i, st = i % NS;
        if (XH) {
            const uint16_t* xh = (const uint16_t*)a.x;
#pragma unroll
            for (int j = 0; j < BM / 16; j++) {
                const int row = tid / 16 + 16 * j, ch = tid % 16, k = kt * FP8_TILE + ch * 8;
                cp_async16_zfill(base + st * SB + 128 * FP8_WROW + (row * FP8_XROW + ch * 8) * 2,
                                 xh + (size_t)(i0 + row) * K + min(k, K - 8), k < K);
            }
        } else {
#pragma unroll
            for (int j = 0; j < BM / 8; j++) {
                const int row = tid / 32 + 8 * j, ch = tid % 32, k = kt * FP8_TILE + ch * 4;
                const int r = min(i0 + row, m - 1);
                cp_async16_zfill(base + st * SB + 128 * FP8_WROW + (row * FP8_XROW + ch * 4) * 4,
                                 x + (size_t)r * K + min(k, K - 4), k < K && i0 + row < m);
            }
        }
    };
    pdl_launch();
    // The weights are constant: their first stages are in flight before the
    // wait for the kernel that wrote x. Group s holds x of stage s (group 0
    // also every prologue weight stage).
#pragma unroll
    for (int i = 0; i < NS - 1; i++)
        if (i < nkt) issueW(i);
    pdl_wait();
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        if (i < nkt) issueX(i);
        cp_async_commit();
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int i = 0; i < nkt; i++) {
        cp_async_wait<NS - 2>();
        __syncthreads();  // stage i is in; every warp is done with stage i - 1, which the next copies overwrite
        if (i + NS - 1 < nkt) issueW(i + NS - 1), issueX(i + NS - 1);
        cp_async_commit();
        const unsigned char* s = fsm + (i % NS) * SB;
        const unsigned char* wr = s + (16 * warp + g) * FP8_WROW + 4 * t;
        const float* xr = reinterpret_cast<const float*>(s + 128 * FP8_WROW) + g * FP8_XROW + 4 * t;
        const uint16_t* xq = reinterpret_cast<const uint16_t*>(s + 128 * FP8_WROW) + g * FP8_XROW + 4 * t;
        float d[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            // Lane (g, t) owns elements 16kk + 4t .. +3 of rows g and g+8 as
            // k-slots {2t, 2t+1} and {2t+8, 2t+9}; x alike for token g.
            const uint32_t wg = *reinterpret_cast<const uint32_t*>(wr + 16 * kk);
            const uint32_t w8 = *reinterpret_cast<const uint32_t*>(wr + 8 * FP8_WROW + 16 * kk);
            const uint32_t af[4] = {e4m3x2_lo(wg), e4m3x2_lo(w8), e4m3x2_hi(wg), e4m3x2_hi(w8)};
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (XH) {
                    const uint2 xv = *reinterpret_cast<const uint2*>(xq + j * 8 * FP8_XROW + 16 * kk);
                    mma16816(d[j], af, xv.x, xv.y);
                } else {
                    const float4 xv = *reinterpret_cast<const float4*>(xr + j * 8 * FP8_XROW + 16 * kk);
                    mma16816(d[j], af, f2h2(xv.x, xv.y), f2h2(xv.z, xv.w));
                }
            }
        }
        const float sc = srow[kt0 + i];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[j][q] = fmaf(d[j][q], sc, acc[j][q]);
    }
    // acc[j]: features f0 = n0 + 16 warp + g (q 0, 1) and f0 + 8 (q 2, 3); tokens 8j + 2t (+1).
    const int f0 = n0 + 16 * warp + g;
    const float* bias = (const float*)a.bias;
    float* y = (float*)a.y;
    auto store = [&](float* dst, bool withBias) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int f = f0 + (q >> 1) * 8, tok = i0 + 8 * j + 2 * t + (q & 1);
                if (f < N && tok < m) dst[(size_t)tok * N + f] = acc[j][q] + (withBias && bias ? bias[f] : 0.f);
            }
    };
    if (gridDim.z == 1) {
        store(y, true);
        return;
    }
    // Split K: partials [split][m][N]; the last split of the tile sums them in order.
    float* part = (float*)a.part;
    store(part + (size_t)blockIdx.z * m * N, false);
    __threadfence();
    __syncthreads();
    int* ticket = (int*)a.ticket + blockIdx.y * gridDim.x + blockIdx.x;
    if (tid == 0) last = atomicAdd(ticket, 1) == (int)gridDim.z - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int f = f0 + (q >> 1) * 8, tok = i0 + 8 * j + 2 * t + (q & 1);
            if (f < N && tok < m) {
                float v = 0.f;
                for (int z = 0; z < (int)gridDim.z; z++) v += __ldcg(part + ((size_t)z * m + tok) * N + f);
                y[(size_t)tok * N + f] = v + (bias ? bias[f] : 0.f);
            }
        }
    if (tid == 0) *ticket = 0;  // zero for the next launch
}

// Grid (ceil(N/128), ceil(m/BM), splits); part and ticket are unused (0)
// with one split.
extern "C" __global__ void __launch_bounds__(256) gemm_fp8_t16(const uint8_t* W, const float* S, const float* x, float* y,
                                                              const float* bias, float* part, int* ticket, int N, int K,
                                                              int m, int cps) {
    gemm_fp8_body<16, 4, false>(Fp8GemmArgs{(unsigned long long)W, (unsigned long long)S, (unsigned long long)x,
                                     (unsigned long long)y, (unsigned long long)bias, (unsigned long long)part,
                                     (unsigned long long)ticket, N, K, m, cps});
}
// x: fp16 [mpad, K] from fp8_x_h.
extern "C" __global__ void __launch_bounds__(256) gemm_fp8_t64(const uint8_t* W, const float* S, const uint16_t* x, float* y,
                                                              const float* bias, float* part, int* ticket, int N, int K,
                                                              int m, int cps) {
    gemm_fp8_body<64, 3, true>(Fp8GemmArgs{(unsigned long long)W, (unsigned long long)S, (unsigned long long)x,
                                     (unsigned long long)y, (unsigned long long)bias, (unsigned long long)part,
                                     (unsigned long long)ticket, N, K, m, cps});
}

#ifdef MANIFOLD_DEV
// The other candidate for larger m (the dev build's, kernels/fp8_dev.go):
// Hopper's FP8 tensor cores through mma.sync m16n8k32 e4m3 x e4m3, with the
// activations quantized to E4M3 per token and 128-element block as DeepSeek's
// own inference does (act_quant: scale amax / 448), so x loses all but 3
// mantissa bits where gemm_fp8_t* keeps 10. fp8_act_quant writes xq[mpad, K]
// (E4M3) and sx[mpad, ceil(K/128)] (float32; rows from m on zero), a warp a
// (token, block); gemm_fp8q_t64 is gemm_fp8_t64 with 8-bit x, four k32 mma a
// k-tile, each (token, k-tile) sum multiplied by the weight's and the
// token's scale. Shared rows of 160 bytes: a lane's 8-byte reads of rows g =
// 0..3 at 8t fall in distinct banks.
extern "C" __global__ void fp8_act_quant(uint8_t* __restrict__ xq, float* __restrict__ sx, const float* __restrict__ x,
                                         int m, int mpad, int K) {
    pdl_entry();
    const int KT = (K + FP8_TILE - 1) / FP8_TILE, lane = threadIdx.x % WARP;
    const long long total = (long long)mpad * KT;
    for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / WARP; i < total;
         i += (long long)gridDim.x * blockDim.x / WARP) {
        const int n = (int)(i / KT), kt = (int)(i % KT), k = kt * FP8_TILE + 4 * lane;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (n < m && k < K) v = *reinterpret_cast<const float4*>(x + (size_t)n * K + k);
        const float amax = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        const float s = amax > 0.f ? amax / 448.f : 1.f, inv = 1.f / s;
        if (lane == 0) sx[i] = n < m ? s : 0.f;
        if (k < K) {
            uint16_t lo, hi;
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v.y * inv), "f"(v.x * inv));
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v.w * inv), "f"(v.z * inv));
            *reinterpret_cast<uint32_t*>(xq + (size_t)n * K + k) = (uint32_t)lo | ((uint32_t)hi << 16);
        }
    }
}

__device__ __forceinline__ void mma16832_e4m3(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#define FP8Q_ROW 160
// Grid (ceil(N/128), mpad/64); no split. Dynamic shared memory 3 stages of
// (128 + 64) rows of FP8Q_ROW bytes.
extern "C" __global__ void __launch_bounds__(256) gemm_fp8q_t64(const uint8_t* W, const float* S, const uint8_t* xq,
                                                               const float* sx, float* y, const float* bias, int N,
                                                               int K, int m) {
    constexpr int BM = 64, NT = BM / 8, NS = 3, SB = (128 + BM) * FP8Q_ROW;
    extern __shared__ __align__(16) unsigned char fsm[];
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 128, i0 = blockIdx.y * BM;
    const int KT = (K + FP8_TILE - 1) / FP8_TILE;
    const float* srow = S + (size_t)blockIdx.x * KT;
    const uint32_t base = smem_u32(fsm);
    auto issueW = [&](int kt) {
        const int st = kt % NS;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int row = tid / 8 + 32 * j, ch = tid % 8, k = kt * FP8_TILE + ch * 16;
            const int r = min(n0 + row, N - 1);
            cp_async16_zfill(base + st * SB + row * FP8Q_ROW + ch * 16, W + (size_t)r * K + min(k, K - 16), k < K);
        }
    };
    auto issueX = [&](int kt) {
        const int st = kt % NS;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int row = tid / 8 + 32 * j, ch = tid % 8, k = kt * FP8_TILE + ch * 16;
            cp_async16_zfill(base + st * SB + (128 + row) * FP8Q_ROW + ch * 16, xq + (size_t)(i0 + row) * K + min(k, K - 16), k < K);
        }
    };
    pdl_launch();
#pragma unroll
    for (int i = 0; i < NS - 1; i++)
        if (i < KT) issueW(i);
    pdl_wait();
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        if (i < KT) issueX(i);
        cp_async_commit();
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int i = 0; i < KT; i++) {
        cp_async_wait<NS - 2>();
        __syncthreads();
        if (i + NS - 1 < KT) issueW(i + NS - 1), issueX(i + NS - 1);
        cp_async_commit();
        const unsigned char* s = fsm + (i % NS) * SB;
        const unsigned char* wr = s + (16 * warp + g) * FP8Q_ROW + 8 * t;
        const unsigned char* xr = s + (128 + g) * FP8Q_ROW + 8 * t;
        float d[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            // Lane (g, t) owns bytes 32kk + 8t .. +7 of rows g and g+8 as
            // k-slots 4t..4t+3 and 4t+16..4t+19; x alike for token g.
            const uint2 wg = *reinterpret_cast<const uint2*>(wr + 32 * kk);
            const uint2 w8 = *reinterpret_cast<const uint2*>(wr + 8 * FP8Q_ROW + 32 * kk);
            const uint32_t af[4] = {wg.x, w8.x, wg.y, w8.y};
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const uint2 xv = *reinterpret_cast<const uint2*>(xr + j * 8 * FP8Q_ROW + 32 * kk);
                mma16832_e4m3(d[j], af, xv.x, xv.y);
            }
        }
        const float sw = srow[i];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int tok = i0 + 8 * j + 2 * t;
            const float s0 = sw * sx[(size_t)tok * KT + i], s1 = sw * sx[(size_t)(tok + 1) * KT + i];
            acc[j][0] = fmaf(d[j][0], s0, acc[j][0]);
            acc[j][1] = fmaf(d[j][1], s1, acc[j][1]);
            acc[j][2] = fmaf(d[j][2], s0, acc[j][2]);
            acc[j][3] = fmaf(d[j][3], s1, acc[j][3]);
        }
    }
    const int f0 = n0 + 16 * warp + g;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int f = f0 + (q >> 1) * 8, tok = i0 + 8 * j + 2 * t + (q & 1);
            if (f < N && tok < m) y[(size_t)tok * N + f] = acc[j][q] + (bias ? bias[f] : 0.f);
        }
}
#endif
