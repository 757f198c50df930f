// htree attention (docs/htree.md, htree.Ops): the incremental update of the
// mean-pooled tree and the per-query attention over its levels. Uses the
// radix select and compaction of dsa.cuh. Plain kernels, correctness first.

// Node nodes lo..hi of a level as the mean of their present children
// (children nodes in the level below), summed in order in float32 like
// htree's meanRows; keys and values together. row = kvHeads*headDim.
extern "C" __global__ void ht_mean(float* dk, float* dv, const float* sk, const float* sv, int lo, int hi, int rate,
                                   int children, int row) {
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

// Attention of one query head per block (job = job0 + blockIdx.x: query i
// = job / heads at position pos0 + i, head h = job % heads): per level from
// the query's top, the candidates (0..rho at the top, else the children of
// the selected parents up to rho), their scores against the query rotated to
// rank n-1 with each key rotated to its rank, the top-K selection (rho
// pinned to +inf, ties to the smaller node), and the unselected candidates'
// terms merged into the global softmax state. Every level's term sum is
// taken directly over the unselected candidates (the CPU engine subtracts
// the selected ones from the sum of all; the same sum up to rounding).
//
// scratch per block (stride words): scores [mc], cands [mc], flags [mc],
// parents [topk]. Shared: the rotated query and the output sum (2*hd floats).
extern "C" __global__ void ht_attend(float* out, const float* q, const float* K, const float* V, HtLevels lv,
                                     const float* cosT, const float* sinT, int half, int interleaved, float* scratch,
                                     int stride, int mc, int job0, int pos0, int heads, int group, int kvHeads,
                                     int hd, float scale, int rate, int topk, int topCand) {
    extern __shared__ float sh[];
    float* qrot = sh;
    float* og = sh + hd;
    __shared__ float red[32];
    __shared__ int s_cut;
    int job = job0 + blockIdx.x;
    int i = job / heads, h = job % heads, t = pos0 + i, kh = h / group;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    float* scores = scratch + (size_t)blockIdx.x * stride;
    int* cands = (int*)(scores + mc);
    int* flags = cands + mc;
    int* parents = flags + mc;
    int row = kvHeads * hd;

    int top = 0, pw = 1;
    for (int tt = t; tt >= topCand; tt /= rate) top++, pw *= rate;
    for (int x = threadIdx.x; x < hd; x += blockDim.x) og[x] = 0.f;
    float gm = -INFINITY, gl = 0.f;
    int np = 0;
    const float* qv = q + ((size_t)i * heads + h) * hd;
    for (int lev = top; lev >= 0; lev--, pw /= rate) {
        int rho = t / pw;
        int n;
        if (lev == top) {
            n = rho + 1;
            for (int x = threadIdx.x; x < n; x += blockDim.x) cands[x] = x;
        } else {
            int last = parents[np - 1];
            n = (np - 1) * rate + min(rate, rho - last * rate + 1);
            for (int x = threadIdx.x; x < n; x += blockDim.x) cands[x] = parents[x / rate] * rate + x % rate;
        }
        __syncthreads();
        if (lev > 0 && n <= topk) {  // every candidate is expanded: no term at this level
            for (int x = threadIdx.x; x < n; x += blockDim.x) parents[x] = cands[x];
            np = n;
            __syncthreads();
            continue;
        }
        // The query rotated to rank n-1.
        const float* cq = cosT + (size_t)(n - 1) * half;
        const float* sq = sinT + (size_t)(n - 1) * half;
        for (int x = threadIdx.x; x < hd; x += blockDim.x) qrot[x] = qv[x];
        __syncthreads();
        for (int x = threadIdx.x; x < half; x += blockDim.x) {
            int i0 = interleaved ? 2 * x : x, i1 = interleaved ? 2 * x + 1 : x + half;
            float a = qrot[i0], b = qrot[i1];
            qrot[i0] = __fsub_rn(__fmul_rn(a, cq[x]), __fmul_rn(b, sq[x]));
            qrot[i1] = __fadd_rn(__fmul_rn(b, cq[x]), __fmul_rn(a, sq[x]));
        }
        __syncthreads();
        const float* Kl = K + (size_t)lv.off[lev] * row + (size_t)kh * hd;
        const float* Vl = V + (size_t)lv.off[lev] * row + (size_t)kh * hd;
        // Scores: a warp per candidate, the key rotated to its rank inside the dot.
        float mx = -INFINITY;
        for (int r = warp; r < n; r += nw) {
            const float* kr = Kl + (size_t)cands[r] * row;
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
            mx = fmaxf(mx, acc);
        }
        mx = block_max(mx, red);
        __syncthreads();
        if (lev > 0) {
            // Top-K by (score desc, node asc), rho (rank n-1) pinned to +inf.
            auto key = [&](int r) { return tk_key(r == n - 1 ? INFINITY : scores[r]); };
            int need;
            unsigned T = tk_radix(key, n, topk, &need);
            // The need-th tie in rank order is the last tie kept.
            tk_compact(
                n, [&](int r) { return key(r) == T; },
                [&](int r, int rank) {
                    if (rank == need - 1) s_cut = r;
                });
            int cut = s_cut;
            np = tk_compact(
                n,
                [&](int r) {
                    unsigned k = key(r);
                    bool sel = k > T || (k == T && r <= cut);
                    flags[r] = sel;
                    return sel;
                },
                [&](int r, int rank) { parents[rank] = cands[r]; });
        }
        // The unselected candidates' terms.
        float ls = 0.f;
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            float w = lev > 0 && flags[r] ? 0.f : expf(scores[r] - mx);
            scores[r] = w;
            ls += w;
        }
        ls = block_sum(ls, red);
        __syncthreads();
        if (ls > 0.f) {
            float nm = fmaxf(gm, mx);
            float fg = expf(gm - nm), fl = expf(mx - nm);
            for (int x = threadIdx.x; x < hd; x += blockDim.x) {
                float o = 0.f;
                for (int r = 0; r < n; r++) {
                    float w = scores[r];
                    if (w != 0.f) o += w * Vl[(size_t)cands[r] * row + x];
                }
                og[x] = og[x] * fg + o * fl;
            }
            gl = gl * fg + ls * fl;
            gm = nm;
        }
        __syncthreads();
    }
    float inv = 1.f / gl;
    for (int x = threadIdx.x; x < hd; x += blockDim.x) out[((size_t)i * heads + h) * hd + x] = og[x] * inv;
}
