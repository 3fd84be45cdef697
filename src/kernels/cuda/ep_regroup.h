// Expert parallelism's receive-side layouts on the GPU. After the dispatch all_to_allv (layers/cuda/
// expert_parallel_cuda.h), rank `me` of an expert-parallel group of `ep` ranks holds the rows of its own
// experts source-major: each source rank's rows in that source's expert-sorted order (local expert 0's,
// then 1's, ...), sources in rank order. The grouped GEMMs need them expert-major: expert e's rows from
// source 0, then from source 1, ... Both layouts and the map between them follow from every source's
// moe_plan offsets, gathered on the device; nothing here waits for the GPU.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

struct EpLayout {
  // I32 [3, ep·El]: for (source s, local expert e) at s·El + e: its first source-major row, its first
  // expert-major row, its row count.
  Tensor segments;
  Tensor local_offsets;  // I32 [El + 1]: the expert-major offsets (the grouped GEMMs' layout)
  int64_t ranks = 0, experts_per_rank = 0;
};

// gathered: I32 [ep, E + 1], row s = source rank s's moe_plan offsets over all E = ep·El experts.
EpLayout ep_layout(const Tensor& gathered, int me, int64_t experts_per_rank, cudaStream_t stream);

// src BF16 [N, H] -> dst BF16 [N, H] (allocated by the caller): source-major to expert-major when
// to_expert_major, else back. N must be the layout's row total.
void ep_regroup(const Tensor& src, const EpLayout& layout, bool to_expert_major, Tensor& dst, cudaStream_t stream);

}  // namespace mt::cuda
