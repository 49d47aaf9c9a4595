// The culprit search after a timeout, and COMMS_DEBUG=detail's argument check:
// both compare ranks through the comm's store, off the hot path.
#include "trace/culprit.h"

#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "config/env.h"
#include "util/strutil.h"
#include "trace/service.h"

namespace comms::trace {

namespace {

using namespace std::chrono_literals;
constexpr auto kAnswerWait = 2500ms;   // the watchers poll every 500 ms
constexpr auto kSearchLimit = 4000ms;  // an unreachable store: give up

std::string key(const Recorder& r, std::string_view what, int64_t n, int rank) {
  return str::cat("comms-trace/", r.info().ns, "/", what, "/", n, "/", rank);
}

struct Progress {
  uint64_t entered = 0, completed = 0;
  std::string entered_op, completed_op;
};

std::string list(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) str::append(out, i ? ", " : "", ranks[i]);
  return out + "]";
}

// `n`: the failing collective's number (Recorder::issued); every Progress
// counts collectives, not seq, since point-to-point ops move seq on some
// ranks only.
std::string describe(const std::string& op, uint64_t n, const std::map<int, Progress>& got, int size) {
  std::vector<int> behind, ahead, inside, silent;
  for (int r = 0; r < size; ++r) {
    auto it = got.find(r);
    if (it == got.end()) silent.push_back(r);
    else if (it->second.entered < n) behind.push_back(r);
    else if (it->second.entered > n) ahead.push_back(r);
    else if (it->second.completed < n) inside.push_back(r);
  }
  auto named = [](const std::string& name, uint64_t k) { return str::cat("collective #", k, " (", name, ")"); };
  std::string out;
  if (!behind.empty()) {
    str::append(out, "ranks that never entered ", named(op, n), ": ", list(behind), " (");
    for (size_t i = 0; i < behind.size() && i < 8; ++i) {
      const Progress& p = got.at(behind[i]);
      str::append(out, i ? "; " : "", "rank ", behind[i], " last completed ",
                  p.completed ? named(p.completed_op, p.completed) : std::string("no collective"));
    }
    out += behind.size() > 8 ? "; ...)" : ")";
  }
  if (!silent.empty()) {
    str::append(out, out.empty() ? "" : "; ", "ranks that did not answer within ",
                std::chrono::duration<double>(kAnswerWait).count(), " s (stopped, dead or cut off): ", list(silent));
  }
  if (!ahead.empty()) {
    str::append(out, out.empty() ? "" : "; ", "ranks already past collective #", n, ": ", list(ahead), " (rank ",
                ahead[0], " entered ", named(got.at(ahead[0]).entered_op, got.at(ahead[0]).entered), ")");
  }
  if (out.empty()) str::append(out, "every rank entered ", named(op, n), "; still in it: ", list(inside));
  return out;
}

std::string search(const Recorder& rec, uint64_t collective, plugin::OpType op) {
  Store& store = *rec.info().store;
  const int64_t req = store.add(kRequestKey, 1);
  publish_progress(rec, req);
  const auto deadline = std::chrono::steady_clock::now() + kAnswerWait;
  const std::string answers = key(rec, "answers", req, 0);
  while (store.add(answers, 0) < rec.info().size && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  std::map<int, Progress> got;
  for (int r = 0; r < rec.info().size; ++r) {
    const std::string k = key(rec, "progress", req, r);
    if (!store.check({k})) continue;
    std::istringstream in(store.get(k, 1s));
    Progress p;
    if (in >> p.entered >> p.completed >> p.entered_op >> p.completed_op) got[r] = p;
  }
  return describe(std::string(plugin::op_name(op)), collective, got, rec.info().size);
}

}  // namespace

void publish_progress(const Recorder& rec, int64_t req) {
  Store& store = *rec.info().store;
  const uint64_t entered = rec.last_entered_collective(), completed = rec.last_completed_collective();
  store.set(key(rec, "progress", req, rec.info().rank),
            str::cat(entered, " ", completed, " ", plugin::op_name(rec.last_entered_collective_op()), " ",
                     plugin::op_name(rec.last_completed_collective_op())));
  // Counted once per rank, though the rank that asks also answers itself.
  if (store.add(key(rec, "progress", req, rec.info().rank) + "/n", 1) == 1) store.add(key(rec, "answers", req, 0), 1);
}

std::string find_culprit(const std::shared_ptr<Recorder>& rec, uint64_t collective, plugin::OpType op) {
  if (!rec->info().store || rec->info().size <= 1 || collective == 0) return {};
  auto result = std::make_shared<std::promise<std::string>>();
  auto answer = result->get_future();
  // On its own thread so that a store that never answers cannot hold the
  // failing op past the limit; the thread keeps what it uses alive.
  std::thread([rec, collective, op, result] {
    try {
      result->set_value(search(*rec, collective, op));
    } catch (const std::exception& e) {
      result->set_value(str::cat("could not ask the store how far the other ranks got: ", e.what()));
    }
  }).detach();
  if (answer.wait_for(kSearchLimit) != std::future_status::ready) {
    return str::cat("the store did not answer within ", std::chrono::duration<double>(kSearchLimit).count(),
                    " s, so which ranks are behind is unknown");
  }
  return answer.get();
}

bool detail_checks() {
  static const bool on = env::get_choice("COMMS_DEBUG", "off", {"off", "detail"}, "a debug level") == "detail";
  return on;
}

Status check_same_args(const Recorder& rec, const OpRecord& r, const std::string& counts,
                       std::chrono::milliseconds timeout) {
  const CommInfo& info = rec.info();
  if (!info.store || info.size <= 1) return {};
  // Numbered by collective, not by seq: point-to-point ops move seq on some
  // ranks only.
  const uint64_t n = r.collective;
  std::string mine = str::cat(plugin::op_name(r.op), " ", to_string(r.dtype), " x ", r.count);
  if (r.root >= 0) str::append(mine, " root ", r.root);
  if (r.op == plugin::OpType::kAllReduce || r.op == plugin::OpType::kReduce ||
      r.op == plugin::OpType::kReduceScatter || r.op == plugin::OpType::kReduceScatterV) {
    str::append(mine, " ", to_string(r.reduction));
  }
  if (!counts.empty()) str::append(mine, " counts ", counts);
  std::map<std::string, std::vector<int>> by_args;
  try {
    info.store->set(key(rec, "args", n, info.rank), mine);
    for (int p = 0; p < info.size; ++p) {
      by_args[p == info.rank ? mine : info.store->get(key(rec, "args", n, p), timeout)].push_back(p);
    }
    // Every rank has read collective n - 2's keys before posting n - 1's.
    if (n > 2) info.store->delete_key(key(rec, "args", n - 2, info.rank));
  } catch (const Error& e) {
    return {e.code(), str::cat("COMMS_DEBUG=detail: exchanging the arguments of collective #", n, " (",
                               plugin::op_name(r.op), ") with the other ranks failed: ", e.what())};
  }
  if (by_args.size() == 1) return {};
  std::string msg = str::cat("COMMS_DEBUG=detail: the ranks called different collectives as collective #", n, ": ");
  bool first = true;
  for (const auto& [args, ranks] : by_args) {
    str::append(msg, first ? "" : ", ", ranks.size() > 1 ? "ranks " : "rank ");
    for (size_t i = 0; i < ranks.size(); ++i) str::append(msg, i ? "," : "", ranks[i]);
    str::append(msg, ": ", args);
    first = false;
  }
  return {ErrorCode::kInvalidArgument, msg};
}

}  // namespace comms::trace
