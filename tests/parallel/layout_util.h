#pragma once
// Runs of `apiary train` under mpirun in any layout, and the comparisons
// that prove a layout equal to the one-rank run: the loss and the gradient
// norm at every step (a gradient summed where it should be averaged, or
// counted twice, moves the norm even where AdamW's normalisation hides it
// from the loss), and the parameters after the last step measured against
// how far training moved them (so that a run that did not train cannot
// pass a loose tolerance).

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../ckpt_util.h"
#include "../cli_util.h"

namespace apiary::testing {

class LayoutRuns {
  public:
    explicit LayoutRuns(std::filesystem::path dir) : dir_(std::move(dir)) {}
    const std::filesystem::path& dir() const { return dir_; }

    CommandResult run(const std::string& name, int ranks, const std::string& args) const {
        const std::string launcher =
            ranks > 1 ? std::string(APIARY_MPIRUN) + " -n " + std::to_string(ranks) + " " : "";
        return run_command(launcher + apiary_bin() +
                           " train --set run.dir=" + (dir_ / name).string() + " " + args);
    }
    std::vector<nlohmann::json> metrics(const std::string& name) const {
        std::vector<nlohmann::json> out;
        std::ifstream in(dir_ / name / "metrics.jsonl");
        for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
        return out;
    }
    // A per-step field of the training records.
    std::vector<double> series(const std::string& name, const std::string& key) const {
        std::vector<double> v;
        for (const auto& j : metrics(name)) {
            if (j.contains("loss")) v.push_back(j[key].get<double>());
        }
        return v;
    }
    std::map<std::string, std::vector<double>> params(const std::string& name, int step) const {
        return checkpoint_tensors(dir_ / name / "ckpt" / fmt::format("step_{:08d}", step));
    }
    // ||b - a|| / ||a - init|| over every parameter: how far two runs ended
    // apart, relative to how far training moved them.
    double update_difference(const std::string& a, const std::string& b, const std::string& init,
                             int step, int step_b = -1) const {
        const auto pa = params(a, step), pb = params(b, step_b < 0 ? step : step_b),
                   p0 = params(init, 1);
        EXPECT_EQ(pa.size(), pb.size()) << a << " vs " << b;
        double diff = 0, moved = 0;
        for (const auto& [name, va] : pa) {
            const auto ib = pb.find(name);
            const auto i0 = p0.find(name);
            if (ib == pb.end() || i0 == p0.end() || ib->second.size() != va.size()) {
                ADD_FAILURE() << b << " has no tensor '" << name << "' of " << a << "'s shape";
                return INFINITY;
            }
            for (size_t i = 0; i < va.size(); ++i) {
                diff += (ib->second[i] - va[i]) * (ib->second[i] - va[i]);
                moved += (va[i] - i0->second[i]) * (va[i] - i0->second[i]);
            }
        }
        return std::sqrt(diff / moved);
    }
    // Per-step relative agreement of a series.
    void expect_series_near(const std::string& a, const std::string& b, const std::string& key,
                            size_t steps, double tol) const {
        const auto sa = series(a, key), sb = series(b, key);
        ASSERT_EQ(sa.size(), steps) << a << " " << key;
        ASSERT_EQ(sb.size(), steps) << b << " " << key;
        for (size_t i = 0; i < steps; ++i) {
            EXPECT_NEAR(sb[i], sa[i], tol * std::fabs(sa[i]))
                << b << " vs " << a << ": " << key << " at step " << i + 1;
        }
    }

  private:
    std::filesystem::path dir_;
};

}  // namespace apiary::testing
