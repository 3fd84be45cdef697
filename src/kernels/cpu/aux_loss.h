// Load-balancing aux loss of Qwen3-MoE (load_balancing_loss_func, hf-numerics.md §1.5), over the
// router logits of every MoE layer with one global average over (layers × tokens):
//   p = softmax(logits) (bf16 mode: rounded to bf16, as softmax without dtype on bf16 logits)
//   f_e = #{rows whose top-k of p holds e} / rows,  P_e = Σ p[·, e] / rows (bf16 mode: P_e rounded to bf16,
//   torch.mean of a bf16 tensor),  aux = E · Σ_e f_e · P_e.   Uniform routing gives aux = k.
// The gradient flows only through P_e (f_e is a count).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace mt::cpu {

struct AuxLossSaved {
  std::vector<double> fraction;  // f_e, [E]
  int64_t rows = 0;              // layers × tokens
};

// logits: per MoE layer F32 [T, E]. Returns aux (0 when there are no rows).
double aux_loss_forward(const std::vector<Tensor>& logits, int64_t top_k, bool bf16, AuxLossSaved* saved);

// dlogits[l] F32 [T, E] += daux · d(aux)/d(logits[l]) (fp32 math on the recomputed softmax).
void aux_loss_backward(double daux, const std::vector<Tensor>& logits, const AuxLossSaved& saved, bool bf16,
                       std::vector<Tensor>& dlogits);

}  // namespace mt::cpu
