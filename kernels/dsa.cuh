// DeepSeek Sparse Attention and MLA (layers/dsa, dsa.Ops), and the
// lightning indexer's scores and exact top-k shared with DeepSeek-V4's
// indexer (dsv4.Ops.V4IndexTopK). Plain kernels, correctness first.

// Shared-memory helpers: dsa_row_stride pads a row of d floats (d a
// multiple of 4) to an odd number of float4s, so that 8 rows read at one
// column hit distinct banks. Rows are staged with cp_async16 (manifold.cu);
// a __syncthreads must follow the wait before other threads read them.
__host__ __device__ __forceinline__ int dsa_row_stride(int d) { return ((d / 4) % 2 == 0) ? d + 4 : d + 8; }

// One k8 step of a warp's scores over four 8-row n-tiles, at float32
// accuracy: sc[j] += Q·K^T for K rows j*8 + g (row stride rs from kr, which
// points at row g, column 8k + 2t), Q's tf32 parts qh, ql of this step; per
// n-tile the small products first, each pass over all four n-tiles so that no
// mma waits on the one just before it.
__device__ __forceinline__ void dsa_qk_step(float sc[4][4], const float* kr, int rs, const uint32_t qh[4],
                                            const uint32_t ql[4]) {
    uint32_t bh[4][2], bl[4][2];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 kv = *reinterpret_cast<const float2*>(kr + j * 8 * rs);
        tf32_split(kv.x, bh[j][0], bl[j][0]);
        tf32_split(kv.y, bh[j][1], bl[j][1]);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) mhc_mma_tf32(sc[j], ql[0], ql[1], ql[2], ql[3], bh[j][0], bh[j][1]);
#pragma unroll
    for (int j = 0; j < 4; j++) mhc_mma_tf32(sc[j], qh[0], qh[1], qh[2], qh[3], bl[j][0], bl[j][1]);
#pragma unroll
    for (int j = 0; j < 4; j++) mhc_mma_tf32(sc[j], qh[0], qh[1], qh[2], qh[3], bh[j][0], bh[j][1]);
}

// ---------------------------------------------------------------------------
// Indexer scores: scores[i, e] = sum_h w[i, h] * ReLU(scale * q[i, h] . keys[e])
// for e < vis_i = min((pos0 + i + 1) / rate, n), -inf beyond (rate 1: DSA's
// causal mask over tokens; rate m: V4's closed windows). One warp per entry,
// grid (ceil(n / warps), rows).
extern "C" __global__ void idx_scores(float* scores, const float* q, const float* keys, const float* w, int heads,
                                      int dim, int n, int pos0, int rate, float scale) {
    pdl_entry();
    int i = blockIdx.y;
    int lane = threadIdx.x % WARP;
    int e = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (e >= n) return;
    int vis = min((pos0 + i + 1) / rate, n);
    float* out = scores + (size_t)i * n;
    if (e >= vis) {
        if (lane == 0) out[e] = -INFINITY;
        return;
    }
    const float* k = keys + (size_t)e * dim;
    const float* qi = q + (size_t)i * heads * dim;
    const float* wi = w + (size_t)i * heads;
    float s = 0.f;
    for (int h = 0; h < heads; h++) {
        float d = 0.f;
        for (int j = lane; j < dim; j += WARP) d += qi[(size_t)h * dim + j] * k[j];
        d = __fmul_rn(warp_sum(d), scale);
        if (d > 0.f) s = __fadd_rn(s, __fmul_rn(wi[h], d));
    }
    if (lane == 0) out[e] = s;
}

// idx_scores_tile is idx_scores with the keys read once per block for all
// heads: block (tile, i) scores keys [64*tile, 64*tile + 64) of query i. The
// visible keys of the tile go to shared memory (cp.async), the queries follow
// in chunks of 64 heads, each thread computes 4 heads x 4 keys of dot
// products, and one thread per key adds the heads' terms in head order, as
// idx_scores does. dim a multiple of 4, keys 16-byte aligned; 256 threads;
// dynamic shared memory (2 * 64 * dsa_row_stride(dim) + 64 * 64) floats.
#define IDX_KT 64
#define IDX_HC 64

extern "C" __global__ void __launch_bounds__(256) idx_scores_tile(float* scores, const float* q, const float* keys,
                                                                  const float* w, int heads, int dim, int n, int pos0,
                                                                  int rate, float scale) {
    pdl_entry();
    extern __shared__ __align__(16) float idx_sm[];
    __shared__ float s_sum[IDX_KT];
    const int KS = dsa_row_stride(dim);
    float* Ks = idx_sm;             // [IDX_KT][KS] keys
    float* Qs = Ks + IDX_KT * KS;   // [IDX_HC][KS] queries of a chunk of heads
    float* Vs = Qs + IDX_HC * KS;   // [IDX_HC][IDX_KT] weighted ReLU terms
    const int tid = threadIdx.x, i = blockIdx.y, e0 = blockIdx.x * IDX_KT;
    const int vis = min((pos0 + i + 1) / rate, n);
    const int ne = min(IDX_KT, vis - e0);  // visible keys in the tile
    float* out = scores + (size_t)i * n;
    if (ne <= 0) {
        for (int j = tid; j < IDX_KT && e0 + j < n; j += blockDim.x) out[e0 + j] = -INFINITY;
        return;
    }
    const int d4 = dim / 4;
    for (int x = tid; x < ne * d4; x += blockDim.x) {
        int r = x / d4, c = x - r * d4;
        cp_async16(smem_u32(Ks + r * KS + 4 * c), keys + (size_t)(e0 + r) * dim + 4 * c);
    }
    cp_async_commit();
    cp_async_wait<0>();
    if (tid < IDX_KT) s_sum[tid] = 0.f;
    const float* qi = q + (size_t)i * heads * dim;
    const float* wi = w + (size_t)i * heads;
    const int kg = tid % 16, hg = tid / 16;  // keys kg + 16u, heads hg + 16r (u, r < 4)
    for (int h0 = 0; h0 < heads; h0 += IDX_HC) {
        const int nh = min(IDX_HC, heads - h0);
        __syncthreads();  // the previous chunk's Qs and Vs are read
        for (int x = tid; x < nh * dim; x += blockDim.x) {
            int r = x / dim, c = x - r * dim;
            Qs[r * KS + c] = qi[(size_t)(h0 + r) * dim + c];
        }
        __syncthreads();  // Ks (each thread waited for its copies) and Qs visible
        float acc[4][4];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int u = 0; u < 4; u++) acc[r][u] = 0.f;
        for (int d = 0; d < dim; d += 4) {
            float4 qv[4], kv[4];
#pragma unroll
            for (int r = 0; r < 4; r++) qv[r] = *(const float4*)(Qs + (hg + 16 * r) * KS + d);
#pragma unroll
            for (int u = 0; u < 4; u++) kv[u] = *(const float4*)(Ks + (kg + 16 * u) * KS + d);
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    acc[r][u] = fmaf(qv[r].x, kv[u].x, acc[r][u]);
                    acc[r][u] = fmaf(qv[r].y, kv[u].y, acc[r][u]);
                    acc[r][u] = fmaf(qv[r].z, kv[u].z, acc[r][u]);
                    acc[r][u] = fmaf(qv[r].w, kv[u].w, acc[r][u]);
                }
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int hl = hg + 16 * r;
            float wh = hl < nh ? wi[h0 + hl] : 0.f;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float d = __fmul_rn(acc[r][u], scale);
                Vs[hl * IDX_KT + kg + 16 * u] = hl < nh && d > 0.f ? __fmul_rn(wh, d) : 0.f;
            }
        }
        __syncthreads();  // Vs complete
        if (tid < IDX_KT) {
            float s = s_sum[tid];
            for (int h = 0; h < nh; h++) s = __fadd_rn(s, Vs[h * IDX_KT + tid]);
            s_sum[tid] = s;
        }
    }
    if (tid < IDX_KT && e0 + tid < n) out[e0 + tid] = tid < ne ? s_sum[tid] : -INFINITY;
}

// idx_scores_mma is idx_scores_tile on the tensor cores, for at most 64
// heads of dim <= 128 (dim % 8 == 0; dsa.go checks): persistent blocks
// (block x takes key tiles x, x + gridDim.x, ... of query blockIdx.y), the
// 64-key tiles copied (cp.async) into a ring of IDX_NS slots, IDX_NS - 1
// tiles ahead of the one being scored; two blocks per multiprocessor, so
// that one's tensor work hides the other's waits.
//
// Dot products at float32 accuracy from three fp16 products (m16n8k16, f32
// sums): each value v is hi + lo 2^-11 with hi = fp16(v) and lo =
// fp16((v - hi) 2^11) (v - hi is exact; the pair keeps 22 significant
// bits, as 3xTF32 does), and q.k = qh.kh + 2^-11 (ql.kh + qh.kl). fp16
// bounds |q| and |k| below 65504, as it bounds the NVFP4 matmuls'
// activations. A landed tile is split once, in place, by the whole block:
// a row's four floats at dims 4c .. 4c+3 become {hi(4c, 4c+1), hi(4c+2,
// 4c+3), lo(4c, 4c+1), lo(4c+2, 4c+3)}, which is lane t's B fragment for
// k16 step c / 4 when the mma's k slots 2t, 2t+1, 2t+8, 2t+9 stand for dims
// 4t .. 4t+3 of the step (the query's A fragments taken alike; the sum over
// k is order-free). Zeros past dim, so dim % 16 == 8 adds nothing.
//
// Warp w takes heads 16(w & 3) .. +15 against keys 32(w >> 2) .. +31 (four
// 8-key n-tiles; each half of the block copies, splits and scores its 32
// keys on its own, between named barriers), then each term fmul(w,
// fmul(dot, scale)) if positive. The warp adds its 16 heads' terms of a key
// in registers (shuffles, a fixed order); the four head groups' sums meet
// in shared memory and are added in group order. Keys past the visible ones
// score -inf. Key row stride IDX_MS = 144 floats (16 mod 32: the 16-byte
// fragment loads of each 8 lanes hit distinct banks).
#define IDX_MT 64    // keys per tile
#define IDX_MS 144   // padded key row of up to 128 floats
#define IDX_QS 136   // the staged query's row
#define IDX_MK 8     // k16 steps: dim <= 128
#define IDX_NS 3     // ring slots of key tiles (two blocks fit on a multiprocessor)
#define IDX_LO 2048.f

// Four floats as fp16 pairs {hi(x, y), hi(z, w), lo(x, y), lo(z, w)}.
__device__ __forceinline__ uint4 idx_split4(float4 v) {
    const __half2 h01 = __floats2half2_rn(v.x, v.y), h23 = __floats2half2_rn(v.z, v.w);
    const float2 f01 = __half22float2(h01), f23 = __half22float2(h23);
    return make_uint4(*reinterpret_cast<const uint32_t*>(&h01), *reinterpret_cast<const uint32_t*>(&h23),
                      f2h2(__fmul_rn(v.x - f01.x, IDX_LO), __fmul_rn(v.y - f01.y, IDX_LO)),
                      f2h2(__fmul_rn(v.z - f23.x, IDX_LO), __fmul_rn(v.w - f23.y, IDX_LO)));
}

// c += a b (m16n8k16, fp16 in, f32 sums); not volatile, so that the
// compiler may interleave independent chains.
__device__ __forceinline__ void idx_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// NK: k16 steps when every tile has the full IDX_MK (dim 128, unrolled
// with no guards), 0 for dim / 16 rounded up at run time.
template <int NK>
__device__ __forceinline__ void idx_scores_body(float* scores, const float* q, const float* keys, const float* w,
                                                int heads, int dim, int n, int pos0, int rate, float scale) {
    extern __shared__ __align__(16) float idx_sm[];
    float* Ks = idx_sm;                         // [IDX_NS][IDX_MT][IDX_MS]; first the query [64][IDX_QS] in the last slot
    float* P = Ks + IDX_NS * IDX_MT * IDX_MS;  // [4 head groups][IDX_MT] the groups' sums
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, g = lane >> 2, t = lane & 3;
    const int i = blockIdx.y, vis = min((pos0 + i + 1) / rate, n), d4 = dim / 4;
    const int nk16 = NK ? NK : (dim + 15) / 16, g4 = 4 * nk16;  // k16 steps; groups of four dims they cover
    const int ntiles = (n + IDX_MT - 1) / IDX_MT;
    float* out = scores + (size_t)i * n;
    // Key rows of tile kt into slot b (rows past n repeat the last key),
    // four threads per row; one commit group per call, empty past the end.
    auto load = [&](int kt, int b) {
        if (kt < ntiles) {
            const int r = tid >> 2;
            const float* src = keys + (size_t)min(kt * IDX_MT + r, n - 1) * dim;
            float* d = Ks + (b * IDX_MT + r) * IDX_MS;
            for (int c = tid & 3; c < d4; c += 4) cp_async16(smem_u32(d + 4 * c), src + 4 * c);
        }
        cp_async_commit();
    };
    int kt = blockIdx.x;
#pragma unroll
    for (int j = 0; j < IDX_NS - 1; j++) load(kt + j * gridDim.x, j);

    // The query's heads (zero past heads and dim) in the ring's last slot,
    // every load in flight before the first store, then this warp's fragments.
    float* qs = Ks + (IDX_NS - 1) * IDX_MT * IDX_MS;
    {
        constexpr int QG = 32, QN = 64 * QG / 256;  // groups of four dims a head; float4 per thread
        const float* qi = q + (size_t)i * heads * dim;
        float4 v[QN];
#pragma unroll
        for (int j = 0; j < QN; j++) {
            const int x = tid + 256 * j, h = x / QG, c = x - h * QG;
            v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (h < heads && c < d4) v[j] = *reinterpret_cast<const float4*>(qi + (size_t)h * dim + 4 * c);
        }
#pragma unroll
        for (int j = 0; j < QN; j++) {
            const int x = tid + 256 * j, h = x / QG, c = x - h * QG;
            *reinterpret_cast<float4*>(qs + h * IDX_QS + 4 * c) = v[j];
        }
    }
    __syncthreads();
    const int hm = 16 * (warp & 3), kn = 32 * (warp >> 2);
    uint32_t qh[IDX_MK][4], ql[IDX_MK][4];
#pragma unroll
    for (int s = 0; s < IDX_MK; s++) {
        const float* qr = qs + (hm + g) * IDX_QS + 16 * s + 4 * t;
        const uint4 a = idx_split4(*reinterpret_cast<const float4*>(qr));
        const uint4 b = idx_split4(*reinterpret_cast<const float4*>(qr + 8 * IDX_QS));
        qh[s][0] = a.x, qh[s][1] = b.x, qh[s][2] = a.y, qh[s][3] = b.y;
        ql[s][0] = a.z, ql[s][1] = b.z, ql[s][2] = a.w, ql[s][3] = b.w;
    }
    // The keys and queries are older than the kernel before this one (DSA's
    // scale of the weights, when dsa.go launches this one with programmatic
    // serialization); the weights are its output.
    pdl_wait();
    const float w0 = hm + g < heads ? w[(size_t)i * heads + hm + g] : 0.f;
    const float w1 = hm + g + 8 < heads ? w[(size_t)i * heads + hm + g + 8] : 0.f;
    __syncthreads();  // the query's slot free for keys

    // The block's halves (warps 0-3 and 4-7) copy, split, score and sum keys
    // 0-31 and 32-63 of each tile on their own, meeting at named barriers.
    const int half = warp >> 2, hw = warp & 3;
    auto half_sync = [&]() { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + half) : "memory"); };
    for (int slot = 0; kt < ntiles; kt += gridDim.x) {
        // The slot before this one was read in the last iteration, before its third barrier.
        load(kt + (IDX_NS - 1) * gridDim.x, slot == 0 ? IDX_NS - 1 : slot - 1);
        cp_async_wait<IDX_NS - 1>();
        half_sync();  // the half's rows of tile kt in their slot; the last tile's sums read
        // The split, in place: warp hw of the half takes its rows hw, hw + 4,
        // ..., lane c the row's group c (every load before the first store).
        if (lane < g4) {
            float* kr = Ks + (slot * IDX_MT + kn + hw) * IDX_MS + 4 * lane;
            float4 v[IDX_MT / 8];
#pragma unroll
            for (int r = 0; r < IDX_MT / 8; r++)
                v[r] = lane < d4 ? *reinterpret_cast<const float4*>(kr + 4 * r * IDX_MS) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int r = 0; r < IDX_MT / 8; r++) *reinterpret_cast<uint4*>(kr + 4 * r * IDX_MS) = idx_split4(v[r]);
        }
        half_sync();  // the half's rows split
        const float* kb = Ks + (slot * IDX_MT + kn + g) * IDX_MS + 4 * t;
        float sm[4][4], sc[4][4];  // qh.kh; ql.kh + qh.kl
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) sm[j][e] = sc[j][e] = 0.f;
#pragma unroll
        for (int s = 0; s < IDX_MK; s++) {
            if (NK ? s < NK : s < nk16) {
                uint4 b[4];
#pragma unroll
                for (int j = 0; j < 4; j++) b[j] = *reinterpret_cast<const uint4*>(kb + j * 8 * IDX_MS + 16 * s);
#pragma unroll
                for (int j = 0; j < 4; j++) idx_mma(sc[j], ql[s], b[j].x, b[j].y);
#pragma unroll
                for (int j = 0; j < 4; j++) idx_mma(sc[j], qh[s], b[j].z, b[j].w);
#pragma unroll
                for (int j = 0; j < 4; j++) idx_mma(sm[j], qh[s], b[j].x, b[j].y);
            }
        }
        // Lane (g, t) holds heads hm + g (e 0, 1) and hm + g + 8 (e 2, 3) of
        // keys kn + 8j + 2t (e 0, 2) and + 1 (e 1, 3). Its eight key values
        // x[2j + e] (the two heads added) are summed over g by halving
        // exchanges (lane bits 16, 8, 4), after which lane (g, t) holds the
        // warp's sum for x index g: key kn + 8(g >> 1) + 2t + (g & 1).
        float x[8];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v[2];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const float d = __fmul_rn(fmaf(sc[j][e + 2 * u], 1.f / IDX_LO, sm[j][e + 2 * u]), scale);
                    v[u] = d > 0.f ? __fmul_rn(u ? w1 : w0, d) : 0.f;
                }
                x[2 * j + e] = __fadd_rn(v[0], v[1]);
            }
        const bool b4 = g & 4, b2 = g & 2, b1 = g & 1;
        float y[4], z[2];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float r = __shfl_xor_sync(0xffffffffu, b4 ? x[k] : x[k + 4], 16);
            y[k] = __fadd_rn(b4 ? x[k + 4] : x[k], r);
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const float r = __shfl_xor_sync(0xffffffffu, b2 ? y[k] : y[k + 2], 8);
            z[k] = __fadd_rn(b2 ? y[k + 2] : y[k], r);
        }
        const float r = __shfl_xor_sync(0xffffffffu, b1 ? z[0] : z[1], 4);
        P[(warp & 3) * IDX_MT + kn + 8 * (g >> 1) + 2 * t + (g & 1)] = __fadd_rn(b1 ? z[1] : z[0], r);
        // The half's four groups' sums in P; every read of its rows done. P
        // is written again after the next tile's barriers, which every
        // thread of the half reaches after its reads below.
        half_sync();
        if (hw == 0) {
            const int key = kn + lane, e = kt * IDX_MT + key;
            const float s = __fadd_rn(__fadd_rn(__fadd_rn(P[key], P[IDX_MT + key]), P[2 * IDX_MT + key]), P[3 * IDX_MT + key]);
            if (e < n) out[e] = e < vis ? s : -INFINITY;
        }
        if (++slot == IDX_NS) slot = 0;
    }
    cp_async_wait<0>();
}

extern "C" __global__ void __launch_bounds__(256, 2) idx_scores_mma(float* scores, const float* q, const float* keys,
                                                                    const float* w, int heads, int dim, int n, int pos0,
                                                                    int rate, float scale) {
    if (dim == 16 * IDX_MK)
        idx_scores_body<IDX_MK>(scores, q, keys, w, heads, dim, n, pos0, rate, scale);
    else
        idx_scores_body<0>(scores, q, keys, w, heads, dim, n, pos0, rate, scale);
}

// ---------------------------------------------------------------------------
// Exact top-k with torch's CPU tie-breaking (layers.TopK).
//
// Keys: a float's order as torch's comparator sees it, as an unsigned
// integer: NaN above everything (all NaNs equal), -0 equal to +0.
__device__ __forceinline__ unsigned tk_key(float v) {
    if (v != v) return 0xffffffffu;
    unsigned u = __float_as_uint(v);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#define TK_BINS 2048
#define TK_U 8

// tk_digit finds the bin of the kk-th largest key in the TK_BINS-bin
// histogram h (shared memory, 16-byte aligned, complete: the caller
// synchronized after filling it) by suffix sums from the top bin: *bin,
// *need (kk less the keys in the bins above it) and *cnt (its count), the
// same in every thread. The first warp searches alone: lane l sums the 64
// bins of chunk l (reading them in a rotated order, free of bank
// conflicts), a suffix scan over the lanes finds the chunk, a second one
// over its bins (two a lane) the bin; the block then meets once to read the
// result. Every thread of the block must call it (blockDim a multiple of
// 32); h may be refilled after it returns.
__device__ void tk_digit(const unsigned* h, int kk, unsigned* bin, int* need, unsigned* cnt) {
    __shared__ unsigned s_bin, s_cnt;
    __shared__ int s_need;
    if (threadIdx.x < WARP) {
        constexpr int PER = TK_BINS / WARP;  // bins a chunk
        static_assert(PER == 64, "tk_digit: 64 bins a lane");
        const unsigned full = 0xffffffffu, k = (unsigned)kk;
        const int lane = threadIdx.x;
        const uint4* h4 = reinterpret_cast<const uint4*>(h + lane * PER);
        unsigned c = 0;
#pragma unroll
        for (int j = 0; j < PER / 4; j++) {
            const uint4 v = h4[(j + lane) & (PER / 4 - 1)];
            c += v.x + v.y + v.z + v.w;
        }
        unsigned x = c;  // keys in chunks >= lane
#pragma unroll
        for (int o = 1; o < WARP; o <<= 1) {
            const unsigned y = __shfl_down_sync(full, x, o);
            if (lane + o < WARP) x += y;
        }
        const unsigned own = __ballot_sync(full, x >= k && x - c < k);
        const int L = own ? __ffs(own) - 1 : 0;
        const unsigned above = __shfl_sync(full, x - c, L);  // keys in the chunks past chunk L
        const uint2 bb = *reinterpret_cast<const uint2*>(h + L * PER + 2 * lane);
        const unsigned c2 = bb.x + bb.y;
        unsigned x2 = c2;  // keys in chunk L's bins >= 2 * lane
#pragma unroll
        for (int o = 1; o < WARP; o <<= 1) {
            const unsigned y = __shfl_down_sync(full, x2, o);
            if (lane + o < WARP) x2 += y;
        }
        const unsigned acc = above + x2 - c2;  // keys in the bins past 2 * lane + 1
        const unsigned own2 = __ballot_sync(full, acc + c2 >= k && acc < k);
        if (own2 && lane == __ffs(own2) - 1) {
            const bool hi = acc + bb.y >= k;  // bin 2 * lane + 1, else 2 * lane
            s_bin = (unsigned)(L * PER + 2 * lane + (hi ? 1 : 0));
            s_need = kk - (int)(hi ? acc : acc + bb.y);
            s_cnt = hi ? bb.y : bb.x;
        }
    }
    __syncthreads();
    *bin = s_bin, *need = s_need, *cnt = s_cnt;
    __syncthreads();
}

// tk_radix returns the k-th largest key (1 <= k <= n) of keyf(0..n-1) and,
// in *need, how many elements equal to it belong to the k largest (k minus
// the number above it), in *ties how many equal it. A block-wide radix
// select over digits of 11, 11 and 10 bits: each pass counts the keys that
// match the digits found so far into TK_BINS bins (TK_U keys loaded per
// thread before counting, so the loads overlap), then a suffix scan of the
// bins finds the digit of the k-th largest. Every thread of the block must
// call it; blockDim a power of two from 32 to 1024.
template <typename KeyF>
__device__ unsigned tk_radix(KeyF keyf, int n, int k, int* need, int* ties) {
    __shared__ __align__(16) unsigned hist[TK_BINS];
    unsigned prefix = 0, mask = 0, cnt = 0;
    int kk = k;
    const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
    for (int p = 0; p < 3; p++) {
        int shift = shifts[p];
        unsigned dmask = (1u << widths[p]) - 1u;
        for (int b = threadIdx.x; b < TK_BINS; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int i0 = 0; i0 < n; i0 += blockDim.x * TK_U) {
            unsigned key[TK_U];
#pragma unroll
            for (int u = 0; u < TK_U; u++) {
                int i = i0 + u * blockDim.x + threadIdx.x;
                key[u] = i < n ? keyf(i) : 0u;
            }
#pragma unroll
            for (int u = 0; u < TK_U; u++) {
                int i = i0 + u * blockDim.x + threadIdx.x;
                // Plain shared atomics: warp aggregation by __match_any_sync
                // measured several times slower (MATCH is a slow instruction).
                if (i < n && (key[u] & mask) == prefix) atomicAdd(&hist[(key[u] >> shift) & dmask], 1u);
            }
        }
        __syncthreads();
        unsigned bin;
        tk_digit(hist, kk, &bin, &kk, &cnt);
        prefix |= bin << shift;
        mask |= dmask << shift;
    }
    *need = kk;
    *ties = (int)cnt;
    return prefix;
}

// tk_compact calls emit(i, rank) for every i in [0, n) with pred(i), rank
// counting those in increasing i, and returns their number. pred is called
// once per i. Each warp takes TK_U runs of 32 consecutive i of a chunk (lane
// l the l-th of each run: coalesced, conflict-free reads of keys held in
// shared memory), a ballot per run ranks them within the warp and a block
// scan of the warps' counts places the warps. Every thread of the block must
// call it (blockDim a multiple of 32).
template <typename Pred, typename Emit>
__device__ int tk_compact(int n, Pred pred, Emit emit) {
    __shared__ int wc[32];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    constexpr int SPAN = WARP * TK_U;  // i per warp and chunk
    int base = 0;
    for (int c0 = 0; c0 < n; c0 += nw * SPAN) {
        const int w0 = c0 + warp * SPAN;
        unsigned m[TK_U];
        int c = 0;
#pragma unroll
        for (int u = 0; u < TK_U; u++) {
            const int i = w0 + u * WARP + lane;
            m[u] = __ballot_sync(0xffffffffu, i < n && pred(i));
            c += __popc(m[u]);
        }
        if (lane == 0) wc[warp] = c;
        __syncthreads();
        // The warps before this one and all of them: a prefix scan of the
        // warp counts in every warp (lane l holds warp l's).
        int pw = lane < nw ? wc[lane] : 0;
#pragma unroll
        for (int o = 1; o < WARP; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, pw, o);
            if (lane >= o) pw += y;
        }
        const int total = __shfl_sync(0xffffffffu, pw, nw - 1);
        int r = base + (warp > 0 ? __shfl_sync(0xffffffffu, pw, warp - 1) : 0);
        const unsigned below = (1u << lane) - 1u;
#pragma unroll
        for (int u = 0; u < TK_U; u++) {
            if (m[u] >> lane & 1u) emit(w0 + u * WARP + lane, r + __popc(m[u] & below));
            r += __popc(m[u]);
        }
        base += total;
        __syncthreads();
    }
    return base;
}

// The sequential algorithm of layers.TopK (torch's CPU kernel: a k-entry
// heap when k*64 <= n, else libstdc++'s introselect), one thread, on global
// scratch. Used only when ties at the k-th value make the set depend on it.
struct TkEntry {
    float v;
    int i;
};

__device__ __forceinline__ bool tk_less(TkEntry a, TkEntry b) {
    bool an = a.v != a.v, bn = b.v != b.v;
    return (an && !bn) || a.v > b.v;
}

__device__ __forceinline__ void tk_swap(TkEntry* q, int a, int b) {
    TkEntry t = q[a];
    q[a] = q[b];
    q[b] = t;
}

__device__ void tk_push_heap(TkEntry* q, int hole, int top, TkEntry v) {
    int parent = (hole - 1) / 2;
    while (hole > top && tk_less(q[parent], v)) {
        q[hole] = q[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    q[hole] = v;
}

__device__ void tk_adjust_heap(TkEntry* q, int hole, int n, TkEntry v) {
    int top = hole, second = hole;
    while (second < (n - 1) / 2) {
        second = 2 * (second + 1);
        if (tk_less(q[second], q[second - 1])) second--;
        q[hole] = q[second];
        hole = second;
    }
    if ((n & 1) == 0 && second == (n - 2) / 2) {
        second = 2 * (second + 1);
        q[hole] = q[second - 1];
        hole = second - 1;
    }
    tk_push_heap(q, hole, top, v);
}

__device__ void tk_pop_heap(TkEntry* q, int n, int result) {
    TkEntry v = q[result];
    q[result] = q[0];
    tk_adjust_heap(q, 0, n, v);
}

__device__ void tk_make_heap(TkEntry* q, int n) {
    if (n < 2) return;
    for (int parent = (n - 2) / 2;; parent--) {
        tk_adjust_heap(q, parent, n, q[parent]);
        if (parent == 0) return;
    }
}

__device__ void tk_heap_select(TkEntry* q, int first, int middle, int last) {
    TkEntry* h = q + first;
    int n = middle - first;
    tk_make_heap(h, n);
    for (int i = n; i < last - first; i++)
        if (tk_less(h[i], h[0])) tk_pop_heap(h, n, i);
}

__device__ void tk_move_median_to_first(TkEntry* q, int result, int a, int b, int c) {
    if (tk_less(q[a], q[b])) {
        if (tk_less(q[b], q[c])) tk_swap(q, result, b);
        else if (tk_less(q[a], q[c])) tk_swap(q, result, c);
        else tk_swap(q, result, a);
    } else if (tk_less(q[a], q[c])) tk_swap(q, result, a);
    else if (tk_less(q[b], q[c])) tk_swap(q, result, c);
    else tk_swap(q, result, b);
}

__device__ int tk_unguarded_partition(TkEntry* q, int first, int last, int pivot) {
    for (;;) {
        while (tk_less(q[first], q[pivot])) first++;
        last--;
        while (tk_less(q[pivot], q[last])) last--;
        if (first >= last) return first;
        tk_swap(q, first, last);
        first++;
    }
}

__device__ void tk_unguarded_linear_insert(TkEntry* q, int last) {
    TkEntry v = q[last];
    int next = last - 1;
    while (tk_less(v, q[next])) {
        q[last] = q[next];
        last = next;
        next--;
    }
    q[last] = v;
}

__device__ void tk_insertion_sort(TkEntry* q, int first, int last) {
    if (first == last) return;
    for (int i = first + 1; i != last; i++) {
        if (tk_less(q[i], q[first])) {
            TkEntry v = q[i];
            for (int j = i; j > first; j--) q[j] = q[j - 1];
            q[first] = v;
        } else {
            tk_unguarded_linear_insert(q, i);
        }
    }
}

__device__ int tk_lg(int n) {
    int r = -1;
    for (; n > 0; n >>= 1) r++;
    return r;
}

__device__ void tk_introselect(TkEntry* q, int first, int nth, int last, int depth) {
    while (last - first > 3) {
        if (depth == 0) {
            tk_heap_select(q, first, nth + 1, last);
            tk_swap(q, first, nth);
            return;
        }
        depth--;
        int mid = first + (last - first) / 2;
        tk_move_median_to_first(q, first, first + 1, mid, last - 1);
        int cut = tk_unguarded_partition(q, first + 1, last, first);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    tk_insertion_sort(q, first, last);
}

// tk_torch marks in flag (zeroed) the indices layers.TopK(row, k, sorted=false) returns.
__device__ void tk_torch(TkEntry* q, const float* row, int n, int k, int* flag) {
    if (k * 64 <= n) {
        for (int j = 0; j < k; j++) q[j] = TkEntry{row[j], j};
        tk_make_heap(q, k);
        for (int idx = k; idx < n; idx++) {
            TkEntry v{row[idx], idx};
            if (tk_less(v, q[0])) {
                if (k > 1) tk_pop_heap(q, k - 1, k - 1);
                q[k - 1] = v;
                tk_push_heap(q, k - 1, 0, v);
            }
        }
    } else {
        for (int j = 0; j < n; j++) q[j] = TkEntry{row[j], j};
        tk_introselect(q, 0, k - 1, n, 2 * tk_lg(n));
    }
    for (int j = 0; j < k; j++) flag[q[j].i] = 1;
}

// tk_torch_emit writes the set layers.TopK(row, k) returns among the first
// vis of the row's n entries (tk_torch, on flag: 3n words of scratch) in
// increasing order, as out's mode says (topk_select's), and returns its size.
// Every thread of the block must call it.
__device__ int tk_torch_emit(const float* row, int n, int k, int vis, int* flag, int mode, int* oi, float* of) {
    for (int j = threadIdx.x; j < n; j += blockDim.x) flag[j] = 0;
    __syncthreads();
    if (threadIdx.x == 0) tk_torch((TkEntry*)(flag + n), row, n, k, flag);
    __syncthreads();
    return tk_compact(
        vis, [&](int j) { return flag[j] != 0; },
        [&](int j, int r) {
            if (mode == 0) oi[r] = j;
            else of[r] = (float)j;
        });
}

// tk_finish completes row i's output of all selected entries: its count
// (mode 0) or -1 past them (mode 1).
__device__ void tk_finish(int all, int i, int ostride, int* cnt, int mode, float* of) {
    if (mode == 0) {
        if (threadIdx.x == 0) cnt[i] = all;
    } else {
        for (int j = all + threadIdx.x; j < ostride; j += blockDim.x) of[j] = -1.f;
    }
}

// tk_stage writes the keys (tk_key) of src[0, n) into keys (shared memory),
// TK_U loads in flight per thread. Every thread of the block must call it;
// the caller synchronizes before reading keys.
__device__ void tk_stage(const float* src, int n, unsigned* keys) {
    for (int c0 = 0; c0 < n; c0 += blockDim.x * TK_U) {
        float v[TK_U];
#pragma unroll
        for (int u = 0; u < TK_U; u++) {
            const int j = c0 + u * blockDim.x + threadIdx.x;
            v[u] = j < n ? src[j] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < TK_U; u++) {
            const int j = c0 + u * blockDim.x + threadIdx.x;
            if (j < n) keys[j] = tk_key(v[u]);
        }
    }
}

// topk_select: one block per row i of scores ([rows, n]): dsa.Select, the
// torch.topk set of k = min(topk, n) entries keeping those below vis_i =
// min((pos0 + i + 1) / rate, n), in increasing order. The k-th largest value
// T is found by radix select; when the ties at T that could be kept are all
// taken (or are all masked) the set is every visible entry >= T, otherwise
// thread 0 runs torch's algorithm itself (tk_torch) on scratch ([rows, 3n]
// words). mode 0: out is int [rows, ostride] and cnt[i] the count; mode 1:
// out is float [rows, ostride], -1 padded. staged: the row's keys are
// read from global memory once, into 4n bytes of dynamic shared memory, and
// every pass reads them there (else each pass reads the row again).
extern "C" __global__ void __launch_bounds__(1024) topk_select(const float* scores, int n, int topk, int pos0, int rate, void* out,
                                       int ostride, int* cnt, int mode, float* scratch, int staged) {
    extern __shared__ unsigned tks_keys[];
    __shared__ int s_vis;
    pdl_launch();  // the sparse attention after it may stage its queries meanwhile (dsa.go)
    int i = blockIdx.x;
    const float* row = scores + (size_t)i * n;
    int k = min(topk, n);
    int vis = min((pos0 + i + 1) / rate, n);
    int* oi = (int*)out + (size_t)i * ostride;
    float* of = (float*)out + (size_t)i * ostride;
    int total = 0;
    if (staged) {
        tk_stage(row, n, tks_keys);
        __syncthreads();
    }
    if (k > 0) {
        auto key = [&](int j) { return staged ? tks_keys[j] : tk_key(row[j]); };
        int need, ties;
        unsigned T = tk_radix(key, n, k, &need, &ties);
        // Visible ties: all of them when every entry is visible.
        int tv = ties;
        if (vis < n && ties != need) {
            if (threadIdx.x == 0) s_vis = 0;
            __syncthreads();
            int ev = 0;
            for (int j = threadIdx.x; j < vis; j += blockDim.x) ev += key(j) == T;
            if (ev) atomicAdd(&s_vis, ev);
            __syncthreads();
            tv = s_vis;
        }
        bool exact = ties == need || tv == 0;
        int* flag = (int*)(scratch + (size_t)i * 3 * n);
        if (!exact) {
            for (int j = threadIdx.x; j < n; j += blockDim.x) flag[j] = 0;
            __syncthreads();
            if (threadIdx.x == 0) tk_torch((TkEntry*)(flag + n), row, n, k, flag);
            __syncthreads();
        }
        total = tk_compact(
            vis, [&](int j) { return exact ? key(j) >= T : flag[j] != 0; },
            [&](int j, int r) {
                if (mode == 0) oi[r] = j;
                else of[r] = (float)j;
            });
    }
    tk_finish(total, i, ostride, cnt, mode, of);
}

// ---------------------------------------------------------------------------
// topk_select for a few long rows, over many blocks: block (b, i) takes keys
// [b*TKM_CHUNK, (b+1)*TKM_CHUNK) of row i. tkm_hist (pass 0, 1, 2) counts
// its keys that match the digits found so far into the row's global
// histogram of the pass; tkm_count finds the k-th largest key T from the
// three histograms and counts its visible keys >= T and == T; tkm_emit
// writes them in increasing order, each block after the counts of those
// before it, when the set is every visible key >= T (tk_radix's rule),
// else block 0 selects the row with torch's algorithm as topk_select does. Every block replays
// the digit search from the histograms (2048 bins each), so no launch
// does it alone. Workspace per row (TKM_WS words, zero before the first
// launch): the three histograms, the per-block counts, a ticket; the last
// block of tkm_emit to finish with the histograms zeroes them again.
#define TKM_CHUNK 2048
#define TKM_MAXB 512
#define TKM_WS (3 * TK_BINS + 2 * TKM_MAXB + 2)

// tkm_find replays the digit search over passes [0, passes) of the row's
// histograms: the digits found (prefix, under mask), and kk, the rank of
// the k-th largest among the keys that match them; after three passes
// prefix is T, kk how many keys equal to T belong to the set and *ties how
// many equal it. h: TK_BINS words of the caller's shared memory. Every
// thread of the block must call it.
__device__ void tkm_find(const unsigned* hist, int passes, int k, unsigned* h, unsigned* prefix, unsigned* mask, int* kk,
                         int* ties) {
    const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
    unsigned pf = 0, mk = 0, cnt = 0;
    int kr = k;
    for (int p = 0; p < passes; p++) {
        for (int b = threadIdx.x; b < TK_BINS; b += blockDim.x) h[b] = hist[p * TK_BINS + b];
        __syncthreads();
        unsigned bin;
        tk_digit(h, kr, &bin, &kr, &cnt);
        pf |= bin << shifts[p];
        mk |= ((1u << widths[p]) - 1u) << shifts[p];
    }
    *prefix = pf, *mask = mk, *kk = kr, *ties = (int)cnt;
}

extern "C" __global__ void __launch_bounds__(1024) tkm_hist(const float* scores, int n, int topk, unsigned* ws, int pass) {
    __shared__ __align__(16) unsigned hist[TK_BINS];
    const int i = blockIdx.y, b = blockIdx.x;
    const float* row = scores + (size_t)i * n;
    unsigned* wr = ws + (size_t)i * TKM_WS;
    unsigned prefix, mask;
    int kk, ties;
    tkm_find(wr, pass, min(topk, n), hist, &prefix, &mask, &kk, &ties);
    for (int j = threadIdx.x; j < TK_BINS; j += blockDim.x) hist[j] = 0;
    __syncthreads();
    const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
    const unsigned dmask = pass == 2 ? 0x3ffu : 0x7ffu;
    const int j1 = min(n, (b + 1) * TKM_CHUNK);
    for (int j = b * TKM_CHUNK + threadIdx.x; j < j1; j += blockDim.x) {
        const unsigned key = tk_key(row[j]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & dmask], 1u);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < TK_BINS; j += blockDim.x)
        if (hist[j]) atomicAdd(&wr[pass * TK_BINS + j], hist[j]);
}

extern "C" __global__ void __launch_bounds__(1024) tkm_count(const float* scores, int n, int topk, int pos0, int rate, unsigned* ws) {
    __shared__ __align__(16) unsigned h[TK_BINS];
    __shared__ int s_ge, s_eq;
    const int i = blockIdx.y, b = blockIdx.x;
    const float* row = scores + (size_t)i * n;
    unsigned* wr = ws + (size_t)i * TKM_WS;
    const int vis = min((pos0 + i + 1) / rate, n);
    unsigned T, mask;
    int need, ties;
    tkm_find(wr, 3, min(topk, n), h, &T, &mask, &need, &ties);
    if (threadIdx.x == 0) s_ge = 0, s_eq = 0;
    __syncthreads();
    int ge = 0, eq = 0;
    const int j1 = min(vis, (b + 1) * TKM_CHUNK);
    for (int j = b * TKM_CHUNK + threadIdx.x; j < j1; j += blockDim.x) {
        const unsigned key = tk_key(row[j]);
        ge += key >= T;
        eq += key == T;
    }
    if (ge) atomicAdd(&s_ge, ge);
    if (eq) atomicAdd(&s_eq, eq);
    __syncthreads();
    if (threadIdx.x == 0) {
        wr[3 * TK_BINS + b] = (unsigned)s_ge;
        wr[3 * TK_BINS + TKM_MAXB + b] = (unsigned)s_eq;
    }
}

extern "C" __global__ void __launch_bounds__(1024) tkm_emit(const float* scores, int n, int topk, int pos0, int rate, void* out,
                                                            int ostride, int* cnt, int mode, float* scratch, unsigned* ws) {
    __shared__ __align__(16) unsigned h[TK_BINS];
    __shared__ int s_base, s_total, s_tv, s_last;
    pdl_launch();
    const int i = blockIdx.y, b = blockIdx.x, nb = gridDim.x;
    const float* row = scores + (size_t)i * n;
    unsigned* wr = ws + (size_t)i * TKM_WS;
    const int vis = min((pos0 + i + 1) / rate, n), k = min(topk, n);
    unsigned T, mask;
    int need, ties;
    tkm_find(wr, 3, k, h, &T, &mask, &need, &ties);
    if (threadIdx.x == 0) {
        int base = 0, total = 0, tv = 0;
        for (int c = 0; c < nb; c++) {
            const int g = (int)wr[3 * TK_BINS + c];
            if (c < b) base += g;
            total += g;
            tv += (int)wr[3 * TK_BINS + TKM_MAXB + c];
        }
        s_base = base, s_total = total, s_tv = tv;
        // Every block has read the histograms and counts: the last one clears them.
        __threadfence();
        s_last = atomicAdd(&wr[TKM_WS - 1], 1u) == (unsigned)(nb - 1);
    }
    __syncthreads();
    const int base = s_base, total = s_total, tv = s_tv;
    if (s_last) {
        __threadfence();
        for (int j = threadIdx.x; j < 3 * TK_BINS; j += blockDim.x) wr[j] = 0;
        if (threadIdx.x == 0) wr[TKM_WS - 1] = 0;
    }
    int* oi = (int*)out + (size_t)i * ostride;
    float* of = (float*)out + (size_t)i * ostride;
    const bool exact = ties == need || tv == 0;
    int all = total;
    if (!exact) {
        // Ties decide: block 0 runs torch's algorithm on the row, as topk_select.
        if (b != 0) return;
        all = tk_torch_emit(row, n, k, vis, (int*)(scratch + (size_t)i * 3 * n), mode, oi, of);
    } else {
        const int j0 = b * TKM_CHUNK, j1 = min(vis, j0 + TKM_CHUNK);
        if (j1 > j0)
            tk_compact(
                j1 - j0, [&](int j) { return tk_key(row[j0 + j]) >= T; },
                [&](int j, int r) {
                    if (mode == 0) oi[base + r] = j0 + j;
                    else of[base + r] = (float)(j0 + j);
                });
    }
    if (b == 0) tk_finish(all, i, ostride, cnt, mode, of);
}

// ---------------------------------------------------------------------------
// Distributed shared memory (thread block clusters): the address of p's
// counterpart in block rank of the cluster; a reduction there that needs no
// reply; a store there; a barrier of every thread of the cluster whose
// release and acquire make the blocks' earlier shared writes visible.
__device__ __forceinline__ uint32_t dsmem_map(const void* p, uint32_t rank) {
    uint32_t a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(a) : "r"(smem_u32(p)), "r"(rank));
    return a;
}
__device__ __forceinline__ void dsmem_add(uint32_t a, uint32_t v) {
    asm volatile("red.relaxed.cluster.shared::cluster.add.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void dsmem_store(uint32_t a, int v) {
    asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void dsmem_store4(uint32_t a, uint4 v) {
    asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

// topk_select for a few long rows in one launch: a cluster of TKC blocks per
// row (grid TKC x rows), block r holding keys [r*per, (r+1)*per) of the row in
// shared memory. Each radix pass histograms the block's keys into its own
// shared memory and adds the counts into every block's histogram of the pass
// (distributed shared memory, reductions that need no reply); after a
// cluster barrier each block runs the digit search on its own copy. The
// counts of visible keys >= T and == T are shared the same way, and the
// blocks then write their keys as tkm_emit does (the same set, the same
// order; block 0 runs torch's algorithm when ties decide). Dynamic shared
// memory: 4 * (5 * TK_BINS + per) bytes: the three pass histograms, the
// block's own histogram, pass 1's slices, its keys. Against the tkm_ passes:
// no global workspace and one launch instead of five.
// TKC blocks a cluster: 8 (portable) or 16 (tkc_select16; dsa.go sets the
// non-portable cluster size attribute).
template <int TKC>
__device__ __forceinline__ void tkc_body(const float* scores, int n, int topk, int pos0, int rate, void* out,
                                         int ostride, int* cnt, int mode, float* scratch) {
    extern __shared__ __align__(16) unsigned tkc_sh[];
    __shared__ int cnts[2 * TKC];  // each block's visible keys >= T, == T
    pdl_launch();
    __shared__ int s_ge, s_eq, s_base, s_total, s_tv;
    unsigned* tot = tkc_sh;                // [3][TK_BINS]
    unsigned* hist = tot + 3 * TK_BINS;    // [TK_BINS]
    unsigned* rs = hist + TK_BINS;         // [TKC][TK_BINS / TKC] pass 1: the blocks' slices of this block's bins
    unsigned* keys = rs + TK_BINS;         // [per]
    const int r = (int)cluster_rank(), i = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int per = (n + TKC - 1) / TKC, j0 = r * per, nl = max(0, min(n, j0 + per) - j0);
    const int k = min(topk, n), vis = min((pos0 + i + 1) / rate, n);
    const float* row = scores + (size_t)i * n;
    tk_stage(row + j0, nl, keys);
    for (int j = tid; j < 3 * TK_BINS; j += nt) tot[j] = 0;
    if (tid == 0) s_ge = 0, s_eq = 0;
    cluster_barrier();  // every block's histograms zeroed before any block adds to them

    unsigned prefix = 0, mask = 0, ties = 0;
    int need = k;
    const int shifts[3] = {21, 10, 0};
    for (int pass = 0; pass < 3; pass++) {
        const int shift = shifts[pass];
        const unsigned dmask = pass == 2 ? 0x3ffu : 0x7ffu;
        for (int b = tid; b < TK_BINS; b += nt) hist[b] = 0;
        __syncthreads();
        // A thread's run of keys in one bin is one atomic (rows of equal
        // scores, such as zeros, would otherwise serialize on one bin).
        unsigned run = 0, c = 0;
        for (int c0 = 0; c0 < nl; c0 += nt * TK_U) {
            unsigned kv[TK_U];
#pragma unroll
            for (int u = 0; u < TK_U; u++) {
                const int j = c0 + u * nt + tid;
                kv[u] = j < nl ? keys[j] : 0u;
            }
#pragma unroll
            for (int u = 0; u < TK_U; u++) {
                if (c0 + u * nt + tid >= nl || (kv[u] & mask) != prefix) continue;
                const unsigned bin = (kv[u] >> shift) & dmask;
                if (c && bin != run) atomicAdd(&hist[run], c), c = 0;
                run = bin, c++;
            }
        }
        if (c) atomicAdd(&hist[run], c);
        __syncthreads();
        if (pass == 1) {
            // Pass 1 counts the keys of one bin of the top digit, spread over
            // every bin of the next: block o sums the bins [o*B, o*B + B) from
            // every block's slice and writes the sums to every block, in
            // 16-byte stores rather than an addition per bin and block.
            constexpr int B = TK_BINS / TKC;
            for (int t4 = tid; t4 < TK_BINS / 4; t4 += nt) {
                const int b4 = 4 * t4, o = b4 / B;
                dsmem_store4(dsmem_map(rs + r * B + (b4 - o * B), o), *reinterpret_cast<const uint4*>(hist + b4));
            }
            cluster_barrier();  // every block's slice of this block's bins in rs
            for (int t = tid; t < (B / 4) * TKC; t += nt) {
                const int k4 = 4 * (t % (B / 4)), d = t / (B / 4);
                uint4 sum = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int src = 0; src < TKC; src++) {
                    const uint4 v = *reinterpret_cast<const uint4*>(rs + src * B + k4);
                    sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
                }
                dsmem_store4(dsmem_map(tot + pass * TK_BINS + r * B + k4, d), sum);
            }
        } else {
            for (int b = tid; b < TK_BINS; b += nt) {
                const unsigned h = hist[b];
                if (h == 0) continue;
#pragma unroll
                for (int d = 0; d < TKC; d++) dsmem_add(dsmem_map(tot + pass * TK_BINS + b, d), h);
            }
        }
        cluster_barrier();
        unsigned bin;
        tk_digit(tot + pass * TK_BINS, need, &bin, &need, &ties);
        prefix |= bin << shift;
        mask |= dmask << shift;
    }
    const unsigned T = prefix;
    const int jv = min(nl, max(0, vis - j0));  // the block's visible keys
    int ge = 0, eq = 0;
    for (int j = tid; j < jv; j += nt) {
        const unsigned key = keys[j];
        ge += key >= T;
        eq += key == T;
    }
    ge = (int)__reduce_add_sync(0xffffffffu, (unsigned)ge);  // one shared atomic a warp
    eq = (int)__reduce_add_sync(0xffffffffu, (unsigned)eq);
    if (tid % WARP == 0 && ge) atomicAdd(&s_ge, ge);
    if (tid % WARP == 0 && eq) atomicAdd(&s_eq, eq);
    __syncthreads();
    if (tid < TKC) {
        dsmem_store(dsmem_map(cnts + r, tid), s_ge);
        dsmem_store(dsmem_map(cnts + TKC + r, tid), s_eq);
    }
    cluster_barrier();  // the last access to another block's shared memory: blocks may leave after it
    if (tid == 0) {
        int base = 0, total = 0, tv = 0;
        for (int c = 0; c < TKC; c++) {
            if (c < r) base += cnts[c];
            total += cnts[c];
            tv += cnts[TKC + c];
        }
        s_base = base, s_total = total, s_tv = tv;
    }
    __syncthreads();
    const int base = s_base, total = s_total, tv = s_tv;
    int* oi = (int*)out + (size_t)i * ostride;
    float* of = (float*)out + (size_t)i * ostride;
    const bool exact = (int)ties == need || tv == 0;
    int all = total;
    if (!exact) {
        // Ties decide: block 0 runs torch's algorithm on the row, as topk_select.
        if (r != 0) return;
        all = tk_torch_emit(row, n, k, vis, (int*)(scratch + (size_t)i * 3 * n), mode, oi, of);
    } else if (jv > 0) {
        tk_compact(
            jv, [&](int j) { return keys[j] >= T; },
            [&](int j, int rr) {
                if (mode == 0) oi[base + rr] = j0 + j;
                else of[base + rr] = (float)(j0 + j);
            });
    }
    if (r == 0) tk_finish(all, i, ostride, cnt, mode, of);
}
extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(1024)
    tkc_select(const float* scores, int n, int topk, int pos0, int rate, void* out, int ostride, int* cnt, int mode,
               float* scratch) {
    tkc_body<8>(scores, n, topk, pos0, rate, out, ostride, cnt, mode, scratch);
}
extern "C" __global__ void __cluster_dims__(16, 1, 1) __launch_bounds__(1024)
    tkc_select16(const float* scores, int n, int topk, int pos0, int rate, void* out, int ostride, int* cnt,
                 int mode, float* scratch) {
    tkc_body<16>(scores, n, topk, pos0, rate, out, ostride, cnt, mode, scratch);
}

// ---------------------------------------------------------------------------
// LayerNorm over rows of n values (layers.LayerNorm, float32 sums): one block per row.
extern "C" __global__ void dsa_layernorm(float* dst, const float* x, const float* w, const float* b, int n, float eps) {
    pdl_entry();
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* dr = dst + (size_t)blockIdx.x * n;
    float s = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += xr[j];
    float mean = block_sum(s, red) / (float)n;
    float vs = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float d = xr[j] - mean;
        vs += d * d;
    }
    vs = block_sum(vs, red);
    float inv = 1.f / sqrtf(vs / (float)n + eps);
    __syncthreads();  // every thread has read its row before dst (may be x) is written
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float y = __fmul_rn((xr[j] - mean) * inv, w[j]);
        dr[j] = b ? __fadd_rn(y, b[j]) : y;
    }
}

// Sparse attention over each query's selected tokens (sel [rows, K], cnt
// [rows]), one block per (head, query), scores in dynamic shared memory (K
// floats):
//
//	s_t = scale * (qa . A[t] + qb . B[t]),   out = sum_t softmax(s)_t V[t]
//
// qa for (i, h) at qa + i*qaI + h*qaH (la values), A[t] at A + h*aH + t*aT;
// qb at qb + i*qbI + h*qbH (lb values), B[t] at B + t*bT; V[t] at V + h*vH +
// t*vT (lv values); out at out + (i*heads + h)*lv. DSAAttendLatent and
// DSAAttendMLA are both this with different strides.
extern "C" __global__ void dsa_attend(float* out, const float* qa, int qaI, int qaH, const float* A, int aH, int aT,
                                      int la, const float* qb, int qbI, int qbH, const float* B, int bT, int lb,
                                      const float* V, int vH, int vT, int lv, const int* sel, const int* cnt, int K,
                                      int heads, float scale) {
    pdl_entry();
    extern __shared__ float p[];
    __shared__ float red[32];
    int h = blockIdx.x, i = blockIdx.y;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    int n = cnt[i];
    const int* ts = sel + (size_t)i * K;
    const float* qav = qa + (size_t)i * qaI + (size_t)h * qaH;
    const float* qbv = qb + (size_t)i * qbI + (size_t)h * qbH;
    float mx = -INFINITY;
    for (int j = warp; j < n; j += nw) {
        size_t t = (size_t)ts[j];
        const float* a = A + (size_t)h * aH + t * aT;
        const float* bb = B + t * bT;
        float d = 0.f, dr = 0.f;
        for (int x = lane; x < la; x += WARP) d += qav[x] * a[x];
        for (int x = lane; x < lb; x += WARP) dr += qbv[x] * bb[x];
        float s = (warp_sum(d) + warp_sum(dr)) * scale;
        if (lane == 0) p[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, red);
    __syncthreads();
    float sum = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(p[j] - mx);
        p[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red);
    __syncthreads();
    float inv = 1.f / sum;
    for (int j = threadIdx.x; j < n; j += blockDim.x) p[j] *= inv;
    __syncthreads();
    float* o = out + ((size_t)i * heads + h) * lv;
    const float* vh = V + (size_t)h * vH;
    for (int x = threadIdx.x; x < lv; x += blockDim.x) {
        float a = 0.f;
        for (int j = 0; j < n; j++) a += p[j] * vh[(size_t)ts[j] * vT + x];
        o[x] = a;
    }
}

// Element (r, c) of a weight of cols columns in its stored format (0 f32, 1
// bf16, 2 NVFP4 with scales S and the global scale, 3 FP8 E4M3 with float32
// scales S of 128x128 tiles: fp8.cuh).
__device__ __forceinline__ float weight_at(const void* W, const uint8_t* S, float global, int format, size_t r,
                                           int c, int cols) {
    if (format == 0) return ((const float*)W)[r * cols + c];
    if (format == 1) return bf16_to_f32(((const uint16_t*)W)[r * cols + c]);
    if (format == 3)
        return e4m3_to_f32(((const uint8_t*)W)[r * cols + c]) *
               ((const float*)S)[(r / 128) * ((cols + 127) / 128) + c / 128];
    uint8_t b = ((const uint8_t*)W)[r * (cols / 2) + c / 2];
    return kE2M1[(b >> (4 * (c & 1))) & 0xf] * e4m3_to_f32(S[r * (cols / 16) + c / 16]) * global;
}

// MLAAbsorbQuery: qLat[i, h, j] = sum_{c < nope} q[i, h, c] * W[h*per + c, j]
// (W = kv_b_proj, [heads*per, rank]); grid (ceil(rank/block), heads, rows).
// FP8 weights take eight rows at a time, their 24 loads issued before any
// decode: e4m3_to_f32's branches otherwise held each load until the one
// before it had been used, one 32-byte load in flight a warp, which left
// DeepSeek-V3's 128 heads latency-bound. The sum's order is the same.
extern "C" __global__ void mla_absorb(float* qLat, const float* q, const void* W, const uint8_t* S, float global,
                                      int format, int heads, int rank, int nope, int per, int qk) {
    pdl_entry();
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int h = blockIdx.y, i = blockIdx.z;
    if (j >= rank) return;
    const float* qn = q + ((size_t)i * heads + h) * qk;
    float a = 0.f;
    int c = 0;
    if (format == 3) {
        const uint8_t* W8 = (const uint8_t*)W;
        const float* sc = (const float*)S;
        const int tiles = (rank + 127) / 128;
        for (; c + 8 <= nope; c += 8) {
            uint8_t b[8];
            float s[8], xv[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const size_t r = (size_t)h * per + c + u;
                b[u] = W8[r * rank + j];
                s[u] = sc[(r / 128) * tiles + j / 128];
                xv[u] = qn[c + u];
            }
#pragma unroll
            for (int u = 0; u < 8; u++) a = __fadd_rn(a, __fmul_rn(xv[u], e4m3_to_f32(b[u]) * s[u]));
        }
    }
    for (; c < nope; c++) a = __fadd_rn(a, __fmul_rn(qn[c], weight_at(W, S, global, format, (size_t)h * per + c, j, rank)));
    qLat[((size_t)i * heads + h) * rank + j] = a;
}

// MLAExpandOutput: out[i, h, c] = sum_j outLat[i, h, j] * W[h*per + nope + c, j];
// one warp per output value. FP8 weights: eight of a lane's columns at a
// time, their loads issued together (mla_absorb's reason), added in the
// same order.
extern "C" __global__ void mla_expand(float* out, const float* outLat, const void* W, const uint8_t* S, float global,
                                      int format, int rows, int heads, int rank, int nope, int per, int vd) {
    pdl_entry();
    long long o = (long long)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (o >= (long long)rows * heads * vd) return;
    int c = (int)(o % vd);
    long long ih = o / vd;
    int h = (int)(ih % heads);
    const float* ol = outLat + ih * rank;
    size_t r = (size_t)h * per + nope + c;
    float a = 0.f;
    int j = lane;
    if (format == 3) {
        const uint8_t* W8 = (const uint8_t*)W;
        const float* sc = (const float*)S;
        const int tiles = (rank + 127) / 128;
        for (; j + 7 * WARP < rank; j += 8 * WARP) {
            uint8_t b[8];
            float s[8], xv[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                b[u] = W8[r * rank + j + u * WARP];
                s[u] = sc[(r / 128) * tiles + (j + u * WARP) / 128];
                xv[u] = ol[j + u * WARP];
            }
#pragma unroll
            for (int u = 0; u < 8; u++) a += xv[u] * (e4m3_to_f32(b[u]) * s[u]);
        }
    }
    for (; j < rank; j += WARP) a += ol[j] * weight_at(W, S, global, format, r, j, rank);
    a = warp_sum(a);
    if (lane == 0) out[o] = a;
}

// ---------------------------------------------------------------------------
// Sparse latent attention (DSAAttendLatent), flash-decoding style: the
// selected latent + rope rows are read once per group of DSA_G heads instead
// of once per head. Block (split, group, query i) takes the split's slice
// [split*per, split*per + per) of the query's cnt[i] selected tokens, in
// tiles of DSA_TT rows that cp.async copies into shared memory, and keeps
// for its DSA_G heads the running max, the running sum of exp and the
// unnormalized weighted sum of latent rows (online softmax). With one split
// it writes out itself; otherwise it writes those to part and
// dsa_attend_combine merges the splits.
//
// Shapes: la (kv_lora) a multiple of 4 up to 512, lb (rope) a multiple of 4;
// lat, rope 16-byte aligned (dsa.go checks all that). qLat is [rows, heads,
// la]; the rope query of (i, h) at qRope + i*qrI + h*qrH (lb values); out
// [rows, heads, la]. part: [rows, splits, heads, la] partial sums, then
// [rows, splits, heads, 2] (max, sum). 256 threads; dynamic shared memory
// ((DSA_TT + DSA_G) * DS + DSA_TT * DSA_G) floats, DS = dsa_row_stride(la + lb).
#define DSA_G 16
#define DSA_TT 32
#define DSA_THREADS 256
#define DSA_MAX_SPLITS 64

// The online softmax of one head g over a tile of DSA_TT (= WARP) tokens,
// lane t holding token t's score s: its probability goes to *p, the head's
// running max s_m and sum s_l are updated and its rescale factor for the
// earlier sums goes to s_a.
static_assert(DSA_TT == WARP, "dsa_softmax_head: a lane per token");
__device__ __forceinline__ void dsa_softmax_head(float s, float* p, int g, float* s_m, float* s_l, float* s_a, int lane) {
    const float mo = s_m[g], lsum = s_l[g];
    const float mn = fmaxf(mo, warp_max(s));
    const float e = mn == -INFINITY ? 0.f : expf(s - mn);
    const float psum = warp_sum(e);
    *p = e;
    __syncwarp();  // every lane has read s_m[g], s_l[g]
    if (lane == 0) {
        const float a = mn == -INFINITY ? 1.f : expf(mo - mn);
        s_a[g] = a;
        s_l[g] = lsum * a + psum;
        s_m[g] = mn;
    }
}

// The online softmax over a tile's scores P[t * ps + h], which become the
// probabilities: warp w takes heads 2w and 2w + 1.
__device__ __forceinline__ void dsa_softmax_tile(float* P, int ps, float* s_m, float* s_l, float* s_a, int warp, int lane) {
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int g = 2 * warp + u;
        dsa_softmax_head(P[lane * ps + g], P + lane * ps + g, g, s_m, s_l, s_a, lane);
    }
}

extern "C" __global__ void __launch_bounds__(DSA_THREADS, 2)
    dsa_attend_split(float* out, float* part, const float* qLat, const float* qRope, int qrI, int qrH,
                     const float* lat, const float* rope, int la, int lb, const int* sel, const int* cnt, int K,
                     int heads, int per, float scale) {
    pdl_entry();
    extern __shared__ __align__(16) float dsa_sm[];
    __shared__ float s_m[DSA_G], s_l[DSA_G], s_a[DSA_G];
    __shared__ int s_tok[DSA_TT];
    const int D = la + lb, DS = dsa_row_stride(D);
    float* Ks = dsa_sm;                 // [DSA_TT][DS] selected rows: latent | rope
    float* Qs = Ks + DSA_TT * DS;       // [DSA_G][DS] queries: qLat | qRope
    float* Ps = Qs + DSA_G * DS;        // [DSA_TT][DSA_G] scores, then probabilities
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int split = blockIdx.x, nsplit = gridDim.x, hb = blockIdx.y * DSA_G, i = blockIdx.z;
    const int n = cnt[i];
    const int lo = min(split * per, n), hi = min(lo + per, n);
    const int* ts = sel + (size_t)i * K;

    // Queries of the group (zero for heads past the last).
    for (int x = tid; x < DSA_G * D; x += DSA_THREADS) {
        int g = x / D, d = x - g * D, h = hb + g;
        float v = 0.f;
        if (h < heads) v = d < la ? qLat[((size_t)i * heads + h) * la + d] : qRope[(size_t)i * qrI + (size_t)h * qrH + (d - la)];
        Qs[g * DS + d] = v;
    }
    if (tid < DSA_G) {
        s_m[tid] = -INFINITY;
        s_l[tid] = 0.f;
        s_a[tid] = 1.f;
    }

    // Score mapping: warp (wh, wt), lane (hs, tsub): heads g0 and g0 + 4, token tt.
    const int g0 = (warp & 1) * 8 + (lane & 3), tt = (warp >> 1) * 8 + (lane >> 2);
    // Output mapping: heads 4*hq .. 4*hq+3, columns 4*cq .. +3 and 256 + 4*cq .. +3.
    const int hq = tid / 64, cq = tid % 64;
    const bool c0ok = 4 * cq < la, c1ok = 256 + 4 * cq < la;
    float acc[4][8];
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int c = 0; c < 8; c++) acc[r][c] = 0.f;

    const int q4 = D / 4, la4 = la / 4;
    for (int t0 = lo; t0 < hi; t0 += DSA_TT) {
        const int nt = min(DSA_TT, hi - t0);
        if (tid < nt) s_tok[tid] = ts[t0 + tid];
        __syncthreads();  // s_tok (and, the first time, Qs and the stats) visible
        for (int x = tid; x < nt * q4; x += DSA_THREADS) {
            int r = x / q4, c = x - r * q4;
            size_t t = (size_t)s_tok[r];
            const float* src = c < la4 ? lat + t * la + 4 * c : rope + t * lb + 4 * (c - la4);
            cp_async16(smem_u32(Ks + r * DS + 4 * c), src);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();  // the tile is in Ks

        // Scores of heads g0, g0 + 4 against token tt (rows past nt hold stale data: masked).
        {
            const float* qa = Qs + g0 * DS;
            const float* qb = Qs + (g0 + 4) * DS;
            const float* kr = Ks + tt * DS;
            float s0 = 0.f, s1 = 0.f;
#pragma unroll 4
            for (int d = 0; d < D; d += 4) {
                float4 k = *(const float4*)(kr + d);
                float4 a = *(const float4*)(qa + d);
                float4 b = *(const float4*)(qb + d);
                s0 = fmaf(a.x, k.x, s0);
                s0 = fmaf(a.y, k.y, s0);
                s0 = fmaf(a.z, k.z, s0);
                s0 = fmaf(a.w, k.w, s0);
                s1 = fmaf(b.x, k.x, s1);
                s1 = fmaf(b.y, k.y, s1);
                s1 = fmaf(b.z, k.z, s1);
                s1 = fmaf(b.w, k.w, s1);
            }
            bool ok = tt < nt;
            Ps[tt * DSA_G + g0] = ok && hb + g0 < heads ? s0 * scale : -INFINITY;
            Ps[tt * DSA_G + g0 + 4] = ok && hb + g0 + 4 < heads ? s1 * scale : -INFINITY;
        }
        __syncthreads();  // all scores in Ps

        dsa_softmax_tile(Ps, DSA_G, s_m, s_l, s_a, warp, lane);
        __syncthreads();  // probabilities in Ps, rescale factors in s_a

        // Weighted latent rows: acc[r][.] for head 4*hq + r.
        {
            float a0 = s_a[4 * hq], a1 = s_a[4 * hq + 1], a2 = s_a[4 * hq + 2], a3 = s_a[4 * hq + 3];
#pragma unroll
            for (int c = 0; c < 8; c++) {
                acc[0][c] *= a0;
                acc[1][c] *= a1;
                acc[2][c] *= a2;
                acc[3][c] *= a3;
            }
            const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int t = 0; t < nt; t++) {
                float4 p = *(const float4*)(Ps + t * DSA_G + 4 * hq);
                const float* kr = Ks + t * DS;
                float4 v0 = c0ok ? *(const float4*)(kr + 4 * cq) : zero;
                float4 v1 = c1ok ? *(const float4*)(kr + 256 + 4 * cq) : zero;
                float pr[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    acc[r][0] = fmaf(pr[r], v0.x, acc[r][0]);
                    acc[r][1] = fmaf(pr[r], v0.y, acc[r][1]);
                    acc[r][2] = fmaf(pr[r], v0.z, acc[r][2]);
                    acc[r][3] = fmaf(pr[r], v0.w, acc[r][3]);
                    acc[r][4] = fmaf(pr[r], v1.x, acc[r][4]);
                    acc[r][5] = fmaf(pr[r], v1.y, acc[r][5]);
                    acc[r][6] = fmaf(pr[r], v1.z, acc[r][6]);
                    acc[r][7] = fmaf(pr[r], v1.w, acc[r][7]);
                }
            }
        }
        __syncthreads();  // Ks, Ps, s_tok free for the next tile
    }
    if (hi <= lo) __syncthreads();  // no tile: the stats' initial values visible

#pragma unroll
    for (int r = 0; r < 4; r++) {
        int g = 4 * hq + r, h = hb + g;
        if (h >= heads) continue;
        float* o;
        float f = 1.f;
        if (nsplit == 1) {
            float l = s_l[g];
            f = l > 0.f ? 1.f / l : 0.f;
            o = out + ((size_t)i * heads + h) * la;
        } else {
            o = part + (((size_t)i * nsplit + split) * heads + h) * la;
        }
        if (c0ok) *(float4*)(o + 4 * cq) = make_float4(acc[r][0] * f, acc[r][1] * f, acc[r][2] * f, acc[r][3] * f);
        if (c1ok) *(float4*)(o + 256 + 4 * cq) = make_float4(acc[r][4] * f, acc[r][5] * f, acc[r][6] * f, acc[r][7] * f);
    }
    if (nsplit > 1 && tid < DSA_G && hb + tid < heads) {
        float* ml = part + (size_t)gridDim.z * nsplit * heads * la + (((size_t)i * nsplit + split) * heads + hb + tid) * 2;
        ml[0] = s_m[tid];
        ml[1] = s_l[tid];
    }
}

// dsa_attend_mma is dsa_attend_split on the tensor cores, for la a multiple
// of 64, lb of 8 and la + lb <= 576 (dsa.go checks), and v4_attention_mma is
// DeepSeek-V4's attention on the same body (attend_mma over a row source:
// rows of la + lb floats from two addresses, or masked): the same blocks,
// splits, online softmax and outputs (part's layout too), with both products as mma
// m16n8k8 in tf32 at float32 accuracy (x = hi + lo, both tf32: a·b = a_lo·b_hi
// + a_hi·b_lo + a_hi·b_hi, as mhc_proj_part does) and the next tile's rows
// copied while this one is worked on.
//
// NW = 8 or 16 warps (16 where la is a multiple of 128: twice the warps to
// hide the mma chains' latencies, half the registers each). Scores S[16
// heads][32 tokens] = Q·K^T: warp w takes the k8 steps [w*KW, w*KW + KW) of
// the D = la + lb columns for all four 8-token n-tiles, its Q fragments
// loaded once (hi and lo in registers for the whole selection); lane (g, t)
// uses the pair of columns 8k + 2t, 8k + 2t + 1 as the fragment's logical
// columns t and t + 4 (Q and K alike, so each dot product still covers every
// column once). The warps' partial sums are added in warp order through
// shared memory by the warp that then runs the online softmax of that head.
// Output O[16][la] += P·V: warp w takes columns [w*la/NW, (w+1)*la/NW) in
// 8-column n-tiles, the 32 tokens in four k8 steps. Three barriers a tile:
// tile arrived (the one before done with), partials written, probabilities
// written; the next tile's copy starts after the first. Rows past a tile's last selected token repeat that token
// (finite values behind probabilities of zero). Row stride DS = D rounded up
// to 32, plus 8 floats: the fragment loads (rows g, columns 2t or t) fall in
// distinct banks.
#define DSA_MKMAX 9  // k8 steps per warp: D <= 8 * 8 * 9 = 576
#define DSA_RS 40    // a head's row of 32 partial scores, padded
#define DSA_PS 24    // a token's row of 16 probabilities, padded

__host__ __device__ __forceinline__ int dsa_mma_stride(int d) { return ((d + 31) & ~31) + 8; }

template <typename Rows, int NW>
__device__ __forceinline__ void attend_mma(const Rows& rows, float* out, float* part, const float* qLat,
                                           const float* qRope, int qrI, int qrH, int la, int lb, int heads, int per,
                                           float scale, const float* sinks) {
    static_assert(NW == 8 || NW == 16, "attend_mma: 8 or 16 warps");
    constexpr int NT = NW * WARP, TPR = NT / DSA_TT;   // threads, threads per copied row
    constexpr int MK = (DSA_MKMAX * 8 + NW - 1) / NW;  // k8 steps per warp at most
    constexpr int OJ = 64 / NW;                        // output n-tiles per warp at most (la <= 512)
    extern __shared__ __align__(16) float dsa_sm[];
    __shared__ float s_m[DSA_G], s_l[DSA_G], s_a[DSA_G];
    __shared__ bool s_ok[2][DSA_TT];
    // The merge of the splits (dsa_attend_combine, launched with
    // programmatic serialization) may start now: it waits for this grid.
    pdl_launch();
    const int D = la + lb, DS = dsa_mma_stride(D), KW = (D / 8 + NW - 1) / NW;
    float* Ks = dsa_sm;                        // [2][DSA_TT][DS] selected rows: latent | rope
    float* red = Ks + 2 * DSA_TT * DS;         // [NW warps][DSA_G][DSA_RS] partial scores
    float* Ps = red + NW * DSA_G * DSA_RS;     // [DSA_TT][DSA_PS] scores, then probabilities
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, g = lane >> 2, t = lane & 3;
    const int split = blockIdx.x, nsplit = gridDim.x, hb = blockIdx.y * DSA_G, i = blockIdx.z;
    const int q4 = D / 4, la4 = la / 4;
    int n = 0, lo = 0, hi = 0;  // this split's rows [lo, hi) of the n selected, after the wait below

    // This thread's row of the tile from token t0 (rows past hi repeat hi -
    // 1): its addresses, found one tile before its copy so that their loads
    // (a token id, an index) are in flight while a tile is worked on.
    struct RowRef {
        const float *a, *b;
        bool ok;
    };
    auto fetch = [&](int t0) {
        RowRef f;
        const int r = tid / TPR;
        f.ok = rows.row(i, min(t0 + r, hi - 1), f.a, f.b) && t0 + r < hi;
        return f;
    };
    // The copy of the tile into buffer b, TPR threads per row; one commit group.
    auto issue = [&](const RowRef& f, int b) {
        const int r = tid / TPR;
        if (tid % TPR == 0) s_ok[b][r] = f.ok;
        float* d = Ks + (b * DSA_TT + r) * DS;
        for (int c = tid % TPR; c < q4; c += TPR) cp_async16(smem_u32(d + 4 * c), c < la4 ? f.a + 4 * c : f.b + 4 * (c - la4));
        cp_async_commit();
    };
    RowRef next{};  // the rows of the tile after the one being copied
    // This split's rows of the selection, the copy of its first tile and the
    // addresses of the second. Rows::warm starts the load of this thread's
    // first token while the count is read.
    auto start = [&]() {
        rows.warm(i, split * per + tid / TPR);
        n = rows.count(i);
        lo = min(split * per, n), hi = min(lo + per, n);
        if (lo < hi) issue(fetch(lo), 0);
        if (lo + DSA_TT < hi) next = fetch(lo + DSA_TT);
    };
    if constexpr (!Rows::kOverlap) start();
    if (tid < DSA_G) {  // the sinks count once: in split 0
        const bool sink = sinks != nullptr && split == 0 && hb + tid < heads;
        s_m[tid] = sink ? sinks[hb + tid] : -INFINITY;
        s_l[tid] = sink ? 1.f : 0.f;
        s_a[tid] = 1.f;
    }

    // The group's queries (zero past the last head) into buffer 1, four
    // loads in flight per thread before their stores; then this warp's Q
    // fragments from there: rows g and g + 8, columns 8k + 2t and 8k + 2t + 1
    // (zero past D), hi and lo parts kept for the whole selection. With
    // Rows::kOverlap the queries are older than the kernel before this one (a
    // top-k, when dsa.go launches this one with programmatic serialization)
    // and this runs before the wait for it; otherwise the first tile's rows
    // are already on their way.
    {
        float* qs = Ks + DSA_TT * DS;
        for (int x0 = 0; x0 < DSA_G * la4; x0 += 4 * NT) {
            float4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int x = x0 + tid + j * NT, hh = x / la4, c = x - hh * la4;
                v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (x < DSA_G * la4 && hb + hh < heads)
                    v[j] = *reinterpret_cast<const float4*>(qLat + ((size_t)i * heads + hb + hh) * la + 4 * c);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int x = x0 + tid + j * NT, hh = x / la4, c = x - hh * la4;
                if (x < DSA_G * la4) *reinterpret_cast<float4*>(qs + hh * DS + 4 * c) = v[j];
            }
        }
        for (int x0 = 0; x0 < DSA_G * lb; x0 += 4 * NT) {
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int x = x0 + tid + j * NT, hh = x / max(lb, 1), c = x - hh * lb;
                v[j] = x < DSA_G * lb && hb + hh < heads ? qRope[(size_t)i * qrI + (size_t)(hb + hh) * qrH + c] : 0.f;
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int x = x0 + tid + j * NT, hh = x / max(lb, 1), c = x - hh * lb;
                if (x < DSA_G * lb) qs[hh * DS + la + c] = v[j];
            }
        }
    }
    __syncthreads();
    uint32_t qh[MK][4], ql[MK][4];
#pragma unroll
    for (int s = 0; s < MK; s++) {
        const int d = 8 * (warp * KW + s) + 2 * t;
        float2 va = make_float2(0.f, 0.f), vb = va;  // rows g and g + 8 at (d, d + 1)
        if (s < KW && d < D) {
            va = *reinterpret_cast<const float2*>(Ks + (DSA_TT + g) * DS + d);
            vb = *reinterpret_cast<const float2*>(Ks + (DSA_TT + g + 8) * DS + d);
        }
        tf32_split(va.x, qh[s][0], ql[s][0]);
        tf32_split(vb.x, qh[s][1], ql[s][1]);
        tf32_split(va.y, qh[s][2], ql[s][2]);
        tf32_split(vb.y, qh[s][3], ql[s][3]);
    }
    __syncthreads();  // buffer 1 free for the copies

    if constexpr (Rows::kOverlap) {
        pdl_wait();  // the selection is the previous kernel's output
        start();
    }

    const int ntw = la / (8 * NW), c0 = warp * (la / NW);  // output n-tiles and first column of this warp
    float o[OJ][4];
#pragma unroll
    for (int j = 0; j < OJ; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

    int b = 0;
    for (int t0 = lo; t0 < hi; t0 += DSA_TT, b ^= 1) {
        const int nt = min(DSA_TT, hi - t0);
        cp_async_wait<0>();
        // Tile b in Ks (and, the first time, the stats); every warp is done
        // with the tile before, so buffer b^1, red and Ps are free.
        __syncthreads();
        if (t0 + DSA_TT < hi) {
            issue(next, b ^ 1);
            if (t0 + 2 * DSA_TT < hi) next = fetch(t0 + 2 * DSA_TT);
        }

        // Partial scores over this warp's columns, four 8-token n-tiles: per
        // k8 step the small products of every n-tile, then the large ones,
        // so that no mma waits on the one just before it.
        const float* kb = Ks + b * DSA_TT * DS;
        float sc[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
        for (int s = 0; s < MK; s++) {
            const int k8 = warp * KW + s;
            if (s < KW && 8 * k8 < D) dsa_qk_step(sc, kb + g * DS + 8 * k8 + 2 * t, DS, qh[s], ql[s]);
        }
        float* rw = red + warp * DSA_G * DSA_RS;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            *reinterpret_cast<float2*>(rw + g * DSA_RS + j * 8 + 2 * t) = make_float2(sc[j][0], sc[j][1]);
            *reinterpret_cast<float2*>(rw + (g + 8) * DSA_RS + j * 8 + 2 * t) = make_float2(sc[j][2], sc[j][3]);
        }
        __syncthreads();  // every warp's partials in red
        // Warp w's heads (DSA_G / NW of them), lane tt its token: the warps'
        // partial sums added in warp order and scaled, then the online softmax.
#pragma unroll
        for (int u = 0; u < DSA_G / NW; u++) {
            const int hh = warp * (DSA_G / NW) + u, tt = lane;
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < NW; w++) v += red[(w * DSA_G + hh) * DSA_RS + tt];
            dsa_softmax_head(tt < nt && s_ok[b][tt] && hb + hh < heads ? v * scale : -INFINITY, Ps + tt * DSA_PS + hh,
                             hh, s_m, s_l, s_a, lane);
        }
        __syncthreads();  // probabilities in Ps, rescale factors in s_a

        // O = O * alpha + P·V over this warp's columns.
        {
            const float a0 = s_a[g], a1 = s_a[g + 8];
#pragma unroll
            for (int j = 0; j < OJ; j++) o[j][0] *= a0, o[j][1] *= a0, o[j][2] *= a1, o[j][3] *= a1;
#pragma unroll
            for (int ks = 0; ks < DSA_TT / 8; ks++) {
                uint32_t ph[4], pl[4];
                tf32_split(Ps[(ks * 8 + t) * DSA_PS + g], ph[0], pl[0]);
                tf32_split(Ps[(ks * 8 + t) * DSA_PS + g + 8], ph[1], pl[1]);
                tf32_split(Ps[(ks * 8 + t + 4) * DSA_PS + g], ph[2], pl[2]);
                tf32_split(Ps[(ks * 8 + t + 4) * DSA_PS + g + 8], ph[3], pl[3]);
                const float* vr = kb + (ks * 8 + t) * DS + c0 + g;
                uint32_t bh[OJ][2], bl[OJ][2];
#pragma unroll
                for (int j = 0; j < OJ; j++) {
                    if (j < ntw) {
                        tf32_split(vr[j * 8], bh[j][0], bl[j][0]);
                        tf32_split(vr[4 * DS + j * 8], bh[j][1], bl[j][1]);
                    }
                }
#pragma unroll
                for (int j = 0; j < OJ; j++)
                    if (j < ntw) mhc_mma_tf32(o[j], pl[0], pl[1], pl[2], pl[3], bh[j][0], bh[j][1]);
#pragma unroll
                for (int j = 0; j < OJ; j++)
                    if (j < ntw) mhc_mma_tf32(o[j], ph[0], ph[1], ph[2], ph[3], bl[j][0], bl[j][1]);
#pragma unroll
                for (int j = 0; j < OJ; j++)
                    if (j < ntw) mhc_mma_tf32(o[j], ph[0], ph[1], ph[2], ph[3], bh[j][0], bh[j][1]);
            }
        }
    }

    // Lane (g, t) holds O[g][c0 + 8j + 2t, +1] and O[g + 8][...].
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int hh = g + 8 * r, h = hb + hh;
        if (h >= heads) continue;
        float f = 1.f;
        float* od;
        if (nsplit == 1) {
            const float l = s_l[hh];
            f = l > 0.f ? 1.f / l : 0.f;
            od = out + ((size_t)i * heads + h) * la;
        } else {
            od = part + (((size_t)i * nsplit + split) * heads + h) * la;
        }
#pragma unroll
        for (int j = 0; j < OJ; j++)
            if (j < ntw)
                *reinterpret_cast<float2*>(od + c0 + 8 * j + 2 * t) = make_float2(o[j][2 * r] * f, o[j][2 * r + 1] * f);
    }
    if (nsplit > 1 && tid < DSA_G && hb + tid < heads) {
        float* ml = part + (size_t)gridDim.z * nsplit * heads * la + (((size_t)i * nsplit + split) * heads + hb + tid) * 2;
        ml[0] = s_m[tid];
        ml[1] = s_l[tid];
    }
}

// DSA's rows: selected token sel[i, t] of the latent and rope caches.
struct DsaRows {
    static constexpr bool kOverlap = true;  // may be launched after a top-k: stages the query before its wait
    const float *lat, *rope;
    const int *sel, *cnt;
    int K, la, lb;
    // warm brings token t's id toward the SM (a hint; t may be past the count).
    __device__ void warm(int i, int t) const {
        if (t < K) asm volatile("prefetch.global.L1 [%0];" ::"l"(sel + (size_t)i * K + t));
    }
    __device__ int count(int i) const { return cnt[i]; }
    __device__ bool row(int i, int t, const float*& a, const float*& b) const {
        const size_t tok = (size_t)__ldg(sel + (size_t)i * K + t);
        a = lat + tok * la;
        b = rope + tok * lb;
        return true;
    }
};

extern "C" __global__ void __launch_bounds__(DSA_THREADS, 1)
    dsa_attend_mma(float* out, float* part, const float* qLat, const float* qRope, int qrI, int qrH, const float* lat,
                   const float* rope, int la, int lb, const int* sel, const int* cnt, int K, int heads, int per,
                   float scale) {
    attend_mma<DsaRows, 8>(DsaRows{lat, rope, sel, cnt, K, la, lb}, out, part, qLat, qRope, qrI, qrH, la, lb, heads,
                           per, scale, nullptr);
}
// The same with 16 warps (la a multiple of 128): twice the warps per
// multiprocessor to hide the mma chains' and shared loads' latencies.
extern "C" __global__ void __launch_bounds__(2 * DSA_THREADS, 1)
    dsa_attend_mma16(float* out, float* part, const float* qLat, const float* qRope, int qrI, int qrH,
                     const float* lat, const float* rope, int la, int lb, const int* sel, const int* cnt, int K,
                     int heads, int per, float scale) {
    attend_mma<DsaRows, 16>(DsaRows{lat, rope, sel, cnt, K, la, lb}, out, part, qLat, qRope, qrI, qrH, la, lb, heads,
                            per, scale, nullptr);
}

// DeepSeek-V4's rows (dsv4.GatherKeys' order, v4_row): the query's window of
// local rows, then its selected compressed entries (-1 slots masked) or all
// the visible ones. Keys are the values; the sinks start each head's sum.
struct V4Rows {
    static constexpr bool kOverlap = false;  // launched plainly: its first rows are copied during the query's staging
    const float *local, *comp, *idx;
    int pos0, lo, window, rate, topk, entries, dim;
    __device__ void warm(int, int) const {}
    __device__ int nloc(int i) const {
        const int p = pos0 + i;
        return p - max(lo, p - window + 1) + 1;
    }
    __device__ int count(int i) const {
        const int p = pos0 + i;
        return nloc(i) + (topk > 0 ? topk : (rate > 0 ? min((p + 1) / rate, entries) : 0));
    }
    __device__ bool row(int i, int t, const float*& a, const float*& b) const {
        const int p = pos0 + i;
        const float* r = v4_row(t, nloc(i), local, max(lo, p - window + 1), lo, comp,
                                topk > 0 ? idx + (size_t)i * topk : nullptr, topk, dim);
        a = b = r ? r : local;  // a -1 slot: a readable row, masked
        return r != nullptr;
    }
};

extern "C" __global__ void __launch_bounds__(DSA_THREADS, 1)
    v4_attention_mma(float* out, float* part, const float* q, const float* local, const float* comp, const float* idx,
                     const float* sinks, int heads, int dim, int pos0, int lo, int window, int rate, int topk,
                     int entries, int per, float scale) {
    attend_mma<V4Rows, 8>(V4Rows{local, comp, idx, pos0, lo, window, rate, topk, entries, dim}, out, part, q, q, 0, 0,
                          dim, 0, heads, per, scale, sinks);
}
extern "C" __global__ void __launch_bounds__(2 * DSA_THREADS, 1)
    v4_attention_mma16(float* out, float* part, const float* q, const float* local, const float* comp, const float* idx,
                       const float* sinks, int heads, int dim, int pos0, int lo, int window, int rate, int topk,
                       int entries, int per, float scale) {
    attend_mma<V4Rows, 16>(V4Rows{local, comp, idx, pos0, lo, window, rate, topk, entries, dim}, out, part, q, q, 0,
                           0, dim, 0, heads, per, scale, sinks);
}

// dsa_attend_combine merges dsa_attend_split's (or dsa_attend_mma's) splits:
// out = sum_s w_s O_s / sum_s w_s l_s, w_s = exp(m_s - max m). Grid (heads,
// rows), 128 threads, thread x taking columns [4x, 4x + 4) (la % 4 == 0,
// la <= 512); the first DSA_CPRE splits' partials are loaded before the
// weights are known, the sums over splits in split order. It touches
// memory only after pdl_wait, so it may be launched early.
#define DSA_CPRE 16
extern "C" __global__ void dsa_attend_combine(float* out, const float* part, int rows, int heads, int la, int nsplit) {
    __shared__ float w[DSA_MAX_SPLITS];
    __shared__ float s_inv;
    pdl_wait();
    const int h = blockIdx.x, i = blockIdx.y, tid = threadIdx.x, x = 4 * tid;
    const float* ml = part + (size_t)rows * nsplit * heads * la + ((size_t)i * nsplit * heads + h) * 2;
    const size_t stride = (size_t)heads * la;  // from one split's rows to the next
    const float* ph = part + ((size_t)i * nsplit * heads + h) * la + x;
    const bool col = x < la;
    float4 v[DSA_CPRE];
#pragma unroll
    for (int u = 0; u < DSA_CPRE; u++)
        v[u] = col && u < nsplit ? __ldcg(reinterpret_cast<const float4*>(ph + u * stride)) : make_float4(0.f, 0.f, 0.f, 0.f);
    if (tid < WARP) {
        constexpr int U = DSA_MAX_SPLITS / WARP;
        float mv[U], lv[U];
        float M = -INFINITY;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int s = tid + u * WARP;
            mv[u] = s < nsplit ? ml[(size_t)s * heads * 2] : -INFINITY;
            lv[u] = s < nsplit ? ml[(size_t)s * heads * 2 + 1] : 0.f;
            M = fmaxf(M, mv[u]);
        }
        M = warp_max(M);
        float L = 0.f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int s = tid + u * WARP;
            const float ws = mv[u] == -INFINITY ? 0.f : expf(mv[u] - M);
            if (s < nsplit) w[s] = ws;
            L += ws * lv[u];
        }
        L = warp_sum(L);
        if (tid == 0) s_inv = L > 0.f ? 1.f / L : 0.f;
    }
    __syncthreads();
    if (!col) return;
    const float inv = s_inv;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    auto add = [&](float ws, float4 q) {
        if (ws != 0.f) {  // an empty split's partials are not added
            a.x = fmaf(ws, q.x, a.x);
            a.y = fmaf(ws, q.y, a.y);
            a.z = fmaf(ws, q.z, a.z);
            a.w = fmaf(ws, q.w, a.w);
        }
    };
#pragma unroll
    for (int u = 0; u < DSA_CPRE; u++)
        if (u < nsplit) add(w[u], v[u]);
    for (int s = DSA_CPRE; s < nsplit; s++) add(w[s], __ldcg(reinterpret_cast<const float4*>(ph + s * stride)));
    *reinterpret_cast<float4*>(out + ((size_t)i * heads + h) * la + x) = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
}
