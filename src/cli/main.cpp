// mixtune command-line entry point: each subcommand lives in its own cmd_*.cpp.
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "cli/cmd_tokenize.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/exit_policy.h"
#include "distributed/mpi_bootstrap.h"

namespace {

// After the error is printed: a multi-rank GPU job skips the process teardown (core/exit_policy.h).
int failed() {
  if (mt::exit_fast_on_error()) {
    std::fflush(nullptr);
    std::_Exit(1);
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f) then fails with EFBIG, said as an error naming the file, instead
  // of SIGXFSZ killing the process in the middle of a save (ignored dispositions also reach the ranks it execs).
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"mixtune: fine-tune Mixture-of-Experts models stored in Hugging Face format"};
  app.require_subcommand(1);
  mt::cli::add_inspect_command(app);
  mt::cli::add_init_command(app);
  mt::cli::add_score_command(app);
  mt::cli::add_convert_command(app);
  mt::cli::add_merge_command(app);
  mt::cli::add_tokenize_command(app);
  mt::cli::add_generate_command(app);
  mt::cli::add_finetune_command(app);
  mt::cli::add_bench_command(app);
  mt::cli::add_launch_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "mixtune: error: %s\n", e.what());
    return failed();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mixtune: error: out of memory\n");
    return failed();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mixtune: error: %s\n", e.what());
    return failed();
  }
  // Only a command that succeeded finalises MPI: mpirun stops the other ranks of a job one of whose ranks
  // failed (exited without it) instead of leaving them to wait in MPI_Finalize.
  mt::mpi_finalize();
  return 0;
}
