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

// Mixer.Activate, one thread per row: pre/post sigmoids, then Sinkhorn-Knopp
// (lite == 0) on res in place or mHC-lite's convex combination of the nz = n!
// permutation matrices. logits [rows, 2n + nz] is overwritten like the
// reference's.
extern "C" __global__ void mhc_activate(float* pre, float* post, float* res, float* logits, const float* base,
                                        const float* scale, int rows, int n, int iters, float eps, int lite, int nz) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    int mix = 2 * n + nz;
    float* l = logits + (size_t)r * mix;
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

// Pre: dst[r, c] = sum_i pre[r, i] * x[r, i, c]; one thread per (r, c).
extern "C" __global__ void mhc_pre(float* dst, const float* x, const float* pre, int rows, int n, int hidden) {
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

// HeadActivate: pre[i] = sigmoid(pre[i] * scale + base[i % n]) + eps.
extern "C" __global__ void mhc_head_activate(float* pre, const float* base, float scale, float eps, int total, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    pre[i] = __fadd_rn(mhc_sigmoid(__fadd_rn(__fmul_rn(pre[i], scale), base[i % n])), eps);
}

// Expand: dst[r, i, c] = emb[r, c].
extern "C" __global__ void mhc_expand(float* dst, const float* emb, int rows, int n, int hidden) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)rows * n * hidden) return;
    int c = (int)(idx % hidden);
    long long r = idx / ((long long)n * hidden);
    dst[idx] = emb[r * hidden + c];
}
