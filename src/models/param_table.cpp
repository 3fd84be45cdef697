#include "models/param_table.h"

#include "core/error.h"

namespace mt {

ParamEntry param_entry(std::string name, Shape shape, ParamUse use, ParamRole role) {
  ParamEntry e;
  e.name = std::move(name);
  e.shape = std::move(shape);
  e.role = role;
  e.use = use;
  const bool norm_or_bias = use == ParamUse::norm || use == ParamUse::bias;
  e.init = use == ParamUse::norm ? ParamInit::ones : use == ParamUse::bias ? ParamInit::zeros : ParamInit::normal;
  e.decay = !norm_or_bias;
  e.trainable = role != ParamRole::buffer;
  return e;
}

void ParamTable::add(ParamEntry e) {
  MT_CHECK(e.role != ParamRole::expert_stack || (!e.shape.empty() && e.shape[0] == num_experts),
           "parameter table: expert stack {} has shape {} for {} experts", e.name, shape_str(e.shape), num_experts);
  const auto [it, fresh] = index_.emplace(e.name, entries_.size());
  MT_CHECK(fresh, "parameter table: {} listed twice", e.name);
  entries_.push_back(std::move(e));
}

const ParamEntry* ParamTable::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

bool ParamTable::is_expert_stack(const std::string& name) const {
  const ParamEntry* e = find(name);
  return e && e->role == ParamRole::expert_stack;
}

DType param_dtype(const ParamEntry& e, DType model_dtype) {
  return e.dtype == ParamDType::f32 ? DType::F32 : model_dtype;
}

Shape param_shape_held(const ParamEntry& e, int64_t experts_held) {
  Shape s = e.shape;
  if (e.role == ParamRole::expert_stack && experts_held >= 0) s[0] = experts_held;
  return s;
}

int64_t param_numel_per_expert(const ParamEntry& e) {
  if (e.role != ParamRole::expert_stack) return shape_numel(e.shape);
  return shape_numel(Shape(e.shape.begin() + 1, e.shape.end()));
}

ParamCounts param_counts(const ParamTable& t) {
  ParamCounts c;
  const int64_t idle = t.num_experts - t.experts_per_token;  // experts a token does not use
  for (const ParamEntry& e : t.entries()) {
    if (e.role == ParamRole::buffer) continue;
    const int64_t n = shape_numel(e.shape);
    c.total += n;
    if (e.role == ParamRole::expert_stack) {
      c.experts += n;
      c.active -= idle * param_numel_per_expert(e);
    }
    if (e.use == ParamUse::embedding || e.use == ParamUse::lm_head) c.embedding += n;
    const bool matmul = e.use == ParamUse::linear || e.use == ParamUse::lm_head ||
                        (e.use == ParamUse::embedding && t.tied_embeddings);
    if (matmul)
      c.matmul_per_token += e.role == ParamRole::expert_stack ? t.experts_per_token * param_numel_per_expert(e) : n;
  }
  c.active += c.total;
  return c;
}

const char* param_role_name(ParamRole r) {
  switch (r) {
    case ParamRole::replicated: return "replicated";
    case ParamRole::expert_stack: return "expert_stack";
    case ParamRole::buffer: return "buffer";
  }
  return "unknown";
}

}  // namespace mt
