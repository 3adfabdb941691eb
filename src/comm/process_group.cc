#include "comm/process_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace apiary::comm {

void wait_all(const std::vector<WorkHandle>& works) {
    for (const auto& w : works) {
        if (w) w->wait();
    }
}

std::string format_ranks(const std::vector<int>& ranks) {
    std::string out;
    for (size_t i = 0; i < ranks.size();) {
        size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
        if (!out.empty()) out += ",";
        out += j == i ? fmt::format("{}", ranks[i])
                      : fmt::format("{}{}{}", ranks[i], j == i + 1 ? "," : "-", ranks[j]);
        i = j + 1;
    }
    return out;
}

namespace {

// Work made of point-to-point parts (the default all_to_all_v).
class PartsWork : public Work {
  public:
    PartsWork(Fingerprint fp, std::vector<WorkHandle> parts) : Work(fp), parts_(std::move(parts)) {}
    bool test() override {
        for (auto& w : parts_) {
            if (!w->test()) return false;
        }
        return true;
    }
    void wait() override { wait_all(parts_); }

  private:
    std::vector<WorkHandle> parts_;
};

}  // namespace

void ProcessGroup::check_counts(const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& recv_counts) const {
    if (int(send_counts.size()) != size_ || int(recv_counts.size()) != size_) {
        throw CommError(fmt::format("{}: all_to_all_v takes one count per rank ({}), got {} send "
                                    "and {} receive counts",
                                    describe(), size_, send_counts.size(), recv_counts.size()));
    }
    for (int r = 0; r < size_; ++r) {
        if (send_counts[size_t(r)] < 0 || recv_counts[size_t(r)] < 0) {
            throw CommError(fmt::format("{}: all_to_all_v with a negative count for rank {}",
                                        describe(), r));
        }
    }
}

WorkHandle ProcessGroup::all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                                      void* recv, const std::vector<int64_t>& recv_counts,
                                      DType dtype, Tag tag) {
    check_counts(send_counts, recv_counts);
    const size_t es = core::dtype_size(dtype);
    const char* s = static_cast<const char*>(send);
    char* d = static_cast<char*>(recv);
    std::vector<WorkHandle> parts;
    int64_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
        const int64_t sc = send_counts[size_t(r)], rc = recv_counts[size_t(r)];
        if (r == rank_) {
            if (sc != rc) {
                throw CommError(fmt::format("{}: all_to_all_v sends {} elements to itself but "
                                            "expects {}",
                                            describe(), sc, rc));
            }
            if (sc > 0) std::memcpy(d + size_t(ro) * es, s + size_t(so) * es, size_t(sc) * es);
        } else {
            if (rc > 0) parts.push_back(this->recv(d + size_t(ro) * es, rc, dtype, r, tag));
            if (sc > 0) parts.push_back(this->send(s + size_t(so) * es, sc, dtype, r, tag));
        }
        so += sc;
        ro += rc;
    }
    return std::make_shared<PartsWork>(Fingerprint{CollOp::all_to_all_v, dtype, 0, tag},
                                       std::move(parts));
}

std::string ProcessGroup::describe() const {
    return fmt::format("{} (world ranks {})", name_, format_ranks(world_ranks_));
}

void check_config_hash(ProcessGroup& world, uint64_t hash) {
    // Hashes travel as raw bytes (two f32 slots each); all_gather does no arithmetic.
    static_assert(sizeof(uint64_t) == 2 * sizeof(float));
    std::vector<uint64_t> all(size_t(world.size()));
    world.all_gather(&hash, all.data(), 2, DType::f32, Tag{"config_hash", 0})->wait();
    std::vector<int> differ;
    size_t first = 0;
    for (int r = 0; r < world.size(); ++r) {
        if (all[size_t(r)] == all[0]) continue;
        if (differ.empty()) first = size_t(r);
        differ.push_back(world.world_ranks()[size_t(r)]);
    }
    if (differ.empty()) return;
    throw CommError(fmt::format(
        "config differs between ranks: {} {} {} config hash {:016x} but rank {} has {:016x} "
        "(seen on rank {}); start every rank with the same config file and --set flags",
        differ.size() == 1 ? "rank" : "ranks", format_ranks(differ),
        differ.size() == 1 ? "has" : "have (the first)", all[first], world.world_ranks()[0], all[0],
        world.world_ranks()[size_t(world.rank())]));
}

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine) {
    const int n = group.size();
    std::vector<int64_t> lengths(static_cast<size_t>(n));
    int64_t len = int64_t(mine.size());
    group.all_gather(&len, lengths.data(), 1, DType::i64, {"string_lengths", 0})->wait();
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    // Sent as f32 words: the collectives move typed elements.
    const size_t words = size_t(std::max<int64_t>((longest + 3) / 4, 1));
    std::vector<float> send(words, 0.0f), recv(words * size_t(n));
    std::memcpy(send.data(), mine.data(), mine.size());
    group.all_gather(send.data(), recv.data(), int64_t(words), DType::f32, {"strings", 0})->wait();
    std::vector<std::string> out;
    for (int r = 0; r < n; ++r) {
        const char* p = reinterpret_cast<const char*>(recv.data() + size_t(r) * words);
        out.emplace_back(p, size_t(lengths[size_t(r)]));
    }
    return out;
}

void ProcessGroup::check_reducible(DType dt, ReduceOp op, bool elementwise) const {
    const bool bulk = dt == DType::f32 || dt == DType::bf16;
    const bool ok = elementwise ? (bulk || ((dt == DType::i64 || dt == DType::f64) &&
                                            (op != ReduceOp::avg || dt == DType::f64)))
                                : (bulk && op != ReduceOp::max);
    if (!ok) {
        throw CommError(
            fmt::format("{}: {} {} is not supported (all_reduce: f32 and bf16 with "
                        "any op, i64 and f64 with sum and max, f64 avg; "
                        "reduce_scatter: f32 and bf16 sums)",
                        name(), reduce_name(op), core::dtype_name(dt)));
    }
}

void ProcessGroup::check_peer(int r) const {
    if (r < 0 || r >= size()) {
        throw CommError(fmt::format("{}: peer rank {} is outside 0..{}", name(), r, size() - 1));
    }
}

}  // namespace apiary::comm
