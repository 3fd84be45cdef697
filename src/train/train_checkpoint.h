// Training checkpoints: <run_dir>/checkpoint-<step>/ holds the model in Hugging Face format (loadable
// by Transformers as is) plus optimizer.safetensors (AdamW moments and fp32 master weights) and
// trainer_state.json (step, loader position, counters, the recipe fields a resume must agree with).
// A checkpoint is assembled in a temporary directory, fsynced and renamed into place; only then does
// <run_dir>/latest (one line: the directory name) move to it, so `latest` never names a partial save.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "models/causal_lm.h"
#include "train/adamw.h"
#include "train/shared_save.h"

namespace mt {

struct TrainerState {
  int64_t step = 0;             // optimizer steps completed (skipped non-finite steps included)
  int64_t optimizer_steps = 0;  // AdamW's t (skipped steps excluded)
  LoaderPosition loader;        // where the next micro-batch comes from
  int64_t nonfinite_streak = 0;
  int64_t tokens_seen = 0;      // input tokens of all micro-batches so far
  nlohmann::json identity;      // recipe fields that must be unchanged to resume (see trainer.cpp)
};

// Saves checkpoint-<step>, moves `latest` to it, then removes the oldest checkpoint-* directories
// beyond keep_last (never the one `latest` names). Returns the checkpoint directory. A failed save (a full
// disk, the file-size limit, an I/O error) leaves no temp directory and `latest` and the earlier checkpoints
// as they were; its mt::Error names the file, what it needed, and the checkpoint `latest` still names.
// optimizer_state: host tensors named "<param>.exp_avg" etc. (TrainEngine::optimizer_state_host).
std::string train_checkpoint_save(const std::string& run_dir, const CausalLM& model,
                                  const std::vector<std::pair<std::string, Tensor>>& optimizer_state,
                                  const TrainerState& state, int64_t keep_last);
std::string train_checkpoint_save(const std::string& run_dir, const CausalLM& model, AdamW& optimizer,
                                  const TrainerState& state, int64_t keep_last);

// A LoRA run's checkpoint: `write_model(dir)` writes the adapter's files (models/lora_checkpoint.h) where the
// model's would go; `model_bytes` is about their size. The rest (optimizer.safetensors, trainer_state.json,
// `latest`, pruning, errors) as above.
std::string train_checkpoint_save(const std::string& run_dir, const std::function<void(const std::string&)>& write_model,
                                  uint64_t model_bytes, const std::vector<std::pair<std::string, Tensor>>& optimizer_state,
                                  const TrainerState& state, int64_t keep_last);

// The same checkpoint saved by every rank of a job (train/shared_save.h): every rank calls it with its
// host model and optimizer state (full shapes; the rows `share` gives this rank hold data), no rank
// gathers the model. The lead moves `latest` and prunes after the commit.
std::string train_checkpoint_save_shared(const SaveShare& share, const std::string& run_dir, const CausalLM& model,
                                         const std::vector<std::pair<std::string, Tensor>>& optimizer_state,
                                         const TrainerState& state, int64_t keep_last);

// "checkpoint-000006": the directory name of step 6's checkpoint.
std::string train_checkpoint_name(int64_t step);
// The step of a checkpoint directory name ("checkpoint-<digits>"), or -1 for any other name.
int64_t train_checkpoint_dir_step(const std::string& name);

// About the bytes a checkpoint of `model` with `optimizer_state` takes on disk (the whole model, every expert,
// whatever this rank holds).
uint64_t train_checkpoint_bytes(const CausalLM& model, const std::vector<std::pair<std::string, Tensor>>& optimizer_state);

// The checkpoint directory `latest` names, or "" when the run has none. A `latest` naming a missing
// or incomplete directory (no config.json, or for a LoRA run no adapter_config.json) is an error.
std::string train_checkpoint_latest(const std::string& run_dir);

TrainerState train_state_read(const std::string& checkpoint_dir);
// Copies optimizer.safetensors into `state` (host tensors; every name, shape and dtype checked).
// expert_count >= 0: the stacked expert tensors' targets (the expert stacks of `params`, the model's parameter
// table) hold experts [expert_first, expert_first + expert_count) only (an expert-parallel rank's share), and only
// those rows are read from the file. file_tensors >= 0: the file holds that many tensors, of which `state` is a
// part (a sharded optimizer's share); else state.size().
void optimizer_state_read(const std::string& checkpoint_dir, const std::vector<std::pair<std::string, Tensor*>>& state,
                          const ParamTable* params = nullptr, int64_t expert_first = 0, int64_t expert_count = -1,
                          int64_t file_tensors = -1);
void optimizer_state_read(const std::string& checkpoint_dir, AdamW& optimizer);

}  // namespace mt
