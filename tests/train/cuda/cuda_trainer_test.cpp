// `mixtune finetune` with train.device: cuda against the CPU reference engine: a bf16 CUDA run (fp32
// master weights) tracks the CPU fp32 loss curve over 50 steps; the checkpoint/resume path and the
// float32-model policy (bf16 compute, fp32 masters saved) work through the CUDA engine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../io/io_test_util.h"
#include "../../kernels/cuda/cuda_test_util.h"
#include "core/error.h"
#include "core/float_convert.h"
#include "models/causal_lm.h"
#include "train/recipe.h"
#include "train/trainer.h"
#include "../train_test_util.h"
#include "cuda_train_fixture.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

using Quiet = test::QuietLog;

TEST(CudaTrainer, Bf16TracksCpuFp32LossCurveOver50Steps) {
  MT_SKIP_WITHOUT_CUDA();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  Quiet q;
  finetune(recipe(dir, "cpu", {}), q.options());
  finetune(recipe(dir, "gpu", {"model.dtype=bfloat16", "train.device=cuda"}), q.options());
  const std::vector<double> cpu = losses_of(dir.path / "cpu"), gpu = losses_of(dir.path / "gpu");
  ASSERT_EQ(cpu.size(), 50u);
  ASSERT_EQ(gpu.size(), 50u);
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double rel = std::fabs(gpu[i] - cpu[i]) / cpu[i];
    worst = std::max(worst, rel);
    // bf16 weights (rounded from the fp32 masters each step) and bf16 activations: a few percent.
    EXPECT_LT(rel, 0.04) << "step " << i + 1 << ": cuda " << gpu[i] << " cpu " << cpu[i];
  }
  std::printf("worst relative loss difference over 50 steps: %.4f (first %.4f / %.4f, last %.4f / %.4f)\n", worst,
              gpu.front(), cpu.front(), gpu.back(), cpu.back());
  EXPECT_LT(gpu.back(), 0.6 * gpu.front());  // it learned the pattern
  // The final checkpoint loads and is bf16.
  CausalLM back = CausalLM::from_pretrained((dir.path / "gpu" / "final").string());
  EXPECT_EQ(back.weights.embed.dtype(), DType::BF16);
}

TEST(CudaTrainer, Float32ModelSavesFp32MastersAndResumes) {
  MT_SKIP_WITHOUT_CUDA();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  Quiet q;
  const std::vector<std::string> base = {"train.device=cuda", "train.max_steps=6", "checkpoint.every_steps=3"};
  finetune(recipe(dir, "straight", base), q.options());
  std::vector<std::string> stop3 = base;
  stop3.push_back("train.max_steps=3");
  finetune(recipe(dir, "resumed", stop3), q.options());
  finetune(recipe(dir, "resumed", base), q.options(/*resume=*/true));
  const std::vector<double> a = losses_of(dir.path / "straight"), b = losses_of(dir.path / "resumed");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-3 * a[i]) << "step " << i + 1;
  CausalLM init = CausalLM::from_pretrained(dir.file("model"));
  CausalLM fin = CausalLM::from_pretrained((dir.path / "straight" / "final").string());
  ASSERT_EQ(fin.weights.embed.dtype(), DType::F32);  // the fp32 masters, not their bf16 copy
  // Masters moved by updates far smaller than a bf16 ulp of the weights: some values are not bf16.
  const std::vector<float> w = fin.weights.layers[0].q_proj.to_floats(), w0 = init.weights.layers[0].q_proj.to_floats();
  int not_bf16 = 0, changed = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    not_bf16 += round_bf16(w[i]) != w[i];
    changed += w[i] != w0[i];
  }
  EXPECT_GT(not_bf16, static_cast<int>(w.size() / 2));
  EXPECT_GT(changed, static_cast<int>(w.size() / 2));
}

TEST(CudaTrainer, MemoryPlanRefusesWhatCannotFit) {
  MT_SKIP_WITHOUT_CUDA();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  Quiet q;
  try {
    finetune(recipe(dir, "huge", {"train.device=cuda", "train.micro_batch_size=100000", "data.seq_len=4096"}),
             q.options());
    FAIL() << "an impossible micro-batch was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("largest micro_batch"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt
