/*
 * gpu-link-bandwidth - what the host-to-device link moves, as the reference
 * pjserve's weight loads are held against (scripts/gpu-check).
 *
 *   gpu-link-bandwidth BYTES REPS
 *
 * Copies BYTES from host memory to device memory REPS times with cudaMemcpy
 * from three kinds of host memory: pageable (malloc, every page touched),
 * registered (malloc + cudaHostRegister: what PJRT_Client_DmaMap does to a
 * host floor) and pinned (cudaHostAlloc). Each copy is timed with CUDA events;
 * the median and best of each kind go to stdout as one JSON object. Exits 1
 * with CUDA's message when a call fails (no device, no driver).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static void check(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess) {
        std::fprintf(stderr, "gpu-link-bandwidth: %s: %s\n", what, cudaGetErrorString(rc));
        std::exit(1);
    }
}

struct timing {
    double median_s, best_s;
};

static timing time_copies(void *dst, const void *src, size_t bytes, int reps)
{
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "warm-up copy");
    std::vector<double> seconds;
    for (int i = 0; i < reps; i++) {
        check(cudaEventRecord(start), "cudaEventRecord");
        check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        check(cudaEventRecord(stop), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        seconds.push_back(ms / 1e3);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(seconds.begin(), seconds.end());
    return {seconds[seconds.size() / 2], seconds.front()};
}

static void print_kind(const char *name, timing t, size_t bytes, bool last)
{
    std::printf("  \"%s\": {\"median_s\": %.9f, \"best_s\": %.9f, \"median_gb_per_s\": %.3f}%s\n",
                name, t.median_s, t.best_s, bytes / t.median_s / 1e9, last ? "" : ",");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        std::fprintf(stderr, "usage: gpu-link-bandwidth BYTES REPS\n");
        return 2;
    }
    size_t bytes = std::strtoull(argv[1], nullptr, 10);
    int reps = std::atoi(argv[2]);
    if (bytes == 0 || reps <= 0) {
        std::fprintf(stderr, "gpu-link-bandwidth: BYTES and REPS must be positive\n");
        return 2;
    }
    cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    void *device = nullptr;
    check(cudaMalloc(&device, bytes), "cudaMalloc");

    char *pageable = static_cast<char *>(std::malloc(bytes));
    if (pageable == nullptr) {
        std::fprintf(stderr, "gpu-link-bandwidth: out of host memory for %zu bytes\n", bytes);
        return 1;
    }
    std::memset(pageable, 1, bytes);
    timing t_pageable = time_copies(device, pageable, bytes, reps);
    check(cudaHostRegister(pageable, bytes, cudaHostRegisterDefault), "cudaHostRegister");
    timing t_registered = time_copies(device, pageable, bytes, reps);
    check(cudaHostUnregister(pageable), "cudaHostUnregister");
    std::free(pageable);

    void *pinned = nullptr;
    check(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    std::memset(pinned, 1, bytes);
    timing t_pinned = time_copies(device, pinned, bytes, reps);
    cudaFreeHost(pinned);
    cudaFree(device);

    std::printf("{\n  \"device\": \"%s\",\n  \"bytes\": %zu,\n  \"reps\": %d,\n", prop.name, bytes,
                reps);
    print_kind("pageable", t_pageable, bytes, false);
    print_kind("registered", t_registered, bytes, false);
    print_kind("pinned", t_pinned, bytes, true);
    std::printf("}\n");
    return 0;
}
