// comms.dist (process groups, offload/reload) and comms.parallel (Megatron's
// RankGenerator and ProcessGroupCollection).
#include "bindings.h"
#include "comms/dist.h"
#include "comms/lifecycle.h"
#include "comms/parallel.h"

namespace comms_py {
namespace {

namespace dist = comms::dist;

// options["nccl"] or options["gloo"], by the names of dist::kOptionSpellings.
void section_options_of(const std::string& backend, const py::dict& d, dist::BackendOptions& o) {
  for (auto [key, value] : d) {
    const std::string k = key.cast<std::string>();
    const dist::OptionSpelling* row = dist::find_option(backend, k);
    if (!row) throw py::value_error("options['" + backend + "']: unknown key '" + k + "'");
    switch (row->type) {
      case dist::OptionType::kBool: row->set(o, value.cast<bool>()); break;
      case dist::OptionType::kInt: row->set(o, value.cast<int>()); break;
      case dist::OptionType::kString: row->set(o, value.cast<std::string>()); break;
    }
  }
}

// {"nccl": {...}, "gloo": {...}, "hints": {...}} -> BackendOptions.
dist::BackendOptions backend_options_of(const std::optional<py::dict>& maybe) {
  dist::BackendOptions o;
  if (!maybe) return o;
  for (auto [key, value] : *maybe) {
    const std::string k = key.cast<std::string>();
    if (k == "nccl" || k == "gloo") section_options_of(k, value.cast<py::dict>(), o);
    else if (k == "hints") o.hints = value.cast<comms::Hints>();
    else throw py::value_error("options: unknown key '" + k + "' (nccl, gloo, hints)");
  }
  return o;
}

py::dict backend_options_to_dict(const dist::BackendOptions& o) {
  py::dict nccl, gloo;
  for (const dist::OptionSpelling& row : dist::kOptionSpellings) {
    const std::optional<dist::OptionValue> v = row.get(o);
    if (!v) continue;
    py::dict& section = row.backend() == "nccl" ? nccl : gloo;
    section[py::str(std::string(row.name))] = std::visit([](const auto& x) { return py::cast(x); }, *v);
  }
  py::dict d;
  d["nccl"] = nccl;
  d["gloo"] = gloo;
  d["hints"] = py::cast(o.hints);
  return d;
}

py::dict spec_to_dict(const dist::GroupSpec& s) {
  py::dict d;
  d["name"] = s.name;
  d["description"] = s.description;
  d["ranks"] = s.ranks;
  d["backend"] = s.backend;
  d["timeout"] = s.timeout;
  d["options"] = backend_options_to_dict(s.options);
  d["hints"] = py::cast(s.hints);
  d["parent"] = s.parent;
  d["route"] = std::string(dist::to_string(s.route));
  d["creation_index"] = s.creation_index;
  return d;
}

std::vector<comms::DeviceType> device_types_of(const std::optional<std::vector<std::string>>& names) {
  std::vector<comms::DeviceType> types;
  if (names) {
    for (const std::string& n : *names) types.push_back(comms::parse_device_type(n));
  }
  return types;
}

void bind_group(py::module_& m) {
  py::class_<dist::Group>(m, "Group", "A process group; falsy on ranks that are not members")
      .def("__bool__", [](const dist::Group& g) { return static_cast<bool>(g); })
      .def_property_readonly("is_member", &dist::Group::is_member)
      .def_property_readonly("rank", &dist::Group::rank)
      .def_property_readonly("size", &dist::Group::size)
      .def_property_readonly("global_ranks", &dist::Group::global_ranks)
      .def_property_readonly("backend", &dist::Group::backend)
      .def_property_readonly("device", [](const dist::Group& g) { return device_to_py(g.device()); })
      .def_property_readonly("route", [](const dist::Group& g) { return std::string(dist::to_string(g.route())); })
      .def_property_readonly("name", &dist::Group::name)
      .def_property_readonly("spec", [](const dist::Group& g) { return spec_to_dict(g.spec()); })
      .def_property_readonly("comm", &dist::Group::shared_comm, "The group's comms.Comm")
      .def("describe", &dist::Group::describe)
      .def("__repr__", [](const dist::Group& g) {
        if (!g) return std::string("<comms.dist.Group (not a member)>");
        return "<comms.dist.Group '" + g.name() + "' rank " + std::to_string(g.rank()) + "/" +
               std::to_string(g.size()) + ">";
      });
}

void bind_groups(py::module_& m) {
  m.def("init_process_group", [](const std::string& backend, const std::optional<std::string>& device,
                                 std::optional<Millis> timeout, std::optional<int> rank,
                                 std::optional<int> world_size, const std::optional<py::dict>& options,
                                 std::optional<bool> elastic) {
    dist::InitOptions init;
    init.backend = backend;
    init.device = device_of(device);
    init.timeout = timeout;
    init.rank = rank;
    init.world_size = world_size;
    init.options = backend_options_of(options);
    init.elastic = elastic;
    py::gil_scoped_release nogil;
    return dist::init_process_group(init);
  }, py::kw_only(), py::arg("backend") = "", py::arg("device") = py::none(), py::arg("timeout") = py::none(),
     py::arg("rank") = py::none(), py::arg("world_size") = py::none(), py::arg("options") = py::none(),
     py::arg("elastic") = py::none(),
     "Creates the world group (collective). device='cpu' binds it eagerly (COMMS_ROUTE=split needs that). "
     "elastic=True: watched for elastic recovery (None: COMMS_ELASTIC).");
  m.def("is_initialized", &dist::is_initialized);
  m.def("world", &dist::world);
  m.def("new_group", [](const std::vector<int>& ranks, const std::string& backend, std::optional<Millis> timeout,
                        const std::optional<py::dict>& options, const std::string& name,
                        const std::string& description) {
    dist::GroupOptions o;
    o.backend = backend;
    o.timeout = timeout;
    o.options = backend_options_of(options);
    o.name = name;
    o.description = description;
    py::gil_scoped_release nogil;
    return dist::new_group(ranks, o);
  }, py::arg("ranks"), py::kw_only(), py::arg("backend") = "", py::arg("timeout") = py::none(),
     py::arg("options") = py::none(), py::arg("name") = "", py::arg("description") = "",
     "Collective over the world (c10d semantics); non-members get a falsy Group.");
  m.def("split_group", [](const dist::Group& parent, const std::vector<std::vector<int>>& rank_lists,
                          std::optional<Millis> timeout, const std::optional<py::dict>& options,
                          const std::string& backend, const std::string& name, const std::string& description) {
    dist::SplitGroupOptions o;
    o.timeout = timeout;
    o.options = backend_options_of(options);
    o.backend = backend;
    o.name = name;
    o.description = description;
    py::gil_scoped_release nogil;
    return dist::split_group(parent, rank_lists, o);
  }, py::arg("parent"), py::arg("rank_lists"), py::kw_only(), py::arg("timeout") = py::none(),
     py::arg("options") = py::none(), py::arg("backend") = "", py::arg("name") = "", py::arg("description") = "");
  m.def("destroy_process_group", [](const std::optional<dist::Group>& group) {
    py::gil_scoped_release nogil;
    if (group) dist::destroy_process_group(*group);
    else dist::destroy_process_group();
  }, py::arg("group") = py::none(), "One group, or (no argument) the world and every group.");
  m.def("groups", &dist::groups);
  m.def("route_from_environment", [] { return std::string(dist::to_string(dist::route_from_environment())); });
  m.def(
      "option_spellings",
      [] {
        py::dict d;
        for (const dist::OptionSpelling& row : dist::kOptionSpellings) {
          static constexpr const char* kTypes[] = {"bool", "int", "str"};
          d[py::str(std::string(row.name))] = py::make_tuple(std::string(row.backend()), kTypes[static_cast<int>(row.type)],
                                                           std::string(row.hint));
        }
        return d;
      },
      "{name: (backend, type, hint)}: every typed option as torch and Megatron spell it, the type its value "
      "takes ('bool', 'int', 'str') and the hint it becomes (comms::dist::kOptionSpellings)");
  m.def("to_hints", [](const py::dict& options) { return dist::to_hints(backend_options_of(options)); },
        py::arg("options"));
}

void bind_lifecycle(py::module_& m) {
  m.def("offload_groups", [](const std::optional<std::vector<std::string>>& device_types) {
    const auto types = device_types_of(device_types);
    dist::OffloadReport r;
    {
      py::gil_scoped_release nogil;
      r = dist::offload_groups(types);
    }
    py::dict d;
    d["groups_offloaded"] = r.groups_offloaded;
    d["communicators_destroyed"] = r.communicators_destroyed;
    d["communicators_suspended"] = r.communicators_suspended;
    d["groups"] = r.groups;
    d["device_memory_before"] = r.device_memory_before;
    d["device_memory_after"] = r.device_memory_after;
    d["text"] = r.to_string();
    return d;
  }, py::arg("device_types") = py::none(), "Releases those backends ('cpu', 'cuda'; default: every non-CPU one).");
  m.def("reload_groups", [] {
    dist::ReloadReport r;
    {
      py::gil_scoped_release nogil;
      r = dist::reload_groups();
    }
    py::dict d;
    d["groups_reloaded"] = r.groups_reloaded;
    d["communicators_created"] = r.communicators_created;
    d["communicators_resumed"] = r.communicators_resumed;
    return d;
  });
  m.def("shutdown", &dist::shutdown, py::call_guard<py::gil_scoped_release>());
}

py::dict recover_dict(const dist::RecoverResult& r) {
  py::dict d;
  d["excluded"] = r.excluded;
  d["lost"] = r.lost;
  d["dropped"] = r.dropped;
  d["epoch"] = r.epoch;
  d["old_rank"] = r.old_rank;
  d["rank"] = r.rank;
  d["world_size"] = r.world_size;
  d["kept"] = r.kept;
  d["rebuilt"] = r.rebuilt;
  d["removed"] = r.removed;
  d["took_ms"] = r.took.count();
  return d;
}

// A Python callable (lost, world_size) -> [ranks], called with the GIL.
std::function<std::vector<int>(const std::vector<int>&, int)> ranks_callback(const py::object& f) {
  auto held = std::make_shared<py::object>(f);
  return [held](const std::vector<int>& lost, int world_size) {
    py::gil_scoped_acquire gil;
    return (*held)(lost, world_size).cast<std::vector<int>>();
  };
}

void bind_recover(py::module_& m) {
  m.def("recover", [](std::optional<Millis> timeout, std::optional<Millis> liveness, const py::object& exclude) {
    dist::RecoverOptions o;
    o.agree = agree_options(timeout, liveness);
    if (!exclude.is_none()) o.exclude = ranks_callback(exclude);
    dist::RecoverResult r;
    {
      py::gil_scoped_release nogil;
      r = dist::recover(o);
    }
    return recover_dict(r);
  }, py::arg("timeout") = py::none(), py::arg("liveness_timeout") = py::none(), py::arg("exclude") = py::none(),
  "After a failed op: recovers the world and rebuilds every group that held a lost rank, in place "
  "(groups without one keep their comm). exclude(lost, world_size) -> alive ranks to drop as well. "
  "Returns {'excluded', 'lost', 'dropped', 'epoch', 'old_rank', 'rank', 'world_size', 'kept', "
  "'rebuilt', 'removed', 'took_ms'}; an excluded rank should exit.");
}

py::dict admit_dict(const dist::AdmitResult& r) {
  py::dict d;
  d["grown"] = r.grown;
  d["joined"] = r.joined;
  d["epoch"] = r.epoch;
  d["rank"] = r.rank;
  d["old_world_size"] = r.old_world_size;
  d["world_size"] = r.world_size;
  d["kept"] = r.kept;
  d["rebuilt"] = r.rebuilt;
  d["created"] = r.created;
  d["took_ms"] = r.took.count();
  return d;
}

comms::AdmitOptions admit_options(std::optional<Millis> timeout, std::optional<Millis> liveness) {
  comms::AdmitOptions o;
  o.timeout = timeout;
  o.liveness_timeout = liveness;
  return o;
}

void bind_grow(py::module_& m) {
  m.def("admit", [](std::optional<Millis> timeout, std::optional<Millis> liveness) {
    dist::AdmitResult r;
    {
      py::gil_scoped_release nogil;
      r = dist::admit(admit_options(timeout, liveness));
    }
    return admit_dict(r);
  }, py::kw_only(), py::arg("timeout") = py::none(), py::arg("liveness_timeout") = py::none(),
  "Collective over the world's members, at a step boundary: admits the newcomers waiting in "
  "join_process_group(). Nothing changes when nobody waits (one store read per rank). Groups keep their "
  "comms; the newcomers are members of none. Returns {'grown', 'joined', 'epoch', 'rank', "
  "'old_world_size', 'world_size', 'kept', 'rebuilt', 'created', 'took_ms'}.");
  m.def("join_process_group", [](std::optional<Millis> timeout) {
    comms::JoinOptions o;
    o.timeout = timeout;
    dist::JoinResult r;
    {
      py::gil_scoped_release nogil;
      r = dist::join_process_group(o);
    }
    py::dict d = admit_dict(r.admission);
    d["collection"] = r.collection ? py::cast(r.collection) : py::none();
    return d;
  }, py::kw_only(), py::arg("timeout") = py::none(),
  "A newcomer joins the elastic job's world and its groups; blocks until the members admit it. Returns "
  "admit()'s dict plus 'collection': the model-parallel collection the members reshaped with "
  "comms.parallel.admit_model_parallel, or None.");
}

}  // namespace

void bind_dist(py::module_& m) {
  bind_group(m);
  bind_groups(m);
  bind_lifecycle(m);
  bind_recover(m);
  bind_grow(m);
}

namespace {

// A collection's recovery after a loss and growth after an admission.
void bind_collection_elastic(py::module_& m) {
  using Collection = dist::ProcessGroupCollection;
  m.def("recover_model_parallel", [](Collection& c, const py::object& rule, std::optional<Millis> timeout,
                                     std::optional<Millis> liveness) {
    dist::ShrinkRule r;
    if (py::isinstance<py::str>(rule)) {
      if (rule.cast<std::string>() != "drop_replicas") {
        throw py::value_error("rule: 'drop_replicas', a callable (lost, world_size) -> ranks to drop, or None");
      }
      r = dist::drop_replicas();
    } else if (!rule.is_none()) {
      auto f = ranks_callback(rule);
      r = [f](const dist::LayoutLoss& loss) { return f(loss.lost, loss.world_size); };
    }
    dist::RecoverResult result;
    {
      py::gil_scoped_release nogil;
      result = dist::recover_model_parallel(c, r, agree_options(timeout, liveness));
    }
    return recover_dict(result);
  }, py::arg("collection"), py::arg("rule") = py::none(), py::kw_only(), py::arg("timeout") = py::none(),
  py::arg("liveness_timeout") = py::none(),
  "dist.recover() plus the collection reshaped in place for the smaller world (dp shrinks). A loss the layout "
  "cannot absorb raises comms.Error saying why unless rule ('drop_replicas' or a callable) drops more ranks.");
  m.def("admit_model_parallel", [](Collection& c, std::optional<Millis> timeout, std::optional<Millis> liveness) {
    dist::AdmitResult r;
    {
      py::gil_scoped_release nogil;
      r = dist::admit_model_parallel(c, admit_options(timeout, liveness));
    }
    return admit_dict(r);
  }, py::arg("collection"), py::kw_only(), py::arg("timeout") = py::none(), py::arg("liveness_timeout") = py::none(),
  "dist.admit() plus the collection reshaped in place for the grown world (dp grows); the newcomers get it "
  "from dist.join_process_group()['collection'].");
}

}  // namespace

void bind_parallel(py::module_& m) {
  py::class_<dist::RankGenerator>(m, "RankGenerator", "Megatron-LM's rank ordering")
      .def(py::init<int, int, int, int, int, std::string_view, int>(), py::arg("tp"), py::arg("ep"), py::arg("dp"),
           py::arg("pp"), py::arg("cp"), py::arg("order") = "tp-cp-ep-dp-pp", py::arg("rank_offset") = 0)
      .def("get_ranks", &dist::RankGenerator::get_ranks, py::arg("token"))
      .def_property_readonly("world_size", &dist::RankGenerator::world_size)
      .def_property_readonly("rank_offset", &dist::RankGenerator::rank_offset)
      .def_property_readonly("order", &dist::RankGenerator::order)
      .def("size_of", &dist::RankGenerator::size_of, py::arg("axis"));

  py::class_<dist::ParallelConfig>(m, "ParallelConfig")
      .def(py::init<>())
      .def_readwrite("tp", &dist::ParallelConfig::tp)
      .def_readwrite("pp", &dist::ParallelConfig::pp)
      .def_readwrite("cp", &dist::ParallelConfig::cp)
      .def_readwrite("ep", &dist::ParallelConfig::ep)
      .def_readwrite("expert_tp", &dist::ParallelConfig::expert_tp)
      .def_readwrite("order", &dist::ParallelConfig::order)
      .def_readwrite("rank_offset", &dist::ParallelConfig::rank_offset)
      .def_readwrite("world_size", &dist::ParallelConfig::world_size)
      .def_readwrite("timeout", &dist::ParallelConfig::timeout)
      .def_readwrite("backend", &dist::ParallelConfig::backend)
      .def_readwrite("create_gloo_groups", &dist::ParallelConfig::create_gloo_groups)
      .def_readwrite("create_all_gather_groups", &dist::ParallelConfig::create_all_gather_groups)
      .def_readwrite("high_priority_groups", &dist::ParallelConfig::high_priority_groups)
      .def_readwrite("name", &dist::ParallelConfig::name)
      .def("set_communicator_config", [](dist::ParallelConfig& c, const std::string& yaml) {
        c.group_options = dist::parse_communicator_config(yaml);
      }, py::arg("yaml_text"), "Per-group options in Megatron's --nccl-communicator-config-path YAML layout")
      .def_property_readonly("group_options", [](const dist::ParallelConfig& c) {
        py::dict d;
        for (const auto& [name, options] : c.group_options) d[py::str(name)] = backend_options_to_dict(options);
        return d;
      });

  m.def("parse_parallel_flags", [](const std::string& text) {
    const dist::ParallelFlags flags = dist::parse_parallel_flags(text);
    return py::make_tuple(flags.config, flags.world, flags.dp);
  }, py::arg("text"), "'world=4,tp=2,pp=2,order=tp-pp-dp' -> (ParallelConfig, world or None, dp or None)");
  m.def("group_names", &dist::group_names);
  m.def("plan_model_parallel", [](const dist::ParallelConfig& config, int world_size, const std::string& backend) {
    const dist::ParallelPlan plan = dist::plan_model_parallel(config, world_size, backend);
    py::dict d;
    d["world_size"] = plan.world_size;
    d["dp"] = plan.dp;
    d["expert_tp"] = plan.expert_tp;
    d["expert_dp"] = plan.expert_dp;
    py::dict groups;
    for (const dist::PlannedGroup& g : plan.groups) groups[py::str(g.name)] = g.rank_lists;
    d["groups"] = groups;
    return d;
  }, py::arg("config"), py::arg("world_size"), py::arg("world_backend") = "");

  using Collection = dist::ProcessGroupCollection;
  // Held by shared_ptr: join_process_group hands a newcomer its collection so.
  py::class_<Collection, std::shared_ptr<Collection>>(m, "ProcessGroupCollection",
                                                      "The model-parallel groups of one collection")
      .def("get", &Collection::get, py::arg("name"), "This rank's group (raises comms.Error if none)")
      .def("has", &Collection::has, py::arg("name"))
      .def("rank_lists", &Collection::rank_lists, py::arg("name"))
      .def_property_readonly("prefix", &Collection::prefix)
      .def_property_readonly("dp_size", [](const Collection& c) { return c.plan().dp; })
      .def_property_readonly("world_size", [](const Collection& c) { return c.plan().world_size; })
      .def("__getattr__", [](const Collection& c, const std::string& name) -> dist::Group {
        if (!c.has(name)) throw py::attribute_error("no group '" + name + "' for this rank in the collection");
        return c.get(name);
      });
  m.def("why_layout_cannot_shrink", &dist::why_layout_cannot_shrink, py::arg("config"), py::arg("world_size"),
        py::arg("gone"), "Why the layout cannot lose these world ranks and be derived again; '' if it can.");
  bind_collection_elastic(m);
  m.def("initialize_model_parallel", [](const dist::ParallelConfig& config) {
    py::gil_scoped_release nogil;
    return dist::initialize_model_parallel(config);
  }, py::arg("config"), "Collective over the world: builds every group of the layout with new_group");
}

}  // namespace comms_py
