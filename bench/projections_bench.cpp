// The attention block's dense projections at Qwen3-30B-A3B layer shapes (one micro-batch of 4096 tokens by
// default), through the same cuBLASLt path training uses (kernels/cuda/gemm.h): forward, input gradient and weight
// gradient (fp32 dW accumulated, beta 1) of q_proj, k_proj, v_proj and o_proj one GEMM each, and of q, k, v as one
// GEMM over the stacked weight [Wq; Wk; Wv] (forward N = (Hq + 2·Hkv)·D, input gradient K = that, weight gradient
// M = that) — what a fused QKV projection would run instead of three. Then the LM head's three GEMMs over the
// vocabulary (logits, input gradient, fp32 weight gradient), as the chunked cross-entropy runs them. A dense 8192³
// GEMM gives the ceiling.
//
// usage: mixtune_bench_projections [--tokens T] [--hidden H] [--heads Hq] [--kv-heads Hkv] [--head-dim D]
//                                  [--vocab V] [--reps R] [--energy-ms MS] [--head-only 1]
// Prints one JSON object: per row the op, its shape, ms per call, TFLOP/s and cuBLASLt's algorithm for it; with
// --energy-ms each row also runs back to back for MS ms: sustained TFLOP/s and pJ per FLOP (bench/sustained_run.h).
// MIXTUNE_GEMM_ALGO_RANK=i makes every GEMM take the heuristic's i-th algorithm (kernels/cuda/gemm.cpp).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/random_fill.h"
#include "bench_args.h"
#include "bench_timing.h"
#include "sustained_run.h"

namespace {

using mt::Device;
using mt::DType;
using mt::Tensor;
using mt::cuda::GemmOperand;
using mt_bench::time_ms;

struct Args {
  int64_t tokens = 4096, hidden = 2048, heads = 32, kv_heads = 4, head_dim = 128, vocab = 151936, reps = 50,
          energy_ms = 0, head_only = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  mt_bench::parse_int_options(argc, argv,
                              {{"--tokens", &a.tokens}, {"--hidden", &a.hidden}, {"--heads", &a.heads},
                               {"--kv-heads", &a.kv_heads}, {"--head-dim", &a.head_dim}, {"--vocab", &a.vocab},
                               {"--reps", &a.reps}, {"--energy-ms", &a.energy_ms},
                               {"--head-only", &a.head_only}},
                              "mixtune_bench_projections [--tokens T] [--hidden H] [--heads Hq] [--kv-heads Hkv] "
                              "[--head-dim D] [--vocab V] [--reps R] [--energy-ms MS] [--head-only 1]");
  return a;
}

Tensor normal(const mt::Shape& shape, DType dt, cudaStream_t st) {
  Tensor t = Tensor::empty(shape, dt, Device::cuda(0));
  mt::cuda::fill_normal(t, 0.02f, 1234, st);
  return t;
}

struct Row {
  std::string op;
  int64_t m, n, k;
  double ms;
  mt_bench::Sustained sustained;
  std::string algo;
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  MT_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t st = mt::cuda::device_context(0).stream;
  const int64_t T = a.tokens, H = a.hidden, nq = a.heads * a.head_dim, nkv = a.kv_heads * a.head_dim;
  const int64_t nqkv = nq + 2 * nkv;
  const DType bf = DType::BF16;

  Tensor x = normal({T, H}, bf, st);           // the normed block input
  Tensor w_qkv = normal({nqkv, H}, bf, st);    // [Wq; Wk; Wv], each part a projection's weight
  Tensor w_o = normal({H, nq}, bf, st);
  Tensor qkv = normal({T, nqkv}, bf, st);      // outputs (forward) / their gradients (backward), row-major
  Tensor o = normal({T, nq}, bf, st);
  Tensor dx = normal({T, H}, bf, st);
  Tensor dw_qkv = Tensor::empty({nqkv, H}, DType::F32, Device::cuda(0));
  Tensor dw_o = Tensor::empty({H, nq}, DType::F32, Device::cuda(0));
  MT_CUDA_CHECK(cudaMemsetAsync(dw_qkv.data(), 0, dw_qkv.nbytes(), st));
  MT_CUDA_CHECK(cudaMemsetAsync(dw_o.data(), 0, dw_o.nbytes(), st));

  auto bfp = [](const Tensor& t, int64_t offset) { return static_cast<const char*>(t.data()) + 2 * offset; };
  std::vector<Row> rows;
  auto gemm_row = [&](const std::string& op, int64_t M, int64_t N, int64_t K, GemmOperand A, GemmOperand B, float beta,
                      void* c, DType cd, int64_t ldc) {
    auto call = [&] { mt::cuda::gemm(0, st, M, N, K, 1.0f, A, B, beta, c, cd, ldc); };
    const double ms = time_ms(static_cast<int>(a.reps), st, call);
    const mt_bench::Sustained sus =
        mt_bench::sustained(static_cast<double>(a.energy_ms) * 1e-3, 2.0 * M * N * K, st, call);
    rows.push_back({op, M, N, K, ms, sus, mt::cuda::gemm_plan_description(M, N, K)});
  };
  // One projection of `out` rows of the stacked weight starting at row r0 (its own contiguous output and gradient
  // buffers, as the unfused layer has them: ld = out), and the same for the stacked whole (ld = nqkv).
  auto projection = [&](const std::string& name, int64_t r0, int64_t out) {
    char* y = static_cast<char*>(qkv.data());
    gemm_row(name + " forward", T, out, H, {x.data(), bf, H, false}, {bfp(w_qkv, r0 * H), bf, H, true}, 0.0f, y, bf,
             out);
    gemm_row(name + " input grad", T, H, out, {y, bf, out, false}, {bfp(w_qkv, r0 * H), bf, H, false},
             name == "q" || name == "qkv" ? 0.0f : 1.0f, dx.data(), bf, H);
    gemm_row(name + " weight grad", out, H, T, {y, bf, out, true}, {x.data(), bf, H, false}, 1.0f,
             static_cast<float*>(dw_qkv.data()) + r0 * H, DType::F32, H);
  };
  if (!a.head_only) {
    projection("q", 0, nq);
    projection("k", nq, nkv);
    projection("v", nq + nkv, nkv);
    projection("qkv", 0, nqkv);
    gemm_row("o forward", T, H, nq, {o.data(), bf, nq, false}, {w_o.data(), bf, nq, true}, 0.0f, dx.data(), bf, H);
    gemm_row("o input grad", T, nq, H, {dx.data(), bf, H, false}, {w_o.data(), bf, nq, false}, 0.0f, o.data(), bf,
             nq);
    gemm_row("o weight grad", H, nq, T, {dx.data(), bf, H, true}, {o.data(), bf, nq, false}, 1.0f, dw_o.data(),
             DType::F32, nq);
  }
  {
    // The LM head over one chunk of T rows (training: the rows with a target): logits [T, V] = x·Wᵀ,
    // dx [T, H] = dlogits·W, dW [V, H] += dlogitsᵀ·x.
    const int64_t V = a.vocab;
    Tensor w_head = normal({V, H}, bf, st), logits = normal({T, V}, bf, st);
    Tensor dw_head = Tensor::empty({V, H}, DType::F32, Device::cuda(0));
    MT_CUDA_CHECK(cudaMemsetAsync(dw_head.data(), 0, dw_head.nbytes(), st));
    gemm_row("head forward", T, V, H, {x.data(), bf, H, false}, {w_head.data(), bf, H, true}, 0.0f, logits.data(), bf,
             V);
    gemm_row("head input grad", T, H, V, {logits.data(), bf, V, false}, {w_head.data(), bf, H, false}, 0.0f,
             dx.data(), bf, H);
    gemm_row("head weight grad", V, H, T, {logits.data(), bf, V, true}, {x.data(), bf, H, false}, 1.0f,
             dw_head.data(), DType::F32, H);
  }
  if (!a.head_only) {
    const int64_t n = 8192;
    Tensor p = normal({n, n}, bf, st), q = normal({n, n}, bf, st), r = Tensor::empty({n, n}, bf, Device::cuda(0));
    gemm_row("dense 8192^3", n, n, n, {p.data(), bf, n, false}, {q.data(), bf, n, true}, 0.0f, r.data(), bf, n);
  }

  std::printf("{\n  \"tokens\": %lld, \"hidden\": %lld, \"q_out\": %lld, \"kv_out\": %lld, \"reps\": %lld,\n"
              "  \"rows\": [\n",
              static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(nq),
              static_cast<long long>(nkv), static_cast<long long>(a.reps));
  double sep[3] = {0, 0, 0};  // q + k + v per pass, against the fused row
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double tflops = 2.0 * r.m * r.n * r.k / (r.ms * 1e-3) / 1e12;
    if (!a.head_only && i < 9) sep[i % 3] += r.ms;
    std::printf("    {\"op\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"ms\": %.4f, \"tflops\": %.1f%s, "
                "\"algo\": \"%s\"}%s\n",
                r.op.c_str(), static_cast<long long>(r.m), static_cast<long long>(r.n), static_cast<long long>(r.k),
                r.ms, tflops, mt_bench::sustained_json(r.sustained, "").c_str(), r.algo.c_str(),
                i + 1 < rows.size() ? "," : "");
  }
  if (a.head_only) {
    std::printf("  ]\n}\n");
    return 0;
  }
  std::printf("  ],\n  \"q_k_v_separate_ms\": {\"forward\": %.4f, \"input_grad\": %.4f, \"weight_grad\": %.4f},\n",
              sep[0], sep[1], sep[2]);
  std::printf("  \"qkv_fused_ms\": {\"forward\": %.4f, \"input_grad\": %.4f, \"weight_grad\": %.4f}\n}\n", rows[9].ms,
              rows[10].ms, rows[11].ms);
  return 0;
}
