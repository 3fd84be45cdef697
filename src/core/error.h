// Errors carry context: which file, tensor or field, expected vs found.
// All user-facing failures throw mt::Error; the CLI prints what() on one line and exits 1.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mt

// Internal invariant (a bug in mixtune if it fires), still thrown rather than aborting.
#define MT_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) ::mt::fail("internal check failed at {}:{}: {}: {}", __FILE__, __LINE__, #cond, \
                            ::fmt::format(__VA_ARGS__));                                      \
  } while (0)
