#include "comm/forensics.h"

#include <fmt/format.h>
#include <time.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "comm/process_group.h"

namespace apiary::comm {

CoarseClock::time_point CoarseClock::now() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return time_point(duration(int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec));
}

namespace {

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

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

// Ranks inside a call with the same sequence number must agree on it; one
// message per sequence number where they do not.
std::vector<std::string> mismatches(const std::string& group,
                                    const std::vector<const GroupSnapshot*>& answered) {
    std::vector<std::string> parts;
    std::map<uint64_t, std::vector<const GroupSnapshot*>> by_seq;
    for (const auto* m : answered) {
        if (m->in_flight && m->in_flight->op != CollOp::send && m->in_flight->op != CollOp::recv) {
            by_seq[m->in_flight->seq].push_back(m);
        }
    }
    for (const auto& [seq, ranks] : by_seq) {
        std::vector<std::pair<Fingerprint, std::vector<int>>> calls;
        for (const auto* m : ranks) {
            auto it = std::find_if(calls.begin(), calls.end(),
                                   [&](const auto& c) { return c.first.same_call(*m->in_flight); });
            if (it == calls.end())
                calls.push_back({*m->in_flight, {m->world_rank}});
            else
                it->second.push_back(m->world_rank);
        }
        if (calls.size() < 2) continue;
        std::string msg = fmt::format("{}: mismatch at #{}:", group, seq);
        for (size_t i = 0; i < calls.size(); ++i) {
            msg += fmt::format(
                "{} {} {} {}", i == 0 ? "" : (i + 1 == calls.size() ? " while" : ","),
                ranks_word(calls[i].second), calls[i].second.size() == 1 ? "calls" : "call",
                calls[i].first.describe());
        }
        parts.push_back(msg + "; every rank must issue the same collectives in the same order");
    }

    return parts;
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

GroupMonitor::GroupMonitor(std::string name, std::vector<int> world_ranks, int my_world_rank)
    : name_(std::move(name)), world_ranks_(std::move(world_ranks)), my_world_rank_(my_world_rank) {
    std::string key = name_;
    for (int r : world_ranks_) key += fmt::format(",{}", r);
    id_ = XXH64(key.data(), key.size(), 0);
}

void GroupMonitor::begin(const Fingerprint& fp) {
    const auto now = Clock::now();
    std::lock_guard lock(mu_);
    in_flight_ = fp;
    in_flight_since_ = now;
}

void GroupMonitor::end(const Fingerprint& fp) {
    const auto now = Clock::now();
    std::lock_guard lock(mu_);
    in_flight_.reset();
    done_[num_done_ % kHistory] = fp;
    ++num_done_;
    last_done_at_ = now;
}

double GroupMonitor::in_flight_seconds() const {
    std::lock_guard lock(mu_);
    return in_flight_ ? seconds_since(in_flight_since_) : 0.0;
}

GroupSnapshot GroupMonitor::snapshot() const {
    std::lock_guard lock(mu_);
    GroupSnapshot s;
    s.world_rank = my_world_rank_;
    s.in_flight = in_flight_;
    if (in_flight_) s.in_flight_s = seconds_since(in_flight_since_);
    if (num_done_ > 0) {
        s.last_done = done_[(num_done_ - 1) % kHistory];
        s.idle_s = seconds_since(last_done_at_);
    }
    // Oldest first.
    const uint64_t first = num_done_ > kHistory ? num_done_ - kHistory : 0;
    for (uint64_t i = first; i < num_done_; ++i) s.recent.push_back(done_[i % kHistory]);
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
    for (size_t i = 0; i < s.recent.size(); ++i) {
        out += fmt::format("{} {}", i == 0 ? "" : ",", s.recent[i].describe());
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
