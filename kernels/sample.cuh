// Token sampling on the device (backend.TokenSampler): only the chosen id
// goes back to the host. Two launches: every block finds the top k of its
// slice of the vocabulary; one block merges those candidates, takes the top k
// (largest first, ties to the lower id, as backend/cpu.SampleToken) and draws
// from their softmax with the host's uniform number u.

// better: a before b in the candidate order. NaN comes first, so that a NaN
// logit reaches the final stage, which reports it instead of drawing.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
    bool na = va != va, nb = vb != vb;
    if (na || nb) return na && (!nb || ia < ib);
    return va > vb || (va == vb && ia < ib);
}

// block_best returns, in every thread, the best (value, id) of the block's
// candidates (one per thread; id -1 for none).
__device__ void block_best(float& v, int& id, float* sv, int* si) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffff, v, o);
        int oi = __shfl_xor_sync(0xffffffff, id, o);
        if (oi >= 0 && (id < 0 || better(ov, oi, v, id))) v = ov, id = oi;
    }
    __syncthreads();
    if (lane == 0) sv[warp] = v, si[warp] = id;
    __syncthreads();
    int nw = blockDim.x / WARP;
    v = lane < nw ? sv[lane] : -INFINITY;
    id = lane < nw ? si[lane] : -1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffff, v, o);
        int oi = __shfl_xor_sync(0xffffffff, id, o);
        if (oi >= 0 && (id < 0 || better(ov, oi, v, id))) v = ov, id = oi;
    }
}

// Top k of values[ids] (n entries in shared memory; ids may be null for
// 0..n-1) into outv/outi, largest first. Entries taken are marked in used.
__device__ void block_topk(const float* vals, const int* ids, int n, int k, unsigned char* used, float* outv, int* outi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int i = threadIdx.x; i < n; i += blockDim.x) used[i] = 0;
    __syncthreads();
    for (int r = 0; r < k; r++) {
        float v = -INFINITY;
        int id = -1, at = -1;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            int gi = ids ? ids[i] : i;
            if (!used[i] && gi >= 0 && (id < 0 || better(vals[i], gi, v, id))) v = vals[i], id = gi, at = i;
        }
        int myid = id;
        block_best(v, id, sv, si);
        if (id >= 0 && myid == id) used[at] = 1;  // the owner marks it
        if (threadIdx.x == 0) outv[r] = v, outi[r] = id;
        __syncthreads();
    }
}

// Stage 1: block b takes logits [b*chunk, (b+1)*chunk) and writes its top k
// candidates (id -1 past the slice) to cand[b*k ...].
__device__ __forceinline__ void sample_partial_body(const float* logits, int n, int chunk, int k, float* candv,
                                                    int* candi) {
    extern __shared__ float sh[];
    int lo = blockIdx.x * chunk, len = max(0, min(chunk, n - lo));
    float* vals = sh;
    int* ids = (int*)(sh + chunk);
    unsigned char* used = (unsigned char*)(ids + chunk);
    for (int i = threadIdx.x; i < len; i += blockDim.x) vals[i] = logits[lo + i], ids[i] = lo + i;
    __syncthreads();
    __shared__ float ov[256];
    __shared__ int oi[256];
    int kk = min(k, len);
    block_topk(vals, ids, len, kk, used, ov, oi);
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
        candv[blockIdx.x * k + r] = r < kk ? ov[r] : -INFINITY;
        candi[blockIdx.x * k + r] = r < kk ? oi[r] : -1;
    }
}

extern "C" __global__ void sample_partial(const float* logits, int n, int chunk, int k, float* candv, int* candi) {
    pdl_entry();
    sample_partial_body(logits, n, chunk, k, candv, candi);
}

// Stage 2: one block merges m candidates, keeps the top k and draws.
// temperature <= 0: the best one.
__device__ __forceinline__ void sample_final_body(const float* candv, const int* candi, int m, int k,
                                                  float temperature, double u, int* out) {
    extern __shared__ float sh[];
    float* vals = sh;
    int* ids = (int*)(sh + m);
    unsigned char* used = (unsigned char*)(ids + m);
    for (int i = threadIdx.x; i < m; i += blockDim.x) vals[i] = candv[i], ids[i] = candi[i];
    __syncthreads();
    __shared__ float tv[256];
    __shared__ int ti[256];
    int kk = temperature <= 0.f ? 1 : k;
    block_topk(vals, ids, m, kk, used, tv, ti);
    if (threadIdx.x != 0) return;
    if (tv[0] != tv[0]) {  // logit ti[0] is NaN: -1 - its id, no draw
        out[0] = -1 - ti[0];
        return;
    }
    if (temperature <= 0.f) {
        out[0] = ti[0];
        return;
    }
    int n = 0;
    while (n < kk && ti[n] >= 0) n++;
    double p[256], sum = 0;
    for (int i = 0; i < n; i++) {
        p[i] = exp((double)((tv[i] - tv[0]) / temperature));
        sum += p[i];
    }
    double r = u * sum;
    for (int i = 0; i < n; i++) {
        if (r < p[i]) {
            out[0] = ti[i];
            return;
        }
        r -= p[i];
    }
    out[0] = ti[n - 1];
}

extern "C" __global__ void sample_final(const float* candv, const int* candi, int m, int k, float temperature, double u,
                                        int* out) {
    pdl_entry();
    sample_final_body(candv, candi, m, k, temperature, u, out);
}

// Batched picks (SampleTokens, kernels/sample.go): pick i's options are the
// 5 step values from dyn[enc + 5i]: its row of logits ([rows, n]), its k (1
// when greedy), its temperature's bits and the low and high words of u. Its
// candidates take cand[i*SAMPLE_BLOCKS*kmax ...], its id out[i].
// sample_partial_rows: grid (SAMPLE_BLOCKS, picks), as sample_partial for
// each pick; sample_final_rows: grid (picks), as sample_final.
#define SAMPLE_BLOCKS 64
extern "C" __global__ void sample_partial_rows(const float* logits, int n, int chunk, int kmax, float* candv,
                                              int* candi, const int* dyn, int enc) {
    pdl_entry();
    const int* a = dyn + enc + 5 * blockIdx.y;
    const size_t at = (size_t)blockIdx.y * SAMPLE_BLOCKS * kmax;
    sample_partial_body(logits + (size_t)a[0] * n, n, chunk, a[1], candv + at, candi + at);
}

extern "C" __global__ void sample_final_rows(const float* candv, const int* candi, int kmax, const int* dyn, int enc,
                                            int* out) {
    pdl_entry();
    const int* a = dyn + enc + 5 * blockIdx.x;
    const size_t at = (size_t)blockIdx.x * SAMPLE_BLOCKS * kmax;
    sample_final_body(candv + at, candi + at, SAMPLE_BLOCKS * a[1], a[1], __int_as_float(a[2]),
                      __hiloint2double(a[4], a[3]), out + blockIdx.x);
}
