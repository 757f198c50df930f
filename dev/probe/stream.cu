// Stream-read probe: how fast one kernel launch can pull a weight matrix's
// bytes from HBM, by which path, with no arithmetic on them; the ceiling the
// m = 1 matmuls (gemv.cuh) are measured against in docs/PERFORMANCE.md.
// Standalone (CUDA runtime, not part of the kernel image); on the device:
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a dev/probe/stream.cu -o /tmp/stream && /tmp/stream
//
// Sizes: 33030144 bytes (the weights and scales of a 4096 x 14336 NVFP4
// matrix) and 132 MB, each over 8 rotating copies so that no launch finds its
// bytes in L2. Paths: ld.global.nc 16-byte loads (U in flight per thread);
// a persistent ring of cp.async.bulk stages (stage bytes SB in NC copies, NS
// stages, bps blocks per multiprocessor, 8 warps consuming); the ring with
// gemv_nvfp4_tma's pattern (16 rows x 1024 bytes plus 16 x 128 scale bytes
// per stage); the first two with programmatic dependent launch (PDL).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "probe.cuh"

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) { asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do { asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory"); } while (!done);
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}


// Persistent ring: stage = SB bytes of a chunk split in NC copies; CW consumer warps.
// mode 0: chunks contiguous; mode 1: gemv rows: 16 rows x 1024 B (row stride rs) + 16 x 128 B scales.
template <int CW>
__global__ void k_ring(const uint8_t* __restrict__ p, const uint8_t* __restrict__ sc, int chunks, int SB, int NC, int NS, int mode, size_t rs, size_t srs, int kst, float* out) {
    extern __shared__ __align__(128) unsigned char sm[];
    pdl_launch();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int RB = mode ? (16 * 1024 + 16 * 128) : SB;
    uint32_t bars = smem_u32(sm + NS * RB);
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (NS + s); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; s++) { mbar_init(full(s), 1); mbar_init(empty(s), CW); }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (warp == CW) {
        int slot = 0; uint32_t ph = 0;
        for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
            mbar_wait(empty(slot), ph ^ 1);
            if (mode == 0) {
                if (lane == 0) mbar_expect_tx(full(slot), SB);
                __syncwarp();
                const int per = SB / NC;
                if (lane < NC) bulk_g2s(smem_u32(sm + slot * RB + lane * per), p + (size_t)c * SB + lane * per, per, full(slot));
            } else {
                if (lane == 0) mbar_expect_tx(full(slot), RB);
                __syncwarp();
                const int tile = c / kst, ks = c % kst, r = lane & 15;
                if (lane < 16) bulk_g2s(smem_u32(sm + slot * RB + r * 1024), p + (size_t)(tile * 16 + r) * rs + (size_t)ks * 1024, 1024, full(slot));
                else bulk_g2s(smem_u32(sm + slot * RB + 16384 + r * 128), sc + (size_t)(tile * 16 + r) * srs + (size_t)ks * 128, 128, full(slot));
            }
            if (++slot == NS) slot = 0, ph ^= 1;
        }
        return;
    }
    uint32_t acc = 0; int slot = 0; uint32_t ph = 0;
    for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
        mbar_wait(full(slot), ph);
        const uint4* st = reinterpret_cast<const uint4*>(sm + slot * RB);
        for (int j = threadIdx.x; j < RB / 16; j += CW * 32) { uint4 v = st[j]; acc ^= v.x ^ v.w; }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty(slot));
        if (++slot == NS) slot = 0, ph ^= 1;
    }
    if (acc == 0x12345678u) out[0] = 1.f;
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s sms %d l2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
    const size_t big = 1ull << 30;
    uint8_t *a, *b; float* out;
    CK(cudaMalloc(&a, big)); CK(cudaMalloc(&b, big)); CK(cudaMalloc(&out, 16));
    CK(cudaMemset(a, 1, big)); CK(cudaMemset(b, 2, big));
    auto timeit = [&](auto launch, int iters) { return time_us(launch, iters, 3); };  // us
    const double copyBW = copy_bandwidth(b, a, big, 3, "copy 1GB");
    size_t sizes[] = {4096ull * 14336 / 2 + 4096ull * 14336 / 16, 16384ull * 14336 / 2 + 16384ull * 14336 / 16};
    for (size_t bytes : sizes) {
        const int nb = (int)(big / bytes) > 8 ? 8 : (int)(big / bytes);
        int rot = 0;
        auto buf = [&]() { rot = (rot + 1) % nb; return a + (size_t)rot * bytes; };
        printf("== %zu bytes (%d rotating buffers)\n", bytes, nb);
        auto report = [&](const char* name, double us) { printf("%-40s %8.2f us %6.0f GB/s %5.1f%% of copy\n", name, us, bytes / (us * 1e-6) / 1e9, 100.0 * bytes / (us * 1e-6) / copyBW); };
        for (int bps : {1, 2, 4, 8}) for (int thr : {256, 512}) {
            if (bps * thr > 2048) continue;
            char nm[64]; snprintf(nm, 64, "ldg U4 blocks/sm %d threads %d", bps, thr);
            report(nm, timeit([&] { k_ldg<4, true><<<sms * bps, thr>>>((const uint4*)buf(), bytes / 16, out); }, 50));
        }
        for (int bps : {2, 4}) {
            char nm[64]; snprintf(nm, 64, "ldg U8 blocks/sm %d threads 256", bps);
            report(nm, timeit([&] { k_ldg<8, true><<<sms * bps, 256>>>((const uint4*)buf(), bytes / 16, out); }, 50));
        }
        struct R { int SB, NC, NS, bps; };
        for (R r : std::vector<R>{{16384, 1, 6, 2}, {16384, 16, 6, 2}, {16384, 32, 6, 2}, {32768, 1, 3, 2}, {32768, 2, 3, 2}, {16384, 1, 4, 3}, {8192, 1, 8, 3}, {16384, 1, 12, 1}, {65536, 1, 3, 1}, {4096, 1, 12, 4}}) {
            int chunks = (int)(bytes / r.SB);
            size_t smem = (size_t)r.NS * r.SB + 16 * r.NS;
            CK(cudaFuncSetAttribute(k_ring<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            char nm[80]; snprintf(nm, 80, "ring contig SB %d NC %d NS %d bps %d", r.SB, r.NC, r.NS, r.bps);
            report(nm, timeit([&] { k_ring<8><<<sms * r.bps, 9 * 32, smem>>>(buf(), nullptr, chunks, r.SB, r.NC, r.NS, 0, 0, 0, 1, out); }, 50));
        }
        for (int K : {14336, 4096}) {  // gemv rows: N rows x K; weights N*K/2 then scales N*K/16
            size_t N = bytes / (K / 2 + K / 16);
            int kst = K / 2048, chunks = (int)(N / 16) * kst;
            for (int NS : {4, 5}) {
                size_t smem = (size_t)NS * (16 * 1024 + 2048) + 16 * NS;
                CK(cudaFuncSetAttribute(k_ring<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                char nm[80]; snprintf(nm, 80, "ring gemv rows K %d NS %d bps 2", K, NS);
                report(nm, timeit([&] { uint8_t* w = buf(); k_ring<8><<<sms * 2, 9 * 32, smem>>>(w, w + N * K / 2, chunks, 0, 0, NS, 1, K / 2, K / 16, kst, out); }, 50));
            }
        }
        {
            cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
            cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(sms * 4); cfg.blockDim = dim3(256); cfg.attrs = at; cfg.numAttrs = 1;
            report("ldg U4 bps 4 thr 256 PDL", timeit([&] { CK(cudaLaunchKernelEx(&cfg, k_ldg<4, true>, (const uint4*)buf(), bytes / 16, out)); }, 50));
            size_t smem = 6 * 16384 + 96;
            CK(cudaFuncSetAttribute(k_ring<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            cudaLaunchConfig_t c2 = cfg; c2.gridDim = dim3(sms * 2); c2.blockDim = dim3(288); c2.dynamicSmemBytes = smem;
            int chunks = (int)(bytes / 16384);
            report("ring contig 16K NS 6 bps 2 PDL", timeit([&] { CK(cudaLaunchKernelEx(&c2, k_ring<8>, (const uint8_t*)buf(), (const uint8_t*)nullptr, chunks, 16384, 1, 6, 0, (size_t)0, (size_t)0, 1, out)); }, 50));
        }
    }
    return 0;
}
