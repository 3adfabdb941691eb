#include "train/launch_targets.h"

#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "core/error.h"
#include "obs/keys.h"
#include "obs/sd.h"

namespace apiary::train {

namespace {

// The value of --name V or --name=V at args[i] (advancing i), or nullptr.
const std::string* option_value(const std::vector<std::string>& args, size_t& i,
                                const std::string& name, std::string& scratch) {
    if (args[i] == name && i + 1 < args.size()) return &args[++i];
    if (args[i].rfind(name + "=", 0) == 0) {
        scratch = args[i].substr(name.size() + 1);
        return &scratch;
    }
    return nullptr;
}

}  // namespace

std::string write_launch_targets(int ranks, const std::string& hosts,
                                 const std::vector<std::string>& args,
                                 const ConfigLoader& load_config) {
    if (args.empty() || args[0] != "train") return "";
    std::string config_file, resume, scratch;
    std::vector<std::string> sets;
    for (size_t i = 1; i < args.size(); ++i) {
        if (const auto* v = option_value(args, i, "--config", scratch)) {
            config_file = *v;
        } else if (const auto* v2 = option_value(args, i, "--set", scratch)) {
            sets.push_back(*v2);
        } else if (const auto* v3 = option_value(args, i, "--resume", scratch)) {
            resume = *v3;
        }
    }
    if (!resume.empty()) {
        config_file = resume + "/config.toml";
        sets.push_back("run.dir=" + resume);
    }
    std::optional<core::Config> c;
    try {
        c.emplace(load_config(config_file, sets));
    } catch (const Error&) {
        return "";  // every rank reports the config's error itself
    }
    const auto mo = obs::MetricsOptions::from_config(*c);
    if (!mo.enabled) return "";
    const std::string run_dir = c->get_string("run.dir");
    const std::string run = std::filesystem::path(run_dir).filename().string();
    // Beside the run directory, not in it (a new run's must be empty), where
    // one glob finds every run's: runs/prometheus/*.json.
    const std::string path =
        mo.sd_file.empty()
            ? (std::filesystem::path(run_dir).parent_path() / "prometheus" / (run + ".json"))
                  .string()
            : mo.sd_file;
    obs::write_sd_targets(path, run, obs::place_targets(ranks, hosts, mo.address, mo.port_base));
    return path;
}

}  // namespace apiary::train
