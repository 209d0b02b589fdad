/* tensordsl's CUDA emulator: the runtime's code, declared in runtime.h (the fibers, the block
 * scheduler, `launch`, the waits of the warp intrinsics, the tensor-core product).
 *
 * Compiled once per cache folder and set of flags into `runtime.o` (codegen/cuda/emulator/pch.py)
 * and linked into every unit, so that a unit's compiler call generates only its kernels. Each
 * unit's shared object still has its own copy of everything here (a static link; every name
 * hidden): its own `rt`, launch mutex, fiber stacks and TLS block (its `__shared__` variables
 * and `tls_anchor`), as when this code was part of each unit. A unit built with the counters
 * (TDSL_EMU_COUNT: its loads and stores instrumented) and a unit that has no `runtime.o`
 * include this file instead (runtime.h, TDSL_EMU_RUNTIME_HERE), as before.
 */
#include "runtime.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

namespace tdsl_emu {

/* The scheduler's state beside what kernels read (`rt`). */
struct Scheduler {
    std::vector<Fiber> fibers;
    std::vector<char *> stacks;
    ucontext_t scheduler, blank;
    void **params = nullptr;
    void (*invoke)(void **) = nullptr;
    std::string error;
};

Launch rt;
namespace {
Scheduler state;
} // namespace
/* This module's TLS block on the launching thread: every `__shared__` variable. */
uintptr_t shared_lo = 0, shared_hi = 0;
std::mutex launch_mutex;

namespace {

struct MmaLane {
    unsigned a[4], b[2];
};

/* Touched before each block so that this module's TLS block exists on this OS thread. */
[[gnu::used]] thread_local char tls_anchor;
std::vector<MmaLane> mma_lanes;

[[noreturn]] void exit_fiber() {
    rt.current->wait = Wait::exited;
    setcontext(&state.scheduler);
    __builtin_unreachable();
}

void fiber_main() {
    state.invoke(state.params);
    exit_fiber();
}

} // namespace

void suspend(Wait wait, const char *what, const char *file, int line) {
    Fiber &f = *rt.current;
    f.wait = wait;
    f.what = what;
    f.file = file;
    f.line = line;
    swapcontext(&f.context, &state.scheduler);
}

[[noreturn]] void fail(const char *message) {
    if (state.error.empty()) state.error = message;
    exit_fiber();
}

[[noreturn]] void fail_assertion(const char *expression, const char *file, int line) {
    fail((std::string("assertion failed: ") + expression + " at " + file + ":" +
          std::to_string(line))
             .c_str());
}

namespace {

[[noreturn]] void fail_with(const std::string &message) { fail(message.c_str()); }

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
    while (state.stacks.size() <= n) {
        size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        void *base = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) return nullptr;
        mprotect(base, page, PROT_NONE); /* guard page: an overflow faults, never corrupts */
        state.stacks.push_back(static_cast<char *>(base) + page);
    }
    return state.stacks[n];
}

/* Unmap every stack: called when a launch ends. Each stack is two memory mappings (the
 * stack and its guard page), and every emulated kernel library has its own pool, so pools
 * kept between launches exhaust the process's mappings (vm.max_map_count, 65530 by default)
 * in a long test run: mmap and malloc then fail. */
void release_stacks() {
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (char *top : state.stacks) munmap(top - page, kStackBytes + page);
    state.stacks.clear();
}

bool start_fibers() {
    size_t count = size_t(rt.block_dim.x) * rt.block_dim.y * rt.block_dim.z;
    state.fibers.assign(count, Fiber{});
    for (size_t n = 0; n < count; ++n) {
        Fiber &f = state.fibers[n];
        f.linear = int(n);
        f.thread_idx = make_uint3(unsigned(n % rt.block_dim.x),
                                  unsigned(n / rt.block_dim.x % rt.block_dim.y),
                                  unsigned(n / (size_t(rt.block_dim.x) * rt.block_dim.y)));
        f.context = state.blank;
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
        if ((group >> lane & 1) && state.fibers[first + lane].predicate) votes |= 1u << lane;
    for (int lane = 0; lane < 32; ++lane) {
        if (!(group >> lane & 1)) continue;
        Fiber &f = state.fibers[first + lane];
        if (f.op == Op::active) f.result = group;
        else if (f.op == Op::ballot) f.result = votes;
        else if (f.op == Op::any) f.result = votes != 0;
        else if (f.op == Op::all) f.result = votes == group;
        else if (f.op != Op::syncwarp) {
            int source = source_lane(f, lane);
            if (source < 0) f.result = f.value;
            else if (group >> source & 1) f.result = state.fibers[first + source].value;
            else f.result = poison_bytes(f.bytes); /* undefined on the GPU */
        }
        f.wait = Wait::none;
    }
}

/* Release every warp whose named lanes all wait at a warp intrinsic; -1 on disagreement. */
int release_warps() {
    int released = 0, count = int(state.fibers.size());
    for (int first = 0; first < count; first += 32) {
        int lanes = count - first < 32 ? count - first : 32;
        unsigned exists = lanes == 32 ? kFullMask : (1u << lanes) - 1, waiting = 0;
        for (int lane = 0; lane < lanes; ++lane)
            if (state.fibers[first + lane].wait == Wait::warp) waiting |= 1u << lane;
        for (int lane = 0; lane < lanes; ++lane) { /* __activemask: lanes at the same call */
            const Fiber &f = state.fibers[first + lane];
            if (!(waiting >> lane & 1) || f.op != Op::active) continue;
            unsigned group = 0;
            for (int other = lane; other < lanes; ++other) {
                const Fiber &g = state.fibers[first + other];
                if ((waiting >> other & 1) && g.op == Op::active && g.line == f.line &&
                    g.file == f.file)
                    group |= 1u << other;
            }
            finish_warp_op(first, group);
            waiting &= ~group;
            ++released;
        }
        for (int lane = 0; lane < lanes; ++lane) {
            const Fiber &f = state.fibers[first + lane];
            if (!(waiting >> lane & 1)) continue;
            unsigned group = f.mask & exists;
            if (!(f.mask >> lane & 1)) {
                state.error = thread_name(f) + " calls " + where(f) + " with a mask that does "
                           "not name its own lane";
                return -1;
            }
            if (group & ~waiting) continue;
            for (int other = 0; other < lanes; ++other) {
                const Fiber &g = state.fibers[first + other];
                if ((group >> other & 1) &&
                    (g.op != f.op || g.mask != f.mask || g.width != f.width)) {
                    state.error = thread_name(f) + " waits at " + where(f) + " but " +
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
    for (const Fiber &f : state.fibers) {
        if (f.wait == Wait::exited) continue;
        if (f.wait != Wait::block) return 0;
        if (first == nullptr) first = &f;
        else if (f.line != first->line || strcmp(f.file, first->file) != 0) {
            state.error = thread_name(*first) + " waits at " + where(*first) + " but " +
                       thread_name(f) + " at " + where(f) +
                       " (__syncthreads in divergent code)";
            return -1;
        }
    }
    for (Fiber &f : state.fibers)
        if (f.wait == Wait::block) f.wait = Wait::none;
    return 1;
}

std::string deadlock_report() {
    std::string text = "deadlock in block (" + std::to_string(rt.block_idx.x) + "," +
                       std::to_string(rt.block_idx.y) + "," + std::to_string(rt.block_idx.z) +
                       "): no thread can run and no barrier can be released";
    size_t n = 0;
    while (n < state.fibers.size()) {
        const Fiber &f = state.fibers[n];
        size_t end = n + 1;
        while (end < state.fibers.size() && state.fibers[end].wait == f.wait &&
               (f.wait == Wait::exited ||
                (state.fibers[end].line == f.line && state.fibers[end].what == f.what)))
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
#ifndef TDSL_EMU_COUNT
void count_enter() {}
void count_leave() {}
void count_barrier(bool) {}
#endif

bool run_block(bool reverse) {
    if (!start_fibers()) {
        state.error = "cannot allocate fiber stacks";
        return false;
    }
    size_t count = state.fibers.size();
    for (;;) {
        for (size_t k = 0; k < count; ++k) {
            Fiber &f = state.fibers[reverse ? count - 1 - k : k];
            if (f.wait != Wait::none) continue;
            rt.current = &f;
            count_enter();
            swapcontext(&state.scheduler, &f.context);
            count_leave();
            if (!state.error.empty()) return false;
        }
        bool alive = false;
        for (const Fiber &f : state.fibers) alive = alive || f.wait != Wait::exited;
        if (!alive) {
            count_barrier(true);
            return true;
        }
        int warps = release_warps();
        int block = warps == 0 ? release_block() : 0;
        if (block > 0) count_barrier(false);
        if (warps < 0 || block < 0) return false;
        if (warps > 0 || block > 0) continue;
        state.error = deadlock_report();
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

} // namespace

int launch(const tdsl_emu_kernel *kernel, const long long *grid, const long long *block,
           long long shared, void **params, int order, char *error, long long error_size) {
    std::lock_guard<std::mutex> hold(launch_mutex);
    const char *bad = check_launch(grid, block, shared);
    state.error = bad ? bad : "";
    rt.grid_dim = dim3(unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2]));
    rt.block_dim = dim3(unsigned(block[0]), unsigned(block[1]), unsigned(block[2]));
    state.params = params;
    state.invoke = kernel->invoke;
    getcontext(&state.blank);
    long long blocks = grid[0] * grid[1] * grid[2];
    for (long long k = 0; state.error.empty() && k < blocks; ++k) {
        long long b = order ? blocks - 1 - k : k;
        rt.block_idx = make_uint3(unsigned(b % grid[0]), unsigned(b / grid[0] % grid[1]),
                                  unsigned(b / (grid[0] * grid[1])));
        if (!poison_shared_memory()) state.error = "cannot find the shared memory (TLS) block";
        else run_block(order != 0);
    }
    state.fibers.clear();
    release_stacks();
    if (state.error.empty()) return 0;
    snprintf(error, size_t(error_size), "%s: %s", kernel->name, state.error.c_str());
    return 1;
}

uint64_t warp_wait(Op op, const char *what, const char *file, int line, unsigned mask,
                   uint64_t value, size_t bytes, int lane_arg, int width) {
    Fiber &f = *rt.current;
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail_with(thread_name(f) + ": " + what + " width must be a power of two <= 32");
    f.op = op;
    f.mask = mask;
    f.lane_arg = lane_arg;
    f.width = width;
    f.bytes = bytes;
    f.value = value;
    suspend(Wait::warp, what, file, line);
    return f.result;
}

float bf16_value(unsigned short bits) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
float f16_value(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }

namespace {
/* The 16-bit value in half `h` (0: the lower) of a register word. */
inline unsigned short half_of(unsigned word, int h) { return (unsigned short)(word >> (16 * h)); }
} // namespace

/* D += A*B over the first `depth` (16, or 8: m16n8k8, registers a[0], a[1], b[0]) of k. */
void mma_16816(float (*value)(unsigned short), const char *what, const char *file, int line,
               float d[4], const unsigned a[4], const unsigned b[2], int depth) {
    Fiber &f = *rt.current;
    int first = f.linear & ~31, lane = f.linear & 31;
    if (first + 32 > int(state.fibers.size()))
        fail_with(thread_name(f) + ": " + what + " needs a warp of 32 threads");
    if (mma_lanes.size() < state.fibers.size()) mma_lanes.resize(state.fibers.size());
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
} // namespace tdsl_emu
