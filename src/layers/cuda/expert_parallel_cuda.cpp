#include "layers/cuda/expert_parallel_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "distributed/cuda/device_communicator.h"
#include "kernels/cuda/cuda_check.h"

namespace mt {

std::vector<std::vector<int>> expert_parallel_groups(int world, int64_t ep) {
  std::vector<std::vector<int>> g(static_cast<size_t>(world / ep));
  for (int r = 0; r < world; ++r) g[static_cast<size_t>(r / ep)].push_back(r);
  return g;
}

std::vector<std::vector<int>> expert_replica_groups(int world, int64_t ep) {
  std::vector<std::vector<int>> g(static_cast<size_t>(ep));
  for (int r = 0; r < world; ++r) g[static_cast<size_t>(r % ep)].push_back(r);
  return g;
}

CudaExpertParallel::CudaExpertParallel(DeviceCommunicator& comm, int64_t experts, EpDispatchMode mode)
    : comm_(comm), experts_(experts), mode_(mode) {
  MT_CHECK(comm.size() >= 1 && experts % comm.size() == 0, "expert parallel: {} experts over {} ranks", experts,
           comm.size());
  per_rank_ = experts / comm.size();
  const size_t bytes = sizeof(int32_t) * static_cast<size_t>(comm.size()) * static_cast<size_t>(experts + 1);
  MT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned_), bytes));
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device));
  watch_ = Tensor::empty({2}, DType::I32, Device::cuda(device));
}

void CudaExpertParallel::begin_step(cudaStream_t stream, bool exact) {
  MT_CUDA_CHECK(cudaMemsetAsync(watch_.data(), 0, watch_.nbytes(), stream));
  budgeted_ = !exact && !budget_.exact();
}

CudaExpertParallel::StepRows CudaExpertParallel::end_step(cudaStream_t stream) {
  MT_CUDA_CHECK(cudaMemcpyAsync(pinned_, watch_.data(), watch_.nbytes(), cudaMemcpyDeviceToHost, stream));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));  // after the step's own sync: nothing left to wait for
  budgeted_ = false;
  StepRows r{pinned_[0], pinned_[1]};
  budget_.observe(r.load);
  return r;
}

CudaExpertParallel::~CudaExpertParallel() {
  if (join_) cudaEventDestroy(join_);
  if (fork_) cudaEventDestroy(fork_);
  if (side_) cudaStreamDestroy(side_);
  if (pinned_) cudaFreeHost(pinned_);
}

int CudaExpertParallel::me() const { return comm_.rank(); }
int CudaExpertParallel::ranks() const { return comm_.size(); }

int64_t ep_padded_rows(int64_t n) {
  if (n <= 16) return std::max<int64_t>(n, 1);
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  const int64_t step = p / 16;
  return (n + step - 1) / step * step;
}

EpDispatch ep_dispatch_plan(const CudaExpertParallel& ep, const Tensor& plan_offsets, cudaStream_t stream,
                            const std::string& what) {
  const int64_t E = ep.experts(), g = ep.ranks(), el = ep.experts_per_rank();
  const int me = ep.me();
  MT_CHECK(plan_offsets.defined() && plan_offsets.dtype() == DType::I32 && plan_offsets.numel() == E + 1,
           "{}: plan offsets must be I32 [{}], found {}", what, E + 1,
           plan_offsets.defined() ? plan_offsets.desc() : std::string("none"));
  Tensor gathered = Tensor::empty({g, E + 1}, DType::I32, plan_offsets.device());
  ep.comm().all_gather(plan_offsets.data(), gathered.data(), E + 1, DType::I32, stream, what + ": all_gather(offsets)");
  EpDispatch d;
  d.layout = cuda::ep_layout(gathered, me, el, stream);
  MT_CUDA_CHECK(cudaMemcpyAsync(ep.pinned_offsets(), gathered.data(), gathered.nbytes(), cudaMemcpyDeviceToHost, stream));
  const auto t0 = std::chrono::steady_clock::now();
  ep.comm().wait(stream, what + ": row counts");
  ep.count_wait(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  ep.count_read();
  auto off = [&](int64_t s, int64_t e) { return static_cast<int64_t>(ep.pinned_offsets()[s * (E + 1) + e]); };
  d.send_first.resize(g);
  d.send_rows.resize(g);
  d.recv_first.resize(g);
  d.recv_rows.resize(g);
  for (int64_t j = 0; j < g; ++j) {
    d.send_first[j] = off(me, j * el);
    d.send_rows[j] = off(me, (j + 1) * el) - d.send_first[j];
    d.recv_first[j] = d.recv_total;
    d.recv_rows[j] = off(j, (me + 1) * el) - off(j, me * el);
    if (d.send_rows[j] < 0 || d.recv_rows[j] < 0 || off(j, E) < 0)
      fail("{}: rank {} of the expert-parallel group sent inconsistent offsets", what, j);
    d.recv_total += d.recv_rows[j];
  }
  return d;
}

Tensor ep_to_experts(const CudaExpertParallel& ep, const EpDispatch& d, const Tensor& rows, cudaStream_t stream,
                     const std::string& what) {
  MT_CHECK(rows.defined() && rows.ndim() == 2 && rows.dtype() == DType::BF16, "{}: rows must be BF16 [slots, H]", what);
  const int64_t H = rows.dim(1), n = ep_padded_rows(d.recv_total);
  const int64_t row_bytes = H * static_cast<int64_t>(sizeof(uint16_t));
  Tensor source_major = Tensor::empty({n, H}, DType::BF16, rows.device());
  ep.comm().all_to_allv(rows.data(), d.send_first, d.send_rows, source_major.data(), d.recv_first, d.recv_rows,
                       row_bytes, stream, what);
  for (int j = 0; j < ep.ranks(); ++j)
    if (j != ep.me()) ep.count_sent(d.send_rows[j] * row_bytes);
  Tensor expert_major = Tensor::empty({n, H}, DType::BF16, rows.device());
  cuda::ep_regroup(source_major, d.layout, /*to_expert_major=*/true, expert_major, stream);
  return expert_major;
}

Tensor ep_from_experts(const CudaExpertParallel& ep, const EpDispatch& d, const Tensor& expert_rows, int64_t slots,
                       cudaStream_t stream, const std::string& what) {
  MT_CHECK(expert_rows.defined() && expert_rows.ndim() == 2 && expert_rows.dtype() == DType::BF16 &&
               expert_rows.dim(0) == ep_padded_rows(d.recv_total),
           "{}: expected BF16 [{}, H] expert rows", what, ep_padded_rows(d.recv_total));
  const int64_t H = expert_rows.dim(1);
  const int64_t row_bytes = H * static_cast<int64_t>(sizeof(uint16_t));
  Tensor source_major = Tensor::empty(expert_rows.shape(), DType::BF16, expert_rows.device());
  cuda::ep_regroup(expert_rows, d.layout, /*to_expert_major=*/false, source_major, stream);
  Tensor out = Tensor::empty({slots, H}, DType::BF16, expert_rows.device());
  // The way back swaps the roles: what this rank received from j returns to j.
  ep.comm().all_to_allv(source_major.data(), d.recv_first, d.recv_rows, out.data(), d.send_first, d.send_rows,
                       row_bytes, stream, what);
  for (int j = 0; j < ep.ranks(); ++j)
    if (j != ep.me()) ep.count_sent(d.recv_rows[j] * row_bytes);
  return out;
}

namespace {

Shape with_rows(const Shape& s, int64_t rows) {
  Shape out = s;
  out[0] = rows;
  return out;
}

}  // namespace

std::vector<Tensor> ep_all_gather_rows(const CudaExpertParallel& ep, const std::vector<Tensor>& xs,
                                       cudaStream_t stream, const std::string& what) {
  const int64_t g = ep.ranks();
  std::vector<Tensor> out;
  std::vector<DeviceCommunicator::Gather> parts;
  for (const Tensor& x : xs) {
    MT_CHECK(x.defined() && x.ndim() >= 1 && x.device().is_cuda(), "{}: expected device rows", what);
    out.push_back(Tensor::empty(with_rows(x.shape(), g * x.dim(0)), x.dtype(), x.device()));
    parts.push_back({x.data(), out.back().data(), x.numel(), x.dtype()});
    ep.count_sent((g - 1) * x.nbytes());
  }
  ep.comm().all_gather(parts, stream, what);
  return out;
}

Tensor ep_reduce_scatter_rows(const CudaExpertParallel& ep, const Tensor& partial, cudaStream_t stream,
                              const std::string& what) {
  const int64_t g = ep.ranks();
  MT_CHECK(partial.defined() && partial.ndim() >= 1 && partial.dim(0) % g == 0, "{}: expected [{}·T, ...] rows",
           what, g);
  Tensor out = Tensor::empty(with_rows(partial.shape(), partial.dim(0) / g), partial.dtype(), partial.device());
  ep.comm().reduce_scatter_sum(partial.data(), out.data(), out.numel(), partial.dtype(), stream, what);
  ep.count_sent((g - 1) * out.nbytes());
  return out;
}

namespace {

// Forks the side stream off `stream`, runs `collectives` there and marks the join.
template <typename F>
EpPending ep_on_side_stream(const CudaExpertParallel& ep, const std::vector<Tensor>& inputs, cudaStream_t stream,
                            F&& collectives) {
  EpPending p;
  p.inputs = inputs;
  MT_CUDA_CHECK(cudaEventRecord(ep.fork_event(), stream));
  MT_CUDA_CHECK(cudaStreamWaitEvent(ep.side_stream(), ep.fork_event(), 0));
  p.results = collectives(ep.side_stream());
  MT_CUDA_CHECK(cudaEventRecord(ep.join_event(), ep.side_stream()));
  p.pending = true;
  return p;
}

}  // namespace

EpPending ep_reduce_scatter_async(const CudaExpertParallel& ep, const std::vector<Tensor>& partials,
                                  cudaStream_t stream, const std::string& what) {
  return ep_on_side_stream(ep, partials, stream, [&](cudaStream_t side) {
    std::vector<Tensor> r;
    for (const Tensor& t : partials) r.push_back(ep_reduce_scatter_rows(ep, t, side, what));
    return r;
  });
}

EpPending ep_all_gather_async(const CudaExpertParallel& ep, const std::vector<Tensor>& xs, cudaStream_t stream,
                              const std::string& what) {
  return ep_on_side_stream(ep, xs, stream, [&](cudaStream_t side) { return ep_all_gather_rows(ep, xs, side, what); });
}

void ep_join(const CudaExpertParallel& ep, EpPending& p, cudaStream_t stream) {
  if (!p.pending) return;
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream, ep.join_event(), 0));
  p.inputs.clear();  // freed after the join: later work on `stream` is ordered after the reduce-scatters
  p.pending = false;
}

int64_t ep_live_rows(const CudaExpertParallel& ep, const Tensor& plan_offsets, int64_t live_experts,
                     cudaStream_t stream, const std::string& what) {
  MT_CHECK(plan_offsets.defined() && plan_offsets.dtype() == DType::I32 && plan_offsets.numel() > live_experts,
           "{}: plan offsets must be I32 with more than {} entries", what, live_experts);
  MT_CUDA_CHECK(cudaMemcpyAsync(ep.pinned_offsets(), plan_offsets.data_as<int32_t>() + live_experts,
                                sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  const auto t0 = std::chrono::steady_clock::now();
  ep.comm().wait(stream, what);
  ep.count_wait(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  ep.count_read();
  const int64_t n = ep.pinned_offsets()[0];
  if (n < 0) fail("{}: negative row count {}", what, n);
  return n;
}

}  // namespace mt
