#include "train/memory_plan.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/error.h"
#include "models/decoder_costs.h"
#include "models/lora_adapter.h"
#include "models/model_weights.h"
#include "models/registry.h"
#include "train/optimizer_shards.h"

namespace mt {

namespace {

// Byte counts are summed in 128-bit integers: with the limits below (dimensions <= 2^31, layers <=
// 2^16, tokens <= 2^40) the largest term is about 2^120 bytes, so nothing overflows, and a result
// past int64 is clamped (it never fits).
using wide = __int128;

constexpr int64_t kMaxDim = int64_t{1} << 31;
constexpr int64_t kMaxLayers = 65536;
constexpr int64_t kMaxTokens = int64_t{1} << 40;      // micro_batch * seq of a request
constexpr int64_t kMaxSearchSeq = int64_t{1} << 22;   // max_seq search bound (4M tokens per row)
constexpr int64_t kMaxSearchBatch = int64_t{1} << 20; // max_micro_batch search bound
constexpr int64_t kSeqStep = 128;                     // max_seq is a multiple of this

// Rows of one chunk of the fused LM head + cross-entropy (CudaModelOptions::loss_chunk_rows).
constexpr int64_t kLossChunkRows = 4096;
// cuBLASLt workspace of the device context (one per device, as llm.c does).
constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;
// The caching allocator rounds every block up and cannot always reuse a freed block for a larger
// request: headroom on top of the exact tensor sizes.
constexpr int64_t kAllocatorSlackBytes = int64_t{256} << 20;

constexpr wide kBf16 = kCostBf16, kF32 = kCostF32, kI32 = kCostI32, kI64 = kCostI64;

// Model-level dimensions of one request, as wide integers so products cannot overflow (each sublayer's own
// come from its spec, through models/decoder_costs.h).
struct Dims {
  wide T, H, E, V;
};

Dims dims_of(const DecoderSpec& c, int64_t tokens) {
  return {tokens, c.hidden_size, c.num_experts(), c.vocab_size};
}

// ---- parameters (element counts), summed from the model's parameter table ----

// The table summed the ways the plan needs it: whole-model counts, ZeRO-3's fetch groups (models/
// param_residency.h: the embedding, each decoder layer, the head) and every tensor for ZeRO-1's assignment.
struct ParamSums {
  wide total = 0, experts = 0;  // every parameter; the expert stacks' (all experts)
  wide embed = 0;               // the embedding's group
  wide head = 0;                // the head's group: the tensors after the layers, and a tied embedding it reads
  std::vector<wide> layer_replicated, layer_experts;  // per decoder layer
  std::vector<wide> replicated;                       // each replicated tensor
  std::vector<wide> stacks, stack_per_expert;         // each expert stack: whole, and one expert of it
};

ParamSums param_sums(const DecoderSpec& c) {
  const ParamTable t = param_table_of(c);
  ParamSums s;
  s.layer_replicated.assign(static_cast<size_t>(c.num_layers()), 0);
  s.layer_experts.assign(static_cast<size_t>(c.num_layers()), 0);
  for (const ParamEntry& e : t.entries()) {
    // NOTE: buffers (DeepSeek-V3's fp32 e_score_correction_bias, E floats per MoE layer) have no gradient or
    // optimizer state; their few bytes are left to the allocator slack.
    if (e.role == ParamRole::buffer) continue;
    // Every term below assumes trained tensors of the model dtype (bf16 on the GPU).
    MT_CHECK(e.dtype == ParamDType::model,
             "memory plan: {} ({}) is not planned: fixed-dtype parameters are not counted yet", e.name,
             param_role_name(e.role));
    wide n = 1;  // wide: a dimension may be 2^31
    for (int64_t dim : e.shape) n *= dim;
    s.total += n;
    if (e.layer < 0) (e.use == ParamUse::embedding ? s.embed : s.head) += n;
    if (e.role == ParamRole::expert_stack) {
      MT_CHECK(e.layer >= 0, "memory plan: expert stack {} outside a layer", e.name);
      s.experts += n;
      s.layer_experts[static_cast<size_t>(e.layer)] += n;
      s.stacks.push_back(n);
      s.stack_per_expert.push_back(n / e.shape[0]);
    } else {
      if (e.layer >= 0) s.layer_replicated[static_cast<size_t>(e.layer)] += n;
      s.replicated.push_back(n);
    }
  }
  if (t.tied_embeddings) s.head += s.embed;
  return s;
}

// ---- activations saved by forward for backward: per layer, the sum of its blocks' (models/decoder_costs.h) ----

// After the last layer: final residual x, final-norm output, targets and input ids (i64), the RoPE cos and
// sin tables (one per attention configuration), document start/end per token (i32) for packed attention.
wide model_saved_bytes(const DecoderSpec& c, const Dims& d) {
  return 2 * d.T * d.H * kBf16 + d.T * kI64 + d.T * kI64 + decoder_rope_table_bytes(c, static_cast<int64_t>(d.T)) +
         2 * d.T * kI32;
}

// ---- transients: alive on top of the saved activations at one moment ----

// Fused LM head + cross-entropy (kernels/cuda/linear_cross_entropy.cu): one bf16 logits chunk of
// min(4096, T) rows (the gradient is written over it in place), the per-row loss (f32) and dx; the head runs
// on the rows that have a target, gathered with their gradient beside the full-width dx (at most T - 1 rows
// each: every row's last token has none).
wide head_loss_bytes(const Dims& d) {
  wide rows = std::min<wide>(kLossChunkRows, d.T);
  return rows * d.V * kBf16 + d.T * kF32 + d.T * d.H * kBf16 + 2 * d.T * d.H * kBf16;
}

int64_t clamp64(wide v) {
  constexpr wide hi = std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(v > hi ? hi : v);
}

// The ranks holding the same experts over which ZeRO-1 shards the expert stacks' state: optimizer_shards (the
// job's ranks) / expert_parallel when the experts are split and the job holds several copies of them, else 1.
int64_t expert_replicas_of(const MemoryPlanInput& in) {
  const int64_t shards = std::max<int64_t>(in.optimizer_shards, 1), ep = std::max<int64_t>(in.expert_parallel, 1);
  return ep > 1 && shards > ep && shards % ep == 0 ? shards / ep : 1;
}

// The parameters whose optimizer state this rank keeps: the experts it holds under expert parallelism (all of
// them, or with several replicas its share of the whole-stack assignment over them), plus its share of the
// replicated tensors (all of them, or with optimizer_shards > 1 its share of the whole-tensor assignment of
// train/optimizer_shards.h); the largest such rank.
// The assignment depends on the tensors' sizes only, not on their order.
wide optimizer_param_count(const MemoryPlanInput& in, const Dims& d, const ParamSums& ps, wide count,
                           wide expert_held) {
  const int64_t shards = std::max<int64_t>(in.optimizer_shards, 1);
  const bool split = in.expert_parallel > 1;
  // Past 2^55 parameters nothing fits anyway; the per-tensor sums below stay within int64 under it.
  if (shards <= 1 || count > (wide{1} << 55)) return count;
  std::vector<int64_t> sizes;
  for (wide n : ps.replicated) sizes.push_back(static_cast<int64_t>(n));
  if (!split)
    for (wide n : ps.stacks) sizes.push_back(static_cast<int64_t>(n));
  const int64_t replicas = expert_replicas_of(in);
  if (replicas <= 1) return (split ? expert_held : 0) + OptimizerShards::largest_share(sizes, static_cast<int>(shards));
  // Rank r's expert stacks are owned among the replicas {r % ep, r % ep + ep, ...}, r itself being replica
  // r / ep; every replica group uses the same map. The largest rank's replicated share plus its expert share.
  const wide per_rank = d.E / in.expert_parallel;
  std::vector<int64_t> expert_sizes;
  for (wide n : ps.stack_per_expert) expert_sizes.push_back(static_cast<int64_t>(per_rank * n));
  const std::vector<int64_t> world_share = OptimizerShards::shares(sizes, static_cast<int>(shards));
  const std::vector<int64_t> expert_share = OptimizerShards::shares(expert_sizes, static_cast<int>(replicas));
  wide most = 0;
  for (int64_t r = 0; r < shards; ++r)
    most = std::max(most, static_cast<wide>(world_share[static_cast<size_t>(r)]) +
                              expert_share[static_cast<size_t>(r / in.expert_parallel)]);
  return most;
}

// ZeRO-3's fetched parameters at their peak: two neighbouring groups of the reading order (models/
// param_residency.h: the embedding, each decoder layer's replicated tensors, the head), the one being read and
// the prefetched next one; counted whole, an upper bound (a rank's own tensors of them are in its share). The
// embedding is released before the first layer runs, so it and the head are never here together unless there
// are no layers. Tied embeddings: the head's group reads the embedding.
wide fetched_groups_count(const MemoryPlanInput& in, const ParamSums& ps) {
  const bool split = in.expert_parallel > 1;
  if (ps.layer_replicated.empty()) return ps.embed + ps.head;
  // Split experts: the replicated tensors (router included), and with several copies of each expert group this
  // rank's expert stacks too (ZeRO-3 shards them over their replicas, train/sharded_params.h); a single copy
  // keeps them, counted in the rank's share.
  const bool replicas = expert_replicas_of(in) > 1;
  wide layer = 0;  // the largest layer group
  for (size_t l = 0; l < ps.layer_replicated.size(); ++l) {
    const wide experts = ps.layer_experts[l];
    layer = std::max(layer, ps.layer_replicated[l] + (split ? (replicas ? experts / in.expert_parallel : 0) : experts));
  }
  return std::max(ps.head, layer) + layer;
}

// Every component for `tokens` tokens, without the searches.
MemoryPlan plan_bytes(const MemoryPlanInput& in, const ParamSums& ps, int64_t tokens, Recompute r, bool master) {
  const DecoderSpec& c = in.cfg;
  const Dims d = dims_of(c, tokens);
  const wide ep = std::max<int64_t>(in.expert_parallel, 1);
  const wide expert_count = ps.experts;  // the whole model's
  wide count = ps.total;
  count -= expert_count - expert_count / ep;  // the experts this rank holds
  BlockBatch b;
  b.tokens = tokens;
  b.recompute = r;
  b.deterministic = in.deterministic;
  b.expert_parallel = ep;
  b.ep_all_gather = in.ep_all_gather;
  b.ep_row_headroom = in.ep_row_headroom;
  b.pair_expert_wgrad = in.pair_expert_wgrad;
  // Every layer's saved activations; the transient peak is the largest layer backward's, or the LM head's loss.
  wide saved = model_saved_bytes(c, d), transient = head_loss_bytes(d);
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    const LayerBytes lb = decoder_layer_bytes(c, l, b);
    saved += lb.saved;
    transient = std::max(transient, lb.backward_peak);
  }
  wide moment_bytes = in.bf16_moments ? kBf16 : kF32;

  MemoryPlan p;
  if (in.lora) {  // frozen base: parameters only; the adapter and full-trained parameters carry the training state
    const wide adapter = in.lora_params, full = in.lora_full_params;
    saved += wide{tokens} * in.lora_saved_per_token;
    transient += wide{tokens} * in.lora_transient_per_token;
    p.param_count = clamp64(count);
    p.params = clamp64(count * kBf16 + adapter * (kF32 + (in.lora_working_copies ? kBf16 : 0)));
    p.grads = clamp64((adapter + full) * kF32);
    p.optimizer_param_count = clamp64(adapter + full);
    p.optimizer = clamp64((adapter + full) * 2 * moment_bytes + (master ? full * kF32 : 0));
    p.activations_saved = clamp64(saved);
    p.activations_transient = clamp64(transient);
    p.activations = clamp64(saved + transient);
    p.workspace = kCublasWorkspaceBytes + kAllocatorSlackBytes;
    p.total = clamp64(static_cast<wide>(p.params) + p.grads + p.optimizer + saved + transient + p.workspace);
    p.available = in.device_bytes - in.reserve_bytes;
    p.fits = p.total <= p.available;
    return p;
  }
  p.param_count = clamp64(count);
  const wide grad_bytes = count * kF32 - (in.bf16_expert_grads ? expert_count / ep * (kF32 - kBf16) : 0);
  p.grads = clamp64(grad_bytes);
  const wide opt_count = optimizer_param_count(in, d, ps, count, expert_count / ep);
  wide held = count;  // parameters present on this rank at the peak
  if (in.shard_parameters && in.reshard_after_forward && in.optimizer_shards > 1)
    held = std::min(count, opt_count + fetched_groups_count(in, ps));
  p.params = clamp64(held * kBf16);
  p.optimizer_param_count = clamp64(opt_count);
  p.optimizer = clamp64(opt_count * (2 * moment_bytes + (master ? kF32 : 0)));
  p.activations_saved = clamp64(saved);
  p.activations_transient = clamp64(transient);
  p.activations = clamp64(saved + transient);
  p.workspace = kCublasWorkspaceBytes + kAllocatorSlackBytes;
  p.total = clamp64(held * kBf16 + grad_bytes + opt_count * (2 * moment_bytes + (master ? kF32 : 0)) + saved +
                    transient + p.workspace);
  p.available = in.device_bytes - in.reserve_bytes;
  p.fits = p.total <= p.available;
  return p;
}

// Largest x in [1, hi] with fits(x), or 0; fits is monotone (true up to some x, false after).
template <typename Fits>
int64_t search_largest(int64_t hi, Fits fits) {
  if (hi < 1 || !fits(1)) return 0;
  int64_t lo = 1;  // fits(lo) holds
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

void check_range(const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) fail("memory plan: {} must be in [{}, {}] (found {})", field, lo, hi, v);
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30); }

std::string optimizer_desc(const MemoryPlan& p) {
  // Kept within the table's column: "1/N (experts 1/R)" when the experts' state is sharded too.
  return fmt::format("m,v {}, {}{}", p.bf16_moments ? "bf16" : "fp32", p.fp32_master ? "fp32 master" : "no master",
                     p.optimizer_shards <= 1  ? ""
                     : p.expert_replicas > 1 ? fmt::format(", 1/{} (experts 1/{})", p.optimizer_shards, p.expert_replicas)
                                             : fmt::format(", 1/{} shard", p.optimizer_shards));
}

}  // namespace

Recompute recompute_parse(const std::string& name, const std::string& where) {
  if (name == "none") return Recompute::none;
  if (name == "selective") return Recompute::selective;
  if (name == "full") return Recompute::full;
  std::string shown;
  for (size_t i = 0; i < name.size() && i < 60; ++i) shown += (name[i] >= 0x20 && name[i] < 0x7f) ? name[i] : '?';
  fail("{}: unknown recompute mode (expected none, selective or full, found \"{}{}\")", where, shown,
       name.size() > 60 ? "..." : "");
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "unknown";
}

MemoryPlan memory_plan(const MemoryPlanInput& in) {
  const DecoderSpec& c = in.cfg;
  check_range("num_hidden_layers", c.num_layers(), 1, kMaxLayers);
  check_range("hidden_size", c.hidden_size, 1, kMaxDim);
  check_range("vocab_size", c.vocab_size, 1, kMaxDim);
  for (const AttentionSpec& a : c.attention) {  // every configuration the layers may use
    check_range("num_attention_heads", a.heads, 1, kMaxDim);
    check_range("num_key_value_heads", a.kv_heads, 1, kMaxDim);
    check_range("head_dim", a.head_dim, 1, kMaxDim);
    check_range("v_head_dim", a.value_dim(), 1, kMaxDim);
  }
  for (const MoeSpec& m : c.moe) {
    check_range("num_experts", m.num_experts, 0, kMaxDim);
    check_range("num_experts_per_tok", m.experts_per_token, m.num_experts > 0 ? 1 : 0, m.num_experts);
    check_range("moe_intermediate_size", m.expert.intermediate_size, 0, kMaxDim);
    if (m.shared_expert) check_range("shared_expert_intermediate_size", m.shared_expert->intermediate_size, 0, kMaxDim);
  }
  for (const MlpSpec& m : c.mlp) check_range("intermediate_size", m.intermediate_size, 0, kMaxDim);
  check_range("micro_batch", in.micro_batch, 1, kMaxTokens);
  check_range("seq", in.seq, 1, kMaxTokens / in.micro_batch);
  check_range("device_bytes", in.device_bytes, 1, std::numeric_limits<int64_t>::max());
  check_range("reserve_bytes", in.reserve_bytes, 0, in.device_bytes);
  check_range("expert_parallel", in.expert_parallel, 1, std::max<int64_t>(c.num_experts(), 1));
  if (in.lora) {
    check_range("lora_params", in.lora_params, 0, int64_t{1} << 50);
    check_range("lora_full_params", in.lora_full_params, 0, int64_t{1} << 50);
    if (in.expert_parallel > 1 || in.optimizer_shards > 1 || in.shard_parameters)
      fail("memory plan: LoRA with expert parallelism or sharding is not supported");
  }

  const ParamSums ps = param_sums(c);
  MemoryPlan p = plan_bytes(in, ps, in.micro_batch * in.seq, in.recompute, in.fp32_master);
  p.layers = c.num_layers();
  p.expert_parallel = in.expert_parallel;
  for (int64_t l = 0; l < c.num_layers(); ++l) p.moe_layers += c.is_moe_layer(l);
  p.micro_batch = in.micro_batch;
  p.seq = in.seq;
  p.device_bytes = in.device_bytes;
  p.reserve_bytes = in.reserve_bytes;
  p.recompute = in.recompute;
  p.fp32_master = in.fp32_master;
  p.bf16_moments = in.bf16_moments;
  p.lora = in.lora;
  p.lora_params = in.lora_params;
  p.lora_full_params = in.lora_full_params;
  p.optimizer_shards = std::max<int64_t>(in.optimizer_shards, 1);
  p.expert_replicas = expert_replicas_of(in);
  p.params_sharded = in.shard_parameters && in.reshard_after_forward && p.optimizer_shards > 1;
  p.bf16_expert_grads = in.bf16_expert_grads;
  p.full_recompute_fits = plan_bytes(in, ps, in.micro_batch * in.seq, Recompute::full, in.fp32_master).fits;
  p.no_master_fits = plan_bytes(in, ps, in.micro_batch * in.seq, in.recompute, false).fits;

  auto fits_tokens = [&](int64_t tokens) { return plan_bytes(in, ps, tokens, in.recompute, in.fp32_master).fits; };
  // The searches never go below the request's own size, so a request that fits is always within them.
  int64_t batch_hi = std::max(in.micro_batch, std::min(kMaxSearchBatch, kMaxTokens / in.seq));
  p.max_micro_batch = search_largest(batch_hi, [&](int64_t b) { return fits_tokens(b * in.seq); });
  int64_t seq_hi = std::max(in.seq, std::min(kMaxSearchSeq, kMaxTokens / in.micro_batch)) / kSeqStep;
  p.max_seq = kSeqStep * search_largest(seq_hi, [&](int64_t s) { return fits_tokens(in.micro_batch * s * kSeqStep); });
  return p;
}

void memory_plan_set_lora(MemoryPlanInput& in, const LoraTable& t, bool gpu) {
  in.lora = true;
  in.lora_params = lora_parameter_count(t);
  in.lora_full_params = 0;
  const ParamTable base = param_table_of(in.cfg);
  for (const std::string& name : t.full)
    if (const ParamEntry* e = base.find(name)) in.lora_full_params += shape_numel(e->shape);
  in.lora_working_copies = gpu;
  in.lora_saved_per_token = in.lora_transient_per_token = 0;
  if (!gpu) return;
  const int64_t k = std::max<int64_t>(in.cfg.experts_per_token(), 1), r = t.config.r;
  for (const LoraEntry& e : t.entries) {
    if (e.is_b) continue;  // one u per adapted weight
    const bool stack = e.role == ParamRole::expert_stack;
    in.lora_saved_per_token += static_cast<int64_t>((stack ? k : 1) * r * kBf16);
    if (stack)
      in.lora_transient_per_token = std::max(in.lora_transient_per_token,
                                             static_cast<int64_t>(k * (std::max(e.in, e.out) + 2 * r) * kBf16));
  }
}

bool pairing_wanted(MemoryPlanInput in, int64_t grad_accum) {
  if (grad_accum < 2) return false;  // nothing to pair with: holding would only raise the peak
  in.pair_expert_wgrad = true;
  return memory_plan(in).fits;
}

std::string MemoryPlan::table() const {
  std::string t = fmt::format(
      "memory plan: {} layers ({} MoE), {:.2f} B parameters{}, micro_batch {} x seq {} = {} tokens, recompute {}\n",
      layers, moe_layers, static_cast<double>(param_count) / 1e9,
      expert_parallel > 1 ? fmt::format(" on this rank (experts split over {} ranks)", expert_parallel) : "",
      micro_batch, seq, micro_batch * seq, recompute_name(recompute));
  auto row = [&](const char* name, const std::string& what, int64_t bytes) {
    t += fmt::format("  {:<12} {:<42} {:>9.2f} GiB\n", name, what, gib(bytes));
  };
  // ZeRO-3: "1/N" of the replicated tensors, and of the expert stacks "1/R" over their replicas when there are several.
  const std::string experts_share = expert_replicas > 1 ? fmt::format(" (experts 1/{})", expert_replicas) : "";
  if (!lora)
    row("parameters",
      params_sharded ? fmt::format("bf16 ZeRO-3: 1/{}{} + 2 {}groups", optimizer_shards, experts_share,
                                   experts_share.empty() ? "fetched " : "")
                     : "bf16",
      params);
  if (lora) {  // the base frozen: its parameters only
    row("parameters", fmt::format("bf16 base (frozen) + fp32 adapter {:.1f} M", static_cast<double>(lora_params) / 1e6),
        params);
    row("gradients", fmt::format("fp32, adapter{}", lora_full_params ? " + router" : ""), grads);
    row("optimizer", fmt::format("m,v {}, adapter{}", bf16_moments ? "bf16" : "fp32",
                                 lora_full_params ? (fp32_master ? " + router (fp32 master)" : " + router") : ""),
        optimizer);
  } else {
    row("gradients", bf16_expert_grads ? "fp32, experts bf16" : "fp32", grads);
    row("optimizer", optimizer_desc(*this), optimizer);
  }
  row("activations",
      fmt::format("saved {:.2f} + peak transient {:.2f}", gib(activations_saved), gib(activations_transient)),
      activations);
  row("workspace", "cuBLASLt + allocator slack", workspace);
  row("total", "", total);
  row("available", fmt::format("device {:.2f} - reserve {:.2f}", gib(device_bytes), gib(reserve_bytes)), available);
  t += fmt::format("  {}: largest micro_batch at seq {}: {}; largest seq at micro_batch {}: {}",
                   fits ? "fits" : "DOES NOT FIT", seq, max_micro_batch, micro_batch, max_seq);
  return t;
}

std::string MemoryPlan::refusal() const {
  if (fits) return "";
  std::string s = fmt::format(
      "does not fit: needs {:.2f} GiB of {:.2f} GiB available (params {:.2f}, grads {:.2f}, optimizer {:.2f} [{}], "
      "activations {:.2f}, workspace {:.2f} GiB at micro_batch {} x seq {}, recompute {})",
      gib(total), gib(available), gib(params), gib(grads), gib(optimizer), optimizer_desc(*this), gib(activations),
      gib(workspace), micro_batch, seq, recompute_name(recompute));
  s += max_micro_batch > 0 ? fmt::format("; largest micro_batch that fits at seq {}: {}", seq, max_micro_batch)
                           : fmt::format("; no micro_batch fits at seq {}", seq);
  s += max_seq > 0 ? fmt::format("; largest seq at micro_batch {}: {}", micro_batch, max_seq)
                   : fmt::format("; no seq fits at micro_batch {}", micro_batch);
  if (recompute != Recompute::full && full_recompute_fits) s += "; or set train.recompute: full";
  if (fp32_master && no_master_fits) s += "; or set optimizer.master_weights: none";
  return s;
}

}  // namespace mt
