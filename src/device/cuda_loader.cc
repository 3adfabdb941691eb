// Finding and loading libapiary_cuda.so (cuda_backend.h), and the device
// layer's CUDA entry points on top of it.

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "device/context.h"
#include "device/cuda_backend.h"

namespace apiary::device {

namespace {

constexpr const char* kModule = "libapiary_cuda.so";

std::vector<std::string> candidates() {
    std::vector<std::string> c;
    // Named by the user: that file or nothing.
    if (const char* env = std::getenv("APIARY_CUDA_MODULE"); env && *env) return {env};
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) c.push_back((exe.parent_path() / kModule).string());
#ifdef APIARY_CUDA_MODULE_DIR
    c.push_back(std::string(APIARY_CUDA_MODULE_DIR) + "/" + kModule);
#endif
    c.emplace_back(kModule);
    return c;
}

struct Loaded {
    const CudaBackend* backend = nullptr;
    std::string why;
};

Loaded load() {
    Loaded l;
    std::string tried;
    for (const std::string& path : candidates()) {
        // A path that does not exist is skipped quietly; the last, bare name
        // goes through the loader's own search.
        const bool named = std::getenv("APIARY_CUDA_MODULE") != nullptr;
        if (!named && path.find('/') != std::string::npos && !std::filesystem::exists(path)) {
            continue;
        }
        void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            tried += fmt::format("{}{}", tried.empty() ? "" : "; ", dlerror());
            continue;
        }
        using Entry = const CudaBackend* (*)();
        auto entry = reinterpret_cast<Entry>(dlsym(h, "apiary_cuda_backend_v1"));
        if (!entry) {
            tried +=
                fmt::format("{}{}: no apiary_cuda_backend_v1", tried.empty() ? "" : "; ", path);
            continue;
        }
        const CudaBackend* b = entry();
        if (!b || b->abi != kCudaBackendAbi) {
            tried += fmt::format("{}{}: built for another apiary", tried.empty() ? "" : "; ", path);
            continue;
        }
        l.backend = b;
        return l;
    }
    l.why = fmt::format(
        "apiary's CUDA module {} could not be loaded ({}); set APIARY_CUDA_MODULE "
        "to its path",
        kModule, tried.empty() ? "not found" : tried);
    return l;
}

}  // namespace

const CudaBackend* cuda_backend(std::string* why) {
    static std::once_flag once;
    static Loaded loaded;
    std::call_once(once, [] { loaded = load(); });
    if (!loaded.backend && why) *why = loaded.why;
    return loaded.backend;
}

bool cuda_built() { return true; }

CudaProbe probe_cuda() {
    std::string why;
    const CudaBackend* b = cuda_backend(&why);
    if (!b) return CudaProbe{true, 0, why, true};
    return b->probe();
}

std::unique_ptr<RawAllocator> cuda_allocator(int device) {
    std::string why;
    const CudaBackend* b = cuda_backend(&why);
    if (!b) throw DeviceError(why);
    return b->allocator(device);
}

std::unique_ptr<Ops> cuda_ops(DeviceArena& arena, int device) {
    std::string why;
    const CudaBackend* b = cuda_backend(&why);
    if (!b) throw DeviceError(why);
    return b->ops(arena, device);
}

}  // namespace apiary::device
