#include "train/optimizer_shards.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "models/model_weights.h"

namespace mt {

int OptimizerShards::owner(const std::string& param) const {
  auto it = by_name_.find(param);
  return it == by_name_.end() ? -1 : owner(it->second);
}

bool OptimizerShards::over_replicas(const std::string& param) const {
  auto it = by_name_.find(param);
  return it != by_name_.end() && over_replicas(it->second);
}

bool OptimizerShards::experts_sharded() const {
  for (bool b : over_replicas_)
    if (b) return true;
  return false;
}

int OptimizerShards::replica_index(int world_rank) const {
  for (size_t j = 0; j < replicas_.size(); ++j)
    if (replicas_[j] == world_rank) return static_cast<int>(j);
  fail("rank {} is not one of the expert replicas of rank {}", world_rank, rank_);
}

std::vector<int> OptimizerShards::owners_by_size(const std::vector<int64_t>& sizes, int world) {
  std::vector<int> owner(sizes.size(), 0);
  if (world <= 1) return owner;
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());  // first minimum
    owner[i] = r;
    load[static_cast<size_t>(r)] += sizes[i];
  }
  return owner;
}

std::vector<int64_t> OptimizerShards::shares(const std::vector<int64_t>& sizes, int world) {
  const std::vector<int> owner = owners_by_size(sizes, world);
  std::vector<int64_t> load(static_cast<size_t>(std::max(world, 1)), 0);
  for (size_t i = 0; i < sizes.size(); ++i) load[static_cast<size_t>(owner[i])] += sizes[i];
  return load;
}

int64_t OptimizerShards::largest_share(const std::vector<int64_t>& sizes, int world) {
  const std::vector<int64_t> load = shares(sizes, world);
  return *std::max_element(load.begin(), load.end());
}

std::vector<int> expert_replica_ranks(int world, int rank, int64_t ep) {
  if (ep < 2) return {rank};
  std::vector<int> r;
  for (int64_t q = rank % ep; q < world; q += ep) r.push_back(static_cast<int>(q));
  return r;
}

OptimizerShards optimizer_shards_for(const ModelWeights& w, int world, int rank, int64_t ep) {
  if (world <= 1) return {};
  const bool split = ep > 1;
  std::vector<std::pair<std::string, int64_t>> params;
  for (const auto& [name, t] : w.named_parameters()) {
    // An expert stack by its per-expert size: the same map whether `w` holds all experts or a slice.
    const bool per_expert = split && w.param_table().is_expert_stack(name) && t->ndim() > 0 && t->dim(0) > 0;
    params.emplace_back(name, per_expert ? t->numel() / t->dim(0) : t->numel());
  }
  const ParamTable& table = w.param_table();
  return OptimizerShards(
      params, world, rank, [&](const std::string& name) { return !(split && table.is_expert_stack(name)); },
      expert_replica_ranks(world, rank, ep), [&](const std::string& name) { return split && table.is_expert_stack(name); });
}

std::string optimizer_state_param(const std::string& state_name) {
  for (const char* suffix : {".exp_avg_sq", ".exp_avg", ".master"}) {
    const std::string s(suffix);
    if (state_name.size() > s.size() && state_name.compare(state_name.size() - s.size(), s.size(), s) == 0)
      return state_name.substr(0, state_name.size() - s.size());
  }
  return "";
}

bool param_is_stacked_expert(const ParamTable& params, const std::string& name) {
  const std::string state_of = optimizer_state_param(name);
  return params.is_expert_stack(state_of.empty() ? name : state_of);
}

}  // namespace mt
