// bf16.cuh: the 16-bit weight matmul for m > 4 (batched decode, prefill) on
// the tensor cores: y[m, N] = x[m, K]·Wᵀ (+ bias), W row-major in bf16 (E =
// 0) or f16 (E = 1). Needs K % 8 == 0 and x 16-byte aligned.
//
// Two launches. gemm16_x_{bf16,f16} splits x once into two 16-bit values of
// the weight's type, hi = x rounded to nearest even and lo = x - hi rounded
// likewise, row-major like x (hi rows, then lo rows): the tensor cores take
// both operands in 16 bits, and x in bf16 alone (8 significant bits, what a
// bf16 GEMM of PyTorch computes) moves the golden bf16 models' logits by up
// to 0.03 from float32 activations' (DeepSeek's routing and top-k by up to
// 4), while hi + lo keeps 16 bits and the logits within 1.2e-4 (measured by
// rounding x so in the CPU backend). Each weight fragment then takes two
// mma, one per half. gemm16_{bf16,f16}_t* computes tiles of 128 features x BT
// tokens: K in stages of BK elements, each stage's weight rows and token rows
// (hi and lo) copied by cp.async (zero-filled past N, m and K) into a ring of
// NS stages, the stage NS - 1 ahead issued while this one is multiplied. Both
// operands are K-contiguous rows, so the weights are the mma's A (row)
// operand and the tokens its B (col) operand, each loaded with ldmatrix
// without transposition; shared rows are padded to BK + 8 elements (80 or
// 144 bytes), which puts the 8 rows of every 8x8 ldmatrix on distinct
// banks. Warp (wf, wt) of the WF x WT warps owns 128 / WF features x BT / WT
// tokens: FI m16 tiles by TJ n8 tiles, m16n8k16 with float32 accumulators.
//
// When the tiles alone would leave multiprocessors idle (few features or
// tokens), K is split over blocks as gemm.cuh does: each writes its float32
// partial tile, and the last of a tile's blocks to finish (an atomic ticket,
// left at zero) adds them in split order, so the result does not depend on
// timing.
#define G16_BF 128  // features per block

template <int E>
__device__ __forceinline__ uint32_t g16_pack(float lo, float hi) {
    if (E == 0) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&v);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t*>(&v);
    }
}

template <int E>
__device__ __forceinline__ float g16_float(uint32_t v, bool high) {
    if (E == 0) return __uint_as_float(high ? v & 0xffff0000u : v << 16);
    return __half2float(__ushort_as_half((unsigned short)(high ? v >> 16 : v & 0xffff)));
}

// hi (returned) and lo (in lo) of the pair (a, b): hi rounds them to type E,
// lo rounds what hi leaves.
template <int E>
__device__ __forceinline__ uint32_t g16_split(float a, float b, uint32_t& lo) {
    const uint32_t hi = g16_pack<E>(a, b);
    lo = g16_pack<E>(a - g16_float<E>(hi, false), b - g16_float<E>(hi, true));
    return hi;
}

// One thread per 8 elements: xh[i] holds the hi parts of x's elements 8i ..
// 8i + 7 (units = m K / 8 of them) in the 16-bit type E, xh[units + i] their
// lo parts.
template <int E>
__device__ __forceinline__ void gemm16_x_body(uint4* __restrict__ xh, const float4* __restrict__ x, int units) {
    pdl_entry();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < units; i += gridDim.x * blockDim.x) {
        const float4 a = x[2 * i], b = x[2 * i + 1];
        uint4 hi, lo;
        hi.x = g16_split<E>(a.x, a.y, lo.x);
        hi.y = g16_split<E>(a.z, a.w, lo.y);
        hi.z = g16_split<E>(b.x, b.y, lo.z);
        hi.w = g16_split<E>(b.z, b.w, lo.w);
        xh[i] = hi;
        xh[units + i] = lo;
    }
}
extern "C" __global__ void gemm16_x_bf16(uint4* xh, const float4* x, int units) { gemm16_x_body<0>(xh, x, units); }
extern "C" __global__ void gemm16_x_f16(uint4* xh, const float4* x, int units) { gemm16_x_body<1>(xh, x, units); }

// Four 8x8 matrices of 16-bit values from shared memory: lane l gives the
// address of row l % 8 of matrix l / 8 and receives, of every matrix j, the
// two values of its row l / 4 at columns 2 (l % 4), +1 in r[j].
__device__ __forceinline__ void g16_ldsm4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += A·B, m16n8k16 on 16-bit operands of type E, float32 accumulators.
template <int E>
__device__ __forceinline__ void g16_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (E == 0) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// BT: tokens per block; WF x WT warps (128 / WF features by BT / WT tokens
// each, multiples of 16); BK: elements of K per stage (a multiple of 16); NS:
// ring stages. Grid: (feature tiles x splits, token tiles); 32 WF WT
// threads; shared memory NS (128 + 2 BT) (BK + 8) x 2 bytes. xh: m rows of
// hi parts, then m rows of lo parts. cps: stages per split; part and ticket
// only when there is more than one.
// LO: the lo parts are multiplied too (the production kernels); without,
// x in 16 bits alone (the dev build's measure of what the lo parts cost).
template <int E, int BT, int WF, int WT, int BK, int NS, bool LO = true>
__device__ __forceinline__ void gemm16_tile(const uint16_t* __restrict__ W, const uint16_t* __restrict__ xh, float* __restrict__ y,
                                            const float* __restrict__ bias, float* __restrict__ part, int* __restrict__ ticket,
                                            int N, int K, int m, int cps) {
    constexpr int NT = 32 * WF * WT;
    constexpr int FW = G16_BF / WF, TW = BT / WT;  // a warp's features and tokens
    constexpr int FI = FW / 16, TJ = TW / 8;       // its m16 and n8 tiles
    constexpr int ROW = BK + 8;                    // elements per shared row
    constexpr int CH = BK / 8;                     // 16-byte copies per row and stage
    constexpr int ROWS = G16_BF + (LO ? 2 : 1) * BT;  // weight rows, then token rows (hi, lo)
    constexpr int STAGE = ROWS * ROW;              // elements
    constexpr int COPIES = ROWS * CH;
    static_assert(FW % 16 == 0 && TW % 16 == 0 && BK % 16 == 0, "gemm16_tile: warp tiles of 16");
    extern __shared__ __align__(16) unsigned char g16s[];
    uint16_t* sm = reinterpret_cast<uint16_t*>(g16s);
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wf = warp % WF, wt = warp / WF;
    const int ntiles = (N + G16_BF - 1) / G16_BF, splits = gridDim.x / ntiles;
    const int nt = blockIdx.x % ntiles, split = blockIdx.x / ntiles, mt = blockIdx.y;
    const int n0 = nt * G16_BF, m0 = mt * BT;
    const int c0 = split * cps, nc = min(cps, (K + BK - 1) / BK - c0);

    // Stage c into ring slot s: row r < 128 is feature n0 + r, row 128 + j
    // the hi part of token m0 + j and row 128 + BT + j its lo part; copies
    // past N, m or K are zeros (K % 8 == 0: a copy is all inside K or all
    // past it).
    auto issue = [&](int c, int s) {
        const uint32_t st = smem_u32(sm + s * STAGE);
        const int k0 = c * BK;
#pragma unroll
        for (int j = 0; j < (COPIES + NT - 1) / NT; j++) {
            const int i = tid + j * NT;
            if (COPIES % NT == 0 || i < COPIES) {
                const int r = i / CH, cc = i % CH, k = k0 + 8 * cc;
                const uint16_t* src;
                bool ok;
                if (r < G16_BF) {
                    ok = n0 + r < N && k < K;
                    src = W + (size_t)(n0 + r) * K + k;
                } else {
                    const int j = r - G16_BF, half = j >= BT, tok = m0 + j - (half ? BT : 0);
                    ok = tok < m && k < K;
                    src = xh + ((size_t)half * m + tok) * K + k;
                }
                cp_async16_zfill(st + 2 * (r * ROW + 8 * cc), ok ? src : W, ok);
            }
        }
    };

    float acc[FI][TJ][4];
#pragma unroll
    for (int i = 0; i < FI; i++)
#pragma unroll
        for (int j = 0; j < TJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

    for (int s = 0; s < NS - 1; s++) {
        if (s < nc) issue(c0 + s, s);
        cp_async_commit();
    }
    // ldmatrix row addresses (elements, within a stage): A tile fi takes rows
    // lane % 16 at column 8 (lane / 16); B tiles 2 q, 2 q + 1 take token rows
    // lane % 8 + 8 (lane / 16) at column 8 ((lane / 8) % 2), the lo parts BT
    // rows further.
    const int aoff = (wf * FW + (lane & 15)) * ROW + 8 * (lane >> 4);
    const int boff = (G16_BF + wt * TW + (lane & 7) + 8 * (lane >> 4)) * ROW + 8 * ((lane >> 3) & 1);
    for (int i = 0; i < nc; i++) {
        cp_async_wait<NS - 2>();
        __syncthreads();  // stage i has landed for every thread; slot (i - 1) % NS is free
        if (i + NS - 1 < nc) issue(c0 + i + NS - 1, (i + NS - 1) % NS);
        cp_async_commit();
        const uint32_t st = smem_u32(sm + (i % NS) * STAGE);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t a[FI][4], b[TJ][2], c[TJ][2];
#pragma unroll
            for (int fi = 0; fi < FI; fi++) g16_ldsm4(a[fi], st + 2 * (aoff + fi * 16 * ROW + 16 * kk));
#pragma unroll
            for (int q = 0; q < TJ / 2; q++) {
                uint32_t r[4];
                g16_ldsm4(r, st + 2 * (boff + q * 16 * ROW + 16 * kk));
                b[2 * q][0] = r[0], b[2 * q][1] = r[1], b[2 * q + 1][0] = r[2], b[2 * q + 1][1] = r[3];
                if (LO) {
                    g16_ldsm4(r, st + 2 * (boff + (BT + q * 16) * ROW + 16 * kk));
                    c[2 * q][0] = r[0], c[2 * q][1] = r[1], c[2 * q + 1][0] = r[2], c[2 * q + 1][1] = r[3];
                }
            }
#pragma unroll
            for (int fi = 0; fi < FI; fi++)
#pragma unroll
                for (int tj = 0; tj < TJ; tj++) {
                    g16_mma<E>(acc[fi][tj], a[fi], b[tj][0], b[tj][1]);
                    if (LO) g16_mma<E>(acc[fi][tj], a[fi], c[tj][0], c[tj][1]);
                }
        }
    }
    cp_async_wait<0>();

    // acc[fi][tj][e]: feature wf FW + 16 fi + g (+ 8 for e >= 2) of the tile,
    // token wt TW + 8 tj + 2 t (+ 1 for odd e).
    if (splits == 1) {
#pragma unroll
        for (int fi = 0; fi < FI; fi++)
#pragma unroll
            for (int tj = 0; tj < TJ; tj++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int f = n0 + wf * FW + 16 * fi + g + (e < 2 ? 0 : 8);
                    const int tok = m0 + wt * TW + 8 * tj + 2 * t + (e & 1);
                    if (f < N && tok < m) y[(size_t)tok * N + f] = acc[fi][tj][e] + (bias ? bias[f] : 0.f);
                }
        return;
    }
    const size_t tile = (size_t)mt * ntiles + nt;
    float* mine = part + (tile * splits + split) * (BT * G16_BF);
#pragma unroll
    for (int fi = 0; fi < FI; fi++)
#pragma unroll
        for (int tj = 0; tj < TJ; tj++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                mine[(wt * TW + 8 * tj + 2 * t + (e & 1)) * G16_BF + wf * FW + 16 * fi + g + (e < 2 ? 0 : 8)] = acc[fi][tj][e];
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(ticket + tile, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* all = part + tile * splits * (BT * G16_BF);
    for (int i = tid; i < BT * G16_BF; i += NT) {
        const int tok = m0 + i / G16_BF, f = n0 + i % G16_BF;
        float v = 0.f;
        for (int s = 0; s < splits; s++) v += __ldcg(all + (size_t)s * (BT * G16_BF) + i);
        if (f < N && tok < m) y[(size_t)tok * N + f] = v + (bias ? bias[f] : 0.f);
    }
    if (tid == 0) ticket[tile] = 0;
}

// OCC: blocks per multiprocessor (registers and shared memory allow it);
// the Go side's g16Kernel table repeats each line's parameters.
#define GEMM16_TILE(NAME, E, BT, WF, WT, BK, NS, OCC) GEMM16_TILE_LO(NAME, E, BT, WF, WT, BK, NS, OCC, true)
#define GEMM16_TILE_LO(NAME, E, BT, WF, WT, BK, NS, OCC, LO)                                                            \
    extern "C" __global__ void __launch_bounds__(32 * WF * WT, OCC)                                                     \
        NAME(const uint16_t* W, const uint16_t* xh, float* y, const float* bias, float* part, int* ticket, int N, int K, \
             int m, int cps) {                                                                                          \
        pdl_entry();                                                                                                    \
        gemm16_tile<E, BT, WF, WT, BK, NS, LO>(W, xh, y, bias, part, ticket, N, K, m, cps);                             \
    }
GEMM16_TILE(gemm16_bf16_t16, 0, 16, 8, 1, 64, 4, 2)
GEMM16_TILE(gemm16_bf16_t32, 0, 32, 4, 2, 64, 4, 2)
GEMM16_TILE(gemm16_bf16_t64, 0, 64, 4, 2, 32, 4, 2)
GEMM16_TILE(gemm16_bf16_t128, 0, 128, 2, 4, 32, 3, 2)
GEMM16_TILE(gemm16_f16_t16, 1, 16, 8, 1, 64, 4, 2)
GEMM16_TILE(gemm16_f16_t32, 1, 32, 4, 2, 64, 4, 2)
GEMM16_TILE(gemm16_f16_t64, 1, 64, 4, 2, 32, 4, 2)
GEMM16_TILE(gemm16_f16_t128, 1, 128, 2, 4, 32, 3, 2)
#ifdef MANIFOLD_DEV
// x in bf16 alone (results off by x's rounding: the dev build's
// MANIFOLD_G16_HI=1), same tiles and shared memory as above.
GEMM16_TILE_LO(gemm16_bf16_t16_hi, 0, 16, 8, 1, 64, 4, 2, false)
GEMM16_TILE_LO(gemm16_bf16_t32_hi, 0, 32, 4, 2, 64, 4, 2, false)
GEMM16_TILE_LO(gemm16_bf16_t64_hi, 0, 64, 4, 2, 32, 4, 2, false)
GEMM16_TILE_LO(gemm16_bf16_t128_hi, 0, 128, 2, 4, 32, 3, 2, false)
#endif

// ---------------------------------------------------------------------------
// gemv_bf16_pf: the bf16 matmul for m <= 4 (decode), K % 8 == 0, x 16-byte
// aligned: one warp per weight row, 8 rows a block, each lane with 8
// 16-byte loads of its row in flight (2048 elements a warp). The weights do
// not depend on earlier kernels, so the first 8 loads are issued before the
// programmatic-launch wait: a kernel chained after another (a decode step)
// has its first weights in flight while that one finishes, as the NVFP4
// GEMV's first copies are. m > 4 passes over the row again, 4 tokens a pass.
#define G16V_P 8  // 16-byte loads in flight per lane

__device__ __forceinline__ float g16v_dot8(uint4 w, const float* __restrict__ xr) {
    const float4 a = *reinterpret_cast<const float4*>(xr), b = *reinterpret_cast<const float4*>(xr + 4);
    return __uint_as_float(w.x << 16) * a.x + __uint_as_float(w.x & 0xffff0000u) * a.y + __uint_as_float(w.y << 16) * a.z +
           __uint_as_float(w.y & 0xffff0000u) * a.w + __uint_as_float(w.z << 16) * b.x + __uint_as_float(w.z & 0xffff0000u) * b.y +
           __uint_as_float(w.w << 16) * b.z + __uint_as_float(w.w & 0xffff0000u) * b.w;
}

extern "C" __global__ void __launch_bounds__(256, 4) gemv_bf16_pf(const uint16_t* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
                                                                  const float* __restrict__ bias, int N, int K, int m) {
    pdl_launch();
    const int r = blockIdx.x * 8 + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const uint16_t* wr = W + (size_t)min(r, N - 1) * K;
    constexpr int SPAN = G16V_P * WARP * 8;  // elements a warp's loads cover
    uint4 w[G16V_P];
#pragma unroll
    for (int u = 0; u < G16V_P; u++) {
        const int k = 8 * (lane + u * WARP);
        w[u] = k < K ? __ldg(reinterpret_cast<const uint4*>(wr + k)) : make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    if (r >= N) return;
    for (int i0 = 0; i0 < m; i0 += 4) {
        const int mt = min(4, m - i0);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int k0 = 0; k0 < K; k0 += SPAN) {
            if (k0 > 0 || i0 > 0) {
#pragma unroll
                for (int u = 0; u < G16V_P; u++) {
                    const int k = k0 + 8 * (lane + u * WARP);
                    w[u] = k < K ? __ldg(reinterpret_cast<const uint4*>(wr + k)) : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int u = 0; u < G16V_P; u++) {
                const int k = k0 + 8 * (lane + u * WARP);
                if (k < K) {
#pragma unroll
                    for (int tt = 0; tt < 4; tt++)
                        if (tt < mt) acc[tt] += g16v_dot8(w[u], x + (size_t)(i0 + tt) * K + k);
                }
            }
        }
#pragma unroll
        for (int tt = 0; tt < 4; tt++) {
            const float s = warp_sum(acc[tt]);
            if (lane == 0 && tt < mt) y[(size_t)(i0 + tt) * N + r] = s + (bias ? bias[r] : 0.f);
        }
    }
}

// ---------------------------------------------------------------------------
// gemv_bf16_grp and gemv_bf16_glu: the bf16 matmuls of a decode step (m <= 4
// a pass) as the fusion pass joins them (kernels/fuse.go), loaded as
// gemv_bf16_pf loads (a warp a row, 8 loads a lane in flight, the first
// before the programmatic-launch wait). grp: up to three weights of the same
// K reading the same x, their rows numbered one after another (N0, then N1,
// then N2): y_j = x·W_jᵀ (+ bias_j), and with res set (one weight) res +=
// y_0 too. glu: gate W0 and up W1 of N0 rows each: y_1 = x·W1ᵀ (+ bias_1)
// and y_0 = silu(g)·u of the gate's and the up's sums, each clamped when
// limit > 0, as the swiglu kernel computes them.
template <bool GLU>
__device__ __forceinline__ void gemv16_body(const uint16_t* __restrict__ W0, const uint16_t* __restrict__ W1,
                                            const uint16_t* __restrict__ W2, float* y0, float* y1, float* y2,
                                            const float* b0, const float* b1, const float* b2, int N0, int N1, int N2,
                                            const float* __restrict__ x, float* res, int K, int m, float limit) {
    pdl_launch();
    constexpr int NR = GLU ? 2 : 1;              // weight rows a warp
    constexpr int P = G16V_P / NR;               // loads a row and lane in flight
    constexpr int SPAN = P * WARP * 8;           // elements of a row a round
    const int total = GLU ? N0 : N0 + N1 + N2;
    const int R = blockIdx.x * 8 + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int Rc = min(R, total - 1);
    // This warp's row: row of weight j (GLU: row Rc of both).
    const int j = GLU ? 0 : Rc < N0 ? 0 : Rc < N0 + N1 ? 1 : 2;
    const int row = Rc - (j > 0 ? N0 : 0) - (j > 1 ? N1 : 0);
    const uint16_t* wr[NR];
    wr[0] = (j == 0 ? W0 : j == 1 ? W1 : W2) + (size_t)row * K;
    if (GLU) wr[NR - 1] = W1 + (size_t)row * K;
    uint4 w[NR][P];
#pragma unroll
    for (int h = 0; h < NR; h++)
#pragma unroll
        for (int u = 0; u < P; u++) {
            const int k = 8 * (lane + u * WARP);
            w[h][u] = k < K ? __ldg(reinterpret_cast<const uint4*>(wr[h] + k)) : make_uint4(0, 0, 0, 0);
        }
    pdl_wait();
    if (R >= total) return;
    for (int i0 = 0; i0 < m; i0 += 4) {
        const int mt = min(4, m - i0);
        float acc[NR][4];
#pragma unroll
        for (int h = 0; h < NR; h++)
#pragma unroll
            for (int tt = 0; tt < 4; tt++) acc[h][tt] = 0.f;
        for (int k0 = 0; k0 < K; k0 += SPAN) {
            if (k0 > 0 || i0 > 0) {
#pragma unroll
                for (int h = 0; h < NR; h++)
#pragma unroll
                    for (int u = 0; u < P; u++) {
                        const int k = k0 + 8 * (lane + u * WARP);
                        w[h][u] = k < K ? __ldg(reinterpret_cast<const uint4*>(wr[h] + k)) : make_uint4(0, 0, 0, 0);
                    }
            }
#pragma unroll
            for (int u = 0; u < P; u++) {
                const int k = k0 + 8 * (lane + u * WARP);
                if (k < K) {
#pragma unroll
                    for (int tt = 0; tt < 4; tt++)
                        if (tt < mt)
#pragma unroll
                            for (int h = 0; h < NR; h++) acc[h][tt] += g16v_dot8(w[h][u], x + (size_t)(i0 + tt) * K + k);
                }
            }
        }
#pragma unroll
        for (int tt = 0; tt < 4; tt++) {
            float s[NR];
#pragma unroll
            for (int h = 0; h < NR; h++) s[h] = warp_sum(acc[h][tt]);
            if (lane != 0 || tt >= mt) continue;
            const size_t tok = i0 + tt;
            if (GLU) {
                float gv = s[0] + (b0 ? b0[row] : 0.f), uv = s[NR - 1] + (b1 ? b1[row] : 0.f);
                y1[tok * N0 + row] = uv;
                if (limit > 0.f) {
                    gv = fminf(gv, limit);
                    uv = fmaxf(fminf(uv, limit), -limit);
                }
                y0[tok * N0 + row] = gv / (1.f + __expf(-gv)) * uv;
            } else {
                const int N = j == 0 ? N0 : j == 1 ? N1 : N2;
                const float* bias = j == 0 ? b0 : j == 1 ? b1 : b2;
                const float v = s[0] + (bias ? bias[row] : 0.f);
                (j == 0 ? y0 : j == 1 ? y1 : y2)[tok * N + row] = v;
                if (res) res[tok * N + row] += v;
            }
        }
    }
}

#define GEMV16(NAME, GLU)                                                                                                \
    extern "C" __global__ void __launch_bounds__(256, 4)                                                                 \
        NAME(const uint16_t* W0, const uint16_t* W1, const uint16_t* W2, float* y0, float* y1, float* y2, const float* b0, \
             const float* b1, const float* b2, int N0, int N1, int N2, const float* x, float* res, int K, int m,          \
             float limit) {                                                                                              \
        gemv16_body<GLU>(W0, W1, W2, y0, y1, y2, b0, b1, b2, N0, N1, N2, x, res, K, m, limit);                          \
    }
GEMV16(gemv_bf16_grp, false)
GEMV16(gemv_bf16_glu, true)
