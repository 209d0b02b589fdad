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
 */
#ifndef TDSL_CUDA_EMU_H
#define TDSL_CUDA_EMU_H

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

namespace tdsl_emu {
namespace {

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

struct Runtime {
    dim3 grid_dim, block_dim;
    uint3 block_idx;
    Fiber *current = nullptr;
    std::vector<Fiber> fibers;
    std::vector<char *> stacks;
    ucontext_t scheduler, blank;
    void **params = nullptr;
    void (*invoke)(void **) = nullptr;
    std::string error;
};

Runtime rt;
std::mutex launch_mutex;
/* This module's TLS block on the launching thread: every `__shared__` variable. */
uintptr_t shared_lo = 0, shared_hi = 0;
/* Touched before each block so that this module's TLS block exists on this OS thread. */
[[gnu::used]] thread_local char tls_anchor;

[[noreturn]] void exit_fiber() {
    rt.current->wait = Wait::exited;
    setcontext(&rt.scheduler);
    __builtin_unreachable();
}

void fiber_main() {
    rt.invoke(rt.params);
    exit_fiber();
}

void suspend(Wait wait, const char *what, const char *file, int line) {
    Fiber &f = *rt.current;
    f.wait = wait;
    f.what = what;
    f.file = file;
    f.line = line;
    swapcontext(&f.context, &rt.scheduler);
}

[[noreturn]] void fail(const std::string &message) {
    if (rt.error.empty()) rt.error = message;
    exit_fiber();
}

std::string thread_name(const Fiber &f) {
    char text[96];
    snprintf(text, sizeof text, "thread (%u,%u,%u)", f.thread_idx.x, f.thread_idx.y,
             f.thread_idx.z);
    return text;
}

std::string where(const Fiber &f) {
    return std::string(f.what) + " at " + f.file + ":" + std::to_string(f.line);
}

/* ---- shared memory: every thread_local byte of this module, poisoned per block ---- */

struct TlsSearch {
    const void *base;
    void *data;
    size_t size;
};

int find_tls(struct dl_phdr_info *info, size_t, void *arg) {
    TlsSearch *search = static_cast<TlsSearch *>(arg);
    if (reinterpret_cast<const void *>(info->dlpi_addr) != search->base) return 0;
    for (int n = 0; n < info->dlpi_phnum; ++n) {
        if (info->dlpi_phdr[n].p_type == PT_TLS) {
            search->data = info->dlpi_tls_data;
            search->size = info->dlpi_phdr[n].p_memsz;
        }
    }
    return 1;
}

bool poison_shared_memory() {
    *static_cast<volatile char *>(&tls_anchor) = 1;
    Dl_info self;
    if (!dladdr(reinterpret_cast<void *>(&find_tls), &self)) return false;
    TlsSearch search{self.dli_fbase, nullptr, 0};
    dl_iterate_phdr(find_tls, &search);
    if (search.data == nullptr) return false;
    memset(search.data, 0xff, search.size);
    shared_lo = reinterpret_cast<uintptr_t>(search.data);
    shared_hi = shared_lo + search.size;
    return true;
}

/* ---- fibers and the block scheduler ---- */

char *stack(size_t n) {
    while (rt.stacks.size() <= n) {
        size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        void *base = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) return nullptr;
        mprotect(base, page, PROT_NONE); /* guard page: an overflow faults, never corrupts */
        rt.stacks.push_back(static_cast<char *>(base) + page);
    }
    return rt.stacks[n];
}

/* Unmap every stack: called when a launch ends. Each stack is two memory mappings (the
 * stack and its guard page), and every emulated kernel library has its own pool, so pools
 * kept between launches exhaust the process's mappings (vm.max_map_count, 65530 by default)
 * in a long test run: mmap and malloc then fail. */
void release_stacks() {
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (char *top : rt.stacks) munmap(top - page, kStackBytes + page);
    rt.stacks.clear();
}

bool start_fibers() {
    size_t count = size_t(rt.block_dim.x) * rt.block_dim.y * rt.block_dim.z;
    rt.fibers.assign(count, Fiber{});
    for (size_t n = 0; n < count; ++n) {
        Fiber &f = rt.fibers[n];
        f.linear = int(n);
        f.thread_idx = make_uint3(unsigned(n % rt.block_dim.x),
                                  unsigned(n / rt.block_dim.x % rt.block_dim.y),
                                  unsigned(n / (size_t(rt.block_dim.x) * rt.block_dim.y)));
        f.context = rt.blank;
        f.context.uc_stack.ss_sp = stack(n);
        if (f.context.uc_stack.ss_sp == nullptr) return false;
        f.context.uc_stack.ss_size = kStackBytes;
        f.context.uc_link = nullptr;
        makecontext(&f.context, fiber_main, 0);
    }
    return true;
}

uint64_t poison_bytes(size_t bytes) {
    return bytes >= 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * bytes)) - 1;
}

/* The lane a shuffle reads, by CUDA's rules for width segments; -1: its own value. */
int source_lane(const Fiber &f, int lane) {
    int width = f.width, segment = lane & ~(width - 1);
    switch (f.op) {
    case Op::shfl_idx: return segment + (f.lane_arg & (width - 1));
    case Op::shfl_up: return (lane - segment) < f.lane_arg ? -1 : lane - f.lane_arg;
    case Op::shfl_down: return (lane - segment) + f.lane_arg >= width ? -1 : lane + f.lane_arg;
    case Op::shfl_xor: {
        int other = lane ^ f.lane_arg;
        return other >= segment + width ? -1 : other;
    }
    default: return -1;
    }
}

void finish_warp_op(int first, unsigned group) {
    unsigned votes = 0;
    for (int lane = 0; lane < 32; ++lane)
        if ((group >> lane & 1) && rt.fibers[first + lane].predicate) votes |= 1u << lane;
    for (int lane = 0; lane < 32; ++lane) {
        if (!(group >> lane & 1)) continue;
        Fiber &f = rt.fibers[first + lane];
        if (f.op == Op::active) f.result = group;
        else if (f.op == Op::ballot) f.result = votes;
        else if (f.op == Op::any) f.result = votes != 0;
        else if (f.op == Op::all) f.result = votes == group;
        else if (f.op != Op::syncwarp) {
            int source = source_lane(f, lane);
            if (source < 0) f.result = f.value;
            else if (group >> source & 1) f.result = rt.fibers[first + source].value;
            else f.result = poison_bytes(f.bytes); /* undefined on the GPU */
        }
        f.wait = Wait::none;
    }
}

/* Release every warp whose named lanes all wait at a warp intrinsic; -1 on disagreement. */
int release_warps() {
    int released = 0, count = int(rt.fibers.size());
    for (int first = 0; first < count; first += 32) {
        int lanes = count - first < 32 ? count - first : 32;
        unsigned exists = lanes == 32 ? kFullMask : (1u << lanes) - 1, waiting = 0;
        for (int lane = 0; lane < lanes; ++lane)
            if (rt.fibers[first + lane].wait == Wait::warp) waiting |= 1u << lane;
        for (int lane = 0; lane < lanes; ++lane) { /* __activemask: lanes at the same call */
            const Fiber &f = rt.fibers[first + lane];
            if (!(waiting >> lane & 1) || f.op != Op::active) continue;
            unsigned group = 0;
            for (int other = lane; other < lanes; ++other) {
                const Fiber &g = rt.fibers[first + other];
                if ((waiting >> other & 1) && g.op == Op::active && g.line == f.line &&
                    g.file == f.file)
                    group |= 1u << other;
            }
            finish_warp_op(first, group);
            waiting &= ~group;
            ++released;
        }
        for (int lane = 0; lane < lanes; ++lane) {
            const Fiber &f = rt.fibers[first + lane];
            if (!(waiting >> lane & 1)) continue;
            unsigned group = f.mask & exists;
            if (!(f.mask >> lane & 1)) {
                rt.error = thread_name(f) + " calls " + where(f) + " with a mask that does "
                           "not name its own lane";
                return -1;
            }
            if (group & ~waiting) continue;
            for (int other = 0; other < lanes; ++other) {
                const Fiber &g = rt.fibers[first + other];
                if ((group >> other & 1) &&
                    (g.op != f.op || g.mask != f.mask || g.width != f.width)) {
                    rt.error = thread_name(f) + " waits at " + where(f) + " but " +
                               thread_name(g) + " of its mask waits at " + where(g) +
                               " (warp intrinsics and masks must match)";
                    return -1;
                }
            }
            finish_warp_op(first, group);
            waiting &= ~group;
            ++released;
        }
    }
    return released;
}

/* Release the block barrier when every thread that has not exited waits at it; -1 when
 * they wait at different __syncthreads calls (undefined behaviour in CUDA). */
int release_block() {
    const Fiber *first = nullptr;
    for (const Fiber &f : rt.fibers) {
        if (f.wait == Wait::exited) continue;
        if (f.wait != Wait::block) return 0;
        if (first == nullptr) first = &f;
        else if (f.line != first->line || strcmp(f.file, first->file) != 0) {
            rt.error = thread_name(*first) + " waits at " + where(*first) + " but " +
                       thread_name(f) + " at " + where(f) +
                       " (__syncthreads in divergent code)";
            return -1;
        }
    }
    for (Fiber &f : rt.fibers)
        if (f.wait == Wait::block) f.wait = Wait::none;
    return 1;
}

std::string deadlock_report() {
    std::string text = "deadlock in block (" + std::to_string(rt.block_idx.x) + "," +
                       std::to_string(rt.block_idx.y) + "," + std::to_string(rt.block_idx.z) +
                       "): no thread can run and no barrier can be released";
    size_t n = 0;
    while (n < rt.fibers.size()) {
        const Fiber &f = rt.fibers[n];
        size_t end = n + 1;
        while (end < rt.fibers.size() && rt.fibers[end].wait == f.wait &&
               (f.wait == Wait::exited ||
                (rt.fibers[end].line == f.line && rt.fibers[end].what == f.what)))
            ++end;
        text += "\n  threads " + std::to_string(n) + "-" + std::to_string(end - 1) + " (" +
                thread_name(f).substr(7) + " ...): ";
        text += f.wait == Wait::exited ? std::string("exited") : "wait at " + where(f);
        n = end;
    }
    return text;
}

/* Counting (counting.h): lanes run kernel code between these two calls; a block barrier or
 * the block's end closes the shared-memory accesses of the warps. Nothing without counting. */
#ifdef TDSL_EMU_COUNT
void count_enter();
void count_leave();
void count_barrier(bool end);
#else
inline void count_enter() {}
inline void count_leave() {}
inline void count_barrier(bool) {}
#endif

bool run_block(bool reverse) {
    if (!start_fibers()) {
        rt.error = "cannot allocate fiber stacks";
        return false;
    }
    size_t count = rt.fibers.size();
    for (;;) {
        for (size_t k = 0; k < count; ++k) {
            Fiber &f = rt.fibers[reverse ? count - 1 - k : k];
            if (f.wait != Wait::none) continue;
            rt.current = &f;
            count_enter();
            swapcontext(&rt.scheduler, &f.context);
            count_leave();
            if (!rt.error.empty()) return false;
        }
        bool alive = false;
        for (const Fiber &f : rt.fibers) alive = alive || f.wait != Wait::exited;
        if (!alive) {
            count_barrier(true);
            return true;
        }
        int warps = release_warps();
        int block = warps == 0 ? release_block() : 0;
        if (block > 0) count_barrier(false);
        if (warps < 0 || block < 0) return false;
        if (warps > 0 || block > 0) continue;
        rt.error = deadlock_report();
        return false;
    }
}

const char *check_launch(const long long *grid, const long long *block, long long shared) {
    static const long long grid_limits[3] = {2147483647LL, 65535, 65535};
    static const long long block_limits[3] = {1024, 1024, 64};
    for (int d = 0; d < 3; ++d) {
        if (grid[d] < 1 || grid[d] > grid_limits[d]) return "grid dimension out of range";
        if (block[d] < 1 || block[d] > block_limits[d]) return "block dimension out of range";
    }
    if (block[0] * block[1] * block[2] > 1024) return "more than 1024 threads per block";
    if (shared < 0 || shared > TDSL_EMU_MAX_SHARED) return "dynamic shared memory out of range";
    return nullptr;
}

int launch(const tdsl_emu_kernel *kernel, const long long *grid, const long long *block,
           long long shared, void **params, int order, char *error, long long error_size) {
    std::lock_guard<std::mutex> hold(launch_mutex);
    const char *bad = check_launch(grid, block, shared);
    rt.error = bad ? bad : "";
    rt.grid_dim = dim3(unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2]));
    rt.block_dim = dim3(unsigned(block[0]), unsigned(block[1]), unsigned(block[2]));
    rt.params = params;
    rt.invoke = kernel->invoke;
    getcontext(&rt.blank);
    long long blocks = grid[0] * grid[1] * grid[2];
    for (long long k = 0; rt.error.empty() && k < blocks; ++k) {
        long long b = order ? blocks - 1 - k : k;
        rt.block_idx = make_uint3(unsigned(b % grid[0]), unsigned(b / grid[0] % grid[1]),
                                  unsigned(b / (grid[0] * grid[1])));
        if (!poison_shared_memory()) rt.error = "cannot find the shared memory (TLS) block";
        else run_block(order != 0);
    }
    rt.fibers.clear();
    release_stacks();
    if (rt.error.empty()) return 0;
    snprintf(error, size_t(error_size), "%s: %s", kernel->name, rt.error.c_str());
    return 1;
}

/* ---- warp intrinsics ---- */

template <class T>
T warp_op(Op op, const char *what, const char *file, int line, unsigned mask, T value,
          int lane_arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value);
    Fiber &f = *rt.current;
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail(thread_name(f) + ": " + what + " width must be a power of two <= 32");
    f.op = op;
    f.mask = mask;
    f.lane_arg = lane_arg;
    f.width = width;
    f.bytes = sizeof(T);
    f.value = 0;
    memcpy(&f.value, &value, sizeof(T));
    suspend(Wait::warp, what, file, line);
    T result;
    memcpy(&result, &f.result, sizeof(T));
    return result;
}

inline unsigned vote(Op op, const char *what, const char *file, int line, unsigned mask, int p) {
    rt.current->predicate = p != 0;
    return warp_op<unsigned>(op, what, file, line, mask, 0u, 0, 32);
}

/* ---- kernel descriptors ---- */

template <class T> std::string kind() {
    if (std::is_pointer<T>::value) return "p";
    std::string size = std::to_string(sizeof(T));
    return (std::is_floating_point<T>::value ? "f" : std::is_signed<T>::value ? "i" : "u") +
           size;
}

template <class... A> const char *signature(void (*)(A...)) {
    static const std::string text = [] {
        std::string joined;
        ((joined += (joined.empty() ? "" : " ") + kind<A>()), ...);
        return joined;
    }();
    return text.c_str();
}

template <auto Kernel> struct Invoke;
template <class... A, void (*Kernel)(A...)> struct Invoke<Kernel> {
    template <size_t... I> static void call(void **params, std::index_sequence<I...>) {
        Kernel(*static_cast<std::remove_reference_t<A> *>(params[I])...);
    }
    static void run(void **params) { call(params, std::index_sequence_for<A...>{}); }
};

} // namespace
} // namespace tdsl_emu

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
#define assert(e) ((e) ? (void)0 : ::tdsl_emu::fail(std::string("assertion failed: ") + #e + " at " + __FILE__ + ":" + std::to_string(__LINE__)))

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

namespace tdsl_emu {
namespace {
struct MmaLane {
    unsigned a[4], b[2];
};
std::vector<MmaLane> mma_lanes;

inline float bf16_value(unsigned short bits) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
inline float f16_value(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }

/* The 16-bit value in half `h` (0: the lower) of a register word. */
inline unsigned short half_of(unsigned word, int h) { return (unsigned short)(word >> (16 * h)); }

/* D += A*B over the first `depth` (16, or 8: m16n8k8, registers a[0], a[1], b[0]) of k. */
void mma_16816(float (*value)(unsigned short), const char *what, const char *file, int line,
               float d[4], const unsigned a[4], const unsigned b[2], int depth = 16) {
    Fiber &f = *rt.current;
    int first = f.linear & ~31, lane = f.linear & 31;
    if (first + 32 > int(rt.fibers.size()))
        fail(thread_name(f) + ": " + what + " needs a warp of 32 threads");
    if (mma_lanes.size() < rt.fibers.size()) mma_lanes.resize(rt.fibers.size());
    MmaLane &mine = mma_lanes[size_t(f.linear)];
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    warp_op<unsigned>(Op::syncwarp, what, file, line, kFullMask, 0u, 0, 32); /* published */
    const MmaLane *warp = &mma_lanes[size_t(first)];
    int g = lane >> 2, q = lane & 3;
    float out[4];
    for (int v = 0; v < 4; ++v) {
        int row = g + 8 * (v >> 1), col = 2 * q + (v & 1);
        float sum = d[v];
        for (int k = 0; k < depth; ++k) {
            int k8 = k & 7, high = k >> 3;
            float x = value(half_of(warp[4 * (row & 7) + k8 / 2].a[(row >> 3) + 2 * high], k & 1));
            float y = value(half_of(warp[4 * col + k8 / 2].b[high], k & 1));
            sum += x * y; /* exact product (16-bit inputs), float sum */
        }
        out[v] = sum;
    }
    warp_op<unsigned>(Op::syncwarp, what, file, line, kFullMask, 0u, 0, 32); /* all read */
    memcpy(d, out, sizeof out);
}
} // namespace
} // namespace tdsl_emu

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
