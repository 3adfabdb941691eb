// libFuzzer target: arbitrary bytes as tokenizer.json. Loading must answer
// with apiary::Error or give a tokenizer that round-trips bytes; any other
// exception, a crash or a failed round trip is a bug.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const auto tok = apiary::data::Tokenizer::from_json_text(text, "fuzz.json");
        const std::string probe = "Hello, world! \xff\xfe caf\xc3\xa9 <|endoftext|> 12345";
        if (tok.decode(tok.encode(probe, false)) != probe) std::abort();
        (void)tok.to_json_text();
    } catch (const apiary::Error&) {
    }
    return 0;
}
