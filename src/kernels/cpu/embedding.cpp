#include "kernels/cpu/embedding.h"

#include "core/error.h"
#include "core/float_convert.h"
#include "kernels/cpu/cpu_tensor.h"

namespace mt::cpu {

namespace {
void check_ids(const Tensor& ids, int64_t V) {
  MT_CHECK(ids.dtype() == DType::I64, "embedding ids must be I64, got {}", ids.desc());
  const int64_t* p = ids.data_as<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (p[i] < 0 || p[i] >= V) fail("token id {} at position {} is outside the vocabulary [0, {})", p[i], i, V);
}
}  // namespace

Tensor embedding_forward(const Tensor& ids, const Tensor& table) {
  MT_CHECK(table.ndim() == 2, "embedding table must be 2-d, got {}", table.desc());
  const int64_t V = table.dim(0), H = table.dim(1), N = ids.numel();
  check_ids(ids, V);
  Tensor out = Tensor::empty({N, H}, DType::F32);
  const int64_t* id = ids.data_as<int64_t>();
  float* o = out.data_as<float>();
  if (table.dtype() == DType::F32) {
    const float* t = table.data_as<float>();
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h) o[i * H + h] = t[id[i] * H + h];
  } else {
    MT_CHECK(table.dtype() == DType::BF16, "embedding table must be F32 or BF16, got {}", table.desc());
    const uint16_t* t = table.data_as<uint16_t>();
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h) o[i * H + h] = bf16_to_float(t[id[i] * H + h]);
  }
  return out;
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, std::optional<int64_t> padding_idx) {
  MT_CHECK(dtable.ndim() == 2, "embedding grad must be 2-d, got {}", dtable.desc());
  const int64_t V = dtable.dim(0), H = dtable.dim(1), N = ids.numel();
  check_f32(dtable, "embedding grad", {V, H});
  check_f32_numel(dout, "embedding dout", N * H);
  check_ids(ids, V);
  MT_CHECK(!padding_idx || (*padding_idx >= 0 && *padding_idx < V), "embedding padding_idx {} outside [0, {})",
           padding_idx.value_or(0), V);
  const int64_t skip = padding_idx.value_or(-1);  // -1 matches no id (checked above)
  const int64_t* id = ids.data_as<int64_t>();
  const float* d = dout.data_as<float>();
  float* g = dtable.data_as<float>();
  for (int64_t i = 0; i < N; ++i) {
    if (id[i] == skip) continue;
    for (int64_t h = 0; h < H; ++h) g[id[i] * H + h] += d[i * H + h];
  }
}

}  // namespace mt::cpu
