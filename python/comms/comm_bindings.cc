// comms.Comm: every op of comms::Comm. Buffers are checked here (contiguous,
// writable where written, matching dtypes and counts) before anything is
// sent; the library's own checks still apply after.
#include <numeric>

#include "bindings.h"

namespace comms_py {
namespace {

using CommPtr = std::shared_ptr<comms::Comm>;
using Counts = std::vector<size_t>;

// The keyword arguments every op takes.
#define COMMS_OP_KWARGS                                                                    \
  py::kw_only(), py::arg("async_op") = false, py::arg("timeout") = py::none(), \
      py::arg("hints") = comms::Hints {}
#define COMMS_OP_PARAMS bool async_op, std::optional<Millis> timeout, const comms::Hints &hints

std::string times(const char* what, size_t n) { return std::string(what) + " * " + std::to_string(n); }

size_t total(const Counts& counts) { return std::accumulate(counts.begin(), counts.end(), size_t{0}); }

void check_counts_size(const CommPtr& c, const Counts& counts, const char* role) {
  if (counts.size() == static_cast<size_t>(c->size())) return;
  throw py::value_error(std::string(role) + " has " + std::to_string(counts.size()) +
                        " entries, but the comm has " + std::to_string(c->size()) + " ranks");
}

py::object all_reduce(const CommPtr& c, py::handle a, py::handle b, py::handle op, COMMS_OP_PARAMS) {
  Keepalive keep;
  const comms::ReduceOp reduce = reduce_op_of(op);
  if (b.is_none()) {
    Buffer buf = acquire(a, "buffer", Access::kWrite, keep);
    return run_op(c, "all_reduce", async_op, timeout, hints, 0, std::move(keep),
                  [&](const comms::OpOptions& o) { return c->all_reduce(buf.view, reduce, o); });
  }
  Buffer in = acquire(a, "input", Access::kRead, keep);
  Buffer out = acquire(b, "output", Access::kWrite, keep);
  check_same_dtype(in, "input", out, "output");
  check_count(out, "output", in.view.count, "the input's count");
  return run_op(c, "all_reduce", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->all_reduce(in.view, out.view, reduce, o); });
}

py::object reduce(const CommPtr& c, py::handle a, py::handle b, int root, py::handle op, COMMS_OP_PARAMS) {
  Keepalive keep;
  const comms::ReduceOp reduce = reduce_op_of(op);
  const bool is_root = c->rank() == root;
  if (b.is_none()) {
    Buffer buf = acquire(a, "buffer", is_root ? Access::kWrite : Access::kRead, keep);
    return run_op(c, "reduce", async_op, timeout, hints, 0, std::move(keep),
                  [&](const comms::OpOptions& o) { return c->reduce(buf.view, root, reduce, o); });
  }
  Buffer in = acquire(a, "input", Access::kRead, keep);
  Buffer out = acquire(b, "output", is_root ? Access::kWrite : Access::kRead, keep);
  check_same_dtype(in, "input", out, "output");
  check_count(out, "output", in.view.count, "the input's count");
  return run_op(c, "reduce", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->reduce(in.view, out.view, root, reduce, o); });
}

py::object broadcast(const CommPtr& c, py::handle a, int root, COMMS_OP_PARAMS) {
  Keepalive keep;
  Buffer buf = acquire(a, "buffer", c->rank() == root ? Access::kRead : Access::kWrite, keep);
  return run_op(c, "broadcast", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->broadcast(buf.view, root, o); });
}

py::object all_gather(const CommPtr& c, py::handle a, py::handle b, COMMS_OP_PARAMS) {
  Keepalive keep;
  Buffer in = acquire(a, "input", Access::kRead, keep);
  const size_t n = static_cast<size_t>(c->size());
  if (py::isinstance<py::list>(b) || py::isinstance<py::tuple>(b)) {  // one output per rank
    py::sequence seq = py::reinterpret_borrow<py::sequence>(b);
    if (seq.size() != n) {
      throw py::value_error("outputs has " + std::to_string(seq.size()) + " buffers, but the comm has " +
                            std::to_string(n) + " ranks");
    }
    std::vector<comms::BufferView> outs;
    for (py::handle item : seq) {
      Buffer out = acquire(item, "outputs[i]", Access::kWrite, keep);
      check_same_dtype(in, "input", out, "outputs[i]");
      check_count(out, "outputs[i]", in.view.count, "the input's count");
      outs.push_back(out.view);
    }
    return run_op(c, "all_gather", async_op, timeout, hints, 0, std::move(keep),
                  [&](const comms::OpOptions& o) { return c->all_gather(in.view, outs, o); });
  }
  Buffer out = acquire(b, "output", Access::kWrite, keep);
  check_same_dtype(in, "input", out, "output");
  check_count(out, "output", n * in.view.count, times("size()", in.view.count));
  return run_op(c, "all_gather", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->all_gather(in.view, out.view, o); });
}

py::object all_gather_v(const CommPtr& c, py::handle a, py::handle b, const Counts& counts, COMMS_OP_PARAMS) {
  Keepalive keep;
  check_counts_size(c, counts, "counts");
  Buffer in = acquire(a, "input", Access::kRead, keep);
  Buffer out = acquire(b, "output", Access::kWrite, keep);
  check_same_dtype(in, "input", out, "output");
  check_count(in, "input", counts[c->rank()], "counts[rank]");
  check_count(out, "output", total(counts), "sum(counts)");
  return run_op(c, "all_gather_v", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->all_gather_v(in.view, out.view, counts, o); });
}

py::object reduce_scatter(const CommPtr& c, py::handle a, py::handle b, py::handle op, COMMS_OP_PARAMS) {
  Keepalive keep;
  const comms::ReduceOp reduce = reduce_op_of(op);
  Buffer in = acquire(a, "input", Access::kRead, keep);
  Buffer out = acquire(b, "output", Access::kWrite, keep);
  check_same_dtype(in, "input", out, "output");
  check_count(in, "input", c->size() * out.view.count, times("size()", out.view.count));
  return run_op(c, "reduce_scatter", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->reduce_scatter(in.view, out.view, reduce, o); });
}

py::object reduce_scatter_v(const CommPtr& c, py::handle a, py::handle b, const Counts& counts, py::handle op,
                            COMMS_OP_PARAMS) {
  Keepalive keep;
  const comms::ReduceOp reduce = reduce_op_of(op);
  check_counts_size(c, counts, "counts");
  Buffer in = acquire(a, "input", Access::kRead, keep);
  Buffer out = acquire(b, "output", Access::kWrite, keep);
  check_same_dtype(in, "input", out, "output");
  check_count(out, "output", counts[c->rank()], "counts[rank]");
  check_count(in, "input", total(counts), "sum(counts)");
  return run_op(c, "reduce_scatter_v", async_op, timeout, hints, 0, std::move(keep), [&](const comms::OpOptions& o) {
    return c->reduce_scatter_v(in.view, out.view, counts, reduce, o);
  });
}

py::object all_to_all(const CommPtr& c, py::handle a, py::handle b, COMMS_OP_PARAMS) {
  Keepalive keep;
  Buffer in = acquire(a, "input", Access::kRead, keep);
  Buffer out = acquire(b, "output", Access::kWrite, keep);
  check_same_dtype(in, "input", out, "output");
  check_count(out, "output", in.view.count, "the input's count");
  if (in.view.count % c->size() != 0) {
    throw py::value_error("input holds " + std::to_string(in.view.count) + " elements, not a multiple of size() " +
                          std::to_string(c->size()));
  }
  return run_op(c, "all_to_all", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->all_to_all(in.view, out.view, o); });
}

py::object all_to_all_v(const CommPtr& c, py::handle a, py::handle b, const Counts& in_counts,
                        const Counts& out_counts, COMMS_OP_PARAMS) {
  Keepalive keep;
  check_counts_size(c, in_counts, "input_counts");
  check_counts_size(c, out_counts, "output_counts");
  Buffer in = acquire(a, "input", Access::kRead, keep);
  Buffer out = acquire(b, "output", Access::kWrite, keep);
  check_same_dtype(in, "input", out, "output");
  check_count(in, "input", total(in_counts), "sum(input_counts)");
  check_count(out, "output", total(out_counts), "sum(output_counts)");
  return run_op(c, "all_to_all_v", async_op, timeout, hints, 0, std::move(keep), [&](const comms::OpOptions& o) {
    return c->all_to_all_v(in.view, in_counts, out.view, out_counts, o);
  });
}

py::object gather(const CommPtr& c, py::handle a, py::handle b, int root, COMMS_OP_PARAMS) {
  Keepalive keep;
  Buffer in = acquire(a, "input", Access::kRead, keep);
  comms::BufferView out_view{nullptr, 0, in.view.dtype, in.view.device};  // unused off the root
  if (c->rank() == root || !b.is_none()) {
    Buffer out = acquire(b, "output", c->rank() == root ? Access::kWrite : Access::kRead, keep);
    check_same_dtype(in, "input", out, "output");
    if (c->rank() == root) check_count(out, "output", c->size() * in.view.count, times("size()", in.view.count));
    out_view = out.view;
  }
  return run_op(c, "gather", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->gather(in.view, out_view, root, o); });
}

py::object scatter(const CommPtr& c, py::handle a, py::handle b, int root, COMMS_OP_PARAMS) {
  Keepalive keep;
  Buffer out = acquire(b, "output", Access::kWrite, keep);
  comms::BufferView in_view{nullptr, 0, out.view.dtype, out.view.device};  // unused off the root
  if (c->rank() == root || !a.is_none()) {
    Buffer in = acquire(a, "input", Access::kRead, keep);
    check_same_dtype(in, "input", out, "output");
    if (c->rank() == root) check_count(in, "input", c->size() * out.view.count, times("size()", out.view.count));
    in_view = in.view;
  }
  return run_op(c, "scatter", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->scatter(in_view, out.view, root, o); });
}

py::object p2p(const CommPtr& c, bool is_send, py::handle a, int peer, uint32_t tag, COMMS_OP_PARAMS) {
  Keepalive keep;
  Buffer buf = acquire(a, "buffer", is_send ? Access::kRead : Access::kWrite, keep);
  return run_op(c, is_send ? "send" : "recv", async_op, timeout, hints, tag, std::move(keep),
                [&](const comms::OpOptions& o) {
                  return is_send ? c->send(buf.view, peer, o) : c->recv(buf.view, peer, o);
                });
}

// ops: (kind, buffer, peer) or (kind, buffer, peer, tag), kind "send"/"recv".
py::object batch_p2p(const CommPtr& c, const py::list& ops, COMMS_OP_PARAMS) {
  Keepalive keep;
  std::vector<comms::P2POp> batch;
  for (py::handle item : ops) {
    auto t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 3 && t.size() != 4) throw py::value_error("each op is (kind, buffer, peer[, tag])");
    const std::string kind = t[0].cast<std::string>();
    if (kind != "send" && kind != "recv") throw py::value_error("op kind must be 'send' or 'recv', got '" + kind + "'");
    const bool is_send = kind == "send";
    Buffer buf = acquire(t[1], is_send ? "send buffer" : "recv buffer", is_send ? Access::kRead : Access::kWrite, keep);
    const int peer = t[2].cast<int>();
    const uint32_t tag = t.size() == 4 ? t[3].cast<uint32_t>() : 0;
    batch.push_back(is_send ? comms::P2POp::send(buf.view, peer, tag) : comms::P2POp::recv(buf.view, peer, tag));
  }
  return run_op(c, "batch_p2p", async_op, timeout, hints, 0, std::move(keep),
                [&](const comms::OpOptions& o) { return c->batch_p2p(batch, o); });
}

comms::SplitOptions split_options(std::optional<Millis> init_timeout, std::optional<Millis> op_timeout,
                                  const comms::Hints& hints, const std::string& backend) {
  comms::SplitOptions options;
  options.init_timeout = init_timeout;
  options.op_timeout = op_timeout;
  options.hints = hints;
  options.backend = backend;
  return options;
}

CommPtr new_comm(const std::string& backend, const std::optional<std::string>& device, const std::string& name,
                 std::optional<Millis> init_timeout, std::optional<Millis> op_timeout, const comms::Hints& hints,
                 std::optional<int> rank, std::optional<int> world_size, bool abort_process_on_error,
                 std::optional<bool> elastic) {
  comms::CommOptions options;
  options.init_timeout = init_timeout;
  options.op_timeout = op_timeout;
  options.hints = hints;
  options.rank = rank;
  options.world_size = world_size;
  options.abort_process_on_error = abort_process_on_error;
  options.elastic = elastic;
  const auto dev = device_of(device);
  py::gil_scoped_release nogil;
  return comms::new_comm(backend, dev, name, options);
}

void bind_properties(py::class_<comms::Comm, CommPtr>& cls) {
  cls.def_property_readonly("name", &comms::Comm::name)
      .def_property_readonly("rank", &comms::Comm::rank)
      .def_property_readonly("size", &comms::Comm::size)
      .def_property_readonly("local_rank", &comms::Comm::local_rank)
      .def_property_readonly("local_size", &comms::Comm::local_size)
      .def_property_readonly("backend", &comms::Comm::backend_string, "The effective backend map, 'cpu:gloo'")
      .def_property_readonly("device", [](const comms::Comm& c) { return device_to_py(c.device()); })
      .def_property_readonly("init_timeout", &comms::Comm::init_timeout)
      .def_property_readonly("op_timeout", &comms::Comm::op_timeout)
      .def_property_readonly("hints", &comms::Comm::hints)
      .def_property_readonly("abort_process_on_error", &comms::Comm::abort_process_on_error)
      .def_property_readonly("elastic", &comms::Comm::elastic, "Watched for elastic recovery (comms.recover etc.)")
      .def("backend_state", [](const comms::Comm& c, const std::string& type) {
        return std::string(comms::to_string(c.backend_state(comms::parse_device_type(type))));
      }, py::arg("device_type"), "'absent', 'lazy', 'ready', 'offloaded' or 'failed'")
      .def("is_failed", &comms::Comm::is_failed)
      .def("describe", &comms::Comm::describe, "The effective configuration as JSON text")
      .def("__repr__", [](const comms::Comm& c) {
        return "<comms.Comm '" + c.name() + "' rank " + std::to_string(c.rank()) + "/" + std::to_string(c.size()) +
               " " + c.backend_string() + ">";
      });
}

void bind_collectives(py::class_<comms::Comm, CommPtr>& cls) {
  cls.def("all_reduce", &all_reduce, py::arg("input"), py::arg("output") = py::none(), py::kw_only(),
          py::arg("op") = "sum", py::arg("async_op") = false, py::arg("timeout") = py::none(),
          py::arg("hints") = comms::Hints{}, "In place with one buffer; otherwise input -> output.")
      .def("reduce", &reduce, py::arg("input"), py::arg("output") = py::none(), py::kw_only(), py::arg("root") = 0,
           py::arg("op") = "sum", py::arg("async_op") = false, py::arg("timeout") = py::none(),
           py::arg("hints") = comms::Hints{})
      .def("broadcast", &broadcast, py::arg("buffer"), py::kw_only(), py::arg("root") = 0, py::arg("async_op") = false,
           py::arg("timeout") = py::none(), py::arg("hints") = comms::Hints{})
      .def("all_gather", &all_gather, py::arg("input"), py::arg("output"), COMMS_OP_KWARGS,
           "output: size * input elements, or a list of size buffers")
      .def("all_gather_v", &all_gather_v, py::arg("input"), py::arg("output"), py::arg("counts"), COMMS_OP_KWARGS)
      .def("reduce_scatter", &reduce_scatter, py::arg("input"), py::arg("output"), py::kw_only(),
           py::arg("op") = "sum", py::arg("async_op") = false, py::arg("timeout") = py::none(),
           py::arg("hints") = comms::Hints{})
      .def("reduce_scatter_v", &reduce_scatter_v, py::arg("input"), py::arg("output"), py::arg("counts"),
           py::kw_only(), py::arg("op") = "sum", py::arg("async_op") = false, py::arg("timeout") = py::none(),
           py::arg("hints") = comms::Hints{})
      .def("all_to_all", &all_to_all, py::arg("input"), py::arg("output"), COMMS_OP_KWARGS)
      .def("all_to_all_v", &all_to_all_v, py::arg("input"), py::arg("output"), py::arg("input_counts"),
           py::arg("output_counts"), COMMS_OP_KWARGS)
      .def("gather", &gather, py::arg("input"), py::arg("output") = py::none(), py::kw_only(), py::arg("root") = 0,
           py::arg("async_op") = false, py::arg("timeout") = py::none(), py::arg("hints") = comms::Hints{})
      .def("scatter", &scatter, py::arg("input"), py::arg("output"), py::kw_only(), py::arg("root") = 0,
           py::arg("async_op") = false, py::arg("timeout") = py::none(), py::arg("hints") = comms::Hints{})
      .def("barrier", [](const CommPtr& c, COMMS_OP_PARAMS) {
        return run_op(c, "barrier", async_op, timeout, hints, 0, {},
                      [&](const comms::OpOptions& o) { return c->barrier(o); });
      }, COMMS_OP_KWARGS)
      .def("send", [](const CommPtr& c, py::handle b, int peer, uint32_t tag, COMMS_OP_PARAMS) {
        return p2p(c, true, b, peer, tag, async_op, timeout, hints);
      }, py::arg("buffer"), py::arg("peer"), py::kw_only(), py::arg("tag") = 0, py::arg("async_op") = false,
         py::arg("timeout") = py::none(), py::arg("hints") = comms::Hints{})
      .def("recv", [](const CommPtr& c, py::handle b, int peer, uint32_t tag, COMMS_OP_PARAMS) {
        return p2p(c, false, b, peer, tag, async_op, timeout, hints);
      }, py::arg("buffer"), py::arg("peer"), py::kw_only(), py::arg("tag") = 0, py::arg("async_op") = false,
         py::arg("timeout") = py::none(), py::arg("hints") = comms::Hints{})
      .def("batch_p2p", &batch_p2p, py::arg("ops"), COMMS_OP_KWARGS,
           "ops: [(\"send\"|\"recv\", buffer, peer[, tag]), ...], issued together");
}

void bind_lifecycle(py::class_<comms::Comm, CommPtr>& cls) {
  cls.def("split", [](comms::Comm& c, const std::vector<int>& ranks, const std::string& name,
                      std::optional<Millis> init_timeout, std::optional<Millis> op_timeout, const comms::Hints& hints,
                      const std::string& backend) {
        const comms::SplitOptions options = split_options(init_timeout, op_timeout, hints, backend);
        py::gil_scoped_release nogil;
        return c.split(ranks, name, options);
      }, py::arg("ranks"), py::arg("name"), py::kw_only(), py::arg("init_timeout") = py::none(),
      py::arg("op_timeout") = py::none(), py::arg("hints") = comms::Hints{}, py::arg("backend") = "",
      "Collective. Members pass their group's parent ranks; non-members pass [] and get None.")
      .def("split_group", [](comms::Comm& c, const std::vector<std::vector<int>>& groups, const std::string& name,
                             std::optional<Millis> init_timeout, std::optional<Millis> op_timeout,
                             const comms::Hints& hints, const std::string& backend) {
        const comms::SplitOptions options = split_options(init_timeout, op_timeout, hints, backend);
        py::gil_scoped_release nogil;
        return c.split_group(groups, name, options);
      }, py::arg("groups"), py::arg("name"), py::kw_only(), py::arg("init_timeout") = py::none(),
      py::arg("op_timeout") = py::none(), py::arg("hints") = comms::Hints{}, py::arg("backend") = "")
      .def("set_timeout", &comms::Comm::set_timeout, py::arg("op_timeout"))
      .def("set_hints", &comms::Comm::set_hints, py::arg("hints"))
      .def("abort", &comms::Comm::abort, py::arg("reason") = "abort() called")
      .def("finalize", &comms::Comm::finalize, py::call_guard<py::gil_scoped_release>())
      .def("offload_backend", [](comms::Comm& c, const std::string& type) {
        const comms::DeviceType t = comms::parse_device_type(type);
        py::gil_scoped_release nogil;
        return c.offload_backend(t);
      }, py::arg("device_type"))
      .def("reload_backend", [](comms::Comm& c, const std::string& type) {
        const comms::DeviceType t = comms::parse_device_type(type);
        py::gil_scoped_release nogil;
        return c.reload_backend(t);
      }, py::arg("device_type"))
      .def("__enter__", [](const CommPtr& c) { return c; })
      .def("__exit__", [](comms::Comm& c, py::args) {
        py::gil_scoped_release nogil;
        c.finalize();
      });
}

}  // namespace

void bind_comm(py::module_& m) {
  py::class_<comms::Comm, CommPtr> cls(m, "Comm", "A communicator: one group of ranks, one backend per device type");
  bind_properties(cls);
  bind_collectives(cls);
  bind_lifecycle(cls);
  m.def("new_comm", &new_comm, py::kw_only(), py::arg("backend") = "", py::arg("device") = py::none(),
        py::arg("name") = "world", py::arg("init_timeout") = py::none(), py::arg("op_timeout") = py::none(),
        py::arg("hints") = comms::Hints{}, py::arg("rank") = py::none(), py::arg("world_size") = py::none(),
        py::arg("abort_process_on_error") = false, py::arg("elastic") = py::none(),
        "Creates a communicator (collective). backend '' = COMMS_BACKEND or the default map.");
  m.def("live_comm_names", &comms::live_comm_names,
        "The names of this process's comms not finalized yet, sorted (what a leak check counts).");
}

}  // namespace comms_py
