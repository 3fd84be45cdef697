// Saving from every rank of a job without gathering the model on one rank: each rank writes the tensors
// (or the expert rows of stacked tensors) it holds into the shared output files (io/safetensors_shared.h).
// The lead (rank 0) writes everything that is not per expert; the ranks of the first expert-parallel group
// write their experts; other ranks (replica groups, data-parallel ranks) write nothing but take part in
// the agreement. Under ZeRO-1 each owner writes its tensors instead (the expert stacks: the owner among the
// ranks holding the same experts writes their rows). The output directory stays all-or-nothing across the
// job: the lead builds it in a temp directory (AtomicDirWriter) whose path it broadcasts, every rank writes its
// part there, and the lead commits only once every rank has reported success. An error on any rank fails the
// save on every rank.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/tensor.h"
#include "distributed/communicator.h"
#include "models/spec/hf_name_map.h"
#include "train/optimizer_shards.h"

namespace mt {

struct SaveShare {
  Communicator* comm = nullptr;  // the job's host communicator
  bool lead = false;
  int64_t expert_first = 0, expert_count = 0;  // the experts whose rows this rank writes
  int64_t held_first = 0, held_count = 0;      // this rank's experts under expert parallelism (else none)
  // A sharded optimizer (train/optimizer_shards.h): each sharded parameter's state — and its weights, which
  // with fp32 masters only the owner holds exactly — is written whole by its owner; an expert stack sharded
  // over its replicas, by its owner among them, its experts' rows (each replica group's owner its own).
  OptimizerShards shards;
  // The model's parameter table: which state tensors are expert stacks.
  std::shared_ptr<const ParamTable> params;
  // What each checkpoint tensor is made of, by its name (from the family's checkpoint map, HfNameMap::saved_sources):
  // its parameter's in-memory name, and the expert it holds or whether its rows are the experts.
  struct Source {
    std::string param;
    int64_t expert = -1;
    bool expert_rows = false;
  };
  std::shared_ptr<const std::unordered_map<std::string, Source>> checkpoint;
  // The rows this rank writes of a checkpoint tensor (a per-expert tensor, a fused stack whose rows are experts, or
  // any other) and of an optimizer-state tensor (stacked experts [E, ...]): all or none, or the expert rows.
  std::pair<int64_t, int64_t> model_rows(const std::string& hf_name, const Tensor& t) const;
  std::pair<int64_t, int64_t> state_rows(const std::string& state_name, const Tensor& t) const;
};

// The share of rank `rank` of a job of `world` ranks with expert-parallel groups of `ep` (1: none; a
// layout the engines reject, ep not dividing world or experts, counts as none) and the engine's shards, for the
// model whose parameter table is `params` (its expert stacks hold params->num_experts experts) and whose checkpoint
// tensors `checkpoint` saves (hf_name_map_of over that table).
SaveShare save_share_for(Communicator* comm, int rank, int world, int64_t ep, std::shared_ptr<const ParamTable> params,
                         const HfNameMap& checkpoint, const OptimizerShards& shards = {});

// lead_prepare(tmp) on the lead (files, layouts), then write_part(tmp) on every rank, then the commit and
// after_commit() on the lead; each phase's outcome agreed by all ranks. Every rank calls it.
void shared_dir_save(const SaveShare& share, const std::string& final_dir,
                     const std::function<void(const std::string& tmp)>& lead_prepare,
                     const std::function<void(const std::string& tmp)>& write_part,
                     const std::function<void()>& after_commit = {});

}  // namespace mt
