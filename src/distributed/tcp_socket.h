// Minimal blocking-with-deadline TCP helpers for the rendezvous and the CPU communicator (POSIX sockets,
// IPv4). Every call that can wait takes a deadline and throws mt::Error naming `what` when it passes, or
// when the peer closes the connection; nothing waits forever.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

using Deadline = std::chrono::steady_clock::time_point;

// An owned socket file descriptor (closed on destruction; movable).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // Gives up ownership: the descriptor stays open and is returned (-1 when there was none).
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Listens on addr:port (port 0: an ephemeral port); *bound_port receives the port.
Socket tcp_listen(const std::string& addr, int port, int* bound_port, const std::string& what);
// Accepts one connection before the deadline.
Socket tcp_accept(const Socket& listener, Deadline deadline, const std::string& what);
// Connects to host:port, retrying refused connections until the deadline (the listener may start later).
Socket tcp_connect(const std::string& host, int port, Deadline deadline, const std::string& what);
// The local IPv4 address of a connected socket (how peers on other hosts reach this one).
std::string tcp_local_address(const Socket& s);

void send_all(const Socket& s, const void* data, size_t n, Deadline deadline, const std::string& what);
void recv_all(const Socket& s, void* data, size_t n, Deadline deadline, const std::string& what);

}  // namespace mt
