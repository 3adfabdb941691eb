#pragma once
// Names to ranges of a flat buffer. Parameters, gradients and optimizer state
// share one layout, so a name's offset is valid in all of them; all-reduce
// buckets and ZeRO shards are ranges of the same buffers, and checkpoints
// store tensors by global name (DESIGN.md, "Flat parameter buffers").
//
// Under tensor parallelism an entry is this rank's part of a global tensor:
// the concatenation, along one dimension, of pieces of it (whole heads of
// the fused q|k|v matrix are three row ranges of GPT-2's c_attn). Every
// element of the local tensor knows its place in the global one, which is
// what layout-independent initialisation and resharding checkpoints use.

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/placement.h"

namespace apiary::model {

struct Shard {
    int dim = -1;  // -1: not split (the local tensor is the global one)
    std::vector<std::pair<int64_t, int64_t>> pieces;  // (global start, length) along dim
};

// How a tensor starts (GPT-2's initialisation): N(0, 0.02), the output
// projections N(0, 0.02 / sqrt(2 L)), biases 0, norm weights 1.
enum class Init : uint8_t { normal, normal_residual, zeros, ones };

struct ParamInfo {
    std::string name;            // global (Hugging Face-style) name, e.g. "h.3.attn.c_attn.weight"
    int64_t offset = 0;          // in elements, into the flat buffers
    std::vector<int64_t> shape;  // this rank's shape
    bool decay = true;           // AdamW weight decay (off for norms and biases)
    int layer = -1;              // transformer block, -1 outside the blocks
    std::vector<int64_t> global_shape;  // the whole tensor's shape
    Shard shard;
    // The gradient is a partial sum over the tensor-parallel ranks (norm
    // weights and positions under sequence parallelism): all-reduced there.
    bool tp_partial_grad = false;
    // The last pipeline stage's copy of a tied embedding: same values as the
    // first stage's, gradients summed across the two.
    bool tied_copy = false;
    // A routed expert's weight (MoE blocks): under expert parallelism held
    // by the dp / ep ranks of one expert shard only, reduced over those.
    bool expert = false;
    Init init = Init::normal;

    int64_t numel() const;
    int64_t global_numel() const;
    bool split() const { return shard.dim >= 0; }
    // Its place in the global tensor (core/placement.h).
    core::Placement placement() const;
};

class ParamRegistry {
  public:
    // Appends a tensor. The next tensor starts on a 16-float (64-byte) boundary
    // unless pad_after is false: then it follows with no gap, so consecutive
    // tensors (q, k, v) form one matrix for a fused matmul. An empty
    // global_shape means the tensor is not split.
    ParamInfo& add(const std::string& name, std::vector<int64_t> shape, bool decay, int layer,
                   bool pad_after = true, std::vector<int64_t> global_shape = {}, Shard shard = {});
    const ParamInfo& get(const std::string& name) const;  // throws if unknown
    const ParamInfo* find(const std::string& name) const;
    int index_of(const std::string& name) const;  // -1 if unknown
    // Pads the buffer so that the next tensor starts on a multiple of
    // `multiple` elements (unit boundaries, see Transformer::units()).
    void align(int64_t multiple);
    const std::vector<ParamInfo>& entries() const { return entries_; }
    std::vector<ParamInfo>& entries() { return entries_; }
    int64_t total() const { return total_; }  // buffer length incl. padding
    int64_t num_params() const;               // sum of local numel, no padding

  private:
    std::vector<ParamInfo> entries_;
    std::unordered_map<std::string, int> index_;
    int64_t total_ = 0;
};

// The parameter indices of one transformer block (-1: none, e.g. a Llama
// block's biases).
struct BlockHandles {
    int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
    int ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, fc2_w = -1, fc2_b = -1;
};
// Block l's name prefix: GPT-2's "h.{l}." (gpt2) or Llama's
// "model.layers.{l}.".
std::string block_prefix(bool gpt2, int l);
// Block l's dense parameters in r, by those names (-1 where r has none).
BlockHandles block_handles(const ParamRegistry& r, bool gpt2, int l);

}  // namespace apiary::model
