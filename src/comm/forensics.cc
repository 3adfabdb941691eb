#include "comm/forensics.h"

#include <fmt/format.h>
#include <time.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "comm/process_group.h"

namespace apiary::comm {

CoarseClock::time_point CoarseClock::now() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return time_point(duration(int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec));
}

namespace {

std::atomic<int64_t> g_tick_ns{0};
std::atomic<int> g_tickers{0};

int64_t clock_ns() { return CoarseClock::now().time_since_epoch().count(); }

}  // namespace

int64_t Ticker::now_ns() noexcept {
    return g_tickers.load(std::memory_order_relaxed) > 0 ? g_tick_ns.load(std::memory_order_relaxed)
                                                         : clock_ns();
}
void Ticker::tick() noexcept { g_tick_ns.store(clock_ns(), std::memory_order_relaxed); }
void Ticker::start() noexcept {
    tick();
    g_tickers.fetch_add(1);
}
void Ticker::stop() noexcept { g_tickers.fetch_sub(1); }

namespace {

constexpr size_t kDumpCalls = 16;

// Tag kinds travel as text; keep one stable copy of each so that a Tag can
// keep pointing at it.
const char* intern(const std::string& s) {
    static std::mutex mu;
    static std::set<std::string> pool;
    std::lock_guard lock(mu);
    return pool.insert(s).first->c_str();
}

std::string ranks_word(const std::vector<int>& ranks) {
    return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", format_ranks(ranks));
}

// Where a rank stands, without timings, so that ranks in the same place
// share one phrase.
std::string where(const GroupSnapshot& s) {
    if (s.in_flight) return "wait in " + s.in_flight->describe();
    if (s.last_done) {
        return fmt::format("{} at {} (completed; has not called #{})", "is",
                           s.last_done->describe(), s.last_done->seq + 1);
    }
    return "has not made any call on this group";
}

// Ranks must agree on every call with the same sequence number, in flight or
// in their recent history. The match check may find a mismatch some calls
// after it happened (it samples, see docs/distributed.md), so the histories
// are compared too and the earliest disagreement is the one named.
std::vector<std::string> mismatches(const std::string& group,
                                    const std::vector<const GroupSnapshot*>& answered) {
    std::map<uint64_t, std::vector<std::pair<const Fingerprint*, int>>> by_seq;
    uint64_t newest_in_flight = 0;
    auto add = [&](const Fingerprint& fp, int rank) {
        if (fp.op != CollOp::send && fp.op != CollOp::recv) by_seq[fp.seq].push_back({&fp, rank});
    };
    for (const auto* m : answered) {
        for (const auto& fp : m->recent) add(fp, m->world_rank);
        if (m->in_flight) {
            add(*m->in_flight, m->world_rank);
            newest_in_flight = std::max(newest_in_flight, m->in_flight->seq);
        }
    }
    for (const auto& [seq, entries] : by_seq) {
        std::vector<std::pair<Fingerprint, std::vector<int>>> calls;
        for (const auto& [fp, rank] : entries) {
            auto it = std::find_if(calls.begin(), calls.end(),
                                   [&](const auto& c) { return c.first.same_call(*fp); });
            if (it == calls.end())
                calls.push_back({*fp, {rank}});
            else
                it->second.push_back(rank);
        }
        if (calls.size() < 2) continue;
        std::string msg = fmt::format("{}: mismatch at #{}:", group, seq);
        for (size_t i = 0; i < calls.size(); ++i) {
            msg += fmt::format(
                "{} {} {} {}", i == 0 ? "" : (i + 1 == calls.size() ? " while" : ","),
                ranks_word(calls[i].second), calls[i].second.size() == 1 ? "calls" : "call",
                calls[i].first.describe());
        }
        if (newest_in_flight > seq) {
            msg += fmt::format(" (the ranks are now at #{})", newest_in_flight);
        }
        return {msg + "; every rank must issue the same collectives in the same order"};
    }
    return {};
}

// Who is behind: ranks that are not in the latest call the others wait in.
// Empty if no answering rank waits in a call.
std::string who_is_behind(const std::string& group,
                          const std::vector<const GroupSnapshot*>& answered) {
    uint64_t newest = 0;
    bool any_waiting = false;
    double longest_wait = 0;
    for (const auto* m : answered) {
        if (m->in_flight) {
            newest = std::max(newest, m->in_flight->seq);
            any_waiting = true;
            longest_wait = std::max(longest_wait, m->in_flight_s);
        }
    }
    if (!any_waiting) return "";
    {
        std::vector<std::pair<std::string, std::vector<int>>> behind, waiting;
        auto add = [](auto& list, const std::string& key, int rank) {
            auto it = std::find_if(list.begin(), list.end(),
                                   [&](const auto& e) { return e.first == key; });
            if (it == list.end())
                list.push_back({key, {rank}});
            else
                it->second.push_back(rank);
        };
        for (const auto* m : answered) {
            const bool waits_newest = m->in_flight && m->in_flight->seq == newest;
            add(waits_newest ? waiting : behind, where(*m), m->world_rank);
        }
        std::string msg = group + ": ";
        if (behind.empty()) {
            msg += fmt::format("all answering ranks wait in {} for {:.1f} s",
                               waiting.front().first.substr(8), longest_wait);
        } else {
            for (size_t i = 0; i < behind.size(); ++i) {
                const bool one = behind[i].second.size() == 1;
                std::string w = behind[i].first;
                if (!one && w.rfind("is ", 0) == 0) w = "are " + w.substr(3);
                if (!one && w.rfind("has ", 0) == 0) w = "have " + w.substr(4);
                if (one && w.rfind("wait ", 0) == 0) w = "waits " + w.substr(5);
                msg += fmt::format("{}{} {}", i == 0 ? "" : "; ", ranks_word(behind[i].second), w);
            }
            for (size_t i = 0; i < waiting.size(); ++i) {
                const bool one = waiting[i].second.size() == 1;
                std::string w = waiting[i].first;
                if (one) w = "waits " + w.substr(5);
                msg += fmt::format("{} {} {}", i == 0 ? " while" : ",",
                                   ranks_word(waiting[i].second), w);
            }
            msg += fmt::format(" for {:.1f} s", longest_wait);
        }
        return msg;
    }
}

}  // namespace

GroupMonitor::GroupMonitor(std::string name, std::vector<int> world_ranks, int my_world_rank,
                           size_t history)
    : name_(std::move(name)),
      world_ranks_(std::move(world_ranks)),
      my_world_rank_(my_world_rank),
      history_(std::max(history, kMinHistory)),
      done_(new Slot[history_]) {
    std::string key = name_;
    for (int r : world_ranks_) key += fmt::format(",{}", r);
    id_ = XXH64(key.data(), key.size(), 0);
}

void GroupMonitor::Slot::store(const Fingerprint& fp) {
    constexpr auto r = std::memory_order_relaxed;
    seq.store(fp.seq, r);
    count.store(fp.count, r);
    tag_id.store(fp.tag.id, r);
    tag_kind.store(fp.tag.kind, r);
    peer.store(fp.peer, r);
    op.store(uint8_t(fp.op), r);
    dtype.store(uint8_t(fp.dtype), r);
}

Fingerprint GroupMonitor::Slot::load() const {
    constexpr auto r = std::memory_order_relaxed;
    Fingerprint fp;
    fp.seq = seq.load(r);
    fp.count = count.load(r);
    fp.tag = Tag{tag_kind.load(r), tag_id.load(r)};
    fp.peer = peer.load(r);
    fp.op = CollOp(op.load(r));
    fp.dtype = DType(dtype.load(r));
    return fp;
}

namespace {

// Against the clock itself, not the ticker: a duration is never shortened.
double seconds_since_ns(int64_t t) { return double(clock_ns() - t) * 1e-9; }

}  // namespace

// Writers (one thread at a time): version odd, fields, version even.
void GroupMonitor::begin(const Fingerprint& fp) {
    const int64_t now = Ticker::now_ns();
    const uint64_t v = version_.load(std::memory_order_relaxed);
    version_.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    in_flight_fp_.store(fp);
    in_flight_since_.store(now, std::memory_order_relaxed);
    in_flight_.store(true, std::memory_order_relaxed);
    version_.store(v + 2, std::memory_order_release);
}

void GroupMonitor::end(const Fingerprint& fp) {
    const int64_t now = Ticker::now_ns();
    const uint64_t v = version_.load(std::memory_order_relaxed);
    version_.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    const uint64_t n = num_done_.load(std::memory_order_relaxed);
    in_flight_.store(false, std::memory_order_relaxed);
    done_[n % history_].store(fp);
    num_done_.store(n + 1, std::memory_order_relaxed);
    last_done_at_.store(now, std::memory_order_relaxed);
    version_.store(v + 2, std::memory_order_release);
}

// Reader: retries until no writer was inside while it read.
template <class Read>
void GroupMonitor::read_consistent(Read&& read) const {
    while (true) {
        const uint64_t v = version_.load(std::memory_order_acquire);
        if (v & 1) {
            std::this_thread::yield();
            continue;
        }
        read();
        std::atomic_thread_fence(std::memory_order_acquire);
        if (version_.load(std::memory_order_relaxed) == v) return;
    }
}

double GroupMonitor::in_flight_seconds() const {
    double s = 0;
    read_consistent([&] {
        s = in_flight_.load(std::memory_order_relaxed)
                ? seconds_since_ns(in_flight_since_.load(std::memory_order_relaxed))
                : 0.0;
    });
    return s;
}

GroupSnapshot GroupMonitor::snapshot() const {
    GroupSnapshot s;
    read_consistent([&] {
        constexpr auto r = std::memory_order_relaxed;
        s = GroupSnapshot{};
        s.world_rank = my_world_rank_;
        if (in_flight_.load(r)) {
            s.in_flight = in_flight_fp_.load();
            s.in_flight_s = seconds_since_ns(in_flight_since_.load(r));
        }
        const uint64_t n = num_done_.load(r);
        if (n > 0) {
            s.last_done = done_[(n - 1) % history_].load();
            s.idle_s = seconds_since_ns(last_done_at_.load(r));
        }
        // Oldest first.
        for (uint64_t i = n > history_ ? n - history_ : 0; i < n; ++i) {
            s.recent.push_back(done_[i % history_].load());
        }
    });
    return s;
}

std::string diagnose(const std::string& group, const std::vector<GroupSnapshot>& members) {
    std::vector<int> silent;
    std::vector<const GroupSnapshot*> answered;
    for (const auto& m : members) {
        if (m.answered)
            answered.push_back(&m);
        else
            silent.push_back(m.world_rank);
    }
    std::vector<std::string> parts = mismatches(group, answered);
    if (parts.empty()) {
        if (std::string behind = who_is_behind(group, answered); !behind.empty()) {
            parts.push_back(behind);
        }
    }
    if (!silent.empty()) {
        parts.push_back(fmt::format("{}: {} did not answer (dead, or stuck outside apiary)", group,
                                    ranks_word(silent)));
    }
    if (parts.empty()) parts.push_back(group + ": no rank is inside a call");
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
    return out;
}

std::string dump_line(const std::string& group, const GroupSnapshot& s) {
    std::string out = fmt::format("rank {}: recent {} calls:", s.world_rank, group);
    if (s.recent.empty()) out += " none";
    // The history may hold many calls (as many as lie between two match
    // checks); the line shows the last few, the diagnosis compares them all.
    const size_t first = s.recent.size() > kDumpCalls ? s.recent.size() - kDumpCalls : 0;
    if (first > 0) out += fmt::format(" ({} earlier),", first);
    for (size_t i = first; i < s.recent.size(); ++i) {
        out += fmt::format("{} {}", i == first ? "" : ",", s.recent[i].describe());
    }
    if (s.in_flight) {
        out += fmt::format("; waits in {} for {:.1f} s", s.in_flight->describe(), s.in_flight_s);
    } else if (s.last_done) {
        out += fmt::format("; not in a call for {:.1f} s", s.idle_s);
    }
    return out;
}

nlohmann::json to_json(const Fingerprint& fp) {
    return {{"seq", fp.seq},
            {"op", int(fp.op)},
            {"dtype", int(fp.dtype)},
            {"count", fp.count},
            {"kind", fp.tag.kind ? fp.tag.kind : ""},
            {"id", fp.tag.id},
            {"peer", fp.peer}};
}

Fingerprint fingerprint_from_json(const nlohmann::json& j) {
    Fingerprint fp;
    fp.seq = j.at("seq").get<uint64_t>();
    fp.op = CollOp(j.at("op").get<int>());
    fp.dtype = DType(j.at("dtype").get<int>());
    fp.count = j.at("count").get<int64_t>();
    const std::string kind = j.at("kind").get<std::string>();
    fp.tag.kind = kind.empty() ? nullptr : intern(kind);
    fp.tag.id = j.at("id").get<int64_t>();
    fp.peer = j.at("peer").get<int32_t>();
    return fp;
}

nlohmann::json to_json(const GroupSnapshot& s) {
    nlohmann::json j = {
        {"rank", s.world_rank}, {"in_flight_s", s.in_flight_s}, {"idle_s", s.idle_s}};
    if (s.in_flight) j["in_flight"] = to_json(*s.in_flight);
    if (s.last_done) j["last_done"] = to_json(*s.last_done);
    j["recent"] = nlohmann::json::array();
    for (const auto& fp : s.recent) j["recent"].push_back(to_json(fp));
    return j;
}

GroupSnapshot snapshot_from_json(const nlohmann::json& j) {
    GroupSnapshot s;
    s.world_rank = j.at("rank").get<int>();
    s.in_flight_s = j.at("in_flight_s").get<double>();
    s.idle_s = j.at("idle_s").get<double>();
    if (j.contains("in_flight")) s.in_flight = fingerprint_from_json(j["in_flight"]);
    if (j.contains("last_done")) s.last_done = fingerprint_from_json(j["last_done"]);
    for (const auto& r : j.at("recent")) s.recent.push_back(fingerprint_from_json(r));
    return s;
}

}  // namespace apiary::comm
