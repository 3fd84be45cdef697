#include "mixtune/mixtune.h"

namespace mixtune {

std::string version() { return MIXTUNE_VERSION_STRING; }

bool has_cuda() {
#ifdef MIXTUNE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace mixtune
