#include "comm/mesh.h"

#include <fmt/format.h>

#include <sstream>

#include "core/error.h"

namespace apiary::comm {

const char* axis_name(Axis a) {
    switch (a) {
        case Axis::dp:
            return "dp";
        case Axis::tp:
            return "tp";
        case Axis::pp:
            return "pp";
    }
    return "?";
}

std::string MeshShape::describe() const {
    std::string out;
    for (Axis a : order) {
        out += fmt::format("{}{}({})", out.empty() ? "" : " * ", axis_name(a), size(a));
    }
    return out;
}

namespace {

std::array<Axis, 3> parse_order(const std::string& text) {
    std::array<Axis, 3> order{};
    std::array<bool, 3> seen{};
    std::stringstream ss(text);
    std::string item;
    int n = 0;
    while (std::getline(ss, item, ',')) {
        item.erase(0, item.find_first_not_of(" \t"));
        item.erase(item.find_last_not_of(" \t") + 1);
        Axis a;
        if (item == "dp")
            a = Axis::dp;
        else if (item == "tp")
            a = Axis::tp;
        else if (item == "pp")
            a = Axis::pp;
        else {
            throw ConfigError(fmt::format(
                "parallel.axis_order: unknown axis '{}' in '{}'; use a permutation of tp,pp,dp",
                item, text));
        }
        if (n >= 3 || seen[size_t(a)]) {
            throw ConfigError(fmt::format(
                "parallel.axis_order: '{}' must name each of tp, pp and dp exactly once", text));
        }
        seen[size_t(a)] = true;
        order[size_t(n++)] = a;
    }
    if (n != 3) {
        throw ConfigError(fmt::format(
            "parallel.axis_order: '{}' must name each of tp, pp and dp exactly once", text));
    }
    return order;
}

}  // namespace

MeshShape resolve_mesh(int world_size, int dp, int tp, int pp, const std::string& axis_order) {
    MeshShape s;
    s.order = parse_order(axis_order);
    s.tp = tp;
    s.pp = pp;
    if (tp < 1 || pp < 1 || dp < 0) {
        throw ConfigError(
            fmt::format("parallel: tp({}), pp({}) must be >= 1 and dp({}) >= 0", tp, pp, dp));
    }
    if (dp == 0) {
        if (world_size % (tp * pp) != 0) {
            throw ConfigError(fmt::format(
                "parallel: world size {} is not divisible by tp({}) * pp({}) = {}; launch a "
                "multiple of {} ranks or change parallel.tp / parallel.pp",
                world_size, tp, pp, tp * pp, tp * pp));
        }
        dp = world_size / (tp * pp);
    }
    s.dp = dp;
    if (s.world_size() != world_size) {
        throw ConfigError(fmt::format(
            "parallel: {} != world size {}; set parallel.dp, parallel.tp and parallel.pp so "
            "that their product is the number of ranks (parallel.dp = 0 derives dp)",
            s.describe(), world_size));
    }
    return s;
}

MeshShape mesh_shape_from(const core::Config& c, int world_size) {
    return resolve_mesh(world_size, int(c.get_int("parallel.dp")), int(c.get_int("parallel.tp")),
                        int(c.get_int("parallel.pp")), c.get_string("parallel.axis_order"));
}

MeshCoord coord_of(const MeshShape& shape, int world_rank) {
    MeshCoord c;
    int rest = world_rank;
    for (Axis a : shape.order) {
        const int v = rest % shape.size(a);
        rest /= shape.size(a);
        (a == Axis::dp ? c.dp : a == Axis::tp ? c.tp : c.pp) = v;
    }
    return c;
}

int rank_of(const MeshShape& shape, const MeshCoord& coord) {
    int rank = 0;
    for (int i = 2; i >= 0; --i) {
        const Axis a = shape.order[size_t(i)];
        rank = rank * shape.size(a) + coord.at(a);
    }
    return rank;
}

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, const MeshShape& shape)
    : world_(std::move(world)), shape_(shape) {
    if (shape_.world_size() != world_->size()) {
        throw ConfigError(
            fmt::format("parallel: {} != world size {}", shape_.describe(), world_->size()));
    }
    coord_ = coord_of(shape_, world_->rank());
    for (Axis a : {Axis::dp, Axis::tp, Axis::pp}) {
        // Members of this rank's group along `a` share the other two coordinates;
        // their linear index is the colour, the coordinate along `a` the order.
        int color = 0;
        for (Axis b : shape_.order) {
            if (b != a) color = color * shape_.size(b) + coord_.at(b);
        }
        groups_[size_t(a)] = world_->split(color, coord_.at(a), axis_name(a));
    }
}

}  // namespace apiary::comm
