// Collectives between the GPUs of one job over NCCL (distributed/cuda/device_communicator.h). Created
// collectively from the job's host communicator (distributed/communicator.h): each group's first rank makes
// its NCCL unique id and broadcasts it over the TCP mesh, or over MPI when the job was started by mpirun
// (distributed/mpi_bootstrap.h). Every operation is queued on the caller's stream and returns at once;
// wait() is the only call that blocks, and it does so with the job's timeout: when a collective does not
// complete in time (a peer died or called something else) it prints "mixtune: error: rank R (...): <operation>
// did not complete within T s", aborts the communicator and exits the process with status 1 (unwinding
// through CUDA and NCCL state after such a failure can itself hang); the launcher stops the other ranks.
// The message also names the first collective of the process that has not finished
// (distributed/cuda/collective_trail.h): the one the job hangs in, when the wait is a step's end.
//
// The communicator is non-blocking (ncclConfig blocking = 0): connection set-up inside a call is polled
// with the same deadline.
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "distributed/cuda/device_communicator.h"

struct ncclComm;

namespace mt {

class Communicator;

class NcclCommunicator final : public DeviceCommunicator {
 public:
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // As device_communicator_create (device_communicator.h): each group's first member makes that group's
  // unique id and broadcasts it over `host` (over MPI when mpi_active()).
  static std::unique_ptr<NcclCommunicator> create_group(Communicator& host, int device,
                                                        std::chrono::milliseconds timeout,
                                                        const std::vector<std::vector<int>>& groups,
                                                        const std::string& name);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  using DeviceCommunicator::all_gather;
  using DeviceCommunicator::all_reduce_sum;
  void all_reduce_sum(const std::vector<Buffer>& buffers, cudaStream_t stream, const std::string& what) override;
  void broadcast(const std::vector<Broadcast>& parts, cudaStream_t stream, const std::string& what) override;
  void reduce_sum(const std::vector<Reduce>& parts, cudaStream_t stream, const std::string& what) override;
  void all_gather(const std::vector<Gather>& parts, cudaStream_t stream, const std::string& what) override;
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype, cudaStream_t stream,
                          const std::string& what) override;
  // Two ranks exchange with one broadcast each (NCCL's send/recv pair is limited to two channels per peer);
  // more ranks use grouped send/recv.
  void all_to_allv(const void* send, const std::vector<int64_t>& send_first, const std::vector<int64_t>& send_rows,
                   void* recv, const std::vector<int64_t>& recv_first, const std::vector<int64_t>& recv_rows,
                   int64_t row_bytes, cudaStream_t stream, const std::string& what) override;
  void send_recv(void* data, int64_t bytes, int from, int to, cudaStream_t stream, const std::string& what) override;
  // Bounded by the timeout (see the header comment).
  void wait(cudaStream_t stream, const std::string& what) override;

 private:
  NcclCommunicator(ncclComm* comm, int rank, int size, int device, std::chrono::milliseconds timeout,
                   std::string name, int host_rank);
  void settle(int result, const char* call, const std::string& what);  // polls a non-blocking call to completion
  [[noreturn]] void abort_and_fail(const std::string& why);  // reports, aborts, exits the process
  void queued(cudaStream_t stream, const std::string& what);  // into the process's CollectiveTrail

  ncclComm* comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  int host_rank_ = 0;  // this process's rank in the job
  std::chrono::milliseconds timeout_;
  std::string name_;  // "NCCL" or the group's name
  bool broken_ = false;
};

}  // namespace mt
