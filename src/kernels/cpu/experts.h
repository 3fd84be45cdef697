// Routed experts over a token -> expert assignment (Qwen3MoeExperts, GptOssExperts, NemotronHExperts; grouped_mm
// dataflow):
//   for each (token t, slot s): e = index[t, s], y = down_e( act(gate_e x_t [+ bg_e], up_e x_t [+ bu_e]) ) [+ bd_e]
//   (without a gate, ReLU²: y = down_e( relu(up_e x_t)² ))
//   out[t] = Σ_s weights[t, s] · y          (bf16: bf16(y·w) per slot, summed in fp32, rounded once; with fp32
//                                            routing weights, as DeepSeek-V3's, y·w stays fp32: one rounding)
// Slots are grouped by expert (a counting sort, stable in slot order) and each expert runs two sgemms
// over its rows; experts that received no tokens are skipped.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/lora.h"

namespace mt::cpu {

// The expert MLP's variant. Defaults: Qwen3-MoE's SwiGLU without biases.
enum class ExpertActivation {
  swiglu,      // silu(g)·u
  swiglu_oai,  // GPT-OSS's clamped form (kernels/cpu/swiglu_oai.h)
  relu2,       // relu(u)², no gate: the first projection is up_proj alone, [E, I, H] (Nemotron-H; kernels/cpu/relu2.h)
};
struct ExpertsVariant {
  ExpertActivation activation = ExpertActivation::swiglu;
  // Per-expert biases (GPT-OSS; both or neither), added after each projection (bf16: to the rounded GEMM output,
  // rounded again, as Transformers' grouped path adds them in place).
  const Tensor* gate_up_bias = nullptr;  // F32|BF16 [E, 2I]: gate entries, then up entries
  const Tensor* down_bias = nullptr;     // F32|BF16 [E, H]
  // Per-expert LoRA adapters (kernels/cpu/lora.h) on the two projections, or off: A [E, r, in], B [E, out, r]
  // (gate_up: in H, out 2I; down: in I, out H). Each expert's adapter runs over that expert's rows only; its
  // output joins the base GEMM's in fp32 and the sum is rounded once in bf16 mode (as one GEMM over W + s·B·A
  // would round; PEFT instead rounds W + s·B·A itself to bf16 first: docs/lora.md).
  LoraRef gate_up_lora;
  LoraRef down_lora;
  // The routing weights are fp32 in Transformers (DeepSeek-V3, Nemotron-H: its router does not cast them to bf16),
  // so grouped_mm's `y · w` is a bf16 · fp32 product kept in fp32: in bf16 mode only the sum over the k slots is
  // rounded. false: bf16 weights, each product rounded to bf16 first (Qwen3-MoE, GPT-OSS).
  bool fp32_weights = false;
};
// The adapters' gradients (F32, accumulated), when the variant has adapters.
struct ExpertsLoraGrads {
  LoraGradRef gate_up;
  LoraGradRef down;
};
// Their gradients (F32, accumulated), when the variant has biases.
struct ExpertsBiasGrads {
  Tensor* gate_up_bias = nullptr;  // [E, 2I]
  Tensor* down_bias = nullptr;     // [E, H]
};

struct ExpertsSaved {
  std::vector<int64_t> offsets;  // [E + 1]: grouped rows of expert e are [offsets[e], offsets[e+1])
  std::vector<int32_t> slot;     // [N = T·k]: grouped row -> flat slot t·k + s
  std::vector<int32_t> row;      // [N]: flat slot -> grouped row
  Tensor xg;                     // F32 [N, H] gathered inputs
  Tensor gate_up;                // F32 [N, 2I] gate | up projections (pre-activation); [N, I] up alone for ReLU²
  Tensor act;                    // F32 [N, I]  the activation's output
  Tensor y;                      // F32 [N, H]  expert outputs before the routing weight
};

// x F32 [T, H], index I32 [T, k] (values checked in [0, E)), weights F32 [T, k],
// gate_up F32|BF16 [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up; ReLU²: [E, I, H] up), down F32|BF16 [E, H, I] -> out
// F32 [T, H].
// `saved` (optional) receives what backward needs.
Tensor experts_forward(const Tensor& x, const Tensor& index, const Tensor& weights, const Tensor& gate_up,
                       const Tensor& down, bool bf16, ExpertsSaved* saved, const ExpertsVariant& variant = {});

// dout F32 [T, H] -> dx F32 [T, H] and dweights F32 [T, k] (both allocated here);
// dgate_up F32 [E, 2I, H] and ddown F32 [E, H, I] are accumulated; an undefined one is a frozen weight whose
// gradient GEMMs are skipped. fp32 math on the saved activations.
// With a biased variant, `bias_grads` receives the biases' gradients (both pointers set; a null one: frozen).
// With adapters, `lora_grads` receives theirs.
void experts_backward(const Tensor& dout, const Tensor& weights, const Tensor& gate_up, const Tensor& down,
                      const ExpertsSaved& saved, Tensor& dx, Tensor& dweights, Tensor& dgate_up, Tensor& ddown,
                      const ExpertsVariant& variant = {}, const ExpertsBiasGrads& bias_grads = {},
                      const ExpertsLoraGrads& lora_grads = {});

}  // namespace mt::cpu
