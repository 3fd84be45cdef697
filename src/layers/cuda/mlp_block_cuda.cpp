#include "layers/cuda/mlp_block_cuda.h"

#include "core/error.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/lora.h"
#include "kernels/cuda/relu2.h"
#include "kernels/cuda/swiglu.h"

namespace mt {

namespace {

bool gated(const MlpDimsCuda& s) { return s.activation != Activation::relu2; }

void check_weights(const MlpDimsCuda& s, const MlpWeightsCuda& w) {
  MT_CHECK(s.hidden > 0 && s.intermediate > 0, "mlp block: hidden {} and intermediate {} must be positive", s.hidden,
           s.intermediate);
  MT_CHECK(s.activation == Activation::swiglu || s.activation == Activation::relu2,
           "mlp block: only the SwiGLU and ReLU² activations are implemented");
  const Shape fh{s.intermediate, s.hidden}, hf{s.hidden, s.intermediate};
  const bool gate_ok = gated(s) ? w.gate.shape() == fh && w.gate.dtype() == DType::BF16 : !w.gate.defined();
  MT_CHECK(gate_ok && w.up.shape() == fh && w.down.shape() == hf && w.up.dtype() == DType::BF16 &&
               w.down.dtype() == DType::BF16,
           "mlp block: expected BF16 gate {} (none for ReLU²), up {} and down {}, found {}, {}, {}",
           gated(s) ? shape_str(fh) : "", shape_str(fh), shape_str(hf), w.gate.desc(), w.up.desc(), w.down.desc());
}

// A gradient shaped like its weight, or undefined (frozen).
bool grad_ok(const Tensor& g, const Shape& s) { return !g.defined() || (g.shape() == s && g.dtype() == DType::F32); }

// The first GEMM's parts: SwiGLU's gate (part 0) and up (part 1) side by side in one [T, 2F] buffer, or ReLU²'s up
// alone ([T, F]).
int parts(const MlpDimsCuda& s) { return gated(s) ? 2 : 1; }
int part_slot(const MlpDimsCuda& s, const MlpWeightsCuda& w, int p) {
  return gated(s) && p == 0 ? w.slot_gate : w.slot_up;
}
const Tensor& part_weight(const MlpDimsCuda& s, const MlpWeightsCuda& w, int p) {
  return gated(s) && p == 0 ? w.gate : w.up;
}

// Part p's columns (p·F) of a row-major [T, parts·F] buffer.
void* part_cols(const Tensor& gu, int64_t F, int p) {
  return static_cast<char*>(gu.data()) + p * F * static_cast<int64_t>(dtype_size(gu.dtype()));
}

void activation_forward(const MlpDimsCuda& s, const Tensor& gu, Tensor& h, cudaStream_t stream) {
  if (gated(s))
    cuda::swiglu_forward(gu, nullptr, h, stream);
  else
    cuda::relu2_forward(gu, h, stream);
}

}  // namespace

Tensor mlp_block_forward_cuda(const CudaBlockEnv& env, const MlpDimsCuda& spec, const MlpWeightsCuda& w, const Tensor& n,
                              MlpActsCuda& acts) {
  check_weights(spec, w);
  const int64_t H = spec.hidden, F = spec.intermediate;
  MT_CHECK(n.ndim() == 2 && n.dim(1) == H && n.dtype() == DType::BF16, "mlp block: input BF16 [T, {}], found {}", H,
           n.desc());
  const int64_t T = n.dim(0);
  env.phase(cuda::Phase::mlp);
  acts.n = n;
  // SwiGLU: gate = n·W_gateᵀ and up = n·W_upᵀ side by side (ldc 2F), the layout the SwiGLU kernel reads; ReLU²: up
  // alone.
  const int np = parts(spec);
  acts.gu = env.bf16({T, np * F});
  for (int p = 0; p < np; ++p) {
    cuda::gemm(env.device, env.stream, T, F, H, 1.0f, {n.data(), DType::BF16, H, false},
               {part_weight(spec, w, p).data(), DType::BF16, H, true}, 0.0f, part_cols(acts.gu, F, p), DType::BF16,
               np * F);
    if (const cuda::LoraOperands l = env.lora(part_slot(spec, w, p)); l.on())
      (np == 2 && p == 0 ? acts.u_gate : acts.u_up) =
          cuda::lora_forward_strided(env.device, env.stream, T, n.data(), H, l, part_cols(acts.gu, F, p), np * F);
  }
  acts.h = env.bf16({T, F});
  activation_forward(spec, acts.gu, acts.h, env.stream);
  Tensor y = env.bf16({T, H});
  cuda::linear_forward(acts.h, w.down, y, env.stream);
  if (const cuda::LoraOperands l = env.lora(w.slot_down); l.on())
    acts.u_down = cuda::lora_forward(acts.h, l, y, env.stream);
  return y;
}

void mlp_acts_drop_cheap(MlpActsCuda& acts) {
  acts.n = Tensor();
  acts.h = Tensor();
}

void mlp_acts_restore(const CudaBlockEnv& env, const MlpDimsCuda& spec, MlpActsCuda& acts) {
  if (acts.h.defined()) return;
  MT_CHECK(acts.gu.defined(), "mlp block: nothing to recompute from (the gate|up outputs were not kept)");
  env.phase(cuda::Phase::mlp);
  acts.h = env.bf16({acts.gu.dim(0), spec.intermediate});
  activation_forward(spec, acts.gu, acts.h, env.stream);
}

Tensor mlp_block_backward_cuda(const CudaBlockEnv& env, const MlpDimsCuda& spec, const MlpWeightsCuda& w,
                               const MlpActsCuda& acts, const Tensor& dy, const MlpGradsCuda& g, Tensor* dn_into) {
  check_weights(spec, w);
  const int64_t H = spec.hidden, F = spec.intermediate;
  MT_CHECK(acts.n.defined() && acts.gu.defined() && acts.h.defined(),
           "mlp block: backward needs n, gu and h (restore the dropped activations first)");
  const int64_t T = acts.n.dim(0);
  MT_CHECK(dy.ndim() == 2 && dy.dim(0) == T && dy.dim(1) == H && dy.dtype() == DType::BF16,
           "mlp block: output gradient BF16 [{}, {}], found {}", T, H, dy.desc());
  const Shape fh{F, H}, hf{H, F};
  MT_CHECK((!gated(spec) || grad_ok(g.gate, fh)) && grad_ok(g.up, fh) && grad_ok(g.down, hf),
           "mlp block: expected F32 gradients {} and {} (or none: frozen), found {}, {}, {}", shape_str(fh),
           shape_str(hf), g.gate.desc(), g.up.desc(), g.down.desc());
  env.phase(cuda::Phase::mlp);

  // Down projection: dh = dy·W_down, dW_down += dyᵀ·h.
  Tensor dh = env.bf16({T, F});
  cuda::linear_backward_input(dy, w.down, dh, env.stream);
  if (g.down.defined()) cuda::linear_backward_weight(dy, acts.h, g.down, env.stream);
  if (const cuda::LoraOperands l = env.lora(w.slot_down); l.on())
    cuda::lora_backward(dy, acts.h, acts.u_down, l, dh, env.dlora(w.slot_down), env.stream);
  // The activation's backward: SwiGLU's d(gate | up) or ReLU²'s d(up), fp32 math rounded once to bf16.
  const int np = parts(spec);
  Tensor dgu = env.bf16({T, np * F});
  if (gated(spec))
    cuda::swiglu_backward(dh, acts.gu, nullptr, dgu, nullptr, env.stream);
  else
    cuda::relu2_backward(dh, acts.gu, dgu, env.stream);
  dh = Tensor();
  // dn = d_gate·W_gate + d_up·W_up (the second GEMM adds, beta 1), or d_up·W_up alone; dW_gate += d_gateᵀ·n,
  // dW_up += d_upᵀ·n.
  Tensor dn = dn_into ? *dn_into : env.bf16({T, H});
  if (dn_into)
    MT_CHECK(dn.shape() == Shape({T, H}) && dn.dtype() == DType::BF16, "mlp block: dn_into BF16 [{}, {}], found {}", T,
             H, dn.desc());
  for (int p = 0; p < np; ++p) {
    const bool is_gate = np == 2 && p == 0;
    const Tensor& wt = part_weight(spec, w, p);
    Tensor& dw = is_gate ? g.gate : g.up;
    const void* d = part_cols(dgu, F, p);
    cuda::gemm(env.device, env.stream, T, H, F, 1.0f, {d, DType::BF16, np * F, false},
               {wt.data(), DType::BF16, H, false}, p == 0 && !dn_into ? 0.0f : 1.0f, dn.data(), DType::BF16, H);
    if (dw.defined())
      cuda::gemm(env.device, env.stream, F, H, T, 1.0f, {d, DType::BF16, np * F, true},
                 {acts.n.data(), DType::BF16, H, false}, 1.0f, dw.data(), DType::F32, H);
    if (const cuda::LoraOperands l = env.lora(part_slot(spec, w, p)); l.on())
      cuda::lora_backward_strided(env.device, env.stream, T, d, np * F, acts.n.data(), H,
                                  is_gate ? acts.u_gate : acts.u_up, l, dn.data(), H, env.dlora(part_slot(spec, w, p)));
  }
  return dn;
}

}  // namespace mt
