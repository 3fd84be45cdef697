#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/exit_policy.h"
#include "core/memory.h"
#include "data/chat_format.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "distributed/communicator.h"
#include "distributed/mpi_bootstrap.h"
#include "distributed/process_group_env.h"
#include "io/hf_cache.h"
#include "models/causal_lm.h"
#include "models/decoder_model.h"
#include "models/hf_checkpoint_map.h"
#include "models/lora_checkpoint.h"
#include "train/expert_load.h"
#include "train/lora_engine.h"
#include "train/lr_schedule.h"
#include "train/metrics_log.h"
#include "train/optimizer_shards.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/shared_save.h"
#include "train/tensorboard_log.h"
#include "train/train_checkpoint.h"
#include "train/train_engine.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

using Clock = std::chrono::steady_clock;

// The recipe settings that decide which batches a step sees and how parameters are stored: a resume
// with any of them changed would not continue the same run, so it is refused. (lr, schedule, clipping,
// max_steps, eval and checkpoint settings may change between resumes.)
nlohmann::json recipe_identity(const Recipe& r, int world) {
  nlohmann::json j;
  j["world_size"] = world;  // ranks x grad_accum micro-batches per step
  j["model.dtype"] = r.model.dtype;
  j["data.train"] = fs::absolute(r.data.train).lexically_normal().string();
  j["data.seq_len"] = r.data.seq_len;
  j["data.pack"] = r.data.pack;
  j["data.truncation"] = r.data.truncation;
  j["train.micro_batch_size"] = r.train.micro_batch_size;
  j["train.grad_accum"] = r.train.grad_accum;
  j["train.seed"] = r.train.seed;
  j["optimizer.master_weights"] = r.optimizer.master_weights;
  if (r.peft.enabled) {  // a LoRA run resumes its adapter; the base comes from model.path again
    j["model.path"] = r.model.path;
    if (!r.peft.target.empty()) {
      std::vector<std::string> t = r.peft.target;
      std::sort(t.begin(), t.end());
      j["peft"] = {{"r", r.peft.r}, {"alpha", r.peft.alpha}, {"use_rslora", r.peft.use_rslora}, {"target", t}};
    }
  }
  return j;
}

// What LoRA training does not do yet, refused before any loading.
void lora_refusals(const Recipe& r, int world) {
  if (!r.peft.enabled) return;
  if (world > 1)
    fail("{}: peft: LoRA training runs in one process so far ({} ranks found; data and expert parallelism with "
         "adapters are not built)",
         r.file, world);
  if (r.parallel.ep > 1) fail("{}: parallel.ep: LoRA training does not support expert parallelism yet", r.file);
}

void identity_check(const nlohmann::json& recipe, const nlohmann::json& saved, const std::string& ckpt) {
  for (const auto& [key, value] : recipe.items()) {
    if (key == "world_size" && !saved.contains(key) && value == 1) continue;  // written before multi-process jobs
    if (!saved.contains(key)) fail("{}: trainer_state.json: identity.{}: missing", ckpt, key);
    if (saved[key] != value)
      fail("cannot resume from {}: {} is {} in the recipe but was {} when the checkpoint was written", ckpt, key,
           value.dump(), saved[key].dump());
  }
}

Batch batch_of(const MicroBatch& mb) {
  Batch b;
  b.input_ids = mb.input_ids;
  b.labels = mb.labels;
  b.position_ids = mb.position_ids;
  return b;
}

int32_t pad_id_of(const DecoderSpec& cfg, const Tokenizer* tok) {
  if (cfg.raw.contains("pad_token_id") && cfg.raw["pad_token_id"].is_number_integer()) {
    const int64_t id = cfg.raw["pad_token_id"].get<int64_t>();
    if (id >= 0 && id < cfg.vocab_size) return static_cast<int32_t>(id);
  }
  if (tok)
    if (auto id = tok->token_to_id("<|endoftext|>"); id && *id < cfg.vocab_size) return *id;
  return 0;
}

struct EvalResult {
  double ce_loss = 0, aux_loss = 0;
  int64_t tokens = 0;
};

// Token-weighted CE over the whole eval set (no shuffling, one pass), and the mean aux loss per batch.
EvalResult evaluate(TrainEngine& engine, const Dataset& data, LoaderOptions lo) {
  lo.shuffle = false;
  lo.epochs = 1;
  DataLoader loader(data, lo);
  MicroBatch mb;
  EvalResult r;
  double ce_sum = 0, aux_sum = 0;
  int64_t batches = 0;
  while (loader.next(mb)) {
    const EngineEval e = engine.eval(batch_of(micro_batch_trimmed(mb, trimmed_columns(mb.longest_row, lo.seq_len))));
    ce_sum += e.ce_sum;
    aux_sum += e.aux_loss;
    r.tokens += e.tokens;
    ++batches;
  }
  r.ce_loss = r.tokens > 0 ? ce_sum / static_cast<double>(r.tokens) : 0;
  r.aux_loss = batches > 0 ? aux_sum / static_cast<double>(batches) : 0;
  return r;
}

std::string dataset_summary(const char* what, const DatasetOptions& o, const DatasetStats& s) {
  return fmt::format("{} data {}: {} examples, {} tokens ({} trained){}{}{}", what, o.path, s.examples, s.tokens,
                     s.trained_tokens, s.from_cache ? ", from cache" : "",
                     s.skipped_bad_lines ? fmt::format(", {} malformed lines skipped", s.skipped_bad_lines) : "",
                     s.truncated || s.dropped_too_long
                         ? fmt::format(", {} truncated, {} dropped as too long", s.truncated, s.dropped_too_long)
                         : "");
}

// Every rank reads the whole accumulation window of all ranks into host memory (three int64 [rows, seq_len]
// tensors per micro-batch) before training on its share. A window past half of this machine's memory is a
// recipe error, said before any loading, instead of an out-of-memory kill in the middle of the first step.
void check_window_fits_host(const Recipe& r, int world) {
  const double tokens = static_cast<double>(r.train.grad_accum) * world * static_cast<double>(r.train.micro_batch_size) *
                        static_cast<double>(r.data.seq_len);
  const double bytes = tokens * 3 * sizeof(int64_t);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double host = static_cast<double>(pages) * static_cast<double>(page);
  if (bytes > host / 2)
    fail("train.grad_accum {} x train.micro_batch_size {} x data.seq_len {} x {} rank{} = {:.4g} tokens per optimizer "
         "step: every rank holds them in host memory ({:.1f} GiB), more than half of this machine's {:.1f} GiB; lower "
         "train.grad_accum, train.micro_batch_size or data.seq_len",
         r.train.grad_accum, r.train.micro_batch_size, r.data.seq_len, world, world == 1 ? "" : "s", tokens,
         bytes / 1073741824.0, host / 1073741824.0);
}

}  // namespace

FinetuneResult finetune(const Recipe& r, const FinetuneOptions& o) {
  // A multi-process job (mixtune launch, mpirun, srun): every rank runs this function; rank 0 alone prints,
  // writes metrics and checkpoints. The rendezvous comes first, so no rank touches the run directory
  // before all have started.
  const ProcessGroupEnv pg = mpi_bootstrap(process_group_env_from_environment());
  std::unique_ptr<Communicator> comm;
  if (pg.world > 1) comm = tcp_communicator_create(pg, std::chrono::seconds(r.parallel.timeout_s));
  check_window_fits_host(r, pg.world);
  lora_refusals(r, pg.world);
  const bool lead = pg.rank == 0;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> quiet(lead ? nullptr : std::fopen("/dev/null", "w"), &std::fclose);
  std::FILE* log = lead ? o.log : quiet.get();
  if (!log) fail("rank {}: cannot open /dev/null", pg.rank);
  const bool tty = lead && (o.progress_tty >= 0 ? o.progress_tty == 1 : isatty(fileno(o.log)) == 1);
  ProgressReporter progress(log, tty, r.train.log_every);
  if (comm)
    progress.message(fmt::format("{} ranks ({}), data parallel: {} micro-batches per step{}",
                                 pg.world, pg.source, pg.world * r.train.grad_accum,
                                 r.parallel.ep > 1 ? fmt::format(", experts split over groups of {} ranks",
                                                                 r.parallel.ep)
                                                   : std::string()));
  const fs::path run_dir = r.checkpoint.dir;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) fail("checkpoint.dir: cannot create {}: {}", run_dir.string(), ec.message());
  // One writer per run directory (train/run_dir.h): rank 0 holds the lock until this function returns and
  // removes what killed runs left; every rank learns the outcome before any reads the directory.
  RunDirLock run_lock;
  {
    std::string why;
    if (lead) {
      try {
        run_lock = run_dir_lock(run_dir.string());
        if (!run_lock.warning.empty()) progress.message(run_lock.warning);
        const std::string swept =
            run_dir_leftovers_summary(run_dir.string(), run_dir_remove_leftovers(run_dir.string()));
        if (!swept.empty()) progress.message(swept);
      } catch (const Error& e) {
        why = e.what();
      }
    }
    if (comm) {
      double failed = why.empty() ? 0.0 : 1.0;
      comm->all_reduce_sum(&failed, 1, "all_reduce(run directory taken by rank 0)");
      if (failed > 0 && why.empty())
        fail("rank {}: rank 0 could not take checkpoint.dir {} (see its error)", pg.rank, run_dir.string());
    }
    if (!why.empty()) fail("{}", why);
  }

  // Resume point (or refuse to start over an existing run by accident).
  TrainerState st;
  st.identity = recipe_identity(r, pg.world);
  const std::string latest = train_checkpoint_latest(run_dir.string());
  std::string resume_dir;
  if (o.resume) {
    if (latest.empty())
      fail("--resume: {} has no checkpoint to resume from (no 'latest' file)", run_dir.string());
    resume_dir = latest;
    TrainerState saved = train_state_read(resume_dir);
    identity_check(st.identity, saved.identity, resume_dir);
    saved.identity = st.identity;
    st = saved;
  } else if (!latest.empty()) {
    fail("checkpoint.dir: {} already holds a run (latest: {}); pass --resume to continue it, or choose another "
         "directory",
         run_dir.string(), fs::path(latest).filename().string());
  }

  // The engine first (from the model's config): an expert-parallel rank then reads only its experts.
  // A LoRA checkpoint holds the adapter, not the model: the base comes from model.path.
  const std::string model_src = resume_dir.empty() || r.peft.enabled ? r.model.path : resume_dir;
  const std::string model_dir = hf_resolve_model_path(model_src);
  const fs::path config_path = fs::path(model_dir) / "config.json";
  if (!fs::exists(config_path)) fail("{}: no config.json in the model directory", model_dir);
  const DecoderSpec model_cfg = DecoderSpec::from_file(config_path.string());
  expert_bias_recipe_check(r, model_cfg);  // before the model loads
  std::string device_why;
  // Every rank must agree on the engine (a rank on the CPU and another on a GPU cannot share collectives).
  int device = train_device_resolve(r, model_cfg, &device_why, pg.local_rank, comm ? std::max(pg.local_world, 1) : 1);
  if (r.peft.enabled && device >= 0)  // an adapter the GPU cannot train: said before the model loads
    if (const std::string no = lora_gpu_unsupported(r, model_cfg, resume_dir); !no.empty()) {
      if (r.train.device != "auto") fail("{}: train.device: '{}': {} (or train on the CPU)", r.file, r.train.device, no);
      device = -1;
      device_why = no;
    }
  if (comm) {
    double on_gpu[2] = {device >= 0 ? 1.0 : 0.0, 1.0};
    comm->all_reduce_sum(on_gpu, 2, "all_reduce(engine choice)");
    if (on_gpu[0] != 0 && on_gpu[0] != on_gpu[1])
      fail("rank {}: train.device {}: {} of {} ranks found a usable GPU; every rank needs one (or set train.device: "
           "cpu)",
           pg.rank, r.train.device, static_cast<int>(on_gpu[0]), pg.world);
  }

  // Model, tokenizer, data.
  LoadOptions lo;
  lo.dtype = r.model.dtype == "float32" ? DType::F32 : DType::BF16;
  const int64_t ep = r.parallel.ep;
  if (comm && ep > 1 && pg.world % ep == 0 && model_cfg.num_experts() % ep == 0) {
    // Its expert-parallel group is ranks of consecutive numbers; its experts [g·E/ep, (g+1)·E/ep), g = rank % ep.
    // The CPU engine trains on the host copy, so it holds those experts only; the GPU's host copy keeps all E
    // rows (the others never written). (A layout that does not divide is refused by the engine.)
    lo.expert_count = model_cfg.num_experts() / ep;
    lo.expert_first = (pg.rank % ep) * lo.expert_count;
    lo.compact_experts = device < 0;
  }
  // ZeRO-3: a rank reads only the replicated parameters it owns (the owners depend on names and sizes only).
  OptimizerShards load_owners;
  if (comm && pg.world > 1 && r.parallel.shard_parameters && r.parallel.shard_optimizer) {
    load_owners = optimizer_shards_for(ModelWeights::absent_like_config(model_cfg, DType::BF16), pg.world,
                                       pg.rank, ep);
    // The expert stacks: every replica reads its experts.
    lo.skip_param = [&load_owners](const std::string& name) { return !load_owners.keeps_weights(name); };
  }
  CausalLM lm = CausalLM::from_pretrained(model_src, lo);
  const DecoderSpec& cfg = lm.config;
  const std::string tok_dir = r.data.tokenizer.empty() ? hf_resolve_model_path(r.model.path) : r.data.tokenizer;
  std::unique_ptr<Tokenizer> tokenizer;
  if (fs::is_regular_file(fs::path(tok_dir) / "tokenizer.json")) {
    tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_file((fs::path(tok_dir) / "tokenizer.json").string()));
  } else if (!r.data.tokenizer.empty()) {
    fail("data.tokenizer: {} has no tokenizer.json", tok_dir);
  }
  DatasetOptions dopt;
  dopt.path = r.data.train;
  dopt.seq_len = r.data.seq_len;
  dopt.truncation = r.data.truncation;
  dopt.skip_bad_lines = r.data.skip_bad_lines;
  dopt.cache_dir = (run_dir / "data-cache").string();
  // The tokenizer directory's chat template picks the chat layout of chat lines (chat_format.h). One mixtune
  // cannot mark for answer-only loss leaves them on the built-in Qwen3 template, as before, and says so.
  if (std::string tmpl = chat_template_from_model_dir(tok_dir); !tmpl.empty()) {
    if (chat_format_of(tmpl))
      dopt.chat_template = std::move(tmpl);
    else
      progress.message(fmt::format("{}: its chat template is not a layout mixtune can mark for answer-only loss ({}); "
                                   "chat lines, if any, use the built-in Qwen3 template", tok_dir, chat_format_names()));
  }
  // Rank 0 builds the dataset cache before the others read it.
  if (comm && !lead) comm->barrier("barrier(dataset cache written)");
  const Dataset train_data = Dataset::load(dopt, tokenizer.get(), cfg.vocab_size);
  progress.message(dataset_summary("train", dopt, train_data.stats()));
  std::unique_ptr<Dataset> eval_data;
  DatasetOptions eopt = dopt;
  if (!r.data.eval.empty()) {
    eopt.path = r.data.eval;
    eval_data = std::make_unique<Dataset>(Dataset::load(eopt, tokenizer.get(), cfg.vocab_size));
    progress.message(dataset_summary("eval", eopt, eval_data->stats()));
  }

  if (comm && lead) comm->barrier("barrier(dataset cache written)");

  LoaderOptions lopt;
  lopt.micro_batch_size = r.train.micro_batch_size;
  lopt.seq_len = r.data.seq_len;
  lopt.pack = r.data.pack;
  lopt.shuffle = true;
  lopt.seed = r.train.seed;
  // As the HF Trainer: max_steps > 0 overrides epochs (the data repeats as often as needed).
  lopt.epochs = r.train.max_steps > 0 ? std::numeric_limits<int64_t>::max() / 4 : r.train.epochs;
  lopt.pad_id = pad_id_of(cfg, tokenizer.get());
  DataLoader loader(train_data, lopt);
  const int64_t batches_per_epoch = loader.batches_per_epoch();
  const int64_t total_steps =
      r.train.max_steps > 0 ? r.train.max_steps
                            : std::max<int64_t>(1, (batches_per_epoch * r.train.epochs + r.train.grad_accum - 1) /
                                                       r.train.grad_accum);

  // A multi-rank GPU job abandons its engine if an error propagates (core/exit_policy.h): destroying NCCL
  // communicators and device memory can wait forever on the peer that failed.
  if (comm && device >= 0) set_exit_fast_on_error(true);
  struct AbandonOnError {
    void operator()(TrainEngine* e) const {
      if (exit_fast_on_error() && std::uncaught_exceptions() > 0) return;
      delete e;
    }
  };
  std::unique_ptr<TrainEngine, AbandonOnError> engine(
      r.peft.enabled && device < 0 ? cpu_lora_engine_create(lm, r, lora_adapter_for_run(r, lm, resume_dir)).release()
      : r.peft.enabled
          ? cuda_engine_hooks()->create_lora(lm, r, lora_adapter_for_run(r, lm, resume_dir), device, log).release()
      : device < 0 ? cpu_engine_create(lm, r, comm.get()).release()
                   : cuda_engine_hooks()->create(lm, r, device, log, comm.get()).release());
  progress.message(fmt::format("device: {}{}", engine->device_name(),
                               r.train.device == "auto" ? " (train.device auto: " + device_why + ")" : ""));
  if (const OptimizerShards& sh = engine->optimizer_shards(); sh.active()) {
    std::vector<double> kept(static_cast<size_t>(pg.world), 0.0);  // every rank's optimizer-state bytes
    kept[static_cast<size_t>(pg.rank)] = static_cast<double>(engine->optimizer_state_bytes());
    comm->all_reduce_sum(kept.data(), pg.world, "all_reduce(optimizer state bytes of every rank)");
    progress.message(fmt::format(
        "optimizer state of the replicated parameters sharded over {} ranks (ZeRO-1){}{}; the largest rank keeps "
        "{:.2f} MiB",
        sh.world(),
        sh.experts_sharded() ? fmt::format(", the experts' over their {} replicas", sh.replicas().size()) : "",
        r.parallel.shard_parameters ? fmt::format(", the parameters too (ZeRO-3, reshard after forward: {}{})",
                                                  r.parallel.reshard_after_forward ? "yes" : "no",
                                                  sh.experts_sharded() ? "; the expert stacks over their replicas" : "")
                                    : "",
        *std::max_element(kept.begin(), kept.end()) / (1 << 20)));
  }

  // Saves: in a job of several ranks every rank writes what it holds into the shared files (train/shared_save.h:
  // no rank gathers the model); alone, the one process writes everything.
  FinetuneResult result;
  const SaveShare share =
      comm ? save_share_for(comm.get(), pg.rank, pg.world, ep, lm.weights.table,
                            hf_name_map_of(lm.config, *lm.weights.table, lm.dtype), engine->optimizer_shards())
           : SaveShare{};
  // Said before a save that will not fit starts writing (it then fails cleanly: train_checkpoint.h).
  auto warn_space = [&](const std::string& what, uint64_t bytes) {
    if (!lead) return;
    if (const std::string w = run_dir_space_warning(run_dir.string(), what, bytes); !w.empty()) progress.message(w);
  };
  auto save_checkpoint = [&] {
    engine->weights_to_host();  // every rank: the tensors (or expert rows) it writes
    auto state = engine->optimizer_state_host();
    if (const LoraWeights* adapter = engine->lora()) {  // the adapter (PEFT's files) instead of the model
      result.last_checkpoint = train_checkpoint_save(
          run_dir.string(),
          [&](const std::string& dir) { lora_write_files(dir, cfg, *adapter, lm.weights, r.model.path); },
          static_cast<uint64_t>(lora_parameter_count(*adapter->table)) * 4, state, st, r.checkpoint.keep_last);
      progress.message(fmt::format("checkpoint: {}", result.last_checkpoint));
      return;
    }
    warn_space(train_checkpoint_name(st.step), train_checkpoint_bytes(lm, state));
    if (comm)
      result.last_checkpoint =
          train_checkpoint_save_shared(share, run_dir.string(), lm, state, st, r.checkpoint.keep_last);
    else
      result.last_checkpoint = train_checkpoint_save(run_dir.string(), lm, state, st, r.checkpoint.keep_last);
    progress.message(fmt::format("checkpoint: {}", result.last_checkpoint));
  };

  if (!resume_dir.empty()) {
    engine->optimizer_state_load(resume_dir);
    engine->set_optimizer_steps(st.optimizer_steps);
    loader.restore(st.loader);
    progress.message(fmt::format("resumed from {} at step {}", resume_dir, st.step));
  }
  LrSchedule sched;
  sched.name = r.schedule.name;
  sched.peak_lr = r.optimizer.lr;
  sched.warmup_steps = r.schedule.warmup_steps;
  sched.total_steps = total_steps;
  sched.min_lr_ratio = r.schedule.min_lr_ratio;

  std::optional<MetricsLog> metrics;
  if (lead) metrics.emplace((run_dir / "metrics.jsonl").string(), resume_dir.empty() ? -1 : st.step);
  // The same records as TensorBoard scalars. Like the loss plot, a view of metrics.jsonl: a failure warns
  // once and the run goes on without it. A resume starts a new event file whose SessionLog START at the
  // next step makes TensorBoard drop what an interrupted run wrote past its checkpoint.
  std::optional<TensorBoardLog> tensorboard;
  auto tensorboard_off = [&](const std::exception& e) {
    progress.message(fmt::format("warning: no TensorBoard events from here on: {}", e.what()));
    tensorboard.reset();
  };
  if (lead) {
    try {
      tensorboard.emplace((run_dir / "tensorboard").string(), st.step + 1, !resume_dir.empty());
    } catch (const std::exception& e) {
      tensorboard_off(e);
    }
  }
  auto record_step = [&](const nlohmann::ordered_json& rec) {
    if (metrics) {
      metrics->append(rec);
      if (o.on_metrics) o.on_metrics(rec);
    }
    if (!tensorboard) return;
    try {
      tensorboard->scalars(st.step, tensorboard_scalars_of_metrics(rec));
    } catch (const std::exception& e) {
      tensorboard_off(e);
    }
  };
  progress.message(fmt::format("model {}: {} parameters ({}), {} steps of {} x {} micro-batches x {} tokens",
                               r.model.path,
                               // the whole model's (an expert-parallel CPU rank holds only its experts)
                               ModelWeights::absent_like_config(cfg, lm.dtype).parameter_count(), r.model.dtype,
                               total_steps,
                               r.train.grad_accum, r.train.micro_batch_size, r.data.seq_len));
  if (const LoraWeights* adapter = engine->lora()) {
    int64_t full = 0;
    for (const std::string& n : adapter->table->full) full += shape_numel(lm.weights.param_table().find(n)->shape);
    const LoraConfig& lc = adapter->table->config;
    progress.message(fmt::format("LoRA r {} alpha {} (scaling {:.4g}) on {}: {} adapter parameters{}; the base is "
                                 "frozen{}",
                                 lc.r, lc.alpha, lc.scaling(), fmt::join(lc.target, ", "),
                                 lora_parameter_count(*adapter->table),
                                 full ? fmt::format(" + {} trained in full", full) : std::string(),
                                 resume_dir.empty() && !r.model.adapter.empty() ? ", adapter from " + r.model.adapter
                                                                               : std::string()));
  }

  int64_t last_saved_step = resume_dir.empty() ? -1 : st.step;
  if (o.steps_begin) o.steps_begin();
  std::deque<double> recent_step_seconds;
  std::vector<MicroBatch> window;
  bool data_done = false;
  while (st.step < total_steps && !data_done) {
    const auto t0 = Clock::now();
    window.clear();
    // Every rank reads the whole global window (grad_accum micro-batches per rank) in the same order and
    // trains on micro-batches rank, rank + world, ...: one rank with grad_accum x world sees the same
    // batches, and the loader position is the same on every rank.
    for (int64_t i = 0; i < r.train.grad_accum * pg.world; ++i) {
      MicroBatch mb;
      if (!loader.next(mb)) {
        data_done = true;
        break;
      }
      window.push_back(std::move(mb));
    }
    if (window.empty()) break;
    // Padding past the longest row is not computed: each group of peers (the micro-batches the ranks run
    // at the same point, window[first .. first + world)) is cut to its longest row, the same width on
    // every rank, so expert parallelism keeps its uniform exchanges.
    for (size_t first = 0; first < window.size(); first += static_cast<size_t>(pg.world)) {
      const size_t last = std::min(first + static_cast<size_t>(pg.world), window.size());
      int64_t longest = 0;
      for (size_t j = first; j < last; ++j) longest = std::max(longest, window[j].longest_row);
      const int64_t columns = trimmed_columns(longest, r.data.seq_len);
      for (size_t j = first; j < last; ++j) window[j] = micro_batch_trimmed(window[j], columns);
    }
    const bool lockstep = r.parallel.ep > 1 || (pg.world > 1 && r.parallel.shard_parameters);
    if (lockstep && static_cast<int64_t>(window.size()) < r.train.grad_accum * pg.world) {
      // Expert parallelism and sharded parameters need every rank to run the same micro-batches count (each
      // MoE layer, each parameter fetch is a collective): the last, partial window of the data is not trained.
      progress.message(fmt::format("the data ends with a partial window of {} micro-batches for {} ranks: not "
                                   "trained ({} needs the same count on every rank)",
                                   window.size(), pg.world,
                                   r.parallel.ep > 1 ? fmt::format("parallel.ep {}", r.parallel.ep)
                                                     : std::string("parallel.shard_parameters")));
      break;
    }
    // HF Trainer: num_items_in_batch = valid labels of the whole accumulation window (all ranks).
    int64_t window_labels = 0, window_tokens = 0;
    for (const auto& mb : window) {
      window_labels += mb.valid_labels;
      window_tokens += mb.input_ids.numel();
    }
    std::vector<Batch> batches;
    const size_t world = static_cast<size_t>(pg.world);
    for (size_t i = static_cast<size_t>(pg.rank); i < window.size(); i += world) {
      batches.push_back(batch_of(window[i]));
      // This micro-batch's peers on the other ranks: window[first .. first + world).
      const size_t first = i - i % world;
      for (size_t j = first; j < std::min(first + world, window.size()); ++j)
        batches.back().uniform_across_ranks &= window[j].input_ids.numel() == window[i].input_ids.numel();
      if (window.size() < first + world) batches.back().uniform_across_ranks = false;
    }
    const double lr = lr_at(sched, st.step);
    // HF Trainer: the CE of every micro-batch is divided by the valid labels of the whole window.
    const EngineStep es =
        engine->step(batches, static_cast<double>(std::max<int64_t>(1, window_labels)), lr, r.clip.max_grad_norm);
    const double loss = es.loss, ce = es.ce_loss, aux = es.aux_loss, grad_norm = es.grad_norm;
    const bool finite = es.finite;
    st.nonfinite_streak = finite ? 0 : st.nonfinite_streak + 1;
    ++st.step;
    st.optimizer_steps = engine->optimizer_steps();
    st.loader = loader.position();
    st.tokens_seen += window_tokens;
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    recent_step_seconds.push_back(seconds);
    if (recent_step_seconds.size() > 20) recent_step_seconds.pop_front();
    double avg = 0;
    for (double s : recent_step_seconds) avg += s;
    avg /= static_cast<double>(recent_step_seconds.size());

    nlohmann::ordered_json rec;
    rec["step"] = st.step;
    rec["loss"] = finite ? nlohmann::ordered_json(loss) : nlohmann::ordered_json(nullptr);
    rec["ce_loss"] = std::isfinite(ce) ? nlohmann::ordered_json(ce) : nlohmann::ordered_json(nullptr);
    rec["aux_loss"] = std::isfinite(aux) ? nlohmann::ordered_json(aux) : nlohmann::ordered_json(nullptr);
    rec["grad_norm"] = std::isfinite(grad_norm) ? nlohmann::ordered_json(grad_norm) : nlohmann::ordered_json(nullptr);
    rec["lr"] = lr;
    rec["tokens"] = window_tokens;
    rec["trained_tokens"] = window_labels;
    rec["tokens_per_s"] = seconds > 0 ? static_cast<double>(window_tokens) / seconds : 0.0;
    rec["peak_memory_bytes"] = engine->peak_memory_bytes();
    rec["peak_reserved_bytes"] = engine->peak_reserved_bytes();
    if (es.expert_load_max_over_mean > 0) rec["expert_load_max_over_mean"] = es.expert_load_max_over_mean;
    rec["epoch"] = st.loader.epoch;
    if (!finite) rec["skipped"] = true;

    StepReport rep;
    rep.step = st.step;
    rep.total_steps = total_steps;
    rep.loss = loss;
    rep.lr = lr;
    rep.grad_norm = grad_norm;
    rep.tokens_per_s = rec["tokens_per_s"].get<double>();
    rep.seconds_per_step = avg;
    rep.skipped = !finite;
    rep.expert_load = es.expert_load_max_over_mean;
    if (!finite) {
      progress.message(fmt::format("warning: step {}: non-finite {} ({} in a row); the update was skipped",
                                   st.step, std::isfinite(loss) ? "gradients" : "loss", st.nonfinite_streak));
      if (st.nonfinite_streak >= r.train.max_nonfinite_steps) {
        record_step(rec);
        fail("training diverged: {} consecutive steps with a non-finite loss or gradients (last: step {}); lower "
             "optimizer.lr, enable clip.max_grad_norm or check the data (train.max_nonfinite_steps = {})",
             st.nonfinite_streak, st.step, r.train.max_nonfinite_steps);
      }
    }
    if (eval_data && r.train.eval_every > 0 && st.step % r.train.eval_every == 0) {
      const EvalResult e = evaluate(*engine, *eval_data, lopt);
      rec["eval_loss"] = e.ce_loss;
      rec["eval_aux_loss"] = e.aux_loss;
      rec["eval_tokens"] = e.tokens;
      progress.message(fmt::format("step {}: eval_loss {:.4f} over {} tokens", st.step, e.ce_loss, e.tokens));
    }
    record_step(rec);
    progress.step(rep);
    result.last_loss = loss;

    bool stop = o.stop_requested && o.stop_requested();
    if (comm) {  // every rank stops after the same step (a signal may reach the ranks at different times)
      double any = stop ? 1.0 : 0.0;
      comm->all_reduce_sum(&any, 1, fmt::format("all_reduce(stop request, step {})", st.step));
      stop = any > 0;
    }
    const bool periodic = r.checkpoint.every_steps > 0 && st.step % r.checkpoint.every_steps == 0;
    if ((periodic && st.step < total_steps) || stop) {
      save_checkpoint();
      last_saved_step = st.step;
    }
    if (stop) {
      progress.finish();
      progress.message(fmt::format("interrupted at step {}; continue with --resume", st.step));
      result.steps = st.step;
      result.interrupted = true;
      return result;
    }
  }
  progress.finish();
  result.steps = st.step;
  // The end state is also a resumable checkpoint when periodic checkpoints are on (a later --resume with a
  // larger max_steps continues from it).
  if (r.checkpoint.every_steps > 0 && last_saved_step != st.step)
    save_checkpoint();
  else
    engine->weights_to_host();
  result.final_dir = (run_dir / "final").string();
  if (const LoraWeights* adapter = engine->lora()) {
    lora_save_pretrained(result.final_dir, cfg, *adapter, lm.weights, r.model.path);
  } else if (warn_space("final", train_checkpoint_bytes(lm, {})); comm) {
    shared_dir_save(
        share, result.final_dir, [&](const std::string& tmp) { lm.write_pretrained_layout(tmp); },
        [&](const std::string& tmp) {
          lm.write_pretrained_rows(tmp, [&](const std::string& n, const Tensor& t) { return share.model_rows(n, t); });
        });
  } else {
    lm.save_pretrained(result.final_dir);
  }
  if (!lead) return result;
  progress.message(fmt::format("final {}: {}", engine->lora() ? "adapter (PEFT format)" : "model", result.final_dir));
  const std::string why = loss_plot_write((run_dir / "metrics.jsonl").string(), (run_dir / "loss.png").string());
  if (why.empty())
    progress.message(fmt::format("loss curve: {}", (run_dir / "loss.png").string()));
  else
    progress.message("warning: no loss plot: " + why);
  if (tensorboard) progress.message(fmt::format("TensorBoard: tensorboard --logdir {}", run_dir.string()));
  return result;
}

}  // namespace mt
