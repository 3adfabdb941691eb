#pragma once
// Names to ranges of a flat buffer. Parameters, gradients and optimizer state
// share one layout, so a name's offset is valid in all of them; all-reduce
// buckets and ZeRO shards are ranges of the same buffers, and checkpoints
// store tensors by name (DESIGN.md, "Flat parameter buffers").

#include <cstdint>
#include <string>
#include <vector>

namespace apiary::model {

struct ParamInfo {
    std::string name;             // Hugging Face-style name, e.g. "h.3.attn.c_attn.weight"
    int64_t offset = 0;           // in elements, into the flat buffers
    std::vector<int64_t> shape;   // global shape
    bool decay = true;            // AdamW weight decay (off for norms and biases)
    int layer = -1;               // transformer block, -1 outside the blocks
    int64_t numel() const;
};

class ParamRegistry {
public:
    // Appends a tensor. The next tensor starts on a 16-float (64-byte) boundary
    // unless pad_after is false: then it follows with no gap, so consecutive
    // tensors (q, k, v) form one matrix for a fused matmul.
    const ParamInfo& add(const std::string& name, std::vector<int64_t> shape, bool decay,
                         int layer, bool pad_after = true);
    const ParamInfo& get(const std::string& name) const;  // throws if unknown
    const ParamInfo* find(const std::string& name) const;
    // Pads the buffer so that the next tensor starts on a multiple of
    // `multiple` elements (unit boundaries, see Transformer::units()).
    void align(int64_t multiple);
    const std::vector<ParamInfo>& entries() const { return entries_; }
    int64_t total() const { return total_; }       // buffer length incl. padding
    int64_t num_params() const;                     // sum of numel, no padding

private:
    std::vector<ParamInfo> entries_;
    int64_t total_ = 0;
};

}  // namespace apiary::model
