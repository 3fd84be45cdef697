#include "distributed/cuda/host_staged_communicator.h"

#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/float_convert.h"
#include "distributed/communicator.h"
#include "kernels/cuda/cuda_check.h"

namespace mt {

namespace {

using Bytes = std::vector<char>;

// The TCP communicator moves float vectors; a message is its byte count (two words) and its bytes.
std::vector<float> to_words(const Bytes& b) {
  std::vector<float> w(2 + (b.size() + 3) / 4);
  const uint64_t n = b.size();
  std::memcpy(w.data(), &n, sizeof n);
  if (!b.empty()) std::memcpy(w.data() + 2, b.data(), b.size());
  return w;
}

Bytes from_words(const std::vector<float>& w, const std::string& what) {
  uint64_t n = 0;
  if (w.size() >= 2) std::memcpy(&n, w.data(), sizeof n);
  if (w.size() < 2 || n > (w.size() - 2) * 4) fail("{}: a malformed staged message ({} words)", what, w.size());
  Bytes b(n);
  if (n > 0) std::memcpy(b.data(), w.data() + 2, n);
  return b;
}

// bytes of device memory at dev, once the stream's earlier work is done.
void download(Bytes& out, size_t at, const void* dev, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) MT_CUDA_CHECK(cudaMemcpyAsync(out.data() + at, dev, bytes, cudaMemcpyDeviceToHost, stream));
}
void upload(void* dev, const char* host, size_t bytes, cudaStream_t stream) {
  if (bytes > 0) MT_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
}
void settle(cudaStream_t stream) { MT_CUDA_CHECK(cudaStreamSynchronize(stream)); }

// out = Σ_r parts[r] (count elements each) in r order, in the element type (BF16 summed in fp32, rounded once).
void sum_in_order(DType t, const std::vector<const char*>& parts, int64_t count, char* out, const std::string& what) {
  const auto n = static_cast<size_t>(count);
  switch (t) {
    case DType::F32:
    case DType::F64: {
      auto run = [&](auto zero) {
        using T = decltype(zero);
        auto* o = reinterpret_cast<T*>(out);
        std::memcpy(o, parts[0], n * sizeof(T));
        for (size_t r = 1; r < parts.size(); ++r) {
          const auto* p = reinterpret_cast<const T*>(parts[r]);
          for (size_t i = 0; i < n; ++i) o[i] += p[i];
        }
      };
      if (t == DType::F32)
        run(0.0f);
      else
        run(0.0);
      return;
    }
    case DType::BF16: {
      auto* o = reinterpret_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, parts[0] + 2 * i, 2);
        float acc = bf16_to_float(h);
        for (size_t r = 1; r < parts.size(); ++r) {
          std::memcpy(&h, parts[r] + 2 * i, 2);
          acc += bf16_to_float(h);
        }
        o[i] = float_to_bf16(acc);
      }
      return;
    }
    default: fail("{}: a sum of {} is not supported", what, dtype_safetensors_name(t));
  }
}

// The rank-order sum of one part of every member's message (count elements of t at byte `at` of each),
// staged in sum at the same offset and uploaded to dev; returns the part's bytes.
size_t upload_sum(const std::vector<Bytes>& from, size_t at, void* dev, int64_t count, DType t, Bytes& sum,
                  cudaStream_t stream, const std::string& what) {
  std::vector<const char*> parts;
  for (const Bytes& m : from) parts.push_back(m.data() + at);
  sum_in_order(t, parts, count, sum.data() + at, what);
  const size_t n = static_cast<size_t>(count) * dtype_size(t);
  upload(dev, sum.data() + at, n, stream);
  return n;
}

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(Communicator& host, std::vector<int> group, int device,
                                               std::string name)
    : host_(host), group_(std::move(group)), device_(device), name_(std::move(name)) {
  rank_ = -1;
  for (size_t i = 0; i < group_.size(); ++i)
    if (group_[i] == host.rank()) rank_ = static_cast<int>(i);
  MT_CHECK(rank_ >= 0, "{}: rank {} is not in its group", name_, host.rank());
}

std::string HostStagedCommunicator::label(const std::string& what) const { return name_ + ": " + what; }

std::vector<Bytes> HostStagedCommunicator::exchange(const std::vector<int>& members, const std::vector<Bytes>& send,
                                                    const std::string& what) {
  std::vector<std::vector<float>> out, in;
  out.reserve(send.size());
  for (const Bytes& b : send) out.push_back(to_words(b));
  host_.all_to_allv(members, out, in, label(what));
  std::vector<Bytes> r;
  r.reserve(in.size());
  for (const auto& w : in) r.push_back(from_words(w, label(what)));
  return r;
}

void HostStagedCommunicator::all_reduce_sum(const std::vector<Buffer>& buffers, cudaStream_t stream,
                                            const std::string& what) {
  size_t total = 0;
  for (const Buffer& b : buffers) total += static_cast<size_t>(b.count) * dtype_size(b.dtype);
  Bytes mine(total);
  size_t at = 0;
  for (const Buffer& b : buffers) {
    const size_t n = static_cast<size_t>(b.count) * dtype_size(b.dtype);
    download(mine, at, b.data, n, stream);
    at += n;
  }
  settle(stream);
  const std::vector<Bytes> all = exchange(group_, std::vector<Bytes>(group_.size(), mine), what);
  for (const Bytes& m : all)
    if (m.size() != total) fail("{}: a peer sent {} bytes for a sum of {}", label(what), m.size(), total);
  Bytes sum(total);
  at = 0;
  for (const Buffer& b : buffers) at += upload_sum(all, at, b.data, b.count, b.dtype, sum, stream, label(what));
  settle(stream);
}

void HostStagedCommunicator::broadcast(const std::vector<Broadcast>& parts, cudaStream_t stream,
                                       const std::string& what) {
  Bytes mine;
  for (const Broadcast& b : parts) {
    MT_CHECK(b.root >= 0 && b.root < size(), "{}: broadcast root {} outside the {} ranks", what, b.root, size());
    if (b.root != rank_) continue;
    const size_t n = static_cast<size_t>(b.count) * dtype_size(b.dtype), at = mine.size();
    mine.resize(at + n);
    download(mine, at, b.data, n, stream);
  }
  settle(stream);
  const std::vector<Bytes> from = exchange(group_, std::vector<Bytes>(group_.size(), mine), what);
  std::vector<size_t> at(group_.size(), 0);
  for (const Broadcast& b : parts) {
    const size_t n = static_cast<size_t>(b.count) * dtype_size(b.dtype);
    const Bytes& src = from[static_cast<size_t>(b.root)];
    size_t& pos = at[static_cast<size_t>(b.root)];
    if (pos + n > src.size()) fail("{}: rank {} of the group sent too few bytes", label(what), b.root);
    if (b.root != rank_) upload(b.data, src.data() + pos, n, stream);
    pos += n;
  }
  settle(stream);
}

void HostStagedCommunicator::reduce_sum(const std::vector<Reduce>& parts, cudaStream_t stream,
                                        const std::string& what) {
  std::vector<Bytes> out(group_.size());  // to each root, this rank's parts of it in order
  for (const Reduce& r : parts) {
    MT_CHECK(r.root >= 0 && r.root < size(), "{}: reduce root {} outside the {} ranks", what, r.root, size());
    Bytes& to = out[static_cast<size_t>(r.root)];
    const size_t n = static_cast<size_t>(r.count) * dtype_size(r.dtype), at = to.size();
    to.resize(at + n);
    download(to, at, r.data, n, stream);
  }
  settle(stream);
  const std::vector<Bytes> in = exchange(group_, out, what);
  const size_t mine = out[static_cast<size_t>(rank_)].size();
  for (const Bytes& m : in)
    if (m.size() != mine) fail("{}: a peer sent {} bytes for sums of {}", label(what), m.size(), mine);
  Bytes sum(mine);
  size_t at = 0;
  for (const Reduce& r : parts)
    if (r.root == rank_) at += upload_sum(in, at, r.data, r.count, r.dtype, sum, stream, label(what));
  settle(stream);
}

void HostStagedCommunicator::all_gather(const std::vector<Gather>& parts, cudaStream_t stream,
                                        const std::string& what) {
  Bytes mine;
  for (const Gather& g : parts) {
    const size_t n = static_cast<size_t>(g.count) * dtype_size(g.dtype), at = mine.size();
    mine.resize(at + n);
    download(mine, at, g.send, n, stream);
  }
  settle(stream);
  const std::vector<Bytes> from = exchange(group_, std::vector<Bytes>(group_.size(), mine), what);
  for (const Bytes& m : from)
    if (m.size() != mine.size()) fail("{}: a peer sent {} bytes for a gather of {}", label(what), m.size(), mine.size());
  size_t at = 0;
  for (const Gather& g : parts) {
    const size_t n = static_cast<size_t>(g.count) * dtype_size(g.dtype);
    for (size_t r = 0; r < from.size(); ++r) upload(static_cast<char*>(g.recv) + r * n, from[r].data() + at, n, stream);
    at += n;
  }
  settle(stream);
}

void HostStagedCommunicator::reduce_scatter_sum(const void* send, void* recv, int64_t count, DType dtype,
                                                cudaStream_t stream, const std::string& what) {
  const size_t n = static_cast<size_t>(count) * dtype_size(dtype);
  Bytes mine(n * group_.size());
  download(mine, 0, send, mine.size(), stream);
  settle(stream);
  std::vector<Bytes> out(group_.size());
  for (size_t j = 0; j < group_.size(); ++j) out[j].assign(mine.begin() + j * n, mine.begin() + (j + 1) * n);
  const std::vector<Bytes> in = exchange(group_, out, what);
  for (const Bytes& m : in)
    if (m.size() != n) fail("{}: a peer sent {} bytes for a slice of {}", label(what), m.size(), n);
  Bytes sum(n);
  upload_sum(in, 0, recv, count, dtype, sum, stream, label(what));
  settle(stream);
}

void HostStagedCommunicator::all_to_allv(const void* send, const std::vector<int64_t>& send_first,
                                         const std::vector<int64_t>& send_rows, void* recv,
                                         const std::vector<int64_t>& recv_first,
                                         const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                                         cudaStream_t stream, const std::string& what) {
  const size_t g = group_.size();
  MT_CHECK(send_first.size() == g && send_rows.size() == g && recv_first.size() == g && recv_rows.size() == g,
           "{}: all_to_allv needs {} entries per list", what, g);
  MT_CHECK(send_rows[rank_] == recv_rows[rank_], "{}: {} rows to itself but {} expected back", what, send_rows[rank_],
           recv_rows[rank_]);
  const char* s = static_cast<const char*>(send);
  char* d = static_cast<char*>(recv);
  const auto rb = static_cast<size_t>(row_bytes);
  std::vector<Bytes> out(g);
  for (size_t j = 0; j < g; ++j) {
    if (static_cast<int>(j) == rank_) continue;
    out[j].resize(static_cast<size_t>(send_rows[j]) * rb);
    download(out[j], 0, s + send_first[j] * row_bytes, out[j].size(), stream);
  }
  settle(stream);
  const std::vector<Bytes> in = exchange(group_, out, what);
  for (size_t j = 0; j < g; ++j) {
    const size_t n = static_cast<size_t>(recv_rows[j]) * rb;
    if (static_cast<int>(j) == rank_) {
      if (n > 0)
        MT_CUDA_CHECK(cudaMemcpyAsync(d + recv_first[j] * row_bytes, s + send_first[j] * row_bytes, n,
                                      cudaMemcpyDeviceToDevice, stream));
      continue;
    }
    if (in[j].size() != n) fail("{}: rank {} of the group sent {} bytes, {} expected", label(what), j, in[j].size(), n);
    upload(d + recv_first[j] * row_bytes, in[j].data(), n, stream);
  }
  settle(stream);
}

void HostStagedCommunicator::send_recv(void* data, int64_t bytes, int from, int to, cudaStream_t stream,
                                       const std::string& what) {
  if (bytes == 0 || from == to || (rank_ != from && rank_ != to)) return;
  const auto n = static_cast<size_t>(bytes);
  const std::vector<int> pair = {group_[static_cast<size_t>(from)], group_[static_cast<size_t>(to)]};
  std::vector<Bytes> out(2);
  if (rank_ == from) {
    out[1].resize(n);
    download(out[1], 0, data, n, stream);
    settle(stream);
  }
  const std::vector<Bytes> in = exchange(pair, out, what);
  if (rank_ == to) {
    if (in[0].size() != n) fail("{}: rank {} of the group sent {} bytes, {} expected", label(what), from, in[0].size(), n);
    upload(data, in[0].data(), n, stream);
    settle(stream);
  }
}

void HostStagedCommunicator::wait(cudaStream_t stream, const std::string&) { settle(stream); }

}  // namespace mt
