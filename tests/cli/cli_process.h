// The mixtune binary as a child process, for the CLI tests: start it with its output in a log file, wait
// for its exit status, read files back.
#pragma once
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace mt::test {

// The binary under test: $MIXTUNE_TEST_BINARY when set (a test binary carried to another machine, e.g. by
// scripts/gpu-session.sh), else the one this build made.
inline const char* mixtune_binary() {
  const char* env = std::getenv("MIXTUNE_TEST_BINARY");
  return env && *env ? env : MIXTUNE_BINARY;
}

// Starts `mixtune args...` with stdout/stderr to `log`; returns the pid.
inline pid_t spawn_mixtune(const std::vector<std::string>& args, const std::filesystem::path& log) {
  const char* binary = mixtune_binary();
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(binary, argv.data());
    _exit(127);
  }
  return pid;
}

// The exit code, or 128 + the signal that killed it (as a shell reports it).
inline int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline int run_mixtune(const std::vector<std::string>& args, const std::filesystem::path& log) {
  return wait_exit(spawn_mixtune(args, log));
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace mt::test
