// Slurm's own records: `sacct --parsable2` output (a header of field names,
// then one '|'-separated row per job or job step) and the job-completion
// log of JobCompType=jobcomp/filetxt (one line of Key=Value per job), plus
// the scheduling part of slurm.conf.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "core/error.h"
#include "sim/slurm.h"
#include "sim/text.h"
#include "sim/trace.h"

namespace apiary::sim {

namespace {

using Record = std::map<std::string, std::string>;

bool missing_time(const std::string& v) {
    return v.empty() || v == "Unknown" || v == "None" || v == "N/A";
}

const std::string& get(const Record& r, const char* key) {
    static const std::string empty;
    auto it = r.find(key);
    return it == r.end() ? empty : it->second;
}

// The count of gres/gpu in a TRES string "cpu=8,mem=64G,node=1,gres/gpu=4".
long long tres_gpus(const std::string& tres) {
    long long n = 0;
    for (const auto& item : split(tres, ',')) {
        const auto eq = item.find('=');
        if (eq == std::string::npos) continue;
        const std::string k = item.substr(0, eq);
        // "gres/gpu" is the total; typed entries ("gres/gpu:a100") repeat it.
        if (k == "gres/gpu") n += std::atoll(item.c_str() + eq + 1);
    }
    return n;
}

bool uses_gpus(const std::vector<Record>& rows) {
    for (const auto& r : rows) {
        if (tres_gpus(get(r, "AllocTRES")) > 0 || tres_gpus(get(r, "ReqTRES")) > 0) return true;
    }
    return false;
}

long long cpus_of(const Record& r) {
    for (const char* k : {"NCPUS", "AllocCPUS", "ReqCPUS"}) {
        const long long n = std::atoll(get(r, k).c_str());
        if (n > 0) return n;
    }
    return 0;
}

// One job from a record whose keys are sacct's field names.
JobSpec job_of(const Record& r, const std::string& where, bool gpus) {
    JobSpec j;
    j.where = where;
    j.id = get(r, "JobID");
    j.state = get(r, "State");
    if (const auto& a = get(r, "Account"); !a.empty()) j.account = a;
    // A job arrives when it could first start: Eligible (later than Submit
    // for held or --begin jobs). `sacct --completion` prints each job's
    // start as its Submit but keeps the real Eligible.
    const char* arrive = missing_time(get(r, "Eligible")) ? "Submit" : "Eligible";
    if (missing_time(get(r, arrive))) {
        throw DataError(fmt::format("{}: job '{}': field 'Submit' is missing (got '{}')", where,
                                    printable(j.id), printable(get(r, "Submit"))));
    }
    j.submit = parse_slurm_time(get(r, arrive), where + ": field '" + arrive + "'");
    j.devices =
        gpus ? std::max(tres_gpus(get(r, "AllocTRES")), tres_gpus(get(r, "ReqTRES"))) : cpus_of(r);
    if (const auto& tl = get(r, "Timelimit"); !tl.empty()) {
        j.time_limit = parse_slurm_duration(tl, where + ": field 'Timelimit'");
    }
    const std::string& start = get(r, "Start");
    const std::string& end = get(r, "End");
    if (missing_time(start)) {
        j.reject = fmt::format("never started in Slurm (state {})", j.state);
    } else if (missing_time(end)) {
        j.reject = fmt::format("no end in Slurm's record (state {})", j.state);
    } else {
        j.recorded_start = parse_slurm_time(start, where + ": field 'Start'");
        j.recorded_end = parse_slurm_time(end, where + ": field 'End'");
        if (j.recorded_end < j.recorded_start) {
            throw DataError(fmt::format("{}: job '{}': End {} is before Start {}", where,
                                        printable(j.id), printable(end), printable(start)));
        }
        if (j.recorded_start < j.submit) {
            throw DataError(fmt::format("{}: job '{}': field 'Start' {} is before its Submit",
                                        where, printable(j.id), printable(start)));
        }
        j.runtime = j.recorded_end - j.recorded_start;
    }
    if (j.devices <= 0 && j.reject.empty()) {
        j.reject = gpus ? "no GPUs in its record (gres/gpu in AllocTRES or ReqTRES)"
                        : "no CPU count in its record (NCPUS, AllocCPUS or ReqCPUS)";
        j.devices = 1;
    }
    return j;
}

// Times become seconds from the earliest submit; later records of the same
// job (a requeue) replace earlier ones, and the count is noted.
Trace finish(std::vector<std::pair<Record, std::string>> rows, const std::string& source,
             SlurmDevices devices, std::vector<std::string> notes) {
    std::vector<Record> records;
    for (const auto& [r, _] : rows) records.push_back(r);
    const bool gpus =
        devices == SlurmDevices::gpus || (devices == SlurmDevices::automatic && uses_gpus(records));
    Trace t;
    t.source = source;
    t.notes = std::move(notes);
    std::map<std::string, size_t> index;
    int superseded = 0;
    for (const auto& [r, where] : rows) {
        JobSpec j = job_of(r, where, gpus);
        if (auto it = index.find(j.id); it != index.end()) {
            t.jobs[it->second] = std::move(j);
            ++superseded;
        } else {
            index[j.id] = t.jobs.size();
            t.jobs.push_back(std::move(j));
        }
    }
    if (superseded > 0) {
        t.notes.push_back(fmt::format(
            "{} earlier record(s) of requeued jobs replaced by their last record", superseded));
    }
    t.device_unit = gpus ? "gpus" : "cpus";
    t.slurm = true;
    t.notes.push_back(fmt::format("devices are Slurm {} per job", gpus ? "GPUs" : "CPUs"));
    double origin = kNever;
    for (const auto& j : t.jobs) origin = std::min(origin, j.submit);
    if (t.jobs.empty()) origin = 0;
    t.origin_epoch = origin;
    size_t no_wait = 0;
    for (auto& j : t.jobs) {
        j.submit -= origin;
        if (j.recorded_start >= 0) j.recorded_start -= origin, j.recorded_end -= origin;
        no_wait += j.recorded_start == j.submit;
    }
    if (t.jobs.size() > 1 && no_wait == t.jobs.size()) {
        t.notes.push_back(
            "every job started the second it arrived: the record shows no waiting (`sacct "
            "--completion` prints the start as Submit; add Eligible to --format)");
    }
    // Slurm's FIFO order (priority/basic): arrival, then job id; the log
    // itself is in completion order.
    auto id_key = [](const std::string& id) {
        return std::make_pair(std::atoll(id.c_str()), id);  // 123, 123_4, 123+1
    };
    std::stable_sort(t.jobs.begin(), t.jobs.end(), [&](const JobSpec& a, const JobSpec& b) {
        if (a.submit != b.submit) return a.submit < b.submit;
        return id_key(a.id) < id_key(b.id);
    });
    return t;
}

// jobcomp/filetxt's keys, renamed to sacct's where they differ.
const std::map<std::string, std::string>& jobcomp_keys() {
    static const std::map<std::string, std::string> k = {
        {"JobId", "JobID"},
        {"UserId", "User"},
        {"GroupId", "Group"},
        {"Name", "JobName"},
        {"JobState", "State"},
        {"Partition", "Partition"},
        {"TimeLimit", "Timelimit"},
        {"StartTime", "Start"},
        {"EndTime", "End"},
        {"NodeList", "NodeList"},
        {"NodeCnt", "NNodes"},
        {"ProcCnt", "NCPUS"},
        {"WorkDir", "WorkDir"},
        {"ReservationName", "Reservation"},
        {"Tres", "AllocTRES"},
        {"Account", "Account"},
        {"QOS", "QOS"},
        {"WcKey", "WCKey"},
        {"Cluster", "Cluster"},
        {"SubmitTime", "Submit"},
        {"EligibleTime", "Eligible"},
        {"DerivedExitCode", "DerivedExitCode"},
        {"ExitCode", "ExitCode"},
        {"ArrayJobId", "ArrayJobId"},
        {"ArrayTaskId", "ArrayTaskId"},
        {"HetJobId", "HetJobId"},
        {"HetJobOffset", "HetJobOffset"},
        {"BlockId", "BlockID"},
        {"Connection", "Connection"},
        {"Reboot", "Reboot"},
        {"Rotate", "Rotate"},
        {"MaxProcs", "MaxProcs"},
        {"Geometry", "Geometry"},
        {"Start", "Start"},
        {"BlockStart", "BlockStart"},
    };
    return k;
}

}  // namespace

double parse_slurm_time(const std::string& text, const std::string& where) {
    std::tm tm{};
    int consumed = 0;
    if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                    &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6 ||
        consumed != int(text.size())) {
        throw DataError(
            fmt::format("{}: '{}' is not a Slurm time (YYYY-MM-DDTHH:MM:SS)", where, text));
    }
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return double(timegm(&tm));
}

double parse_slurm_duration(const std::string& text, const std::string& where) {
    if (text == "UNLIMITED" || text == "Partition_Limit" || text == "INFINITE") return kNever;
    auto bad = [&] {
        return DataError(fmt::format(
            "{}: '{}' is not a Slurm duration ([D-]HH:MM:SS, MM:SS, minutes or UNLIMITED)", where,
            text));
    };
    std::string rest = text;
    double days = 0;
    const auto dash = rest.find('-');
    auto number = [&](const std::string& s) {
        double v = 0;
        if (s.empty() || s.find_first_not_of("0123456789.") != std::string::npos ||
            !parse_double(s, &v)) {
            throw bad();
        }
        return v;
    };
    if (dash != std::string::npos) {
        days = number(rest.substr(0, dash));
        rest = rest.substr(dash + 1);
    }
    const auto parts = split(rest, ':');
    std::vector<double> v;
    for (const auto& p : parts) v.push_back(number(p));
    double s = 0;
    if (dash != std::string::npos) {  // D-HH, D-HH:MM, D-HH:MM:SS
        if (v.size() > 3) throw bad();
        const double mult[] = {3600, 60, 1};
        for (size_t i = 0; i < v.size(); ++i) s += v[i] * mult[i];
    } else if (v.size() == 1) {
        s = v[0] * 60;  // minutes
    } else if (v.size() == 2) {
        s = v[0] * 60 + v[1];
    } else if (v.size() == 3) {
        s = v[0] * 3600 + v[1] * 60 + v[2];
    } else {
        throw bad();
    }
    return days * 86400 + s;
}

Trace parse_sacct(const std::string& text, const std::string& source, SlurmDevices devices) {
    std::vector<std::string> header;
    std::vector<std::pair<Record, std::string>> rows;
    int steps = 0, line_no = 0;
    for (const auto& line : split_lines(text)) {
        ++line_no;
        if (trim(line).empty()) continue;
        const std::string where = fmt::format("{}:{}", source, line_no);
        const auto cells = split(line, '|');
        if (header.empty()) {
            header = cells;
            for (const char* need : {"JobID", "Submit", "Start", "End"}) {
                if (std::find(header.begin(), header.end(), need) == header.end()) {
                    throw DataError(fmt::format(
                        "{}: sacct header lacks '{}': run sacct --parsable2 --format=JobID,"
                        "Submit,Eligible,Start,End,Timelimit,NCPUS,AllocTRES,State,Account",
                        where, need));
                }
            }
            continue;
        }
        if (cells.size() != header.size()) {
            throw DataError(fmt::format("{}: {} fields but the header has {}", where, cells.size(),
                                        header.size()));
        }
        Record r;
        for (size_t i = 0; i < cells.size(); ++i) r[header[i]] = cells[i];
        if (r["JobID"].find('.') != std::string::npos) {
            ++steps;  // 123.batch, 123.extern, 123.0: steps of a job already counted
            continue;
        }
        rows.emplace_back(std::move(r), where);
    }
    if (header.empty()) throw DataError(fmt::format("{}: empty sacct output", source));
    std::vector<std::string> notes;
    if (steps > 0) {
        notes.push_back(fmt::format(
            "{} job-step rows skipped (JobID with '.': batch, extern and srun steps)", steps));
    }
    return finish(std::move(rows), source, devices, std::move(notes));
}

Trace parse_jobcomp(const std::string& text, const std::string& source, SlurmDevices devices) {
    std::vector<std::pair<Record, std::string>> rows;
    int line_no = 0;
    const auto& keys = jobcomp_keys();
    for (const auto& line : split_lines(text)) {
        ++line_no;
        if (trim(line).empty()) continue;
        const std::string where = fmt::format("{}:{}", source, line_no);
        Record r;
        std::string key;
        // Values are unquoted and may hold spaces (a job name, a directory):
        // a word that does not start with a known "Key=" continues the value.
        for (const auto& word : split(trim(line), ' ')) {
            const auto eq = word.find('=');
            if (eq != std::string::npos && keys.count(word.substr(0, eq))) {
                key = keys.at(word.substr(0, eq));
                r[key] = word.substr(eq + 1);
            } else if (!key.empty()) {
                r[key] += " " + word;
            } else {
                throw DataError(
                    fmt::format("{}: '{}' is not a jobcomp/filetxt field (lines start with JobId=)",
                                where, printable(word)));
            }
        }
        if (!r.count("JobID")) {
            throw DataError(fmt::format("{}: no JobId= in a jobcomp/filetxt line", where));
        }
        rows.emplace_back(std::move(r), where);
    }
    return finish(std::move(rows), source, devices, {});
}

long long hostlist_count(const std::string& hostlist, const std::string& where) {
    long long total = 0;
    int depth = 0;
    std::string cur;
    auto count_one = [&](const std::string& name) {
        long long n = 1;
        size_t pos = 0;
        while ((pos = name.find('[', pos)) != std::string::npos) {
            const size_t close = name.find(']', pos);
            if (close == std::string::npos) {
                throw ConfigError(fmt::format("{}: unclosed '[' in hostlist '{}'", where, name));
            }
            long long in = 0;
            for (const auto& r : split(name.substr(pos + 1, close - pos - 1), ',')) {
                const auto dash = r.find('-');
                const long long a = std::atoll(r.c_str());
                const long long b =
                    dash == std::string::npos ? a : std::atoll(r.c_str() + dash + 1);
                if (b < a) throw ConfigError(fmt::format("{}: bad range '{}'", where, r));
                in += b - a + 1;
            }
            n *= in;
            pos = close;
        }
        return n;
    };
    for (char ch : hostlist) {
        if (ch == '[') ++depth;
        if (ch == ']') --depth;
        if (ch == ',' && depth == 0) {
            if (!cur.empty()) total += count_one(cur);
            cur.clear();
        } else {
            cur += ch;
        }
    }
    if (!cur.empty()) total += count_one(cur);
    return total;
}

}  // namespace apiary::sim
