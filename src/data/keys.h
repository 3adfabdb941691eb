#pragma once
// Config keys of the data layer (data.*); `apiary config keys` lists them.

#include "data/remote.h"

namespace apiary::core {
class Config;
class Schema;
}  // namespace apiary::core

namespace apiary::data {

void add_keys(core::Schema& schema);

// Every data.* key of a remote source (cache, S3 endpoint and region): the
// one place that reads them, for the loader and for `apiary train`'s
// resolution of its sources alike.
RemoteOptions remote_options_from(const core::Config& config);

}  // namespace apiary::data
