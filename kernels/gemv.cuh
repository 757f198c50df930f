// Decode-shape matmuls (m <= 16): NVFP4 on the tensor cores with a cp.async
// pipeline, several weights sharing one input per launch, and fused epilogues
// (SwiGLU, residual add); bf16 with four 16-byte loads in flight per lane.
//
// NVFP4 (gemv_nvfp4_*): y[i, n] = global * sum_k x[i, k] * W[n, k], K % 256 == 0.
// A block takes a tile of 16 output features (two 8-feature mma tiles, u = 0,
// 1) and its KW warps split K: warp w takes the 256-element chunks w, w+KW, ...
// Within a chunk, lane (g, t) owns elements [64t, 64t+64) of feature row g of
// each tile: 32 bytes of E2M1 pairs and 4 E4M3 scale bytes, which it copies to
// its own slots of shared memory with cp.async, GEMV_STAGES chunks ahead, and
// reads back itself (no barrier: cp.async.wait_group orders a thread's own
// copies). The sum over k is order-free, so the k-slots of each mma are any
// fixed assignment of those elements, the x fragments gathered alike.
//
// Exactness: each weight times its block scale reaches the mma as an fp16
// value without rounding. DEC 1 widens the nibbles to E4M3 bytes (x 2^-6) and
// converts pairs with cvt.f16x2.e4m3x2; DEC 0 builds the fp16 bits directly
// (x 2^-14). Either product with the E4M3 scale has at most 6 significant bits
// and lies in [2^-24, 42], so the fp16 multiply is exact; the activations are
// rounded to fp16 (|x| < 65504), sums are fp32.

// Per warp and stage: 2 tiles x 2 x 16 B x 32 lanes of weights, 2 x 4 B x 32
// of scales, and with XS == 2 the chunk's 256 activations (f32).
#define GEMV_WS_BYTES 2304
#define GEMV_X_BYTES 1024

// One launch: up to three weights of the same K reading the same x (tiles of
// weight j end at tiles[j]). mode 0: y_j = W_j x (+ bias_j). mode 1 (two
// weights of equal N, gate and up): a tile holds 8 features of each; y_0 =
// silu(gate) * up (clamped when limit > 0), y_1 = up. mode 2 (one weight):
// y_0 = W x (+ bias) and res += y_0.
struct GemvArgs {
    unsigned long long P[3], S[3], y[3], bias[3];
    unsigned long long x, res;
    float global[3];
    float limit;
    int N[3];
    int tiles[3];
    int K, m, ngroups, mode;
    // m == 1 only: when nx is set, x is RMSNorm(nx) * nw (eps) computed while
    // staging, and block 0 also writes it to nh (the RMSNorm's output).
    unsigned long long nx, nw, nh;
    float eps;
    // bit 0: each warp takes a contiguous run of chunks; bit 1: weight copies
    // prefetch 256 B into L2; bits 8-15: T, tiles per block (0 means 1).
    // gemv_nvfp4_tma*: bits 4-6 the benchmarks' ablations and timeline, bits
    // 16-23 ring slots, bit 24 weight copies evict-first, bits 25-27 the
    // ring's first fill paced.
    int flags;
    // gemv_nvfp4_tma* (mode 0, no norm): weight j reads x + j * xs floats (0:
    // every weight reads x); each block then takes tiles of one weight only.
    long long xs;
};

// Tile tl of a launch: which weight (gi) and its first feature (n0).
__device__ __forceinline__ void gemv_tile(const GemvArgs& a, int tl, int& gi, int& n0) {
    gi = 0;
    if (a.ngroups > 1 && tl >= a.tiles[0]) gi = (a.ngroups > 2 && tl >= a.tiles[1]) ? 2 : 1;
    int lt = tl - (gi ? a.tiles[gi - 1] : 0);
    n0 = a.mode == 1 ? lt * 8 : lt * 16;
}


// Two E4M3 bytes (the low or high half of v, low byte first) to fp16x2 (low half first).
__device__ __forceinline__ uint32_t e4m3x2_lo(uint32_t v) {
    uint32_t r;
    asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;}\n" : "=r"(r) : "r"(v));
    return r;
}
__device__ __forceinline__ uint32_t e4m3x2_hi(uint32_t v) {
    uint32_t r;
    asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;}\n" : "=r"(r) : "r"(v));
    return r;
}

__device__ __forceinline__ uint32_t hmul2u(uint32_t a, uint32_t b) {
    __half2 r = __hmul2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
}

// fp4x8_decode's multipliers 2 and 16, read from constant memory: ptxas
// cannot see them, so it keeps the multiplies (FMA pipe) instead of turning
// them into shifts on the ALU pipe or folding them into masks, one more ALU
// op a word (docs/PERFORMANCE.md round 36).
__constant__ uint32_t dec_mul[2] = {2u, 16u};

template <int DEC>
__device__ __forceinline__ void fp4x8_decode(uint32_t u, uint32_t h[4]) {
    if (DEC == 1) {
        // E4M3 byte of a code s e1 e0 m: s<<7 | e1 e0 m << 2 (the value x 2^-6).
        uint32_t e0 = ((u << 2) & 0x1C1C1C1Cu) | ((u << 4) & 0x80808080u);  // elements 0, 2, 4, 6
        uint32_t e1 = ((u >> 2) & 0x1C1C1C1Cu) | (u & 0x80808080u);         // elements 1, 3, 5, 7
        h[0] = e4m3x2_lo(e0);  // (0, 2)
        h[1] = e4m3x2_hi(e0);  // (4, 6)
        h[2] = e4m3x2_lo(e1);  // (1, 3)
        h[3] = e4m3x2_hi(e1);  // (5, 7)
    } else if (DEC == 2) {
        // fp16 with the code's bits in place (s -> bit 15, e1 e0 m -> bits 11..9):
        // the value x 2^-14, exact (0.5 a subnormal). Integer ops only, 10
        // a word: 3 LOP3, one shift and 4 PRMT on the ALU pipe, the two left
        // shifts as multiplies (IMAD) on the FMA pipe.
        // The signs are masked once (t) and each byte's form is one select
        // (c ? b : a, LUT 0xD8) between a sign source that is zero outside
        // bit 7 and the bits the select takes from the magnitude source.
        const uint32_t t = u & 0x88888888u;
        uint32_t flo, fhi;
        asm("lop3.b32 %0, %1, %2, 0x0E0E0E0E, 0xD8;\n" : "=r"(flo) : "r"(t * dec_mul[1]), "r"(u * dec_mul[0]));  // bytes: elements 0, 2, 4, 6
        asm("lop3.b32 %0, %1, %2, 0x0E0E0E0E, 0xD8;\n" : "=r"(fhi) : "r"(t), "r"(u >> 3));                        // bytes: elements 1, 3, 5, 7
        h[0] = __byte_perm(flo, 0, 0x1404);  // (0, 2)
        h[1] = __byte_perm(flo, 0, 0x3424);  // (4, 6)
        h[2] = __byte_perm(fhi, 0, 0x1404);  // (1, 3)
        h[3] = __byte_perm(fhi, 0, 0x3424);  // (5, 7)
    } else {
        e2m1x8_to_h2(u, h);  // (0, 1), (2, 3), (4, 5), (6, 7)
    }
}

// fp16x2 x fragments of 8 consecutive activations, paired as fp4x8_decode's words.
template <int DEC>
__device__ __forceinline__ void x8_pairs(float4 a, float4 b, uint32_t p[4]) {
    if (DEC == 1) {
        p[0] = f2h2(a.x, a.z);
        p[1] = f2h2(b.x, b.z);
        p[2] = f2h2(a.y, a.w);
        p[3] = f2h2(b.y, b.w);
    } else {
        p[0] = f2h2(a.x, a.y);
        p[1] = f2h2(a.z, a.w);
        p[2] = f2h2(b.x, b.y);
        p[3] = f2h2(b.z, b.w);
    }
}

// MR: 1 (m == 1), 8 (m <= 8) or 16 (m <= 16). XS, where x comes from: 0
// read per chunk from global memory (MR 8, 16); 1 staged once per block in
// shared memory as the fp16 pairs each lane's words need, optionally
// RMS-normalized on the way (MR 1); 2 copied with each chunk's weights by
// cp.async, laid out [q][t][8] so that a lane's reads hit distinct banks (MR 1).
//
// The weights are the mma's A operand (rows g: feature g of the tile's first
// 8, rows g+8: feature g of its second 8) and x is B (column g: token g), so
// one m16n8k16 covers 16 features and 8 tokens, every fragment register holds
// data, and each lane's B pairs are its x pairs as loaded.
// TM: tiles per block, 0 for T from a.flags (gemv_nvfp4_s1_d1_mt).
template <int MR, int DEC, int XS, int GEMV_STAGES, int TM = 1>
__device__ __forceinline__ void gemv_nvfp4_body(const GemvArgs& a) {
    constexpr int SB = GEMV_WS_BYTES + (XS == 2 ? GEMV_X_BYTES : 0);  // stage bytes
    extern __shared__ __align__(16) unsigned char gsm[];
    const int lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3, warp = threadIdx.x / WARP;
    const int K = a.K, m = a.m;
    // A block holds T tiles (consecutive), each split over KW warps, and stages
    // x once for all of them. Which weight and features this warp's tile covers:
    const int T = TM ? TM : max((a.flags >> 8) & 0xff, 1);
    const int KW = blockDim.x / WARP / T, wt = warp % KW, tb = warp / KW;
    const int tile = blockIdx.x * T + tb;
    int gi, n0;
    gemv_tile(a, tile, gi, n0);
    const bool swiglu = a.mode == 1;
    const uint8_t* prow[2];
    const uint8_t* srow[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int gu = swiglu ? u : gi;
        int row = swiglu ? n0 + g : n0 + 8 * u + g;
        row = row < a.N[gu] ? row : 0;
        prow[u] = (const uint8_t*)a.P[gu] + (size_t)row * (K / 2) + 16 * t;
        srow[u] = (const uint8_t*)a.S[gu] + (size_t)row * (K / 16) + 4 * t;
    }
    unsigned char* wsm = gsm + warp * (GEMV_STAGES * SB);
    // Each cp.async instruction copies 64 contiguous bytes of every row: lane
    // (g, t) copies bytes [64j + 16t, +16) of the chunk (j = 0, 1), which are
    // piece t%2 of lane (g, 2j + t/2)'s 32 bytes; a __syncwarp after the wait
    // makes them visible to their owner. The 4 scale bytes are the lane's own.
    const uint32_t sbase = smem_u32(wsm) + 2048 + lane * 4;
    const uint32_t wdst0 = smem_u32(wsm) + (t % 2) * 512 + (g * 4 + t / 2) * 16;      // j = 0
    const uint32_t wdst1 = smem_u32(wsm) + (t % 2) * 512 + (g * 4 + 2 + t / 2) * 16;  // j = 1
    const int C = K / 256;
    const bool contig = a.flags & 1, l2pf = a.flags & 2;
    const int c0 = contig ? wt * C / KW : wt;
    int nch = contig ? (wt + 1) * C / KW - c0 : (wt < C ? (C - 1 - wt) / KW + 1 : 0);
    if (tile >= a.tiles[2]) nch = 0;  // past the last tile (the grid rounds up)
    pdl_launch();
    if (XS == 2) pdl_wait();  // its prologue copies x
    const int cstep = contig ? 1 : KW;
    auto issue = [&](int i) {
        int ch = c0 + i * cstep, st = i % GEMV_STAGES;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const uint8_t* p = prow[u] + (size_t)ch * 128;
            if (l2pf) {
                cp_async16_l2(wdst0 + st * SB + u * 1024, p);
                cp_async16_l2(wdst1 + st * SB + u * 1024, p + 64);
            } else {
                cp_async16(wdst0 + st * SB + u * 1024, p);
                cp_async16(wdst1 + st * SB + u * 1024, p + 64);
            }
            cp_async4(sbase + st * SB + u * 128, srow[u] + (size_t)ch * 16);
        }
        if (XS == 2) {  // lane L copies activations [8L, 8L+8) of the chunk: q = L % 8, t = L / 8
            const float* xg = (const float*)a.x + (size_t)ch * 256 + 8 * lane;
            uint32_t d = smem_u32(wsm) + st * SB + GEMV_WS_BYTES + ((lane % 8) * 4 + lane / 8) * 32;
            cp_async16(d, xg);
            cp_async16(d + 16, xg + 4);
        }
    };
#pragma unroll
    for (int i = 0; i < GEMV_STAGES - 1; i++) {
        if (i < nch) issue(i);
        cp_async_commit();
    }
    // The weights are constant: their first copies are in flight before the
    // wait for the previous kernel, which wrote x.
    if (XS != 2) pdl_wait();
    // m == 1: xs[(chunk*8 + q)*4 + t] holds the 4 pairs of word q of lane t's
    // elements of the chunk (consecutive t: no bank conflicts).
    uint4* xs = reinterpret_cast<uint4*>(gsm + (blockDim.x / WARP) * (GEMV_STAGES * SB));
    if (XS == 1) {
        const float* x = (const float*)(a.nx ? a.nx : a.x);
        float inv = 1.f;
        if (a.nx) {
            __shared__ float nred[32];
            float ss = 0.f;
            for (int j0 = threadIdx.x; j0 < K / 4; j0 += 8 * blockDim.x) {
                float4 v[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    int j = j0 + u * blockDim.x;
                    v[u] = j < K / 4 ? reinterpret_cast<const float4*>(x)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
                for (int u = 0; u < 8; u++) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
            }
            ss = block_sum(ss, nred);
            inv = rsqrtf(ss / K + a.eps);
        }
        const float* nw = (const float*)a.nw;
        float* nh = blockIdx.x == 0 ? (float*)a.nh : nullptr;
#pragma unroll 4
        for (int j = threadIdx.x; j < K / 8; j += blockDim.x) {
            int tt = j & 3, q = (j >> 2) & 7, ch = j >> 5;
            int e = ch * 256 + 64 * tt + 8 * q;
            float4 xa = *reinterpret_cast<const float4*>(x + e), xb = *reinterpret_cast<const float4*>(x + e + 4);
            if (a.nx) {  // as the rmsnorm kernel: w * (x * inv)
                float4 wa = __ldg(reinterpret_cast<const float4*>(nw + e)), wb = __ldg(reinterpret_cast<const float4*>(nw + e + 4));
                xa = make_float4(wa.x * (xa.x * inv), wa.y * (xa.y * inv), wa.z * (xa.z * inv), wa.w * (xa.w * inv));
                xb = make_float4(wb.x * (xb.x * inv), wb.y * (xb.y * inv), wb.z * (xb.z * inv), wb.w * (xb.w * inv));
                if (nh) {
                    *reinterpret_cast<float4*>(nh + e) = xa;
                    *reinterpret_cast<float4*>(nh + e + 4) = xb;
                }
            }
            uint32_t pr[4];
            x8_pairs<DEC>(xa, xb, pr);
            xs[j] = make_uint4(pr[0], pr[1], pr[2], pr[3]);
        }
        __syncthreads();
    }

    // acc: tokens 0-7 (column 2t, 2t+1 of features g, g+8); acc8: tokens 8-15.
    // NA independent chains each, so that consecutive mma do not wait on one another.
    constexpr int NA = MR == 16 ? 2 : 4;
    float acc[NA][4], acc8[NA][4];
#pragma unroll
    for (int c = 0; c < NA; c++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[c][i] = acc8[c][i] = 0.f;
    const float* xr0 = (const float*)a.x + (size_t)min(g, m - 1) * K + 64 * t;
    const float* xr8 = (const float*)a.x + (size_t)min(g + 8, m - 1) * K + 64 * t;
    for (int i = 0; i < nch; i++) {
        cp_async_wait<GEMV_STAGES - 2>();
        __syncwarp();
        int st = i % GEMV_STAGES;
        const unsigned char* s = wsm + st * SB;
        uint4 w[2][2];
        uint32_t sc[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            w[u][0] = *reinterpret_cast<const uint4*>(s + (u * 2) * 512 + lane * 16);
            w[u][1] = *reinterpret_cast<const uint4*>(s + (u * 2 + 1) * 512 + lane * 16);
            sc[u] = *reinterpret_cast<const uint32_t*>(s + 2048 + u * 128 + lane * 4);
        }
        if (i + GEMV_STAGES - 1 < nch) issue(i + GEMV_STAGES - 1);
        cp_async_commit();
        int k0 = (c0 + i * cstep) * 256;
        // Scales as fp16x2 pairs (s, s), one per 16-element block.
        uint32_t sh[2][4];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            uint32_t lo = e4m3x2_lo(sc[u]), hi = e4m3x2_hi(sc[u]);
            sh[u][0] = __byte_perm(lo, 0, 0x1010);
            sh[u][1] = __byte_perm(lo, 0, 0x3232);
            sh[u][2] = __byte_perm(hi, 0, 0x1010);
            sh[u][3] = __byte_perm(hi, 0, 0x3232);
        }
#pragma unroll
        for (int q = 0; q < 8; q++) {
            uint32_t xp[4], xp8[4];
            if (XS == 1) {
                uint4 v = xs[((k0 / 256) * 8 + q) * 4 + t];
                xp[0] = v.x, xp[1] = v.y, xp[2] = v.z, xp[3] = v.w;
            } else if (XS == 2) {
                const float4* xv = reinterpret_cast<const float4*>(s + GEMV_WS_BYTES + (q * 4 + t) * 32);
                x8_pairs<DEC>(xv[0], xv[1], xp);
            } else {
                float4 xa = *reinterpret_cast<const float4*>(xr0 + k0 + 8 * q);
                float4 xb = *reinterpret_cast<const float4*>(xr0 + k0 + 8 * q + 4);
                x8_pairs<DEC>(xa, xb, xp);
            }
            if (MR == 16) {
                float4 xa = *reinterpret_cast<const float4*>(xr8 + k0 + 8 * q);
                float4 xb = *reinterpret_cast<const float4*>(xr8 + k0 + 8 * q + 4);
                x8_pairs<DEC>(xa, xb, xp8);
            }
            uint32_t h[2][4];
#pragma unroll
            for (int u = 0; u < 2; u++) {
                uint4 wv = w[u][q / 4];
                uint32_t word = (q % 4 == 0) ? wv.x : (q % 4 == 1) ? wv.y : (q % 4 == 2) ? wv.z : wv.w;
                fp4x8_decode<DEC>(word, h[u]);
                uint32_t s2 = sh[u][q / 2];
#pragma unroll
                for (int j = 0; j < 4; j++) h[u][j] = hmul2u(h[u][j], s2);
            }
            uint32_t a0[4] = {h[0][0], h[1][0], h[0][1], h[1][1]};
            uint32_t a1[4] = {h[0][2], h[1][2], h[0][3], h[1][3]};
            mma16816(acc[(2 * q) % NA], a0, xp[0], xp[1]);
            mma16816(acc[(2 * q + 1) % NA], a1, xp[2], xp[3]);
            if (MR == 16) {
                mma16816(acc8[(2 * q) % NA], a0, xp8[0], xp8[1]);
                mma16816(acc8[(2 * q + 1) % NA], a1, xp8[2], xp8[3]);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    // red: [warps][8][32] partial sums of the block's warps (acc, then acc8).
    float* red = reinterpret_cast<float*>(gsm);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v = 0.f, v8 = 0.f;
#pragma unroll
        for (int c = 0; c < NA; c++) v += acc[c][i], v8 += acc8[c][i];
        red[(warp * 8 + i) * WARP + lane] = v;
        red[(warp * 8 + 4 + i) * WARP + lane] = v8;
    }
    __syncthreads();
    const float F = DEC == 1 ? 64.f : 16384.f;
    const int nj = MR == 16 ? 8 : 4;
    if (swiglu) {
        // Entries i = 0, 1 are gate features, i + 2 the up features of the same lane.
        for (int o = threadIdx.x; o < T * (nj / 2 * WARP); o += blockDim.x) {
            int ot = o / (nj / 2 * WARP), l = o % WARP, j = o % (nj / 2 * WARP) / WARP, i = j % 2, half = j / 2;
            int tgi, n0;
            gemv_tile(a, blockIdx.x * T + ot, tgi, n0);
            float gs = 0.f, us = 0.f;
            for (int w2 = ot * KW; w2 < ot * KW + KW; w2++) {
                gs += red[(w2 * 8 + half * 4 + i) * WARP + l];
                us += red[(w2 * 8 + half * 4 + i + 2) * WARP + l];
            }
            int tok = 2 * (l & 3) + i + 8 * half, col = n0 + (l >> 2);
            if (tok < m && col < a.N[0]) {
                const float* b0 = (const float*)a.bias[0];
                const float* b1 = (const float*)a.bias[1];
                float gv = gs * (a.global[0] * F) + (b0 ? b0[col] : 0.f);
                float uv = us * (a.global[1] * F) + (b1 ? b1[col] : 0.f);
                ((float*)a.y[1])[(size_t)tok * a.N[1] + col] = uv;
                if (a.limit > 0.f) {
                    gv = fminf(gv, a.limit);
                    uv = fmaxf(fminf(uv, a.limit), -a.limit);
                }
                ((float*)a.y[0])[(size_t)tok * a.N[0] + col] = gv / (1.f + __expf(-gv)) * uv;
            }
        }
        return;
    }
    float* res = (float*)a.res;
    for (int o = threadIdx.x; o < T * (nj * WARP); o += blockDim.x) {
        int ot = o / (nj * WARP), l = o % WARP, j = o % (nj * WARP) / WARP, i = j % 4, half = j / 4;
        int gi, n0;
        gemv_tile(a, blockIdx.x * T + ot, gi, n0);
        const int N = a.N[gi];
        const float sc = a.global[gi] * F;
        const float* bias = (const float*)a.bias[gi];
        float* y = (float*)a.y[gi];
        float v = 0.f;
        for (int w2 = ot * KW; w2 < ot * KW + KW; w2++) v += red[(w2 * 8 + j) * WARP + l];
        int tok = 2 * (l & 3) + (i & 1) + 8 * half, col = n0 + (l >> 2) + (i < 2 ? 0 : 8);
        if (tok < m && col < N) {
            v = v * sc + (bias ? bias[col] : 0.f);
            y[(size_t)tok * N + col] = v;
            if (a.mode == 2) res[(size_t)tok * N + col] += v;
        }
    }
}

// Blocks of up to 16 warps; ST pipeline stages (chunks in flight per warp, less one).
#define GEMV_NVFP4(NAME, MR, DEC, XS, ST)                                                               \
    extern "C" __global__ void __launch_bounds__(512) NAME(const __grid_constant__ GemvArgs a) { \
        gemv_nvfp4_body<MR, DEC, XS, ST>(a);                                                            \
    }
GEMV_NVFP4(gemv_nvfp4_m1_d1, 1, 1, 2, 2)
#ifdef MANIFOLD_DEV
// The dev build's (kernels/dev.go): the integer E2M1 decoding, the
// 88-register staged kernel, 4 pipeline stages.
GEMV_NVFP4(gemv_nvfp4_m1_d0, 1, 0, 2, 2)
GEMV_NVFP4(gemv_nvfp4_s1_d0, 1, 0, 1, 2)
GEMV_NVFP4(gemv_nvfp4_s1_d1, 1, 1, 1, 2)
GEMV_NVFP4(gemv_nvfp4_s1_d1_st4, 1, 1, 1, 4)
#endif
// At most 64 registers, so that 32 warps fit on a multiprocessor.
extern "C" __global__ void __launch_bounds__(512, 2) gemv_nvfp4_s1_d1_lb(const __grid_constant__ GemvArgs a) {
    gemv_nvfp4_body<1, 1, 1, 2>(a);
}
// The same with blocks of up to 32 warps (several tiles per block, x staged once).
extern "C" __global__ void __launch_bounds__(1024, 1) gemv_nvfp4_s1_d1_mt(const __grid_constant__ GemvArgs a) {
    gemv_nvfp4_body<1, 1, 1, 2, 0>(a);
}
#ifdef MANIFOLD_DEV
// The dev build's: 2 <= m <= 16 on the decode-shape kernels (production
// takes the GEMM there), and m = 1 on the m <= 8 kernel.
GEMV_NVFP4(gemv_nvfp4_m8_d0, 8, 0, 0, 2)
GEMV_NVFP4(gemv_nvfp4_m8_d1, 8, 1, 0, 2)
GEMV_NVFP4(gemv_nvfp4_m16_d0, 16, 0, 0, 2)
GEMV_NVFP4(gemv_nvfp4_m16_d1, 16, 1, 0, 2)
#endif

// bf16 GEMV, m <= 4 per pass, K % 8 == 0, 16-byte aligned x: one warp per
// output row, each lane with four 16-byte weight loads in flight.
extern "C" __global__ void __launch_bounds__(256, 4) gemv_bf16_u4(const uint16_t* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
                                        const float* __restrict__ bias, int N, int K, int m) {
    pdl_launch();
    pdl_wait();
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= N) return;
    const uint16_t* wr = W + (size_t)r * K;
    for (int i0 = 0; i0 < m; i0 += 4) {
        int mt = min(4, m - i0);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int k = lane * 8; k < K; k += 4 * WARP * 8) {
            uint4 wv[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int kk = k + u * WARP * 8;
                wv[u] = kk < K ? __ldg(reinterpret_cast<const uint4*>(wr + kk)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int kk = k + u * WARP * 8;
                if (kk >= K) break;
                uint32_t uw[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
                float w[8];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    w[2 * j] = __uint_as_float(uw[j] << 16);
                    w[2 * j + 1] = __uint_as_float(uw[j] & 0xffff0000u);
                }
#pragma unroll
                for (int tt = 0; tt < 4; tt++) {
                    if (tt < mt) {
                        const float* xr = x + (size_t)(i0 + tt) * K + kk;
                        float4 xa = *reinterpret_cast<const float4*>(xr);
                        float4 xb = *reinterpret_cast<const float4*>(xr + 4);
                        acc[tt] += w[0] * xa.x + w[1] * xa.y + w[2] * xa.z + w[3] * xa.w + w[4] * xb.x + w[5] * xb.y +
                                   w[6] * xb.z + w[7] * xb.w;
                    }
                }
            }
        }
#pragma unroll
        for (int tt = 0; tt < 4; tt++) {
            float s = warp_sum(acc[tt]);
            if (lane == 0 && tt < mt) y[(size_t)(i0 + tt) * N + r] = s + (bias ? bias[r] : 0.f);
        }
    }
}

// ---------------------------------------------------------------------------
// gemv_nvfp4_tma: the m = 1 NVFP4 matmul as a persistent kernel fed by bulk
// copies (K % 256 == 0; same GemvArgs, modes and epilogues as above).
//
// One block per multiprocessor walks its tiles (16 weight rows each, numbered
// as gemv_tile does; block b takes tiles b, b + grid, ...) in stages of 2048
// elements of every row, the last one partial where K % 2048 != 0 (below).
// Warp TMA_CW (the producer) copies a stage's 16 x 1024 weight bytes and
// 16 x 128 scale bytes into a ring of NS slots with cp.async.bulk, the
// copies' arrival counted by the slot's "full" mbarrier, and refills a slot
// once the TMA_CW consumer warps have released it on its "empty" mbarrier. The copy engine keeps up to NS stages (up to 150 KB) in
// flight per multiprocessor without registers or instructions per byte.
//
// Consumer warp w takes 128-element group w of every stage: lane (g, t) owns
// elements [32t, 32t+32) of rows g and g+8 (16 bytes each), which are scale
// blocks 2t and 2t+1 of the group. The block scales leave the inner loop:
// the mma's A operand is the raw E2M1 values (decoded by integer ops: x 2^-14, exact in fp16) and its
// B column c carries the activations of block c only (zero elsewhere), so
// D[r][c] is row r's unscaled dot product over block c. The lane holding
// D[r][2t], D[r][2t+1] multiplies them by row r's scales of those blocks in
// fp32: 4 FMA per 8 mma instead of a multiply per weight pair.
//
// A partial last stage (K % 2048 = 128 tg, tg even) holds groups 0 to tg - 1
// of each row. Its row copies take only their bytes (64 tg of weights, 8 tg
// of scales: multiples of 16, as a bulk copy needs), and the expected byte
// count is theirs; its tensor copies take the whole boxes, the segments past
// K filled with zeros, which count toward the transaction as the rows past N
// do. Either way the slot past the tail holds bytes of no use (stale or
// uninitialized: a scale byte 0x7F is NaN) and x is staged only to K, so a
// consumer warp reads and adds nothing for its groups past the tail, yet
// waits on the slot and releases it as in a full stage. The full stages keep
// their loop as it was: the tail is one more pass of the same stage body,
// after that loop, with the warp's count of groups in it.
#define TMA_ROWSTRIDE 1088                         // a row's 1024 weight bytes, padded: rows g, g+1 on other banks
#define TMA_SROW 144                               // a row's 128 scale bytes, padded likewise
#define TMA_WBYTES (16 * TMA_ROWSTRIDE)
#define TMA_STAGE (TMA_WBYTES + 16 * TMA_SROW)     // 19712 bytes
#define TMA_MAXNS 8
#define TMA_DEC 2           // fp4x8_decode's variant (same pairs as 1, values x 2^-14)
#define TMA_UNIT 16384.f    // 1 / the decoded values' scale

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
// The same, streaming: the lines are first to go from L2.
__device__ __forceinline__ void bulk_g2s_stream(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "l"(policy)
                 : "memory");
}
// A CUtensorMap (the driver's 128-byte tensor descriptor), opaque here.
struct __align__(64) TensorMap {
    unsigned long long v[16];
};
// gemv_nvfp4_tma8_tm's parameters: GemvArgs, then per weight the tensor maps
// of its E2M1 bytes (3-D: 128 bytes of a row's 1024-byte stage segment, row,
// segment; boxes of 8 segments x 8 rows, 128-byte swizzle) and of its scales
// (2-D: a row's 128 scale bytes of a stage, row; boxes of 8 rows, 128-byte
// swizzle), encoded by the host (fuse.go: tmaMaps).
struct GemvArgsTM {
    GemvArgs g;
    TensorMap tw[3], ts[3];
};
// Tensor copies of one box into shared memory, counted on bar, evict-first in L2.
__device__ __forceinline__ void tensor_g2s_3d(uint32_t dst, const TensorMap* m, int c0, int c1, int c2, uint32_t bar,
                                              uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
        "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
        : "memory");
}
__device__ __forceinline__ void tensor_g2s_2d(uint32_t dst, const TensorMap* m, int c0, int c1, uint32_t bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
        "l"(m), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
        : "memory");
}
// gemv_nvfp4_tma8_tm's ring slot: two blocks of 8 rows x 1024 weight bytes,
// each [segment][row][128 bytes] with the 16-byte chunks of row r at chunk
// c ^ r (the copy's 128-byte swizzle), then two blocks of 8 rows x 128 scale
// bytes, [row][128 bytes] likewise swizzled: 18 KB, every block 1024-aligned.
#define TM_STAGE 18432
// The ring slot row of tile row g (and g + 8) of an 8-row block: rows read in one
// quarter-warp phase (g = 2p, 2p + 1) differ in bit 2, so their swizzles land
// their chunks on distinct banks.
__device__ __forceinline__ int tm_row(int g) { return (g & 1) * 4 + (g >> 1); }

// Named barrier 1 over the CW consumer warps (the producer never joins it).
template <int CW>
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(CW * WARP) : "memory"); }

// d = A·B with a zero accumulator.
__device__ __forceinline__ void mma16816_z(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

// Shared-memory loads at a 32-bit shared address (one register plus the
// constant the caller adds, which the compiler folds into the instruction).
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ uint32_t lds16(uint32_t addr) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr) : "memory");
    return v;
}

// Benchmark timeline (flags bit 6, BenchmarkGEMVTimeline): the global timer
// at fixed points, 64 slots per block in a.nh (no norm is fused then).
// The memory clobber keeps the read after the memory instructions before it
// in program order (a stamp marks the work issued before it).
__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
#define TMA_TR_ENTRY 0   // producer: after the barriers' setup
#define TMA_TR_ISSUE 1   // producer: stage s's copies issued (s < 24)
#define TMA_TR_WAITED 30 // consumer warp 0: the previous kernel finished (pdl_wait returned)
#define TMA_TR_STAGED 31 // consumer warp 0: x staged
#define TMA_TR_FULL 32   // consumer warp 0: stage s arrived (s < 24)
#define TMA_TR_END 60    // consumer warp 0: its last tile's sums written

// Shared memory: [NS stages][xs: K/8 uint4 (x8_pairs<1> of each 8 activations)]
// [zero: TMA_ZERO uint4][red: 2 x TMA_CW x 16 floats][nred: TMA_CW floats][full, empty: NS each].
// The zeros are what the lanes of B's empty columns read: as many as their
// loads of a stage span (two of the next group's 2 KB further on), so that
// every lane reads at one address plus constants (fuse.go: tmaFixed).
#define TMA_ZERO 130
template <int CW, bool TRACE, bool TM = false>
__device__ __forceinline__ void gemv_nvfp4_tma_body(const GemvArgs& a, const TensorMap* tw = nullptr,
                                                    const TensorMap* ts = nullptr) {
    constexpr int GP = 16 / CW;  // groups per consumer warp and stage
    constexpr int STAGE = TM ? TM_STAGE : TMA_STAGE;
    extern __shared__ __align__(16) unsigned char tsm_raw[];
    // TM: the ring 1024-aligned, as the swizzled copies need (the host adds 1 KB).
    unsigned char* tsm = TM ? tsm_raw + ((1024u - (smem_u32(tsm_raw) & 1023u)) & 1023u) : tsm_raw;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    // stages: the full stages of a tile; tail: the elements of its partial last stage (0: none).
    const int K = a.K, NS = (a.flags >> 16) & 0xff, stages = K / 2048, tail = K % 2048, total = a.tiles[2];
    const bool swiglu = a.mode == 1;
    unsigned char* ring = tsm;
    uint4* xs = reinterpret_cast<uint4*>(tsm + NS * STAGE);
    uint4* zero = xs + K / 8;
    float* red = reinterpret_cast<float*>(zero + TMA_ZERO);
    float* nred = red + 2 * CW * 16;
    const uint32_t bars = smem_u32(nred + CW);  // 8-byte aligned: everything before is a multiple of 16 bytes
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (NS + s); };
    __shared__ int s_trk;  // the timeline: this block's launch count
    const bool trace = TRACE && ((a.flags >> 6) & 1);
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; s++) {
            mbar_init(full(s), 1);
            mbar_init(empty(s), CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        if (trace) s_trk = atomicAdd((unsigned*)a.nh + blockIdx.x, 1u);
    }
    __syncthreads();
    pdl_launch();
    // Timeline words: 512 counters, then four launches' [grid][64] in turn.
    unsigned long long* tr =
        trace ? (unsigned long long*)a.nh + 256 + ((size_t)(s_trk & 3) * gridDim.x + blockIdx.x) * 64 : nullptr;
    if (TRACE && tr && threadIdx.x == CW * WARP) tr[TMA_TR_ENTRY] = gtime();
    int trs = 0;  // stages passed, for the timeline

    if (warp == CW) {
        // Producer: lane r < 16 copies weight row r of each stage, lane 16 + r its scales.
        // The weights are constant: copies start before the wait for the previous kernel.
        const int r = lane & 15;
        const bool wl = lane < 16;
        const uint32_t bytes = wl ? 1024u : 128u;
        // A partial last stage: each row's bytes up to K (multiples of 16), and only those expected.
        const uint32_t tbytes = wl ? tail / 2 : tail / 16, ttx = 16 * (tail / 2 + tail / 16);
        const uint32_t doff = wl ? r * TMA_ROWSTRIDE : TMA_WBYTES + r * TMA_SROW;
        const bool evict = (a.flags >> 24) & 1;  // weights marked evict-first in L2
        uint64_t policy = 0;
        if (evict) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
        else if (TM) asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
        int slot = 0;
        uint32_t phase = 0;
        // flags bits 25-27, pace: stage n of the ring's first fill is copied
        // only once stage n - pace has arrived (0: all at once). Fewer copies
        // then wait in the memory's queues at the release, and x's loads,
        // which queue behind them, return sooner (docs/PERFORMANCE.md round 40).
        const int pace = (a.flags >> 25) & 7;
        auto paced = [&](int n) {
            if (pace && n >= pace && n < NS) mbar_wait(full(n - pace), 0);
        };
        int ni = 0;  // stages issued
        const int nst = stages + (tail != 0);  // stages a tile, the partial one included
        for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
            int gi, n0;
            gemv_tile(a, tile, gi, n0);
            if (TM) {
                // Lane 0: four tensor copies a stage (rows past N arrive as zeros).
                const int g0 = swiglu ? 0 : gi, g1 = swiglu ? 1 : gi, r1 = swiglu ? n0 : n0 + 8;
                if (tile == (int)blockIdx.x && lane < 2) {  // the descriptors on their way before the first copy
                    asm volatile("prefetch.tensormap [%0];\n" ::"l"(lane ? ts + g0 : tw + g0) : "memory");
                }
                for (int ks = 0; ks < nst; ks++, ni++) {  // a partial stage's boxes past K arrive as zeros too
                    mbar_wait(empty(slot), phase ^ 1);
                    paced(ni);
                    if (lane == 0) {
                        const uint32_t st = smem_u32(ring + slot * STAGE);
                        mbar_expect_tx(full(slot), TM_STAGE);
                        tensor_g2s_3d(st, tw + g0, 0, n0, 8 * ks, full(slot), policy);
                        tensor_g2s_3d(st + 8192, tw + g1, 0, r1, 8 * ks, full(slot), policy);
                        tensor_g2s_2d(st + 16384, ts + g0, 32 * ks, n0, full(slot), policy);
                        tensor_g2s_2d(st + 17408, ts + g1, 32 * ks, r1, full(slot), policy);
                    }
                    __syncwarp();
                    if (TRACE && tr && lane == 0 && trs < 24) tr[TMA_TR_ISSUE + trs] = gtime();
                    if (TRACE) trs++;
                    if (++slot == NS) slot = 0, phase ^= 1;
                }
                continue;
            }
            const int gu = swiglu ? (r >> 3) : gi;
            int row = swiglu ? n0 + (r & 7) : n0 + r;
            row = row < a.N[gu] ? row : 0;
            const uint8_t* src = wl ? (const uint8_t*)a.P[gu] + (size_t)row * (K / 2) : (const uint8_t*)a.S[gu] + (size_t)row * (K / 16);
            for (int ks = 0; ks < nst; ks++, ni++) {
                const bool part = ks == stages;
                const uint32_t nb = part ? tbytes : bytes;
                mbar_wait(empty(slot), phase ^ 1);
                paced(ni);
                if (lane == 0) mbar_expect_tx(full(slot), part ? ttx : 16 * 1024 + 16 * 128);
                __syncwarp();
                if (evict)
                    bulk_g2s_stream(smem_u32(ring + slot * STAGE + doff), src + (size_t)ks * bytes, nb, full(slot), policy);
                else
                    bulk_g2s(smem_u32(ring + slot * STAGE + doff), src + (size_t)ks * bytes, nb, full(slot));
                if (TRACE && tr && lane == 0 && trs < 24) tr[TMA_TR_ISSUE + trs] = gtime();
                if (TRACE) trs++;
                if (++slot == NS) slot = 0, phase ^= 1;
            }
        }
        return;
    }

    // Consumers: stage x (optionally RMS-normalized) as fp16 pairs. Up to
    // K = 16384 every load of x is in flight before the first use (a loop of
    // dependent round trips cost 1-3 us at K = 14336), and the first norm
    // weights (constant) are loaded before the wait for the previous kernel.
    const int tid = threadIdx.x;
    // Benchmark ablations (flags bit 4: x not staged, zeros instead; bit 5:
    // the weights read from the ring but not decoded or multiplied).
    // Only the tracing instances take them: the others test no flag a stage.
    const bool noX = TRACE && ((a.flags >> 4) & 1), noDec = TRACE && ((a.flags >> 5) & 1);
    const float* nw = (const float*)a.nw;
    float* nh = blockIdx.x == 0 ? (float*)a.nh : nullptr;
    size_t xoff = 0;  // the x of this block's weight (a.xs: every tile of the block is of one weight)
    if (a.xs && blockIdx.x < total) {
        int gi, n0;
        gemv_tile(a, blockIdx.x, gi, n0);
        xoff = (size_t)gi * a.xs;
    }
    constexpr int NT = CW * WARP, MI = 16384 / (8 * NT), MW = 4096 / (8 * NT) > 0 ? 4096 / (8 * NT) : 1;
    if (noX) {
        pdl_wait();
        for (int j = tid; j < K / 8; j += NT) xs[j] = make_uint4(0, 0, 0, 0);
    } else if (K <= 8 * NT * MI) {
        float4 wa[MW], wb[MW], xa[MI], xb[MI];
        if (a.nx) {
#pragma unroll
            for (int i = 0; i < MW; i++) {
                const int e = 8 * (tid + i * NT);
                if (e < K) wa[i] = __ldg(reinterpret_cast<const float4*>(nw + e)), wb[i] = __ldg(reinterpret_cast<const float4*>(nw + e + 4));
            }
        }
        // x is the previous kernel's output: plain loads, which stay after
        // the wait (the compiler may hoist __ldg, a read-only load, above it).
        pdl_wait();
        if (TRACE && tr && tid == 0) tr[TMA_TR_WAITED] = gtime();
        const float* x = (const float*)(a.nx ? a.nx : a.x) + xoff;
#pragma unroll
        for (int i = 0; i < MI; i++) {
            const int e = 8 * (tid + i * NT);
            xa[i] = xb[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (e < K) xa[i] = *reinterpret_cast<const float4*>(x + e), xb[i] = *reinterpret_cast<const float4*>(x + e + 4);
        }
        float inv = 1.f;
        if (a.nx) {
            float ss = 0.f;
#pragma unroll
            for (int i = 0; i < MI; i++)
                ss += xa[i].x * xa[i].x + xa[i].y * xa[i].y + xa[i].z * xa[i].z + xa[i].w * xa[i].w + xb[i].x * xb[i].x +
                      xb[i].y * xb[i].y + xb[i].z * xb[i].z + xb[i].w * xb[i].w;
            ss = warp_sum(ss);
            if (lane == 0) nred[warp] = ss;
            consumers_sync<CW>();
            ss = 0.f;
#pragma unroll
            for (int w2 = 0; w2 < CW; w2++) ss += nred[w2];
            inv = rsqrtf(ss / K + a.eps);
        }
#pragma unroll
        for (int i = 0; i < MI; i++) {
            const int j = tid + i * NT, e = 8 * j;
            if (e >= K) break;
            float4 va = xa[i], vb = xb[i];
            if (a.nx) {  // as the rmsnorm kernel: w * (x * inv)
                float4 w0, w1;
                if (i < MW) w0 = wa[i < MW ? i : 0], w1 = wb[i < MW ? i : 0];
                else w0 = __ldg(reinterpret_cast<const float4*>(nw + e)), w1 = __ldg(reinterpret_cast<const float4*>(nw + e + 4));
                va = make_float4(w0.x * (va.x * inv), w0.y * (va.y * inv), w0.z * (va.z * inv), w0.w * (va.w * inv));
                vb = make_float4(w1.x * (vb.x * inv), w1.y * (vb.y * inv), w1.z * (vb.z * inv), w1.w * (vb.w * inv));
                if (nh) {
                    *reinterpret_cast<float4*>(nh + e) = va;
                    *reinterpret_cast<float4*>(nh + e + 4) = vb;
                }
            }
            uint32_t pr[4];
            x8_pairs<1>(va, vb, pr);
            xs[j] = make_uint4(pr[0], pr[1], pr[2], pr[3]);
        }
    } else {
        pdl_wait();
        const float* x = (const float*)(a.nx ? a.nx : a.x) + xoff;
        float inv = 1.f;
        if (a.nx) {
            float ss = 0.f;
            for (int j = tid; j < K / 4; j += NT) {
                float4 v = reinterpret_cast<const float4*>(x)[j];
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            ss = warp_sum(ss);
            if (lane == 0) nred[warp] = ss;
            consumers_sync<CW>();
            ss = 0.f;
#pragma unroll
            for (int w2 = 0; w2 < CW; w2++) ss += nred[w2];
            inv = rsqrtf(ss / K + a.eps);
        }
        for (int j = tid; j < K / 8; j += NT) {
            const int e = 8 * j;
            float4 va = *reinterpret_cast<const float4*>(x + e), vb = *reinterpret_cast<const float4*>(x + e + 4);
            if (a.nx) {
                float4 w0 = __ldg(reinterpret_cast<const float4*>(nw + e)), w1 = __ldg(reinterpret_cast<const float4*>(nw + e + 4));
                va = make_float4(w0.x * (va.x * inv), w0.y * (va.y * inv), w0.z * (va.z * inv), w0.w * (va.w * inv));
                vb = make_float4(w1.x * (vb.x * inv), w1.y * (vb.y * inv), w1.z * (vb.z * inv), w1.w * (vb.w * inv));
                if (nh) {
                    *reinterpret_cast<float4*>(nh + e) = va;
                    *reinterpret_cast<float4*>(nh + e + 4) = vb;
                }
            }
            uint32_t pr[4];
            x8_pairs<1>(va, vb, pr);
            xs[j] = make_uint4(pr[0], pr[1], pr[2], pr[3]);
        }
    }
    for (int j = tid; j < TMA_ZERO; j += NT) zero[j] = make_uint4(0, 0, 0, 0);
    consumers_sync<CW>();
    if (TRACE && tr && tid == 0) tr[TMA_TR_STAGED] = gtime();

    const int g = lane >> 2, t = lane & 3;
    // The consumer loop is bound by the instructions it issues (about one a
    // clock a scheduler; the decode's 10 a word are 160 of a stage's 243,
    // docs/PERFORMANCE.md rounds 36 and 37), so a stage's addressing is a few
    // adds: every shared load is one register plus a constant. The B
    // operand's sources: block 2t of the group (words 0, 1) is real for
    // column g == 2t, block 2t+1 (words 2, 3) for g == 2t+1; others read
    // zeros, at a stride of 0 a stage.
    const uint32_t xs_u = smem_u32(xs), zero_u = smem_u32(zero);
    const bool xr0 = g == 2 * t, xr1 = g == 2 * t + 1;
    const uint32_t xt0 = xr0 ? xs_u + (4 * t + 16 * warp) * 16 : zero_u;      // group `warp` of stage 0
    const uint32_t xt1 = xr1 ? xs_u + (4 * t + 2 + 16 * warp) * 16 : zero_u;
    const uint32_t xstep0 = xr0 ? 16 * 256 : 0, xstep1 = xr1 ? 16 * 256 : 0;  // 16 groups of 256 bytes a stage
    constexpr uint32_t XG = CW * 256;                                         // group warp + CW * gq: gq * XG further
    // Row g's (and g+8's) 16 weight bytes and 2 scale bytes of group warp + CW * gq.
    const int sg = tm_row(g);
    auto wofs = [&](int gq) {
        if (TM) return ((warp >> 1) + CW * gq / 2) * 1024 + sg * 128 + ((((warp & 1) * 4 + t) ^ sg) << 4);
        return g * TMA_ROWSTRIDE + warp * 64 + t * 16 + CW * gq * 64;
    };
    auto sofs = [&](int gq) {
        if (TM) return 16384 + sg * 128 + ((((warp >> 1) + CW * gq / 2) ^ sg) << 4) + (warp & 1) * 8 + 2 * t;
        return TMA_WBYTES + g * TMA_SROW + warp * 8 + 2 * t + CW * gq * 8;
    };
    constexpr int W8 = TM ? 8192 : 8 * TMA_ROWSTRIDE, S8 = TM ? 1024 : 8 * TMA_SROW;  // rows g+8
    constexpr int WG = TM ? CW / 2 * 1024 : CW * 64;                                   // wofs(gq + 1) - wofs(gq)
    static_assert(GP <= 2, "the zeros and offsets cover two groups a stage");
    const uint32_t ring_u = smem_u32(ring), ring_end = ring_u + NS * STAGE;
    const uint32_t wo = wofs(0), so0 = sofs(0), so1 = sofs(GP - 1);
    uint32_t st = ring_u, fb = full(0), phase = 0;  // the slot's address, its full barrier, its parity
    const uint32_t eb = 8 * NS;                    // empty(s) - full(s)
    // The partial last stage's groups (tail / 128, even) that are this warp's: groups
    // warp + CW * gq for gq < tn.
    int tn = 0;
#pragma unroll
    for (int gq = 0; gq < GP; gq++) tn += warp + CW * gq < tail / 128;
    int tl = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x, tl++) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        uint32_t xa0 = xt0, xa1 = xt1;
        // One stage of the tile: the first ng of this warp's GP groups (GP
        // but in a partial last stage, where it may be none: the warp still
        // waits on the slot and releases it).
        auto stage = [&](int ng) {
            mbar_wait(fb, phase);
            if (TRACE && tr && tid == 0 && trs < 24) tr[TMA_TR_FULL + trs] = gtime();
            if (TRACE) trs++;
            // The slot's weights and scales are read before its release; x (not
            // in the ring) group by group after it, so that fewer registers are
            // live across the release.
            uint4 wa[GP], wb[GP];
            uint32_t sa[GP], sb[GP];
            // (Row copies: s1 is s0 plus a constant, sofs(GP - 1) - sofs(0), folded into the loads.)
            const uint32_t w0 = st + wo, s0 = st + so0, s1 = TM ? st + so1 : s0 + CW * (GP - 1) * 8;
#pragma unroll
            for (int gq = 0; gq < GP; gq++) {
                if (gq >= ng) continue;  // (with ng == GP, as in every full stage, this folds away)
                wa[gq] = lds128(w0 + gq * WG);
                wb[gq] = lds128(w0 + gq * WG + W8);
                sa[gq] = lds16(gq ? s1 : s0);
                sb[gq] = lds16((gq ? s1 : s0) + S8);
            }
            const uint32_t xg0 = xa0, xg1 = xa1;
            xa0 += xstep0, xa1 += xstep1;
            __syncwarp();
            if (lane == 0) mbar_arrive(fb + eb);  // every shared read of the slot is done
            st += STAGE, fb += 8;
            if (st == ring_end) st = ring_u, fb = full(0), phase ^= 1;
            if (noDec) {
#pragma unroll
                for (int gq = 0; gq < GP; gq++)
                    if (gq < ng) acc[0] += __uint_as_float((wa[gq].x ^ wb[gq].w ^ sa[gq] ^ lds128(xg0 + gq * XG + 16).y) & 0x3f800001u);
                return;
            }
#pragma unroll
            for (int gq = 0; gq < GP; gq++) {
                if (gq >= ng) continue;
                const uint32_t wva[4] = {wa[gq].x, wa[gq].y, wa[gq].z, wa[gq].w}, wvb[4] = {wb[gq].x, wb[gq].y, wb[gq].z, wb[gq].w};
                const uint4 xv[4] = {lds128(xg0 + gq * XG), lds128(xg0 + gq * XG + 16), lds128(xg1 + gq * XG), lds128(xg1 + gq * XG + 16)};
                // One accumulator chain a group (8 mma): the consumers are bound by
                // the instructions they issue, and a second chain cost 4 FADD.
                float da[4];
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    uint32_t ha[4], hb[4];
                    fp4x8_decode<TMA_DEC>(wva[w], ha);
                    fp4x8_decode<TMA_DEC>(wvb[w], hb);
                    const uint32_t ae[4] = {ha[0], hb[0], ha[1], hb[1]};
                    const uint32_t ao[4] = {ha[2], hb[2], ha[3], hb[3]};
                    if (w == 0) mma16816_z(da, ae, xv[w].x, xv[w].y);
                    else mma16816(da, ae, xv[w].x, xv[w].y);
                    mma16816(da, ao, xv[w].z, xv[w].w);
                }
                const uint32_t hsa = e4m3x2_lo(sa[gq]), hsb = e4m3x2_lo(sb[gq]);
                const float2 fa = __half22float2(*reinterpret_cast<const __half2*>(&hsa));
                const float2 fb2 = __half22float2(*reinterpret_cast<const __half2*>(&hsb));
                acc[0] = fmaf(da[0], fa.x, acc[0]);
                acc[1] = fmaf(da[1], fa.y, acc[1]);
                acc[2] = fmaf(da[2], fb2.x, acc[2]);
                acc[3] = fmaf(da[3], fb2.y, acc[3]);
            }
        };
        for (int ks = 0; ks < stages; ks++) stage(GP);
        if (tail) stage(tn);
        // Rows g and g+8 of this warp's groups, summed over t, then over the warps.
        float vg = acc[0] + acc[1], v8 = acc[2] + acc[3];
        vg += __shfl_xor_sync(0xffffffff, vg, 1);
        vg += __shfl_xor_sync(0xffffffff, vg, 2);
        v8 += __shfl_xor_sync(0xffffffff, v8, 1);
        v8 += __shfl_xor_sync(0xffffffff, v8, 2);
        float* rb = red + (tl & 1) * (CW * 16);
        if (t == 0) {  // TM: rows g and g+8 of the mma are the tile's rows sg and sg+8
            rb[warp * 16 + (TM ? sg : g)] = vg;
            rb[warp * 16 + (TM ? sg : g) + 8] = v8;
        }
        consumers_sync<CW>();
        if (warp == 0 && lane < 16) {
            // red is double-buffered by tile: warps reach the next tile's
            // barrier only after warp 0 has read this one.
            float v = 0.f;
#pragma unroll
            for (int w2 = 0; w2 < CW; w2++) v += rb[w2 * 16 + lane];
            int gi, n0;
            gemv_tile(a, tile, gi, n0);
            if (swiglu) {
                const float u = __shfl_down_sync(0x0000ffff, v, 8, 16);  // lane r < 8: the up row r
                const int col = n0 + lane;
                if (lane < 8 && col < a.N[0]) {
                    const float* b0 = (const float*)a.bias[0];
                    const float* b1 = (const float*)a.bias[1];
                    float gv = v * (a.global[0] * TMA_UNIT) + (b0 ? b0[col] : 0.f);
                    float uv = u * (a.global[1] * TMA_UNIT) + (b1 ? b1[col] : 0.f);
                    ((float*)a.y[1])[col] = uv;
                    if (a.limit > 0.f) {
                        gv = fminf(gv, a.limit);
                        uv = fmaxf(fminf(uv, a.limit), -a.limit);
                    }
                    ((float*)a.y[0])[col] = gv / (1.f + __expf(-gv)) * uv;
                }
            } else {
                const int col = n0 + lane;
                if (col < a.N[gi]) {
                    const float* bias = (const float*)a.bias[gi];
                    v = v * (a.global[gi] * TMA_UNIT) + (bias ? bias[col] : 0.f);
                    ((float*)a.y[gi])[col] = v;
                    if (a.mode == 2) ((float*)a.res)[col] += v;
                }
            }
        }
    }
    if (TRACE && tr && tid == 0) tr[TMA_TR_END] = gtime();
}

// 16 consumer warps, one block per multiprocessor (the dev build's); 8
// consumer warps (two groups each per stage) with at most half a
// multiprocessor's registers, so that the next launch's block fits beside it
// (its copies start while this one drains, with programmatic dependent
// launch), or a third of them (the dev build's).
#ifdef MANIFOLD_DEV
extern "C" __global__ void __launch_bounds__(17 * WARP, 1) gemv_nvfp4_tma(const __grid_constant__ GemvArgs a) {
    gemv_nvfp4_tma_body<16, false>(a);
}
#endif
extern "C" __global__ void __launch_bounds__(9 * WARP, 2) gemv_nvfp4_tma8(const __grid_constant__ GemvArgs a) {
    gemv_nvfp4_tma_body<8, false>(a);
}
#ifdef MANIFOLD_DEV
extern "C" __global__ void __launch_bounds__(9 * WARP, 3) gemv_nvfp4_tma8_3(const __grid_constant__ GemvArgs a) {
    gemv_nvfp4_tma_body<8, false>(a);
}
#endif
// gemv_nvfp4_tma8 with each stage's weights and scales in four tensor copies
// (two 8-row blocks of each) instead of 32 row copies.
extern "C" __global__ void __launch_bounds__(9 * WARP, 2) gemv_nvfp4_tma8_tm(const __grid_constant__ GemvArgsTM a) {
    gemv_nvfp4_tma_body<8, false, true>(a.g, a.tw, a.ts);
}
// gemv_nvfp4_tma8 and gemv_nvfp4_tma8_tm writing their timelines and taking
// the ablations (BenchmarkGEMVTimeline, the dev build's).
#ifdef MANIFOLD_DEV
extern "C" __global__ void __launch_bounds__(9 * WARP, 2) gemv_nvfp4_tma8_trace(const __grid_constant__ GemvArgs a) {
    gemv_nvfp4_tma_body<8, true>(a);
}
extern "C" __global__ void __launch_bounds__(9 * WARP, 2) gemv_nvfp4_tma8_tm_trace(const __grid_constant__ GemvArgsTM a) {
    gemv_nvfp4_tma_body<8, true, true>(a.g, a.tw, a.ts);
}
#endif
