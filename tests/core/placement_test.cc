// core::Placement::validate on shapes a damaged or hostile manifest can hold.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "core/placement.h"

namespace apiary::core {
namespace {

Placement whole(std::vector<int64_t> shape) {
    Placement p;
    p.global_shape = shape;
    p.local_shape = shape;
    return p;
}

TEST(Placement, AShapeWhoseProductOverflowsIsRefused) {
    // 2^31 x 2^31 wraps to 0 bytes in a product of int32 and overflows
    // nothing in int64, but is far past any machine: refused, naming it.
    try {
        whole({int64_t(1) << 31, int64_t(1) << 31}).validate();
        FAIL() << "accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("2147483648, 2147483648"), std::string::npos)
            << e.what();
    }
    // A product that overflows 64 bits.
    EXPECT_THROW(whole({int64_t(1) << 40, int64_t(1) << 40, int64_t(1) << 40}).validate(),
                 std::invalid_argument);
}

TEST(Placement, OrdinaryAndEmptyShapesPass) {
    EXPECT_NO_THROW(whole({50257, 768}).validate());
    EXPECT_NO_THROW(whole({0, int64_t(1) << 62}).validate());  // no elements
    EXPECT_NO_THROW(whole({}).validate());                     // a scalar
}

}  // namespace
}  // namespace apiary::core
