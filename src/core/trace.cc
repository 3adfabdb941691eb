#include "core/trace.h"

#include <time.h>

#include <memory>
#include <mutex>
#include <set>

namespace apiary::core::trace {

namespace {

// One buffer per thread that ever recorded; kept in a process-wide list so
// take() finds them, and alive after the thread ends (its events are still
// to be written).
struct Buffer {
    std::mutex mu;  // uncontended but for take(): a few ns per event
    ThreadEvents data;
};

struct Registry {
    std::mutex mu;
    std::vector<std::shared_ptr<Buffer>> buffers;
    std::set<std::string> interned;
    int next_tid = 1;
};

Registry& registry() {
    static Registry* r = new Registry();  // never destroyed: threads may outlive statics
    return *r;
}

Buffer& my_buffer() {
    thread_local std::shared_ptr<Buffer> mine;
    if (!mine) {
        mine = std::make_shared<Buffer>();
        Registry& r = registry();
        std::lock_guard<std::mutex> lock(r.mu);
        mine->data.tid = r.next_tid++;
        mine->data.name = "thread " + std::to_string(mine->data.tid);
        r.buffers.push_back(mine);
    }
    return *mine;
}

}  // namespace

namespace detail {

std::atomic<bool> g_on{false};

void record(const Event& e) {
    Buffer& b = my_buffer();
    std::lock_guard<std::mutex> lock(b.mu);
    b.data.events.push_back(e);
}

}  // namespace detail

const char* kind_name(Kind k) {
    switch (k) {
        case Kind::step:
            return "step";
        case Kind::compute:
            return "compute";
        case Kind::comm:
            return "comm";
        case Kind::wait:
            return "wait";
        case Kind::data:
            return "data";
        case Kind::optimizer:
            return "optimizer";
        case Kind::checkpoint:
            return "checkpoint";
        case Kind::eval:
            return "eval";
        case Kind::other:
            break;
    }
    return "other";
}

Kind kind_from_name(const std::string& name) {
    for (int k = 0; k <= int(Kind::other); ++k) {
        if (name == kind_name(Kind(k))) return Kind(k);
    }
    return Kind::other;
}

void set_on(bool on) { detail::g_on.store(on, std::memory_order_relaxed); }

int64_t now_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void set_thread_name(const std::string& name) {
    Buffer& b = my_buffer();
    std::lock_guard<std::mutex> lock(b.mu);
    b.data.name = name;
}

const char* intern(const std::string& s) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    return r.interned.insert(s).first->c_str();
}

std::vector<ThreadEvents> take() {
    Registry& r = registry();
    std::vector<std::shared_ptr<Buffer>> buffers;
    {
        std::lock_guard<std::mutex> lock(r.mu);
        buffers = r.buffers;
    }
    std::vector<ThreadEvents> out;
    for (auto& b : buffers) {
        std::lock_guard<std::mutex> lock(b->mu);
        if (b->data.events.empty()) continue;
        ThreadEvents t;
        t.tid = b->data.tid;
        t.name = b->data.name;
        t.events.swap(b->data.events);
        out.push_back(std::move(t));
    }
    return out;
}

}  // namespace apiary::core::trace
