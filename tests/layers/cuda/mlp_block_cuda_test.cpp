// The CUDA dense MLP block (layers/cuda/mlp_block_cuda.h) against the CPU block (layers/mlp_block.h) in bf16
// mode, on random bf16-representable data at sizes that are not tile multiples (T = 1 and odd T; H, F
// multiples of 8). The CPU block runs its own norm first; its normalised input n goes to the GPU block, so
// both multiply the same numbers. The env carries no config and no batch: the block reads only its spec.
//
// Thresholds (bf16 unit roundoff u = 2^-9, one step 2^-8 ≈ 3.9e-3; max-norm is relative to max|ref|):
// Forward, stage by stage (each stage's CPU reference takes the GPU's previous stage as input, so each
// check is one op against its CPU op, as in tests/kernels/cuda/{gemm,swiglu}_test.cpp):
//   gate|up GEMMs: same inputs, fp32 accumulation in another order, one bf16 rounding: 4e-3 / 3e-3.
//   SwiGLU: two bf16 roundings on both sides, expf may differ by an ulp and flip one: 8e-3 / 2e-3.
//   down GEMM: as gate|up, 4e-3 / 3e-3.
// Forward end to end (y against the CPU chain from its own activations): a rounding flip upstream (rare:
// fp32 order differences are ~1e-7 of a value, a bf16 step 4e-3) adds at most a step to one element of
// h; y's own rounding is one step: 1e-2 / 5e-3.
// Backward against the CPU block (fp32 math from its bf16 forward activations); the GPU rounds dh and
// d(gate|up) to bf16 (≤ u each, the second also carrying the first: ≤ 2u relative per element) and dn twice
// (the gate part, then with the up part added):
//   dW_down = Σ_t dy·h: exact inputs but for the forward's rare flips of h (at T = 1 one flipped h moves a
//     whole column by up to two steps, the SwiGLU bound): 8e-3 / 2e-3; from the GPU's own h, only the fp32
//     summation order differs: 2e-5 / 5e-6 (tests/kernels/cuda/gemm_test.cpp).
//   dW_gate, dW_up = Σ_t d(gate|up)·n: each term within 2u ≈ 3.9e-3 relative (the bound at T = 1; for
//     larger T the per-term errors have random signs and average): 1e-2 / 5e-3.
//   dn = d_gate·W_gate + d_up·W_up: 2u per term plus the two roundings: 1.6e-2 / 6e-3.
// The gradients start from random values of the products' size, so a store instead of an add fails.
//
// ReLU² (CudaMlpBlockRelu2: Nemotron-H's MLP layers and shared expert; up and down only, no gate weight), the same
// derivations with one op fewer:
//   up GEMM: 4e-3 / 3e-3 (as gate|up). ReLU² from the GPU's up: bit for bit (kernels/cuda/relu2.h: no transcendental
//   function, one rounding on both sides). down GEMM: 4e-3 / 3e-3. y end to end: a flipped up rounding moves h = up²
//   by twice its relative step, one element of h: 1e-2 / 5e-3 as for SwiGLU.
//   Backward: dW_down 8e-3 / 2e-3 and from the GPU's own h 2e-5 / 5e-6 (as above); d_up = 2·up·dh rounded twice on
//   the GPU (dh, d_up: ≤ 2u per element), so dW_up 1e-2 / 5e-3; dn = d_up·W_up, one GEMM with one rounding (SwiGLU's
//   two-part bound holds a fortiori): 1.6e-2 / 6e-3.
#include "layers/cuda/mlp_block_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../../kernels/cuda/cuda_test_util.h"
#include "../../kernels/cuda/error_report.h"
#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/relu2.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/phase_timer.h"
#include "layers/mlp_block.h"

namespace mt {
namespace {

struct Case {
  int64_t T, H, F;
};

// A block env with nothing but a device, a stream and a (disabled) timer.
struct BareEnv {
  cuda::PhaseTimer timer;
  CudaBlockEnv env;
  BareEnv() {
    env.device = 0;
    env.stream = cuda::device_context(0).stream;
    env.timer = &timer;
  }
};

std::vector<float> columns(const std::vector<float>& v, int64_t rows, int64_t ld, int64_t from, int64_t count) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * count));
  for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), v.begin() + r * ld + from, v.begin() + r * ld + from + count);
  return out;
}

std::vector<float> side_by_side(const std::vector<float>& a, const std::vector<float>& b, int64_t rows, int64_t F) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * 2 * F));
  for (int64_t r = 0; r < rows; ++r) {
    out.insert(out.end(), a.begin() + r * F, a.begin() + (r + 1) * F);
    out.insert(out.end(), b.begin() + r * F, b.begin() + (r + 1) * F);
  }
  return out;
}

Tensor bf16_values(const Shape& s, uint64_t seed, float scale) { return test::host_random(s, seed, scale, true); }

Tensor dev_zeros(const Shape& s, DType dt) { return cuda::to_device(Tensor::zeros(s, dt), 0); }

void run_case(const Case& c, uint64_t seed) {
  const int64_t T = c.T, H = c.H, F = c.F;
  const std::string what = "T=" + std::to_string(T) + " H=" + std::to_string(H) + " F=" + std::to_string(F);
  SCOPED_TRACE(what);
  DecoderSpec cfg;
  cfg.norm_eps = 1e-6;
  BlockEnv cpu_env;
  cpu_env.spec = &cfg;
  cpu_env.bf16 = true;
  MlpSpec cpu_mlp;  // the CPU block's sublayer spec
  cpu_mlp.intermediate_size = F;

  // BF16 weights (as the CPU bf16 model holds them), scaled so gate, up and y are O(1).
  LayerWeights L;
  {
    std::vector<float> nw = test::cuda_random_floats(static_cast<size_t>(H), seed, 0.1f);
    for (float& x : nw) x = round_bf16(1.0f + x);
    L.post_norm = Tensor::from_floats({H}, nw).to(DType::BF16);
  }
  L.mlp_gate = bf16_values({F, H}, seed + 1, 1.0f / std::sqrt(float(H))).to(DType::BF16);
  L.mlp_up = bf16_values({F, H}, seed + 2, 1.0f / std::sqrt(float(H))).to(DType::BF16);
  L.mlp_down = bf16_values({H, F}, seed + 3, 1.0f / std::sqrt(float(F))).to(DType::BF16);
  const Tensor h = bf16_values({T, H}, seed + 4, 1.0f), dy = bf16_values({T, H}, seed + 5, 1.0f);
  // Starting gradients of the products' size (Σ over T of O(0.5) terms).
  const float g0_scale = 0.5f * std::sqrt(static_cast<float>(T));
  const Tensor g0_gate = test::host_random({F, H}, seed + 6, g0_scale), g0_up = test::host_random({F, H}, seed + 7, g0_scale),
               g0_down = test::host_random({H, F}, seed + 8, g0_scale);

  // CPU block.
  MlpBlockActs acts;
  mlp_block_forward(cpu_env, cpu_mlp, L, h, &acts);
  const Tensor y_cpu = cpu::linear_forward(acts.act, L.mlp_down, true);  // the block's output before its residual
  LayerWeights G;
  G.post_norm = Tensor::zeros({H}, DType::F32);
  G.mlp_gate = g0_gate.clone();
  G.mlp_up = g0_up.clone();
  G.mlp_down = g0_down.clone();
  mlp_block_backward(cpu_env, cpu_mlp, L, h, acts, dy, G);
  // dn, which the CPU block passes straight into its norm's backward: its chain up to there.
  Tensor dact = Tensor::empty({T, F}, DType::F32), dgate, dup;
  cpu::linear_backward(dy, acts.act, L.mlp_down, &dact, nullptr);
  cpu::swiglu_backward(dact, acts.gate, acts.up, dgate, dup);
  Tensor dn_cpu = Tensor::empty({T, H}, DType::F32), dn_up = Tensor::empty({T, H}, DType::F32);
  cpu::linear_backward(dgate, acts.n, L.mlp_gate, &dn_cpu, nullptr);
  cpu::linear_backward(dup, acts.n, L.mlp_up, &dn_up, nullptr);
  std::vector<float> dn_want = dn_cpu.to_floats();
  const std::vector<float> dn_up_v = dn_up.to_floats();
  for (size_t i = 0; i < dn_want.size(); ++i) dn_want[i] += dn_up_v[i];

  // GPU block on the CPU block's normalised input.
  BareEnv be;
  const MlpDimsCuda spec{H, F, Activation::swiglu};
  const Tensor wg = cuda::to_device(L.mlp_gate, 0), wu = cuda::to_device(L.mlp_up, 0), wd = cuda::to_device(L.mlp_down, 0);
  const MlpWeightsCuda w{wg, wu, wd};
  const Tensor n = test::device_from_host(acts.n, DType::BF16);
  MlpActsCuda ga;
  const Tensor y = mlp_block_forward_cuda(be.env, spec, w, n, ga);
  ASSERT_EQ(y.shape(), (Shape{T, H}));
  ASSERT_EQ(ga.gu.shape(), (Shape{T, 2 * F}));
  ASSERT_EQ(ga.h.shape(), (Shape{T, F}));

  const std::vector<float> gu = test::device_floats(ga.gu), hv = test::device_floats(ga.h), yv = test::device_floats(y);
  const std::vector<float> g_gpu = columns(gu, T, 2 * F, 0, F), u_gpu = columns(gu, T, 2 * F, F, F);
  test::expect_norm(gu, side_by_side(acts.gate.to_floats(), acts.up.to_floats(), T, F), 4e-3, 3e-3, "gate|up");
  const Tensor h_from_gpu = cpu::swiglu_forward(Tensor::from_floats({T, F}, g_gpu), Tensor::from_floats({T, F}, u_gpu), true);
  test::expect_norm(hv, h_from_gpu.to_floats(), 8e-3, 2e-3, "swiglu (from the GPU's gate|up)");
  const Tensor hg = Tensor::from_floats({T, F}, hv);
  test::expect_norm(yv, cpu::linear_forward(hg, L.mlp_down, true).to_floats(), 4e-3, 3e-3, "down (from the GPU's h)");
  test::expect_norm(yv, y_cpu.to_floats(), 1e-2, 5e-3, "y end to end");

  // Backward, twice from the same state: bitwise the same (every GEMM sums in a fixed order).
  const Tensor ddy = test::device_from_host(dy, DType::BF16);
  Tensor dgw[2], duw[2], ddw[2], dn[2];
  for (int run = 0; run < 2; ++run) {
    dgw[run] = cuda::to_device(g0_gate, 0);
    duw[run] = cuda::to_device(g0_up, 0);
    ddw[run] = cuda::to_device(g0_down, 0);
    dn[run] = mlp_block_backward_cuda(be.env, spec, w, ga, ddy, MlpGradsCuda{dgw[run], duw[run], ddw[run]});
  }
  ASSERT_EQ(dn[0].shape(), (Shape{T, H}));
  const std::vector<float> dnv = test::device_floats(dn[0]);
  test::expect_norm(dnv, dn_want, 1.6e-2, 6e-3, "dn");
  test::expect_norm(test::device_floats(ddw[0]), G.mlp_down.to_floats(), 8e-3, 2e-3, "dW_down");
  test::expect_norm(test::device_floats(dgw[0]), G.mlp_gate.to_floats(), 1e-2, 5e-3, "dW_gate");
  test::expect_norm(test::device_floats(duw[0]), G.mlp_up.to_floats(), 1e-2, 5e-3, "dW_up");
  {
    Tensor want = g0_down.clone();
    cpu::linear_backward(dy, hg, L.mlp_down, nullptr, &want);
    test::expect_norm(test::device_floats(ddw[0]), want.to_floats(), 2e-5, 5e-6, "dW_down (from the GPU's h)");
  }
  const std::vector<float> a0 = test::device_floats(dgw[0]), a1 = test::device_floats(dgw[1]);
  const std::vector<float> b0 = test::device_floats(ddw[0]), b1 = test::device_floats(ddw[1]);
  EXPECT_EQ(std::memcmp(a0.data(), a1.data(), a0.size() * sizeof(float)), 0) << "dW_gate differs between two runs";
  EXPECT_EQ(std::memcmp(b0.data(), b1.data(), b0.size() * sizeof(float)), 0) << "dW_down differs between two runs";
  EXPECT_EQ(test::device_floats(dn[1]), dnv) << "dn differs between two runs";
}

TEST(CudaMlpBlock, MatchesCpuBlockBf16) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 3100;
  const Case cases[] = {{1, 64, 128}, {7, 40, 24}, {133, 128, 344}, {300, 96, 200}, {64, 256, 512}};
  for (const Case& c : cases) run_case(c, seed += 20);
}

// ReLU²: up and down only (no gate weight, no gate gradient), the CPU block on the same weights.
void run_relu2_case(const Case& c, uint64_t seed) {
  const int64_t T = c.T, H = c.H, F = c.F;
  SCOPED_TRACE("relu2 T=" + std::to_string(T) + " H=" + std::to_string(H) + " F=" + std::to_string(F));
  DecoderSpec cfg;
  cfg.norm_eps = 1e-5;
  BlockEnv cpu_env;
  cpu_env.spec = &cfg;
  cpu_env.bf16 = true;
  MlpSpec cpu_mlp{F, Activation::relu2, false};

  LayerWeights L;
  {
    std::vector<float> nw = test::cuda_random_floats(static_cast<size_t>(H), seed, 0.1f);
    for (float& x : nw) x = round_bf16(1.0f + x);
    L.post_norm = Tensor::from_floats({H}, nw).to(DType::BF16);
  }
  L.mlp_up = bf16_values({F, H}, seed + 2, 1.0f / std::sqrt(float(H))).to(DType::BF16);
  L.mlp_down = bf16_values({H, F}, seed + 3, 1.0f / std::sqrt(float(F))).to(DType::BF16);
  const Tensor h = bf16_values({T, H}, seed + 4, 1.0f), dy = bf16_values({T, H}, seed + 5, 1.0f);
  const float g0_scale = 0.5f * std::sqrt(static_cast<float>(T));
  const Tensor g0_up = test::host_random({F, H}, seed + 7, g0_scale);
  const Tensor g0_down = test::host_random({H, F}, seed + 8, g0_scale);

  MlpBlockActs acts;
  mlp_block_forward(cpu_env, cpu_mlp, L, h, &acts);
  ASSERT_FALSE(acts.gate.defined());
  const Tensor y_cpu = cpu::linear_forward(acts.act, L.mlp_down, true);
  LayerWeights G;
  G.post_norm = Tensor::zeros({H}, DType::F32);
  G.mlp_up = g0_up.clone();
  G.mlp_down = g0_down.clone();
  mlp_block_backward(cpu_env, cpu_mlp, L, h, acts, dy, G);
  EXPECT_FALSE(G.mlp_gate.defined());
  Tensor dact = Tensor::empty({T, F}, DType::F32);
  cpu::linear_backward(dy, acts.act, L.mlp_down, &dact, nullptr);
  Tensor dn_cpu = Tensor::empty({T, H}, DType::F32);
  cpu::linear_backward(cpu::relu2_backward(dact, acts.up), acts.n, L.mlp_up, &dn_cpu, nullptr);

  BareEnv be;
  const MlpDimsCuda spec{H, F, Activation::relu2};
  const Tensor none, wu = cuda::to_device(L.mlp_up, 0), wd = cuda::to_device(L.mlp_down, 0);
  const MlpWeightsCuda w{none, wu, wd};
  const Tensor n = test::device_from_host(acts.n, DType::BF16);
  MlpActsCuda ga;
  const Tensor y = mlp_block_forward_cuda(be.env, spec, w, n, ga);
  ASSERT_EQ(y.shape(), (Shape{T, H}));
  ASSERT_EQ(ga.gu.shape(), (Shape{T, F}));  // up alone
  ASSERT_EQ(ga.h.shape(), (Shape{T, F}));
  EXPECT_FALSE(ga.u_gate.defined());

  const std::vector<float> up = test::device_floats(ga.gu), hv = test::device_floats(ga.h), yv = test::device_floats(y);
  test::expect_norm(up, acts.up.to_floats(), 4e-3, 3e-3, "up");
  EXPECT_EQ(hv, cpu::relu2_forward(Tensor::from_floats({T, F}, up), true).to_floats()) << "relu2 (from the GPU's up)";
  const Tensor hg = Tensor::from_floats({T, F}, hv);
  test::expect_norm(yv, cpu::linear_forward(hg, L.mlp_down, true).to_floats(), 4e-3, 3e-3, "down (from the GPU's h)");
  test::expect_norm(yv, y_cpu.to_floats(), 1e-2, 5e-3, "y end to end");

  const Tensor ddy = test::device_from_host(dy, DType::BF16);
  Tensor no_gate, duw[2], ddw[2], dn[2];
  for (int run = 0; run < 2; ++run) {
    duw[run] = cuda::to_device(g0_up, 0);
    ddw[run] = cuda::to_device(g0_down, 0);
    dn[run] = mlp_block_backward_cuda(be.env, spec, w, ga, ddy, MlpGradsCuda{no_gate, duw[run], ddw[run]});
  }
  EXPECT_FALSE(no_gate.defined());
  ASSERT_EQ(dn[0].shape(), (Shape{T, H}));
  const std::vector<float> dnv = test::device_floats(dn[0]);
  test::expect_norm(dnv, dn_cpu.to_floats(), 1.6e-2, 6e-3, "dn");
  test::expect_norm(test::device_floats(ddw[0]), G.mlp_down.to_floats(), 8e-3, 2e-3, "dW_down");
  test::expect_norm(test::device_floats(duw[0]), G.mlp_up.to_floats(), 1e-2, 5e-3, "dW_up");
  {
    Tensor want = g0_down.clone();
    cpu::linear_backward(dy, hg, L.mlp_down, nullptr, &want);
    test::expect_norm(test::device_floats(ddw[0]), want.to_floats(), 2e-5, 5e-6, "dW_down (from the GPU's h)");
  }
  EXPECT_EQ(test::device_floats(duw[1]), test::device_floats(duw[0])) << "dW_up differs between two runs";
  EXPECT_EQ(test::device_floats(ddw[1]), test::device_floats(ddw[0])) << "dW_down differs between two runs";
  EXPECT_EQ(test::device_floats(dn[1]), dnv) << "dn differs between two runs";

  // dn_into (a shared expert's input gradient joining the routed experts'): dn added onto what is there.
  const Tensor base = bf16_values({T, H}, seed + 9, 1.0f);
  Tensor into = test::device_from_host(base, DType::BF16);
  Tensor duw2 = cuda::to_device(g0_up, 0), ddw2 = cuda::to_device(g0_down, 0);
  const Tensor joined =
      mlp_block_backward_cuda(be.env, spec, w, ga, ddy, MlpGradsCuda{no_gate, duw2, ddw2}, &into);
  EXPECT_EQ(joined.data(), into.data());
  std::vector<float> want_joined = base.to_floats();
  for (size_t i = 0; i < want_joined.size(); ++i) want_joined[i] += dnv[i];
  // The GEMM adds in fp32 onto the bf16 base and rounds once; dnv was rounded on its own: one step apart at most.
  test::expect_norm(test::device_floats(joined), want_joined, 8e-3, 4e-3, "dn added into dn_into");
}

TEST(CudaMlpBlockRelu2, MatchesCpuBlockBf16) {
  MT_SKIP_WITHOUT_CUDA();
  uint64_t seed = 5100;
  const Case cases[] = {{1, 64, 128}, {7, 40, 24}, {133, 128, 344}, {300, 96, 200}, {64, 256, 512}};
  for (const Case& c : cases) run_relu2_case(c, seed += 20);
}

// Selective recompute for ReLU²: h recomputed from the kept up is bitwise the forward's; no tokens: empty output and
// untouched gradients; a gate weight given to a ReLU² block is refused (it has none to read).
TEST(CudaMlpBlockRelu2, RecomputeZeroTokensAndRefusals) {
  MT_SKIP_WITHOUT_CUDA();
  const int64_t T = 37, H = 64, F = 96;
  BareEnv be;
  const MlpDimsCuda spec{H, F, Activation::relu2};
  const Tensor none;
  const Tensor wu = test::device_from_host(test::host_random({F, H}, 2, 0.125f, true), DType::BF16);
  const Tensor wd = test::device_from_host(test::host_random({H, F}, 3, 0.1f, true), DType::BF16);
  const MlpWeightsCuda w{none, wu, wd};
  const Tensor n = test::device_from_host(test::host_random({T, H}, 4, 1.0f, true), DType::BF16);
  MlpActsCuda acts;
  mlp_block_forward_cuda(be.env, spec, w, n, acts);
  const std::vector<float> h_fwd = test::device_floats(acts.h);
  mlp_acts_drop_cheap(acts);
  EXPECT_FALSE(acts.h.defined());
  mlp_acts_restore(be.env, spec, acts);
  ASSERT_TRUE(acts.h.defined());
  EXPECT_EQ(test::device_floats(acts.h), h_fwd);

  const Tensor n0 = Tensor::empty({0, H}, DType::BF16, Device::cuda(0));
  MlpActsCuda empty;
  EXPECT_EQ(mlp_block_forward_cuda(be.env, spec, w, n0, empty).shape(), (Shape{0, H}));
  const Tensor g0 = test::host_random({F, H}, 5, 1.0f), g0d = test::host_random({H, F}, 6, 1.0f);
  Tensor gg, gu = cuda::to_device(g0, 0), gd = cuda::to_device(g0d, 0);
  const Tensor dy0 = Tensor::empty({0, H}, DType::BF16, Device::cuda(0));
  EXPECT_EQ(mlp_block_backward_cuda(be.env, spec, w, empty, dy0, MlpGradsCuda{gg, gu, gd}).shape(), (Shape{0, H}));
  EXPECT_EQ(test::device_floats(gu), g0.to_floats());
  EXPECT_EQ(test::device_floats(gd), g0d.to_floats());

  MlpActsCuda refused;
  EXPECT_THROW(mlp_block_forward_cuda(be.env, spec, {wu, wu, wd}, n, refused), Error);  // a gate for ReLU²
  EXPECT_THROW(mlp_block_forward_cuda(be.env, MlpDimsCuda{H, F, Activation::swiglu}, w, n, refused), Error);  // none
  EXPECT_THROW(mlp_block_forward_cuda(be.env, MlpDimsCuda{H, F, Activation::swiglu_oai}, {wu, wu, wd}, n, refused),
               Error);
}

// Selective recompute: h dropped and recomputed from the kept gate|up is bitwise the forward's, so the
// backward is too.
TEST(CudaMlpBlock, RecomputedActivationsAreBitwiseTheForwards) {
  MT_SKIP_WITHOUT_CUDA();
  const int64_t T = 37, H = 64, F = 96;
  BareEnv be;
  const MlpDimsCuda spec{H, F, Activation::swiglu};
  const Tensor wg = test::device_from_host(test::host_random({F, H}, 1, 0.125f, true), DType::BF16);
  const Tensor wu = test::device_from_host(test::host_random({F, H}, 2, 0.125f, true), DType::BF16);
  const Tensor wd = test::device_from_host(test::host_random({H, F}, 3, 0.1f, true), DType::BF16);
  const MlpWeightsCuda w{wg, wu, wd};
  const Tensor n = test::device_from_host(test::host_random({T, H}, 4, 1.0f, true), DType::BF16);
  MlpActsCuda acts;
  mlp_block_forward_cuda(be.env, spec, w, n, acts);
  const std::vector<float> h_fwd = test::device_floats(acts.h);
  mlp_acts_drop_cheap(acts);
  EXPECT_FALSE(acts.n.defined());
  EXPECT_FALSE(acts.h.defined());
  EXPECT_TRUE(acts.gu.defined());
  mlp_acts_restore(be.env, spec, acts);
  ASSERT_TRUE(acts.h.defined());
  EXPECT_EQ(test::device_floats(acts.h), h_fwd);
  // The backward refuses to run without n (the caller restores it: the norm is not the block's).
  const Tensor dy = test::device_from_host(test::host_random({T, H}, 5, 1.0f, true), DType::BF16);
  Tensor gg = dev_zeros({F, H}, DType::F32), gu = dev_zeros({F, H}, DType::F32),
         gd = dev_zeros({H, F}, DType::F32);
  EXPECT_THROW(mlp_block_backward_cuda(be.env, spec, w, acts, dy, MlpGradsCuda{gg, gu, gd}), Error);
}

// No tokens (a rank's empty share): an empty output, and the backward leaves the gradients as they were.
TEST(CudaMlpBlock, ZeroTokens) {
  MT_SKIP_WITHOUT_CUDA();
  const int64_t H = 32, F = 48;
  BareEnv be;
  const MlpDimsCuda spec{H, F, Activation::swiglu};
  const Tensor wg = test::device_from_host(test::host_random({F, H}, 1, 0.2f, true), DType::BF16);
  const Tensor wu = test::device_from_host(test::host_random({F, H}, 2, 0.2f, true), DType::BF16);
  const Tensor wd = test::device_from_host(test::host_random({H, F}, 3, 0.2f, true), DType::BF16);
  const Tensor n = Tensor::empty({0, H}, DType::BF16, Device::cuda(0));
  MlpActsCuda acts;
  const Tensor y = mlp_block_forward_cuda(be.env, spec, {wg, wu, wd}, n, acts);
  EXPECT_EQ(y.shape(), (Shape{0, H}));
  const Tensor g0 = test::host_random({F, H}, 4, 1.0f), g0d = test::host_random({H, F}, 5, 1.0f);
  Tensor gg = cuda::to_device(g0, 0), gu = cuda::to_device(g0, 0), gd = cuda::to_device(g0d, 0);
  const Tensor dy = Tensor::empty({0, H}, DType::BF16, Device::cuda(0));
  const Tensor dn = mlp_block_backward_cuda(be.env, spec, {wg, wu, wd}, acts, dy, MlpGradsCuda{gg, gu, gd});
  EXPECT_EQ(dn.shape(), (Shape{0, H}));
  EXPECT_EQ(test::device_floats(gg), g0.to_floats());
  EXPECT_EQ(test::device_floats(gu), g0.to_floats());
  EXPECT_EQ(test::device_floats(gd), g0d.to_floats());
}

TEST(CudaMlpBlock, RejectsMismatchedShapes) {
  MT_SKIP_WITHOUT_CUDA();
  const int64_t H = 32, F = 48;
  BareEnv be;
  const Tensor wg = dev_zeros({F, H}, DType::BF16), wd = dev_zeros({H, F}, DType::BF16);
  const Tensor wrong = dev_zeros({F, H + 8}, DType::BF16);
  const Tensor f32 = dev_zeros({F, H}, DType::F32);
  const Tensor n = dev_zeros({4, H}, DType::BF16);
  MlpActsCuda acts;
  const MlpDimsCuda spec{H, F, Activation::swiglu};
  EXPECT_THROW(mlp_block_forward_cuda(be.env, spec, {wg, wrong, wd}, n, acts), Error);
  EXPECT_THROW(mlp_block_forward_cuda(be.env, spec, {wg, f32, wd}, n, acts), Error);
  EXPECT_THROW(mlp_block_forward_cuda(be.env, MlpDimsCuda{H, F + 8, Activation::swiglu}, {wg, wg, wd}, n, acts), Error);
  const Tensor n_wide = dev_zeros({4, H + 8}, DType::BF16);
  EXPECT_THROW(mlp_block_forward_cuda(be.env, spec, {wg, wg, wd}, n_wide, acts), Error);
}

}  // namespace
}  // namespace mt
