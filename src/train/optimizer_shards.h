// ZeRO-1: the optimizer state (moments, fp32 master) of a tensor several ranks hold lives on one owner rank,
// which runs its update and broadcasts the new values to the others. Two kinds of tensors:
// - replicated (every rank of the job holds them: all of them without expert parallelism, all but the stacked
//   expert weights with it): owned among the `world` ranks;
// - the stacked expert weights under expert parallelism when the job holds several copies of each expert group
//   (world > ep): owned among `replicas`, the ranks holding the same experts (one per expert-parallel group).
// Both engines sum each such gradient on its owner only, over the tensor's ranks (a reduce, half an all-reduce's
// traffic), and take each tensor's squared norm from its owner for the global norm. The CPU engine's reduce sums
// in rank order like its all-reduce, so a sharded run is bitwise the run without sharding; on the GPUs that holds
// for two ranks (a + b either way), while with more NCCL's reduce may add the ranks in another order than its
// all-reduce. Whole tensors, largest first onto the least-loaded rank (ties: the lower rank): every rank computes
// the same map from the same parameter list (names and element counts only; every replica group has the same
// expert slices, so all use the same map over their members' positions); a rank's share is at most the average
// plus the largest tensor.
#pragma once
#include <concepts>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "models/param_table.h"
#include "train/adamw.h"

namespace mt {

class OptimizerShards {
 public:
  OptimizerShards() = default;  // not sharded: every rank updates every parameter
  // params: (name, element count) in the engine's parameter order. sharded(name): whether that parameter is
  // replicated over the `world` ranks (the others keep owner -1).
  template <typename Sharded>
  OptimizerShards(const std::vector<std::pair<std::string, int64_t>>& params, int world, int rank, Sharded sharded)
      : OptimizerShards(params, world, rank, sharded, {}, [](const std::string&) { return false; }) {}
  // Also the parameters for which over_replicas(name) holds (the stacked experts) owned among `replicas` (world
  // ranks, the same list on every member, this rank among them; fewer than two: those keep owner -1).
  template <typename Sharded, typename OverReplicas>
  OptimizerShards(const std::vector<std::pair<std::string, int64_t>>& params, int world, int rank, Sharded sharded,
                  std::vector<int> replicas, OverReplicas over_replicas)
      : world_(world), rank_(rank), replicas_(std::move(replicas)) {
    if (replicas_.size() < 2) replicas_.clear();
    std::vector<int64_t> sizes, expert_sizes;
    std::vector<size_t> which, experts;
    for (size_t i = 0; i < params.size(); ++i) {
      if (world <= 1) break;
      if (!replicas_.empty() && over_replicas(params[i].first))
        experts.push_back(i), expert_sizes.push_back(params[i].second);
      else if (sharded(params[i].first))
        which.push_back(i), sizes.push_back(params[i].second);
    }
    owner_.assign(params.size(), -1);
    over_replicas_.assign(params.size(), false);
    const std::vector<int> owners = owners_by_size(sizes, world);
    for (size_t j = 0; j < which.size(); ++j) owner_[which[j]] = owners[j];
    const std::vector<int> at = owners_by_size(expert_sizes, static_cast<int>(replicas_.size()));
    for (size_t j = 0; j < experts.size(); ++j) {
      owner_[experts[j]] = replicas_[static_cast<size_t>(at[j])];
      over_replicas_[experts[j]] = true;
    }
    for (size_t i = 0; i < params.size(); ++i) by_name_.emplace(params[i].first, i);
  }

  bool active() const { return world_ > 1; }
  int world() const { return world_; }
  int rank() const { return rank_; }
  // Owner rank (of the world) of parameter i (engine order) or of a named parameter, either kind; -1: every rank
  // holding it updates it.
  int owner(size_t i) const { return i < owner_.size() ? owner_[i] : -1; }
  int owner(const std::string& param) const;
  // Whether this rank keeps the optimizer state of parameter i and updates it.
  bool updates(size_t i) const { return owner(i) < 0 || owner(i) == rank_; }
  // Whether parameter i's owner is one of replicas() (an expert stack) rather than of the world.
  bool over_replicas(size_t i) const { return i < over_replicas_.size() && over_replicas_[i]; }
  bool over_replicas(const std::string& param) const;
  // The owner of a replicated parameter sharded over the world (-1 for the rest, the expert stacks included):
  // what ZeRO-3 and the world-wide reduce and broadcast go by.
  int world_owner(size_t i) const { return over_replicas(i) ? -1 : owner(i); }
  int world_owner(const std::string& param) const { return over_replicas(param) ? -1 : owner(param); }
  // Whether this rank keeps parameter i's weights under ZeRO-3 (train/sharded_params.h): the ones nobody owns
  // (every rank holding them updates them) and its own, of either kind (an expert stack sharded over its
  // replicas is kept by its owner among them only).
  bool keeps_weights(size_t i) const { return owner(i) < 0 || owner(i) == rank_; }
  bool keeps_weights(const std::string& param) const { return owner(param) < 0 || owner(param) == rank_; }
  // The ranks holding this rank's experts when the expert stacks are sharded over them (else empty), and a
  // rank's position among them (what a communicator over the replica group calls that rank).
  const std::vector<int>& replicas() const { return replicas_; }
  bool experts_sharded() const;
  int replica_index(int world_rank) const;

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
  // Every rank's elements under owners_by_size.
  static std::vector<int64_t> shares(const std::vector<int64_t>& sizes, int world);

 private:
  int world_ = 1, rank_ = 0;
  std::vector<int> owner_;
  std::vector<bool> over_replicas_;
  std::vector<int> replicas_;
  std::unordered_map<std::string, size_t> by_name_;
};

struct ModelWeights;
// The engines' shards in a job of `world` ranks with expert-parallel groups of `ep` consecutive ranks (1: no
// expert parallelism): every parameter of `w` is sharded over the world except, when the experts are split
// over ranks (ep > 1), the stacked expert weights, which are sharded over this rank's expert replicas
// {rank % ep, rank % ep + ep, ...} when world > ep (else each rank updates its own). world 1: not sharded.
// The expert stacks are ordered by their per-expert size, so `w` may hold all E experts or this rank's E/ep.
OptimizerShards optimizer_shards_for(const ModelWeights& w, int world, int rank, int64_t ep);
// Catches a caller of the former (…, bool experts_split) form: a bool would silently mean ep 0 or 1.
template <typename B>
  requires std::same_as<B, bool>
OptimizerShards optimizer_shards_for(const ModelWeights& w, int world, int rank, B) = delete;
// The ranks holding the same experts as `rank` in a job of `world` ranks with expert-parallel groups of `ep`
// consecutive ranks: {rank % ep, rank % ep + ep, ...} (every rank alone when ep < 2).
std::vector<int> expert_replica_ranks(int world, int rank, int64_t ep);

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

// Whether `name`, a parameter's or one of its optimizer-state tensors', is an expert stack (ParamRole::expert_stack)
// of `params`: the tensors expert parallelism splits over ranks.
bool param_is_stacked_expert(const ParamTable& params, const std::string& name);

}  // namespace mt
