// Chunked fused LM head + cross-entropy against the CPU reference (cpu::linear_forward,
// cpu::cross_entropy_*, cpu::linear_backward). In BF16 the device rounds the logits (HF's bf16 lm_head)
// and the logit gradient (HF's bf16 grad of the bf16 logits) before the two backward GEMMs; the host
// reference applies the same two roundings. Remaining differences: fp32 accumulation order, which can
// move a logit by one bf16 step.
//   loss sum: relative 2e-3 (BF16), 1e-5 (F32); count exact.
//   dx: max-norm 8e-3, rel-L2 3e-3 (BF16 output, one rounding + rare flips); F32 3e-5 / 1e-5 (a V-long
//   fp32 dot product on each side).  dW (fp32 accumulate): 4e-3 / 2e-3 (BF16), 3e-5 / 1e-5 (F32).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/cpu_tensor.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/linear_cross_entropy.h"

namespace mt {
namespace {

Tensor random_targets(int64_t T, int64_t V, double ignore_frac, uint64_t seed) {
  std::mt19937_64 g(seed);
  Tensor t = Tensor::empty({T}, DType::I64);
  for (int64_t i = 0; i < T; ++i)
    t.data_as<int64_t>()[i] = (static_cast<double>(g() % 1000) / 1000.0 < ignore_frac) ? -100 : static_cast<int64_t>(g() % V);
  return t;
}

void run_case(int64_t T, int64_t H, int64_t V, int64_t chunk, double ignore_frac, DType dt, uint64_t seed) {
  const bool bf = dt == DType::BF16;
  const std::string what = std::string(bf ? "bf16" : "f32") + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
                           " V=" + std::to_string(V) + " chunk=" + std::to_string(chunk);
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  Tensor x = test::host_random({T, H}, seed, 1.0f, true);
  Tensor w = test::host_random({V, H}, seed + 1, 0.1f, true);
  Tensor y = random_targets(T, V, ignore_frac, seed + 2);

  // Host reference.
  Tensor logits = cpu::linear_forward(x, w, bf);
  const cpu::CrossEntropyResult ref = cpu::cross_entropy_forward(logits, y);
  const float scale = ref.count > 0 ? 1.0f / static_cast<float>(ref.count) : 1.0f;
  Tensor dlogits = Tensor::empty({T, V}, DType::F32);
  cpu::cross_entropy_backward(logits, y, scale, dlogits);
  if (bf) cpu::round_bf16_inplace(dlogits.data_as<float>(), dlogits.numel());
  Tensor dx_ref = Tensor::empty({T, H}, DType::F32);
  Tensor dw0 = test::host_random({V, H}, seed + 3, 0.01f);
  Tensor dw_ref = dw0.clone();
  cpu::linear_backward(dlogits, x, w, &dx_ref, &dw_ref);

  Tensor dxd = test::device_from_host(x, dt), dwd = test::device_from_host(w, dt);
  Tensor yd = cuda::to_device(y, 0);
  Tensor loss = Tensor::empty({1}, DType::F32, d), count = Tensor::empty({1}, DType::I32, d);
  Tensor gx = Tensor::empty({T, H}, dt, d);
  Tensor gw = cuda::to_device(dw0, 0);
  cuda::LinearCrossEntropyArgs args;
  args.chunk_rows = chunk;
  args.grad_scale = scale;
  cuda::linear_cross_entropy(dxd, dwd, yd, args, loss, count, &gx, &gw, ctx.stream);
  const float got_loss = test::device_floats(loss)[0];
  const Tensor got_count = cuda::to_host(count);
  EXPECT_EQ(got_count.data_as<int32_t>()[0], ref.count) << what;
  EXPECT_NEAR(got_loss, ref.loss_sum, (bf ? 2e-3 : 1e-5) * std::max(1.0, std::fabs(ref.loss_sum))) << what << " loss";
  test::expect_near_normalised(test::device_floats(gx), dx_ref.to_floats(), bf ? 8e-3 : 3e-5, bf ? 3e-3 : 1e-5,
                               what + " dx");
  test::expect_near_normalised(test::device_floats(gw), dw_ref.to_floats(), bf ? 4e-3 : 3e-5, bf ? 2e-3 : 1e-5,
                               what + " dW");

  // Loss only: same loss, gradients untouched.
  args.compute_grad = false;
  Tensor loss2 = Tensor::empty({1}, DType::F32, d);
  cuda::linear_cross_entropy(dxd, dwd, yd, args, loss2, count, nullptr, nullptr, ctx.stream);
  EXPECT_EQ(test::device_floats(loss2)[0], got_loss) << what << " loss-only pass";
}

TEST(CudaLinearCrossEntropy, MatchesCpu) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 1300;
  for (DType dt : {DType::BF16, DType::F32}) {
    run_case(37, 64, 1000, 16, 0.3, dt, seed += 10);   // three chunks, the last partial
    run_case(5, 3, 7, 100, 0.0, dt, seed += 10);       // one chunk larger than T
    run_case(130, 96, 5003, 64, 0.1, dt, seed += 10);  // odd vocabulary
    run_case(40, 64, 12008, 16, 0.2, dt, seed += 10);  // bf16: the 16-byte row kernel, a lone last packet per thread
    run_case(700, 32, 2056, 700, 0.2, dt, seed += 10);  // one chunk of more rows than the GPU has SMs
    run_case(1, 8, 2, 1, 0.0, dt, seed += 10);
    run_case(9, 16, 50, 4, 1.0, dt, seed += 10);       // every target ignored: loss 0, count 0, dx 0
  }
}

TEST(CudaLinearCrossEntropy, RejectsBadArguments) {
  MT_SKIP_WITHOUT_CUDA();
  auto& ctx = cuda::device_context(0);
  const Device d = Device::cuda(0);
  Tensor x = Tensor::empty({4, 8}, DType::BF16, d), w = Tensor::empty({10, 8}, DType::BF16, d);
  Tensor y3 = Tensor::empty({3}, DType::I64, d);
  Tensor loss = Tensor::empty({1}, DType::F32, d), count = Tensor::empty({1}, DType::I32, d);
  cuda::LinearCrossEntropyArgs args;
  args.compute_grad = false;
  EXPECT_THROW(cuda::linear_cross_entropy(x, w, y3, args, loss, count, nullptr, nullptr, ctx.stream), Error);
  Tensor y4 = Tensor::empty({4}, DType::I64, d);
  args.compute_grad = true;  // without dx/dw
  EXPECT_THROW(cuda::linear_cross_entropy(x, w, y4, args, loss, count, nullptr, nullptr, ctx.stream), Error);
}

}  // namespace
}  // namespace mt
