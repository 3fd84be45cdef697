// The reversible map between a Hugging Face checkpoint's tensors and a model's in-memory parameters, built from a
// family's rules (models/spec/hf_rules.h) and its parameter list. load() checks every checkpoint tensor before it
// allocates anything (missing, unexpected, duplicate, wrong shape or dtype, bad quantisation scales: one-line
// mt::Error naming the file and the tensor) and then fills each parameter in place; save() gives the checkpoint
// tensors in the order save_pretrained writes them, as views of the parameters wherever the bytes are contiguous.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/spec/hf_rules.h"

namespace mt {

class CheckpointFiles;

// One in-memory parameter (a row of the model's parameter table), in state_dict order.
struct HfParam {
  std::string name;           // Transformers' in-memory (v5) name
  Shape shape;
  DType dtype = DType::F32;   // what load converts to (F32 or BF16)
  bool expert_stack = false;  // dim 0 indexes routed experts (expert parallelism splits it)
};

// The tensors of a checkpoint as load() reads them.
struct HfCheckpoint {
  std::string source;              // the directory (or file), named by errors that have no file
  std::vector<std::string> names;  // every stored name, once per file holding it
  std::function<Tensor(const std::string&)> tensor;        // a CPU tensor (may borrow mapped bytes)
  std::function<std::string(const std::string&)> file_of;  // the file holding a name; empty: `source`
};
// The tensors of a checkpoint directory (borrows `files`, which must outlive the result).
HfCheckpoint hf_checkpoint_of(const CheckpointFiles& files);

struct HfLoadOptions {
  // Only experts [expert_first, expert_first + expert_count) of each expert stack are read (an expert-parallel
  // rank's share); every tensor is still checked. -1: all. The stack keeps all E rows (the others unwritten) unless
  // compact_experts, where it holds just those experts.
  int64_t expert_first = 0;
  int64_t expert_count = -1;
  bool compact_experts = false;
  // skip(param name) true: the parameter's tensors are checked but not read; it is returned as Tensor::absent.
  std::function<bool(const std::string&)> skip;
  // FP8 block size (quantization_config.weight_block_size).
  int64_t fp8_block_rows = 128;
  int64_t fp8_block_cols = 128;
  // false: the checkpoint declares no FP8 quantisation (config.json has no quantization_config), so an F8_E4M3
  // tensor is an error rather than dequantised.
  bool fp8_declared = true;
};

// Where a tensor save() writes comes from: which parameter, and which of an expert stack's experts it holds (a shared
// save gives each rank the tensors, or the rows, of the experts it holds: train/shared_save.h).
struct HfSavedSource {
  std::string name;           // the checkpoint name, as saved_names() gives it
  size_t param = 0;           // index into params()
  int64_t expert = -1;        // inside hf_stack_experts: the one expert this tensor is; else -1
  bool expert_rows = false;   // an expert stack's tensor whose dim 0 still indexes its experts (a fused stack)
};

class HfNameMap {
 public:
  // Resolves every rule against every parameter; throws mt::Error naming the parameter when a rule does not fit
  // its shape, two parameters claim one checkpoint name, a rename is not invertible, or a drop hides a tensor.
  HfNameMap(const HfLayout& layout, std::vector<HfParam> params);
  ~HfNameMap();
  HfNameMap(HfNameMap&&) noexcept;
  HfNameMap& operator=(HfNameMap&&) noexcept;

  const std::vector<HfParam>& params() const { return params_; }

  // The parameters, parallel to params(), converted to each one's dtype.
  std::vector<Tensor> load(const HfCheckpoint& ckpt, const HfLoadOptions& options = {}) const;

  // The checkpoint tensors for `values` (parallel to params(); an expert stack may hold experts
  // [expert_first, expert_first + dim 0) only), in save order, with their checkpoint names (renamed back).
  // Tensors are views of `values` where the bytes are contiguous, else copies; an absent value, or experts a stack
  // does not hold, give Tensor::absent of the right shape (a shared save's other ranks' parts). A tensor whose
  // dim 0 indexes the experts (a fused stack) comes back in its full shape with only the held experts' rows written
  // (the others unset: a shared save writes just those rows, HfSavedSource::expert_rows).
  std::vector<std::pair<std::string, Tensor>> save(const std::vector<Tensor>& values, int64_t expert_first = 0) const;

  // Every checkpoint name save() writes, in order, with its shape (plans, inspect).
  std::vector<std::pair<std::string, Shape>> saved_names() const;
  // Parallel to saved_names(): the storage each saved tensor is a view of in Transformers' save (one per expert
  // stack of a parameter's tree, all its experts' tensors sharing it; one per tensor otherwise), numbered 0, 1, ...
  // in save order. huggingface_hub's sharding places a storage's tensors together.
  std::vector<int64_t> saved_storage_units() const;
  // Parallel to saved_names(): each saved tensor's parameter and experts.
  std::vector<HfSavedSource> saved_sources() const;

  struct Impl;  // the resolved rule trees (defined in the .cpp only)

 private:
  std::vector<HfParam> params_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
