#include "train/sharded_params.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace mt {

namespace {

class HostParamTransport final : public ParamTransport {
 public:
  HostParamTransport(Communicator& comm, int rank, int world, std::vector<int> replicas)
      : comm_(comm), rank_(rank), world_(world), replicas_(std::move(replicas)) {}

  void bring(int64_t, const std::vector<ShardedParam>& members, const std::string& what) override {
    std::vector<int> everyone(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) everyone[static_cast<size_t>(r)] = r;
    bring_kind(members, false, everyone, nullptr, what);
    if (!replicas_.empty()) bring_kind(members, true, replicas_, &replicas_, what);
  }

 private:
  // The members of one kind, owner by owner (ranks of the job), over the job's communicator or `group`.
  void bring_kind(const std::vector<ShardedParam>& members, bool over_replicas, const std::vector<int>& owners,
                  const std::vector<int>* group, const std::string& what) {
    for (int owner : owners) {
      size_t bytes = 0;
      const ShardedParam* only = nullptr;  // the owner's one tensor of the group: broadcast in place, no packing copy
      int count = 0;
      auto ours = [&](const ShardedParam& m) { return m.owner == owner && m.over_replicas == over_replicas; };
      for (const ShardedParam& m : members)
        if (ours(m)) bytes += m.t->nbytes(), only = &m, ++count;
      if (bytes == 0) continue;
      const bool mine = owner == rank_;
      const std::string op = fmt::format("broadcast({}: {} held by rank {})", what,
                                         over_replicas ? "expert stacks" : "parameters", owner);
      auto broadcast = [&](void* data) {
        if (group)
          comm_.broadcast(*group, data, bytes, owner, op);
        else
          comm_.broadcast(data, bytes, owner, op);
      };
      if (count == 1) {
        broadcast(only->t->data());
        continue;
      }
      packed_.resize(bytes);
      size_t at = 0;
      for (const ShardedParam& m : members) {
        if (!ours(m)) continue;
        if (mine) std::memcpy(packed_.data() + at, m.t->data(), m.t->nbytes());
        at += m.t->nbytes();
      }
      broadcast(packed_.data());
      if (mine) continue;
      at = 0;
      for (const ShardedParam& m : members) {
        if (!ours(m)) continue;
        std::memcpy(m.t->data(), packed_.data() + at, m.t->nbytes());
        at += m.t->nbytes();
      }
    }
  }

  Communicator& comm_;
  int rank_, world_;
  std::vector<int> replicas_;
  std::vector<unsigned char> packed_;
};

}  // namespace

std::unique_ptr<ParamTransport> host_param_transport(Communicator& comm, int rank, int world,
                                                     std::vector<int> replicas) {
  return std::make_unique<HostParamTransport>(comm, rank, world, std::move(replicas));
}

int64_t ShardedParams::group_of(const std::string& param, int64_t num_layers) {
  static const std::string layers = "model.layers.";
  if (param == "model.embed_tokens.weight") return kEmbedding;
  if (param.starts_with(layers)) {
    const size_t dot = param.find('.', layers.size());
    MT_CHECK(dot != std::string::npos, "parameter name {}", param);
    return std::stoll(param.substr(layers.size(), dot - layers.size()));
  }
  return head(num_layers);  // model.norm.weight, lm_head.weight
}

int64_t ShardedParams::group_of(const ParamEntry& e, int64_t num_layers) {
  if (e.layer >= 0) return e.layer;
  return e.use == ParamUse::embedding ? kEmbedding : head(num_layers);
}

ShardedParams::ShardedParams(ModelWeights& w, const DecoderSpec& cfg, const OptimizerShards& shards,
                             std::unique_ptr<ParamTransport> transport, bool reshard_after_forward)
    : shards_(shards),
      transport_(std::move(transport)),
      reshard_after_forward_(reshard_after_forward),
      num_layers_(cfg.num_layers()) {
  MT_CHECK(shards.active(), "sharded parameters need the job's ZeRO-1 owners");
  const auto params = w.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const int owner = shards.owner(i);
    if (owner < 0) continue;  // every rank holding it keeps it (the expert stacks of a single copy)
    const auto& [name, t] = params[i];
    const ParamEntry* e = w.param_table().find(name);
    MT_CHECK(e != nullptr, "sharded parameters: {} is not in the parameter table", name);
    const int64_t g = group_of(*e, num_layers_);
    const bool replicas = shards.over_replicas(i);
    const ShardedParam m{t, owner, replicas, replicas ? shards.replica_index(owner) : owner};
    groups_[g].push_back(m);
    if (g == kEmbedding && cfg.tie_word_embeddings) groups_[head(num_layers_)].push_back(m);
  }
  for (const auto& [g, members] : groups_) present_[g] = true;
}

ShardedParams::ShardedParams(ModelWeights& w, const DecoderSpec& cfg, const OptimizerShards& shards,
                             Communicator& comm, bool reshard_after_forward)
    : ShardedParams(w, cfg, shards,
                    host_param_transport(comm, shards.rank(), shards.world(),
                                         shards.experts_sharded() ? shards.replicas() : std::vector<int>{}),
                    reshard_after_forward) {
  MT_CHECK(shards.world() == comm.size(), "sharded parameters over {} ranks, the job has {}", shards.world(),
           comm.size());
}

std::string ShardedParams::group_name(int64_t group) const {
  if (group == kEmbedding) return "the embedding";
  if (group == head(num_layers_)) return "the head";
  return fmt::format("layer {}", group);
}

void ShardedParams::shard() {
  for (const auto& group : groups_) release(group.first, false);
}

void ShardedParams::prefetch(int64_t group) {
  const auto it = groups_.find(group);
  if (it == groups_.end() || present_[group]) return;
  ++fetches_;
  for (ShardedParam& m : it->second)  // a tensor both the embedding and the head read may be here already
    if (m.owner != shards_.rank() && !m.t->present()) *m.t = Tensor::empty(m.t->shape(), m.t->dtype(), m.t->device());
  transport_->bring(group, it->second, fmt::format("{} (fetch {})", group_name(group), fetches_));
  present_[group] = true;
}

void ShardedParams::fetch(int64_t group) {
  prefetch(group);
  transport_->join(group);
}

void ShardedParams::release(int64_t group, bool backward_follows) {
  const auto it = groups_.find(group);
  if (it == groups_.end() || !present_[group]) return;
  if (backward_follows && !reshard_after_forward_) return;
  transport_->join(group);  // nothing may still be writing the tensors dropped here
  for (ShardedParam& m : it->second)
    if (m.owner != shards_.rank()) *m.t = Tensor::absent(m.t->shape(), m.t->dtype(), m.t->device());
  present_[group] = false;
}

}  // namespace mt
