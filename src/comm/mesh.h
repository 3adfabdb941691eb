#pragma once
// DeviceMesh: the world as a dp x pp x tp grid of ranks, with one process
// group per axis. The axis order (parallel.axis_order) says which axis varies
// fastest across neighbouring world ranks. The default is the rank order the
// planner and the simulator assume too (core::kAxisOrder, "tp,dp,pp"): a tp
// group on neighbouring ranks (one node), where its frequent, latency-bound
// traffic belongs, then dp, whose traffic overlaps backward, and pp, whose
// few point-to-point messages span the farthest.

#include <array>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "core/config.h"

namespace apiary::comm {

enum class Axis { dp, tp, pp };
const char* axis_name(Axis a);

struct MeshShape {
    int dp = 1, tp = 1, pp = 1;
    std::array<Axis, 3> order{Axis::tp, Axis::dp, Axis::pp};  // fastest first: core::kAxisOrder

    int size(Axis a) const { return a == Axis::dp ? dp : a == Axis::tp ? tp : pp; }
    int world_size() const { return dp * tp * pp; }
    // "tp(2) * pp(2) * dp(3)", in axis order.
    std::string describe() const;
};

struct MeshCoord {
    int dp = 0, tp = 0, pp = 0;
    int at(Axis a) const { return a == Axis::dp ? dp : a == Axis::tp ? tp : pp; }
};

// Checks and completes a layout before anything is allocated. dp = 0 means
// world_size / (tp * pp). Throws ConfigError naming the parallel.* keys, e.g.
// "tp(2) * pp(2) * dp(3) != world size 8".
MeshShape resolve_mesh(int world_size, int dp, int tp, int pp, const std::string& axis_order);
// Same from parallel.dp, parallel.tp, parallel.pp and parallel.axis_order.
MeshShape mesh_shape_from(const core::Config& config, int world_size);

MeshCoord coord_of(const MeshShape& shape, int world_rank);
int rank_of(const MeshShape& shape, const MeshCoord& coord);

class DeviceMesh {
  public:
    // Collective over `world` (every rank calls it with the same shape):
    // validates the shape against the world size, then splits the dp, tp and
    // pp groups of this rank.
    DeviceMesh(std::shared_ptr<ProcessGroup> world, const MeshShape& shape);

    const MeshShape& shape() const { return shape_; }
    const MeshCoord& coord() const { return coord_; }
    ProcessGroup& world() { return *world_; }
    ProcessGroup& dp() { return *groups_[0]; }
    ProcessGroup& tp() { return *groups_[1]; }
    ProcessGroup& pp() { return *groups_[2]; }
    std::shared_ptr<ProcessGroup> group(Axis a) const { return groups_[size_t(a)]; }
    int dp_rank() const { return coord_.dp; }
    int tp_rank() const { return coord_.tp; }
    int pp_rank() const { return coord_.pp; }

  private:
    std::shared_ptr<ProcessGroup> world_;
    MeshShape shape_;
    MeshCoord coord_;
    std::array<std::shared_ptr<ProcessGroup>, 3> groups_;  // indexed by Axis
};

}  // namespace apiary::comm
