// io/file_lock: one holder at a time; the second attempt learns the holder's note; the lock goes with its
// holder (released when the object goes, when the process dies) and is not inherited by programs it starts.
#include "io/file_lock.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "io_test_util.h"

extern char** environ;

namespace mt {
namespace {

using io_test::read_bytes;
using io_test::ScratchDir;

TEST(FileLock, OneHolderAtATime) {
  ScratchDir d;
  const std::string path = d.file("mixtune.lock");
  {
    FileLockAttempt a = file_lock_try(path, "pid 1 host a");
    ASSERT_TRUE(a.lock.held());
    EXPECT_FALSE(a.busy);
    EXPECT_EQ(read_bytes(path), "pid 1 host a\n");
    // A second open of the same file, even in this process, is a second holder.
    FileLockAttempt b = file_lock_try(path, "pid 2 host b");
    EXPECT_FALSE(b.lock.held());
    EXPECT_TRUE(b.busy);
    EXPECT_EQ(b.holder, "pid 1 host a");
    EXPECT_EQ(read_bytes(path), "pid 1 host a\n");  // the failed attempt left the note alone
    FileLock moved = std::move(a.lock);
    EXPECT_TRUE(moved.held());
    EXPECT_TRUE(file_lock_try(path, "pid 3 host c").busy);
  }
  FileLockAttempt c = file_lock_try(path, "pid 4 host d");
  EXPECT_TRUE(c.lock.held());
  EXPECT_EQ(read_bytes(path), "pid 4 host d\n");  // a shorter note replaces a longer one whole
}

TEST(FileLock, ADeadHolderDoesNotBlock) {
  ScratchDir d;
  const std::string path = d.file("mixtune.lock");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    FileLockAttempt a = file_lock_try(path, "pid child");
    (void)!::write(ready[1], a.lock.held() ? "y" : "n", 1);
    ::pause();  // killed below
    ::_exit(0);
  }
  char got = 0;
  ASSERT_EQ(::read(ready[0], &got, 1), 1);
  ASSERT_EQ(got, 'y');
  EXPECT_TRUE(file_lock_try(path, "pid parent").busy);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(file_lock_try(path, "pid parent").lock.held());
  ::close(ready[0]);
  ::close(ready[1]);
}

// A program started while the lock is held must not keep it after the holder lets go.
TEST(FileLock, ProgramsStartedByTheHolderDoNotInheritIt) {
  ScratchDir d;
  const std::string path = d.file("mixtune.lock");
  pid_t child = 0;
  {
    FileLockAttempt a = file_lock_try(path, "holder");
    ASSERT_TRUE(a.lock.held());
    char sh[] = "/bin/sh", c[] = "-c", cmd[] = "exec sleep 30";
    char* argv[] = {sh, c, cmd, nullptr};
    ASSERT_EQ(::posix_spawn(&child, "/bin/sh", nullptr, nullptr, argv, environ), 0);
  }
  const FileLockAttempt b = file_lock_try(path, "next");
  EXPECT_TRUE(b.lock.held()) << "the started program holds the lock";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST(FileLock, AnUnopenableFileIsAnError) {
  ScratchDir d;
  io_test::expect_error([&] { file_lock_try(d.file("missing/dir/mixtune.lock"), "x"); },
                        {"cannot open the lock file", "missing/dir/mixtune.lock"});
}

}  // namespace
}  // namespace mt
