/* XLA FFI handlers that launch a generated CUDA kernel without Python (codegen/cuda/run/launch.py).
 *
 * `tdsl_cuda_launch` (platform CUDA): the kernel's CUBIN, compiled by NVRTC at trace time,
 * is loaded once per CUDA context (the context of XLA's stream) and launched with
 * cuLaunchKernel on XLA's stream (XLA_FFI_Stream_Get). libcuda is opened with dlopen when
 * first needed, so nothing links against a driver that may be absent.
 * `tdsl_cuda_launch_emulated` (platform Host): the same handler with the CUDA emulator
 * (codegen/cuda/emulator/runtime.h) as the driver: the "image" is the path of an emulator library, a
 * launch runs the kernel on the calling thread. Everything else (attributes, checks,
 * argument packing, poisoning) is shared, so the CPU tests exercise it.
 *
 * Attributes of a call: image (u8 array), image_id (s64: a digest of image and entries, the
 * module cache key), entry (string: the entry points of the kernels to launch, in order,
 * separated by spaces), grid (s64 x 3 per entry), block (s64 x 3), shared (s64), params
 * (s64 array: the kernels' 64-bit parameters), scratch (s32, default 0: how many outputs
 * after the first are scratch space), poison (s32: fill the outputs with 0xff bytes first),
 * order (s32: emulator scheduling order), dtypes (string: numpy dtype names of the output,
 * each operand, each scratch output). Every kernel gets the same arguments, as
 * codegen/cuda/emit.py declares them: the output pointer, one pointer per operand, one per
 * scratch output, then each parameter as a 64-bit integer. The kernels run one after
 * another on the stream, so a later one reads what an earlier one wrote to scratch space.
 *
 * Both handlers declare XLA's command-buffer trait, so XLA may capture a call into a CUDA
 * graph: a call always enqueues the same operations on XLA's stream (the optional poisoning
 * memsets, then one cuLaunchKernel per entry), all fixed by the attributes, and never waits on
 * the stream or reads device memory. Loading the module (once per context and image) is not
 * a stream operation; it runs with this thread's capture mode relaxed (`RelaxedCapture`), so
 * a first call that XLA captures may load it.
 */
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <cuda.h>

#include "xla/ffi/api/c_api.h"

#define TDSL_EXPORT extern "C" __attribute__((visibility("default")))
#define TDSL_STR2(x) #x
#define TDSL_STR(x) TDSL_STR2(x) /* expands cuda.h's versioned names: cuCtxPushCurrent_v2 */

namespace {

struct EmulatedKernel { /* tdsl_emu_kernel of codegen/cuda/emulator/runtime.h */
    const char *name;
    const char *signature;
    int (*launch)(const EmulatedKernel *, const long long *, const long long *, long long,
                  void **, int, char *, long long);
    void (*invoke)(void **);
};

struct Call {
    const uint8_t *image = nullptr;
    size_t image_size = 0;
    int64_t image_id = 0, shared = 0;
    std::string entry, dtypes; /* entry: the entry points, separated by spaces */
    std::vector<std::string> entries;
    const int64_t *grid = nullptr, *block = nullptr, *params = nullptr;
    size_t grid_size = 0, params_size = 0;
    int32_t scratch = 0, poison = 0, order = 0;
};

/* An output buffer: where, and how many bytes (poisoned before the launch when asked). */
struct Output {
    void *data;
    size_t bytes;
};

std::vector<std::string> words(const std::string &text) {
    std::vector<std::string> found;
    for (size_t start = 0; start <= text.size();) {
        size_t end = text.find(' ', start);
        if (end == std::string::npos) end = text.size();
        found.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return found;
}

/* ---- the CUDA driver, opened with dlopen ---- */

struct CudaDriver {
    decltype(&cuInit) init = nullptr;
    decltype(&cuGetErrorString) error_string = nullptr;
    decltype(&cuStreamGetCtx) stream_context = nullptr;
    decltype(&cuCtxPushCurrent) push = nullptr;
    decltype(&cuCtxPopCurrent) pop = nullptr;
    decltype(&cuModuleLoadData) load = nullptr;
    decltype(&cuModuleGetFunction) function = nullptr;
    decltype(&cuModuleUnload) unload = nullptr;
    decltype(&cuFuncSetAttribute) set_attribute = nullptr;
    decltype(&cuLaunchKernel) launch = nullptr;
    decltype(&cuMemsetD8Async) memset = nullptr;
    std::string error; /* why the driver is unusable, empty when it is */
};

template <class F> bool symbol(void *library, const char *name, F *slot, std::string *error) {
    *slot = reinterpret_cast<F>(dlsym(library, name));
    if (*slot == nullptr) *error = std::string("libcuda has no ") + name;
    return *slot != nullptr;
}

const CudaDriver &cuda_driver() {
    static const CudaDriver driver = [] {
        CudaDriver d;
        void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (library == nullptr) {
            const char *why = dlerror();
            d.error = std::string("cannot open the CUDA driver: ") + (why ? why : "libcuda.so.1");
            return d;
        }
        bool ok = symbol(library, TDSL_STR(cuInit), &d.init, &d.error) &&
                  symbol(library, TDSL_STR(cuGetErrorString), &d.error_string, &d.error) &&
                  symbol(library, TDSL_STR(cuStreamGetCtx), &d.stream_context, &d.error) &&
                  symbol(library, TDSL_STR(cuCtxPushCurrent), &d.push, &d.error) &&
                  symbol(library, TDSL_STR(cuCtxPopCurrent), &d.pop, &d.error) &&
                  symbol(library, TDSL_STR(cuModuleLoadData), &d.load, &d.error) &&
                  symbol(library, TDSL_STR(cuModuleGetFunction), &d.function, &d.error) &&
                  symbol(library, TDSL_STR(cuModuleUnload), &d.unload, &d.error) &&
                  symbol(library, TDSL_STR(cuFuncSetAttribute), &d.set_attribute, &d.error) &&
                  symbol(library, TDSL_STR(cuLaunchKernel), &d.launch, &d.error) &&
                  symbol(library, TDSL_STR(cuMemsetD8Async), &d.memset, &d.error);
        if (ok && d.init(0) != CUDA_SUCCESS) d.error = "cuInit failed";
        return d;
    }();
    return driver;
}

std::string cuda_failure(CUresult status, const char *what) {
    const char *text = nullptr;
    if (cuda_driver().error_string) cuda_driver().error_string(status, &text);
    return std::string(what) + " failed: " + (text ? text : std::to_string(int(status)));
}

/* ---- one launch path, two drivers ---- */

std::mutex cache_mutex;
/* (context, image_id) -> the function of each entry; the emulator's context is null. Only
 * a complete load is stored: a failed one leaves no entry (and unloads what it loaded), so
 * the next call tries again and fails, if it does, with the same message. */
std::map<std::tuple<void *, int64_t>, std::vector<void *>> functions;
/* Static shared memory a block gets without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize). */
constexpr int64_t default_shared_limit = 48 * 1024;

std::string cuda_functions(const Call &call, void *stream, CUcontext *context,
                           std::vector<void *> *found) {
    const CudaDriver &d = cuda_driver();
    if (!d.error.empty()) return d.error;
    CUresult status = d.stream_context(static_cast<CUstream>(stream), context);
    if (status != CUDA_SUCCESS) return cuda_failure(status, "cuStreamGetCtx");
    std::lock_guard<std::mutex> hold(cache_mutex);
    auto hit = functions.find({*context, call.image_id});
    if (hit != functions.end()) {
        *found = hit->second;
        return "";
    }
    CUmodule module = nullptr;
    d.push(*context);
    status = d.load(&module, call.image);
    const char *step = "cuModuleLoadData (the kernel's CUBIN)";
    std::vector<void *> loaded;
    for (size_t n = 0; status == CUDA_SUCCESS && n < call.entries.size(); ++n) {
        CUfunction function = nullptr;
        status = d.function(&function, module, call.entries[n].c_str());
        step = "cuModuleGetFunction";
        /* Dynamic shared memory above the default needs the opt-in, once per function. */
        if (status == CUDA_SUCCESS && call.shared > default_shared_limit) {
            status = d.set_attribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     int(call.shared));
            step = "cuFuncSetAttribute (dynamic shared memory)";
        }
        loaded.push_back(function);
    }
    if (status != CUDA_SUCCESS && module != nullptr) d.unload(module);
    CUcontext popped;
    d.pop(&popped);
    if (status != CUDA_SUCCESS) return cuda_failure(status, step);
    *found = functions[{*context, call.image_id}] = loaded;
    return "";
}

/* This thread's stream capture mode relaxed for the guard's lifetime (no-op without a driver
 * that has cuThreadExchangeStreamCaptureMode): module loading is allowed during a capture. */
class RelaxedCapture {
    using Exchange = CUresult (*)(CUstreamCaptureMode *);
    Exchange exchange_;
    CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;

    static Exchange find() {
        static const Exchange found = [] {
            void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
            void *function =
                library ? dlsym(library, TDSL_STR(cuThreadExchangeStreamCaptureMode)) : nullptr;
            return reinterpret_cast<Exchange>(function);
        }();
        return found;
    }

  public:
    RelaxedCapture() : exchange_(find()) {
        if (exchange_ != nullptr && exchange_(&mode_) != CUDA_SUCCESS) exchange_ = nullptr;
    }
    ~RelaxedCapture() {
        if (exchange_ != nullptr) exchange_(&mode_);
    }
    RelaxedCapture(const RelaxedCapture &) = delete;
    RelaxedCapture &operator=(const RelaxedCapture &) = delete;
};

std::string cuda_launch(const Call &call, void *stream, const std::vector<Output> &outputs,
                        void **arguments) {
    CUcontext context;
    std::vector<void *> kernels;
    std::string error;
    {
        RelaxedCapture relaxed; /* the first call in a context loads the module */
        error = cuda_functions(call, stream, &context, &kernels);
    }
    if (!error.empty()) return error;
    const CudaDriver &d = cuda_driver();
    d.push(context);
    CUresult status = CUDA_SUCCESS;
    for (size_t n = 0; call.poison && status == CUDA_SUCCESS && n < outputs.size(); ++n)
        status = d.memset(reinterpret_cast<CUdeviceptr>(outputs[n].data), 0xff,
                          outputs[n].bytes, static_cast<CUstream>(stream));
    for (size_t n = 0; status == CUDA_SUCCESS && n < kernels.size(); ++n) {
        const int64_t *grid = call.grid + 3 * n;
        status = d.launch(static_cast<CUfunction>(kernels[n]), unsigned(grid[0]),
                          unsigned(grid[1]), unsigned(grid[2]), unsigned(call.block[0]),
                          unsigned(call.block[1]), unsigned(call.block[2]),
                          unsigned(call.shared), static_cast<CUstream>(stream), arguments,
                          nullptr);
    }
    CUcontext popped;
    d.pop(&popped);
    return status == CUDA_SUCCESS ? "" : cuda_failure(status, "cuLaunchKernel");
}

std::string emulated_kernels(const Call &call, std::vector<void *> *found) {
    std::lock_guard<std::mutex> hold(cache_mutex);
    auto hit = functions.find({nullptr, call.image_id});
    if (hit != functions.end()) {
        *found = hit->second;
        return "";
    }
    std::string path(reinterpret_cast<const char *>(call.image), call.image_size);
    void *library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return std::string("cannot open ") + path;
    std::vector<void *> loaded;
    for (const std::string &entry : call.entries) {
        loaded.push_back(dlsym(library, ("tdsl_emu_kernel_" + entry).c_str()));
        if (loaded.back() == nullptr) {
            dlclose(library); /* nothing of a failed load stays behind */
            return path + " has no kernel " + entry;
        }
    }
    *found = functions[{nullptr, call.image_id}] = loaded;
    return "";
}

std::string emulated_launch(const Call &call, void *, const std::vector<Output> &outputs,
                            void **arguments) {
    std::vector<void *> kernels;
    std::string failed = emulated_kernels(call, &kernels);
    if (!failed.empty()) return failed;
    for (size_t n = 0; call.poison && n < outputs.size(); ++n)
        memset(outputs[n].data, 0xff, outputs[n].bytes);
    for (size_t n = 0; n < kernels.size(); ++n) {
        auto *kernel = static_cast<const EmulatedKernel *>(kernels[n]);
        char error[16384] = "";
        int status = kernel->launch(kernel, reinterpret_cast<const long long *>(call.grid + 3 * n),
                                    reinterpret_cast<const long long *>(call.block), call.shared,
                                    arguments, call.order, error, sizeof error);
        if (status == 0) continue;
        std::string text = error;
        std::string named = call.entries[n] + ": "; /* the handler names the entries itself */
        return text.compare(0, named.size(), named) == 0 ? text.substr(named.size()) : text;
    }
    return "";
}

/* ---- the FFI call frame ---- */

XLA_FFI_Error *ffi_error(const XLA_FFI_Api *api, const std::string &message,
                         XLA_FFI_Error_Code code = XLA_FFI_Error_Code_INVALID_ARGUMENT) {
    XLA_FFI_Error_Create_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = message.c_str(); /* copied by XLA */
    args.errc = code;
    return api->XLA_FFI_Error_Create(&args);
}

XLA_FFI_Error *metadata(XLA_FFI_CallFrame *frame) {
    auto *extension = reinterpret_cast<XLA_FFI_Metadata_Extension *>(frame->extension_start);
    XLA_FFI_Metadata *data = extension->metadata;
    if (data->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
        return ffi_error(frame->api, "tensordsl: XLA_FFI_Metadata is too small");
    data->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    data->api_version.extension_start = nullptr;
    data->api_version.major_version = XLA_FFI_API_MAJOR;
    data->api_version.minor_version = XLA_FFI_API_MINOR;
    data->traits = XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE; /* see the header */
    return nullptr;
}

bool named(const XLA_FFI_ByteSpan *name, const char *expected) {
    return name->len == strlen(expected) && memcmp(name->ptr, expected, name->len) == 0;
}

/* Read the attributes; an error message names the first bad or missing one. */
std::string read_attributes(const XLA_FFI_Attrs &attrs, Call *call) {
    int found = 0;
    for (int64_t a = 0; a < attrs.size; ++a) {
        const XLA_FFI_ByteSpan *name = attrs.names[a];
        void *value = attrs.attrs[a];
        if (attrs.types[a] == XLA_FFI_AttrType_STRING) {
            auto *text = static_cast<const XLA_FFI_ByteSpan *>(value);
            std::string s(text->ptr, text->len);
            if (named(name, "entry")) call->entry = s, call->entries = words(s), found |= 1;
            if (named(name, "dtypes")) call->dtypes = s, found |= 2;
        } else if (attrs.types[a] == XLA_FFI_AttrType_ARRAY) {
            auto *array = static_cast<const XLA_FFI_Array *>(value);
            bool s64 = array->dtype == XLA_FFI_DataType_S64;
            auto *data = static_cast<const int64_t *>(array->data);
            if (named(name, "image") && array->dtype == XLA_FFI_DataType_U8)
                call->image = static_cast<const uint8_t *>(array->data),
                call->image_size = array->size, found |= 4;
            if (named(name, "grid") && s64)
                call->grid = data, call->grid_size = array->size, found |= 8;
            if (named(name, "block") && s64 && array->size == 3) call->block = data, found |= 16;
            if (named(name, "params") && s64)
                call->params = data, call->params_size = array->size, found |= 32;
        } else if (attrs.types[a] == XLA_FFI_AttrType_SCALAR) {
            auto *scalar = static_cast<const XLA_FFI_Scalar *>(value);
            if (scalar->dtype == XLA_FFI_DataType_S64) {
                int64_t v = *static_cast<const int64_t *>(scalar->value);
                if (named(name, "image_id")) call->image_id = v, found |= 64;
                if (named(name, "shared")) call->shared = v, found |= 128;
            } else if (scalar->dtype == XLA_FFI_DataType_S32) {
                int32_t v = *static_cast<const int32_t *>(scalar->value);
                if (named(name, "scratch")) call->scratch = v;
                if (named(name, "poison")) call->poison = v;
                if (named(name, "order")) call->order = v;
            }
        }
    }
    static const char *required[] = {"entry (string)", "dtypes (string)", "image (u8 array)",
                                     "grid (3 x s64 per entry)", "block (3 x s64)",
                                     "params (s64 array)", "image_id (s64)", "shared (s64)"};
    for (int bit = 0; bit < 8; ++bit)
        if (!(found >> bit & 1)) return std::string("missing attribute ") + required[bit];
    if (call->grid_size != 3 * call->entries.size())
        return "grid has " + std::to_string(call->grid_size) + " values for " +
               std::to_string(call->entries.size()) + " entries; expected 3 per entry";
    return "";
}

XLA_FFI_DataType dtype_code(const std::string &name) {
    static const std::map<std::string, XLA_FFI_DataType> codes = {
        {"float32", XLA_FFI_DataType_F32}, {"float64", XLA_FFI_DataType_F64},
        {"float16", XLA_FFI_DataType_F16}, {"bfloat16", XLA_FFI_DataType_BF16},
        {"int32", XLA_FFI_DataType_S32},   {"int64", XLA_FFI_DataType_S64},
        {"uint8", XLA_FFI_DataType_U8}};
    auto found = codes.find(name);
    return found == codes.end() ? XLA_FFI_DataType_INVALID : found->second;
}

/* The kernels' pointer arguments: the output, the operands, the scratch outputs. */
std::vector<XLA_FFI_Buffer *> pointer_buffers(const XLA_FFI_CallFrame *frame) {
    std::vector<XLA_FFI_Buffer *> found{static_cast<XLA_FFI_Buffer *>(frame->rets.rets[0])};
    for (int64_t n = 0; n < frame->args.size; ++n)
        found.push_back(static_cast<XLA_FFI_Buffer *>(frame->args.args[n]));
    for (int64_t n = 1; n < frame->rets.size; ++n)
        found.push_back(static_cast<XLA_FFI_Buffer *>(frame->rets.rets[n]));
    return found;
}

/* The buffers' element types against `dtypes`; an error message or "". */
std::string check_buffers(const XLA_FFI_CallFrame *frame, const Call &call) {
    std::vector<std::string> names = words(call.dtypes);
    int64_t operands = int64_t(names.size()) - 1 - call.scratch;
    if (frame->rets.size != 1 + call.scratch || frame->args.size != operands)
        return "expected " + std::to_string(operands) + " operands, 1 output and " +
               std::to_string(call.scratch) + " scratch outputs";
    std::vector<XLA_FFI_Buffer *> buffers = pointer_buffers(frame);
    for (size_t n = 0; n < names.size(); ++n) {
        if (buffers[n]->dtype == dtype_code(names[n])) continue;
        std::string what = n == 0                    ? std::string("the output")
                           : int64_t(n) <= operands ? "operand " + std::to_string(n - 1)
                                                     : "scratch output " + std::to_string(n - 1 - operands);
        return what + " is not " + names[n];
    }
    return "";
}

size_t buffer_bytes(const XLA_FFI_Buffer *buffer) {
    size_t size = 4;
    switch (buffer->dtype) {
    case XLA_FFI_DataType_U8: size = 1; break;
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16: size = 2; break;
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_S64: size = 8; break;
    default: break;
    }
    for (int64_t d = 0; d < buffer->rank; ++d) size *= size_t(buffer->dims[d]);
    return size;
}

using Launcher = std::string (*)(const Call &, void *, const std::vector<Output> &, void **);

XLA_FFI_Error *handle(XLA_FFI_CallFrame *frame, Launcher launcher, bool needs_stream) {
    if (frame->extension_start != nullptr &&
        frame->extension_start->type == XLA_FFI_Extension_Metadata)
        return metadata(frame);
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return ffi_error(frame->api, "tensordsl: called outside the execute stage");
    Call call;
    std::string error = read_attributes(frame->attrs, &call);
    if (error.empty()) error = check_buffers(frame, call);
    if (!error.empty()) return ffi_error(frame->api, "tensordsl " + call.entry + ": " + error);
    void *stream = nullptr;
    if (needs_stream) {
        XLA_FFI_Stream_Get_Args args;
        memset(&args, 0, sizeof args);
        args.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
        args.ctx = frame->ctx;
        XLA_FFI_Error *failed = frame->api->XLA_FFI_Stream_Get(&args);
        if (failed != nullptr) return failed;
        stream = args.stream;
    }
    /* Arguments as the kernels declare them: out, operands, scratch, then int64 parameters. */
    std::vector<XLA_FFI_Buffer *> buffers = pointer_buffers(frame);
    size_t count = buffers.size();
    std::vector<void *> pointers(count), arguments(count + call.params_size);
    for (size_t n = 0; n < count; ++n) pointers[n] = buffers[n]->data, arguments[n] = &pointers[n];
    for (size_t n = 0; n < call.params_size; ++n)
        arguments[count + n] = const_cast<int64_t *>(&call.params[n]);
    std::vector<Output> outputs;
    for (int64_t n = 0; n < frame->rets.size; ++n) {
        auto *buffer = static_cast<XLA_FFI_Buffer *>(frame->rets.rets[n]);
        outputs.push_back({buffer->data, buffer_bytes(buffer)});
    }
    error = launcher(call, stream, outputs, arguments.data());
    if (error.empty()) return nullptr;
    return ffi_error(frame->api, "tensordsl " + call.entry + ": " + error,
                     XLA_FFI_Error_Code_INTERNAL);
}

} // namespace

TDSL_EXPORT XLA_FFI_Error *tdsl_cuda_launch(XLA_FFI_CallFrame *frame) {
    return handle(frame, cuda_launch, true);
}

TDSL_EXPORT XLA_FFI_Error *tdsl_cuda_launch_emulated(XLA_FFI_CallFrame *frame) {
    return handle(frame, emulated_launch, false);
}

/* Why the CUDA driver cannot be used here ("" when it can); opens it on first call. */
TDSL_EXPORT const char *tdsl_cuda_driver_error() { return cuda_driver().error.c_str(); }

/* How many (context, image) entries the module cache holds (tests: a failed load adds none). */
TDSL_EXPORT long long tdsl_cuda_cache_entries() {
    std::lock_guard<std::mutex> hold(cache_mutex);
    return static_cast<long long>(functions.size());
}
