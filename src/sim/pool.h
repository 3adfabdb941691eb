#pragma once
// The devices of a set of nodes, handed out all-or-nothing: a job gets
// exactly the devices it asks for, at once, or nothing (gang allocation).
// Whole free nodes go first, then the best-fitting partly free node, then
// the fullest remnants, so large jobs keep whole nodes and small ones pack.
// A node that fails or is reclaimed (spot) leaves the pool until it returns.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace apiary::sim {

class Pool {
  public:
    // Nodes [first_node, first_node + nodes) of `per_node` devices each; slot
    // ids are node * per_node + slot, unique across pools.
    Pool(int first_node, int nodes, int per_node, bool active);

    long long free() const { return free_; }
    long long active_devices() const { return active_nodes_ * per_node_; }
    int per_node() const { return per_node_; }
    int first_node() const { return first_; }
    int nodes() const { return int(free_slots_.size()); }
    bool owns(int node) const { return node >= first_ && node < first_ + nodes(); }
    bool active(int node) const { return active_[node - first_]; }
    int free_on(int node) const { return int(free_slots_[node - first_].size()); }
    // Free devices on active nodes that are partly busy: idle, but only for
    // jobs that fit beside what runs there (fragmentation).
    long long fragmented() const {
        return free_ - (long long)bucket_[size_t(per_node_)].size() * per_node_;
    }

    // Leaf switches of `nodes` nodes each (consecutive nodes; 0: none): a
    // job of whole nodes that fits in the free whole nodes of one leaf takes
    // them from the leaf with the fewest that holds it (best fit).
    void set_leaf_nodes(int nodes) { leaf_nodes_ = nodes; }
    // Appends n slot ids to `out` when n <= free(); false (nothing taken) otherwise.
    bool allocate(long long n, std::vector<int32_t>& out);
    void release(const int32_t* slots, size_t n);
    // A failed or reclaimed node leaves the pool; its free devices with it.
    void deactivate(int node);
    void activate(int node);
    // Active nodes, those with the most free devices first (spot reclaims
    // take idle nodes before busy ones).
    std::vector<int> active_by_free() const;

  private:
    void take(int local, long long k, std::vector<int32_t>& out);
    void bucket_insert(int local);
    void bucket_remove(int local);
    bool allocate_in_leaf(long long whole, std::vector<int32_t>& out);
    int first_, per_node_;
    int leaf_nodes_ = 0;
    long long free_ = 0, active_nodes_ = 0;
    std::vector<std::vector<int32_t>> free_slots_;  // per node
    std::vector<char> active_;
    std::vector<std::vector<int>> bucket_;  // bucket_[f]: active nodes with f free devices
    std::vector<int> pos_;                  // index of a node in its bucket
};

}  // namespace apiary::sim
