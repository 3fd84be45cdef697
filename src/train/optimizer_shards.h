// ZeRO-1 for the parameters every rank of a job holds (replicated: all of them without expert parallelism,
// all but the stacked expert weights with it): each such tensor's optimizer state (moments, fp32 master)
// lives on one owner rank, which runs its update and broadcasts the new values to the other ranks. Both
// engines sum each such gradient on its owner only (a reduce, half an all-reduce's traffic) and take each
// tensor's squared norm from its owner for the global norm. The CPU engine's reduce sums in rank order like its
// all-reduce, so a sharded run is bitwise the run without sharding; on the GPUs that holds for two ranks (a + b
// either way), while with more NCCL's reduce may add the ranks in another order than its all-reduce.
// Whole tensors, largest first onto the least-loaded rank (ties: the lower rank): every rank computes the
// same map from the same parameter list; a rank's share is at most the average plus the largest tensor.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "train/adamw.h"

namespace mt {

class OptimizerShards {
 public:
  OptimizerShards() = default;  // not sharded: every rank updates every parameter
  // params: (name, element count) in the engine's parameter order. sharded(name): whether that parameter is
  // replicated over the `world` ranks (the others keep owner -1).
  template <typename Sharded>
  OptimizerShards(const std::vector<std::pair<std::string, int64_t>>& params, int world, int rank, Sharded sharded)
      : world_(world), rank_(rank) {
    std::vector<int64_t> sizes;
    std::vector<size_t> which;
    for (size_t i = 0; i < params.size(); ++i)
      if (world > 1 && sharded(params[i].first)) which.push_back(i), sizes.push_back(params[i].second);
    owner_.assign(params.size(), -1);
    const std::vector<int> owners = owners_by_size(sizes, world);
    for (size_t j = 0; j < which.size(); ++j) owner_[which[j]] = owners[j];
    for (size_t i = 0; i < params.size(); ++i) by_name_.emplace(params[i].first, owner_[i]);
  }

  bool active() const { return world_ > 1; }
  int world() const { return world_; }
  int rank() const { return rank_; }
  // Owner rank of parameter i (engine order) or of a named parameter; -1: every rank updates it.
  int owner(size_t i) const { return i < owner_.size() ? owner_[i] : -1; }
  int owner(const std::string& param) const;
  // Whether this rank keeps the optimizer state of parameter i and updates it.
  bool updates(size_t i) const { return owner(i) < 0 || owner(i) == rank_; }

  // The entries of `all` (one per parameter, engine order) whose parameters this rank updates.
  template <typename T>
  std::vector<T> updated(const std::vector<T>& all) const {
    std::vector<T> r;
    for (size_t i = 0; i < all.size(); ++i)
      if (updates(i)) r.push_back(all[i]);
    return r;
  }

  // The largest-first assignment of tensors of `sizes` elements to `world` ranks (owner per tensor).
  static std::vector<int> owners_by_size(const std::vector<int64_t>& sizes, int world);
  // The most elements any rank is assigned by owners_by_size.
  static int64_t largest_share(const std::vector<int64_t>& sizes, int world);

 private:
  int world_ = 1, rank_ = 0;
  std::vector<int> owner_;
  std::unordered_map<std::string, int> by_name_;
};

struct Qwen3MoeWeights;
// The engines' shards: every parameter of `w` is replicated over the `world` ranks except, when the experts
// are split over ranks (expert parallelism), the stacked expert weights. world 1: not sharded.
OptimizerShards optimizer_shards_for(const Qwen3MoeWeights& w, int world, int rank, bool experts_split);

// The parameter a Hugging Face tensor name belongs to: the name itself, or for a per-expert tensor
// ("...mlp.experts.<e>.{gate,up,down}_proj.weight") the stacked "...mlp.experts.{gate_up,down}_proj".
std::string hf_tensor_param(const std::string& hf_name);

// One optimizer-state tensor of the whole model, with this rank's tensor of that name where it updates the
// parameter (null: another rank's share).
struct StateSlot {
  OptimizerStateSpec spec;
  Tensor* held = nullptr;
};

// Every parameter's optimizer-state tensors in the unsharded order (what a save lays out, what a resume's file
// holds): params in engine order, held the optimizer's named_state() (the parameters this rank updates, in
// order), specs_of(name, param) the optimizer's state_specs.
template <typename Params, typename SpecsOf>
std::vector<StateSlot> optimizer_state_layout(const Params& params, const OptimizerShards& shards,
                                              const std::vector<std::pair<std::string, Tensor*>>& held,
                                              SpecsOf&& specs_of) {
  std::vector<StateSlot> r;
  size_t k = 0;
  for (size_t i = 0; i < params.size(); ++i)
    for (OptimizerStateSpec& s : specs_of(params[i].first, *params[i].second)) {
      Tensor* t = nullptr;
      if (shards.updates(i)) {
        MT_CHECK(k < held.size() && held[k].first == s.name, "optimizer state: {} where {} was expected",
                 k < held.size() ? held[k].first : std::string("nothing"), s.name);
        t = held[k++].second;
      }
      r.push_back({std::move(s), t});
    }
  MT_CHECK(k == held.size(), "optimizer state: {} tensors held, {} laid out", held.size(), k);
  return r;
}

// The parameter an optimizer-state tensor belongs to: "<param>.exp_avg", ".exp_avg_sq" or ".master" without
// the suffix ("" for another name).
std::string optimizer_state_param(const std::string& state_name);

}  // namespace mt
