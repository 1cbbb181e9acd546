// Probes of the K stream's rate (benchmarks/probe_k_stream.py): each kernel reads a buffer once
// and folds it into a value it never writes (unless it equals a sentinel), so only the loads count.
//   k_cpasync: each block streams one contiguous run through a ring of STAGES cp.async stages of
//              SB bytes (STAGES - 1 in flight while one is read), as santa_prop.cu.jinja does;
//   k_bulk:    the same ring filled by one thread's cp.async.bulk copies (TMA, one mbarrier a stage);
//   k_ldg:     plain 16-byte loads, UNROLL in flight a thread, grid-stride.
#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ void cpa16(void* smem, const void* g) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void waitg() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ uint32_t su32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

template <int STAGES, int SB, int THREADS>
__global__ void __launch_bounds__(THREADS) k_cpasync(const uint4* __restrict__ src, long long n16, unsigned* out) {
    extern __shared__ __align__(128) uint4 ring[];
    constexpr int PER = SB / 16;
    long long pb = (n16 + gridDim.x - 1) / gridDim.x;
    pb = (pb + PER - 1) / PER * PER;
    long long start = blockIdx.x * pb;
    long long end = start + pb < n16 ? start + pb : n16;
    int nst = end > start ? (int)((end - start) / PER) : 0;
    auto issue = [&](int st) {
        uint4* dst = ring + (st % STAGES) * PER;
        const uint4* s = src + start + (long long)st * PER;
#pragma unroll
        for (int j = threadIdx.x; j < PER; j += THREADS) cpa16(dst + j, s + j);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) { if (s < nst) issue(s); commit(); }
    unsigned acc = 0;
    for (int i = 0; i < nst; ++i) {
        if (i + STAGES - 1 < nst) issue(i + STAGES - 1);
        commit();
        waitg<STAGES - 1>();
        __syncthreads();
        const uint4* b = ring + (i % STAGES) * PER;
#pragma unroll
        for (int j = threadIdx.x; j < PER; j += THREADS) { uint4 x = b[j]; acc ^= x.x ^ x.y ^ x.z ^ x.w; }
        __syncthreads();
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

template <int STAGES, int SB, int THREADS>
__global__ void __launch_bounds__(THREADS) k_bulk(const char* __restrict__ src, long long nbytes, unsigned* out) {
    extern __shared__ __align__(128) char ringb[];
    __shared__ __align__(8) uint64_t full[STAGES];
    long long pb = (nbytes + gridDim.x - 1) / gridDim.x;
    pb = (pb + SB - 1) / SB * SB;
    long long start = blockIdx.x * pb;
    long long end = start + pb < nbytes ? start + pb : nbytes;
    int nst = end > start ? (int)((end - start) / SB) : 0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(su32(&full[s])));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int st) {
        uint64_t* bar = &full[st % STAGES];
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(su32(bar)), "r"(SB) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                     ::"r"(su32(ringb + (st % STAGES) * SB)), "l"(src + start + (long long)st * SB), "r"(SB), "r"(su32(bar)) : "memory");
    };
    if (threadIdx.x == 0) for (int s = 0; s < STAGES && s < nst; ++s) issue(s);
    unsigned acc = 0;
    for (int i = 0; i < nst; ++i) {
        uint32_t par = (i / STAGES) & 1;
        asm volatile("{\n.reg .pred d;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 d, [%0], %1;\n@!d bra W_%=;\n}\n"
                     ::"r"(su32(&full[i % STAGES])), "r"(par) : "memory");
        const uint4* b = reinterpret_cast<const uint4*>(ringb + (i % STAGES) * SB);
#pragma unroll
        for (int j = threadIdx.x; j < SB / 16; j += THREADS) { uint4 x = b[j]; acc ^= x.x ^ x.y ^ x.z ^ x.w; }
        __syncthreads();
        if (threadIdx.x == 0 && i + STAGES < nst) issue(i + STAGES);
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

template <int UNROLL, int THREADS>
__global__ void __launch_bounds__(THREADS) k_ldg(const uint4* __restrict__ src, long long n16, unsigned* out) {
    unsigned acc = 0;
    long long stride = (long long)gridDim.x * THREADS * UNROLL;
    for (long long base = (long long)blockIdx.x * THREADS * UNROLL + threadIdx.x; base < n16; base += stride) {
        uint4 x[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long long i = base + (long long)u * THREADS;
            if (i < n16) asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(x[u].x), "=r"(x[u].y), "=r"(x[u].z), "=r"(x[u].w) : "l"(src + i));
            else x[u] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= x[u].x ^ x[u].y ^ x[u].z ^ x[u].w;
    }
    if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

template <typename F>
static int setup(F f, int smem) {
    return (int)cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
}

#define CPA(ST, SB, TH) \
    extern "C" int cpa_##ST##_##SB##_##TH(const void* s, long long nb, unsigned* o, int grid, cudaStream_t st) { \
        int sm = ST * SB; static bool ok = false; if (!ok) { setup(k_cpasync<ST, SB, TH>, sm); ok = true; } \
        k_cpasync<ST, SB, TH><<<grid, TH, sm, st>>>((const uint4*)s, nb / 16, o); return (int)cudaGetLastError(); }
#define BULK(ST, SB, TH) \
    extern "C" int bulk_##ST##_##SB##_##TH(const void* s, long long nb, unsigned* o, int grid, cudaStream_t st) { \
        int sm = ST * SB; static bool ok = false; if (!ok) { setup(k_bulk<ST, SB, TH>, sm); ok = true; } \
        k_bulk<ST, SB, TH><<<grid, TH, sm, st>>>((const char*)s, nb, o); return (int)cudaGetLastError(); }
#define LDG(U, TH) \
    extern "C" int ldg_##U##_##TH(const void* s, long long nb, unsigned* o, int grid, cudaStream_t st) { \
        k_ldg<U, TH><<<grid, TH, 0, st>>>((const uint4*)s, nb / 16, o); return (int)cudaGetLastError(); }

CPA(4, 16384, 256)
CPA(4, 32768, 256)
BULK(4, 32768, 256)
BULK(3, 65536, 256)
LDG(4, 256)
