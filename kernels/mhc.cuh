// Hyper-connections (layers/mhc, mhc.Ops): the steps of seed 000's split,
// each a plain kernel (correctness first; fusing comes later). The float32
// operations follow the reference's order, with __fmul_rn/__fadd_rn where
// the compiler would otherwise contract into FMAs the reference does not do,
// and exp/sigmoid in double rounded once, as the Go reference computes them.

#define MHC_MAXN 16  // most streams the Sinkhorn and post kernels take (mhc.go checks)

// mhc.Sigmoid: 1/(1+exp(-x)) in double, rounded to float32.
__device__ __forceinline__ float mhc_sigmoid(float x) {
    if (x >= 0.f) return (float)(1.0 / (1.0 + exp(-(double)x)));
    double e = exp((double)x);
    return (float)(e / (1.0 + e));
}

// The projection's row scale: logits[r, :mix] *= 1/sqrt(mean(x[r, :width]^2) + eps).
// One block per row; the projection itself is a MatMul before it.
extern "C" __global__ void mhc_rowscale(float* logits, const float* x, int width, int mix, float eps) {
    pdl_entry();
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * width;
    float ss = 0.f;
    for (int j = threadIdx.x; j < width; j += blockDim.x) ss += xr[j] * xr[j];
    ss = block_sum(ss, red);
    float inv = 1.f / sqrtf(ss / (float)width + eps);
    float* l = logits + (size_t)blockIdx.x * mix;
    for (int j = threadIdx.x; j < mix; j += blockDim.x) l[j] *= inv;
}

// k-th permutation of 0..n-1 in lexicographic order (mhc.Permutations'
// order) into p, by the factorial number system.
__device__ void mhc_perm(int k, int n, int* p) {
    int f = 1;
    for (int i = 2; i < n; i++) f *= i;  // (n-1)!
    unsigned used = 0;
    for (int pos = 0; pos < n; pos++) {
        int d = f > 0 ? k / f : 0;
        if (f > 0) k %= f;
        for (int v = 0; v < n; v++) {
            if (used & (1u << v)) continue;
            if (d-- == 0) {
                p[pos] = v;
                used |= 1u << v;
                break;
            }
        }
        if (n - 1 - pos > 0) f /= (n - 1 - pos);
    }
}

// Sinkhorn-Knopp of mhc_activate_row below for a compile-time n, in
// registers (the general loop works in place in global memory, a dependent
// round trip per step): the same operations in the same order.
template <int N>
__device__ __forceinline__ void mhc_sinkhorn_reg(float* h, const float* z, int iters, float eps) {
    float m[N * N];
#pragma unroll
    for (int i = 0; i < N * N; i++) m[i] = z[i];
#pragma unroll
    for (int i = 0; i < N; i++) {
        float mx = m[i * N];
#pragma unroll
        for (int j = 1; j < N; j++) mx = fmaxf(mx, m[i * N + j]);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < N; j++) {
            float e = (float)exp((double)(m[i * N + j] - mx));
            m[i * N + j] = e;
            s += e;
        }
#pragma unroll
        for (int j = 0; j < N; j++) m[i * N + j] = __fadd_rn(m[i * N + j] / s, eps);
    }
    for (int it = 0; it < max(iters, 1); it++) {
        if (it > 0) {
#pragma unroll
            for (int i = 0; i < N; i++) {
                float s = 0.f;
#pragma unroll
                for (int j = 0; j < N; j++) s += m[i * N + j];
                s += eps;
#pragma unroll
                for (int j = 0; j < N; j++) m[i * N + j] /= s;
            }
        }
#pragma unroll
        for (int j = 0; j < N; j++) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < N; i++) s += m[i * N + j];
            s += eps;
#pragma unroll
            for (int i = 0; i < N; i++) m[i * N + j] /= s;
        }
    }
#pragma unroll
    for (int i = 0; i < N * N; i++) h[i] = m[i];
}

// Mixer.Activate of row r: pre/post sigmoids, then Sinkhorn-Knopp (lite ==
// 0) on res in place or mHC-lite's convex combination of the nz = n!
// permutation matrices. l is the row's logits [2n + nz], overwritten like the
// reference's.
__device__ void mhc_activate_row(float* pre, float* post, float* res, float* l, const float* base,
                                 const float* scale, int r, int n, int iters, float eps, int lite, int nz) {
    float s0 = scale[0], s1 = scale[1], s2 = scale[2];
    for (int i = 0; i < n; i++) {
        pre[(size_t)r * n + i] = __fadd_rn(mhc_sigmoid(__fadd_rn(__fmul_rn(l[i], s0), base[i])), eps);
        post[(size_t)r * n + i] = 2.f * mhc_sigmoid(__fadd_rn(__fmul_rn(l[n + i], s1), base[n + i]));
    }
    float* z = l + 2 * n;
    for (int i = 0; i < nz; i++) z[i] = __fadd_rn(__fmul_rn(z[i], s2), base[2 * n + i]);
    float* h = res + (size_t)r * n * n;
    if (lite) {
        float mx = z[0];
        for (int k = 1; k < nz; k++) mx = fmaxf(mx, z[k]);
        float s = 0.f;
        for (int k = 0; k < nz; k++) {
            float e = (float)exp((double)(z[k] - mx));
            z[k] = e;
            s += e;
        }
        for (int k = 0; k < nz; k++) z[k] /= s;
        for (int i = 0; i < n * n; i++) h[i] = 0.f;
        int p[MHC_MAXN];
        for (int k = 0; k < nz; k++) {
            mhc_perm(k, n, p);
            for (int i = 0; i < n; i++) h[i * n + p[i]] += z[k];
        }
        return;
    }
    if (n == 4) {
        mhc_sinkhorn_reg<4>(h, z, iters, eps);
        return;
    }
    if (n == 3) {
        mhc_sinkhorn_reg<3>(h, z, iters, eps);
        return;
    }
    for (int i = 0; i < n * n; i++) h[i] = z[i];
    for (int i = 0; i < n; i++) {
        float* row = h + i * n;
        float mx = row[0];
        for (int j = 1; j < n; j++) mx = fmaxf(mx, row[j]);
        float s = 0.f;
        for (int j = 0; j < n; j++) {
            float e = (float)exp((double)(row[j] - mx));
            row[j] = e;
            s += e;
        }
        for (int j = 0; j < n; j++) row[j] = __fadd_rn(row[j] / s, eps);
    }
    for (int it = 0; it < max(iters, 1); it++) {  // the first column pass always runs
        if (it > 0) {  // rows
            for (int i = 0; i < n; i++) {
                float s = 0.f;
                for (int j = 0; j < n; j++) s += h[i * n + j];
                s += eps;
                for (int j = 0; j < n; j++) h[i * n + j] /= s;
            }
        }
        for (int j = 0; j < n; j++) {  // columns
            float s = 0.f;
            for (int i = 0; i < n; i++) s += h[i * n + j];
            s += eps;
            for (int i = 0; i < n; i++) h[i * n + j] /= s;
        }
    }
}

// Mixer.Activate, one thread per row; logits [rows, 2n + nz] is overwritten.
extern "C" __global__ void mhc_activate(float* pre, float* post, float* res, float* logits, const float* base,
                                        const float* scale, int rows, int n, int iters, float eps, int lite, int nz) {
    pdl_entry();
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    mhc_activate_row(pre, post, res, logits + (size_t)r * (2 * n + nz), base, scale, r, n, iters, eps, lite, nz);
}

// ---------------------------------------------------------------------------
// Fused projection (MHCProject): per token the sum of squares of its n*C
// stream row and the mix dot products with fn [mix, K = n*C], in one pass
// over the stream, then the row scale.
//
// mhc_proj_part_*: grid (slices, ty), MHC_PTHREADS threads = 8 warps as
// wt token groups x (8 / wt) K groups. Block (s, y) takes the K slice
// [s*ks, s*ks + ks) and the tiles of 16*wt tokens y, y + ty, ... (one tile
// unless wt = 8; mhc.go sizes the grid as one wave): it copies fn[:, slice]
// into shared memory once (rows padded to a multiple of 8 with zeros, row
// stride ks + 16 so the fragment loads are free of bank conflicts), then
// each warp runs 16 tokens of each tile over every (8 / wt)-th 32-wide
// chunk of the slice on the tensor cores (mma m16n8k8 tf32). x comes
// through the warp's ring of chunks in shared memory (cp.async, three
// chunks in flight, staged before the weights so the first copies overlap them;
// measured: 440 us for x loaded into registers a chunk ahead, docs/
// PERFORMANCE.md round 10); lane (g = lane/4, t = lane%4) takes
// x[row g and g+8][c + 4t .. +3] and [c + 16 + 4t .. +3] from it as its A
// fragments, and the k8 step s uses the pair at (s/2)*16 + 4t + 2(s%2) as the fragment's
// logical columns t and t+4; the B fragments take fn at the same physical
// columns, so each dot product still covers every column once. Float32
// accuracy from tf32 operands: x = hi + lo (both tf32), x·w = hi·w + lo·w
// (+ hi·w_lo for f32 weights; bf16 weights are exact in tf32), and each
// chunk's mma sums (32 columns) are added into float32 accumulators on the
// CUDA cores. The partial sums go to part [slices, rows, mix + 1] (column mix:
// the sum of squares); mhc_proj_finish adds the slices.
// ks is a multiple of 64 (mhc.go); mix <= 8*MHC_PMAXNT.
#define MHC_PTHREADS 256
#define MHC_PWARPS (MHC_PTHREADS / WARP)
#define MHC_PMAXNT 4  // 8-wide output tiles: mix <= 32 (mhc.go checks)

// The rest of MHCCoeffsPre for a few tokens, run by mhc_proj_part's last
// block to finish (ticket non-null; mhc.go): the slices' sums (as
// mhc_proj_finish), the activation (as mhc_activate16, n <= 4) and pre (as
// mhc_pre4), each step's operations those of its kernel, in the same order.
// The other blocks leave after taking their ticket; the last resets it.
struct MhcTail {
    unsigned* ticket;
    float *logits, *pre, *post, *res, *dst;
    const float *base, *scale;
    int n, hidden, iters;
    float eps, normEps;
};
__device__ void mhc_coeffs_tail(const float* part, const float* x, int rows, int K, int mix, int S, const MhcTail& t);

// v as tf32 hi and lo parts: hi is v truncated to tf32 (one mask: a
// rounding cvt costs four instructions), lo = v - hi exactly in float32,
// passed as is (the tensor cores read a tf32 operand's top 19 bits, so lo is
// truncated there): |v - hi - lo| < 2^-10 |lo| < 2^-20 |v|. Finite v only.
__device__ __forceinline__ void tf32_split(float v, uint32_t& hi, uint32_t& lo) {
    hi = __float_as_uint(v) & 0xffffe000u;
    lo = __float_as_uint(v - __uint_as_float(hi));
}

__device__ __forceinline__ void mhc_mma_tf32(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four consecutive values of a stream row p at k into v, zeros past len
// (the staging of rows whose width or address rules out 16-byte copies).
__device__ __forceinline__ void mhc_x4(const float* __restrict__ p, int k, int len, float* v) {
#pragma unroll
    for (int j = 0; j < 4; j++) v[j] = k + j < len ? __ldg(p + k + j) : 0.f;
}

// A row's sum of squares over the four lanes t of its quad (all get it).
__device__ __forceinline__ float mhc_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Four consecutive weights from shared memory as float32 (16-byte or 8-byte aligned).
__device__ __forceinline__ void mhc_w4(const float* p, float* w) {
    float4 q = *reinterpret_cast<const float4*>(p);
    w[0] = q.x; w[1] = q.y; w[2] = q.z; w[3] = q.w;
}
__device__ __forceinline__ void mhc_w4(const uint16_t* p, float* w) {
    uint2 q = *reinterpret_cast<const uint2*>(p);
    w[0] = __uint_as_float(q.x << 16);
    w[1] = __uint_as_float(q.x & 0xffff0000u);
    w[2] = __uint_as_float(q.y << 16);
    w[3] = __uint_as_float(q.y & 0xffff0000u);
}

// A warp's x chunks (16 rows x 32 columns) go through a ring of
// MHC_PSTAGES slots of its own in shared memory, MHC_PSTAGES - 1 chunks in
// flight while one is used. In a slot, row r's float4 i sits at i ^ 4(r & 1), so that a
// quarter warp's fragment reads (rows g, g + 1, float4s t or 4 + t) hit
// distinct banks.
#define MHC_PSTAGES 4
#define MHC_PSLOT 512  // floats

// Lane l stages rows l/8 + 4q (q < 4) at float4 l % 8 of the chunk at
// column c: row q at rb + q*4K while q < nq, rows past the end at last
// (pointers at the slice's start): asynchronous 16-byte copies (zeros past
// len) for VEC, else loads and a store.
template <bool VEC>
__device__ __forceinline__ void mhc_proj_stage(float* slot, const float* rb, const float* last, int nq, int K, int c,
                                               int len, int lane) {
    const int i = lane & 7, k = c + 4 * i;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int r = (lane >> 3) + 4 * q;
        const float* p = q < nq ? rb + (size_t)(4 * q) * K : last;
        float* d = slot + r * 32 + 4 * (i ^ ((r & 1) * 4));
        if (VEC) {
            cp_async16_zfill(smem_u32(d), k < len ? p + k : p, k < len);
        } else {
            float v[4];
            mhc_x4(p, k, len, v);
            *reinterpret_cast<float4*>(d) = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
    cp_async_commit();
}

// Lane (g, t)'s A fragments of a staged chunk: rows g and g + 8, columns
// 4t .. 4t + 3 and 16 + 4t .. + 3 (the four k8 steps), as 16 floats.
__device__ __forceinline__ void mhc_proj_frag(float (&v)[16], const float* slot, int g, int t) {
    const int sw = (g & 1) * 4;
    const float4 a0 = *reinterpret_cast<const float4*>(slot + g * 32 + 4 * (t ^ sw));
    const float4 a1 = *reinterpret_cast<const float4*>(slot + g * 32 + 4 * ((4 + t) ^ sw));
    const float4 b0 = *reinterpret_cast<const float4*>(slot + (g + 8) * 32 + 4 * (t ^ sw));
    const float4 b1 = *reinterpret_cast<const float4*>(slot + (g + 8) * 32 + 4 * ((4 + t) ^ sw));
    v[0] = a0.x, v[1] = a0.y, v[2] = a0.z, v[3] = a0.w, v[4] = a1.x, v[5] = a1.y, v[6] = a1.z, v[7] = a1.w;
    v[8] = b0.x, v[9] = b0.y, v[10] = b0.z, v[11] = b0.w, v[12] = b1.x, v[13] = b1.y, v[14] = b1.z, v[15] = b1.w;
}

// The chunk's sums of squares and its products with the weight rows in ws
// (tf32 mma at float32 accuracy: x = hi + lo; bf16 weights are exact in
// tf32, f32 weights split likewise and the lo x lo term dropped), each
// chunk's products added to acc as one partial. NT, the 8-row weight tiles,
// is a template parameter so that the tiles' mma chains interleave, and the
// hi and lo products run as separate chains.
template <typename T, int NT>
__device__ __forceinline__ void mhc_proj_step(float (&acc)[MHC_PMAXNT][4], float& ssa, float& ssb, const float (&xv)[16],
                                              const T* ws, int c, int g, int t, int rs) {
    constexpr bool kSplitW = sizeof(T) == 4;
    uint32_t hi[16], lo[16];
#pragma unroll
    for (int i = 0; i < 8; i++) ssa = fmaf(xv[i], xv[i], ssa);
#pragma unroll
    for (int i = 8; i < 16; i++) ssb = fmaf(xv[i], xv[i], ssb);
#pragma unroll
    for (int i = 0; i < 16; i++) tf32_split(xv[i], hi[i], lo[i]);
    float w[NT][8], dh[NT][4], dl[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const T* wr = ws + (j * 8 + g) * rs + c + 4 * t;
        mhc_w4(wr, w[j]);
        mhc_w4(wr + 16, w[j] + 4);
#pragma unroll
        for (int i = 0; i < 4; i++) dh[j][i] = dl[j][i] = 0.f;
    }
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const int o = (s >> 1) * 4 + (s & 1) * 2;  // columns o, o+1 of the row's 8
#pragma unroll
        for (int j = 0; j < NT; j++) {
            uint32_t b0 = __float_as_uint(w[j][o]), b1 = __float_as_uint(w[j][o + 1]);
            if (kSplitW) {
                uint32_t l0, l1;
                tf32_split(w[j][o], b0, l0);
                tf32_split(w[j][o + 1], b1, l1);
                mhc_mma_tf32(dl[j], hi[o], hi[8 + o], hi[o + 1], hi[9 + o], l0, l1);
            }
            mhc_mma_tf32(dl[j], lo[o], lo[8 + o], lo[o + 1], lo[9 + o], b0, b1);
            mhc_mma_tf32(dh[j], hi[o], hi[8 + o], hi[o + 1], hi[9 + o], b0, b1);
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] += dh[j][i] + dl[j][i];
}

// Lane (g, t)'s sums for rows r0 + g and r0 + g + 8 of slice s straight to
// part (a warp that holds its rows' whole slice: wt = 8).
__device__ __forceinline__ void mhc_proj_emit(float* part, const float (&acc)[MHC_PMAXNT][4], float ssa, float ssb,
                                              int s, int r0, int rows, int mix, int g, int t) {
    ssa = mhc_quad_sum(ssa);
    ssb = mhc_quad_sum(ssb);
    const int cols = mix + 1;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + g + 8 * h;
        if (r >= rows) continue;
        float* pr = part + ((size_t)s * rows + r) * cols;
#pragma unroll
        for (int j = 0; j < MHC_PMAXNT; j++) {
            const int m = j * 8 + 2 * t;
            if (m < mix) pr[m] = acc[j][2 * h];
            if (m + 1 < mix) pr[m + 1] = acc[j][2 * h + 1];
        }
        if (t == 0) pr[mix] = h ? ssb : ssa;
    }
}

// A warp's stream of chunks: for each of the block's tiles (y = blockIdx.y,
// + gridDim.y, ... while the warp has rows there) the chunks c0, c0 + step,
// ... of the slice, items 0 .. items - 1, staged through the ring in order
// (stage keeps the cursor; each call commits one group, empty past the end).
template <bool VEC>
struct mhc_proj_stream {
    const float* x;
    float* ring;
    int rows, K, k0, len, wt, tw, c0, step, nc, items, lane;
    int su = 0, sc = 0, next = 0;  // the next item to stage: tile su, chunk sc
    const float *rb, *last;        // tile su's first row of the lane, the last row
    int nq;                        // tile su's rows of the lane before the end
    __device__ __forceinline__ void tile() {
        const int r = ((int)(blockIdx.y + su * gridDim.y) * wt + tw) * 16 + (lane >> 3);
        rb = x + (size_t)min(r, rows - 1) * K + k0;
        nq = r < rows ? min(4, (rows - 1 - r) / 4 + 1) : 0;
    }
    __device__ __forceinline__ void start() {
        last = x + (size_t)(rows - 1) * K + k0;
        tile();
    }
    __device__ __forceinline__ void stage() {
        if (next < items) {
            mhc_proj_stage<VEC>(ring + (next % MHC_PSTAGES) * MHC_PSLOT, rb, last, nq, K, c0 + sc * step, len, lane);
            if (++sc == nc) sc = 0, su++, tile();
        } else {
            cp_async_commit();
        }
        next++;
    }
};

// The warp's items after the first MHC_PSTAGES - 1 were staged: item
// it + MHC_PSTAGES - 1 is staged before item it is used, across tiles, so
// the copies run on while a tile's sums are written. With one K group
// (step 32) each finished tile's sums go straight to part; else the block
// has one tile and the caller adds the groups.
template <typename T, bool VEC, int NT>
__device__ __forceinline__ void mhc_proj_loop(float (&acc)[MHC_PMAXNT][4], float& ssa, float& ssb, float* part,
                                              mhc_proj_stream<VEC>& st, const T* ws, int mix, int rs) {
    const int g = st.lane >> 2, t = st.lane & 3;
    int u = 0, i = 0;
    for (int it = 0; it < st.items; it++) {
        st.stage();
        cp_async_wait<MHC_PSTAGES - 1>();
        __syncwarp();
        float xv[16];
        mhc_proj_frag(xv, st.ring + (it % MHC_PSTAGES) * MHC_PSLOT, g, t);
        mhc_proj_step<T, NT>(acc, ssa, ssb, xv, ws, st.c0 + i * st.step, g, t, rs);
        __syncwarp();  // the slot is staged again next step
        if (++i == st.nc) {
            i = 0;
            if (st.step == 32) {
                const int r0 = ((int)(blockIdx.y + u * gridDim.y) * st.wt + st.tw) * 16;
                mhc_proj_emit(part, acc, ssa, ssb, blockIdx.x, r0, st.rows, mix, g, t);
#pragma unroll
                for (int j = 0; j < MHC_PMAXNT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
                ssa = ssb = 0.f;
            }
            u++;
        }
    }
}

template <typename T, bool VEC>
__device__ __forceinline__ void mhc_proj_part(float* __restrict__ part, const float* __restrict__ x,
                                              const T* __restrict__ W, int rows, int K, int mix, int ks, int wt,
                                              const MhcTail& tail) {
    extern __shared__ __align__(16) unsigned char mhc_sh[];
    const int npad = (mix + 7) & ~7, nt = npad / 8, rs = ks + 16, cols = mix + 1;
    const size_t wbytes = (size_t)npad * rs * sizeof(T);
    T* ws = reinterpret_cast<T*>(mhc_sh);                    // [npad][rs]
    float* red = reinterpret_cast<float*>(mhc_sh + wbytes);  // [8 warps][16][npad + 1], after the rings
    const int k0 = blockIdx.x * ks, len = min(ks, K - k0);

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane >> 2, t = lane & 3;
    const int wk = MHC_PWARPS / wt, tw = warp % wt, kw = warp / wt;
    mhc_proj_stream<VEC> st;
    st.x = x, st.rows = rows, st.K = K, st.k0 = k0, st.len = len, st.wt = wt, st.tw = tw, st.lane = lane;
    st.ring = reinterpret_cast<float*>(mhc_sh + wbytes) + warp * MHC_PSTAGES * MHC_PSLOT;
    st.step = 32 * wk, st.c0 = kw * 32;
    st.nc = st.c0 < len ? (len - st.c0 + st.step - 1) / st.step : 0;  // chunks per tile
    int ntl = 0;  // the block's tiles where this warp has rows
    if (((int)blockIdx.y * wt + tw) * 16 < rows) ntl = ((rows - 1 - tw * 16) / (wt * 16) - (int)blockIdx.y) / (int)gridDim.y + 1;
    st.items = ntl * st.nc;

    // fn[:, k0 .. k0 + len) into ws, zeros in the padding rows and columns:
    // constant, so copied before the wait for the previous kernel (with
    // programmatic dependent launch, under its tail), one commit group
    // ahead of the x chunks'.
    constexpr int V = 16 / sizeof(T);
    const int per = ks / V;
    for (int i = threadIdx.x; i < npad * per; i += blockDim.x) {
        int m = i / per, kk = (i - m * per) * V;
        T* d = ws + m * rs + kk;
        if (VEC && m < mix && kk + V <= len) {
            cp_async16(smem_u32(d), W + (size_t)m * K + k0 + kk);
        } else {
#pragma unroll
            for (int j = 0; j < V; j++) d[j] = (m < mix && kk + j < len) ? W[(size_t)m * K + k0 + kk + j] : T(0);
        }
    }
    cp_async_commit();
    pdl_wait();
    st.start();
#pragma unroll
    for (int i = 0; i < MHC_PSTAGES - 1; i++) st.stage();
    cp_async_wait<MHC_PSTAGES - 1>();  // this thread's weight copies (the oldest group)
    __syncthreads();

    float acc[MHC_PMAXNT][4];
#pragma unroll
    for (int j = 0; j < MHC_PMAXNT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    float ssa = 0.f, ssb = 0.f;
    switch (nt) {  // uniform: one loop per tile count
        case 1: mhc_proj_loop<T, VEC, 1>(acc, ssa, ssb, part, st, ws, mix, rs); break;
        case 2: mhc_proj_loop<T, VEC, 2>(acc, ssa, ssb, part, st, ws, mix, rs); break;
        case 3: mhc_proj_loop<T, VEC, 3>(acc, ssa, ssb, part, st, ws, mix, rs); break;
        default: mhc_proj_loop<T, VEC, 4>(acc, ssa, ssb, part, st, ws, mix, rs); break;
    }
    if (wk == 1) return;  // the sums went out tile by tile

    // K groups (one tile per block): each warp's 16 x (npad + 1) sums into
    // red, in the rings' place, then the groups added.
    ssa = mhc_quad_sum(ssa);
    ssb = mhc_quad_sum(ssb);
    __syncthreads();
    const int rstride = npad + 1;
    float* rw = red + (size_t)warp * 16 * rstride;
#pragma unroll
    for (int j = 0; j < MHC_PMAXNT; j++) {
        if (j < nt) {
            rw[g * rstride + j * 8 + 2 * t] = acc[j][0];
            rw[g * rstride + j * 8 + 2 * t + 1] = acc[j][1];
            rw[(g + 8) * rstride + j * 8 + 2 * t] = acc[j][2];
            rw[(g + 8) * rstride + j * 8 + 2 * t + 1] = acc[j][3];
        }
    }
    if (t == 0) {
        rw[g * rstride + npad] = ssa;
        rw[(g + 8) * rstride + npad] = ssb;
    }
    __syncthreads();
    const int base = blockIdx.y * 16 * wt;
    for (int e = threadIdx.x; e < 16 * wt * cols; e += blockDim.x) {
        int i = e / cols, m = e - i * cols;
        int r = base + i;
        if (r >= rows) break;  // e only grows, and so does r
        int src = m < mix ? m : npad, grp = i / 16, row = i % 16;
        float v = 0.f;
        for (int q = 0; q < wk; q++) v += red[((size_t)(q * wt + grp) * 16 + row) * rstride + src];
        part[((size_t)blockIdx.x * rows + r) * cols + m] = v;
    }
    if (tail.ticket) mhc_coeffs_tail(part, x, rows, K, mix, gridDim.x, tail);
}

extern "C" __global__ void __launch_bounds__(MHC_PTHREADS, 2)
    mhc_proj_part_f32(float* part, const float* x, const float* W, int rows, int K, int mix, int ks, int wt,
                        const __grid_constant__ MhcTail tail) {
    pdl_launch();  // mhc_proj_part waits after staging its weights
    mhc_proj_part<float, false>(part, x, W, rows, K, mix, ks, wt, tail);
}
extern "C" __global__ void __launch_bounds__(MHC_PTHREADS, 2)
    mhc_proj_part_f32_v(float* part, const float* x, const float* W, int rows, int K, int mix, int ks, int wt,
                        const __grid_constant__ MhcTail tail) {
    pdl_launch();  // mhc_proj_part waits after staging its weights
    mhc_proj_part<float, true>(part, x, W, rows, K, mix, ks, wt, tail);
}
extern "C" __global__ void __launch_bounds__(MHC_PTHREADS, 2)
    mhc_proj_part_bf16(float* part, const float* x, const uint16_t* W, int rows, int K, int mix, int ks, int wt,
                        const __grid_constant__ MhcTail tail) {
    pdl_launch();  // mhc_proj_part waits after staging its weights
    mhc_proj_part<uint16_t, false>(part, x, W, rows, K, mix, ks, wt, tail);
}
extern "C" __global__ void __launch_bounds__(MHC_PTHREADS, 2)
    mhc_proj_part_bf16_v(float* part, const float* x, const uint16_t* W, int rows, int K, int mix, int ks, int wt,
                        const __grid_constant__ MhcTail tail) {
    pdl_launch();  // mhc_proj_part waits after staging its weights
    mhc_proj_part<uint16_t, true>(part, x, W, rows, K, mix, ks, wt, tail);
}

// Row r's logits from the slices' partial sums (mix values then the sum of
// squares per slice): thread (g, m) of a block of MHC_FT threads adds column
// m over slices g, g + G, ... (independent loads in flight), then the groups
// are added in shared memory and 1/rms (float64, as the CPU) applied.
#define MHC_FT 128
#define MHC_FG (MHC_FT / 64)
// Threads past MHC_FT (a larger block: mhc_coeffs_tail) only meet the barrier.
__device__ __forceinline__ void mhc_sum_slices(float* l, const float* part, int r, int rows, int mix, int S, int K, float eps) {
    __shared__ float acc[MHC_FG][64];
    __shared__ double ssd[MHC_FG];
    const int m = threadIdx.x & 63, grp = threadIdx.x >> 6;
    if (threadIdx.x < MHC_FT) {
        float v = 0.f;
        double ss = 0.0;
        if (m <= mix) {
            // 16 slices' loads in flight, then added in slice order; past
            // L1 (the tail reads other blocks' sums).
            const float* pm = part + (size_t)r * (mix + 1) + m;
            const size_t sstride = (size_t)rows * (mix + 1);
            int s = grp;
            for (; s + 15 * MHC_FG < S; s += 16 * MHC_FG) {
                float p[16];
#pragma unroll
                for (int i = 0; i < 16; i++) p[i] = __ldcg(pm + (size_t)(s + i * MHC_FG) * sstride);
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    if (m == mix) ss += p[i];
                    else v += p[i];
                }
            }
            for (; s < S; s += MHC_FG) {
                const float p = __ldcg(pm + (size_t)s * sstride);
                if (m == mix) ss += p;
                else v += p;
            }
        }
        acc[grp][m] = v;
        if (m == mix) ssd[grp] = ss;
    }
    __syncthreads();
    if (grp == 0 && m < mix) {
        float tv = 0.f;
        double tss = 0.0;
#pragma unroll
        for (int g2 = 0; g2 < MHC_FG; g2++) tv += acc[g2][m], tss += ssd[g2];
        l[m] = tv * (float)(1.0 / sqrt(tss / (double)K + (double)eps));
    }
}

// logits[r, m] = sum over slices of part[s, r, m], times 1/rms; a block per row.
extern "C" __global__ void mhc_proj_finish(float* logits, const float* part, int rows, int mix, int S, int K, float eps) {
    pdl_entry();
    mhc_sum_slices(logits + (size_t)blockIdx.x * mix, part, blockIdx.x, rows, mix, S, K, eps);
}

// Pre: dst[r, c] = sum_i pre[r, i] * x[r, i, c]; one thread per (r, c).
extern "C" __global__ void mhc_pre(float* dst, const float* x, const float* pre, int rows, int n, int hidden) {
    pdl_entry();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)rows * hidden) return;
    int r = (int)(idx / hidden), c = (int)(idx % hidden);
    const float* xs = x + (size_t)r * n * hidden + c;
    const float* w = pre + (size_t)r * n;
    float acc = __fmul_rn(w[0], xs[0]);
    for (int i = 1; i < n; i++) acc = __fadd_rn(acc, __fmul_rn(w[i], xs[(size_t)i * hidden]));
    dst[idx] = acc;
}

// Post: dst[r, k, c] = post[r, k] * out[r, c] + sum_j res[r, j, k] * x[r, j, c];
// one thread per (r, c), which reads its column of x before writing it, so
// dst may be x.
extern "C" __global__ void mhc_post(float* dst, const float* x, const float* out, const float* post, const float* res,
                                    int rows, int n, int hidden) {
    pdl_entry();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)rows * hidden) return;
    int r = (int)(idx / hidden), c = (int)(idx % hidden);
    const float* xs = x + (size_t)r * n * hidden + c;
    float t[MHC_MAXN];
#pragma unroll
    for (int j = 0; j < MHC_MAXN; j++) t[j] = j < n ? xs[(size_t)j * hidden] : 0.f;
    float oc = out[idx];
    const float* p = post + (size_t)r * n;
    const float* h = res + (size_t)r * n * n;
    float* ds = dst + (size_t)r * n * hidden + c;
    for (int k = 0; k < n; k++) {
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < MHC_MAXN; j++)
            if (j < n) acc = __fadd_rn(acc, __fmul_rn(h[j * n + k], t[j]));
        ds[(size_t)k * hidden] = __fadd_rn(__fmul_rn(p[k], oc), acc);
    }
}

// Pre's sum for four columns of M streams: w[0] t[0] + w[1] t[1] + ..., in order.
template <int M>
__device__ __forceinline__ float4 mhc_pre4_sum(const float (&wv)[M], const float4 (&t)[M]) {
    float4 a = make_float4(__fmul_rn(wv[0], t[0].x), __fmul_rn(wv[0], t[0].y), __fmul_rn(wv[0], t[0].z), __fmul_rn(wv[0], t[0].w));
#pragma unroll
    for (int i = 1; i < M; i++) {
        a.x = __fadd_rn(a.x, __fmul_rn(wv[i], t[i].x));
        a.y = __fadd_rn(a.y, __fmul_rn(wv[i], t[i].y));
        a.z = __fadd_rn(a.z, __fmul_rn(wv[i], t[i].z));
        a.w = __fadd_rn(a.w, __fmul_rn(wv[i], t[i].w));
    }
    return a;
}

// mhc_pre and mhc_post four columns at a time (hidden % 4 == 0, every
// pointer 16-byte aligned; mhc.go picks them): block (x, y) takes columns
// [4c, 4c + 4), c = x * blockDim + thread, of rows y, y + gridDim.y, ...;
// each column's operations are those above, in the same order. The
// coefficients are loaded before the stream, the n stream loads and the
// output's are in flight together, and the stream is read and written with
// streaming hints (each byte is touched once). n is a template parameter
// up to 4 (the streams in registers), a loop bound above it.
template <int N>
__device__ __forceinline__ void mhc_pre4_row(float* dst, const float* x, const float* pre, int r, int c, int n, int hidden) {
    const int nn = N > 0 ? N : n, q = hidden >> 2;
    const float* w = pre + (size_t)r * nn;
    const float4* xs = reinterpret_cast<const float4*>(x + (size_t)r * nn * hidden) + c;
    float4 a;
    if (N > 0) {
        constexpr int M = N > 0 ? N : 1;
        float wv[M];
        float4 t[M];
#pragma unroll
        for (int i = 0; i < M; i++) wv[i] = w[i];
#pragma unroll
        for (int i = 0; i < M; i++) t[i] = __ldcs(xs + (size_t)i * q);
        a = mhc_pre4_sum<M>(wv, t);
    } else {
        const float4 t0 = __ldcs(xs);
        a = make_float4(__fmul_rn(w[0], t0.x), __fmul_rn(w[0], t0.y), __fmul_rn(w[0], t0.z), __fmul_rn(w[0], t0.w));
        for (int i = 1; i < nn; i++) {
            const float4 ti = __ldcs(xs + (size_t)i * q);
            const float wi = w[i];
            a.x = __fadd_rn(a.x, __fmul_rn(wi, ti.x));
            a.y = __fadd_rn(a.y, __fmul_rn(wi, ti.y));
            a.z = __fadd_rn(a.z, __fmul_rn(wi, ti.z));
            a.w = __fadd_rn(a.w, __fmul_rn(wi, ti.w));
        }
    }
    __stcs(reinterpret_cast<float4*>(dst + (size_t)r * hidden) + c, a);
}

extern "C" __global__ void mhc_pre4(float* dst, const float* x, const float* pre, int rows, int n, int hidden) {
    pdl_entry();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (hidden >> 2)) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        switch (n) {
        case 1: mhc_pre4_row<1>(dst, x, pre, r, c, n, hidden); break;
        case 2: mhc_pre4_row<2>(dst, x, pre, r, c, n, hidden); break;
        case 3: mhc_pre4_row<3>(dst, x, pre, r, c, n, hidden); break;
        case 4: mhc_pre4_row<4>(dst, x, pre, r, c, n, hidden); break;
        default: mhc_pre4_row<0>(dst, x, pre, r, c, n, hidden);
        }
    }
}

// dst may be x: a thread reads its columns of every stream before it writes them.
template <int N>
__device__ __forceinline__ void mhc_post4_row(float* dst, const float* x, const float* out, const float* post, const float* res,
                                              int r, int c, int hidden) {
    const int q = hidden >> 2;
    float h[N * N], p[N];
#pragma unroll
    for (int i = 0; i < N * N; i++) h[i] = res[(size_t)r * N * N + i];
#pragma unroll
    for (int k = 0; k < N; k++) p[k] = post[(size_t)r * N + k];
    const float4* xs = reinterpret_cast<const float4*>(x + (size_t)r * N * hidden) + c;
    float4 t[N];
#pragma unroll
    for (int j = 0; j < N; j++) t[j] = __ldcs(xs + (size_t)j * q);
    const float4 oc = __ldcs(reinterpret_cast<const float4*>(out + (size_t)r * hidden) + c);
    float4* ds = reinterpret_cast<float4*>(dst + (size_t)r * N * hidden) + c;
#pragma unroll
    for (int k = 0; k < N; k++) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < N; j++) {
            const float hj = h[j * N + k];
            a.x = __fadd_rn(a.x, __fmul_rn(hj, t[j].x));
            a.y = __fadd_rn(a.y, __fmul_rn(hj, t[j].y));
            a.z = __fadd_rn(a.z, __fmul_rn(hj, t[j].z));
            a.w = __fadd_rn(a.w, __fmul_rn(hj, t[j].w));
        }
        __stcs(ds + (size_t)k * q, make_float4(__fadd_rn(__fmul_rn(p[k], oc.x), a.x), __fadd_rn(__fmul_rn(p[k], oc.y), a.y),
                                               __fadd_rn(__fmul_rn(p[k], oc.z), a.z), __fadd_rn(__fmul_rn(p[k], oc.w), a.w)));
    }
}

// n from 1 to 4 (mhc.go sends more streams to mhc_post).
extern "C" __global__ void mhc_post4(float* dst, const float* x, const float* out, const float* post, const float* res,
                                     int rows, int n, int hidden) {
    pdl_entry();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (hidden >> 2)) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        switch (n) {
        case 1: mhc_post4_row<1>(dst, x, out, post, res, r, c, hidden); break;
        case 2: mhc_post4_row<2>(dst, x, out, post, res, r, c, hidden); break;
        case 3: mhc_post4_row<3>(dst, x, out, post, res, r, c, hidden); break;
        default: mhc_post4_row<4>(dst, x, out, post, res, r, c, hidden);
        }
    }
}

// Mixer.Activate for Sinkhorn residuals with n <= 4: 16 lanes per token,
// lane L holding element L = i*n + j of the n x n matrix. Each row's and
// column's sum is gathered by shuffles and added in the reference's order
// (mhc_activate_row, mhc_sinkhorn_reg), so the results are the same bits;
// the latency of one token's 20 iterations is spread over 16 lanes instead
// of one thread. N, the stream count, is a template parameter: each sum's
// N shuffles are in flight together before the adds (in order), which a
// loop over a runtime n kept one after another.
template <int N>
__device__ __forceinline__ void mhc_activate16_t(float* pre, float* post, float* res, float* l, const float* base,
                                                 const float* scale, int r, int L, unsigned mask, int iters, float eps) {
    constexpr int NZ = N * N;
    if (L < N) {
        pre[(size_t)r * N + L] = __fadd_rn(mhc_sigmoid(__fadd_rn(__fmul_rn(l[L], scale[0]), base[L])), eps);
        post[(size_t)r * N + L] = 2.f * mhc_sigmoid(__fadd_rn(__fmul_rn(l[N + L], scale[1]), base[N + L]));
    }
    float m = 0.f;
    if (L < NZ) {
        m = __fadd_rn(__fmul_rn(l[2 * N + L], scale[2]), base[2 * N + L]);
        l[2 * N + L] = m;
    }
    // Lanes past n*n compute along (their sources wrap within the 16) and store nothing.
    const int i = L / N, j = L - i * N;
    float v[N];
    auto row = [&](float x) {
#pragma unroll
        for (int jj = 0; jj < N; jj++) v[jj] = __shfl_sync(mask, x, i * N + jj, 16);
    };
    auto col = [&](float x) {
#pragma unroll
        for (int ii = 0; ii < N; ii++) v[ii] = __shfl_sync(mask, x, ii * N + j, 16);
    };
    row(m);
    float mx = v[0];
#pragma unroll
    for (int jj = 1; jj < N; jj++) mx = fmaxf(mx, v[jj]);
    const float e = (float)exp((double)(m - mx));
    row(e);
    float s = 0.f;
#pragma unroll
    for (int jj = 0; jj < N; jj++) s += v[jj];
    m = __fadd_rn(e / s, eps);
    for (int it = 0; it < max(iters, 1); it++) {
        if (it > 0) {
            row(m);
            s = 0.f;
#pragma unroll
            for (int jj = 0; jj < N; jj++) s += v[jj];
            s += eps;
            m /= s;
        }
        col(m);
        s = 0.f;
#pragma unroll
        for (int ii = 0; ii < N; ii++) s += v[ii];
        s += eps;
        m /= s;
    }
    if (L < NZ) res[(size_t)r * NZ + L] = m;
}

// Token r's activation on the 16 lanes of thread t's half warp (n <= 4).
__device__ __forceinline__ void mhc_activate16_row(float* pre, float* post, float* res, float* logits, const float* base,
                                                   const float* scale, int r, int t, int n, int iters, float eps) {
    const int L = t & 15;
    const unsigned mask = 0xffffu << (t & 16);
    float* l = logits + (size_t)r * (2 * n + n * n);
    switch (n) {
    case 1: mhc_activate16_t<1>(pre, post, res, l, base, scale, r, L, mask, iters, eps); break;
    case 2: mhc_activate16_t<2>(pre, post, res, l, base, scale, r, L, mask, iters, eps); break;
    case 3: mhc_activate16_t<3>(pre, post, res, l, base, scale, r, L, mask, iters, eps); break;
    default: mhc_activate16_t<4>(pre, post, res, l, base, scale, r, L, mask, iters, eps);
    }
}

extern "C" __global__ void mhc_activate16(float* pre, float* post, float* res, float* logits, const float* base,
                                          const float* scale, int rows, int n, int iters, float eps) {
    pdl_entry();
    const int r = blockIdx.x * (blockDim.x / 16) + threadIdx.x / 16;
    if (r >= rows) return;  // a token's 16 lanes leave together
    mhc_activate16_row(pre, post, res, logits, base, scale, r, threadIdx.x, n, iters, eps);
}

// HeadActivate: pre[i] = sigmoid(pre[i] * scale + base[i % n]) + eps.
extern "C" __global__ void mhc_head_activate(float* pre, const float* base, float scale, float eps, int total, int n) {
    pdl_entry();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    pre[i] = __fadd_rn(mhc_sigmoid(__fadd_rn(__fmul_rn(pre[i], scale), base[i % n])), eps);
}

// Expand: dst[r, i, c] = emb[r, c].
extern "C" __global__ void mhc_expand(float* dst, const float* emb, int rows, int n, int hidden) {
    pdl_entry();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)rows * n * hidden) return;
    int c = (int)(idx % hidden);
    long long r = idx / ((long long)n * hidden);
    dst[idx] = emb[r * hidden + c];
}

// mhc_pre4 over rows tokens by one block: each thread's four items (float4
// columns) have their stream loads in flight together, one round trip for a
// token of hidden 4096; the sums are mhc_pre4_row's.
template <int N>
__device__ __forceinline__ void mhc_tail_pre(float* dst, const float* x, const float* pre, int rows, int hidden) {
    const int q = hidden >> 2, total = rows * q;
    for (int e0 = threadIdx.x; e0 < total; e0 += 4 * blockDim.x) {
        float wv[4][N];
        float4 tv[4][N];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int e = e0 + k * blockDim.x, r = e / q, c = e - r * q;
            if (e < total) {
                const float4* xs = reinterpret_cast<const float4*>(x + (size_t)r * N * hidden) + c;
#pragma unroll
                for (int i = 0; i < N; i++) wv[k][i] = pre[(size_t)r * N + i], tv[k][i] = __ldcs(xs + (size_t)i * q);
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int e = e0 + k * blockDim.x, r = e / q, c = e - r * q;
            if (e < total) __stcs(reinterpret_cast<float4*>(dst + (size_t)r * hidden) + c, mhc_pre4_sum<N>(wv[k], tv[k]));
        }
    }
}

// mhc_proj_part's last block (MhcTail above): rows <= MHC_PTHREADS / 16,
// n <= 4, hidden % 4 == 0 and x, dst 16-byte aligned (mhc.go checks).
__device__ void mhc_coeffs_tail(const float* part, const float* x, int rows, int K, int mix, int S, const MhcTail& t) {
    __shared__ int last;
    __threadfence();  // this block's partial sums, before its ticket
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(t.ticket, 1u) == gridDim.x * gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *t.ticket = 0;  // every block has taken its ticket
    for (int r = 0; r < rows; r++) {
        mhc_sum_slices(t.logits + (size_t)r * mix, part, r, rows, mix, S, K, t.normEps);
        __syncthreads();  // the sums' shared arrays are used again
    }
    if (threadIdx.x < 16 * rows)  // a token's 16 lanes: whole half warps
        mhc_activate16_row(t.pre, t.post, t.res, t.logits, t.base, t.scale, threadIdx.x / 16, threadIdx.x, t.n, t.iters, t.eps);
    __syncthreads();  // pre's coefficients, written above by this block
    switch (t.n) {
    case 1: mhc_tail_pre<1>(t.dst, x, t.pre, rows, t.hidden); break;
    case 2: mhc_tail_pre<2>(t.dst, x, t.pre, rows, t.hidden); break;
    case 3: mhc_tail_pre<3>(t.dst, x, t.pre, rows, t.hidden); break;
    default: mhc_tail_pre<4>(t.dst, x, t.pre, rows, t.hidden);
    }
}
