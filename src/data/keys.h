#pragma once
// Config keys of the data layer (data.*); `apiary config keys` lists them.

namespace apiary::core {
class Schema;
}

namespace apiary::data {

void add_keys(core::Schema& schema);

}  // namespace apiary::data
