// `apiary config keys|presets|show`: every key documented, from the schema.

#include <fmt/format.h>

#include "cli/command.h"
#include "core/model_spec.h"

namespace apiary::cli {

namespace {

const char* type_word(core::ValueType t) {
    switch (t) {
        case core::ValueType::boolean: return "bool";
        case core::ValueType::integer: return "int";
        case core::ValueType::real: return "float";
        case core::ValueType::string: return "string";
    }
    return "?";
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("config", "list config keys and model presets");
    cmd->require_subcommand(1);

    auto* keys = cmd->add_subcommand("keys", "every config key: type, default and meaning");
    static bool markdown = false;
    keys->add_flag("--markdown", markdown, "print a Markdown table (docs/config.md)");
    keys->callback([] {
        const auto& schema = full_schema();
        if (markdown) {
            fmt::print("| key | type | default | meaning |\n|---|---|---|---|\n");
        }
        for (const auto& k : schema.keys()) {
            std::string def = core::value_to_string(k.default_value);
            std::string doc = k.doc;
            if (!k.choices.empty()) {
                std::string list;
                for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + (c.empty() ? "\"\"" : c);
                doc += " [" + list + "]";
            }
            if (markdown) {
                fmt::print("| `{}` | {} | `{}` | {} |\n", k.key, type_word(k.type), def, doc);
            } else {
                fmt::print("{:<28} {:<6} {:<12} {}\n", k.key, type_word(k.type), def, doc);
            }
        }
    });

    auto* presets = cmd->add_subcommand("presets", "named model shapes");
    presets->callback([] {
        fmt::print("{:<14} {:<6} {:>4} {:>6} {:>4} {:>4} {:>7} {:>6} {:>14}\n", "preset", "arch",
                   "L", "C", "NH", "KV", "V", "T", "params");
        for (const auto& name : core::preset_names()) {
            const auto& s = core::preset(name);
            fmt::print("{:<14} {:<6} {:>4} {:>6} {:>4} {:>4} {:>7} {:>6} {:>14}\n", name,
                       core::arch_name(s.arch), s.n_layer, s.n_embd, s.n_head, s.n_kv_head,
                       s.vocab_size, s.max_seq_len, s.num_params());
        }
    });

    auto* show = cmd->add_subcommand("show", "the resolved config: defaults, file, overrides");
    static std::string file;
    static std::vector<std::string> sets;
    show->add_option("--config", file, "TOML config file");
    show->add_option("--set", sets, "key=value override (repeatable)");
    show->callback([] { fmt::print("{}", load_config(file, sets).to_toml()); });
}

CommandRegistrar reg("config", setup);

}  // namespace

}  // namespace apiary::cli
