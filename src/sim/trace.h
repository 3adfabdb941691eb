#pragma once
// Job traces: what was submitted to a cluster, in apiary's own CSV / JSON
// format (docs/sim.md lists every field) or as Slurm recorded it (`sacct
// --parsable2` output, or the job-completion log of jobcomp/filetxt). Every
// reader names the file, line and field of anything it cannot use; rows it
// skips on purpose (Slurm job steps) are counted in Trace::notes.

#include <iosfwd>
#include <limits>
#include <string>
#include <vector>

namespace apiary::sim {

inline constexpr double kNever = std::numeric_limits<double>::infinity();

// One submitted job. Times are seconds from the trace's origin.
struct JobSpec {
    std::string id;
    std::string where;  // "file:line" (or "file: job #k"), for messages
    double submit = 0;
    long long devices = 0;
    double runtime = -1;     // seconds of work at full speed; < 0: from the planner
    double time_limit = -1;  // the user's estimate, which backfill plans with; < 0: runtime
    int priority = 0;        // class: higher classes first in the priority queues
    std::string account = "default";
    std::string user;       // the submitting user (SWF field 12), for fair share and limits
    bool spot = false;      // runs on spot capacity, at the spot price
    bool flexible = false;  // its start may be moved to low-carbon hours
    double deadline = -1;   // latest completion for a flexible job (absolute, s)
    // The planner's view of the job, when `model` names a preset.
    std::string model;
    int tp = 1, pp = 1, zero = 0, micro_batch = 1, seq_len = 0;
    long long global_batch = 0;
    std::string precision, recompute;
    double steps = 0, tokens = 0;
    double checkpoint_s = -1, checkpoint_interval_s = -1;
    // What a real scheduler did with it (Slurm records), for comparison.
    double recorded_start = -1, recorded_end = -1;
    std::string state;
    // A dependency: the job is not eligible before job `after` (an id in the
    // same trace) has ended and `think_s` more seconds have passed (SWF
    // fields 17 and 18).
    std::string after;
    double think_s = 0;
    std::string reject;  // set by a reader when the record cannot be replayed
};

struct Trace {
    std::string source;
    std::vector<JobSpec> jobs;
    std::vector<std::string> notes;  // rows skipped on purpose, and why
    double origin_epoch = 0;         // Slurm records: the Unix time of t = 0
    std::string device_unit;         // Slurm records: "cpus" or "gpus"; SWF: "nodes"
    long long max_nodes = 0;         // SWF header: MaxNodes (or MaxProcs / procs per node)
    bool slurm = false;              // a Slurm record (its reaction time can be measured)
};

enum class TraceFormat { automatic, csv, json, sacct, jobcomp, swf };
TraceFormat parse_trace_format(const std::string& name);  // throws ConfigError

// How a Slurm record's size becomes a device count.
enum class SlurmDevices { automatic, cpus, gpus };
SlurmDevices parse_slurm_devices(const std::string& name);

// Options of the readers that only some formats use.
struct ReadOptions {
    SlurmDevices devices = SlurmDevices::automatic;
    long long procs_per_node = 1;  // SWF: processors per node (a job's nodes = ceil(procs / this))
};

// A file, gzip-compressed or not (by its first bytes), is read whole.
Trace read_trace(const std::string& path, TraceFormat format = TraceFormat::automatic,
                 SlurmDevices devices = SlurmDevices::automatic);
Trace read_trace(const std::string& path, TraceFormat format, const ReadOptions& opt);
Trace parse_trace(const std::string& text, const std::string& source, TraceFormat format,
                  SlurmDevices devices = SlurmDevices::automatic);
Trace parse_trace(const std::string& text, const std::string& source, TraceFormat format,
                  const ReadOptions& opt);

// The Standard Workload Format of the Parallel Workloads Archive (swf.cc):
// 18 whitespace-separated fields a job, ';' header lines (MaxNodes,
// MaxProcs, UnixStartTime), -1 for unknown. Jobs that cannot be replayed
// (zero or unknown run time, cancelled before they started) are counted in
// Trace::notes and left out.
Trace parse_swf(const std::string& text, const std::string& source, long long procs_per_node);

// Slurm's own records (slurm_trace.cc).
Trace parse_sacct(const std::string& text, const std::string& source, SlurmDevices devices);
Trace parse_jobcomp(const std::string& text, const std::string& source, SlurmDevices devices);

// The documented fields of apiary's own format: name and meaning.
struct TraceField {
    const char* name;
    const char* doc;
};
const std::vector<TraceField>& trace_fields();

// A recorded scheduler's reaction time, from its own record: the mean gap
// between each second in which it started jobs and the latest arrival or
// end at or before it (what let them start). 0 without recorded starts.
double record_latency_s(const Trace& trace);

// Writes apiary's CSV format with the scheduling fields (id, submit, devices,
// runtime, time_limit, priority, account, spot, flexible, deadline).
void write_trace_csv(const Trace& trace, std::ostream& out);

}  // namespace apiary::sim
