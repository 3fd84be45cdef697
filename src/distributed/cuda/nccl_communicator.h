// Collectives between the GPUs of one job over NCCL. Created collectively from the job's host
// communicator (distributed/communicator.h): rank 0 makes the NCCL unique id and broadcasts it over the
// TCP mesh, so no MPI is needed. Every operation is queued on the caller's stream and returns at once;
// wait() is the only call that blocks, and it does so with the job's timeout: when a collective does not
// complete in time (a peer died or called something else) it prints "mixtune: error: rank R (...): <operation>
// did not complete within T s", aborts the communicator and exits the process with status 1 (unwinding
// through CUDA and NCCL state after such a failure can itself hang); the launcher stops the other ranks.
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

struct ncclComm;

namespace mt {

class Communicator;

class NcclCommunicator {
 public:
  // Collective over every rank of `host`; `device` is this rank's GPU.
  static std::unique_ptr<NcclCommunicator> create(Communicator& host, int device, std::chrono::milliseconds timeout);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Collective over every rank of `host`: `groups` partitions the job's ranks (the same list on every
  // rank); this rank joins a communicator among the members of its group, ranked in the listed order.
  // Each group's first member makes that group's unique id and broadcasts it over `host`. `name` appears
  // in error messages ("expert-parallel group").
  static std::unique_ptr<NcclCommunicator> create_group(Communicator& host, int device,
                                                        std::chrono::milliseconds timeout,
                                                        const std::vector<std::vector<int>>& groups,
                                                        const std::string& name);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

  // In place, summed over the ranks (F32, F64, BF16). Every rank receives the same values.
  void all_reduce_sum(void* data, int64_t count, DType dtype, cudaStream_t stream, const std::string& what);
  // Several in-place sums fused into one NCCL group (one launch).
  struct Buffer {
    void* data;
    int64_t count;
    DType dtype;
  };
  void all_reduce_sum(const std::vector<Buffer>& buffers, cudaStream_t stream, const std::string& what);
  // Several in-place broadcasts, each from its own root rank, fused into one NCCL group (one launch).
  struct Broadcast {
    void* data;
    int64_t count;
    DType dtype;
    int root;
  };
  void broadcast(const std::vector<Broadcast>& parts, cudaStream_t stream, const std::string& what);
  // recv[r·count .. (r+1)·count) = rank r's send (count elements of dtype).
  void all_gather(const void* send, void* recv, int64_t count, DType dtype, cudaStream_t stream,
                  const std::string& what);
  // Several all-gathers fused into one NCCL group (one launch).
  struct Gather {
    const void* send;
    void* recv;
    int64_t count;
    DType dtype;
  };
  void all_gather(const std::vector<Gather>& parts, cudaStream_t stream, const std::string& what);
  // recv (count elements) = Σ over ranks of their send[rank()·count .. (rank()+1)·count) (F32, F64, BF16).
  void reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype, cudaStream_t stream,
                          const std::string& what);
  // Rows of row_bytes: send_rows[j] rows starting at row send_first[j] of `send` go to rank j; rank j's rows
  // for this rank land at row recv_first[j] of `recv` (recv_rows[j] of them). Zero-row pairs send nothing;
  // this rank's own rows are a device-to-device copy. Two ranks exchange with one broadcast each (NCCL's
  // send/recv pair is limited to two channels per peer); more ranks use grouped send/recv.
  void all_to_allv(const void* send, const std::vector<int64_t>& send_first, const std::vector<int64_t>& send_rows,
                   void* recv, const std::vector<int64_t>& recv_first, const std::vector<int64_t>& recv_rows,
                   int64_t row_bytes, cudaStream_t stream, const std::string& what);
  // bytes from `data` on rank `from` to `data` on rank `to` (both call it; other ranks must not).
  void send_recv(void* data, int64_t bytes, int from, int to, cudaStream_t stream, const std::string& what);

  // Blocks until `stream` is done, bounded by the timeout (see the header comment).
  void wait(cudaStream_t stream, const std::string& what);

 private:
  NcclCommunicator(ncclComm* comm, int rank, int size, int device, std::chrono::milliseconds timeout,
                   std::string name, int host_rank);
  void settle(int result, const char* call, const std::string& what);  // polls a non-blocking call to completion
  [[noreturn]] void abort_and_fail(const std::string& why);  // reports, aborts, exits the process

  ncclComm* comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  int host_rank_ = 0;  // this process's rank in the job
  std::chrono::milliseconds timeout_;
  std::string name_;  // "NCCL" or the group's name
  bool broken_ = false;
};

}  // namespace mt
