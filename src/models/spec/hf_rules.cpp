#include "models/spec/hf_rules.h"

#include <utility>

namespace mt {

HfNode hf_tensor(std::string name_pattern, unsigned quant) {
  HfNode n;
  n.kind = HfNode::Kind::tensor;
  n.name = std::move(name_pattern);
  n.quant = quant;
  return n;
}

namespace {
HfNode node_of(HfNode::Kind kind, int dim, std::vector<HfNode> parts) {
  HfNode n;
  n.kind = kind;
  n.dim = dim;
  n.parts = std::move(parts);
  return n;
}
}  // namespace

HfNode hf_stack_experts(HfNode per_expert) { return node_of(HfNode::Kind::stack_experts, 0, {std::move(per_expert)}); }
HfNode hf_concat(int dim, std::vector<HfNode> parts) { return node_of(HfNode::Kind::concat, dim, std::move(parts)); }
HfNode hf_transpose(HfNode part) { return node_of(HfNode::Kind::transpose, 0, {std::move(part)}); }
HfNode hf_deinterleave(int dim, HfNode part) { return node_of(HfNode::Kind::deinterleave, dim, {std::move(part)}); }
HfNode hf_one_of(std::vector<HfNode> alternatives) {
  return node_of(HfNode::Kind::one_of, 0, std::move(alternatives));
}

HfRule hf_rename(std::string hf_prefix, std::string param_prefix) {
  return HfRule{HfRule::Kind::rename, std::move(hf_prefix), std::move(param_prefix), {}};
}
HfRule hf_drop(std::string hf_pattern) { return HfRule{HfRule::Kind::drop, std::move(hf_pattern), {}, {}}; }
HfRule hf_param(std::string param_pattern, HfNode source) {
  return HfRule{HfRule::Kind::param, {}, std::move(param_pattern), std::move(source)};
}

HfRule hf_quantised(const std::string& param_pattern, unsigned quant) {
  return hf_param(param_pattern, hf_tensor(param_pattern, quant));
}

namespace {
bool node_accepts(const HfNode& n, HfQuant q) {
  if (n.kind == HfNode::Kind::tensor) return (n.quant & q) != 0;
  for (const HfNode& p : n.parts)
    if (node_accepts(p, q)) return true;
  return false;
}
}  // namespace

bool hf_layout_accepts(const HfLayout& l, HfQuant q) {
  if (q == hf_fp8_block && l.fp8_any_matrix) return true;
  for (const HfRule& r : l.rules)
    if (r.kind == HfRule::Kind::param && node_accepts(r.source, q)) return true;
  return false;
}

}  // namespace mt
