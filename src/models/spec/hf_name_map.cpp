#include "models/spec/hf_name_map.h"

#include <algorithm>
#include <filesystem>
#include <exception>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "io/checkpoint_files.h"
#include "io/dequant.h"
#include "models/spec/tensor_rearrange.h"

namespace mt {

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Name patterns: literal text and placeholders {X} (a decimal index, written without leading zeros) or {*}.

struct Pattern {
  struct Seg {
    bool placeholder = false;
    std::string text;  // literal text, or the placeholder's name ("L", "E", "*")
  };
  std::vector<Seg> segs;
};

using Bindings = std::vector<std::pair<std::string, int64_t>>;

Pattern pattern_parse(const std::string& p, bool star_ok, const std::string& what) {
  Pattern r;
  size_t i = 0;
  while (i < p.size()) {
    const size_t open = p.find('{', i);
    if (open == std::string::npos) {
      r.segs.push_back({false, p.substr(i)});
      break;
    }
    if (open > i) r.segs.push_back({false, p.substr(i, open - i)});
    const size_t close = p.find('}', open);
    if (close == std::string::npos || close == open + 1) fail("hf rules: {}: bad placeholder in '{}'", what, p);
    const std::string name = p.substr(open + 1, close - open - 1);
    if (name == "*" && (!star_ok || close + 1 != p.size()))
      fail("hf rules: {}: '{{*}}' is allowed only at the end of a rename or drop pattern ('{}')", what, p);
    r.segs.push_back({true, name});
    i = close + 1;
  }
  return r;
}

// Matches `name` against the whole pattern (or, with rest != nullptr, a prefix of it, the remainder going to *rest).
bool pattern_match(const Pattern& p, std::string_view name, Bindings* b, std::string* rest) {
  size_t at = 0;
  for (const auto& s : p.segs) {
    if (!s.placeholder) {
      if (name.substr(at, s.text.size()) != s.text) return false;
      at += s.text.size();
    } else if (s.text == "*") {
      at = name.size();
    } else {
      size_t end = at;
      while (end < name.size() && end - at < 18 && name[end] >= '0' && name[end] <= '9') ++end;
      if (end == at || (name[at] == '0' && end - at > 1)) return false;  // none, or a leading zero
      if (b) b->emplace_back(s.text, std::stoll(std::string(name.substr(at, end - at))));
      at = end;
    }
  }
  if (rest) {
    *rest = std::string(name.substr(at));
    return true;
  }
  return at == name.size();
}

std::string pattern_fill(const Pattern& p, const Bindings& b, const std::string& what) {
  std::string r;
  for (const auto& s : p.segs) {
    if (!s.placeholder) {
      r += s.text;
      continue;
    }
    auto it = std::find_if(b.begin(), b.end(), [&](const auto& kv) { return kv.first == s.text; });
    if (it == b.end()) fail("hf rules: {}: placeholder {{{}}} is not bound here", what, s.text);
    r += std::to_string(it->second);
  }
  return r;
}

// A name with every numeric dot-separated component written without leading zeros ("experts.007.x" ->
// "experts.7.x"): two checkpoint names equal after this name one expert twice.
std::string canonical_indices(const std::string& n) {
  std::string r;
  size_t i = 0;
  while (i < n.size()) {
    size_t j = n.find('.', i);
    if (j == std::string::npos) j = n.size();
    std::string part = n.substr(i, j - i);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos) {
      const size_t nz = part.find_first_not_of('0');
      part = nz == std::string::npos ? "0" : part.substr(nz);
    }
    r += part;
    if (j < n.size()) r += '.';
    i = j + 1;
  }
  return r;
}

std::string list_some(const std::vector<std::string>& v, size_t from, size_t most) {
  std::string s;
  for (size_t i = from; i < v.size() && i < from + most; ++i) s += (i > from ? ", " : "") + v[i];
  if (v.size() > from + most) s += ", ...";
  return s;
}

bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

struct HfNameMap::Impl {
  // The rule tree of one parameter with names bound and shapes known.
  struct Node {
    HfNode::Kind kind = HfNode::Kind::tensor;
    Shape shape;
    int dim = 0;
    std::vector<Node> parts;
    int leaf = -1;  // tensor: index into leaves
  };
  // One checkpoint tensor a rule reads (plain name `name`, plus its quantised companions where allowed).
  struct Leaf {
    std::string name;  // checkpoint name
    Shape shape;       // as a plain float tensor
    unsigned quant = hf_plain;
    size_t param = 0;
  };
  enum class Role { plain, fp8_scale, mx_blocks, mx_scales };
  struct Rename {
    Pattern hf, param;
  };

  std::vector<Rename> renames;
  std::vector<Pattern> drops;
  std::vector<Node> roots;  // parallel to params
  std::vector<Leaf> leaves;
  std::unordered_map<std::string, std::pair<int, Role>> slots;  // checkpoint name -> leaf
  std::vector<size_t> save_order;                                // param indices
  bool fp8_any_matrix = false;                                   // HfLayout::fp8_any_matrix

  std::string rename_to_hf(const std::string& mem) const {
    for (const auto& r : renames) {
      Bindings b;
      std::string rest;
      if (pattern_match(r.param, mem, &b, &rest)) return pattern_fill(r.hf, b, "rename") + rest;
    }
    return mem;
  }
  std::string rename_to_param(const std::string& hf) const {
    for (const auto& r : renames) {
      Bindings b;
      std::string rest;
      if (pattern_match(r.hf, hf, &b, &rest)) return pattern_fill(r.param, b, "rename") + rest;
    }
    return hf;
  }
  bool dropped(const std::string& hf) const {
    for (const auto& d : drops)
      if (pattern_match(d, hf, nullptr, nullptr)) return true;
    return false;
  }

  Node resolve(const HfNode& src, const Shape& shape, Bindings& b, size_t param, const std::string& what);
  void add_slot(const std::string& name, int leaf, Role role, const std::vector<HfParam>& params);
};

namespace {
std::string param_what(const HfParam& p) { return fmt::format("parameter '{}' {}", p.name, shape_str(p.shape)); }

// Whether rows [r0, r1) of dim 0 pass through `n` unchanged in meaning: an expert stack read or written for some
// experts only.
bool rows_pass_through(const HfNameMap::Impl::Node& n, const std::vector<HfNameMap::Impl::Leaf>& leaves) {
  using K = HfNode::Kind;
  switch (n.kind) {
    case K::stack_experts: return true;
    case K::concat:
    case K::deinterleave:
      if (n.dim == 0) return false;
      break;
    case K::transpose:
      if (n.shape.size() < 3) return false;
      break;
    case K::one_of: break;
    case K::tensor: return !n.shape.empty() && (leaves[n.leaf].quant == hf_plain || n.shape.size() >= 3);
  }
  for (const auto& p : n.parts)
    if (!rows_pass_through(p, leaves)) return false;
  return true;
}
}  // namespace

HfNameMap::Impl::Node HfNameMap::Impl::resolve(const HfNode& src, const Shape& shape, Bindings& b, size_t param,
                                              const std::string& what) {
  using K = HfNode::Kind;
  Node n;
  n.kind = src.kind;
  n.shape = shape;
  n.dim = src.dim;
  const int nd = static_cast<int>(shape.size());
  switch (src.kind) {
    case K::tensor: {
      const std::string mem = pattern_fill(pattern_parse(src.name, false, what), b, what);
      const std::string hf = rename_to_hf(mem);
      if (rename_to_param(hf) != mem)
        fail("hf rules: {}: renames are not invertible for '{}' (saved as '{}', read back as '{}')", what, mem, hf,
             rename_to_param(hf));
      n.leaf = static_cast<int>(leaves.size());
      unsigned quant = src.quant | (fp8_any_matrix && nd >= 2 ? unsigned{hf_fp8_block} : 0u);
      if ((src.quant & hf_mxfp4) && nd < 2)
        fail("hf rules: {}: '{}' {} cannot be MXFP4 (needs [..., 32k, n])", what, hf, shape_str(shape));
      // A model whose sizes are not whole MXFP4 groups (a tiny test model) can only store this tensor plain.
      if ((src.quant & hf_mxfp4) && shape[nd - 2] % 32 != 0) quant &= ~unsigned{hf_mxfp4};
      leaves.push_back(Leaf{hf, shape, quant, param});
      if ((src.quant & hf_fp8_block) && nd < 2)
        fail("hf rules: {}: '{}' {} cannot be FP8 block-quantised (needs 2 dims)", what, hf, shape_str(shape));
      break;
    }
    case K::stack_experts: {
      if (src.parts.size() != 1 || nd < 1) fail("hf rules: {}: stack_experts needs one operand and a dim 0", what);
      if (shape[0] > (1 << 20)) fail("hf rules: {}: {} experts is more than a stack supports", what, shape[0]);
      const Shape per(shape.begin() + 1, shape.end());
      for (int64_t e = 0; e < shape[0]; ++e) {
        b.emplace_back("E", e);
        n.parts.push_back(resolve(src.parts[0], per, b, param, what));
        b.pop_back();
      }
      break;
    }
    case K::concat: {
      const int64_t k = static_cast<int64_t>(src.parts.size());
      if (k < 1 || src.dim < 0 || src.dim >= nd || shape[src.dim] % k != 0)
        fail("hf rules: {}: cannot split dim {} into {} equal parts", what, src.dim, k);
      Shape part = shape;
      part[src.dim] /= k;
      for (const auto& p : src.parts) n.parts.push_back(resolve(p, part, b, param, what));
      break;
    }
    case K::transpose: {
      if (src.parts.size() != 1 || nd < 2) fail("hf rules: {}: transpose needs one operand of 2+ dims", what);
      Shape t = shape;
      std::swap(t[nd - 1], t[nd - 2]);
      n.parts.push_back(resolve(src.parts[0], t, b, param, what));
      break;
    }
    case K::deinterleave:
      if (src.parts.size() != 1 || src.dim < 0 || src.dim >= nd || shape[src.dim] % 2 != 0)
        fail("hf rules: {}: cannot deinterleave dim {} (needs an even size)", what, src.dim);
      n.parts.push_back(resolve(src.parts[0], shape, b, param, what));
      break;
    case K::one_of:
      if (src.parts.empty()) fail("hf rules: {}: one_of needs alternatives", what);
      for (const auto& p : src.parts) n.parts.push_back(resolve(p, shape, b, param, what));
      break;
  }
  return n;
}

void HfNameMap::Impl::add_slot(const std::string& name, int leaf, Role role, const std::vector<HfParam>& params) {
  auto [it, fresh] = slots.emplace(name, std::make_pair(leaf, role));
  if (!fresh)
    fail("hf rules: checkpoint tensor '{}' is claimed by parameters '{}' and '{}'", name,
         params[leaves[it->second.first].param].name, params[leaves[leaf].param].name);
  if (dropped(name)) fail("hf rules: checkpoint tensor '{}' of parameter '{}' matches a drop rule", name,
                          params[leaves[leaf].param].name);
}

HfNameMap::HfNameMap(const HfLayout& layout, std::vector<HfParam> params)
    : params_(std::move(params)), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  struct ParamRule {
    Pattern pattern;
    const HfNode* source;
  };
  std::vector<ParamRule> param_rules;
  m.fp8_any_matrix = layout.fp8_any_matrix;
  for (const HfRule& r : layout.rules) {
    switch (r.kind) {
      case HfRule::Kind::rename:
        m.renames.push_back({pattern_parse(r.hf, true, "rename"), pattern_parse(r.param, true, "rename")});
        break;
      case HfRule::Kind::drop: m.drops.push_back(pattern_parse(r.hf, true, "drop")); break;
      case HfRule::Kind::param: param_rules.push_back({pattern_parse(r.param, false, r.param), &r.source}); break;
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const HfParam& p = params_[i];
    const std::string what = param_what(p);
    int64_t n = 1;
    for (int64_t d : p.shape)
      if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / 8 / d))
        fail("hf rules: {}: shape is negative or too large", what);
      else
        n *= d;
    if (p.dtype != DType::F32 && p.dtype != DType::BF16)
      fail("hf rules: {}: dtype {} (expected F32 or BF16)", what, dtype_safetensors_name(p.dtype));
    Bindings b;
    const HfNode* source = nullptr;
    for (const auto& r : param_rules)
      if (pattern_match(r.pattern, p.name, &b, nullptr)) {
        source = r.source;
        break;
      } else {
        b.clear();
      }
    const HfNode identity = hf_tensor(p.name);
    m.roots.push_back(m.resolve(source ? *source : identity, p.shape, b, i, what));
    if (p.expert_stack && !rows_pass_through(m.roots.back(), m.leaves))
      fail("hf rules: {}: an expert stack's rule must keep experts on dim 0 (stack, concat/deinterleave on dim >= 1, "
           "transpose of 3+ dims)", what);
  }
  for (size_t l = 0; l < m.leaves.size(); ++l) {
    const int li = static_cast<int>(l);
    const auto& leaf = m.leaves[l];
    m.add_slot(leaf.name, li, Impl::Role::plain, params_);
    if (leaf.quant & hf_fp8_block) m.add_slot(leaf.name + "_scale_inv", li, Impl::Role::fp8_scale, params_);
    if (leaf.quant & hf_mxfp4) {
      m.add_slot(leaf.name + "_blocks", li, Impl::Role::mx_blocks, params_);
      m.add_slot(leaf.name + "_scales", li, Impl::Role::mx_scales, params_);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) m.save_order.push_back(i);
  if (layout.save_order == HfSaveOrder::sorted_by_param)
    std::stable_sort(m.save_order.begin(), m.save_order.end(),
                     [&](size_t a, size_t b) { return params_[a].name < params_[b].name; });
}

HfNameMap::~HfNameMap() = default;
HfNameMap::HfNameMap(HfNameMap&&) noexcept = default;
HfNameMap& HfNameMap::operator=(HfNameMap&&) noexcept = default;

HfCheckpoint hf_checkpoint_of(const CheckpointFiles& files) {
  HfCheckpoint c;
  c.source = files.dir();
  c.names = files.names();
  c.tensor = [&files](const std::string& n) { return files.tensor(n); };
  c.file_of = [&files](const std::string& n) {
    return (std::filesystem::path(files.dir()) / files.shard_of(n)).string();
  };
  return c;
}

// ---------------------------------------------------------------------------------------------------------------
// Load

namespace {

using Node = HfNameMap::Impl::Node;
using K = HfNode::Kind;

int64_t rows_of(const Node& n) { return n.shape.empty() ? 1 : n.shape[0]; }

// The stored tensors behind rows [r0, r1) of node n: all of each when that is all of n; else rows [r0, r1) of each
// (a partial range only reaches 3+-dim leaves of expert stacks, whose stored tensors share dim 0 with the node).
Tensor rows_of_stored(const Tensor& t, const Node& n, int64_t r0, int64_t r1) {
  if (n.shape.empty() || (r0 == 0 && r1 == n.shape[0])) return t;
  return t.rows(r0, r1);
}

Shape with_rows(Shape s, int64_t r0, int64_t r1) {
  if (!s.empty()) s[0] = r1 - r0;
  return s;
}

struct Stored {
  Tensor t;
  std::string name, file;
};

// What the checkpoint holds for one leaf, and in which form.
struct Found {
  Stored plain, scale, blocks, scales;
  enum class Form { missing, plain, fp8, mxfp4 } form = Form::missing;
};

struct Loader {
  const HfNameMap::Impl& m;
  const std::vector<HfParam>& params;
  const HfCheckpoint& ckpt;
  const HfLoadOptions& opt;
  std::vector<Found> found;                      // parallel to m.leaves
  std::unordered_map<const Node*, size_t> choice;  // one_of -> the alternative the checkpoint holds

  std::string file_of(const std::string& name) const {
    return ckpt.file_of ? ckpt.file_of(name) : ckpt.source;
  }

  void collect() {
    found.resize(m.leaves.size());
    const std::unordered_set<std::string> stored(ckpt.names.begin(), ckpt.names.end());
    std::vector<std::string> extra;
    for (const std::string& n : ckpt.names) {
      if (m.dropped(n)) continue;
      auto it = m.slots.find(n);
      if (it == m.slots.end()) {
        const std::string canon = canonical_indices(n);
        if (canon != n && m.slots.count(canon) && stored.count(canon))
          fail("{}: tensor '{}': duplicate expert index ('{}' names the same tensor)", file_of(n), n, canon);
        extra.push_back(n);
        continue;
      }
      Found& f = found[static_cast<size_t>(it->second.first)];
      using R = HfNameMap::Impl::Role;
      Stored& s = it->second.second == R::plain       ? f.plain
                  : it->second.second == R::fp8_scale ? f.scale
                  : it->second.second == R::mx_blocks ? f.blocks
                                                      : f.scales;
      if (s.t.defined())
        fail("{}: tensor '{}' is stored twice (also in {})", file_of(n), n, s.file);
      s = Stored{ckpt.tensor(n), n, file_of(n)};
      if (!s.t.defined()) fail("{}: tensor '{}' is listed but cannot be read", s.file, n);
      if (!s.t.device().is_cpu()) fail("{}: tensor '{}': expected a CPU tensor", s.file, n);
    }
    if (!extra.empty())
      fail("{}: unexpected tensor '{}' (no rule reads it){}{}", file_of(extra[0]), extra[0],
           extra.size() > 1 ? fmt::format("; {} more: ", extra.size() - 1) : "", list_some(extra, 1, 4));
  }

  bool holds_any(const Node& n) const {
    if (n.kind == K::tensor) {
      const Found& f = found[static_cast<size_t>(n.leaf)];
      return f.plain.t.defined() || f.scale.t.defined() || f.blocks.t.defined() || f.scales.t.defined();
    }
    for (const auto& p : n.parts)
      if (holds_any(p)) return true;
    return false;
  }

  const Stored* any_stored(const Node& n) const {
    if (n.kind == K::tensor) {
      const Found& f = found[static_cast<size_t>(n.leaf)];
      for (const Stored* s : {&f.plain, &f.scale, &f.blocks, &f.scales})
        if (s->t.defined()) return s;
      return nullptr;
    }
    for (const auto& p : n.parts)
      if (const Stored* s = any_stored(p)) return s;
    return nullptr;
  }

  // Picks the stored alternative of every one_of and checks every leaf it reads.
  void check(const Node& n, std::vector<bool>& used) {
    if (n.kind == K::one_of) {
      size_t pick = n.parts.size();
      for (size_t i = 0; i < n.parts.size(); ++i) {
        if (!holds_any(n.parts[i])) continue;
        if (pick != n.parts.size()) {
          const Stored* a = any_stored(n.parts[pick]);
          const Stored* b = any_stored(n.parts[i]);
          fail("{}: tensors '{}' and '{}' are two forms of one parameter; a checkpoint holds one", b->file, a->name,
               b->name);
        }
        pick = i;
      }
      if (pick == n.parts.size()) pick = 0;
      choice[&n] = pick;
      check(n.parts[pick], used);
      return;
    }
    if (n.kind != K::tensor) {
      for (const auto& p : n.parts) check(p, used);
      return;
    }
    used[static_cast<size_t>(n.leaf)] = true;
    check_leaf(m.leaves[static_cast<size_t>(n.leaf)], found[static_cast<size_t>(n.leaf)]);
  }

  void check_leaf(const HfNameMap::Impl::Leaf& leaf, Found& f) const {
    const Shape& shape = leaf.shape;
    if (f.blocks.t.defined() || f.scales.t.defined()) {  // MXFP4 (slots exist only where the rule allows it)
      const Stored& any = f.blocks.t.defined() ? f.blocks : f.scales;
      if (!f.blocks.t.defined()) fail("{}: tensor '{}_blocks' is missing (its scales are stored)", any.file, leaf.name);
      if (!f.scales.t.defined()) fail("{}: tensor '{}_scales' is missing (its blocks are stored)", any.file, leaf.name);
      if (f.plain.t.defined())
        fail("{}: tensor '{}' is stored both plain and as MXFP4 blocks", f.plain.file, leaf.name);
      const size_t nd = shape.size();
      Shape scales(shape.begin(), shape.end() - 2);
      scales.push_back(shape[nd - 1]);
      scales.push_back(shape[nd - 2] / 32);
      Shape blocks = scales;
      blocks.push_back(16);
      for (const Stored* s : {&f.blocks, &f.scales}) {
        if (s->t.dtype() != DType::U8)
          fail("{}: tensor '{}': wrong dtype (expected U8, found {})", s->file, s->name,
               dtype_safetensors_name(s->t.dtype()));
        const Shape& want = s == &f.blocks ? blocks : scales;
        if (s->t.shape() != want)
          fail("{}: tensor '{}': wrong shape (expected {} for {} {}, found {})", s->file, s->name, shape_str(want),
               leaf.name, shape_str(shape), shape_str(s->t.shape()));
      }
      f.form = Found::Form::mxfp4;
      return;
    }
    if (!f.plain.t.defined() && f.scale.t.defined())
      fail("{}: tensor '{}' has no weight '{}' (expected shape {})", f.scale.file, f.scale.name, leaf.name,
           shape_str(shape));
    if (!f.plain.t.defined())
      fail("{}: tensor '{}' is missing (expected shape {})", ckpt.source, leaf.name, shape_str(shape));
    const Stored& p = f.plain;
    if (p.t.shape() != shape)
      fail("{}: tensor '{}': wrong shape (expected {}, found {})", p.file, p.name, shape_str(shape),
           shape_str(p.t.shape()));
    if (p.t.dtype() == DType::F8_E4M3 && (leaf.quant & hf_fp8_block)) {
      if (!opt.fp8_declared)
        fail("{}: tensor '{}' is F8_E4M3 but config.json has no quantization_config (quant_method \"fp8\")", p.file,
             p.name);
      if (!f.scale.t.defined())
        fail("{}: tensor '{}_scale_inv' is missing (its weight is F8_E4M3)", p.file, leaf.name);
      const Stored& s = f.scale;
      if (s.t.dtype() != DType::F32)
        fail("{}: tensor '{}': wrong dtype (expected F32, found {})", s.file, s.name,
             dtype_safetensors_name(s.t.dtype()));
      const Shape want = fp8_block_scale_shape(shape, opt.fp8_block_rows, opt.fp8_block_cols);
      if (s.t.shape() != want)
        fail("{}: tensor '{}': wrong shape (expected {} for {}x{} blocks of {}, found {})", s.file, s.name,
             shape_str(want), opt.fp8_block_rows, opt.fp8_block_cols, shape_str(shape), shape_str(s.t.shape()));
      f.form = Found::Form::fp8;
      return;
    }
    if (f.scale.t.defined())
      fail("{}: tensor '{}' is stored but '{}' is {} (not F8_E4M3)", f.scale.file, f.scale.name, p.name,
           dtype_safetensors_name(p.t.dtype()));
    if (!is_float_dtype(p.t.dtype()))
      fail("{}: tensor '{}': wrong dtype (expected F32, BF16 or F16{}, found {})", p.file, p.name,
           (leaf.quant & hf_fp8_block) ? ", or F8_E4M3 with scales" : "", dtype_safetensors_name(p.t.dtype()));
    f.form = Found::Form::plain;
  }

  // Fills `dst` (node n's rows [r0, r1)) from the checkpoint.
  void fill(const Node& n, const Box& dst, int64_t r0, int64_t r1) const {
    switch (n.kind) {
      case K::stack_experts:
        for (int64_t e = r0; e < r1; ++e) {
          const Node& part = n.parts[static_cast<size_t>(e)];
          fill(part, dst.index(e - r0), 0, rows_of(part));
        }
        return;
      case K::concat: {
        const int64_t len = n.parts[0].shape[static_cast<size_t>(n.dim)];
        for (size_t i = 0; i < n.parts.size(); ++i)
          if (n.dim == 0)
            fill(n.parts[i], dst.slice(0, static_cast<int64_t>(i) * len, len), 0, len);
          else
            fill(n.parts[i], dst.slice(n.dim, static_cast<int64_t>(i) * len, len), r0, r1);
        return;
      }
      case K::one_of: fill(n.parts[choice.at(&n)], dst, r0, r1); return;
      case K::transpose:
      case K::deinterleave: transform(n, dst, r0, r1); return;
      case K::tensor: leaf(n, dst, r0, r1); return;
    }
  }

  // A transform computes its operand into a temporary, then rearranges it into dst. Both act on each row of dim 0
  // alone when dim 0 is untouched (transpose of 3+ dims, deinterleave of dim >= 1), so they go one row at a time
  // and the temporary holds one expert, not the whole stack.
  void transform(const Node& n, const Box& dst, int64_t r0, int64_t r1) const {
    const Node& part = n.parts[0];
    const bool per_row = n.kind == K::transpose ? n.shape.size() >= 3 : n.dim >= 1;
    const DType dt = dst.base.dtype();
    if (n.kind == K::transpose && part.kind == K::tensor &&
        found[static_cast<size_t>(part.leaf)].form == Found::Form::mxfp4) {
      // MXFP4 blocks are stored in this node's orientation (HF transposes after dequantising): no transpose.
      const Found& f = found[static_cast<size_t>(part.leaf)];
      Tensor out = dst.contiguous() ? dst.view() : Tensor::empty(dst.shape(), dt);
      dequant_mxfp4_into(rows_of_stored(f.blocks.t, n, r0, r1), rows_of_stored(f.scales.t, n, r0, r1), out,
                         f.blocks.file + ": " + f.blocks.name);
      if (!dst.contiguous()) dst.write(out);
      return;
    }
    const int64_t step = per_row ? 1 : r1 - r0;
    for (int64_t a = r0; a < r1; a += step) {
      const int64_t b = a + step;
      Tensor in = Tensor::empty(per_row ? with_rows(part.shape, a, b) : part.shape, dt);
      fill(part, Box::whole(in), per_row ? a : r0, per_row ? b : r1);
      const Box to = per_row ? dst.slice(0, a - r0, 1) : dst;
      Tensor out = to.contiguous() ? to.view() : Tensor::empty(to.shape(), dt);
      if (n.kind == K::transpose)
        transpose_last2_into(in, out);
      else
        deinterleave_into(in, n.dim, out);
      if (!to.contiguous()) to.write(out);
    }
  }

  void leaf(const Node& n, const Box& dst, int64_t r0, int64_t r1) const {
    const Found& f = found[static_cast<size_t>(n.leaf)];
    const DType dt = dst.base.dtype();
    Tensor out = dst.contiguous() ? dst.view() : Tensor::empty(dst.shape(), dt);
    switch (f.form) {
      case Found::Form::plain: out.copy_from(rows_of_stored(f.plain.t, n, r0, r1)); break;
      case Found::Form::fp8:
        dequant_fp8_block_into(rows_of_stored(f.plain.t, n, r0, r1), rows_of_stored(f.scale.t, n, r0, r1),
                               opt.fp8_block_rows, opt.fp8_block_cols, out, f.plain.file + ": " + f.plain.name);
        break;
      case Found::Form::mxfp4: {  // dequantised in the blocks' orientation, then transposed to the leaf's
        Shape blk = with_rows(f.scales.t.shape(), r0, r1);
        blk.back() *= 32;
        Tensor tmp = Tensor::empty(blk, dt);
        dequant_mxfp4_into(rows_of_stored(f.blocks.t, n, r0, r1), rows_of_stored(f.scales.t, n, r0, r1), tmp,
                           f.blocks.file + ": " + f.blocks.name);
        transpose_last2_into(tmp, out);
        break;
      }
      case Found::Form::missing: MT_CHECK(false, "leaf {} not checked", m.leaves[static_cast<size_t>(n.leaf)].name);
    }
    if (!dst.contiguous()) dst.write(out);
  }
};

}  // namespace

std::vector<Tensor> HfNameMap::load(const HfCheckpoint& ckpt, const HfLoadOptions& options) const {
  const Impl& m = *impl_;
  Loader L{m, params_, ckpt, options, {}, {}};
  L.collect();
  std::vector<bool> used(m.leaves.size(), false);
  for (const Node& root : m.roots) L.check(root, used);
  for (size_t l = 0; l < m.leaves.size(); ++l)  // a stored form that the chosen alternative does not read
    if (!used[l])
      if (const Stored* s = L.any_stored(Node{K::tensor, {}, 0, {}, static_cast<int>(l)}))
        fail("{}: unexpected tensor '{}' (another form of its parameter is stored)", s->file, s->name);

  // Allocate (checking the expert range) first, then fill the parameters in parallel; the fill does not fail on
  // checked input, but an exception must not leave an OpenMP region, so the first one is carried out of it.
  struct Job {
    Box dst;
    int64_t r0, r1;
  };
  std::vector<Tensor> out;
  std::vector<std::optional<Job>> jobs;
  out.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const HfParam& p = params_[i];
    int64_t r0 = 0, r1 = rows_of(m.roots[i]);
    bool compact = false;
    if (p.expert_stack && options.expert_count >= 0) {
      if (options.expert_first < 0 || options.expert_first + options.expert_count > r1)
        fail("{}: experts [{}, {}) of parameter '{}' with {}", ckpt.source, options.expert_first,
             options.expert_first + options.expert_count, p.name, r1);
      r0 = options.expert_first;
      r1 = r0 + options.expert_count;
      compact = options.compact_experts;
    }
    const Shape shape = compact ? with_rows(p.shape, r0, r1) : p.shape;
    if (options.skip && options.skip(p.name)) {
      out.push_back(Tensor::absent(shape, p.dtype));
      jobs.emplace_back();
      continue;
    }
    out.push_back(Tensor::empty(shape, p.dtype));
    const Box whole = Box::whole(out.back());
    const bool all_rows = compact || (r0 == 0 && r1 == rows_of(m.roots[i]));
    jobs.push_back(Job{all_rows ? whole : whole.slice(0, r0, r1 - r0), r0, r1});
  }
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!jobs[i]) continue;
    try {
      L.fill(m.roots[i], jobs[i]->dst, jobs[i]->r0, jobs[i]->r1);
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Save

namespace {

struct Saver {
  const HfNameMap::Impl& m;
  std::vector<std::pair<std::string, Tensor>>& out;

  void absent(const Node& n, DType dt) {
    if (n.kind == K::tensor) {
      out.emplace_back(m.leaves[static_cast<size_t>(n.leaf)].name, Tensor::absent(n.shape, dt));
      return;
    }
    if (n.kind == K::one_of) return absent(n.parts[0], dt);
    for (const auto& p : n.parts) absent(p, dt);
  }

  // Emits the checkpoint tensors of node n, whose rows [r0, r1) are `src`.
  void emit(const Node& n, const Box& src, int64_t r0, int64_t r1) {
    const DType dt = src.base.dtype();
    switch (n.kind) {
      case K::stack_experts:
        for (int64_t e = 0; e < rows_of(n); ++e) {
          const Node& part = n.parts[static_cast<size_t>(e)];
          if (e >= r0 && e < r1)
            emit(part, src.index(e - r0), 0, rows_of(part));
          else
            absent(part, dt);
        }
        return;
      case K::concat: {
        const int64_t len = n.parts[0].shape[static_cast<size_t>(n.dim)];
        for (size_t i = 0; i < n.parts.size(); ++i)
          if (n.dim == 0)
            emit(n.parts[i], src.slice(0, static_cast<int64_t>(i) * len, len), 0, len);
          else
            emit(n.parts[i], src.slice(n.dim, static_cast<int64_t>(i) * len, len), r0, r1);
        return;
      }
      case K::one_of: emit(n.parts[0], src, r0, r1); return;
      case K::transpose:
      case K::deinterleave: {
        const Node& part = n.parts[0];
        const Shape shape = with_rows(part.shape, r0, r1);
        if (!src.base.present()) {
          emit(part, Box::whole(Tensor::absent(shape, dt)), r0, r1);
          return;
        }
        const Tensor in = src.read();
        Tensor t = Tensor::empty(shape, dt);
        if (n.kind == K::transpose)
          transpose_last2_into(in, t);
        else
          interleave_into(in, n.dim, t);
        emit(part, Box::whole(t), r0, r1);
        return;
      }
      case K::tensor: {
        const std::string& name = m.leaves[static_cast<size_t>(n.leaf)].name;
        const bool whole = n.shape.empty() || (r0 == 0 && r1 == n.shape[0]);
        if (whole || !src.base.present()) {
          out.emplace_back(name, whole ? src.read() : Tensor::absent(n.shape, dt));
          return;
        }
        // Rows [r0, r1) of a tensor whose dim 0 is every expert (a fused stack: GPT-OSS's gate_up_proj, its bias,
        // down_proj) from a compact stack: the full shape with only those rows written, at their place, so a
        // shared save writes them (SaveShare::model_rows gives this rank just these rows). The other rows are
        // never touched, so they cost no memory (a large allocation's pages are mapped on first write), and never
        // read. See save() in the header.
        Tensor full = Tensor::empty(n.shape, dt);
        full.rows(r0, r1).copy_from(src.read());
        out.emplace_back(name, std::move(full));
        return;
      }
    }
  }
};

}  // namespace

std::vector<std::pair<std::string, Tensor>> HfNameMap::save(const std::vector<Tensor>& values,
                                                            int64_t expert_first) const {
  const Impl& m = *impl_;
  MT_CHECK(values.size() == params_.size(), "{} values for {} parameters", values.size(), params_.size());
  std::vector<std::pair<std::string, Tensor>> out;
  Saver S{m, out};
  for (size_t i : m.save_order) {
    const HfParam& p = params_[i];
    const Tensor& v = values[i];
    MT_CHECK(v.defined() && v.dtype() == p.dtype, "parameter '{}' is {}, expected {}", p.name,
             v.defined() ? v.desc() : "undefined", dtype_safetensors_name(p.dtype));
    int64_t r0 = 0, r1 = rows_of(m.roots[i]);
    if (v.shape() != p.shape) {  // an expert stack holding some experts only
      MT_CHECK(p.expert_stack && with_rows(p.shape, 0, v.dim(0)) == v.shape() && expert_first >= 0 &&
                   expert_first + v.dim(0) <= r1,
               "parameter '{}' is {}, expected {} (experts from {})", p.name, v.desc(), shape_str(p.shape),
               expert_first);
      r0 = expert_first;
      r1 = r0 + v.dim(0);
    }
    S.emit(m.roots[i], Box::whole(v), r0, r1);
  }
  return out;
}

namespace {
// Numbers the leaves save() writes under n, in save() order; `unit` >= 0: inside an expert stack, whose leaves
// share it.
void storage_units(const Node& n, int64_t unit, int64_t& next, std::vector<int64_t>& out) {
  switch (n.kind) {
    case K::tensor: out.push_back(unit >= 0 ? unit : next++); return;
    case K::one_of: storage_units(n.parts[0], unit, next, out); return;
    case K::stack_experts:
      if (unit < 0) unit = next++;
      break;
    default: break;
  }
  for (const auto& p : n.parts) storage_units(p, unit, next, out);
}
}  // namespace

std::vector<int64_t> HfNameMap::saved_storage_units() const {
  std::vector<int64_t> r;
  int64_t next = 0;
  for (size_t i : impl_->save_order) storage_units(impl_->roots[i], -1, next, r);
  return r;
}

namespace {
// The sources of the leaves save() writes under n, in save() order (Saver::emit's walk). `rows`: n's dim 0 indexes
// the experts of the parameter's stack.
void saved_sources_of(const HfNameMap::Impl& m, const Node& n, size_t param, int64_t expert, bool rows,
                      std::vector<HfSavedSource>& out) {
  switch (n.kind) {
    case K::tensor: out.push_back({m.leaves[static_cast<size_t>(n.leaf)].name, param, expert, rows}); return;
    case K::one_of: saved_sources_of(m, n.parts[0], param, expert, rows, out); return;
    case K::stack_experts:
      for (size_t e = 0; e < n.parts.size(); ++e)
        saved_sources_of(m, n.parts[e], param, static_cast<int64_t>(e), false, out);
      return;
    case K::concat:
    case K::deinterleave: rows = rows && n.dim != 0; break;  // along dim 0 the parts split the experts
    case K::transpose: rows = rows && n.shape.size() >= 3; break;  // a 2-d transpose moves dim 0
  }
  for (const auto& p : n.parts) saved_sources_of(m, p, param, expert, rows, out);
}
}  // namespace

std::vector<HfSavedSource> HfNameMap::saved_sources() const {
  std::vector<HfSavedSource> r;
  for (size_t i : impl_->save_order) saved_sources_of(*impl_, impl_->roots[i], i, -1, params_[i].expert_stack, r);
  return r;
}

std::vector<std::pair<std::string, Shape>> HfNameMap::saved_names() const {
  std::vector<Tensor> values;
  for (const HfParam& p : params_) values.push_back(Tensor::absent(p.shape, p.dtype));
  std::vector<std::pair<std::string, Shape>> r;
  for (const auto& [n, t] : save(values)) r.emplace_back(n, t.shape());
  return r;
}

}  // namespace mt
