// The docs against the binary: docs/config.md is generated from the schema
// and must be current (`apiary config keys --markdown`, see the file's
// header); the user guide must name every config key, and the README's
// command list every verb and subcommand `apiary --help` lists.

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../cli_util.h"

using namespace apiary::testing;

namespace {

std::string read_doc(const std::string& relative) {
    std::ifstream in(std::string(APIARY_SOURCE_DIR) + "/" + relative);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The names under "Subcommands:" in a help text (CLI11: two spaces, the
// name, then its description).
std::vector<std::string> subcommands(const std::string& help) {
    std::vector<std::string> out;
    const auto at = help.find("Subcommands:");
    if (at == std::string::npos) return out;
    std::stringstream ss(help.substr(at));
    std::string line;
    std::getline(ss, line);
    const std::regex entry(R"(^  ([a-z][a-z0-9-]*)\s)");
    std::smatch m;
    while (std::getline(ss, line)) {
        if (std::regex_search(line, m, entry)) out.push_back(m[1]);
    }
    return out;
}

}  // namespace

TEST(Docs, ConfigReferenceIsCurrent) {
    const auto r = run_command(apiary_bin() + " config keys --markdown");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string doc = read_doc("docs/config.md");
    ASSERT_FALSE(doc.empty()) << "docs/config.md is missing";
    const auto table = doc.find("| key |");
    ASSERT_NE(table, std::string::npos) << "docs/config.md has no key table";
    EXPECT_EQ(doc.substr(table), r.output)
        << "docs/config.md is stale: regenerate its table with `apiary config keys --markdown`";
}

TEST(Docs, UserGuideNamesEveryConfigKey) {
    const auto r = run_command(apiary_bin() + " config keys --markdown");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string guide = read_doc("docs/user-guide.md");
    ASSERT_FALSE(guide.empty()) << "docs/user-guide.md is missing";
    const std::regex row(R"(^\| `([a-z_]+\.[a-z0-9_]+)` \|)");
    int keys = 0;
    std::stringstream ss(r.output);
    for (std::string line; std::getline(ss, line);) {
        std::smatch m;
        if (!std::regex_search(line, m, row)) continue;
        ++keys;
        const std::string key = m[1].str();
        std::string quoted = "`";  // (appending: GCC 12 misreads "`" + key as overlapping)
        quoted += key;
        quoted += '`';
        EXPECT_NE(guide.find(quoted), std::string::npos)
            << "docs/user-guide.md does not name config key " << key
            << " (add it to \"Config keys\" with its meaning)";
    }
    EXPECT_GT(keys, 100) << "the key table did not parse:\n" << r.output;
}

TEST(Docs, ReadmeNamesEveryCommand) {
    const std::string readme = read_doc("README.md");
    ASSERT_FALSE(readme.empty()) << "README.md is missing";
    const auto top = run_command(apiary_bin() + " --help");
    ASSERT_EQ(top.exit_code, 0) << top.output;
    const auto verbs = subcommands(top.output);
    EXPECT_GE(verbs.size(), 10u) << top.output;
    for (const auto& verb : verbs) {
        EXPECT_NE(readme.find("apiary " + verb), std::string::npos)
            << "README.md does not mention `apiary " << verb << "`";
        const auto help = run_command(apiary_bin() + " " + verb + " --help");
        ASSERT_EQ(help.exit_code, 0) << help.output;
        for (const auto& sub : subcommands(help.output)) {
            // In the command list (`apiary bench ckpt`) or as a shorthand
            // after the verb's first mention (`bench ckpt`).
            EXPECT_NE(readme.find(verb + " " + sub), std::string::npos)
                << "README.md does not mention `apiary " << verb << " " << sub << "`";
        }
    }
}
