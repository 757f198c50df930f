// gemm.cuh: the NVFP4 matmul for m > 1 (batched decode, prefill) on the
// tensor cores: y[m, N] = x[m, K]·Wᵀ (+ bias), W in the ModelOpt layout
// (E2M1 pairs, E4M3 scales per 16 elements, a global scale). Needs K % 128
// == 0 and x 16-byte aligned; uses fp4x8_decode, x8_pairs and e4m3x2_lo of
// gemv.cuh.
//
// Two launches. gemm_x_h8 converts x once to fp16 pairs in the order the
// mma's B fragments take them, zero-padded to a whole number of token tiles
// (every block of the matmul then copies its x straight into shared memory,
// and the conversion is not repeated per block). gemm_nvfp4_[k256_|k512_]t*
// computes tiles of 128 features x BM tokens: K in stages of 128, 256 or 512
// elements (1 to 4 chunks of 128), each stage's weights, scales and x brought
// in by cp.async into a ring a few stages ahead. Warp w owns FG groups of 16
// features (16 FG w .. 16 FG w + 16 FG - 1 of the tile; FG = 1, or 2 in the
// _f2 variant, whose blocks have half the warps): for each group, lane (g, t)
// decodes the 16 bytes of elements [32t, 32t+32) of features g and g+8
// (scale blocks 2t and 2t+1), multiplies them by their block scales in fp16
// (the E2M1 x E4M3 product has 6 significant bits: exact, and with the
// decode's 2^-6 inside fp16's range), and runs two m16n8k16 per 8 tokens and
// 16 elements, accumulating in float32; each B fragment loaded serves the FG
// groups. Each weight is decoded once per token tile.
//
// When the tiles alone would leave multiprocessors idle (few features or
// tokens), K is split over blocks: each writes its float32 partial tile, and
// the last of a tile's blocks to finish (an atomic ticket, left at zero)
// adds them in split order, so the result does not depend on timing.
#define GT_N 128    // features per block: 8 warps x 16

// One thread per 8 elements: xh[n][c][q][t] (uint4) holds elements
// 128c + 32t + 8q .. +8 of token n as x8_pairs<1>; tokens m..mpad-1 are zero.
extern "C" __global__ void gemm_x_h8(uint4* __restrict__ xh, const float* __restrict__ x, int m, int mpad, int K) {
    pdl_entry();
    const int units = K / 8;
    const long total = (long)mpad * units;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const int n = (int)(i / units), j = (int)(i % units);
        const int e = (j >> 4) * 128 + 32 * (j & 3) + 8 * ((j >> 2) & 3);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (n < m) {
            const float* xr = x + (size_t)n * K + e;
            uint32_t p[4];
            x8_pairs<1>(*reinterpret_cast<const float4*>(xr), *reinterpret_cast<const float4*>(xr + 4), p);
            v = make_uint4(p[0], p[1], p[2], p[3]);
        }
        xh[i] = v;
    }
}

__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}

// TT: 8-token tiles per warp (BM = 8 TT tokens per block); NS: ring stages;
// KC: elements of K per stage (128, 256 or 512; K % KC == 0): a feature's
// KC / 2 weight bytes per stage are one to four whole 64-byte segments, and
// larger stages mean fewer, longer requests in flight for the same bytes.
// FG: 16-feature groups a warp. Grid: (feature tiles x splits, token
// tiles); 256 / FG threads; shared memory
// NS x (128 x KC/2 weight bytes + 128 x KC/16 scale bytes + BM x XROW x 16).
// cps: stages per split; part and ticket only when there is more than one.
template <int TT, int NS, int KC, int FG = 1>
__device__ __forceinline__ void gemm_nvfp4_tile(const uint8_t* __restrict__ P, const uint8_t* __restrict__ S, float scale,
                                                const uint4* __restrict__ xh, float* __restrict__ y, const float* __restrict__ bias,
                                                float* __restrict__ part, int* __restrict__ ticket, int N, int K, int m, int cps) {
    constexpr int H = KC / 128;                   // 128-element sub-chunks per stage
    constexpr int XROW = 16 * H + 4;              // uint4 per token (16 H + 4: conflict-free B loads)
    constexpr int BM = 8 * TT, WR = KC / 2, SR = KC / 16, WB = GT_N * WR, SB = GT_N * SR, STAGE = WB + SB + BM * XROW * 16;
    constexpr int NT = 256 / FG;  // threads: 8 / FG warps of 16 FG features
    extern __shared__ __align__(16) unsigned char gts[];
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int ntiles = (N + GT_N - 1) / GT_N, splits = gridDim.x / ntiles;
    const int nt = blockIdx.x % ntiles, split = blockIdx.x / ntiles, mt = blockIdx.y;
    const int n0 = nt * GT_N, m0 = mt * BM;
    const int c0 = split * cps, nc = min(cps, K / KC - c0);
    const size_t kb = K / 2, ks = K / 16;

    // Stage c's copies into a ring slot: WR weight bytes and SR scale bytes
    // per feature (feature 0's past N: their sums are never written), 16 H
    // x 16 bytes of x per token. Each thread's sources and destinations are
    // fixed but for the stage's offset: weights (16 bytes of features
    // tid / (WR/16) + j NT / (WR/16)), scales (feature tid, tid < 128), x
    // (16 bytes of tokens (tid + NT j) / 16H).
    constexpr int WT = WR / 16, WC = GT_N * WT / NT, XT = 16 * H, XC = BM * XT >= NT ? BM * XT / NT : 1;
    const int wr = tid / WT, wp = 16 * (tid % WT), xn = tid / XT, xj = tid % XT;
    const uint8_t* wsrc = P + wp;
    const uint8_t* ssrc = S + (tid < GT_N && n0 + tid < N ? n0 + tid : 0) * ks;
    const uint4* xsrc = xh + (size_t)(m0 + xn) * (K / 8) + xj;
    // With two or four sub-chunks per row, odd rows hold each pair swapped, so
    // that the 16-byte reads of rows g and g + 1 fall on different banks.
    const int wsw = H >= 2 ? ((wp >> 6) ^ (wr & 1)) * 64 + (wp & 63) : wp;
    const uint32_t sbase = smem_u32(gts), wdst = WR * wr + wsw, xdst = WB + SB + 16 * (xn * XROW + xj);
    size_t wrow[WC];
#pragma unroll
    for (int j = 0; j < WC; j++) {
        const int row = n0 + wr + j * (NT / WT);
        wrow[j] = (row < N ? row : 0) * kb;
    }
    auto issue = [&](int c, int slot) {
        const uint32_t st = sbase + slot * STAGE;
#pragma unroll
        for (int j = 0; j < WC; j++) cp_async16(st + wdst + j * (NT / WT) * WR, wsrc + wrow[j] + WR * c);
        if (tid < GT_N) {
            if (SR == 8) cp_async8(st + WB + SR * tid, ssrc + SR * c);
#pragma unroll
            for (int j = 0; j < SR / 16; j++) cp_async16(st + WB + SR * tid + 16 * j, ssrc + SR * c + 16 * j);
        }
#pragma unroll
        for (int j = 0; j < XC; j++)
            if (BM * XT >= NT || tid < BM * XT)
                cp_async16(st + xdst + j * (NT / XT) * XROW * 16, xsrc + (size_t)j * (NT / XT) * (K / 8) + XT * c);
    };

    float acc[FG][TT][4];
#pragma unroll
    for (int f = 0; f < FG; f++)
#pragma unroll
        for (int u = 0; u < TT; u++) acc[f][u][0] = acc[f][u][1] = acc[f][u][2] = acc[f][u][3] = 0.f;
#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (s < nc) issue(c0 + s, s);
        cp_async_commit();
    }
    // This lane's features in the tile: ra[f] and rb[f] = ra[f] + 8 of the
    // warp's 16-feature group f (each B fragment loaded serves FG groups).
    int ra[FG], rb[FG];
#pragma unroll
    for (int f = 0; f < FG; f++) ra[f] = 16 * (FG * warp + f) + g, rb[f] = ra[f] + 8;
    for (int i = 0; i < nc; i++) {
        cp_async_wait<NS - 2>();
        __syncthreads();  // stage i has landed for every thread; slot (i - 1) % NS is free
        if (i + NS - 1 < nc) issue(c0 + i + NS - 1, (i + NS - 1) % NS);
        cp_async_commit();
        const unsigned char* st = gts + (i % NS) * STAGE;
#pragma unroll
        for (int h = 0; h < H; h++) {
            const int hs = H >= 2 ? 64 * (h ^ (g & 1)) : 0;  // rows ra and rb have g's parity
            uint32_t wva[FG][4], wvb[FG][4], sa[FG], sb[FG];
#pragma unroll
            for (int f = 0; f < FG; f++) {
                const uint4 wa = *reinterpret_cast<const uint4*>(st + WR * ra[f] + hs + 16 * t);
                const uint4 wb = *reinterpret_cast<const uint4*>(st + WR * rb[f] + hs + 16 * t);
                wva[f][0] = wa.x, wva[f][1] = wa.y, wva[f][2] = wa.z, wva[f][3] = wa.w;
                wvb[f][0] = wb.x, wvb[f][1] = wb.y, wvb[f][2] = wb.z, wvb[f][3] = wb.w;
                sa[f] = e4m3x2_lo(*reinterpret_cast<const uint16_t*>(st + WB + SR * ra[f] + 8 * h + 2 * t));
                sb[f] = e4m3x2_lo(*reinterpret_cast<const uint16_t*>(st + WB + SR * rb[f] + 8 * h + 2 * t));
            }
            const uint4* xs = reinterpret_cast<const uint4*>(st + WB + SB) + g * XROW + 16 * h + t;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint32_t ae[FG][4], ao[FG][4];
#pragma unroll
                for (int f = 0; f < FG; f++) {
                    // Words 0, 1 are scale block 2t (the low scale byte), 2, 3 block 2t + 1.
                    const uint32_t ma = q < 2 ? __byte_perm(sa[f], 0, 0x1010) : __byte_perm(sa[f], 0, 0x3232);
                    const uint32_t mb = q < 2 ? __byte_perm(sb[f], 0, 0x1010) : __byte_perm(sb[f], 0, 0x3232);
                    uint32_t da[4], db[4];
                    fp4x8_decode<1>(wva[f][q], da);
                    fp4x8_decode<1>(wvb[f][q], db);
#pragma unroll
                    for (int j = 0; j < 4; j++) da[j] = hmul2u(da[j], ma), db[j] = hmul2u(db[j], mb);
                    ae[f][0] = da[0], ae[f][1] = db[0], ae[f][2] = da[1], ae[f][3] = db[1];
                    ao[f][0] = da[2], ao[f][1] = db[2], ao[f][2] = da[3], ao[f][3] = db[3];
                }
#pragma unroll
                for (int u = 0; u < TT; u++) {
                    const uint4 xv = xs[8 * u * XROW + 4 * q];
#pragma unroll
                    for (int f = 0; f < FG; f++) {
                        mma16816(acc[f][u], ae[f], xv.x, xv.y);
                        mma16816(acc[f][u], ao[f], xv.z, xv.w);
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    // acc[f][u]: features ra[f] (0, 1) and rb[f] (2, 3) of tokens 8u + 2t, 8u + 2t + 1.
    if (splits == 1) {
#pragma unroll
        for (int f = 0; f < FG; f++)
#pragma unroll
            for (int u = 0; u < TT; u++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int ft = n0 + (e < 2 ? ra[f] : rb[f]), tok = m0 + 8 * u + 2 * t + (e & 1);
                    if (ft < N && tok < m) y[(size_t)tok * N + ft] = acc[f][u][e] * scale + (bias ? bias[ft] : 0.f);
                }
        return;
    }
    const size_t tile = (size_t)mt * ntiles + nt;
    float* mine = part + (tile * splits + split) * (BM * GT_N);
#pragma unroll
    for (int f = 0; f < FG; f++)
#pragma unroll
        for (int u = 0; u < TT; u++)
#pragma unroll
            for (int e = 0; e < 4; e++) mine[(8 * u + 2 * t + (e & 1)) * GT_N + (e < 2 ? ra[f] : rb[f])] = acc[f][u][e];
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(ticket + tile, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* all = part + tile * splits * (BM * GT_N);
    for (int i = tid; i < BM * GT_N; i += NT) {
        const int tok = m0 + i / GT_N, f = n0 + i % GT_N;
        float v = 0.f;
        for (int s = 0; s < splits; s++) v += __ldcg(all + (size_t)s * (BM * GT_N) + i);
        if (f < N && tok < m) y[(size_t)tok * N + f] = v * scale + (bias ? bias[f] : 0.f);
    }
    if (tid == 0) ticket[tile] = 0;
}

// OCC: blocks per multiprocessor (registers and shared memory allow it).
#define GEMM_NVFP4_TILE(NAME, TT, NS, KC, OCC) GEMM_NVFP4_TILE_FG(NAME, TT, NS, KC, OCC, 1)
// FG: 16-feature groups a warp (256 / FG threads a block).
#define GEMM_NVFP4_TILE_FG(NAME, TT, NS, KC, OCC, FG)                                                                            \
    extern "C" __global__ void __launch_bounds__(256 / FG, OCC)                                                                  \
        NAME(const uint8_t* P, const uint8_t* S, float scale, const uint4* xh, float* y, const float* bias, float* part, \
             int* ticket, int N, int K, int m, int cps) {                                                                        \
        pdl_entry();                                                                                                             \
        gemm_nvfp4_tile<TT, NS, KC, FG>(P, S, scale, xh, y, bias, part, ticket, N, K, m, cps);                                      \
    }
GEMM_NVFP4_TILE(gemm_nvfp4_t8, 1, 4, 128, 3)
GEMM_NVFP4_TILE(gemm_nvfp4_t16, 2, 4, 128, 3)
GEMM_NVFP4_TILE(gemm_nvfp4_t32, 4, 4, 128, 2)
GEMM_NVFP4_TILE(gemm_nvfp4_t64, 8, 3, 128, 2)
GEMM_NVFP4_TILE(gemm_nvfp4_k256_t8, 1, 4, 256, 2)
GEMM_NVFP4_TILE(gemm_nvfp4_k256_t16, 2, 4, 256, 2)
GEMM_NVFP4_TILE(gemm_nvfp4_k256_t32, 4, 3, 256, 2)
GEMM_NVFP4_TILE(gemm_nvfp4_k256_t64, 8, 2, 256, 2)
GEMM_NVFP4_TILE(gemm_nvfp4_k512_t8, 1, 4, 512, 1)
GEMM_NVFP4_TILE(gemm_nvfp4_k512_t16, 2, 3, 512, 1)
GEMM_NVFP4_TILE(gemm_nvfp4_k512_t32, 4, 3, 512, 1)
GEMM_NVFP4_TILE(gemm_nvfp4_k512_t64, 8, 2, 512, 1)
GEMM_NVFP4_TILE_FG(gemm_nvfp4_k256_t64_f2, 8, 2, 256, 2, 2)
