#include "train/adamw.h"

#include <cmath>

#include "core/error.h"
#include "core/float_convert.h"

namespace mt {

namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = int64_t{1} << 15;

// at::lerp as torch's vectorized CPU kernel computes it (ATen/native/cpu/Lerp.h): a fused
// multiply-add on the side of the smaller weight, so the result is exact at weight 0 and 1.
// The fixture comparison (AdamW.MatchesTorchFixture) is bit-exact only with the fma.
inline float lerp_torch(float self, float end, float w) {
  return std::abs(w) < 0.5f ? std::fma(w, end - self, self) : std::fma(-(end - self), 1.0f - w, end);
}

struct StepScalars {
  float decay_mul;   // 1 - lr*wd (1 when the parameter does not decay)
  float w1;          // 1 - beta1, the lerp weight
  float beta2;
  float one_minus_b2;
  float bc2_sqrt;    // sqrt(1 - beta2^t)
  float eps;
  float neg_step;    // -lr / (1 - beta1^t)
};

// One element of torch's _single_tensor_adamw, op by op in fp32.
inline float adamw_element(float p, float g, float& m, float& v, const StepScalars& s) {
  p = p * s.decay_mul;
  m = lerp_torch(m, g, s.w1);
  v = v * s.beta2;
  v = v + s.one_minus_b2 * g * g;
  float denom = std::sqrt(v) / s.bc2_sqrt + s.eps;
  return p + s.neg_step * m / denom;
}

}  // namespace

bool adamw_hf_decays(const std::string& name) {
  for (const char* pat : {"bias", "layernorm", "rmsnorm", "_norm.", ".norm."})
    if (name.find(pat) != std::string::npos) return false;
  return name.rfind("norm.", 0) != 0;  // a top-level "norm.weight"
}

AdamW::AdamW(std::vector<std::pair<std::string, Tensor*>> params, AdamWOptions options,
             const std::function<bool(const std::string&)>& decays)
    : options_(options) {
  if (!(options.beta1 >= 0 && options.beta1 < 1) || !(options.beta2 >= 0 && options.beta2 < 1))
    fail("AdamW: betas must be in [0, 1) (found {}, {})", options.beta1, options.beta2);
  if (!(options.eps >= 0) || !(options.weight_decay >= 0) || !(options.lr >= 0))
    fail("AdamW: lr, eps and weight_decay must be >= 0 (found {}, {}, {})", options.lr, options.eps,
         options.weight_decay);
  for (auto& [name, p] : params) {
    MT_CHECK(p && p->defined(), "AdamW parameter '{}' is undefined", name);
    if (p->dtype() != DType::F32 && p->dtype() != DType::BF16)
      fail("AdamW: parameter '{}' has dtype {} (expected F32 or BF16)", name, dtype_safetensors_name(p->dtype()));
    if (!p->device().is_cpu()) fail("AdamW: parameter '{}' is on {} (this optimizer runs on the CPU)", name, p->device().str());
    Slot s;
    s.name = name;
    s.param = p;
    s.exp_avg = Tensor::zeros(p->shape(), DType::F32);
    s.exp_avg_sq = Tensor::zeros(p->shape(), DType::F32);
    if (p->dtype() == DType::BF16 && options.master_weights) s.master = p->to(DType::F32);
    s.decay = decays ? decays(name) : true;
    slots_.push_back(std::move(s));
  }
}

void AdamW::step(const std::vector<const Tensor*>& grads, double lr) {
  if (grads.size() != slots_.size())
    fail("AdamW: {} gradients for {} parameters", grads.size(), slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Tensor* g = grads[i];
    const Slot& s = slots_[i];
    if (!g || !g->defined()) fail("AdamW: gradient of '{}' is undefined", s.name);
    if (g->shape() != s.param->shape())
      fail("AdamW: gradient of '{}' has shape {} (expected {})", s.name, shape_str(g->shape()),
           shape_str(s.param->shape()));
    if (g->dtype() != DType::F32 && g->dtype() != DType::BF16)
      fail("AdamW: gradient of '{}' has dtype {} (expected F32 or BF16)", s.name, dtype_safetensors_name(g->dtype()));
    if (!g->device().is_cpu()) fail("AdamW: gradient of '{}' is on {}", s.name, g->device().str());
  }
  ++step_;
  // As torch: Python floats (double) for the bias corrections, each scalar then enters a
  // float tensor op and is rounded to float there.
  const AdamWOptions& o = options_;
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step_));
  StepScalars sc;
  sc.w1 = static_cast<float>(1.0 - o.beta1);
  sc.beta2 = static_cast<float>(o.beta2);
  sc.one_minus_b2 = static_cast<float>(1.0 - o.beta2);
  sc.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  sc.eps = static_cast<float>(o.eps);
  sc.neg_step = static_cast<float>(-(lr / bc1));

  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    StepScalars ps = sc;
    ps.decay_mul = s.decay ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
    const int64_t n = s.param->numel();
    float* m = s.exp_avg.data_as<float>();
    float* v = s.exp_avg_sq.data_as<float>();
    const bool g_bf16 = grads[i]->dtype() == DType::BF16;
    const float* g32 = g_bf16 ? nullptr : grads[i]->data_as<float>();
    const uint16_t* g16 = g_bf16 ? grads[i]->data_as<uint16_t>() : nullptr;
    if (s.master.defined()) {
      float* w = s.master.data_as<float>();
      uint16_t* out = s.param->data_as<uint16_t>();
#pragma omp parallel for if (n >= kParallelMin)
      for (int64_t k = 0; k < n; ++k) {
        float g = g_bf16 ? bf16_to_float(g16[k]) : g32[k];
        w[k] = adamw_element(w[k], g, m[k], v[k], ps);
        out[k] = float_to_bf16(w[k]);
      }
    } else if (s.param->dtype() == DType::BF16) {
      uint16_t* w = s.param->data_as<uint16_t>();
#pragma omp parallel for if (n >= kParallelMin)
      for (int64_t k = 0; k < n; ++k) {
        float g = g_bf16 ? bf16_to_float(g16[k]) : g32[k];
        w[k] = float_to_bf16(adamw_element(bf16_to_float(w[k]), g, m[k], v[k], ps));
      }
    } else {
      float* w = s.param->data_as<float>();
#pragma omp parallel for if (n >= kParallelMin)
      for (int64_t k = 0; k < n; ++k) {
        float g = g_bf16 ? bf16_to_float(g16[k]) : g32[k];
        w[k] = adamw_element(w[k], g, m[k], v[k], ps);
      }
    }
  }
}

std::vector<OptimizerStateSpec> AdamW::state_specs(const std::string& name, const Tensor& param,
                                                   const AdamWOptions& options) {
  std::vector<OptimizerStateSpec> r = {{name + ".exp_avg", param.shape(), DType::F32},
                                       {name + ".exp_avg_sq", param.shape(), DType::F32}};
  if (param.dtype() == DType::BF16 && options.master_weights) r.push_back({name + ".master", param.shape(), DType::F32});
  return r;
}

std::vector<std::pair<std::string, Tensor*>> AdamW::named_state() {
  std::vector<std::pair<std::string, Tensor*>> r;
  for (Slot& s : slots_) {
    r.emplace_back(s.name + ".exp_avg", &s.exp_avg);
    r.emplace_back(s.name + ".exp_avg_sq", &s.exp_avg_sq);
    if (s.master.defined()) r.emplace_back(s.name + ".master", &s.master);
  }
  return r;
}

}  // namespace mt
