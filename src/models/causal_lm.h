// The Hugging Face-style entry points: a causal LM loaded from a checkpoint directory (or a repo id
// in the local hub cache) and saved back in the original Hugging Face names, layouts and sharding.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/checkpoint_files.h"
#include "models/spec/decoder_spec.h"
#include "models/model_weights.h"

namespace mt {

struct LoadOptions {
  // Parameter storage dtype. Unset ("auto"): the dtype the checkpoint's float tensors are stored in
  // when they all agree, else config.json's dtype; so an unchanged save rewrites identical bytes.
  std::optional<DType> dtype;
  // expert_count >= 0: only experts [expert_first, expert_first + expert_count) of each MoE layer are read
  // from the shards (an expert-parallel rank's share; ModelWeights::from_hf). The model is then
  // `experts_partial`: save_pretrained refuses it; a shared save (write_pretrained_rows) writes those experts.
  int64_t expert_first = 0, expert_count = -1;
  // With expert_count: the stacked expert tensors hold only those experts ([expert_count, ...], the CPU
  // engine's expert-parallel parameters), not all E rows with only those written (the CUDA engine's host copy).
  bool compact_experts = false;
  // skip_param(name) true: that parameter is checked in the shards but not read; it stays Tensor::absent (a
  // ZeRO-3 rank's parameters owned by other ranks). The model is then `params_partial` and refuses to be saved.
  std::function<bool(const std::string&)> skip_param = {};
};

struct SaveOptions {
  std::optional<int64_t> max_shard_bytes;  // unset: reuse the source's shard mapping, else "50GB"
  bool reuse_source_sharding = true;       // only when the tensor names and dtypes are unchanged
};

class CausalLM {
 public:
  static CausalLM from_pretrained(const std::string& path_or_repo_id, const LoadOptions& options = {});
  // A freshly initialised model (normal(0, initializer_range), norms = 1, the embedding's padding_idx row 0) for
  // `config`.
  static CausalLM from_config(const DecoderSpec& config, DType dtype, uint64_t seed);

  // Writes config.json, generation_config.json, tokenizer files carried from the source, and the
  // weights (per-expert HF names) atomically: a failed save leaves `dir` as it was.
  void save_pretrained(const std::string& dir, const SaveOptions& options = {}) const;
  // The same files written into an existing directory, without the atomic swap: for callers that
  // assemble a larger all-or-nothing directory (training checkpoints) themselves.
  void write_pretrained_files(const std::string& dir, const SaveOptions& options = {}) const;
  // The same files written by several processes (a job whose ranks each hold some of the experts; see
  // io/safetensors_shared.h): the lead writes the metadata files and lays out the weight files; after a
  // barrier every process writes the rows of the HF tensors rows_of gives it (HF names: per-expert
  // tensors). Allowed on an experts_partial model: the caller makes sure every row has a writer.
  void write_pretrained_layout(const std::string& dir, const SaveOptions& options = {}) const;
  void write_pretrained_rows(const std::string& dir, const RowsOf& rows_of, const SaveOptions& options = {}) const;
  // Converts the parameters to `dtype` (the source shard mapping is kept; bytes change).
  void cast(DType dtype);

  DecoderSpec config;
  ModelWeights weights;
  DType dtype = DType::F32;
  std::string source_dir;                          // empty for from_config
  std::map<std::string, std::string> carried_files;  // carried_file_names() read at load: name -> bytes
  std::map<std::string, std::string> source_shard_of;  // tensor -> shard file, when loaded from shards
  DType source_dtype = DType::F32;
  bool experts_partial = false;  // loaded with LoadOptions::expert_count: the other experts are unset
  int64_t expert_first = 0;      // LoadOptions::compact_experts: the first expert the stacked tensors hold
  bool params_partial = false;   // loaded with LoadOptions::skip_param: those parameters are absent

 private:
  struct SaveLayout {
    std::vector<std::pair<std::string, Tensor>> tensors;  // HF names, save order
    CheckpointWriteOptions write;
  };
  SaveLayout save_layout(const SaveOptions& options) const;
  void write_metadata_files(const std::string& dir) const;  // config, generation config, carried files
};

// Files besides the weights that a save carries over from the source directory.
const std::vector<std::string>& carried_file_names();

// save_pretrained's shard assignment for tensors in save order (ModelWeights::to_hf), with the storage each is a
// view of (HfNameMap::saved_storage_units, parallel): huggingface_hub's greedy rule over storage units; tensor ->
// "model-0000k-of-0000N.safetensors"; empty when everything fits in one file.
std::map<std::string, std::string> hf_shard_mapping(const std::vector<std::pair<std::string, Tensor>>& ordered,
                                                    const std::vector<int64_t>& storage_units,
                                                    int64_t max_shard_bytes);

}  // namespace mt
