// The row budget of expert parallelism by all-gather (layers/cuda/expert_parallel_cuda.h): how many rows the
// buffers of this rank's experts get without reading their count on the host.
//
// After the router, the rows routed to this rank's experts are known only on the GPU. Reading that count
// costs a host wait per layer and micro-batch: the CPU stops queueing work until the GPU has drained its
// queue, and the next launches start from an empty queue. Instead the buffers get a budget: the largest
// load seen so far, as a ratio to the rank's even share (T·k rows: its T tokens' k slots), times a headroom.
// The GPU records each layer's load and whether it passed the budget (kernels/cuda/ep_row_watch.h); the
// training step reads that once, at its own sync. A step whose load passed the budget anywhere (the rows
// past it were dropped, so its gradients are wrong) runs again with exact counts, before its update; its
// load raises the budget, and the budget also rises whenever a step's load comes within the headroom of it.
// The first step runs with exact counts (nothing observed yet).
#pragma once
#include <cstdint>

namespace mt {

class EpRowBudget {
 public:
  // The device's loads are fixed-point ratios to the even share, in units of 1/kScale.
  static constexpr int64_t kScale = 4096;
  // A step's largest load may grow by this much over the largest seen before without a rerun.
  static constexpr double kDefaultHeadroom = 1.15;

  // headroom: 0 = always exact counts (a host read per layer and micro-batch); else > 0. Below 1 the budget
  // is under the load already seen, so every step passes it and runs twice (a test of the fallback).
  explicit EpRowBudget(double headroom = kDefaultHeadroom);

  double headroom() const { return headroom_; }
  // True while there is no budget: the rows are counted on the host.
  bool exact() const { return budget_ == 0; }
  // The budget as a ratio to the even share (0 while exact()).
  double ratio() const { return static_cast<double>(budget_) / kScale; }
  // The rows to allocate for a micro-batch whose even share is `share` rows and whose largest possible load
  // is `most` rows (every slot of the group's tokens that can land here): the budget's rows, at most `most`,
  // at least 1. Only while !exact().
  int64_t rows(int64_t share, int64_t most) const;
  // A step's largest load (fixed point, the maximum over its layers and micro-batches; 0 when it had none):
  // the budget becomes at least load · headroom.
  void observe(int64_t load);

 private:
  double headroom_ = kDefaultHeadroom;
  int64_t budget_ = 0;  // fixed point, 0 = none yet
};

}  // namespace mt
