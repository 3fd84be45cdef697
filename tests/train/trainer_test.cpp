// The training loop end to end on the CPU: Transformers parity (tests/fixtures/qwen3_moe/train5, made by
// tools/hf_reference/make_model_fixtures.py), bitwise resume, accumulation normalisation, divergence stop,
// checkpoint rotation, refusals and the TensorBoard event files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../io/io_test_util.h"
#include "core/error.h"
#include "fixture_tensors.h"
#include "models/causal_lm.h"
#include "train/recipe.h"
#include "train/train_engine.h"
#include "train/trainer.h"
#include "tensorboard_test_util.h"
#include "train_test_util.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

const std::string kFixtures = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/";

using test::slurp;

using test::metrics_of;

// A recipe over a fixture checkpoint; `extra` YAML lines are appended to the sections by --set.
Recipe recipe_for(const io_test::ScratchDir& dir, const std::string& variant, const std::vector<std::string>& sets) {
  const std::string path = dir.file("recipe.yaml");
  std::ofstream(path) << "model: {path: " << kFixtures << variant << "/ckpt, dtype: float32}\n"
                      << "data: {train: " << kFixtures << "train5/train.jsonl, seq_len: 16, pack: true}\n"
                      << "train: {micro_batch_size: 1, grad_accum: 1, max_steps: 5, seed: 7}\n"
                      << "optimizer: {lr: 1.0e-3, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.01}\n"
                      << "schedule: {name: constant}\n"
                      << "clip: {max_grad_norm: 0}\n"
                      << "checkpoint: {dir: " << dir.file("run") << "}\n";
  return recipe_load(path, sets);
}

using Quiet = test::QuietLog;

// Done-criterion of the pipeline issue: per-step losses within 1e-4 relative of Transformers' 5 AdamW steps
// on the same packed batch, final weights within 1e-4 absolute.
TEST(Trainer, MatchesTransformersFiveSteps) {
  io_test::ScratchDir dir;
  const nlohmann::json meta = nlohmann::json::parse(slurp(kFixtures + "train5/meta.json"));
  // The fixture ran torch.optim.AdamW(model.parameters()): every parameter decays.
  Recipe r = recipe_for(dir, "moe_gqa_aux", {"optimizer.decay_norms_and_biases=true"});
  Quiet q;
  FinetuneResult res = finetune(r, q.options());
  ASSERT_EQ(res.steps, 5);
  auto m = metrics_of(dir.path / "run");
  ASSERT_EQ(m.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const auto& want = meta["steps"][i];
    for (const char* k : {"loss", "ce_loss", "aux_loss"}) {
      const double got = m[i][k].get<double>(), ref = want[k].get<double>();
      EXPECT_LE(std::abs(got - ref), 1e-4 * std::abs(ref)) << "step " << i + 1 << " " << k << " " << got << " vs " << ref;
    }
    EXPECT_EQ(m[i]["trained_tokens"].get<int64_t>(), want["tokens"].get<int64_t>());
    EXPECT_EQ(m[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
  }
  const auto ref = test::fixture_checkpoint_read(kFixtures + "train5/final");
  const auto got = test::fixture_checkpoint_read(res.final_dir);
  ASSERT_EQ(got.tensors.size(), ref.tensors.size());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, t] : ref.tensors) {
    ASSERT_TRUE(got.tensors.count(name)) << name;
    const Tensor& g = got.tensors.at(name);
    ASSERT_EQ(g.shape(), t.shape()) << name;
    const float* a = g.data_as<float>();
    const float* b = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (std::abs(a[i] - b[i]) > worst) worst = std::abs(a[i] - b[i]), worst_name = name;
  }
  EXPECT_LE(worst, 1e-4) << worst_name;
  // The source's shard layout is kept.
  EXPECT_EQ(got.shard_of, ref.shard_of);
  EXPECT_TRUE(fs::exists(dir.path / "run" / "final" / "config.json"));
}

std::map<std::string, std::string> dir_bytes(const fs::path& d) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out[e.path().filename().string()] = slurp(e.path());
  return out;
}

// 6 steps straight vs 3 steps, a stop (as SIGINT does), --resume, 3 more: byte-identical final checkpoints and
// identical losses. BF16 parameters with fp32 master weights, accumulation, clipping and a cosine schedule, so
// every piece of state has to survive the checkpoint.
TEST(Trainer, ResumeIsBitwiseIdentical) {
  const std::vector<std::string> sets = {"model.dtype=bfloat16",      "train.max_steps=6",
                                         "train.grad_accum=2",        "data.pack=false",
                                         "clip.max_grad_norm=0.5",    "schedule.name=cosine",
                                         "schedule.warmup_steps=2",   "schedule.min_lr_ratio=0.1",
                                         "checkpoint.every_steps=2",  "checkpoint.keep_last=1"};
  io_test::ScratchDir a, b;
  Quiet q;
  FinetuneResult ra = finetune(recipe_for(a, "moe_gqa_aux", sets), q.options());
  ASSERT_EQ(ra.steps, 6);

  const Recipe rb = recipe_for(b, "moe_gqa_aux", sets);
  FinetuneOptions ob = q.options();
  int calls = 0;
  ob.stop_requested = [&] { return ++calls == 3; };
  FinetuneResult first = finetune(rb, ob);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.steps, 3);
  EXPECT_FALSE(fs::exists(b.path / "run" / "final"));
  EXPECT_EQ(slurp(b.path / "run" / "latest"), "checkpoint-000003\n");
  // keep_last 1: the step-2 checkpoint was pruned when step 3's was written.
  EXPECT_FALSE(fs::exists(b.path / "run" / "checkpoint-000002"));
  FinetuneResult second = finetune(rb, q.options(/*resume=*/true));
  EXPECT_FALSE(second.interrupted);
  EXPECT_EQ(second.steps, 6);

  const auto fa = dir_bytes(a.path / "run" / "final"), fb = dir_bytes(b.path / "run" / "final");
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [name, bytes] : fa) {
    ASSERT_TRUE(fb.count(name)) << name;
    EXPECT_TRUE(bytes == fb.at(name)) << name << " differs";
  }
  auto ma = metrics_of(a.path / "run"), mb = metrics_of(b.path / "run");
  ASSERT_EQ(ma.size(), 6u);
  ASSERT_EQ(mb.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    for (const char* k : {"loss", "grad_norm", "lr"}) EXPECT_EQ(ma[i][k], mb[i][k]) << "step " << i + 1 << " " << k;
  // The warm-up starts at lr 0 (HF's LambdaLR), so the first step leaves the weights as they were.
  EXPECT_EQ(ma[0]["lr"].get<double>(), 0.0);
  EXPECT_NEAR(ma[1]["lr"].get<double>(), 0.5e-3, 1e-12);
  // Training moved the weights (bf16 weights are re-sharded: one file).
  ASSERT_TRUE(fa.count("model.safetensors"));
  const auto trained = test::fixture_tensors_read((a.path / "run" / "final" / "model.safetensors").string());
  const auto source = test::fixture_checkpoint_read(kFixtures + "moe_gqa_aux/ckpt");
  const Tensor& w = trained.at("model.layers.0.self_attn.q_proj.weight");
  const Tensor w0 = source.tensors.at("model.layers.0.self_attn.q_proj.weight").to(DType::BF16);
  EXPECT_FALSE(test::tensor_bytes_equal(w, w0));
  // The carried files survive although the checkpoint the resume loaded from was pruned.
  EXPECT_EQ(fb.at("generation_config.json"), slurp(kFixtures + "moe_gqa_aux/ckpt/generation_config.json"));
}

// HF normalisation: CE sum / valid labels of the whole window. Without an aux loss, two micro-batches of one
// row accumulate to the same update as one micro-batch of two rows.
TEST(Trainer, AccumulationMatchesOneLargeBatch) {
  const std::vector<std::string> common = {"data.pack=false", "train.max_steps=2", "schedule.name=constant"};
  io_test::ScratchDir a, b;
  Quiet q;
  auto sa = common, sb = common;
  sa.push_back("train.grad_accum=2");
  sb.push_back("train.micro_batch_size=2");
  FinetuneResult ra = finetune(recipe_for(a, "moe_mha_tied_sparse2", sa), q.options());
  FinetuneResult rb = finetune(recipe_for(b, "moe_mha_tied_sparse2", sb), q.options());
  auto ma = metrics_of(a.path / "run"), mb = metrics_of(b.path / "run");
  ASSERT_EQ(ma.size(), 2u);
  ASSERT_EQ(mb.size(), 2u);
  // Not bitwise: GEMMs of 2 rows against 1, and the gradient summed in another order (fp32 reassociation,
  // K·u·Σ|a·b|); AdamW's m/√v then moves an update by about lr times the gradient's relative change, more where a
  // gradient nearly cancels. Measured over OpenBLAS's core types: loss ≤ 7e-8 and grad norm ≤ 6.6e-7 relative,
  // weights ≤ 2.3e-6 absolute (Haswell).
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(ma[i]["loss"].get<double>(), mb[i]["loss"].get<double>(), 1e-6 * ma[i]["loss"].get<double>());
    EXPECT_NEAR(ma[i]["grad_norm"].get<double>(), mb[i]["grad_norm"].get<double>(), 1e-5 * mb[i]["grad_norm"].get<double>());
    EXPECT_EQ(ma[i]["trained_tokens"], mb[i]["trained_tokens"]);
  }
  const auto ca = test::fixture_checkpoint_read(ra.final_dir), cb = test::fixture_checkpoint_read(rb.final_dir);
  for (const auto& [name, t] : ca.tensors) {
    const float* x = t.data_as<float>();
    const float* y = cb.tensors.at(name).data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_NEAR(x[i], y[i], 1e-5) << name << "[" << i << "]";
  }
}

// Padding past the longest row is not computed: with one document per row, seq_len 64 trains exactly as
// seq_len 16 (both cut to the 16 and 8 columns the 9- and 7-token documents need), aux loss included, and the
// metrics count the tokens computed.
TEST(Trainer, PaddingPastTheLongestRowIsNotComputed) {
  const std::vector<std::string> common = {"data.pack=false", "train.max_steps=2"};
  io_test::ScratchDir a, b;
  Quiet q;
  auto sa = common, sb = common;
  sb.push_back("data.seq_len=64");
  FinetuneResult ra = finetune(recipe_for(a, "moe_gqa_aux", sa), q.options());
  FinetuneResult rb = finetune(recipe_for(b, "moe_gqa_aux", sb), q.options());
  auto ma = metrics_of(a.path / "run"), mb = metrics_of(b.path / "run");
  ASSERT_EQ(ma.size(), 2u);
  ASSERT_EQ(mb.size(), 2u);
  std::multiset<int64_t> columns;  // one row a step: the documents' 9 and 7 tokens in the seeded order
  // Bitwise by construction: both runs give the model the same trimmed [1, 16] and [1, 8] batches, so the same
  // GEMMs run on the same values in the same order.
  for (size_t i = 0; i < 2; ++i) {
    for (const char* k : {"loss", "ce_loss", "aux_loss", "grad_norm"})
      EXPECT_EQ(ma[i][k].get<double>(), mb[i][k].get<double>()) << "step " << i + 1 << " " << k;
    EXPECT_EQ(ma[i]["tokens"], mb[i]["tokens"]);
    columns.insert(mb[i]["tokens"].get<int64_t>());
  }
  EXPECT_EQ(columns, (std::multiset<int64_t>{8, 16}));
  const auto ca = test::fixture_checkpoint_read(ra.final_dir), cb = test::fixture_checkpoint_read(rb.final_dir);
  for (const auto& [name, t] : ca.tensors) {
    const Tensor& u = cb.tensors.at(name);
    ASSERT_EQ(std::memcmp(t.data(), u.data(), t.nbytes()), 0) << name;
  }
}

TEST(Trainer, StopsWhenTrainingDiverges) {
  io_test::ScratchDir dir;
  Quiet q;
  Recipe r = recipe_for(dir, "moe_gqa_aux", {"optimizer.lr=1.0e30", "train.max_nonfinite_steps=2", "train.max_steps=10"});
  try {
    finetune(r, q.options());
    FAIL() << "expected a divergence error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training diverged: 2 consecutive steps"), std::string::npos) << e.what();
  }
  auto m = metrics_of(dir.path / "run");
  ASSERT_GE(m.size(), 3u);
  EXPECT_TRUE(m.back()["skipped"].get<bool>());
  EXPECT_TRUE(m.back()["loss"].is_null());
  EXPECT_FALSE(fs::exists(dir.path / "run" / "final"));
}

TEST(Trainer, RefusesToOverwriteOrMisresume) {
  io_test::ScratchDir dir;
  Quiet q;
  Recipe r = recipe_for(dir, "moe_gqa_aux", {"train.max_steps=2", "checkpoint.every_steps=1"});
  finetune(r, q.options());
  try {
    finetune(r, q.options());
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already holds a run (latest: checkpoint-000002); pass --resume"),
              std::string::npos)
        << e.what();
  }
  Recipe changed = recipe_for(dir, "moe_gqa_aux", {"train.max_steps=3", "data.seq_len=32"});
  try {
    finetune(changed, q.options(true));
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.seq_len is 32 in the recipe but was 16"), std::string::npos) << e.what();
  }
  // A longer run continues from the end-of-run checkpoint; metrics keep steps 1-2 and add step 3.
  Recipe longer = recipe_for(dir, "moe_gqa_aux", {"train.max_steps=3", "checkpoint.every_steps=1"});
  FinetuneResult res = finetune(longer, q.options(true));
  EXPECT_EQ(res.steps, 3);
  auto m = metrics_of(dir.path / "run");
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[2]["step"].get<int64_t>(), 3);
  // A torn `latest` is reported, not trusted.
  std::ofstream(dir.path / "run" / "latest") << "checkpoint-000009\n";
  try {
    finetune(longer, q.options(true));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint-000009: trainer_state.json is missing"), std::string::npos)
        << e.what();
  }
}

// A window of micro-batches that cannot fit the host is refused before anything is loaded or written.
TEST(Trainer, RefusesAWindowLargerThanTheHost) {
  io_test::ScratchDir dir;
  Quiet q;
  const Recipe r = recipe_for(dir, "moe_gqa_aux",
                              {"train.grad_accum=1048576", "train.micro_batch_size=1048576", "data.seq_len=16777216"});
  try {
    finetune(r, q.options());
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("train.grad_accum 1048576 x train.micro_batch_size 1048576 x data.seq_len "
                                          "16777216 x 1 rank = 1.845e+19 tokens per optimizer step: every rank holds "
                                          "them in host memory (412316860416.0 GiB)",
                                          0),
              0u)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path / "run"));
}

TEST(Trainer, EvalLossAndDeviceChoice) {
  io_test::ScratchDir dir;
  Quiet q;
  Recipe r = recipe_for(dir, "moe_gqa_aux",
                        {"data.eval=" + kFixtures + "train5/train.jsonl", "train.eval_every=2", "train.max_steps=4"});
  finetune(r, q.options());
  auto m = metrics_of(dir.path / "run");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_FALSE(m[0].contains("eval_loss"));
  ASSERT_TRUE(m[1].contains("eval_loss"));
  // Eval on the training data after training: below the first step's loss.
  EXPECT_LT(m[3]["eval_loss"].get<double>(), m[0]["ce_loss"].get<double>());
  EXPECT_EQ(m[1]["eval_tokens"].get<int64_t>(), 12);
  // train.device: cuda without a usable device (or without CUDA support) is refused with the reason.
  const CudaEngineHooks* hooks = cuda_engine_hooks();
  if (!hooks || hooks->device_count() == 0) {
    Recipe cuda = recipe_for(dir, "moe_gqa_aux", {"train.device=cuda", "checkpoint.dir=" + dir.file("run2")});
    try {
      finetune(cuda, q.options());
      FAIL() << "train.device: cuda accepted without a device";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("no CUDA device") != std::string::npos || m.find("no CUDA support") != std::string::npos)
          << m;
    }
  }
}

// TensorBoard shows what metrics.jsonl holds: train/loss and eval/loss at every step equal the records' values
// (as float). A resume from an earlier checkpoint than the interrupted run reached (as after a kill between a
// step's record and its checkpoint) writes a second event file whose SessionLog START at the resumed step
// drops what the interrupted run wrote from there on.
TEST(Trainer, TensorBoardEventsFollowMetricsThroughAResume) {
  io_test::ScratchDir dir;
  Quiet q;
  const Recipe r = recipe_for(dir, "moe_gqa_aux",
                              {"train.max_steps=4", "checkpoint.every_steps=2", "checkpoint.keep_last=3",
                               "data.eval=" + kFixtures + "train5/train.jsonl", "train.eval_every=2"});
  FinetuneOptions first = q.options();
  int calls = 0;
  first.stop_requested = [&] { return ++calls == 3; };
  ASSERT_EQ(finetune(r, first).steps, 3);
  std::ofstream(dir.file("run/latest")) << "checkpoint-000002\n";
  ASSERT_EQ(finetune(r, q.options(/*resume=*/true)).steps, 4);

  const fs::path tb = dir.path / "run" / "tensorboard";
  const auto files = test::event_files(tb);
  ASSERT_EQ(files.size(), 2u);
  std::vector<std::vector<test::DecodedEvent>> events(2);
  for (size_t f = 0; f < 2; ++f)
    for (const std::string& payload : test::tfrecords_read(files[f])) events[f].push_back(test::event_decode(payload));
  // file_version, START at the first step the file writes, then one event a step.
  const std::vector<std::vector<int64_t>> want_steps = {{0, 1, 1, 2, 3}, {0, 3, 3, 4}};
  for (size_t f = 0; f < 2; ++f) {
    ASSERT_EQ(events[f].size(), want_steps[f].size()) << files[f];
    EXPECT_EQ(events[f][0].file_version, "brain.Event:2");
    EXPECT_TRUE(events[f][1].session_start) << files[f];
    for (size_t i = 0; i < events[f].size(); ++i)
      EXPECT_EQ(events[f][i].step, want_steps[f][i]) << files[f] << " event " << i;
  }
  const auto m = metrics_of(dir.path / "run");
  ASSERT_EQ(m.size(), 4u);
  const auto loss = test::tensorboard_series(tb, "train/loss"), eval = test::tensorboard_series(tb, "eval/loss");
  ASSERT_EQ(loss.size(), 4u);
  for (int64_t step = 1; step <= 4; ++step)
    EXPECT_EQ(loss.at(step), m[step - 1]["loss"].get<float>()) << "step " << step;
  ASSERT_EQ(eval.size(), 2u);
  EXPECT_EQ(eval.at(2), m[1]["eval_loss"].get<float>());
  EXPECT_EQ(eval.at(4), m[3]["eval_loss"].get<float>());
  // Every numeric field of a step record is a scalar.
  std::set<std::string> tags;
  for (const auto& [tag, value] : events[1][3].values) tags.insert(tag);
  for (const char* t : {"train/loss", "train/ce_loss", "train/aux_loss", "train/grad_norm", "train/lr",
                        "train/tokens_per_s", "train/peak_memory_bytes", "train/expert_load_max_over_mean",
                        "eval/loss", "eval/tokens"})
    EXPECT_TRUE(tags.count(t)) << t;
}

// Like the loss plot, TensorBoard output that cannot be written is a warning; the run goes on.
TEST(Trainer, UnwritableTensorBoardDirectoryOnlyWarns) {
  io_test::ScratchDir dir;
  Quiet q;
  fs::create_directories(dir.path / "run");
  std::ofstream(dir.file("run/tensorboard")) << "a file where the directory would go";
  ASSERT_EQ(finetune(recipe_for(dir, "moe_gqa_aux", {"train.max_steps=2"}), q.options()).steps, 2);
  EXPECT_EQ(metrics_of(dir.path / "run").size(), 2u);
  std::fflush(q.f);
  std::rewind(q.f);
  std::string log(1 << 16, '\0');
  log.resize(std::fread(log.data(), 1, log.size(), q.f));
  EXPECT_NE(log.find("warning: no TensorBoard events from here on: "), std::string::npos) << log;
}

}  // namespace
}  // namespace mt
