// Nemotron-H under the CPU engine's expert parallelism (layers/expert_parallel.h), two ranks that are threads over
// loopback, on the hybrid_all_kinds fixture (fp32; layers M E M * E -, each MoE layer 8 ReLU² experts top-2 with the
// fp32 selection bias and a ReLU² shared expert): each rank holds its 4 experts' rows of both up/down stacks (the
// trainer's compact load), runs the replicated Mamba2 mixers, attention, routers, shared experts and MLP, and its
// experts' MLPs for both ranks' tokens.
//
// EP 2 against EP 1 (the whole model on each rank's batch): loss, logits and every gradient; the replicated ones
// against that batch's, each expert stack against the sum of both batches' rows of the rank's experts. Tolerances:
// expert_parallel_parity.h.
#include <gtest/gtest.h>

#include <string>

#include "expert_parallel_parity.h"

namespace mt {
namespace {

const std::string kCkpt = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/nemotron_h/hybrid_all_kinds/ckpt";

// One sequence of 24 tokens per rank (three Mamba chunks of 8; ids inside the vocabulary of 128).
Batch batch_of_rank(int rank) {
  const int64_t S = 24;
  Batch b;
  b.input_ids = Tensor::empty({1, S}, DType::I64);
  for (int64_t s = 0; s < S; ++s) b.input_ids.data_as<int64_t>()[s] = (5 + 37 * rank + 11 * s + s * s) % 128;
  b.labels = b.input_ids.clone();
  b.labels.data_as<int64_t>()[0] = -100;
  return b;
}

TEST(CpuExpertParallelNemotronH, Ep2MatchesEp1LossLogitsAndEveryGradient) {
  test::expect_ep2_matches_ep1(kCkpt, batch_of_rank, 4);  // up_proj and down_proj of layers 1 and 4
}

}  // namespace
}  // namespace mt
