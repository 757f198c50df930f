// DeepSeek-V4's own operations (layers/dsv4, dsv4.Ops): the compressor,
// attention with per-head sinks over the sliding window plus compressed
// entries, and the layout moves of the grouped output projection and the
// MoE dispatch. The indexer's scores and top-k are in dsa.cuh, shared with
// DSA. Plain kernels, correctness first.

// Slot k of entry e's softmax pool at channel c (dsv4.Compress): the Ca
// halves of the previous window's rows (CSA, when that window exists), then
// the Cb halves of the window's own rows; HCA has only the window's rows.
struct V4Slot {
    float z, v;
};

__device__ __forceinline__ V4Slot v4_slot(const float* kv, const float* gate, const float* ape, int k, int first,
                                          int rate, int width, int rw, int overlap, int hasPrev, int c) {
    int r, s, col;
    if (overlap && hasPrev && k < rate) {
        s = k, r = first - rate + k, col = c;
    } else {
        s = overlap && hasPrev ? k - rate : k;
        r = first + s;
        col = overlap ? width + c : c;
    }
    V4Slot o;
    o.z = __fadd_rn(gate[(size_t)r * rw + col], ape[(size_t)s * rw + col]);
    o.v = kv[(size_t)r * rw + col];
    return o;
}

// Compress: one block per entry; dynamic shared memory holds the entry's
// width values through the RMS norm and the RoPE of its last 2*half channels
// at position pos0 + e*rate (angles as layers.RoPEAngles: float32 angle,
// cos and sin in double, times rscale).
extern "C" __global__ void v4_compress(float* dst, const float* kv, const float* gate, const float* ape,
                                       const float* norm, int rate, int width, int overlap, int prev, int pos0,
                                       float eps, const float* inv_freq, int half, float rscale, int interleaved) {
    pdl_entry();
    extern __shared__ float row[];
    __shared__ float red[32];
    int e = blockIdx.x;
    int rw = overlap ? 2 * width : width;
    int first = (prev ? rate : 0) + e * rate;  // first source row of window e
    int hasPrev = overlap && first - rate >= 0;
    int slots = hasPrev ? 2 * rate : rate;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        float mx = -INFINITY;
        for (int k = 0; k < slots; k++) mx = fmaxf(mx, v4_slot(kv, gate, ape, k, first, rate, width, rw, overlap, hasPrev, c).z);
        float sum = 0.f, acc = 0.f;
        for (int k = 0; k < slots; k++) {
            V4Slot s = v4_slot(kv, gate, ape, k, first, rate, width, rw, overlap, hasPrev, c);
            float w = (float)exp((double)(s.z - mx));
            sum += w;
            acc = __fadd_rn(acc, __fmul_rn(w, s.v));
        }
        row[c] = acc / sum;
    }
    __syncthreads();
    float ss = 0.f;
    for (int c = threadIdx.x; c < width; c += blockDim.x) ss += row[c] * row[c];
    ss = block_sum(ss, red);
    float inv = 1.f / sqrtf(ss / (float)width + eps);
    for (int c = threadIdx.x; c < width; c += blockDim.x) row[c] = __fmul_rn(norm[c], __fmul_rn(row[c], inv));
    __syncthreads();
    float* v = row + width - 2 * half;
    float pos = (float)(pos0 + e * rate);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float a = __fmul_rn(pos, inv_freq[i]);
        float cs = __fmul_rn((float)cos((double)a), rscale), sn = __fmul_rn((float)sin((double)a), rscale);
        int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
        float p = v[i0], q = v[i1];
        v[i0] = __fsub_rn(__fmul_rn(p, cs), __fmul_rn(q, sn));
        v[i1] = __fadd_rn(__fmul_rn(q, cs), __fmul_rn(p, sn));
    }
    __syncthreads();
    for (int c = threadIdx.x; c < width; c += blockDim.x) dst[(size_t)e * width + c] = row[c];
}

// The key row t of query p in V4 attention (dsv4.GatherKeys' order), or
// null for a -1 slot of the index list.
__device__ __forceinline__ const float* v4_row(int t, int nloc, const float* local, int l0, int lo, const float* comp,
                                               const float* fi, int topk, int dim) {
    if (t < nloc) return local + (size_t)(l0 - lo + t) * dim;
    t -= nloc;
    if (topk > 0) {
        float w = fi[t];
        if (w < 0.f) return nullptr;
        return comp + (size_t)(int)w * dim;
    }
    return comp + (size_t)t * dim;
}

#define V4_CHUNK 1024  // key scores held in shared memory at a time

// Attention with sinks: one block per (head, query); the keys are processed
// in chunks of V4_CHUNK with online rescaling, starting from the sink
// (max = sink, sum = 1). A warp scores a key at a time and keeps the key's
// row address in shared memory; the weighted sum then walks the chunk's rows
// four at a time (four independent loads in flight per thread), each thread
// owning VW consecutive columns (VW = 4: float4 loads; dsv4.go checks the
// alignment). Dynamic shared memory: V4_CHUNK scores, dim floats, V4_CHUNK
// row addresses.
template <int VW>
__device__ __forceinline__ void v4_attention_t(float* out, const float* q, const float* local, const float* comp,
                                               const float* idx, const float* sinks, int heads, int dim, int pos0, int lo,
                                               int window, int rate, int topk, int entries, float scale) {
    extern __shared__ float sh[];
    float* sc = sh;
    float* acc = sh + V4_CHUNK;
    const float** rp = reinterpret_cast<const float**>(acc + ((dim + 3) & ~3));
    __shared__ float red[32];
    int h = blockIdx.x, i = blockIdx.y, p = pos0 + i;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    int l0 = max(lo, p - window + 1);
    int nloc = p - l0 + 1;
    int ncomp = topk > 0 ? topk : (rate > 0 ? min((p + 1) / rate, entries) : 0);
    int total = nloc + ncomp;
    const float* qv = q + ((size_t)i * heads + h) * dim;
    const float* fi = topk > 0 ? idx + (size_t)i * topk : nullptr;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) acc[j] = 0.f;
    float M = sinks[h], S = 1.f;
    for (int c0 = 0; c0 < total; c0 += V4_CHUNK) {
        int cn = min(V4_CHUNK, total - c0);
        float cmax = -INFINITY;
        for (int t = warp; t < cn; t += nw) {
            const float* kr = v4_row(c0 + t, nloc, local, l0, lo, comp, fi, topk, dim);
            float d = -INFINITY;
            if (kr) {
                float s = 0.f;
                for (int j = lane; j < dim; j += WARP) s += qv[j] * kr[j];
                d = warp_sum(s) * scale;
            }
            if (lane == 0) {
                sc[t] = d;
                rp[t] = kr ? kr : local;  // a -1 slot: weight 0 on a readable row
            }
            cmax = fmaxf(cmax, d);
        }
        cmax = block_max(cmax, red);
        __syncthreads();
        float nm = fmaxf(M, cmax);
        float f = expf(M - nm);
        float ps = 0.f;
        for (int t = threadIdx.x; t < cn; t += blockDim.x) {
            float w = expf(sc[t] - nm);
            sc[t] = w;
            ps += w;
        }
        ps = block_sum(ps, red);
        __syncthreads();
        S = S * f + ps;
        for (int j = threadIdx.x * VW; j < dim; j += blockDim.x * VW) {
            float a[VW];
#pragma unroll
            for (int u = 0; u < VW; u++) a[u] = acc[j + u] * f;
            int t = 0;
            for (; t + 4 <= cn; t += 4) {
                float v[4][VW];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (VW == 4) {
                        float4 x = *reinterpret_cast<const float4*>(rp[t + k] + j);
                        v[k][0] = x.x, v[k][1] = x.y, v[k][2] = x.z, v[k][3] = x.w;
                    } else {
                        v[k][0] = rp[t + k][j];
                    }
                }
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float w = sc[t + k];
#pragma unroll
                    for (int u = 0; u < VW; u++) a[u] += w * v[k][u];
                }
            }
            for (; t < cn; t++) {
                const float w = sc[t];
#pragma unroll
                for (int u = 0; u < VW; u++) a[u] += w * rp[t][j + u];
            }
#pragma unroll
            for (int u = 0; u < VW; u++) acc[j + u] = a[u];
        }
        M = nm;
        __syncthreads();
    }
    float inv = 1.f / S;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) out[((size_t)i * heads + h) * dim + j] = acc[j] * inv;
}

extern "C" __global__ void v4_attention(float* out, const float* q, const float* local, const float* comp,
                                        const float* idx, const float* sinks, int heads, int dim, int pos0, int lo,
                                        int window, int rate, int topk, int entries, float scale) {
    pdl_entry();
    v4_attention_t<1>(out, q, local, comp, idx, sinks, heads, dim, pos0, lo, window, rate, topk, entries, scale);
}
extern "C" __global__ void v4_attention4(float* out, const float* q, const float* local, const float* comp,
                                         const float* idx, const float* sinks, int heads, int dim, int pos0, int lo,
                                         int window, int rate, int topk, int entries, float scale) {
    pdl_entry();
    v4_attention_t<4>(out, q, local, comp, idx, sinks, heads, dim, pos0, lo, window, rate, topk, entries, scale);
}

// Transpose: src [a, b, w] into dst [b, a, w].
extern "C" __global__ void v4_transpose(float* dst, const float* src, int a, int b, int w) {
    pdl_entry();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)a * b * w) return;
    int c = (int)(idx % w);
    long long ij = idx / w;
    int i = (int)(ij / b), j = (int)(ij % b);
    dst[((long long)j * a + i) * w + c] = src[idx];
}

// Gather: dst[i] = src[rows[i]] for the blockIdx.y-th of up to kIdBlock rows
// (ids in the parameters); dst points at the block's first row.
extern "C" __global__ void rows_gather(float* dst, const float* src, IdBlock rows, int w) {
    pdl_entry();
    int i = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= w) return;
    dst[(size_t)i * w + c] = src[(size_t)rows.v[i] * w + c];
}

// ScatterAdd of up to 128 rows: dst[rows[i]] += scale[i] * src[i], the rows
// taken in order by each thread (a row may repeat); src points at the block's
// first row.
#define kRowBlock 128
struct RowScaleBlock {
    int row[kRowBlock];
    float scale[kRowBlock];
};

extern "C" __global__ void rows_scatter_add(float* dst, const float* src, RowScaleBlock rs, int n, int w) {
    pdl_entry();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= w) return;
    for (int i = 0; i < n; i++) {
        float* d = dst + (size_t)rs.row[i] * w + c;
        *d = __fadd_rn(*d, __fmul_rn(rs.scale[i], src[(size_t)i * w + c]));
    }
}
