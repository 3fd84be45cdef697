#include "layers/expert_parallel.h"

#include <cstring>

#include "core/error.h"
#include "distributed/communicator.h"
#include "core/float_convert.h"

namespace mt {

namespace {

// One row of H floats appended to a message.
void append_rows(std::vector<float>& msg, const float* src, int64_t H) {
  msg.insert(msg.end(), src, src + H);
}

}  // namespace

ExpertParallel expert_parallel_for(Communicator* comm, int64_t ep, int64_t num_experts) {
  ExpertParallel r;
  const int64_t world = comm ? comm->size() : 1;
  if (ep == 1) return r;
  if (world % ep != 0)
    fail("parallel.ep: {} does not divide the {} rank{} of this job", ep, world, world == 1 ? "" : "s");
  if (num_experts % ep != 0) fail("parallel.ep: {} does not divide the model's {} experts", ep, num_experts);
  r.comm = comm;
  const int rank = comm->rank(), n = static_cast<int>(ep);
  const int first = rank / n * n;
  for (int j = 0; j < n; ++j) r.group.push_back(first + j);
  r.me = rank - first;
  r.experts_per_rank = num_experts / n;
  for (int q = r.me; q < world; q += n) r.replicas.push_back(q);
  return r;
}

Tensor ep_experts_forward(const ExpertParallel& ep, const Tensor& x, const Tensor& index, const Tensor& weights,
                          const Tensor& gate_up, const Tensor& down, bool bf16, EpExpertsSaved* saved,
                          const cpu::ExpertsVariant& variant) {
  MT_CHECK(saved != nullptr, "ep_experts_forward needs a saved struct");
  const int g = static_cast<int>(ep.group.size());
  const int64_t T = weights.dim(0), k = weights.dim(1), H = x.dim(1), E = ep.experts_per_rank * g;
  MT_CHECK(gate_up.dim(0) == ep.experts_per_rank && down.dim(0) == ep.experts_per_rank,
           "expert parallel: this rank holds {} / {} experts, it owns {}", gate_up.dim(0), down.dim(0),
           ep.experts_per_rank);
  const int32_t* idx = index.data_as<int32_t>();
  const float* xp = x.data_as<float>();
  EpExpertsSaved& s = *saved;
  s.slots.assign(g, {});
  std::vector<std::vector<float>> send(g), recv;
  for (int64_t i = 0; i < T * k; ++i) {
    const int e = idx[i];
    MT_CHECK(e >= 0 && e < E, "expert index {} outside [0, {})", e, E);
    s.slots[e / ep.experts_per_rank].push_back(i);
  }
  // Message to group[j]: n local expert ids (as floats, exact), then the n token rows.
  for (int j = 0; j < g; ++j) {
    for (int64_t i : s.slots[j]) send[j].push_back(static_cast<float>(idx[i] - j * ep.experts_per_rank));
    for (int64_t i : s.slots[j]) append_rows(send[j], xp + (i / k) * H, H);
  }
  ep.comm->all_to_allv(ep.group, send, recv, "all_to_allv(expert dispatch, forward)");

  s.recv_rows.assign(g, 0);
  int64_t N = 0;
  for (int j = 0; j < g; ++j) {
    if (recv[j].size() % static_cast<size_t>(H + 1) != 0)
      fail("expert parallel: rank {} sent {} values, not rows of {} + 1", ep.group[j], recv[j].size(), H);
    s.recv_rows[j] = static_cast<int64_t>(recv[j].size()) / (H + 1);
    N += s.recv_rows[j];
  }
  Tensor xr = Tensor::empty({N, H}, DType::F32), ir = Tensor::empty({N, 1}, DType::I32);
  Tensor ones = Tensor::empty({N, 1}, DType::F32);
  int64_t r = 0;
  for (int j = 0; j < g; ++j) {
    const int64_t n = s.recv_rows[j];
    for (int64_t q = 0; q < n; ++q, ++r) {
      const float id = recv[j][q];
      if (!(id >= 0 && id < static_cast<float>(ep.experts_per_rank)))
        fail("expert parallel: rank {} sent local expert id {} (this rank owns {})", ep.group[j], id,
             ep.experts_per_rank);
      ir.data_as<int32_t>()[r] = static_cast<int32_t>(id);
      ones.data_as<float>()[r] = 1.0f;
      std::memcpy(xr.data_as<float>() + r * H, recv[j].data() + n + q * H, sizeof(float) * H);
    }
  }
  // k = 1 and weight 1: each output row is its expert's output, bias included (already bf16-rounded in bf16 mode).
  Tensor yr = cpu::experts_forward(xr, ir, ones, gate_up, down, bf16, &s.local, variant);

  std::vector<std::vector<float>> back(g);
  r = 0;
  for (int j = 0; j < g; ++j)
    for (int64_t q = 0; q < s.recv_rows[j]; ++q, ++r) append_rows(back[j], yr.data_as<float>() + r * H, H);
  ep.comm->all_to_allv(ep.group, back, recv, "all_to_allv(expert combine, forward)");
  s.y_slots = Tensor::empty({T * k, H}, DType::F32);
  float* ys = s.y_slots.data_as<float>();
  for (int j = 0; j < g; ++j) {
    if (recv[j].size() != s.slots[j].size() * static_cast<size_t>(H))
      fail("expert parallel: rank {} returned {} values for {} rows", ep.group[j], recv[j].size(), s.slots[j].size());
    for (size_t q = 0; q < s.slots[j].size(); ++q)
      std::memcpy(ys + s.slots[j][q] * H, recv[j].data() + q * H, sizeof(float) * H);
  }

  // The routing-weighted combine, exactly as cpu::experts_forward does it.
  Tensor out = Tensor::empty({T, H}, DType::F32);
  float* op = out.data_as<float>();
  const float* wp = weights.data_as<float>();
  const bool round_product = bf16 && !variant.fp32_weights;
  for (int64_t t = 0; t < T; ++t) {
    float* o = op + t * H;
    for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float w = wp[t * k + j];
      const float* yrow = ys + (t * k + j) * H;
      for (int64_t h = 0; h < H; ++h) o[h] += round_product ? round_bf16(yrow[h] * w) : yrow[h] * w;
    }
    if (bf16)
      for (int64_t h = 0; h < H; ++h) o[h] = round_bf16(o[h]);
  }
  return out;
}

void ep_experts_backward(const ExpertParallel& ep, const Tensor& dout, const Tensor& weights, const Tensor& gate_up,
                         const Tensor& down, const EpExpertsSaved& s, Tensor& dx, Tensor& dweights, Tensor& dgate_up,
                         Tensor& ddown, const cpu::ExpertsVariant& variant, const cpu::ExpertsBiasGrads& bias_grads) {
  const int g = static_cast<int>(ep.group.size());
  const int64_t T = weights.dim(0), k = weights.dim(1), H = dout.dim(1);
  MT_CHECK(s.y_slots.defined() && s.y_slots.dim(0) == T * k, "expert parallel backward without its forward");
  const float* gp = dout.data_as<float>();
  const float* wp = weights.data_as<float>();
  const float* ys = s.y_slots.data_as<float>();
  dweights = Tensor::empty({T, k}, DType::F32);
  float* dwp = dweights.data_as<float>();
  // dweights and each slot's dY (= dout · w), as cpu::experts_backward computes them.
  std::vector<std::vector<float>> send(g), recv;
  std::vector<float> dy_row(static_cast<size_t>(H));
  for (int j = 0; j < g; ++j) {
    for (int64_t sl : s.slots[j]) {
      const int64_t t = sl / k;
      double dot = 0.0;
      for (int64_t h = 0; h < H; ++h) {
        dot += static_cast<double>(gp[t * H + h]) * ys[sl * H + h];
        dy_row[h] = gp[t * H + h] * wp[sl];
      }
      dwp[sl] = static_cast<float>(dot);
      append_rows(send[j], dy_row.data(), H);
    }
  }
  ep.comm->all_to_allv(ep.group, send, recv, "all_to_allv(expert dispatch, backward)");
  int64_t N = 0;
  for (int j = 0; j < g; ++j) {
    if (static_cast<int64_t>(recv[j].size()) != s.recv_rows[j] * H)
      fail("expert parallel: rank {} sent {} gradient values for {} rows", ep.group[j], recv[j].size(),
           s.recv_rows[j]);
    N += s.recv_rows[j];
  }
  Tensor dyr = Tensor::empty({N, H}, DType::F32), ones = Tensor::empty({N, 1}, DType::F32);
  int64_t r = 0;
  for (int j = 0; j < g; ++j)
    for (int64_t q = 0; q < s.recv_rows[j]; ++q, ++r) {
      std::memcpy(dyr.data_as<float>() + r * H, recv[j].data() + q * H, sizeof(float) * H);
      ones.data_as<float>()[r] = 1.0f;
    }
  Tensor dxr, dw_unused;
  cpu::experts_backward(dyr, ones, gate_up, down, s.local, dxr, dw_unused, dgate_up, ddown, variant, bias_grads);

  std::vector<std::vector<float>> back(g);
  r = 0;
  for (int j = 0; j < g; ++j)
    for (int64_t q = 0; q < s.recv_rows[j]; ++q, ++r) append_rows(back[j], dxr.data_as<float>() + r * H, H);
  ep.comm->all_to_allv(ep.group, back, recv, "all_to_allv(expert combine, backward)");
  // dX per token: its slots' input gradients summed in slot order, as cpu::experts_backward does.
  Tensor dslots = Tensor::empty({T * k, H}, DType::F32);
  float* dsp = dslots.data_as<float>();
  for (int j = 0; j < g; ++j) {
    if (recv[j].size() != s.slots[j].size() * static_cast<size_t>(H))
      fail("expert parallel: rank {} returned {} input-gradient values for {} rows", ep.group[j], recv[j].size(),
           s.slots[j].size());
    for (size_t q = 0; q < s.slots[j].size(); ++q)
      std::memcpy(dsp + s.slots[j][q] * H, recv[j].data() + q * H, sizeof(float) * H);
  }
  dx = Tensor::empty({T, H}, DType::F32);
  float* dxo = dx.data_as<float>();
  for (int64_t t = 0; t < T; ++t) {
    float* o = dxo + t * H;
    for (int64_t h = 0; h < H; ++h) o[h] = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t h = 0; h < H; ++h) o[h] += dsp[(t * k + j) * H + h];
  }
}

}  // namespace mt
