// The trainer's --elastic loop: one all_reduce of [gradient..., loss] per
// step, summed. Rank r of n takes samples r, r + n, ... of the step's global
// batch; each sample weighs 1 / global batch, so the sum is the batch's mean
// whatever n is, and a rank's share is a function of (rank, world size) of
// the comm in force.
//
// Losing a rank: a step whose all_reduce failed, or that not every rank
// completed (a per-step commit vote), is redone on the survivors after
// comms::recover(). The reduction is a plain sum in a fixed order, so a run
// that loses rank R at step K ends with the same final_loss, to the bit, as
// one that shrinks R away by plan just before step K (--fail-rank/--fail-step
// vs --shrink-rank/--shrink-step).
//
// Healing: at every step boundary the members call comms::admit(), which
// costs a store read when nobody waits. When it returns a grown comm, rank 0
// broadcasts the step to train next and the parameters over it (plain SGD:
// there is no other optimizer state), and everyone trains on at the new
// size. A process started with COMMS_REPLACEMENT (commsrun --replace) joins
// the job's comm instead of creating it and receives that broadcast. With
// --grow-step G the members admit only at step G's boundary, waiting there
// for a newcomer, so that a run healed at step G by a replacement ends with
// the same final_loss, to the bit, as --shrink-rank R --shrink-step K
// --grow-step G with a newcomer started by hand.
#include "elastic.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace trainer {

namespace {

using Clock = std::chrono::steady_clock;

// The name comms::dist gives the world comm: what a newcomer joins.
constexpr const char* kWorldName = "world";
// --grow-step: how long the members wait for a newcomer, polling admit().
constexpr auto kPlannedGrowWait = std::chrono::seconds(60);
constexpr auto kPlannedGrowPoll = std::chrono::milliseconds(20);

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Errors that a retry on the survivors would only repeat.
bool is_usage_error(const comms::Error& e) {
  return e.code() == comms::ErrorCode::kInvalidArgument || e.code() == comms::ErrorCode::kUnsupported;
}

std::string rank_list(int first, int end) {
  std::string out;
  for (int r = first; r < end; ++r) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

// Rank R's end at the failing step: another thread SIGKILLs the process
// while the main thread is inside the step's all_reduce.
class SelfKiller {
 public:
  void arm() {
    thread_ = std::thread([this] {
      while (!go_.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      std::fprintf(stderr, "trainer: killing this rank inside the all_reduce (t=%.6f)\n", unix_seconds());
      kill(getpid(), SIGKILL);
    });
  }
  void fire() { go_.store(true); }
  // The main thread never gets past the step (its vote would count it in).
  [[noreturn]] void wait_for_death() {
    while (true) pause();
  }

 private:
  std::atomic<bool> go_{false};
  std::thread thread_;
};

class ElasticLoop {
 public:
  ElasticLoop(std::shared_ptr<comms::Comm> comm, int world_rank, const ElasticRun& run, Model& model,
              StopWatcher& stop)
      : comm_(std::move(comm)), world_rank_(world_rank), run_(run), model_(model), stop_(stop),
        buf_(model.params.size() + 1) {}

  // Trains steps `first`..steps. `admitted`: this process was admitted at
  // step first's boundary, which the others have passed.
  int train(int first, bool admitted);

  // Rank 0's step and parameters to every rank of the comm (newcomers take
  // them; the members already hold the same); again on the survivors when a
  // rank is lost meanwhile. Returns the step. `first_done`: set when the
  // first broadcast completed (a newcomer's first collective).
  int share_state(int step, Clock::time_point* first_done = nullptr);

  comms::Comm& comm() { return *comm_; }

 private:
  void adopt(std::shared_ptr<comms::Comm> next) {
    comm_ = std::move(next);
    // The world group held the job's first comm, replaced now: release it.
    comms::dist::destroy_process_group();
  }
  void recover_now(int step);
  bool planned_shrink(int step);
  bool admit_newcomers(int step);
  void step_gradient(int step);

  std::shared_ptr<comms::Comm> comm_;
  const int world_rank_;  // -1 for a newcomer
  const ElasticRun& run_;
  Model& model_;
  StopWatcher& stop_;
  std::vector<float> buf_;
  bool recovered_ = false;
  bool planned_shrink_done_ = false;
  bool planned_grow_done_ = false;
};

void ElasticLoop::recover_now(int step) {
  stop_.at("recovery (revoke, agree, shrink)", step);
  comms::Recovery r = comms::recover(*comm_);
  adopt(r.comm);
  if (comm_->rank() == 0) {
    std::string lost;
    for (int l : r.agreement.lost) lost += (lost.empty() ? "" : ",") + std::to_string(l);
    std::printf("recovered: lost ranks [%s] in %lld ms, world %d\n", lost.c_str(),
                static_cast<long long>(r.took.count()), comm_->size());
    std::fflush(stdout);
  }
  recovered_ = true;
}

// False when this rank is the one excluded.
bool ElasticLoop::planned_shrink(int step) {
  if (planned_shrink_done_ || step != run_.shrink_step || run_.shrink_rank < 0 || run_.shrink_rank >= comm_->size()) {
    return true;
  }
  planned_shrink_done_ = true;
  stop_.at("a planned shrink", step);
  const int excluded[] = {run_.shrink_rank};
  auto smaller = comms::shrink(*comm_, excluded);
  if (!smaller) {
    std::printf("trainer: rank %d left by a planned shrink before step %d\n", world_rank_, step);
    return false;
  }
  adopt(std::move(smaller));
  if (comm_->rank() == 0) {
    std::printf("shrunk: excluded rank %d before step %d, world %d\n", run_.shrink_rank, step, comm_->size());
  }
  return true;
}

// False when the admission failed and the comm was recovered instead: the
// caller runs the boundary again.
bool ElasticLoop::admit_newcomers(int step) {
  const bool planned = run_.grow_step > 0;
  if (planned && (planned_grow_done_ || step != run_.grow_step)) return true;
  stop_.at("admitting newcomers", step);
  const auto waiting_since = Clock::now();
  auto admitting_since = waiting_since;
  std::shared_ptr<comms::Comm> grown;
  while (true) {
    admitting_since = Clock::now();
    try {
      grown = comms::admit(comm_);
    } catch (const comms::Error& e) {
      if (is_usage_error(e)) throw;
      std::fprintf(stderr, "trainer: the admission before step %d failed, recovering: %s\n", step, e.what());
      recover_now(step);
      return false;
    }
    if (!planned || grown != comm_) break;
    if (Clock::now() - waiting_since > kPlannedGrowWait) {
      throw comms::Error(comms::ErrorCode::kTimeout,
                         "--grow-step " + std::to_string(step) + ": no newcomer joined " + comm_->name() + " within " +
                             std::to_string(kPlannedGrowWait.count()) + " s (rank " +
                             std::to_string(comm_->rank()) + ")");
    }
    std::this_thread::sleep_for(kPlannedGrowPoll);
  }
  if (grown == comm_) return true;
  planned_grow_done_ = planned;
  const int before = comm_->size();
  adopt(std::move(grown));
  const auto sending_since = Clock::now();
  share_state(step);
  if (comm_->rank() == 0) {
    std::printf("grown: ranks [%s] joined in %.1f ms at step %d, world %d (state transfer %.1f ms)\n",
                rank_list(before, comm_->size()).c_str(), ms_since(admitting_since), step, comm_->size(),
                ms_since(sending_since));
    std::fflush(stdout);
  }
  return true;
}

int ElasticLoop::share_state(int step, Clock::time_point* first_done) {
  while (true) {
    stop_.at("sending the model to newcomers", step);
    int64_t next = step;
    bool ok = true;
    try {
      comm_->broadcast(comms::BufferView::of(&next, 1), 0);
      if (first_done) *first_done = Clock::now();
      comm_->broadcast(comms::BufferView::of(model_.params), 0);
    } catch (const comms::Error& e) {
      if (is_usage_error(e)) throw;
      std::fprintf(stderr, "trainer: sending the model before step %d failed, recovering: %s\n", step, e.what());
      ok = false;
    }
    if (comms::agree_all(*comm_, ok)) return static_cast<int>(next);
    recover_now(step);  // rank 0 of the survivors is a member: it holds the state
  }
}

void ElasticLoop::step_gradient(int step) {
  std::fill(buf_.begin(), buf_.end(), 0.0f);
  const float weight = 1.0f / static_cast<float>(run_.global_batch);
  double local_loss = 0;
  for (int i = comm_->rank(); i < run_.global_batch; i += comm_->size()) {
    const double l = model_.accumulate(sample(uint64_t(step) * run_.global_batch + i), buf_, weight);
    local_loss += l / run_.global_batch;
  }
  buf_.back() = static_cast<float>(local_loss);
}

int ElasticLoop::train(int first, bool admitted) {
  SelfKiller killer;
  double loss = 0;
  bool boundary_passed = admitted;
  for (int step = first; step <= run_.steps; ++step) {
    if (!boundary_passed) {
      if (!planned_shrink(step)) {
        comm_.reset();
        comms::dist::destroy_process_group();
        return 0;
      }
      if (!admit_newcomers(step)) {
        --step;  // the boundary again, on the survivors
        continue;
      }
    }
    boundary_passed = false;
    stop_.at("the gradient all_reduce", step);
    step_gradient(step);
    const bool dying = step == run_.fail_step && world_rank_ >= 0 && world_rank_ == run_.fail_rank;
    if (dying) killer.arm();
    bool ok = true;
    try {
      if (dying) killer.fire();
      comm_->all_reduce(comms::BufferView::of(buf_), comms::ReduceOp::sum());
    } catch (const comms::Error& e) {
      if (is_usage_error(e)) throw;
      std::fprintf(stderr, "trainer: step %d failed, recovering: %s\n", step, e.what());
      ok = false;
    }
    if (dying) killer.wait_for_death();
    stop_.at("the step's commit vote", step);
    if (!comms::agree_all(*comm_, ok)) {
      recover_now(step);
      --step;  // redo it on the survivors
      continue;
    }
    if (recovered_ && comm_->rank() == 0) {
      std::printf("first step after recovery done (t=%.6f)\n", unix_seconds());
      recovered_ = false;
    }
    loss = buf_.back();
    for (size_t p = 0; p < model_.params.size(); ++p) model_.params[p] -= run_.lr * buf_[p];
    if (comm_->rank() == 0 && (step % run_.print_every == 0 || step == 1)) {
      std::printf("step %d loss %.9g world %d\n", step, loss, comm_->size());
      std::fflush(stdout);
    }
    if (const int sig = stop_.requested()) {
      std::fprintf(stderr, "trainer: stopped by SIG%s at step %d\n", sigabbrev_np(sig), step);
      return 128 + sig;
    }
  }
  // A newcomer waiting now ends with the job (its step is past the last)
  // instead of waiting in join() for its timeout; one that comes later is
  // told the job has finished (close_admissions).
  // (Not by a process admitted there: the others have passed it.)
  if (run_.grow_step == 0 && !(admitted && first > run_.steps)) admit_newcomers(run_.steps + 1);
  if (comm_->rank() == 0) comms::close_admissions(*comm_);
  stop_.at("the final barrier and shutdown", run_.steps);
  comm_->barrier();
  if (comm_->rank() == 0) std::printf("final_loss=%.9g world=%d\n", loss, comm_->size());
  comm_.reset();
  comms::dist::destroy_process_group();
  return 0;
}

}  // namespace

int train_elastic(std::shared_ptr<comms::Comm> comm, int world_rank, const ElasticRun& run, Model& model,
                  StopWatcher& stop) {
  if (comm->rank() == 0) model.init(42);
  comm->broadcast(comms::BufferView::of(model.params), 0);
  ElasticLoop loop(std::move(comm), world_rank, run, model, stop);
  return loop.train(1, false);
}

int join_and_train(const ElasticRun& run, Model& model, StopWatcher& stop) {
  stop.at("joining the job (waiting to be admitted)");
  const auto joining_since = Clock::now();
  // An admission that fails on the members' side (a member lost during it)
  // makes join() take a new ticket: the survivors admit it after recovering.
  std::shared_ptr<comms::Comm> comm;
  try {
    comm = comms::join(kWorldName);
  } catch (const comms::Error& e) {
    if (e.code() != comms::ErrorCode::kAborted) throw;
    std::printf("trainer: the job finished before admitting this process: %s\n", e.what());
    return 0;
  }
  const auto joined = Clock::now();
  ElasticLoop loop(std::move(comm), -1, run, model, stop);
  Clock::time_point first_collective;
  const int step = loop.share_state(0, &first_collective);
  using Ms = std::chrono::duration<double, std::milli>;
  std::printf("trainer: joined as rank %d of %d before step %d: first collective %.1f ms after calling join "
              "(join returned at %.1f ms), state transfer %.1f ms\n",
              loop.comm().rank(), loop.comm().size(), step, Ms(first_collective - joining_since).count(),
              Ms(joined - joining_since).count(), ms_since(joined));
  std::fflush(stdout);
  return loop.train(step, true);
}

}  // namespace trainer
