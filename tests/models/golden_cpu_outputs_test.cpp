// Frozen outputs of the CPU engine on the Transformers fixtures (tests/fixtures/qwen3_moe), so a refactor can be
// shown to leave every bit unchanged: fp32 logits, losses and gradients per batch, bf16 logits and losses, one
// AdamW step, the train5 trajectory through finetune(), greedy generation. Stored in
// tests/fixtures/golden_cpu/ by this same test (MIXTUNE_GOLDEN_WRITE=<dir>), compared bitwise otherwise.
//
// Bitwise holds only where the same arithmetic runs in the same order, so the test runs only in the ctest
// entry golden_cpu_outputs (CMakeLists.txt), which fixes before the process starts what picks kernels at
// load time: OpenBLAS's core (Nehalem: SSE kernels any x86-64-v2 CPU runs), one BLAS and one OpenMP thread, and
// glibc's libm variants (no FMA ones: exp/log/pow/sin/cos in double round differently with FMA).
// The gtest-discovered copies skip. Full tensors where a difference should be readable (logits, gradients of the
// plain and packed batches); 64-bit digests where size matters more (packed2 and bf16 gradients, parameters
// after AdamW and after train5).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "../io/io_test_util.h"
#include "../train/train_test_util.h"
#include "hf_fixture_util.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/generation_config.h"
#include "models/decoder_model.h"
#include "models/generate.h"
#include "train/adamw.h"
#include "train/recipe.h"
#include "train/trainer.h"

extern "C" char* openblas_get_corename(void);
extern "C" int openblas_get_num_threads(void);

namespace mt {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/qwen3_moe";
const fs::path kGolden = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/golden_cpu";
const char* kVariants[] = {"moe_gqa_aux", "moe_mha_tied_sparse2", "moe_mqa_legacy", "dense_qwen3"};
const char* kBatches[] = {"plain", "packed", "packed2"};

// Skips unless the process runs under the pinned environment of the ctest entry, and checks that the pinning
// took: the env must be set before OpenBLAS loads, which only the process environment does.
bool pinned_or_skip() {
  const char* p = std::getenv("MIXTUNE_GOLDEN_PINNED");
  if (!p || std::string(p) != "1") return false;
  EXPECT_STREQ(openblas_get_corename(), "Nehalem") << "OPENBLAS_CORETYPE=Nehalem was not honoured";
  EXPECT_EQ(openblas_get_num_threads(), 1);
  EXPECT_EQ(omp_get_max_threads(), 1);
  const char* tun = std::getenv("GLIBC_TUNABLES");
  EXPECT_TRUE(tun && std::strstr(tun, "-FMA")) << "GLIBC_TUNABLES must disable libm's FMA variants";
  EXPECT_EQ(std::getenv("OPENBLAS_BLOCK_FACTOR"), nullptr) << "OPENBLAS_BLOCK_FACTOR changes GEMM blocking";
  return true;
}
#define GOLDEN_PINNED_OR_SKIP()                                                                                   \
  if (!pinned_or_skip())                                                                                          \
  GTEST_SKIP() << "bitwise goldens run only in the ctest entry golden_cpu_outputs (pinned BLAS core, threads, " \
                  "libm; MIXTUNE_GOLDEN_PINNED=1)"

// FNV-1a over a tensor's bytes: bit-equality of tensors too large to store, as one I64.
Tensor digest(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  Tensor d = Tensor::empty({1}, DType::I64);
  std::memcpy(d.data(), &h, 8);
  return d;
}

Tensor scalar(double v) {
  Tensor t = Tensor::empty({1}, DType::F64);
  std::memcpy(t.data(), &v, 8);
  return t;
}

Tensor ids(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I64);
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * 8);
  return t;
}

// One golden file: the outputs recorded by add(), then written (MIXTUNE_GOLDEN_WRITE=<dir>) or compared bitwise.
class Golden {
 public:
  explicit Golden(std::string rel) : rel_(std::move(rel)) {}
  void add(const std::string& name, const Tensor& t) { got_.emplace_back(name, t.clone()); }
  void add(const std::string& prefix, const ForwardResult& r) {
    add(prefix + "loss", scalar(r.loss));
    add(prefix + "ce_loss", scalar(r.ce_loss));
    add(prefix + "aux_loss", scalar(r.aux_loss));
    add(prefix + "tokens", ids({r.tokens}));
    if (r.logits.defined()) add(prefix + "logits", r.logits);
  }
  void finish() {
    if (const char* dir = std::getenv("MIXTUNE_GOLDEN_WRITE")) {
      const fs::path out = fs::path(dir) / rel_;
      fs::create_directories(out.parent_path());
      safetensors_write(out.string(), got_, {});
      return;
    }
    SafetensorsFile want = SafetensorsFile::open((kGolden / rel_).string());
    EXPECT_EQ(want.names().size(), got_.size()) << rel_;
    for (const auto& [name, t] : got_) {
      SCOPED_TRACE(rel_ + ": " + name);
      ASSERT_TRUE(want.has(name));
      const Tensor w = want.tensor(name);
      ASSERT_EQ(w.dtype(), t.dtype());
      ASSERT_EQ(w.shape(), t.shape());
      if (std::memcmp(w.data(), t.data(), t.nbytes()) == 0) continue;
      std::ostringstream first;
      first.precision(17);
      if (t.dtype() == DType::F64) {
        first << t.data_as<double>()[0] << " vs golden " << w.data_as<double>()[0];
      } else if (t.dtype() == DType::F32) {
        const float *a = t.data_as<float>(), *b = w.data_as<float>();
        int64_t i = 0;
        while (std::memcmp(a + i, b + i, 4) == 0) ++i;
        first << "element " << i << ": " << a[i] << " vs golden " << b[i];
      } else {
        first << "(ids or a digest)";
      }
      ADD_FAILURE() << "not bit-identical to the golden; first difference " << first.str();
    }
  }

 private:
  std::string rel_;
  std::vector<std::pair<std::string, Tensor>> got_;
};

class GoldenCpu : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenCpu, ModelOutputsBitwise) {
  GOLDEN_PINNED_OR_SKIP();
  const fs::path dir = kFixtures / GetParam();
  Golden g(std::string(GetParam()) + "/outputs.safetensors");
  CausalLM m = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::F32});
  CausalLM m16 = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::BF16});
  for (const std::string bname : kBatches) {
    const Batch b = test::load_batch(SafetensorsFile::open((dir / (bname + ".safetensors")).string()));
    g.add(bname + ".fwd.", DecoderModel(m.config, m.weights).forward(b, true));
    ModelWeights grads = ModelWeights::zeros_like_config(m.config, DType::F32);
    g.add(bname + ".fb.", DecoderModel(m.config, m.weights).forward_backward(b, grads));
    for (auto& [name, t] : grads.named_parameters())
      g.add(bname + ".grad." + name, bname == "packed2" ? digest(*t) : *t);
    if (bname == "plain") {  // one AdamW step on our own gradients, settings of meta.json
      CausalLM stepped = CausalLM::from_pretrained((dir / "ckpt").string(), {DType::F32});
      const AdamWOptions o = test::adamw_options(test::read_json(dir / "meta.json")["adamw_one_step"]);
      std::vector<const Tensor*> gp;
      for (auto& [name, t] : grads.named_parameters()) gp.push_back(t);
      AdamW opt(stepped.weights.named_parameters(), o);
      opt.step(gp, o.lr);
      for (auto& [name, p] : stepped.weights.named_parameters()) g.add("adamw." + name, digest(*p));
    }
    g.add("bf16." + bname + ".fwd.", DecoderModel(m16.config, m16.weights).forward(b, true));
    ModelWeights grads16 = ModelWeights::zeros_like_config(m16.config, DType::F32);
    g.add("bf16." + bname + ".fb.", DecoderModel(m16.config, m16.weights).forward_backward(b, grads16));
    for (auto& [name, t] : grads16.named_parameters()) g.add("bf16." + bname + ".grad." + name, digest(*t));
  }
  // Greedy generation (KV cache) from generate.json's prompts, as tests/models/generate_test.cpp runs it.
  const auto gen = test::read_json(dir / "generate.json");
  const GenerationConfig gc = generation_config_read((dir / "ckpt").string(), m.config.raw);
  for (size_t i = 0; i < gen["prompts"].size(); ++i) {
    GenerateOptions o;
    o.max_new_tokens = gen.value("max_new_tokens", 12);
    o.sampling.temperature = 0;
    o.eos_token_ids = gc.eos_token_ids;
    const auto r = generate(m.config, m.weights, gen["prompts"][i].get<std::vector<int64_t>>(), o);
    g.add("generate." + std::to_string(i), ids(r.ids));
  }
  g.finish();
}

INSTANTIATE_TEST_SUITE_P(Variants, GoldenCpu, ::testing::ValuesIn(kVariants));

// The five-step trajectory of tests/train/trainer_test.cpp (Trainer.MatchesTransformersFiveSteps) through
// finetune(): per-step losses from metrics.jsonl (JSON doubles round-trip exactly), the final parameters.
TEST(GoldenCpuTrain, Train5TrajectoryBitwise) {
  GOLDEN_PINNED_OR_SKIP();
  io_test::ScratchDir dir;
  const std::string recipe = dir.file("recipe.yaml");
  std::ofstream(recipe) << "model: {path: " << (kFixtures / "moe_gqa_aux/ckpt").string() << ", dtype: float32}\n"
                        << "data: {train: " << (kFixtures / "train5/train.jsonl").string()
                        << ", seq_len: 16, pack: true}\n"
                        << "train: {micro_batch_size: 1, grad_accum: 1, max_steps: 5, seed: 7}\n"
                        << "optimizer: {lr: 1.0e-3, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.01}\n"
                        << "schedule: {name: constant}\n"
                        << "clip: {max_grad_norm: 0}\n"
                        << "checkpoint: {dir: " << dir.file("run") << "}\n";
  test::QuietLog q;
  const FinetuneResult res = finetune(recipe_load(recipe, {"optimizer.decay_norms_and_biases=true"}), q.options());
  ASSERT_EQ(res.steps, 5);
  Golden g("train5/outputs.safetensors");
  std::ifstream metrics(dir.path / "run" / "metrics.jsonl");
  int step = 0;
  for (std::string line; std::getline(metrics, line); ++step) {
    const auto rec = nlohmann::json::parse(line);
    for (const char* k : {"loss", "ce_loss", "aux_loss", "grad_norm"})
      g.add("step" + std::to_string(step + 1) + "." + k, scalar(rec[k].get<double>()));
  }
  EXPECT_EQ(step, 5);
  CausalLM final_model = CausalLM::from_pretrained(res.final_dir, {DType::F32});
  for (auto& [name, p] : final_model.weights.named_parameters()) g.add("final." + name, digest(*p));
  g.finish();
}

}  // namespace
}  // namespace mt
