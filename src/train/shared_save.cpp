#include "train/shared_save.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "io/atomic_dir.h"

namespace mt {

namespace {

std::pair<int64_t, int64_t> all_rows(const Tensor& t) { return {0, t.ndim() == 0 ? 1 : t.dim(0)}; }

// The rows of `t` that hold experts [first, first + count) (t's rows are all the experts).
std::pair<int64_t, int64_t> expert_rows_of(const Tensor& t, int64_t first, int64_t count) {
  const int64_t rows = all_rows(t).second;
  const int64_t r0 = std::min(first, rows), r1 = std::min(first + count, rows);
  return r1 > r0 ? std::pair<int64_t, int64_t>{r0, r1} : std::pair<int64_t, int64_t>{0, 0};
}

// Every rank learns whether any rank failed; this rank's own error wins its message.
void agree(const SaveShare& share, const std::string& why, const std::string& phase, const std::string& dir) {
  double failed = why.empty() ? 0.0 : 1.0;
  share.comm->all_reduce_sum(&failed, 1, "all_reduce(" + phase + " of " + dir + " succeeded)");
  if (!why.empty()) fail("{}", why);
  if (failed > 0)
    fail("rank {}: saving {}: {} failed on {} other rank{} (see their errors); nothing was committed",
         share.comm->rank(), dir, phase, static_cast<int>(failed), failed > 1 ? "s" : "");
}

}  // namespace

std::pair<int64_t, int64_t> SaveShare::model_rows(const std::string& hf_name, const Tensor& t) const {
  MT_CHECK(checkpoint != nullptr && params != nullptr, "a save share without the model's checkpoint map");
  const auto it = checkpoint->find(hf_name);
  if (it == checkpoint->end()) fail("shared save: '{}' is not a tensor of this model's checkpoint", hf_name);
  const Source& src = it->second;
  // The tensors of experts [first, first + count): one of those experts whole, or their rows of a fused stack (the
  // checkpoint map keeps every expert stack's experts on dim 0).
  auto of_experts = [&](int64_t first, int64_t count) -> std::pair<int64_t, int64_t> {
    if (src.expert < 0) return expert_rows_of(t, first, count);
    return src.expert >= first && src.expert < first + count ? all_rows(t) : std::pair<int64_t, int64_t>{0, 0};
  };
  if (const int owner = shards.owner(src.param); owner >= 0) {
    if (owner != shards.rank()) return {0, 0};
    return shards.over_replicas(src.param) ? of_experts(held_first, held_count) : all_rows(t);
  }
  if (!params->is_expert_stack(src.param)) return lead ? all_rows(t) : std::pair<int64_t, int64_t>{0, 0};
  MT_CHECK(src.expert >= 0 || src.expert_rows, "shared save: '{}' of expert stack '{}' holds neither one expert nor "
           "expert rows", hf_name, src.param);
  return of_experts(expert_first, expert_count);
}

std::pair<int64_t, int64_t> SaveShare::state_rows(const std::string& state_name, const Tensor& t) const {
  auto rows_of = [&](int64_t first, int64_t count) { return expert_rows_of(t, first, count); };
  const std::string param = optimizer_state_param(state_name);
  if (const int owner = shards.owner(param); owner >= 0) {
    if (owner != shards.rank()) return {0, 0};
    return shards.over_replicas(param) ? rows_of(held_first, held_count) : all_rows(t);
  }
  MT_CHECK(params != nullptr, "a save share without the model's parameter table");
  if (!params->is_expert_stack(param)) return lead ? all_rows(t) : std::pair<int64_t, int64_t>{0, 0};
  return rows_of(expert_first, expert_count);
}

SaveShare save_share_for(Communicator* comm, int rank, int world, int64_t ep, std::shared_ptr<const ParamTable> params,
                         const HfNameMap& checkpoint, const OptimizerShards& shards) {
  MT_CHECK(params != nullptr, "save_share_for: no parameter table");
  SaveShare s;
  auto sources = std::make_shared<std::unordered_map<std::string, SaveShare::Source>>();
  for (const HfSavedSource& src : checkpoint.saved_sources())
    (*sources)[src.name] = {checkpoint.params().at(src.param).name, src.expert, src.expert_rows};
  s.checkpoint = std::move(sources);
  s.comm = comm;
  s.lead = rank == 0;
  s.shards = shards;
  const int64_t num_experts = params->num_experts;
  s.params = std::move(params);
  const bool split = ep > 1 && world % ep == 0 && num_experts % ep == 0;
  if (!split) {
    s.expert_count = s.lead ? num_experts : 0;
  } else {
    s.held_count = num_experts / ep;
    s.held_first = rank % ep * s.held_count;
    if (rank < ep) {  // the first expert-parallel group; the other groups hold replicas
      s.expert_count = s.held_count;
      s.expert_first = s.held_first;
    }
  }
  return s;
}

void shared_dir_save(const SaveShare& share, const std::string& final_dir,
                     const std::function<void(const std::string& tmp)>& lead_prepare,
                     const std::function<void(const std::string& tmp)>& write_part,
                     const std::function<void()>& after_commit) {
  MT_CHECK(share.comm != nullptr, "shared save of {} without a communicator", final_dir);
  std::unique_ptr<AtomicDirWriter> out;
  std::string why;
  char tmp[4096] = {};
  if (share.lead) {
    try {
      out = std::make_unique<AtomicDirWriter>(final_dir);
      if (out->path().size() >= sizeof tmp) fail("{}: path longer than {} bytes", out->path(), sizeof tmp - 1);
      lead_prepare(out->path());
      std::memcpy(tmp, out->path().data(), out->path().size());
    } catch (const Error& e) {
      why = e.what();
    }
  }
  share.comm->broadcast(tmp, sizeof tmp, 0, "broadcast(temp directory of " + final_dir + ")");
  if (tmp[0] == '\0') {
    if (!why.empty()) fail("{}", why);
    fail("rank {}: saving {}: rank 0 could not lay out the output (see its error); nothing was committed",
         share.comm->rank(), final_dir);
  }
  try {
    write_part(tmp);
  } catch (const Error& e) {
    why = e.what();
  }
  agree(share, why, "writing every rank's part", final_dir);
  if (share.lead) {
    try {
      out->commit();
      if (after_commit) after_commit();
    } catch (const Error& e) {
      why = e.what();
    }
  }
  agree(share, why, "the commit", final_dir);
}

}  // namespace mt
