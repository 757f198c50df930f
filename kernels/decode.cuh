// Kernels whose launches do not depend on the token position, so that a
// decode step can be captured once as a CUDA graph and replayed: the
// position (and the token ids) live in a small device array `dyn` that the
// backend writes before each step. pos0 = dyn[0] + posRel.

// Embedding gather: dst[i, :] = table[ids[i], :] as float32; ids on the device.
extern "C" __global__ void embed_ids(const void* table, const uint8_t* S, float global, int format, const int* ids,
                                     float* dst, int n) {
    pdl_launch();
    pdl_wait();
    int i = blockIdx.x;
    size_t r = (size_t)max(ids[i], 0);  // a held pick of -1 - id (NaN logits): row 0; its step is dropped
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float v;
        if (format == 0) v = ((const float*)table)[r * n + j];
        else if (format == 1) v = bf16_to_f32(((const uint16_t*)table)[r * n + j]);
        else {
            uint8_t b = ((const uint8_t*)table)[r * (n / 2) + j / 2];
            v = kE2M1[(b >> (4 * (j & 1))) & 0xf] * e4m3_to_f32(S[r * (n / 16) + j / 16]) * global;
        }
        dst[(size_t)i * n + j] = v;
    }
}

// RoPE as the rope kernel, on up to two tensors at once (q and k: heads1
// vectors per row of x1, heads2 of x2, both `stride` apart).
extern "C" __global__ void rope_dyn(float* x1, int heads1, float* x2, int heads2, const float* inv_freq, int rows,
                                    int stride, int off, int half, const int* dyn, int posRel, float scale,
                                    int interleaved, int inverse) {
    pdl_launch();
    pdl_wait();
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int heads = heads1 + heads2;
    int total = rows * heads * half;
    if (idx >= total) return;
    int pos0 = dyn[0] + posRel;
    int i = idx % half, vec = idx / half, row = vec / heads, hh = vec % heads;
    float a = (float)(pos0 + row) * inv_freq[i];
    float c = cosf(a) * scale, s = sinf(a) * scale;
    if (inverse) s = -s;
    float* v = hh < heads1 ? x1 + ((size_t)row * heads1 + hh) * stride + off
                           : x2 + ((size_t)row * heads2 + (hh - heads1)) * stride + off;
    int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    float p = v[i0], q = v[i1];
    v[i0] = p * c - q * s;
    v[i1] = q * c + p * s;
}

// rope_dyn after in-place per-head RMSNorms of x1's and x2's vectors
// (Qwen3's q_norm and k_norm; w1, w2 their weights of n == stride values,
// null: that tensor's not normed), in one launch instead of three: a warp a
// vector, its sum of squares as rmsnorm's (rsqrtf(ss / n + eps)), then each
// channel w[c] * (v[c] * inv) as rmsnorm writes it, the pairs of [off, off +
// 2*half) rotated as rope_dyn rotates them. A lane reads and writes only its
// own channels (after the warp's sum), so nothing races. Grid
// ceil(rows * (heads1 + heads2) / 8), 256 threads.
extern "C" __global__ void rope_norm_dyn(float* x1, int heads1, float* x2, int heads2, const float* inv_freq,
                                         int rows, int stride, int off, int half, const int* dyn, int posRel,
                                         float scale, int interleaved, int inverse, const float* w1,
                                         const float* w2, float eps) {
    pdl_launch();
    pdl_wait();
    const int lane = threadIdx.x % WARP, vec = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int heads = heads1 + heads2;
    if (vec >= rows * heads) return;  // the whole warp
    const int row = vec / heads, hh = vec % heads;
    float* v = hh < heads1 ? x1 + ((size_t)row * heads1 + hh) * stride : x2 + ((size_t)row * heads2 + (hh - heads1)) * stride;
    const float* w = hh < heads1 ? w1 : w2;
    float inv = 1.f;
    if (w) {
        float ss = 0.f;
        for (int c = lane; c < stride; c += WARP) ss += v[c] * v[c];
        ss = warp_sum(ss);
        inv = rsqrtf(ss / stride + eps);
    }
    auto at = [&](int c) { return w ? w[c] * (v[c] * inv) : v[c]; };
    if (w) {  // the channels no pair rotates: normalized only
        for (int c = lane; c < stride; c += WARP)
            if (c < off || c >= off + 2 * half) v[c] = at(c);
    }
    const int pos0 = dyn[0] + posRel;
    for (int i = lane; i < half; i += WARP) {
        const float a = (float)(pos0 + row) * inv_freq[i];
        float c = cosf(a) * scale, s = sinf(a) * scale;
        if (inverse) s = -s;
        const int i0 = off + (interleaved ? 2 * i : i), i1 = off + (interleaved ? 2 * i + 1 : i + half);
        const float p = at(i0), q = at(i1);
        v[i0] = p * c - q * s;
        v[i1] = q * c + p * s;
    }
}

// Causal attention with the step's keys and values appended to the cache in
// the same launch. Grid (heads, m, splits), ATT_THREADS threads; hd % 4 == 0,
// hd <= 256. Query row i is at position p = pos0 + i and sees keys
// [start, p], start = max(0, p - window + 1) with a window, else 0; key t
// comes from the cache when t < pos0 and from row t - pos0 of knew/vnew
// otherwise (nothing in this launch reads the cache at pos0 and after, which
// blocks (h < kvHeads, i, 0) write). Split s takes an equal share of the keys;
// with one split the block writes out, else its (max, sum, unnormalized
// output) go to part for attn_combine. Scores live in dynamic shared memory
// (one float per key of the share).
#define ATT_THREADS 256
// HD: the head size when known at compile time (the loops unroll, so every
// load of a key is in flight at once), else 0.
template <int HD>
__device__ __forceinline__ void attention_kv_body(float* out, const float* q, const float* knew, const float* vnew,
                                                  float* kc, float* vc, const int* dyn, int posRel, int heads,
                                                  int kvHeads, int hd, float scale, int window, float* part) {
    extern __shared__ float att_sh[];
    __shared__ float red[32];
    __shared__ __align__(16) float qs[256];
    __shared__ __align__(16) float pv[ATT_THREADS / WARP][256];
    if (HD) hd = HD;
    pdl_launch();
    pdl_wait();
    const int h = blockIdx.x, i = blockIdx.y, s = blockIdx.z, splits = gridDim.z;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP, nw = ATT_THREADS / WARP;
    const int pos0 = dyn[0] + posRel;
    const size_t row = (size_t)kvHeads * hd;
    if (s == 0 && h < kvHeads) {
        const float* kn = knew + (size_t)i * row + (size_t)h * hd;
        const float* vn = vnew + (size_t)i * row + (size_t)h * hd;
        float* kd = kc + (size_t)(pos0 + i) * row + (size_t)h * hd;
        float* vd = vc + (size_t)(pos0 + i) * row + (size_t)h * hd;
        for (int j = tid; j < hd; j += ATT_THREADS) {
            kd[j] = kn[j];
            vd[j] = vn[j];
        }
    }
    const int p = pos0 + i;
    const int start = window > 0 ? max(0, p - window + 1) : 0;
    const int n = p - start + 1;
    const int len = (n + splits - 1) / splits;
    const int t0 = start + s * len, t1 = min(p + 1, t0 + len);
    const int kh = h / (heads / kvHeads);
    const float* qv = q + ((size_t)i * heads + h) * hd;
    for (int j = tid; j < hd; j += ATT_THREADS) qs[j] = qv[j] * scale;
    __syncthreads();
    // Scores: one thread per key.
    float mx = -INFINITY;
    const int hd4 = hd / 4;
    for (int t = t0 + tid; t < t1; t += ATT_THREADS) {
        const float* kv = t < pos0 ? kc + (size_t)t * row + (size_t)kh * hd : knew + (size_t)(t - pos0) * row + (size_t)kh * hd;
        if (t < pos0) {  // the key's values, for the weighted sum below
            const float* vv = vc + (size_t)t * row + (size_t)kh * hd;
            for (int j = 0; j < hd; j += 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(vv + j));
        }
        float d0 = 0.f, d1 = 0.f;
#pragma unroll
        for (int j = 0; j < (HD ? HD / 4 : 1); j++) {
            if (!HD) break;
            float4 k4 = *reinterpret_cast<const float4*>(kv + 4 * j);
            float4 q4 = *reinterpret_cast<const float4*>(qs + 4 * j);
            d0 += q4.x * k4.x + q4.y * k4.y;
            d1 += q4.z * k4.z + q4.w * k4.w;
        }
        if (!HD) {
            for (int j = 0; j < hd4; j++) {
                float4 k4 = *reinterpret_cast<const float4*>(kv + 4 * j);
                float4 q4 = *reinterpret_cast<const float4*>(qs + 4 * j);
                d0 += q4.x * k4.x + q4.y * k4.y;
                d1 += q4.z * k4.z + q4.w * k4.w;
            }
        }
        float d = d0 + d1;
        att_sh[t - t0] = d;
        mx = fmaxf(mx, d);
    }
    mx = block_max(mx, red);
    __syncthreads();
    float sum = 0.f;
    for (int t = tid; t < t1 - t0; t += ATT_THREADS) {
        float e = __expf(att_sh[t] - mx);
        att_sh[t] = e;
        sum += e;
    }
    sum = block_sum(sum, red);
    __syncthreads();
    // Weighted values: warp w takes keys w, w+nw, ...; lane takes 4 channels (and 4 more past 128).
    float4 acc0 = make_float4(0.f, 0.f, 0.f, 0.f), acc1 = acc0;
    const bool c0 = lane < hd4, c1 = lane + WARP < hd4;
#pragma unroll 8
    for (int t = t0 + warp; t < t1; t += nw) {
        const float* vv = t < pos0 ? vc + (size_t)t * row + (size_t)kh * hd : vnew + (size_t)(t - pos0) * row + (size_t)kh * hd;
        float e = att_sh[t - t0];
        if (c0) {
            float4 v4 = *reinterpret_cast<const float4*>(vv + 4 * lane);
            acc0.x += e * v4.x; acc0.y += e * v4.y; acc0.z += e * v4.z; acc0.w += e * v4.w;
        }
        if (c1) {
            float4 v4 = *reinterpret_cast<const float4*>(vv + 4 * (lane + WARP));
            acc1.x += e * v4.x; acc1.y += e * v4.y; acc1.z += e * v4.z; acc1.w += e * v4.w;
        }
    }
    if (c0) *reinterpret_cast<float4*>(&pv[warp][4 * lane]) = acc0;
    if (c1) *reinterpret_cast<float4*>(&pv[warp][4 * (lane + WARP)]) = acc1;
    __syncthreads();
    if (splits == 1) {
        float inv = 1.f / sum;
        float* o = out + ((size_t)i * heads + h) * hd;
        for (int j = tid; j < hd; j += ATT_THREADS) {
            float v = 0.f;
            for (int w = 0; w < nw; w++) v += pv[w][j];
            o[j] = v * inv;
        }
        return;
    }
    // part: [m][heads][splits][hd + 2]: the output sums, then max and sum.
    float* pp = part + (((size_t)i * heads + h) * splits + s) * (hd + 2);
    for (int j = tid; j < hd; j += ATT_THREADS) {
        float v = 0.f;
        for (int w = 0; w < nw; w++) v += pv[w][j];
        pp[j] = v;
    }
    if (tid == 0) {
        pp[hd] = t1 > t0 ? mx : -INFINITY;
        pp[hd + 1] = t1 > t0 ? sum : 0.f;
    }
}

#define ATTENTION_KV(NAME, HD)                                                                                      \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) NAME(                                                 \
        float* out, const float* q, const float* knew, const float* vnew, float* kc, float* vc, const int* dyn,     \
        int posRel, int heads, int kvHeads, int hd, float scale, int window, float* part) {                         \
        attention_kv_body<HD>(out, q, knew, vnew, kc, vc, dyn, posRel, heads, kvHeads, hd, scale, window, part);    \
    }
ATTENTION_KV(attention_kv, 0)
ATTENTION_KV(attention_kv_64, 64)
ATTENTION_KV(attention_kv_128, 128)

// Merges attention_kv's splits: grid (heads, m), one thread per channel (loop).
extern "C" __global__ void attn_combine(float* out, const float* part, int heads, int hd, int splits) {
    pdl_launch();
    pdl_wait();
    const int h = blockIdx.x, i = blockIdx.y;
    const float* pp = part + ((size_t)i * heads + h) * splits * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, pp[s * (hd + 2) + hd]);
    float den = 0.f;
    for (int s = 0; s < splits; s++) {
        float mx = pp[s * (hd + 2) + hd];
        if (mx > -INFINITY) den += __expf(mx - M) * pp[s * (hd + 2) + hd + 1];
    }
    float inv = 1.f / den;
    float* o = out + ((size_t)i * heads + h) * hd;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        float v = 0.f;
        for (int s = 0; s < splits; s++) {
            float mx = pp[s * (hd + 2) + hd];
            if (mx > -INFINITY) v += __expf(mx - M) * pp[s * (hd + 2) + j];
        }
        o[j] = v * inv;
    }
}

// Decode attention for one query row (m == 1), flash-decoding style, with
// the step's key and value appended to the cache and, optionally, RoPE
// applied to q and the new key in the same launch (the rope_dyn it replaces:
// channels [roff, roff + 2*rhalf), angle float(p) * inv_freq[i], cos and sin
// times rscale; rhalf == 0: no rotation), and before it, optionally, the
// in-place per-head RMSNorms of q and k (qnw, knw: their weights, null for
// none; neps their epsilon; attd_norms), which then need no launch of their
// own either. Grid (kvHeads * hgroups, splits),
// ATTD_WARPS warps: block (kh*hgroups + j, s) takes query heads j*GB ..
// j*GB+GB-1 of kv head kh (G = heads / kvHeads <= 16 of them, GB = G /
// hgroups: several per block share every key and value it loads; more
// blocks, fewer heads each, when the context is short), over
// an equal share of the visible keys [start, p], in chunks of ATTD_CH keys
// double-buffered through shared memory (cp.async). Warp w keeps the online
// softmax (max, sum, output) of heads w, w + ATTD_WARPS, ...; lane j holds
// the score of the chunk's key j and HD/32 output channels. With one split
// the block writes out; else each writes its (output, max, sum) to part, and
// the last of a block row's splits to finish (ticket[blockIdx.x], reset by it) merges
// them: no second launch.
//
// The cache rows before p - late are read before pdl_wait: the host passes
// as late the rows written by any of the last 128 launches (kvCache.lateRows
// in backend.go), so the kernels that wrote the others are complete (a grid
// completes only after its predecessor, and at most 128 grids are resident:
// a chain of unfinished launches is shorter). The late rows are read after
// the wait. Row p (the new key, rotated, and value) is written by the block
// whose share ends at p, which also stages it into its chunk from shared
// memory.
//
// cl != 0: the grid's splits form one thread block cluster along y (2 to 8
// blocks), and the partials merge in block 0's shared memory instead: each
// block stores its (output, max, sum) there (distributed shared memory) and
// block 0 merges them after one cluster barrier, in the ticket merge's order
// (the same values), with no global round trips (write, fence, atomic, read).
// cl bit 1 (the dev image's, MANIFOLD_ATTN_ABLATE=wait): the launch returns
// after its wait; the production image ignores it.
//
// tr (the dev image's, Backend.StartAttnTrace; null otherwise, and ignored
// by the production image): thread 0 of each
// block writes the global timer at fixed points (ATTD_TR_*) to record
// [launch][block][8] after ATTD_TR_HEAD words of per-block launch counters
// (32-bit, at the grid's linear block index; one grid shape per trace).
// profile.go's attnTrace* constants name the same layout (TestAttnTraceLayout).
#define ATTD_TR_LAUNCHES 64  // launches recorded (the counters wrap)
#define ATTD_TR_BLOCKS 1024  // blocks a launch may have
#define ATTD_TR_HEAD 512     // 64-bit words of counters: ATTD_TR_BLOCKS 32-bit ones
#define ATTD_TR_ENTRY 0   // the block started
#define ATTD_TR_WAITED 1  // the previous kernel complete (pdl_wait returned)
#define ATTD_TR_Q 2       // q and the new key rotated in shared memory
#define ATTD_TR_CHUNK 3   // the first chunk's keys in shared memory
#define ATTD_TR_LOOP 4    // every chunk done
#define ATTD_TR_MERGE 5   // the cluster's partials stored (cluster merge) or written (global merge)
#define ATTD_TR_END 6     // the block's last write issued
#define ATTD_TR_SM 7      // its multiprocessor
#define ATTD_WARPS 4
#define ATTD_CH 32
#define ATTD_PM(HD) ((HD) + 4)  // a partial's row in block 0's merge area: HD outputs, max, sum, padding
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// A block's record in attn_decode's and attn_short's trace: stamp(slot)
// writes the global timer there, on thread 0 only (after its earlier
// instructions have issued: their loads' values used), when a trace runs
// (tr not null; the dev image only: DEV_ON); the record's address is kept
// in shared memory.
__device__ __forceinline__ unsigned long long*& attd_trace_rec() {
    __shared__ unsigned long long* rec;
    return rec;
}
struct AttdStamp {
    bool on;
    __device__ __forceinline__ void operator()(int slot) const {
        if (on) attd_trace_rec()[slot] = gtime();
    }
};
__device__ __forceinline__ AttdStamp attd_trace_begin(unsigned long long* tr, int tid) {
    if (DEV_ON && tr && tid == 0) {
        const unsigned lb = blockIdx.x + gridDim.x * blockIdx.y;
        const unsigned launch = atomicAdd(reinterpret_cast<unsigned*>(tr) + lb, 1u) % ATTD_TR_LAUNCHES;
        unsigned long long* rec = tr + ATTD_TR_HEAD + ((size_t)launch * ATTD_TR_BLOCKS + lb) * 8;
        attd_trace_rec() = rec;
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        rec[ATTD_TR_ENTRY] = gtime();
        rec[ATTD_TR_SM] = smid;
    }
    return AttdStamp{DEV_ON && tr != nullptr && tid == 0};
}
// Channel c of v rotated by the angles whose cos and sin (times rscale) are
// rc[i], rs[i] for pair i; with w (not null) v is first normalized as the
// in-place rmsnorm the launch took in writes it: w[j] * (v[j] * inv).
__device__ __forceinline__ float attd_rot(const float* v, int c, const float* rc, const float* rs, int rhalf, int roff,
                                          int rinter, const float* w = nullptr, float inv = 1.f) {
    auto at = [&](int j) { return w ? w[j] * (v[j] * inv) : v[j]; };
    const int r = c - roff;
    if (rhalf == 0 || r < 0 || r >= 2 * rhalf) return at(c);
    const int i = rinter ? r / 2 : r % rhalf;
    const int i0 = roff + (rinter ? 2 * i : i), i1 = roff + (rinter ? 2 * i + 1 : i + rhalf);
    return c == i0 ? at(i0) * rc[i] - at(i1) * rs[i] : at(i1) * rc[i] + at(i0) * rs[i];
}

// The per-head RMSNorms of q and k (Qwen3's q_norm and k_norm) that a
// one-row attention launch took in (qnw, knw: their weights of HD values;
// null: none): ninv[g] the inverse RMS of the block's query head hb + g (g <
// GB), ninv[GB] that of the new key of kv head kh, as rmsnorm computes it
// (rsqrtf(sum of squares / HD + eps)), a warp a row. The caller syncs the
// block before reading them.
template <int HD>
__device__ __forceinline__ void attd_norms(float* ninv, const float* q, const float* knew, int hb, int GB, int kh,
                                           const float* qnw, const float* knw, float eps, int warp, int lane,
                                           int nwarps) {
    for (int r = warp; r <= GB; r += nwarps) {
        const bool isk = r == GB;
        if (isk ? knw == nullptr : qnw == nullptr) continue;  // the same on the warp's lanes
        const float* x = isk ? knew + (size_t)kh * HD : q + (size_t)(hb + r) * HD;
        float ss = 0.f;
#pragma unroll
        for (int c = lane; c < HD; c += WARP) ss += x[c] * x[c];
        ss = warp_sum(ss);
        if (lane == 0) ninv[r] = rsqrtf(ss / HD + eps);
    }
}

// A cluster of splits after each stored its partials in block 0's shared
// memory (pm: [splits][GB][ATTD_PM(HD)], each row HD outputs not yet
// divided, the split's maximum, its sum): one barrier, then block 0 writes
// the merged output of its GB heads; stamp (the trace's) marks both.
template <int HD, typename Stamp>
__device__ __forceinline__ void attd_cluster_merge(float* out, const float* pm, int hb, int GB, int splits, int tid,
                                                   int nt, Stamp stamp) {
    cluster_arrive_release();
    cluster_wait_acquire();
    stamp(ATTD_TR_MERGE);
    if (cluster_rank() != 0) {
        stamp(ATTD_TR_END);
        return;
    }
    for (int i = tid; i < GB * HD; i += nt) {
        const int g = i / HD, c = i % HD;
        float M = -INFINITY;
        for (int s2 = 0; s2 < splits; s2++) M = fmaxf(M, pm[(s2 * GB + g) * ATTD_PM(HD) + HD]);
        float den = 0.f, acc = 0.f;
        for (int s2 = 0; s2 < splits; s2++) {
            const float* pq = pm + (s2 * GB + g) * ATTD_PM(HD);
            const float mx = pq[HD];
            if (mx == -INFINITY) continue;  // an empty share
            const float e = __expf(mx - M);
            den += e * pq[HD + 1];
            acc += e * pq[c];
        }
        const float inv = 1.f / den;
        out[(size_t)(hb + g) * HD + c] = acc * inv;
    }
    stamp(ATTD_TR_END);
}

// attn_decode's scores of one chunk: sc[g * ATTD_CH + j] = q_g . k_j for
// the block's items = GB * ATTD_CH (head, key) pairs, -inf past the chunk's
// nk keys; P threads a pair (adjacent lanes), each the float4s P apart,
// summed by shuffles.
template <int HD, int P, int RS>
__device__ __forceinline__ void attd_scores(float* sc, const float* kb, const float* qs, int items, int nk, int tid) {
    constexpr int NT = ATTD_WARPS * WARP;
    for (int base = 0; base < items * P; base += NT) {  // the same trip count on every thread (the shuffles)
        const int i = base + tid, it = i / P, ps = i % P;
        const int g = it / ATTD_CH, j = it % ATTD_CH;
        const bool ok = it < items && j < nk;
        float d0 = 0.f, d1 = 0.f;
        if (ok) {
            const float4* kr = reinterpret_cast<const float4*>(kb + j * RS);
            const float4* qr = reinterpret_cast<const float4*>(qs + g * HD);
#pragma unroll
            for (int t = 0; t < HD / 4 / P; t++) {
                const float4 k4 = kr[ps + P * t], q4 = qr[ps + P * t];
                d0 += q4.x * k4.x + q4.y * k4.y;
                d1 += q4.z * k4.z + q4.w * k4.w;
            }
        }
        float d = d0 + d1;
#pragma unroll
        for (int m = 1; m < P; m <<= 1) d += __shfl_xor_sync(0xffffffff, d, m);
        if (it < items && ps == 0) sc[it] = ok ? d : -INFINITY;
    }
}

template <int HD>
__device__ __forceinline__ void attn_decode_body(float* out, const float* q, const float* knew, const float* vnew,
                                                 float* kc, float* vc, const int* dyn, int posRel, int heads,
                                                 int kvHeads, float scale, int window, float* part, int* ticket,
                                                 const float* inv_freq, int rhalf, int roff, float rscale, int rinter,
                                                 const float* qnw, const float* knw, float neps, int hgroups, int cl,
                                                 int late, unsigned long long* tr) {
    constexpr int VEC = HD / WARP;  // output channels per lane
    constexpr int RS = HD + 4;      // padded row: 8 rows at one column hit distinct banks
    constexpr int NT = ATTD_WARPS * WARP;
    constexpr int GPW = 16 / ATTD_WARPS;  // heads per warp, at most
    extern __shared__ __align__(16) float ad_sh[];
    __shared__ int is_last;
    __shared__ float ninv[17];  // the inverse RMS of the block's query heads and the new key (attd_norms)
    const int G = heads / kvHeads, GB = G / hgroups;  // the kv head's query heads, the block's
    float* kbuf = ad_sh;                     // [2][CH][RS]
    float* vbuf = kbuf + 2 * ATTD_CH * RS;   // [2][CH][RS]
    float* qs = vbuf + 2 * ATTD_CH * RS;     // [G][HD], rotated and scaled
    float* sc = qs + G * HD;                 // [G][CH] the chunk's scores
    float* kn = sc + G * ATTD_CH;            // [HD] the new key, rotated
    float* vn = kn + HD;                     // [HD] the new value
    float* rc = vn + HD;                     // [HD/2] cos and sin of the rotation's angles
    float* rs = rc + HD / 2;
    float* pm = rs + HD / 2;                 // cl: [splits][GB][ATTD_PM(HD)], block 0's partials to merge
    const int kh = blockIdx.x / hgroups, hb = kh * G + (blockIdx.x % hgroups) * GB;  // kv head, first query head
    const int s = blockIdx.y, splits = gridDim.y;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    pdl_launch();
    if (cl & 1) cluster_arrive_relaxed();  // waited for before the first remote store: every block has started
    const AttdStamp stamp = attd_trace_begin(tr, tid);  // the trace: this block's record
    const int p = dyn[0] + posRel;
    const int start = window > 0 ? max(0, p - window + 1) : 0;
    const int len = (p - start + 1 + splits - 1) / splits;
    const int t0 = start + s * len, t1 = min(p + 1, t0 + len);
    const size_t row = (size_t)kvHeads * HD;
    // Rows [c, c + CH) of the share, those before p and in [lo, hi), into
    // buffer b; one commit group.
    auto load = [&](int c, int b, int lo, int hi) {
        const int rows = min(ATTD_CH, t1 - c);
        for (int i = tid; i < 2 * rows * (HD / 4); i += NT) {
            const int isv = i >= rows * (HD / 4);
            const int ii = isv ? i - rows * (HD / 4) : i;
            const int j = ii / (HD / 4), c4 = ii % (HD / 4), t = c + j;
            if (t < t1 && t < p && t >= lo && t < hi) {
                const float* src = (isv ? vc : kc) + (size_t)t * row + (size_t)kh * HD + 4 * c4;
                cp_async16(smem_u32((isv ? vbuf : kbuf) + (b * ATTD_CH + j) * RS + 4 * c4), src);
            }
        }
        cp_async_commit();
    };
    const int pw = p - late;  // rows from pw on may still be being written: read after the wait
    if (t0 < t1) load(t0, 0, 0, pw);
    // The rotation depends on the position alone: one sincosf per pair, shared by the heads.
    for (int i = tid; i < rhalf; i += NT) {
        float sn, cs;
        sincosf((float)p * inv_freq[i], &sn, &cs);
        rc[i] = cs * rscale, rs[i] = sn * rscale;
    }
    __syncthreads();
    pdl_wait();
    stamp(ATTD_TR_WAITED);
    if (t0 < t1) load(t0, 0, pw, p);
    if (DEV_ON && (cl & 2)) return;  // the dev image's ablation: the launch and its wait alone, writing nothing
    if (qnw || knw) {
        attd_norms<HD>(ninv, q, knew, hb, GB, kh, qnw, knw, neps, warp, lane, ATTD_WARPS);
        __syncthreads();
    }
    for (int i = tid; i < GB * HD; i += NT) {
        const int g = i / HD, c = i % HD;
        qs[i] = attd_rot(q + (size_t)(hb + g) * HD, c, rc, rs, rhalf, roff, rinter, qnw, qnw ? ninv[g] : 1.f) * scale;
    }
    const bool mine = t0 < t1 && t1 == p + 1;  // this share ends at the new key
    if (mine) {
        for (int c = tid; c < HD; c += NT) {
            const float kr =
                attd_rot(knew + (size_t)kh * HD, c, rc, rs, rhalf, roff, rinter, knw, knw ? ninv[GB] : 1.f);
            const float vv = vnew[(size_t)kh * HD + c];
            kn[c] = kr;
            vn[c] = vv;
            if (blockIdx.x % hgroups == 0) {  // one block per kv head writes the cache
                kc[(size_t)p * row + (size_t)kh * HD + c] = kr;
                vc[(size_t)p * row + (size_t)kh * HD + c] = vv;
            }
        }
    }
    stamp(ATTD_TR_Q);
    float mrun[GPW], lrun[GPW], o[GPW][VEC];
#pragma unroll
    for (int gi = 0; gi < GPW; gi++) {
        mrun[gi] = -INFINITY, lrun[gi] = 0.f;
#pragma unroll
        for (int v = 0; v < VEC; v++) o[gi][v] = 0.f;
    }
    int b = 0;
    for (int c = t0; c < t1; c += ATTD_CH, b ^= 1) {
        if (c + ATTD_CH < t1) load(c + ATTD_CH, b ^ 1, 0, p);
        else cp_async_commit();
        cp_async_wait<1>();
        if (mine && p >= c && p < c + ATTD_CH) {  // the new row from shared memory
            for (int i = tid; i < HD; i += NT) {
                kbuf[(b * ATTD_CH + p - c) * RS + i] = kn[i];
                vbuf[(b * ATTD_CH + p - c) * RS + i] = vn[i];
            }
        }
        __syncthreads();
        if (c == t0) stamp(ATTD_TR_CHUNK);
        const int nk = min(ATTD_CH, t1 - c);
        // Up to 4 threads a (head, key) score: at one or two query heads a
        // block, every warp scores (one warp alone took 0.8 us of the step).
        const float* kb = kbuf + b * ATTD_CH * RS;
        if (GB * ATTD_CH * 4 <= NT) attd_scores<HD, 4, RS>(sc, kb, qs, GB * ATTD_CH, nk, tid);
        else if (GB * ATTD_CH * 2 <= NT) attd_scores<HD, 2, RS>(sc, kb, qs, GB * ATTD_CH, nk, tid);
        else attd_scores<HD, 1, RS>(sc, kb, qs, GB * ATTD_CH, nk, tid);
        __syncthreads();
#pragma unroll
        for (int gi = 0; gi < GPW; gi++) {
            const int g = warp + gi * ATTD_WARPS;
            if (g >= GB) break;
            const float sj = sc[g * ATTD_CH + lane];
            const float mnew = fmaxf(mrun[gi], warp_max(sj));  // finite: the chunk holds a key
            const float alpha = __expf(mrun[gi] - mnew);
            const float pj = __expf(sj - mnew);
            lrun[gi] = lrun[gi] * alpha + warp_sum(pj);
            mrun[gi] = mnew;
#pragma unroll
            for (int v = 0; v < VEC; v++) o[gi][v] *= alpha;
            const float* vb = vbuf + b * ATTD_CH * RS + lane * VEC;
            for (int j = 0; j < nk; j++) {
                const float e = __shfl_sync(0xffffffff, pj, j);
                if constexpr (VEC == 4) {
                    const float4 w = *reinterpret_cast<const float4*>(vb + j * RS);
                    o[gi][0] += e * w.x, o[gi][1] += e * w.y, o[gi][2] += e * w.z, o[gi][3] += e * w.w;
                } else {
                    const float2 w = *reinterpret_cast<const float2*>(vb + j * RS);
                    o[gi][0] += e * w.x, o[gi][1] += e * w.y;
                }
            }
        }
        __syncthreads();  // buffer b is free for the load two chunks on
    }
    cp_async_wait<0>();
    stamp(ATTD_TR_LOOP);
    if (cl & 1) {
        cluster_wait_acquire();
#pragma unroll
        for (int gi = 0; gi < GPW; gi++) {
            const int g = warp + gi * ATTD_WARPS;
            if (g >= GB) break;
            const uint32_t row0 = dsmem_map(pm + (s * GB + g) * ATTD_PM(HD), 0);
            if constexpr (VEC == 4) {
                dsmem_store4(row0 + 16 * lane, make_uint4(__float_as_uint(o[gi][0]), __float_as_uint(o[gi][1]),
                                                          __float_as_uint(o[gi][2]), __float_as_uint(o[gi][3])));
            } else {
#pragma unroll
                for (int v = 0; v < VEC; v++) dsmem_store(row0 + 4 * (lane * VEC + v), __float_as_int(o[gi][v]));
            }
            if (lane == 0) {
                dsmem_store(row0 + 4 * HD, __float_as_int(mrun[gi]));
                dsmem_store(row0 + 4 * (HD + 1), __float_as_int(lrun[gi]));
            }
        }
        attd_cluster_merge<HD>(out, pm, hb, GB, splits, tid, NT, stamp);
        return;
    }
#pragma unroll
    for (int gi = 0; gi < GPW; gi++) {
        const int g = warp + gi * ATTD_WARPS;
        if (g >= GB) break;
        const int h = hb + g;
        if (splits == 1) {
            const float inv = 1.f / lrun[gi];
#pragma unroll
            for (int v = 0; v < VEC; v++) out[(size_t)h * HD + lane * VEC + v] = o[gi][v] * inv;
        } else {
            float* pp = part + ((size_t)h * splits + s) * (HD + 2);
#pragma unroll
            for (int v = 0; v < VEC; v++) pp[lane * VEC + v] = o[gi][v];
            if (lane == 0) pp[HD] = mrun[gi], pp[HD + 1] = lrun[gi];
        }
    }
    if (splits == 1) {
        stamp(ATTD_TR_END);
        return;
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(ticket + blockIdx.x, 1) == splits - 1;
    __syncthreads();
    stamp(ATTD_TR_MERGE);
    if (!is_last) {
        stamp(ATTD_TR_END);
        return;
    }
    __threadfence();
    if (tid == 0) ticket[blockIdx.x] = 0;
#pragma unroll
    for (int gi = 0; gi < GPW; gi++) {
        const int g = warp + gi * ATTD_WARPS;
        if (g >= GB) break;
        const int h = hb + g;
        const float* ph = part + (size_t)h * splits * (HD + 2);
        float M = -INFINITY;
        for (int s2 = lane; s2 < splits; s2 += WARP) M = fmaxf(M, __ldcg(ph + s2 * (HD + 2) + HD));
        M = warp_max(M);
        float den = 0.f, acc[VEC];
#pragma unroll
        for (int v = 0; v < VEC; v++) acc[v] = 0.f;
#pragma unroll 4
        for (int s2 = 0; s2 < splits; s2++) {
            const float* pq = ph + s2 * (HD + 2);
            const float mx = __ldcg(pq + HD);
            if (mx == -INFINITY) continue;  // an empty share
            const float e = __expf(mx - M);
            den += e * __ldcg(pq + HD + 1);
#pragma unroll
            for (int v = 0; v < VEC; v++) acc[v] += e * __ldcg(pq + lane * VEC + v);
        }
        const float inv = 1.f / den;
#pragma unroll
        for (int v = 0; v < VEC; v++) out[(size_t)h * HD + lane * VEC + v] = acc[v] * inv;
    }
    stamp(ATTD_TR_END);
}

#define ATTN_DECODE(NAME, HD)                                                                                        \
    extern "C" __global__ void __launch_bounds__(ATTD_WARPS * WARP) NAME(                                            \
        float* out, const float* q, const float* knew, const float* vnew, float* kc, float* vc, const int* dyn,      \
        int posRel, int heads, int kvHeads, float scale, int window, float* part, int* ticket, const float* inv_freq, \
        int rhalf, int roff, float rscale, int rinter, const float* qnw, const float* knw, float neps, int hgroups,   \
        int cl, int late, unsigned long long* tr) {                                                                  \
        attn_decode_body<HD>(out, q, knew, vnew, kc, vc, dyn, posRel, heads, kvHeads, scale, window, part, ticket,   \
                             inv_freq, rhalf, roff, rscale, rinter, qnw, knw, neps, hgroups, cl, late, tr);          \
    }
ATTN_DECODE(attn_decode_64, 64)
ATTN_DECODE(attn_decode_128, 128)

// attn_short_{64,128}: one query row over a short context, every key of a
// block's share in shared memory at once and 16 warps on it (attn_decode
// streams 32-key chunks through 4 warps and splits the keys over a cluster
// of blocks, whose merge waits for the slowest). Grid (kvHeads * hgroups,
// S): a block per (kv head, group of GB = G / hgroups query heads, share),
// the keys in S equal shares (S = 1: the block writes its heads' output;
// 1 < S <= 8: the shares are a cluster along y and merge in block 0's
// shared memory as attn_decode's cluster does). In a block: the rows of its
// share before p - late copied before the wait (late as attn_decode's), the
// rest, the new key (rotated) and value after it; a head's WPH = 16 / GB warps score its keys, 8 lanes a key
// and two keys a lane at a time, with q in registers (each key's row read
// once, without bank conflicts; the loop is bound by its dependent
// latencies, docs/PERFORMANCE.md round 34), each keeping its maximum; then
// each takes every WPH-th key (at most 32) with the head's maximum over
// its warps', so that their partial outputs and sums add up directly.
// kpb: the most keys a share holds (the host sizes the shared memory from
// it); the other arguments as attn_decode's, and cl bit 2: the hgroups blocks of a kv head form a
// cluster along x (S = 1 only) and each copies a part of the rows into all
// of them (bulk copies multicast), so that a multiprocessor takes in only
// its part of the keys while the launch before still streams its weights.
#define ATTS_WARPS 16
// A bulk copy global -> shared into the same offset of every block of the
// cluster in mask, each block's barrier at bar counting the bytes.
__device__ __forceinline__ void bulk_g2s_multicast(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                   uint16_t mask) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
        "%4;\n" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "h"(mask)
        : "memory");
}

template <int HD>
__device__ __forceinline__ void attn_short_body(float* out, const float* q, const float* knew, const float* vnew,
                                                float* kc, float* vc, const int* dyn, int posRel, int heads,
                                                int kvHeads, float scale, int window, int kpb, const float* inv_freq,
                                                int rhalf, int roff, float rscale, int rinter, const float* qnw,
                                                const float* knw, float neps, int hgroups, int cl, int late,
                                                unsigned long long* tr) {
    constexpr int VEC = HD / WARP;
    constexpr int RS = HD + 4;
    constexpr int NT = ATTS_WARPS * WARP;
    extern __shared__ __align__(16) float as_sh[];
    __shared__ __align__(8) unsigned long long as_bar;  // cl bit 2: the share's rows have arrived
    __shared__ float as_wmax[ATTS_WARPS];               // each warp's maximum score
    __shared__ float ninv[17];                          // the inverse RMS of the block's query heads and the new key
    const int G = heads / kvHeads, GB = G / hgroups;
    const int kr = max(kpb, ATTS_WARPS);     // rows of kbuf: after the scores it holds the warps' partials
    float* kbuf = as_sh;                     // [kr][RS]
    float* vbuf = kbuf + kr * RS;            // [kpb][RS]
    float* qs = vbuf + kpb * RS;             // [GB][HD], rotated and scaled
    float* sc = qs + GB * HD;                // [GB][kpb]
    float* rc = sc + GB * kpb;               // [HD/2] cos and sin of the rotation's angles
    float* rs = rc + HD / 2;
    float* pm = rs + HD / 2;                 // S > 1: [S][GB][ATTD_PM(HD)], block 0's partials to merge
    float* red = kbuf;                       // [ATTS_WARPS][RS]: a warp's outputs, its sum and the maximum
    const int kh = blockIdx.x / hgroups, hb = kh * G + (blockIdx.x % hgroups) * GB;
    const int s = blockIdx.y, S = gridDim.y;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const bool mc = cl & 4;
    pdl_launch();
    if (cl & 1) cluster_arrive_relaxed();  // waited for before the first remote store: every block has started
    const AttdStamp stamp = attd_trace_begin(tr, tid);  // the trace: this block's record
    const int p = dyn[0] + posRel;
    const int start = window > 0 ? max(0, p - window + 1) : 0;
    const int len = (p - start + 1 + S - 1) / S;  // at most kpb (the host's shape)
    const int t0 = start + s * len, t1 = min(p + 1, t0 + len), nk = max(t1 - t0, 0);
    const int nb = max(min(t1, p) - t0, 0);  // the share's rows before p
    const size_t row = (size_t)kvHeads * HD;
    const uint32_t bar = smem_u32(&as_bar);
    // The share's rows j in [j0, j1) (before p), into kbuf and vbuf: with mc
    // this block's part of them (i = r mod hgroups) multicast to the
    // cluster's blocks, whose barriers count the bytes; else by cp.async, one
    // commit group. Rows from p - late on may still be being written (as
    // attn_decode's): they are copied after the wait.
    const int nbp = min(max(p - late - t0, 0), nb);
    auto copyRows = [&](int j0, int j1) {
        const int n = j1 - j0;
        if (mc) {
            const int r = blockIdx.x % hgroups;
            const uint16_t mask = (uint16_t)((1u << hgroups) - 1);
            for (int i = r + hgroups * tid; i < 2 * n; i += hgroups * NT) {
                const int isv = i >= n;
                const int j = j0 + (isv ? i - n : i);
                const float* src = (isv ? vc : kc) + (size_t)(t0 + j) * row + (size_t)kh * HD;
                bulk_g2s_multicast(smem_u32((isv ? vbuf : kbuf) + j * RS), src, HD * 4, bar, mask);
            }
        } else {
            for (int i = tid; i < 2 * n * (HD / 4); i += NT) {
                const int isv = i >= n * (HD / 4);
                const int ii = isv ? i - n * (HD / 4) : i;
                const int j = j0 + ii / (HD / 4), c4 = ii % (HD / 4);
                const float* src = (isv ? vc : kc) + (size_t)(t0 + j) * row + (size_t)kh * HD + 4 * c4;
                cp_async16(smem_u32((isv ? vbuf : kbuf) + j * RS + 4 * c4), src);
            }
            cp_async_commit();
        }
    };
    if (mc) {  // every block's barrier set up before any copy lands in it
        if (tid == 0) {
            mbar_init(bar, 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        cluster_arrive_release();
        cluster_wait_acquire();
        if (tid == 0) mbar_expect_tx(bar, 2 * nb * HD * 4);
    }
    copyRows(0, nbp);
    for (int i = tid; i < rhalf; i += NT) {
        float sn, cs;
        sincosf((float)p * inv_freq[i], &sn, &cs);
        rc[i] = cs * rscale, rs[i] = sn * rscale;
    }
    // The warps' roles, worked out before the wait (the divisions are not on
    // the path after it).
    int WPH = ATTS_WARPS / GB;  // warps a head (GB <= 16)
    int g = warp / WPH, sl = warp % WPH;
    int mine = (nk - sl + WPH - 1) / WPH;  // the keys the warp weighs
    asm volatile("" : "+r"(WPH), "+r"(g), "+r"(sl), "+r"(mine));
    __syncthreads();
    pdl_wait();
    stamp(ATTD_TR_WAITED);
    if (nbp < nb) copyRows(nbp, nb);
    if (DEV_ON && (cl & 2)) {  // the dev image's ablation: the launch and its wait alone, writing nothing
        if (mc) mbar_wait(bar, 0);  // no block leaves while copies into it are under way
        return;
    }
    // q, and when this share ends at the new key its row from knew and
    // vnew, on separate threads: their loads are under way together (one
    // round trip to L2 after the wait, not two).
    // The norms taken in first (their sums: one more round trip and a sync).
    const int nq = GB * HD, nn = nk > 0 && t1 == p + 1 ? 2 * HD : 0;
    if (qnw || knw) {
        attd_norms<HD>(ninv, q, knew, hb, GB, kh, qnw, knw, neps, warp, lane, ATTS_WARPS);
        __syncthreads();
    }
    for (int i = tid; i < nq + nn; i += NT) {
        if (i < nq) {
            const int g = i / HD, c = i % HD;
            qs[i] = attd_rot(q + (size_t)(hb + g) * HD, c, rc, rs, rhalf, roff, rinter, qnw, qnw ? ninv[g] : 1.f) *
                    scale;
        } else {
            const int c = (i - nq) % HD;
            const bool isv = i - nq >= HD;
            const float x = isv ? vnew[(size_t)kh * HD + c]
                                : attd_rot(knew + (size_t)kh * HD, c, rc, rs, rhalf, roff, rinter, knw,
                                           knw ? ninv[GB] : 1.f);
            (isv ? vbuf : kbuf)[(p - t0) * RS + c] = x;
            if (blockIdx.x % hgroups == 0)  // one block a kv head writes the cache
                (isv ? vc : kc)[(size_t)p * row + (size_t)kh * HD + c] = x;
        }
    }
    stamp(ATTD_TR_Q);
    if (mc) mbar_wait(bar, 0);
    else cp_async_wait<0>();
    __syncthreads();
    stamp(ATTD_TR_CHUNK);
    if (g < GB) {  // scores: 8 lanes a key (a row's 16-byte pieces 8 apart: no bank conflicts), q in registers
        const int kg = lane / 8, ps = lane % 8;
        float4 qv[HD / 32];
#pragma unroll
        for (int t = 0; t < HD / 32; t++) qv[t] = reinterpret_cast<const float4*>(qs + g * HD)[ps + 8 * t];
        float wm = -INFINITY;  // the maximum of the warp's scores
        // Two keys a lane at a time, their loads and sums interleaved; the
        // same trip count on the warp's lanes (the shuffles).
        for (int base = 4 * sl; base < nk; base += 8 * WPH) {
            const int j0 = base + kg, j1 = j0 + 4 * WPH;
            float a0 = 0.f, a1 = 0.f, b0 = 0.f, b1 = 0.f;
            // Rows past the share are read as its last (no branch around the
            // loads) and their sums dropped.
            const float4* k0 = reinterpret_cast<const float4*>(kbuf + min(j0, nk - 1) * RS);
            const float4* k1 = reinterpret_cast<const float4*>(kbuf + min(j1, nk - 1) * RS);
#pragma unroll
            for (int t = 0; t < HD / 32; t++) {
                const float4 x4 = k0[ps + 8 * t], y4 = k1[ps + 8 * t];
                a0 += qv[t].x * x4.x + qv[t].y * x4.y;
                a1 += qv[t].z * x4.z + qv[t].w * x4.w;
                b0 += qv[t].x * y4.x + qv[t].y * y4.y;
                b1 += qv[t].z * y4.z + qv[t].w * y4.w;
            }
            float da = a0 + a1, db = b0 + b1;
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) {
                da += __shfl_xor_sync(0xffffffff, da, m);
                db += __shfl_xor_sync(0xffffffff, db, m);
            }
            if (j0 < nk) {
                if (ps == 0) sc[g * kpb + j0] = da;
                wm = fmaxf(wm, da);
            }
            if (j1 < nk) {
                if (ps == 0) sc[g * kpb + j1] = db;
                wm = fmaxf(wm, db);
            }
        }
        wm = fmaxf(wm, __shfl_xor_sync(0xffffffff, wm, 8));
        wm = fmaxf(wm, __shfl_xor_sync(0xffffffff, wm, 16));
        if (lane == 0) as_wmax[warp] = wm;
    }
    __syncthreads();  // kbuf is free: red takes its place
    float mx = -INFINITY;
    if (g < GB) {
        const float* sg = sc + g * kpb;
#pragma unroll
        for (int w = 0; w < ATTS_WARPS; w++)  // the head's maximum from its warps' (-inf for an empty share)
            if (w < WPH) mx = fmaxf(mx, as_wmax[g * WPH + w]);
        // The warp's keys j = sl + WPH * i (i < 32): lane i's weight, then
        // every lane its channels of the weighted values.
        const float e = lane < mine ? __expf(sg[sl + WPH * lane] - mx) : 0.f;
        const float l = warp_sum(e);
        float o[VEC];
#pragma unroll
        for (int v = 0; v < VEC; v++) o[v] = 0.f;
        const float* vb = vbuf + sl * RS + lane * VEC;
#pragma unroll 4
        for (int i = 0; i < mine; i++) {
            const float ei = __shfl_sync(0xffffffff, e, i);
            if constexpr (VEC == 4) {
                const float4 w = *reinterpret_cast<const float4*>(vb + i * WPH * RS);
                o[0] += ei * w.x, o[1] += ei * w.y, o[2] += ei * w.z, o[3] += ei * w.w;
            } else {
                const float2 w = *reinterpret_cast<const float2*>(vb + i * WPH * RS);
                o[0] += ei * w.x, o[1] += ei * w.y;
            }
        }
#pragma unroll
        for (int v = 0; v < VEC; v++) red[warp * RS + lane * VEC + v] = o[v];
        if (lane == 0) red[warp * RS + HD] = l, red[warp * RS + HD + 1] = mx;
    }
    stamp(ATTD_TR_LOOP);
    __syncthreads();
    // A head's warps summed: its outputs (not yet divided) and sum.
    auto summed = [&](int h, int c, float& acc, float& den) {
        acc = 0.f, den = 0.f;
#pragma unroll
        for (int w = 0; w < ATTS_WARPS; w++) {
            if (w < WPH) acc += red[(h * WPH + w) * RS + c], den += red[(h * WPH + w) * RS + HD];
        }
    };
    if (S == 1) {
        for (int i = tid; i < GB * HD; i += NT) {
            const int h = i / HD, c = i % HD;
            float acc, den;
            summed(h, c, acc, den);
            out[(size_t)(hb + h) * HD + c] = acc / den;
        }
        stamp(ATTD_TR_END);
        return;
    }
    cluster_wait_acquire();
    for (int i = tid; i < GB * HD; i += NT) {  // this share's (outputs, maximum, sum) a head into block 0
        const int h = i / HD, c = i % HD;
        float acc, den;
        summed(h, c, acc, den);
        const uint32_t r0 = dsmem_map(pm + (s * GB + h) * ATTD_PM(HD), 0);
        dsmem_store(r0 + 4 * c, __float_as_int(acc));
        if (c == 0) {  // the head's maximum (every warp of it has the same) and sum
            dsmem_store(r0 + 4 * HD, __float_as_int(red[h * WPH * RS + HD + 1]));
            dsmem_store(r0 + 4 * (HD + 1), __float_as_int(den));
        }
    }
    attd_cluster_merge<HD>(out, pm, hb, GB, S, tid, NT, stamp);
}

#define ATTN_SHORT(NAME, HD)                                                                                     \
    extern "C" __global__ void __launch_bounds__(ATTS_WARPS * WARP) NAME(                                        \
        float* out, const float* q, const float* knew, const float* vnew, float* kc, float* vc, const int* dyn,  \
        int posRel, int heads, int kvHeads, float scale, int window, int kpb, const float* inv_freq, int rhalf,   \
        int roff, float rscale, int rinter, const float* qnw, const float* knw, float neps, int hgroups, int cl,  \
        int late, unsigned long long* tr) {                                                                       \
        attn_short_body<HD>(out, q, knew, vnew, kc, vc, dyn, posRel, heads, kvHeads, scale, window, kpb,         \
                            inv_freq, rhalf, roff, rscale, rinter, qnw, knw, neps, hgroups, cl, late, tr);        \
    }
ATTN_SHORT(attn_short_64, 64)
ATTN_SHORT(attn_short_128, 128)

// attn_prefill_{64,128}: causal attention for many new rows at once (a
// prompt chunk), tiled as flash attention: a block per (query head, 64
// rows); each 64-key tile of the visible keys is copied into shared memory
// once and used by all 64 rows (attention_kv reads every key once per row).
// Scores and the weighted values in float32 (each thread 4 rows x 4 keys,
// then 4 rows x HD/16 channels), online softmax per row as attention_kv
// computes it (max-subtracted __expf). Same arguments as attention_kv (no
// splits); blocks of the first kv heads write the new keys and values into
// the cache as it does, while every block reads the new ones from knew and
// vnew. Grid (heads, ceil(m / 64)), 256 threads; shared memory
// 3 x 64 x (HD + 4) + 64 x 68 floats.
#define APF_ROWS 64
template <int HD>
__device__ __forceinline__ void attn_prefill_body(float* out, const float* q, const float* knew, const float* vnew, float* kc,
                                                  float* vc, const int* dyn, int posRel, int m, int heads, int kvHeads,
                                                  float scale, int window) {
    constexpr int S = HD + 4, PS = APF_ROWS + 4, C4 = HD / 64;  // row strides (floats); float4 channels per thread
    extern __shared__ __align__(16) float apf[];
    float* Qs = apf;
    float* Ks = Qs + APF_ROWS * S;
    float* Vs = Ks + APF_ROWS * S;
    float* Ps = Vs + APF_ROWS * S;
    pdl_launch();
    pdl_wait();
    const int h = blockIdx.x, i0 = blockIdx.y * APF_ROWS, tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int pos0 = dyn[0] + posRel, rows = min(APF_ROWS, m - i0);
    const size_t row = (size_t)kvHeads * HD;
    const int kh = h / (heads / kvHeads);
    if (h < kvHeads) {
        for (int e = tid; e < rows * (HD / 4); e += 256) {
            const int i = i0 + e / (HD / 4), j = 4 * (e % (HD / 4));
            const size_t src = (size_t)i * row + (size_t)h * HD + j, dst = (size_t)(pos0 + i) * row + (size_t)h * HD + j;
            *reinterpret_cast<float4*>(kc + dst) = *reinterpret_cast<const float4*>(knew + src);
            *reinterpret_cast<float4*>(vc + dst) = *reinterpret_cast<const float4*>(vnew + src);
        }
    }
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
    const int pfirst = pos0 + i0, plast = pos0 + i0 + rows - 1;
    const int kfirst = window > 0 ? max(0, pfirst - window + 1) : 0;
    float mrow[4], lrow[4], o[4][4 * C4];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        mrow[a] = -INFINITY, lrow[a] = 0.f;
#pragma unroll
        for (int c = 0; c < 4 * C4; c++) o[a][c] = 0.f;
    }
    for (int k0 = kfirst; k0 <= plast; k0 += APF_ROWS) {
        __syncthreads();  // the previous tile's K, V and P are no longer read
        for (int e = tid; e < APF_ROWS * (HD / 4); e += 256) {
            const int r = e / (HD / 4), j = 4 * (e % (HD / 4)), t = k0 + r;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
            if (t <= plast) {
                const float* kp = t < pos0 ? kc + (size_t)t * row : knew + (size_t)(t - pos0) * row;
                const float* vp = t < pos0 ? vc + (size_t)t * row : vnew + (size_t)(t - pos0) * row;
                kv = *reinterpret_cast<const float4*>(kp + (size_t)kh * HD + j);
                vv = *reinterpret_cast<const float4*>(vp + (size_t)kh * HD + j);
            }
            *reinterpret_cast<float4*>(Ks + r * S + j) = kv;
            *reinterpret_cast<float4*>(Vs + r * S + j) = vv;
        }
        __syncthreads();
        // Scores of rows 4ty + a against keys tx + 16b.
        float s[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) s[a][b] = 0.f;
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
                    s[a][b] += qa[a].x * kb[b].x + qa[a].y * kb[b].y + qa[a].z * kb[b].z + qa[a].w * kb[b].w;
        }
        // Online softmax: the 16 threads of a row are lanes of one half warp.
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int p = pos0 + i0 + 4 * ty + a, lo = window > 0 ? max(0, p - window + 1) : 0;
            float mx = -INFINITY;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int t = k0 + tx + 16 * b;
                if (t > p || t < lo) s[a][b] = -INFINITY;
                mx = fmaxf(mx, s[a][b]);
            }
#pragma unroll
            for (int off = 1; off < 16; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, off));
            const float mnew = fmaxf(mrow[a], mx);
            const float corr = mnew == -INFINITY ? 1.f : __expf(mrow[a] - mnew);
            float sum = 0.f;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const float e = s[a][b] == -INFINITY ? 0.f : __expf(s[a][b] - mnew);
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

#define ATTN_PREFILL(NAME, HD)                                                                                             \
    extern "C" __global__ void __launch_bounds__(256) NAME(float* out, const float* q, const float* knew, const float* vnew, \
                                                           float* kc, float* vc, const int* dyn, int posRel, int m,        \
                                                           int heads, int kvHeads, float scale, int window) {               \
        attn_prefill_body<HD>(out, q, knew, vnew, kc, vc, dyn, posRel, m, heads, kvHeads, scale, window);                  \
    }
ATTN_PREFILL(attn_prefill_64, 64)
ATTN_PREFILL(attn_prefill_128, 128)
