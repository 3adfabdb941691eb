#pragma once
// A checkpoint's tensors gathered by global name, whatever layout saved them
// (through the same reader that resumes runs), for tests that compare runs.

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/sharded.h"

namespace apiary::testing {

// kind: "param", "adam_m" or "adam_v".
inline std::map<std::string, std::vector<double>> checkpoint_tensors(
    const std::filesystem::path& dir, const std::string& kind = "param") {
    const ckpt::CheckpointReader reader(dir.string());
    std::map<std::string, std::vector<double>> out;
    for (const auto& name : reader.tensors(kind)) {
        core::Placement whole;
        whole.global_shape = whole.local_shape = reader.global_shape(kind, name);
        std::vector<float> v(static_cast<size_t>(whole.local_numel()));
        reader.read(kind, name, whole, 0, whole.local_numel(), v.data());
        out[name] = std::vector<double>(v.begin(), v.end());
    }
    return out;
}

// The manifest of a checkpoint directory.
inline nlohmann::json checkpoint_manifest(const std::filesystem::path& dir) {
    std::ifstream in(dir / ckpt::kManifestFile);
    return nlohmann::json::parse(in);
}

}  // namespace apiary::testing
