#pragma once
// Hang forensics. Each rank records, per process group, the call it is in and
// its last completed calls (GroupMonitor). When a call exceeds comm.timeout_s,
// the ranks exchange these records (over a side channel, since the main
// communicator is blocked) and diagnose() turns them into one line naming the
// rank that is behind and where, e.g.
//   rank 3 is at all_reduce #1043 bucket 7 (done 12.0 s ago, has not called
//   #1044) while ranks 0-2 wait in all_reduce #1044 bucket 8 for 300.0 s
// or, when ranks called different collectives under one sequence number,
//   mismatch at #5: rank 0 calls all_reduce #5 bucket 5 (f32 x 1024) while
//   rank 1 calls all_reduce #5 bucket 6 (f32 x 1024)

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/types.h"

namespace apiary::comm {

// CLOCK_MONOTONIC_COARSE: a few milliseconds of resolution, which is all
// a watchdog with timeouts in seconds needs, for about 7 ns a read instead of
// 30-50 ns for steady_clock on this kind of VM. It is read on every
// collective, and a small all-reduce takes about a microsecond.
struct CoarseClock {
    using duration = std::chrono::nanoseconds;
    using rep = duration::rep;
    using period = duration::period;
    using time_point = std::chrono::time_point<CoarseClock>;
    static constexpr bool is_steady = true;
    static time_point now() noexcept;
};
using Clock = CoarseClock;

// CoarseClock's time in nanoseconds as a thread that runs anyway (the MPI
// watchdog, every 0.1 s or faster) last saw it: one load per call where the
// monitor's two clock reads per collective cost a few nanoseconds each, about
// a tenth of what apiary adds to a small all-reduce. Stale by at most one
// tick; without a ticking thread it reads the clock.
struct Ticker {
    static int64_t now_ns() noexcept;
    static void tick() noexcept;   // the ticking thread, periodically
    static void start() noexcept;  // a ticking thread begins (counted)
    static void stop() noexcept;   // ... and ends
};

// One rank's view of one group at one moment.
struct GroupSnapshot {
    int world_rank = -1;
    bool answered = true;  // false: the rank sent nothing (dead, or stuck outside apiary)
    std::optional<Fingerprint> in_flight;  // the call it waits in, if any
    double in_flight_s = 0;                // for how long
    std::optional<Fingerprint> last_done;  // its last completed call
    double idle_s = 0;                     // since last_done completed
    std::vector<Fingerprint> recent;       // last completed calls, oldest first
};

// Per rank and group: what is in flight and what completed recently.
// begin() and end() are called by one thread at a time (the one executing the
// group's calls) on every collective, so they take no lock: a seqlock lets
// the watchdog's snapshot() read a consistent state without slowing them
// (a small all-reduce takes about half a microsecond; two mutexes per call
// cost a tenth of that). snapshot() may run on any thread at any time.
class GroupMonitor {
  public:
    static constexpr size_t kMinHistory = 16;
    // history: completed calls kept (at least kMinHistory). The MPI backend
    // keeps as many as lie between two match checks, so that a mismatch the
    // check finds is still in every rank's history when they compare.
    GroupMonitor(std::string name, std::vector<int> world_ranks, int my_world_rank,
                 size_t history = kMinHistory);

    void begin(const Fingerprint& fp);
    void end(const Fingerprint& fp);
    GroupSnapshot snapshot() const;
    // Seconds the current call has been in flight (0 if none).
    double in_flight_seconds() const;

    const std::string& name() const { return name_; }
    const std::vector<int>& world_ranks() const { return world_ranks_; }
    // Same for every member of the group on every rank: hash of name and members.
    uint64_t id() const { return id_; }

  private:
    // A Fingerprint in relaxed atomics, so that a reader racing a writer is
    // not undefined behaviour (the seqlock discards what it read then).
    struct Slot {
        std::atomic<uint64_t> seq{0};
        std::atomic<int64_t> count{0}, tag_id{-1};
        std::atomic<const char*> tag_kind{nullptr};
        std::atomic<int32_t> peer{-1};
        std::atomic<uint8_t> op{0}, dtype{0};
        void store(const Fingerprint& fp);
        Fingerprint load() const;
    };
    template <class Read>
    void read_consistent(Read&& read) const;

    std::string name_;
    std::vector<int> world_ranks_;
    int my_world_rank_;
    uint64_t id_;
    std::atomic<uint64_t> version_{0};  // odd while a writer is inside
    std::atomic<bool> in_flight_{false};
    Slot in_flight_fp_;
    std::atomic<int64_t> in_flight_since_{0};  // CoarseClock ns
    // The last history_ completed calls, a ring (no allocation per call).
    size_t history_;
    std::unique_ptr<Slot[]> done_;
    std::atomic<uint64_t> num_done_{0};
    std::atomic<int64_t> last_done_at_{0};  // CoarseClock ns
};

// One line: who is behind and where, or which ranks disagree. `members` are
// the group's ranks in group order; `group` names the group for the message.
std::string diagnose(const std::string& group, const std::vector<GroupSnapshot>& members);

// "rank 2: recent world calls: all_reduce #3 ..., all_reduce #4 ...; waits in
// all_reduce #5 ... for 3.0 s" — the per-rank dump printed on a timeout.
std::string dump_line(const std::string& group, const GroupSnapshot& s);

// Serialisation for the side channel (the tag kind is interned on reading).
nlohmann::json to_json(const GroupSnapshot& s);
GroupSnapshot snapshot_from_json(const nlohmann::json& j);
nlohmann::json to_json(const Fingerprint& fp);
Fingerprint fingerprint_from_json(const nlohmann::json& j);

}  // namespace apiary::comm
