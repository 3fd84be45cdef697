// MLA's assembly of query, key and value and its backward (kernels/cuda/mla_assemble.h) against the CPU ops the CPU
// block assembles them with (kernels/cpu/rope.h's interleaved and half-split RoPE, column copies), at packed-document
// positions with YaRN-like scaled tables, on bf16-representable inputs.
// Thresholds: the copies are exact; the forward's RoPE columns round each product and the sum as the CPU's bf16 path
// does, from the same table values: bit-equal. Backward: the CPU keeps fp32 (dq's rotated columns, the rope key's
// head sum then rotation, in head order on both sides), the GPU rounds once to bf16 and may contract the products
// into an fma differently (an fp32 ulp before that rounding): within one bf16 step of each value (2^-8 relative to
// the largest, max-norm 4e-3) and rel-L2 3e-3 (the rounding, u = 2^-9, over every element).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "cuda_test_util.h"
#include "error_report.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/mla_assemble.h"

namespace mt {
namespace {

struct Case {
  int64_t T, heads, nope, rope, dv, v_pad, kv_lora;
  bool interleaved;
};

// Rows [rows, width] of v, columns [from, from + n).
std::vector<float> cols(const std::vector<float>& v, int64_t rows, int64_t width, int64_t from, int64_t n) {
  std::vector<float> r;
  for (int64_t i = 0; i < rows; ++i) r.insert(r.end(), v.begin() + i * width + from, v.begin() + i * width + from + n);
  return r;
}

std::vector<float> first_half(const Tensor& full) {
  return cols(full.to_floats(), full.dim(0), full.dim(1), 0, full.dim(1) / 2);
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

Tensor rope_fwd(const Case& c, const std::vector<float>& x, int64_t rows, const cpu::RopeTables& t) {
  const Tensor in = Tensor::from_floats({rows, c.rope}, x);
  return c.interleaved ? cpu::rope_interleaved_forward(in, t, true) : cpu::rope_forward(in, t, true);
}
Tensor rope_bwd(const Case& c, const std::vector<float>& g, int64_t rows, const cpu::RopeTables& t) {
  const Tensor in = Tensor::from_floats({rows, c.rope}, g);
  return c.interleaved ? cpu::rope_interleaved_backward(in, t) : cpu::rope_backward(in, t);
}

void run_case(const Case& c, uint64_t seed) {
  const int64_t T = c.T, Hq = c.heads, D = c.nope + c.rope, W = c.nope + c.dv, C = c.kv_lora + c.rope;
  const int64_t Dvp = c.v_pad > 0 ? c.v_pad : c.dv;
  SCOPED_TRACE("T=" + std::to_string(T) + " heads=" + std::to_string(Hq) + " nope=" + std::to_string(c.nope) +
               " rope=" + std::to_string(c.rope) + " dv=" + std::to_string(c.dv) + " v_pad=" + std::to_string(Dvp) +
               (c.interleaved ? " interleaved" : " split"));
  const cudaStream_t stream = cuda::device_context(0).stream;
  // Packed documents: positions restart at 0 partway.
  Tensor pos = Tensor::empty({T}, DType::I64);
  for (int64_t t = 0; t < T; ++t) pos.data_as<int64_t>()[t] = t < T / 2 ? t + 3 : t - T / 2;
  std::vector<float> inv(static_cast<size_t>(c.rope / 2));
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / std::pow(50.0f, 2.0f * float(i) / float(c.rope));
  const cpu::RopeTables tab = cpu::rope_tables(pos, inv, 1.3f, true);
  const Tensor cos = cuda::to_device(Tensor::from_floats({T, c.rope / 2}, first_half(tab.cos)), 0);
  const Tensor sin = cuda::to_device(Tensor::from_floats({T, c.rope / 2}, first_half(tab.sin)), 0);

  const Tensor q = test::host_random({T, Hq * D}, seed, 1.0f, true);
  const Tensor ckv = test::host_random({T, C}, seed + 1, 1.0f, true);
  const Tensor kv = test::host_random({T, Hq * W}, seed + 2, 1.0f, true);
  cuda::MlaAssembleDims d{T, Hq, c.nope, c.rope, c.dv, c.v_pad, c.interleaved};
  Tensor query = Tensor::empty({T, Hq, D}, DType::BF16, Device::cuda(0));
  Tensor key = Tensor::empty({T, Hq, D}, DType::BF16, Device::cuda(0));
  Tensor value = Tensor::empty({T, Hq, Dvp}, DType::BF16, Device::cuda(0));
  cuda::mla_assemble_forward(d, test::device_from_host(q, DType::BF16), test::device_from_host(ckv, DType::BF16),
                             test::device_from_host(kv, DType::BF16), cos, sin, query, key, value, stream);

  // The CPU's assembly.
  const std::vector<float> qv = q.to_floats(), ckvv = ckv.to_floats(), kvv = kv.to_floats();
  const std::vector<float> q_rot = rope_fwd(c, cols(qv, T * Hq, D, c.nope, c.rope), T * Hq, tab).to_floats();
  const std::vector<float> k_rot = rope_fwd(c, cols(ckvv, T, C, c.kv_lora, c.rope), T, tab).to_floats();
  std::vector<float> want_q, want_k, want_v;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t r = t * Hq + h;
      for (int64_t j = 0; j < c.nope; ++j) want_q.push_back(qv[r * D + j]);
      for (int64_t j = 0; j < c.rope; ++j) want_q.push_back(q_rot[r * c.rope + j]);
      for (int64_t j = 0; j < c.nope; ++j) want_k.push_back(kvv[r * W + j]);
      for (int64_t j = 0; j < c.rope; ++j) want_k.push_back(k_rot[t * c.rope + j]);
      for (int64_t j = 0; j < Dvp; ++j) want_v.push_back(j < c.dv ? kvv[r * W + c.nope + j] : 0.0f);
    }
  EXPECT_EQ(test::device_floats(query), want_q) << "query";
  EXPECT_EQ(test::device_floats(key), want_k) << "key";
  EXPECT_EQ(test::device_floats(value), want_v) << "value";

  // Backward.
  const Tensor dquery = test::host_random({T, Hq, D}, seed + 3, 1.0f, true);
  const Tensor dkey = test::host_random({T, Hq, D}, seed + 4, 1.0f, true);
  const Tensor dvalue = test::host_random({T, Hq, Dvp}, seed + 5, 1.0f, true);
  Tensor dq = Tensor::empty({T, Hq * D}, DType::BF16, Device::cuda(0));
  Tensor dkv = Tensor::empty({T, Hq * W}, DType::BF16, Device::cuda(0));
  // dckv's latent columns hold a sentinel the backward must leave alone.
  std::vector<float> sentinel(static_cast<size_t>(T * C), 7.0f);
  Tensor dckv = test::device_from_host(Tensor::from_floats({T, C}, sentinel), DType::BF16);
  cuda::mla_assemble_backward(d, test::device_from_host(dquery, DType::BF16), test::device_from_host(dkey, DType::BF16),
                              test::device_from_host(dvalue, DType::BF16), cos, sin, dq, dkv, dckv, stream);
  const std::vector<float> gq = dquery.to_floats(), gk = dkey.to_floats(), gv = dvalue.to_floats();
  const std::vector<float> dq_rot = rope_bwd(c, cols(gq, T * Hq, D, c.nope, c.rope), T * Hq, tab).to_floats();
  std::vector<float> krot_sum(static_cast<size_t>(T * c.rope), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t j = 0; j < c.rope; ++j) krot_sum[t * c.rope + j] += gk[(t * Hq + h) * D + c.nope + j];
  const std::vector<float> dk_rot = rope_bwd(c, krot_sum, T, tab).to_floats();
  std::vector<float> want_dq_nope, want_dkv;
  for (int64_t r = 0; r < T * Hq; ++r) {
    for (int64_t j = 0; j < c.nope; ++j) want_dq_nope.push_back(gq[r * D + j]);
    for (int64_t j = 0; j < c.nope; ++j) want_dkv.push_back(gk[r * D + j]);
    for (int64_t j = 0; j < c.dv; ++j) want_dkv.push_back(gv[r * Dvp + j]);
  }
  const std::vector<float> got_dq = test::device_floats(dq), got_dckv = test::device_floats(dckv);
  EXPECT_EQ(cols(got_dq, T * Hq, D, 0, c.nope), want_dq_nope) << "dq (no-rope columns)";
  test::expect_norm(cols(got_dq, T * Hq, D, c.nope, c.rope), dq_rot, 4e-3, 3e-3, "dq (rope columns)");
  EXPECT_EQ(test::device_floats(dkv), want_dkv) << "dkv";
  test::expect_norm(cols(got_dckv, T, C, c.kv_lora, c.rope), dk_rot, 4e-3, 3e-3, "dckv (rope key, summed over heads)");
  EXPECT_EQ(cols(got_dckv, T, C, 0, c.kv_lora), cols(sentinel, T, C, 0, c.kv_lora)) << "dckv's latent columns touched";
  // The rounding is the only difference: the GPU's values are the CPU's fp32 ones rounded, up to an fp32 ulp.
  const std::vector<float> want_rot = rounded(dq_rot), got_rot = cols(got_dq, T * Hq, D, c.nope, c.rope);
  int64_t off = 0;
  for (size_t i = 0; i < want_rot.size(); ++i) off += got_rot[i] != want_rot[i];
  EXPECT_LE(off * 100, static_cast<int64_t>(want_rot.size())) << off << " dq rope values are not the CPU's rounded";
}

TEST(CudaMlaAssemble, MatchesCpuAssembly) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 900;
  const Case cases[] = {
      {37, 3, 24, 8, 16, 32, 16, true},      // the fixture's head sizes, value padded to 32
      {37, 3, 24, 8, 16, 32, 16, false},     // the half-split RoPE
      {19, 2, 128, 64, 128, 128, 32, true},  // DeepSeek-V3's 192 / 128, no padding
      {1, 1, 0, 2, 4, 8, 8, true},           // one token, no no-rope columns
  };
  for (const Case& c : cases) run_case(c, seed += 10);
}

TEST(CudaMlaAssemble, RefusesMismatchedShapesInOneLine) {
  MT_SKIP_WITHOUT_CUDA();
  const cudaStream_t stream = cuda::device_context(0).stream;
  const int64_t T = 4;
  auto dev = [](const Shape& s) { return Tensor::zeros(s, DType::BF16).to(DType::BF16); };
  const Tensor cos = cuda::to_device(Tensor::zeros({T, 4}, DType::F32), 0), sin = cos;
  const Tensor q = cuda::to_device(dev({T, 2 * 24}), 0), ckv = cuda::to_device(dev({T, 24}), 0);
  const Tensor kv = cuda::to_device(dev({T, 2 * 20}), 0);
  Tensor query = cuda::to_device(dev({T, 2, 24}), 0), key = query, value = cuda::to_device(dev({T, 2, 4}), 0);
  cuda::MlaAssembleDims d{T, 2, 16, 8, 4, 0, true};
  cuda::mla_assemble_forward(d, q, ckv, kv, cos, sin, query, key, value, stream);  // fits
  d.rope = 7;  // odd
  try {
    cuda::mla_assemble_forward(d, q, ckv, kv, cos, sin, query, key, value, stream);
    ADD_FAILURE() << "odd rope accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  d.rope = 8;
  d.v_dim = 8;  // kv too small for it
  EXPECT_THROW(cuda::mla_assemble_forward(d, q, ckv, kv, cos, sin, query, key, value, stream), Error);
}

}  // namespace
}  // namespace mt
