// The memory-bound kernels of a training step at Qwen3-30B-A3B layer shapes (one micro-batch of 4096 tokens by
// default), each timed alone against the device-to-device copy rate measured in the same run: the residual add +
// RMSNorm and its backward (hidden size), QK-norm + RoPE and its backward (query and key heads), SwiGLU and its
// backward (the expert rows), the router, the token embedding and its gradient, the global gradient norm and the AdamW
// update over a parameter set in both precision policies. The permutation kernels are in
// mixtune_bench_grouped_gemm, the flash-attention ones in mixtune_bench_flash_attention; the LM head + loss is a
// GEMM-bound op and is reported here in TFLOP/s.
//
// Bytes are what each op must move through HBM at least (every input read once, every output written once), so
// `of_copy` = achieved GB/s ÷ the copy's GB/s is how close the op is to its floor.
//
// usage: mixtune_bench_memory_kernels [--tokens T] [--hidden H] [--heads Hq] [--kv-heads Hkv] [--head-dim D]
//                                     [--experts E] [--topk K] [--inter I] [--vocab V] [--adamw-elements N] [--reps R]
// Prints one JSON object.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/grad_norm.h"
#include "kernels/cuda/linear_cross_entropy.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/swiglu.h"
#include "bench_args.h"
#include "bench_timing.h"

namespace {

using mt::Device;
using mt::DType;
using mt::Tensor;
using mt_bench::time_ms;

struct Args {
  int64_t tokens = 4096, hidden = 2048, heads = 32, kv_heads = 4, head_dim = 128, experts = 128, topk = 8,
          inter = 768, vocab = 151936, adamw_elements = 256LL << 20, reps = 20;
};

Args parse(int argc, char** argv) {
  Args a;
  mt_bench::parse_int_options(
      argc, argv,
      {{"--tokens", &a.tokens}, {"--hidden", &a.hidden}, {"--heads", &a.heads}, {"--kv-heads", &a.kv_heads},
       {"--head-dim", &a.head_dim}, {"--experts", &a.experts}, {"--topk", &a.topk}, {"--inter", &a.inter},
       {"--vocab", &a.vocab}, {"--adamw-elements", &a.adamw_elements}, {"--reps", &a.reps}},
      "mixtune_bench_memory_kernels [--tokens T] [--hidden H] [--heads Hq] [--kv-heads Hkv] [--head-dim D] "
      "[--experts E] [--topk K] [--inter I] [--vocab V] [--adamw-elements N] [--reps R]");
  return a;
}

struct Row {
  std::string op;
  double bytes, flops, ms;
};

Tensor dev_empty(const mt::Shape& shape, DType dt) { return Tensor::empty(shape, dt, Device::cuda(0)); }
Tensor dev_zeros(const mt::Shape& shape, DType dt) {
  Tensor t = dev_empty(shape, dt);
  MT_CUDA_CHECK(cudaMemset(t.data(), 0, t.nbytes()));
  return t;
}

Tensor normal(const mt::Shape& shape, DType dt, float stddev, uint64_t seed, cudaStream_t st) {
  Tensor t = dev_empty(shape, dt);
  mt::cuda::fill_normal(t, stddev, seed, st);
  return t;
}

Tensor ids_like(int64_t n, int64_t range, cudaStream_t st) {
  std::vector<int64_t> h(static_cast<size_t>(n));
  uint64_t s = 88172645463325252ULL;
  for (auto& v : h) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v = static_cast<int64_t>(s % static_cast<uint64_t>(range));
  }
  Tensor t = dev_empty({n}, DType::I64);
  MT_CUDA_CHECK(cudaMemcpyAsync(t.data(), h.data(), h.size() * sizeof(int64_t), cudaMemcpyHostToDevice, st));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  MT_CUDA_CHECK(cudaSetDevice(0));
  const mt::cuda::DeviceContext& ctx = mt::cuda::device_context(0);
  cudaStream_t st = ctx.stream;
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int64_t T = a.tokens, H = a.hidden, Hq = a.heads, D = a.head_dim, E = a.experts, K = a.topk, I = a.inter,
                V = a.vocab, N = T * K;
  const float eps = 1e-6f;
  std::vector<Row> rows;
  auto mem = [&](const std::string& op, double bytes, auto&& f) {
    rows.push_back({op, bytes, 0, time_ms(static_cast<int>(a.reps), st, f)});
  };

  // The ceiling: a device-to-device copy of 512 MiB (read + write counted).
  const double copy_gbps = mt_bench::copy_rate_gbps(static_cast<int>(a.reps), st);

  const double act = static_cast<double>(T) * H * 2;  // one [T, H] bf16 activation
  {
    Tensor x = normal({T, H}, DType::BF16, 1.0f, 1, st), r = normal({T, H}, DType::BF16, 1.0f, 2, st);
    Tensor w = normal({H}, DType::BF16, 0.1f, 3, st), sum = dev_empty({T, H}, DType::BF16);
    Tensor out = dev_empty({T, H}, DType::BF16), dx = dev_empty({T, H}, DType::BF16);
    Tensor dw = dev_zeros({H}, DType::F32);
    mem("rmsnorm_residual_forward", 4 * act,
        [&] { mt::cuda::rmsnorm_residual_forward(x, r, w, eps, sum, out, nullptr, st); });
    mem("rmsnorm_backward_residual", 4 * act, [&] { mt::cuda::rmsnorm_backward(out, x, w, eps, dx, dw, &r, st); });
  }
  {
    // QK-norm + RoPE both ways, for the query heads (Hq) and the key heads (--kv-heads): the forward with each rows-
    // per-group choice (`_r1` … `_r4`; the plain row is the shape's own), the backward from a bf16 gradient and, for
    // the query heads, from the flash backward's fp32 dQ sums (as training runs it), each also without the next-row
    // prefetch (`_noprefetch`).
    Tensor pos = dev_empty({T}, DType::I64);
    std::vector<int64_t> hp(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) hp[static_cast<size_t>(t)] = t;
    MT_CUDA_CHECK(cudaMemcpyAsync(pos.data(), hp.data(), hp.size() * sizeof(int64_t), cudaMemcpyHostToDevice, st));
    Tensor cos = dev_empty({T, D / 2}, DType::F32), sin = dev_empty({T, D / 2}, DType::F32);
    mt::cuda::rope_tables(pos, D, 1e6, true, cos, sin, st);
    const double tables = 2.0 * T * (D / 2) * 4;
    for (const int64_t heads : {Hq, a.kv_heads}) {
      const std::string who = heads == Hq ? "qk_norm_rope" : "k_norm_rope";
      const double q = static_cast<double>(T) * heads * D * 2;
      Tensor x = normal({T * heads, D}, DType::BF16, 1.0f, 4, st), w = normal({D}, DType::BF16, 0.1f, 5, st);
      Tensor out = dev_empty({T * heads, D}, DType::BF16), dx = dev_empty({T * heads, D}, DType::BF16);
      Tensor dw = dev_zeros({D}, DType::F32);
      for (const int r : {0, 1, 2, 4}) {
        mt::cuda::detail::rmsnorm_rope_rows_per_group_set(r);
        mem(who + "_forward" + (r ? "_r" + std::to_string(r) : std::string()), 2 * q + tables,
            [&] { mt::cuda::rmsnorm_rope_forward(x, w, eps, cos, sin, out, st); });
      }
      mt::cuda::detail::rmsnorm_rope_rows_per_group_set(0);
      mt::cuda::FlashDqSums sums;
      if (heads == Hq && D == 128) {
        sums.acc = normal({T * heads * D}, DType::F32, 1.0f, 6, st);
        sums.scale = 0.088f, sums.tokens = T, sums.heads = heads;
      }
      for (const bool prefetch : {true, false}) {
        mt::cuda::detail::rmsnorm_backward_prefetch_next_set(prefetch);
        const std::string tail = prefetch ? "" : "_noprefetch";
        mem(who + "_backward" + tail, 3 * q + tables,
            [&] { mt::cuda::rmsnorm_rope_backward(out, x, w, eps, cos, sin, dx, dw, st); });
        if (sums.acc.defined())  // fp32 dQ (4 bytes an element) and x read, dx written
          mem(who + "_backward_from_flash_dq" + tail, 4 * q + tables,
              [&] { mt::cuda::rmsnorm_rope_backward_from_flash_dq(sums, x, w, eps, cos, sin, dx, dw, st); });
      }
      mt::cuda::detail::rmsnorm_backward_prefetch_next_set(true);
    }
  }
  {
    Tensor gu = normal({N, 2 * I}, DType::BF16, 1.0f, 6, st), h = dev_empty({N, I}, DType::BF16);
    Tensor dgu = dev_empty({N, 2 * I}, DType::BF16);
    const double hb = static_cast<double>(N) * I * 2;
    mem("swiglu_forward", 3 * hb, [&] { mt::cuda::swiglu_forward(gu, nullptr, h, st); });
    mem("swiglu_backward", 5 * hb, [&] { mt::cuda::swiglu_backward(h, gu, nullptr, dgu, nullptr, st); });
  }
  {
    Tensor logits = normal({T, E}, DType::BF16, 1.0f, 7, st);
    mt::cuda::RouterResult res;
    mem("router_forward", T * E * 2.0 + T * K * 8.0,
        [&] { res = mt::cuda::router_forward(logits, K, true, true, nullptr, st); });
    Tensor dwts = normal({T, K}, DType::F32, 1.0f, 8, st), dlogits = dev_empty({T, E}, DType::BF16);
    mem("router_backward", T * E * 4.0 + T * K * 12.0,
        [&] { mt::cuda::router_backward(dwts, logits, res, true, Tensor(), true, dlogits, st); });
  }
  {
    Tensor table = normal({V, H}, DType::BF16, 0.02f, 9, st), ids = ids_like(T, V, st);
    Tensor out = dev_empty({T, H}, DType::BF16), dtable = dev_zeros({V, H}, DType::F32);
    mem("embedding_forward", 2 * act, [&] { mt::cuda::embedding_forward(ids, table, out, st); });
    mem("embedding_backward", act + T * H * 8.0, [&] { mt::cuda::embedding_backward(ids, out, dtable, std::nullopt, st); });
  }
  {
    // The LM head + loss over one micro-batch (three GEMMs and the row softmax): GEMM-bound.
    Tensor x = normal({T, H}, DType::BF16, 1.0f, 10, st), w = normal({V, H}, DType::BF16, 0.02f, 11, st);
    Tensor y = ids_like(T, V, st), dx = dev_empty({T, H}, DType::BF16);
    Tensor dw = dev_zeros({V, H}, DType::F32);
    Tensor loss = dev_empty({1}, DType::F32), count = dev_empty({1}, DType::I32);
    mt::cuda::LinearCrossEntropyArgs args;
    args.chunk_rows = T;
    args.grad_scale = 1.0f / static_cast<float>(T);
    const int head_reps = static_cast<int>(std::max<int64_t>(a.reps / 4, 2));
    rows.push_back({"lm_head_cross_entropy", 0, 6.0 * T * H * V, time_ms(head_reps, st, [&] {
                      mt::cuda::linear_cross_entropy(x, w, y, args, loss, count, &dx, &dw, st);
                    })});
  }
  // The optimizer over adamw_elements parameters in 8 tensors: pure bf16 (bf16 moments, stochastic rounding) and
  // fp32 masters (fp32 moments); the global norm over the same bf16 gradients.
  for (const bool master : {false, true}) {
    const int64_t n = a.adamw_elements / 8;
    std::vector<Tensor> params, grads;
    for (int i = 0; i < 8; ++i) {
      params.push_back(normal({n}, DType::BF16, 0.02f, 20 + i, st));
      grads.push_back(normal({n}, DType::BF16, 1e-3f, 40 + i, st));
    }
    std::vector<std::pair<std::string, Tensor*>> named;
    std::vector<const Tensor*> gp;
    for (int i = 0; i < 8; ++i) {
      named.emplace_back("p" + std::to_string(i), &params[static_cast<size_t>(i)]);
      gp.push_back(&grads[static_cast<size_t>(i)]);
    }
    mt::cuda::CudaAdamWOptions o;
    o.bf16_master = master;
    o.moment_dtype = master ? DType::F32 : DType::BF16;
    mt::cuda::CudaAdamW opt(named, o, {}, st);
    Tensor norm = dev_empty({1}, DType::F32), coef = dev_empty({1}, DType::F32);
    const double el = static_cast<double>(n) * 8;
    if (!master) mem("grad_norm_bf16", 2 * el, [&] { mt::cuda::grad_norm_clip_coef(gp, 1.0f, norm, coef, st); });
    // pure bf16: p, g, m, v read (8 B), p, m, v written (6 B); fp32 masters: master, m, v (12 B) and g (2 B) read,
    // master, m, v (12 B) and the bf16 param (2 B) written.
    mem(master ? "adamw_fp32_master" : "adamw_bf16", (master ? 28.0 : 14.0) * el,
        [&] { opt.step(gp, 1e-5, &coef, st); });
  }
  MT_CUDA_CHECK(cudaStreamSynchronize(st));

  std::printf("{\"bench\": \"memory_kernels\", \"gpu\": \"%s\", \"copy_gbps\": %.0f,\n", prop.name, copy_gbps);
  std::printf(" \"shape\": {\"tokens\": %lld, \"hidden\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
              "\"head_dim\": %lld, \"experts\": %lld, \"top_k\": %lld, \"moe_intermediate\": %lld, "
              "\"vocab\": %lld, \"adamw_elements\": %lld},\n",
              (long long)T, (long long)H, (long long)Hq, (long long)a.kv_heads, (long long)D, (long long)E,
              (long long)K, (long long)I, (long long)V, (long long)a.adamw_elements);
  std::printf(" \"ops\": [\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (r.flops > 0)
      std::printf("  {\"op\": \"%s\", \"ms\": %.4f, \"tflops\": %.1f}", r.op.c_str(), r.ms, r.flops / r.ms * 1e-9);
    else
      std::printf("  {\"op\": \"%s\", \"ms\": %.4f, \"gbps\": %.0f, \"of_copy\": %.2f}", r.op.c_str(), r.ms,
                  r.bytes / r.ms * 1e-6, r.bytes / r.ms * 1e-6 / copy_gbps);
    std::printf("%s\n", i + 1 < rows.size() ? "," : "");
  }
  std::printf(" ]}\n");
  return 0;
}
