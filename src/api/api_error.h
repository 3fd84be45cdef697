// The library boundary: internal errors (mt::Error, allocation failures, the standard library's) become
// mixtune::Error with the same one-line message, so callers catch one type and no internal type leaks.
#pragma once
#include <exception>
#include <new>
#include <utility>

#include "core/error.h"
#include "mixtune/mixtune.h"

namespace mixtune::detail {

template <class F>
auto api_call(F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (const mixtune::Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw mixtune::Error("out of memory");
  } catch (const std::exception& e) {
    throw mixtune::Error(e.what());
  }
}

}  // namespace mixtune::detail
