#include "models/cuda/cuda_batch.h"

#include "core/error.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/rope.h"

namespace mt {

CudaBatch cuda_batch_upload(const DecoderSpec& cfg, const Batch& b, int device, bool document_mask) {
  batch_validate(cfg, b);
  cuda::DeviceContext& ctx = cuda::device_context(device);
  CudaBatch g;
  g.batch = b.input_ids.dim(0);
  g.seq = b.input_ids.dim(1);
  g.uniform_across_ranks = b.uniform_across_ranks;
  const int64_t T = g.tokens();
  g.ids = cuda::to_device(b.input_ids.view({T}), device);
  if (b.labels.defined()) {
    const Tensor targets = cpu::causal_lm_targets(b.labels, cfg.vocab_size);
    const int64_t* y = targets.data_as<int64_t>();
    for (int64_t i = 0; i < targets.numel(); ++i) g.target_count += y[i] != -100;
    g.targets = cuda::to_device(targets.view({T}), device);
    if (g.target_count < T) {
      MT_CHECK(T < (int64_t{1} << 31), "batch: {} tokens in one micro-batch exceed the int32 row index", T);
      Tensor rows = Tensor::empty({g.target_count}, DType::I32), row_targets = Tensor::empty({g.target_count}, DType::I64);
      int64_t n = 0;
      for (int64_t i = 0; i < T; ++i) {
        if (y[i] == -100) continue;
        rows.data_as<int32_t>()[n] = static_cast<int32_t>(i);
        row_targets.data_as<int64_t>()[n++] = y[i];
      }
      g.target_rows = cuda::to_device(rows, device);
      g.row_targets = cuda::to_device(row_targets, device);
    }
  }
  const Tensor positions = cuda::to_device(batch_positions(b).view({T}), device);
  g.rope_cos = Tensor::empty({T, cfg.only_attention().head_dim / 2}, DType::F32, Device::cuda(device));
  g.rope_sin = Tensor::empty({T, cfg.only_attention().head_dim / 2}, DType::F32, Device::cuda(device));
  cuda::rope_tables(positions, cfg.only_attention().head_dim, cfg.only_attention().rope.theta, /*bf16=*/true,
                    g.rope_cos, g.rope_sin, ctx.stream);
  const Tensor doc_ids = document_mask ? batch_document_ids(b) : Tensor();
  const Tensor doc_dev = doc_ids.defined() ? cuda::to_device(doc_ids, device) : Tensor();
  g.docs = cuda::attention_docs_from_ids(doc_dev, g.batch, g.seq, device, ctx.stream);
  return g;
}

}  // namespace mt
