#include "train/train_engine.h"

#include <cstring>
#include <functional>

#include <fmt/format.h>

#include "core/error.h"
#include "core/memory.h"
#include "distributed/communicator.h"
#include "layers/expert_parallel.h"
#include "train/adamw.h"
#include "train/expert_load.h"
#include "train/grad_clip.h"
#include "train/sharded_params.h"
#include "train/train_checkpoint.h"

namespace mt {

namespace {

CudaEngineHooks& hooks_storage() {
  static CudaEngineHooks h;
  return h;
}

class CpuEngine final : public TrainEngine {
 public:
  CpuEngine(CausalLM& lm, const Recipe& r, Communicator* comm)
      : lm_(lm), comm_(comm && comm->size() > 1 ? comm : nullptr),
        ep_(experts_sliced(lm, expert_parallel_for(comm_, r.parallel.ep, lm.config.num_experts()))),
        shards_(comm_ && r.parallel.shard_optimizer
                    ? optimizer_shards_for(lm.weights, comm_->size(), comm_->rank(), r.parallel.ep)
                    : OptimizerShards()),
        sharded_params_(sharded_params_of(lm, r, shards_, comm_)),
        loads_(ExpertLoads::zeros(lm.config)),
        bias_rate_(r.moe.bias_update_rate),
        model_(lm.config, lm.weights, model_options(ep_, sharded_params_.get(), loads_)),
        grads_(ModelWeights::zeros_like_config(lm.config, DType::F32, split() ? ep_.experts_per_rank : -1)),
        optimizer_(shards_.updated(lm.weights.named_parameters()), adamw_options_from(r),
                   r.optimizer.decay_norms_and_biases ? std::function<bool(const std::string&)>() : adamw_hf_decays) {
    if (r.optimizer.moment_dtype != "float32")
      fail("optimizer.moment_dtype: '{}' is supported on CUDA only (the CPU optimizer keeps float32 moments)",
           r.optimizer.moment_dtype);
    expert_bias_recipe_check(r, lm.config);
    if (r.optimizer.expert_grad_dtype != "float32")
      fail("optimizer.expert_grad_dtype: '{}' is supported on CUDA only (the CPU keeps float32 gradients)",
           r.optimizer.expert_grad_dtype);
    for (auto& [name, g] : grads_.named_parameters()) {
      grad_list_.push_back(g);
      split_.push_back(split() && grads_.param_table().is_expert_stack(name));
    }
    grad_const_.assign(grad_list_.begin(), grad_list_.end());
    updated_grads_ = shards_.updated(grad_const_);
    updated_grad_list_ = shards_.updated(grad_list_);
    for (auto& [name, p] : lm.weights.named_parameters()) param_list_.push_back(p);
    MT_CHECK(!shards_.experts_sharded() || shards_.replicas() == ep_.replicas,
             "the optimizer's expert replicas differ from expert parallelism's");
    if (sharded_params_) sharded_params_->shard();  // after the model has checked the whole set
    // peak_memory_bytes: training's peak, not the load's (with sharded parameters the load held them all).
    memory_reset_peak(Device::cpu());
  }

  std::string device_name() const override { return "cpu"; }

  EngineStep step(const std::vector<Batch>& window, double ce_divisor, double lr, double max_grad_norm) override {
    for (Tensor* g : grad_list_) std::memset(g->data(), 0, g->nbytes());
    if (!loads_.empty()) loads_.flat.fill_zero();
    LossOptions lo;
    lo.ce_divisor = ce_divisor;
    EngineStep s;
    for (const Batch& b : window) {
      ForwardResult f = model_.forward_backward(b, grads_, lo);
      s.loss += f.loss;
      s.ce_loss += f.ce_loss;
      s.aux_loss += f.aux_loss;
    }
    double micro_batches = static_cast<double>(window.size());
    if (comm_) {
      ++steps_;
      reduce_gradients();
      // The loss sums and every rank's expert loads (exact in doubles) in one all-reduce.
      std::vector<double> sums = {s.loss, s.ce_loss, s.aux_loss, micro_batches};
      const int64_t nloads = loads_.empty() ? 0 : loads_.flat.numel();
      const int32_t* load = nloads ? loads_.flat.data_as<int32_t>() : nullptr;
      for (int64_t i = 0; i < nloads; ++i) sums.push_back(load[i]);
      comm_->all_reduce_sum(sums.data(), static_cast<int64_t>(sums.size()),
                            "all_reduce(loss sums and expert loads, step " + std::to_string(steps_) + ")");
      s.loss = sums[0], s.ce_loss = sums[1], s.aux_loss = sums[2], micro_batches = sums[3];
      for (int64_t i = 0; i < nloads; ++i) {
        const double v = sums[4 + static_cast<size_t>(i)];
        MT_CHECK(v <= 2147483647.0, "step {}: an expert load of {} slots over the ranks (more than int32 holds)",
                 steps_, v);
        loads_.flat.data_as<int32_t>()[i] = static_cast<int32_t>(v);
      }
    }
    s.expert_load_max_over_mean = expert_loads_max_over_mean(loads_);
    if (micro_batches > 0) s.aux_loss /= micro_batches;
    s.grad_norm = shards_.active() || split() ? distributed_grad_norm() : grad_global_norm(grad_list_);
    s.finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
    if (s.finite) {
      grad_clip_to(updated_grad_list_, s.grad_norm, max_grad_norm);
      optimizer_.step(updated_grads_, lr);
      // Sharded parameters (the expert stacks too) are fetched from their owners at their next use instead.
      if (shards_.active() && !sharded_params_) broadcast_updates();
      if (shards_.experts_sharded() && !sharded_params_) broadcast_expert_updates();
      // After the optimizer step, every rank alike from the summed loads (DeepSeek-V3's bias update).
      if (bias_rate_ > 0) expert_bias_update_all(loads_, lm_.weights, bias_rate_);
    }
    return s;
  }

  // Each owner's updated parameters to every rank: one broadcast per owner, its tensors packed.
  void broadcast_updates() {
    for (int owner = 0; owner < shards_.world(); ++owner) broadcast_owned(world_set(owner), nullptr);
  }
  // Each replica's updated expert stacks to the other ranks holding the same experts, the same way.
  void broadcast_expert_updates() {
    for (int owner : shards_.replicas()) broadcast_owned(replica_set(owner), &ep_.replicas);
  }
  void broadcast_owned(int set, const std::vector<int>* group) {
    const int owner = set_owner(set);
    const size_t bytes = each_owned(param_list_, set, [](Tensor&, size_t) {});
    if (bytes == 0) return;
    packed_.resize(bytes);
    const bool mine = owner == shards_.rank();
    if (mine) each_owned(param_list_, set, [&](Tensor& t, size_t at) { std::memcpy(packed_.data() + at, t.data(), t.nbytes()); });
    const std::string what = std::string(group ? "broadcast(expert stacks" : "broadcast(parameters") +
                             " updated by rank " + std::to_string(owner) + ", step " + std::to_string(steps_) + ")";
    if (group)
      comm_->broadcast(*group, packed_.data(), bytes, owner, what);
    else
      comm_->broadcast(packed_.data(), bytes, owner, what);
    if (!mine) each_owned(param_list_, set, [&](Tensor& t, size_t at) { std::memcpy(t.data(), packed_.data() + at, t.nbytes()); });
  }

  // Calls f(tensor, byte offset) for the tensors of `ts` (engine parameter order) that `set` reduces (world_set /
  // replica_set: one owner's), as if packed back to back; returns their bytes. Every rank has the same owner map,
  // so all agree on the sizes.
  template <typename F>
  size_t each_owned(const std::vector<Tensor*>& ts, int set, F&& f) const {
    size_t at = 0;
    for (size_t i = 0; i < ts.size(); ++i)
      if (reduced_by(i) == set) {
        f(*ts[i], at);
        at += ts[i]->nbytes();
      }
    return at;
  }

  EngineEval eval(const Batch& b) override {
    LossOptions o;
    o.ce_divisor = 1;  // ce_loss = the CE sum of this batch
    ForwardResult f = model_.forward(b, false, o);
    return {f.ce_loss, f.aux_loss, f.tokens};
  }

  int64_t optimizer_steps() const override { return optimizer_.step_count(); }

  // The gradients summed over the ranks, each where it is needed: those every rank updates (all of them
  // without ZeRO-1; with it, none but the experts) in one all-reduce; the experts under expert parallelism
  // over their replicas only (the ranks holding the same experts; none when the job is one group); and each
  // sharded tensor only on its owner (one reduce per owner, its tensors packed; over the world, or for an
  // expert stack over its replicas) — half an all-reduce's traffic. All sum in rank order, so the owner's
  // gradient is bitwise the all-reduced one; the other ranks' copies are left partial and unused.
  void reduce_gradients() {
    const std::string step = "step " + std::to_string(steps_);
    packed_collective(kEveryRank, [&](float* p, int64_t n) {
      comm_->all_reduce_sum(p, n, "all_reduce(gradients, " + step + ")");
    });
    if (ep_.replicas.size() > 1)
      packed_collective(kExpertReplicas, [&](float* p, int64_t n) {
        comm_->all_reduce_sum(ep_.replicas, p, n, "all_reduce(expert gradients over replicas, " + step + ")");
      });
    for (int owner : shards_.replicas())
      packed_collective(replica_set(owner), [&](float* p, int64_t n) {
        comm_->reduce_sum(ep_.replicas, p, n, owner,
                          "reduce(expert gradients owned by rank " + std::to_string(owner) + ", " + step + ")");
      });
    if (!shards_.active()) return;
    for (int owner = 0; owner < shards_.world(); ++owner)
      packed_collective(world_set(owner), [&](float* p, int64_t n) {
        comm_->reduce_sum(p, n, owner, "reduce(gradients owned by rank " + std::to_string(owner) + ", " + step + ")");
      });
  }
  // Which gradients a packed collective moves: those of one owner rank (ZeRO-1: world_set(r) over the world,
  // replica_set(r) the expert stacks over their replicas), or these two sets.
  static constexpr int kEveryRank = -1;       // held whole by every rank, not sharded
  static constexpr int kExpertReplicas = -2;  // this rank's experts, under expert parallelism, not sharded
  static int world_set(int owner) { return owner; }
  int replica_set(int owner) const { return shards_.world() + owner; }
  int set_owner(int set) const { return set >= shards_.world() ? set - shards_.world() : set; }
  int reduced_by(size_t i) const {
    if (shards_.over_replicas(i)) return replica_set(shards_.owner(i));
    if (split_[i]) return kExpertReplicas;
    return shards_.owner(i) >= 0 ? world_set(shards_.owner(i)) : kEveryRank;
  }
  // Packs the gradients `reduced_by` that set into flat_, runs `collective` on it and unpacks the result where
  // this rank uses it (every rank for the two sets; else the owner); no call when there are none.
  template <typename F>
  void packed_collective(int set, F&& collective) {
    size_t bytes = 0;
    for (size_t i = 0; i < grad_list_.size(); ++i)
      if (reduced_by(i) == set) bytes += grad_list_[i]->nbytes();
    if (bytes == 0) return;
    flat_.resize(bytes / sizeof(float));
    auto* flat = reinterpret_cast<unsigned char*>(flat_.data());
    auto each = [&](auto&& f) {
      size_t at = 0;
      for (size_t i = 0; i < grad_list_.size(); ++i)
        if (reduced_by(i) == set) f(*grad_list_[i], at), at += grad_list_[i]->nbytes();
    };
    each([&](Tensor& g, size_t at) { std::memcpy(flat + at, g.data(), g.nbytes()); });
    collective(flat_.data(), static_cast<int64_t>(flat_.size()));
    if (set < 0 || set_owner(set) == shards_.rank())
      each([&](Tensor& g, size_t at) { std::memcpy(g.data(), flat + at, g.nbytes()); });
  }
  // The global norm when not every rank holds every summed gradient whole, bitwise the same on every rank:
  // a sharded tensor's norm from its owner (an all-reduce of a vector that is zero elsewhere: exact); an
  // expert stack's from the Σ g² of the group's slices (summed over the expert-parallel group in rank order;
  // replica groups hold bitwise the same gradients, so they agree); the rest computed here; then the norm of
  // norms in tensor order. With ZeRO-1 alone it is bitwise grad_global_norm of the all-reduced gradients.
  // With the expert stacks sharded over their replicas, a stack's owners (one per position of the expert-
  // parallel group: the same map in every replica group, so together they form the group of ranks q·ep ..
  // q·ep + ep - 1) put their slices' Σ g² into the world all-reduce of the owners' norms and the others zero:
  // summed in rank order, the zeros add exactly nothing and the owners' terms come in group order, so it is
  // bitwise the expert-parallel group's sum of the unsharded run.
  double distributed_grad_norm() {
    const std::string step = "step " + std::to_string(steps_);
    const size_t n = grad_list_.size();
    const bool experts_sharded = shards_.experts_sharded();
    std::vector<double> norms(n, 0.0), sumsq;  // sumsq: one per expert stack, in order
    for (size_t i = 0; i < n; ++i)
      if (split_[i])
        sumsq.push_back(!experts_sharded || shards_.owner(i) == shards_.rank() ? tensor_grad_sumsq(*grad_list_[i]) : 0.0);
    if (shards_.active()) {
      for (size_t i = 0; i < n; ++i)
        if (shards_.world_owner(i) == shards_.rank()) norms[i] = tensor_grad_norm(*grad_list_[i]);
      if (experts_sharded) norms.insert(norms.end(), sumsq.begin(), sumsq.end());
      comm_->all_reduce_sum(norms.data(), static_cast<int64_t>(norms.size()),
                            "all_reduce(gradient norms, " + step + ")");
      if (experts_sharded) {
        std::copy(norms.begin() + static_cast<ptrdiff_t>(n), norms.end(), sumsq.begin());
        norms.resize(n);
      }
    }
    if (!sumsq.empty() && !experts_sharded)
      comm_->all_reduce_sum(ep_.group, sumsq.data(), static_cast<int64_t>(sumsq.size()),
                            "all_reduce(expert gradient norms, " + step + ")");
    for (size_t i = 0, k = 0; i < n; ++i) {
      if (split_[i])
        norms[i] = norm_of_sumsq(sumsq[k++]);
      else if (shards_.owner(i) < 0)
        norms[i] = tensor_grad_norm(*grad_list_[i]);
    }
    return norm_of_norms(norms);
  }
  void set_optimizer_steps(int64_t t) override { optimizer_.set_step_count(t); }
  void weights_to_host() override {}
  // Every parameter's state, in the unsharded order and full shapes (what the file holds): a sharded-away
  // parameter's as a shape-only placeholder (its owner writes it); an expert stack's, under expert parallelism,
  // as all E experts' rows of which this rank fills its own — on the rank that writes them (train/shared_save.h:
  // the stack's owner among the replicas when sharded, else the first group's rank), else shape only.
  std::vector<std::pair<std::string, Tensor>> optimizer_state_host() override {
    std::vector<std::pair<std::string, Tensor>> r;
    for (StateSlot& s : state_layout()) {
      if (!split() || !param_is_stacked_expert(lm_.weights.param_table(), s.spec.name)) {
        r.emplace_back(s.spec.name, s.held ? *s.held : Tensor::absent(s.spec.shape, s.spec.dtype));
        continue;
      }
      Shape full = s.spec.shape;
      full[0] = lm_.config.num_experts();
      const bool writes = shards_.experts_sharded() ? s.held != nullptr : ep_.group.front() == 0;
      if (!writes) {  // another replica (the owner, or the first group) writes these experts
        r.emplace_back(s.spec.name, Tensor::absent(full, s.spec.dtype));
        continue;
      }
      Tensor t = Tensor::empty(full, s.spec.dtype);  // the other experts' rows are never touched
      t.rows(ep_.first_expert(), ep_.first_expert() + ep_.experts_per_rank).copy_from(*s.held);
      r.emplace_back(s.spec.name, std::move(t));
    }
    return r;
  }
  // This rank's share of the file: the tensors it updates, of the expert stacks its own experts' rows (the
  // file holds all E, from any expert-parallel layout).
  void optimizer_state_load(const std::string& dir) override {
    const auto total = static_cast<int64_t>(state_layout().size());
    optimizer_state_read(dir, optimizer_.named_state(), &lm_.weights.param_table(), split() ? ep_.first_expert() : 0,
                         split() ? ep_.experts_per_rank : -1, total);
  }
  const OptimizerShards& optimizer_shards() const override { return shards_; }
  int64_t optimizer_state_bytes() override {
    int64_t b = 0;
    for (auto& [name, t] : optimizer_.named_state()) b += static_cast<int64_t>(t->nbytes());
    return b;
  }
  int64_t peak_memory_bytes() const override { return memory_stats(Device::cpu()).peak_bytes; }
  int64_t peak_reserved_bytes() const override { return peak_memory_bytes(); }

 private:
  std::vector<StateSlot> state_layout() {
    return optimizer_state_layout(lm_.weights.named_parameters(), shards_, optimizer_.named_state(),
                                  [&](const std::string& n, const Tensor& p) {
                                    return AdamW::state_specs(n, p, optimizer_.options());
                                  });
  }

  bool split() const { return !ep_.group.empty(); }  // experts split over ranks (parallel.ep > 1)

  // Under expert parallelism the CausalLM's stacks become this rank's experts only: the trainer loads them so
  // (LoadOptions::compact_experts); a model holding all E experts gives up the others here.
  static ExpertParallel experts_sliced(CausalLM& lm, ExpertParallel ep) {
    if (ep.group.empty()) return ep;
    const int64_t first = ep.first_expert(), n = ep.experts_per_rank;
    for (auto& [name, t] : lm.weights.named_parameters()) {
      if (!lm.weights.param_table().is_expert_stack(name)) continue;
      if (t->dim(0) == n && lm.expert_first == first) continue;  // already this rank's slice
      if (t->dim(0) != lm.config.num_experts())
        fail("{}: holds {} experts from expert {}; this rank of parallel.ep {} trains experts {}..{}", name,
             t->dim(0), lm.expert_first, ep.group.size(), first, first + n - 1);
      *t = t->rows(first, first + n).clone();
    }
    lm.expert_first = first;
    lm.experts_partial = true;
    return ep;
  }
  static ModelOptions model_options(const ExpertParallel& ep, ParamResidency* residency, ExpertLoads& loads) {
    ModelOptions o;
    if (!ep.group.empty()) o.expert_parallel = &ep;
    o.residency = residency;
    if (!loads.empty()) o.expert_load = &loads.layers;
    return o;
  }
  // ZeRO-3 (parallel.shard_parameters): the ZeRO-1 owners keep the parameters too. One process: nothing to
  // shard.
  static std::unique_ptr<ShardedParams> sharded_params_of(CausalLM& lm, const Recipe& r, const OptimizerShards& shards,
                                                          Communicator* comm) {
    if (!r.parallel.shard_parameters || !comm) return nullptr;
    MT_CHECK(shards.active(), "parallel.shard_parameters without ZeRO-1 owners (recipe_load refuses that)");
    return std::make_unique<ShardedParams>(lm.weights, lm.config, shards, *comm, r.parallel.reshard_after_forward);
  }

  CausalLM& lm_;
  Communicator* comm_;  // null: one process
  ExpertParallel ep_;
  int64_t steps_ = 0;   // steps taken in this process (named in collective errors)
  std::vector<float> flat_;
  OptimizerShards shards_;  // ZeRO-1 over the ranks (train/optimizer_shards.h), or none
  std::unique_ptr<ShardedParams> sharded_params_;  // ZeRO-3 (train/sharded_params.h), or none
  ExpertLoads loads_;       // this step's routed slots per expert and MoE layer (summed over the ranks)
  double bias_rate_ = 0;    // moe.bias_update_rate
  DecoderModel model_;
  ModelWeights grads_;
  AdamW optimizer_;         // the parameters this rank updates
  std::vector<Tensor*> grad_list_;
  std::vector<bool> split_;  // per gradient: an expert stack split over the expert-parallel group
  std::vector<const Tensor*> grad_const_;
  std::vector<const Tensor*> updated_grads_;  // grad_const_'s entries for optimizer_'s parameters
  std::vector<Tensor*> updated_grad_list_;    // the same, writable (the clip scales only these)
  std::vector<Tensor*> param_list_;           // the parameters, engine order (grad_list_'s order)
  std::vector<unsigned char> packed_;         // broadcast_updates' buffer
};

}  // namespace

AdamWOptions adamw_options_from(const Recipe& r) {
  AdamWOptions a;
  a.lr = r.optimizer.lr;
  a.beta1 = r.optimizer.beta1;
  a.beta2 = r.optimizer.beta2;
  a.eps = r.optimizer.eps;
  a.weight_decay = r.optimizer.weight_decay;
  a.master_weights = r.optimizer.master_weights == "float32";
  return a;
}

std::unique_ptr<TrainEngine> cpu_engine_create(CausalLM& lm, const Recipe& r, Communicator* comm) {
  return std::make_unique<CpuEngine>(lm, r, comm);
}

void cuda_engine_register(CudaEngineHooks hooks) { hooks_storage() = std::move(hooks); }

const CudaEngineHooks* cuda_engine_hooks() {
  const CudaEngineHooks& h = hooks_storage();
  return h.create ? &h : nullptr;
}

int train_device_resolve(const Recipe& r, const DecoderSpec& cfg, std::string* why, int local_rank,
                         int local_world) {
  const std::string& d = r.train.device;
  if (d == "cpu") return -1;
  const CudaEngineHooks* h = cuda_engine_hooks();
  const int count = h ? h->device_count() : 0;
  const bool ranks = local_world > 1;  // one GPU per rank of this node: the rank's LOCAL_RANK
  // Host-staged GPU collectives let ranks share a GPU: local rank r takes GPU r mod count.
  const bool share = r.parallel.gpu_collectives == "host";
  auto rank_device = [&] { return share && count > 0 ? local_rank % count : local_rank; };
  if (d == "auto") {
    if (!h) {
      if (why) *why = "this build has no CUDA support";
      return -1;
    }
    if (count == 0) {
      if (why) *why = "no CUDA device found";
      return -1;
    }
    if (ranks && count < local_world && !share) {
      if (why) *why = fmt::format("{} ranks on this node but {} CUDA device{}", local_world, count, count == 1 ? "" : "s");
      return -1;
    }
    if (const std::string no = h->unsupported(cfg); !no.empty()) {
      if (why) *why = "the CUDA path cannot run this model: " + no;
      return -1;
    }
    if (why) *why = !ranks ? "a CUDA device is present" : share ? "ranks share the CUDA devices" : "one CUDA device per rank";
    return ranks ? rank_device() : 0;
  }
  int index = 0;
  if (d.size() > 5) index = std::stoi(d.substr(5));  // "cuda:N" (the recipe parser checked the form)
  if (!h) fail("train.device: '{}': this build of mixtune has no CUDA support (use cpu or auto)", d);
  if (ranks) {
    if (d != "cuda")
      fail("train.device: '{}': in a job of several ranks each rank uses the GPU of its LOCAL_RANK; set "
           "train.device: cuda (or auto)",
           d);
    index = rank_device();
  }
  if (index >= count)
    fail("train.device: '{}': {} needs CUDA device {} but {} CUDA device{} found", d,
         ranks ? fmt::format("local rank {}", local_rank) : std::string("the job"), index,
         count == 0 ? "no" : std::to_string(count), count == 1 ? " was" : "s were");
  if (const std::string no = h->unsupported(cfg); !no.empty())
    fail("train.device: '{}': the CUDA path cannot run this model: {} (use cpu)", d, no);
  return index;
}

}  // namespace mt
