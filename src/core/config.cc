#include "core/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/parallelism.h"

namespace apiary::core {

namespace {

const char* type_name(ValueType t) {
    switch (t) {
        case ValueType::boolean:
            return "a boolean";
        case ValueType::integer:
            return "an integer";
        case ValueType::real:
            return "a number";
        case ValueType::string:
            return "a string";
    }
    return "?";
}

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

}  // namespace

std::string toml_quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    out += fmt::format("\\u{:04x}", c);
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

std::string value_to_string(const Value& v) {
    return std::visit(
        [](const auto& x) -> std::string {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, bool>) {
                return x ? "true" : "false";
            } else if constexpr (std::is_same_v<T, int64_t>) {
                return std::to_string(x);
            } else if constexpr (std::is_same_v<T, double>) {
                std::string s = fmt::format("{}", x);
                if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
                return s;
            } else {
                return toml_quote(x);
            }
        },
        v);
}

// ---- Schema ----

Schema& Schema::add(KeySpec spec) {
    APIARY_CHECK(!index_.count(spec.key), "config key '{}' registered twice", spec.key);
    APIARY_CHECK(spec.key.find('.') != std::string::npos, "config key '{}' has no section",
                 spec.key);
    index_[spec.key] = keys_.size();
    keys_.push_back(std::move(spec));
    return *this;
}

Schema& Schema::add_bool(const std::string& key, bool def, const std::string& doc) {
    return add({key, ValueType::boolean, def, doc, {}, {}, {}});
}

Schema& Schema::add_int(const std::string& key, int64_t def, const std::string& doc,
                        std::optional<double> min, std::optional<double> max) {
    return add({key, ValueType::integer, def, doc, min, max, {}});
}

Schema& Schema::add_real(const std::string& key, double def, const std::string& doc,
                         std::optional<double> min, std::optional<double> max) {
    return add({key, ValueType::real, def, doc, min, max, {}});
}

Schema& Schema::add_string(const std::string& key, const std::string& def, const std::string& doc,
                           std::vector<std::string> choices) {
    return add({key, ValueType::string, def, doc, {}, {}, std::move(choices)});
}

const KeySpec* Schema::find(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &keys_[it->second];
}

std::string Schema::suggest(const std::string& key) const {
    std::string best;
    size_t best_d = std::max<size_t>(3, key.size() / 3) + 1;
    for (const auto& k : keys_) {
        // Compare both the full key and the name without its section, so
        // "lr" suggests "train.lr" and "train.learning_rat" suggests too.
        const std::string tail = k.key.substr(k.key.find('.') + 1);
        const size_t d = std::min(edit_distance(key, k.key), edit_distance(key, tail));
        if (d < best_d) best_d = d, best = k.key;
    }
    return best;
}

// ---- Config ----

Config::Config(const Schema& schema) : schema_(&schema) {
    for (const auto& k : schema.keys()) {
        values_[k.key] = k.default_value;
        sources_[k.key] = "default";
    }
}

void Config::set_value(const std::string& key, const Value& raw, const std::string& source) {
    const KeySpec* spec = schema_->find(key);
    if (!spec) {
        const std::string hint = schema_->suggest(key);
        throw ConfigError(fmt::format("{}: unknown config key '{}'{}", source, key,
                                      hint.empty()
                                          ? std::string(" (run `apiary config keys` for the list)")
                                          : fmt::format(" (did you mean '{}'?)", hint)));
    }
    Value v = raw;
    // Numbers convert where no information is lost: 3 -> 3.0, 1e3 -> 1000.
    if (spec->type == ValueType::real && std::holds_alternative<int64_t>(v)) {
        v = double(std::get<int64_t>(v));
    }
    if (spec->type == ValueType::integer && std::holds_alternative<double>(v)) {
        const double d = std::get<double>(v);
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) v = int64_t(d);
    }
    const bool type_ok =
        (spec->type == ValueType::boolean && std::holds_alternative<bool>(v)) ||
        (spec->type == ValueType::integer && std::holds_alternative<int64_t>(v)) ||
        (spec->type == ValueType::real && std::holds_alternative<double>(v)) ||
        (spec->type == ValueType::string && std::holds_alternative<std::string>(v));
    if (!type_ok) {
        throw ConfigError(fmt::format("{}: {} must be {}, got {}", source, key,
                                      type_name(spec->type), value_to_string(raw)));
    }
    if (spec->type == ValueType::integer || spec->type == ValueType::real) {
        const double d =
            spec->type == ValueType::integer ? double(std::get<int64_t>(v)) : std::get<double>(v);
        if (!std::isfinite(d) || (spec->min && d < *spec->min) || (spec->max && d > *spec->max)) {
            std::string range;
            if (spec->min && spec->max) {
                range = fmt::format("between {} and {}", *spec->min, *spec->max);
            } else if (spec->min) {
                range = fmt::format("at least {}", *spec->min);
            } else if (spec->max) {
                range = fmt::format("at most {}", *spec->max);
            } else {
                range = "finite";
            }
            throw ConfigError(fmt::format("{}: {} = {} is out of range: must be {}", source, key,
                                          value_to_string(v), range));
        }
    }
    if (spec->type == ValueType::string && !spec->choices.empty()) {
        const auto& s = std::get<std::string>(v);
        if (std::find(spec->choices.begin(), spec->choices.end(), s) == spec->choices.end()) {
            throw ConfigError(fmt::format("{}: {} = '{}' is not one of: {}", source, key, s,
                                          fmt::join(spec->choices, ", ")));
        }
    }
    values_[key] = v;
    sources_[key] = source;
}

namespace {

void flatten(const toml::table& table, const std::string& prefix, const std::string& path,
             Config& config) {
    for (const auto& [k, node] : table) {
        const std::string key =
            prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
        const auto& src = node.source();
        const std::string where = fmt::format("{}:{}", path, src.begin.line);
        if (const auto* sub = node.as_table()) {
            flatten(*sub, key, path, config);
        } else if (const auto* b = node.as_boolean()) {
            config.set_value(key, b->get(), where);
        } else if (const auto* i = node.as_integer()) {
            config.set_value(key, int64_t(i->get()), where);
        } else if (const auto* f = node.as_floating_point()) {
            config.set_value(key, f->get(), where);
        } else if (const auto* s = node.as_string()) {
            config.set_value(key, s->get(), where);
        } else {
            throw ConfigError(
                fmt::format("{}: {} has an unsupported TOML type (arrays and "
                            "dates are not config values)",
                            where, key));
        }
    }
}

}  // namespace

void Config::load_string(const std::string& text, const std::string& source) {
    toml::table table;
    try {
        table = toml::parse(text, source);
    } catch (const toml::parse_error& e) {
        throw ConfigError(fmt::format("{}:{}:{}: invalid TOML: {}", source, e.source().begin.line,
                                      e.source().begin.column, e.description()));
    }
    flatten(table, "", source, *this);
}

void Config::load_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError(fmt::format("{}: cannot open config file", path));
    std::stringstream ss;
    ss << in.rdbuf();
    load_string(ss.str(), path);
}

void Config::set(const std::string& assignment) {
    const auto eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
        throw ConfigError(fmt::format("--set '{}': expected key=value", assignment));
    }
    const std::string key = assignment.substr(0, eq);
    const std::string text = assignment.substr(eq + 1);
    const std::string where = fmt::format("--set {}", assignment);
    const KeySpec* spec = schema_->find(key);
    if (!spec) {
        set_value(key, text, where);  // throws with a suggestion
        return;
    }
    auto parse_number = [&](auto& out) {
        const char* b = text.data();
        const char* e = text.data() + text.size();
        auto [p, ec] = std::from_chars(b, e, out);
        return ec == std::errc() && p == e;
    };
    switch (spec->type) {
        case ValueType::boolean:
            if (text == "true" || text == "1") return set_value(key, true, where);
            if (text == "false" || text == "0") return set_value(key, false, where);
            break;
        case ValueType::integer: {
            int64_t i = 0;
            if (parse_number(i)) return set_value(key, i, where);
            double d = 0;
            if (parse_number(d)) return set_value(key, d, where);  // 1e3 -> 1000
            break;
        }
        case ValueType::real: {
            double d = 0;
            if (parse_number(d)) return set_value(key, d, where);
            break;
        }
        case ValueType::string:
            return set_value(key, text, where);
    }
    throw ConfigError(
        fmt::format("{}: {} must be {}, got '{}'", where, key, type_name(spec->type), text));
}

const Value& Config::get(const std::string& key, ValueType type) const {
    const KeySpec* spec = schema_->find(key);
    APIARY_CHECK(spec != nullptr, "config key '{}' is not in the schema", key);
    APIARY_CHECK(spec->type == type, "config key '{}' read as {} but it is {}", key,
                 type_name(type), type_name(spec->type));
    return values_.at(key);
}

int64_t Config::get_int(const std::string& key) const {
    return std::get<int64_t>(get(key, ValueType::integer));
}
double Config::get_real(const std::string& key) const {
    return std::get<double>(get(key, ValueType::real));
}
bool Config::get_bool(const std::string& key) const {
    return std::get<bool>(get(key, ValueType::boolean));
}
const std::string& Config::get_string(const std::string& key) const {
    return std::get<std::string>(get(key, ValueType::string));
}
bool Config::is_set(const std::string& key) const {
    auto it = sources_.find(key);
    return it != sources_.end() && it->second != "default";
}
const std::string& Config::source(const std::string& key) const { return sources_.at(key); }

std::string Config::to_toml() const {
    std::map<std::string, std::vector<const KeySpec*>> sections;
    std::vector<std::string> order;
    for (const auto& k : schema_->keys()) {
        const std::string section = k.key.substr(0, k.key.rfind('.'));
        if (!sections.count(section)) order.push_back(section);
        sections[section].push_back(&k);
    }
    std::string out;
    for (const auto& section : order) {
        out += fmt::format("[{}]\n", section);
        for (const KeySpec* k : sections[section]) {
            out += fmt::format("# {}\n{} = {}\n", k->doc, k->key.substr(section.size() + 1),
                               value_to_string(values_.at(k->key)));
        }
        out += "\n";
    }
    return out;
}

uint64_t Config::hash() const {
    XXH64_state_t* st = XXH64_createState();
    XXH64_reset(st, 0);
    for (const auto& [k, v] : values_) {
        const std::string line = k + "=" + value_to_string(v) + "\n";
        XXH64_update(st, line.data(), line.size());
    }
    const uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

// ---- keys shared by trainer and planner ----

void add_shared_keys(Schema& s) {
    s.add_string("model.preset", "tiny",
                 "named model shape; model.* keys set below override its fields "
                 "(`apiary config presets` lists them)");
    s.add_string("model.arch", "", "architecture: gpt2 or llama (empty: from the preset)",
                 {"", "gpt2", "llama"});
    s.add_int("model.n_layer", 0, "transformer blocks L (0: from the preset)", 0, 1000);
    s.add_int("model.n_embd", 0, "model width C (0: from the preset)", 0, 1 << 20);
    s.add_int("model.n_head", 0, "attention heads NH (0: from the preset)", 0, 4096);
    s.add_int("model.n_kv_head", 0,
              "key/value heads for grouped-query attention, llama only (0: from the preset)", 0,
              4096);
    s.add_int("model.vocab_size", 0,
              "vocabulary size V (0: the tokenizer's when training, the preset's when planning; "
              "training accepts V >= the tokenizer's, the extra rows unused)",
              0, 1 << 24);
    s.add_int("model.max_seq_len", 0, "longest sequence the model accepts (0: from the preset)", 0,
              1 << 22);
    s.add_int("model.ffn_hidden", 0, "MLP hidden width (0: 4C for gpt2, 8C/3 rounded for llama)", 0,
              1 << 22);
    s.add_string("model.tie_embeddings", "",
                 "share the token embedding with the LM head: true, false or empty (preset)",
                 {"", "true", "false"});
    s.add_real("model.norm_eps", 0.0, "LayerNorm / RMSNorm epsilon (0: from the preset)", 0.0, 1.0);
    s.add_real("model.rope_theta", 0.0, "RoPE base, llama only (0: from the preset)", 0.0, 1e9);
    s.add_int("model.head_dim", 0, "width of one attention head (0: n_embd / n_head)", 0, 1 << 16);
    s.add_int("model.kv_lora_rank", 0,
              "latent attention (DeepSeek-V2/V3) key/value rank; 0: plain attention (planner only)",
              0, 1 << 20);
    s.add_int("model.q_lora_rank", 0, "latent attention query rank (0: full-rank queries)", 0,
              1 << 20);
    s.add_int("model.qk_rope_dim", 0, "latent attention rotary query/key width per head", 0,
              1 << 16);
    s.add_int("model.v_head_dim", 0, "latent attention value width per head (0: head_dim)", 0,
              1 << 16);
    s.add_int("model.n_expert", 0, "routed experts per MoE block; 0: dense", 0,
              1 << 16);
    s.add_int("model.n_expert_active", 0, "routed experts each token uses (top-k)", 0, 1 << 16);
    s.add_int("model.n_shared_expert", 0, "experts every token uses besides the routed ones", 0,
              1 << 16);
    s.add_int("model.moe_ffn_hidden", 0, "hidden width of one expert (0: model.ffn_hidden)", 0,
              1 << 22);
    s.add_int("model.moe_dense_layers", 0, "leading blocks with a dense MLP instead of experts", 0,
              1000);
    s.add_string("model.moe_router", "softmax",
                 "expert scores: softmax, or sigmoid with a selection bias (DeepSeek-V3)",
                 {"softmax", "sigmoid"});
    s.add_bool("model.moe_dropless", false,
               "no capacity cut: every expert takes every token routed to it");
    s.add_real("model.moe_capacity_factor", 1.25,
               "rows per expert as a multiple of its even share N K / E of a micro-batch's "
               "choices; choices beyond it are dropped (must be > 0)",
               0.0, 1000.0);
    s.add_real("model.moe_aux_loss_coef", 0.01,
               "coefficient of the load-balancing loss E sum_e f_e P_e per MoE block", 0.0, 100.0);
    s.add_real("model.moe_z_loss_coef", 0.001,
               "coefficient of the router z-loss mean logsumexp(logits)^2 per MoE block", 0.0,
               100.0);

    s.add_int("train.batch_size", 16, "micro-batch size B, sequences per rank per micro-step", 1,
              1 << 20);
    s.add_int("train.seq_len", 128, "sequence length T of a training sample", 1, 1 << 22);
    s.add_int("train.grad_accum", 1, "micro-steps accumulated into one optimizer step", 1, 1 << 20);
    s.add_string("train.precision", "fp32",
                 "compute precision: fp32, bf16 or fp16 (fp8: planner only)",
                 {"fp32", "bf16", "fp16", "fp8"});
    s.add_string("train.device", "cpu",
                 "where the step computes: cpu, or cuda (needs a CUDA build and a GPU; the "
                 "trainer's GPU step is not wired yet, see docs/gpu.md)",
                 {"cpu", "cuda"});

    s.add_int("parallel.dp", 0, "data-parallel ranks (0: world size / (tp * pp))", 0, 1 << 24);
    s.add_int("parallel.tp", 1, "tensor-parallel ranks", 1, 1 << 16);
    s.add_int("parallel.pp", 1, "pipeline-parallel stages", 1, 1 << 16);
    s.add_int("parallel.cp", 1,
              "context-parallel ranks: each holds 1/cp of every sequence (planner only)", 1,
              1 << 16);
    s.add_int("parallel.ep", 1,
              "expert-parallel ranks, carved out of the data-parallel ones: each holds 1/ep of the routed experts", 1,
              1 << 16);
    s.add_int("parallel.zero_stage", 0,
              "ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters", 0, 3);
    s.add_string("parallel.recompute", "none",
                 "activation recomputation: none, selective (attention) or full (whole block)",
                 {"none", "selective", "full"});
    s.add_bool("parallel.sequence_parallel", false,
               "shard the norm and residual activations along the sequence across tp ranks");
    s.add_int("parallel.microbatches", 0, "pipeline micro-batches per step (0: train.grad_accum)",
              0, 1 << 20);
    s.add_string("parallel.schedule", "1f1b", "pipeline schedule: gpipe, 1f1b or interleaved",
                 {"gpipe", "1f1b", "interleaved"});
    s.add_int("parallel.virtual_stages", 2,
              "model chunks per pipeline stage under parallel.schedule = interleaved", 1, 1 << 10);
    s.add_string("parallel.stage_layers", "",
                 "blocks per pipeline stage (per virtual stage when interleaved), comma-separated, "
                 "e.g. \"5,4,3\" (empty: balanced by the planner's cost model, the head's "
                 "cost included)");
    s.add_string("parallel.layout", "manual",
                 "manual: the parallel.* keys as given; auto: apiary train asks the planner "
                 "(with plan.calibration, and the ranks and hosts it was launched on) for the "
                 "fastest layout that fits the global batch and trains with it",
                 {"manual", "auto"});
    s.add_string("parallel.axis_order", kAxisOrder,
                 "mesh axes from fastest-varying (neighbouring ranks) to slowest");
}

ModelSpec model_spec_from(const Config& c) {
    ModelSpec s = preset(c.get_string("model.preset"));
    if (const auto& a = c.get_string("model.arch"); !a.empty()) s.arch = parse_arch(a);
    auto override_int = [&](const char* key, int& field) {
        if (const int64_t v = c.get_int(key); v > 0) field = int(v);
    };
    override_int("model.n_layer", s.n_layer);
    override_int("model.n_embd", s.n_embd);
    override_int("model.n_head", s.n_head);
    override_int("model.n_kv_head", s.n_kv_head);
    override_int("model.vocab_size", s.vocab_size);
    override_int("model.max_seq_len", s.max_seq_len);
    override_int("model.ffn_hidden", s.ffn_hidden);
    override_int("model.head_dim", s.head_dim);
    override_int("model.kv_lora_rank", s.kv_lora_rank);
    override_int("model.q_lora_rank", s.q_lora_rank);
    override_int("model.qk_rope_dim", s.qk_rope_dim);
    override_int("model.v_head_dim", s.v_head_dim);
    override_int("model.n_expert", s.n_expert);
    override_int("model.n_expert_active", s.n_expert_active);
    override_int("model.n_shared_expert", s.n_shared_expert);
    override_int("model.moe_ffn_hidden", s.moe_ffn_hidden);
    override_int("model.moe_dense_layers", s.moe_dense_layers);
    // A gpt2 model given only a new head count keeps plain multi-head attention.
    if (s.arch == Arch::gpt2 && c.get_int("model.n_kv_head") == 0) s.n_kv_head = s.n_head;
    if (const auto& t = c.get_string("model.tie_embeddings"); !t.empty()) {
        s.tie_embeddings = t == "true";
    }
    if (const double e = c.get_real("model.norm_eps"); e > 0) s.norm_eps = float(e);
    if (const double r = c.get_real("model.rope_theta"); r > 0) s.rope_theta = float(r);
    s.moe_sigmoid = c.get_string("model.moe_router") == "sigmoid";
    s.moe_dropless = c.get_bool("model.moe_dropless");
    s.moe_capacity_factor = float(c.get_real("model.moe_capacity_factor"));
    s.moe_aux_loss_coef = float(c.get_real("model.moe_aux_loss_coef"));
    s.moe_z_loss_coef = float(c.get_real("model.moe_z_loss_coef"));
    s.validate();
    return s;
}

}  // namespace apiary::core
