#include "core/exit_policy.h"

#include <atomic>

namespace mt {

namespace {
std::atomic<bool> g_fast{false};
}

void set_exit_fast_on_error(bool on) { g_fast.store(on); }
bool exit_fast_on_error() { return g_fast.load(); }

}  // namespace mt
