#pragma once
// Timeline spans for traces (Chrome trace format, written by obs/): each
// span is a named interval on the thread that ran it, with a kind that says
// what the time was (compute, communication, waiting, data, ...), an
// optional layer and an optional byte count. Recording is process-wide and
// off by default; a span then costs one relaxed atomic load and a branch,
// so the layers below obs/ (comm, model, parallel) mark their spans freely.
// When on, a span reads the clock twice and appends to its thread's buffer.
//
// Nesting: spans on one thread nest (a scope ends before its parent does);
// the trace analysis relies on it.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace apiary::core::trace {

enum class Kind : uint8_t {
    step,        // one optimizer step (the frame everything else sits in)
    compute,     // forward, backward, head
    comm,        // a collective executed (on whichever thread ran it)
    wait,        // the step's thread blocked on communication (exposed)
    data,        // waiting for the next batch
    optimizer,   // gradient norm, clipping, AdamW, parameter gather
    checkpoint,  // saving
    eval,        // evaluation on held-out data
    other,
};
const char* kind_name(Kind k);
// The kind named by kind_name(), or Kind::other.
Kind kind_from_name(const std::string& name);

struct Event {
    const char* name = nullptr;    // a string literal or an interned string
    const char* detail = nullptr;  // e.g. the algorithm of a collective (literal or interned)
    const char* tag = nullptr;     // a collective's tag kind ("bucket", "tp_sum", ...)
    int64_t begin_ns = 0;          // CLOCK_MONOTONIC
    int64_t end_ns = 0;
    int64_t bytes = -1;  // bytes a collective moves (-1: none)
    int64_t id = -1;     // a step number, a collective's tag id (-1: none)
    int32_t layer = -1;  // transformer block (-1: none)
    Kind kind = Kind::other;
};

// Everything one thread recorded.
struct ThreadEvents {
    int tid = 0;  // small, stable per thread of this process
    std::string name;
    std::vector<Event> events;
};

namespace detail {
extern std::atomic<bool> g_on;
void record(const Event& e);
}  // namespace detail

inline bool on() { return detail::g_on.load(std::memory_order_relaxed); }
void set_on(bool on);
int64_t now_ns();
// Names the calling thread in traces ("comm dp", ...).
void set_thread_name(const std::string& name);
// A stable C string equal to s, for span names made at run time.
const char* intern(const std::string& s);
// Moves out every thread's events recorded so far (threads with none are
// left out).
std::vector<ThreadEvents> take();

class Span {
  public:
    Span(const char* name, Kind kind, int32_t layer = -1, int64_t bytes = -1,
         const char* detail = nullptr, int64_t id = -1) {
        if (!on()) return;
        e_.name = name;
        e_.kind = kind;
        e_.layer = layer;
        e_.bytes = bytes;
        e_.detail = detail;
        e_.id = id;
        e_.begin_ns = now_ns();
    }
    // A span with every field but the times given (check on() first: the
    // prototype is built for nothing otherwise).
    explicit Span(const Event& proto) {
        if (!on()) return;
        e_ = proto;
        e_.begin_ns = now_ns();
    }
    ~Span() {
        if (e_.name) {
            e_.end_ns = now_ns();
            detail::record(e_);
        }
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

  private:
    Event e_;
};

}  // namespace apiary::core::trace

#define APIARY_TRACE_CONCAT2(a, b) a##b
#define APIARY_TRACE_CONCAT(a, b) APIARY_TRACE_CONCAT2(a, b)
// APIARY_TRACE("name", kind[, layer, bytes, detail, id]): a span over the
// rest of the enclosing scope.
#define APIARY_TRACE(...) \
    ::apiary::core::trace::Span APIARY_TRACE_CONCAT(apiary_trace_, __LINE__)(__VA_ARGS__)
