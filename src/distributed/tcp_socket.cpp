#include "distributed/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace mt {

namespace {

int ms_left(Deadline d) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - std::chrono::steady_clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits until fd is ready for `events` or the deadline passes (false).
bool wait_ready(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) fail("poll: {}", std::strerror(errno));
  }
}

sockaddr_in resolve(const std::string& host, int port, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) fail("{}: cannot resolve host '{}': {}", what, host, ::gai_strerror(rc));
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Socket::~Socket() { close(); }

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket tcp_listen(const std::string& addr, int port, int* bound_port, const std::string& what) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) fail("{}: socket: {}", what, std::strerror(errno));
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = resolve(addr, port, what);
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    fail("{}: cannot listen on {}:{}: {}", what, addr, port, std::strerror(errno));
  if (::listen(s.fd(), 128) != 0) fail("{}: listen: {}", what, std::strerror(errno));
  socklen_t len = sizeof(a);
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len);
  if (bound_port) *bound_port = ntohs(a.sin_port);
  return s;
}

Socket tcp_accept(const Socket& listener, Deadline deadline, const std::string& what) {
  for (;;) {
    if (!wait_ready(listener.fd(), POLLIN, deadline)) fail("{}: timed out waiting for a connection", what);
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nodelay(fd);
      return Socket(fd);
    }
    if (errno != EINTR && errno != ECONNABORTED) fail("{}: accept: {}", what, std::strerror(errno));
  }
}

Socket tcp_connect(const std::string& host, int port, Deadline deadline, const std::string& what) {
  const sockaddr_in a = resolve(host, port, what);
  for (;;) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) fail("{}: socket: {}", what, std::strerror(errno));
    if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0) {
      set_nodelay(s.fd());
      return s;
    }
    const int err = errno;
    if (err != ECONNREFUSED && err != ETIMEDOUT && err != ENETUNREACH && err != EHOSTUNREACH && err != EINTR)
      fail("{}: cannot connect to {}:{}: {}", what, host, port, std::strerror(err));
    if (std::chrono::steady_clock::now() >= deadline)
      fail("{}: timed out connecting to {}:{} ({})", what, host, port, std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string tcp_local_address(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len);
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return buf;
}

void send_all(const Socket& s, const void* data, size_t n, Deadline deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_ready(s.fd(), POLLOUT, deadline)) fail("{}: timed out sending", what);
    const ssize_t k = ::send(s.fd(), p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail("{}: the peer is gone ({})", what, std::strerror(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(const Socket& s, void* data, size_t n, Deadline deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_ready(s.fd(), POLLIN, deadline)) fail("{}: timed out receiving", what);
    const ssize_t k = ::recv(s.fd(), p, n, MSG_DONTWAIT);
    if (k == 0) fail("{}: the peer closed the connection", what);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail("{}: the peer is gone ({})", what, std::strerror(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace mt
