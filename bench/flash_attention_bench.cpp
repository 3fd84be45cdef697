// Flash attention forward and backward at Qwen3-30B-A3B attention shapes (32 query heads, 4 KV heads,
// head_dim 128, causal) for one long sequence and for packed documents. Prints one JSON object with the
// time and TFLOP/s of each pass. FLOPs count the causal half only: forward 2 GEMMs, backward 5 (2.5x),
// each 2·S_visible·D per head, as FlashAttention's benchmarks do. "forward" is the kernel the library
// picks (forward_kernel); where head_dim 128 has two forwards (a cc 9.0 GPU), forward_by_kernel times
// both, the Hopper one (sm90: TMA + wgmma) and the mma.sync one, and forward_speedup is mma / sm90;
// "backward", backward_kernel, backward_by_kernel and backward_speedup likewise for the backward.
//
// usage: mixtune_bench_flash_attention [--seq S] [--batch B] [--heads H] [--kv-heads K] [--head-dim D]
//                                      [--doc-len L] [--reps R] [--energy-seconds S] [--bwd-heads G]
//                                      [--bwd-heads-sweep ROUNDS] [--fwd-early-ab ROUNDS] [--window W]
//                                      [--sinks 0|1] [--scale X] [--fwd-sm90-hd64 0|1] [--v-dim DV]
//                                      [--bwd-mla-slices-ab ROUNDS]
// --energy-seconds S also runs the default forward and backward back to back for S seconds each: sustained TFLOP/s
// and picojoules per FLOP from the GPU's energy counter (bench/sustained_run.h). --bwd-heads G forces the
// sm90 backward's query heads per work item (0: its measured rule chooses; default: MIXTUNE_FLASH_BWD_HEADS,
// else the rule); --bwd-heads-sweep ROUNDS times the sm90 backward at every G dividing heads / kv-heads,
// alternating G within each round, and reports each G's median (backward_by_heads); --fwd-early-ab ROUNDS
// times the sm90 forward with its softmax left to ptxas (0) and pinned before the P·V wait (1, the default)
// alternately (forward_by_softmax, medians).
//
// Sliding window and sinks (GPT-OSS's sliding layers): --window W (keys j > t − W only), --sinks 1 (a sink logit
// per query head; the backward also accumulates dsinks), --scale X (softmax scale; 0: head_dim^-1/2). These run
// the mma.sync kernels (head_dim 128), or at head_dim 64 the mma.sync backward and the forward Auto picks. The FLOPs count the pairs the window leaves, Σ_t min(t − doc_start + 1, W) (the window's
// real work, not the causal half), so TFLOP/s stays comparable with the causal runs; "full_causal" times the same
// shape (and sinks) without the window, for the O(T·W) against O(T²) comparison. GPT-OSS's sliding layer:
//   mixtune_bench_flash_attention --head-dim 64 --heads 64 --kv-heads 8 --seq 4096 --window 128 --sinks 1
// --fwd-sm90-hd64 1 (head_dim 64, a cc 9.0 GPU) also times the Hopper forward (window, sinks and scale included)
// against the mma.sync one: forward_by_kernel / forward_speedup as at head_dim 128, and with a window
// full_causal_by_kernel for the same shape without it (GPT-OSS's full layers). Under Auto the head_dim 64 sm90
// forward runs unless MIXTUNE_FLASH_FWD_SM90_HD64=0 (forward_kernel says which ran):
//   mixtune_bench_flash_attention --head-dim 64 --heads 64 --kv-heads 8 --seq 4096 --window 128 --sinks 1
//       --scale 0.125 --fwd-sm90-hd64 1
//
// MLA (DeepSeek-V3: q, k 192 columns, v and out 128): --head-dim 192 --v-dim 128 (--v-dim 0: the head dim). FLOPs
// per visible pair and head: forward 2·(D + Dv) (Q·Kᵀ over D, P·V over Dv; 4·D at equal dims), backward
// 2·(3·D + 2·Dv) (S, dK, dQ over D; dP, dV over Dv; 2.5x the forward at equal dims). Where the Hopper forward runs
// (a cc 9.0 GPU) forward_by_kernel times it against mma.sync (forced; Auto takes it unless
// MIXTUNE_FLASH_FWD_SM90_MLA=0); --bwd-mla-slices-ab ROUNDS times the mma.sync backward in one column slice and in two
// alternately (backward_by_mla_slices, medians). The Hopper backward at 192 / 128 (a cc 9.0 GPU; any scale) is timed
// against mma.sync in backward_by_kernel / backward_speedup as at head_dim 128 (forced; Auto takes it unless
// MIXTUNE_FLASH_BWD_SM90_MLA=0, backward_kernel says which ran). DeepSeek-V3's heads (128, all distinct KV heads) at
// seq 4096:
//   mixtune_bench_flash_attention --head-dim 192 --v-dim 128 --heads 128 --kv-heads 128 --scale 0.1352
//       --bwd-mla-slices-ab 3
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/float_convert.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "bench_timing.h"
#include "sustained_run.h"

namespace {

using mt_bench::time_ms;

using mt::DType;
using mt::Tensor;

Tensor random_bf16(const mt::Shape& s, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Tensor h = Tensor::empty(s, DType::BF16);
  uint16_t* p = h.data_as<uint16_t>();
  for (int64_t i = 0; i < h.numel(); ++i) p[i] = mt::float_to_bf16(d(g));
  return mt::cuda::to_device(h, 0);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t S = 4096, B = 1, Hq = 32, Hk = 4, D = 128, Dv = 0, doc_len = 0, window = 0;
  int reps = 10, bwd_heads = -1, sweep_rounds = 0, fwd_ab_rounds = 0, mla_ab_rounds = 0;
  bool use_sinks = false, fwd_sm90_hd64 = false;
  float scale = 0.0f;
  double energy_seconds = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", s.c_str());
      return 2;
    }
    const char* arg = argv[++i];
    const int64_t v = std::atoll(arg);
    if (s == "--seq")
      S = v;
    else if (s == "--batch")
      B = v;
    else if (s == "--heads")
      Hq = v;
    else if (s == "--kv-heads")
      Hk = v;
    else if (s == "--head-dim")
      D = v;
    else if (s == "--v-dim")
      Dv = v;
    else if (s == "--bwd-mla-slices-ab")
      mla_ab_rounds = static_cast<int>(v);
    else if (s == "--doc-len")
      doc_len = v;
    else if (s == "--reps")
      reps = static_cast<int>(v);
    else if (s == "--energy-seconds")
      energy_seconds = static_cast<double>(v);
    else if (s == "--bwd-heads")
      bwd_heads = static_cast<int>(v);
    else if (s == "--bwd-heads-sweep")
      sweep_rounds = static_cast<int>(v);
    else if (s == "--fwd-early-ab")
      fwd_ab_rounds = static_cast<int>(v);
    else if (s == "--window")
      window = v;
    else if (s == "--sinks")
      use_sinks = v != 0;
    else if (s == "--fwd-sm90-hd64")
      fwd_sm90_hd64 = v != 0;
    else if (s == "--scale")
      scale = static_cast<float>(std::atof(arg));
    else {
      std::fprintf(stderr, "unknown argument %s\n", s.c_str());
      return 2;
    }
  }
  try {
    mt::cuda::DeviceContext& ctx = mt::cuda::device_context(0);
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const int64_t T = B * S;
    if (Dv <= 0) Dv = D;
    Tensor q = random_bf16({T, Hq, D}, 1), k = random_bf16({T, Hk, D}, 2), v = random_bf16({T, Hk, Dv}, 3);
    Tensor dout = random_bf16({T, Hq, Dv}, 4);
    Tensor doc;
    if (doc_len > 0) {
      Tensor h = Tensor::empty({B, S}, DType::I32);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < S; ++i) h.data_as<int32_t>()[b * S + i] = static_cast<int32_t>(i / doc_len);
      doc = mt::cuda::to_device(h, 0);
    }
    // (query, key) pairs attended: row i of a document sees min(i − start + 1, W) keys (W = 0: all i − start + 1).
    auto visible_pairs = [&](int64_t w) {
      double pairs = 0;
      for (int64_t i = 0; i < S; ++i) {
        const int64_t seen = doc_len > 0 ? i % doc_len + 1 : i + 1;
        pairs += static_cast<double>(w > 0 ? std::min(seen, w) : seen);
      }
      return pairs * static_cast<double>(B);
    };
    const double visible = visible_pairs(window), visible_causal = visible_pairs(0);
    mt::cuda::AttentionDocs docs = mt::cuda::attention_docs_from_ids(doc, B, S, 0, ctx.stream);
    mt::cuda::FlashAttentionShape fs{T, Hq, Hk, D};
    fs.v_dim = Dv;
    fs.window = window;
    fs.scale = scale;
    Tensor sinks, dsinks;
    if (use_sinks) {
      Tensor h = Tensor::empty({Hq}, DType::F32);
      for (int64_t i = 0; i < Hq; ++i) h.data_as<float>()[i] = static_cast<float>(i % 7) - 1.0f;  // logits -1..5
      sinks = mt::cuda::to_device(h, 0);
      dsinks = mt::cuda::to_device(Tensor::zeros({Hq}, DType::F32), 0);  // accumulates over the reps
    }
    Tensor* dsinks_out = use_sinks ? &dsinks : nullptr;
    Tensor out, lse, dq, dk, dv;
    namespace det = mt::cuda::detail;
    det::FlashArgs fa;
    fa.T = static_cast<int>(T), fa.Hq = static_cast<int>(Hq), fa.Hk = static_cast<int>(Hk), fa.D = static_cast<int>(D);
    fa.Dv = static_cast<int>(Dv);
    // What flash_attention.cpp makes of the shape: a window reaching past every row is none.
    fa.window = window < T ? static_cast<int>(window) : 0;
    fa.scale = scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(D));
    fa.sinks = use_sinks ? sinks.data_as<float>() : nullptr;
    // Whether the sm90 forward takes the call (head_dim 128 plain, or 64 with any args), and whether it is timed
    // against mma.sync (head_dim 64: with --fwd-sm90-hd64 1).
    const bool sm90_fwd_takes = det::flash_fwd_sm90_takes_args(fa) && det::flash_fwd_sm90_supported(fa);
    const bool have_sm90 = sm90_fwd_takes && (D != 64 || fwd_sm90_hd64);
    // The sm90 backward: head_dim 128 plain, or MLA's 192 / 128 with any scale (no window or sinks).
    const bool have_bwd_sm90 = det::flash_bwd_sm90_takes_args(fa) && det::flash_bwd_sm90_supported(fa);
    if (bwd_heads >= 0) det::flash_bwd_sm90_heads_set(bwd_heads);
    const int bwd_heads_used =
        have_bwd_sm90 ? det::flash_bwd_sm90_heads_per_item(static_cast<int>(T), static_cast<int>(Hq),
                                                           static_cast<int>(Hk), ctx.sm_count)
                      : 0;
    auto forward_ms = [&](det::FlashFwdKernel kind) {
      det::flash_fwd_kernel_set(kind);
      const double ms = time_ms(reps, ctx.stream, [&] {
        mt::cuda::flash_attention_forward(fs, q, k, v, docs, out, lse, ctx.stream, sinks);
      }, /*warmup=*/2);
      det::flash_fwd_kernel_set(det::FlashFwdKernel::Auto);
      return ms;
    };
    const double fwd_ms = forward_ms(det::FlashFwdKernel::Auto);
    const double mma_ms = have_sm90 ? forward_ms(det::FlashFwdKernel::MmaSync) : fwd_ms;
    const double sm90_ms = have_sm90 ? forward_ms(det::FlashFwdKernel::Sm90) : 0.0;
    // Softmax left to ptxas (0) against pinned early (1), alternating; medians over the rounds.
    std::vector<double> fwd_ab[2];
    if (have_sm90 && fwd_ab_rounds > 0) {
      for (int r = 0; r < fwd_ab_rounds; ++r)
        for (int on = 0; on < 2; ++on) {
          det::flash_fwd_sm90_early_softmax_set(on);
          fwd_ab[on].push_back(forward_ms(det::FlashFwdKernel::Sm90));
        }
      det::flash_fwd_sm90_early_softmax_set(-1);
    }
    // The backward reads out and lse of the last forward (identical up to rounding either way).
    auto backward_ms = [&](det::FlashBwdKernel kind) {
      det::flash_bwd_kernel_set(kind);
      const double ms = time_ms(reps, ctx.stream, [&] {
        mt::cuda::flash_attention_backward(fs, dout, q, k, v, out, lse, docs, dq, dk, dv, ctx.stream, nullptr,
                                           mt::cuda::FlashBwdMode::fast, sinks, dsinks_out);
      }, /*warmup=*/2);
      det::flash_bwd_kernel_set(det::FlashBwdKernel::Auto);
      return ms;
    };
    const double bwd_ms = backward_ms(det::FlashBwdKernel::Auto);
    const double bwd_mma_ms = have_bwd_sm90 ? backward_ms(det::FlashBwdKernel::MmaSync) : bwd_ms;
    const double bwd_sm90_ms = have_bwd_sm90 ? backward_ms(det::FlashBwdKernel::Sm90) : 0.0;
    // Per visible pair and head: forward Q·Kᵀ (D) + P·V (Dv), backward S, dK, dQ (D) + dP, dV (Dv); 2 FLOPs a MAC.
    const double fwd_per_pair = 2.0 * static_cast<double>(D + Dv);
    const double bwd_per_pair = 2.0 * static_cast<double>(3 * D + 2 * Dv);
    const double fwd_flops = fwd_per_pair * visible * Hq, bwd_flops = bwd_per_pair * visible * Hq;
    // The same shape without the window (the default kernels; sinks and scale kept), for the comparison.
    double causal_fwd_ms = 0, causal_bwd_ms = 0, causal_sm90_ms = 0, causal_mma_ms = 0;
    if (fs.window > 0) {
      mt::cuda::FlashAttentionShape full = fs;
      full.window = 0;
      Tensor o2, l2, dq2, dk2, dv2;
      causal_fwd_ms = time_ms(reps, ctx.stream, [&] {
        mt::cuda::flash_attention_forward(full, q, k, v, docs, o2, l2, ctx.stream, sinks);
      }, /*warmup=*/2);
      if (have_sm90 && D == 64)
        for (const det::FlashFwdKernel kind : {det::FlashFwdKernel::Sm90, det::FlashFwdKernel::MmaSync}) {
          det::flash_fwd_kernel_set(kind);
          (kind == det::FlashFwdKernel::Sm90 ? causal_sm90_ms : causal_mma_ms) = time_ms(reps, ctx.stream, [&] {
            mt::cuda::flash_attention_forward(full, q, k, v, docs, o2, l2, ctx.stream, sinks);
          }, /*warmup=*/2);
          det::flash_fwd_kernel_set(det::FlashFwdKernel::Auto);
        }
      causal_bwd_ms = time_ms(reps, ctx.stream, [&] {
        mt::cuda::flash_attention_backward(full, dout, q, k, v, o2, l2, docs, dq2, dk2, dv2, ctx.stream, nullptr,
                                           mt::cuda::FlashBwdMode::fast, sinks, dsinks_out);
      }, /*warmup=*/2);
    }
    const double causal_fwd_flops = fwd_per_pair * visible_causal * Hq;
    const double causal_bwd_flops = bwd_per_pair * visible_causal * Hq;
    // MLA's backward in one column slice and in two, alternating; medians over the rounds.
    std::vector<double> mla_ab[2];
    if (Dv != D && mla_ab_rounds > 0) {
      det::flash_bwd_kernel_set(det::FlashBwdKernel::MmaSync);
      for (int r = 0; r < mla_ab_rounds; ++r)
        for (int sl = 1; sl <= 2; ++sl) {
          det::flash_bwd_mla_slices_set(sl);
          mla_ab[sl - 1].push_back(time_ms(reps, ctx.stream, [&] {
            mt::cuda::flash_attention_backward(fs, dout, q, k, v, out, lse, docs, dq, dk, dv, ctx.stream, nullptr,
                                               mt::cuda::FlashBwdMode::fast, sinks, dsinks_out);
          }, /*warmup=*/2));
        }
      det::flash_bwd_mla_slices_set(-1);
      det::flash_bwd_kernel_set(det::FlashBwdKernel::Auto);
    }
    // The sweep: every divisor G of the group, alternating within a round; medians over the rounds.
    std::vector<int> sweep_g;
    std::vector<std::vector<double>> sweep_ms;
    if (have_bwd_sm90 && sweep_rounds > 0) {
      for (int g = 1; g <= Hq / Hk; ++g)
        if ((Hq / Hk) % g == 0) sweep_g.push_back(g);
      sweep_ms.resize(sweep_g.size());
      det::flash_bwd_kernel_set(det::FlashBwdKernel::Sm90);
      for (int r = 0; r < sweep_rounds; ++r)
        for (size_t i = 0; i < sweep_g.size(); ++i) {
          det::flash_bwd_sm90_heads_set(sweep_g[i]);
          sweep_ms[i].push_back(time_ms(reps, ctx.stream, [&] {
            mt::cuda::flash_attention_backward(fs, dout, q, k, v, out, lse, docs, dq, dk, dv, ctx.stream, nullptr,
                                           mt::cuda::FlashBwdMode::fast, sinks, dsinks_out);
          }, /*warmup=*/2));
        }
      det::flash_bwd_kernel_set(det::FlashBwdKernel::Auto);
      det::flash_bwd_sm90_heads_set(bwd_heads);  // back to the run's setting (-1: unset)
    }
    const mt_bench::Sustained fwd_sus = mt_bench::sustained(energy_seconds, fwd_flops, ctx.stream, [&] {
      mt::cuda::flash_attention_forward(fs, q, k, v, docs, out, lse, ctx.stream, sinks);
    });
    const mt_bench::Sustained bwd_sus = mt_bench::sustained(energy_seconds, bwd_flops, ctx.stream, [&] {
      mt::cuda::flash_attention_backward(fs, dout, q, k, v, out, lse, docs, dq, dk, dv, ctx.stream, nullptr,
                                           mt::cuda::FlashBwdMode::fast, sinks, dsinks_out);
    });
    const char* env = std::getenv("MIXTUNE_FLASH_FWD");
    const char* env64 = std::getenv("MIXTUNE_FLASH_FWD_SM90_HD64");
    const char* env_mla = std::getenv("MIXTUNE_FLASH_FWD_SM90_MLA");
    const bool auto_sm90 = sm90_fwd_takes && (env == nullptr || std::string(env) != "mma") &&
                           (D != 64 || !(env64 && std::string(env64) == "0")) &&
                           (Dv == D || !(env_mla && std::string(env_mla) == "0"));
    const char* auto_kernel = auto_sm90 ? "sm90" : "mma";
    std::printf(
        "{\"bench\": \"flash_attention\", \"gpu\": \"%s\", \"batch\": %lld, \"seq\": %lld, \"heads\": %lld, "
        "\"kv_heads\": %lld, \"head_dim\": %lld, \"v_dim\": %lld, \"doc_len\": %lld,\n",
        prop.name, (long long)B, (long long)S, (long long)Hq, (long long)Hk, (long long)D, (long long)Dv,
        (long long)doc_len);
    std::printf(" \"window\": %lld, \"sinks\": %s, \"scale\": %.6g, \"visible_pairs\": %.0f,\n", (long long)window,
                use_sinks ? "true" : "false", fa.scale, visible);
    if (fs.window > 0)
      std::printf(
          " \"full_causal\": {\"forward\": {\"ms\": %.4f, \"tflops\": %.1f}, \"backward\": {\"ms\": %.4f, "
          "\"tflops\": %.1f}}, \"window_speedup\": {\"forward\": %.2f, \"backward\": %.2f},\n",
          causal_fwd_ms, causal_fwd_flops / causal_fwd_ms * 1e-9, causal_bwd_ms, causal_bwd_flops / causal_bwd_ms * 1e-9,
          causal_fwd_ms / fwd_ms, causal_bwd_ms / bwd_ms);
    if (causal_sm90_ms > 0)
      std::printf(
          " \"full_causal_by_kernel\": {\"sm90\": {\"ms\": %.4f, \"tflops\": %.1f}, \"mma\": {\"ms\": %.4f, "
          "\"tflops\": %.1f}}, \"full_causal_speedup\": %.2f,\n",
          causal_sm90_ms, causal_fwd_flops / causal_sm90_ms * 1e-9, causal_mma_ms, causal_fwd_flops / causal_mma_ms * 1e-9,
          causal_mma_ms / causal_sm90_ms);
    std::printf(" \"forward_kernel\": \"%s\", \"forward\": {\"ms\": %.4f, \"tflops\": %.1f%s},\n", auto_kernel, fwd_ms,
                fwd_flops / fwd_ms * 1e-9, mt_bench::sustained_json(fwd_sus, "").c_str());
    if (have_sm90)
      std::printf(
          " \"forward_by_kernel\": {\"sm90\": {\"ms\": %.4f, \"tflops\": %.1f}, \"mma\": {\"ms\": %.4f, \"tflops\": "
          "%.1f}}, \"forward_speedup\": %.2f,\n",
          sm90_ms, fwd_flops / sm90_ms * 1e-9, mma_ms, fwd_flops / mma_ms * 1e-9, mma_ms / sm90_ms);
    const char* benv = std::getenv("MIXTUNE_FLASH_BWD");
    const char* benv_mla = std::getenv("MIXTUNE_FLASH_BWD_SM90_MLA");  // 192 / 128: Auto's sm90 unless "0"
    const char* auto_bwd = have_bwd_sm90 && (benv == nullptr || std::string(benv) != "mma") &&
                                   (Dv == D || !(benv_mla && std::string(benv_mla) == "0"))
                               ? "sm90"
                               : "mma";
    std::printf(" \"backward_kernel\": \"%s\",", auto_bwd);
    if (have_bwd_sm90)
      std::printf(
          " \"backward_by_kernel\": {\"sm90\": {\"ms\": %.4f, \"tflops\": %.1f}, \"mma\": {\"ms\": %.4f, "
          "\"tflops\": %.1f}}, \"backward_speedup\": %.2f,\n",
          bwd_sm90_ms, bwd_flops / bwd_sm90_ms * 1e-9, bwd_mma_ms, bwd_flops / bwd_mma_ms * 1e-9,
          bwd_mma_ms / bwd_sm90_ms);
    if (!fwd_ab[0].empty()) {
      std::printf(" \"forward_by_softmax\": {");
      for (int on = 0; on < 2; ++on) {
        std::vector<double> m = fwd_ab[on];
        std::sort(m.begin(), m.end());
        const double med = m[m.size() / 2];
        std::printf("%s\"%s\": {\"ms\": %.4f, \"tflops\": %.1f}", on ? ", " : "", on ? "early" : "late", med,
                    fwd_flops / med * 1e-9);
      }
      std::printf("},\n");
    }
    if (!mla_ab[0].empty()) {
      std::printf(" \"backward_by_mla_slices\": {");
      for (int sl = 0; sl < 2; ++sl) {
        std::vector<double> m = mla_ab[sl];
        std::sort(m.begin(), m.end());
        const double med = m[m.size() / 2];
        std::printf("%s\"%d\": {\"ms\": %.4f, \"tflops\": %.1f}", sl ? ", " : "", sl + 1, med, bwd_flops / med * 1e-9);
      }
      std::printf("},\n");
    }
    if (!sweep_g.empty()) {
      std::printf(" \"backward_by_heads\": {");
      for (size_t i = 0; i < sweep_g.size(); ++i) {
        std::vector<double> m = sweep_ms[i];
        std::sort(m.begin(), m.end());
        const double med = m[m.size() / 2];
        std::printf("%s\"%d\": {\"ms\": %.4f, \"tflops\": %.1f}", i ? ", " : "", sweep_g[i], med,
                    bwd_flops / med * 1e-9);
      }
      std::printf("},\n");
    }
    std::printf(" \"backward_heads_per_item\": %d,\n", bwd_heads_used);
    std::printf(" \"backward\": {\"ms\": %.4f, \"tflops\": %.1f%s}}\n", bwd_ms, bwd_flops / bwd_ms * 1e-9,
                mt_bench::sustained_json(bwd_sus, "").c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
