// Helpers shared by the CUDA Mamba2 op tests (conv1d_causal, mamba2_dt, rmsnorm_gated): packed documents in both
// forms (the CPU's segments, the device's AttentionDocs from the same ids), column slices of a [T, W] host matrix,
// and exact comparisons (bit-reproducibility, untouched columns).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "cuda_test_util.h"
#include "kernels/cpu/seq_segments.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/flash_attention.h"

namespace mt::test {

struct PackedDocs {
  int64_t batch = 0, seq = 0;
  std::vector<cpu::SeqSegment> segs;  // the CPU's
  cuda::AttentionDocs dev;            // the device's, from the same document ids
};

// lengths[b]: the document lengths of row b (summing to seq).
inline PackedDocs packed_docs(const std::vector<std::vector<int64_t>>& lengths, int64_t seq) {
  PackedDocs p;
  p.batch = static_cast<int64_t>(lengths.size());
  p.seq = seq;
  Tensor ids = Tensor::empty({p.batch, seq}, DType::I32);
  int32_t* d = ids.data_as<int32_t>();
  int32_t id = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t s = 0;
    for (int64_t len : lengths[static_cast<size_t>(b)]) {
      for (int64_t i = 0; i < len; ++i) d[b * seq + s + i] = id;
      s += len, ++id;
    }
    EXPECT_EQ(s, seq) << "document lengths of row " << b;
  }
  p.segs = cpu::document_segments(ids, p.batch, seq);
  auto& ctx = cuda::device_context(0);
  p.dev = cuda::attention_docs_from_ids(cuda::to_device(ids, 0), p.batch, seq, 0, ctx.stream);
  return p;
}

// Columns [c0, c0 + n) of host values [T, W] (row-major), as an F32 host tensor [T, n].
inline Tensor host_columns(const std::vector<float>& m, int64_t T, int64_t W, int64_t c0, int64_t n) {
  std::vector<float> r(static_cast<size_t>(T * n));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < n; ++c) r[t * n + c] = m[t * W + c0 + c];
  return Tensor::from_floats({T, n}, r);
}

inline std::vector<float> columns_of(const std::vector<float>& m, int64_t T, int64_t W, int64_t c0, int64_t n) {
  return host_columns(m, T, W, c0, n).to_floats();
}

// Every column of got [T, W] outside [c0, c0 + n) is bit-equal to before.
inline void expect_other_columns_untouched(const std::vector<float>& got, const std::vector<float>& before, int64_t T,
                                           int64_t W, int64_t c0, int64_t n, const std::string& what) {
  ASSERT_EQ(got.size(), before.size());
  int64_t changed = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < W; ++c)
      if ((c < c0 || c >= c0 + n) && std::memcmp(&got[t * W + c], &before[t * W + c], sizeof(float)) != 0) ++changed;
  EXPECT_EQ(changed, 0) << what << ": columns outside [" << c0 << ", " << c0 + n << ") changed";
}

inline void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << ": not bitwise equal";
}

}  // namespace mt::test
