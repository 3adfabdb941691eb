// Tokenizer files: Hugging Face tokenizer.json and GPT-2's vocab.json +
// merges.txt. Token strings in both use GPT-2's byte-to-printable-character
// map, so a vocabulary of raw bytes survives JSON.

#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/file_io.h"
#include "data/tokenizer.h"

namespace apiary::data {

namespace {

struct ByteMap {
    uint32_t to_cp[256];
    std::map<uint32_t, unsigned char> from_cp;
    ByteMap() {
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable =
                (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            to_cp[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
            from_cp[to_cp[b]] = static_cast<unsigned char>(b);
        }
    }
};
const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

void put_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else {  // the map only uses code points below 0x800
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

[[noreturn]] void bad(const std::string& source, const std::string& what) {
    throw DataError(fmt::format("tokenizer '{}': {}", source, what));
}

nlohmann::json parse_json(std::string_view text, const std::string& source) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
        bad(source, fmt::format("not valid JSON at byte {} ({}); is this a tokenizer.json?", e.byte,
                                e.what()));
    }
}

std::string token_from_json(const std::string& s, const std::string& source,
                            const std::string& where) {
    std::string bytes;
    if (!unicode_to_bytes(s, &bytes)) {
        bad(source, fmt::format("{}: token '{}' uses a character outside the byte-level "
                                "alphabet; only byte-level BPE tokenizers are supported",
                                where, s));
    }
    return bytes;
}

// Builds ids -> bytes from a token -> id map, and the merges from pairs of
// token strings.
Tokenizer assemble(const std::vector<std::pair<std::string, int64_t>>& vocab_entries,
                   const std::vector<std::pair<std::string, std::string>>& merge_pairs,
                   std::vector<std::pair<std::string, uint32_t>> specials,
                   const std::string& source) {
    int64_t max_id = -1;
    for (const auto& e : vocab_entries) max_id = std::max(max_id, e.second);
    for (const auto& s : specials) max_id = std::max<int64_t>(max_id, s.second);
    // Ids must be dense, so the largest id is below the number of entries;
    // checking first also keeps a hostile id from sizing a huge allocation.
    const int64_t entries = static_cast<int64_t>(vocab_entries.size() + specials.size());
    if (max_id < 0 || max_id >= entries) {
        bad(source, fmt::format("vocabulary is empty or has id {} with only {} tokens (ids must "
                                "be dense from 0)",
                                max_id, entries));
    }
    std::vector<std::string> vocab(static_cast<size_t>(max_id + 1));
    std::vector<bool> filled(vocab.size(), false);
    std::unordered_map<std::string, uint32_t> by_string;
    for (const auto& [tok, id] : vocab_entries) {
        if (id < 0) bad(source, fmt::format("model.vocab['{}'] has negative id {}", tok, id));
        if (filled[id] && vocab[id] != tok) {
            bad(source, fmt::format("id {} is given to two tokens", id));
        }
        vocab[id] = tok;
        filled[id] = true;
        by_string.emplace(tok, static_cast<uint32_t>(id));
    }
    for (const auto& [text, id] : specials) {
        if (!filled[id]) {
            vocab[id] = text;
            filled[id] = true;
        }
    }
    for (size_t id = 0; id < vocab.size(); ++id) {
        if (!filled[id]) bad(source, fmt::format("no token has id {} (ids must be dense)", id));
    }
    std::vector<Merge> merges;
    merges.reserve(merge_pairs.size());
    for (size_t r = 0; r < merge_pairs.size(); ++r) {
        const auto& [a, b] = merge_pairs[r];
        auto ia = by_string.find(a), ib = by_string.find(b), ic = by_string.find(a + b);
        if (ia == by_string.end() || ib == by_string.end() || ic == by_string.end()) {
            bad(source, fmt::format("merge {} refers to a token missing from the vocabulary", r));
        }
        merges.push_back({ia->second, ib->second, ic->second});
    }
    try {
        return Tokenizer(std::move(vocab), std::move(merges), std::move(specials));
    } catch (const DataError& e) {
        bad(source, e.what());
    }
}

}  // namespace

std::string bytes_to_unicode(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char b : bytes) put_utf8(byte_map().to_cp[b], out);
    return out;
}

bool unicode_to_bytes(std::string_view text, std::string* bytes) {
    bytes->clear();
    const auto& m = byte_map().from_cp;
    for (size_t i = 0; i < text.size();) {
        const auto b0 = static_cast<unsigned char>(text[i]);
        uint32_t cp;
        if (b0 < 0x80) {
            cp = b0;
            i += 1;
        } else if ((b0 & 0xE0) == 0xC0 && i + 1 < text.size()) {
            cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
            i += 2;
        } else {
            return false;
        }
        auto it = m.find(cp);
        if (it == m.end()) return false;
        *bytes += static_cast<char>(it->second);
    }
    return true;
}

Tokenizer Tokenizer::from_json_text(std::string_view text, const std::string& source) {
    const nlohmann::json j = parse_json(text, source);
    try {
        if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
            bad(source, "no 'model' object; expected a Hugging Face tokenizer.json");
        }
        const auto& model = j["model"];
        const std::string type = model.value("type", "BPE");
        if (type != "BPE")
            bad(source, fmt::format("model.type is '{}', only BPE is supported", type));
        if (!model.contains("vocab") || !model["vocab"].is_object()) {
            bad(source, "model.vocab is missing or not an object");
        }
        if (!model.contains("merges") || !model["merges"].is_array()) {
            bad(source, "model.merges is missing or not an array");
        }
        std::vector<std::pair<std::string, std::string>> merges;
        for (size_t r = 0; r < model["merges"].size(); ++r) {
            const auto& m = model["merges"][r];
            std::string a, b;
            if (m.is_string()) {  // "a b" (tokenizers < 0.20)
                const std::string s = m.get<std::string>();
                const size_t sp = s.find(' ');
                if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
                    bad(source, fmt::format("model.merges[{}] = '{}' is not two tokens", r, s));
                }
                a = s.substr(0, sp);
                b = s.substr(sp + 1);
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                a = m[0].get<std::string>();
                b = m[1].get<std::string>();
            } else {
                bad(source, fmt::format("model.merges[{}] is neither \"a b\" nor [a, b]", r));
            }
            merges.emplace_back(token_from_json(a, source, fmt::format("model.merges[{}]", r)),
                                token_from_json(b, source, fmt::format("model.merges[{}]", r)));
        }
        std::vector<std::pair<std::string, uint32_t>> specials;
        std::map<int64_t, std::string> special_ids;
        if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
            for (const auto& t : j["added_tokens"]) {
                const std::string content = t.at("content").get<std::string>();
                const int64_t id = t.at("id").get<int64_t>();
                if (id < 0) bad(source, fmt::format("added token '{}' has negative id", content));
                specials.emplace_back(content, static_cast<uint32_t>(id));
                special_ids[id] = content;
            }
        }
        std::vector<std::pair<std::string, int64_t>> vocab;
        vocab.reserve(model["vocab"].size());
        for (const auto& [tok, id] : model["vocab"].items()) {
            if (!id.is_number_integer())
                bad(source, fmt::format("model.vocab['{}'] is not an integer", tok));
            const int64_t v = id.get<int64_t>();
            auto sp = special_ids.find(v);
            if (sp != special_ids.end() && sp->second == tok) {
                vocab.emplace_back(tok, v);  // a special token's text is stored raw
            } else {
                vocab.emplace_back(token_from_json(tok, source, "model.vocab"), v);
            }
        }
        return assemble(vocab, merges, std::move(specials), source);
    } catch (const nlohmann::json::exception& e) {
        bad(source, fmt::format("unexpected structure: {}", e.what()));
    }
}

Tokenizer Tokenizer::load(const std::string& path) {
    return from_json_text(read_file(path, kMaxTokenizerBytes, "tokenizer file"), path);
}

Tokenizer Tokenizer::load_gpt2(const std::string& vocab_json, const std::string& merges_txt) {
    const nlohmann::json j =
        parse_json(read_file(vocab_json, kMaxTokenizerBytes, "vocabulary file"), vocab_json);
    if (!j.is_object()) bad(vocab_json, "expected a JSON object of token -> id");
    std::vector<std::pair<std::string, int64_t>> vocab;
    std::vector<std::pair<std::string, uint32_t>> specials;
    for (const auto& [tok, id] : j.items()) {
        if (!id.is_number_integer()) bad(vocab_json, fmt::format("'{}' has no integer id", tok));
        // GPT-2's one special token is stored raw; every other token uses the byte map.
        if (tok == "<|endoftext|>") {
            specials.emplace_back(tok, id.get<uint32_t>());
            vocab.emplace_back(tok, id.get<int64_t>());
        } else {
            vocab.emplace_back(token_from_json(tok, vocab_json, "vocab"), id.get<int64_t>());
        }
    }
    const std::string text = read_file(merges_txt, kMaxTokenizerBytes, "merges file");
    std::vector<std::pair<std::string, std::string>> merges;
    size_t line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || line.rfind("#version", 0) == 0) continue;
        const size_t sp = line.find(' ');
        if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
            bad(merges_txt, fmt::format("line {}: '{}' is not two tokens", line_no, line));
        }
        const std::string where = fmt::format("line {}", line_no);
        merges.emplace_back(token_from_json(line.substr(0, sp), merges_txt, where),
                            token_from_json(line.substr(sp + 1), merges_txt, where));
    }
    return assemble(vocab, merges, std::move(specials), vocab_json + " + " + merges_txt);
}

std::string Tokenizer::to_json_text() const {
    using ojson = nlohmann::ordered_json;
    ojson j;
    j["version"] = "1.0";
    j["truncation"] = nullptr;
    j["padding"] = nullptr;
    ojson added = ojson::array();
    std::vector<bool> is_special(vocab_.size(), false);
    for (const auto& [text, id] : specials_) {
        is_special[id] = true;
        added.push_back({{"id", id},
                         {"content", text},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
    }
    j["added_tokens"] = added;
    j["normalizer"] = nullptr;
    const ojson byte_level = {{"type", "ByteLevel"},
                              {"add_prefix_space", false},
                              {"trim_offsets", true},
                              {"use_regex", true}};
    j["pre_tokenizer"] = byte_level;
    j["post_processor"] = nullptr;
    j["decoder"] = byte_level;
    // Appended straight to ordered_json's underlying vector: its operator[]
    // searches linearly, which is quadratic over a 50k vocabulary. Keys are
    // unique because token byte strings are.
    ojson vocab = ojson::object();
    auto& entries = vocab.get_ref<ojson::object_t&>();
    entries.reserve(vocab_.size());
    for (uint32_t id = 0; id < vocab_.size(); ++id) {
        entries.std::vector<ojson::object_t::value_type>::emplace_back(
            is_special[id] ? vocab_[id] : bytes_to_unicode(vocab_[id]), ojson(id));
    }
    ojson merges = ojson::array();
    for (const auto& m : merges_) {
        merges.push_back(bytes_to_unicode(vocab_[m.left]) + " " +
                         bytes_to_unicode(vocab_[m.right]));
    }
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", merges}};
    return j.dump(1) + "\n";
}

void Tokenizer::save(const std::string& path) const { write_file_atomic(path, to_json_text()); }

uint64_t Tokenizer::hash() const {
    std::string buf;
    auto put32 = [&](uint32_t v) { buf.append(reinterpret_cast<const char*>(&v), 4); };
    put32(static_cast<uint32_t>(vocab_.size()));
    for (const auto& t : vocab_) {
        put32(static_cast<uint32_t>(t.size()));
        buf += t;
    }
    for (const auto& m : merges_) {
        put32(m.left);
        put32(m.right);
        put32(m.result);
    }
    for (const auto& [text, id] : specials_) {
        put32(id);
        put32(static_cast<uint32_t>(text.size()));
        buf += text;
    }
    return xxhash64(buf.data(), buf.size());
}

}  // namespace apiary::data
