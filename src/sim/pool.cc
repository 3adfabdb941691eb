#include "sim/pool.h"

#include <algorithm>

#include "core/error.h"

namespace apiary::sim {

Pool::Pool(int first_node, int nodes, int per_node, bool active)
    : first_(first_node), per_node_(per_node) {
    free_slots_.resize(nodes);
    active_.assign(nodes, 0);
    pos_.assign(nodes, -1);
    bucket_.resize(per_node + 1);
    for (int i = 0; i < nodes; ++i) {
        // Slots pop from the back: lowest slot ids are handed out first.
        for (int s = per_node - 1; s >= 0; --s) {
            free_slots_[i].push_back(int32_t((first_ + i) * per_node + s));
        }
        if (active) activate(first_ + i);
    }
}

void Pool::bucket_insert(int local) {
    auto& b = bucket_[free_slots_[local].size()];
    pos_[local] = int(b.size());
    b.push_back(local);
}

void Pool::bucket_remove(int local) {
    auto& b = bucket_[free_slots_[local].size()];
    const int p = pos_[local];
    b[p] = b.back();
    pos_[b[p]] = p;
    b.pop_back();
    pos_[local] = -1;
}

void Pool::take(int local, long long k, std::vector<int32_t>& out) {
    bucket_remove(local);
    auto& fs = free_slots_[local];
    for (long long i = 0; i < k; ++i) {
        out.push_back(fs.back());
        fs.pop_back();
    }
    free_ -= k;
    bucket_insert(local);
}

bool Pool::allocate_in_leaf(long long whole, std::vector<int32_t>& out) {
    const int leaves = (nodes() + leaf_nodes_ - 1) / leaf_nodes_;
    std::vector<int> count(size_t(leaves), 0);
    for (int local : bucket_[per_node_]) ++count[size_t(local / leaf_nodes_)];
    int best = -1;
    for (int l = 0; l < leaves; ++l) {
        if (count[size_t(l)] >= whole && (best < 0 || count[size_t(l)] < count[size_t(best)]))
            best = l;
    }
    if (best < 0) return false;
    std::vector<int> mine;  // this leaf's whole free nodes, lowest first
    for (int local : bucket_[per_node_]) {
        if (local / leaf_nodes_ == best) mine.push_back(local);
    }
    std::sort(mine.begin(), mine.end());
    for (long long i = 0; i < whole; ++i) take(mine[size_t(i)], per_node_, out);
    return true;
}

bool Pool::allocate(long long n, std::vector<int32_t>& out) {
    if (n > free_ || n <= 0) return false;
    if (leaf_nodes_ > 0 && n >= per_node_ && n / per_node_ <= leaf_nodes_ &&
        allocate_in_leaf(n / per_node_, out)) {
        n -= n / per_node_ * per_node_;
    }
    while (n >= per_node_ && !bucket_[per_node_].empty()) {
        take(bucket_[per_node_].back(), per_node_, out);
        n -= per_node_;
    }
    if (n > 0 && n < per_node_) {
        for (int f = int(n); f <= per_node_; ++f) {  // best fit: the smallest that holds it
            if (!bucket_[f].empty()) {
                take(bucket_[f].back(), n, out);
                return true;
            }
        }
    }
    // Fragments: the fullest partly free nodes first.
    for (int f = per_node_; f >= 1 && n > 0; --f) {
        while (!bucket_[f].empty() && n > 0) {
            const long long k = std::min<long long>(f, n);
            take(bucket_[f].back(), k, out);
            n -= k;
        }
    }
    APIARY_CHECK(n == 0, "pool allocation short by {} devices with {} free", n, free_);
    return true;
}

void Pool::release(const int32_t* slots, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const int local = slots[i] / per_node_ - first_;
        if (active_[local]) {
            bucket_remove(local);
            ++free_;
        }
        free_slots_[local].push_back(slots[i]);
        if (active_[local]) bucket_insert(local);
    }
}

void Pool::deactivate(int node) {
    const int local = node - first_;
    if (!active_[local]) return;
    bucket_remove(local);
    free_ -= (long long)free_slots_[local].size();
    active_[local] = 0;
    --active_nodes_;
}

void Pool::activate(int node) {
    const int local = node - first_;
    if (active_[local]) return;
    active_[local] = 1;
    ++active_nodes_;
    free_ += (long long)free_slots_[local].size();
    bucket_insert(local);
}

std::vector<int> Pool::active_by_free() const {
    std::vector<int> out;
    for (int f = per_node_; f >= 0; --f) {
        for (int local : bucket_[f]) out.push_back(first_ + local);
    }
    return out;
}

}  // namespace apiary::sim
