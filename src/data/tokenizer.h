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
        // A pre-token of up to kSlotBytes bytes that encodes to at most
        // kSlotIds ids, in one 64-byte line; len 0 marks an empty slot.
        static constexpr size_t kSlotBytes = 22, kSlotIds = 10;
        struct Slot {
            uint8_t len = 0, count = 0;
            char bytes[kSlotBytes];
            uint32_t ids[kSlotIds];
        };
        // Heap entry of merge_long: a candidate merge at a left position.
        struct Candidate {
            uint32_t rank, pos, left, right;
        };
        void merge_short(std::string_view piece, std::vector<uint32_t>& out);
        void merge_long(std::string_view piece, std::vector<uint32_t>& out);
        void remember(std::string_view piece, const uint32_t* ids, size_t count);

        const Tokenizer* tok_;
        // Direct-mapped cache of pre-tokens: no allocation per entry, and a
        // miss costs one line. Grows from small (an encoder may live for one
        // short string) while it keeps missing.
        std::vector<Slot> cache_;
        size_t cache_misses_ = 0;
        // merge_long's scratch, kept between calls.
        std::vector<uint32_t> id_, next_, prev_;
        std::vector<Candidate> heap_;
    };

  private:
    // Open addressing over (left, right) id pairs in 8-byte slots (a table
    // of 1 MiB for GPT-2's 50000 merges, which stays in L2): one multiply and
    // usually one cache line per lookup, where std::unordered_map costs a
    // division and a pointer chase. Lookups are most of the work of encoding
    // a pre-token the cache does not hold. A slot packs left (22 bits),
    // right and rank (21 bits each), so ids must stay below kMaxVocab.
    class PairTable {
      public:
        static constexpr uint32_t kMaxVocab = (1u << 21) - 1;
        // A pair listed twice keeps its first (lowest) rank, as in Hugging Face.
        void build(const std::vector<Merge>& merges);
        // The rank of merging a then b, or UINT32_MAX.
        uint32_t find(uint32_t a, uint32_t b) const {
            const uint64_t key = (uint64_t(a) << 21) | b;
            for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;; i = (i + 1) & mask_) {
                const uint64_t v = slots_[i];
                if ((v >> 21) == key) return uint32_t(v & kRankMask);
                if (v == kEmpty) return UINT32_MAX;
            }
        }
        // The id a merge of that rank makes. Most vocabularies (GPT-2's, and
        // those apiary trains) number merged tokens in rank order: then no
        // memory is read.
        uint32_t result(uint32_t rank) const {
            return sequential_ ? rank + first_result_ : results_[rank];
        }
        // The rank of merging the tokens of bytes a and b (a dense table:
        // every pre-token starts as bytes, so these lookups are a third of all).
        uint32_t find_bytes(unsigned char a, unsigned char b) const {
            return byte_pairs_[(size_t(a) << 8) | b];
        }
        void build_bytes(const uint32_t* byte_id);

      private:
        static constexpr uint64_t kEmpty = ~0ull;  // ids below kMaxVocab never make it
        static constexpr uint64_t kRankMask = (1u << 21) - 1;
        std::vector<uint64_t> slots_;
        size_t mask_ = 0;
        int shift_ = 63;
        bool sequential_ = false;
        uint32_t first_result_ = 0;
        std::vector<uint32_t> results_;
        std::vector<uint32_t> byte_pairs_;  // 256 x 256
    };

    void build_index();

    std::vector<std::string> vocab_;
    std::vector<Merge> merges_;
    std::vector<std::pair<std::string, uint32_t>> specials_;
    uint32_t byte_id_[256] = {};
    PairTable pairs_;
};

// GPT-2's reversible map from bytes to printable Unicode characters, used for
// token strings in vocab.json / tokenizer.json (e.g. a space is "Ġ").
std::string bytes_to_unicode(std::string_view bytes);
// Inverse; returns false if a character is not in the map.
bool unicode_to_bytes(std::string_view text, std::string* bytes);

}  // namespace apiary::data
