// GPT-OSS's clamped SwiGLU (GptOssExperts._apply_gate, hf-numerics.md §4.2), on a gate | up pair of rows:
//   g' = min(g, 7);  u' = clamp(u, −7, 7);  glu = g'·sigmoid(1.702·g');  a = (u' + 1)·glu
// bf16: every op rounds as the eager bf16 ops do (1.702·g', sigmoid, the product, u' + 1, the last product).
#pragma once
#include <cstdint>

namespace mt::cpu {

constexpr float kSwigluOaiLimit = 7.0f;
constexpr float kSwigluOaiAlpha = 1.702f;

void swiglu_oai_forward_rows(int64_t rows, int64_t F, const float* g, const float* u, int64_t ld_in, float* a,
                             int64_t ld_out, bool bf16);
// da -> dg, du in fp32 on the (unrounded) saved g, u. The clamps pass the gradient where their input is inside
// the bounds, bounds included (torch.clamp's rule).
void swiglu_oai_backward_rows(int64_t rows, int64_t F, const float* da, int64_t ld_da, const float* g,
                              const float* u, int64_t ld_in, float* dg, float* du, int64_t ld_out);

}  // namespace mt::cpu
