// Token embedding lookup and its scatter-add gradient.
#pragma once
#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace mt::cpu {

// ids I64 [N] (any shape; values must be in [0, V), checked), table F32|BF16 [V, H] -> F32 [N, H].
Tensor embedding_forward(const Tensor& ids, const Tensor& table);
// dtable F32 [V, H] += scatter-add of dout F32 [N, H] rows at ids (serial over tokens: fixed order).
// padding_idx (in [0, V), checked): tokens with that id add nothing, so its row gets no gradient, as torch's
// nn.Embedding(padding_idx) does (DecoderSpec::padding_idx).
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, std::optional<int64_t> padding_idx);

}  // namespace mt::cpu
