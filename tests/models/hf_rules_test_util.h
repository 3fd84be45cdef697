// Helpers for the checkpoint-converter tests: an in-memory checkpoint, deterministic tensors, and the four families'
// checkpoint layouts written as rule lists (hf-numerics.md §3.3, §4.3, §5.4, §6.3, §8.1).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/float_convert.h"
#include "models/spec/hf_name_map.h"
#include "models/families/families.h"
#include "models/spec/hf_rules.h"

namespace mt::hf_test {

// Checkpoint tensors in stored order; a name may repeat (two files holding it).
struct FakeCheckpoint {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::string dir = "ckpt";

  void add(const std::string& name, Tensor t) { tensors.emplace_back(name, std::move(t)); }
  void erase(const std::string& name) {
    std::erase_if(tensors, [&](const auto& kv) { return kv.first == name; });
  }
  Tensor& at(const std::string& name) {
    for (auto& [n, t] : tensors)
      if (n == name) return t;
    ADD_FAILURE() << "no tensor " << name;
    return tensors.front().second;
  }
  // Files are named after the tensor's first letter's parity, so errors can be checked to name the right file.
  static std::string file_for(const std::string& name) {
    return std::string("ckpt/model-0000") + (name.size() % 2 ? "1" : "2") + "-of-00002.safetensors";
  }
  HfCheckpoint view() const {
    HfCheckpoint c;
    c.source = dir;
    for (const auto& [n, t] : tensors) c.names.push_back(n);
    c.tensor = [this](const std::string& n) {
      for (const auto& [m, t] : tensors)
        if (m == n) return t;
      return Tensor();
    };
    c.file_of = [](const std::string& n) { return file_for(n); };
    return c;
  }
};

// Distinct bf16 / f32 values per tensor (seeded by `salt`), so any misplaced element shows.
inline Tensor pattern_tensor(const Shape& shape, DType dt, uint32_t salt) {
  Tensor t = Tensor::empty(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = static_cast<float>((i * 7919 + salt * 104729) % 65521) / 256.0f - 100.0f;
    if (dt == DType::BF16)
      t.data_as<uint16_t>()[i] = float_to_bf16(v);
    else
      t.data_as<float>()[i] = v;
  }
  return t;
}

inline bool bytes_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// ---- Families (tiny): parameter lists in state_dict order, rules as the family files will state them.

// Qwen3-MoE / Qwen3 (§3.3, §8.1 qwen2_moe pattern): the family file's rules (families/qwen3.cpp).
inline HfLayout qwen3_layout(bool moe, bool tied) { return qwen3_hf_layout(moe, tied); }

// GPT-OSS (§4.3, §8.5): fused experts stored [E, H, 2I] with gate/up interleaved in the last dim, [E, I, H] for
// down; MXFP4 or bf16. In memory (the engine's layout): gate_up [E, 2I, H] gate rows then up rows, down [E, H, I].
inline HfLayout gpt_oss_layout() { return gpt_oss_hf_layout(); }  // the family file's rules (families/gpt_oss.cpp)

struct GptOssDims {
  int64_t V = 16, H = 32, I = 32, E = 3, heads = 2, kv = 1, D = 16, layers = 2;
};
inline std::vector<HfParam> gpt_oss_params(const GptOssDims& d, DType dt = DType::BF16) {
  std::vector<HfParam> p = {{"model.embed_tokens.weight", {d.V, d.H}, dt}};
  for (int64_t L = 0; L < d.layers; ++L) {
    const std::string s = "model.layers." + std::to_string(L) + ".";
    p.push_back({s + "self_attn.q_proj.weight", {d.heads * d.D, d.H}, dt});
    p.push_back({s + "self_attn.q_proj.bias", {d.heads * d.D}, dt});
    p.push_back({s + "self_attn.k_proj.weight", {d.kv * d.D, d.H}, dt});
    p.push_back({s + "self_attn.k_proj.bias", {d.kv * d.D}, dt});
    p.push_back({s + "self_attn.v_proj.weight", {d.kv * d.D, d.H}, dt});
    p.push_back({s + "self_attn.v_proj.bias", {d.kv * d.D}, dt});
    p.push_back({s + "self_attn.o_proj.weight", {d.H, d.heads * d.D}, dt});
    p.push_back({s + "self_attn.o_proj.bias", {d.H}, dt});
    p.push_back({s + "self_attn.sinks", {d.heads}, dt});
    p.push_back({s + "mlp.router.weight", {d.E, d.H}, dt});
    p.push_back({s + "mlp.router.bias", {d.E}, dt});
    p.push_back({s + "mlp.experts.gate_up_proj", {d.E, 2 * d.I, d.H}, dt, true});
    p.push_back({s + "mlp.experts.gate_up_proj_bias", {d.E, 2 * d.I}, dt, true});
    p.push_back({s + "mlp.experts.down_proj", {d.E, d.H, d.I}, dt, true});
    p.push_back({s + "mlp.experts.down_proj_bias", {d.E, d.H}, dt, true});
    p.push_back({s + "input_layernorm.weight", {d.H}, dt});
    p.push_back({s + "post_attention_layernorm.weight", {d.H}, dt});
  }
  p.push_back({"model.norm.weight", {d.H}, dt});
  p.push_back({"lm_head.weight", {d.V, d.H}, dt});
  return p;
}

// DeepSeek-V3 (§5.4, §8.1, §8.6): per-expert tensors like Qwen3-MoE; every linear weight may be FP8 with block
// scales; the MTP layer (index num_hidden_layers) is dropped; e_score_correction_bias is an F32 buffer.
struct Dsv3Dims {
  int64_t V = 16, H = 8, q_lora = 6, kv_lora = 4, rope = 2, nope = 2, v = 3, heads = 2, F = 10, I = 4, E = 3,
          shared_I = 4, layers = 2;  // layer 0 dense, layer 1 MoE
};
inline HfLayout dsv3_layout(const Dsv3Dims& d) {
  HfLayout l;
  const std::string p = "model.layers.{L}.", x = p + "mlp.experts.";
  for (const char* w : {"self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
                        "self_attn.kv_b_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                        "mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj"})
    l.rules.push_back(hf_quantised(p + w + ".weight", hf_fp8_block));
  l.rules.push_back(hf_param(x + "gate_up_proj",
                             hf_concat(1, {hf_stack_experts(hf_tensor(x + "{E}.gate_proj.weight", hf_fp8_block)),
                                           hf_stack_experts(hf_tensor(x + "{E}.up_proj.weight", hf_fp8_block))})));
  l.rules.push_back(hf_param(x + "down_proj", hf_stack_experts(hf_tensor(x + "{E}.down_proj.weight", hf_fp8_block))));
  l.rules.push_back(hf_drop("model.layers." + std::to_string(d.layers) + ".{*}"));  // the MTP layer
  l.save_order = HfSaveOrder::sorted_by_param;
  return l;
}
inline std::vector<HfParam> dsv3_params(const Dsv3Dims& d, DType dt = DType::BF16) {
  std::vector<HfParam> p = {{"model.embed_tokens.weight", {d.V, d.H}, dt}};
  for (int64_t L = 0; L < d.layers; ++L) {
    const std::string s = "model.layers." + std::to_string(L) + ".";
    p.push_back({s + "self_attn.q_a_proj.weight", {d.q_lora, d.H}, dt});
    p.push_back({s + "self_attn.q_a_layernorm.weight", {d.q_lora}, dt});
    p.push_back({s + "self_attn.q_b_proj.weight", {d.heads * (d.nope + d.rope), d.q_lora}, dt});
    p.push_back({s + "self_attn.kv_a_proj_with_mqa.weight", {d.kv_lora + d.rope, d.H}, dt});
    p.push_back({s + "self_attn.kv_a_layernorm.weight", {d.kv_lora}, dt});
    p.push_back({s + "self_attn.kv_b_proj.weight", {d.heads * (d.nope + d.v), d.kv_lora}, dt});
    p.push_back({s + "self_attn.o_proj.weight", {d.H, d.heads * d.v}, dt});
    if (L == 0) {
      p.push_back({s + "mlp.gate_proj.weight", {d.F, d.H}, dt});
      p.push_back({s + "mlp.up_proj.weight", {d.F, d.H}, dt});
      p.push_back({s + "mlp.down_proj.weight", {d.H, d.F}, dt});
    } else {
      p.push_back({s + "mlp.gate.weight", {d.E, d.H}, dt});
      p.push_back({s + "mlp.gate.e_score_correction_bias", {d.E}, DType::F32});
      p.push_back({s + "mlp.experts.gate_up_proj", {d.E, 2 * d.I, d.H}, dt, true});
      p.push_back({s + "mlp.experts.down_proj", {d.E, d.H, d.I}, dt, true});
      p.push_back({s + "mlp.shared_experts.gate_proj.weight", {d.shared_I, d.H}, dt});
      p.push_back({s + "mlp.shared_experts.up_proj.weight", {d.shared_I, d.H}, dt});
      p.push_back({s + "mlp.shared_experts.down_proj.weight", {d.H, d.shared_I}, dt});
    }
    p.push_back({s + "input_layernorm.weight", {d.H}, dt});
    p.push_back({s + "post_attention_layernorm.weight", {d.H}, dt});
  }
  p.push_back({"model.norm.weight", {d.H}, dt});
  p.push_back({"lm_head.weight", {d.V, d.H}, dt});
  return p;
}

// Nemotron-H (§6.3, §8.1): "backbone." on disk, "model." in memory; up/down experts stacked (no gate); mtp.* ignored.
inline HfLayout nemotron_h_layout() {
  HfLayout l;
  const std::string x = "model.layers.{L}.mixer.experts.";
  l.rules = {
      hf_rename("backbone.", "model."),
      hf_drop("mtp.{*}"),
      hf_param(x + "up_proj", hf_stack_experts(hf_tensor(x + "{E}.up_proj.weight"))),
      hf_param(x + "down_proj", hf_stack_experts(hf_tensor(x + "{E}.down_proj.weight"))),
  };
  l.save_order = HfSaveOrder::sorted_by_param;
  return l;
}
struct NemhDims {
  int64_t V = 16, H = 8, in_proj = 30, conv = 12, mheads = 2, inner = 8, E = 3, I = 4, shared_I = 6, q = 8, kv = 4;
};
inline std::vector<HfParam> nemotron_h_params(const NemhDims& d, DType dt = DType::BF16) {
  // Pattern "ME*": a Mamba layer, an MoE layer, an attention layer.
  std::vector<HfParam> p = {{"model.embeddings.weight", {d.V, d.H}, dt}};
  p.push_back({"model.layers.0.norm.weight", {d.H}, dt});
  p.push_back({"model.layers.0.mixer.A_log", {d.mheads}, dt});
  p.push_back({"model.layers.0.mixer.D", {d.mheads}, dt});
  p.push_back({"model.layers.0.mixer.conv1d.weight", {d.conv, 1, 4}, dt});
  p.push_back({"model.layers.0.mixer.conv1d.bias", {d.conv}, dt});
  p.push_back({"model.layers.0.mixer.dt_bias", {d.mheads}, dt});
  p.push_back({"model.layers.0.mixer.in_proj.weight", {d.in_proj, d.H}, dt});
  p.push_back({"model.layers.0.mixer.norm.weight", {d.inner}, dt});
  p.push_back({"model.layers.0.mixer.out_proj.weight", {d.H, d.inner}, dt});
  p.push_back({"model.layers.1.norm.weight", {d.H}, dt});
  p.push_back({"model.layers.1.mixer.gate.weight", {d.E, d.H}, dt});
  p.push_back({"model.layers.1.mixer.gate.e_score_correction_bias", {d.E}, DType::F32});
  p.push_back({"model.layers.1.mixer.experts.up_proj", {d.E, d.I, d.H}, dt, true});
  p.push_back({"model.layers.1.mixer.experts.down_proj", {d.E, d.H, d.I}, dt, true});
  p.push_back({"model.layers.1.mixer.shared_experts.up_proj.weight", {d.shared_I, d.H}, dt});
  p.push_back({"model.layers.1.mixer.shared_experts.down_proj.weight", {d.H, d.shared_I}, dt});
  p.push_back({"model.layers.2.norm.weight", {d.H}, dt});
  p.push_back({"model.layers.2.mixer.q_proj.weight", {d.q, d.H}, dt});
  p.push_back({"model.layers.2.mixer.k_proj.weight", {d.kv, d.H}, dt});
  p.push_back({"model.layers.2.mixer.v_proj.weight", {d.kv, d.H}, dt});
  p.push_back({"model.layers.2.mixer.o_proj.weight", {d.H, d.q}, dt});
  p.push_back({"model.norm_f.weight", {d.H}, dt});
  p.push_back({"lm_head.weight", {d.V, d.H}, dt});
  return p;
}

// Parameters filled with distinct values (what a trained model holds).
inline std::vector<Tensor> pattern_params(const std::vector<HfParam>& params) {
  std::vector<Tensor> v;
  for (size_t i = 0; i < params.size(); ++i)
    v.push_back(pattern_tensor(params[i].shape, params[i].dtype, static_cast<uint32_t>(i + 1)));
  return v;
}

// A checkpoint holding exactly what `map` saves for `values` (deep copies).
inline FakeCheckpoint saved_checkpoint(const HfNameMap& map, const std::vector<Tensor>& values) {
  FakeCheckpoint c;
  for (auto& [n, t] : map.save(values)) c.add(n, t.clone());
  return c;
}

}  // namespace mt::hf_test
