#pragma once
// Small text helpers shared by the writers of SVG and HTML (sim/, obs/).

#include <string>

namespace apiary::core {

// s with &, <, > and " replaced by their XML entities: safe as element text
// and inside a double-quoted attribute.
std::string xml_escape(const std::string& s);

}  // namespace apiary::core
