#include "kernels/cuda/adamw.h"

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

// kAligned16: every array of the tensor starts 16-byte aligned (the vector path may run).
enum : uint8_t { kParamF32 = 1, kParamBf16 = 2, kGradBf16 = 4, kHasMaster = 8, kAligned16 = 16 };

struct AdamWLaunch {
  MultiTensorTable table;
  void* param[kMultiTensorMax];
  float* master[kMultiTensorMax];
  const void* grad[kMultiTensorMax];
  void* m[kMultiTensorMax];
  void* v[kMultiTensorMax];
  int64_t offset[kMultiTensorMax];
  float decay_mul[kMultiTensorMax];
  uint8_t flags[kMultiTensorMax];
};

struct AdamWScalars {
  float w1, beta2, one_minus_b2, bc2_sqrt, eps, neg_step;
  bool moments_bf16;
  uint64_t seed;
};

// at::lerp as torch computes it: an fma on the side of the smaller weight.
__device__ inline float lerp_torch(float self, float end, float w) {
  const float d = __fsub_rn(end, self);
  return fabsf(w) < 0.5f ? fmaf(w, d, self) : fmaf(-d, __fsub_rn(1.0f, w), end);
}

// 16 random bits per element for stochastic rounding: a 32-bit integer hash (lowbias32) of the element
// index folded with the step's seed. 32-bit multiplies only: the pure-bf16 update is arithmetic-bound,
// and a 64-bit mix per element cost more than the memory traffic.
__device__ inline uint32_t hash32(uint32_t seed, uint64_t index) {
  uint32_t x = seed ^ static_cast<uint32_t>(index) ^ (static_cast<uint32_t>(index >> 32) * 0x9e3779b9u);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Stochastic rounding to bf16: add 16 random bits below the kept ones and truncate, so the expected
// value equals the fp32 value. Non-finite values round to nearest.
__device__ inline bf16 bf16_stochastic(float v, uint32_t r) {
  if (!isfinite(v)) return __float2bfloat16_rn(v);
  const uint32_t bits = (__float_as_uint(v) + (r & 0xffffu)) & 0xffff0000u;
  return __ushort_as_bfloat16(static_cast<unsigned short>(bits >> 16));
}

// One element of torch's _single_tensor_adamw, op by op (no contraction into fma except inside lerp, as
// torch): updates p, m, v in place.
__device__ inline void adamw_element(float g, float& p, float& m, float& v, const AdamWScalars& s, float decay_mul,
                                     const float* clip, float coef) {
  if (clip) g = __fmul_rn(g, coef);
  p = __fmul_rn(p, decay_mul);
  m = lerp_torch(m, g, s.w1);
  v = __fmul_rn(v, s.beta2);
  v = __fadd_rn(v, __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step, m), denom));
}

// N consecutive elements from a bf16 or fp32 array; VEC: one 16-byte access per 8 bf16 / 4 fp32.
template <int N, bool VEC>
__device__ inline void load_n(const void* base, bool is_bf16, int64_t k, float (&out)[N]) {
  if (is_bf16) {
    const bf16* p = static_cast<const bf16*>(base) + k;
    if constexpr (VEC && N % 8 != 0) {  // N = 4: one 8-byte access
      static_assert(N == 4, "vector loads take 4 or a multiple of 8 elements");
      const uint2 raw = *reinterpret_cast<const uint2*>(p);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const float2 f = __bfloat1622float2(h[q]);
        out[2 * q] = f.x, out[2 * q + 1] = f.y;
      }
    } else if constexpr (VEC) {
#pragma unroll
      for (int j = 0; j < N; j += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p + j);
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 f = __bfloat1622float2(h[q]);
          out[j + 2 * q] = f.x, out[j + 2 * q + 1] = f.y;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) out[j] = __bfloat162float(p[j]);
    }
  } else {
    const float* p = static_cast<const float*>(base) + k;
    if constexpr (VEC) {
#pragma unroll
      for (int j = 0; j < N; j += 4) {
        const float4 f = *reinterpret_cast<const float4*>(p + j);
        out[j] = f.x, out[j + 1] = f.y, out[j + 2] = f.z, out[j + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) out[j] = p[j];
    }
  }
}

// Stores N values to a bf16 (round to nearest) or fp32 array.
template <int N, bool VEC>
__device__ inline void store_n(void* base, bool is_bf16, int64_t k, const float (&in)[N]) {
  if (is_bf16) {
    bf16* p = static_cast<bf16*>(base) + k;
    if constexpr (VEC && N % 8 != 0) {
      uint2 raw;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
      h[0] = __floats2bfloat162_rn(in[0], in[1]);
      h[1] = __floats2bfloat162_rn(in[2], in[3]);
      *reinterpret_cast<uint2*>(p) = raw;
    } else if constexpr (VEC) {
#pragma unroll
      for (int j = 0; j < N; j += 8) {
        uint4 raw;
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
        for (int q = 0; q < 4; ++q) h[q] = __floats2bfloat162_rn(in[j + 2 * q], in[j + 2 * q + 1]);
        *reinterpret_cast<uint4*>(p + j) = raw;
      }
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) p[j] = __float2bfloat16_rn(in[j]);
    }
  } else {
    float* p = static_cast<float*>(base) + k;
    if constexpr (VEC) {
#pragma unroll
      for (int j = 0; j < N; j += 4) *reinterpret_cast<float4*>(p + j) = make_float4(in[j], in[j + 1], in[j + 2], in[j + 3]);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) p[j] = in[j];
    }
  }
}

// Elements k .. k + N - 1 of tensor i: loads issued together (memory-level parallelism: the update is
// bandwidth-bound), the math per element, then the stores. VEC needs k % 8 == 0 and 16-byte aligned arrays.
template <int N, bool VEC>
__device__ inline void adamw_elements(const AdamWLaunch& L, int i, int64_t k, const AdamWScalars& s,
                                      uint32_t seed32, const float* clip, float coef) {
  const uint8_t f = L.flags[i];
  float g[N], p[N], m[N], v[N];
  load_n<N, VEC>(L.grad[i], f & kGradBf16, k, g);
  if (f & kHasMaster)
    load_n<N, VEC>(L.master[i], false, k, p);
  else
    load_n<N, VEC>(L.param[i], f & kParamBf16, k, p);
  load_n<N, VEC>(L.m[i], s.moments_bf16, k, m);
  load_n<N, VEC>(L.v[i], s.moments_bf16, k, v);
  const float decay_mul = L.decay_mul[i];
#pragma unroll
  for (int j = 0; j < N; ++j) adamw_element(g[j], p[j], m[j], v[j], s, decay_mul, clip, coef);
  store_n<N, VEC>(L.m[i], s.moments_bf16, k, m);
  store_n<N, VEC>(L.v[i], s.moments_bf16, k, v);
  if (f & kHasMaster) {
    store_n<N, VEC>(L.master[i], false, k, p);
    store_n<N, VEC>(L.param[i], true, k, p);
  } else if (f & kParamBf16) {
    bf16* out = static_cast<bf16*>(L.param[i]) + k;
    alignas(16) bf16 r[N];
#pragma unroll
    for (int j = 0; j < N; ++j) r[j] = bf16_stochastic(p[j], hash32(seed32, static_cast<uint64_t>(L.offset[i] + k + j)));
    if constexpr (VEC && N % 8 != 0) {
      *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(r);
    } else if constexpr (VEC) {  // one 16-byte store per 8 (eight 2-byte stores per thread cost more than the math)
#pragma unroll
      for (int j = 0; j < N; j += 8) *reinterpret_cast<uint4*>(out + j) = *reinterpret_cast<const uint4*>(r + j);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) out[j] = r[j];
    }
  } else {
    store_n<N, VEC>(L.param[i], false, k, p);
  }
}

// Eight elements of a tensor whose arrays are all bf16 (parameter without master, gradient, both moments):
// one 16-byte load per array, all four in flight, kept packed (16 registers) and unpacked pair by pair for
// the math, so the wider access costs no spills; the same element math and rounding as adamw_elements.
__device__ inline void adamw_elements_bf16x8(const AdamWLaunch& L, int i, int64_t k, const AdamWScalars& s,
                                             uint32_t seed32, const float* clip, float coef) {
  const uint4 graw = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(L.grad[i]) + k);
  const uint4 praw = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(L.param[i]) + k);
  const uint4 mraw = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(L.m[i]) + k);
  const uint4 vraw = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(L.v[i]) + k);
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&graw);
  const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&praw);
  const __nv_bfloat162* m2 = reinterpret_cast<const __nv_bfloat162*>(&mraw);
  const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(&vraw);
  uint4 pout, mout, vout;
  __nv_bfloat162* po = reinterpret_cast<__nv_bfloat162*>(&pout);
  __nv_bfloat162* mo = reinterpret_cast<__nv_bfloat162*>(&mout);
  __nv_bfloat162* vo = reinterpret_cast<__nv_bfloat162*>(&vout);
  const float decay_mul = L.decay_mul[i];
  const uint64_t at = static_cast<uint64_t>(L.offset[i] + k);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 g = __bfloat1622float2(g2[q]);
    float2 p = __bfloat1622float2(p2[q]), m = __bfloat1622float2(m2[q]), v = __bfloat1622float2(v2[q]);
    adamw_element(g.x, p.x, m.x, v.x, s, decay_mul, clip, coef);
    adamw_element(g.y, p.y, m.y, v.y, s, decay_mul, clip, coef);
    mo[q] = __floats2bfloat162_rn(m.x, m.y);
    vo[q] = __floats2bfloat162_rn(v.x, v.y);
    po[q] = __halves2bfloat162(bf16_stochastic(p.x, hash32(seed32, at + 2 * q)),
                               bf16_stochastic(p.y, hash32(seed32, at + 2 * q + 1)));
  }
  *reinterpret_cast<uint4*>(static_cast<bf16*>(L.m[i]) + k) = mout;
  *reinterpret_cast<uint4*>(static_cast<bf16*>(L.v[i]) + k) = vout;
  *reinterpret_cast<uint4*>(static_cast<bf16*>(L.param[i]) + k) = pout;
}

// Elements per thread per pass of the vector path (one 16-byte access per bf16 array).
// Four elements per thread per pass (one 16-byte access per fp32 array, 8 bytes per bf16 one) and three
// 512-thread blocks per SM (≤ 40 registers). Measured with ncu on the H200 (bench/NOTES.md 27): with eight
// elements per thread and two blocks per SM the fp32-master update ran at 1.3 TB/s (44.5 ms for 1.87 B
// parameters); this shape runs it at 3.9 TB/s (14.3 ms) and the pure-bf16 update at 3.5 TB/s (7.9 ms, was 8.4).
constexpr int kAdamwVec = 4;
constexpr int kAdamwVecBf16 = 8;
static_assert(kChunkElems % kAdamwVecBf16 == 0, "chunks start on a vector boundary");

__global__ void __launch_bounds__(kMultiTensorThreads, 3)
    adamw_kernel(AdamWLaunch L, AdamWScalars s, const float* __restrict__ clip) {
  pdl_wait();
  const int64_t b = blockIdx.x;
  const int i = table_tensor(L.table, b);
  const int64_t begin = (b - L.table.chunk_begin[i]) * kChunkElems;  // a multiple of kAdamwVec
  const int64_t end = min(L.table.numel[i], begin + kChunkElems);
  const float coef = clip ? *clip : 1.0f;
  const uint32_t seed32 = static_cast<uint32_t>(s.seed ^ (s.seed >> 32));
  int64_t tail = begin;
  const uint8_t f = L.flags[i];
  if ((f & kAligned16) && (f & kParamBf16) && (f & kGradBf16) && !(f & kHasMaster) && s.moments_bf16) {
    // Every array bf16 (the pure-bf16 experts): eight elements per thread, one 16-byte access per array.
    tail = begin + (end - begin) / kAdamwVecBf16 * kAdamwVecBf16;
    for (int64_t k = begin + kAdamwVecBf16 * threadIdx.x; k < tail; k += kAdamwVecBf16 * blockDim.x)
      adamw_elements_bf16x8(L, i, k, s, seed32, clip, coef);
  } else if (f & kAligned16) {
    tail = begin + (end - begin) / kAdamwVec * kAdamwVec;
    for (int64_t k = begin + kAdamwVec * threadIdx.x; k < tail; k += kAdamwVec * blockDim.x)
      adamw_elements<kAdamwVec, true>(L, i, k, s, seed32, clip, coef);
  }
  for (int64_t k = tail + threadIdx.x; k < end; k += blockDim.x) adamw_elements<1, false>(L, i, k, s, seed32, clip, coef);
}


__global__ void bf16_to_f32_kernel(const bf16* __restrict__ in, float* __restrict__ out, int64_t n) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);
}

}  // namespace

CudaAdamW::CudaAdamW(std::vector<std::pair<std::string, Tensor*>> params, CudaAdamWOptions options,
                     const std::function<bool(const std::string&)>& decays, cudaStream_t stream,
                     const std::vector<int64_t>& element_offsets)
    : options_(options) {
  const char* op = "CudaAdamW";
  const AdamWOptions& o = options.hyper;
  MT_CUDA_REQUIRE(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
                  std::string(op) + ": betas must be in [0, 1) (found " + std::to_string(o.beta1) + ", " +
                      std::to_string(o.beta2) + ")");
  MT_CUDA_REQUIRE(o.eps >= 0 && o.weight_decay >= 0 && o.lr >= 0,
                  std::string(op) + ": lr, eps and weight_decay must be >= 0");
  MT_CUDA_REQUIRE(options.moment_dtype == DType::F32 || options.moment_dtype == DType::BF16,
                  std::string(op) + ": moments must be F32 or BF16");
  int64_t offset = 0;
  for (auto& [name, p] : params) {
    MT_CUDA_REQUIRE(p && p->defined() && p->device().is_cuda() &&
                        (p->dtype() == DType::F32 || p->dtype() == DType::BF16),
                    std::string(op) + ": parameter '" + name + "' must be an F32 or BF16 CUDA tensor, got " +
                        (p ? tensor_where(*p) : std::string("null")));
    if (slots_.empty()) device_ = p->device().index;
    MT_CUDA_REQUIRE(p->device().index == device_, std::string(op) + ": parameter '" + name + "' is on " +
                                                      p->device().str() + ", others on cuda:" + std::to_string(device_));
    Slot s;
    s.name = name;
    s.param = p;
    const Device d = p->device();
    s.exp_avg = Tensor::empty(p->shape(), options.moment_dtype, d);
    s.exp_avg_sq = Tensor::empty(p->shape(), options.moment_dtype, d);
    fill_zero_async(s.exp_avg, stream);
    fill_zero_async(s.exp_avg_sq, stream);
    if (p->dtype() == DType::BF16 && options.bf16_master) {
      s.master = Tensor::empty(p->shape(), DType::F32, d);
      if (p->numel() > 0) {
        launch_kernel(bf16_to_f32_kernel, blocks_for(p->numel(), 256), 256, 0, stream, p->data_as<bf16>(),
            s.master.data_as<float>(), p->numel());
      }
    }
    s.decay = decays ? decays(name) : true;
    s.offset = slots_.size() < element_offsets.size() ? element_offsets[slots_.size()] : offset;
    offset += p->numel();
    slots_.push_back(std::move(s));
  }
}

void CudaAdamW::step(const std::vector<const Tensor*>& grads, double lr, const Tensor* clip_coef, cudaStream_t stream) {
  const char* op = "CudaAdamW::step";
  MT_CUDA_REQUIRE(grads.size() == slots_.size(), std::string(op) + ": " + std::to_string(grads.size()) +
                                                     " gradients for " + std::to_string(slots_.size()) + " parameters");
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Tensor* g = grads[i];
    const Slot& s = slots_[i];
    MT_CUDA_REQUIRE(g && g->defined() && g->shape() == s.param->shape() && g->device() == s.param->device() &&
                        (g->dtype() == DType::F32 || g->dtype() == DType::BF16),
                    std::string(op) + ": gradient of '" + s.name + "' must be F32|BF16 " + shape_str(s.param->shape()) +
                        " on " + s.param->device().str() + ", got " + (g ? tensor_where(*g) : std::string("null")));
  }
  ++step_;
  if (slots_.empty()) return;  // a sharded optimizer's rank that owns no parameter (train/optimizer_shards.h)
  if (clip_coef) check_tensor(*clip_coef, op, device_, DType::F32, 1);
  // As torch: Python floats (double) for the bias corrections, rounded to float where they enter fp32 math.
  const AdamWOptions& o = options_.hyper;
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step_));
  AdamWScalars sc;
  sc.w1 = static_cast<float>(1.0 - o.beta1);
  sc.beta2 = static_cast<float>(o.beta2);
  sc.one_minus_b2 = static_cast<float>(1.0 - o.beta2);
  sc.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  sc.eps = static_cast<float>(o.eps);
  sc.neg_step = static_cast<float>(-(lr / bc1));
  sc.moments_bf16 = options_.moment_dtype == DType::BF16;
  sc.seed = options_.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(step_) * 0xd1b54a32d192ed03ull;
  const float decay_mul = static_cast<float>(1.0 - lr * o.weight_decay);
  const float* clip = clip_coef ? clip_coef->data_as<float>() : nullptr;

  AdamWLaunch L{};
  auto flush = [&]() {
    if (L.table.count == 0) return;
    const int64_t blocks = table_finish(L.table);
    launch_kernel(adamw_kernel, static_cast<unsigned>(blocks), kMultiTensorThreads, 0, stream, L, sc, clip);
    L.table.count = 0;
  };
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.param->numel() == 0) continue;
    const int c = L.table.count;
    L.param[c] = s.param->data();
    L.master[c] = s.master.defined() ? s.master.data_as<float>() : nullptr;
    L.grad[c] = grads[i]->data();
    L.m[c] = s.exp_avg.data();
    L.v[c] = s.exp_avg_sq.data();
    L.offset[c] = s.offset;
    L.decay_mul[c] = s.decay ? decay_mul : 1.0f;
    const bool aligned = aligned16(L.param[c]) && aligned16(L.master[c]) && aligned16(L.grad[c]) &&
                         aligned16(L.m[c]) && aligned16(L.v[c]);
    L.flags[c] = static_cast<uint8_t>((s.param->dtype() == DType::BF16 ? kParamBf16 : kParamF32) |
                                      (grads[i]->dtype() == DType::BF16 ? kGradBf16 : 0) |
                                      (s.master.defined() ? kHasMaster : 0) | (aligned ? kAligned16 : 0));
    L.table.numel[c] = s.param->numel();
    if (++L.table.count == kMultiTensorMax) flush();
  }
  flush();
}

std::vector<OptimizerStateSpec> CudaAdamW::state_specs(const std::string& name, const Tensor& param,
                                                       const CudaAdamWOptions& options) {
  std::vector<OptimizerStateSpec> r = {{name + ".exp_avg", param.shape(), options.moment_dtype},
                                       {name + ".exp_avg_sq", param.shape(), options.moment_dtype}};
  if (param.dtype() == DType::BF16 && options.bf16_master) r.push_back({name + ".master", param.shape(), DType::F32});
  return r;
}

std::vector<std::pair<std::string, Tensor*>> CudaAdamW::named_state() {
  std::vector<std::pair<std::string, Tensor*>> r;
  for (Slot& s : slots_) {
    r.emplace_back(s.name + ".exp_avg", &s.exp_avg);
    r.emplace_back(s.name + ".exp_avg_sq", &s.exp_avg_sq);
    if (s.master.defined()) r.emplace_back(s.name + ".master", &s.master);
  }
  return r;
}

}  // namespace mt::cuda
