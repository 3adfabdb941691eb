#include "comm/nccl_bootstrap.h"

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"

namespace apiary::comm {

namespace {

// One broadcast of fixed size: status, message length, the id, the message.
constexpr int64_t kMessageBytes = 256;
struct Payload {
    int64_t ok = 0;
    int64_t message_len = 0;
    uint8_t id[kNcclIdBytes] = {};
    char message[kMessageBytes] = {};
};
static_assert(sizeof(Payload) % sizeof(int64_t) == 0);

}  // namespace

NcclId exchange_nccl_id(ProcessGroup& boot, const std::function<NcclId()>& make) {
    Payload p;
    std::exception_ptr failure;
    if (boot.rank() == 0) {
        try {
            const NcclId id = make();
            std::memcpy(p.id, id.data(), kNcclIdBytes);
            p.ok = 1;
        } catch (const std::exception& e) {
            failure = std::current_exception();
            const std::string m = e.what();
            p.message_len = int64_t(std::min<size_t>(m.size(), kMessageBytes));
            std::memcpy(p.message, m.data(), size_t(p.message_len));
        }
    }
    boot.broadcast(&p, int64_t(sizeof(Payload) / sizeof(int64_t)), DType::i64, 0, Tag{"nccl_id", 0})
        ->wait();
    if (failure) std::rethrow_exception(failure);
    if (p.ok != 1) {
        throw CommError(fmt::format(
            "NCCL bootstrap of {}: rank 0 could not create the NCCL unique id: {}", boot.describe(),
            std::string(p.message, size_t(std::clamp<int64_t>(p.message_len, 0, kMessageBytes)))));
    }
    NcclId id;
    std::memcpy(id.data(), p.id, kNcclIdBytes);
    return id;
}

}  // namespace apiary::comm
