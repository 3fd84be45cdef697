// ZeRO-3 (recipe parallel.shard_parameters): the parameters ZeRO-1 shards (train/optimizer_shards.h, whole
// tensors) are kept only by their owner, which also updates them: the replicated ones (every rank's copy is
// the same) by their owner among the world's ranks, and under expert parallelism with several copies of each
// expert group (world > ep) each expert stack by its owner among the ranks holding those experts (its
// replicas). The model fetches a group of them right before reading it (models/param_residency.h): each
// owner of a tensor of the group sends it to the other ranks of its kind (a ParamTransport: host broadcasts on
// the CPU engine, below; device broadcasts on the CUDA engine, train/cuda/cuda_param_transport.h; an expert
// stack only to its replicas), and the other ranks hold them until the group is released —
// after the backward always, and already after the forward with parallel.reshard_after_forward (the
// default). Between uses a rank holds its own share; the tensors of other ranks are Tensor::absent (shape,
// dtype and device only), so the shared save (train/shared_save.h), where each owner writes its tensors,
// needs nothing gathered.
// The gradients are not sharded: the accumulation window syncs once, so every rank sums its micro-batches'
// gradients whole and the owners receive the reduced sums.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"
#include "models/param_residency.h"
#include "models/spec/decoder_spec.h"
#include "models/model_weights.h"
#include "train/optimizer_shards.h"

namespace mt {

struct ShardedParam {
  Tensor* t;
  int owner;                   // its owner's rank in the job
  bool over_replicas = false;  // an expert stack: travels among its replicas only
  int root = 0;                // the owner's rank in the group it travels over (the job, or the replicas)
};

// How a group's tensors reach the ranks that do not own them.
class ParamTransport {
 public:
  virtual ~ParamTransport() = default;
  // Every member ends up holding its owner's values; the members other ranks own were just allocated here
  // (uninitialised). `what` names the group and the fetch for error messages. May be asynchronous: the
  // model's use of the group waits in join().
  virtual void bring(int64_t group, const std::vector<ShardedParam>& members, const std::string& what) = 0;
  // Orders what reads `group` from here on after its bring.
  virtual void join(int64_t group) { (void)group; }
};

// The CPU transport: per owner, one broadcast over the job's communicator of its tensors of the group
// (packed when it has several; a single one, such as the embedding, in place); the expert stacks' over their
// replicas (the job's ranks listed, this rank among them; empty when no stack is sharded over them).
std::unique_ptr<ParamTransport> host_param_transport(Communicator& comm, int rank, int world,
                                                     std::vector<int> replicas = {});

class ShardedParams final : public ParamResidency {
 public:
  // shards: the engine's ZeRO-1 owners over the job's ranks (active). Nothing is dropped until shard().
  ShardedParams(ModelWeights& w, const DecoderSpec& cfg, const OptimizerShards& shards,
                std::unique_ptr<ParamTransport> transport, bool reshard_after_forward);
  // With the host transport over comm.
  ShardedParams(ModelWeights& w, const DecoderSpec& cfg, const OptimizerShards& shards, Communicator& comm,
                bool reshard_after_forward);

  // Drops the tensors other ranks own: from here on they are present only between fetch and release.
  void shard();
  void fetch(int64_t group) override;
  void prefetch(int64_t group) override;
  void release(int64_t group, bool backward_follows) override;

  // The ParamResidency group of a parameter table entry: its layer, the embedding's (tied embeddings: the head also
  // reads it), or the head's (final norm, lm_head).
  static int64_t group_of(const ParamEntry& e, int64_t num_layers);
  // The same from a Qwen-style name alone (model.embed_tokens / model.layers.N. / the rest).
  static int64_t group_of(const std::string& param, int64_t num_layers);

 private:
  std::string group_name(int64_t group) const;

  const OptimizerShards& shards_;
  std::unique_ptr<ParamTransport> transport_;
  const bool reshard_after_forward_;
  const int64_t num_layers_;
  std::map<int64_t, std::vector<ShardedParam>> groups_;  // the sharded tensors each group reads, engine order
  std::map<int64_t, bool> present_;  // whether the other ranks' tensors of the group are here now
  int64_t fetches_ = 0;  // counted in collective names, so a mismatch between ranks names where
};

}  // namespace mt
