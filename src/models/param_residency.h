// Where a model's parameters are while it runs. A job that shards its parameters over its ranks (ZeRO-3,
// train/sharded_params.h) holds only its own share; the model asks for a group of parameters right before
// it reads them and hands the group back after, so the others' tensors are here one group at a time.
#pragma once
#include <cstdint>

namespace mt {

class ParamResidency {
 public:
  // The groups, in the order a forward pass reads them: the embedding, each decoder layer, then the head
  // (final norm and LM head, or with tied embeddings the final norm and the embedding).
  static constexpr int64_t kEmbedding = -1;
  static int64_t head(int64_t num_layers) { return num_layers; }

  virtual ~ParamResidency() = default;
  // Makes every parameter of `group` present (a no-op for those already here). Every rank of the job makes
  // the same calls in the same order.
  virtual void fetch(int64_t group) = 0;
  // May start bringing `group` (for example on a side stream) so that its fetch, which must still follow,
  // waits less. Same collective rule as fetch.
  virtual void prefetch(int64_t group) { (void)group; }
  // The model is done reading `group` for now; backward_follows: a backward pass will read it again in this
  // step (the reshard policy decides whether it stays until then).
  virtual void release(int64_t group, bool backward_follows) = 0;
};

}  // namespace mt
