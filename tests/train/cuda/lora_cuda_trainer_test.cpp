// `mixtune finetune` with a peft section on train.device: cuda (train/cuda/cuda_lora_engine.h) against the CPU LoRA
// engine (train/lora_engine.h), through the Trainer on the CUDA training fixture (a small Qwen3-MoE, F32 checkpoint,
// the counting data): r 16 alpha 32 on the attention projections and every expert, the router trained in full.
//   - the loss falls; final/ holds PEFT's two files only, which lora_load_pretrained reads and which lower the base's
//     loss on the CPU; the base checkpoint's files are untouched;
//   - the loss curve tracks the CPU's, by a bound derived from the CPU engine's own bf16 run (below);
//   - a stop and --resume on the GPU continues the run: bitwise with train.deterministic when two uninterrupted runs
//     are bitwise the same, else within 3x their spread;
//   - a checkpoint written by either engine resumes on the other (the same files and optimizer-state names).
//
// The tracking bound (as tests/train/cuda/lora_cuda_train_test.cpp's): the CPU engine over the bf16 base (model.dtype
// bfloat16: the same adapter in fp32, the router bf16 with an fp32 master) is run beside its fp32 run, and its relative
// distance from the fp32 curve measures what bf16 does to this run. The GPU's bf16 noise is of the same kind (other
// accumulation orders and rounding points; kernels/cuda/lora.h adds a few roundings of the adapter's small
// contribution), so its curve may be at most 3x as far from fp32 on average and at its worst step (2x by the triangle
// inequality against the CPU bf16 curve, plus room for routing near-ties), with floors of 1e-3 (mean) and 3e-3 (worst)
// for a CPU bf16 run that lands very close. A run continued on the other engine from the same checkpoint differs from
// the uninterrupted one by that engine pair's noise only over the continued steps: at most 4x the CPU bf16 distance
// (the GPU's bound plus the CPU bf16 curve's own distance), same floors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../io/io_test_util.h"
#include "../../kernels/cuda/cuda_test_util.h"
#include "../train_test_util.h"
#include "core/error.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "models/lora_checkpoint.h"
#include "train/train_checkpoint.h"
#include "train/recipe.h"
#include "train/trainer.h"
#include "cuda_train_fixture.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

using Quiet = test::QuietLog;

constexpr int kSteps = 20;

// The fixture's recipe (micro-batch 2, grad_accum 2, seq 64, clipping 1) with LoRA, kSteps steps at lr 1e-2 after 2
// warm-up steps, on `device` in `dtype`, plus `sets`.
Recipe lora_recipe(const io_test::ScratchDir& dir, const std::string& run, const std::string& device,
                   const std::string& dtype, std::vector<std::string> sets = {}) {
  const std::string path = write_recipe(dir, run);
  std::ofstream(path, std::ios::app)
      << "peft: {method: lora, r: 16, alpha: 32, target: [q_proj, k_proj, v_proj, o_proj, experts, router]}\n";
  std::vector<std::string> all = {"train.device=" + device, "model.dtype=" + dtype,
                                  "train.max_steps=" + std::to_string(kSteps), "optimizer.lr=1.0e-2",
                                  "schedule.warmup_steps=2"};
  all.insert(all.end(), sets.begin(), sets.end());
  return recipe_load(path, all);
}

using test::slurp;

// Every file of a directory, concatenated in name order with their names.
std::string dir_bytes(const fs::path& d) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(d))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& f : files) all += f.filename().string() + slurp(f);
  return all;
}

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

struct Distance {
  double mean = 0, worst = 0;
};
// Over steps [from, to) of the two curves.
Distance distance(const std::vector<double>& got, const std::vector<double>& want, size_t from = 0, size_t to = 0) {
  if (to == 0) to = want.size();
  Distance d;
  for (size_t i = from; i < to; ++i) {
    d.mean += rel(got[i], want[i]) / static_cast<double>(to - from);
    d.worst = std::max(d.worst, rel(got[i], want[i]));
  }
  return d;
}

double mean_of(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / static_cast<double>(to - from);
}

// Two rows of 48 tokens counting up, as the fixture's data (train.jsonl) does, from starts it may not have used.
Batch counting_batch() {
  const int64_t B = 2, S = 48;
  Batch b;
  b.input_ids = Tensor::empty({B, S}, DType::I64);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < S; ++t) b.input_ids.data_as<int64_t>()[r * S + t] = 37 + 151 * r + t;
  b.labels = b.input_ids;
  return b;
}

TEST(CudaLoraTrainer, LearnsAndSavesAPeftAdapterWithTheBaseUntouched) {
  MT_SKIP_WITHOUT_CUDA();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  const std::string base_before = dir_bytes(dir.path / "model");
  Quiet q;
  const FinetuneResult res = finetune(lora_recipe(dir, "gpu", "cuda", "bfloat16"), q.options());
  ASSERT_EQ(res.steps, kSteps);
  const std::vector<double> loss = losses_of(dir.path / "gpu");
  ASSERT_EQ(loss.size(), static_cast<size_t>(kSteps));
  std::printf("CUDA LoRA loss: first 5 steps %.4f, last 5 %.4f\n", mean_of(loss, 0, 5), mean_of(loss, kSteps - 5, kSteps));
  EXPECT_LT(mean_of(loss, kSteps - 5, kSteps), 0.9 * mean_of(loss, 0, 5));
  const fs::path fin = dir.path / "gpu" / "final";
  EXPECT_TRUE(fs::is_regular_file(fin / "adapter_config.json"));
  EXPECT_TRUE(fs::is_regular_file(fin / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(fin / "config.json"));
  EXPECT_FALSE(fs::exists(fin / "model.safetensors"));
  EXPECT_TRUE(dir_bytes(dir.path / "model") == base_before) << "the base checkpoint's files changed";
  // The saved adapter (and the routers it trained in full) over the base lowers the CPU fp32 loss of a batch.
  CausalLM lm = CausalLM::from_pretrained(dir.file("model"));
  const Batch b = counting_batch();
  const LossOptions lo;  // the mean over the batch's labels
  const double base_loss = DecoderModel(lm.config, lm.weights).forward(b, false, lo).ce_loss;
  LoraWeights adapter = lora_load_pretrained(fin.string(), lm.config, lm.weights);
  EXPECT_EQ(adapter.table->config.r, 16);
  bool b_nonzero = false;
  for (const auto& [n, t] : adapter.named_parameters())
    if (n.find("lora_B") != std::string::npos)
      for (float v : t->to_floats()) b_nonzero = b_nonzero || v != 0;
  EXPECT_TRUE(b_nonzero);
  ModelOptions mo;
  mo.lora = &adapter;
  const double tuned_loss = DecoderModel(lm.config, lm.weights, mo).forward(b, false, lo).ce_loss;
  std::printf("CPU fp32 CE of the test batch: base %.4f, with the CUDA-trained adapter %.4f\n", base_loss, tuned_loss);
  EXPECT_LT(tuned_loss, 0.9 * base_loss);
}

// The curves of one recipe on the CPU in fp32 and bf16 and on the GPU; then each engine continuing the other's
// checkpoint of step kSteps / 2.
TEST(CudaLoraTrainer, TracksTheCpuCurveAndResumesTheOtherEnginesCheckpoint) {
  MT_SKIP_WITHOUT_CUDA();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  Quiet q;
  const std::vector<std::string> every = {"checkpoint.every_steps=" + std::to_string(kSteps / 2)};
  finetune(lora_recipe(dir, "cpu32", "cpu", "float32"), q.options());
  finetune(lora_recipe(dir, "cpu16", "cpu", "bfloat16", every), q.options());
  finetune(lora_recipe(dir, "gpu", "cuda", "bfloat16", every), q.options());
  const std::vector<double> fp32 = losses_of(dir.path / "cpu32"), cpu16 = losses_of(dir.path / "cpu16"),
                            gpu = losses_of(dir.path / "gpu");
  ASSERT_EQ(fp32.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(cpu16.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(gpu.size(), static_cast<size_t>(kSteps));
  const Distance cpu_d = distance(cpu16, fp32), gpu_d = distance(gpu, fp32);
  for (int i = 0; i < kSteps; ++i)
    std::printf("[ curve    ] step %2d: cpu fp32 %.6f  cpu bf16 %.6f  gpu %.6f\n", i + 1, fp32[i], cpu16[i], gpu[i]);
  std::printf("distance from the CPU fp32 curve: CPU bf16 mean %.2e worst %.2e; GPU mean %.2e worst %.2e\n", cpu_d.mean,
              cpu_d.worst, gpu_d.mean, gpu_d.worst);
  EXPECT_LT(mean_of(fp32, kSteps - 5, kSteps), 0.9 * mean_of(fp32, 0, 5));  // the reference learned
  EXPECT_LE(gpu_d.mean, std::max(3 * cpu_d.mean, 1e-3));
  EXPECT_LE(gpu_d.worst, std::max(3 * cpu_d.worst, 3e-3));

  // Each run's checkpoint of step kSteps / 2, copied and continued on the other engine.
  const size_t half = kSteps / 2;
  auto continue_on = [&](const std::string& from, const std::string& run, const std::string& device) {
    fs::create_directories(dir.path / run);
    const fs::path ck = dir.path / from / train_checkpoint_name(half);
    ASSERT_TRUE(fs::is_directory(ck)) << ck;
    fs::copy(ck, dir.path / run / ck.filename(), fs::copy_options::recursive);
    std::ofstream(dir.path / run / "latest") << ck.filename().string() << "\n";
    std::ifstream m(dir.path / from / "metrics.jsonl");  // the first half's records, as the run itself would hold
    std::ofstream out(dir.path / run / "metrics.jsonl");
    std::string line;
    for (size_t i = 0; i < half && std::getline(m, line); ++i) out << line << "\n";
    out.close();
    const FinetuneResult r = finetune(lora_recipe(dir, run, device, "bfloat16", every), q.options(/*resume=*/true));
    EXPECT_EQ(r.steps, kSteps) << run;
  };
  continue_on("cpu16", "cpu-then-gpu", "cuda");
  continue_on("gpu", "gpu-then-cpu", "cpu");
  const std::vector<double> cg = losses_of(dir.path / "cpu-then-gpu"), gc = losses_of(dir.path / "gpu-then-cpu");
  ASSERT_EQ(cg.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(gc.size(), static_cast<size_t>(kSteps));
  const Distance cg_d = distance(cg, cpu16, half, kSteps), gc_d = distance(gc, gpu, half, kSteps);
  std::printf("continued on the other engine, steps %zu-%d: CPU checkpoint on the GPU mean %.2e worst %.2e, GPU "
              "checkpoint on the CPU mean %.2e worst %.2e\n",
              half + 1, kSteps, cg_d.mean, cg_d.worst, gc_d.mean, gc_d.worst);
  for (const Distance& d : {cg_d, gc_d}) {
    EXPECT_LE(d.mean, std::max(4 * cpu_d.mean, 1e-3));
    EXPECT_LE(d.worst, std::max(4 * cpu_d.worst, 3e-3));
  }
}

// A stop after step 3 and --resume on the GPU, against two uninterrupted runs (train.deterministic).
TEST(CudaLoraTrainer, ResumeContinuesTheRun) {
  MT_SKIP_WITHOUT_CUDA();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  Quiet q;
  const std::vector<std::string> sets = {"train.max_steps=6", "checkpoint.every_steps=2", "train.deterministic=true"};
  finetune(lora_recipe(dir, "a", "cuda", "bfloat16", sets), q.options());
  finetune(lora_recipe(dir, "b", "cuda", "bfloat16", sets), q.options());
  const Recipe rr = lora_recipe(dir, "resumed", "cuda", "bfloat16", sets);
  FinetuneOptions stop = q.options();
  int calls = 0;
  stop.stop_requested = [&] { return ++calls == 3; };
  EXPECT_TRUE(finetune(rr, stop).interrupted);
  const fs::path ck = dir.path / "resumed" / train_checkpoint_name(3);
  EXPECT_TRUE(fs::is_regular_file(ck / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(ck / "optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(ck / "model.safetensors"));
  EXPECT_EQ(finetune(rr, q.options(/*resume=*/true)).steps, 6);
  const std::vector<nlohmann::json> ma = metrics_of(dir.path / "a"), mb = metrics_of(dir.path / "b"),
                                    mr = metrics_of(dir.path / "resumed");
  ASSERT_EQ(ma.size(), 6u);
  ASSERT_EQ(mb.size(), 6u);
  ASSERT_EQ(mr.size(), 6u);
  double spread = 0;
  for (size_t i = 0; i < 6; ++i)
    spread = std::max(spread, std::fabs(mb[i]["loss"].get<double>() - ma[i]["loss"].get<double>()));
  const bool bitwise = spread == 0 && dir_bytes(dir.path / "a" / "final") == dir_bytes(dir.path / "b" / "final");
  std::printf("two uninterrupted runs: %s (largest loss difference %.3g)\n", bitwise ? "bitwise the same" : "differ",
              spread);
  for (size_t i = 0; i < 6; ++i) {
    const double a = ma[i]["loss"].get<double>(), r = mr[i]["loss"].get<double>();
    if (bitwise) {
      EXPECT_EQ(r, a) << "step " << i + 1;
      EXPECT_EQ(mr[i]["grad_norm"].get<double>(), ma[i]["grad_norm"].get<double>()) << "step " << i + 1;
    } else {
      EXPECT_LE(std::fabs(r - a), 3 * spread) << "step " << i + 1;
    }
  }
  if (bitwise) {
    EXPECT_TRUE(dir_bytes(dir.path / "resumed" / "final") == dir_bytes(dir.path / "a" / "final"))
        << "the resumed run's final adapter differs";
  }
}

TEST(CudaLoraTrainer, RefusesWhatTheGpuCannotTrainBeforeLoading) {
  MT_SKIP_WITHOUT_CUDA();
  io_test::ScratchDir dir;
  write_model_and_data(dir);
  Quiet q;
  const Recipe r = lora_recipe(dir, "r4", "cuda", "bfloat16", {"peft.r=4"});
  try {
    finetune(r, q.options());
    ADD_FAILURE() << "r 4 on the experts was accepted on the GPU";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              r.file + ": train.device: 'cuda': peft.r 4 on expert stacks is not a multiple of 8, which the GPU's "
                       "grouped GEMMs need (their 16-byte rows); use 8, 16, 32, ... (or train on the CPU)");
  }
  // train.device auto trains it on the CPU instead.
  EXPECT_EQ(finetune(lora_recipe(dir, "r4-auto", "auto", "bfloat16", {"peft.r=4", "train.max_steps=1"}), q.options())
                .steps,
            1);
}

}  // namespace
}  // namespace mt
