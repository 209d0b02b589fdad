/* Counters of the CUDA emulator (runtime.h includes this header in a unit built with
 * TDSL_EMU_COUNT; codegen/cuda/emulator/emulate.py builds such units with `counting=True`).
 *
 * Per launch, reset by `tdsl_emu_count_reset` and read by `tdsl_emu_count_read`:
 *
 * - FMAs: the kernel's `TDSL_COUNT_FMA(n)` hooks, which the emitter writes at each body
 *   evaluation when asked (`emit_cuda(..., counting=True)`; never in the text NVRTC gets);
 * - global bytes loaded and stored: every load and store the host compiler leaves in the
 *   kernel's code (`-fsanitize=thread` instruments each one with a call to a `__tsan_readN`
 *   or `__tsan_writeN` hook, defined here instead of by the TSan runtime, which is not
 *   linked; calls to memcpy, memmove and memset are wrapped at link time) whose address
 *   lies in one of the buffers the launch registered (its arrays);
 * - shared-memory bank conflicts: an access whose address lies in the module's TLS block
 *   (every `__shared__` variable) is recorded per warp, per access site (the instruction,
 *   the hook's return address) and per occurrence (the n-th time the lane executes that
 *   site): the lanes of a warp that execute a site for the n-th time form one request, as
 *   on the GPU. When a block barrier is released or the block ends, each request is split
 *   into phases (32 lanes for accesses of 4 bytes or less, 16 for 8 bytes, 8 for 16) and
 *   a phase takes as many wavefronts as the most distinct 4-byte words it touches in one of
 *   the 32 banks; the conflicts are the wavefronts past one per phase.
 *
 * Only accesses made while a lane runs count (not the scheduler's); a hook that runs inside
 * a hook (library code the hooks call) counts nothing.
 */
#ifndef TDSL_CUDA_EMU_COUNTING_H
#define TDSL_CUDA_EMU_COUNTING_H

#include <algorithm>
#include <unordered_map>

#define TDSL_EMU_QUIET __attribute__((no_sanitize_thread, noinline))

namespace tdsl_emu {
namespace {

constexpr int kBanks = 32;
enum Counter { fmas, loaded, stored, shared_loads, shared_stores, requests, conflicts, kCounters };

struct Request {
    unsigned lanes = 0;
    unsigned char size[32];
    uintptr_t address[32];
};

struct Site {
    uintptr_t pc;
    int warp;
    unsigned occurrence;
    bool operator==(const Site &o) const {
        return pc == o.pc && warp == o.warp && occurrence == o.occurrence;
    }
};

struct SiteHash {
    size_t operator()(const Site &s) const {
        return std::hash<uintptr_t>()(s.pc) ^ (size_t(s.warp) * 0x9e3779b97f4a7c15ull) ^
               (size_t(s.occurrence) << 17);
    }
};

struct Counting {
    long long value[kCounters] = {};
    std::vector<std::pair<uintptr_t, uintptr_t>> global; /* [lo, hi) of each buffer */
    bool active = false;                                  /* a lane runs, no hook runs */
    std::unordered_map<Site, Request, SiteHash> pending;
    std::vector<std::unordered_map<uintptr_t, unsigned>> seen; /* per lane: site -> times */
};

Counting counting;

/* Wavefronts past the first of each phase of one request. */
TDSL_EMU_QUIET long long request_conflicts(const Request &r) {
    int size = 1;
    for (int lane = 0; lane < 32; ++lane)
        if (r.lanes >> lane & 1) size = std::max<int>(size, r.size[lane]);
    int per_phase = size <= 4 ? 32 : size == 8 ? 16 : 8;
    long long extra = 0;
    for (int first = 0; first < 32; first += per_phase) {
        uintptr_t words[32 * 4];
        int n = 0;
        for (int lane = first; lane < first + per_phase; ++lane) {
            if (!(r.lanes >> lane & 1)) continue;
            uintptr_t word = r.address[lane] / 4, last = (r.address[lane] + r.size[lane] - 1) / 4;
            for (; word <= last && n < 32 * 4; ++word) words[n++] = word;
        }
        if (n == 0) continue;
        std::sort(words, words + n);
        n = int(std::unique(words, words + n) - words);
        int per_bank[kBanks] = {};
        int most = 0;
        for (int k = 0; k < n; ++k) most = std::max(most, ++per_bank[words[k] % kBanks]);
        extra += most - 1;
    }
    return extra;
}

TDSL_EMU_QUIET void count_access(const void *pointer, size_t size, bool write, uintptr_t pc) {
    if (!counting.active) return;
    counting.active = false;
    uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
    if (address >= shared_lo && address < shared_hi) {
        counting.value[write ? shared_stores : shared_loads] += 1;
        const Fiber &f = *rt.current;
        unsigned &times = counting.seen[f.linear][pc];
        Request &r = counting.pending[Site{pc, f.linear / 32, times++}];
        int lane = f.linear % 32;
        r.lanes |= 1u << lane;
        r.size[lane] = static_cast<unsigned char>(std::min<size_t>(size, 16));
        r.address[lane] = address;
    } else {
        for (const auto &range : counting.global) {
            if (address >= range.first && address < range.second) {
                counting.value[write ? stored : loaded] += static_cast<long long>(size);
                break;
            }
        }
    }
    counting.active = true;
}

TDSL_EMU_QUIET void count_fmas(long long n) {
    if (counting.active) counting.value[fmas] += n;
}

/* GCC's instrumentation misses a store that a call makes directly into memory (`out_[k] =
 * __float2bfloat16_rn(v)` when the conversion is not inlined, as a struct returned in
 * place): through these, the value lands in a temporary and the store is an assignment. */
__attribute__((always_inline)) inline __nv_bfloat16 stored_bfloat16(float x) {
    __nv_bfloat16 value = __float2bfloat16_rn(x);
    return value;
}
__attribute__((always_inline)) inline __half stored_half(float x) {
    __half value = __float2half_rn(x);
    return value;
}

} // namespace

/* The scheduler's calls (runtime.h declares them). */
TDSL_EMU_QUIET void count_enter() {
    if (counting.seen.size() != state.fibers.size()) {
        counting.seen.assign(state.fibers.size(), {});
    }
    counting.active = true;
}

TDSL_EMU_QUIET void count_leave() { counting.active = false; }

TDSL_EMU_QUIET void count_barrier(bool end) {
    bool was = counting.active;
    counting.active = false;
    for (const auto &entry : counting.pending) {
        counting.value[requests] += 1;
        counting.value[conflicts] += request_conflicts(entry.second);
    }
    counting.pending.clear();
    if (end) counting.seen.clear(); /* the next block's lanes start afresh */
    counting.active = was;
}

} // namespace tdsl_emu

#define __float2bfloat16_rn(x) ::tdsl_emu::stored_bfloat16(x)
#define __float2half_rn(x) ::tdsl_emu::stored_half(x)
#define TDSL_COUNT_FMA(n) ::tdsl_emu::count_fmas(n)
/* Hidden: each counting library's code calls its own hooks, whatever else is loaded. */
#define TDSL_EMU_HOOK extern "C" TDSL_EMU_QUIET
#define TDSL_EMU_PC reinterpret_cast<uintptr_t>(__builtin_return_address(0))

/* The hooks that -fsanitize=thread calls (the TSan runtime is not linked). */
#define TDSL_EMU_HOOKS(n)                                                                     \
    TDSL_EMU_HOOK void __tsan_read##n(void *p) {                                              \
        ::tdsl_emu::count_access(p, n, false, TDSL_EMU_PC);                                   \
    }                                                                                         \
    TDSL_EMU_HOOK void __tsan_write##n(void *p) {                                             \
        ::tdsl_emu::count_access(p, n, true, TDSL_EMU_PC);                                    \
    }                                                                                         \
    TDSL_EMU_HOOK void __tsan_unaligned_read##n(void *p) {                                    \
        ::tdsl_emu::count_access(p, n, false, TDSL_EMU_PC);                                   \
    }                                                                                         \
    TDSL_EMU_HOOK void __tsan_unaligned_write##n(void *p) {                                   \
        ::tdsl_emu::count_access(p, n, true, TDSL_EMU_PC);                                    \
    }                                                                                         \
    TDSL_EMU_HOOK void __tsan_volatile_read##n(void *p) {                                     \
        ::tdsl_emu::count_access(p, n, false, TDSL_EMU_PC);                                   \
    }                                                                                         \
    TDSL_EMU_HOOK void __tsan_volatile_write##n(void *p) {                                    \
        ::tdsl_emu::count_access(p, n, true, TDSL_EMU_PC);                                    \
    }
TDSL_EMU_HOOKS(1)
TDSL_EMU_HOOKS(2)
TDSL_EMU_HOOKS(4)
TDSL_EMU_HOOKS(8)
TDSL_EMU_HOOKS(16)
#undef TDSL_EMU_HOOKS
TDSL_EMU_HOOK void __tsan_read_range(void *p, unsigned long size) {
    ::tdsl_emu::count_access(p, size, false, TDSL_EMU_PC);
}
TDSL_EMU_HOOK void __tsan_write_range(void *p, unsigned long size) {
    ::tdsl_emu::count_access(p, size, true, TDSL_EMU_PC);
}
/* memcpy, memmove and memset called by the unit (cuda_bf16.h's stores of a bfloat16, GCC's
 * block copies): the linker sends them here (-Wl,--wrap=...; TSan's runtime intercepts them
 * instead), counted as one read and one write of the range. */
extern "C" void *__real_memcpy(void *, const void *, size_t);
extern "C" void *__real_memmove(void *, const void *, size_t);
extern "C" void *__real_memset(void *, int, size_t);
TDSL_EMU_HOOK void *__wrap_memcpy(void *to, const void *from, size_t size) {
    ::tdsl_emu::count_access(from, size, false, TDSL_EMU_PC);
    ::tdsl_emu::count_access(to, size, true, TDSL_EMU_PC);
    return __real_memcpy(to, from, size);
}
TDSL_EMU_HOOK void *__wrap_memmove(void *to, const void *from, size_t size) {
    ::tdsl_emu::count_access(from, size, false, TDSL_EMU_PC);
    ::tdsl_emu::count_access(to, size, true, TDSL_EMU_PC);
    return __real_memmove(to, from, size);
}
TDSL_EMU_HOOK void *__wrap_memset(void *to, int value, size_t size) {
    ::tdsl_emu::count_access(to, size, true, TDSL_EMU_PC);
    return __real_memset(to, value, size);
}

/* Atomic loads and stores (the guard of a function's static variable): plain, as fibers
 * switch only at barriers. */
#define TDSL_EMU_ATOMICS(bits, T)                                                             \
    TDSL_EMU_HOOK T __tsan_atomic##bits##_load(const volatile T *p, int) {                    \
        return *p;                                                                            \
    }                                                                                         \
    TDSL_EMU_HOOK void __tsan_atomic##bits##_store(volatile T *p, T v, int) {                 \
        *p = v;                                                                               \
    }
TDSL_EMU_ATOMICS(8, char)
TDSL_EMU_ATOMICS(16, short)
TDSL_EMU_ATOMICS(32, int)
TDSL_EMU_ATOMICS(64, long long)
#undef TDSL_EMU_ATOMICS
TDSL_EMU_HOOK void __tsan_init() {}
TDSL_EMU_HOOK void __tsan_func_entry(void *) {}
TDSL_EMU_HOOK void __tsan_func_exit() {}
TDSL_EMU_HOOK void __tsan_vptr_update(void *, void *) {}
TDSL_EMU_HOOK void __tsan_vptr_read(void *) {}

/* Reset the counters and register the launch's global buffers ([lo, hi) pairs). */
TDSL_EMU_EXPORT TDSL_EMU_QUIET void tdsl_emu_count_reset(const unsigned long long *ranges,
                                                         int count) {
    std::lock_guard<std::mutex> hold(::tdsl_emu::launch_mutex);
    auto &c = ::tdsl_emu::counting;
    std::fill(c.value, c.value + ::tdsl_emu::kCounters, 0);
    c.global.clear();
    for (int n = 0; n < count; ++n) c.global.emplace_back(ranges[2 * n], ranges[2 * n + 1]);
    c.pending.clear();
    c.seen.clear();
}

/* The counters since the last reset: fmas, global bytes loaded, stored, shared loads,
 * shared stores, shared requests (warp, site, occurrence), bank conflicts. */
TDSL_EMU_EXPORT TDSL_EMU_QUIET int tdsl_emu_count_read(long long *values, int count) {
    std::lock_guard<std::mutex> hold(::tdsl_emu::launch_mutex);
    int n = std::min<int>(count, ::tdsl_emu::kCounters);
    std::copy(::tdsl_emu::counting.value, ::tdsl_emu::counting.value + n, values);
    return ::tdsl_emu::kCounters;
}

#endif /* TDSL_CUDA_EMU_COUNTING_H */
