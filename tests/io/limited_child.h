// Runs a piece of code in a forked child process under a file-size limit (setrlimit(RLIMIT_FSIZE)), with
// SIGXFSZ ignored as `mixtune` does (src/cli/main.cpp), and brings back the mt::Error it threw.
#pragma once
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "core/error.h"

namespace mt::io_test {

struct ChildOutcome {
  bool exited = false;  // exited normally (not killed: SIGXFSZ would)
  bool threw = false;
  std::string error;    // the mt::Error's message
};

template <typename F>
ChildOutcome run_with_file_size_limit(rlim_t limit, F&& f) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit lim = {limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    std::string msg;
    char code = 'n';
    try {
      f();
    } catch (const Error& e) {
      msg = e.what();
      code = 'e';
    }
    (void)!::write(fds[1], &code, 1);
    (void)!::write(fds[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ChildOutcome r;
  r.exited = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  r.threw = !got.empty() && got[0] == 'e';
  if (!got.empty()) r.error = got.substr(1);
  return r;
}

}  // namespace mt::io_test
