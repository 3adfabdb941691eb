#include "device/device.h"

#include <fmt/format.h>

#include "core/error.h"

namespace apiary::device {

DeviceKind parse_device(const std::string& name, const std::string& key) {
    if (name == "cpu") return DeviceKind::cpu;
    if (name == "cuda") return DeviceKind::cuda;
    throw ConfigError(fmt::format("{} = '{}': expected 'cpu' or 'cuda'", key, name));
}

const char* device_name(DeviceKind kind) { return kind == DeviceKind::cuda ? "cuda" : "cpu"; }

void require_device(DeviceKind kind, const std::string& key,
                    const std::function<CudaProbe()>& probe) {
    if (kind == DeviceKind::cpu) return;
    const CudaProbe p = probe();
    if (!p.built) {
        throw DeviceError(fmt::format(
            "{} = 'cuda' but this apiary was built without the CUDA backend (configured with "
            "APIARY_CUDA=OFF, or AUTO found no CUDA toolkit); rebuild with -DAPIARY_CUDA=ON on a "
            "machine with the CUDA toolkit, or set {} = 'cpu'",
            key, key));
    }
    if (p.module_missing) {
        throw DeviceError(fmt::format("{} = 'cuda' but {}, or set {} = 'cpu'", key, p.error, key));
    }
    if (!p.error.empty() || p.count <= 0) {
        throw DeviceError(fmt::format(
            "{} = 'cuda' but no usable GPU: the CUDA runtime reports {} (cudaGetDeviceCount); "
            "check the driver and CUDA_VISIBLE_DEVICES, or set {} = 'cpu'",
            key, p.error.empty() ? fmt::format("{} devices", p.count) : p.error, key));
    }
}

}  // namespace apiary::device
