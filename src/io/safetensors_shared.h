// A safetensors file written by several processes at once: a checkpoint saved by the ranks of a job
// without gathering the model on one of them (each rank writes the experts it holds).
//   1. the lead lays the file out with safetensors_shared_create (header, full size, no data);
//   2. every process writes the rows it holds with safetensors_shared_write (pwrite + fsync);
//   3. once every process has written, the file is byte-identical to what safetensors_write makes
//      from the complete tensors. The callers' barriers order 1 < 2 < commit; a file whose parts
//      were not all written must not be committed (train/shared_save.h).
// Every process passes the same names, dtypes, shapes and metadata (the layout is computed from them
// alone); only the rows a process writes need to hold data.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mt {

// The rows along dim 0 that this process writes of a tensor: [first, second); {0, 0}: none. A 0-d
// tensor counts as one row.
using RowsOf = std::function<std::pair<int64_t, int64_t>(const std::string& name, const Tensor& t)>;

// Creates (or truncates) `path` with the header and the full file size; the data is left as holes.
void safetensors_shared_create(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata);

// Writes this process's rows of each tensor at their place in `path` (which must have been created with the
// same tensors and metadata) and fsyncs them. Errors name the file and the tensor.
void safetensors_shared_write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata, const RowsOf& rows_of);

}  // namespace mt
