// Raw launchers of the flash-attention kernels (flash_attention_fwd.cu, flash_attention_fwd_sm90.cu,
// flash_attention_bwd.cu, attention_docs.cu), called by flash_attention.cpp after its checks. Layouts:
// q [T][Hq][D], k [T][Hk][D], v [T][Hk][Dv], out/dout [T][Hq][Dv] bf16 (Dv = D except MLA's D 192 / Dv 128);
// lse/delta [Hq][T] fp32; doc_start/doc_end [T] int32 (token t attends to keys [doc_start[t], t], and with
// window W > 0 to keys j > t − W only: keys [max(doc_start[t], t − W + 1), t]; doc_end[t] is one past the
// last token of t's document).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace mt::cuda::detail {

struct FlashArgs {
  int T = 0, Hq = 0, Hk = 0, D = 0;  // D: head size of q and k
  int Dv = 0;          // head size of v and out; 0: D (flash_value_dim)
  int window = 0;      // > 0 and < T: sliding window (keys j > t − window); 0: none (flash_attention.cpp
                       // turns a window >= T into 0, so the kernels never form t − window out of range)
  float scale = 0.0f;  // softmax scale on q·k (D^-0.5 unless the caller gives one)
  const int32_t* doc_start = nullptr;
  const int32_t* doc_end = nullptr;
  const float* sinks = nullptr;  // [Hq] sink logits (score units, not scaled), or null: no sink column
  float* dsinks = nullptr;       // backward: [Hq] += d(loss)/d(sink), or null; needs sinks
};

// The value (and output) head size of a call: Dv, or D where Dv is 0.
inline int flash_value_dim(const FlashArgs& a) { return a.Dv > 0 ? a.Dv : a.D; }

// Whether a call uses none of the features only the mma.sync kernels have (window, sinks or dsinks, a scale
// other than D^-0.5): the sm90 kernels take only such calls.
bool flash_args_plain(const FlashArgs& a);

void flash_fwd_launch(const FlashArgs& a, const void* q, const void* k, const void* v, void* out, float* lse,
                      cudaStream_t stream);

// Hopper forward (flash_attention_fwd_sm90.cu: TMA + wgmma), same contract as flash_fwd_launch for
// head_dim 128 with plain args (flash_args_plain), head_dim 64 with any args (window, sinks, scale) and MLA's
// D 192 / Dv 128 with any scale (no window or sinks); flash_attention.cpp routes the rest to the mma.sync
// kernel; q, k, v, out 16-byte aligned. Supported: D == Dv == 128 or 64, or D 192 / Dv 128, and the current
// device runs its sm_90a build (a cc 9.0 GPU and 90a in CMAKE_CUDA_ARCHITECTURES; cached per device). The
// launcher throws where it is not supported or flash_fwd_sm90_takes_args is false.
bool flash_fwd_sm90_supported(const FlashArgs& a);
bool flash_fwd_sm90_takes_args(const FlashArgs& a);
void flash_fwd_sm90_launch(const FlashArgs& a, const void* q, const void* k, const void* v, void* out, float* lse,
                           cudaStream_t stream);
// The sm90 forward's loop: 1 = the next tile's softmax pinned before the wait for this tile's P·V (the default),
// 0 = left to ptxas (which sinks it below the wait), -1 = unset (MIXTUNE_FLASH_FWD_EARLY_SOFTMAX=0 in the
// environment, read once, selects 0). Tests and the bench set it; process-wide.
void flash_fwd_sm90_early_softmax_set(int on);

// Which forward flash_attention_forward runs. Auto: the sm90 one where flash_fwd_sm90_supported and
// flash_fwd_sm90_takes_args, the environment does not say MIXTUNE_FLASH_FWD=mma (read once) and, at head_dim
// 64, not MIXTUNE_FLASH_FWD_SM90_HD64=0 (read once), and at D 192 / Dv 128 not MIXTUNE_FLASH_FWD_SM90_MLA=0
// (read once); else mma.sync. MmaSync / Sm90 force one
// (Sm90 is an error where it cannot run); tests and the bench use this. Process-wide.
enum class FlashFwdKernel { Auto, MmaSync, Sm90 };
void flash_fwd_kernel_set(FlashFwdKernel k);
FlashFwdKernel flash_fwd_kernel_get();

// Workspace (fp32, zeroed here): dq_acc [T][Hq][D], dk_acc [T][Hk][D], dv_acc [T][Hk][Dv], delta [Hq][T] and one
// element more (the sm90 backward's work-item counter). With a.dsinks, also dsinks += −Σ_t p_sink·delta
// (flash_sink_grad_launch).
void flash_bwd_launch(const FlashArgs& a, const void* dout, const void* q, const void* k, const void* v,
                      const void* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc, float* dk_acc,
                      float* dv_acc, float* delta, cudaStream_t stream);

// The deterministic backward (flash_attention_bwd.cu): the same results to fp32 summation order, every
// sum in a fixed order (no atomics), so a run repeats bit for bit. dK/dV per query head into dk_part /
// dv_part [T][Hq][D] / [T][Hq][Dv] (summed over each GQA group in head order), dQ by a separate forward-shaped
// pass into dq_acc [T][Hq][D]; delta as above. Any head_dim the mma.sync backward takes, on any GPU it runs on.
void flash_bwd_deterministic_launch(const FlashArgs& a, const void* dout, const void* q, const void* k, const void* v,
                                    const void* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc,
                                    float* dk_part, float* dv_part, float* delta, cudaStream_t stream);

// MLA's D 192 / Dv 128 mma.sync backwards (both modes) in one column slice (the default: 255 registers, 16
// bytes of spills) or two (Sᵀ and dPᵀ computed twice, no spills): flash_bwd_mla_slices_set(1 or 2; -1 =
// unset: MIXTUNE_FLASH_BWD_MLA_SLICES=2 in the environment, read once, selects 2). Tests and the bench set it
// until the two are measured; process-wide.
void flash_bwd_mla_slices_set(int slices);
int flash_bwd_mla_slices();

// Hopper backward (flash_attention_bwd_sm90.cu: TMA + wgmma), same contract and workspace as
// flash_bwd_launch for head_dim 128 with plain args (flash_args_plain) and for MLA's D 192 / Dv 128 with any scale
// and no window or sinks (flash_bwd_sm90_takes_args; flash_attention_bwd_sm90_mla.cu, which the two entry points
// below route 192 / 128 to); q, k, v, dout 16-byte aligned. Supported: D == Dv == 128 or D 192 / Dv 128, a cc 9.0
// GPU running the sm_90a build. The launcher throws where it is not supported or the args are not taken.
bool flash_bwd_sm90_supported(const FlashArgs& a);
bool flash_bwd_sm90_takes_args(const FlashArgs& a);
// dq null (head_dim 128 only): dq_acc keeps the fp32 dQ sums (flash_dq_layout.cuh) and no bf16 dq is made.
void flash_bwd_sm90_launch(const FlashArgs& a, const void* dout, const void* q, const void* k, const void* v,
                           const void* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc,
                           float* dk_acc, float* dv_acc, float* delta, cudaStream_t stream);
// Query heads per work item of the sm90 backward (a divisor of Hq / Hk): forced by flash_bwd_sm90_heads_set(g)
// (g > 0; 0 = choose, -1 = unset: the environment's MIXTUNE_FLASH_BWD_HEADS, read once, else choose), else
// chosen from the measured rule in flash_attention_bwd_sm90.cu (2 where Hq / Hk is even and that leaves at
// least two items per SM of `sms`, else 1). A forced g that does not divide Hq / Hk is lowered to a divisor.
// Tests and the bench set it; process-wide.
void flash_bwd_sm90_heads_set(int g);
int flash_bwd_sm90_heads_per_item(int T, int Hq, int Hk, int sms);
// The sm90 backward's dQ sums to bf16 dq [T][Hq][128] (× scale).
void flash_dq_sums_to_bf16(const float* dq_acc, int T, int Hq, float scale, void* dq, cudaStream_t stream);
// The 192 / 128 kernel (flash_attention_bwd_sm90_mla.cu): 96-key items, 3 consumer warpgroups; dq_acc in its own
// layout ([Hq][3][T][64], flash_dq_layout.cuh's in-row permutation), converted to bf16 dq inside the launch.
bool flash_bwd_sm90_mla_supported(const FlashArgs& a);
void flash_bwd_sm90_mla_launch(const FlashArgs& a, const void* dout, const void* q, const void* k, const void* v,
                               const void* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc,
                               float* dk_acc, float* dv_acc, float* delta, cudaStream_t stream);

// The steps around the main backward kernel that both backwards share (flash_attention_bwd.cu):
// prologue (one kernel) = zero dq_acc / dk_acc / dv_acc and the int after delta's T·Hq floats (the sm90
// backward's item counter; delta must have that extra element), and delta = rowsum(dO ⊙ O); epilogue = the
// fp32 buffers to bf16 dq, dk, dv (dQ and dK times the softmax scale); dq_acc == nullptr leaves dq to the
// caller (the sm90 backward keeps dq_acc in its own layout and converts it itself).
void flash_bwd_prologue(const FlashArgs& a, const void* dout, const void* out, float* dq_acc, float* dk_acc,
                        float* dv_acc, float* delta, cudaStream_t stream);
void flash_bwd_epilogue(const FlashArgs& a, const float* dq_acc, const float* dk_acc, const float* dv_acc, void* dq,
                        void* dk, void* dv, cudaStream_t stream);
// a.dsinks[h] += −Σ_t exp(a.sinks[h] − lse[h][t]) · delta[h][t]: one block per head, each thread a fixed stride
// of tokens, then a fixed tree, so the sum is bitwise the same run to run. Both mma.sync backwards call it after
// the prologue (delta); nothing is queued without a.dsinks.
void flash_sink_grad_launch(const FlashArgs& a, const float* lse, const float* delta, cudaStream_t stream);

// Which backward flash_attention_backward runs: as FlashFwdKernel, with MIXTUNE_FLASH_BWD=mma (read once)
// selecting the mma.sync one under Auto; at D 192 / Dv 128 Auto takes the sm90 one unless
// MIXTUNE_FLASH_BWD_SM90_MLA=0 (read once).
enum class FlashBwdKernel { Auto, MmaSync, Sm90 };
void flash_bwd_kernel_set(FlashBwdKernel k);
FlashBwdKernel flash_bwd_kernel_get();

// Document bounds from doc ids [B][S] (doc == null: each row is one document), or from cu_seqlens [docs + 1].
void attention_docs_from_ids_launch(const int32_t* doc, int B, int S, int32_t* start, int32_t* end,
                                    cudaStream_t stream);
void attention_docs_from_cu_seqlens_launch(const int32_t* cu, int docs, int32_t* start, int32_t* end,
                                           cudaStream_t stream);

}  // namespace mt::cuda::detail
