#include "train/cuda/bench_run.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>
#include <cmath>
#include <functional>
#include <random>

#include "core/error.h"
#include "core/memory.h"
#include "distributed/communicator.h"
#include "distributed/mpi_bootstrap.h"
#include "distributed/process_group_env.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gpu_energy.h"
#include "kernels/cuda/gpu_spin.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/router.h"
#include "models/spec/config_writer.h"
#include "models/causal_lm.h"
#include "models/cuda/cuda_lora.h"
#include "models/decoder_costs.h"
#include "models/lora_adapter.h"
#include "models/presets.h"
#include "models/registry.h"
#include "train/cuda/cuda_job_collectives.h"
#include "train/cuda/cuda_param_transport.h"
#include "train/cuda/cuda_train_step.h"
#include "train/sharded_params.h"

namespace mt {

namespace {

// An experiment switch's milliseconds (unset or empty: 0); anything but a number in [0, 60000] is an error.
double env_milliseconds(const char* var) {
  const char* e = std::getenv(var);
  if (e == nullptr || *e == '\0') return 0.0;
  char* end = nullptr;
  const double v = std::strtod(e, &end);
  if (*end != '\0' || !(v >= 0.0 && v <= 60000.0))
    fail("{}: expected milliseconds in [0, 60000], found '{}'", var, e);
  return v;
}

// --lora-r / --lora-alpha / --lora-targets as an adapter config (alpha 0: 2·r, the r 16 / alpha 32).
LoraConfig bench_lora_config(const BenchOptions& o) {
  LoraConfig c;
  c.r = o.lora_r;
  c.alpha = o.lora_alpha > 0 ? o.lora_alpha : 2.0 * static_cast<double>(o.lora_r);
  c.target = o.lora_targets;
  return c;
}

// Dense bf16 GEMM 8192³ through the same cuBLASLt path the model uses: best of 10 timed runs.
double measure_gemm_ceiling_tflops(int device) {
  const int64_t n = 8192;
  cuda::DeviceContext& ctx = cuda::device_context(device);
  Tensor a = Tensor::empty({n, n}, DType::BF16, Device::cuda(device));
  Tensor b = Tensor::empty({n, n}, DType::BF16, Device::cuda(device));
  Tensor c = Tensor::empty({n, n}, DType::BF16, Device::cuda(device));
  cuda::fill_normal(a, 1.0f, 1, ctx.stream);
  cuda::fill_normal(b, 1.0f, 2, ctx.stream);
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0));
  MT_CUDA_CHECK(cudaEventCreate(&e1));
  auto run = [&] { cuda::linear_forward(a, b, c, ctx.stream); };
  for (int i = 0; i < 3; ++i) run();
  float best = 1e30f;
  for (int i = 0; i < 10; ++i) {
    MT_CUDA_CHECK(cudaEventRecord(e0, ctx.stream));
    run();
    MT_CUDA_CHECK(cudaEventRecord(e1, ctx.stream));
    MT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(n) * n * n / (best * 1e-3) / 1e12;
}

DecoderSpec bench_config(const BenchOptions& o) {
  nlohmann::json j;
  if (!o.model_dir.empty()) {
    j = DecoderSpec::from_file(o.model_dir + "/config.json").to_json();
  } else {
    j = preset_config_json(o.preset);
  }
  if (o.layers > 0) config_json_set_layers(j, o.layers);
  return DecoderSpec::from_json(j, o.model_dir.empty() ? "preset " + o.preset : o.model_dir);
}

Batch random_batch(const DecoderSpec& cfg, int64_t mbs, int64_t seq, int64_t prompt_len, std::mt19937_64& g) {
  Batch b;
  b.input_ids = Tensor::empty({mbs, seq}, DType::I64);
  std::uniform_int_distribution<int64_t> d(0, cfg.vocab_size - 1);
  int64_t* p = b.input_ids.data_as<int64_t>();
  for (int64_t i = 0; i < mbs * seq; ++i) p[i] = d(g);
  b.labels = b.input_ids;
  if (prompt_len > 0) {
    b.labels = b.input_ids.clone();
    for (int64_t r = 0; r < mbs; ++r)
      for (int64_t t = 0; t < prompt_len; ++t) b.labels.data_as<int64_t>()[r * seq + t] = -100;
  }
  return b;
}

// The multi-GPU side of a bench (empty for one process).
struct BenchRanks {
  ProcessGroupEnv pg;
  std::unique_ptr<Communicator> host;
  CudaJobCollectives job;
};

}  // namespace

nlohmann::ordered_json bench_run(const BenchOptions& o, std::FILE* log_in) {
  MT_CHECK(o.steps >= 1 && o.warmup >= 0 && o.seq >= 2 && o.micro_batch >= 1 && o.grad_accum >= 1,
           "bench: steps >= 1, warmup >= 0, seq >= 2, micro_batch >= 1, grad_accum >= 1 (found {}, {}, {}, {}, {})",
           o.steps, o.warmup, o.seq, o.micro_batch, o.grad_accum);
  MT_CHECK(o.layers >= 0, "bench: --layers must be >= 0 (0: all the model's layers), found {}", o.layers);
  MT_CHECK(o.precision == "bf16" || o.precision == "fp32-master", "bench: --precision must be bf16 or fp32-master, "
           "found '{}'", o.precision);
  MT_CHECK(o.prompt_fraction >= 0.0 && o.prompt_fraction < 1.0, "bench: --prompt-fraction must be in [0, 1), found {}",
           o.prompt_fraction);
  const int64_t prompt_len = static_cast<int64_t>(o.prompt_fraction * static_cast<double>(o.seq));
  // The balanced-routing probe is process-wide: on for this run only, off again however it ends.
  struct ProbeScope {
    explicit ProbeScope(bool on) { cuda::set_balanced_routing_probe(on); }
    ~ProbeScope() { cuda::set_balanced_routing_probe(false); }
  } balanced_probe(o.balanced_router);
  BenchRanks ranks;
  ranks.pg = mpi_bootstrap(process_group_env_from_environment());
  const int world = ranks.pg.world, rank = ranks.pg.rank;
  if (o.ep < 1 || world % o.ep != 0) fail("bench: --ep {} must divide the {} rank(s) of this job", o.ep, world);
  std::FILE* log = rank == 0 ? log_in : nullptr;
  const DeviceCollectives collectives = device_collectives_parse(o.gpu_collectives, "bench --gpu-collectives");
  const int count = cuda::device_count();
  const bool share = collectives == DeviceCollectives::host && count > 0;  // ranks may share a GPU
  const int device = world > 1 ? (share ? ranks.pg.local_rank % count : ranks.pg.local_rank) : o.device;
  if (o.shard_parameters && !o.shard_optimizer)
    fail("bench: --shard-parameters needs the optimizer state sharded (drop --no-shard-optimizer)");
  if (device >= count) fail("bench: rank {} needs cuda:{}, {} CUDA device(s) found", rank, device, count);
  cuda::device_set(device);
  cuda::DeviceContext& ctx = cuda::device_context(device);
  const DecoderSpec cfg = bench_config(o);
  if (cfg.num_experts() % o.ep != 0)
    fail("bench: --ep {} does not divide the model's {} experts", o.ep, cfg.num_experts());
  const bool fp32_master = o.precision == "fp32-master";

  if (world > 1) {
    ranks.host = tcp_communicator_create(ranks.pg, std::chrono::seconds(600));
    const EpDispatchMode dispatch =
        ep_dispatch_mode_parse(o.ep_dispatch, o.ep, cfg.experts_per_token(), "bench --ep-dispatch");
    ranks.job = cuda_job_collectives_create(*ranks.host, device, std::chrono::seconds(600), o.ep, cfg.num_experts(),
                                            dispatch, "bench --ep", collectives);
  }
  CudaExpertParallel* ep = ranks.job.ep.get();
  if (ep) ep->set_row_headroom(o.ep_row_headroom);
  const int64_t held = ep ? ep->experts_per_rank() : cfg.num_experts();
  const int64_t first_expert = ep ? ep->first_expert() : 0;
  std::shared_ptr<const LoraTable> lora_table;
  if (o.lora_r > 0) {
    if (world > 1) fail("bench: --lora-r runs on one GPU (LoRA with data or expert parallelism is not built)");
    lora_table = std::make_shared<const LoraTable>(lora_table_of(cfg, bench_lora_config(o), "bench --lora-targets"));
  }

  size_t free_b = 0, total_b = 0;
  MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  MemoryPlanInput pin;
  pin.cfg = cfg;
  pin.micro_batch = o.micro_batch;
  pin.seq = o.seq;
  pin.recompute = o.recompute;
  pin.deterministic = o.deterministic;
  pin.fp32_master = fp32_master;
  pin.bf16_moments = !fp32_master;
  pin.bf16_expert_grads = !fp32_master;
  pin.expert_parallel = o.ep;
  pin.optimizer_shards = world > 1 && o.shard_optimizer ? world : 1;
  const bool shard_params = world > 1 && o.shard_parameters;
  pin.shard_parameters = shard_params;
  pin.ep_all_gather = ep && ep->mode() == EpDispatchMode::all_gather;
  pin.ep_row_headroom = o.ep_row_headroom;
  pin.device_bytes = static_cast<int64_t>(total_b);
  pin.reserve_bytes = memory_plan_reserve_bytes(pin.device_bytes);
  if (lora_table) {  // the adapter's fp32 moments and the router's fp32 master (PEFT's defaults)
    memory_plan_set_lora(pin, *lora_table, /*gpu=*/true);
    pin.fp32_master = true;
    pin.bf16_moments = false;
  }
  // LoRA: the frozen experts have no weight gradients to pair.
  const bool pair = !o.no_pair_expert_wgrad && !lora_table && pairing_wanted(pin, o.grad_accum);
  pin.pair_expert_wgrad = pair;
  const MemoryPlan plan = memory_plan(pin);
  if (log) std::fprintf(log, "%s\n", plan.table().c_str());
  if (!plan.fits && !o.force) fail("bench: {} (--force runs it anyway)", plan.refusal());

  const double ceiling = measure_gemm_ceiling_tflops(device);
  // One layer's expert exchange alone, 20 times, timed on the GPU: what the transport gives without the
  // training around it. all_to_all mode: the dispatch volume (T·k rows of H bf16, (ep-1)/ep of them remote);
  // all_gather mode: the forward all-gather of T rows (and, apart, the forward's reduce-scatter of ep·T
  // rows). Each burst runs twice: right after the host queues it (host-paced: the host's enqueue and
  // polling rate can set the time) and queued behind a GPU spin, so that the events time the GPU alone.
  nlohmann::ordered_json probe;
  if (ep) {
    const int g = ep->ranks(), me = ep->me();
    const bool gathers = ep->mode() == EpDispatchMode::all_gather;
    const int64_t tokens = o.micro_batch * o.seq, H = cfg.hidden_size;
    const int64_t rows = gathers ? tokens : tokens * cfg.experts_per_token();
    std::vector<int64_t> first(g), count(g);
    for (int j = 0; j < g; ++j) count[j] = rows / g, first[j] = j * (rows / g);
    Tensor a = Tensor::empty({rows, H}, DType::BF16, Device::cuda(device));
    Tensor b = Tensor::empty({gathers ? g * rows : rows, H}, DType::BF16, Device::cuda(device));
    cudaEvent_t e0, e1;
    MT_CUDA_CHECK(cudaEventCreate(&e0));
    MT_CUDA_CHECK(cudaEventCreate(&e1));
    struct Burst {
      double gpu_ms, host_enqueue_ms;
    };
    auto burst = [&](const std::function<void()>& once, bool behind_spin) {
      for (int i = 0; i < 3; ++i) once();
      ep->comm().wait(ctx.stream, "probe warm-up");
      if (behind_spin) cuda::gpu_spin(20'000'000, ctx.stream);  // 20 ms: longer than queueing 20 calls
      MT_CUDA_CHECK(cudaEventRecord(e0, ctx.stream));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) once();
      const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      MT_CUDA_CHECK(cudaEventRecord(e1, ctx.stream));
      ep->comm().wait(ctx.stream, "probe");
      float ms = 0;
      MT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      return Burst{ms / 20.0, host_ms / 20.0};
    };
    auto exchange = [&] {
      if (gathers)
        ep->comm().all_gather(a.data(), b.data(), a.numel(), DType::BF16, ctx.stream, "probe");
      else
        ep->comm().all_to_allv(a.data(), first, count, b.data(), first, count, H * 2, ctx.stream, "probe");
    };
    const Burst paced = burst(exchange, false), alone = burst(exchange, true);
    const double remote =
        static_cast<double>(gathers ? (g - 1) * rows : rows - rows / g) * static_cast<double>(H) * 2.0;
    auto gbs = [&](double ms) { return remote / (ms * 1e-3) / 1e9; };
    probe = {{"operation", gathers ? "all_gather" : "all_to_allv"},
             {"rows_per_call", rows}, {"remote_bytes_per_call", remote}, {"ms_per_call", paced.gpu_ms},
             {"gb_per_s", gbs(paced.gpu_ms)}, {"host_enqueue_ms_per_call", paced.host_enqueue_ms},
             {"gpu_paced_ms_per_call", alone.gpu_ms}, {"gpu_paced_gb_per_s", gbs(alone.gpu_ms)}};
    if (log)
      std::fprintf(log, "expert exchange probe (rank %d): %.3f ms per call, %.1f GB/s (host enqueue %.3f ms per "
                   "call); queued behind a GPU spin: %.3f ms, %.1f GB/s\n", me, paced.gpu_ms, gbs(paced.gpu_ms),
                   paced.host_enqueue_ms, alone.gpu_ms, gbs(alone.gpu_ms));
    if (gathers) {
      // The forward's combine: [g·T, H] partial sums -> this rank's [T, H].
      auto scatter = [&] {
        ep->comm().reduce_scatter_sum(b.data(), a.data(), a.numel(), DType::BF16, ctx.stream, "probe");
      };
      const Burst rs_paced = burst(scatter, false), rs_alone = burst(scatter, true);
      probe["reduce_scatter"] = {{"ms_per_call", rs_paced.gpu_ms}, {"host_enqueue_ms_per_call", rs_paced.host_enqueue_ms},
                                 {"gpu_paced_ms_per_call", rs_alone.gpu_ms},
                                 {"gpu_paced_gb_per_s", gbs(rs_alone.gpu_ms)}};
      if (log)
        std::fprintf(log, "reduce-scatter probe (rank %d): %.3f ms per call (host enqueue %.3f); behind a GPU spin: "
                     "%.3f ms, %.1f GB/s\n", me, rs_paced.gpu_ms, rs_paced.host_enqueue_ms, rs_alone.gpu_ms,
                     gbs(rs_alone.gpu_ms));
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cuda::allocator_empty_cache(device);
  cuda::allocator_reset_peak(device);
  memory_reset_peak(Device::cuda(device));

  // Parameters on the device: a checkpoint's, or the Transformers init (normal(0, initializer_range),
  // norms 1) drawn on the device. Every rank draws the same replicated parameters; expert slices differ.
  // ZeRO-1 owners by names and sizes; under ZeRO-3 the parameters other ranks own are never allocated here.
  ModelWeights w = ModelWeights::absent_like_config(cfg, DType::BF16, Device::cuda(device), held);
  const OptimizerShards shards = world > 1 && o.shard_optimizer
                                     ? optimizer_shards_for(w, world, rank, o.ep)
                                     : OptimizerShards();
  {
    auto params = w.named_parameters();
    for (size_t i = 0; i < params.size(); ++i)
      if (!shard_params || shards.keeps_weights(i))
        *params[i].second = Tensor::empty(params[i].second->shape(), DType::BF16, Device::cuda(device));
  }
  if (!o.model_dir.empty()) {
    LoadOptions lo;
    lo.dtype = DType::BF16;
    CausalLM lm = CausalLM::from_pretrained(o.model_dir, lo);
    auto src = lm.weights.named_parameters();
    auto dst = w.named_parameters();
    MT_CHECK(src.size() == dst.size(), "bench: {} parameters in {}, the sliced config has {}", src.size(),
             o.model_dir, dst.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (!dst[i].second->present()) continue;
      const Tensor& h = *src[i].second;
      cuda::copy_host_to_device(*dst[i].second, lm.weights.param_table().is_expert_stack(src[i].first) ? h.rows(first_expert, first_expert + held) : h);
    }
    auto bsrc = lm.weights.named_buffers();  // F32, replicated (DeepSeek-V3's e_score_correction_bias)
    auto bdst = w.named_buffers();
    for (size_t i = 0; i < bsrc.size() && i < bdst.size(); ++i)
      *bdst[i].second = cuda::to_device(*bsrc[i].second, device);
  } else {
    for (auto& [name, t] : w.named_buffers()) {  // Transformers' init: zeros
      *t = Tensor::empty(t->shape(), t->dtype(), Device::cuda(device));
      cuda::fill_zero_async(*t, ctx.stream);
    }
    uint64_t k = 0;
    for (auto& [name, t] : w.named_parameters()) {
      ++k;
      if (!t->present()) continue;
      const ParamEntry& e = *w.param_table().find(name);
      const uint64_t seed = o.seed * 1000003 + k + (e.role == ParamRole::expert_stack ? 7919ull * static_cast<uint64_t>(first_expert) : 0);
      if (e.init == ParamInit::ones)
        cuda::fill_constant(*t, 1.0f, ctx.stream);
      else
        cuda::fill_normal(*t, static_cast<float>(cfg.initializer_range), seed, ctx.stream);
    }
  }

  CudaTrainStepOptions so;
  so.model.recompute = o.recompute;
  so.model.deterministic = o.deterministic;
  so.adamw.hyper.lr = 1e-5;
  so.adamw.hyper.weight_decay = 0.0;
  so.adamw.bf16_master = fp32_master;
  so.adamw.moment_dtype = fp32_master ? DType::F32 : DType::BF16;
  so.adamw.seed = o.seed;
  so.pair_expert_wgrad = pair;
  so.expert_grad_dtype = fp32_master ? DType::F32 : DType::BF16;  // pure bf16: gradients as Transformers keeps them
  so.collectives = ranks.job.step();
  so.shards = shards;
  std::unique_ptr<CudaLora> lora;
  if (lora_table) {
    lora = std::make_unique<CudaLora>(LoraWeights::init(lora_table, cfg.num_layers(), o.seed), device);
    so.lora = lora.get();
    so.adamw.bf16_master = true;
    so.adamw.moment_dtype = DType::F32;
  }
  std::unique_ptr<ShardedParams> sharded;
  if (shard_params) {
    auto transport = std::make_unique<CudaParamTransport>(*ranks.job.world, device, ranks.job.replicas.get());
    sharded = std::make_unique<ShardedParams>(w, cfg, shards, std::move(transport), /*reshard_after_forward=*/true);
    so.model.residency = sharded.get();
    so.params_sharded = true;
  }
  CudaTrainStep trainer(cfg, w, device, so);
  if (sharded) sharded->shard();

  std::mt19937_64 g(o.seed + 7777ull * static_cast<uint64_t>(rank));  // each rank its own tokens
  const int64_t tokens_per_step = o.micro_batch * o.seq * o.grad_accum;  // per GPU
  nlohmann::ordered_json j;
  double loss_first = 0, loss_last = 0, timed_s = 0;
  int64_t a2a_bytes = 0;
  double host_wait_s = 0;
  int64_t host_reads = 0, reruns = 0;  // over the timed steps
  double energy_j = 0;        // this GPU's, over the timed steps (NVML's counter; kernels/cuda/gpu_energy.h)
  bool energy_known = true;
  // Experiment switch: MIXTUNE_BENCH_LEAD_MS=N queues an N ms GPU spin ahead of each step, so the host has
  // queued the step's launches before the GPU reaches them. phases_ms (GPU time from the step's first mark)
  // then shows whether the host's enqueue rate held the GPU back; tokens/s includes the spin.
  // MIXTUNE_BENCH_IDLE_MS=N instead sleeps N ms on the host before each step (the GPU idles, the host is not
  // ahead): the same pause without the lead, to tell launch-rate effects from clock or power ones.
  const int64_t lead_ns = static_cast<int64_t>(env_milliseconds("MIXTUNE_BENCH_LEAD_MS") * 1e6);
  const double idle_ms = env_milliseconds("MIXTUNE_BENCH_IDLE_MS");
  for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
    std::vector<Batch> host;
    std::vector<CudaBatch> window;
    for (int64_t i = 0; i < o.grad_accum; ++i) {
      host.push_back(random_batch(cfg, o.micro_batch, o.seq, prompt_len, g));
      window.push_back(cuda_batch_upload(cfg, host.back(), device));
    }
    const bool timed = s >= o.warmup;
    // Marked in the warm-up steps too, so that peak_gib_by_phase sees the first steps' allocations (the optimizer's
    // state, the allocator's first blocks); their times are dropped before the first timed step.
    trainer.model().timer().enable(true);
    if (s == o.warmup) trainer.model().timer().reset_totals();
    cuda::stream_sync(ctx.stream);
    if (ranks.host) ranks.host->barrier("barrier(bench step " + std::to_string(s + 1) + ")");
    const int64_t mallocs0 = cuda::allocator_stats(device).cuda_malloc_calls;
    const int64_t sent0 = ep ? ep->bytes_sent() : 0;
    const double wait0 = ep ? ep->host_wait_s() : 0;
    const int64_t reads0 = ep ? ep->host_reads() : 0, reruns0 = trainer.reruns();
    if (lead_ns > 0) cuda::gpu_spin(lead_ns, ctx.stream);
    if (idle_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(idle_ms));
    const std::optional<double> joules0 = cuda::gpu_energy_joules(device);
    const auto t0 = std::chrono::steady_clock::now();
    // The mean over the window's targets (every rank's micro-batches hold the same count), as the trainer does.
    int64_t targets = 0;
    for (const CudaBatch& b : window) targets += b.target_count;
    const EngineStep r = trainer.step(window, static_cast<double>(targets * world), 1e-5, 1.0);
    cuda::stream_sync(ctx.stream);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::optional<double> joules1 = cuda::gpu_energy_joules(device);
    trainer.model().timer().collect();
    if (s == 0) loss_first = r.loss;
    loss_last = r.loss;
    if (timed) {
      timed_s += sec;
      if (joules0 && joules1)
        energy_j += *joules1 - *joules0;
      else
        energy_known = false;
      if (ep) a2a_bytes += ep->bytes_sent() - sent0, host_wait_s += ep->host_wait_s() - wait0;
      if (ep) host_reads += ep->host_reads() - reads0;
      reruns += trainer.reruns() - reruns0;
    }
    if (log)
      std::fprintf(log, "bench step %lld/%lld: loss %.4f, %.3f s, %.0f tokens/s%s, %lld cudaMalloc%s\n",
                   static_cast<long long>(s + 1), static_cast<long long>(o.warmup + o.steps), r.loss, sec,
                   tokens_per_step / sec, world > 1 ? " per GPU" : "",
                   static_cast<long long>(cuda::allocator_stats(device).cuda_malloc_calls - mallocs0),
                   timed ? "" : " (warm-up)");
  }
  const cuda::AllocatorStats mem = cuda::allocator_stats(device);
  // Per-GPU memory: the largest over the ranks (peak allocated, peak reserved, optimizer state kept, and the peak
  // of the tensors' own bytes: the allocator's peak less its block rounding and the slack of reused roomier blocks,
  // which is what the memory plan counts).
  constexpr int kPeaks = 4;
  double peaks[kPeaks] = {static_cast<double>(mem.peak_allocated_bytes), static_cast<double>(mem.peak_reserved_bytes),
                          static_cast<double>(trainer.optimizer_state_bytes()),
                          static_cast<double>(memory_stats(Device::cuda(device)).peak_bytes)};
  if (ranks.host) {
    double all[kPeaks * 64] = {};
    MT_CHECK(world <= 64, "bench: at most 64 ranks");
    for (int k = 0; k < kPeaks; ++k) all[kPeaks * rank + k] = peaks[k];
    ranks.host->all_reduce_sum(all, kPeaks * world, "all_reduce(peak memory)");
    for (int q = 0; q < world; ++q)
      for (int k = 0; k < kPeaks; ++k) peaks[k] = std::max(peaks[k], all[kPeaks * q + k]);
  }
  if (rank != 0) return j;
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const double tps = static_cast<double>(tokens_per_step * o.steps) / timed_s;
  const double fpt = decoder_train_flops_per_token(cfg, o.seq);
  const double tflops = tps * fpt / 1e12;

  j["tool"] = "mixtune";
  const char* commit = std::getenv("MIXTUNE_COMMIT");  // set by scripts/gpu-session.sh from the packed build
  j["commit"] = commit && *commit ? commit : "unknown";
  j["command"] = o.command;
  j["gpu"] = prop.name;
  j["gpus"] = world;
  j["ep"] = o.ep;
  if (ep) j["ep_dispatch"] = ep_dispatch_mode_name(ep->mode());
  j["model"] = {{"preset", o.model_dir.empty() ? o.preset : ""},
                {"model_dir", o.model_dir},
                {"layers", cfg.num_layers()},
                {"params_on_gpu0", w.parameter_count()},
                {"hidden", cfg.hidden_size},
                {"experts", cfg.num_experts()},
                {"top_k", cfg.experts_per_token()}};
  j["seq"] = o.seq;
  j["micro_batch"] = o.micro_batch;
  j["grad_accum"] = o.grad_accum;
  j["steps"] = o.steps;
  j["warmup"] = o.warmup;
  j["precision"] = o.precision;
  j["recompute"] = recompute_name(o.recompute);
  j["deterministic"] = o.deterministic;
  if (lora_table)
    j["lora"] = {{"r", lora_table->config.r},
                 {"alpha", lora_table->config.alpha},
                 {"targets", lora_table->config.target},
                 {"adapter_parameters", lora_parameter_count(*lora_table)},
                 {"full_trained", lora_table->full},
                 {"flops_note", "flops_per_token and MFU count full fine-tuning's 3x forward; LoRA skips the frozen "
                                "base's weight-gradient GEMMs (about 2x forward plus the adapters)"}};
  j["pair_expert_wgrad"] = pair;
  j["shard_optimizer"] = world > 1 && o.shard_optimizer;
  j["shard_parameters"] = shard_params;
  if (world > 1) {
    j["gpu_collectives"] = o.gpu_collectives;
    j["ranks_from"] = ranks.pg.source;  // the launcher's variables (", rendezvous through MPI" under mpirun)
  }
  if (lead_ns > 0) j["lead_spin_ms"] = static_cast<double>(lead_ns) / 1e6;
  if (idle_ms > 0) j["idle_ms"] = idle_ms;
  j["router"] = o.balanced_router ? "balanced (probe)" : "real";
  j["prompt_fraction"] = o.prompt_fraction;
  j["tokens_per_s_per_gpu"] = tps;
  j["step_time_s"] = timed_s / static_cast<double>(o.steps);
  j["flops_per_token"] = fpt;
  j["model_tflops_per_gpu"] = tflops;
  j["gemm_ceiling_tflops"] = ceiling;
  j["mfu_vs_ceiling"] = tflops / ceiling;
  j["mfu_vs_989"] = tflops / 989.0;
  if (energy_known && energy_j > 0) {  // rank 0's GPU (lead spins included, as in tokens/s)
    j["energy_j_per_step"] = energy_j / static_cast<double>(o.steps);
    j["mean_power_w"] = energy_j / timed_s;
    j["energy_pj_per_model_flop"] = energy_j / (static_cast<double>(tokens_per_step * o.steps) * fpt) * 1e12;
  }
  j["peak_allocated_bytes"] = static_cast<int64_t>(peaks[0]);
  j["peak_reserved_bytes"] = static_cast<int64_t>(peaks[1]);
  j["peak_tensor_bytes"] = static_cast<int64_t>(peaks[3]);
  j["memory_plan_bytes"] = plan.total;
  j["optimizer_state_bytes"] = static_cast<int64_t>(peaks[2]);  // the largest rank's AdamW state
  j["memory_plan_optimizer_bytes"] = plan.optimizer;
  j["allocator"] = {{"cuda_malloc_calls", mem.cuda_malloc_calls},
                    {"cache_hits", mem.cache_hits},
                    {"cache_releases", mem.cache_releases}};
  nlohmann::ordered_json phases;
  const auto& totals = trainer.model().timer().totals_ms();
  for (int p = 0; p < cuda::kPhaseCount; ++p)
    phases[cuda::phase_name(static_cast<cuda::Phase>(p))] = totals[p] / static_cast<double>(o.steps);
  j["phases_ms"] = phases;
  nlohmann::ordered_json host_phases;
  const auto& host = trainer.model().timer().host_totals_ms();
  for (int p = 0; p < cuda::kPhaseCount; ++p)
    host_phases[cuda::phase_name(static_cast<cuda::Phase>(p))] = host[p] / static_cast<double>(o.steps);
  j["host_phases_ms"] = host_phases;
  nlohmann::ordered_json phase_peaks;  // GiB: the allocator's peak when each phase last raised it
  const auto& phase_peak_bytes = trainer.model().timer().peak_bytes_by_phase();
  for (int p = 0; p < cuda::kPhaseCount; ++p)
    if (phase_peak_bytes[p] > 0)
      phase_peaks[cuda::phase_name(static_cast<cuda::Phase>(p))] = static_cast<double>(phase_peak_bytes[p]) / (1 << 30);
  j["peak_gib_by_phase"] = phase_peaks;
  if (ep) {
    // comm_ms: compute-stream time in the comm phase (collectives on the compute stream, waiting for the
    // slower rank, and the joins of side-stream reduce-scatters). hidden_fraction: 1 - comm_ms / the time
    // this step's bytes take at the probe's rate (0 when nothing overlaps; it cannot see load imbalance).
    const double comm_ms = totals[static_cast<int>(cuda::Phase::comm)] / static_cast<double>(o.steps);
    const double plan_ms = totals[static_cast<int>(cuda::Phase::comm_plan)] / static_cast<double>(o.steps);
    const double bytes = static_cast<double>(a2a_bytes) / static_cast<double>(o.steps);
    const double probe_gbs = probe.contains("gb_per_s") ? probe["gb_per_s"].get<double>() : 0.0;
    const double alone_ms = probe_gbs > 0 ? bytes / (probe_gbs * 1e9) * 1e3 : 0.0;
    const bool gathers = ep->mode() == EpDispatchMode::all_gather;
    j["all_to_all"] = {
        {"mode", ep_dispatch_mode_name(ep->mode())},
        {"bytes_sent_per_step_gpu0", bytes},
        {"comm_ms_per_step", comm_ms},
        {"row_count_exchange_ms_per_step", plan_ms},
        {"host_wait_for_counts_ms_per_step", host_wait_s * 1e3 / static_cast<double>(o.steps)},
        {"host_count_reads_per_step", static_cast<double>(host_reads) / static_cast<double>(o.steps)},
        {"row_budget", {{"headroom", ep->row_budget().headroom()},
                        {"ratio_to_even_share", ep->row_budget().ratio()},
                        {"steps_rerun", reruns}}},
        {"achieved_gb_per_s", comm_ms > 0 ? bytes / (comm_ms * 1e-3) / 1e9 : 0.0},
        {"bytes_at_probe_rate_ms_per_step", alone_ms},
        {"hidden_fraction", alone_ms > 0 ? std::max(0.0, 1.0 - comm_ms / alone_ms) : 0.0},
        {"alone", probe},
        {"note", gathers ? "all_gather mode: tokens and output gradients all-gathered on the compute stream, the "
                           "forward combine reduce-scattered on it, the backward input gradient reduce-scattered "
                           "on a side stream under the expert wgrad; comm_plan is the host read of this rank's "
                           "expert row count"
                         : "all_to_all mode: NCCL send/recv on the compute stream, not overlapped; comm_ms "
                           "(all_to_allv + regroup) includes waiting for the slower rank; the row-count exchange "
                           "(all_gather + host wait) is apart"}};
  }
  j["loss_first"] = loss_first;
  j["loss_last"] = loss_last;
  return j;
}

}  // namespace mt
