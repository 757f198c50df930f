// What the standalone probes share (dev/probe/*.cu, each built by one nvcc
// command): the error check, timing a launch with CUDA events, and the
// device's copy bandwidth, the roofline they report against.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

// us per call of launch over iters calls queued back to back, after warm
// calls that are not timed.
template <typename F>
double time_us(F launch, int iters, int warm) {
    static cudaEvent_t e0, e1;
    if (!e0) { CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1)); }
    for (int i = 0; i < warm; i++) launch();
    CK(cudaGetLastError());
    CK(cudaEventRecord(e0));
    for (int i = 0; i < iters; i++) launch();
    CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e3 / iters;
}

// The device-to-device copy rate of bytes from src to dst (the driver's
// copy), counting bytes read and written; printed as label says.
inline double copy_bandwidth(void* dst, const void* src, size_t bytes, int warm, const char* label) {
    const double us = time_us([&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 10, warm);
    const double bw = 2.0 * bytes / (us * 1e-6);
    printf("%s %.1f us = %.0f GB/s (read + write)\n", label, us, bw / 1e9);
    return bw;
}
