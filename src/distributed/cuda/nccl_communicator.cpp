#include "distributed/cuda/nccl_communicator.h"

#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/cuda/collective_trail.h"
#include "distributed/mpi_bootstrap.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"

namespace mt {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    default: fail("NCCL: dtype {} has no NCCL type", dtype_safetensors_name(t));
  }
}

// Non-blocking unless MIXTUNE_NCCL_BLOCKING=1 (an experiment switch: a blocking communicator queues its
// kernels in the calling thread, without the polling round trip).
ncclConfig_t comm_config() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  const char* b = std::getenv("MIXTUNE_NCCL_BLOCKING");
  c.blocking = b && std::string(b) == "1" ? 1 : 0;
  return c;
}

// Polls until a non-blocking communicator's pending operation has finished; returns its final state.
// Gives up (returning ncclInProgress) at `deadline`.
ncclResult_t poll_comm(ncclComm_t comm, Clock::time_point deadline) {
  ncclResult_t state = ncclInProgress;
  for (int spins = 0;; ++spins) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress || Clock::now() > deadline) return state;
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// MIXTUNE_NCCL_A2A=p2p keeps send/recv for two ranks (for comparison).
bool two_rank_broadcast() {
  const char* v = std::getenv("MIXTUNE_NCCL_A2A");
  return !(v && std::string(v) == "p2p");
}

std::string nccl_error_text(ncclComm_t comm, ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  if (const char* last = comm ? ncclGetLastError(comm) : nullptr; last && *last) s += std::string(" (") + last + ")";
  return s;
}

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm* comm, int rank, int size, int device,
                                   std::chrono::milliseconds timeout, std::string name, int host_rank)
    : comm_(comm), rank_(rank), size_(size), device_(device), host_rank_(host_rank), timeout_(timeout),
      name_(std::move(name)) {}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_group(Communicator& host, int device,
                                                                 std::chrono::milliseconds timeout,
                                                                 const std::vector<std::vector<int>>& groups,
                                                                 const std::string& name) {
  cuda::device_set(device);
  const int me = host.rank();
  int my_group = -1, my_rank = -1;
  for (size_t g = 0; g < groups.size(); ++g) {
    MT_CHECK(!groups[g].empty(), "{}: empty group", name);
    for (size_t i = 0; i < groups[g].size(); ++i)
      if (groups[g][i] == me) my_group = static_cast<int>(g), my_rank = static_cast<int>(i);
  }
  MT_CHECK(my_group >= 0, "{}: rank {} is in none of the groups", name, me);
  ncclUniqueId mine{};
  for (size_t g = 0; g < groups.size(); ++g) {
    ncclUniqueId id{};
    const int root = groups[g][0];
    if (me == root) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) fail("rank {}: ncclGetUniqueId failed ({}): {}", me, name, ncclGetErrorString(r));
    }
    // Under mpirun the ids go through MPI (distributed/mpi_bootstrap.h), else over the TCP rendezvous's mesh.
    if (mpi_active())
      mpi_broadcast(&id, sizeof id, root, name + " unique id");
    else
      host.broadcast(&id, sizeof id, root, "broadcast(" + name + " unique id)");
    if (static_cast<int>(g) == my_group) mine = id;
  }
  const int n = static_cast<int>(groups[static_cast<size_t>(my_group)].size());
  ncclConfig_t config = comm_config();
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, n, mine, my_rank, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    fail("rank {}: {} initialisation on cuda:{} failed: {}", me, name, device, nccl_error_text(comm, r));
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(comm, my_rank, n, device, timeout, name, me));
  c->settle(r, "ncclCommInitRankConfig", fmt::format("{} initialisation on cuda:{}", name, device));
  // Every rank has joined before the first collective is queued.
  host.barrier("barrier(" + name + " ready)");
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (!comm_) return;
  // A healthy communicator finalises (flushing its pending work) within the timeout; else it is aborted.
  const ncclResult_t f = ncclCommFinalize(comm_);
  const bool ok = (f == ncclSuccess || f == ncclInProgress) && poll_comm(comm_, Clock::now() + timeout_) == ncclSuccess;
  if (ok)
    ncclCommDestroy(comm_);
  else
    ncclCommAbort(comm_);
}

void NcclCommunicator::settle(int result, const char* call, const std::string& what) {
  const auto r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess) return;
  if (r != ncclInProgress) abort_and_fail(fmt::format("{} failed in {}: {}", call, what, nccl_error_text(comm_, r)));
  const ncclResult_t s = poll_comm(comm_, Clock::now() + timeout_);
  if (s == ncclInProgress)
    abort_and_fail(fmt::format("{} did not complete within {:g} s ({})", what, timeout_.count() / 1000.0, call));
  if (s != ncclSuccess) abort_and_fail(fmt::format("{} failed in {}: {}", call, what, nccl_error_text(comm_, s)));
}

// A collective that failed or timed out leaves NCCL kernels and peers in an unknown state: unwinding through
// the CUDA and NCCL destructors (a device synchronisation, a finalize that waits for the peers) could hang the
// very process that is reporting the hang. So, as PyTorch's NCCL watchdog does, the process reports the error
// in mixtune's one-line format and exits; the launcher (or mpirun/srun) then stops the other ranks. A watchdog
// thread bounds ncclCommAbort itself.
void NcclCommunicator::abort_and_fail(const std::string& why) {
  const std::string msg = fmt::format("rank {} ({} rank {} of {}): {}", host_rank_, name_, rank_, size_, why);
  std::fprintf(stderr, "mixtune: error: %s\n", msg.c_str());
  std::fflush(stderr);
  broken_ = true;
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(1);
  }).detach();
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  std::_Exit(1);
}

void NcclCommunicator::all_reduce_sum(const std::vector<Buffer>& buffers, cudaStream_t stream,
                                      const std::string& what) {
  MT_CHECK(comm_ != nullptr, "{}: the NCCL communicator was aborted", what);
  settle(ncclGroupStart(), "ncclGroupStart", what);
  for (const Buffer& b : buffers)
    if (b.count > 0)
      settle(ncclAllReduce(b.data, b.data, static_cast<size_t>(b.count), nccl_type(b.dtype), ncclSum, comm_, stream),
             "ncclAllReduce", what);
  settle(ncclGroupEnd(), "ncclGroupEnd", what);
  queued(stream, what);
}

void NcclCommunicator::broadcast(const std::vector<Broadcast>& parts, cudaStream_t stream, const std::string& what) {
  MT_CHECK(comm_ != nullptr, "{}: the NCCL communicator was aborted", what);
  for (const Broadcast& b : parts)
    MT_CHECK(b.root >= 0 && b.root < size_, "{}: broadcast root {} outside the {} ranks", what, b.root, size_);
  settle(ncclGroupStart(), "ncclGroupStart", what);
  for (const Broadcast& b : parts) {
    if (b.count > 0)
      settle(ncclBroadcast(b.data, b.data, static_cast<size_t>(b.count), nccl_type(b.dtype), b.root, comm_, stream),
             "ncclBroadcast", what);
  }
  settle(ncclGroupEnd(), "ncclGroupEnd", what);
  queued(stream, what);
}

void NcclCommunicator::reduce_sum(const std::vector<Reduce>& parts, cudaStream_t stream, const std::string& what) {
  MT_CHECK(comm_ != nullptr, "{}: the NCCL communicator was aborted", what);
  for (const Reduce& r : parts)
    MT_CHECK(r.root >= 0 && r.root < size_, "{}: reduce root {} outside the {} ranks", what, r.root, size_);
  settle(ncclGroupStart(), "ncclGroupStart", what);
  for (const Reduce& r : parts)
    if (r.count > 0)
      settle(ncclReduce(r.data, r.data, static_cast<size_t>(r.count), nccl_type(r.dtype), ncclSum, r.root, comm_,
                        stream),
             "ncclReduce", what);
  settle(ncclGroupEnd(), "ncclGroupEnd", what);
  queued(stream, what);
}

void NcclCommunicator::all_gather(const std::vector<Gather>& parts, cudaStream_t stream, const std::string& what) {
  MT_CHECK(comm_ != nullptr, "{}: the NCCL communicator was aborted", what);
  settle(ncclGroupStart(), "ncclGroupStart", what);
  for (const Gather& g : parts)
    settle(ncclAllGather(g.send, g.recv, static_cast<size_t>(g.count), nccl_type(g.dtype), comm_, stream),
           "ncclAllGather", what);
  settle(ncclGroupEnd(), "ncclGroupEnd", what);
  queued(stream, what);
}

void NcclCommunicator::reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype,
                                          cudaStream_t stream, const std::string& what) {
  MT_CHECK(comm_ != nullptr, "{}: the NCCL communicator was aborted", what);
  settle(ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type(dtype), ncclSum, comm_, stream),
         "ncclReduceScatter", what);
  queued(stream, what);
}

void NcclCommunicator::all_to_allv(const void* send, const std::vector<int64_t>& send_first,
                                   const std::vector<int64_t>& send_rows, void* recv,
                                   const std::vector<int64_t>& recv_first, const std::vector<int64_t>& recv_rows,
                                   int64_t row_bytes, cudaStream_t stream, const std::string& what) {
  MT_CHECK(comm_ != nullptr, "{}: the NCCL communicator was aborted", what);
  const size_t n = static_cast<size_t>(size_);
  MT_CHECK(send_first.size() == n && send_rows.size() == n && recv_first.size() == n && recv_rows.size() == n,
           "{}: all_to_allv needs {} entries per list", what, n);
  const char* s = static_cast<const char*>(send);
  char* d = static_cast<char*>(recv);
  // This rank's own rows: a device copy, not a trip through NCCL.
  MT_CHECK(send_rows[rank_] == recv_rows[rank_], "{}: {} rows to itself but {} expected back", what,
           send_rows[rank_], recv_rows[rank_]);
  if (send_rows[rank_] > 0)
    MT_CUDA_CHECK(cudaMemcpyAsync(d + recv_first[rank_] * row_bytes, s + send_first[rank_] * row_bytes,
                                  static_cast<size_t>(send_rows[rank_] * row_bytes), cudaMemcpyDeviceToDevice, stream));
  if (size_ == 2 && two_rank_broadcast()) {
    // NCCL gives a send/recv pair two channels per peer (≈70 GB/s over NVLink on the H200s); a broadcast
    // from each rank runs on the ring's channels. With two ranks each broadcast reaches exactly the peer.
    const int other = 1 - rank_;
    settle(ncclGroupStart(), "ncclGroupStart", what);
    for (int root = 0; root < 2; ++root) {
      const int64_t rows = root == rank_ ? send_rows[other] : recv_rows[other];
      if (rows == 0) continue;  // both ranks see the same count
      char* root_rows = const_cast<char*>(s) + send_first[other] * row_bytes;
      void* out = root == rank_ ? root_rows : d + recv_first[other] * row_bytes;  // in place on the root
      settle(ncclBroadcast(root == rank_ ? root_rows : nullptr, out, static_cast<size_t>(rows * row_bytes), ncclUint8,
                           root, comm_, stream),
             "ncclBroadcast", what);
    }
    settle(ncclGroupEnd(), "ncclGroupEnd", what);
  queued(stream, what);
    return;
  }
  settle(ncclGroupStart(), "ncclGroupStart", what);
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    if (send_rows[j] > 0)
      settle(ncclSend(s + send_first[j] * row_bytes, static_cast<size_t>(send_rows[j] * row_bytes), ncclUint8, j,
                      comm_, stream),
             "ncclSend", what);
    if (recv_rows[j] > 0)
      settle(ncclRecv(d + recv_first[j] * row_bytes, static_cast<size_t>(recv_rows[j] * row_bytes), ncclUint8, j,
                      comm_, stream),
             "ncclRecv", what);
  }
  settle(ncclGroupEnd(), "ncclGroupEnd", what);
  queued(stream, what);
}

void NcclCommunicator::send_recv(void* data, int64_t bytes, int from, int to, cudaStream_t stream,
                                 const std::string& what) {
  MT_CHECK(comm_ != nullptr, "{}: the NCCL communicator was aborted", what);
  if (bytes == 0 || from == to) return;
  if (rank_ == from)
    settle(ncclSend(data, static_cast<size_t>(bytes), ncclUint8, to, comm_, stream), "ncclSend", what);
  else if (rank_ == to)
    settle(ncclRecv(data, static_cast<size_t>(bytes), ncclUint8, from, comm_, stream), "ncclRecv", what);
  else
    return;
  queued(stream, what);
}

void NcclCommunicator::queued(cudaStream_t stream, const std::string& what) {
  CollectiveTrail::process().record(stream, name_ + ": " + what);
}

void NcclCommunicator::wait(cudaStream_t stream, const std::string& what) {
  MT_CHECK(comm_ != nullptr, "{}: the NCCL communicator was aborted", what);
  const Clock::time_point deadline = Clock::now() + timeout_;
  for (int spins = 0;; ++spins) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) MT_CUDA_CHECK(q);
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress)
      abort_and_fail(fmt::format("{} failed: {}", what, nccl_error_text(comm_, state)));
    if (Clock::now() > deadline) {
      // The step's sync waits for every layer's collectives: name the first one that has not finished.
      const std::string stuck = CollectiveTrail::process().first_unfinished();
      abort_and_fail(fmt::format("{} did not complete within {:g} s (a peer stopped or is in another collective){}",
                                 what, timeout_.count() / 1000.0,
                                 stuck.empty() ? std::string() : "; first unfinished collective: " + stuck));
    }
    if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace mt
