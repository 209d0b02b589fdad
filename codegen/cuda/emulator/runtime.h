/* tensordsl's CUDA emulator: the CUDA execution model on the CPU, for C++ host compilers.
 *
 * A translation unit includes this header, then CUDA kernels exactly as NVRTC would see
 * them (codegen/cuda/emulator/emulate.py wraps each one in its own namespace and appends a descriptor
 * per kernel with TDSL_EMU_KERNEL). A launch runs the blocks one after another on the
 * calling OS thread; each CUDA thread of a block is a fiber (ucontext, mmap'd stack with a
 * guard page) that runs until it reaches a barrier or returns:
 *
 * - `__syncthreads` waits until every thread of the block that has not exited waits there
 *   (exited threads count as arrived, as on the GPU);
 * - `__syncwarp`, `__shfl*_sync`, `__ballot_sync`, `__any_sync`, `__all_sync` wait until
 *   every lane named in the mask (that exists in the block) waits at a warp intrinsic; the
 *   lanes must agree on the intrinsic and the mask. A shuffle reading a lane outside the
 *   mask gets all-ones bytes (NaN, -1): undefined on the GPU, visible here;
 *   `__activemask()` waits until no lane of the warp can run and returns the lanes that
 *   reached the same `__activemask()` call (the emulator's notion of converged lanes);
 * - `__shared__` variables are `thread_local` (static storage, `extern __shared__` allowed)
 *   and every byte of them is set to 0xff before each block, so reading shared memory that
 *   the block did not write gives NaN or -1;
 * - when no fiber can run and no barrier can be released, the launch stops and reports
 *   which threads wait where (a deadlock), instead of hanging;
 * - `td_mma_16816_bf16` / `td_mma_16816_f16(d, a, b)`, the tensor-core product of the mma
 *   strategy (codegen/cuda/staged/mma.py; inline PTX `mma.sync.aligned.m16n8k16` on a GPU), are
 *   warp-collective here too: each lane publishes its A and B fragments, the warp syncs,
 *   each lane computes its own four D values in float (k ascending), the warp syncs again;
 *   `td_mma_1688_bf16` / `td_mma_1688_f16` (m16n8k8, the first 8 of k) likewise;
 *   The generated source skips its inline PTX where `TDSL_CUDA_EMULATOR` is defined;
 * - `order` 1 runs the blocks and the threads of each block in reverse order, so that a
 *   missing barrier changes the result.
 * Fibers switch only at barriers, so atomics are plain read-modify-writes. Launches of one
 * translation unit are serialised by a mutex.
 *
 * Counting (a unit built with TDSL_EMU_COUNT, see codegen/cuda/emulator/counting.h): the
 * kernel's `TDSL_COUNT_FMA(n)` hooks, its global loads and stores and its shared-memory
 * bank conflicts are counted per launch.
 *
 * This header declares; runtime.cc defines (the scheduler, fibers, `launch`, the waits of the
 * warp intrinsics, the tensor-core product). A unit links runtime.cc compiled once per cache
 * folder (codegen/cuda/emulator/pch.py), so that its compiler call generates only its
 * kernels; and the header includes no C++ library header but <cmath> (the scheduler's
 * strings and vectors are runtime.cc's), so that a unit reads little besides the CUDA
 * headers: with the header precompiled, both cut a unit's compile to about a fifth
 * (docs/testing.md). Every name here is hidden: each unit's library has its own state.
 */
#ifndef TDSL_CUDA_EMU_H
#define TDSL_CUDA_EMU_H

#include <ucontext.h>

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __shared__
#undef __constant__
#undef __launch_bounds__
#undef __align__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ thread_local
#define __constant__

#define TDSL_CUDA_EMULATOR 1 /* generated CUDA takes the emulator's td_mma_16816_* */
#define TDSL_EMU_EXPORT extern "C" __attribute__((visibility("default")))
#define TDSL_EMU_MAX_SHARED (227 * 1024) /* dynamic shared memory per block (H100) */

/* What codegen/cuda/emulator/emulate.py and the FFI handler see of one kernel (C layout). */
struct tdsl_emu_kernel {
    const char *name;
    const char *signature; /* one token per parameter: "p" pointer, "i8" int64, "f4" ... */
    int (*launch)(const struct tdsl_emu_kernel *kernel, const long long *grid,
                  const long long *block, long long shared_bytes, void **params, int order,
                  char *error, long long error_size);
    void (*invoke)(void **params);
};

/* Every name of the runtime is hidden: each unit's shared object has its own (runtime.cc). */
#pragma GCC visibility push(hidden)
namespace tdsl_emu {

enum class Wait { none, block, warp, exited };
enum class Op { syncwarp, shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all, active };
constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned kFullMask = 0xffffffffu;

struct Fiber {
    ucontext_t context;
    uint3 thread_idx;
    int linear = 0;
    Wait wait = Wait::none;
    const char *what = "", *file = "";
    int line = 0;
    Op op = Op::syncwarp;
    unsigned mask = 0;
    int lane_arg = 0, width = 32, predicate = 0;
    size_t bytes = 0;
    uint64_t value = 0, result = 0;
};

/* What kernel code reads of a launch (the CUDA built-in variables); the scheduler's own
 * state is runtime.cc's, so that a unit parses no C++ library header but <cmath>. */
struct Launch {
    dim3 grid_dim, block_dim;
    uint3 block_idx;
    Fiber *current = nullptr;
};

/* ---- defined in runtime.cc ---- */

extern Launch rt;
extern uintptr_t shared_lo, shared_hi; /* this module's TLS block: every `__shared__` byte */

/* Park the calling fiber at a barrier until the scheduler releases it. */
void suspend(Wait wait, const char *what, const char *file, int line);
/* Stop the launch with `message` (the first one is reported); `assert(e)` in a kernel. */
[[noreturn]] void fail(const char *message);
[[noreturn]] void fail_assertion(const char *expression, const char *file, int line);
/* The launch a kernel's descriptor points to (`tdsl_emu_kernel::launch`). */
int launch(const tdsl_emu_kernel *kernel, const long long *grid, const long long *block,
           long long shared, void **params, int order, char *error, long long error_size);
/* A warp intrinsic: wait for the lanes of `mask`, return this lane's result (`bytes` of it). */
uint64_t warp_wait(Op op, const char *what, const char *file, int line, unsigned mask,
                   uint64_t value, size_t bytes, int lane_arg, int width);
/* The tensor-core product (below), of 16-bit values read by `value`. */
void mma_16816(float (*value)(unsigned short), const char *what, const char *file, int line,
               float d[4], const unsigned a[4], const unsigned b[2], int depth = 16);
float bf16_value(unsigned short bits);
float f16_value(unsigned short bits);

/* Counting (counting.h defines them): lanes run kernel code between count_enter and
 * count_leave; a block barrier or the block's end closes the warps' shared-memory accesses. */
#ifdef TDSL_EMU_COUNT
void count_enter();
void count_leave();
void count_barrier(bool end);
#endif

/* ---- warp intrinsics ---- */

template <class T>
T warp_op(Op op, const char *what, const char *file, int line, unsigned mask, T value,
          int lane_arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value);
    uint64_t bits = 0;
    memcpy(&bits, &value, sizeof(T));
    bits = warp_wait(op, what, file, line, mask, bits, sizeof(T), lane_arg, width);
    T result;
    memcpy(&result, &bits, sizeof(T));
    return result;
}

inline unsigned vote(Op op, const char *what, const char *file, int line, unsigned mask, int p) {
    rt.current->predicate = p != 0;
    return warp_op<unsigned>(op, what, file, line, mask, 0u, 0, 32);
}

/* ---- kernel descriptors ---- */

/* A kernel's parameter kinds, one token each ("p" pointer, "f4" float, "i8" int64, "u2"
 * half ...), as constants: a descriptor is initialised statically. */
template <size_t N> struct Text {
    char c[N];
};

template <class T> constexpr Text<24> kind() {
    Text<24> text{};
    if (std::is_pointer<T>::value) {
        text.c[0] = 'p';
        return text;
    }
    text.c[0] = std::is_floating_point<T>::value ? 'f' : std::is_signed<T>::value ? 'i' : 'u';
    char digits[20] = {};
    int n = 0;
    for (size_t size = sizeof(T); size > 0; size /= 10) digits[n++] = char('0' + size % 10);
    for (int k = 0; k < n; ++k) text.c[1 + k] = digits[n - 1 - k];
    return text;
}

template <class... A> struct Signature {
    static constexpr Text<24 * sizeof...(A) + 1> text = [] {
        Text<24 * sizeof...(A) + 1> joined{};
        size_t n = 0;
        const Text<24> tokens[] = {Text<24>{}, kind<A>()...};
        for (const Text<24> &token : tokens) {
            if (token.c[0] == 0) continue;
            if (n > 0) joined.c[n++] = ' ';
            for (size_t k = 0; token.c[k] != 0; ++k) joined.c[n++] = token.c[k];
        }
        return joined;
    }();
};

template <class... A> constexpr const char *signature(void (*)(A...)) {
    return Signature<A...>::text.c;
}

template <auto Kernel> struct Invoke;
template <class... A, void (*Kernel)(A...)> struct Invoke<Kernel> {
    template <size_t... I> static void call(void **params, std::index_sequence<I...>) {
        Kernel(*static_cast<std::remove_reference_t<A> *>(params[I])...);
    }
    static void run(void **params) { call(params, std::index_sequence_for<A...>{}); }
};

} // namespace tdsl_emu
#pragma GCC visibility pop

/* The runtime's code: linked as runtime.o (built once per cache folder, pch.py) into a unit,
 * or compiled in the unit where it has no runtime.o or counts (its accesses instrumented with
 * the kernels', as they always were; counting.h reads its state). */
#if defined(TDSL_EMU_COUNT) || defined(TDSL_EMU_RUNTIME_HERE)
#include "runtime.cc"
#endif

#ifdef TDSL_EMU_COUNT
#include "counting.h"
#else
#define TDSL_COUNT_FMA(n) ((void)0)
#endif

#define TDSL_EMU_KERNEL(space, entry)                                                         \
    TDSL_EMU_EXPORT const tdsl_emu_kernel tdsl_emu_kernel_##entry = {                         \
        #entry, ::tdsl_emu::signature(&space::entry), &::tdsl_emu::launch,                    \
        &::tdsl_emu::Invoke<&space::entry>::run};

/* ---- the CUDA names kernels use ---- */

#define threadIdx (::tdsl_emu::rt.current->thread_idx)
#define blockIdx (::tdsl_emu::rt.block_idx)
#define blockDim (::tdsl_emu::rt.block_dim)
#define gridDim (::tdsl_emu::rt.grid_dim)
#define warpSize 32

#define __syncthreads() ::tdsl_emu::suspend(::tdsl_emu::Wait::block, "__syncthreads", __FILE__, __LINE__)
#define __syncwarp(...) ::tdsl_emu::syncwarp(__FILE__, __LINE__ __VA_OPT__(,) __VA_ARGS__)
#define TDSL_EMU_SHFL(op, name, ...) ::tdsl_emu::shfl(::tdsl_emu::Op::op, name, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_sync(...) TDSL_EMU_SHFL(shfl_idx, "__shfl_sync", __VA_ARGS__)
#define __shfl_up_sync(...) TDSL_EMU_SHFL(shfl_up, "__shfl_up_sync", __VA_ARGS__)
#define __shfl_down_sync(...) TDSL_EMU_SHFL(shfl_down, "__shfl_down_sync", __VA_ARGS__)
#define __shfl_xor_sync(...) TDSL_EMU_SHFL(shfl_xor, "__shfl_xor_sync", __VA_ARGS__)
#define __ballot_sync(m, p) ::tdsl_emu::vote(::tdsl_emu::Op::ballot, "__ballot_sync", __FILE__, __LINE__, m, p)
#define __any_sync(m, p) (::tdsl_emu::vote(::tdsl_emu::Op::any, "__any_sync", __FILE__, __LINE__, m, p) != 0)
#define __all_sync(m, p) (::tdsl_emu::vote(::tdsl_emu::Op::all, "__all_sync", __FILE__, __LINE__, m, p) != 0)
#undef assert
#define assert(e) ((e) ? (void)0 : ::tdsl_emu::fail_assertion(#e, __FILE__, __LINE__))

namespace tdsl_emu {
namespace {
inline void syncwarp(const char *file, int line, unsigned mask = kFullMask) {
    warp_op<unsigned>(Op::syncwarp, "__syncwarp", file, line, mask, 0u, 0, 32);
}
template <class T>
T shfl(Op op, const char *what, const char *file, int line, unsigned mask, T value, int lane,
       int width = 32) {
    return warp_op<T>(op, what, file, line, mask, value, lane, width);
}
} // namespace
} // namespace tdsl_emu

/* ---- tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}, fragment layout of
 * the PTX ISA (codegen/cuda/staged/fragments.py): lane = 4*g + q holds A rows g and g+8, columns
 * 2q, 2q+1 (+8); B rows 2q, 2q+1 (+8) of column g; D rows g, g+8, columns 2q, 2q+1. ---- */

/* `mma_16816` (runtime.cc) publishes each lane's fragments, syncs the warp, computes the
 * lane's four D values in float (k ascending: exact products of 16-bit inputs, float sums)
 * and syncs again; `depth` 8 is m16n8k8 (registers a[0], a[1], b[0]). */
#define td_mma_16816_bf16(d, a, b) ::tdsl_emu::mma_16816(::tdsl_emu::bf16_value, "td_mma_16816_bf16", __FILE__, __LINE__, d, a, b)
#define td_mma_16816_f16(d, a, b) ::tdsl_emu::mma_16816(::tdsl_emu::f16_value, "td_mma_16816_f16", __FILE__, __LINE__, d, a, b)
#define td_mma_1688_bf16(d, a, b) ::tdsl_emu::mma_16816(::tdsl_emu::bf16_value, "td_mma_1688_bf16", __FILE__, __LINE__, d, a, b, 8)
#define td_mma_1688_f16(d, a, b) ::tdsl_emu::mma_16816(::tdsl_emu::f16_value, "td_mma_1688_f16", __FILE__, __LINE__, d, a, b, 8)

#define __activemask() ::tdsl_emu::warp_op<unsigned>(::tdsl_emu::Op::active, "__activemask", __FILE__, __LINE__, 0xffffffffu, 0u, 0, 32)
[[noreturn]] inline void __trap() { ::tdsl_emu::fail("__trap() called"); }
inline void __threadfence() {}
inline void __threadfence_block() {}

/* ---- bit casts and fast-math intrinsics (computed exactly here) ---- */

template <class To, class From> inline To tdsl_emu_bits(From x) {
    To y;
    memcpy(&y, &x, sizeof y);
    return y;
}
inline float __int_as_float(int x) { return tdsl_emu_bits<float>(x); }
inline int __float_as_int(float x) { return tdsl_emu_bits<int>(x); }
inline float __uint_as_float(unsigned x) { return tdsl_emu_bits<float>(x); }
inline unsigned __float_as_uint(float x) { return tdsl_emu_bits<unsigned>(x); }
inline double __longlong_as_double(long long x) { return tdsl_emu_bits<double>(x); }
inline long long __double_as_longlong(double x) { return tdsl_emu_bits<long long>(x); }
template <class T> inline T __ldg(const T *p) { return *p; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0 ? 0.0f : x > 1 ? 1.0f : x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

/* ---- half precision functions that cuda_fp16.h / cuda_bf16.h declare for nvcc only ---- */

#define TDSL_EMU_HALF_MATH(T, to, from)                                                       \
    inline T hsqrt(T x) { return from(sqrtf(to(x))); }                                       \
    inline T hrsqrt(T x) { return from(1.0f / sqrtf(to(x))); }                                \
    inline T hexp(T x) { return from(expf(to(x))); }                                          \
    inline T hlog(T x) { return from(logf(to(x))); }                                          \
    inline T hsin(T x) { return from(sinf(to(x))); }                                          \
    inline T hcos(T x) { return from(cosf(to(x))); }                                          \
    inline T __hfma(T a, T b, T c) { return from(fmaf(to(a), to(b), to(c))); }                \
    inline T atomicAdd(T *p, T v) {                                                           \
        T old = *p;                                                                           \
        *p = from(to(old) + to(v));                                                           \
        return old;                                                                           \
    }
TDSL_EMU_HALF_MATH(__half, __half2float, __float2half_rn)
TDSL_EMU_HALF_MATH(__nv_bfloat16, __bfloat162float, __float2bfloat16_rn)
#undef TDSL_EMU_HALF_MATH

/* ---- atomics: fibers switch only at barriers, so a read-modify-write is atomic ---- */

#define TDSL_EMU_ATOMIC(name, expr)                                                           \
    template <class T, class U> inline T name(T *p, U v) {                                    \
        T old = *p;                                                                           \
        *p = (expr);                                                                          \
        return old;                                                                           \
    }
TDSL_EMU_ATOMIC(atomicAdd, T(old + v))
TDSL_EMU_ATOMIC(atomicSub, T(old - v))
TDSL_EMU_ATOMIC(atomicExch, T(v))
TDSL_EMU_ATOMIC(atomicMin, T(v < old ? v : old))
TDSL_EMU_ATOMIC(atomicMax, T(v > old ? v : old))
TDSL_EMU_ATOMIC(atomicAnd, T(old & v))
TDSL_EMU_ATOMIC(atomicOr, T(old | v))
TDSL_EMU_ATOMIC(atomicXor, T(old ^ v))
#undef TDSL_EMU_ATOMIC
template <class T> inline T atomicCAS(T *p, T compare, T v) {
    T old = *p;
    if (old == compare) *p = v;
    return old;
}

#endif /* TDSL_CUDA_EMU_H */
