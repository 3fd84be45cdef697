#include "models/cuda/cuda_lora.h"

#include "core/error.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/lora.h"

namespace mt {

namespace {

// A LoraWeights of `table` whose tensors are empty device tensors of dtype dt (scale per layer as the table's).
LoraWeights device_like(const LoraWeights& host, DType dt, int device) {
  LoraWeights w;
  w.table = host.table;
  w.layers.resize(host.layers.size());
  for (size_t l = 0; l < host.layers.size(); ++l) w.layers[l].scale = host.layers[l].scale;
  for (const LoraEntry& e : w.table->entries) w.slot(e) = Tensor::empty(e.shape, dt, Device::cuda(device));
  return w;
}

}  // namespace

CudaLora::CudaLora(const LoraWeights& host, int device) : device_(device) {
  MT_CHECK(host.table != nullptr, "CudaLora: adapter without a table");
  for (const LoraEntry& e : host.table->entries) {
    const Tensor& t = host.slot(e);
    MT_CHECK(t.defined() && t.dtype() == DType::F32 && t.device().is_cpu() && t.shape() == e.shape,
             "CudaLora: {} must be F32 {} on the CPU, found {}", e.name, shape_str(e.shape),
             t.defined() ? t.desc() : "none");
  }
  masters_ = device_like(host, DType::F32, device_);
  working_ = device_like(host, DType::BF16, device_);
  for (const LoraEntry& e : host.table->entries) cuda::copy_host_to_device(masters_.slot(e), host.slot(e));
  refresh();
}

LoraWeights CudaLora::zero_grads() const {
  LoraWeights g = device_like(masters_, DType::F32, device_);
  const cudaStream_t stream = cuda::device_context(device_).stream;
  for (auto& [name, t] : g.named_parameters()) cuda::fill_zero_async(*t, stream);
  return g;
}

void CudaLora::refresh() {
  const cudaStream_t stream = cuda::device_context(device_).stream;
  for (size_t l = 0; l < masters_.layers.size(); ++l) {
    const LayerLora& m = masters_.layers[l];
    LayerLora& w = working_.layers[l];
    for (int slot = 0; slot <= WeightSlot::last_layer_slot; ++slot) {
      const LoraPair* mp = m.at(slot);
      if (!mp || !mp->on()) continue;
      LoraPair* wp = w.at(slot);
      cuda::lora_working_copy(mp->a, mp->b, m.scale, wp->a, wp->b, stream);
    }
  }
}

void CudaLora::to_host(LoraWeights& host) const {
  MT_CHECK(host.table && host.table->entries.size() == masters_.table->entries.size(),
           "CudaLora::to_host: the host adapter has another table");
  for (const LoraEntry& e : masters_.table->entries) cuda::copy_device_to_host(host.slot(e), masters_.slot(e));
}

int64_t CudaLora::bytes() const {
  int64_t b = 0;
  for (const auto& [name, t] : masters_.named_parameters()) b += static_cast<int64_t>(t->nbytes());
  for (const auto& [name, t] : working_.named_parameters()) b += static_cast<int64_t>(t->nbytes());
  return b;
}

}  // namespace mt
