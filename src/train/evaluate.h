// Scoring pre-tokenized records with a model (no gradients): what `mixtune score` prints and the
// eval loss of training.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "data/token_jsonl.h"
#include "models/causal_lm.h"
#include "models/lora_adapter.h"

namespace mt {

struct ScoreResult {
  double loss = 0;      // ce_loss + router_aux_loss_coef * aux_loss (when the config records router logits)
  double ce_loss = 0;   // mean over every valid (shifted) label of all records
  double aux_loss = 0;  // mean of the per-batch load-balancing losses (0 when not computed)
  int64_t tokens = 0;   // valid shifted labels
  Tensor logits;        // F32 [B, S, V] when all records have one length, else [total tokens, V]
};

// Records of equal length form one batch [B, S] (exactly Transformers' forward on that batch);
// otherwise each record is its own batch and the CE is token-weighted over all of them.
// adapter (optional): a LoRA adapter on the model (models/lora_adapter.h), run unmerged as PEFT runs it.
ScoreResult score_records(CausalLM& model, const std::vector<TokenRecord>& records, bool want_logits,
                          const LoraWeights* adapter = nullptr);

}  // namespace mt
