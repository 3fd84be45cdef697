// Grouped expert GEMM at Qwen3-30B-A3B layer shapes (hidden 2048, moe_intermediate 768, 128 experts,
// top-8, 4096 tokens by default) against a cuBLASLt dense GEMM of the same FLOPs, plus the permutation
// kernels around it. Prints one JSON object: per op the time, TFLOP/s (GB/s for the memory-bound ops)
// and the ratio to cuBLASLt.
//
// usage: mixtune_bench_grouped_gemm [--tokens N] [--hidden H] [--inter I] [--experts E] [--topk K]
//                                   [--balanced | --uniform] [--reps R] [--no-check] [--energy-seconds S] [--only S]
//                                   [--alternate K]
// Each "gemm" row also times cuBLASLt's strided batch of E GEMMs of N / E rows each (cublaslt_batched_*): the
// balanced routing's problem, each expert's weights read for its own rows, as cuBLAS runs it.
// --only S runs only the GEMM rows whose name contains S (e.g. fwd_gate_up_sm90: short processes to alternate).
// --alternate K times the Hopper forward/dgrad K times each on the static tile walk and with claimed tiles,
// alternating in one process ("static_vs_claimed": medians). "tile_schedule_model" gives, for this routing, the
// busiest block's load in tiles under both schedules for a tail tile costing 1 / 0.8 / 0.6 / 0.5 of a full one.
// --energy-seconds S also runs each wgmma op and each cuBLASLt twin back to back for S seconds: sustained TFLOP/s
// and picojoules per FLOP from the GPU's energy counter (kernels/cuda/gpu_energy.h).
// --no-check skips the wgmma rows' comparison with mma.sync (each copies the whole output to the host: at
// 8192 tokens a run takes ~100 s with it, ~45 s without); their diff fields are then 0.
// On a cc 9.0 GPU (sm_90a build) every product is also timed on the TMA + wgmma kernels ("gemm_sm90":
// fwd_*, dgrad_*, wgrad_* (accumulating into F32 or BF16 dW), with the largest difference from the
// mma.sync output); the "gemm" rows run whatever grouped_gemm picks by default (wgmma there).
// Routing: each token takes the top-k of (N(0,1) noise + a per-expert bias ~ N(0, 0.5)), a skewed load
// like a trained router's; --uniform drops the bias (every expert equally likely: the counts scatter ~ +- 16 around
// N / E, like the standard workload's router at random initialisation); --balanced gives every expert the same
// count (results say which).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "core/float_convert.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm_kernels.h"
#include "kernels/cuda/moe_permute.h"
#include "bench_timing.h"
#include "sustained_run.h"

namespace {

using mt_bench::time_ms;

using mt::DType;
using mt::Tensor;
using mt_bench::Sustained;
using mt_bench::sustained;
using mt_bench::sustained_json;

struct Args {
  int64_t tokens = 4096, hidden = 2048, inter = 768, experts = 128, topk = 8;
  bool balanced = false;
  bool uniform = false;  // --uniform: top-k of N(0,1) noise, no per-expert bias
  bool check = true;  // --no-check: time the wgmma rows only (no mma.sync run, no host comparison)
  int reps = 20;
  double energy_seconds = 0;  // --energy-seconds S: also run each wgmma op and its cuBLASLt twin for S seconds
  // --only S: run only the GEMM rows whose name contains S (short processes for alternating A/B runs: the rows of
  // one process drift as the GPU warms, bench/NOTES.md 74).
  std::string only;
  // --alternate K: time each Hopper forward/dgrad K times on the static tile walk and K times with claimed tiles,
  // alternating, and report both medians (one process, drift shared by both: bench/NOTES.md 79).
  int alternate = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", s.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (s == "--tokens")
      a.tokens = next();
    else if (s == "--hidden")
      a.hidden = next();
    else if (s == "--inter")
      a.inter = next();
    else if (s == "--experts")
      a.experts = next();
    else if (s == "--topk")
      a.topk = next();
    else if (s == "--reps")
      a.reps = static_cast<int>(next());
    else if (s == "--balanced")
      a.balanced = true;
    else if (s == "--uniform")
      a.uniform = true;
    else if (s == "--no-check")
      a.check = false;
    else if (s == "--energy-seconds")
      a.energy_seconds = static_cast<double>(next());
    else if (s == "--alternate") {
      const int64_t k = next();
      if (k < 0 || k > 1000) {
        std::fprintf(stderr, "--alternate: %lld runs, need 0 to 1000\n", static_cast<long long>(k));
        std::exit(2);
      }
      a.alternate = static_cast<int>(k);
    }
    else if (s == "--only") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "--only needs a value\n");
        std::exit(2);
      }
      a.only = argv[++i];
    }
    else {
      std::fprintf(stderr, "unknown argument %s\n", s.c_str());
      std::exit(2);
    }
  }
  if (a.balanced && a.uniform) {
    std::fprintf(stderr, "--balanced and --uniform: choose one routing\n");
    std::exit(2);
  }
  return a;
}

// Random bf16 device tensor (values ~ N(0, scale)), filled on the host once.
Tensor random_bf16(const mt::Shape& s, uint64_t seed, float scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Tensor h = Tensor::empty(s, DType::BF16);
  uint16_t* p = h.data_as<uint16_t>();
  for (int64_t i = 0; i < h.numel(); ++i) p[i] = mt::float_to_bf16(d(g));
  return mt::cuda::to_device(h, 0);
}

// Row-major dense GEMM through cuBLASLt (column-major underneath):
//   nt:  C[M][N] (bf16)  = A[M][K] · B[N][K]ᵀ
//   nn:  C[M][N] (bf16)  = A[M][K] · B[K][N]
//   tn:  C[M][N] (fp32) += A[K][M]ᵀ · B[K][N]
// batch > 1: that many independent GEMMs of these sizes, operands and outputs packed one after the other (a
// strided batch): the balanced grouped GEMM's problem (every expert the same rows) as cuBLAS solves it.
struct DenseGemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  float beta = 0.0f;
  const void *a = nullptr, *b = nullptr;
  void* c = nullptr;

  DenseGemm(const char* kind, int64_t M, int64_t N, int64_t K, const void* A, const void* B, void* C,
            int64_t batch = 1)
      : a(A), b(B), c(C) {
    mt::cuda::DeviceContext& ctx = mt::cuda::device_context(0);
    // Column-major view: Cc [N, M] = op(Bc) · op(Ac), the arguments swapped.
    cublasOperation_t op_first, op_second;
    int64_t first_rows, first_cols, first_ld, second_rows, second_cols, second_ld;
    cudaDataType_t ct = CUDA_R_16BF;
    const std::string k = kind;
    if (k == "nt") {  // B[N][K] = col-major [K, N] -> T ; A[M][K] = col-major [K, M] -> N
      op_first = CUBLAS_OP_T, first_rows = K, first_cols = N, first_ld = K;
      op_second = CUBLAS_OP_N, second_rows = K, second_cols = M, second_ld = K;
    } else if (k == "nn") {  // B[K][N] = col-major [N, K] -> N ; A[M][K] = col-major [K, M] -> N
      op_first = CUBLAS_OP_N, first_rows = N, first_cols = K, first_ld = N;
      op_second = CUBLAS_OP_N, second_rows = K, second_cols = M, second_ld = K;
    } else {  // tn: B[K][N] = col-major [N, K] -> N ; A[K][M] = col-major [M, K] -> T
      op_first = CUBLAS_OP_N, first_rows = N, first_cols = K, first_ld = N;
      op_second = CUBLAS_OP_T, second_rows = M, second_cols = K, second_ld = M;
      ct = CUDA_R_32F;
      beta = 1.0f;
    }
    MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, first_rows, first_cols, first_ld));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, second_rows, second_cols, second_ld));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, ct, N, M, N));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      const int64_t strides[3] = {first_rows * first_cols, second_rows * second_cols, M * N};
      cublasLtMatrixLayout_t layouts[3] = {la, lb, lc};
      for (int i = 0; i < 3; ++i) {
        MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                         sizeof(count)));
        MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &strides[i], sizeof(strides[i])));
      }
    }
    cublasLtMatmulPreference_t pref;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ctx.workspace_bytes;
    MT_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    MT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt, desc, la, lb, lc, lc, pref, 1, &res, &found));
    if (found == 0) {
      std::fprintf(stderr, "cuBLASLt has no algorithm for %s %lld x %lld x %lld\n", kind, (long long)M, (long long)N,
                   (long long)K);
      std::exit(1);
    }
    algo = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run() {
    mt::cuda::DeviceContext& ctx = mt::cuda::device_context(0);
    const float alpha = 1.0f;
    // First operand is B (see above), second is A.
    MT_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, desc, &alpha, b, la, a, lb, &beta, c, lc, c, lc, &algo, ctx.workspace,
                                   ctx.workspace_bytes, ctx.stream));
  }
  ~DenseGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
};

// The static tile walk against claimed tiles, as a model (bench/NOTES.md 79): the 256-wide tile's tiles in the
// kernel's order (expert-major, n fastest), a full tile costing 1 and an expert's last tile with <= 64 rows
// costing c; static: block b takes tiles b, b + blocks, ...; claimed: each next tile to the block that is free
// first. Returns the busiest block's load for each.
struct ScheduleModel {
  double static_max, claimed_max, mean;
};
ScheduleModel schedule_model(const std::vector<int64_t>& counts, int ntn, int blocks, double c) {
  std::vector<double> cost;
  for (int64_t rows : counts)
    for (int64_t m0 = 0; m0 < rows; m0 += 128)
      for (int n = 0; n < ntn; ++n) cost.push_back(rows - m0 <= 64 ? c : 1.0);
  std::vector<double> st(static_cast<size_t>(blocks), 0.0);
  for (size_t i = 0; i < cost.size(); ++i) st[i % st.size()] += cost[i];
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int b = 0; b < blocks; ++b) free_at.push(0.0);
  double claimed = 0, total = 0;
  for (double x : cost) {
    const double f = free_at.top() + x;
    free_at.pop();
    free_at.push(f);
    claimed = std::max(claimed, f);
    total += x;
  }
  return {*std::max_element(st.begin(), st.end()), claimed, total / blocks};
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    mt::cuda::DeviceContext& ctx = mt::cuda::device_context(0);
    cudaStream_t st = ctx.stream;
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const int64_t T = a.tokens, H = a.hidden, I = a.inter, E = a.experts, k = a.topk, N = T * k;

    // Routing on the host (top-k of noise + per-expert bias), then the device plan.
    std::mt19937_64 g(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> bias(E);
    for (auto& b : bias) b = a.balanced || a.uniform ? 0.0f : 0.5f * nd(g);
    Tensor idx_h = Tensor::empty({T, k}, DType::I32);
    int32_t* idx = idx_h.data_as<int32_t>();
    std::vector<int> order(E);
    std::vector<float> score(E);
    for (int64_t t = 0; t < T; ++t) {
      if (a.balanced) {
        for (int64_t s = 0; s < k; ++s) idx[t * k + s] = static_cast<int32_t>((t * k + s) % E);
        continue;
      }
      for (int64_t e = 0; e < E; ++e) score[e] = nd(g) + bias[e], order[e] = static_cast<int>(e);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int x, int y) { return score[x] > score[y]; });
      for (int64_t s = 0; s < k; ++s) idx[t * k + s] = order[s];
    }
    std::vector<int64_t> counts(E, 0);
    for (int64_t i = 0; i < N; ++i) counts[idx[i]]++;
    const int64_t cmin = *std::min_element(counts.begin(), counts.end()),
                  cmax = *std::max_element(counts.begin(), counts.end());
    const int64_t empty = std::count(counts.begin(), counts.end(), 0);
    Tensor index = mt::cuda::to_device(idx_h, 0);
    mt::cuda::MoePlan plan = mt::cuda::moe_plan(index, E, st);

    Tensor x = random_bf16({T, H}, 1, 1.0f), xg = random_bf16({N, H}, 2, 1.0f);
    Tensor w1 = random_bf16({E, 2 * I, H}, 3, 0.02f), w2 = random_bf16({E, H, I}, 4, 0.02f);
    Tensor gu = random_bf16({N, 2 * I}, 5, 1.0f), act = random_bf16({N, I}, 6, 1.0f);
    Tensor y = random_bf16({N, H}, 7, 1.0f), dy = random_bf16({N, H}, 8, 1.0f);
    Tensor dact = random_bf16({N, I}, 9, 1.0f), dgu = random_bf16({N, 2 * I}, 10, 1.0f);
    Tensor dxg = random_bf16({N, H}, 11, 1.0f);
    auto zeros_f32 = [&](const mt::Shape& s) {
      Tensor t = Tensor::empty(s, DType::F32, mt::Device::cuda(0));
      mt::cuda::fill_zero_async(t, ctx.stream);
      return t;
    };
    Tensor dw1 = zeros_f32({E, 2 * I, H}), dw2 = zeros_f32({E, H, I});
    Tensor wts = mt::cuda::to_device(Tensor::from_floats({T, k}, std::vector<float>(T * k, 0.125f)), 0);
    Tensor out = Tensor::empty({T, H}, DType::BF16, mt::Device::cuda(0));
    Tensor dwts = Tensor::empty({T, k}, DType::F32, mt::Device::cuda(0));
    // Dense operands for cuBLASLt of the same sizes (one big "expert").
    Tensor dense_w1 = random_bf16({2 * I, H}, 12, 0.02f), dense_w2 = random_bf16({H, I}, 13, 0.02f);
    Tensor ddw1 = zeros_f32({2 * I, H}), ddw2 = zeros_f32({H, I});
    Tensor dense_out = Tensor::empty({N, 2 * I}, DType::BF16, mt::Device::cuda(0));
    Tensor dense_out2 = Tensor::empty({N, H}, DType::BF16, mt::Device::cuda(0));
    Tensor dense_out3 = Tensor::empty({N, I}, DType::BF16, mt::Device::cuda(0));

    struct Row {
      std::string op;
      double flops, ms, dense_ms, batched_ms;
      Sustained dense_sustained;
    };
    std::vector<Row> rows;
    const auto selected = [&](const std::string& op) { return a.only.empty() || op.find(a.only) != std::string::npos; };
    // Every expert with the same rows, Mb = N / E (the balanced routing's count): what the weight re-reads of
    // 128 small GEMMs leave cuBLAS (the dense GEMM reads one weight matrix for all N rows).
    const int64_t Mb = N / E;
    // batched: the strided-batch twin, its FLOPs 2 · E · Mb · (its sizes) = flops · E · Mb / N.
    // (None where the experts average under one row: Mb = 0.) The batched wgrad accumulates into the grouped
    // wgrad's F32 dW (same [E][M][N] shape; every compared run of it overwrites first).
    auto batched_gemm = [&](const char* kind, int64_t M, int64_t Nn, int64_t K, const void* A, const void* B, void* C) {
      return Mb > 0 ? std::make_unique<DenseGemm>(kind, M, Nn, K, A, B, C, E) : nullptr;
    };
    auto gemm_row = [&](const char* op, double flops, auto&& grouped, DenseGemm& dense,
                        const std::unique_ptr<DenseGemm>& batched) {
      if (!selected(op)) return;
      const double ms = time_ms(a.reps, st, grouped);
      const double dms = time_ms(a.reps, st, [&] { dense.run(); });
      const double bms = batched ? time_ms(a.reps, st, [&] { batched->run(); }) : 0.0;
      rows.push_back({op, flops, ms, dms, bms, sustained(a.energy_seconds, flops, st, [&] { dense.run(); })});
    };
    const double f_gu = 2.0 * N * (2 * I) * H, f_dn = 2.0 * N * H * I;
    {
      DenseGemm d("nt", N, 2 * I, H, xg.data(), dense_w1.data(), dense_out.data());
      std::unique_ptr<DenseGemm> b = batched_gemm("nt", Mb, 2 * I, H, xg.data(), w1.data(), dense_out.data());
      gemm_row(
          "fwd_gate_up", f_gu, [&] { mt::cuda::grouped_gemm_forward(xg, w1, plan.offsets, gu, st); }, d, b);
    }
    {
      DenseGemm d("nt", N, H, I, act.data(), dense_w2.data(), dense_out2.data());
      std::unique_ptr<DenseGemm> b = batched_gemm("nt", Mb, H, I, act.data(), w2.data(), dense_out2.data());
      gemm_row(
          "fwd_down", f_dn, [&] { mt::cuda::grouped_gemm_forward(act, w2, plan.offsets, y, st); }, d, b);
    }
    {
      DenseGemm d("nn", N, I, H, dy.data(), dense_w2.data(), dense_out3.data());
      std::unique_ptr<DenseGemm> b = batched_gemm("nn", Mb, I, H, dy.data(), w2.data(), dense_out3.data());
      gemm_row(
          "dgrad_down", f_dn, [&] { mt::cuda::grouped_gemm_dgrad(dy, w2, plan.offsets, dact, st); }, d, b);
    }
    {
      DenseGemm d("nn", N, H, 2 * I, dgu.data(), dense_w1.data(), dense_out2.data());
      std::unique_ptr<DenseGemm> b = batched_gemm("nn", Mb, H, 2 * I, dgu.data(), w1.data(), dense_out2.data());
      gemm_row(
          "dgrad_gate_up", f_gu, [&] { mt::cuda::grouped_gemm_dgrad(dgu, w1, plan.offsets, dxg, st); }, d, b);
    }
    {
      DenseGemm d("tn", H, I, N, dy.data(), act.data(), ddw2.data());
      std::unique_ptr<DenseGemm> b = batched_gemm("tn", H, I, Mb, dy.data(), act.data(), dw2.data());
      gemm_row(
          "wgrad_down", f_dn, [&] { mt::cuda::grouped_gemm_wgrad(dy, act, plan.offsets, dw2, true, st); }, d, b);
    }
    {
      DenseGemm d("tn", 2 * I, H, N, dgu.data(), xg.data(), ddw1.data());
      std::unique_ptr<DenseGemm> b = batched_gemm("tn", 2 * I, H, Mb, dgu.data(), xg.data(), dw1.data());
      gemm_row(
          "wgrad_gate_up", f_gu, [&] { mt::cuda::grouped_gemm_wgrad(dgu, xg, plan.offsets, dw1, true, st); }, d, b);
    }
    // The Hopper forward (TMA + wgmma) on the same operands, and how far its output is from mma.sync's.
    struct Sm90Row {
      std::string op;
      double flops, ms, max_abs_diff, max_abs_ref;
      int64_t non_finite;
      Sustained sus;
    };
    std::vector<Sm90Row> sm90;
    struct AltRow {
      std::string op;
      double static_ms, claimed_ms;
    };
    std::vector<AltRow> alternating;
    namespace det = mt::cuda::detail;
    if (ctx.cc_major == 9 && det::grouped_gemm_sm90_compiled()) {
      // run() writes `out`; it runs once on each kernel (compared), then timed() is timed on the wgmma one.
      auto sm90_row2 = [&](const char* op, double flops, Tensor& out, auto&& run, auto&& timed) {
        if (!selected(op)) return;
        if (!a.check) {
          det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Wgmma);
          const double ms = time_ms(a.reps, st, timed);
          const Sustained sus = sustained(a.energy_seconds, flops, st, timed);
          det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Auto);
          sm90.push_back({op, flops, ms, 0.0, 0.0, 0, sus});
          return;
        }
        det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::MmaSync);
        run();
        const std::vector<float> ref = mt::cuda::to_host(out).to_floats();
        det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Wgmma);
        run();
        const std::vector<float> got = mt::cuda::to_host(out).to_floats();
        double diff = 0, refmax = 0;
        int64_t non_finite = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          if (!std::isfinite(got[i])) {
            ++non_finite;
            continue;
          }
          diff = std::max(diff, std::fabs(double(got[i]) - ref[i]));
          refmax = std::max(refmax, std::fabs(double(ref[i])));
        }
        const double ms = time_ms(a.reps, st, timed);
        const Sustained sus = sustained(a.energy_seconds, flops, st, timed);
        det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Auto);
        sm90.push_back({op, flops, ms, diff, refmax, non_finite, sus});
      };
      auto sm90_row = [&](const char* op, double flops, Tensor& out, auto&& run) { sm90_row2(op, flops, out, run, run); };
      sm90_row("fwd_gate_up_sm90", f_gu, gu, [&] { mt::cuda::grouped_gemm_forward(xg, w1, plan.offsets, gu, st); });
      sm90_row("fwd_down_sm90", f_dn, y, [&] { mt::cuda::grouped_gemm_forward(act, w2, plan.offsets, y, st); });
      sm90_row("dgrad_down_sm90", f_dn, dact, [&] { mt::cuda::grouped_gemm_dgrad(dy, w2, plan.offsets, dact, st); });
      sm90_row("dgrad_gate_up_sm90", f_gu, dxg,
               [&] { mt::cuda::grouped_gemm_dgrad(dgu, w1, plan.offsets, dxg, st); });
      if (a.alternate > 0) {
        auto alternate_row = [&](const char* op, auto&& run) {
          if (!selected(op)) return;
          std::vector<double> t_static, t_claimed;
          det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Wgmma);
          for (int i = 0; i < a.alternate; ++i) {
            det::grouped_gemm_sm90_dynamic_set(0);
            t_static.push_back(time_ms(a.reps, st, run));
            det::grouped_gemm_sm90_dynamic_set(1);
            t_claimed.push_back(time_ms(a.reps, st, run));
          }
          det::grouped_gemm_sm90_dynamic_set(-1);
          det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Auto);
          auto median = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
          };
          alternating.push_back({op, median(t_static), median(t_claimed)});
        };
        alternate_row("fwd_gate_up_sm90", [&] { mt::cuda::grouped_gemm_forward(xg, w1, plan.offsets, gu, st); });
        alternate_row("fwd_down_sm90", [&] { mt::cuda::grouped_gemm_forward(act, w2, plan.offsets, y, st); });
        alternate_row("dgrad_down_sm90", [&] { mt::cuda::grouped_gemm_dgrad(dy, w2, plan.offsets, dact, st); });
        alternate_row("dgrad_gate_up_sm90", [&] { mt::cuda::grouped_gemm_dgrad(dgu, w1, plan.offsets, dxg, st); });
      }
      // wgrad: compared when overwriting, timed accumulating (the training pattern), into F32 and BF16 dW.
      Tensor dw1h = Tensor::empty({E, 2 * I, H}, DType::BF16, mt::Device::cuda(0));
      Tensor dw2h = Tensor::empty({E, H, I}, DType::BF16, mt::Device::cuda(0));
      mt::cuda::fill_zero_async(dw1h, st);
      mt::cuda::fill_zero_async(dw2h, st);
      for (Tensor* dwp : {&dw2, &dw2h}) {
        const bool h16 = dwp == &dw2h;
        sm90_row2(h16 ? "wgrad_down_bf16dw_sm90" : "wgrad_down_sm90", f_dn, *dwp,
                  [&] { mt::cuda::grouped_gemm_wgrad(dy, act, plan.offsets, *dwp, false, st); },
                  [&] { mt::cuda::grouped_gemm_wgrad(dy, act, plan.offsets, *dwp, true, st); });
      }
      for (Tensor* dwp : {&dw1, &dw1h}) {
        const bool h16 = dwp == &dw1h;
        sm90_row2(h16 ? "wgrad_gate_up_bf16dw_sm90" : "wgrad_gate_up_sm90", f_gu, *dwp,
                  [&] { mt::cuda::grouped_gemm_wgrad(dgu, xg, plan.offsets, *dwp, false, st); },
                  [&] { mt::cuda::grouped_gemm_wgrad(dgu, xg, plan.offsets, *dwp, true, st); });
      }
      // A first pass into bf16 dW (stores only, no reduce-adds): what the reduce traffic costs (bench/NOTES.md 35).
      sm90_row2("wgrad_down_bf16dw_store_sm90", f_dn, dw2h,
                [&] { mt::cuda::grouped_gemm_wgrad(dy, act, plan.offsets, dw2h, false, st); },
                [&] { mt::cuda::grouped_gemm_wgrad(dy, act, plan.offsets, dw2h, false, st); });
      sm90_row2("wgrad_gate_up_bf16dw_store_sm90", f_gu, dw1h,
                [&] { mt::cuda::grouped_gemm_wgrad(dgu, xg, plan.offsets, dw1h, false, st); },
                [&] { mt::cuda::grouped_gemm_wgrad(dgu, xg, plan.offsets, dw1h, false, st); });
      // Last (the GPU warms up over the run, so rows after them would read slower): the claimed-tile schedule
      // (`_dyn`), then mainloop probes of the forward's 256-wide tile (outputs not compared: without stores or
      // loads they are garbage): stage count, the 128 x 384 tile, the epilogue's share (no stores), and the tensor
      // cores without TMA loads.
      struct Probe {
        const char* suffix;
        det::GroupedSm90Probe p;
        bool dynamic = false;  // the claimed-tile schedule (detail::grouped_gemm_sm90_dynamic_set)
      };
      const Probe probes[] = {{"_dyn", {}, true},
                              {"_s3", {3, true, true}},
                              {"_s4", {4, true, true}},
                              {"_n384", {0, true, true, 384}},
                              {"_s3", {3, true, true}},
                              {"_s4", {4, true, true}},
                              {"_n384", {0, true, true, 384}},
                              {"_s3_nostore", {3, false, true}},
                              {"_s4_nostore", {4, false, true}},
                              {"_s4_noload", {4, true, false}}};
      for (const Probe& pr : probes) {
        auto probe_row = [&](const char* op, double flops, auto&& run) {
          if (!selected(std::string(op) + pr.suffix)) return;
          det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Wgmma);
          det::grouped_gemm_sm90_probe_set(pr.p);
          det::grouped_gemm_sm90_dynamic_set(pr.dynamic ? 1 : 0);
          const double ms = time_ms(a.reps, st, run);
          const Sustained sus = sustained(a.energy_seconds, flops, st, run);
          det::grouped_gemm_sm90_dynamic_set(-1);
          det::grouped_gemm_sm90_probe_set({});
          det::grouped_gemm_fwd_kernel_set(det::GroupedFwdKernel::Auto);
          sm90.push_back({std::string(op) + pr.suffix, flops, ms, 0.0, 0.0, 0, sus});
        };
        probe_row("fwd_gate_up_sm90", f_gu, [&] { mt::cuda::grouped_gemm_forward(xg, w1, plan.offsets, gu, st); });
        probe_row("fwd_down_sm90", f_dn, [&] { mt::cuda::grouped_gemm_forward(act, w2, plan.offsets, y, st); });
        if (!pr.p.store || !pr.p.load) continue;  // the dgrad has the stage and 384-wide probes only
        probe_row("dgrad_down_sm90", f_dn, [&] { mt::cuda::grouped_gemm_dgrad(dy, w2, plan.offsets, dact, st); });
        probe_row("dgrad_gate_up_sm90", f_gu, [&] { mt::cuda::grouped_gemm_dgrad(dgu, w1, plan.offsets, dxg, st); });
      }
    }
    // Memory-bound permutation kernels: bytes moved per call.
    struct MemRow {
      std::string op;
      double bytes, ms;
    };
    std::vector<MemRow> mem;
    mem.push_back({"plan", N * 4.0 * 3, time_ms(a.reps, st, [&] { plan = mt::cuda::moe_plan(index, E, st); })});
    mem.push_back({"gather", 2.0 * N * H * 2, time_ms(a.reps, st, [&] { xg = mt::cuda::moe_gather(x, plan, st); })});
    mem.push_back(
        {"combine", (N + T) * H * 2.0, time_ms(a.reps, st, [&] { mt::cuda::moe_combine(y, wts, plan, out, st); })});
    mem.push_back({"combine_backward", (T + 2.0 * N) * H * 2,
                   time_ms(a.reps, st, [&] { mt::cuda::moe_combine_backward(out, y, wts, plan, dy, dwts, st); })});
    mem.push_back({"gather_backward", (N + T) * H * 2.0,
                   time_ms(a.reps, st, [&] { mt::cuda::moe_gather_backward(dxg, plan, out, st); })});

    double tot_flops = 0, tot_ms = 0, tot_dense = 0;
    std::printf("{\"bench\": \"grouped_gemm\", \"gpu\": \"%s\", \"sms\": %d,\n", prop.name, prop.multiProcessorCount);
    std::printf(
        " \"shape\": {\"tokens\": %lld, \"hidden\": %lld, \"moe_intermediate\": %lld, \"experts\": %lld, "
        "\"top_k\": %lld, \"routing\": \"%s\", \"rows_per_expert_min\": %lld, \"rows_per_expert_max\": %lld, "
        "\"empty_experts\": %lld, \"checked_against_mma_sync\": %s},\n",
        (long long)T, (long long)H, (long long)I, (long long)E, (long long)k,
        a.balanced ? "balanced" : a.uniform ? "uniform-random" : "skewed-random",
        (long long)cmin, (long long)cmax, (long long)empty, a.check ? "true" : "false");
    std::printf(" \"gemm\": [\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      tot_flops += r.flops, tot_ms += r.ms, tot_dense += r.dense_ms;
      std::printf(
          "  {\"op\": \"%s\", \"gflop\": %.1f, \"ms\": %.4f, \"tflops\": %.1f, \"cublaslt_dense_ms\": %.4f, "
          "\"cublaslt_dense_tflops\": %.1f, \"ratio_to_dense\": %.3f, \"cublaslt_batched_rows\": %lld, "
          "\"cublaslt_batched_ms\": %.4f, \"cublaslt_batched_tflops\": %.1f%s}%s\n",
          r.op.c_str(), r.flops * 1e-9, r.ms, r.flops / r.ms * 1e-9, r.dense_ms, r.flops / r.dense_ms * 1e-9,
          r.dense_ms / r.ms, static_cast<long long>(Mb), r.batched_ms,
          r.batched_ms > 0 ? r.flops * static_cast<double>(E * Mb) / static_cast<double>(N) / r.batched_ms * 1e-9 : 0.0,
          sustained_json(r.dense_sustained, "cublaslt_dense_").c_str(), i + 1 < rows.size() ? "," : "");
    }
    std::printf(" ],\n \"gemm_total\": {\"ms\": %.4f, \"tflops\": %.1f, \"cublaslt_dense_tflops\": %.1f},\n", tot_ms,
                tot_ms > 0 ? tot_flops / tot_ms * 1e-9 : 0.0, tot_dense > 0 ? tot_flops / tot_dense * 1e-9 : 0.0);
    std::printf(" \"gemm_sm90\": [\n");
    for (size_t i = 0; i < sm90.size(); ++i) {
      const Sm90Row& r = sm90[i];
      std::printf(
          "  {\"op\": \"%s\", \"gflop\": %.1f, \"ms\": %.4f, \"tflops\": %.1f, \"max_abs_diff_vs_mma_sync\": %.4g, "
          "\"max_abs_out\": %.4g, \"non_finite\": %lld%s}%s\n",
          r.op.c_str(), r.flops * 1e-9, r.ms, r.flops / r.ms * 1e-9, r.max_abs_diff, r.max_abs_ref,
          static_cast<long long>(r.non_finite), sustained_json(r.sus, "").c_str(),
          i + 1 < sm90.size() ? "," : "");
    }
    std::printf(" ],\n");
    if (!alternating.empty()) {
      std::printf(" \"static_vs_claimed\": [\n");
      for (size_t i = 0; i < alternating.size(); ++i)
        std::printf("  {\"op\": \"%s\", \"runs\": %d, \"static_ms_median\": %.4f, \"claimed_ms_median\": %.4f, "
                    "\"claimed_over_static\": %.3f}%s\n",
                    alternating[i].op.c_str(), a.alternate, alternating[i].static_ms, alternating[i].claimed_ms,
                    alternating[i].claimed_ms / alternating[i].static_ms, i + 1 < alternating.size() ? "," : "");
      std::printf(" ],\n");
    }
    // The tile-schedule model of this routing (256-wide tiles, output widths 2I, H, I, H; busiest block's tiles).
    std::printf(" \"tile_schedule_model\": [\n");
    const struct {
      const char* op;
      int64_t width;
    } widths[] = {{"fwd_gate_up", 2 * I}, {"fwd_down", H}, {"dgrad_down", I}, {"dgrad_gate_up", H}};
    for (size_t i = 0; i < 4; ++i) {
      std::printf("  {\"op\": \"%s\"", widths[i].op);
      for (double c : {1.0, 0.8, 0.6, 0.5}) {
        const ScheduleModel m = schedule_model(counts, static_cast<int>((widths[i].width + 255) / 256),
                                               prop.multiProcessorCount, c);
        std::printf(", \"tail_cost_%.1f\": {\"static_max\": %.2f, \"claimed_max\": %.2f, \"mean\": %.2f}", c,
                    m.static_max, m.claimed_max, m.mean);
      }
      std::printf("}%s\n", i + 1 < 4 ? "," : "");
    }
    std::printf(" ],\n");
    std::printf(" \"memory_bound\": [\n");
    for (size_t i = 0; i < mem.size(); ++i)
      std::printf("  {\"op\": \"%s\", \"ms\": %.4f, \"gbps\": %.0f}%s\n", mem[i].op.c_str(), mem[i].ms,
                  mem[i].bytes / mem[i].ms * 1e-6, i + 1 < mem.size() ? "," : "");
    std::printf(" ]}\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
