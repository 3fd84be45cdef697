// Each subcommand registers itself on the CLI11 app; its work runs in the callback.
#pragma once
#include <CLI/CLI.hpp>

#include "core/dtype.h"

namespace mt::cli {

void add_inspect_command(CLI::App& app);
void add_init_command(CLI::App& app);
void add_score_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_merge_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_finetune_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_launch_command(CLI::App& app);

// "bfloat16" | "float32" (and torch spellings) -> DType; mt::Error naming the option otherwise.
DType parse_param_dtype(const std::string& s, const char* option);

}  // namespace mt::cli
