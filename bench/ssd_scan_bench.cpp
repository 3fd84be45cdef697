// The chunked SSD scan (kernels/cuda/ssd_scan.h) at Nemotron 3 Nano's Mamba2 shapes (64 heads × 64, 8 groups,
// state 128): forward with the states buffer, backward with it and without it (recomputing the states). Prints one
// JSON object: ms per call, TFLOP/s of the MACs the kernels execute (chunk 64; the masked C·Bᵀ counted whole), GB/s
// of the main DRAM traffic (act, y / dy, dact, the states and dS_in buffers at each read and write; L2 hits not
// subtracted), and that traffic against a device-to-device copy measured in the same run (of_copy; copy_floor_ms: the
// time the bytes take at the copy rate).
//
// usage: mixtune_bench_ssd_scan [--tokens T] [--seq S] [--doc-len L] [--bf16 0|1] [--reps R]
//   T tokens (default 4096) in rows of S (default 4096); --doc-len L > 0 packs documents of L tokens in each row.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/ssd_scan.h"

namespace {

using mt::DType;
using mt::Tensor;

Tensor random_device(const mt::Shape& s, uint64_t seed, DType dt, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(mt::shape_numel(s)));
  for (float& x : v) x = d(g);
  const Tensor h = Tensor::from_floats(s, v);
  return mt::cuda::to_device(dt == DType::F32 ? h : h.to(dt), 0);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 4096, S = 4096, doc_len = 0;
  int reps = 20;
  bool bf16 = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--tokens") T = v;
    else if (a == "--seq") S = v;
    else if (a == "--doc-len") doc_len = v;
    else if (a == "--reps") reps = static_cast<int>(v);
    else if (a == "--bf16") bf16 = v != 0;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (S <= 0 || T % S != 0) {
    std::fprintf(stderr, "--tokens must be a multiple of --seq\n");
    return 2;
  }
  const int64_t H = 64, P = 64, G = 8, N = 128, B = T / S;
  const mt::cuda::SsdScanShape s{H, P, G, N};
  const int64_t W = H * P + 2 * G * N;
  const DType adt = bf16 ? DType::BF16 : DType::F32;
  cudaStream_t stream = mt::cuda::device_context(0).stream;
  const Tensor act = random_device({T, W}, 1, adt, -1.0f, 1.0f);
  const Tensor dt = random_device({T, H}, 2, DType::F32, 0.01f, 0.2f);
  const Tensor A = random_device({H}, 3, DType::F32, -4.0f, -0.1f);
  const Tensor D = random_device({H}, 4, adt, -1.0f, 1.0f);
  const Tensor dy = random_device({T, H * P}, 5, DType::F32, -1.0f, 1.0f);
  Tensor doc = Tensor::empty({B, S}, DType::I32);
  for (int64_t i = 0; i < T; ++i) doc.data_as<int32_t>()[i] = doc_len > 0 ? static_cast<int32_t>((i % S) / doc_len) : 0;
  const mt::cuda::AttentionDocs docs = mt::cuda::attention_docs_from_ids(mt::cuda::to_device(doc, 0), B, S, 0, stream);
  Tensor y = Tensor::empty({T, H * P}, DType::F32, mt::Device::cuda(0));
  Tensor states = Tensor::empty({mt::cuda::ssd_scan_states_numel(s, T)}, DType::F32, mt::Device::cuda(0));
  Tensor dact = Tensor::empty({T, W}, adt, mt::Device::cuda(0));
  Tensor ddt = Tensor::empty({T, H}, DType::F32, mt::Device::cuda(0));
  Tensor dA = Tensor::empty({H}, DType::F32, mt::Device::cuda(0));
  Tensor dD = Tensor::empty({H}, DType::F32, mt::Device::cuda(0));
  mt::cuda::fill_zero_async(dD, stream);

  const double fwd_ms = mt_bench::time_ms(reps, stream, [&] {
    mt::cuda::ssd_scan_forward(s, act, dt, A, D, docs, y, &states, stream);
  });
  const double bwd_ms = mt_bench::time_ms(reps, stream, [&] {
    mt::cuda::ssd_scan_backward(s, act, dt, A, D, docs, dy, &states, dact, ddt, dA, dD, stream);
  });
  const double bwd_re_ms = mt_bench::time_ms(reps, stream, [&] {
    mt::cuda::ssd_scan_backward(s, act, dt, A, D, docs, dy, nullptr, dact, ddt, dA, dD, stream);
  });

  // The floor the byte counts are held to: a device-to-device copy, as mixtune_bench_memory_kernels measures it.
  const double copy_gbps = mt_bench::copy_rate_gbps(reps, stream);

  // MACs the kernels run (ssd_scan.h): per (chunk, head) and per (chunk, group).
  const double Q = static_cast<double>(mt::cuda::kSsdChunk), nc = std::ceil(static_cast<double>(T) / Q);
  const double state_mac = nc * H * P * N * Q;
  const double fwd_mac = state_mac + nc * H * (Q * Q * P + Q * P * N) + nc * G * Q * Q * N;
  const double bwd_mac = state_mac + nc * H * (2 * Q * Q * P + 2 * Q * P * N) + nc * H * (Q * Q * P + 2 * Q * P * N) +
                         nc * G * 3 * Q * Q * N;
  const double es = bf16 ? 2.0 : 4.0, st = 4.0 * nc * H * P * N;
  const double act_b = es * T * W, hp_b = 4.0 * T * H * P;
  const double fwd_bytes = 3 * act_b + hp_b + 4 * st;                   // act ~3x, y, states w + r/w + r
  const double bwd_bytes = 3 * act_b + act_b + 3 * hp_b + 2 * st + 5 * st;  // act, dact, dy 3x, S_in 2x, dS_in 5x
  const double re_bytes = bwd_bytes + act_b + 3 * st;

  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  auto row = [&](const char* op, double ms, double mac, double bytes, bool last) {
    const double gbps = bytes / ms * 1e-6;
    std::printf("  {\"op\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f, \"gbps\": %.0f, \"of_copy\": %.2f, "
                "\"copy_floor_ms\": %.4f}%s\n",
                op, ms, 2 * mac / ms * 1e-9, gbps, gbps / copy_gbps, bytes / copy_gbps * 1e-6, last ? "" : ",");
  };
  std::printf("{\"bench\": \"ssd_scan\", \"gpu\": \"%s\", \"tokens\": %lld, \"seq\": %lld, \"doc_len\": %lld, "
              "\"act\": \"%s\", \"heads\": %lld, \"head_dim\": %lld, \"groups\": %lld, \"state\": %lld, "
              "\"states_mib\": %.1f, \"copy_gbps\": %.0f,\n \"ops\": [\n",
              prop.name, static_cast<long long>(T), static_cast<long long>(S), static_cast<long long>(doc_len),
              bf16 ? "bf16" : "f32", static_cast<long long>(H), static_cast<long long>(P), static_cast<long long>(G),
              static_cast<long long>(N), st / (1024.0 * 1024.0), copy_gbps);
  row("forward", fwd_ms, fwd_mac, fwd_bytes, false);
  row("backward", bwd_ms, bwd_mac, bwd_bytes, false);
  row("backward_recompute", bwd_re_ms, bwd_mac + state_mac, re_bytes, true);
  std::printf(" ]}\n");
  return 0;
}
