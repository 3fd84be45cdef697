// Helpers shared by the io tests: a scratch directory and raw file bytes.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace mt::io_test {

// A fresh directory under the system temp dir, removed with everything in it at scope end.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           ("mixtune_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// The names in a directory, sorted.
inline std::vector<std::string> listing(const std::filesystem::path& p) {
  std::vector<std::string> r;
  for (auto& e : std::filesystem::directory_iterator(p)) r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file as a hostile producer might write it: length, header text, data.
inline std::string st_bytes(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

// Runs `f`, expects an mt::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected mt::Error";
  } catch (const mt::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line error: " << msg;
  }
}

}  // namespace mt::io_test
