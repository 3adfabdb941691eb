#pragma once
// A seeded generator of text whose words rarely repeat: invented words and
// names, programming identifiers (some very long), and words in nine other
// scripts, with numbers, punctuation and line breaks between them. A BPE
// encoder's pre-token cache hits on the Bible almost always; here most
// pre-tokens are new, so this text measures (and tests) the merge loop
// itself. No file is shipped: the same seed gives the same bytes everywhere
// (the generator uses its own integer RNG, not <random>'s distributions,
// whose results differ between standard libraries).
//
//   std::string text = varied_text(/*seed=*/1, /*bytes=*/4 << 20);

#include <cstddef>
#include <cstdint>
#include <string>

namespace apiary::data {

// About `bytes` bytes (ends at a word boundary just past it), valid UTF-8.
std::string varied_text(uint64_t seed, size_t bytes);

}  // namespace apiary::data
