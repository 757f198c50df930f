// Paged KV cache (kernels/paged.go; reference layers/paged.go): the pool
// is one allocation of [layer][k, v][blocks*bs rows][kvHeads*hd] floats,
// and a call's rows are described in the queue's step values (dyn), from
// slot enc on: for query row r, E[3r] is its position, E[3r+1] the pool row
// its key and value go to, and E[3r+2] the slot (from enc) of its sequence's
// block table, position t of which lies in pool row table[t/bs]*bs + t%bs.

// pga_norms applies in-place per-head RMSNorms (Qwen3's q_norm and k_norm,
// as rmsnorm computes them: rsqrtf(sum of squares / hd + eps), then w[c] *
// (x[c] * inv)) to nq vectors of hd values at xq (weight qnw) and nk at xk
// (knw), a warp a vector; a null weight leaves its vectors as they are. The
// caller syncs the block before others read them.
__device__ __forceinline__ void pga_norms(float* xq, int nq, const float* qnw, float* xk, int nk, const float* knw,
                                          int hd, float eps) {
    const int lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    for (int h = threadIdx.x / WARP; h < nq + nk; h += nw) {
        const float* w = h < nq ? qnw : knw;
        if (!w) continue;  // the same on the warp's lanes
        float* x = h < nq ? xq + (size_t)h * hd : xk + (size_t)(h - nq) * hd;
        float ss = 0.f;
        for (int c = lane; c < hd; c += WARP) ss += x[c] * x[c];
        ss = warp_sum(ss);
        const float inv = rsqrtf(ss / hd + eps);
        for (int c = lane; c < hd; c += WARP) x[c] = w[c] * (x[c] * inv);
    }
}

// paged_append rotates row r's query heads (q, null: none) and key heads in
// place as rope_dyn does at position E[3r] (half == 0: no rotation), then
// writes the row's key and value to pool row E[3r+1] of kp and vp. Before
// the rotation, with qnw or knw (not null), the query heads (with q) or the
// key heads are normalized in place (pga_norms, epsilon eps): the rmsnorm
// launches queued before it moved in (paged.go).
// Grid (rows), 256 threads.
extern "C" __global__ void paged_append(float* q, float* k, const float* v, float* kp, float* vp, const int* dyn,
                                        int enc, int heads, int kvHeads, int hd, const float* inv_freq, int half,
                                        float scale, int interleaved, const float* qnw, const float* knw,
                                        float eps) {
    pdl_entry();
    const int r = blockIdx.x;
    const int* E = dyn + enc;
    const int pos = E[3 * r];
    const size_t W = (size_t)kvHeads * hd;
    float* kr = k + (size_t)r * W;
    if ((qnw && q) || knw) {
        pga_norms(q ? q + (size_t)r * heads * hd : nullptr, q ? heads : 0, qnw, kr, kvHeads, knw, hd, eps);
        __syncthreads();
    }
    if (half > 0) {
        const int nh = (q ? heads : 0) + kvHeads;
        for (int idx = threadIdx.x; idx < nh * half; idx += blockDim.x) {
            int i = idx % half, hh = idx / half;
            float a = (float)pos * inv_freq[i];
            float c = cosf(a) * scale, s = sinf(a) * scale;
            float* x = q && hh < heads ? q + ((size_t)r * heads + hh) * hd : kr + (size_t)(hh - (q ? heads : 0)) * hd;
            int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
            float p = x[i0], o = x[i1];
            x[i0] = p * c - o * s;
            x[i1] = o * c + p * s;
        }
        __syncthreads(); // the rotated key, written by other threads of the block
    }
    const size_t dst = (size_t)E[3 * r + 1] * W;
    const float* vr = v + (size_t)r * W;
    for (size_t j = threadIdx.x; j < W; j += blockDim.x) {
        kp[dst + j] = kr[j];
        vp[dst + j] = vr[j];
    }
}

// paged_attn_{64,128,any}: causal attention of query rows over their
// sequences' keys read through the block tables. Grid (rows * kvHeads *
// hgroups, splits), PGA_WARPS warps: block (r, kh, j) takes the gb = G /
// hgroups query heads kh*G + j*gb .. of kv head kh (G = heads / kvHeads,
// gb <= GM <= PGA_GMAX), over keys [split*keys, (split+1)*keys) of the visible
// [start, pos] (the host picks keys and splits so that the grid fills the
// GPU: pagedSplits). Warp w weighs rounds of KEYS consecutive keys, lo +
// w*KEYS + r*PGA_WARPS*KEYS .., every row of a round loaded before any is
// weighed and the next round's block-table lookups issued under those loads,
// keeping an online softmax (max, sum, output) per head; a lane holds NE
// channels of each (pga_chan: consecutive ones, loaded as one vector, for
// heads of 64 and 128). The block merges its warps' in shared memory, a
// warp a head. With one split it writes out, else its (output, max, sum) to
// part (an empty share writes max -inf, sum 0 and outputs 0), and the last
// of a row of splits to finish (ticket[blockIdx.x], reset by it) merges
// them, a warp a head. list >= 0: the launch runs the rows listed from slot
// enc + list (block row i: row E[list + i]) and leaves the others to
// paged_prefill.
//
// part's layout: the partial of head g of block x, split s, is number pi =
// (x * gb + g) * splits + s of T = gridDim.x * gb * splits; its hd outputs
// at part + pi * hd (16-byte aligned rows for heads of 128), its max and sum
// at part + T * hd + 2 * pi. T * (hd + 2) floats: rows * heads * splits *
// (hd + 2), as the host sizes it.
#define PGA_WARPS 4
#define PGA_GMAX 8
template <int HD>
struct Pga {
    static constexpr int NE = HD ? HD / WARP : 8; // channels a lane
    // chan is the channel of a lane's e-th value.
    static __device__ __forceinline__ int chan(int lane, int e) { return HD ? lane * NE + e : lane + WARP * e; }
    // load reads a lane's channels of the row at p (16-byte aligned for HD
    // 128, 8 for 64; channels past hd read as 0); CG: through L2 only (what
    // other blocks of the launch wrote).
    template <bool CG = false>
    static __device__ __forceinline__ void load(float (&x)[NE], const float* p, int lane, int hd) {
        if constexpr (HD == 128) {
            const float4* p4 = reinterpret_cast<const float4*>(p) + lane;
            const float4 t = CG ? __ldcg(p4) : *p4;
            x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
        } else if constexpr (HD == 64) {
            const float2* p2 = reinterpret_cast<const float2*>(p) + lane;
            const float2 t = CG ? __ldcg(p2) : *p2;
            x[0] = t.x, x[1] = t.y;
        } else {
#pragma unroll
            for (int e = 0; e < NE; e++) {
                const int c = chan(lane, e);
                x[e] = c < hd ? (CG ? __ldcg(p + c) : p[c]) : 0.f;
            }
        }
    }
    // store writes a lane's channels to the row at p (aligned as load's).
    static __device__ __forceinline__ void store(float* p, const float (&x)[NE], int lane, int hd) {
        if constexpr (HD == 128) {
            reinterpret_cast<float4*>(p)[lane] = make_float4(x[0], x[1], x[2], x[3]);
        } else if constexpr (HD == 64) {
            reinterpret_cast<float2*>(p)[lane] = make_float2(x[0], x[1]);
        } else {
#pragma unroll
            for (int e = 0; e < NE; e++) {
                const int c = chan(lane, e);
                if (c < hd) p[c] = x[e];
            }
        }
    }
};

// pga_halve is a step of pga_fold: lanes M = 32 H / N apart swap halves of
// the 2 H values each holds and add the half they get, the lane with bit M
// set keeping the upper half; then the steps after it, down to one value.
template <int N, int H>
__device__ __forceinline__ void pga_halve(float (&v)[N], int lane) {
    if constexpr (H >= 1) {
        constexpr int M = WARP * H / N;
        const bool up = lane & M;
#pragma unroll
        for (int i = 0; i < H; i++) {
            const float give = up ? v[i] : v[i + H];
            const float keep = up ? v[i + H] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffff, give, M);
        }
        pga_halve<N, H / 2>(v, lane);
    }
}

// pga_fold sums each of a lane's N values (a power of two, at most 32)
// over the warp and leaves one sum a lane: lane l holds value l / (32 / N)'s.
// The halving steps (pga_halve) take N - 1 shuffles, log2(32 / N) more
// finish, where a warp_sum of each value takes 5 N. The lanes added are
// the pairs warp_sum adds, step by step, so each sum is warp_sum's to the
// bit.
template <int N>
__device__ __forceinline__ float pga_fold(float (&v)[N], int lane) {
    static_assert(N >= 1 && N <= WARP && (N & (N - 1)) == 0, "pga_fold: N a power of two up to 32");
    pga_halve<N, N / 2>(v, lane);
    float s = v[0];
#pragma unroll
    for (int m = WARP / N / 2; m >= 1; m /= 2) s += __shfl_xor_sync(0xffffffff, s, m);
    return s;
}

// pga_weigh folds KEYS key rows k and value rows v (a lane's channels; the
// first nv >= 1 of them keys of the share, the others weighed 0) into the
// online softmax (max mx, sum sm, outputs acc) of each of the block's gb
// heads (queries qv): the GM * KEYS dot products in one pga_fold, each
// score then taken from its lane by every lane, and one rescale of a head's
// outputs for the round.
template <int NE, int GM, int KEYS>
__device__ __forceinline__ void pga_weigh(const float (&k)[KEYS][NE], const float (&v)[KEYS][NE], int nv,
                                          const float (&qv)[GM][NE], float (&acc)[GM][NE], float (&mx)[GM],
                                          float (&sm)[GM], int gb, float scale, int lane) {
    constexpr int N = GM * KEYS, REST = WARP / N;
    float d[N];
#pragma unroll
    for (int g = 0; g < GM; g++) {
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            float x = 0.f;
#pragma unroll
            for (int e = 0; e < NE; e++) x += qv[g][e] * k[j][e];
            d[g * KEYS + j] = x;
        }
    }
    const float mine = pga_fold<N>(d, lane) * scale; // score of head lane / REST / KEYS, key lane / REST % KEYS
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= gb) break; // the same on every lane
        float s[KEYS], mc = -INFINITY;
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            const float x = __shfl_sync(0xffffffff, mine, (g * KEYS + j) * REST);
            s[j] = j < nv ? x : -INFINITY;
            mc = fmaxf(mc, s[j]);
        }
        const float m = fmaxf(mx[g], mc); // finite: key 0 is the share's
        const float corr = expf(mx[g] - m);
        float p[KEYS], ps = 0.f;
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            p[j] = expf(s[j] - m);
            ps += p[j];
        }
        mx[g] = m;
        sm[g] = sm[g] * corr + ps;
#pragma unroll
        for (int e = 0; e < NE; e++) {
            float a = acc[g][e] * corr;
#pragma unroll
            for (int j = 0; j < KEYS; j++) a += p[j] * v[j][e];
            acc[g][e] = a;
        }
    }
}

//
// FUSED (paged_attn_*_rope, every row a decode row: its sequence's only
// row this step): the launch is also paged_append of the rows. A block
// rotates its query heads (from q, as rope_dyn at the row's position;
// half == 0: no rotation) in shared memory, q itself left as it was; the
// blocks whose share holds the row's position p rotate its key (from knew)
// the same way and take it and its value (vnew) from shared memory, not
// the pool, which those of head group 0 write them to. No other block
// reads row p of the pool.
template <int HD, int GM, bool FUSED>
__device__ __forceinline__ void paged_attn_body(float* out, const float* q, float* kp, float* vp, const int* dyn,
                                                int enc, int heads, int kvHeads, int hd, int hgroups, float scale,
                                                int window, int bs, int keys, float* part, int* ticket, int list,
                                                const float* knew,
                                                const float* vnew, const float* inv_freq, int half, float rscale,
                                                int inter, const float* qnw = nullptr, const float* knw = nullptr,
                                                float neps = 0.f) {
    // [PGA_WARPS][gb][hd + 4] (a warp's outputs, max and sum a head), then
    // FUSED's new key and value [2][hd]
    extern __shared__ __align__(16) float pga_sh[];
    using P = Pga<HD>;
    constexpr int NE = P::NE;
    // The keys a warp keeps in flight: 4, or 2 where the heads' registers
    // (queries and outputs, 2 * GM * NE) are many.
    constexpr int KEYS = GM * NE <= 16 ? 4 : 2, STEP = PGA_WARPS * KEYS;
    if (HD) hd = HD;
    pdl_entry();
    const int G = heads / kvHeads, gb = G / hgroups;
    int bx = blockIdx.x;
    const int hg = bx % hgroups;
    bx /= hgroups;
    const int kh = bx % kvHeads;
    const int split = blockIdx.y, splits = gridDim.y;
    const int* E = dyn + enc;
    const int r = list >= 0 ? E[list + bx / kvHeads] : bx / kvHeads; // list: the rows to run, from slot enc + list
    const int pos = E[3 * r];
    const int* table = E + E[3 * r + 2];
    const int start = window > 0 ? max(0, pos - window + 1) : 0;
    const int lo = max(start, split * keys), hi = min(pos + 1, (split + 1) * keys);
    const size_t W = (size_t)kvHeads * hd;
    const int h0 = kh * G + hg * gb;
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int rs = hd + 4; // a row of the merge area (16-byte aligned)

    // FUSED: whether this block's share holds the new key, which comes
    // last, from shared memory (end: the keys before it, from the pool).
    const bool owner = FUSED && pos >= split * keys && pos < (split + 1) * keys;
    const int end = owner ? hi - 1 : hi;

    // This warp's rounds, and the pool offsets of a round's keys: keys
    // past end take the last one's row (read, weighed 0), so that the
    // lookups and loads take no branch; unsigned division once a round.
    const int first = lo + w * KEYS;
    const int rounds = first < end ? (end - first + STEP - 1) / STEP : 0;
    const int last = max(end - 1, 0);
    size_t at[KEYS];
    auto rowsOf = [&](int t) {
        int tc = min(t, last);
        int blk = (unsigned)tc / (unsigned)bs, off = tc - blk * bs;
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            if (j > 0) { // the next key's block and offset
                const int nx = min(t + j, last);
                off += nx - tc; // 0 or 1
                tc = nx;
                const bool wrap = off == bs;
                blk += wrap;
                off = wrap ? 0 : off;
            }
            at[j] = ((size_t)table[blk] * bs + off) * W + (size_t)kh * hd;
        }
    };
    float kr[KEYS][NE], vr[KEYS][NE];
    auto fetch = [&]() {
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            P::load(kr[j], kp + at[j], lane, hd);
            P::load(vr[j], vp + at[j], lane, hd);
        }
    };
    // The first round's rows are on their way while the queries are staged.
    if (rounds > 0) {
        rowsOf(first);
        fetch();
        rowsOf(first + STEP);
    }

    // FUSED: the query heads staged (in the merge area, free until the end)
    // and the new row.
    float* qs = pga_sh;
    float* kn = pga_sh + PGA_WARPS * gb * rs;
    float* vn = kn + hd;
    if constexpr (FUSED) {
        for (int i = threadIdx.x; i < gb * hd; i += blockDim.x) qs[i] = q[((size_t)r * heads + h0) * hd + i];
        if (owner) {
            for (int i = threadIdx.x; i < hd; i += blockDim.x) {
                kn[i] = knew[(size_t)r * W + (size_t)kh * hd + i];
                vn[i] = vnew[(size_t)r * W + (size_t)kh * hd + i];
            }
        }
        __syncthreads();
        if (qnw || knw) {  // the append's norms, in shared memory
            pga_norms(qs, gb, qnw, kn, owner ? 1 : 0, knw, hd, neps);
            __syncthreads();
        }
        if (half > 0) {
            // A thread a pair of channels: one sincosf, applied to every
            // head (and the new key).
            const int nv = gb + (owner ? 1 : 0);
            for (int i = threadIdx.x; i < half; i += blockDim.x) {
                float sn, cs;
                sincosf((float)pos * inv_freq[i], &sn, &cs);
                const float c = cs * rscale, s = sn * rscale;
                const int i0 = inter ? 2 * i : i, i1 = inter ? 2 * i + 1 : i + half;
                for (int hh = 0; hh < nv; hh++) {
                    float* x = hh < gb ? qs + hh * hd : kn;
                    const float p0 = x[i0], p1 = x[i1];
                    x[i0] = p0 * c - p1 * s;
                    x[i1] = p1 * c + p0 * s;
                }
            }
            __syncthreads();
        }
        if (owner && hg == 0) {
            const size_t dst = (size_t)E[3 * r + 1] * W + (size_t)kh * hd;
            for (int i = threadIdx.x; i < hd; i += blockDim.x) {
                kp[dst + i] = kn[i];
                vp[dst + i] = vn[i];
            }
        }
    }
    float qv[GM][NE], acc[GM][NE], mx[GM], sm[GM];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        mx[g] = -INFINITY;
        sm[g] = 0.f;
#pragma unroll
        for (int e = 0; e < NE; e++) {
            const int c = P::chan(lane, e);
            qv[g][e] = g < gb && c < hd ? (FUSED ? qs[g * hd + c] : q[((size_t)r * heads + h0 + g) * hd + c]) : 0.f;
            acc[g][e] = 0.f;
        }
    }
    if constexpr (FUSED) __syncthreads(); // every warp has its heads before any writes the merge area

    int t = first;
    for (int i = 0; i < rounds; i++, t += STEP) {
        if (i > 0) {
            fetch();
            rowsOf(t + STEP); // the next round's lookups, under this round's loads
        }
        pga_weigh<NE, GM, KEYS>(kr, vr, end - t, qv, acc, mx, sm, gb, scale, lane);
    }
    if (owner && w == 0) { // FUSED's new key
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            P::load(kr[j], kn, lane, hd);
            P::load(vr[j], vn, lane, hd);
        }
        pga_weigh<NE, GM, KEYS>(kr, vr, 1, qv, acc, mx, sm, gb, scale, lane);
    }

    // The warps' states to shared memory; warp u merges heads u,
    // u + PGA_WARPS, ...
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= gb) break;
        float* sh = pga_sh + (w * gb + g) * rs;
        P::store(sh, acc[g], lane, hd);
        if (lane == 0) {
            sh[hd] = mx[g];
            sh[hd + 1] = sm[g];
        }
    }
    __syncthreads();
    for (int g = w; g < gb; g += PGA_WARPS) {
        float M = -INFINITY;
#pragma unroll
        for (int u = 0; u < PGA_WARPS; u++) M = fmaxf(M, pga_sh[(u * gb + g) * rs + hd]);
        float L = 0.f, O[NE];
#pragma unroll
        for (int e = 0; e < NE; e++) O[e] = 0.f;
#pragma unroll
        for (int u = 0; u < PGA_WARPS; u++) {
            const float* sh = pga_sh + (u * gb + g) * rs;
            // A warp without keys weighs 0 (its sum and outputs are 0; its
            // max -inf, and -inf - -inf is NaN).
            const float f = sh[hd] == -INFINITY ? 0.f : expf(sh[hd] - M);
            L += sh[hd + 1] * f;
            float x[NE];
            P::load(x, sh, lane, hd);
#pragma unroll
            for (int e = 0; e < NE; e++) O[e] += x[e] * f;
        }
        const size_t qh = (size_t)r * heads + h0 + g;
        if (splits == 1) {
#pragma unroll
            for (int e = 0; e < NE; e++) O[e] /= L;
            P::store(out + qh * hd, O, lane, hd);
        } else {
            const size_t pi = ((size_t)blockIdx.x * gb + g) * splits + split;
            const size_t T = (size_t)gridDim.x * gb * splits;
            P::store(part + pi * hd, O, lane, hd);
            if (lane == 0) {
                part[T * hd + 2 * pi] = M;
                part[T * hd + 2 * pi + 1] = L;
            }
        }
    }
    if (splits == 1) return;
    // The last of the row's splits to finish merges them (as attn_decode),
    // a warp a head: every split's loads issued without a branch on what
    // they hold (an empty split's max -inf weighs 0: its sum and outputs
    // are 0, and the row's max is finite, the share holding pos being
    // another).
    __shared__ int pga_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) pga_last = atomicAdd(ticket + blockIdx.x, 1) == splits - 1;
    __syncthreads();
    if (!pga_last) return;
    __threadfence();
    if (threadIdx.x == 0) ticket[blockIdx.x] = 0;
    const size_t T = (size_t)gridDim.x * gb * splits;
    for (int g = w; g < gb; g += PGA_WARPS) {
        const size_t p0 = ((size_t)blockIdx.x * gb + g) * splits;
        const float* po = part + p0 * hd;
        const float* pml = part + T * hd + 2 * p0;
        float M = -INFINITY;
        for (int s2 = lane; s2 < splits; s2 += WARP) M = fmaxf(M, __ldcg(pml + 2 * s2));
        M = warp_max(M);
        float den = 0.f, o[NE];
#pragma unroll
        for (int e = 0; e < NE; e++) o[e] = 0.f;
#pragma unroll 4
        for (int s2 = 0; s2 < splits; s2++) {
            float x[NE];
            P::template load<true>(x, po + (size_t)s2 * hd, lane, hd);
            const float f = __expf(__ldcg(pml + 2 * s2) - M);
            den += f * __ldcg(pml + 2 * s2 + 1);
#pragma unroll
            for (int e = 0; e < NE; e++) o[e] += f * x[e];
        }
#pragma unroll
        for (int e = 0; e < NE; e++) o[e] /= den;
        P::store(out + ((size_t)r * heads + h0 + g) * hd, o, lane, hd);
    }
}

#define PAGED_ATTN(NAME, HD, GM)                                                                                      \
    extern "C" __global__ void __launch_bounds__(PGA_WARPS * WARP)                                                    \
        NAME(float* out, const float* q, float* kp, float* vp, const int* dyn, int enc, int heads, int kvHeads,       \
             int hd, int hgroups, float scale, int window, int bs, int keys, float* part, int* ticket, int list) {    \
        paged_attn_body<HD, GM, false>(out, q, kp, vp, dyn, enc, heads, kvHeads, hd, hgroups, scale, window, bs,      \
                                       keys, part, ticket, list, nullptr, nullptr, nullptr, 0, 1.f, 0);               \
    }
#define PAGED_ATTN_ROPE(NAME, HD, GM)                                                                                 \
    extern "C" __global__ void __launch_bounds__(PGA_WARPS * WARP)                                                    \
        NAME(float* out, const float* q, float* kp, float* vp, const int* dyn, int enc, int heads, int kvHeads,       \
             int hd, int hgroups, float scale, int window, int bs, int keys, float* part, int* ticket, int list,      \
             const float* knew, const float* vnew, const float* inv_freq, int half, float rscale, int inter,          \
             const float* qnw, const float* knw, float neps) {                                                        \
        paged_attn_body<HD, GM, true>(out, q, kp, vp, dyn, enc, heads, kvHeads, hd, hgroups, scale, window, bs, keys, \
                                      part, ticket, list, knew, vnew, inv_freq, half, rscale, inter, qnw, knw, neps); \
    }
// _g4: at most 4 query heads a block (gb <= 4: the 8B shapes' 32 heads on 8
// kv heads), in half the registers. _rope: FUSED.
PAGED_ATTN(paged_attn_64, 64, PGA_GMAX)
PAGED_ATTN(paged_attn_128, 128, PGA_GMAX)
PAGED_ATTN(paged_attn_64_g4, 64, 4)
PAGED_ATTN(paged_attn_128_g4, 128, 4)
PAGED_ATTN(paged_attn_any, 0, PGA_GMAX)
PAGED_ATTN_ROPE(paged_attn_64_rope, 64, PGA_GMAX)
PAGED_ATTN_ROPE(paged_attn_128_rope, 128, PGA_GMAX)
PAGED_ATTN_ROPE(paged_attn_64_g4_rope, 64, 4)
PAGED_ATTN_ROPE(paged_attn_128_g4_rope, 128, 4)
PAGED_ATTN_ROPE(paged_attn_any_rope, 0, PGA_GMAX)

// paged_prefill_{64,128}: attn_prefill (decode.cuh) over a paged cache, for
// the sequences of a call that run many rows (prompt chunks): a block per
// (query head, tile), a tile 64 consecutive rows of one sequence, listed
// from slot enc + tiles as (first row, rows); every key, the tile's own
// included, comes from the pool through the sequence's block table
// (paged_append ran before). Grid (heads, tiles), 256 threads; shared
// memory as attn_prefill.
template <int HD>
__device__ __forceinline__ void paged_prefill_body(float* out, const float* q, const float* kp, const float* vp,
                                                   const int* dyn, int enc, int tiles, int heads, int kvHeads,
                                                   float scale, int window, int bs) {
    constexpr int S = HD + 4, PS = APF_ROWS + 4, C4 = HD / 64; // row strides (floats); float4 channels per thread
    extern __shared__ __align__(16) float ppf[];
    float* Qs = ppf;
    float* Ks = Qs + APF_ROWS * S;
    float* Vs = Ks + APF_ROWS * S;
    float* Ps = Vs + APF_ROWS * S;
    pdl_entry();
    const int* E = dyn + enc;
    const int h = blockIdx.x, i0 = E[tiles + 2 * blockIdx.y], rows = E[tiles + 2 * blockIdx.y + 1];
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int pos0 = E[3 * i0];
    const int* table = E + E[3 * i0 + 2];
    const size_t row = (size_t)kvHeads * HD;
    const int kh = h / (heads / kvHeads);
    for (int e = tid; e < APF_ROWS * (HD / 4); e += 256) {
        const int r = e / (HD / 4), j = 4 * (e % (HD / 4));
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < rows) {
            v = *reinterpret_cast<const float4*>(q + ((size_t)(i0 + r) * heads + h) * HD + j);
            v = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
        }
        *reinterpret_cast<float4*>(Qs + r * S + j) = v;
    }
    // The rows' positions and the keys any of them sees.
    const int pfirst = pos0, plast = pos0 + rows - 1;
    const int kfirst = window > 0 ? max(0, pfirst - window + 1) : 0;
    float mrow[4], lrow[4], o[4][4 * C4];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        mrow[a] = -INFINITY, lrow[a] = 0.f;
#pragma unroll
        for (int c = 0; c < 4 * C4; c++) o[a][c] = 0.f;
    }
    for (int k0 = kfirst; k0 <= plast; k0 += APF_ROWS) {
        __syncthreads(); // the previous tile's K, V and P are no longer read
        for (int e = tid; e < APF_ROWS * (HD / 4); e += 256) {
            const int r = e / (HD / 4), j = 4 * (e % (HD / 4)), t = k0 + r;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
            if (t <= plast) {
                const size_t at = ((size_t)table[t / bs] * bs + t % bs) * row + (size_t)kh * HD + j;
                kv = *reinterpret_cast<const float4*>(kp + at);
                vv = *reinterpret_cast<const float4*>(vp + at);
            }
            *reinterpret_cast<float4*>(Ks + r * S + j) = kv;
            *reinterpret_cast<float4*>(Vs + r * S + j) = vv;
        }
        __syncthreads();
        // Scores of rows 4ty + a against keys tx + 16b.
        float sc[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) sc[a][b] = 0.f;
#pragma unroll 4
        for (int d = 0; d < HD; d += 4) {
            float4 qa[4], kb[4];
#pragma unroll
            for (int a = 0; a < 4; a++) qa[a] = *reinterpret_cast<const float4*>(Qs + (4 * ty + a) * S + d);
#pragma unroll
            for (int b = 0; b < 4; b++) kb[b] = *reinterpret_cast<const float4*>(Ks + (tx + 16 * b) * S + d);
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++)
                    sc[a][b] += qa[a].x * kb[b].x + qa[a].y * kb[b].y + qa[a].z * kb[b].z + qa[a].w * kb[b].w;
        }
        // Online softmax: the 16 threads of a row are lanes of one half warp.
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int p = pos0 + 4 * ty + a, lo = window > 0 ? max(0, p - window + 1) : 0;
            float mx = -INFINITY;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int t = k0 + tx + 16 * b;
                if (t > p || t < lo) sc[a][b] = -INFINITY;
                mx = fmaxf(mx, sc[a][b]);
            }
#pragma unroll
            for (int off = 1; off < 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, off));
            const float mnew = fmaxf(mrow[a], mx);
            const float corr = mnew == -INFINITY ? 1.f : __expf(mrow[a] - mnew);
            float sum = 0.f;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const float e = sc[a][b] == -INFINITY ? 0.f : __expf(sc[a][b] - mnew);
                Ps[(4 * ty + a) * PS + tx + 16 * b] = e;
                sum += e;
            }
#pragma unroll
            for (int off = 1; off < 16; off <<= 1) sum += __shfl_xor_sync(0xffffffff, sum, off);
            mrow[a] = mnew;
            lrow[a] = lrow[a] * corr + sum;
#pragma unroll
            for (int c = 0; c < 4 * C4; c++) o[a][c] *= corr;
        }
        __syncthreads();
        // Weighted values: rows 4ty + a, channels 4tx + 64c' .. + 3.
#pragma unroll 4
        for (int j = 0; j < APF_ROWS; j++) {
            float pa[4];
#pragma unroll
            for (int a = 0; a < 4; a++) pa[a] = Ps[(4 * ty + a) * PS + j];
#pragma unroll
            for (int cc = 0; cc < C4; cc++) {
                const float4 v = *reinterpret_cast<const float4*>(Vs + j * S + 64 * cc + 4 * tx);
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    o[a][4 * cc] += pa[a] * v.x;
                    o[a][4 * cc + 1] += pa[a] * v.y;
                    o[a][4 * cc + 2] += pa[a] * v.z;
                    o[a][4 * cc + 3] += pa[a] * v.w;
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int r = 4 * ty + a;
        if (r >= rows) continue;
        const float inv = 1.f / lrow[a];
        float* op = out + ((size_t)(i0 + r) * heads + h) * HD;
#pragma unroll
        for (int cc = 0; cc < C4; cc++)
            *reinterpret_cast<float4*>(op + 64 * cc + 4 * tx) =
                make_float4(o[a][4 * cc] * inv, o[a][4 * cc + 1] * inv, o[a][4 * cc + 2] * inv, o[a][4 * cc + 3] * inv);
    }
}

#define PAGED_PREFILL(NAME, HD)                                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                                                 \
        NAME(float* out, const float* q, const float* kp, const float* vp, const int* dyn, int enc, int tiles,        \
             int heads, int kvHeads, float scale, int window, int bs) {                                               \
        paged_prefill_body<HD>(out, q, kp, vp, dyn, enc, tiles, heads, kvHeads, scale, window, bs);                   \
    }
PAGED_PREFILL(paged_prefill_64, 64)
PAGED_PREFILL(paged_prefill_128, 128)

// paged_copy copies block src to block dst in each of the pool's planes
// (a layer's keys or values), plane floats apart, of blockFloats floats a
// block. Grid (planes, chunks), 256 threads.
extern "C" __global__ void paged_copy(float* pool, unsigned long long plane, int blockFloats, int dst, int src) {
    pdl_entry();
    float* p = pool + (size_t)blockIdx.x * plane;
    const float* s = p + (size_t)src * blockFloats;
    float* d = p + (size_t)dst * blockFloats;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < blockFloats; j += gridDim.y * blockDim.x) d[j] = s[j];
}
