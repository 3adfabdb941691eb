// libFuzzer target: arbitrary bytes as manifest.json. Manifest::load must
// answer with apiary::Error or return a manifest whose shard names stay in
// its directory; any other exception or crash is a bug.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string dir = "/tmp/apiary_fuzz_manifest_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    {
        FILE* f = std::fopen((dir + "/manifest.json").c_str(), "wb");
        if (!f) return 0;
        std::fwrite(data, 1, size, f);
        std::fclose(f);
    }
    try {
        const auto m = apiary::data::Manifest::load(dir);
        for (const auto& s : m.shards) {
            if (s.file.find('/') == 0 || s.file.find("..") != std::string::npos) std::abort();
        }
        (void)m.to_json().dump();
    } catch (const apiary::Error&) {
    }
    std::filesystem::remove_all(dir);
    return 0;
}
