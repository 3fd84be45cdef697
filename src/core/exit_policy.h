// How a process ends after an error. Normally the error unwinds the stack (destructors free everything) and
// main prints it. A multi-rank GPU job is different: tearing down NCCL communicators (ncclCommDestroy,
// ncclCommFinalize) and device memory (cudaFree syncs the device) can wait forever on a peer that stopped,
// which is the failure being reported. Such a job sets exit_fast_on_error: its engine is abandoned rather than
// destroyed while an error propagates, and main exits right after printing the error (std::_Exit), leaving
// the driver to reclaim the GPU; the launcher then stops the other ranks.
#pragma once

namespace mt {

void set_exit_fast_on_error(bool on);
bool exit_fast_on_error();

}  // namespace mt
