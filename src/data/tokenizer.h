#pragma once
// Byte-level BPE tokenizer (GPT-2 style).
//
//   Tokenizer tok = Tokenizer::load("tokenizer.json");   // or load_gpt2(vocab, merges)
//   std::vector<uint32_t> ids = tok.encode(text);          // multithreaded for big inputs
//   std::string bytes = tok.decode(ids);                   // decode(encode(b)) == b, any bytes
//
// Ids 0..255 need not be the raw bytes: every token is a byte string, and the
// vocabulary maps ids to those strings (GPT-2's own ids are permuted). A merge
// list ranks pairs of ids; encoding a pre-token merges its lowest-ranked
// adjacent pair first, leftmost on ties, exactly as Hugging Face's BPE model.
// Special tokens (e.g. `<|endoftext|>`) are matched literally before
// pre-tokenization and never merge with their neighbours.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace apiary::data {

struct Merge {
    uint32_t left, right, result;
};

class Tokenizer {
  public:
    Tokenizer() = default;
    // vocab[i] is the byte string of id i; every single byte must occur in
    // it. merges are in rank order. specials are (text, id) with id < vocab size.
    Tokenizer(std::vector<std::string> vocab, std::vector<Merge> merges,
              std::vector<std::pair<std::string, uint32_t>> specials);

    // Hugging Face tokenizer.json (BPE model, ByteLevel pre-tokenizer).
    static Tokenizer load(const std::string& path);
    static Tokenizer from_json_text(std::string_view text, const std::string& source);
    // GPT-2's vocab.json (a.k.a. encoder.json) + merges.txt (a.k.a. vocab.bpe).
    static Tokenizer load_gpt2(const std::string& vocab_json, const std::string& merges_txt);
    void save(const std::string& path) const;  // tokenizer.json, atomically
    std::string to_json_text() const;

    // Encodes any bytes. With allow_special, literal special-token text
    // becomes its id; without, it is encoded as ordinary text.
    std::vector<uint32_t> encode(std::string_view text, bool allow_special = true,
                                 int num_threads = 0) const;
    void encode_append(std::string_view text, std::vector<uint32_t>& out,
                       bool allow_special = true) const;
    std::string decode(const std::vector<uint32_t>& ids) const;
    void decode_append(const uint32_t* ids, size_t n, std::string& out) const;

    size_t vocab_size() const { return vocab_.size(); }
    const std::string& token_bytes(uint32_t id) const { return vocab_[id]; }
    const std::vector<Merge>& merges() const { return merges_; }
    const std::vector<std::pair<std::string, uint32_t>>& specials() const { return specials_; }
    // Id of a special token; throws DataError naming it if absent.
    uint32_t special_id(const std::string& text) const;
    bool has_special(const std::string& text) const;
    // xxhash64 of the vocabulary, merges and special tokens: shards record it
    // so a loader can refuse shards made with another tokenizer.
    uint64_t hash() const;

    // Encodes one pre-token with a per-caller cache; the building block for
    // encode() and for streaming encoders that keep their own cache.
    class Encoder {
      public:
        explicit Encoder(const Tokenizer& tok) : tok_(&tok) {}
        void encode(std::string_view text, std::vector<uint32_t>& out, bool allow_special);
        void encode_ordinary(std::string_view text, std::vector<uint32_t>& out);
        void encode_piece(std::string_view piece, std::vector<uint32_t>& out);

      private:
        void merge_short(std::string_view piece, std::vector<uint32_t>& out);
        void merge_long(std::string_view piece, std::vector<uint32_t>& out);
        const Tokenizer* tok_;
        std::unordered_map<std::string, std::vector<uint32_t>> cache_;
        std::vector<uint32_t> ids_, ranks_;
    };

  private:
    void build_index();
    // (rank, result) of merging ids a then b, or rank == UINT32_MAX.
    std::pair<uint32_t, uint32_t> merge_of(uint32_t a, uint32_t b) const {
        auto it = pair_rank_.find((uint64_t(a) << 32) | b);
        if (it == pair_rank_.end()) return {UINT32_MAX, 0};
        return {it->second, merges_[it->second].result};
    }

    std::vector<std::string> vocab_;
    std::vector<Merge> merges_;
    std::vector<std::pair<std::string, uint32_t>> specials_;
    uint32_t byte_id_[256] = {};
    std::unordered_map<uint64_t, uint32_t> pair_rank_;
};

// GPT-2's reversible map from bytes to printable Unicode characters, used for
// token strings in vocab.json / tokenizer.json (e.g. a space is "Ġ").
std::string bytes_to_unicode(std::string_view bytes);
// Inverse; returns false if a character is not in the map.
bool unicode_to_bytes(std::string_view text, std::string* bytes);

}  // namespace apiary::data
