#include "train/evaluate.h"

#include <cstring>

#include "core/error.h"
#include "models/decoder_model.h"

namespace mt {

namespace {
Tensor i64_tensor(const std::vector<const std::vector<int64_t>*>& rows, int64_t len) {
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size()), len}, DType::I64);
  for (size_t r = 0; r < rows.size(); ++r)
    std::memcpy(t.data_as<int64_t>() + r * len, rows[r]->data(), len * sizeof(int64_t));
  return t;
}

Batch make_batch(const std::vector<const TokenRecord*>& recs) {
  const int64_t len = static_cast<int64_t>(recs[0]->input_ids.size());
  std::vector<const std::vector<int64_t>*> ids, labels, pos;
  bool any_pos = false;
  for (const auto* r : recs) any_pos = any_pos || !r->position_ids.empty();
  std::vector<std::vector<int64_t>> default_pos;
  default_pos.reserve(recs.size());
  for (const auto* r : recs) {
    ids.push_back(&r->input_ids);
    labels.push_back(&r->labels);
    if (any_pos) {
      if (r->position_ids.empty()) {
        default_pos.emplace_back(len);
        for (int64_t i = 0; i < len; ++i) default_pos.back()[i] = i;
        pos.push_back(&default_pos.back());
      } else {
        pos.push_back(&r->position_ids);
      }
    }
  }
  Batch b;
  b.input_ids = i64_tensor(ids, len);
  b.labels = i64_tensor(labels, len);
  if (any_pos) b.position_ids = i64_tensor(pos, len);
  return b;
}
}  // namespace

ScoreResult score_records(CausalLM& model, const std::vector<TokenRecord>& records, bool want_logits,
                          const LoraWeights* adapter) {
  MT_CHECK(!records.empty(), "score of no records");
  ModelOptions mo;
  mo.lora = adapter;
  DecoderModel net(model.config, model.weights, mo);
  bool uniform = true;
  for (const auto& r : records) uniform = uniform && r.input_ids.size() == records[0].input_ids.size();
  std::vector<std::vector<const TokenRecord*>> batches;
  if (uniform) {
    batches.emplace_back();
    for (const auto& r : records) batches.back().push_back(&r);
  } else {
    for (const auto& r : records) batches.push_back({&r});
  }
  ScoreResult out;
  double ce_sum = 0, aux_sum = 0;
  int64_t total_tokens = 0;
  for (const auto& r : records) total_tokens += static_cast<int64_t>(r.input_ids.size());
  const int64_t vocab = model.config.vocab_size;
  if (want_logits) {
    out.logits = uniform ? Tensor::empty({static_cast<int64_t>(records.size()),
                                          static_cast<int64_t>(records[0].input_ids.size()), vocab},
                                         DType::F32)
                         : Tensor::empty({total_tokens, vocab}, DType::F32);
  }
  int64_t row = 0;
  for (const auto& recs : batches) {
    ForwardResult fr = net.forward(make_batch(recs), want_logits);
    if (fr.tokens) ce_sum += fr.ce_loss * static_cast<double>(fr.tokens);
    out.tokens += fr.tokens;
    aux_sum += fr.aux_loss;
    if (want_logits) {
      std::memcpy(static_cast<char*>(out.logits.data()) + row * vocab * sizeof(float), fr.logits.data(),
                  fr.logits.nbytes());
      row += fr.logits.numel() / vocab;
    }
  }
  out.ce_loss = out.tokens ? ce_sum / static_cast<double>(out.tokens) : 0.0;
  out.aux_loss = aux_sum / static_cast<double>(batches.size());
  const bool with_aux = model.config.aux_loss_on();
  out.loss = out.ce_loss + (with_aux ? model.config.aux_loss_coef() * out.aux_loss : 0.0);
  return out;
}

}  // namespace mt
