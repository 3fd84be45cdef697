#include "train/recipe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"

namespace mt {
namespace {

// Writes `text` to a fresh temp file; removed at scope end.
struct TempRecipe {
  std::string path;
  explicit TempRecipe(const std::string& text) {
    static int n = 0;
    path = (std::filesystem::temp_directory_path() /
            ("mixtune_recipe_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".yaml"))
               .string();
    std::ofstream(path) << text;
  }
  ~TempRecipe() { std::filesystem::remove(path); }
};

const char* kMinimal = "model: {path: /m}\ndata: {train: t.jsonl}\ncheckpoint: {dir: /ck}\n";

// Loads and returns the error text ("" if it loaded).
std::string load_error(const std::string& text, const std::vector<std::string>& sets = {}) {
  TempRecipe f(text);
  try {
    recipe_load(f.path, sets);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind(f.path, 0), 0u) << "message must start with the file: " << msg;
    return msg.substr(f.path.size());
  }
  return "";
}

TEST(Recipe, FullRecipeParses) {
  TempRecipe f(R"(
model:
  path: /models/qwen3-moe
  dtype: float32
data:
  train: train.jsonl
  eval: eval.jsonl
  seq_len: 2048
  pack: false
  truncation: drop
  skip_bad_lines: true
train:
  micro_batch_size: 4
  grad_accum: 8
  max_steps: 500
  epochs: 3
  seed: 42
  device: cuda:1
  eval_every: 50
optimizer:
  name: adamw
  lr: 2.5e-4
  betas: [0.8, 0.95]
  eps: 1.0e-6
  weight_decay: 0.1
  master_weights: none
schedule:
  name: cosine
  warmup_steps: 20
  min_lr_ratio: 0.1
clip:
  max_grad_norm: 0
checkpoint:
  dir: /ck
  every_steps: 100
  keep_last: 5
)");
  const Recipe r = recipe_load(f.path, {});
  EXPECT_EQ(r.model.path, "/models/qwen3-moe");
  EXPECT_EQ(r.model.dtype, "float32");
  EXPECT_EQ(r.data.train, "train.jsonl");
  EXPECT_EQ(r.data.eval, "eval.jsonl");
  EXPECT_EQ(r.data.seq_len, 2048);
  EXPECT_FALSE(r.data.pack);
  EXPECT_EQ(r.data.truncation, "drop");
  EXPECT_TRUE(r.data.skip_bad_lines);
  EXPECT_EQ(r.train.micro_batch_size, 4);
  EXPECT_EQ(r.train.grad_accum, 8);
  EXPECT_EQ(r.train.max_steps, 500);
  EXPECT_EQ(r.train.epochs, 3);
  EXPECT_EQ(r.train.seed, 42u);
  EXPECT_EQ(r.train.device, "cuda:1");
  EXPECT_EQ(r.train.eval_every, 50);
  EXPECT_EQ(r.optimizer.name, "adamw");
  EXPECT_DOUBLE_EQ(r.optimizer.lr, 2.5e-4);
  EXPECT_DOUBLE_EQ(r.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(r.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(r.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(r.optimizer.weight_decay, 0.1);
  EXPECT_EQ(r.optimizer.master_weights, "none");
  EXPECT_EQ(r.schedule.name, "cosine");
  EXPECT_EQ(r.schedule.warmup_steps, 20);
  EXPECT_DOUBLE_EQ(r.schedule.min_lr_ratio, 0.1);
  EXPECT_DOUBLE_EQ(r.clip.max_grad_norm, 0.0);
  EXPECT_EQ(r.checkpoint.dir, "/ck");
  EXPECT_EQ(r.checkpoint.every_steps, 100);
  EXPECT_EQ(r.checkpoint.keep_last, 5);
}

TEST(Recipe, Defaults) {
  TempRecipe f(kMinimal);
  const Recipe r = recipe_load(f.path, {});
  EXPECT_EQ(r.model.path, "/m");
  EXPECT_EQ(r.model.dtype, "bfloat16");
  EXPECT_EQ(r.data.eval, "");
  EXPECT_EQ(r.data.seq_len, 4096);
  EXPECT_TRUE(r.data.pack);
  EXPECT_EQ(r.data.truncation, "right");
  EXPECT_FALSE(r.data.skip_bad_lines);
  EXPECT_EQ(r.train.micro_batch_size, 1);
  EXPECT_EQ(r.train.grad_accum, 1);
  EXPECT_EQ(r.train.max_steps, 0);
  EXPECT_EQ(r.train.epochs, 1);
  EXPECT_EQ(r.train.seed, 1234u);
  EXPECT_EQ(r.train.device, "auto");
  EXPECT_EQ(r.train.eval_every, 0);
  EXPECT_FALSE(r.train.deterministic);
  EXPECT_TRUE(recipe_load(f.path, {"train.deterministic=true"}).train.deterministic);
  EXPECT_EQ(load_error(kMinimal, {"train.deterministic=sometimes"}),
            ": train.deterministic: must be true or false (found 'sometimes')");
  EXPECT_DOUBLE_EQ(r.optimizer.lr, 1e-5);
  EXPECT_DOUBLE_EQ(r.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(r.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(r.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(r.optimizer.weight_decay, 0.0);
  EXPECT_EQ(r.optimizer.master_weights, "float32");
  EXPECT_EQ(r.schedule.name, "constant");
  EXPECT_EQ(r.schedule.warmup_steps, 0);
  EXPECT_DOUBLE_EQ(r.schedule.min_lr_ratio, 0.0);
  EXPECT_DOUBLE_EQ(r.clip.max_grad_norm, 1.0);
  EXPECT_EQ(r.checkpoint.every_steps, 0);
  EXPECT_EQ(r.checkpoint.keep_last, 2);
  EXPECT_EQ(r.parallel.timeout_s, 600);
  EXPECT_EQ(r.parallel.ep_dispatch, "auto");
  EXPECT_DOUBLE_EQ(r.parallel.ep_row_headroom, 1.15);
  EXPECT_TRUE(r.parallel.shard_optimizer);
  EXPECT_EQ(r.parallel.gpu_collectives, "nccl");
}

TEST(Recipe, SetOverridesScalarAndList) {
  TempRecipe f(std::string(kMinimal) + "train: {grad_accum: 2}\n");
  const Recipe r = recipe_load(
      f.path, {"train.grad_accum=16", "optimizer.betas=[0.9,0.95]", "data.pack=false", "model.path=/other",
               "parallel.gpu_collectives=host"});
  EXPECT_EQ(r.train.grad_accum, 16);
  EXPECT_EQ(r.parallel.gpu_collectives, "host");
  EXPECT_DOUBLE_EQ(r.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(r.optimizer.beta2, 0.95);
  EXPECT_FALSE(r.data.pack);
  EXPECT_EQ(r.model.path, "/other");
  // A --set can supply a required key missing from the file; overrides are validated too.
  TempRecipe g("model: {path: /m}\ndata: {train: t}\n");
  EXPECT_EQ(recipe_load(g.path, {"checkpoint.dir=/x"}).checkpoint.dir, "/x");
  EXPECT_EQ(load_error(kMinimal, {"train.grad_accum=0"}),
            ": train.grad_accum: must be an integer in 1..1048576 (found '0')");
}

TEST(Recipe, UnknownKeyAndSection) {
  EXPECT_EQ(load_error(std::string(kMinimal) + "train: {foo: 1}\n"),
            ": unknown key 'train.foo' (valid keys in 'train': micro_batch_size, grad_accum, max_steps, epochs, "
            "seed, device, eval_every, log_every, max_nonfinite_steps, recompute, deterministic)");
  EXPECT_EQ(load_error(std::string(kMinimal) + "trian: {epochs: 1}\n"),
            ": unknown section 'trian' (valid sections: model, data, train, optimizer, schedule, clip, checkpoint, parallel, peft, moe)");
  EXPECT_EQ(load_error(std::string(kMinimal) + "clip: 3\n"), ": clip: must be a mapping of keys (found 3)");
  EXPECT_EQ(load_error("- a\n- b\n"), ": the recipe must be a mapping of sections (found a list)");
}

TEST(Recipe, BadValuesNameTheKeyPath) {
  const std::string m = kMinimal;
  EXPECT_EQ(load_error(m + "train: {micro_batch_size: abc}\n"),
            ": train.micro_batch_size: must be an integer in 1..1048576 (found 'abc')");
  EXPECT_EQ(load_error(m + "train: {micro_batch_size: 1.5}\n"),
            ": train.micro_batch_size: must be an integer in 1..1048576 (found '1.5')");
  EXPECT_EQ(load_error("model: {path: /m}\ncheckpoint: {dir: /c}\ndata: {train: t, seq_len: 0}\n"),
            ": data.seq_len: must be an integer in 1..16777216 (found '0')");
  EXPECT_EQ(load_error(m + "optimizer: {lr: 0}\n"), ": optimizer.lr: must be a number > 0 (found '0')");
  EXPECT_EQ(load_error(m + "optimizer: {lr: .nan}\n"), ": optimizer.lr: must be a number > 0 (found '.nan')");
  EXPECT_EQ(load_error(m + "optimizer: {eps: -1e-8}\n"), ": optimizer.eps: must be a number > 0 (found '-1e-8')");
  EXPECT_EQ(load_error(m + "optimizer: {betas: [0.9, 1.0]}\n"),
            ": optimizer.betas: each beta must be a number in [0, 1) (found '1.0')");
  EXPECT_EQ(load_error(m + "optimizer: {betas: [-0.1, 0.9]}\n"),
            ": optimizer.betas: each beta must be a number in [0, 1) (found '-0.1')");
  EXPECT_EQ(load_error(m + "optimizer: {betas: [0.9]}\n"),
            ": optimizer.betas: must be a list [beta1, beta2] (found 'a list')");
  EXPECT_EQ(load_error(m + "schedule: {min_lr_ratio: 1.5}\n"),
            ": schedule.min_lr_ratio: must be a number in [0, 1] (found '1.5')");
  EXPECT_EQ(load_error(m + "schedule: {warmup_steps: -1}\n"),
            ": schedule.warmup_steps: must be an integer >= 0 (found '-1')");
  EXPECT_EQ(load_error(m + "checkpoint_x: 1\n").find("unknown section 'checkpoint_x'"), 2u);
  EXPECT_EQ(load_error("model: {path: /m}\ndata: {train: t}\ncheckpoint: {dir: /c, keep_last: 0}\n"),
            ": checkpoint.keep_last: must be an integer >= 1 (found '0')");
  EXPECT_EQ(load_error(m + "train: {grad_accum: 0}\n"), ": train.grad_accum: must be an integer in 1..1048576 (found '0')");
  EXPECT_EQ(load_error(m + "parallel: {timeout_s: 0}\n"), ": parallel.timeout_s: must be an integer in 1..31536000 (found '0')");
  EXPECT_EQ(load_error(m + "clip: {max_grad_norm: -1}\n"), ": clip.max_grad_norm: must be a number >= 0 (found '-1')");
  EXPECT_EQ(load_error(m + "train: {pack: 1}\n").find("unknown key 'train.pack'"), 2u);
  EXPECT_EQ(load_error("model: {path: /m}\ncheckpoint: {dir: /c}\ndata: {train: t, pack: maybe}\n"),
            ": data.pack: must be true or false (found 'maybe')");
}

// Sizes the engine multiplies (tokens per window) and the collective deadline have upper bounds, so a hostile
// recipe cannot overflow them into a wrapped-around allocation or a deadline in the past.
TEST(Recipe, SizesHaveUpperBounds) {
  const std::string m = kMinimal;
  // (--set, the error after the file name)
  const std::pair<const char*, const char*> refused[] = {
      {"data.seq_len=9223372036854775807",
       ": data.seq_len: must be an integer in 1..16777216 (found '9223372036854775807')"},
      {"data.seq_len=99999999999999999999",
       ": data.seq_len: must be an integer in 1..16777216 (found '99999999999999999999')"},
      {"train.micro_batch_size=1048577", ": train.micro_batch_size: must be an integer in 1..1048576 (found '1048577')"},
      {"train.grad_accum=4611686018427387904",
       ": train.grad_accum: must be an integer in 1..1048576 (found '4611686018427387904')"},
      {"parallel.timeout_s=9223372036854775807",
       ": parallel.timeout_s: must be an integer in 1..31536000 (found '9223372036854775807')"},
  };
  for (const auto& [set, error] : refused) EXPECT_EQ(load_error(m, {set}), error) << set;
  const Recipe r = recipe_load(TempRecipe(m).path, {"data.seq_len=16777216", "train.micro_batch_size=1048576",
                                                     "train.grad_accum=1048576", "parallel.timeout_s=31536000"});
  EXPECT_EQ(r.data.seq_len, kMaxSeqLen);
  EXPECT_EQ(r.train.micro_batch_size, kMaxMicroBatch);
  EXPECT_EQ(r.train.grad_accum, kMaxGradAccum);
  EXPECT_EQ(r.parallel.timeout_s, kMaxTimeoutS);
}

TEST(Recipe, EnumsListChoices) {
  const std::string m = kMinimal;
  EXPECT_EQ(load_error(m + "schedule: {name: step}\n"),
            ": schedule.name: must be one of constant, linear, cosine (found 'step')");
  EXPECT_EQ(load_error("model: {path: /m, dtype: fp16}\ndata: {train: t}\ncheckpoint: {dir: /c}\n"),
            ": model.dtype: must be one of bfloat16, float32 (found 'fp16')");
  EXPECT_EQ(load_error(m + "train: {device: gpu}\n"),
            ": train.device: must be one of auto, cpu, cuda, cuda:N (found 'gpu')");
  EXPECT_EQ(load_error(m + "train: {device: 'cuda:x'}\n"),
            ": train.device: must be one of auto, cpu, cuda, cuda:N (found 'cuda:x')");
  EXPECT_EQ(load_error(m + "optimizer: {name: sgd}\n"), ": optimizer.name: must be one of adamw (found 'sgd')");
  EXPECT_EQ(load_error(m + "parallel: {ep_dispatch: deepep}\n"),
            ": parallel.ep_dispatch: must be one of auto, all_gather, all_to_all (found 'deepep')");
  EXPECT_EQ(load_error(m + "parallel: {ep_row_headroom: -0.5}\n"),
            ": parallel.ep_row_headroom: must be 0 (count the expert rows on the host) or a number in (0, 16] "
            "(found '-0.5')");
  EXPECT_EQ(load_error(m + "parallel: {ep_row_headroom: lots}\n"),
            ": parallel.ep_row_headroom: must be 0 (count the expert rows on the host) or a number in (0, 16] "
            "(found 'lots')");
  EXPECT_EQ(load_error(m + "parallel: {gpu_collectives: mpi}\n"),
            ": parallel.gpu_collectives: must be one of nccl, host (found 'mpi')");
  EXPECT_EQ(load_error(m + "parallel: {shard_optimizer: sometimes}\n"),
            ": parallel.shard_optimizer: must be true or false (found 'sometimes')");
  EXPECT_EQ(load_error(m + "optimizer: {master_weights: bf16}\n"),
            ": optimizer.master_weights: must be one of float32, none (found 'bf16')");
}

TEST(Recipe, RequiredKeys) {
  EXPECT_EQ(load_error("data: {train: t}\ncheckpoint: {dir: /c}\n"), ": model.path: required key is missing");
  EXPECT_EQ(load_error("model: {path: /m}\ncheckpoint: {dir: /c}\n"), ": data.train: required key is missing");
  EXPECT_EQ(load_error("model: {path: /m}\ndata: {train: t}\n"), ": checkpoint.dir: required key is missing");
  EXPECT_EQ(load_error(""), ": model.path: required key is missing");
}

TEST(Recipe, BadSetNamesTheArgument) {
  EXPECT_EQ(load_error(kMinimal, {"train.grad_accum"}), ": --set 'train.grad_accum': expected section.key=value");
  EXPECT_EQ(load_error(kMinimal, {"train.foo=1"}),
            ": --set 'train.foo=1': unknown key 'train.foo' (valid keys in 'train': micro_batch_size, grad_accum, "
            "max_steps, epochs, seed, device, eval_every, log_every, max_nonfinite_steps, recompute, deterministic)");
  EXPECT_EQ(load_error(kMinimal, {"bogus.x=1"}).find(": --set 'bogus.x=1': unknown section 'bogus'"), 0u);
  EXPECT_EQ(load_error(kMinimal, {"train=1"}).find(": --set 'train=1': unknown key 'train'"), 0u);
  EXPECT_EQ(load_error(kMinimal, {"optimizer.betas=[0.9,"}).find(": --set 'optimizer.betas=[0.9,': value is not"),
            0u);
}

TEST(Recipe, YamlSyntaxErrorHasLineAndColumn) {
  const std::string e = load_error("model:\n  path: /m\ndata: [unclosed\n");
  EXPECT_EQ(e.find(":4:"), 0u) << e;  // yaml-cpp reports the end of input for an unclosed flow list
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
  const std::string e2 = load_error("model:\n  path: /m\n    bad: indent\n");
  EXPECT_EQ(e2.find(":3:"), 0u) << e2;
  try {
    recipe_load("/nonexistent/recipe.yaml", {});
    FAIL();
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "/nonexistent/recipe.yaml: cannot open recipe file");
  }
}


// The peft section (LoRA): defaults, the form of each field, and what is refused; the target names themselves are
// checked against the model's family when it is loaded (tests/models/lora_model_test.cpp).
TEST(Recipe, PeftSection) {
  {
    TempRecipe f(kMinimal);
    EXPECT_FALSE(recipe_load(f.path, {}).peft.enabled);
  }
  TempRecipe f(std::string(kMinimal) + "peft: {target: [q_proj, experts]}\n");
  const Recipe r = recipe_load(f.path, {});
  EXPECT_TRUE(r.peft.enabled);
  EXPECT_EQ(r.peft.method, "lora");
  EXPECT_EQ(r.peft.r, 16);
  EXPECT_EQ(r.peft.alpha, 32);
  EXPECT_EQ(r.peft.dropout, 0.0);
  EXPECT_FALSE(r.peft.use_rslora);
  EXPECT_EQ(r.peft.target, (std::vector<std::string>{"q_proj", "experts"}));
  EXPECT_EQ(r.file, f.path);
  const Recipe s = recipe_load(f.path, {"peft.r=8", "peft.alpha=4", "peft.use_rslora=true"});
  EXPECT_EQ(s.peft.r, 8);
  EXPECT_EQ(s.peft.alpha, 4);
  EXPECT_TRUE(s.peft.use_rslora);

  const std::string p = std::string(kMinimal) + "peft: {target: [q_proj]}\n";
  EXPECT_EQ(load_error(p, {"peft.method=dora"}), ": peft.method: must be one of lora (found 'dora')");
  EXPECT_EQ(load_error(p, {"peft.r=0"}), ": peft.r: must be an integer in 1..1048576 (found '0')");
  EXPECT_EQ(load_error(p, {"peft.alpha=0"}), ": peft.alpha: must be a number > 0 (found '0')");
  EXPECT_EQ(load_error(p, {"peft.dropout=0.1"}),
            ": peft.dropout: must be 0: LoRA dropout is not implemented (PEFT refuses it for expert parameters too) "
            "(found '0.1')");
  EXPECT_EQ(load_error(p, {"peft.target=[]"}), ": peft.target: must be a non-empty list of target names (found 'a list')");
  EXPECT_EQ(load_error(p, {"peft.target=q_proj"}),
            ": peft.target: must be a non-empty list of target names (found 'q_proj')");
  EXPECT_EQ(load_error(std::string(kMinimal) + "peft: {r: 4}\n"), ": peft.target: required key is missing");
  EXPECT_EQ(load_error(p, {"peft.rank=4"}),
            ": --set 'peft.rank=4': unknown key 'peft.rank' (valid keys in 'peft': method, r, alpha, dropout, target, "
            "use_rslora)");
  // model.adapter alone turns LoRA on; its adapter_config.json gives the settings.
  TempRecipe a{std::string(kMinimal)};
  const Recipe ra = recipe_load(a.path, {"model.adapter=/some/adapter"});
  EXPECT_TRUE(ra.peft.enabled);
  EXPECT_TRUE(ra.peft.target.empty());
}

// recipes/ of the source tree ($MIXTUNE_SOURCE_DIR where the test binary runs elsewhere, as tests/fixture_dir.h).
std::filesystem::path shipped_recipes_dir() {
  std::vector<std::filesystem::path> roots;
  if (const char* e = std::getenv("MIXTUNE_SOURCE_DIR"); e && *e) roots.emplace_back(e);
  roots.emplace_back(MIXTUNE_SOURCE_DIR);
  roots.push_back(std::filesystem::current_path());
  for (const auto& r : roots)
    if (std::filesystem::is_regular_file(r / "recipes" / "quickstart.yaml")) return r / "recipes";
  return {};
}

// Every recipe shipped in recipes/ loads (recipe_load checks each key, value and bound, and throws otherwise), and the
// ones the README and scripts/gpu-session.sh run keep what their header comments promise.
TEST(Recipe, ShippedRecipesLoad) {
  const std::filesystem::path dir = shipped_recipes_dir();
  ASSERT_FALSE(dir.empty()) << "recipes/quickstart.yaml not found";
  std::map<std::string, Recipe> loaded;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    loaded.emplace(e.path().filename().string(), recipe_load(e.path().string(), {}));
  }
  for (const char* name : {"quickstart.yaml", "quickstart-lora.yaml", "gpt-oss-20b.yaml", "qwen3-30b-a3b-lora.yaml",
                           "moonlight-16b-a3b.yaml", "nemotron-3-nano-30b-a3b.yaml"})
    ASSERT_EQ(loaded.count(name), 1u) << name;

  // Moonlight-16B-A3B: 4 GPUs, experts split over them, pure bf16, the aux-loss-free bias update on.
  const Recipe& m = loaded.at("moonlight-16b-a3b.yaml");
  EXPECT_EQ(m.model.dtype, "bfloat16");
  EXPECT_EQ(m.train.device, "cuda");
  EXPECT_EQ(m.train.recompute, "none");
  EXPECT_EQ(m.parallel.ep, 4);
  EXPECT_EQ(m.optimizer.master_weights, "none");
  EXPECT_EQ(m.optimizer.moment_dtype, "bfloat16");
  EXPECT_EQ(m.optimizer.expert_grad_dtype, "bfloat16");
  EXPECT_DOUBLE_EQ(m.moe.bias_update_rate, 0.001);
  EXPECT_FALSE(m.peft.enabled);
  // The overrides scripts/gpu-session.sh's dsv3-recipe stage runs it with (one GPU, a slice, 50 steps).
  const Recipe slice = recipe_load((dir / "moonlight-16b-a3b.yaml").string(),
                                   {"parallel.ep=1", "train.max_steps=50", "data.seq_len=2048", "train.grad_accum=2",
                                    "train.log_every=1", "optimizer.lr=1.0e-4", "schedule.warmup_steps=5"});
  EXPECT_EQ(slice.parallel.ep, 1);
  EXPECT_EQ(slice.train.max_steps, 50);
  EXPECT_DOUBLE_EQ(slice.moe.bias_update_rate, 0.001);

  // Nemotron 3 Nano: 8 GPUs, experts split over them, pure bf16, the selection bias as loaded; the overrides of
  // scripts/gpu-session.sh's nemotron-recipe stage.
  const Recipe& n = loaded.at("nemotron-3-nano-30b-a3b.yaml");
  EXPECT_EQ(n.parallel.ep, 8);
  EXPECT_EQ(n.train.recompute, "none");
  EXPECT_EQ(n.optimizer.master_weights, "none");
  EXPECT_EQ(n.moe.bias_update_rate, 0.0);
  const Recipe nslice = recipe_load((dir / "nemotron-3-nano-30b-a3b.yaml").string(),
                                    {"parallel.ep=1", "train.max_steps=50", "data.seq_len=2048", "train.grad_accum=2",
                                     "train.log_every=1", "optimizer.lr=1.0e-4", "schedule.warmup_steps=5"});
  EXPECT_EQ(nslice.parallel.ep, 1);
  EXPECT_EQ(nslice.train.max_steps, 50);

  const Recipe& g = loaded.at("gpt-oss-20b.yaml");  // GPT-OSS has no selection bias: the update stays off
  EXPECT_EQ(g.parallel.ep, 4);
  EXPECT_EQ(g.moe.bias_update_rate, 0.0);
  const Recipe& l = loaded.at("qwen3-30b-a3b-lora.yaml");
  EXPECT_TRUE(l.peft.enabled);
  EXPECT_EQ(l.peft.r, 16);
  EXPECT_EQ(l.peft.alpha, 32);
  EXPECT_EQ(l.train.recompute, "full");
}

}  // namespace
}  // namespace mt
