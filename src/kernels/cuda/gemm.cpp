#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/bias.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"

namespace mt::cuda {

namespace {

struct PlanKey {
  int device;
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  DType ab, c;
  int align_a, align_b, align_c;  // largest power of two (<= 256) dividing each pointer
  // linear_forward_bias: cuBLASLt's bias epilogue (a bias of the output's dtype, one per output column of our
  // row-major C), and the bias pointer's alignment (the heuristic reads it from the descriptor).
  bool bias = false;
  int align_bias = 0;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(k.device));
    mix(k.ta | (k.tb << 1));
    for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc}) mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(k.ab) | (static_cast<uint64_t>(k.c) << 8));
    mix(static_cast<uint64_t>(k.align_a) | (static_cast<uint64_t>(k.align_b) << 16) |
        (static_cast<uint64_t>(k.align_c) << 32));
    mix(static_cast<uint64_t>(k.bias) | (static_cast<uint64_t>(k.align_bias) << 8));
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  int rank = 0, found = 0;  // which of the heuristic's `found` results `algo` is; found 0: no algorithm (a bias
                            // plan the heuristic refused: linear_forward_bias then takes its fallback)
};

// A probe for the benches (bench/NOTES.md 95): MIXTUNE_GEMM_ALGO_RANK=i makes every GEMM take the heuristic's
// i-th result (its last when it offers fewer) instead of its first. Read once.
int algo_rank() {
  static const int rank = [] {
    const char* v = std::getenv("MIXTUNE_GEMM_ALGO_RANK");
    if (!v || !*v) return 0;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || r < 0 || r >= 64)
      fail("environment: MIXTUNE_GEMM_ALGO_RANK must be an integer in 0..63 (found '{}')", v);
    return static_cast<int>(r);
  }();
  return rank;
}

std::mutex g_plans_mutex;
// Never destroyed (descriptors outlive static destruction harmlessly; the driver may be gone by then).
std::unordered_map<PlanKey, Plan, PlanKeyHash>& plans() {
  static auto* m = new std::unordered_map<PlanKey, Plan, PlanKeyHash>();
  return *m;
}

int pointer_alignment(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (u % static_cast<uintptr_t>(a)) != 0) a /= 2;
  return a;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F32: return CUDA_R_32F;
    default: fail("GEMM: unsupported dtype {}", dtype_safetensors_name(t));
  }
}

const char* dt_name(DType t) { return dtype_safetensors_name(t).data(); }

int algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;  // every attribute read here fits 32 bits (the ids are uint32 or uint16 enums)
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
  return static_cast<int>(v);
}

// Builds the cuBLASLt plan. Column-major view of the row-major problem: Cᶜ[N,M] = op(B)ᶜ · op(A)ᶜ,
// so cuBLAS's A is our B and its B is our A; each row-major [r, c] buffer is a column-major [c, r] one.
// A bias plan (k.bias) adds a bias vector of length N (the rows of Cᶜ, our columns) in the epilogue, in fp32
// before the one rounding to C's dtype; `bias` is a pointer of the key's alignment for the heuristic. Where the
// heuristic offers no algorithm for a bias plan, the plan comes back with found = 0 instead of failing.
Plan make_plan(const PlanKey& k, const DeviceContext& ctx, const void* bias) {
  Plan p;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS A = our B
  const cublasOperation_t op_b = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS B = our A
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const cudaDataType_t ab = cuda_type(k.ab), c = cuda_type(k.c);
  if (k.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = c;  // the output's dtype, as cublasLt.h documents for non-IMMA, non-fp8 GEMMs
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // Stored (column-major) shapes: our B is [K,N] row-major (= [N,K] col) or [N,K] when transposed.
  const uint64_t a_rows = k.tb ? k.k : k.n, a_cols = k.tb ? k.n : k.k;
  const uint64_t b_rows = k.ta ? k.m : k.k, b_cols = k.ta ? k.k : k.m;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, ab, a_rows, a_cols, k.ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, ab, b_rows, b_cols, k.lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, c, k.n, k.m, k.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = ctx.workspace_bytes;
  const uint32_t al_a = k.align_b, al_b = k.align_a, al_c = k.align_c;  // cuBLAS A/B swapped
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));
  const int want = algo_rank() + 1;
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(want));
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx.lt, p.desc, p.la, p.lb, p.lc, p.lc, pref, want, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.la);
    cublasLtMatrixLayoutDestroy(p.lb);
    cublasLtMatrixLayoutDestroy(p.lc);
    cublasLtMatmulDescDestroy(p.desc);
    if (k.bias) return Plan{};  // found = 0: the caller's fallback
    fail("cuBLASLt has no algorithm for GEMM M={} N={} K={} trans=({}, {}) {}->{} ld=({}, {}, {}) ({})", k.m, k.n,
         k.k, k.ta, k.tb, dt_name(k.ab), dt_name(k.c), k.lda, k.ldb, k.ldc, cublasLtGetStatusString(st));
  }
  p.found = found;
  p.rank = std::min(want, found) - 1;
  p.algo = results[static_cast<size_t>(p.rank)].algo;
  return p;
}

void check_operand_dtypes(DType ab, DType c) {
  const bool ok = (ab == DType::BF16 && (c == DType::BF16 || c == DType::F32)) || (ab == DType::F32 && c == DType::F32);
  MT_CHECK(ok, "GEMM dtypes {} x {} -> {} are not supported", dt_name(ab), dt_name(ab), dt_name(c));
}

// The GEMM with an optional bias epilogue. Returns false (having queued nothing) for a bias plan that cuBLASLt has
// no algorithm for; a bias-free GEMM always runs or throws.
bool gemm_impl(int device, cudaStream_t stream, int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& a,
               const GemmOperand& b, float beta, void* c, DType c_dtype, int64_t ldc, const void* bias) {
  MT_CHECK(M >= 0 && N >= 0 && K >= 0, "GEMM sizes M={} N={} K={}", M, N, K);
  MT_CHECK(a.dtype == b.dtype, "GEMM operand dtypes differ: {} and {}", dt_name(a.dtype), dt_name(b.dtype));
  check_operand_dtypes(a.dtype, c_dtype);
  if (M == 0 || N == 0) return true;
  MT_CHECK(ldc >= N, "GEMM ldc {} < N {}", ldc, N);
  if (K == 0) {
    if (bias) return false;  // C = bias: the caller's fallback writes it
    MT_CHECK(beta == 0.0f || beta == 1.0f, "GEMM with K=0 needs beta 0 or 1, got {}", beta);
    if (beta == 0.0f) {
      const size_t es = dtype_size(c_dtype);
      MT_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * es, 0, static_cast<size_t>(N) * es,
                                      static_cast<size_t>(M), stream));
    }
    return true;
  }
  MT_CHECK(a.ld >= (a.trans ? M : K) && b.ld >= (b.trans ? K : N), "GEMM leading dims lda={} ldb={} for M={} N={} K={}",
           a.ld, b.ld, M, N, K);
  DeviceContext& ctx = device_context(device);
  PlanKey key{device, a.trans, b.trans, M, N, K, a.ld, b.ld, ldc, a.dtype, c_dtype,
              pointer_alignment(a.ptr), pointer_alignment(b.ptr), pointer_alignment(c),
              bias != nullptr, bias ? pointer_alignment(bias) : 0};
  // The lock is held through cublasLtMatmul (which only queues work) for bias plans: their descriptor takes this
  // call's bias pointer, so two threads must not interleave setting it and using it.
  std::unique_lock<std::mutex> lock(g_plans_mutex);
  auto it = plans().find(key);
  if (it == plans().end()) it = plans().emplace(key, make_plan(key, ctx, bias)).first;
  const Plan* plan = &it->second;  // unordered_map nodes are stable
  if (plan->found == 0) return false;
  if (bias)
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  else
    lock.unlock();
  MT_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, plan->desc, &alpha, b.ptr, plan->la, a.ptr, plan->lb, &beta, c, plan->lc, c,
                                 plan->lc, &plan->algo, ctx.workspace, ctx.workspace_bytes, stream));
  return true;
}

std::atomic<bool> g_bias_epilogue{true};

}  // namespace

namespace detail {
void linear_bias_epilogue_set(bool on) { g_bias_epilogue.store(on); }
}  // namespace detail

void gemm(int device, cudaStream_t stream, int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& a,
          const GemmOperand& b, float beta, void* c, DType c_dtype, int64_t ldc) {
  gemm_impl(device, stream, M, N, K, alpha, a, b, beta, c, c_dtype, ldc, nullptr);
}

namespace {
int64_t leading_rows(const Tensor& t) { return shape_numel(Shape(t.shape().begin(), t.shape().end() - 1)); }

int same_cuda_device(const Tensor& a, const Tensor& b, const Tensor& c, const char* what) {
  MT_CHECK(a.device().is_cuda() && a.device() == b.device() && a.device() == c.device(), "{}: tensors on {}, {}, {}",
           what, a.device().str(), b.device().str(), c.device().str());
  return a.device().index;
}
}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, Tensor& y, cudaStream_t stream) {
  MT_CHECK(w.ndim() == 2 && x.ndim() >= 1 && y.ndim() >= 1 && x.dim(-1) == w.dim(1) && y.dim(-1) == w.dim(0) &&
               leading_rows(x) == leading_rows(y),
           "linear_forward: x {} w {} y {}", x.desc(), w.desc(), y.desc());
  const int dev = same_cuda_device(x, w, y, "linear_forward");
  const int64_t M = leading_rows(x), N = w.dim(0), K = w.dim(1);
  gemm(dev, stream, M, N, K, 1.0f, {x.data(), x.dtype(), K, false}, {w.data(), w.dtype(), K, true}, 0.0f, y.data(),
       y.dtype(), N);
}

void linear_forward_bias(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, cudaStream_t stream) {
  MT_CHECK(w.ndim() == 2 && x.ndim() >= 1 && y.ndim() >= 1 && x.dim(-1) == w.dim(1) && y.dim(-1) == w.dim(0) &&
               leading_rows(x) == leading_rows(y),
           "linear_forward_bias: x {} w {} y {}", x.desc(), w.desc(), y.desc());
  MT_CHECK(b.defined() && b.ndim() == 1 && b.dim(0) == w.dim(0) &&
               (b.dtype() == DType::BF16 || b.dtype() == DType::F32),
           "linear_forward_bias: bias {} for weight {}", b.defined() ? b.desc() : "undefined", w.desc());
  const int dev = same_cuda_device(x, w, y, "linear_forward_bias");
  MT_CHECK(b.device() == y.device(), "linear_forward_bias: bias on {}, output on {}", b.device().str(),
           y.device().str());
  const int64_t M = leading_rows(x), N = w.dim(0), K = w.dim(1);
  if (M == 0 || N == 0) return;
  const GemmOperand xa{x.data(), x.dtype(), K, false}, wb{w.data(), w.dtype(), K, true};
  // The epilogue takes a bias of y's dtype; other biases, K = 0 and shapes cuBLASLt refuses take the fallback.
  if (g_bias_epilogue.load() && b.dtype() == y.dtype() &&
      gemm_impl(dev, stream, M, N, K, 1.0f, xa, wb, 0.0f, y.data(), y.dtype(), N, b.data()))
    return;
  // Fallback: the fp32 product, then y = round(acc + b) in one kernel (bias.h): the same single rounding.
  Tensor acc = y.dtype() == DType::F32 ? y : Tensor::empty(y.shape(), DType::F32, y.device());
  gemm(dev, stream, M, N, K, 1.0f, xa, wb, 0.0f, acc.data(), DType::F32, N);
  bias_add_rows(acc, b, y, stream);
}

void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx, cudaStream_t stream, float beta) {
  MT_CHECK(w.ndim() == 2 && dy.ndim() >= 1 && dx.ndim() >= 1 && dy.dim(-1) == w.dim(0) && dx.dim(-1) == w.dim(1) &&
               leading_rows(dy) == leading_rows(dx),
           "linear_backward_input: dy {} w {} dx {}", dy.desc(), w.desc(), dx.desc());
  const int dev = same_cuda_device(dy, w, dx, "linear_backward_input");
  const int64_t M = leading_rows(dy), N = w.dim(1), K = w.dim(0);
  gemm(dev, stream, M, N, K, 1.0f, {dy.data(), dy.dtype(), K, false}, {w.data(), w.dtype(), N, false}, beta,
       dx.data(), dx.dtype(), N);
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, cudaStream_t stream, float beta) {
  MT_CHECK(dw.ndim() == 2 && dy.ndim() >= 1 && x.ndim() >= 1 && dy.dim(-1) == dw.dim(0) && x.dim(-1) == dw.dim(1) &&
               leading_rows(dy) == leading_rows(x),
           "linear_backward_weight: dy {} x {} dw {}", dy.desc(), x.desc(), dw.desc());
  const int dev = same_cuda_device(dy, x, dw, "linear_backward_weight");
  const int64_t M = dw.dim(0), N = dw.dim(1), K = leading_rows(dy);
  gemm(dev, stream, M, N, K, 1.0f, {dy.data(), dy.dtype(), M, true}, {x.data(), x.dtype(), N, false}, beta, dw.data(),
       dw.dtype(), N);
}

int64_t gemm_plan_count() {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  return static_cast<int64_t>(plans().size());
}

std::string gemm_plan_description(int64_t M, int64_t N, int64_t K) {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  for (const auto& [k, p] : plans()) {
    if (k.m != M || k.n != N || k.k != K || p.found == 0) continue;
    const cublasLtMatmulAlgo_t& a = p.algo;
    return fmt::format("rank {} of {}: algo {} tile {} stages {} split-k {} swizzle {}", p.rank, p.found,
                       algo_config(a, CUBLASLT_ALGO_CONFIG_ID), algo_config(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                       algo_config(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), algo_config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                       algo_config(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
  }
  return "no plan";
}

}  // namespace mt::cuda
