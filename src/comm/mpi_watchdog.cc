// The watchdog: one thread per process that notices a collective stuck past
// comm.timeout_s (or a mismatch found by the match check), gathers every
// rank's fingerprints over the side channel and has rank 0 print who is
// behind and where, then ends the process non-zero on every rank.
//
// Why a side channel: the group's communicator is blocked inside the stuck
// collective, so the exchange needs a communicator nothing else uses (a
// duplicate of MPI_COMM_WORLD made at start-up; MPI_THREAD_MULTIPLE lets
// this thread use it while another thread sits in MPI_Allreduce). A rank whose
// main thread is stalled in its own code still answers: its watchdog thread
// is not stalled. A rank that is dead does not answer and is named as such.

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/mpi_internal.h"

namespace apiary::comm::detail {

namespace {

constexpr int kTagAlarm = 7001, kTagState = 7002, kTagDone = 7003;
// How long ranks wait for each other's reports before naming the silent ones.
constexpr double kExchangeSeconds = 10.0;

Watchdog* g_watchdog = nullptr;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

void say(const std::string& line) {
    // One write per line so that lines of different ranks do not interleave.
    const std::string text = fmt::format("apiary: {}\n", line);
    ssize_t ignored = ::write(2, text.data(), text.size());
    (void)ignored;
}

// Polls a request until it completes or the deadline passes.
bool wait_until(MPI_Request* req, double deadline) {
    int flag = 0;
    while (true) {
        MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (flag) return true;
        if (now_s() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

}  // namespace

Watchdog* watchdog() { return g_watchdog; }
void set_watchdog(Watchdog* w) { g_watchdog = w; }

Watchdog::Watchdog(double timeout_s) : timeout_s_(timeout_s) {
    MPI_Comm_dup(MPI_COMM_WORLD, &side_);
    MPI_Comm_rank(side_, &world_rank_);
    MPI_Comm_size(side_, &world_size_);
    Ticker::start();
    thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    Ticker::stop();
}

void Watchdog::watch(const std::shared_ptr<GroupMonitor>& monitor) {
    std::lock_guard lock(mu_);
    monitors_.push_back(monitor);
}

void Watchdog::raise(uint64_t group_id, int reason) {
    uint64_t expected = 0;
    if (raised_group_.compare_exchange_strong(expected, group_id)) raised_reason_ = reason;
}

void Watchdog::loop() {
    long long alarm[3] = {0, 0, 0};  // group id, origin rank, reason
    MPI_Request alarm_req;
    MPI_Irecv(alarm, 3, MPI_LONG_LONG, MPI_ANY_SOURCE, kTagAlarm, side_, &alarm_req);
    const double poll = std::min(0.1, timeout_s_ / 10);
    while (!stop_) {
        std::this_thread::sleep_for(std::chrono::duration<double>(poll));
        Ticker::tick();
        int flag = 0;
        MPI_Test(&alarm_req, &flag, MPI_STATUS_IGNORE);
        if (flag) report(uint64_t(alarm[0]), int(alarm[1]), int(alarm[2]));
        if (raised_group_ == 0) {
            std::lock_guard lock(mu_);
            for (const auto& weak : monitors_) {
                auto m = weak.lock();
                if (m && m->in_flight_seconds() > timeout_s_) {
                    raise(m->id(), kTimeout);
                    break;
                }
            }
        }
        if (const uint64_t g = raised_group_; g != 0) {
            long long msg[3] = {(long long)g, world_rank_, raised_reason_};
            std::vector<MPI_Request> reqs;
            for (int r = 0; r < world_size_; ++r) {
                if (r == world_rank_) continue;
                reqs.emplace_back();
                MPI_Isend(msg, 3, MPI_LONG_LONG, r, kTagAlarm, side_, &reqs.back());
            }
            // The sends need not complete: a dead peer must not hold up the report.
            for (auto& r : reqs) MPI_Request_free(&r);
            report(g, world_rank_, raised_reason_);
        }
    }
    MPI_Cancel(&alarm_req);
    MPI_Wait(&alarm_req, MPI_STATUS_IGNORE);
}

void Watchdog::report(uint64_t group_id, int origin, int reason) {
    nlohmann::json mine = {{"rank", world_rank_}, {"groups", nlohmann::json::array()}};
    {
        std::lock_guard lock(mu_);
        for (const auto& weak : monitors_) {
            auto m = weak.lock();
            if (!m) continue;
            const GroupSnapshot s = m->snapshot();
            mine["groups"].push_back({{"id", m->id()},
                                      {"name", m->name()},
                                      {"members", m->world_ranks()},
                                      {"state", to_json(s)}});
            if (m->id() == group_id || s.in_flight) say(dump_line(m->name(), s));
        }
    }
    const double deadline = now_s() + kExchangeSeconds;
    if (world_rank_ != 0) {
        const std::string text = mine.dump();
        MPI_Request req;
        MPI_Isend(text.data(), int(text.size()), MPI_CHAR, 0, kTagState, side_, &req);
        wait_until(&req, deadline);
        char done = 0;
        MPI_Request done_req;
        MPI_Irecv(&done, 1, MPI_CHAR, 0, kTagDone, side_, &done_req);
        if (!wait_until(&done_req, deadline + kExchangeSeconds)) {
            say(fmt::format("rank {}: rank 0 sent no report (dead or stuck); see the lines above",
                            world_rank_));
        }
        std::fflush(nullptr);
        std::_Exit(1);
    }

    std::map<int, nlohmann::json> states{{0, mine}};
    while (int(states.size()) < world_size_ && now_s() < deadline) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, kTagState, side_, &flag, &st);
        if (!flag) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            continue;
        }
        int len = 0;
        MPI_Get_count(&st, MPI_CHAR, &len);
        std::string text(size_t(len), '\0');
        MPI_Recv(text.data(), len, MPI_CHAR, st.MPI_SOURCE, kTagState, side_, MPI_STATUS_IGNORE);
        states[st.MPI_SOURCE] = nlohmann::json::parse(text, nullptr, false);
    }

    // The group that raised the alarm, as rank 0 or any answering member knows it.
    std::string name = "group";
    std::vector<int> members;
    for (const auto& [rank, s] : states) {
        if (s.is_discarded()) continue;
        for (const auto& g : s["groups"]) {
            if (g["id"].get<uint64_t>() == group_id) {
                name = g["name"].get<std::string>();
                members = g["members"].get<std::vector<int>>();
            }
        }
        if (!members.empty()) break;
    }
    std::vector<GroupSnapshot> snaps;
    for (int r : members) {
        GroupSnapshot snap;
        snap.world_rank = r;
        snap.answered = false;
        if (auto it = states.find(r); it != states.end() && !it->second.is_discarded()) {
            for (const auto& g : it->second["groups"]) {
                if (g["id"].get<uint64_t>() == group_id) snap = snapshot_from_json(g["state"]);
            }
        }
        snaps.push_back(snap);
    }
    const std::string what =
        reason == kMismatch
            ? fmt::format("ranks called different collectives (found by rank {})", origin)
            : fmt::format("a collective exceeded comm.timeout_s = {} s on rank {}", timeout_s_,
                          origin);
    const std::string line =
        fmt::format("apiary: error: {}: {}; aborting\n", what, diagnose(name, snaps));
    ssize_t ignored = ::write(2, line.data(), line.size());
    (void)ignored;
    char done = 1;
    for (int r = 1; r < world_size_; ++r) {
        MPI_Request req;
        MPI_Isend(&done, 1, MPI_CHAR, r, kTagDone, side_, &req);
        MPI_Request_free(&req);
    }
    // Give the done messages a moment to leave before this process goes.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::fflush(nullptr);
    std::_Exit(1);
}

}  // namespace apiary::comm::detail
