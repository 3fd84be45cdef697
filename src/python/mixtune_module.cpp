// The Python binding of the public API (include/mixtune/mixtune.h) as the extension module mixtune._mixtune;
// python/mixtune/__init__.py is the package users import. Long calls release the GIL; callbacks take it back.
// Ctrl-C during finetune: Python's SIGINT handler only flags the signal, so each step boundary runs the pending
// handlers (PyErr_CheckSignals); a KeyboardInterrupt stops the run there with a checkpoint, as the CLI does on
// SIGINT, and is raised again once finetune has returned. An exception raised by a callback stops it the same way.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mixtune/mixtune.h"

namespace py = pybind11;

namespace {

// The first Python exception raised inside a native call (a callback's, or KeyboardInterrupt), raised again
// after it returns.
struct PendingError {
  std::optional<py::error_already_set> error;
  bool set() const { return error.has_value(); }
  void capture(py::error_already_set& e) {
    if (!error) error.emplace(std::move(e));
  }
  void rethrow() {
    if (error) {
      py::error_already_set e = std::move(*error);
      error.reset();
      throw e;
    }
  }
};

// Polled by the native loop with the GIL released: pending signal handlers run here (KeyboardInterrupt on Ctrl-C).
bool python_stop_requested(PendingError& pending) {
  py::gil_scoped_acquire gil;
  if (pending.set()) return true;
  if (PyErr_CheckSignals() != 0) {
    py::error_already_set e;
    pending.capture(e);
    return true;
  }
  return false;
}

std::vector<mixtune::Sequence> sequences_of(const py::object& input_ids, const py::object& labels) {
  const auto ids = input_ids.cast<std::vector<std::vector<int64_t>>>();
  std::vector<std::vector<int64_t>> labs;
  if (!labels.is_none()) {
    labs = labels.cast<std::vector<std::vector<int64_t>>>();
    if (labs.size() != ids.size())
      throw mixtune::Error("score: labels has " + std::to_string(labs.size()) + " sequences, input_ids " +
                           std::to_string(ids.size()));
  }
  std::vector<mixtune::Sequence> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    out[i].input_ids = ids[i];
    if (!labs.empty()) out[i].labels = labs[i];
  }
  return out;
}

py::dict score(const mixtune::Model& m, const py::object& input_ids, const py::object& labels, bool logits) {
  const std::vector<mixtune::Sequence> seqs = sequences_of(input_ids, labels);
  mixtune::ScoreResult r;
  {
    py::gil_scoped_release nogil;
    r = m.score(seqs, logits);
  }
  py::dict d;
  d["loss"] = r.loss;
  d["ce_loss"] = r.ce_loss;
  d["aux_loss"] = r.aux_loss;
  d["tokens"] = r.tokens;
  if (logits) {
    // The array owns the vector's buffer (no copy).
    auto* data = new std::vector<float>(std::move(r.logits));
    py::capsule owner(data, [](void* p) { delete static_cast<std::vector<float>*>(p); });
    d["logits"] = py::array_t<float>(r.logits_shape, data->data(), owner);
  }
  return d;
}

py::dict generate(const mixtune::Model& m, const py::object& prompt, int64_t max_new_tokens,
                  std::optional<double> temperature, std::optional<double> top_p, std::optional<int64_t> top_k,
                  uint64_t seed, const py::object& on_token) {
  mixtune::GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.temperature = temperature;
  o.top_p = top_p;
  o.top_k = top_k;
  o.seed = seed;
  PendingError pending;
  if (!on_token.is_none()) {
    o.on_token = [&](int64_t id) {
      if (pending.set()) return;
      py::gil_scoped_acquire gil;
      try {
        on_token(id);
      } catch (py::error_already_set& e) {
        pending.capture(e);
      }
    };
  }
  o.stop_requested = [&] { return python_stop_requested(pending); };
  mixtune::GenerateResult r;
  if (py::isinstance<py::str>(prompt)) {
    const std::string text = prompt.cast<std::string>();
    py::gil_scoped_release nogil;
    r = m.generate(text, o);
  } else {
    const auto ids = prompt.cast<std::vector<int64_t>>();
    py::gil_scoped_release nogil;
    r = m.generate(ids, o);
  }
  pending.rethrow();
  py::dict d;
  d["ids"] = r.ids;
  d["text"] = r.text;
  d["stop_reason"] = r.stop_reason;
  return d;
}

py::dict finetune(const std::string& recipe, const std::vector<std::string>& sets, bool resume,
                  const std::string& adapter, const py::object& on_step, bool quiet) {
  mixtune::FinetuneOptions o;
  o.set = sets;
  o.resume = resume;
  o.adapter = adapter;
  o.quiet = quiet;
  PendingError pending;
  if (!on_step.is_none()) {
    o.on_step = [&](const mixtune::StepMetrics& s) {
      py::gil_scoped_acquire gil;
      if (pending.set()) return;
      try {
        on_step(py::module_::import("json").attr("loads")(s.json));
      } catch (py::error_already_set& e) {
        pending.capture(e);
      }
    };
  }
  o.stop_requested = [&] { return python_stop_requested(pending); };
  mixtune::FinetuneResult r;
  {
    py::gil_scoped_release nogil;
    r = mixtune::finetune(recipe, o);
  }
  pending.rethrow();
  py::dict d;
  d["steps"] = r.steps;
  d["interrupted"] = r.interrupted;
  d["last_loss"] = r.last_loss;
  d["final_dir"] = r.final_dir;
  d["last_checkpoint"] = r.last_checkpoint;
  d["metrics_path"] = r.metrics_path;
  return d;
}

py::dict memory_plan(const mixtune::Model& m, int64_t micro_batch, int64_t seq_len, const std::string& recompute,
                     const std::string& precision, int64_t device_bytes) {
  mixtune::PlanOptions o;
  o.micro_batch = micro_batch;
  o.seq_len = seq_len;
  o.recompute = recompute;
  o.precision = precision;
  o.device_bytes = device_bytes;
  const mixtune::MemoryPlan p = m.memory_plan(o);
  py::dict d;
  d["params"] = p.params;
  d["grads"] = p.grads;
  d["optimizer"] = p.optimizer;
  d["activations"] = p.activations;
  d["workspace"] = p.workspace;
  d["total"] = p.total;
  d["available"] = p.available;
  d["fits"] = p.fits;
  d["max_micro_batch"] = p.max_micro_batch;
  d["max_seq_len"] = p.max_seq_len;
  d["table"] = p.table;
  return d;
}

}  // namespace

PYBIND11_MODULE(_mixtune, m) {
  m.doc() = "mixtune's native library (use the mixtune package)";
  py::register_exception<mixtune::Error>(m, "Error", PyExc_RuntimeError);
  m.def("version", &mixtune::version);
  m.def("has_cuda", &mixtune::has_cuda);

  py::class_<mixtune::Model>(m, "Model")
      .def_static(
          "from_pretrained",
          [](const std::string& path, const std::string& dtype, const std::string& adapter) {
            mixtune::LoadOptions o;
            o.dtype = dtype;
            o.adapter = adapter;
            py::gil_scoped_release nogil;
            return mixtune::Model::from_pretrained(path, o);
          },
          py::arg("path"), py::arg("dtype") = "auto", py::arg("adapter") = "")
      .def_static("inspect_json", [](const std::string& path) { return mixtune::Model::inspect(path).json; })
      .def("info_json", [](const mixtune::Model& self) { return self.info().json; })
      .def("info_dtype", [](const mixtune::Model& self) { return self.info().dtype; })
      .def("memory_plan", &memory_plan, py::arg("micro_batch") = 1, py::arg("seq_len") = 4096,
           py::arg("recompute") = "selective", py::arg("precision") = "fp32-master",
           py::arg("device_bytes") = int64_t{80} << 30)
      .def("score", &score, py::arg("input_ids"), py::arg("labels") = py::none(), py::arg("logits") = false)
      .def("encode", &mixtune::Model::encode)
      .def("decode", &mixtune::Model::decode)
      .def("apply_chat_template", &mixtune::Model::apply_chat_template, py::arg("messages_json"),
           py::arg("enable_thinking") = true)
      .def("generate", &generate, py::arg("prompt"), py::arg("max_new_tokens") = 128,
           py::arg("temperature") = py::none(), py::arg("top_p") = py::none(), py::arg("top_k") = py::none(),
           py::arg("seed") = 0, py::arg("on_token") = py::none())
      .def("load_adapter", &mixtune::Model::load_adapter, py::call_guard<py::gil_scoped_release>())
      .def("merge_adapter", &mixtune::Model::merge_adapter, py::call_guard<py::gil_scoped_release>())
      .def("has_adapter", &mixtune::Model::has_adapter)
      .def("save_adapter", &mixtune::Model::save_adapter, py::call_guard<py::gil_scoped_release>())
      .def("save_pretrained", &mixtune::Model::save_pretrained, py::call_guard<py::gil_scoped_release>());

  m.def("finetune", &finetune, py::arg("recipe"), py::arg("sets"), py::arg("resume"), py::arg("adapter"),
        py::arg("on_step"), py::arg("quiet"));
}
