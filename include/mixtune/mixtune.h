// mixtune's public C++ API: load a Hugging Face checkpoint, inspect it, score and generate with it, fine-tune from a
// recipe, save it back. Family-agnostic (every architecture `mixtune inspect` knows); the internals (src/) are not
// installed and may change, this header keeps its meaning across 0.x releases (new members are added at the end).
// Every failure is a mixtune::Error whose message is the one line the CLI prints (file and field named).
// docs/api.md is the reference.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixtune/version.h"

#if defined(MIXTUNE_BUILDING_LIBRARY)
#define MIXTUNE_API __attribute__((visibility("default")))
#else
#define MIXTUNE_API
#endif

namespace mixtune {

class MIXTUNE_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The library's version ("0.1.0") and whether it was built with the CUDA backend.
MIXTUNE_API std::string version();
MIXTUNE_API bool has_cuda();

struct LoadOptions {
  std::string dtype = "auto";  // "auto" (the checkpoint's), "bfloat16" or "float32"
  std::string adapter;         // a LoRA adapter directory in PEFT's format, attached unmerged (Model::load_adapter)
};

struct ParameterCounts {
  int64_t total = 0, active_per_token = 0, routed_experts = 0, embeddings = 0;
};

struct ModelInfo {
  std::string architecture;  // config.json architectures[0], e.g. "Qwen3MoeForCausalLM"
  std::string model_type;    // "qwen3_moe", "gpt_oss", "deepseek_v3", "nemotron_h"
  std::string dtype;         // the parameters' dtype in memory: "bfloat16" | "float32"
  int64_t layers = 0, moe_layers = 0, hidden_size = 0, vocab_size = 0, experts = 0, experts_per_token = 0;
  ParameterCounts parameters;
  std::string json;  // everything `mixtune inspect --json` prints for the checkpoint
};

// A sequence to score: labels empty = input_ids (the causal LM loss over every next token); -100 = ignored.
// position_ids empty = 0..n-1; a packed row of several documents restarts them at 0 at each document, and
// attention then stays inside each document (as Transformers' packed-sequence forward).
struct Sequence {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;
  std::vector<int64_t> position_ids;
};

struct ScoreResult {
  double loss = 0;      // ce_loss + router_aux_loss_coef · aux_loss, as Transformers' forward returns it
  double ce_loss = 0;   // mean over every valid shifted label of all sequences
  double aux_loss = 0;  // mean load-balancing loss over the batches (0 when the config does not compute it)
  int64_t tokens = 0;   // valid shifted labels
  // With want_logits: float32, row-major, shape [sequences, length, vocab] when all sequences have one length,
  // else [total tokens, vocab].
  std::vector<float> logits;
  std::vector<int64_t> logits_shape;
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  // Unset: generation_config.json's (else 1.0, 1.0, off); temperature 0 = greedy.
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  uint64_t seed = 0;
  std::function<void(int64_t id)> on_token;  // each generated id as it is chosen (streaming)
  std::function<bool()> stop_requested;      // polled after each token: true ends generation ("stopped")
};

struct GenerateResult {
  std::vector<int64_t> ids;  // the generated tokens (the EOS that stopped generation included)
  std::string text;          // their decoding without that EOS ("" when the model has no tokenizer)
  std::string stop_reason;   // "eos" | "max_new_tokens" | "max_length" | "stopped"
};

// Memory the CUDA engine's training would take (the plan `mixtune bench --plan-only` and training print).
struct PlanOptions {
  int64_t micro_batch = 1, seq_len = 4096;
  std::string recompute = "selective";  // "none" | "selective" | "full"
  std::string precision = "fp32-master";  // "fp32-master" | "bf16"
  int64_t device_bytes = int64_t{80} << 30;  // the GPU's memory
};

struct MemoryPlan {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, total = 0, available = 0;
  bool fits = false;
  int64_t max_micro_batch = 0, max_seq_len = 0;  // largest that fit at the other's value (0: none)
  std::string table;                             // the human table the training log prints
};

class MIXTUNE_API Model {
 public:
  // A checkpoint directory, or "Org/Name" in the local Hugging Face cache (HF_HUB_CACHE, HF_HOME).
  static Model from_pretrained(const std::string& path_or_repo_id, const LoadOptions& options = {});
  // Only the description (config.json and the shards' headers): nothing large is read.
  static ModelInfo inspect(const std::string& path_or_repo_id);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  ModelInfo info() const;
  MemoryPlan memory_plan(const PlanOptions& options = {}) const;

  // The loss (and logits) of the sequences as Transformers' forward computes them; an attached adapter runs
  // unmerged, as PEFT's forward does.
  ScoreResult score(const std::vector<Sequence>& sequences, bool want_logits = false) const;

  // Tokenizer of the checkpoint directory (tokenizer.json); Error when it has none.
  std::vector<int64_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
  // The checkpoint's chat template over an OpenAI-style messages JSON array, with the generation prompt.
  std::string apply_chat_template(const std::string& messages_json, bool enable_thinking = true) const;

  // Sampled (or greedy) continuation with a KV / recurrent cache on the CPU. Error while an adapter is attached
  // unmerged (call merge_adapter(): the cached path runs merged weights).
  GenerateResult generate(const std::vector<int64_t>& prompt_ids, const GenerateOptions& options = {}) const;
  GenerateResult generate(const std::string& prompt_text, const GenerateOptions& options = {}) const;

  // LoRA adapters in PEFT's format: attach (unmerged), merge into the weights (PEFT's merge_and_unload), save.
  void load_adapter(const std::string& dir);
  void merge_adapter();
  bool has_adapter() const;
  void save_adapter(const std::string& dir) const;

  // Transformers' layout, names, sharding and dtype; atomic (a failed save leaves `dir` as it was). Error while an
  // adapter is attached unmerged (merge it, or save_adapter).
  void save_pretrained(const std::string& dir) const;

  struct Impl;

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One optimizer step's metrics: the record metrics.jsonl gets.
struct StepMetrics {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;  // NaN where the record holds null (non-finite)
  std::optional<double> eval_loss;
  std::string json;  // the whole record
};

struct FinetuneOptions {
  std::vector<std::string> set;  // recipe overrides "section.key=value" (a YAML value), as `--set`
  bool resume = false;           // continue from <checkpoint.dir>/latest
  std::string adapter;           // continue training this LoRA adapter (= set model.adapter=DIR)
  std::function<void(const StepMetrics&)> on_step;  // after each optimizer step (the lead rank's)
  // Polled after every optimizer step: true stops the run there; it writes a checkpoint and returns with
  // interrupted = true (as the CLI on SIGINT; `resume` continues it). E.g. [&] { return token.stop_requested(); }.
  std::function<bool()> stop_requested;
  // Called once when set-up (loading, data, resume) is done and the first step is next.
  std::function<void()> on_steps_begin;
  bool quiet = false;  // no progress lines on stderr
};

struct FinetuneResult {
  int64_t steps = 0;
  bool interrupted = false;
  double last_loss = 0;
  std::string final_dir;        // the fine-tuned checkpoint (or adapter); "" when interrupted
  std::string last_checkpoint;  // "" when none was written
  std::string metrics_path;     // metrics.jsonl
};

MIXTUNE_API FinetuneResult finetune(const std::string& recipe_path, const FinetuneOptions& options = {});

}  // namespace mixtune
