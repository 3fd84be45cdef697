// Token embedding lookup and its gradient.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace mt::cuda {

// ids I64|I32 [N] (any shape), table [V, H] (BF16|F32) -> out [N, H], the table's dtype (a copy: exact).
// Ids are validated on the host by the data path; an id outside [0, V) here yields a zero row (no fault).
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, cudaStream_t stream);

// dtable F32 [V, H] += Σ_{i: ids[i] = v} dout[i] (dout [N, H], BF16|F32). Deterministic: ids are sorted
// (stable radix sort), and each id's rows are summed in token order by one block, without atomics.
// Out-of-range ids contribute nothing; nor do tokens whose id is padding_idx (in [0, V), checked): its row gets no
// gradient, as torch's nn.Embedding(padding_idx) does (DecoderSpec::padding_idx).
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, std::optional<int64_t> padding_idx,
                        cudaStream_t stream);

}  // namespace mt::cuda
