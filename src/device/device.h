#pragma once
// Which device a run computes on (train.device), and whether it can: the
// checks that run before anything is allocated or a run directory is written.

#include <functional>
#include <string>

namespace apiary::device {

enum class DeviceKind : int { cpu = 0, cuda = 1 };

// "cpu" | "cuda"; anything else throws ConfigError naming `key`.
DeviceKind parse_device(const std::string& name, const std::string& key);
const char* device_name(DeviceKind kind);

// Whether this binary was built with the CUDA backend (APIARY_CUDA).
bool cuda_built();

// What the CUDA runtime says about this machine: the number of GPUs, or why
// there are none (cudaGetDeviceCount's error: no driver, no device, ...).
struct CudaProbe {
    bool built = false;
    int count = 0;
    std::string error;  // empty when the runtime answered
    // The CUDA module (cuda_backend.h) could not be loaded: `error` says why.
    bool module_missing = false;
};
// Asks the CUDA runtime (never throws; on a build without CUDA: built = false).
CudaProbe probe_cuda();

// Throws DeviceError naming `key` and what is missing when `kind` cannot run
// here: a build without CUDA, or no usable GPU. The probe is a parameter so
// that tests can stand in for a machine they are not on.
void require_device(DeviceKind kind, const std::string& key,
                    const std::function<CudaProbe()>& probe = probe_cuda);

}  // namespace apiary::device
