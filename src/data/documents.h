#pragma once
// Reading corpora as a stream of documents, in bounded memory.
//
// Formats, by file name:
//   *.jsonl, *.json       one JSON object per line; the document is one field
//   anything else         plain text; the whole file is one document
//   *.zst suffix          zstd-compressed, decompressed as it streams
//                         (e.g. corpus.jsonl.zst, book.txt.zst)
//
// A plain-text document may be larger than memory: it arrives in blocks cut
// at pre-token boundaries (pretokenize.h), so encoding blocks one by one gives
// the same tokens as encoding the whole text.

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace apiary::data {

struct DocumentOptions {
    std::string jsonl_field = "text";
    size_t block_bytes = 8u << 20;  // plain-text block size
};

// fn(text, starts_document): pieces in file order. A JSONL line that is not
// JSON, or lacks the field, is a DataError naming the file and line.
using PieceFn = std::function<void(std::string_view text, bool starts_document)>;
void for_each_piece(const std::string& path, const DocumentOptions& options, const PieceFn& fn);

// Pieces without document structure, e.g. for tokenizer training.
void for_each_block(const std::string& path, const DocumentOptions& options,
                    const std::function<void(std::string_view)>& fn);

}  // namespace apiary::data
