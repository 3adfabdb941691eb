// libFuzzer target: arbitrary bytes as a token shard file. The reader must
// answer with apiary::Error or read every token and index entry in bounds
// (ASan checks the bounds); any other exception or crash is a bug.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "data/file_io.h"
#include "data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = "/tmp/apiary_fuzz_shard_" + std::to_string(::getpid()) + ".bin";
    {
        FILE* f = std::fopen(path.c_str(), "wb");
        if (!f) return 0;
        std::fwrite(data, 1, size, f);
        std::fclose(f);
    }
    try {
        apiary::data::ShardReader r(path);
        uint64_t sum = 0;
        for (uint64_t i = 0; i < r.num_tokens(); ++i) sum += r.token(i);
        for (uint64_t d = 0; d < r.num_docs(); ++d) sum += r.doc_start(d);
        r.verify(apiary::data::hex64(apiary::data::xxhash64(data, size)));
        if (sum == 0x123456789) std::fputc(' ', stderr);  // keep the reads
    } catch (const apiary::Error&) {
    }
    std::remove(path.c_str());
    return 0;
}
