#include "sim/profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "sim/text.h"
#include "sim/trace.h"

namespace apiary::sim {

Profile::Profile(double step_s, std::vector<double> values) : step_(step_s), v_(std::move(values)) {
    prefix_.assign(v_.size() + 1, 0.0);
    for (size_t k = 0; k < v_.size(); ++k) prefix_[k + 1] = prefix_[k] + v_[k];
}

Profile Profile::constant(double value) {
    Profile p(3600, {value});
    p.constant_ = true;
    return p;
}

double Profile::at(double t) const {
    if (v_.empty()) return 0;
    const double p = period_s();
    double r = std::fmod(t, p);
    if (r < 0) r += p;
    const size_t k = std::min(v_.size() - 1, size_t(r / step_));
    return v_[k];
}

double Profile::cumulative(double t) const {
    const double p = period_s();
    const double cycles = std::floor(t / p);
    const double r = t - cycles * p;
    const size_t k = std::min(v_.size() - 1, size_t(r / step_));
    return cycles * prefix_.back() * step_ + prefix_[k] * step_ + v_[k] * (r - double(k) * step_);
}

double Profile::integral(double t0, double t1) const {
    if (v_.empty() || t1 <= t0) return 0;
    if (constant_) return v_[0] * (t1 - t0);
    return cumulative(t1) - cumulative(t0);
}

double Profile::next_change(double t) const {
    if (v_.size() <= 1) return kNever;
    double next = (std::floor(t / step_) + 1) * step_;
    if (next <= t) next += step_;  // rounding at a boundary
    return next;
}

double Profile::min() const { return v_.empty() ? 0 : *std::min_element(v_.begin(), v_.end()); }

const std::vector<double>* ProfileTable::column(const std::string& name) const {
    for (size_t i = 0; i < columns.size(); ++i) {
        if (columns[i] == name) return &values[i];
    }
    return nullptr;
}

namespace {

// The planner's format: one value per line, hourly, for a single column.
bool bare_values(const std::vector<std::string>& lines, ProfileTable& t, const std::string& col) {
    for (const auto& l : lines) {
        if (is_blank_or_comment(l)) continue;
        double v = 0;
        if (!parse_double(l, &v)) return false;
        break;
    }
    t.columns = {col};
    t.values.assign(1, {});
    int line_no = 0;
    for (const auto& l : lines) {
        ++line_no;
        if (is_blank_or_comment(l)) continue;
        const Cell c{trim(l), fmt::format("{}:{}", t.source, line_no), col};
        t.values[0].push_back(cell_number(c, 0, 1e12, ">= 0; one value per hour"));
    }
    return true;
}

void check_header(const std::vector<std::string>& header, const std::string& where,
                  const std::vector<std::string>& required,
                  const std::vector<std::string>& optional) {
    std::vector<std::string> known = {"hour"};
    known.insert(known.end(), required.begin(), required.end());
    known.insert(known.end(), optional.begin(), optional.end());
    if (header.empty() || header[0] != "hour") {
        throw DataError(fmt::format("{}: the first column must be 'hour' (header: {})", where,
                                    fmt::join(header, ",")));
    }
    for (const auto& h : header) {
        if (std::find(known.begin(), known.end(), h) == known.end()) {
            throw DataError(fmt::format("{}: unknown field '{}' (known: {})", where, h,
                                        fmt::join(known, ", ")));
        }
    }
    for (const auto& r : required) {
        if (std::find(header.begin(), header.end(), r) == header.end()) {
            throw DataError(fmt::format("{}: field '{}' is missing from the header", where, r));
        }
    }
}

}  // namespace

ProfileTable parse_profile_table(const std::string& text, const std::string& source,
                                 const std::vector<std::string>& required,
                                 const std::vector<std::string>& optional) {
    ProfileTable t;
    t.source = source;
    const auto lines = split_lines(text);
    if (required.size() == 1 && optional.empty() && bare_values(lines, t, required[0])) {
        if (t.values[0].empty()) throw DataError(fmt::format("{}: no values", source));
        return t;
    }
    std::vector<std::string> header;
    std::vector<double> hours;
    int line_no = 0;
    for (const auto& line : lines) {
        ++line_no;
        if (is_blank_or_comment(line)) continue;
        const std::string where = fmt::format("{}:{}", source, line_no);
        auto cells = split_csv(line, where);
        for (auto& c : cells) c = trim(c);
        if (header.empty()) {
            check_header(cells, where, required, optional);
            header = cells;
            t.columns.assign(header.begin() + 1, header.end());
            t.values.assign(t.columns.size(), {});
            continue;
        }
        if (cells.size() != header.size()) {
            throw DataError(fmt::format("{}: {} cells but the header has {} fields", where,
                                        cells.size(), header.size()));
        }
        const double h = cell_number(Cell{cells[0], where, "hour"}, 0, 1e9, "hours, >= 0");
        if (hours.empty() && h != 0) {
            throw DataError(fmt::format(
                "{}: field 'hour': the profile starts at hour {}; it must start at 0, the start "
                "of the trace",
                where, h));
        }
        if (hours.size() >= 2) {
            const double step = hours[1] - hours[0];
            if (std::abs(h - hours.back() - step) > 1e-9 * std::max(1.0, h)) {
                throw DataError(fmt::format(
                    "{}: field 'hour': {} follows {}: rows must come every {} h without gaps",
                    where, h, hours.back(), step));
            }
        } else if (hours.size() == 1 && h <= hours[0]) {
            throw DataError(
                fmt::format("{}: field 'hour': {} does not follow {}", where, h, hours[0]));
        }
        hours.push_back(h);
        for (size_t i = 1; i < cells.size(); ++i) {
            t.values[i - 1].push_back(
                cell_number(Cell{cells[i], where, header[i]}, 0, 1e12, "a value >= 0"));
        }
    }
    if (hours.empty()) throw DataError(fmt::format("{}: no rows", source));
    t.step_s = hours.size() >= 2 ? (hours[1] - hours[0]) * 3600 : 3600;
    return t;
}

ProfileTable read_profile_table(const std::string& path, const std::vector<std::string>& required,
                                const std::vector<std::string>& optional) {
    ProfileTable t;
    with_printable_errors([&] {
        t = parse_profile_table(read_text_file(path, "profile"), path, required, optional);
    });
    return t;
}

}  // namespace apiary::sim
