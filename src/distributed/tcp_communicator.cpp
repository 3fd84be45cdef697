// The CPU communicator over TCP (communicator.h).
//
// Rendezvous: rank 0 listens at MASTER_PORT (every interface); every other rank connects to MASTER_ADDR and
// sends a hello {magic, rank, world, mesh port}; rank 0 checks the ranks (each once, same world size), then
// sends every rank the table of mesh addresses (a rank's address is where its connection to rank 0 came from, rank
// 0's is MASTER_ADDR). Mesh: rank i connects to every rank j < i and accepts the ranks above it.
//
// Collectives move messages with a 16-byte header {sequence number of this pair's exchanges, op, element
// count} that the receiver checks, so ranks that disagree on the order of collectives fail with both sides named instead
// of exchanging the wrong bytes. All sends and receives of one phase progress together under poll(), so
// two ranks sending each other large buffers cannot deadlock on full socket buffers.
// all_reduce_sum: reduce-scatter (rank r owns chunk r, sums it in rank order) then all-gather, over the world or
// a group of ranks; reduce_sum: every member's copy to the root, summed there in the same order.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/tcp_socket.h"

namespace mt {

namespace {

constexpr uint32_t kMagic = 0x6d74636fu;  // "mtco"

struct Hello {
  uint32_t magic;
  int32_t rank, world, port;
};
struct Entry {
  char addr[256];  // an IPv4 address or a host name (rank 0's under an MPI bootstrap)
  int32_t port;
};
struct Header {
  uint32_t seq, op;
  uint64_t count;
};
enum Op : uint32_t { kAllReduceF32 = 1, kAllReduceF64 = 2, kBroadcast = 3, kBarrier = 4, kAllToAllCounts = 5,
                     kAllToAll = 6, kReduceF32 = 7 };

const char* op_name(uint32_t op) {
  switch (op) {
    case kAllReduceF32: return "all_reduce(float32)";
    case kAllReduceF64: return "all_reduce(float64)";
    case kBroadcast: return "broadcast";
    case kBarrier: return "barrier";
    case kAllToAllCounts: return "all_to_allv(counts)";
    case kAllToAll: return "all_to_allv";
    case kReduceF32: return "reduce(float32)";
  }
  return "unknown";
}

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(const ProcessGroupEnv& env, std::chrono::milliseconds timeout)
      : rank_(env.rank), world_(env.world), timeout_(timeout), peers_(env.world) {
    const Deadline deadline = std::chrono::steady_clock::now() + timeout_;
    const std::string who = "rank " + std::to_string(rank_) + ": rendezvous at " + env.master_addr + ":" +
                            std::to_string(env.master_port);
    if (env.master_addr.size() >= sizeof(Entry::addr))
      fail("{}: the address is longer than {} characters", who, sizeof(Entry::addr) - 1);
    int mesh_port = 0;
    Socket mesh = tcp_listen("0.0.0.0", 0, &mesh_port, who + ": mesh listener");
    std::vector<Entry> table(world_);
    if (rank_ == 0) {
      // Under `mixtune launch` (or an MPI bootstrap) the listener is already open; else MASTER_PORT on every
      // interface: MASTER_ADDR may be a host name that resolves to a loopback address on its own host.
      Socket rv = env.rendezvous_fd >= 0 ? Socket(env.rendezvous_fd)
                                         : tcp_listen("0.0.0.0", env.master_port, nullptr, who);
      std::vector<Socket> conns(world_);
      int joined = 1;
      while (joined < world_) {
        Socket c;
        try {
          c = tcp_accept(rv, deadline, who);
        } catch (const Error&) {
          std::string missing;
          for (int r = 1; r < world_; ++r)
            if (!conns[r].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          fail("{}: timed out after {:g} s with {} of {} ranks joined (missing: {})", who, timeout_.count() / 1000.0,
               joined, world_, missing);
        }
        Hello h{};
        recv_all(c, &h, sizeof(h), deadline, who + ": hello");
        if (h.magic != kMagic) fail("{}: a connection that is not a mixtune rank (bad hello)", who);
        if (h.world != world_)
          fail("{}: rank {} says the world has {} ranks, rank 0 says {}", who, h.rank, h.world, world_);
        if (h.rank <= 0 || h.rank >= world_ || conns[h.rank].valid())
          fail("{}: rank {} joined twice or is out of range (world {})", who, h.rank, world_);
        std::snprintf(table[h.rank].addr, sizeof(table[h.rank].addr), "%s", peer_address(c).c_str());
        table[h.rank].port = h.port;
        conns[h.rank] = std::move(c);
        ++joined;
      }
      std::snprintf(table[0].addr, sizeof(table[0].addr), "%s", env.master_addr.c_str());
      table[0].port = mesh_port;
      for (int r = 1; r < world_; ++r) send_all(conns[r], table.data(), table.size() * sizeof(Entry), deadline, who);
    } else {
      Socket c = tcp_connect(env.master_addr, env.master_port, deadline, who);
      const Hello h{kMagic, rank_, world_, mesh_port};
      send_all(c, &h, sizeof(h), deadline, who + ": hello");
      recv_all(c, table.data(), table.size() * sizeof(Entry), deadline, who + ": address table");
    }
    // Mesh: connect down, accept up.
    for (int j = 0; j < rank_; ++j) {
      const std::string w = "rank " + std::to_string(rank_) + ": connecting to rank " + std::to_string(j);
      peers_[j] = tcp_connect(table[j].addr, table[j].port, deadline, w);
      const int32_t me = rank_;
      send_all(peers_[j], &me, sizeof(me), deadline, w);
    }
    for (int k = rank_ + 1; k < world_; ++k) {
      const std::string w = "rank " + std::to_string(rank_) + ": waiting for the ranks above it";
      Socket c = tcp_accept(mesh, deadline, w);
      int32_t r = -1;
      recv_all(c, &r, sizeof(r), deadline, w);
      if (r <= rank_ || r >= world_ || peers_[r].valid()) fail("{}: unexpected rank {} connected", w, r);
      peers_[r] = std::move(c);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return world_; }

  void all_reduce_sum(float* data, int64_t n, const std::string& what) override {
    all_reduce(world_group_, data, n, kAllReduceF32, what);
  }
  void all_reduce_sum(double* data, int64_t n, const std::string& what) override {
    all_reduce(world_group_, data, n, kAllReduceF64, what);
  }
  void all_reduce_sum(const std::vector<int>& group, float* data, int64_t n, const std::string& what) override {
    all_reduce(group, data, n, kAllReduceF32, what);
  }
  void all_reduce_sum(const std::vector<int>& group, double* data, int64_t n, const std::string& what) override {
    all_reduce(group, data, n, kAllReduceF64, what);
  }

  // Every other member sends root its copy; root sums them in the group's order. In pieces of kReducePiece
  // elements, so root holds a piece per member at a time, not a copy of the whole buffer per member.
  void reduce_sum(float* data, int64_t n, int root, const std::string& what) override {
    if (root < 0 || root >= world_) fail("reduce({}): root {} outside the world of {}", what, root, world_);
    reduce_sum(world_group_, data, n, root, what);
  }
  void reduce_sum(const std::vector<int>& group, float* data, int64_t n, int root, const std::string& what) override {
    if (n < 0) fail("reduce({}): negative count {}", what, n);
    const int g = static_cast<int>(group.size());
    const int me = member_index(group, "reduce", what);
    const int at_root = root_index(group, root, "reduce", what);
    if (g == 1) return;
    constexpr int64_t kReducePiece = int64_t{1} << 22;
    std::vector<float> parts;
    for (int64_t at = 0; at == 0 || at < n; at += kReducePiece) {
      const int64_t m = std::min(kReducePiece, n - at);
      const Header h = next_header(kReduceF32, static_cast<uint64_t>(m));
      std::vector<Xfer> x;
      if (me != at_root) {
        x.push_back(Xfer{root, reinterpret_cast<const char*>(data + at), static_cast<size_t>(m) * sizeof(float),
                         nullptr, 0, h, true, false});
        exchange(x, what);
        continue;
      }
      parts.resize(static_cast<size_t>(m) * g);
      for (int j = 0; j < g; ++j)
        if (j != me)
          x.push_back(Xfer{group[j], nullptr, 0, reinterpret_cast<char*>(parts.data() + static_cast<size_t>(j) * m),
                           static_cast<size_t>(m) * sizeof(float), h, false, true});
      exchange(x, what);
      std::copy(data + at, data + at + m, parts.begin() + static_cast<ptrdiff_t>(me) * m);
      sum_in_rank_order(parts.data(), m, g, data + at);
    }
  }

  void broadcast(void* data, size_t bytes, int root, const std::string& what) override {
    if (root < 0 || root >= world_) fail("broadcast({}): root {} outside the world of {}", what, root, world_);
    broadcast(world_group_, data, bytes, root, what);
  }
  void broadcast(const std::vector<int>& group, void* data, size_t bytes, int root, const std::string& what) override {
    const int me = member_index(group, "broadcast", what);
    const int at_root = root_index(group, root, "broadcast", what);
    if (group.size() == 1) return;
    const Header h = next_header(kBroadcast, bytes);
    std::vector<Xfer> x;
    for (int j = 0; j < static_cast<int>(group.size()); ++j) {
      if (j == me) continue;
      if (me == at_root) x.push_back(Xfer{group[j], static_cast<const char*>(data), bytes, nullptr, 0, h, true, false});
      else if (j == at_root) x.push_back(Xfer{group[j], nullptr, 0, static_cast<char*>(data), bytes, h, false, true});
    }
    exchange(x, what);
  }

  void all_to_allv(const std::vector<int>& group, const std::vector<std::vector<float>>& send,
                   std::vector<std::vector<float>>& recv, const std::string& what) override {
    const int g = static_cast<int>(group.size());
    int me = -1;
    for (int j = 0; j < g; ++j) {
      if (group[j] < 0 || group[j] >= world_) fail("all_to_allv({}): rank {} outside the world of {}", what, group[j], world_);
      if (group[j] == rank_) me = j;
    }
    if (me < 0 || static_cast<int>(send.size()) != g)
      fail("all_to_allv({}): rank {} is not in the group or has {} send buffers for {} ranks", what, rank_, send.size(), g);
    // Counts first (each side then knows how much to receive), then the payloads. The group is the same on
    // every member, so the headers' sequence numbers stay aligned across the world.
    std::vector<uint64_t> out_n(g), in_n(g, 0);
    for (int j = 0; j < g; ++j) out_n[j] = send[j].size();
    const Header hc = next_header(kAllToAllCounts, static_cast<uint64_t>(g));
    std::vector<Xfer> x;
    for (int j = 0; j < g; ++j)
      if (j != me)
        x.push_back(Xfer{group[j], reinterpret_cast<const char*>(&out_n[j]), sizeof(uint64_t),
                         reinterpret_cast<char*>(&in_n[j]), sizeof(uint64_t), hc, true, true});
    exchange(x, what);
    recv.assign(g, {});
    recv[me] = send[me];
    const Header hp = next_header(kAllToAll, static_cast<uint64_t>(g));
    x.clear();
    for (int j = 0; j < g; ++j) {
      if (j == me) continue;
      recv[j].resize(in_n[j]);
      x.push_back(Xfer{group[j], reinterpret_cast<const char*>(send[j].data()), send[j].size() * sizeof(float),
                       reinterpret_cast<char*>(recv[j].data()), recv[j].size() * sizeof(float), hp, true, true});
    }
    exchange(x, what);
  }

  void barrier(const std::string& what) override {
    const Header h = next_header(kBarrier, 0);
    std::vector<Xfer> x;
    for (int p = 0; p < world_; ++p)
      if (p != rank_) x.push_back(Xfer{p, nullptr, 0, nullptr, 0, h, true, true});
    exchange(x, what);
  }

 private:
  // One peer's part of a phase: an optional send (header + bytes) and an optional receive (header checked,
  // then bytes). A zero-byte send or receive still moves its header when has_send / has_recv is set.
  struct Xfer {
    int peer;
    const char* send;
    size_t send_n;
    char* recv;
    size_t recv_n;
    Header h;
    bool has_send = false, has_recv = false;
    // progress
    std::vector<char> out;
    size_t out_done = 0;
    Header in_h{};
    size_t in_done = 0;
    Xfer(int p, const char* s, size_t sn, char* r, size_t rn, Header hh, bool hs = false, bool hr = false)
        : peer(p), send(s), send_n(sn), recv(r), recv_n(rn), h(hh), has_send(hs || s != nullptr),
          has_recv(hr || r != nullptr) {}
  };

  // The sequence number is set per peer in exchange(): the number of exchanges this pair has had, the same
  // on both sides, also when collectives run within groups of ranks.
  static Header next_header(uint32_t op, uint64_t count) { return Header{0, op, count}; }

  static std::string peer_address(const Socket& s) {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    ::getpeername(s.fd(), reinterpret_cast<sockaddr*>(&a), &len);
    char buf[64] = {};
    if (a.ss_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf, sizeof(buf));
    return buf;
  }

  std::string where(int peer, const std::string& what) const {
    return "rank " + std::to_string(rank_) + ", peer rank " + std::to_string(peer) + ", " + what;
  }

  // A peer whose connection ended (orderly close, reset or broken pipe: it failed or exited) or broke.
  [[noreturn]] void peer_failed(int peer, const std::string& what, int err) const {
    if (err == 0 || err == ECONNRESET || err == EPIPE)
      fail("{}: the peer closed the connection (did it fail or exit?)", where(peer, what));
    fail("{}: the connection to the peer failed ({})", where(peer, what), std::strerror(err));
  }

  void exchange(std::vector<Xfer>& xs, const std::string& what) {
    const Deadline deadline = std::chrono::steady_clock::now() + timeout_;
    for (Xfer& x : xs) x.h.seq = ++peer_seq_[x.peer];
    for (Xfer& x : xs) {
      if (!x.has_send) continue;
      x.out.resize(sizeof(Header) + x.send_n);
      std::memcpy(x.out.data(), &x.h, sizeof(Header));
      if (x.send_n) std::memcpy(x.out.data() + sizeof(Header), x.send, x.send_n);
    }
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<Xfer*> owner;
      for (Xfer& x : xs) {
        short ev = 0;
        if (x.has_send && x.out_done < x.out.size()) ev |= POLLOUT;
        if (x.has_recv && x.in_done < sizeof(Header) + x.recv_n) ev |= POLLIN;
        if (ev) {
          fds.push_back(pollfd{peers_[x.peer].fd(), ev, 0});
          owner.push_back(&x);
        }
      }
      if (fds.empty()) return;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        std::string waiting;
        for (Xfer* x : owner) waiting += (waiting.empty() ? "" : ", ") + std::to_string(x->peer);
        fail("rank {}: {} did not complete within {:g} s (waiting for rank {})", rank_, what, timeout_.count() / 1000.0,
             waiting);
      }
      const int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (r < 0 && errno != EINTR) fail("rank {}: {}: poll: {}", rank_, what, std::strerror(errno));
      for (size_t i = 0; r > 0 && i < fds.size(); ++i) {
        Xfer& x = *owner[i];
        const int fd = fds[i].fd;
        if (fds[i].revents & POLLOUT) {
          const ssize_t k = ::send(fd, x.out.data() + x.out_done, x.out.size() - x.out_done, MSG_NOSIGNAL | MSG_DONTWAIT);
          if (k < 0 && errno != EAGAIN && errno != EINTR) peer_failed(x.peer, what, errno);
          if (k > 0) x.out_done += static_cast<size_t>(k);
        }
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          const size_t total = sizeof(Header) + x.recv_n;
          if (x.in_done >= total) continue;
          char* dst = x.in_done < sizeof(Header) ? reinterpret_cast<char*>(&x.in_h) + x.in_done
                                                 : x.recv + (x.in_done - sizeof(Header));
          const size_t want = x.in_done < sizeof(Header) ? sizeof(Header) - x.in_done : total - x.in_done;
          const ssize_t k = ::recv(fd, dst, want, MSG_DONTWAIT);
          if (k == 0) peer_failed(x.peer, what, 0);
          if (k < 0 && errno != EAGAIN && errno != EINTR) peer_failed(x.peer, what, errno);
          if (k > 0) {
            const bool header_was_partial = x.in_done < sizeof(Header);
            x.in_done += static_cast<size_t>(k);
            if (header_was_partial && x.in_done >= sizeof(Header) &&
                (x.in_h.seq != x.h.seq || x.in_h.op != x.h.op || x.in_h.count != x.h.count))
              fail("{}: collective mismatch: this rank is in #{} {} of {} elements, the peer sent #{} {} of {}",
                   where(x.peer, what), x.h.seq, op_name(x.h.op), x.h.count, x.in_h.seq, op_name(x.in_h.op),
                   x.in_h.count);
          }
        }
      }
    }
  }

  // out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) ... over the `count` m-element parts, laid out rank
  // after rank: the one summation order of both all_reduce and reduce_sum, so they agree bitwise.
  template <typename T>
  static void sum_in_rank_order(const T* parts, int64_t m, int count, T* out) {
    for (int64_t i = 0; i < m; ++i) {
      T s = parts[i];
      for (int p = 1; p < count; ++p) s += parts[static_cast<size_t>(p) * m + i];
      out[i] = s;
    }
  }

  // Reduce-scatter within the group (member j owns chunk j and sums it in the group's order), then all-gather.
  template <typename T>
  void all_reduce(const std::vector<int>& group, T* data, int64_t n, uint32_t op, const std::string& what) {
    if (n < 0) fail("all_reduce({}): negative count {}", what, n);
    const int g = static_cast<int>(group.size());
    const int me = member_index(group, "all_reduce", what);
    if (g == 1) return;
    const Header h = next_header(op, static_cast<uint64_t>(n));
    auto lo = [&](int c) { return n * c / g; };
    const int64_t mine = lo(me + 1) - lo(me);
    // Reduce-scatter: every member's copy of my chunk, then the sum in group order.
    std::vector<T> parts(static_cast<size_t>(mine) * g);
    std::vector<Xfer> x;
    for (int j = 0; j < g; ++j) {
      if (j == me) continue;
      x.push_back(Xfer{group[j], reinterpret_cast<const char*>(data + lo(j)), static_cast<size_t>(lo(j + 1) - lo(j)) * sizeof(T),
                       reinterpret_cast<char*>(parts.data() + static_cast<size_t>(j) * mine),
                       static_cast<size_t>(mine) * sizeof(T), h, true, true});
    }
    exchange(x, what);
    std::copy(data + lo(me), data + lo(me + 1), parts.begin() + static_cast<ptrdiff_t>(me) * mine);
    sum_in_rank_order(parts.data(), mine, g, data + lo(me));
    // All-gather: my reduced chunk to everyone, theirs into place.
    const Header h2 = next_header(op, static_cast<uint64_t>(n));
    x.clear();
    for (int j = 0; j < g; ++j) {
      if (j == me) continue;
      x.push_back(Xfer{group[j], reinterpret_cast<const char*>(data + lo(me)), static_cast<size_t>(mine) * sizeof(T),
                       reinterpret_cast<char*>(data + lo(j)), static_cast<size_t>(lo(j + 1) - lo(j)) * sizeof(T), h2,
                       true, true});
    }
    exchange(x, what);
  }

  // This rank's index in `group` (each member once, all inside the world).
  int member_index(const std::vector<int>& group, const char* op, const std::string& what) const {
    int me = -1;
    std::vector<bool> seen(static_cast<size_t>(world_), false);
    for (int j = 0; j < static_cast<int>(group.size()); ++j) {
      const int r = group[j];
      if (r < 0 || r >= world_ || seen[static_cast<size_t>(r)])
        fail("{}({}): rank {} of the group is outside the world of {} or listed twice", op, what, r, world_);
      seen[static_cast<size_t>(r)] = true;
      if (r == rank_) me = j;
    }
    if (me < 0) fail("{}({}): rank {} is not in the group", op, what, rank_);
    return me;
  }

  // root's index in `group` (already checked by member_index).
  int root_index(const std::vector<int>& group, int root, const char* op, const std::string& what) const {
    for (int j = 0; j < static_cast<int>(group.size()); ++j)
      if (group[j] == root) return j;
    fail("{}({}): root {} is not in the group", op, what, root);
  }

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::vector<Socket> peers_;
  std::vector<uint32_t> peer_seq_ = std::vector<uint32_t>(static_cast<size_t>(world_), 0);
  std::vector<int> world_group_ = [this] {
    std::vector<int> g(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) g[static_cast<size_t>(r)] = r;
    return g;
  }();
};

}  // namespace

std::unique_ptr<Communicator> tcp_communicator_create(const ProcessGroupEnv& env, std::chrono::milliseconds timeout) {
  if (env.world < 1 || env.rank < 0 || env.rank >= env.world)
    fail("communicator: rank {} outside the world of {}", env.rank, env.world);
  return std::make_unique<TcpCommunicator>(env, timeout);
}

}  // namespace mt
