// DeepSeek-V3's auxiliary-loss-free load balancing (recipe moe.bias_update_rate, train/expert_load.h) through the CPU
// engine and the trainer, on the mla_yarn_dense1 fixture (layer 1: 8 experts in 4 groups, keep 2, top-2) made skewed:
// its selection bias e_score_correction_bias set to +1 on experts 0 and 1 (group 0), so every token picks those two
// (the sigmoid scores are < 1 apart) and the max/mean load is E/k = 4 exactly.
//   - γ > 0 brings the max/mean load down toward 1; γ = 0 (Transformers) keeps it at 4 and the bias bytes as loaded.
//   - One engine step updates the bias bitwise as the rule applied to the step's loads, counted independently.
//   - Stop + resume is bitwise a straight run (the bias is saved in each checkpoint's model files and loaded back).
//   - Expert parallelism 2 gives bitwise EP 1's biases (the loads are integer sums over the ranks).
//   - The recipe's refusals: one line naming the file and field.
//   - The balance metric is logged for every MoE family (Qwen3-MoE here).
//   - The GPU test's DeepSeek-V3 (the GPU kernels' shapes) meets the GPU test's expectations on the CPU.
// Thresholds of the balancing runs: with 8 experts and ~256-512 slots a step, an even router's max/mean is ~1.3 from
// sampling noise alone (the largest of 8 counts of mean 32-64) and γ keeps the bias oscillating by ±γ around the
// balance; the measured means of the last 10 of 30 steps are 1.66 and 1.63 (printed). 2.0 sits between those and the
// skewed 4.0.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../distributed/thread_ranks.h"
#include "../io/io_test_util.h"
#include "core/error.h"
#include "distributed/communicator.h"
#include "fixture_tensors.h"
#include "kernels/cpu/expert_bias.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "train/expert_load.h"
#include "train/recipe.h"
#include "train/train_engine.h"
#include "train/trainer.h"
#include "expert_bias_test_util.h"
#include "train_test_util.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

using test::metrics_of;
using test::slurp;
using Quiet = test::QuietLog;

const std::string kDsv3 = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/deepseek_v3/mla_yarn_dense1/ckpt";
const std::string kQwen = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/moe_gqa_aux/ckpt";
const std::string kBiasName = "model.layers.1.mlp.gate.e_score_correction_bias";
constexpr int64_t kMoeLayer = 1;

// The fixture with experts 0 and 1 favoured by +1 on the selection bias, saved as fp32.
void write_skewed_model(const std::string& dir) {
  LoadOptions lo;
  lo.dtype = DType::F32;
  CausalLM lm = CausalLM::from_pretrained(kDsv3, lo);
  test::skew_selection_bias(lm);
  lm.save_pretrained(dir);
}

struct SkewedRun {
  io_test::ScratchDir dir;
  SkewedRun() {
    write_skewed_model(dir.file("model"));
    test::write_random_token_data(dir.file("train.jsonl"), 128);
  }
  Recipe recipe(const std::string& run, const std::vector<std::string>& sets) const {
    const std::string path = dir.file(run + ".yaml");
    std::ofstream(path) << "model: {path: " << dir.file("model") << ", dtype: float32}\n"
                        << "data: {train: " << dir.file("train.jsonl") << ", seq_len: 32, pack: true}\n"
                        << "train: {micro_batch_size: 2, grad_accum: 2, max_steps: 30, seed: 3, device: cpu}\n"
                        << "optimizer: {lr: 1.0e-3, betas: [0.9, 0.95], weight_decay: 0.01}\n"
                        << "clip: {max_grad_norm: 1.0}\n"
                        << "checkpoint: {dir: " << dir.file(run) << "}\n";
    return recipe_load(path, sets);
  }
  std::vector<double> loads(const std::string& run) const {
    std::vector<double> r;
    for (const auto& m : metrics_of(dir.path / run)) r.push_back(m.at("expert_load_max_over_mean").get<double>());
    return r;
  }
  Tensor final_bias(const std::string& run) const {
    return test::saved_tensor((dir.path / run / "final").string(), kBiasName);
  }
};

double mean_of(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / static_cast<double>(to - from);
}

TEST(ExpertBiasTrainer, SkewedRouterBalancesWithARateAndStaysSkewedWithout) {
  SkewedRun run;
  Quiet q;
  finetune(run.recipe("off", {}), q.options());
  finetune(run.recipe("on", {"moe.bias_update_rate=0.05"}), q.options());
  const std::vector<double> off = run.loads("off"), on = run.loads("on");
  ASSERT_EQ(off.size(), 30u);
  ASSERT_EQ(on.size(), 30u);
  // γ = 0: every token on experts 0 and 1, max/mean = E/k = 4 at every step; the bias saved as it was loaded.
  for (size_t i = 0; i < off.size(); ++i) EXPECT_DOUBLE_EQ(off[i], 4.0) << "step " << i + 1;
  const Tensor skewed = test::saved_tensor(run.dir.file("model"), kBiasName);
  EXPECT_TRUE(test::tensor_bytes_equal(run.final_bias("off"), skewed));
  // γ = 0.05: the first step routes as the γ = 0 run (the update comes after it); the two favourites lose 0.05 and
  // the six others gain 0.05 per step while skewed, so the +1 gap closes in ~10 steps and the load evens out.
  EXPECT_DOUBLE_EQ(on[0], 4.0);
  const double late = mean_of(on, 20, 30);
  std::printf("max/mean load with rate 0.05: step 1 %.3f, step 10 %.3f, steps 21-30 mean %.3f, last %.3f\n", on[0],
              on[9], late, on.back());
  EXPECT_LT(late, 2.0);
  for (size_t i = 20; i < on.size(); ++i) EXPECT_LT(on[i], 3.0) << "step " << i + 1;
  const std::vector<float> b = run.final_bias("on").to_floats();
  EXPECT_LT(b[0], 0.75f);
  EXPECT_LT(b[1], 0.75f);
  for (size_t e = 2; e < b.size(); ++e) EXPECT_GT(b[e], 0.25f) << "expert " << e;
  // The progress lines show it.
  std::rewind(q.f);
  std::string log(1 << 16, '\0');
  log.resize(std::fread(log.data(), 1, log.size(), q.f));
  EXPECT_NE(log.find("load_max/mean 4.00"), std::string::npos) << log.substr(0, 2000);
}

// The GPU test's model (DeepSeek-V3 at the GPU kernels' shapes, tests/train/cuda/expert_bias_cuda_trainer_test.cpp)
// and recipe, on the CPU: the same expectations hold, so there they test the GPU's counts and update.
TEST(ExpertBiasTrainer, TheGpuTestsDeepseekV3BalancesOnTheCpu) {
  io_test::ScratchDir dir;
  const DecoderSpec spec = DecoderSpec::from_json(test::small_deepseek_v3(), "test");
  CausalLM lm = CausalLM::from_config(spec, DType::F32, 7);
  test::skew_selection_bias(lm);
  lm.save_pretrained(dir.file("model"));
  test::write_random_token_data(dir.file("train.jsonl"), spec.vocab_size);
  const std::string path = dir.file("r.yaml");
  std::ofstream(path) << "model: {path: " << dir.file("model") << ", dtype: float32}\n"
                      << "data: {train: " << dir.file("train.jsonl") << ", seq_len: 64, pack: true}\n"
                      << "train: {micro_batch_size: 2, grad_accum: 2, max_steps: 30, seed: 5, device: cpu}\n"
                      << "optimizer: {lr: 2.0e-3, betas: [0.9, 0.95], weight_decay: 0.01}\n"
                      << "schedule: {name: cosine, warmup_steps: 5}\n"
                      << "checkpoint: {dir: " << dir.file("run") << "}\n";
  Quiet q;
  finetune(recipe_load(path, {"moe.bias_update_rate=0.05"}), q.options());
  std::vector<double> on;
  for (const auto& m : metrics_of(dir.path / "run")) on.push_back(m.at("expert_load_max_over_mean").get<double>());
  ASSERT_EQ(on.size(), 30u);
  EXPECT_DOUBLE_EQ(on[0], 4.0);
  const double late = mean_of(on, 20, 30);
  std::printf("small DeepSeek-V3 on the CPU, rate 0.05: step 10 %.3f, steps 21-30 mean %.3f\n", on[9], late);
  EXPECT_LT(late, 2.0);
  const std::vector<float> b = test::saved_tensor(dir.file("run/final"), "model.layers.1.mlp.gate.e_score_correction_bias").to_floats();
  EXPECT_LT(b[0], 0.75f);
  EXPECT_LT(b[1], 0.75f);
  for (size_t e = 2; e < b.size(); ++e) EXPECT_GT(b[e], 0.25f) << "expert " << e;
}

// One engine step against the rule applied by hand to the step's loads, counted by an independent model.
TEST(ExpertBiasTrainer, OneEngineStepUpdatesTheBiasFromItsLoadsExactly) {
  SkewedRun run;
  const Recipe r = run.recipe("x", {"moe.bias_update_rate=0.125", "train.device=cpu"});
  LoadOptions lo;
  lo.dtype = DType::F32;
  CausalLM lm = CausalLM::from_pretrained(run.dir.file("model"), lo);
  // Two micro-batches whose routes are not all on experts 0, 1: a milder skew.
  Tensor& bias = lm.weights.layers[kMoeLayer].router_score_bias;
  const std::vector<float> start = {0.02f, 0.01f, 0.0f, -0.01f, 0.03f, 0.0f, 0.005f, -0.02f};
  std::copy(start.begin(), start.end(), bias.data_as<float>());
  std::vector<Batch> window(2);
  for (int m = 0; m < 2; ++m) {
    const int64_t S = 20;
    window[m].input_ids = Tensor::empty({1, S}, DType::I64);
    for (int64_t s = 0; s < S; ++s) window[m].input_ids.data_as<int64_t>()[s] = (7 + 29 * m + 13 * s + s * s) % 128;
    window[m].labels = window[m].input_ids.clone();
  }
  // The loads, counted by a second model on a copy of the weights.
  CausalLM ref = CausalLM::from_pretrained(run.dir.file("model"), lo);
  ref.weights.layers[kMoeLayer].router_score_bias.copy_from(bias);
  ExpertLoads loads = ExpertLoads::zeros(ref.config);
  ModelOptions mo;
  mo.expert_load = &loads.layers;
  DecoderModel counter(ref.config, ref.weights, mo);
  for (const Batch& b : window) {
    ModelWeights g = ModelWeights::zeros_like_config(ref.config, DType::F32);
    counter.forward_backward(b, g);
  }
  EXPECT_FALSE(loads.layers[0].defined());  // layer 0 is dense
  const std::vector<float> l = loads.layers[kMoeLayer].to_floats();
  double slots = 0;
  for (float v : l) slots += v;
  EXPECT_EQ(slots, 2 * 20 * 2);  // tokens x k
  Tensor want = bias.clone();
  cpu::expert_bias_update(loads.layers[kMoeLayer], want, 0.125);
  ASSERT_FALSE(test::tensor_bytes_equal(want, bias));  // the step has something to move

  auto engine = cpu_engine_create(lm, r);
  const EngineStep s = engine->step(window, 40.0, 1e-3, 1.0);
  ASSERT_TRUE(s.finite);
  EXPECT_TRUE(test::tensor_bytes_equal(lm.weights.layers[kMoeLayer].router_score_bias, want));
  EXPECT_DOUBLE_EQ(s.expert_load_max_over_mean, expert_loads_max_over_mean(loads));
  // Evaluation neither counts nor moves anything.
  engine->eval(window[0]);
  EXPECT_TRUE(test::tensor_bytes_equal(lm.weights.layers[kMoeLayer].router_score_bias, want));
}

std::map<std::string, std::string> dir_bytes(const fs::path& d) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out[e.path().filename().string()] = slurp(e.path());
  return out;
}

// 6 steps straight against 3, a stop, --resume and 3 more, with the bias moving every step: byte-identical final
// checkpoints (the bias among their tensors) and identical metrics. BF16 parameters with fp32 masters (the bias stays
// an fp32 buffer) and accumulation.
TEST(ExpertBiasTrainer, ResumeWithTheBiasUpdateIsBitwiseIdentical) {
  SkewedRun run;
  const std::vector<std::string> sets = {"model.dtype=bfloat16", "train.max_steps=6", "checkpoint.every_steps=2",
                                         "checkpoint.keep_last=1", "moe.bias_update_rate=0.03"};
  Quiet q;
  FinetuneResult ra = finetune(run.recipe("a", sets), q.options());
  ASSERT_EQ(ra.steps, 6);
  const Recipe rb = run.recipe("b", sets);
  FinetuneOptions ob = q.options();
  int calls = 0;
  ob.stop_requested = [&] { return ++calls == 3; };
  FinetuneResult first = finetune(rb, ob);
  ASSERT_TRUE(first.interrupted);
  EXPECT_EQ(first.steps, 3);
  // The checkpoint holds the moved bias.
  const Tensor at3 = test::saved_tensor((run.dir.path / "b" / "checkpoint-000003").string(), kBiasName);
  EXPECT_EQ(at3.dtype(), DType::F32);
  const Tensor skewed = test::saved_tensor(run.dir.file("model"), kBiasName);
  EXPECT_FALSE(test::tensor_bytes_equal(at3, skewed));
  FinetuneResult second = finetune(rb, q.options(/*resume=*/true));
  EXPECT_EQ(second.steps, 6);
  const auto fa = dir_bytes(run.dir.path / "a" / "final"), fb = dir_bytes(run.dir.path / "b" / "final");
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [name, bytes] : fa) {
    ASSERT_TRUE(fb.count(name)) << name;
    EXPECT_TRUE(bytes == fb.at(name)) << name << " differs";
  }
  const auto ma = metrics_of(run.dir.path / "a"), mb = metrics_of(run.dir.path / "b");
  ASSERT_EQ(ma.size(), 6u);
  ASSERT_EQ(mb.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    for (const char* k : {"loss", "grad_norm", "expert_load_max_over_mean"})
      EXPECT_EQ(ma[i][k], mb[i][k]) << "step " << i + 1 << " " << k;
  // The straight run's final bias is the skewed one moved by ±0.03 six times at most per expert, and did move.
  const std::vector<float> fin = run.final_bias("a").to_floats(), sk = skewed.to_floats();
  for (size_t e = 0; e < fin.size(); ++e) EXPECT_LE(std::fabs(fin[e] - sk[e]), 6 * 0.03f + 1e-6f) << "expert " << e;
  EXPECT_LT(fin[0], sk[0]);
}

// Two thread ranks: data parallel (EP 1), expert parallel (EP 2) and EP 2 with ZeRO-3 runs of three engine steps give
// bitwise the same biases on every rank; the first step's is the rule applied to both ranks' loads, counted by one
// process. (Later steps route on weights that differ in the last bits between the layouts; the integer loads agree
// unless a token sits at a near-tie, which these batches do not have.)
Batch rank_batch(int rank, int step) {
  const int64_t S = 24;
  Batch b;
  b.input_ids = Tensor::empty({1, S}, DType::I64);
  for (int64_t s = 0; s < S; ++s) b.input_ids.data_as<int64_t>()[s] = (5 + 37 * rank + 53 * step + 11 * s + s * s) % 128;
  b.labels = b.input_ids.clone();
  b.labels.data_as<int64_t>()[0] = -100;
  return b;
}

TEST(ExpertBiasTrainer, ExpertParallelTwoGivesTheBiasesOfOne) {
  constexpr int kWorld = 2, kSteps = 3;
  constexpr double kRate = 0.02;
  const int64_t E = DecoderSpec::from_file(kDsv3 + "/config.json").num_experts();
  // [ep 1 or 2][rank][step]: the bias after each step.
  // [layout][rank][step]; layout 3: EP 2 with ZeRO-3 (parameters and optimizer state sharded; the bias, a buffer,
  // stays on every rank).
  std::vector<std::vector<std::vector<Tensor>>> bias(4, std::vector<std::vector<Tensor>>(kWorld));
  std::vector<std::vector<std::vector<double>>> metric(4, std::vector<std::vector<double>>(kWorld));
  for (int64_t layout : {1, 2, 3}) {
    const int64_t ep = layout == 1 ? 1 : 2;
    const int port = test::free_port();
    const auto err = test::run_ranks(kWorld, [&](int r) {
      auto comm = tcp_communicator_create(test::env_of(r, kWorld, port), std::chrono::milliseconds(20000));
      LoadOptions lo;
      lo.dtype = DType::F32;
      if (ep > 1) {
        lo.expert_count = E / ep;
        lo.expert_first = r % ep * lo.expert_count;
        lo.compact_experts = true;
      }
      CausalLM lm = CausalLM::from_pretrained(kDsv3, lo);
      Recipe recipe;
      recipe.model.dtype = "float32";
      recipe.train.device = "cpu";
      recipe.optimizer.lr = 1e-3;
      recipe.parallel.ep = ep;
      recipe.parallel.shard_optimizer = layout == 3;
      recipe.parallel.shard_parameters = layout == 3;
      recipe.moe.bias_update_rate = kRate;
      auto engine = cpu_engine_create(lm, recipe, comm.get());
      for (int s = 0; s < kSteps; ++s) {
        const EngineStep st = engine->step({rank_batch(r, s)}, 40.0, 1e-3, 1.0);
        bias[layout][r].push_back(lm.weights.layers[kMoeLayer].router_score_bias.clone());
        metric[layout][r].push_back(st.expert_load_max_over_mean);
      }
    });
    for (int r = 0; r < kWorld; ++r) ASSERT_EQ(err[r], "") << "layout " << layout << " rank " << r;
  }
  // Step 1's bias from the loads of both ranks' first batches, counted on the loaded weights by one process.
  LoadOptions lo;
  lo.dtype = DType::F32;
  CausalLM whole = CausalLM::from_pretrained(kDsv3, lo);
  ExpertLoads loads = ExpertLoads::zeros(whole.config);
  ModelOptions mo;
  mo.expert_load = &loads.layers;
  DecoderModel counter(whole.config, whole.weights, mo);
  for (int r = 0; r < kWorld; ++r) {
    ModelWeights g = ModelWeights::zeros_like_config(whole.config, DType::F32);
    counter.forward_backward(rank_batch(r, 0), g);
  }
  Tensor want1 = whole.weights.layers[kMoeLayer].router_score_bias.clone();
  cpu::expert_bias_update(loads.layers[kMoeLayer], want1, kRate);
  for (int64_t layout : {1, 2, 3})
    for (int r = 0; r < kWorld; ++r) {
      SCOPED_TRACE("layout " + std::to_string(layout) + " rank " + std::to_string(r));
      EXPECT_TRUE(test::tensor_bytes_equal(bias[layout][r][0], want1));
      EXPECT_DOUBLE_EQ(metric[layout][r][0], expert_loads_max_over_mean(loads));
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_TRUE(test::tensor_bytes_equal(bias[layout][r][s], bias[1][0][s])) << "step " << s + 1;
        EXPECT_EQ(metric[layout][r][s], metric[1][0][s]) << "step " << s + 1;
      }
    }
  EXPECT_FALSE(test::tensor_bytes_equal(bias[1][0][kSteps - 1], whole.weights.layers[kMoeLayer].router_score_bias));
}

TEST(ExpertBiasTrainer, RecipeRefusals) {
  io_test::ScratchDir dir;
  const std::string path = dir.file("recipe.yaml");
  auto write = [&](const std::string& extra) {
    std::ofstream(path) << "model: {path: " << kDsv3 << "}\n"
                        << "data: {train: " << dir.file("t.jsonl") << "}\n"
                        << "checkpoint: {dir: " << dir.file("run") << "}\n"
                        << extra;
  };
  write("moe: {bias_update_rate: 0.001}\n");
  EXPECT_DOUBLE_EQ(recipe_load(path, {}).moe.bias_update_rate, 0.001);
  write("");
  EXPECT_EQ(recipe_load(path, {}).moe.bias_update_rate, 0.0);  // Transformers' behaviour by default
  EXPECT_EQ(recipe_load(path, {"moe.bias_update_rate=0.5"}).moe.bias_update_rate, 0.5);
  for (const char* bad : {"-0.001", ".nan", ".inf", "fast", "[1]"}) {
    write(std::string("moe: {bias_update_rate: ") + bad + "}\n");
    io_test::expect_error([&] { recipe_load(path, {}); },
                          {path + ": moe.bias_update_rate: must be a finite number >= 0", bad[0] == '[' ? "" : bad});
  }
  write("moe: {bias_rate: 0.1}\n");
  io_test::expect_error([&] { recipe_load(path, {}); }, {path, "unknown key 'moe.bias_rate'", "bias_update_rate"});
  write("moe: {bias_update_rate: 0.01}\npeft: {target: [q_a_proj]}\n");
  io_test::expect_error([&] { recipe_load(path, {}); }, {path + ": moe.bias_update_rate: LoRA", "frozen"});
  write("peft: {target: [q_a_proj]}\n");  // LoRA with the default: fine
  EXPECT_TRUE(recipe_load(path, {}).peft.enabled);

  // A model without a selection bias (Qwen3-MoE's softmax router): refused before training, naming the recipe.
  std::ofstream(dir.file("t.jsonl")) << "{\"input_ids\": [1, 2, 3, 4], \"labels\": [1, 2, 3, 4]}\n";
  std::ofstream(path) << "model: {path: " << kQwen << ", dtype: float32}\n"
                      << "data: {train: " << dir.file("t.jsonl") << ", seq_len: 8}\n"
                      << "train: {max_steps: 1, device: cpu}\n"
                      << "checkpoint: {dir: " << dir.file("run") << "}\n"
                      << "moe: {bias_update_rate: 0.01}\n";
  Quiet q;
  io_test::expect_error([&] { finetune(recipe_load(path, {}), q.options()); },
                        {path + ": moe.bias_update_rate: 0.01 needs a model whose router has a selection bias",
                         "qwen3_moe"});
  EXPECT_FALSE(fs::exists(dir.path / "run" / "latest"));
  // The engine refuses it too (a recipe made in code).
  LoadOptions lo;
  lo.dtype = DType::F32;
  CausalLM qwen = CausalLM::from_pretrained(kQwen, lo);
  Recipe made;
  made.moe.bias_update_rate = 0.01;
  io_test::expect_error([&] { cpu_engine_create(qwen, made); }, {"recipe: moe.bias_update_rate"});
}

// Every MoE family logs its balance (here Qwen3-MoE's softmax router, no bias to update): between 1 and E/k.
TEST(ExpertBiasTrainer, TheBalanceIsLoggedForEveryMoeFamily) {
  io_test::ScratchDir dir;
  std::ofstream(dir.file("t.jsonl")) << "{\"input_ids\": [5, 9, 3, 7, 11, 2, 8, 6, 4, 10], \"labels\": [5, 9, 3, 7, "
                                        "11, 2, 8, 6, 4, 10]}\n";
  const std::string path = dir.file("recipe.yaml");
  std::ofstream(path) << "model: {path: " << kQwen << ", dtype: float32}\n"
                      << "data: {train: " << dir.file("t.jsonl") << ", seq_len: 16}\n"
                      << "train: {max_steps: 2, device: cpu}\n"
                      << "checkpoint: {dir: " << dir.file("run") << "}\n";
  Quiet q;
  finetune(recipe_load(path, {}), q.options());
  const DecoderSpec cfg = DecoderSpec::from_file(kQwen + "/config.json");
  const double most = static_cast<double>(cfg.num_experts()) / static_cast<double>(cfg.experts_per_token());
  const auto m = metrics_of(dir.path / "run");
  ASSERT_EQ(m.size(), 2u);
  for (const auto& rec : m) {
    ASSERT_TRUE(rec.contains("expert_load_max_over_mean")) << rec.dump();
    const double v = rec["expert_load_max_over_mean"].get<double>();
    EXPECT_GE(v, 1.0);
    EXPECT_LE(v, most);
  }
}

}  // namespace
}  // namespace mt
