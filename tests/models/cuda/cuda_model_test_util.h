// Shared by the CUDA model tests: host weights copied to GPU 0, zero gradient buffers there, a micro-batch with
// packed documents and ignored labels, the per-gradient comparison of two models' gradients, and one AdamW step
// against a Transformers fixture's.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "../../kernels/cuda/error_report.h"
#include "../../kernels/cuda/cuda_test_util.h"
#include "../hf_fixture_util.h"
#include "core/float_convert.h"
#include "io/safetensors.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "models/causal_lm.h"
#include "models/cuda/cuda_batch.h"
#include "models/cuda/decoder_cuda_model.h"
#include "models/decoder_model.h"
#include "models/model_weights.h"
#include "models/spec/decoder_spec.h"

namespace mt::test {

// Every parameter and buffer (DeepSeek-V3's F32 e_score_correction_bias) of `host` uploaded unchanged (same dtype)
// to cuda:0.
inline ModelWeights to_device_weights(ModelWeights& host) {
  ModelWeights d = host;  // same structure; every tensor replaced below
  auto src = host.named_parameters();
  auto dst = d.named_parameters();
  for (size_t i = 0; i < src.size(); ++i) *dst[i].second = cuda::to_device(*src[i].second, 0);
  auto bsrc = host.named_buffers();
  auto bdst = d.named_buffers();
  for (size_t i = 0; i < bsrc.size(); ++i) *bdst[i].second = cuda::to_device(*bsrc[i].second, 0);
  return d;
}

// F32 zeros shaped like cfg's parameters on cuda:0.
inline ModelWeights device_zeros_like(const DecoderSpec& cfg) {
  ModelWeights host = ModelWeights::zeros_like_config(cfg, DType::F32);
  return to_device_weights(host);
}

// Two rows of 96 tokens; row 1 packs three documents; every 7th label ignored.
inline Batch test_batch(const DecoderSpec& cfg) {
  const int64_t B = 2, S = 96;
  Batch b;
  b.input_ids = Tensor::empty({B, S}, DType::I64);
  b.labels = Tensor::empty({B, S}, DType::I64);
  b.position_ids = Tensor::empty({B, S}, DType::I64);
  auto* ids = b.input_ids.data_as<int64_t>();
  auto* lab = b.labels.data_as<int64_t>();
  auto* pos = b.position_ids.data_as<int64_t>();
  uint64_t s = 12345;
  for (int64_t i = 0; i < B * S; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    ids[i] = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(cfg.vocab_size));
    lab[i] = (i % 7 == 3) ? -100 : ids[i];
    const int64_t r = i / S, t = i % S;
    pos[i] = r == 0 ? t : (t < 40 ? t : (t < 70 ? t - 40 : t - 70));
  }
  return b;
}

// The same floats bit for bit (a recompute or a rerun that must repeat the forward exactly).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A tensor's elements as floats on the host, from the device or the host.
inline std::vector<float> floats_of(const Tensor& t) {
  return t.device().is_cpu() ? t.to_floats() : device_floats(t);
}

// One forward_backward of the CUDA model on `b` (LM head in chunks of 64 rows, so the tests' small batches take
// several): the loss sum and its mean over `div`, the target count, whether a load-balancing loss came out, and the
// gradients (F32 on the device, zero-initialised). residency: ZeRO-3-style parameter fetching (models/param_residency.h).
struct CudaRun {
  float ce_sum = 0;
  double ce = 0;  // ce_sum / div
  int32_t count = 0;
  bool aux = false;
  float aux_value = 0;  // the load-balancing loss when aux
  ModelWeights grads;
};
inline CudaRun run_cuda(const DecoderSpec& cfg, ModelWeights& dev_w, const Batch& b, Recompute rc, double div,
                        bool deterministic = false, ParamResidency* residency = nullptr) {
  CudaModelOptions o;
  o.recompute = rc;
  o.loss_chunk_rows = 64;
  o.deterministic = deterministic;
  o.residency = residency;
  DecoderCudaModel model(cfg, dev_w, 0, o);
  const CudaBatch gb = cuda_batch_upload(cfg, b, 0);
  CudaRun r;
  r.grads = device_zeros_like(cfg);
  const CudaLoss l = model.forward_backward(gb, r.grads, div);
  r.ce_sum = cuda::to_host(l.ce_sum).to_floats()[0];
  r.ce = r.ce_sum / div;
  r.count = cuda::to_host(l.count).data_as<int32_t>()[0];
  r.aux = l.aux.defined();
  r.aux_value = r.aux ? cuda::to_host(l.aux).to_floats()[0] : 0.0f;
  return r;
}

// A random correction bias (Transformers' init is zeros, which would leave its selection role untested).
inline void randomise_correction_bias(ModelWeights& w, uint64_t seed) {
  for (LayerWeights& L : w.layers)
    if (L.router_score_bias.defined()) L.router_score_bias = host_random(L.router_score_bias.shape(), seed++, 0.05f);
}

// Normalised-error limits of one gradient (cuda_test_util.h).
struct GradLimit {
  double max_norm, rel_l2;
};

// A gradient's limits against the CPU bf16 model: `base`, or for a router weight (mlp.gate.weight; GPT-OSS's
// mlp.router.weight and .bias) 0.1 max-norm /
// 0.06 rel-L2: its gradient goes through the routing-weight dot products over H and the softmax Jacobian of bf16
// logits, the noisiest (CudaHfFixture.MqaLegacyGradientsMatchCpuBf16).
inline GradLimit router_limit(const std::string& name, GradLimit base) {
  const bool router = name.find(".mlp.gate.") != std::string::npos || name.find(".mlp.router.") != std::string::npos;
  return router ? GradLimit{0.1, 0.06} : base;
}

// Every gradient of `got` against the same-named one of `want` (the same parameter table; each on the device or
// the host) within limit(index, name); MT_PRINT_ERRORS=1 prints the measured errors. `each`, when given, also
// sees every pair (extra checks or prints).
using GradLimitFn = std::function<GradLimit(size_t index, const std::string& name)>;
using GradPairFn = std::function<void(size_t index, const std::string& name, const std::vector<float>& got,
                                      const std::vector<float>& want)>;
inline void expect_gradients_near(const ModelWeights& got, const ModelWeights& want, const GradLimitFn& limit,
                                  const std::string& what = "gradient", const GradPairFn& each = {}) {
  const auto g = got.named_parameters();
  const auto w = want.named_parameters();
  ASSERT_EQ(g.size(), w.size()) << what << ": parameter count";
  for (size_t i = 0; i < w.size(); ++i) {
    const std::string& name = w[i].first;
    ASSERT_EQ(g[i].first, name) << what;
    const std::vector<float> a = floats_of(*g[i].second), b = floats_of(*w[i].second);
    const GradLimit l = limit(i, name);
    expect_norm(a, b, l.max_norm, l.rel_l2, what + " " + name);
    if (each) each(i, name, a, b);
  }
}

// The same limits for every gradient.
inline void expect_gradients_near(const ModelWeights& got, const ModelWeights& want, GradLimit l,
                                  const std::string& what = "gradient") {
  expect_gradients_near(got, want, [l](size_t, const std::string&) { return l; }, what);
}

// One training step end to end against Transformers: the CUDA model's bf16 gradients on the plain batch,
// then CudaAdamW with fp32 masters (started from the checkpoint's fp32 weights, as `model.dtype: float32`
// runs on CUDA), against the parameters after torch.optim.AdamW's step on Transformers' fp32 gradients
// (after_adamw.safetensors, settings in meta.json). Adam's first step moves a weight by lr·g/(|g| + eps),
// i.e. by ±lr for any gradient well above eps, so an element whose gradient sign agrees gets torch's
// update to fp32 rounding, and one whose sign the bf16 noise flips (gradients near zero) is off by up to
// 2·lr. Elements with |g| >= half the tensor's gradient RMS are held to 1e-5 (at most 0.5% of them may
// flip: bf16 gradients are ~1e-2 rel-L2 from fp32 ones); every other element to 2·lr + 1e-5. At least a
// fifth of all elements must be in the first group, so the check cannot pass on zero gradients.
inline void expect_one_cuda_adamw_step_matches(const std::filesystem::path& vdir) {
  const AdamWOptions o = adamw_options(read_json(vdir / "meta.json")["adamw_one_step"]);
  CausalLM m32 = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::F32});
  CausalLM m16 = CausalLM::from_pretrained((vdir / "ckpt").string(), {DType::BF16});
  ModelWeights dev_w = to_device_weights(m16.weights);
  SafetensorsFile io = SafetensorsFile::open((vdir / "plain.safetensors").string());
  DecoderCudaModel model(m16.config, dev_w, 0);
  const CudaBatch gb = cuda_batch_upload(m16.config, load_batch(io), 0);
  ModelWeights grads = device_zeros_like(m16.config);
  model.forward_backward(gb, grads, static_cast<double>(gb.target_count));

  cuda::CudaAdamWOptions co;
  co.hyper = o;
  co.bf16_master = true;
  const cudaStream_t stream = cuda::device_context(0).stream;
  cuda::CudaAdamW opt(dev_w.named_parameters(), co, nullptr, stream);  // torch's AdamW here decays everything
  auto host32 = m32.weights.named_parameters();
  auto state = opt.named_state();
  size_t masters = 0;
  for (auto& [name, t] : state)
    for (auto& [pname, hp32] : host32)
      if (name == pname + ".master") cuda::copy_host_to_device(*t, *hp32), ++masters;
  ASSERT_EQ(masters, host32.size());
  std::vector<const Tensor*> g;
  for (auto& [name, t] : grads.named_parameters()) g.push_back(t);
  opt.step(g, o.lr, nullptr, stream);

  // The fp32 masters back on the host, compared in Transformers' layout (to_hf: GPT-OSS's experts are interleaved and
  // transposed there; Qwen3-MoE's are the engine's).
  ModelWeights stepped = ModelWeights::zeros_like_config(m32.config, DType::F32);
  auto stepped_p = stepped.named_parameters();
  size_t copied = 0;
  for (auto& [name, t] : opt.named_state()) {
    if (name.size() < 7 || name.substr(name.size() - 7) != ".master") continue;
    const std::string pname = name.substr(0, name.size() - 7);
    for (auto& [sname, st] : stepped_p)
      if (sname == pname) cuda::copy_device_to_host(*st, *t), ++copied;
  }
  ASSERT_EQ(copied, stepped_p.size());
  SafetensorsFile after = SafetensorsFile::open((vdir / "after_adamw.safetensors").string());
  int64_t total = 0, well = 0, flipped = 0;
  // Transformers' names and layout where the fixture has them; older fixtures (Qwen3-MoE's legacy spellings, whose
  // to_hf names are per-expert) store the engine's names and layout.
  std::vector<std::pair<std::string, Tensor>> compared;
  for (auto& [pname, t] : stepped.to_hf(m32.config)) {  // buffers (never trained: no optimizer step) left out
    const ParamEntry* e = stepped.param_table().find(pname);
    if (!e || e->role != ParamRole::buffer) compared.emplace_back(pname, t);
  }
  bool hf_names = true;
  for (const auto& [pname, t] : compared) hf_names = hf_names && after.has(pname);
  if (!hf_names) {
    compared.clear();
    for (const auto& [pname, t] : stepped.named_parameters()) compared.emplace_back(pname, *t);
  }
  for (const auto& [pname, t] : compared) {
    SCOPED_TRACE(pname);
    const std::vector<float> got = t.to_floats(), want = after.tensor(pname).to_floats();
    const std::vector<float> gref = io.tensor("grad." + pname).to_floats();
    ASSERT_EQ(got.size(), want.size());
    double ss = 0;
    for (float v : gref) ss += double(v) * v;
    const double rms = std::sqrt(ss / std::max<size_t>(gref.size(), 1));
    for (size_t i = 0; i < got.size(); ++i, ++total) {
      const double d = std::fabs(double(got[i]) - want[i]);
      ASSERT_LE(d, 2 * o.lr + 1e-5) << "element " << i << ": " << got[i] << " vs " << want[i];
      if (rms > 0 && std::fabs(gref[i]) >= 0.5 * rms) {
        ++well;
        flipped += d > 1e-5;
      }
    }
  }
  EXPECT_GE(well * 5, total) << well << " of " << total << " elements have a gradient above half their RMS";
  EXPECT_LE(flipped * 200, well) << flipped << " of " << well << " well-conditioned elements differ by more than 1e-5";
  if (std::getenv("MT_PRINT_ERRORS"))
    std::printf("[ error    ] one step: %lld of %lld well-conditioned elements off by > 1e-5 (%lld elements)\n",
                static_cast<long long>(flipped), static_cast<long long>(well), static_cast<long long>(total));
}



// The logits of every row as Transformers' bf16 run rounds them: the CUDA model's final hidden state (F32 or BF16 on
// the device, [T, H]) times the head (host weights, [V, H]) in fp64, rounded once to bf16. The loss never
// materialises logits, so comparisons with a fixture's logits go through this.
inline std::vector<float> bf16_logits_from_final_hidden(const Tensor& final_hidden, const Tensor& head, int64_t T,
                                                        int64_t H, int64_t V) {
  const std::vector<float> xf = device_floats(final_hidden), hw = head.to_floats();
  EXPECT_EQ(static_cast<int64_t>(xf.size()), T * H);
  std::vector<float> logits(static_cast<size_t>(T * V));
  if (static_cast<int64_t>(xf.size()) != T * H) return logits;
  for (int64_t r = 0; r < T; ++r)
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t h = 0; h < H; ++h) acc += double(xf[r * H + h]) * hw[v * H + h];
      logits[r * V + v] = round_bf16(static_cast<float>(acc));
    }
  return logits;
}

}  // namespace mt::test
