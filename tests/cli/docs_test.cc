// docs/config.md is generated from the schema: this fails when a key is
// added, removed or changed without regenerating it
// (`apiary config keys --markdown`, see the file's header).

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "../cli_util.h"

using namespace apiary::testing;

TEST(Docs, ConfigReferenceIsCurrent) {
    const auto r = run_command(apiary_bin() + " config keys --markdown");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(std::string(APIARY_SOURCE_DIR) + "/docs/config.md");
    ASSERT_TRUE(in) << "docs/config.md is missing";
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string doc = ss.str();
    const auto table = doc.find("| key |");
    ASSERT_NE(table, std::string::npos) << "docs/config.md has no key table";
    EXPECT_EQ(doc.substr(table), r.output)
        << "docs/config.md is stale: regenerate its table with `apiary config keys --markdown`";
}
