// comms/elastic.h for Python: revoke, agree_on_failures, shrink, recover,
// agree_all, join, admit. The blocking calls release the GIL.
#include "bindings.h"
#include "comms/elastic.h"

namespace comms_py {

comms::AgreeOptions agree_options(std::optional<Millis> timeout, std::optional<Millis> liveness_timeout) {
  comms::AgreeOptions o;
  o.timeout = timeout;
  o.liveness_timeout = liveness_timeout;
  return o;
}

namespace {

using CommPtr = std::shared_ptr<comms::Comm>;

py::dict agreement_dict(const comms::Agreement& a) {
  py::dict d;
  d["epoch"] = a.epoch;
  d["lost"] = a.lost;
  d["round"] = a.round;
  return d;
}

comms::Agreement agreement_of(const py::dict& d) {
  comms::Agreement a;
  a.epoch = d["epoch"].cast<uint64_t>();
  a.lost = d["lost"].cast<std::vector<int>>();
  a.round = d["round"].cast<int>();
  return a;
}

}  // namespace

void bind_elastic(py::module_& m) {
  m.def("revoke", [](comms::Comm& c, const std::string& reason) {
    py::gil_scoped_release nogil;
    comms::revoke(c, reason);
  }, py::arg("comm"), py::arg("reason") = "revoke() called",
  "Every rank's pending and later ops on the comm fail with code 'revoked'.");
  m.def("is_revoked", &comms::is_revoked, py::arg("comm"));
  m.def("epoch", &comms::epoch, py::arg("comm"));
  m.def("agree_on_failures", [](comms::Comm& c, std::optional<Millis> timeout, std::optional<Millis> liveness) {
    comms::Agreement a;
    {
      py::gil_scoped_release nogil;
      a = comms::agree_on_failures(c, agree_options(timeout, liveness));
    }
    return agreement_dict(a);
  }, py::arg("comm"), py::kw_only(), py::arg("timeout") = py::none(), py::arg("liveness_timeout") = py::none(),
  "{'epoch', 'lost', 'round'}: the same on every survivor.");
  m.def("shrink", [](comms::Comm& c, std::optional<std::vector<int>> exclude, std::optional<py::dict> agreement) {
    if (exclude.has_value() == agreement.has_value()) {
      throw py::value_error("shrink takes exclude=[ranks] (planned) or agreement=agree_on_failures(...)");
    }
    if (exclude) {
      py::gil_scoped_release nogil;
      return comms::shrink(c, *exclude);
    }
    const comms::Agreement a = agreement_of(*agreement);
    py::gil_scoped_release nogil;
    return comms::shrink(c, a);
  }, py::arg("comm"), py::kw_only(), py::arg("exclude") = py::none(), py::arg("agreement") = py::none(),
  "The survivors' comm; None on an excluded rank.");
  m.def("recover", [](comms::Comm& c, std::optional<Millis> timeout, std::optional<Millis> liveness) {
    comms::Recovery r;
    {
      py::gil_scoped_release nogil;
      r = comms::recover(c, agree_options(timeout, liveness));
    }
    py::dict d = agreement_dict(r.agreement);
    d["comm"] = r.comm;
    d["took_ms"] = r.took.count();
    return d;
  }, py::arg("comm"), py::kw_only(), py::arg("timeout") = py::none(), py::arg("liveness_timeout") = py::none(),
  "revoke + agree + shrink: {'comm', 'epoch', 'lost', 'round', 'took_ms'}.");
  m.def("agree_all", [](comms::Comm& c, bool ok, std::optional<Millis> timeout) {
    py::gil_scoped_release nogil;
    return comms::agree_all(c, ok, agree_options(timeout, std::nullopt));
  }, py::arg("comm"), py::arg("ok"), py::kw_only(), py::arg("timeout") = py::none(),
  "Per-step commit vote: True on every rank iff every rank passed ok=True.");
  m.def("join", [](const std::string& name, std::optional<Millis> timeout) {
    comms::JoinOptions o;
    o.timeout = timeout;
    py::gil_scoped_release nogil;
    return comms::join(name, o);
  }, py::arg("name"), py::kw_only(), py::arg("timeout") = py::none(),
  "Joins the elastic job's comm `name` as a newcomer; blocks until the members admit it and returns "
  "the grown comm (this process's rank: after the members').");
  m.def("admit", [](const CommPtr& c, std::optional<Millis> timeout, std::optional<Millis> liveness) {
    comms::AdmitOptions o;
    o.timeout = timeout;
    o.liveness_timeout = liveness;
    py::gil_scoped_release nogil;
    return comms::admit(c, o);
  }, py::arg("comm"), py::kw_only(), py::arg("timeout") = py::none(), py::arg("liveness_timeout") = py::none(),
  "Collective over the members: the grown comm with the waiting newcomers, or `comm` itself when "
  "nobody waits (one store read per rank).");
  m.def("close_admissions", [](const CommPtr& c) {
    py::gil_scoped_release nogil;
    comms::close_admissions(*c);
  }, py::arg("comm"),
  "Ends admissions for good (a job past its last step): waiting and later newcomers' join() raise "
  "comms.Error with code 'aborted' instead of waiting out their timeout. Any member; not collective.");
}

}  // namespace comms_py
