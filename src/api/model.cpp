// mixtune::Model: a CausalLM (models/causal_lm.h) with its optional LoRA adapter and tokenizer, behind the
// library's types. Each method is one call into the layers the CLI commands use.
#include <algorithm>
#include <filesystem>
#include <optional>

#include "api/api_error.h"
#include "core/dtype.h"
#include "core/error.h"
#include "data/chat_prompt.h"
#include "data/token_jsonl.h"
#include "data/tokenizer.h"
#include "io/json_text.h"
#include "mixtune/mixtune.h"
#include "models/causal_lm.h"
#include "models/checkpoint_report.h"
#include "models/generate.h"
#include "models/generation_config.h"
#include "models/lora_checkpoint.h"
#include "train/evaluate.h"
#include "train/memory_plan.h"

namespace mixtune {

using detail::api_call;

struct Model::Impl {
  mutable mt::CausalLM lm;  // score's forward and generate's cache run on it without changing the parameters
  std::optional<mt::LoraWeights> adapter;
  std::string adapter_dir;
  mutable std::optional<mt::Tokenizer> tokenizer;

  const mt::Tokenizer& tok() const {
    if (!tokenizer) {
      if (lm.source_dir.empty()) mt::fail("this model was not loaded from a directory: it has no tokenizer");
      tokenizer = mt::Tokenizer::from_file(lm.source_dir);
    }
    return *tokenizer;
  }
};

namespace {

ModelInfo info_of(const mt::CheckpointReport& r) {
  const nlohmann::json& j = r.json;
  ModelInfo i;
  i.architecture = j["architecture"];
  i.model_type = j["model_type"];
  i.dtype = j["dtype"];
  i.layers = j["layers"];
  i.moe_layers = j["moe_layers"];
  i.hidden_size = j["hidden_size"];
  i.vocab_size = j["vocab_size"];
  i.experts = j["experts"];
  i.experts_per_token = j["experts_per_token"];
  const nlohmann::json& p = j["parameters"];
  i.parameters = {p["total"], p["active_per_token"], p["routed_experts"], p["embeddings"]};
  i.json = j.dump();
  return i;
}

// The ids and labels checked as `mixtune score` checks a JSONL line; errors name sequences[i].
std::vector<mt::TokenRecord> records_of(const std::vector<Sequence>& seqs, int64_t vocab) {
  if (seqs.empty()) mt::fail("score: no sequences");
  std::vector<mt::TokenRecord> out;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = seqs[i];
    mt::TokenRecord r;
    r.input_ids = s.input_ids;
    r.labels = s.labels.empty() ? s.input_ids : s.labels;
    r.position_ids = s.position_ids;
    r.line = static_cast<int64_t>(i) + 1;
    if (r.input_ids.empty()) mt::fail("score: sequences[{}].input_ids is empty", i);
    if (r.labels.size() != r.input_ids.size())
      mt::fail("score: sequences[{}]: labels has {} entries, input_ids {}", i, r.labels.size(), r.input_ids.size());
    if (!r.position_ids.empty() && r.position_ids.size() != r.input_ids.size())
      mt::fail("score: sequences[{}]: position_ids has {} entries, input_ids {}", i, r.position_ids.size(),
               r.input_ids.size());
    for (size_t t = 0; t < r.input_ids.size(); ++t) {
      if (r.input_ids[t] < 0 || r.input_ids[t] >= vocab)
        mt::fail("score: sequences[{}].input_ids[{}] = {} is outside the vocabulary [0, {})", i, t, r.input_ids[t], vocab);
      if (r.labels[t] != -100 && (r.labels[t] < 0 || r.labels[t] >= vocab))
        mt::fail("score: sequences[{}].labels[{}] = {} is neither -100 nor in [0, {})", i, t, r.labels[t], vocab);
    }
    for (size_t t = 0; t < r.position_ids.size(); ++t)
      if (r.position_ids[t] < 0) mt::fail("score: sequences[{}].position_ids[{}] = {} is negative", i, t, r.position_ids[t]);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::from_pretrained(const std::string& path_or_repo_id, const LoadOptions& options) {
  return api_call([&] {
    mt::LoadOptions lo;
    if (options.dtype != "auto" && !options.dtype.empty()) {
      const auto t = mt::dtype_from_torch_name(options.dtype);
      if (!t || (*t != mt::DType::F32 && *t != mt::DType::BF16))
        mt::fail("LoadOptions.dtype: bad dtype '{}' (valid: auto, bfloat16, float32)", options.dtype);
      lo.dtype = *t;
    }
    auto impl = std::make_unique<Impl>(Impl{mt::CausalLM::from_pretrained(path_or_repo_id, lo), {}, {}, {}});
    Model m(std::move(impl));
    if (!options.adapter.empty()) m.load_adapter(options.adapter);
    return m;
  });
}

ModelInfo Model::inspect(const std::string& path_or_repo_id) {
  return api_call([&] { return info_of(mt::checkpoint_report(path_or_repo_id)); });
}

ModelInfo Model::info() const {
  return api_call([&] {
    ModelInfo i = info_of(mt::checkpoint_report(impl_->lm.source_dir));
    i.dtype = std::string(mt::dtype_torch_name(impl_->lm.dtype));  // as loaded, not as stored
    return i;
  });
}

MemoryPlan Model::memory_plan(const PlanOptions& options) const {
  return api_call([&] {
    if (options.precision != "bf16" && options.precision != "fp32-master")
      mt::fail("PlanOptions.precision must be bf16 or fp32-master, found '{}'", options.precision);
    if (options.micro_batch < 1 || options.seq_len < 1 || options.device_bytes < 1)
      mt::fail("PlanOptions: micro_batch, seq_len and device_bytes must be positive");
    mt::MemoryPlanInput in;
    in.cfg = impl_->lm.config;
    in.micro_batch = options.micro_batch;
    in.seq = options.seq_len;
    in.recompute = mt::recompute_parse(options.recompute, "PlanOptions.recompute");
    const bool fp32_master = options.precision == "fp32-master";
    in.fp32_master = fp32_master;
    in.bf16_moments = !fp32_master;
    in.bf16_expert_grads = !fp32_master;
    in.device_bytes = options.device_bytes;
    in.reserve_bytes = mt::memory_plan_reserve_bytes(in.device_bytes);
    if (impl_->adapter) mt::memory_plan_set_lora(in, *impl_->adapter->table, /*gpu=*/true);
    const mt::MemoryPlan p = mt::memory_plan(in);
    MemoryPlan out;
    out.params = p.params;
    out.grads = p.grads;
    out.optimizer = p.optimizer;
    out.activations = p.activations;
    out.workspace = p.workspace;
    out.total = p.total;
    out.available = p.available;
    out.fits = p.fits;
    out.max_micro_batch = p.max_micro_batch;
    out.max_seq_len = p.max_seq;
    out.table = p.table();
    return out;
  });
}

ScoreResult Model::score(const std::vector<Sequence>& sequences, bool want_logits) const {
  return api_call([&] {
    const std::vector<mt::TokenRecord> records = records_of(sequences, impl_->lm.config.vocab_size);
    const mt::ScoreResult r =
        mt::score_records(impl_->lm, records, want_logits, impl_->adapter ? &*impl_->adapter : nullptr);
    ScoreResult out;
    out.loss = r.loss;
    out.ce_loss = r.ce_loss;
    out.aux_loss = r.aux_loss;
    out.tokens = r.tokens;
    if (want_logits) {
      out.logits_shape = r.logits.shape();
      const float* p = r.logits.data_as<float>();
      out.logits.assign(p, p + r.logits.numel());
    }
    return out;
  });
}

std::vector<int64_t> Model::encode(const std::string& text) const {
  return api_call([&] {
    const std::vector<int32_t> ids = impl_->tok().encode(text);
    return std::vector<int64_t>(ids.begin(), ids.end());
  });
}

std::string Model::decode(const std::vector<int64_t>& ids) const {
  return api_call([&] {
    std::vector<int32_t> v;
    for (int64_t id : ids) {
      if (id < 0 || id > INT32_MAX) mt::fail("decode: token id {} is out of range", id);
      v.push_back(static_cast<int32_t>(id));
    }
    return impl_->tok().decode(v);
  });
}

std::string Model::apply_chat_template(const std::string& messages_json, bool enable_thinking) const {
  return api_call([&] {
    if (impl_->lm.source_dir.empty()) mt::fail("apply_chat_template: the model has no source directory");
    const std::string what = "apply_chat_template messages";
    return mt::chat_prompt_render(mt::json_parse_strict(messages_json, what, 64), impl_->lm.source_dir,
                                  enable_thinking, what);
  });
}

GenerateResult Model::generate(const std::vector<int64_t>& prompt_ids, const GenerateOptions& options) const {
  return api_call([&] {
    if (impl_->adapter)
      mt::fail("generate: the LoRA adapter {} is attached unmerged; call merge_adapter() first (the cached decode "
               "runs merged weights)",
               impl_->adapter_dir);
    if (options.max_new_tokens < 0)
      mt::fail("generate: GenerateOptions.max_new_tokens must be >= 0, found {}", options.max_new_tokens);
    mt::CausalLM& lm = impl_->lm;
    for (size_t i = 0; i < prompt_ids.size(); ++i)
      if (prompt_ids[i] < 0 || prompt_ids[i] >= lm.config.vocab_size)
        mt::fail("generate: prompt token {} has id {}, outside the model vocabulary [0, {})", i, prompt_ids[i],
                 lm.config.vocab_size);
    const mt::GenerationConfig gc = mt::generation_config_read(lm.source_dir, lm.config.raw);
    mt::GenerateOptions o;
    o.max_new_tokens = options.max_new_tokens;
    // As `mixtune generate`: the caller's, else generation_config.json's (do_sample false = greedy), else HF's.
    o.sampling.temperature = options.temperature.value_or(gc.do_sample == false ? 0.0 : gc.temperature.value_or(1.0));
    o.sampling.top_p = options.top_p.value_or(gc.top_p.value_or(1.0));
    o.sampling.top_k = options.top_k.value_or(gc.top_k.value_or(0));
    o.seed = options.seed;
    o.eos_token_ids = gc.eos_token_ids;
    o.stop_requested = options.stop_requested;
    const mt::GenerateResult r = mt::generate(lm.config, lm.weights, prompt_ids, o, options.on_token);
    GenerateResult out;
    out.ids = r.ids;
    out.stop_reason = r.stop_reason;
    const bool has_tokenizer =
        !lm.source_dir.empty() && std::filesystem::exists(std::filesystem::path(lm.source_dir) / "tokenizer.json");
    if (has_tokenizer) {
      std::vector<int64_t> shown(r.ids.begin(), r.ids.end() - (r.stop_reason == "eos" ? 1 : 0));
      out.text = decode(shown);
    }
    return out;
  });
}

GenerateResult Model::generate(const std::string& prompt_text, const GenerateOptions& options) const {
  const std::vector<int64_t> ids = encode(prompt_text);
  if (ids.empty()) throw Error("generate: the prompt encodes to no tokens");
  return generate(ids, options);
}

void Model::load_adapter(const std::string& dir) {
  api_call([&] {
    if (impl_->adapter) mt::fail("load_adapter {}: an adapter ({}) is already attached", dir, impl_->adapter_dir);
    impl_->adapter = mt::lora_load_pretrained(dir, impl_->lm.config, impl_->lm.weights);
    impl_->adapter_dir = dir;
  });
}

void Model::merge_adapter() {
  api_call([&] {
    if (!impl_->adapter) mt::fail("merge_adapter: no adapter is attached");
    mt::lora_merge_into(impl_->lm.weights, *impl_->adapter);
    impl_->adapter.reset();
    impl_->adapter_dir.clear();
  });
}

bool Model::has_adapter() const { return impl_->adapter.has_value(); }

void Model::save_adapter(const std::string& dir) const {
  api_call([&] {
    if (!impl_->adapter) mt::fail("save_adapter: no adapter is attached");
    mt::lora_save_pretrained(dir, impl_->lm.config, *impl_->adapter, impl_->lm.weights, impl_->lm.source_dir);
  });
}

void Model::save_pretrained(const std::string& dir) const {
  api_call([&] {
    if (impl_->adapter)
      mt::fail("save_pretrained {}: the LoRA adapter {} is attached unmerged; merge_adapter() first, or "
               "save_adapter()",
               dir, impl_->adapter_dir);
    impl_->lm.save_pretrained(dir);
  });
}

}  // namespace mixtune
