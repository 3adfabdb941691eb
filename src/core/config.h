#pragma once
// Typed, documented configuration. A Schema lists every key (type, default,
// range, one line of documentation); a Config holds values for a schema,
// filled from defaults, then TOML files, then `--set key=value` overrides.
// Every error names the key and where the value came from, and an unknown key
// gets a "did you mean" suggestion. The resolved config writes itself back as
// TOML with every default, so a run directory records exactly what ran.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace apiary::core {

enum class ValueType { boolean, integer, real, string };
using Value = std::variant<bool, int64_t, double, std::string>;

struct KeySpec {
    std::string key;  // "section.name"
    ValueType type = ValueType::integer;
    Value default_value;
    std::string doc;
    std::optional<double> min, max;    // inclusive bounds for numbers
    std::vector<std::string> choices;  // allowed strings, empty: any
};

class Schema {
public:
    Schema& add_bool(const std::string& key, bool def, const std::string& doc);
    Schema& add_int(const std::string& key, int64_t def, const std::string& doc,
                    std::optional<double> min = std::nullopt,
                    std::optional<double> max = std::nullopt);
    Schema& add_real(const std::string& key, double def, const std::string& doc,
                     std::optional<double> min = std::nullopt,
                     std::optional<double> max = std::nullopt);
    Schema& add_string(const std::string& key, const std::string& def, const std::string& doc,
                       std::vector<std::string> choices = {});

    const KeySpec* find(const std::string& key) const;
    // The known key closest to `key` by edit distance, or "" if none is close.
    std::string suggest(const std::string& key) const;
    const std::vector<KeySpec>& keys() const { return keys_; }

private:
    Schema& add(KeySpec spec);
    std::vector<KeySpec> keys_;
    std::map<std::string, size_t> index_;
};

class Config {
public:
    explicit Config(const Schema& schema);

    // Reads a TOML file; every key must be in the schema. Throws ConfigError
    // naming the file, line and key.
    void load_file(const std::string& path);
    void load_string(const std::string& toml_text, const std::string& source);
    // "a.b=value" from the command line; the value is parsed by the key's type.
    void set(const std::string& assignment);
    void set_value(const std::string& key, const Value& value, const std::string& source);

    int64_t get_int(const std::string& key) const;
    double get_real(const std::string& key) const;
    bool get_bool(const std::string& key) const;
    const std::string& get_string(const std::string& key) const;
    // True when a file or --set gave the key a value (not just its default).
    bool is_set(const std::string& key) const;
    // Where the value came from: "default", a file path, or "--set".
    const std::string& source(const std::string& key) const;

    // Every key, grouped by section, each with its doc line as a comment.
    std::string to_toml() const;
    // Hash of the resolved values; ranks compare it at start-up.
    uint64_t hash() const;
    const Schema& schema() const { return *schema_; }

private:
    const Value& get(const std::string& key, ValueType type) const;
    const Schema* schema_;
    std::map<std::string, Value> values_;
    std::map<std::string, std::string> sources_;
};

// Keys shared by the trainer and the planner: model.*, parallel.* and the
// batch keys (train.batch_size, train.seq_len, train.grad_accum,
// train.precision). Each layer adds its own keys to the same schema.
void add_shared_keys(Schema& schema);

struct ModelSpec;
// Resolves model.preset, then applies every model.* key that was set.
ModelSpec model_spec_from(const Config& config);

// A TOML string literal with escapes, for writers of TOML.
std::string toml_quote(const std::string& s);
std::string value_to_string(const Value& v);

}  // namespace apiary::core
