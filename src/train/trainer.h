// `mixtune finetune`: the training loop driven by a Recipe.
//   load model (HF dir) + tokenizer + datasets -> for each optimizer step: grad_accum micro-batches,
//   loss = CE sum / valid labels of the whole window + router_aux_loss_coef · aux per micro-batch
//   (the HF Trainer's num_items_in_batch normalisation), global grad norm, NaN/Inf skip, clipping,
//   AdamW at the scheduled lr; metrics.jsonl every step, eval every eval_every steps, checkpoints
//   every every_steps, <checkpoint.dir>/final/ at the end, loss.png drawn from metrics.jsonl.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "train/recipe.h"

namespace mt {

struct FinetuneOptions {
  bool resume = false;                   // continue from <checkpoint.dir>/latest (error if there is none)
  std::function<bool()> stop_requested;  // polled after every optimizer step (SIGINT/SIGTERM)
  // Called once, when set-up (rendezvous, model and data loading, resume) is done and the first step is next:
  // from then on a stop request ends the run at a step boundary with a checkpoint; before it there is nothing
  // to save, so the CLI lets a signal end the process at once (a rank waiting on a rendezvous that never
  // completes must not sit out parallel.timeout_s after Ctrl-C).
  std::function<void()> steps_begin;
  // Called on the lead rank with each step's metrics.jsonl record, after it is written (the library's on_step).
  std::function<void(const nlohmann::ordered_json&)> on_metrics;
  std::FILE* log = stderr;               // progress, warnings
  int progress_tty = -1;                 // -1: decide by isatty(log); 0/1 force
};

struct FinetuneResult {
  int64_t steps = 0;             // optimizer steps completed
  bool interrupted = false;      // stopped by stop_requested (a checkpoint was written)
  double last_loss = 0;
  std::string final_dir;         // "" when interrupted
  std::string last_checkpoint;   // "" when none was written
};

FinetuneResult finetune(const Recipe& recipe, const FinetuneOptions& options);

}  // namespace mt
