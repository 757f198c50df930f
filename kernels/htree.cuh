// htree attention (docs/htree.md, htree.Ops): the incremental update of the
// mean-pooled tree and the per-query attention over its levels. Uses the
// radix select and compaction of dsa.cuh.

// Node nodes lo..hi of a level as the mean of their present children
// (children nodes in the level below), summed in order in float32 like
// htree's meanRows; keys and values together. row = kvHeads*headDim.
extern "C" __global__ void ht_mean(float* dk, float* dv, const float* sk, const float* sv, int lo, int hi, int rate,
                                   int children, int row) {
    pdl_entry();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)(hi - lo + 1) * row) return;
    int node = lo + (int)(idx / row), ch = (int)(idx % row);
    int c0 = node * rate, c1 = min(node * rate + rate, children);
    float k = sk[(size_t)c0 * row + ch], v = sv[(size_t)c0 * row + ch];
    for (int c = c0 + 1; c < c1; c++) {
        k += sk[(size_t)c * row + ch];
        v += sv[(size_t)c * row + ch];
    }
    if (c1 - c0 != 1) {
        k /= (float)(c1 - c0);
        v /= (float)(c1 - c0);
    }
    dk[(size_t)node * row + ch] = k;
    dv[(size_t)node * row + ch] = v;
}

#define HT_MAXLEVELS 32
struct HtLevels {
    int off[HT_MAXLEVELS];  // first node of each level in the layer's K and V
};

// ---------------------------------------------------------------------------
// Decode attention over the tree, level by level from the top, four kernels
// per level (HTreeAttention queues them):
//
//   ht_score   candidates of the level and their scores, HT_T per block
//   ht_select  the top-K (levels >= 1): the next level's parents
//   ht_part    the unselected candidates' terms, one partial (m, l, o) per
//              tile of HT_T candidates
//   ht_combine (once, after level 0) every partial of the query head merged
//              into the output
//
// A job is one query head: job = job0 + blockIdx.y (blockIdx.x for the
// per-job kernels), query i = job / heads at position pos0 + i, head h =
// job % heads. Scratch per job (stride words): scores [mc], cands [mc],
// flags [mc], parents [topk]. part: [jobs of the wave, levels, tiles, hd+2].
#define HT_T 64

struct HtJob {
    int i, h, t, top;  // query row, head, position, top level
    int n;             // candidates at the level asked for
    int rho;           // the level's node holding t
};

// ht_job locates a job at level lev: its top level and, when lev <= top,
// the level's candidate count, which depends on t only: the top level
// scores 0..rho, each level below the children (up to rho) of
// min(n above, topk) parents whose last is rho above.
__device__ HtJob ht_job(int job, int pos0, int heads, int lev, int rate, int topk, int topCand) {
    HtJob j;
    j.i = job / heads;
    j.h = job % heads;
    j.t = pos0 + j.i;
    j.top = 0;
    int pw = 1;
    for (int tt = j.t; tt >= topCand; tt /= rate) j.top++, pw *= rate;
    j.n = 0;
    j.rho = 0;
    if (lev > j.top) return j;
    int rho = j.t / pw, n = rho + 1;
    for (int l = j.top - 1; l >= lev; l--) {
        pw /= rate;
        int r = j.t / pw, np = min(n, topk);
        n = (np - 1) * rate + min(rate, r - rho * rate + 1);
        rho = r;
    }
    j.n = n;
    j.rho = rho;
    return j;
}

// ht_pairs splits the two float4 a lane loads for rotary pairs 4sl .. 4sl+3
// (elements 8sl .. 8sl+7 when interleaved; else 4sl .. 4sl+3 and the same
// past half) into each pair's first (a) and second (b) element.
__device__ __forceinline__ void ht_pairs(float4 v0, float4 v1, int interleaved, float a[4], float b[4]) {
    if (interleaved) {
        a[0] = v0.x, b[0] = v0.y, a[1] = v0.z, b[1] = v0.w, a[2] = v1.x, b[2] = v1.y, a[3] = v1.z, b[3] = v1.w;
    } else {
        a[0] = v0.x, a[1] = v0.y, a[2] = v0.z, a[3] = v0.w, b[0] = v1.x, b[1] = v1.y, b[2] = v1.z, b[3] = v1.w;
    }
}

// ht_score: block (tile, job) writes the node and the score of candidates
// [HT_T*tile, HT_T*tile + HT_T) of the level: the query rotated to rank n-1
// against each key rotated to its rank inside the dot, a warp per candidate.
// (Copying the tile's key and cos/sin rows to shared memory first measured
// slower: 66 KB per block leaves three blocks per SM.) Levels >= 1 with
// n <= topk expand every candidate: only the nodes are written. 256 threads,
// 8 warps of HT_T/8 candidates; dynamic shared memory hd floats.
extern "C" __global__ void __launch_bounds__(256) ht_score(const float* q, const float* K, HtLevels lv, const float* cosT,
                                                           const float* sinT, int half, int interleaved, float* scratch,
                                                           int stride, int mc, int job0, int pos0, int heads, int group,
                                                           int kvHeads, int hd, float scale, int rate, int topk,
                                                           int topCand, int lev) {
    pdl_entry();
    extern __shared__ float qrot[];
    int job = job0 + blockIdx.y;
    HtJob j = ht_job(job, pos0, heads, lev, rate, topk, topCand);
    int r0 = blockIdx.x * HT_T;
    if (lev > j.top || r0 >= j.n) return;
    int n = j.n, kh = j.h / group, row = kvHeads * hd;
    float* scores = scratch + (size_t)blockIdx.y * stride;
    int* cands = (int*)(scores + mc);
    const int* parents = (const int*)(scores + 3 * mc);
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    __shared__ int node[HT_T];
    int cnt = min(HT_T, n - r0);
    const bool expand = lev > 0 && n <= topk;
    // Every global load of the prologue (the candidates' parents, q and its
    // rotation at rank n-1) is issued before the first store or use: one
    // round trip instead of three.
    const float* qv = q + ((size_t)j.i * heads + j.h) * hd;
    const float* cq = cosT + (size_t)(n - 1) * half;
    const float* sq = sinT + (size_t)(n - 1) * half;
    const int tx = threadIdx.x;
    int cand = 0;
    if (tx < cnt) cand = lev == j.top ? r0 + tx : parents[(r0 + tx) / rate] * rate + (r0 + tx) % rate;
    float qa = 0.f, qb = 0.f, cr = 0.f, sr = 0.f;
    const int i0 = interleaved ? 2 * tx : tx, i1 = interleaved ? 2 * tx + 1 : tx + half;
    if (!expand && tx < half) qa = qv[i0], qb = qv[i1], cr = cq[tx], sr = sq[tx];
    if (tx < cnt) node[tx] = cand, cands[r0 + tx] = cand;
    if (expand) return;
    for (int e = 2 * half + tx; e < hd; e += blockDim.x) qrot[e] = qv[e];
    if (tx < half) {
        qrot[i0] = __fsub_rn(__fmul_rn(qa, cr), __fmul_rn(qb, sr));
        qrot[i1] = __fadd_rn(__fmul_rn(qb, cr), __fmul_rn(qa, sr));
    }
    for (int e = tx + blockDim.x; e < half; e += blockDim.x) {  // head dims past 512
        const int e0 = interleaved ? 2 * e : e, e1 = interleaved ? 2 * e + 1 : e + half;
        const float a = qv[e0], b = qv[e1];
        qrot[e0] = __fsub_rn(__fmul_rn(a, cq[e]), __fmul_rn(b, sq[e]));
        qrot[e1] = __fadd_rn(__fmul_rn(b, cq[e]), __fmul_rn(a, sq[e]));
    }
    __syncthreads();
    const float* Kl = K + (size_t)lv.off[lev] * row + (size_t)kh * hd;
    // Each warp takes HT_T/8 consecutive candidates (measured faster than
    // taking every 8th: 100 against 117 us at level 0 of 128k).
    constexpr int PW = HT_T / 8;
    const int L = half / 4;  // 16-byte loads: lanes per candidate, four pairs each
    if (half % 4 == 0 && L > 0 && L <= WARP && WARP % L == 0 && hd % 4 == 0) {
        // Lane sl of a group of L takes pairs 4sl .. 4sl+3: two float4 of the
        // key (and of q), one of cos and one of sin; WARP / L candidates a pass.
        const int cpp = WARP / L, sub = lane / L, sl = lane % L;
        const int a0 = interleaved ? 8 * sl : 4 * sl, a1 = interleaved ? 8 * sl + 4 : half + 4 * sl;
        float qa4[4], qb4[4];
        ht_pairs(*reinterpret_cast<const float4*>(qrot + a0), *reinterpret_cast<const float4*>(qrot + a1), interleaved,
                 qa4, qb4);
        // The dot product of the candidate of pass u0 (0 when none).
        auto dot = [&](int u0) {
            const int x0 = warp * PW + u0 + sub, r = r0 + x0;
            float acc = 0.f;
            if (u0 + sub < PW && x0 < cnt) {
                const float* kr = Kl + (size_t)node[x0] * row;
                const float4 k0 = *reinterpret_cast<const float4*>(kr + a0), k1 = *reinterpret_cast<const float4*>(kr + a1);
                const float4 c4 = *reinterpret_cast<const float4*>(cosT + (size_t)r * half + 4 * sl);
                const float4 s4 = *reinterpret_cast<const float4*>(sinT + (size_t)r * half + 4 * sl);
                float ka[4], kb[4];
                ht_pairs(k0, k1, interleaved, ka, kb);
                const float cc[4] = {c4.x, c4.y, c4.z, c4.w}, ss[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc += cc[e] * (qa4[e] * ka[e] + qb4[e] * kb[e]) + ss[e] * (qb4[e] * ka[e] - qa4[e] * kb[e]);
                for (int e = 2 * half + sl; e < hd; e += L) acc += qrot[e] * kr[e];
            }
            for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            return acc;
        };
        auto put = [&](int u0, float acc) {
            const int x0 = warp * PW + u0 + sub;
            if (u0 + sub < PW && x0 < cnt && sl == 0) scores[r0 + x0] = scale * acc;
        };
        if (cpp == 2) {  // half 64 (head dim 128): all four passes' loads in flight at once
            float acc[PW / 2];
#pragma unroll
            for (int p = 0; p < PW / 2; p++) acc[p] = dot(2 * p);
#pragma unroll
            for (int p = 0; p < PW / 2; p++) put(2 * p, acc[p]);
        } else {
            for (int u0 = 0; u0 < PW; u0 += cpp) put(u0, dot(u0));
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < PW; u++) {
        int x0 = warp * PW + u, r = r0 + x0;
        if (x0 >= cnt) break;
        const float* kr = Kl + (size_t)node[x0] * row;
        const float* c = cosT + (size_t)r * half;
        const float* s = sinT + (size_t)r * half;
        float acc = 0.f;
        for (int x = lane; x < half; x += WARP) {
            int i0 = interleaved ? 2 * x : x, i1 = interleaved ? 2 * x + 1 : x + half;
            float a1 = qrot[i0], a2 = qrot[i1], b1 = kr[i0], b2 = kr[i1];
            acc += c[x] * (a1 * b1 + a2 * b2) + s[x] * (a2 * b1 - a1 * b2);
        }
        for (int x = 2 * half + lane; x < hd; x += WARP) acc += qrot[x] * kr[x];
        acc = scale * warp_sum(acc);
        if (lane == 0) scores[r] = acc;
    }
}

// ht_select: block per job at level lev >= 1: the next level's parents. With
// n <= topk every candidate; otherwise the top-K by (score desc, node asc)
// with rho (rank n-1) pinned to +inf, flags[r] marking the selected ranks.
// 1024 threads. staged: the scores' keys are read into shared memory once
// (dynamic, 4 mc bytes) instead of from scratch by every pass.
extern "C" __global__ void __launch_bounds__(1024) ht_select(float* scratch, int stride, int mc, int job0, int pos0,
                                                             int heads, int rate, int topk, int topCand, int lev,
                                                             int staged) {
    pdl_entry();
    extern __shared__ unsigned hts_keys[];
    __shared__ int s_cut;
    int job = job0 + blockIdx.x;
    HtJob j = ht_job(job, pos0, heads, lev, rate, topk, topCand);
    if (lev > j.top || lev == 0) return;
    int n = j.n;
    float* scores = scratch + (size_t)blockIdx.x * stride;
    int* cands = (int*)(scores + mc);
    int* flags = cands + mc;
    int* parents = flags + mc;
    if (n <= topk) {
        for (int x = threadIdx.x; x < n; x += blockDim.x) parents[x] = cands[x];
        return;
    }
    if (staged) {
        tk_stage(scores, n, hts_keys);
        __syncthreads();
    }
    auto key = [&](int r) { return r == n - 1 ? tk_key(INFINITY) : staged ? hts_keys[r] : tk_key(scores[r]); };
    int need, ties;
    unsigned T = tk_radix(key, n, topk, &need, &ties);
    // The need-th tie in rank order is the last tie kept.
    if (ties == need) {
        if (threadIdx.x == 0) s_cut = n;
    } else {
        tk_compact(
            n, [&](int r) { return key(r) == T; },
            [&](int r, int rank) {
                if (rank == need - 1) s_cut = r;
            });
    }
    __syncthreads();
    int cut = s_cut;
    tk_compact(
        n,
        [&](int r) {
            unsigned k = key(r);
            bool sel = k > T || (k == T && r <= cut);
            flags[r] = sel;
            return sel;
        },
        [&](int r, int rank) { parents[rank] = cands[r]; });
}

// ht_part: block (tile, job) sums the terms of the tile's candidates that
// are not selected (all of them at level 0; none at levels >= 1 with n <=
// topk): m = their largest score, l = sum exp(s - m), o = sum exp(s - m) v,
// written to the job's partial of (lev, tile), l = 0 when there are none.
// 128 threads.
extern "C" __global__ void __launch_bounds__(128) ht_part(float* part, const float* V, HtLevels lv, const float* scratch,
                                                          int stride, int mc, int job0, int pos0, int heads, int group,
                                                          int kvHeads, int hd, int rate, int topk, int topCand,
                                                          int levels, int tiles, int lev) {
    pdl_entry();
    __shared__ float w[HT_T];
    __shared__ int node[HT_T];
    __shared__ float red[32];
    int job = job0 + blockIdx.y;
    HtJob j = ht_job(job, pos0, heads, lev, rate, topk, topCand);
    float* pp = part + (((size_t)blockIdx.y * levels + lev) * tiles + blockIdx.x) * (hd + 2);
    int r0 = blockIdx.x * HT_T;
    int n = j.n;
    if (lev > j.top || r0 >= n || (lev > 0 && n <= topk)) {
        if (threadIdx.x == 0) pp[hd + 1] = 0.f;
        return;
    }
    const float* scores = scratch + (size_t)blockIdx.y * stride;
    const int* cands = (const int*)(scores + mc);
    const int* flags = cands + mc;
    int cnt = min(HT_T, n - r0);
    float s = -INFINITY;
    if (threadIdx.x < cnt) {
        int r = r0 + threadIdx.x;
        bool term = lev == 0 || !flags[r];
        s = term ? scores[r] : -INFINITY;
        node[threadIdx.x] = cands[r];
    }
    float m = block_max(s, red);
    __syncthreads();
    if (m == -INFINITY) {  // every candidate of the tile selected
        if (threadIdx.x == 0) pp[hd + 1] = 0.f;
        return;
    }
    float e = s == -INFINITY ? 0.f : expf(s - m);
    if (threadIdx.x < HT_T) w[threadIdx.x] = threadIdx.x < cnt ? e : 0.f;
    float l = block_sum(e, red);
    __syncthreads();
    int row = kvHeads * hd;
    const float* Vl = V + (size_t)lv.off[lev] * row + (size_t)(j.h / group) * hd;
    const int L = hd / 4;  // 16-byte loads: lanes per row, RP rows at a time
    if (hd % 4 == 0 && L > 0 && blockDim.x == 128 && 128 % L == 0 && 128 / L <= 8) {
        __shared__ float4 acc4[128];
        const int RP = 128 / L, rp = threadIdx.x / L, c = threadIdx.x % L;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int r = rp; r < cnt; r += RP) {
            const float wr = w[r];
            const float4 v = *reinterpret_cast<const float4*>(Vl + (size_t)node[r] * row + 4 * c);
            o.x += wr * v.x, o.y += wr * v.y, o.z += wr * v.z, o.w += wr * v.w;
        }
        acc4[threadIdx.x] = o;
        __syncthreads();
        if (threadIdx.x < L) {  // the RP partial sums of channels 4c .. 4c+3, in order
            float4 t = acc4[threadIdx.x];
            for (int q = 1; q < RP; q++) {
                const float4 u = acc4[q * L + threadIdx.x];
                t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
            }
            float* d = pp + 4 * threadIdx.x;  // hd + 2 floats a partial: not 16-byte aligned
            d[0] = t.x, d[1] = t.y, d[2] = t.z, d[3] = t.w;
        }
    } else {
        for (int x = threadIdx.x; x < hd; x += blockDim.x) {
            // Selected rows have weight 0 and are read anyway: no branch, so the
            // loads of a run of rows overlap.
            float o = 0.f;
#pragma unroll 8
            for (int r = 0; r < cnt; r++) o += w[r] * Vl[(size_t)node[r] * row + x];
            pp[x] = o;
        }
    }
    if (threadIdx.x == 0) {
        pp[hd] = m;
        pp[hd + 1] = l;
    }
}

// ht_combine: block per job: out = sum_p e^(m_p - M) o_p / sum_p e^(m_p - M)
// l_p over the job's partials with l_p > 0 (levels 0..top, every tile). The
// factors e^(m_p - M) go to shared memory first; then each warp takes a run
// of partials, each lane up to HT_CC columns held in registers, the rows of
// HT_CP partials loaded before they are added (so the loads overlap), and
// the warps' sums are added in shared memory. 512 threads; dynamic shared
// memory np + 16*hd floats.
#define HT_CC 8
#define HT_CP 8
extern "C" __global__ void __launch_bounds__(512) ht_combine(float* out, const float* part, int job0, int pos0, int heads,
                                                             int hd, int rate, int topk, int topCand, int levels,
                                                             int tiles) {
    pdl_entry();
    extern __shared__ float sh[];
    __shared__ float red[32];
    int job = job0 + blockIdx.x;
    HtJob j = ht_job(job, pos0, heads, 0, rate, topk, topCand);
    const float* pj = part + (size_t)blockIdx.x * levels * tiles * (hd + 2);
    int np = (j.top + 1) * tiles;
    float* f = sh;             // [np]
    float* acc = sh + np;      // [nw, hd]
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    float M = -INFINITY;
    for (int p = threadIdx.x; p < np; p += blockDim.x) {
        const float* pp = pj + (size_t)p * (hd + 2);
        if (pp[hd + 1] > 0.f) M = fmaxf(M, pp[hd]);
    }
    M = block_max(M, red);
    __syncthreads();
    float L = 0.f;
    for (int p = threadIdx.x; p < np; p += blockDim.x) {
        const float* pp = pj + (size_t)p * (hd + 2);
        float l = pp[hd + 1], e = l > 0.f ? expf(pp[hd] - M) : 0.f;
        f[p] = e;
        L += e * l;
    }
    L = block_sum(L, red);  // its barriers also publish f
    int per = (np + nw - 1) / nw, p0 = warp * per, p1 = min(np, p0 + per);
    for (int x0 = 0; x0 < hd; x0 += WARP * HT_CC) {
        float o[HT_CC];
#pragma unroll
        for (int c = 0; c < HT_CC; c++) o[c] = 0.f;
        // HT_CP partials' loads in flight before the first is added; the
        // sums stay in partial order, skipping those with e == 0 (their
        // rows were never written).
        for (int pb = p0; pb < p1; pb += HT_CP) {
            float e[HT_CP], v[HT_CP][HT_CC];
#pragma unroll
            for (int u = 0; u < HT_CP; u++) {
                const int p = pb + u;
                e[u] = p < p1 ? f[p] : 0.f;
                const float* pp = pj + (size_t)p * (hd + 2) + x0 + lane;
#pragma unroll
                for (int c = 0; c < HT_CC; c++) v[u][c] = e[u] != 0.f && x0 + lane + WARP * c < hd ? pp[WARP * c] : 0.f;
            }
#pragma unroll
            for (int u = 0; u < HT_CP; u++) {
                if (e[u] == 0.f) continue;
#pragma unroll
                for (int c = 0; c < HT_CC; c++)
                    if (x0 + lane + WARP * c < hd) o[c] += e[u] * v[u][c];
            }
        }
#pragma unroll
        for (int c = 0; c < HT_CC; c++)
            if (x0 + lane + WARP * c < hd) acc[warp * hd + x0 + lane + WARP * c] = o[c];
    }
    __syncthreads();
    float inv = 1.f / L;
    for (int x = threadIdx.x; x < hd; x += blockDim.x) {
        float o = 0.f;
        for (int w = 0; w < nw; w++) o += acc[w * hd + x];
        out[((size_t)j.i * heads + j.h) * hd + x] = o * inv;
    }
}
